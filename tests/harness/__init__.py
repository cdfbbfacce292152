"""What the tests of every lesson share. The generic per-lesson tests live in this package's modules (checks,
visible, honest, notebooks); each tests/lessons/test_<module>.py names its lesson (LESSON = "06_gpu") and imports
them, and tests/lessons/conftest.py gives each the cases of that lesson only (`each`)."""

import functools
import importlib.util
from pathlib import Path

import pytest


def each(argnames, cases):
    """Mark a generic test to run once per case of the importing file's lesson: cases(lesson) -> [pytest.param or
    value]. A lesson with no case has no such test (tests/lessons/conftest.py)."""
    return pytest.mark.each(argnames, cases)


def one_lesson(lesson):
    """The cases of a test that runs once per lesson."""
    return [lesson]


@functools.lru_cache(maxsize=None)
def book_build():
    """book/build.py (`make book`), imported as a module."""
    spec = importlib.util.spec_from_file_location(
        "book_build", Path(__file__).resolve().parents[2] / "book" / "build.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
