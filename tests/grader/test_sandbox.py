"""The sandbox's host side, piece by piece: frames it refuses, callbacks, bounded calls, and the
worker's own integrity check. The attacks themselves are graded in tests/grader/test_adversarial*.py."""

import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder import notebook as nbk
from autograder.checking import PartialCredit, Subject, checks_for
from autograder.grade import imports_triton, submission_cells
from autograder.release import release
from autograder.sandbox import runner, wire
from autograder.worker import DEFAULT_LIMITS, Malformed, Sandbox, SandboxError, Session, _uid_refusal, choose_mode
from tests.harness.lessons import fill


def test_frames_are_capped_before_they_are_parsed():
    assert wire.loads(b'{"ok": [[], []]}') == {"ok": [[], []]}
    with pytest.raises(wire.WireError, match="items"):
        wire.loads(b'{"ok":[' + b"[]," * wire.MAX_TOKENS + b"[]]}")
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", wire.MAX_FRAME + 1))
        with pytest.raises(wire.WireError, match="larger"):
            wire.recv_frame(b)
        payload = json.dumps({"ok": "x" * 1000}).encode()
        a.sendall(struct.pack(">I", len(payload)) + payload)
        assert wire.recv_frame(b) == {"ok": "x" * 1000}


@pytest.mark.parametrize(
    "frame",
    [
        {"cell": -1000, "state": "start"},
        {"cell": 3, "state": "start"},
        {"cell": "0", "state": "done"},
        {"cell": True, "state": "start"},
        {"cell": 0, "state": "running"},
        {"cell": 0, "state": "done", "error": "x"},
        {"cell": 0, "state": "done", "error": {"type": 1, "mro": [], "message": ""}},
    ],
)
def test_malformed_cell_frames_are_refused(frame):
    session = Session(
        SimpleNamespace(limits=replace(DEFAULT_LIMITS, notebook_seconds=10), protect=True), "01_attention", []
    )
    with pytest.raises(Malformed):
        session._progress(frame, 3)
    error = {"type": "ValueError", "mro": ["ValueError", "Exception"], "message": "m" * 5000}
    assert session._progress({"cell": 2, "state": "done", "error": error}, 3)[2]["message"] == "m" * 2000


@pytest.mark.parametrize("reply", [{"ok": 1, "error": {}}, {"error": "boom"}, {"result": 1}, {"error": {"type": "E"}}])
def test_malformed_replies_are_refused(reply):
    session = Session(
        SimpleNamespace(limits=replace(DEFAULT_LIMITS, notebook_seconds=10), protect=True), "01_attention", []
    )
    with pytest.raises(Malformed):
        session._reply(reply)


def test_the_worker_notices_a_change_to_itself():
    shell = runner.preload()
    before = runner.fingerprint(shell)
    assert runner.fingerprint(shell) == before
    shell.user_ns["softmax"] = lambda x: x  # a previous student's answer, left in the pristine shell
    assert runner.fingerprint(shell) != before
    del shell.user_ns["softmax"]
    original = wire.dumps
    wire.dumps = lambda message: b"{}"  # the worker's own code replaced
    try:
        assert runner.fingerprint(shell) != before
    finally:
        wire.dumps = original
    assert runner.fingerprint(shell) == before


def test_a_sandbox_starts_with_no_python_run_in_a_forked_grader():
    """grade starts sandboxes from threads (grade.Warm, --jobs) while others import: a fork that runs Python in the
    child (a preexec_fn) raced an import that registers at-fork hooks and broke logging's ("Exception ignored in:
    <function _releaseLock>"). No at-fork hook runs as a sandbox starts (nor as the uid mode's check runs, a
    sandbox's first step there), and it still starts inside its cgroups."""
    forks, watching = [], [True]
    os.register_at_fork(before=lambda: watching[0] and forks.append(os.getpid()))  # stays registered: made inert
    try:
        _uid_refusal()
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    finally:
        watching[0] = False
    try:
        assert not forks, "the grader forked with Python run in the child"
        for path in sandbox.cgroup.paths.values():
            assert str(sandbox.proc.pid) in Path(path, "cgroup.procs").read_text().split()
    finally:
        sandbox.close()


def test_a_worker_without_triton_preloaded_still_runs_a_cell_that_imports_it():
    """grade preloads Triton only for lessons whose cells import it (imports_triton): a student's cell of another
    lesson that imports it gets it in its own child, not an error."""
    pytest.importorskip("triton")
    assert [lesson for lesson in nbk.lesson_names() if imports_triton([lesson])] == ["06_gpu", "09_flash_backward"]
    cell = (
        "import sys\nbefore = 'triton' in sys.modules\nimport triton\ndef seen():\n    return [before, triton.__name__]"
    )
    for triton in (False, True):
        try:
            sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=1024), triton=triton)
        except SandboxError as e:
            pytest.skip(f"no sandbox here: {e}")
        s = Session(sandbox, "01_attention", [cell])
        try:
            s.open()
            assert s.transport(call("seen")) == {"ok": [triton, "triton"]}
        finally:
            s.close()
            sandbox.close()


