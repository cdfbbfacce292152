"""The registry of hidden checks: each lesson's autograder/lessons/<module>/checks.py fills a Checks, and
verify() runs one of them against a notebook's namespace (the hidden test's one line)."""

import importlib
import inspect
import warnings

from autograder import lessons
from autograder.checking.subject import LocalSubject, StudentError

LESSONS = lessons.solutions_modules()  # {lesson: its solutions module and grader package}, from lessons/*/lesson.toml


def checks_for(lesson):
    """{graded name: Check} of a lesson, each with what its manifest forbids it ([forbids], Check.forbid)."""
    if lesson not in LESSONS:
        raise ValueError(f"unknown lesson {lesson!r}; lessons are {', '.join(LESSONS)}")
    checks = importlib.import_module(f"autograder.lessons.{LESSONS[lesson]}.checks").CHECKS
    for name, rule in lessons.forbids(lesson).items():
        checks[name].forbid = rule
    return checks


class Check:
    """One graded name's check. isolate: names of the student's other answers that this
    function may call (softmax inside attention, ...); during the check they are replaced by
    correct versions from autograder.sandbox.helpers, so one mistake costs one function's points.

    aspects: {aspect: weight} for partial credit, declared once here; the first is the core.
    The check body tests each inside `with s.aspect(name):`. Every other aspect is earned only
    when the core passes, so stubs and constant answers score nothing.

    memory_bound: its verdict rests on a memory bound (Subject.memory_bound). In a long process, memory
    that earlier work freed stays mapped where a bounded block can reuse it unseen, so the tests judge
    its mistakes in a fresh interpreter, as the grader does (a child forked from a fresh worker)."""

    def __init__(self, name, fn, isolate=(), aspects=None, memory_bound=False):
        self.name, self.fn, self.isolate = name, fn, tuple(isolate)
        self.aspects = dict(aspects or {})
        self.memory_bound = memory_bound
        self.forbid = None  # {"aspect", "paths", "instead"}: the lesson's manifest ([forbids], checks_for)

    def __call__(self, subject):
        """Run against a Subject; an exception from the student's code becomes a teaching AssertionError."""
        for _ in self.steps(subject):
            pass

    def steps(self, subject):
        """The check, run part by part: a generator that yields, between parts, the label of the process the next part
        needs (Subject.next_process), and raises as __call__ does. A check written as a generator yields those labels
        itself, between blocks, so that the grader may run other checks' parts before its next one and the parts of
        several checks that need the same process in one (grade.run_checks); a plain function is one part."""
        if self.forbid and self.forbid["aspect"] not in self.aspects:  # a bug of ours: never grade it unenforced
            raise RuntimeError(f"{self.name} forbids paths in an aspect it does not have: {self.forbid['aspect']}")
        record = subject._aspects = _Aspects(self.aspects, self.name, self.forbid) if self.aspects else None
        try:
            if self.isolate:
                subject.isolate(self.isolate)
            try:
                parts = self.fn(subject)
                for label in parts if inspect.isgenerator(parts) else ():
                    subject.pause()
                    yield label
            finally:
                if self.isolate:
                    subject.restore()
        except StudentError as e:
            raise AssertionError(f"your code raised {e.type}: {e.message}") from None
        finally:
            subject._aspects = None
        if record:
            record.verdict(self.name)


class PartialCredit(AssertionError):
    """Some aspects of a check failed, the core passed: earned of total weight.
    rows: [{"aspect", "weight", "passed", "message"}]; str() is the failing aspects' messages."""

    def __init__(self, earned, total, rows):
        # One slip can fail several aspects with the same words: say them once.
        super().__init__("\n".join(dict.fromkeys(r["message"] for r in rows if not r["passed"])))
        self.earned, self.total, self.rows = earned, total, rows


class _Aspects:
    """What each declared aspect of one check run gave: None (not tested yet), or a failure message."""

    def __init__(self, weights, name="", forbid=None):
        self.weights, self.core = weights, next(iter(weights))
        self.tested, self.failed = set(), {}
        self.name, self.forbid = name, forbid
        self.forbidden_calls = 0  # calls made with the forbidden paths off

    def verdict(self, name):
        untested = [a for a in self.weights if a not in self.tested]
        if untested:  # a bug of ours: never give an aspect's share untested
            raise RuntimeError(f"the check of {name} never tested {', '.join(untested)}")
        if self.forbid and not self.forbidden_calls and self.forbid["aspect"] not in self.failed:  # nor one whose
            # forbidden paths were never off (unless that aspect failed first: a process over its memory bound)
            raise RuntimeError(f"the check of {name} called nothing with {', '.join(self.forbid['paths'])} off")
        if self.failed:
            rows = [
                dict(aspect=a, weight=w, passed=a not in self.failed, message=self.failed.get(a, ""))
                for a, w in self.weights.items()
            ]
            earned = sum(r["weight"] for r in rows if r["passed"])
            raise PartialCredit(earned, sum(self.weights.values()), rows)


class Checks(dict):
    """A lesson's checks by graded name. In a checks module:
    CHECKS = Checks()
    @CHECKS.add("softmax")
    def softmax(s): ..."""

    def add(self, name, isolate=(), aspects=None, memory_bound=False):
        def register(fn):
            self[name] = Check(name, fn, isolate, aspects, memory_bound)
            return fn

        return register


def verify(lesson, name, namespace):
    """The hidden test of one graded name, run against the notebook's own namespace."""
    check = checks_for(lesson)[name]
    # nbgrader zeroes a cell that writes to stderr, so warnings from the student's code while
    # it is being checked must not reach it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(LocalSubject(namespace, f"{lesson}/{name}"))
