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
import math
import re
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

from autograder import lessons
from autograder.checks.memory import LocalBound
from autograder.sandbox import wire
from autograder.sandbox.runner import HONEST_HELD_MB
from autograder.sandbox.server import ObjectServer
from autograder.sandbox.wire import Array, Handle

LESSONS = lessons.solutions_modules()  # {lesson: its solutions and checks module}, from lessons/*/lesson.toml


def checks_for(lesson):
    """{graded name: Check} of a lesson."""
    if lesson not in LESSONS:
        raise ValueError(f"unknown lesson {lesson!r}; lessons are {', '.join(LESSONS)}")
    return importlib.import_module(f"autograder.checks.{LESSONS[lesson]}").CHECKS


class Check:
    """One graded name's check. isolate: names of the student's other answers that this
    function may call (softmax inside attention, ...); during the check they are replaced by
    correct versions from autograder.sandbox.helpers, so one mistake costs one function's points.

    aspects: {aspect: weight} for partial credit, declared once here; the first is the core.
    The check body tests each inside `with s.aspect(name):`. Every other aspect is earned only
    when the core passes, so stubs and constant answers score nothing."""

    def __init__(self, name, fn, isolate=(), aspects=None):
        self.name, self.fn, self.isolate = name, fn, tuple(isolate)
        self.aspects = dict(aspects or {})

    def __call__(self, subject):
        """Run against a Subject; an exception from the student's code becomes a teaching AssertionError."""
        record = subject._aspects = _Aspects(self.aspects) if self.aspects else None
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

    def __init__(self, weights):
        self.weights, self.core = weights, next(iter(weights))
        self.tested, self.failed = set(), {}

    def verdict(self, name):
        untested = [a for a in self.weights if a not in self.tested]
        if untested:  # a bug of ours: never give an aspect's share untested
            raise RuntimeError(f"the check of {name} never tested {', '.join(untested)}")
        if self.failed:
            rows = [dict(aspect=a, weight=w, passed=a not in self.failed, message=self.failed.get(a, ""))
                    for a, w in self.weights.items()]
            earned = sum(r["weight"] for r in rows if r["passed"])
            raise PartialCredit(earned, sum(self.weights.values()), rows)


class Checks(dict):
    """A lesson's checks by graded name. In a checks module:
        CHECKS = Checks()
        @CHECKS.add("softmax")
        def softmax(s): ..."""

    def add(self, name, isolate=(), aspects=None):
        def register(fn):
            self[name] = Check(name, fn, isolate, aspects)
            return fn
        return register


class Unchecked(Exception):
    """The student's code could not be checked: it hung or ended its process (grader only).
    Only the transport says so (an "unchecked" reply), never the name of a student's exception."""


class Regrade(Unchecked):
    """The grader could not judge the call for a reason of its own or of the machine's (its wall-clock backstop ran
    out while the code used little CPU: it waited): status error, flagged for regrading, never a fail."""


class OverBudget(Exception):
    """A bounded call (Subject.call_bounded) ran past its memory bound and was killed."""


# Sent with each isolate request, never kept in the sandbox: they are lessons' answers.
STAND_INS = (Path(__file__).parent / "stand_ins.py").read_text(encoding="utf-8")
NOT_IMPLEMENTED = "not implemented yet: replace `raise NotImplementedError()` with your code"
MAX_STUDENT_MESSAGE = 300
# Numbers and array reprs in a student's exception message may be the hidden inputs.
_NUMBERS = re.compile(r"(?:tensor|array)\((?:[^()]|\([^()]*\))*\)|\[[-+\d.,eEinfa\s\[\]]*\d[-+\d.,eEinfa\s\[\]]*\]"
                      r"|-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+"
                      r"|(?<![\w.])-?\d+(?![\w.])")  # an integer on its own (an index, a size), not float32's


def student_message(text):
    """A student's exception message as feedback shows it: array data, decimals and integers masked,
    capped. Only the student's text comes here: the grader's own messages (shapes it reports) never do."""
    text = _NUMBERS.sub("\u2026", str(text))
    return text if len(text) <= MAX_STUDENT_MESSAGE else text[:MAX_STUDENT_MESSAGE - 1] + "\u2026"