def test_a_process_killed_after_a_cell_ran_out_of_memory_costs_that_cell_not_the_next():
    """A cell that fills memory and keeps it gets MemoryError; the process may be killed for memory (its cgroup, the
    machine) only while a later cell runs. That later cell is not to blame: the cell that ran out is skipped on the
    restart, and what the later one defines is graded."""
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=20))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    hog = "blob = [bytearray(2**20)]\nraise MemoryError  # as filling memory does, deterministically"
    killed = "import os\nif 'blob' in globals():\n    os._exit(9)  # as the OOM killer would\ndef room():\n    return 1"
    s = Session(sandbox, "01_attention", [hog, killed])
    try:
        s.open()
        assert list(s.skipped) == [0] and "memory" in s.skipped[0], s.skipped
        assert s.transport(call("room")) == {"ok": 1}
    finally:
        s.close()
        sandbox.close()


def test_cells_the_grader_transformed_run_as_ipython_runs_them():
    """The grader does IPython's static transformation of a notebook's cells once (runner.prepared_cells) and each
    child runs them as they come, until a cell changes the shell's transformers: magics, a cell magic, a single line
    (whose transformation depends on the shell) and a transformer of the student's own behave as in IPython."""
    cells = [
        "%%capture captured\nprint('hi')",
        "%matplotlib inline\nx = 1",
        "%time w = 3",
        "get_ipython().input_transformers_post.append(lambda lines: [l.replace('SEVEN', '7') for l in lines])",
        "v = SEVEN\nu = 1",
        "def seen():\n    return [captured.stdout, x, w, v]",
    ]
    assert runner.prepared_cells(cells, 10_000)[1] == [1, 4, 5]  # a cell magic is one line once transformed
    assert runner.prepared_cells(cells, 60)[1] == [1]  # within the grader's budget only
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=1024), triton=False)
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    s = Session(sandbox, "01_attention", cells)
    try:
        s.open()
        assert s.cell_errors == {} and s.transport(call("seen")) == {"ok": ["hi\n", 1, 3, 7]}
    finally:
        s.close()
        sandbox.close()


def test_a_cell_every_submission_shares_is_transformed_once(monkeypatch):
    """IPython's static transformation of the lesson's own cells, the same in every submission, is done once a
    grading thread (runner._transformed), within bounds: a long answer cell is transformed every time."""
    from IPython.core.inputtransformer2 import TransformerManager

    done, transform = [], TransformerManager.transform_cell
    monkeypatch.setattr(TransformerManager, "transform_cell", lambda self, c: done.append(c) or transform(self, c))
    monkeypatch.setattr(runner, "_TRANSFORMED", threading.local())
    long = "%time x = 1\n" + "y = 2\n" * runner.TRANSFORMED_CHARS
    cells = ["%time a = 1\nb = 2", long]
    first = runner.prepared_cells(cells, 10**6)
    assert runner.prepared_cells(cells, 10**6) == first and first[1] == [0, 1]
    assert done == [cells[0], long, long]


CELL = """
import os, subprocess, sys, time
from sandbox.server import host_callback

_listed = subprocess.run([sys.executable, "-c", "print('pip list')"], capture_output=True, text=True).stdout

def listed():  # what a process of a cell's own (pip list) said
    return _listed

def ask(n):
    return [host_callback({"i": i}) for i in range(n)]

daemon = os.fork()
if daemon == 0:  # a daemon, which could work for a call (a bounded one outside its bound)
    os.setsid()
    time.sleep(600)
    os._exit(0)

me = os.getpid

def processes():  # the daemon, and the live processes this one can see
    return daemon, sorted(int(p) for p in os.listdir("/proc") if p.isdigit()
                          and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z")

def spawn():  # a fresh Python of the call's own, where no tripwire and no bound would be, importing what it needs
    try:
        return subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"]).returncode
    except OSError as e:
        return type(e).__name__
"""


@pytest.fixture(scope="module")
def session():
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=20))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    s = Session(sandbox, "01_attention", [CELL])
    s.open()
    yield s
    s.close()
    sandbox.close()


def call(name, *args, **extra):
    return {"op": "call", "target": {"name": name}, "args": list(args), "kwargs": {}, **extra}


@pytest.mark.slow
def test_a_cell_that_ran_out_of_memory_is_skipped():
    """A top-level cell that fills memory and keeps it (MemoryError) would starve every later call:
    it is skipped on a restart, and the rest of the notebook is graded as if it were not there."""
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=20))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    hog = "blob = []\nwhile True:\n    blob.append(bytearray(16 * 2**20))"
    s = Session(sandbox, "01_attention", ["def room():\n    return len(bytearray(64 * 2**20))", hog])
    try:
        s.open()
        # MemoryError, or the process ended while it reported one (a thread or the reply could not start)
        assert list(s.skipped) == [1] and ("memory" in s.skipped[1] or "ended" in s.skipped[1]), s.skipped
        assert s.transport(call("room")) == {"ok": 64 * 2**20}
    finally:
        s.close()
        sandbox.close()


