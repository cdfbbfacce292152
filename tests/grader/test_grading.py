"""The real grader, `python -m autograder grade`, on a whole class of real submissions:
round trip, every mutant, correct variants, parallel against serial, shards and merge."""
import csv
import json
import subprocess
import sys

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import LESSONS, fill

pytestmark = pytest.mark.slow


def run(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True, timeout=1200)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def read_grades(results):
    with open(results / "grades.csv", newline="") as f:
        return {(r["student"], r["lesson"], r["test"]): r for r in csv.DictReader(f)}


def build_class(root, lessons, with_mutants=True):
    """SUBMISSIONS with, per lesson, a solved and a blank student, one student per variant and per mutant that
    the real grader must see (tests.harness.mutants.graded_by_the_grader: test_checks judges all of them in-process).
    Returns {student: (lesson, name or None, expectation)}."""
    release(root / "release", lessons)
    subs, who = root / "submissions", {}
    for lesson in lessons:
        rel = nbk.read(root / "release" / lesson / f"{lesson}.ipynb")
        entries = [(f"solved-{lesson}", fill(rel, lesson), (lesson, None, "full")),
                   (f"blank-{lesson}", rel, (lesson, None, "zero"))]
        module = mutants.for_lesson(lesson) if with_mutants else None
        for name, items in (module.MUTANTS.items() if module else []):
            for i, mistake in enumerate(items):
                if mutants.graded_by_the_grader(lesson, name, i, mistake):
                    _, keyword, code = mistake
                    entries.append((f"mutant-{lesson}-{name}-{i}", fill(rel, lesson, {name: code}),
                                    (lesson, name, keyword)))
        for name, items in (module.VARIANTS.items() if module else []):
            for i, (how, code) in enumerate(items):
                entries.append((f"variant-{lesson}-{name}-{i}", fill(rel, lesson, {name: code}), (lesson, None, "full")))
        for student, nb, expect in entries:
            nbk.write(nb, subs / student / lesson / f"{lesson}.ipynb")
            who[student] = expect
    return subs, who


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs, who = build_class(root, LESSONS)
    run("grade", str(subs), "--out", str(root / "results"), "--jobs", "2", "--quiet")
    return who, read_grades(root / "results"), root


def test_grades_csv_is_complete(graded_class):
    who, grades, _ = graded_class
    expected = {(s, lesson, t) for s in who for lesson in LESSONS
                for t, _ in nbk.graded_tests(nbk.read(nbk.lesson_path(lesson)))}
    assert set(grades) == expected
    for (student, lesson, _), row in grades.items():
        if lesson != who[student][0]:
            assert row["status"] == "missing" and row["points"] == "0"


def test_round_trip_full_marks_and_blank_zero(graded_class):
    who, grades, _ = graded_class
    for (student, lesson, test), row in grades.items():
        if lesson != who[student][0]:
            continue
        kind = who[student][2]
        if kind == "full":
            assert (row["status"], row["points"]) == ("passed", row["max_points"]), (student, test, row["message"])
        elif kind == "zero":
            assert row["status"] == "failed" and row["points"] == "0", (student, test)
            assert "not implemented" in row["message"]


def _also_loses(student, lesson, name):
    """The other names mutant-{lesson}-{name}-{i} may cost (tests.harness.mutants.also_loses)."""
    what = mutants.for_lesson(lesson).MUTANTS[name][int(student.rsplit("-", 1)[1])][0]
    return mutants.also_loses(lesson, what)


def test_each_mutant_loses_points_on_its_own_function_only(graded_class):
    who, grades, _ = graded_class
    caught = 0
    for student, (lesson, name, keyword) in who.items():
        if name is None:
            continue
        for (s, l, test), row in grades.items():
            if (s, l) != (student, lesson):
                continue
            if test == f"test_{name}":  # partial credit may keep the share of aspects it gets right
                assert row["status"] == "failed" and float(row["points"]) < float(row["max_points"]), (student, row)
                assert keyword.lower() in row["message"].lower(), (student, row["message"])
                caught += 1
            elif test.removeprefix("test_") not in _also_loses(student, lesson, name):
                assert row["status"] == "passed", (student, test, row["message"])
    assert caught == sum(1 for _, name, _ in who.values() if name)


def test_feedback_pages_show_no_hidden_code(graded_class):
    who, _, root = graded_class
    pages = list((root / "results" / "feedback").glob("*/*.html"))
    assert len(pages) == len(who) * len(LESSONS)
    for page in pages:
        text = page.read_text()
        assert "verify(" not in text and "BEGIN HIDDEN" not in text and "import solutions" not in text


@pytest.fixture(scope="module")
def small_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    subs, who = build_class(root, LESSONS[:1])
    return root, subs


