"""The known mistakes of each lesson, defined once: one module per lesson, autograder/lessons/<module>/mistakes.py.

A module holds
    MUTANTS = {graded name: [Mistake(what, keyword, code, message=..., aspect=...) or (what, keyword, code)]}
    VARIANTS = {graded name: [(how it differs, code)]}            # correct alternatives: full marks
    HIDDEN_ONLY = {what: why}   # mistakes the visible tests may leave to the hidden checks (at most 5%)
    ALSO_LOSES = {what: {other graded name: why}}   # other names a mistake may cost (memory the cells keep)

code is the answer cell's source: the function (or class) a student who makes that mistake writes.
keyword is a word the feedback must contain; message, where given, is what the check says when it
recognises the mistake, and aspect the aspect it costs. A check recognises such a mistake by running
the definition on its own inputs (`defined`), so the mutant the tests run and the formula the check
compares with are one text. A mistake marked evidence=True is one only evidence shows (memory under a
bound, an error it raises): its check names it with its message, and no check runs it. A mistake whose code
is too slow to run in the grader (a Triton kernel, which a CPU runs only in Triton's interpreter) carries a
model: the source of a plain torch function of the same name that returns what the code returns. The check
runs the model, the tests run the code as a mutant, and tests/harness/checks.py holds the two equal on the
check's own inputs (its module's MODEL_INPUTS).

Grader-side only, like solutions/ and the checks: autograder/sandbox/ never imports it, and messages
never name hidden inputs or expected values.
"""

import copy
import functools
import importlib
import warnings
from pathlib import Path

import numpy as np

from autograder.checking.comparators import reference
from autograder.checking.registry import LESSONS

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"  # the grader's lesson packages


class Mistake(tuple):
    """(what, keyword, code), a plain triple for the tests that unpack it, with message and aspect, and
    evidence: only evidence shows it (its check reads the message; `defined` leaves it out); model: what
    `defined` runs in place of a code too slow for the grader (a Triton kernel), as source."""

    def __new__(cls, what, keyword, code, message="", aspect="", evidence=False, model=""):
        assert not (evidence and model), "a mistake only evidence shows is never run: it needs no model"
        self = super().__new__(cls, (what, keyword, code))
        self.message, self.aspect, self.evidence, self.model = message, aspect, evidence, model
        return self

    what, keyword, code = (property(lambda self, i=i: self[i]) for i in range(3))


def edited(code, *replacements):
    """code with each (old, new) text replacement made; old must occur (a mutant that changes nothing would
    silently be the correct answer). LookupError, not an AssertionError, where it does not: the grader takes an
    AssertionError for the student's failure and shows its text, while this is a bug of ours (a reformatted
    reference), an error flagged for regrading."""
    for old, new in replacements:
        if old not in code:
            raise LookupError(f"a mistake's edit no longer applies (the reference changed?): {old!r} not in its code")
        code = code.replace(old, new)
    return code


def lessons():
    """The lessons that have a mistakes module (autograder/lessons/<module>/mistakes.py), in order."""
    return [lesson for lesson, module in LESSONS.items() if (LESSONS_DIR / module / "mistakes.py").is_file()]


def for_lesson(lesson):
    """The lesson's mistakes module, or None when it has none."""
    if lesson not in lessons():
        return None
    return importlib.import_module(f"autograder.lessons.{LESSONS[lesson]}.mistakes")


def mutants(lesson):
    """{graded name: [Mistake]} of the lesson (plain triples read as Mistakes without a message)."""
    module = for_lesson(lesson)
    return {
        name: [m if isinstance(m, Mistake) else Mistake(*m) for m in items]
        for name, items in (getattr(module, "MUTANTS", {}) if module else {}).items()
    }


def variants(lesson):
    """{graded name: [(how it differs, code)]}."""
    return dict(getattr(for_lesson(lesson), "VARIANTS", {}))


MAX_HIDDEN_ONLY = 0.05  # the share of a lesson's mistakes that HIDDEN_ONLY may leave to the hidden checks


def hidden_only(lesson):
    """{what: why} of the mistakes the visible tests may leave to the hidden checks (at most MAX_HIDDEN_ONLY)."""
    return dict(getattr(for_lesson(lesson), "HIDDEN_ONLY", {}))


def also_loses(lesson, what):
    """The other graded names a mistake may cost (ALSO_LOSES): memory its cells keep counts against every
    memory bound of the lesson, as an honest notebook's would."""
    return set(getattr(for_lesson(lesson), "ALSO_LOSES", {}).get(what, {}))


@functools.lru_cache(maxsize=None)
def _compiled(lesson, name, what):
    [mistake] = [m for m in mutants(lesson)[name] if m.what == what]
    # the answer cell runs beside the reference's other names (softmax inside attention, np, torch)
    ns = dict(vars(importlib.import_module(f"solutions.{LESSONS[lesson]}")))
    exec(compile(mistake.model or mistake.code, f"<mistake {lesson}:{name}: {what}>", "exec"), ns)
    return ns[name]


def defined(lesson, name):
    """[(Mistake, its function)] of the mistakes of `name` that carry a message, evidence aside: what a check
    runs on its own inputs to recognise them (its model, where it has one). Compiled once per process, against
    the reference's other names."""
    return [(m, _compiled(lesson, name, m.what)) for m in mutants(lesson).get(name, []) if m.message and not m.evidence]


class Shadows:
    """The defined mistakes of a cache class `name` (update(k, v), len, reset), each a cache made in the grader
    with the student's arguments and given the same calls: what a student who made that mistake would get at
    each step. One that raises is not what the student wrote, and is dropped."""

    def __init__(self, lesson, name, *args, **kwargs):
        self.live = []
        for mistake, cls in defined(lesson, name):
            try:
                self.live.append((mistake, cls(*args, **kwargs)))
            except Exception:  # noqa: BLE001 - a mistake this call cannot be
                continue

    def _each(self, act):
        kept, out = [], []
        for mistake, cache in self.live:
            try:
                out.append((mistake, cache, act(cache)))
            except Exception:  # noqa: BLE001 - e.g. a full cache where the student's had room
                continue
            kept.append((mistake, cache))
        self.live = kept
        return out

    def update(self, k, v):
        """[(message, (keys, values) as Arrays, len after)] of each mistake's update(k, v) (numpy inputs)."""
        import torch

        return [
            (m.message, (reference(got[0]), reference(got[1])), len(cache))
            for m, cache, got in self._each(lambda c: c.update(torch.from_numpy(k.copy()), torch.from_numpy(v.copy())))
        ]

    def lengths(self):
        return [(m.message, n) for m, _, n in self._each(len)]

    def reset(self):
        self._each(lambda c: c.reset())


def on(lesson, name, *args, fresh=False, **kwargs):
    """[(Mistake, what it returns on these inputs)] of the defined mistakes of `name`. One that raises on
    them cannot be what the student's code did there, and is left out; its warnings are not the student's.
    fresh: each mistake gets its own deep copy of the inputs (a cache it appends to)."""
    out = []
    for mistake, fn in defined(lesson, name):
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                given, named = copy.deepcopy((args, kwargs)) if fresh else (args, kwargs)
                out.append((mistake, fn(*given, **named)))
        except Exception:  # noqa: BLE001 - e.g. a broadcast only square inputs allow
            continue
    return out


def compared(lesson, name, *args, convert=None):
    """[(message, reference)] of the defined mistakes of `name` on these inputs: the `mistakes=` list of
    expect_array. convert: what each result goes through first (a cast to the inputs' dtype)."""
    return [(m.message, reference(convert(got) if convert else got)) for m, got in on(lesson, name, *args)]