@pytest.mark.slow
def test_callbacks_are_answered_by_the_host(session):
    log = []

    def handler(payload):
        log.append(payload)
        return payload["i"] * 10

    assert session.transport(call("ask", 3), callback=handler) == {"ok": [0, 10, 20]}
    assert log == [{"i": 0}, {"i": 1}, {"i": 2}]
    reply = session.transport(call("ask", 1))  # no handler: the call cannot be checked
    assert "callback" in reply["unchecked"]
    with pytest.raises(AssertionError):  # the check's own verdict inside a handler ends the call...
        session.transport(call("ask", 2), callback=lambda payload: (_ for _ in ()).throw(AssertionError()))
    assert session.transport(call("ask", 1), callback=lambda p: "fine") == {"ok": ["fine"]}  # ...not the session


@pytest.mark.slow
def test_a_bounded_call_runs_with_no_other_process_of_the_sandbox(session):
    session.close()
    daemon, before = wire.decode(session.transport(call("processes"))["ok"])
    assert "ok" in session.transport({"op": "bound", "mb": 256})
    _, during = wire.decode(session.transport(call("processes"))["ok"])
    bounded = session.transport(call("me"))["ok"]
    assert session.transport({"op": "unbound"}) == {"ok": None}
    assert daemon in before and daemon not in during, (daemon, before, during)
    assert set(during) < set(before)  # the serving process itself, bounded: no process of its own
    assert session.transport(call("me"))["ok"] != bounded  # a fresh one after the bound, which cannot be lifted


@pytest.mark.slow
def test_calls_with_paths_off_run_with_no_other_process_and_can_start_none(session):
    """Once the cells ran with paths off (a process of their own costs nothing there), the worker confines the child
    from outside (runner.confine): the daemon a cell left is gone, and a call cannot start a Python of its own, where
    no path is off, to do its work."""
    session.close()
    assert session.transport({"op": "forbid", "paths": ["softmax"]}) == {"ok": None}
    try:
        assert session.transport(call("listed")) == {"ok": "pip list\n"}
        me = session.transport(call("me"))["ok"]
        daemon, during = wire.decode(session.transport(call("processes"))["ok"])
        assert daemon not in during and me in during, (daemon, during)
        # EAGAIN (RLIMIT_NPROC is none), or, for a root child, above that limit, killed by the worker
        assert session.transport(call("spawn"))["ok"] in ("BlockingIOError", -signal.SIGKILL)
    finally:
        assert session.transport({"op": "unforbid"}) == {"ok": None}
    daemon, plain = wire.decode(session.transport(call("processes"))["ok"])
    assert daemon in plain and session.transport(call("spawn")) == {"ok": 0}  # nothing forbidden: not confined


@pytest.mark.slow
def test_a_memory_bound_holds_against_the_students_own_process(session, tmp_path):
    """The bound is set from outside: a notebook that disables setrlimit and fork in its own process
    still runs out (a tiled flash_attention of lesson 06 that materialises every score loses "tiled")."""
    lesson = "06_gpu"
    release(tmp_path, [lesson])
    nb = fill(nbk.read(tmp_path / lesson / f"{lesson}.ipynb"), lesson, {"flash_attention": UNBOUNDED_FLASH})
    sandbox = Sandbox(session.sandbox.mode)  # the grader's own limits
    attacker = Session(sandbox, lesson, submission_cells(nb)[0])
    try:
        with pytest.raises(PartialCredit) as failed:
            checks_for(lesson)["flash_attention"](Subject(attacker.transport))
    finally:
        attacker.close()
        sandbox.close()
    assert [r["aspect"] for r in failed.value.rows if not r["passed"]] == ["tiled"], failed.value.rows


@pytest.mark.slow
def test_a_memory_bound_is_refused_to_a_process_that_already_holds_much(session):
    """A bound counts from a fresh worker: a process that already maps the whole bound gets none."""
    sandbox = Sandbox(session.sandbox.mode)
    holder = Session(sandbox, "01_attention", ["import mmap\nkeep = mmap.mmap(-1, 96 << 20)"])
    try:
        reply = holder.transport({"op": "bound", "mb": 64})
        assert "free large arrays" in reply["refused"] and reply["held_mb"] >= 96, reply
        assert holder.transport({"op": "unbound"}) == {"ok": None}
    finally:
        holder.close()
        sandbox.close()


