"""The student's code as a check sees it: a Subject reached through a transport (the sandbox in the grader,
this process in a notebook's hidden test), and the errors its replies become."""

import contextlib
import hashlib
import json
import re
import secrets
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from autograder.check_submission import MAX_CELL_CHARS, MAX_CODE_CHARS, TOO_MUCH_CODE
from autograder.checking.memory import LocalBound
from autograder.sandbox import tripwires, wire
from autograder.sandbox.server import ObjectServer
from autograder.sandbox.wire import Array, Handle


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
_NUMBERS = re.compile(
    r"(?:tensor|array)\((?:[^()]|\([^()]*\))*\)|\[[-+\d.,eEinfa\s\[\]]*\d[-+\d.,eEinfa\s\[\]]*\]"
    r"|-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+"
    r"|(?<![\w.])-?\d+(?![\w.])"
)  # an integer on its own (an index, a size), not float32's


def student_message(text):
    """A student's exception message as feedback shows it: array data, decimals and integers masked,
    capped. Only the student's text comes here: the grader's own messages (shapes it reports) never do."""
    text = _NUMBERS.sub("\u2026", str(text))
    return text if len(text) <= MAX_STUDENT_MESSAGE else text[: MAX_STUDENT_MESSAGE - 1] + "\u2026"


class StudentError(Exception):
    """The student's code raised: type name, its class names (mro) and message (masked for
    feedback; raw_message as sent, for checks that look for a word in it)."""

    def __init__(self, type, mro, message):
        super().__init__(f"{type}: {message}")
        self.type, self.mro = student_message(type)[:80], tuple(mro)
        self.raw_message, self.message = message, student_message(message)

    def is_a(self, name):
        return name in self.mro


# This run's secret (one a grading process): what unseen_seed gives is the same for every submission the run grades,
# so the grader's own side of the cases drawn from it is worked out once a run (Subject.once_per_run), and differs
# between runs
RUN_KEY = secrets.token_bytes(16)


def unseen_seed(rng):
    """A seed (below 2**31) for inputs a check draws in the student's process, which no source shows: a check's rng is
    seeded from its name (Subject), so a call on inputs drawn from it could be answered from a table worked out
    beforehand (a "tiled" case's few outputs, without touching its keys). The seed is rng's next draw keyed by
    RUN_KEY: a table worked out in another run misses. rng draws it, so that what the check draws after stays as
    it was."""
    drawn = int(rng.integers(2**31)).to_bytes(4, "little")
    return int.from_bytes(hashlib.blake2b(drawn, key=RUN_KEY, digest_size=4).digest(), "little") >> 1