def test_parallel_equals_serial_and_shards_merge_to_one_run(small_class):
    root, subs = small_class
    run("grade", str(subs), "--out", str(root / "serial"), "--jobs", "1", "--quiet")
    run("grade", str(subs), "--out", str(root / "parallel"), "--jobs", "2", "--quiet")
    for i in range(3):
        run("grade", str(subs), "--out", str(root / f"shard{i}"), "--shard", f"{i}/3", "--quiet")
    run("merge", *[str(root / f"shard{i}") for i in range(3)], "--out", str(root / "merged"))
    serial = (root / "serial" / "grades.csv").read_text()
    assert (root / "parallel" / "grades.csv").read_text() == serial
    assert (root / "merged" / "grades.csv").read_text() == serial
    assert len((root / "shard0" / "grades.csv").read_text().splitlines()) < len(serial.splitlines())


def test_resume_skips_finished_work_and_is_idempotent(small_class):
    root, subs = small_class
    out = root / "resume"
    run("grade", str(subs), "--out", str(out), "--quiet")
    first = (out / "grades.csv").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / ".results").glob("*/*.json")}
    victim = next(iter(stamps))
    victim.unlink()  # as if the grader had been killed before this one finished
    p = run("grade", str(subs), "--out", str(out), "--resume")
    assert "graded 1 submission(s) of 01_attention (1 not graded before)" in p.stderr  # only the lost one
    assert (out / "grades.csv").read_text() == first
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items() if p != victim)


@pytest.mark.parametrize("args, words", [
    (["grade", "{subs}", "--out", "{out}", "--lesson", "99_nope"], "invalid choice"),
    (["grade", "{empty}", "--out", "{out}"], "no student folders"),
    (["grade", "{missing}", "--out", "{out}"], "does not exist"),
    (["grade", "{subs}", "--out", "{file}"], "not a folder"),
    (["grade", "{subs}", "--out", "{out}", "--shard", "3/3"], "--shard"),
    (["merge", "{empty}", "--out", "{out}"], "no grading results"),
    (["grade", "{subs}", "--out", "{out}", "--student", "nobody"], "no such student"),
    (["grade", "{subs}", "--out", "{out}", "--manifest", "{file}"], "cannot read the manifest"),
    (["grade", "{subs}", "--out", "{out}", "--memory", "0"], "--memory must be a positive number"),
    (["grade", "{subs}", "--out", "{subs}/results"], "overlap"),
    (["manifest", "{subs}", "--out", "{empty}"], "name a file"),
])
def test_bad_input_to_the_grader_fails_before_any_work(small_class, tmp_path, args, words):
    root, subs = small_class
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    fmt = dict(subs=subs, out=tmp_path / "out", empty=tmp_path / "empty", missing=tmp_path / "nope",
               file=tmp_path / "file")
    p = run(*[a.format(**fmt) for a in args], check=False)
    assert p.returncode == 2 and words in p.stderr.strip().splitlines()[-1], p.stderr
    assert p.stderr.startswith("usage:") or len(p.stderr.strip().splitlines()) == 1, p.stderr  # one clear line
    assert not (tmp_path / "out" / "grades.csv").exists()


def test_gradescope_results_per_student(small_class):
    root, subs = small_class
    out = root / "gradescope-run"
    run("grade", str(subs), "--out", str(out), "--gradescope", "--quiet")
    grades = read_grades(out)
    for student in {s for s, _, _ in grades}:
        data = json.loads((out / "gradescope" / student / "results.json").read_text())
        mine = [r for (s, _, _), r in grades.items() if s == student]
        assert data["score"] == sum(float(r["points"]) for r in mine)
        assert len(data["tests"]) == len(mine)
        assert {t["status"] for t in data["tests"]} <= {"passed", "failed"}
        assert all(t["max_score"] > 0 and "name" in t and "output" in t for t in data["tests"])


def test_a_cell_that_does_not_run_is_named(tmp_path):
    """A SyntaxError, or an error raised before the def, is named with its cell: not a mistake in the function."""
    release(tmp_path / "release", ["01_attention"])
    rel = nbk.read(tmp_path / "release" / "01_attention" / "01_attention.ipynb")
    solved = fill(rel, "01_attention")
    code = {nbk.grade_id(c): nbk.source(c) for c in nbk.code_cells(solved) if nbk.is_answer(c)}
    broken = {"syntax": {"softmax": code["softmax"].replace("):", ")", 1)},
              "raises-first": {"causal_mask": "raise RuntimeError('oops')\n" + code["causal_mask"]}}
    for student, replace in broken.items():
        nbk.write(fill(rel, "01_attention", replace), tmp_path / "subs" / student / "01_attention" / "01_attention.ipynb")
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--quiet")
    grades = read_grades(tmp_path / "results")
    syntax = grades["syntax", "01_attention", "test_softmax"]["message"]
    assert "did not run" in syntax and "SyntaxError" in syntax and "def softmax" in syntax, syntax
    first = grades["raises-first", "01_attention", "test_causal_mask"]["message"]
    assert "did not run" in first and "RuntimeError" in first, first
    assert grades["syntax", "01_attention", "test_causal_mask"]["status"] == "passed"
