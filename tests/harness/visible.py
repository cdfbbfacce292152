"""Visible tests teach before grading: every known-wrong answer (autograder/lessons/<module>/mistakes.py) fails its own
function's visible test in the RELEASED notebook, with a message that names the same mistake as
the hidden check (its keyword), and no other function's visible test fails (no misblame); every
correct variant passes them all.

The runs are autograder.audit's fast runs, as `python -m autograder audit LESSON` makes and prints them
as a table: a lesson runs once with the solutions, forking a child per mutant and variant just before its
answer cell, which stops where the rest of the notebook can no longer differ from the solutions' run
(tests/grader/test_audit.py holds the fast run to the exact run's verdicts).

    .venv/bin/python -m tests.harness.visible [LESSON ...]   # the audit's tables of these lessons
"""

import functools
import sys

import pytest

from autograder import audit
from autograder.checking import mistakes
from tests.harness import each, mutants, one_lesson
from tests.harness.lessons import LESSONS

MAX_HIDDEN_ONLY = mistakes.MAX_HIDDEN_ONLY  # the share of a lesson's mutants that only the hidden checks may catch


@functools.lru_cache(maxsize=None)
def run_lesson(lesson):
    """{(name, what): {visible test grade_id: failure message}} for every mutant and variant (autograder.audit)."""
    return audit.run_lesson(lesson, fast=True)


def _cases(kind):
    return lambda lesson: mutants.cases(kind, [lesson])


def _hidden_only(lesson):
    return getattr(mutants.for_lesson(lesson), "HIDDEN_ONLY", {})


def verdict(lesson, name, mutant):
    """(caught, own message, misblamed, failures): caught when the own visible test fails naming the keyword."""
    caught, own, misblamed = audit.verdict(run_lesson(lesson), name, mistakes.Mistake(*mutant))
    return caught, own, misblamed, run_lesson(lesson)[name, mutant[0]]


__all__ = [
    "test_solutions_pass_every_visible_test",
    "test_mutant_fails_its_own_visible_test_naming_the_mistake",
    "test_few_mutants_are_hidden_only",
    "test_correct_variant_passes_every_visible_test",
]


@pytest.mark.slow
@each("lesson", one_lesson)
def test_solutions_pass_every_visible_test(lesson):
    assert run_lesson(lesson)["<solutions>", ""] == {}


@pytest.mark.slow
@each("lesson, name, mutant", _cases("MUTANTS"))
def test_mutant_fails_its_own_visible_test_naming_the_mistake(lesson, name, mutant):
    caught, own, misblamed, failures = verdict(lesson, name, mutant)
    assert not misblamed, f"'{mutant[0]}' in {name} makes other visible tests fail: {failures}"
    if mutant[0] in _hidden_only(lesson):
        return
    assert own, f"'{mutant[0]}' passes the visible test of {name}"
    assert caught, f"the visible test of {name} fails for '{mutant[0]}' without naming {mutant[1]!r}: {own}"


@pytest.mark.slow
@each("lesson", one_lesson)
def test_few_mutants_are_hidden_only(lesson):
    module = mutants.for_lesson(lesson)
    total = sum(len(v) for v in module.MUTANTS.values())
    known = {m[0] for ms in module.MUTANTS.values() for m in ms}
    hidden = _hidden_only(lesson)
    assert set(hidden) <= known, f"HIDDEN_ONLY names unknown mutants: {set(hidden) - known}"
    assert all(isinstance(why, str) and why.strip() for why in hidden.values()), "each needs a one-line reason"
    assert len(hidden) <= MAX_HIDDEN_ONLY * total, f"{len(hidden)} of {total} mutants are hidden-only (max 5%)"


@pytest.mark.slow
@each("lesson, name, variant", _cases("VARIANTS"))
def test_correct_variant_passes_every_visible_test(lesson, name, variant):
    assert run_lesson(lesson)[name, variant[0]] == {}


def summary(lessons):
    for lesson in lessons:
        print("\n".join(audit.table(lesson, audit.run_lesson(lesson, hidden=True))))


if __name__ == "__main__":
    summary(sys.argv[1:] or LESSONS)
