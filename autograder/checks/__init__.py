"""Hidden-test checks, one module per lesson, named after its solutions module.

A check draws inputs, runs the student's code through a Subject and compares the result with
solutions/ in this process. It raises AssertionError with a message that names the likely
mistake, never the hidden inputs, expected values or code. The same check runs two ways:

- in the notebook, as a hidden test (plain nbgrader):  verify("01_attention", "softmax", globals())
- in the grader, against code in a sandbox (RemoteSubject in autograder.grade).

A check sees only plain data (numpy arrays in wire.Array, numbers, handles), whichever way it runs.
"""
import contextlib
import importlib
import json
import warnings
import zlib

import numpy as np
import torch

from autograder.sandbox import wire
from autograder.sandbox.server import ObjectServer
from autograder.sandbox.wire import Array, Handle

LESSONS = {
    "01_attention": "attention",
    "02_heads": "heads",
    "03_multi_head": "multi_head",
    "04_gqa": "gqa",
    "05_kv_cache": "kv_cache",
    "06_gpu": "gpu",
    "07_head_specialization": "head_specialization",
}


def checks_for(lesson):
    """{graded name: Check} of a lesson."""
    if lesson not in LESSONS:
        raise ValueError(f"unknown lesson {lesson!r}; lessons are {', '.join(LESSONS)}")
    return importlib.import_module(f"autograder.checks.{LESSONS[lesson]}").CHECKS


class Check:
    """One graded name's check. isolate: names of the student's other answers that this
    function may call (softmax inside attention, ...); during the check they are replaced by
    correct versions from autograder.sandbox.helpers, so one mistake costs one function's points."""

    def __init__(self, name, fn, isolate=()):
        self.name, self.fn, self.isolate = name, fn, tuple(isolate)

    def __call__(self, subject):
        """Run against a Subject; an exception from the student's code becomes a teaching AssertionError."""
        try:
            if self.isolate:
                subject.isolate(self.isolate)
            try:
                self.fn(subject)
            finally:
                if self.isolate:
                    subject.restore()
        except StudentError as e:
            raise AssertionError(f"your code raised {e.type}: {e.message}") from None


class Checks(dict):
    """A lesson's checks by graded name. In a checks module:
        CHECKS = Checks()
        @CHECKS.add("softmax")
        def softmax(s): ..."""

    def add(self, name, isolate=()):
        def register(fn):
            self[name] = Check(name, fn, isolate)
            return fn
        return register


class Unchecked(Exception):
    """The student's code could not be checked: it hung or ended its process (grader only)."""


UNCHECKED = ("Timeout", "ProcessEnded")
NOT_IMPLEMENTED = "not implemented yet: replace `raise NotImplementedError()` with your code"


class StudentError(Exception):
    """The student's code raised: type name, its class names (mro) and message."""

    def __init__(self, type, mro, message):
        super().__init__(f"{type}: {message}")
        self.type, self.mro, self.message = type, tuple(mro), message

    def is_a(self, name):
        return name in self.mro