class StudentError(Exception):
    """The student's code raised: type name, its class names (mro) and message (masked for
    feedback; raw_message as sent, for checks that look for a word in it)."""

    def __init__(self, type, mro, message):
        super().__init__(f"{type}: {message}")
        self.type, self.mro = student_message(type)[:80], tuple(mro)
        self.raw_message, self.message = message, student_message(message)

    def is_a(self, name):
        return name in self.mro


class Subject:
    """The student's code, reached through a transport (request -> reply, both plain data).
    sources: the code cells the student's notebook ran, as text (host-side evidence for checks
    that parse them with ast; empty when unknown)."""

    def __init__(self, transport, seed_text="", sources=()):
        self._transport = transport
        self.rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
        self.sources = [str(c) for c in sources]
        self._aspects = None
        self._isolated = ()  # the names isolate() replaced, until restore()
        self.held_mb = 0  # see memory_bound()

    def _request(self, request, callback=None):
        reply = self._transport(request, callback=callback) if callback else self._transport(request)
        if not isinstance(reply, dict):
            raise Unchecked("the sandbox sent a malformed reply")
        if "unchecked" in reply:
            raise Unchecked(str(reply["unchecked"]))
        if "stalled" in reply:
            raise Regrade(str(reply["stalled"]))
        if "too_slow" in reply:  # the call's CPU limit: the cases it did not finish are lost, as a wrong answer's
            raise AssertionError(str(reply["too_slow"]))
        if "over_budget" in reply:
            raise OverBudget(str(reply["over_budget"]))
        if "error" in reply:
            e = reply["error"] if isinstance(reply["error"], dict) else {}
            mro = e.get("mro") if isinstance(e.get("mro"), list) else []
            error = StudentError(str(e.get("type")), [str(m) for m in mro[:64]], str(e.get("message", ""))[:10_000])
            if error.is_a("NotImplementedError"):  # ends the check whatever it catches: not written yet
                raise AssertionError(NOT_IMPLEMENTED)
            raise error
        try:
            return wire.decode(reply.get("ok"))
        except wire.WireError as e:  # only code in the student's process could have sent it
            raise AssertionError(f"the reply from your notebook's process was not plain data ({e}): "
                                 "does your code change the grader's server?") from None

    def _call_request(self, target, args, kwargs, **extra):
        return {"op": "call", "target": _target(target), "args": [wire.encode_plain(a) for a in args],
                "kwargs": {k: wire.encode_plain(v) for k, v in kwargs.items()}, **extra}

    def call(self, target, *args, **kwargs):
        """target: a name the notebook defines, a Handle, or (Handle, method name)."""
        return self._request(self._call_request(target, args, kwargs))

    def call_for_effect(self, target, *args, **kwargs):
        """call(), for its effect only: the result is not sent back (a long stream of updates)."""
        self._request(self._call_request(target, args, kwargs, discard=True))

    def call_traced(self, target, *args, **kwargs):
        """(result, ops): call(), plus every tensor op the call ran, as [name, first input's shape,
        [floating outputs' shapes]] (see sandbox.server.OpLog). The log is recorded next to the
        student's code, so it may be forged: use it to explain a mistake, never to award points."""
        reply = self._request(self._call_request(target, args, kwargs, trace=True))
        if not (isinstance(reply, tuple) and len(reply) == 2):
            raise AssertionError("the reply from your notebook's process was not a traced result: "
                                 "does your code change the grader's server?")
        return reply

    @contextlib.contextmanager
    def memory_bound(self, memory_mb, headroom_mb=0, inputs_mb=0):
        """A block in which the student's process may map at most memory_mb MiB more than a fresh one
        (in the sandbox: the pristine worker it is forked from), and (in the sandbox) start no process:
        a hard limit set from outside that process by the sandbox's worker (runner.bound()), after it
        killed every other process of the sandbox. What the process mapped before the block (its cells,
        a buffer they keep, memory freed but still mapped, earlier checks) is part of memory_mb, never
        headroom on top of it: size memory_mb for an honest process (runner.py says what one maps) and
        the forbidden layout well above it. The limit cannot be lifted, so the grader ends that process
        after the block: handles from before or inside it are gone, and the next request runs the
        cells again. In-process (LocalSubject) the soft limit of this process is lowered for the block,
        counted the same way (checks.memory). A call that runs out raises OverBudget or comes back as a
        StudentError (MemoryError, or torch's "can't allocate memory"). One bound per block (no nesting).
        A process that already holds memory_mb is over budget before the block (OverBudget); one that
        ended before it could be bounded fails with that reason (AssertionError).
        self.held_mb: what the process held beyond a fresh one when the block began.
        headroom_mb: a process holding more than an honest fresh one (runner.HONEST_HELD_MB: %matplotlib
        inline, a scratch tensor) gets what it holds on top of memory_mb, up to headroom_mb (over budget
        above it): a check that allows it sizes its forbidden layout from self.held_mb, well above
        self.held_mb + memory_mb + 64 MiB (a buffer kept before the block is then too small to hold it).
        inputs_mb: what the check's own inputs take, made inside the block (helpers.drawn_calls), on top of
        memory_mb, which is then the answer's working memory alone."""
        reply = self._transport({"op": "bound", "mb": int(memory_mb), "headroom": int(headroom_mb),
                                 "inputs": int(inputs_mb)})
        held = reply.get("held_mb") if isinstance(reply, dict) else None
        self.held_mb = held if isinstance(held, int) else 0
        if isinstance(reply, dict) and "refused" in reply:
            self._transport({"op": "unbound"})
            if isinstance(held, int):
                raise OverBudget(str(reply["refused"]))
            raise AssertionError(f"your code's memory could not be checked: {reply['refused']}")
        try:
            yield
        finally:
            self._transport({"op": "unbound"})
            if self._isolated:  # the fresh process runs the notebook's own names again
                self.isolate(self._isolated)

    def call_bounded(self, memory_mb, target, *args, **kwargs):
        """call() alone in a memory_bound(memory_mb) block."""
        with self.memory_bound(memory_mb):
            return self.call(target, *args, **kwargs)

    def call_with_callbacks(self, handler, target, *args, **kwargs):
        """call(), during which code next to the student's (sandbox.helpers) may ask this process
        handler(payload) -> reply through sandbox.server.host_callback: a record the student cannot reach."""
        return self._request(self._call_request(target, args, kwargs), callback=handler)

    @contextlib.contextmanager
    def aspect(self, name):
        """One aspect of a check with partial credit (Check): a failure inside fails only this aspect,
        unless it is the core. Outside a check with aspects it is a plain block."""
        record = self._aspects
        if record is None:
            yield
            return
        if name not in record.weights:
            raise RuntimeError(f"undeclared aspect {name!r}")
        record.tested.add(name)
        try:
            yield
        except (AssertionError, StudentError) as e:
            message = str(e) if isinstance(e, AssertionError) else f"your code raised {e.type}: {e.message}"
            if name == record.core or str(e) == NOT_IMPLEMENTED:
                raise AssertionError(message) from None
            record.failed.setdefault(name, message)

    def helper(self, name, *args, **kwargs):
        """Build one of autograder.sandbox.helpers next to the student's code; returns a Handle."""
        return self.call({"helper": name}, *args, **kwargs)

    def get(self, handle, name):
        """handle.name; handle may be a name the notebook defines (s.get("FlashAttention", "apply"))."""
        where = {"global": handle} if isinstance(handle, str) else {"handle": handle.id}
        return self._request({"op": "getattr", **where, "name": name})

    def state(self, handle, keep_vars=False):
        """A module's state_dict as {name: Array}; keep_vars: state_dict(keep_vars=True), the parameters
        themselves, whose Arrays keep their requires_grad (a plain state_dict detaches them)."""
        return self._request({"op": "state", "handle": handle.id, **({"keep_vars": True} if keep_vars else {})})

    def load(self, handle, state):
        """load_state_dict(strict=True) with {name: numpy array}, sent as tensors."""
        return self._request({"op": "load", "handle": handle.id,
                              "state": {k: wire.encode_plain(tensor(v)) for k, v in state.items()}})

    def has(self, name):
        return self._request({"op": "has", "name": name})

    def isolate(self, names):
        """Until restore(), the notebook's `names` are correct helpers (Check.isolate)."""
        self._isolated = tuple(names)
        return self._request({"op": "isolate", "names": list(names), "source": STAND_INS})

    def restore(self):
        self._isolated = ()
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
        roundtrip = lambda msg: json.loads(wire.dumps(msg))  # noqa: E731

        bound = LocalBound()

        def transport(request, callback=None):
            if request.get("op") == "bound":
                return bound.enter(namespace, int(request["mb"]), int(request.get("headroom", 0)),
                                   int(request.get("inputs", 0)))
            if request.get("op") == "unbound":
                return bound.leave()
            server.channel = (lambda payload: roundtrip(wire.encode_plain(callback(wire.decode(roundtrip(payload))))))\
                if callback else None
            return roundtrip(server.handle(roundtrip(request)))

        sources = namespace.get("In") or namespace.get("__cell_sources__") or ()
        super().__init__(transport, seed_text, [c for c in sources if isinstance(c, str)])


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


