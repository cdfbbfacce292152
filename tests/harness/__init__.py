"""What the tests of every lesson share. The generic per-lesson tests live in this package's modules (checks,
visible, honest, notebooks); each tests/lessons/test_<module>.py names its lesson (LESSON = "06_gpu") and imports
them, and tests/lessons/conftest.py gives each the cases of that lesson only (`each`)."""

import pytest


def each(argnames, cases):
    """Mark a generic test to run once per case of the importing file's lesson: cases(lesson) -> [pytest.param or
    value]. A lesson with no case has no such test (tests/lessons/conftest.py)."""
    return pytest.mark.each(argnames, cases)


def one_lesson(lesson):
    """The cases of a test that runs once per lesson."""
    return [lesson]
