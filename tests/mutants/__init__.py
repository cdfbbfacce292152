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
