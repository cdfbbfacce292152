"""The known mistakes and correct variants live in the course (autograder/mistakes/NN_name.py); the tests
use them as mutants. A mutant must lose its own function's points and only those; a variant must keep
full marks."""
from autograder.mistakes import also_loses, for_lesson  # noqa: F401 - the tests' names for them


def cases(kind, lessons):
    """pytest params (lesson, name, item) of every MUTANTS or VARIANTS entry of the lessons."""
    import pytest

    out = []
    for lesson in lessons:
        module = for_lesson(lesson)
        for name, items in (getattr(module, kind, {}) if module else {}).items():
            out += [pytest.param(lesson, name, item, id=f"{lesson}-{name}-{item[0]}") for item in items]
    return out
