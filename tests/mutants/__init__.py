"""Known-wrong answers (MUTANTS) and correct variants (VARIANTS), one module per lesson.

MUTANTS = {graded name: [(what is wrong, a word the feedback must contain, the answer cell's code)]}
VARIANTS = {graded name: [(how it differs, the answer cell's code)]}

A mutant must lose its own function's points and only those; a variant must keep full marks.
"""
import importlib


def for_lesson(lesson):
    try:
        return importlib.import_module(f"tests.mutants.m{lesson}")
    except ModuleNotFoundError:
        return None


def cases(kind, lessons):
    """pytest params (lesson, name, item) of every MUTANTS or VARIANTS entry of the lessons."""
    import pytest

    out = []
    for lesson in lessons:
        module = for_lesson(lesson)
        for name, items in (getattr(module, kind, {}) if module else {}).items():
            out += [pytest.param(lesson, name, item, id=f"{lesson}-{name}-{item[0]}") for item in items]
    return out


def also_loses(lesson, what):
    """The other graded names a mutant may cost (its module's ALSO_LOSES = {what: {name: why}}): memory its
    cells keep counts against every memory bound of the lesson, as an honest notebook's would."""
    module = for_lesson(lesson)
    return set(getattr(module, "ALSO_LOSES", {}).get(what, {}))
