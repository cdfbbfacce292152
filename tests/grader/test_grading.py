"""The real grader, `python -m autograder grade`, on lesson 01's class: parallel against serial, shards and merge,
resume, bad input, Gradescope's results; each lesson's whole class (round trip, every mutant, correct variants) is
graded in its own file (tests/harness/grading.py)."""

import json
import shutil
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness.grading import build_class, read_grades, run
from tests.harness.lessons import LESSONS, fill

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_class(tmp_path_factory):
    """Lesson 01's class, graded once serially into root/serial: the run the others are compared with, and the
    folder the resume test starts from (a plain run of the same class writes the same results)."""
    root = tmp_path_factory.mktemp("small")
    subs, who = build_class(root, LESSONS[:1])
    run("grade", str(subs), "--out", str(root / "serial"), "--jobs", "1", "--quiet")
    return root, subs


@pytest.fixture(scope="module")
def parallel(small_class):
    """The same class graded by two processes, with Gradescope's results too (--gradescope only adds files):
    the folder."""
    root, subs = small_class
    run("grade", str(subs), "--out", str(root / "parallel"), "--jobs", "2", "--gradescope", "--quiet")
    return root / "parallel"


def test_parallel_equals_serial_and_shards_merge_to_one_run(small_class, parallel):
    root, subs = small_class
    for i in range(3):
        run("grade", str(subs), "--out", str(root / f"shard{i}"), "--shard", f"{i}/3", "--quiet")
    run("merge", *[str(root / f"shard{i}") for i in range(3)], "--out", str(root / "merged"))
    serial = (root / "serial" / "grades.csv").read_text()
    assert (parallel / "grades.csv").read_text() == serial
    assert (root / "merged" / "grades.csv").read_text() == serial
    assert len((root / "shard0" / "grades.csv").read_text().splitlines()) < len(serial.splitlines())


def test_resume_skips_finished_work_and_is_idempotent(small_class):
    root, subs = small_class
    out = root / "resume"
    shutil.copytree(root / "serial", out)  # a finished run, with its index: still valid where it is copied
    first = (out / "grades.csv").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / ".results").glob("*/*.json")}
    victim = next(iter(stamps))
    victim.unlink()  # as if the grader had been killed before this one finished
    p = run("grade", str(subs), "--out", str(out), "--resume")
    assert "graded 1 submission(s) of 01_attention (1 not graded before)" in p.stderr  # only the lost one
    assert (out / "grades.csv").read_text() == first
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items() if p != victim)


@pytest.mark.parametrize(
    "args, words",
    [
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
    ],
)
def test_bad_input_to_the_grader_fails_before_any_work(small_class, tmp_path, args, words):
    root, subs = small_class
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    fmt = dict(
        subs=subs, out=tmp_path / "out", empty=tmp_path / "empty", missing=tmp_path / "nope", file=tmp_path / "file"
    )
    p = run(*[a.format(**fmt) for a in args], check=False)
    assert p.returncode == 2 and words in p.stderr.strip().splitlines()[-1], p.stderr
    assert p.stderr.startswith("usage:") or len(p.stderr.strip().splitlines()) == 1, p.stderr  # one clear line
    assert not (tmp_path / "out" / "grades.csv").exists()


def test_gradescope_results_per_student(parallel):
    grades = read_grades(parallel)
    for student in {s for s, _, _ in grades}:
        data = json.loads((parallel / "gradescope" / student / "results.json").read_text())
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
    broken = {
        "syntax": {"softmax": code["softmax"].replace("):", ")", 1)},
        "raises-first": {"causal_mask": "raise RuntimeError('oops')\n" + code["causal_mask"]},
    }
    for student, replace in broken.items():
        nbk.write(
            fill(rel, "01_attention", replace), tmp_path / "subs" / student / "01_attention" / "01_attention.ipynb"
        )
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--quiet")
    grades = read_grades(tmp_path / "results")
    syntax = grades["syntax", "01_attention", "test_softmax"]["message"]
    assert "did not run" in syntax and "SyntaxError" in syntax and "def softmax" in syntax, syntax
    first = grades["raises-first", "01_attention", "test_causal_mask"]["message"]
    assert "did not run" in first and "RuntimeError" in first, first
    assert grades["syntax", "01_attention", "test_causal_mask"]["status"] == "passed"


CLASS = Path(__file__).parent / "data" / "class-526e3a5"


def test_a_class_grades_as_it_did_before_the_per_lesson_layout(tmp_path):
    """tests/grader/data/class-526e3a5: eight submissions of lesson 01 (solved, blank, mutants that keep partial
    credit, a correct variant) and the grades.csv, totals.csv and feedback pages that main wrote for them at 526e3a5,
    the commit before the per-lesson layout (issue 34), where two runs agreed byte for byte. Grading them now writes
    the same files. A change meant to alter a verdict or its words changes them: write RESULTS again (`grade
    SUBMISSIONS --out RESULTS`, keep grades.csv and totals.csv in expected/,
    the pages' texts in expected/feedback.json) and say so in the commit."""
    shutil.copytree(CLASS / "SUBMISSIONS", tmp_path / "SUBMISSIONS")
    run("grade", str(tmp_path / "SUBMISSIONS"), "--out", str(tmp_path / "RESULTS"), "--quiet")
    # CLASS/expected holds what RESULTS held: grades.csv and totals.csv as files, the feedback pages as the texts of
    # feedback.json, keyed by their paths under RESULTS, so that no tool takes them for grading output
    pages = json.loads((CLASS / "expected" / "feedback.json").read_text(encoding="utf-8"))
    kept = {
        Path(name): (CLASS / "expected" / name).read_text(encoding="utf-8") for name in ("grades.csv", "totals.csv")
    }
    kept |= {Path(rel): text for rel, text in pages.items()}
    written = sorted(p.relative_to(tmp_path / "RESULTS") for p in (tmp_path / "RESULTS" / "feedback").rglob("*"))
    assert [p for p in written if (tmp_path / "RESULTS" / p).is_file()] == sorted(
        p for p in kept if "feedback" in p.parts
    )
    for rel, text in kept.items():
        assert (tmp_path / "RESULTS" / rel).read_text(encoding="utf-8") == text, (
            f"{rel} differs from what main wrote at 526e3a5"
        )