def call_within_memory(s, memory_mb, message, target, *args, **kwargs):
    """s.call_bounded(memory_mb, target, ...); running out of memory there fails with `message` (what
    the answer must have materialised). Size the case so that the wrong layout needs one allocation
    well above memory_mb, which counts from a fresh process (Subject.memory_bound)."""
    with within_memory(s, memory_mb, message):
        return s.call(target, *args, **kwargs)


@contextlib.contextmanager
def within_memory(s, memory_mb, message, headroom_mb=0, inputs_mb=0):
    """A block of calls in s.memory_bound(memory_mb, headroom_mb, inputs_mb); running out of memory there fails with
    `message`.
    It gives reword(message), which sets the message for what follows in the block (one bound, calls
    that must fit it for different reasons)."""
    said = [message]
    try:
        with s.memory_bound(memory_mb, headroom_mb, inputs_mb):
            yield lambda new: said.__setitem__(0, new)
    except OverBudget:
        fail(said[0] + _held(s))
    except StudentError as e:
        if e.is_a("MemoryError") or "alloc" in e.raw_message.lower():
            fail(said[0] + _held(s))
        raise


GLIBC_SLACK_MB = 64 + 16  # a thread arena's unused heap, which no address-space limit sees (runner.bound), and a margin
# What a check that grows its evidence (evidence_times) lets a notebook hold on top of its bound: a 256 MiB dataset
# or scratch tensor with %matplotlib inline's 30 to 60 MiB (Subject.memory_bound's headroom_mb).
HEADROOM_MB = 320