_RUN = threading.local()  # Subject.once_per_run's values, a grading thread's own
ONCE_PER_RUN_KEPT = 8  # values kept a thread: the few of the lessons a run grades


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
        # isolate() is due again before the next request: the process serving it may be a fresh one, which runs the
        # notebook's own names (after memory_bound, forbidding and elsewhere). Sent when a request comes, not when the
        # block ends: a block that ends the check (restore) then starts no process only to isolate it.
        self._isolation_due = False
        self.held_mb = 0  # see memory_bound()
        self._calls = 0  # calls sent (forbidding() counts those of its block)
        self._forbidding = None  # inside forbidding(): [its paths, self._calls when the paths were last found off]
        self._blocks = 0  # forbidding, elsewhere and memory_bound blocks open: a check pauses only outside them

    def once_per_run(self, key, make):
        """make()'s value, made once a run in each grading thread for each key (hashable, saying all make() depends
        on): the grader's own side of a case (its inputs, their exact answers) is the same for every submission, when
        drawn from unseen_seed. Each thread keeps its own (no state is shared between grading threads), the last
        ONCE_PER_RUN_KEPT. The value is shared by the checks that ask for it: they must not change it."""
        kept = _RUN.__dict__.setdefault("kept", {})
        if key not in kept:
            while len(kept) >= ONCE_PER_RUN_KEPT:
                kept.pop(next(iter(kept)))
            kept[key] = make()
        return kept[key]

    def readable_sources(self):
        """The sources of up to MAX_CELL_CHARS characters, for a check that parses them on the grader's side, whose
        work is bounded: more than MAX_CODE_CHARS characters of them in all fail the aspect, in check_submission.py's
        words."""
        read = [c for c in self.sources if len(c) <= MAX_CELL_CHARS]
        total = sum(map(len, read))
        if total > MAX_CODE_CHARS:
            raise AssertionError(TOO_MUCH_CODE.format(total))
        return read

    def _request(self, request, callback=None):
        if self._isolation_due:
            self.isolate(self._isolated)
        self._calls += request.get("op") == "call"
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
            raise AssertionError(
                f"the reply from your notebook's process was not plain data ({e}): "
                "does your code change the grader's server?"
            ) from None

    def _call_request(self, target, args, kwargs, **extra):
        return {
            "op": "call",
            "target": _target(target),
            "args": [wire.encode_plain(a) for a in args],
            "kwargs": {k: wire.encode_plain(v) for k, v in kwargs.items()},
            **extra,
        }

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
            raise AssertionError(
                "the reply from your notebook's process was not a traced result: "
                "does your code change the grader's server?"
            )
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
        memory_mb, which is then the answer's working memory alone.
        Inside forbidding(), a block whose calls succeeded has the paths probed in its process before that
        process ends (_still_forbidding): no fresh one is started only to probe them."""
        if self._isolation_due:  # before the bound: the stand-ins are no part of what it counts
            self.isolate(self._isolated)
        reply = self._transport(
            {"op": "bound", "mb": int(memory_mb), "headroom": int(headroom_mb), "inputs": int(inputs_mb)}
        )
        held = reply.get("held_mb") if isinstance(reply, dict) else None
        self.held_mb = held if isinstance(held, int) else 0
        if isinstance(reply, dict) and "refused" in reply:
            self._transport({"op": "unbound"})
            self._isolation_due = bool(self._isolated)  # that process is ended too
            if isinstance(held, int):
                raise OverBudget(str(reply["refused"]))
            raise AssertionError(f"your code's memory could not be checked: {reply['refused']}")
        calls = self._calls
        self._blocks += 1
        try:
            yield
            if self._forbidding and self._calls > calls:  # probed before the process ends: see _still_forbidding
                self._still_forbidding(bounded=True)
        finally:
            self._blocks -= 1
            self._transport({"op": "unbound"})
            self._isolation_due = bool(self._isolated)

    def cpu_seconds(self):
        """The CPU seconds the student's process has used so far: in the sandbox read by its worker from outside the
        process (runner.cpu_seconds), which its code cannot change; in-process (LocalSubject), this process's own."""
        used = self._request({"op": "cpu"})
        if not isinstance(used, float):
            raise Unchecked("your notebook's process ended before its CPU time could be read")
        return used

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
        rule = record.forbid if record.forbid and record.forbid["aspect"] == name else None
        try:
            with self.forbidding(rule["paths"]) if rule else contextlib.nullcontext():
                yield
        except (AssertionError, StudentError) as e:
            message = str(e) if isinstance(e, AssertionError) else f"your code raised {e.type}: {e.message}"
            if rule:
                message = forbidden_message(record.name, rule, e, message)
            if name == record.core or str(e) == NOT_IMPLEMENTED:
                raise AssertionError(message) from None
            record.failed.setdefault(name, message)

    @contextlib.contextmanager
    def forbidding(self, paths):
        """A block whose calls run in a process that switched `paths` off before the notebook's cells ran
        (sandbox/tripwires.py: PyTorch's attention kernels, its softmax, autograd): a forbidden operator raises
        ForbiddenPath, autograd records nothing. In the sandbox the grader ends the serving process, runs the cells
        again in a fresh one with the paths off, and ends that one after the block (Session._kind); in-process
        (LocalSubject) they are off during each call only. Subject.aspect enters it for the aspect the lesson's
        manifest names ([forbids]); a check whose blocks call nothing would enforce nothing (a bug of ours, which
        _Aspects.verdict raises)."""
        self._transport({"op": "forbid", "paths": list(paths)})
        self._isolation_due = bool(self._isolated)
        calls = self._calls
        self._forbidding = [list(paths), calls]
        self._blocks += 1
        try:
            yield
            if self._calls > self._forbidding[1]:
                self._still_forbidding()
        finally:
            self._blocks -= 1
            self._forbidding = None
            if self._aspects:
                self._aspects.forbidden_calls += self._calls - calls
            self._transport({"op": "unforbid"})
            self._isolation_due = bool(self._isolated)

    def _still_forbidding(self, bounded=False):
        """Fail unless the forbidding block's paths are still off where its calls ran (tripwires.probe says what
        turning them back on takes, and what this second layer is worth). The probe is not counted as a call of the
        block. bounded: asked by memory_bound before it ends the process its calls ran in, which is confined (no other
        process of the student's, runner.confine) and switched the paths off before any cell ran, as a fresh process
        would be: the probe there sees what the cells and the calls themselves did, where one in a fresh process sees
        the cells only, and costs no process of its own. A probe the bound stops there (out of memory, the process
        ended) is left to the block's end, in a fresh process, as it was before."""
        paths, calls = self._forbidding[0], self._calls
        try:
            lost = self.helper("tripwires_probe", paths)
        except StudentError as e:
            if bounded and (e.is_a("MemoryError") or "alloc" in e.raw_message.lower()):
                return
            lost = [f"the grader's probe (it raised {e.type})"]
        except (OverBudget, Unchecked):
            if bounded:
                return
            raise
        finally:
            self._calls = calls
        self._forbidding[1] = calls
        if lost:
            raise AssertionError(
                f"the guard against PyTorch's kernels was switched off ({lost[0]} no longer raises): "
                "leave the process as the grader set it up"
            )

    @contextlib.contextmanager
    def elsewhere(self, cells):
        """A block whose requests go to a fresh process that ran the grader's `cells` (source text) instead of the
        notebook's: nothing the notebook's code did is there (in-process: a fresh namespace)."""
        self._transport({"op": "elsewhere", "cells": list(cells)})
        self._isolation_due = False  # the grader's cells have nothing to isolate; due again after the block
        self._blocks += 1
        try:
            yield
        finally:
            self._blocks -= 1
            self._transport({"op": "here"})
            self._isolation_due = bool(self._isolated)

    def next_process(self, aspect=None, cells=None):
        """The label a check yields (Check.steps) before a part that needs a process of another kind: the one that
        switched off the paths the lesson's manifest forbids in `aspect` (Subject.aspect), or one that ran the grader's
        `cells` (Subject.elsewhere). The grader runs the parts of a notebook's checks that yield the same label one
        after the other (grade.run_checks), so that they share that process: each switch costs a fresh process, which
        runs the notebook's cells again."""
        if cells is not None:
            return ("elsewhere", tuple(cells))
        rule = self._aspects.forbid if self._aspects else None
        return ("forbid", tuple(rule["paths"])) if rule and rule["aspect"] == aspect else ("notebook",)

    def pause(self):
        """Between two parts of a check (Check.steps), while other checks' parts run: none of this check's blocks may
        be open (a bug of ours), and the names it isolates are given back, to be isolated again at its next request."""
        if self._blocks:
            raise RuntimeError("a check paused inside a forbidding, elsewhere or memory_bound block")
        if self._isolated:
            names = self._isolated
            self.restore()
            self._isolated, self._isolation_due = names, True

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
        return self._request(
            {"op": "load", "handle": handle.id, "state": {k: wire.encode_plain(tensor(v)) for k, v in state.items()}}
        )

    def has(self, name):
        return self._request({"op": "has", "name": name})

    def isolate(self, names):
        """Until restore(), the notebook's `names` are correct helpers (Check.isolate)."""
        self._isolated, self._isolation_due = tuple(names), False
        return self._request({"op": "isolate", "names": list(names), "source": STAND_INS})

    def restore(self):
        self._isolated, self._isolation_due = (), False
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

    def once_per_run(self, key, make):
        """make(), made again each time: here the grader's side shares the student's process, where what it kept would
        count against the memory bounds that follow, and one notebook is checked once."""
        return make()

    def __init__(self, namespace, seed_text=""):
        servers = [ObjectServer(namespace)]  # the notebook's, and inside Subject.elsewhere the grader's cells'
        roundtrip = lambda msg: json.loads(wire.dumps(msg))  # noqa: E731

        bound = LocalBound()
        off = []  # the paths switched off (Subject.forbidding) during each request, and only then: the check's own
        #           work in this process uses them (here nothing is out of the student's reach anyway)

        def transport(request, callback=None):
            if request.get("op") == "bound":
                return bound.enter(
                    namespace, int(request["mb"]), int(request.get("headroom", 0)), int(request.get("inputs", 0))
                )
            if request.get("op") == "unbound":
                return bound.leave()
            if request.get("op") == "cpu":
                return {"ok": time.process_time()}
            if request.get("op") in ("forbid", "unforbid"):
                off[:] = request.get("paths", ()) if request["op"] == "forbid" else ()
                return {"ok": None}
            if request.get("op") in ("elsewhere", "here"):
                servers[1:] = [_elsewhere(request["cells"])] if request["op"] == "elsewhere" else []
                return {"ok": None}
            remove = tripwires.install(off, for_good=False) if off else None
            try:
                return handle(request, callback)
            finally:
                if remove:
                    remove()

        def handle(request, callback):
            server = servers[-1]
            server.channel = (
                (lambda payload: roundtrip(wire.encode_plain(callback(wire.decode(roundtrip(payload))))))
                if callback
                else None
            )
            return roundtrip(server.handle(roundtrip(request)))

        sources = namespace.get("In") or namespace.get("__cell_sources__") or ()
        super().__init__(transport, seed_text, [c for c in sources if isinstance(c, str)])


def _elsewhere(cells):
    """An ObjectServer of a fresh namespace that ran cells (Subject.elsewhere, in-process)."""
    import linecache

    namespace = {"__name__": "__elsewhere__"}
    for i, source in enumerate(cells):
        filename = f"<grader cell {i}>"  # Triton reads a kernel's source with inspect
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        try:
            exec(compile(source, filename, "exec"), namespace)
        except Exception:  # noqa: BLE001 - as a cell that raised: what it defined stays, calls say the rest
            pass
    return ObjectServer(namespace)


def forbidden_message(name, rule, error, message):
    """What a failure inside an aspect with forbidden paths says: the path reached, or the failure with the paths
    that were off."""
    if isinstance(error, StudentError) and error.type == "ForbiddenPath":
        return tripwires.message(name, error.message, rule["instead"])
    off = " and ".join(tripwires.PATHS[p] for p in rule["paths"])
    return f"{message} (this part of the check runs with {off} switched off: {rule['instead']})"


def tensor(array, dtype=None):
    """A numpy array to send as a torch tensor; dtype 'bfloat16' is allowed."""
    array = np.asarray(array)
    return Array("tensor", dtype or array.dtype.name, array.astype(np.float32) if dtype == "bfloat16" else array)