class Subject:
    """The student's code, reached through a transport (request -> reply, both plain data)."""

    def __init__(self, transport, seed_text=""):
        self._transport = transport
        self.rng = np.random.default_rng(zlib.crc32(seed_text.encode()))

    def _request(self, request):
        reply = self._transport(request)
        if "error" in reply:
            e = reply["error"]
            error = StudentError(str(e.get("type")), [str(m) for m in e.get("mro", [])], str(e.get("message", "")))
            # These two end the check whatever it catches: the code could not be run, or is not written yet.
            if error.type in UNCHECKED:
                raise Unchecked(error.message)
            if error.is_a("NotImplementedError"):
                raise AssertionError(NOT_IMPLEMENTED)
            raise error
        return wire.decode(reply["ok"])

    def call(self, target, *args, **kwargs):
        """target: a name the notebook defines, a Handle, or (Handle, method name)."""
        return self._request({"op": "call", "target": _target(target),
                              "args": [wire.encode_plain(a) for a in args],
                              "kwargs": {k: wire.encode_plain(v) for k, v in kwargs.items()}})

    def call_traced(self, target, *args, **kwargs):
        """(result, ops): call(), plus every tensor op the call ran, as [name, first input's shape,
        [floating outputs' shapes]] (see sandbox.server.OpLog)."""
        result, ops = self._request({"op": "call", "trace": True, "target": _target(target),
                                     "args": [wire.encode_plain(a) for a in args],
                                     "kwargs": {k: wire.encode_plain(v) for k, v in kwargs.items()}})
        return result, ops

    def helper(self, name, *args, **kwargs):
        """Build one of autograder.sandbox.helpers next to the student's code; returns a Handle."""
        return self.call({"helper": name}, *args, **kwargs)

    def get(self, handle, name):
        return self._request({"op": "getattr", "handle": handle.id, "name": name})

    def state(self, handle):
        """A module's state_dict as {name: Array}."""
        return self._request({"op": "state", "handle": handle.id})

    def load(self, handle, state):
        """load_state_dict(strict=True) with {name: numpy array}, sent as tensors."""
        return self._request({"op": "load", "handle": handle.id,
                              "state": {k: wire.encode_plain(tensor(v)) for k, v in state.items()}})

    def has(self, name):
        return self._request({"op": "has", "name": name})

    def isolate(self, names):
        """Until restore(), the notebook's `names` are correct helpers (Check.isolate)."""
        return self._request({"op": "isolate", "names": list(names)})

    def restore(self):
        return self._request({"op": "restore"})


def _target(t):
    if isinstance(t, str):
        return {"name": t}
    if isinstance(t, Handle):
        return {"handle": t.id}
    if isinstance(t, tuple):
        return {"handle": t[0].id, "method": t[1]}
    return t  # {"helper": name}


class LocalSubject(Subject):
    """The student's code in this process (hidden tests run in the notebook). Requests and
    replies still go through JSON, so a check sees exactly what it would see in the grader."""

    def __init__(self, namespace, seed_text=""):
        server = ObjectServer(namespace)
        super().__init__(lambda req: json.loads(wire.dumps(server.handle(json.loads(wire.dumps(req))))), seed_text)


def verify(lesson, name, namespace):
    """The hidden test of one graded name, run against the notebook's own namespace."""
    check = checks_for(lesson)[name]
    # nbgrader zeroes a cell that writes to stderr, so warnings from the student's code while
    # it is being checked must not reach it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(LocalSubject(namespace, f"{lesson}/{name}"))


# ---- inputs -------------------------------------------------------------------------------

def as_torch(array):
    """A numpy array as a torch tensor, for computing references here."""
    return torch.from_numpy(np.ascontiguousarray(array))


def call_named(s, what, *args, hint="", **kwargs):
    """s.call(*args, **kwargs); when the student's code raises, the failure names the call `what`."""
    try:
        return s.call(*args, **kwargs)
    except StudentError as e:
        fail(f"{what} raised {e.type}: {e.message}" + (f" ({hint})" if hint else ""))


def tensor(array, dtype=None):
    """A numpy array to send as a torch tensor; dtype 'bfloat16' is allowed."""
    array = np.asarray(array)
    return Array("tensor", dtype or array.dtype.name, array.astype(np.float32) if dtype == "bfloat16" else array)


def reference(value):
    """A solutions/ result (tensors, arrays, tuples, numbers) as the plain data a check compares with."""
    return wire.decode(ObjectServer({})._encode(value, [0]))


# ---- verdicts ------------------------------------------------------------------------------

