"""The real grader, `python -m autograder grade`, on one lesson's class of real submissions (the importing
tests/lessons/test_<module>.py's): round trip, every mutant the grader must see, correct variants, feedback pages."""

import csv
import subprocess
import sys

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import LESSONS, fill

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
    """SUBMISSIONS with, per lesson, a solved and a blank student, one student per variant and per mutant that
    the real grader must see (tests.harness.mutants.graded_by_the_grader: test_checks judges all of them in-process).
    Returns {student: (lesson, name or None, expectation)}."""
    release(root / "release", lessons)
    subs, who = root / "submissions", {}
    for lesson in lessons:
        rel = nbk.read(root / "release" / lesson / f"{lesson}.ipynb")
        entries = [
            (f"solved-{lesson}", fill(rel, lesson), (lesson, None, "full")),
            (f"blank-{lesson}", rel, (lesson, None, "zero")),
        ]
        module = mutants.for_lesson(lesson) if with_mutants else None
        for name, items in module.MUTANTS.items() if module else []:
            for i, mistake in enumerate(items):
                if mutants.graded_by_the_grader(lesson, name, i, mistake):
                    _, keyword, code = mistake
                    entries.append(
                        (f"mutant-{lesson}-{name}-{i}", fill(rel, lesson, {name: code}), (lesson, name, keyword))
                    )
        for name, items in module.VARIANTS.items() if module else []:
            for i, (how, code) in enumerate(items):
                entries.append(
                    (f"variant-{lesson}-{name}-{i}", fill(rel, lesson, {name: code}), (lesson, None, "full"))
                )
        for student, nb, expect in entries:
            nbk.write(nb, subs / student / lesson / f"{lesson}.ipynb")
            who[student] = expect
    return subs, who


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_feedback_pages_show_no_hidden_code(graded_class):
    who, _, root = graded_class
    pages = list((root / "results" / "feedback").glob("*/*.html"))
    assert len(pages) == len(who) * len(LESSONS)
    for page in pages:
        text = page.read_text()
        assert "verify(" not in text and "BEGIN HIDDEN" not in text and "import solutions" not in text
