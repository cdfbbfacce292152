"""The known mistakes and correct variants live in the course (autograder/lessons/<module>/mistakes.py); the tests
use them as mutants. A mutant must lose its own function's points and only those; a variant must keep
full marks."""

from autograder.checking import LESSONS, checks_for
from autograder.checking.mistakes import also_loses, for_lesson  # noqa: F401 - the tests' names for them

# Checks whose verdict rests on a memory bound (declared beside the check: Checks.add(..., memory_bound=True)).
# In a long pytest process, memory that earlier tests freed stays mapped in glibc's per-thread heaps, where a
# bounded block can reuse it unseen; the grader bounds a child forked from a fresh worker. Their mutants are judged
# in a fresh interpreter, as the grader does.
MEMORY_BOUND = {
    (lesson, name) for lesson in LESSONS for name, check in checks_for(lesson).items() if check.memory_bound
}


def graded_by_the_grader(lesson, name, index, mistake):
    """Whether the real-grader test (tests/harness/grading.py) grades this mutant too; test_checks judges every one
    (those of MEMORY_BOUND in a fresh interpreter, as the grader does). The grader sees those whose verdict the
    sandbox may change: a cost to an aspect or to another name's points; of the rest, the first of each name and,
    for the memory-bound names, every third, stand for the pipeline."""
    return (
        bool(getattr(mistake, "aspect", ""))
        or bool(also_loses(lesson, mistake[0]))
        or index == 0
        or ((lesson, name) in MEMORY_BOUND and index % 3 == 0)
    )


def cases(kind, lessons):
    """pytest params (lesson, name, item) of every MUTANTS or VARIANTS entry of the lessons."""
    import pytest

    out = []
    for lesson in lessons:
        module = for_lesson(lesson)
        for name, items in (getattr(module, kind, {}) if module else {}).items():
            out += [pytest.param(lesson, name, item, id=f"{lesson}-{name}-{item[0]}") for item in items]
    return out