TOLERANCE = {"float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (1e-2, 2e-3), "bfloat16": (5e-2, 2e-2)}


def fail(message):
    raise AssertionError(message)


def kind_of(value):
    """How a value is named in feedback."""
    if isinstance(value, Array):
        return {"tensor": "a torch.Tensor", "ndarray": "a numpy array", "npscalar": "a numpy scalar"}[value.kind]
    if isinstance(value, Handle):
        return f"a {value.type}"
    return "None" if value is None else f"a {type(value).__name__}"


def dtype_ok(got, want, upcast_ok=False):
    """got's dtype is want's, or (upcast_ok) float64 where want is float32: numpy promotes
    float32 / np.sqrt(d) to float64, a harmless widening in the numpy lesson."""
    return got.dtype == want.dtype or (upcast_ok and (got.dtype, want.dtype) == ("float64", "float32"))


def close(got, want, rtol=None, atol=None, upcast_ok=False):
    """Same kind, dtype, shape, and values within the dtype's tolerance (NaN equal to NaN)."""
    if not (isinstance(got, Array) and got.kind == want.kind and dtype_ok(got, want, upcast_ok)
            and got.shape == want.shape):
        return False
    if want.data.dtype.kind in "biu":
        return bool(np.array_equal(got.data, want.data))
    r, a = TOLERANCE.get(want.dtype, (1e-5, 1e-6))
    return bool(np.allclose(got.data, want.data, rtol=rtol or r, atol=atol or a, equal_nan=True))


def expect_array(got, want, what, mistakes=(), nan_hint="", hint="", rtol=None, atol=None, upcast_ok=False):
    """Check a returned array against the reference `want` (an Array from reference()).

    mistakes: [(message, Array)] of what known mistakes would return on the same inputs, or a
    function returning them (called only when the result is wrong); a match fails with that
    message. Then kind, dtype, shape, device, NaN and values.
    """
    if callable(mistakes):
        mistakes = [] if close(got, want, rtol, atol, upcast_ok) else mistakes()
    for message, wrong in mistakes:
        if close(got, wrong, rtol, atol, upcast_ok) and not close(got, want, rtol, atol, upcast_ok):
            fail(f"{what}: {message}")
    if not isinstance(got, Array) or got.kind != want.kind:
        fail(f"{what} should be {kind_of(want)}, but it is {kind_of(got)}")
    if got.subclass:
        fail(f"{what} should be a plain {kind_of(want)[2:]}, not a subclass ({got.subclass})")
    if not dtype_ok(got, want, upcast_ok):
        fail(f"{what} has dtype {got.dtype}, but should have {want.dtype}: keep the inputs' dtype")
    if got.shape != want.shape:
        fail(f"{what} has shape {got.shape}, but should have shape {want.shape}")
    if got.kind == "tensor" and got.device != want.device:
        fail(f"{what} is on {got.device}, but the inputs were on {want.device}")
    if want.data.dtype.kind == "f":
        bad = ~np.isfinite(got.data) & np.isfinite(want.data)
        if bad.any():
            fail(f"{what} contains NaN or inf where the correct result is finite" + (f": {nan_hint}" if nan_hint else ""))
    if not close(got, want, rtol, atol, upcast_ok):
        fail(f"{what} differs from the correct result" + (f": {hint}" if hint else ""))


def expect_int(got, want, what, mistakes=()):
    """A Python int equal to want; mistakes: [(message, wrong int)]."""
    for message, wrong in mistakes:
        if got == wrong and got != want and type(got) is int:
            fail(f"{what}: {message}")
    if type(got) is not int:
        fail(f"{what} should be a Python int, but it is {kind_of(got)}")
    if got != want:
        fail(f"{what} is not the right count")


def expect_int_attributes(s, handle, rules, what):
    """Each attribute of the student's object must be the right Python int.
    rules: {name: (value, how it is computed, e.g. "d_model // n_heads")}."""
    for name, (want, rule) in rules.items():
        try:
            got = s.get(handle, name)
        except StudentError:
            fail(f"{what} has no attribute `{name}`: set self.{name} = {rule} in __init__")
        if type(got) is not int:
            fail(f"{what}.{name} should be the int {rule}, but it is {kind_of(got)}")
        if got != want:
            fail(f"{what}.{name} should be {rule}")


def expect_pair(got, what):
    """A result that must be a pair (out, weights); returns it."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} should return a pair (out, weights), but returned {kind_of(got)}"
             + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""))
    return got


@contextlib.contextmanager
def expect_error(error, what):
    """with expect_error("ValueError", "split_heads with D % H != 0"): s.call(...)"""
    try:
        yield
    except StudentError as e:
        if not e.is_a(error):
            fail(f"{what} should raise {error}, but raised {e.type}")
        return
    fail(f"{what} should raise {error}, but returned normally")