@pytest.mark.slow
def test_memory_mapped_before_a_bound_is_part_of_it(session):
    """Memory the cells mapped before the bound is no headroom: 64 MiB reserved at top level, then an 80 MiB
    allocation under a 128 MiB bound runs out; without the reserve it fits. (One allocation above 64 MiB:
    glibc's thread arenas reserve 64 MiB heaps whose unused part is mapped already, see runner.bound.)"""
    sandbox = Sandbox(session.sandbox.mode)
    grab = "import numpy as np\ndef grab():\n    return int(np.ones(80 << 20, np.uint8).sum())\n"
    try:
        for cells, fits in (([grab], True), ([grab, "import mmap\nkeep = mmap.mmap(-1, 64 << 20)"], False)):
            s = Session(sandbox, "01_attention", cells)
            try:
                assert "ok" in s.transport({"op": "bound", "mb": 128})
                reply = s.transport(call("grab"))
                assert ("ok" in reply) == fits, reply
                s.transport({"op": "unbound"})
            finally:
                s.close()
    finally:
        sandbox.close()


# A child of the worker, outside any sandbox: on SIGUSR1 it maps (never touches) 512 MiB and says
# whether it could (on `out`); a thread of a student's process could do the same at any moment.
MAPPER = """
import mmap, signal, time
asked, keep = [], []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
out.write("ready\\n"); out.flush()
while True:
    if asked:
        asked.clear()
        try:
            keep.append(mmap.mmap(-1, 512 << 20))
            out.write("1\\n")
        except OSError:
            out.write("0\\n")
        out.flush()
    time.sleep(0.001)
"""


@pytest.fixture
def mapper():
    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", f"import os\nout = os.fdopen({w}, 'w')\n" + MAPPER], pass_fds=[w])
    os.close(w)
    out = os.fdopen(r)
    try:
        assert out.readline() == "ready\n"
        yield SimpleNamespace(pid=child.pid, stdout=out)
    finally:
        child.kill()
        child.wait()
        out.close()


def _bound_of(pid):
    return resource.prlimit(pid, resource.RLIMIT_AS)[0]


def test_memory_mapped_while_a_bound_is_set_is_within_it(mapper, monkeypatch):
    """The child maps 512 MiB between the worker's measurement and its limit (here: just as the limit is
    set): that memory must not lie beyond the limit, unseen (the child is stopped meanwhile)."""
    opts = {"pidns": False, "cgroup": None, "uid": 0, "pristine_vm": runner.vm_size(mapper.pid)}
    prlimit = resource.prlimit

    def late(pid, which, limits=None):
        if which == resource.RLIMIT_AS and limits is not None:
            os.kill(pid, signal.SIGUSR1)
            select.select([mapper.stdout], [], [], 0.5)  # a running child maps now; a stopped one cannot
        return prlimit(pid, which, limits) if limits is not None else prlimit(pid, which)

    monkeypatch.setattr(runner.resource, "prlimit", late)
    reply = runner.bound(mapper.pid, 64, opts)
    monkeypatch.undo()
    assert reply["op"] == "bounded", reply
    mapper.stdout.readline()  # the mapping, tried once the child runs again
    assert runner.vm_size(mapper.pid) <= _bound_of(mapper.pid), "memory mapped during the bound escapes it"


def test_a_process_the_child_started_cannot_continue_it_while_it_is_bounded(mapper, monkeypatch, tmp_path):
    """Just after the worker killed the sandbox's other processes (here: as the kill returns), the child starts
    one of its own, if its process limit lets it (a child is no root, whom the limit does not bind: the test
    starts it for the child), which keeps sending it SIGCONT; the child maps 512 MiB as its limit is set. It
    may start none once the bound began, so it stays stopped, and the 512 MiB lie within the limit."""
    (tmp_path / "cgroup.procs").write_text("")
    opts = {"pidns": False, "cgroup": str(tmp_path), "uid": 0, "pristine_vm": runner.vm_size(mapper.pid)}
    reap, prlimit, started = runner.reap, resource.prlimit, []

    def then_start(opts, keep=()):
        reap(opts, keep)
        if not started and prlimit(mapper.pid, resource.RLIMIT_NPROC)[0] != 0:
            helper = os.fork()
            if helper == 0:
                try:
                    while True:
                        os.kill(mapper.pid, signal.SIGCONT)
                        time.sleep(0.0005)
                finally:
                    os._exit(0)
            started.append(helper)
            (tmp_path / "cgroup.procs").write_text(f"{helper}\n")  # the sandbox's own record of it

    def late(pid, which, limits=None):
        if which == resource.RLIMIT_AS and limits is not None:
            os.kill(pid, signal.SIGUSR1)
            select.select([mapper.stdout], [], [], 0.5)  # a running child maps now; a stopped one cannot
        return prlimit(pid, which, limits) if limits is not None else prlimit(pid, which)

    monkeypatch.setattr(runner, "reap", then_start)
    monkeypatch.setattr(runner.resource, "prlimit", late)
    try:
        reply = runner.bound(mapper.pid, 64, opts)
    finally:
        monkeypatch.undo()
        for helper in started:
            os.kill(helper, signal.SIGKILL)
            os.waitpid(helper, 0)
    assert reply["op"] == "bounded", reply
    assert runner.vm_size(mapper.pid) <= _bound_of(mapper.pid), "memory mapped during the bound escapes it"