def evidence_times(s, memory_mb, unit_mb):
    """Inside s.memory_bound(memory_mb, headroom_mb): how many times larger a check makes its case,
    whose forbidden layout takes unit_mb MiB at its usual size, so that it exceeds what the process
    held before the block (which headroom put on top of memory_mb: a buffer kept to hold it) plus
    memory_mb plus glibc's slack. 1 for a process holding no more than an honest fresh one."""
    if s.held_mb < HONEST_HELD_MB:
        return 1
    return max(1, math.ceil((s.held_mb + memory_mb + GLIBC_SLACK_MB) / unit_mb))


HELD_NOTE_MB = 16  # an honest process holds less than 8 MiB beyond a fresh one when a bound begins


def _held(s):
    """What a failure under a memory bound adds when the process already held much before it."""
    return (f" (your notebook's process already held {s.held_mb} MiB more than a fresh one before the call: "
            "memory your cells keep counts too: free large arrays they keep at top level)") \
        if s.held_mb >= HELD_NOTE_MB else ""


def tensor(array, dtype=None):
    """A numpy array to send as a torch tensor; dtype 'bfloat16' is allowed."""
    array = np.asarray(array)
    return Array("tensor", dtype or array.dtype.name, array.astype(np.float32) if dtype == "bfloat16" else array)


