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
    (those of MEMORY_BOUND in a fresh interpreter, as the grader does). The grader sees every kind of verdict: each
    mutant that only evidence shows (memory, a tripwire: the sandbox's) or that costs another name's points (memory
    its cells keep), the first of each name, the first to cost each of its aspects, and every third of a memory-bound
    name (its verdicts pass a bound the sandbox sets). The others differ from one of those in values only, which the
    sandbox does not change, and would each cost a notebook's grading (3 s of CPU in lesson 09)."""
    aspect = getattr(mistake, "aspect", "")
    return (
        index == 0
        or getattr(mistake, "evidence", False)
        or bool(also_loses(lesson, mistake[0]))
        or (bool(aspect) and all(getattr(m, "aspect", "") != aspect for m in for_lesson(lesson).MUTANTS[name][:index]))
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