def test_a_child_that_unmapped_part_of_the_worker_gains_no_headroom(mapper):
    """A child mapping 256 MiB less than the fresh worker (it unmapped libraries or arenas it inherited) is
    bounded from what it maps, not from the worker: the 256 MiB are no room for a forbidden tensor."""
    vm = runner.vm_size(mapper.pid)
    opts = {"pidns": False, "cgroup": None, "uid": 0, "pristine_vm": vm + (256 << 20)}
    assert runner.bound(mapper.pid, 64, opts)["op"] == "bounded"
    assert _bound_of(mapper.pid) <= vm + (64 << 20)


UNBOUNDED_FLASH = """
import os, resource
resource.setrlimit = resource.prlimit = lambda *a, **k: None  # the bound must not be set in this process
os.fork = lambda: 0

def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    check_attention_inputs(q, k, v)  # every score at once: correct values, no tiles
    Tq, Tk = q.size(2), k.size(2)
    acc = torch.promote_types(q.dtype, torch.float32)
    s = (q.to(acc) @ k.to(acc).transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal:
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq), float("-inf"))
    return (s.softmax(-1) @ v.to(acc)).to(q.dtype)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid mode's clean-up runs as root")
def test_the_uid_modes_check_asks_as_that_uid(tmp_path, monkeypatch):
    """The uid mode is taken only where its uid reads the Python install and nothing of the course."""
    from autograder import worker

    if os.geteuid() != 0:
        pytest.skip("the uid mode needs root")
    private = tmp_path / "course"  # pytest's folders are mode 0700: no other uid may enter
    private.mkdir()
    shared = Path(tempfile.mkdtemp(prefix="mha-uid-check-"))  # mode 0700 too, until opened below
    try:
        python = {k: "/usr/lib" for k in ("stdlib", "purelib", "platlib")}
        monkeypatch.setattr(worker.sysconfig, "get_paths", lambda: python)
        monkeypatch.setattr(worker, "_course_paths", lambda: [str(private), str(shared)])
        assert _uid_refusal() == ""
        shared.chmod(0o755)
        assert f"can read {shared}: make the course owned by root" in _uid_refusal()
        python["purelib"] = str(private)
        assert f"cannot read the Python install at {private}" in _uid_refusal()
    finally:
        shared.rmdir()


def test_the_uid_mode_cleans_what_the_childs_uid_left(tmp_path):
    """Where a child cannot have its own IPC namespace, the worker removes its uid's SysV
    segments and its files in the shared /dev/shm."""
    import ctypes

    uid = 1_999_999_999
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            ctypes.CDLL(None).shmget(0, 4096, 0o1000 | 0o600)
            open(f"/dev/shm/mha-test-{uid}", "w").close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    owned = lambda: [line for line in open("/proc/sysvipc/shm").readlines()[1:] if line.split()[7] == str(uid)]  # noqa: E731
    assert owned() and os.path.exists(f"/dev/shm/mha-test-{uid}")
    runner.remove_ipc(uid)
    runner.wipe_owned("/dev/shm", uid)
    assert not owned() and not os.path.exists(f"/dev/shm/mha-test-{uid}")


def _forks_as(uid, limit):
    """How many of 3 * limit forks succeed in a process that becomes uid and takes the child's limits with
    `processes` = limit, as runner.child does in the uid mode (bounded: its children sleep a moment and go)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        n = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            runner.set_limits({**DEFAULT_LIMITS.child(), "processes": limit})
            for _ in range(3 * limit):
                if os.fork() == 0:
                    time.sleep(1)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        finally:
            os.write(w, str(n).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        n = int(f.read() or -1)
    os.waitpid(pid, 0)
    return n


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid mode runs as root")
def test_the_uid_modes_process_limit_holds_where_roots_would_not():
    """The kernel ignores RLIMIT_NPROC for a real uid 0: the uid mode's child holds to its process limit (a fork
    bomb stops there) because it becomes an unprivileged uid of its own (worker._free_uid) before its limits."""
    from autograder.worker import _free_uid

    assert _forks_as(0, 20) == 60  # as root the limit is no limit: what the uid mode must never run a child as
    assert _forks_as(_free_uid(), 20) < 20


NASTY_TREE = '''
import os, socket
def nasty_tree(top, outside, files=20_000):
    """What a child may leave in its scratch folder (top), with a link to `outside` that must survive."""
    os.chdir(top)
    home = os.open(".", os.O_RDONLY)
    for name in ("d" * 1, "L" * 250):  # 1,500 nested folders; 40 nested names of 250 characters (past PATH_MAX)
        for _ in range(1500 if len(name) == 1 else 40):
            os.mkdir(name)
            os.chdir(name)
        os.fchdir(home)
    for _ in range(files):  # one folder of many files
        os.makedirs("many", exist_ok=True)
        open(f"many/{_}", "w").close()
    os.makedirs("locked/inner")
    open("locked/inner/f", "w").close()
    os.chmod("locked/inner", 0)
    os.chmod("locked", 0)
    os.makedirs("readonly")
    open("readonly/f", "w").close()
    os.chmod("readonly/f", 0)
    os.chmod("readonly", 0o500)
    os.mkfifo("fifo")
    socket.socket(socket.AF_UNIX).bind("sock")
    os.symlink("loop-b", "loop-a")
    os.symlink("loop-a", "loop-b")
    for name, target in (("up", ".."), ("root", "/"), ("outside", outside), ("outside-file", f"{outside}/canary")):
        os.symlink(target, name)
    keep = open("kept-open", "w")  # a file it still holds
    os.chmod(".", 0)  # and the folder itself
    return keep
'''


def test_the_wipe_removes_whatever_a_child_left(tmp_path):
    """Deep trees, names past PATH_MAX, folders made unreadable, FIFOs, sockets, link loops, links out
    (never followed), many files, the scratch folder itself made unreadable: emptied, never recursively."""
    scope = {}
    exec(NASTY_TREE, scope)
    root = Path(tempfile.mkdtemp(dir="/tmp" if os.geteuid() == 0 else tmp_path))  # pytest's folders: mode 0700
    top, outside = root / "scratch", root / "outside"
    top.mkdir()
    outside.mkdir()
    (outside / "canary").write_text("x")
    uid = 65534 if os.geteuid() == 0 else os.geteuid()  # as root, permissions would not be tested
    for path in (root, top):
        os.chmod(path, 0o755)
    os.chmod(outside, 0o751)  # a link's target keeps its mode (a wipe that chmods through links: any folder)
    os.chown(top, uid, uid) if os.geteuid() == 0 else None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's tree and the worker's wipe, as the same unprivileged user
        ok = b"?"
        try:
            os.setgid(uid) if os.geteuid() == 0 else None
            os.setuid(uid) if os.geteuid() == 0 else None
            keep = scope["nasty_tree"](str(top), str(outside))
            os.chdir("/")
            ok = b"1" if runner.wipe([str(top)], {str(top): 0o755}) else b"0"
            keep.close()
        except BaseException as e:
            ok = repr(e).encode()[:500]
        finally:
            os.write(w, ok)
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"1"
    try:
        assert top.is_dir() and list(top.iterdir()) == [] and (top.stat().st_mode & 0o777) == 0o755
        assert (outside / "canary").read_text() == "x" and (outside.stat().st_mode & 0o777) == 0o751
    finally:
        assert runner.remove_tree(str(root))


def test_a_tree_that_cannot_be_removed_is_reported_not_raised(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.setattr(runner.os, "rmdir", lambda *a, **k: (_ for _ in ()).throw(PermissionError("no")))
    assert runner.wipe([str(tmp_path)]) is False
    assert runner.remove_tree(str(tmp_path)) is False


def test_auto_never_takes_a_mode_that_hides_no_file(tmp_path, monkeypatch):
    """A bubblewrap that fails (Ubuntu's AppArmor rule, a container) first on PATH: auto takes the uid mode
    (root, the course private) or refuses in one line naming bubblewrap; never unshare, which hides nothing."""
    (tmp_path / "bwrap").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    try:
        assert choose_mode("auto") == "uid"
    except SandboxError as e:
        assert "bubblewrap" in str(e) and "\n" not in str(e), e
    from autograder.worker import weak_mode_warning

    for mode in ("unshare", "none"):
        assert all(word in weak_mode_warning(mode) for word in ("solutions/", "RESULTS", "gradebook")), mode
    assert weak_mode_warning("bwrap") is weak_mode_warning("uid") is None


def test_a_reply_is_capped_by_its_data_not_by_what_it_says_its_size_is():
    """An ndarray subclass whose nbytes says 0 still counts its data against the reply's cap."""
    import numpy as np

    from autograder.sandbox.server import MAX_REPLY_BYTES, ObjectServer

    class Liar(np.ndarray):
        @property
        def nbytes(self):
            return 0

    big = np.zeros(MAX_REPLY_BYTES // 4 + 1, dtype=np.float32)
    server = ObjectServer({"liar": lambda: big.view(Liar), "honest": lambda: big[:16]})
    call = lambda name: server.handle({"op": "call", "target": {"name": name}, "args": [], "kwargs": {}})  # noqa: E731
    assert call("liar")["error"]["type"] == "OutputTooLarge"
    assert "ok" in call("honest")


@pytest.mark.slow
def test_time_limits_count_cpu_time_and_a_wait_is_regraded():
    """A call's limit counts the CPU time of the student's process (issue 33): code that computes past it is too slow
    for the graded sizes (its case is lost, with that message), code that sleeps passes the wall-clock backstop and
    is the grader's to regrade; neither is "an infinite loop?", and the child is restarted for the next call."""
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=1))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    cell = (
        "import time\n\ndef spin():\n    while True:\n        pass\n\n"
        "def nap():\n    time.sleep(60)\n\ndef quick():\n    return 7\n"
    )
    s = Session(sandbox, "01_attention", [cell])
    try:
        s.open()
        slow = s.transport(call("spin"))  # stopped by its CPU time, before the backstop
        assert list(slow) == ["too_slow"] and "CPU time" in slow["too_slow"] and "too slow" in slow["too_slow"], slow
        waited = s.transport(call("nap"))
        assert list(waited) == ["stalled"] and "grade it again" in waited["stalled"], waited
        assert s.transport(call("quick")) == {"ok": 7}
        used = s.transport({"op": "cpu"})  # Subject.cpu_seconds: the worker's reading, never the child's word
        assert isinstance(used["ok"], float) and used["ok"] >= 0, used
    finally:
        s.close()
        sandbox.close()


def test_a_stalled_call_is_flagged_for_regrading_and_a_slow_one_loses_its_case():
    """What grade stores for each: a wait is an error to regrade (never a fail); CPU past the limit fails the check."""
    from autograder.checking import Check, Subject
    from autograder.grade import run_check

    def replying(reply):
        return Subject(lambda request: reply)

    check = Check("f", lambda s: s.call("f"))
    stalled = run_check(check, replying({"stalled": "waited"}), 2)
    assert stalled["status"] == "error" and stalled.get("grader_error") is True, stalled
    slow = run_check(check, replying({"too_slow": "too slow for the graded sizes"}), 2)
    assert slow["status"] == "failed" and "too slow" in slow["message"] and not slow.get("grader_error"), slow


def test_restore_starts_no_child_only_to_restore_it():
    """Subject.restore() after a block whose child the next request replaces (a bound ended it, another kind is asked
    for) starts none: a fresh child has nothing isolated. The replaced child is ended, so none keeps the stand-ins."""
    try:
        sandbox = Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=20))
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    started, start = [], sandbox.start
    sandbox.start = lambda *args: started.append(1) or start(*args)
    s = Session(sandbox, "01_attention", ["def f():\n    return 1"])
    try:
        assert s.transport({"op": "isolate", "names": ["f"], "source": "def f():\n    return 2"}) == {"ok": None}
        assert s.transport(call("f")) == {"ok": 2}
        s.transport({"op": "forbid", "paths": ["softmax"]})
        assert s.transport({"op": "restore"}) == {"ok": None}
        s.transport({"op": "unforbid"})
        assert s.transport(call("f")) == {"ok": 1}
        assert len(started) == 2  # the first child and the one after restore(): none only to restore
    finally:
        s.close()
        sandbox.close()