def reference(value, dtype=None):
    """A solutions/ result (tensors, arrays, tuples, numbers) as the plain data a check compares with.
    dtype: the result is the exact answer (computed in float64) to a question asked in `dtype`: the
    Array says `dtype` (what the student must return) and keeps the float64 values, so a correct
    answer is judged by its distance from the truth, not from the reference's own rounding."""
    got = wire.decode(ObjectServer({})._encode(value, [0]))
    if dtype is None:
        return got
    if not isinstance(got, Array):
        raise TypeError("reference(value, dtype) takes a single array")
    return Array(got.kind, dtype, got.data, got.device, got.subclass)


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


def close(got, want, rtol=None, atol=None, upcast_ok=False, cond=1.0):
    """Same kind, dtype, shape, and values within the dtype's tolerance times cond (NaN equal to NaN)."""
    if not (isinstance(got, Array) and got.kind == want.kind and dtype_ok(got, want, upcast_ok)
            and got.shape == want.shape):
        return False
    if want.data.dtype.kind in "biu":
        return bool(np.array_equal(got.data, want.data))
    return bool(_near(got, want, rtol, atol, cond).all())


def _near(got, want, rtol, atol, cond):
    r, a = TOLERANCE.get(want.dtype, (1e-5, 1e-6))
    with np.errstate(invalid="ignore"):
        return np.isclose(got.data.astype(np.float64), want.data.astype(np.float64),
                          rtol=(rtol or r) * cond, atol=(atol or a) * cond, equal_nan=True)


def where_it_differs(bad, axes=None, regions=None):
    """Where a result differs, in words and without values. bad: bool array of wrong entries;
    axes: a name per dimension ("B", "H", "T", ...); regions: {name: bool array broadcasting to bad}."""
    if not bad.any():
        return ""
    if bad.all():
        return "everywhere"
    for name, region in (regions or {}).items():
        region = np.broadcast_to(np.asarray(region, dtype=bool), bad.shape)
        if region.any() and not (bad & ~region).any():
            return f"only in the {name}"
        if (~region).any() and not (bad & region).any():
            return f"only outside the {name}"
    parts = []
    for axis, size in enumerate(bad.shape):
        if size < 2:
            continue
        name = axes[axis] if axes and axis < len(axes) else f"axis {axis}"
        hit = bad.any(axis=tuple(i for i in range(bad.ndim) if i != axis))
        if hit.all():
            continue
        first, last = int(np.argmax(hit)), size - 1 - int(np.argmax(hit[::-1]))
        if hit.sum() == 1 and name in ("H", "Hkv"):
            parts.append(f"in one head only ({name})")
        elif hit[first:last + 1].all() and last == size - 1:
            parts.append(f"only in the last positions along {name} (the tail)")
        elif hit[first:last + 1].all() and first == 0:
            parts.append(f"only in the first positions along {name}")
        else:
            parts.append(f"in some positions along {name}")
    return "; ".join(parts) or "in scattered entries"


def expect_array(got, want, what, mistakes=(), nan_hint="", hint="", rtol=None, atol=None, upcast_ok=False,
                 cond=1.0, axes=None, regions=None):
    """Check a returned array against the reference `want` (an Array from reference()).

    mistakes: [(message, Array)] of what known mistakes would return on the same inputs, or a
    function returning them (called only when the result is wrong); a match fails with that
    message. Then kind, dtype, shape, device, NaN and values; a value mismatch says where it is
    (axes and regions: see where_it_differs). cond scales the tolerance (the problem's conditioning).
    """
    tol = dict(rtol=rtol, atol=atol, upcast_ok=upcast_ok, cond=cond)
    if callable(mistakes):
        mistakes = [] if close(got, want, **tol) else mistakes()
    for message, wrong in mistakes:
        if close(got, wrong, **tol) and not close(got, want, **tol):
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
    if not close(got, want, **tol):
        where = where_it_differs(~_near(got, want, rtol, atol, cond), axes, regions) \
            if want.data.dtype.kind == "f" else ""
        fail(f"{what} differs from the correct result" + (f" ({where})" if where else "") + (f": {hint}" if hint else ""))


def expect_int(got, want, what, mistakes=()):
    """A Python int equal to want; mistakes: [(message, wrong int)], or a function returning them (called only
    when the answer is wrong)."""
    if callable(mistakes):
        mistakes = [] if got == want and type(got) is int else mistakes()
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
