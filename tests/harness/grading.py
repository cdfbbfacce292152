"""The real grader, `python -m autograder grade`, on one lesson's class of real submissions (the importing
tests/lessons/test_<module>.py's): round trip, every mutant the grader must see, correct variants, feedback pages."""

import csv
import subprocess
import sys

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import LESSONS, fill, graded_names

__all__ = [
    "graded_class",
    "test_grades_csv_is_complete",
    "test_round_trip_full_marks_and_blank_zero",
    "test_each_mutant_loses_points_on_its_own_function_only",
    "test_feedback_pages_show_no_hidden_code",
]


def run(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True, timeout=1200)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def read_grades(results):
    with open(results / "grades.csv", newline="") as f:
        return {(r["student"], r["lesson"], r["test"]): r for r in csv.DictReader(f)}


def build_class(root, lessons, with_mutants=True):
    """SUBMISSIONS with, per lesson, a solved and a blank student, and students who each answer a few names with a
    mutant that the real grader must see (tests.harness.mutants.graded_by_the_grader: test_checks judges all of them
    in-process) or a correct variant, packed by pack(). Returns {student: (lesson, expectation)}: "full", "zero", or
    {name: (what, keyword)} of the student's mutants (the names it answers otherwise keep their marks)."""
    release(root / "release", lessons)
    subs, who = root / "submissions", {}
    for lesson in lessons:
        rel = nbk.read(root / "release" / lesson / f"{lesson}.ipynb")
        entries = [(f"solved-{lesson}", fill(rel, lesson), "full"), (f"blank-{lesson}", rel, "zero")]
        module = mutants.for_lesson(lesson) if with_mutants else None
        mistaken = [
            (name, code, (what, keyword))
            for name, ms in (module.MUTANTS.items() if module else [])
            for i, (what, keyword, code) in enumerate(ms)
            if mutants.graded_by_the_grader(lesson, name, i, ms[i])
        ]
        correct = [(name, code, None) for name, vs in (module.VARIANTS.items() if module else []) for _, code in vs]
        # apart: whatever a correct variant's calls leave behind must show on the other names, which all keep marks
        for k, group in enumerate(pack(lesson, mistaken) + pack(lesson, correct)):
            expect = {name: mistake for name, _, mistake in group if mistake} or "full"
            entries.append((f"pack-{lesson}-{k}", fill(rel, lesson, {name: code for name, code, _ in group}), expect))
        for student, nb, expect in entries:
            nbk.write(nb, subs / student / lesson / f"{lesson}.ipynb")
            who[student] = (lesson, expect)
    return subs, who


def pack(lesson, items):
    """items [(graded name, answer cell code, (what, keyword) of a mutant or None for a correct variant)] in as few
    groups as one notebook can grade apart: one answer per name, and none that another's check can see
    (tests.harness.checks.seen_by: a cell running more than definitions is seen by all). A mutant that may cost
    other names (ALSO_LOSES) is graded alone. Each group costs a notebook's grading (3 s of CPU in lesson 09)."""
    from tests.harness.checks import seen_by  # the lesson's cells, run in this process to follow what checks read

    groups = []  # [(items, their names, the names whose checks see them)]
    for item in items:
        name, code, mistake = item
        also = mistake and mutants.also_loses(lesson, mistake[0])
        seen = set(graded_names(lesson)) if also else seen_by(lesson, name, code)
        for members, names, sees in groups:
            if name not in names | sees and not seen & names:
                members.append(item)
                names.add(name)
                sees |= seen
                break
        else:
            groups.append(([item], {name}, seen))
    return [members for members, _, _ in groups]


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, request):
    """The importing file's lesson's class, graded for every lesson of the course (the others are missing)."""
    root = tmp_path_factory.mktemp("class")
    subs, who = build_class(root, [request.module.LESSON])
    run("grade", str(subs), "--out", str(root / "results"), "--all-lessons", "--jobs", "2", "--quiet")
    return who, read_grades(root / "results"), root


@pytest.mark.slow
def test_grades_csv_is_complete(graded_class):
    who, grades, _ = graded_class
    expected = {
        (s, lesson, t)
        for s in who
        for lesson in LESSONS
        for t, _ in nbk.graded_tests(nbk.read(nbk.lesson_path(lesson)))
    }
    assert set(grades) == expected
    for (student, lesson, _), row in grades.items():
        if lesson != who[student][0]:
            assert row["status"] == "missing" and row["points"] == "0"


@pytest.mark.slow
def test_round_trip_full_marks_and_blank_zero(graded_class):
    who, grades, _ = graded_class
    for (student, lesson, test), row in grades.items():
        if lesson != who[student][0]:
            continue
        kind = who[student][1]
        if kind == "full":
            assert (row["status"], row["points"]) == ("passed", row["max_points"]), (student, test, row["message"])
        elif kind == "zero":
            assert row["status"] == "failed" and row["points"] == "0", (student, test)
            assert "not implemented" in row["message"]


@pytest.mark.slow
def test_each_mutant_loses_points_on_its_own_function_only(graded_class):
    who, grades, _ = graded_class
    caught = 0
    for (student, lesson, test), row in grades.items():
        expect = who[student][1]
        if lesson != who[student][0] or not isinstance(expect, dict):
            continue
        name = test.removeprefix("test_")
        if name in expect:  # partial credit may keep the share of aspects it gets right
            what, keyword = expect[name]
            assert row["status"] == "failed" and float(row["points"]) < float(row["max_points"]), (student, what, row)
            assert keyword.lower() in row["message"].lower(), (student, what, row["message"])
            caught += 1
        elif not any(name in mutants.also_loses(lesson, what) for what, _ in expect.values()):
            assert row["status"] == "passed", (student, sorted(w for w, _ in expect.values()), test, row["message"])
    assert caught == sum(len(expect) for _, expect in who.values() if isinstance(expect, dict))


@pytest.mark.slow
def test_feedback_pages_show_no_hidden_code(graded_class):
    who, _, root = graded_class
    pages = list((root / "results" / "feedback").glob("*/*.html"))
    assert len(pages) == len(who) * len(LESSONS)
    for page in pages:
        text = page.read_text()
        assert "verify(" not in text and "BEGIN HIDDEN" not in text and "import solutions" not in text