def test_a_child_of_the_grader_s_cells_goes_on_to_run_the_notebook_s_with_the_same_paths_off():
    """Session.then(paths): the next child of the grader's cells (Subject.elsewhere) switches the paths off before
    them, and goes on to run the notebook's cells for a block that forbids the same paths: one process for both (issue
    33). The paths are off from its start; the notebook's cells see nothing the grader's defined; no memory bound is
    asked of it (what the grader's cells left would count); a cell that ends it is skipped in a fresh child."""
    try:
        sandbox = Sandbox(
            choose_mode("auto"),
            replace(DEFAULT_LIMITS, memory_mb=512, call_seconds=20),
            triton=False,
            forbids=["softmax"],
        )
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")
    started, start = [], sandbox.start
    sandbox.start = lambda *args: started.append(1) or start(*args)
    reach = "import torch\n\ndef reach():\n    try:\n        return torch.ones(2).softmax(0).tolist()\n" + (
        "    except Exception as e:\n        return type(e).__name__\n"
    )
    grader = [reach + "\ngraders = 1\n"]
    notebook = [reach + "\ndef sees():\n    return 'graders' in globals()\n", "import os\nos._exit(3)", "after = 2"]
    s = Session(sandbox, "01_attention", notebook)
    try:
        s.then(["softmax"])
        s.transport({"op": "elsewhere", "cells": grader})
        assert s.transport(call("reach")) == {"ok": "ForbiddenPath"}
        s.transport({"op": "here"})
        s.then([])
        s.transport({"op": "forbid", "paths": ["softmax"]})
        assert s.transport(call("sees")) == {"ok": False}
        assert s.transport(call("reach")) == {"ok": "ForbiddenPath"}
        assert s.transport({"op": "getattr", "global": "after", "name": "real"}) == {"ok": 2}
        assert len(started) == 2 and list(s.skipped) == [1], (started, s.skipped)  # the cell that ended it, skipped
        s.transport({"op": "unforbid"})
        s.then(["softmax"])
        s.transport({"op": "elsewhere", "cells": grader})
        assert s.transport(call("reach")) == {"ok": "ForbiddenPath"}
        s.transport({"op": "here"})
        s.transport({"op": "forbid", "paths": ["softmax"]})
        assert s.transport(call("sees")) == {"ok": False} and len(started) == 3  # it went on
        with pytest.raises(RuntimeError, match="grader's cells"):
            s.transport({"op": "bound", "mb": 40})
        s.transport({"op": "unforbid"})
        assert s.transport(call("reach")) == {"ok": [0.5, 0.5]} and len(started) == 4  # a plain child
    finally:
        s.close()
        sandbox.close()


