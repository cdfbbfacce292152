"""One file per lesson: tests/lessons/test_<module>.py sets LESSON = "NN_name" and imports the generic tests of
tests/harness/, which are parametrized here with that lesson's cases, so that the file is the whole slice of one
lesson (`pytest tests/lessons/test_gpu.py`, `-k 06_gpu`) and xdist's loadfile shares the lessons between workers."""

import pytest


def _each(obj):
    """The `each` mark (tests.harness.each) of a generic test: (argnames, cases), or None."""
    marks = [m for m in getattr(obj, "pytestmark", []) if m.name == "each"]
    return marks[0].args if marks else None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """A generic test with no case in this lesson is not one of its tests (not even a skipped one)."""
    each = _each(obj) if callable(obj) and name.startswith("test_") else None
    if each and not list(each[1](collector.module.LESSON)):
        return []
    return None


def pytest_generate_tests(metafunc):
    each = _each(metafunc.function)
    if each:
        argnames, cases = each
        metafunc.parametrize(argnames, list(cases(metafunc.module.LESSON)))


def pytest_collection_modifyitems(items):
    """Every test of a lesson's file answers to -k with the lesson's id (06_gpu), its module's name aside (gpu)."""
    for item in items:
        lesson = getattr(getattr(item, "module", None), "LESSON", None)
        if isinstance(lesson, str):
            item.extra_keyword_matches.add(lesson)