def _softmax_sandbox():
    """A sandbox whose children may switch PyTorch's softmax off (Session.then's tests), or a skip where none starts."""
    try:
        return Sandbox(choose_mode("auto"), replace(DEFAULT_LIMITS, memory_mb=512), triton=False, forbids=["softmax"])
    except SandboxError as e:
        pytest.skip(f"no sandbox here: {e}")


def test_a_restore_between_the_grader_s_cells_and_the_notebook_s_keeps_the_child_that_goes_on():
    """Subject.restore() after an elsewhere block (a check that isolates names gives them back when it pauses) in the
    child that is to go on to the notebook's cells (Session.then) ended it, and the block that forbids the same paths
    started a fresh one: nothing of the notebook's is isolated in a child that ran only the grader's cells."""
    sandbox = _softmax_sandbox()
    started, start = [], sandbox.start
    sandbox.start = lambda *args: started.append(1) or start(*args)
    s = Session(sandbox, "01_attention", ["def f():\n    return 1\n"])
    try:
        s.then(["softmax"])
        s.transport({"op": "elsewhere", "cells": ["graders = 1\n"]})
        assert s.transport({"op": "getattr", "global": "graders", "name": "real"}) == {"ok": 1}
        s.transport({"op": "here"})
        s.then([])
        assert s.transport({"op": "restore"}) == {"ok": None}
        s.transport({"op": "forbid", "paths": ["softmax"]})
        assert s.transport(call("f")) == {"ok": 1}
        assert len(started) == 1, started
    finally:
        s.close()
        sandbox.close()


def test_the_notebook_s_cells_see_no_output_of_the_grader_s_in_the_child_that_ran_both():
    """runner.child resets the namespace between the grader's cells and the notebook's (Session.then): IPython's output
    history (Out, _oh), a dict the fresh namespace shares, kept what a grader's cell showed."""
    sandbox = _softmax_sandbox()
    s = Session(sandbox, "01_attention", ["def seen():\n    return [list(Out.values()), list(_oh.values())]\n"])
    try:
        s.then(["softmax"])
        s.transport({"op": "elsewhere", "cells": ["graders = 41\ngraders\n"]})
        assert s.transport({"op": "getattr", "global": "graders", "name": "real"}) == {"ok": 41}
        s.transport({"op": "here"})
        s.then([])
        s.transport({"op": "forbid", "paths": ["softmax"]})
        assert s.transport(call("seen")) == {"ok": [[], []]}
    finally:
        s.close()
        sandbox.close()


def test_the_grader_s_cells_run_first_in_the_child_that_then_switches_paths_off_for_the_notebook():
    """grade.run_checks: parts that run the grader's cells go before the parts that wait for paths off, in one child
    (Session.then), unless a check under a memory bound switches the same paths off: its bound must count the
    notebook's process alone."""
    from autograder.checking import Check
    from autograder.grade import run_checks

    def order(bounded):
        said = []

        def part(name, label):
            def fn(s):
                yield label
                said.append(name)

            return fn

        checks = [
            Check("values", part("values", ("forbid", ("softmax",)))),
            Check("replay", part("replay", ("elsewhere", ("cell",)))),
            Check("tiled", part("tiled", ("forbid", ("softmax",))), aspects={"v": 1, "t": 1}, memory_bound=bounded),
        ]
        checks[2].forbid = {"aspect": "t", "paths": ["softmax"], "instead": "x"}
        session = SimpleNamespace(then=lambda paths: said.append(tuple(paths)))
        run_checks([(c, Subject(lambda r: {"ok": None}), 1, None) for c in checks], session)
        return said

    assert order(False) == [("softmax",), "replay", (), "values", "tiled"]
    assert order(True) == ["values", "tiled", "replay"]


def test_the_worker_warms_triton_s_interpreter_before_its_children_fork():
    """The interpreter rewrites Triton's own @triton.jit functions (tl.max, tl.sum) at their first use in a process:
    the worker does it once (warm_kernel), not each child that launches a student's kernel (issue 33)."""
    pytest.importorskip("triton")
    probe = (
        "from autograder.sandbox import runner\n"
        "runner.preload(True)\n"
        "import triton.language as tl\n"
        "from triton.runtime.interpreter import InterpretedFunction\n"
        "print(all(f.fn in InterpretedFunction.rewritten_fn for f in (tl.max, tl.sum)))\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]
