"""The grader's side of the sandbox: start a sandboxed worker, run a submission in it.

Modes, strongest first (see README, "The sandbox and what it protects"); auto takes bwrap or uid, never
a mode that hides no file:
- bwrap: bubblewrap. New user, PID, network, IPC and mount namespaces; the file system is only
  the system's libraries, Python and its packages, read-only, with debuggers masked, plus an
  empty, writable /scratch (HOME and TMPDIR); /tmp exists but is read-only; no capabilities;
  dies with the grader.
- uid (root, where namespaces are refused: Docker, Kubernetes, Gradescope): each child runs as an
  unprivileged uid of its own sandbox, which must not be able to read the course (checked at
  start: fail closed). The worker runs as root and kills and cleans after that uid.
- unshare (only when asked for, with a warning: WEAK_MODES): util-linux unshare. No network, its
  own PID and IPC namespaces (everything dies with the worker), resource limits. The file system
  is NOT hidden: student code reads and writes whatever the grader's user can.
- none (--unsafe only): a plain subprocess with resource limits.
Every mode but none: a non-dumpable worker and, in each child, a seccomp filter (no ptrace, no
process_vm_readv/writev, no IP sockets), no capabilities, its own IPC namespace and size-limited /dev/shm where
the kernel allows, and a memory cgroup (shared memory counts) and a pids cgroup where one can be
made; the worker checks its own code between submissions and restarts when it changed.
Every mode: memory, CPU time, file size and process limits on the child, wall-clock limits
per cell, per call and per notebook, enforced from here by killing. Every frame from the
sandbox is validated, and capped in size and item count, before use.
"""

import importlib.machinery
import importlib.util
import itertools
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from autograder.check_submission import MAX_CODE_CHARS
from autograder.sandbox import wire
from autograder.sandbox.runner import prepared_cells, reap, remove_tree

SANDBOX_PKG = Path(__file__).resolve().parent / "sandbox"
SCRATCH = "/scratch"  # inside bubblewrap: the only writable folder (with /dev/shm)


class LimitsError(ValueError):
    """Limits that cannot be used: one line naming the field (the caller adds the file or flag)."""


@dataclass(frozen=True)
class Limits:
    """What one submission may use: memory (MB), CPU time (s), file size (MB) and processes (the child's
    rlimits and cgroup), the CPU time per cell and per checked call (s: what the student's process used, read from
    outside it, so that a busy grader does not change a verdict) and the wall clock per notebook (s). A cell or call
    also has a wall-clock backstop, WALL_FACTOR times its CPU limit, for code that sleeps or blocks: its expiry is
    the grader's to regrade, never a fail.
    DEFAULT_LIMITS is the grader's; a lesson's manifest ([limits] in lesson.toml, autograder/lessons/__init__.py)
    raises or lowers any of them, and grade's flags (--memory, --cell-timeout, ...) override both
    (grade.lesson_limits), each through over(), the one reader, which validates."""

    memory_mb: int = 3072
    cpu_seconds: int = 600
    file_mb: int = 64
    processes: int = 256
    cell_seconds: int = 60
    call_seconds: int = 30
    notebook_seconds: int = 600

    def over(self, overrides, where="limits") -> "Limits":
        """These limits with `overrides` {field: value} put over them; LimitsError naming `where`.field for
        a field Limits has not or a value that is not a positive whole number."""
        names = [f.name for f in fields(self)]
        for key, value in (overrides or {}).items():
            if key not in names:
                raise LimitsError(f"{where}.{key}: unknown limit; a lesson may set {', '.join(names)}")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise LimitsError(f"{where}.{key}: should be a positive whole number, not {value!r}")
        return replace(self, **(overrides or {}))

    def statement(self) -> str:
        """The limits a student can hit, in the words each lesson's introduction and check_submission.py use (tests
        hold the lessons to them)."""
        return (
            f"each code cell may use {self.cell_seconds} s and each graded call {self.call_seconds} s of CPU time "
            f"(time your code computes, not time it waits), the whole notebook {self.cpu_seconds} s, and "
            f"{self.memory_mb} MB of memory"
        )

    def to_json(self) -> dict:
        """{field: value}: what grade's fingerprint hashes."""
        return asdict(self)

    def child(self) -> dict:
        """The four the sandbox's child sets on itself (sandbox/runner.set_limits), as its start message sends them."""
        return {
            "memory_mb": self.memory_mb,
            "cpu_seconds": self.cpu_seconds,
            "file_mb": self.file_mb,
            "processes": self.processes,
        }


DEFAULT_LIMITS = Limits()
WALL_FACTOR = 4  # a cell's or call's wall-clock backstop, in times its CPU limit
POLL_SECONDS = 0.5  # how often the CPU time of a cell or call that has not answered is read
TOO_SLOW = (
    "your code used more than {s} s of CPU time on one call, the limit for each (the lesson states it), "
    "and was stopped: correct but too slow for the graded sizes (check_submission.py times one case at them). "
    "Loop over tiles with torch operations, not over single entries in Python, and keep the block sizes "
    "you are given"
)
STALLED = (
    "your code neither finished nor used the CPU for {s} s (it waited: sleep, input(), a lock, a busy "
    "grader?): not graded; your instructor will grade it again"
)

# Debuggers are masked inside bubblewrap (the seccomp filter stops them anyway).
DEBUGGERS = (
    "gdb",
    "gdbserver",
    "gdb-multiarch",
    "gcore",
    "strace",
    "ltrace",
    "lldb",
    "lldb-server",
    "perf",
    "eu-stack",
    "pstack",
)
MAX_CALLBACKS = 100_000
# Tests only: a run without the defences this module adds, to show that the attacks they stop are real.
UNPROTECTED_ENV = "AUTOGRADER_TEST_UNPROTECTED"


class SandboxError(RuntimeError):
    """The sandbox could not be started or stopped answering."""


class Timeout(Exception):
    pass


class OverCpu(Exception):
    """A cell or call used more CPU time than its limit (the student's process, read from outside it)."""


class Stalled(Exception):
    """A cell or call passed its wall-clock backstop without using up its CPU limit."""


class Died(Exception):
    """The child ended (os._exit, a signal, a resource limit) while we waited for it."""


class Malformed(Died):
    """The child sent something that is not a valid frame: it is killed all the same."""


def _works(cmd):
    try:
        return (
            subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_mode(requested="auto", unsafe=False):
    """The sandbox mode to use; raises SandboxError (fail closed) when none works. auto takes only
    a mode that hides the course, the gradebook and every other file from student code (bwrap,
    uid); unshare and none, which do not, are used only when asked for (see WEAK_MODES)."""
    py = sys.executable
    probes = {"bwrap": _bwrap_base() + ["--", py, "-c", "pass"], "unshare": _unshare_base() + [py, "-c", "pass"]}
    candidates = ["bwrap", "uid"] if requested == "auto" else [requested]
    why = ""
    for mode in candidates:
        if mode == "uid":
            why = _uid_refusal()
            if not why:
                return mode
        elif mode == "none" or (mode in probes and shutil.which(probes[mode][0]) and _works(probes[mode])):
            if mode == "none" and not unsafe:
                break
            return mode
    if requested == "uid":
        raise SandboxError(f"no sandbox available for mode 'uid': {why}")
    if requested == "none":
        raise SandboxError(
            "--sandbox none runs student code with no sandbox at all: add --unsafe (only for code you trust)"
        )
    if requested == "unshare":
        raise SandboxError(
            "no sandbox available for mode 'unshare': util-linux's unshare cannot create its namespaces "
            "here; use --sandbox auto"
        )
    bwrap = (
        "bubblewrap cannot create its namespaces here (AppArmor's rule on unprivileged user namespaces, "
        "a container): allow them"
        if shutil.which("bwrap")
        else "install bubblewrap (apt-get install bubblewrap)"
    )
    raise SandboxError(
        f"no sandbox that hides the file system from student code works here for mode {requested!r}: "
        f"{bwrap}, or run as root with the course unreadable to other users (the uid mode); "
        "--sandbox unshare (which hides no file) or --unsafe grade only code you trust"
    )


# Modes that do not hide the file system: taken only when asked for, and said once per run (grade.py).
WEAK_MODES = {
    "unshare": "the unshare sandbox hides no file: student code can read and write whatever the grader's user "
    "can (solutions/, the hidden checks, other submissions, RESULTS, the gradebook, other copies of "
    "the course); only its network, processes and limits are contained",
    "none": "no sandbox (--unsafe): student code can read and write whatever the grader's user can (solutions/, "
    "the hidden checks, other submissions, RESULTS, the gradebook), use the network and leave processes "
    "behind",
}


def weak_mode_warning(mode):
    """One line saying what `mode` does not protect, or None for a mode that hides the file system."""
    return (
        f"warning: {WEAK_MODES[mode]}; grade with bubblewrap or the uid mode for anything that counts"
        if mode in WEAK_MODES
        else None
    )


def _system_binds():
    """Read-only binds: system libraries, the Python install and its packages, a few /etc files."""
    paths = [
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/alternatives",
        "/etc/localtime",
        "/etc/fonts",
        sys.base_prefix,
        sys.prefix,
        os.path.realpath(sys.executable),
    ]
    return [p for p in dict.fromkeys(paths) if os.path.exists(p)]


def _package_dirs():
    return [
        str(Path(loc).resolve())
        for name in ("solutions", "autograder")
        for spec in [importlib.util.find_spec(name)]
        if spec
        for loc in (spec.submodule_search_locations or [])
    ]


def _hidden_packages():
    """Folders of our own packages that the Python binds would expose (a non-editable install)."""
    return [loc for loc in _package_dirs() if any(Path(loc).is_relative_to(Path(b).resolve()) for b in _system_binds())]


def _bwrap_base(shm_mb=64, protect=True):
    cmd = [
        "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--cap-drop",
        "ALL",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--size",
        str(1 << 30),
        "--tmpfs",
        SCRATCH,
    ]
    cmd += (["--size", str(shm_mb << 20)] if protect else []) + ["--tmpfs", "/dev/shm"]
    for p in _system_binds():
        cmd += ["--ro-bind", p, p]
    for p in _hidden_packages():
        cmd += ["--tmpfs", p]
    if protect:
        found = {
            os.path.realpath(os.path.join(d, name))
            for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin")
            for name in DEBUGGERS
            if os.path.isfile(os.path.join(d, name))
        }
        for path in sorted(found):
            cmd += ["--ro-bind", "/dev/null", path]
    for dev in sorted(Path("/dev").glob("nvidia*")):  # a GPU, where there is one
        cmd += ["--dev-bind", str(dev), str(dev)]
    return cmd


def _unshare_base():
    cmd = ["unshare", "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc"]
    return cmd + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])


# Run as the uid: "bad PATH" for a needed path it cannot read (or enter), "seen PATH" for a course path it can read.
_UID_CHECK = (
    'while [ "$1" != -- ]; do [ -r "$1" ] && [ -x "$1" ] || echo "bad $1"; shift; done; shift; '
    'for p do [ -r "$p" ] && echo "seen $p"; done; exit 0'
)


def _course_paths():
    """Where the worker's Python would find the course: the lessons, and our packages wherever it would import
    them from (an editable install, site-packages), found as it finds them: not in our working folder."""
    path = [p for p in sys.path if p not in ("", os.getcwd())]
    found = [str(Path(_package_dirs()[-1]).parent / "lessons")]
    for name in ("solutions", "autograder"):
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find and find(name, path if finder is importlib.machinery.PathFinder else None)
            found += [spec.origin] + list(spec.submodule_search_locations or []) if spec else []
    return [p for p in dict.fromkeys(found) if p]


def _uid_refusal(uid=None):
    """Why the uid mode cannot be used here ('' when it can): it needs root, and a uid that can
    read the Python install (a child imports lazily) but not the course: the lessons, and our
    packages wherever the worker's Python would find them (an editable install, site-packages).
    Asked of a shell run as that uid by subprocess itself (no preexec_fn, no os.fork: grade starts sandboxes from
    threads, and a fork that runs Python there races imports; see _Cgroups.joining)."""
    if os.geteuid() != 0:
        return "the uid mode needs the grader to run as root"
    uid = uid or _free_uid()
    needed = [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
    try:
        lines = subprocess.run(
            ["/bin/sh", "-c", _UID_CHECK, "sh", *needed, "--", *_course_paths()],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return f"the uid mode could not be checked as uid {uid}: {e}"
    bad, seen = ([line.split(" ", 1)[1] for line in lines if line.startswith(word)] for word in ("bad ", "seen "))
    why = (
        f"uid {uid} cannot read the Python install at {', '.join(bad)}"
        if bad
        else f"uid {uid} can read {', '.join(seen)}: make the course owned by root with mode 0700"
        if seen
        else ""
    )
    return f"the uid mode needs the course unreadable to other users and Python readable: {why[:4000]}" if why else ""


def _free_uid():
    """An unprivileged uid of our own: no account, no files (a random one in a range far above
    real accounts, so that two sandboxes, even of two graders, almost never share one)."""
    return random.randrange(1_000_000, 2_000_000_000)


def _env(scratch):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": f"{scratch}/.mpl",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TRITON_CACHE_DIR": f"{scratch}/.triton",
    }
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run in its interpreter on a CPU
    return env


class _Cgroups:
    """A pids cgroup capping the sandbox's processes and a memory cgroup (v1 or v2) where we may
    make them. The memory one counts what rlimits cannot: SysV and /dev/shm memory."""

    _count = itertools.count()

    def __init__(self, processes, memory):
        self.paths = {}
        name = f"mha-autograder-{os.getpid()}-{next(self._count)}"
        for controller, files in (("pids", ("pids.max",)), ("memory", ("memory.limit_in_bytes", "memory.max"))):
            if controller == "memory" and not memory:
                continue
            for root in (f"/sys/fs/cgroup/{controller}", "/sys/fs/cgroup"):
                if os.path.exists(os.path.join(root, "cgroup.procs")) and os.access(root, os.W_OK):
                    path = os.path.join(root, name)
                    try:
                        os.makedirs(path, exist_ok=True)
                        if not any(os.path.exists(os.path.join(path, f)) for f in files):
                            raise OSError("controller not enabled")
                        if controller == "pids":
                            Path(path, "pids.max").write_text(str(processes))
                        self.paths[controller] = path
                        break
                    except OSError:
                        if not self.paths or path not in self.paths.values():
                            self._rmdir(path)

    @property
    def path(self):
        return self.paths.get("pids")

    def joining(self, cmd):
        """cmd, started inside the cgroups: a shell moves itself into each, then execs cmd (exit status 125, and
        nothing run, when one refuses it). Not a preexec_fn: that makes subprocess fork the grader and run Python
        in the child, and grade starts sandboxes from threads (grade.Warm, --jobs) while others import: a fork
        racing an import that registers at-fork hooks (logging's) breaks them ("Exception ignored in
        <function _releaseLock>"), and a lock another thread held stays held in the child. Without one,
        subprocess runs no Python between fork and exec."""
        groups = list(dict.fromkeys(self.paths.values()))
        if not groups:
            return cmd
        join = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *groups, "--", *cmd]

    def limit_memory(self, extra_mb):
        """Once the worker has imported everything: what it uses now plus extra_mb, for everything."""
        path = self.paths.get("memory")
        if not path:
            return
        v1 = os.path.exists(os.path.join(path, "memory.limit_in_bytes"))
        used = int(Path(path, "memory.usage_in_bytes" if v1 else "memory.current").read_text())
        limit = str(used + extra_mb * 2**20)
        for f in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") if v1 else ("memory.max", "memory.swap.max"):
            try:
                Path(path, f).write_text(limit if "swap." not in f else "0")
            except OSError:
                pass  # no swap accounting: there is no swap to count, or the RAM limit still holds

    def remove(self):
        for path in dict.fromkeys(self.paths.values()):
            self._rmdir(path)

    @staticmethod
    def _rmdir(path):
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


class Sandbox:
    """One sandboxed worker. start() gives a fresh child per submission (see runner.py)."""

    def __init__(self, mode, limits: Limits = DEFAULT_LIMITS, data_dir=None, triton=True, forbids=()) -> None:
        """triton: the worker imports Triton before its children fork (grade: where a lesson graded imports it).
        forbids: the paths some children switch off (the lessons' [forbids]), found before they fork (tripwires)."""
        self.mode, self.limits = mode, limits
        self.uid = None  # the uid mode's children's
        self._exited = None  # an "exited" that came in answer to cpu(), for stop_child
        self.protect = mode != "none" and os.environ.get(UNPROTECTED_ENV) != "1"
        # The uid mode's child must be able to enter this folder: not one inside a private one.
        self._tmp = tempfile.mkdtemp(prefix="mha-sandbox-", dir="/tmp" if mode == "uid" else None)
        pkg = Path(self._tmp, "sandbox")  # a private copy of the sandbox code: nothing else of ours
        shutil.copytree(SANDBOX_PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
        self.ctl, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = child_end.fileno()
        runner = [sys.executable, "-m", "sandbox.runner", str(fd)]
        flags = ([] if self.protect else ["--unprotected"]) + ([] if triton else ["--no-triton"])
        flags += [f"--forbids={','.join(forbids)}"] if forbids else []
        popen_env = None
        if mode == "bwrap":
            cmd = _bwrap_base(self.limits.memory_mb, self.protect)
            cmd += ["--ro-bind", self._tmp, "/opt/grader", "--chdir", SCRATCH, "--clearenv"]
            for k, v in dict(_env(SCRATCH), PYTHONPATH="/opt/grader").items():
                cmd += ["--setenv", k, v]
            if data_dir:
                cmd += ["--ro-bind", str(data_dir), "/course"]
            # Everything read-only but /scratch and /dev/shm, which the worker wipes after every
            # submission. (/tmp may hold mount points of the binds: it must not be writable.)
            cmd += ["--remount-ro", "/tmp", "--remount-ro", "/", "--"] + runner + [SCRATCH, "--private-tmp", "--pidns"]
            self.course_dir = "/course" if data_dir else None
        else:
            scratch = Path(self._tmp, "scratch")
            scratch.mkdir()
            local = dict(_env(str(scratch)), PYTHONPATH=self._tmp)
            self.course_dir = str(data_dir) if data_dir else None
            if mode == "uid":
                uid = _free_uid()
                why = _uid_refusal(uid)
                if why:
                    remove_tree(self._tmp)
                    raise SandboxError(why)
                # The child may enter our folder (not list it), and write only to its scratch;
                # the course's data files are copied where it may read them.
                os.chmod(self._tmp, 0o711)
                os.chown(scratch, uid, uid)
                if data_dir:
                    self.course_dir = shutil.copytree(data_dir, Path(self._tmp, "course"))
                    for root, dirs, files in os.walk(self.course_dir):
                        for name in dirs + files:
                            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
                    os.chmod(self.course_dir, 0o755)
                cmd, popen_env = runner + [str(scratch), f"--uid={uid}"], local
                self.uid = uid
            elif mode == "unshare":
                cmd, popen_env = _unshare_base() + runner + [str(scratch), "--pidns"], local
            else:
                cmd, popen_env = runner + [str(scratch)], local
        self.cgroup = _Cgroups(self.limits.processes, memory=self.protect)
        if self.cgroup.path and mode != "bwrap":
            cmd.append(f"--cgroup={self.cgroup.path}")
        self.proc = subprocess.Popen(
            self.cgroup.joining(cmd + flags),
            pass_fds=[fd],
            env=popen_env,
            cwd=self._tmp,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        child_end.close()
        reply = self._recv(120)
        if reply is None or reply.get("op") != "ready":
            try:  # it closed its socket as it died: let it end, so that what it wrote can be read
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            err = self.proc.stderr.read1(65536).decode(errors="replace") if self.proc.poll() is not None else ""
            self.close()
            last = [line.strip() for line in err.splitlines() if line.strip()]  # a traceback ends with its cause
            raise SandboxError(f"the {mode} sandbox did not start: {last[-1][:300] if last else 'no answer'}")
        self.cgroup.limit_memory(self.limits.memory_mb)

    def _recv(self, timeout):
        """One control message from the worker, a dict with a str "op" (None when it is gone or
        sent anything else: the worker is ours, but a broken one must not break the grader)."""
        self.ctl.settimeout(timeout)
        try:
            msg = json.loads(self.ctl.recv(65536) or "null")
        except (socket.timeout, OSError, ValueError, RecursionError):
            return None
        return msg if isinstance(msg, dict) and isinstance(msg.get("op"), str) else None

    def alive(self):
        return self.proc.poll() is None

    def start(self, lesson, data_files):
        """A fresh child for one submission; returns its data socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        start = {
            "op": "start",
            "limits": self.limits.child(),
            "data_files": data_files,
            "data_dir": f"{self.course_dir}/{lesson}" if self.course_dir else "",
        }
        try:
            socket.send_fds(self.ctl, [json.dumps(start).encode()], [theirs.fileno()])
        except OSError as e:
            raise SandboxError(f"the sandbox stopped answering: {e}") from None
        finally:
            theirs.close()
        return ours

    def bound(self, mb, headroom=0, inputs=0):
        """Before a bounded block of calls: the worker kills every process of the sandbox but itself
        and the serving child, then lowers the child's address-space limit (soft and hard, from
        outside the child: nothing in the student's process takes part) to what a fresh worker maps
        plus mb MiB (plus what it holds, up to headroom MiB, and the grader's own inputs: runner.bound), and
        its process limit to none. Returns {"held_mb": what the child mapped beyond a fresh worker}, with
        "refused": why when refused (a student's process that already holds the whole bound, see
        runner.bound(); held_mb is absent when it ended first)."""
        try:
            self.ctl.send(
                json.dumps({"op": "bound", "mb": int(mb), "headroom": int(headroom), "inputs": int(inputs)}).encode()
            )
        except OSError as e:
            raise SandboxError(f"the sandbox stopped answering: {e}") from None
        reply = self._recv(30)
        if reply is None or reply["op"] not in ("bounded", "refused"):
            self.close()
            raise SandboxError("the sandbox stopped answering")
        held = reply.get("held_mb")
        held = {"held_mb": held} if isinstance(held, int) and 0 <= held < 2**40 else {}
        return {"refused": str(reply.get("why"))[:500], **held} if reply["op"] == "refused" else held

    def confine(self):
        """Once the cells ran with paths off (Subject.forbidding), before any call: the worker kills every process of
        the sandbox but itself and the serving child, and sets the child's process limit to none, from outside the
        child (runner.confine), so that a Python of the student's own, where no path is off, does none of the calls'
        work. Cells ran unconfined (pip list, nvidia-smi in a cell cost nothing); the other children are not
        confined (Triton compiles a kernel at its first launch on a GPU, with processes of its own)."""
        try:
            self.ctl.send(json.dumps({"op": "confine"}).encode())
        except OSError as e:
            raise SandboxError(f"the sandbox stopped answering: {e}") from None
        reply = self._recv(30)
        if reply is not None and reply["op"] == "exited":  # the child ended: its calls say so
            self._exited = reply
        elif reply is None or reply["op"] not in ("confined", "refused"):
            self.close()
            raise SandboxError("the sandbox stopped answering")

    def cpu(self):
        """The CPU seconds the serving child (and every process of the sandbox) used so far (runner.cpu_seconds), or
        None when it has ended (its "exited" is kept for stop_child)."""
        try:
            self.ctl.send(json.dumps({"op": "cpu"}).encode())
        except OSError as e:
            raise SandboxError(f"the sandbox stopped answering: {e}") from None
        reply = self._recv(30)
        if reply is not None and reply["op"] == "exited":
            self._exited = reply
            return None
        seconds = reply.get("seconds") if reply is not None and reply["op"] == "cpu" else None
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            self.close()
            raise SandboxError("the sandbox stopped answering")
        return float(seconds)

    def stop_child(self, data):
        """Make sure the current child is gone and the worker is clean again."""
        data.close()  # a child waiting for a request now ends by itself
        try:
            self.ctl.send(json.dumps({"op": "kill"}).encode())
        except OSError:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reply, self._exited = self._exited or self._recv(max(deadline - time.monotonic(), 0.01)), None
            if reply is None:
                break
            if reply["op"] == "exited":
                if reply.get("restart"):  # the worker found its own code changed: a fresh one next time
                    self.close()
                return
        self.close()
        raise SandboxError("the sandbox stopped answering")

    def close(self):
        try:
            self.ctl.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        # A child outside the worker's process group (its own session) is ended too: by cgroup and,
        # in the uid mode, by uid. Then its scratch folder goes, whatever it holds (never recursively).
        reap({"pidns": False, "uid": self.uid, "cgroup": self.cgroup.path})
        self.cgroup.remove()
        remove_tree(self._tmp)


class Session:
    """One submission in a sandbox: run its cells, then forward check requests to it.

    A cell that hangs past its limit or kills the process is skipped on a restart, so the rest
    of the notebook can still be graded; a check whose call hangs or crashes gets an "unchecked"
    reply and the next check runs in a restarted child.
    """

    MAX_STARTS = 6

    def __init__(self, sandbox, lesson, cells, data_files=()):
        self.sandbox, self.lesson, self.cells, self.data_files = sandbox, lesson, list(cells), list(data_files)
        self.skipped = {}  # cell index -> why it was skipped
        self.cell_errors = {}  # cell index -> error description
        self.data = None
        self.bounded = False  # inside Subject.memory_bound: the child runs under a memory bound
        self.forbid = ()  # inside Subject.forbidding: the paths to switch off before the cells (tripwires)
        self.elsewhere = None  # inside Subject.elsewhere: the grader's cells, run instead of the notebook's
        self.reached = None  # with paths off: the first cell's ForbiddenPath (describe()), a failed call's cause
        self.serving = ((), None)  # (forbid, elsewhere) of the serving child
        self.ahead = ()  # see then()
        self.goes_on = None  # the paths with which the serving child of the grader's cells may run the notebook's
        self.went_on = False  # the serving child ran the grader's cells before the notebook's (_serve)
        self.starts = 0
        self.deadline = time.monotonic() + sandbox.limits.notebook_seconds
        # What the grader parses from the sandbox is capped (its own memory); tests may lift it.
        self.caps = {} if sandbox.protect else {"max_bytes": 2**32 - 1, "max_tokens": None}
        self.prepared = None  # prepared_cells(cells), made at the first start

    def _recv(self, timeout):
        timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise Timeout("notebook")
        self.data.settimeout(timeout)
        try:
            msg = wire.recv_frame(self.data, **self.caps)
        except socket.timeout:
            raise Timeout("call") from None
        except wire.WireError as e:
            raise Malformed(str(e)) from None
        except OSError as e:
            raise Died(str(e)) from None
        if msg is None:
            raise Died("the process ended")
        if not isinstance(msg, dict):
            raise Malformed("a message that is not a JSON object")
        return msg

    def _await(self, cpu_limit):
        """The next frame, waited for while the child uses less than cpu_limit CPU seconds and the wall clock stays
        within WALL_FACTOR times that; past them OverCpu or Stalled (Timeout("notebook") past the notebook's limit).
        The CPU time is read only when no frame came within POLL_SECONDS (from there: a call that answers sooner
        costs no reading, and the student is never charged for more than it used)."""
        begun = time.monotonic()
        backstop, start = begun + cpu_limit * WALL_FACTOR, None
        while True:
            now = time.monotonic()
            wait = min(POLL_SECONDS, backstop - now, self.deadline - now)
            if wait > 0 and select.select([self.data], [], [], wait)[0]:
                return self._recv(max(backstop - time.monotonic(), 30))  # a frame is coming: read it whole
            if time.monotonic() >= self.deadline:
                raise Timeout("notebook")
            used = self.sandbox.cpu()
            if used is None:  # the child ended: its socket says so
                return self._recv(5)
            start = used if start is None else start
            if used - start > cpu_limit:
                raise OverCpu(f"{cpu_limit} s of CPU time")
            if time.monotonic() >= backstop:
                raise Stalled(f"{cpu_limit * WALL_FACTOR} s")

    def _progress(self, msg, n):
        """A cell progress frame, validated: ("done",), ("start", i) or ("end", i, error or None)."""
        if msg.get("cells") == "done":
            return ("done",)
        cell, state = msg.get("cell"), msg.get("state")
        if not self.sandbox.protect:  # tests only: trust the frame, as the grader once did
            return ("start", cell) if state == "start" else ("end", cell, msg.get("error"))
        if type(cell) is not int or not 0 <= cell < n or state not in ("start", "done"):
            raise Malformed(f"a malformed cell message {str(msg)[:100]!r}")
        error = msg.get("error")
        if state == "done" and error is not None and _student_error(error) is None:
            raise Malformed("a malformed cell error")
        return ("start", cell) if state == "start" else ("end", cell, error and _student_error(error))

    def open(self):
        """(Re)start the child and run the cells; raises SandboxError when it cannot be done."""
        while True:
            if self.starts >= self.MAX_STARTS:
                raise SandboxError("the notebook crashed or hung too many times to be graded")
            self.starts += 1
            self.close()
            if not self.sandbox.alive():
                raise SandboxError("the sandbox worker died")
            self.data = self.sandbox.start(self.lesson, self.data_files)
            self.serving, self.went_on = (self.forbid, self.elsewhere), False
            self.reached = None
            if self.elsewhere is not None:  # the grader's own cells: nothing of the notebook's runs, none skipped
                self.goes_on = self.ahead or None
                wire.send_frame(
                    self.data, {"cells": self.elsewhere, **({"forbid": list(self.ahead)} if self.ahead else {})}
                )
                try:  # timed by CPU as the notebook's cells are; the grader's cells are never skipped
                    while (
                        self._progress(self._await(self.sandbox.limits.cell_seconds), len(self.elsewhere))[0] != "done"
                    ):
                        pass
                except (Timeout, OverCpu, Stalled):
                    raise SandboxError("the grader's cells ran past their time limit") from None
                return
            if self._notebook(self.forbid):
                return

    def _notebook(self, forbid):
        """Run the notebook's cells in the serving child (forbid: the paths it is to switch off first, when it has
        not yet); returns whether they ran, else the child is to be restarted (a cell that ended it or ran past its
        limit is skipped from then on). Raises SandboxError when the notebook cannot be run."""
        self.goes_on = None
        run = [i for i in range(len(self.cells)) if i not in self.skipped]
        if self.prepared is None:
            texts, indices = prepared_cells(self.cells, MAX_CODE_CHARS)
            self.prepared = texts, set(indices)
        # The cells' errors a student is shown are those of a plain run: a child with paths off may fail a scratch
        # cell that calls one (Subject.forbidding).
        kept, self.cell_errors = self.cell_errors, {}
        current = None
        try:
            texts, prepared = self.prepared
            wire.send_frame(
                self.data,
                {
                    "cells": [texts[i] for i in run],
                    "prepared": [k for k, i in enumerate(run) if i in prepared],
                    **({"forbid": list(forbid)} if forbid else {}),
                },
            )
            while True:
                frame = self._progress(self._await(self.sandbox.limits.cell_seconds), len(run))
                if frame[0] == "done":
                    break
                current = run[frame[1]]
                if frame[0] != "start":
                    if frame[2]:
                        self.cell_errors[current] = frame[2]
                    current = None
        except Timeout:
            raise SandboxError("the notebook ran past its time limit") from None
        except (OverCpu, Stalled) as e:
            if current is None:
                raise SandboxError("the notebook ran past its time limit") from None
            self.skipped[current] = (
                f"used more than {self.sandbox.limits.cell_seconds} s of CPU time, the limit for each cell"
                if isinstance(e, OverCpu)
                else f"neither finished nor used the CPU within {e} (it waited: sleep, input()?)"
            )
        except (Died, OSError) as e:
            if current is None:
                raise SandboxError(f"the notebook's process ended: {e}") from None
            if not self._starved():  # else a cell before it ran out of memory and kept it: that one is skipped
                self.skipped[current] = "ended the Python process (os._exit, a crash or a resource limit)"
        else:
            if not self._starved():
                reached = [e for e in self.cell_errors.values() if self.forbid and e.get("type") == "ForbiddenPath"]
                self.reached = reached[0] if reached else None
                if self.forbid:  # the plain run's errors are shown; only the child itself may do the calls' work
                    self.cell_errors = kept
                    self.sandbox.confine()
                return True
        return False

    def _starved(self):
        """Skip, on the next start, the cells that ran out of memory in this run (MemoryError): one may keep what it
        took (a global list of buffers), so that every later call fails for it, or the process is killed for memory
        (the sandbox's cgroup, the machine) while a later cell runs, which is not that cell's doing. Returns whether
        there were any."""
        starved = [i for i, e in self.cell_errors.items() if "MemoryError" in (e.get("mro") or ())]
        for i in starved:
            self.skipped[i] = "ran out of memory (MemoryError)"
        return bool(starved)

    def transport(self, request, callback=None):
        """Send one check request; returns its reply (interfaces.md, section 1): ok, error (the
        student's exception), over_budget, or unchecked when the code could not be run to the end
        (a hang, the process ended, a malformed reply); the child is restarted next time.
        callback: the handler of the call's host_callback frames (Subject.call_with_callbacks)."""
        if request.get("op") in ("bound", "unbound"):
            return self._bound(request)
        if request.get("op") in ("forbid", "unforbid", "elsewhere", "here"):
            return self._kind(request)
        if (
            request.get("op") == "restore"
            and self.data is not None
            and self.goes_on is not None
            and self.elsewhere is None
        ):
            return {"ok": None}  # a child that ran only the grader's cells, to go on to the notebook's: none isolated
        if request.get("op") == "restore" and (self.data is None or self.serving != (self.forbid, self.elsewhere)):
            if self.data is not None:  # replaced at the next request: ended now, so that none keeps the stand-ins
                self.close()
                self.starts -= 1
            return {"ok": None}  # the next request runs in a fresh child, where nothing is isolated: none is started
        if request.get("op") == "cpu":  # Subject.cpu_seconds: the worker reads it, never the child
            self._serve()  # the child that serves the next call: the one to read
            return {"ok": self.sandbox.cpu()}
        if self.data is None and self.bounded:  # the child ended inside a bounded block: its calls stay unchecked
            return {"over_budget": "the process ended inside the memory bound"}
        self._serve()
        try:
            wire.send_frame(self.data, request)
            for _ in range(MAX_CALLBACKS + 1):
                reply = self._await(self.sandbox.limits.call_seconds)
                if "callback" not in reply:
                    # A cell reached a forbidden path (a compiler's decorator, say) with the paths off: the call
                    # failed for it, and its message says so.
                    return self._reply({"error": self.reached} if "error" in reply and self.reached else reply)
                if callback is None:
                    raise Malformed("a callback outside a call that allows them")
                try:
                    answer = wire.encode_plain(callback(wire.decode(reply["callback"])))
                except wire.WireError as e:
                    raise Malformed(f"a malformed callback: {e}") from None
                except BaseException:  # the check's own verdict (or bug): the call cannot go on
                    self.close()
                    raise
                wire.send_frame(self.data, {"callback_reply": answer})
            raise Malformed(f"more than {MAX_CALLBACKS} callbacks in one call")
        except Timeout:
            self.close()
            # the notebook's wall clock is a backstop too: past it, the grader's to regrade
            return {
                "stalled": f"the notebook's total time ({self.sandbox.limits.notebook_seconds} s) ran out: not "
                "graded; your instructor will grade it again"
            }
        except OverCpu:
            self.close()
            return {"too_slow": TOO_SLOW.format(s=self.sandbox.limits.call_seconds)}
        except Stalled:
            self.close()
            return {"stalled": STALLED.format(s=self.sandbox.limits.call_seconds * WALL_FACTOR)}
        except Malformed as e:
            self.close()
            return {"unchecked": f"your code could not be checked: its process sent {str(e)[:200]}"}
        except (Died, OSError):
            self.close()
            if self.bounded:
                return {"over_budget": "the call ran past its memory bound and its process ended"}
            return {
                "unchecked": "your code ended the Python process (os._exit, sys.exit in a thread, a crash such "
                "as a Triton kernel's tl.load or tl.store without mask=, or a memory or CPU limit)"
            }

    def _bound(self, request):
        """The host's part of Subject.memory_bound: {"op": "bound", "mb": N} has the worker bound the
        serving child (Sandbox.bound); {"op": "unbound"} ends that child (its limit cannot be lifted),
        so the next request runs the cells again in a fresh one. Never forwarded to the child."""
        if request["op"] == "unbound":
            if self.bounded and self.data is not None:
                self.close()
                self.starts -= 1  # a restart the grader asked for, not a crash of the notebook
            self.bounded = False
            return {"ok": None}
        self._serve()
        if self.went_on:  # a bug of ours (grade.run_checks): never a verdict
            raise RuntimeError("a memory bound asked of a child that ran the grader's cells before the notebook's")
        reply = self.sandbox.bound(request["mb"], request.get("headroom", 0), request.get("inputs", 0))
        self.bounded = True  # refused too: that child may start no thread or process any more (runner.bound)
        return reply if "refused" in reply else {"ok": None, **reply}

    def _kind(self, request):
        """The host's part of Subject.forbidding and Subject.elsewhere: {"op": "forbid", "paths": [...]} asks for a
        child that switched the paths off before running the cells (runner.child, sandbox/tripwires.py), "unforbid"
        for one that did not; {"op": "elsewhere", "cells": [...]} for one that runs the grader's cells instead of the
        notebook's, "here" for the notebook's again. The serving child is replaced at the next request that needs
        another kind (_serve), so blocks that follow each other share one. Never forwarded to the child."""
        op = request["op"]
        if op in ("forbid", "unforbid"):
            self.forbid = tuple(str(p) for p in request.get("paths", ())) if op == "forbid" else ()
        else:
            self.elsewhere = [str(c) for c in request.get("cells", ())] if op == "elsewhere" else None
        return {"ok": None}

    def _serve(self):
        """A serving child of the kind asked for (forbid), started or restarted as needed. A child that ran the grader's
        cells with the paths off that are asked for now (then()) goes on to run the notebook's cells instead."""
        if self.data is not None and self.serving != (self.forbid, self.elsewhere):
            if not self._goes_on():
                self.close()
                self.starts -= 1  # a restart the grader asked for, not a crash of the notebook
            else:
                self.serving = (self.forbid, None)
                if self._notebook(()):  # its paths are off since it began
                    self.went_on = True  # what the grader's cells left must be no part of a memory bound's count
                    return
                self.close()  # a cell ended it or ran past its limit: skipped in the fresh one
        if self.data is None:
            self.open()

    def _goes_on(self):
        """Whether the serving child ran the grader's cells with exactly the paths off that are asked for now (then()),
        so that it may run the notebook's cells next."""
        return self.goes_on is not None and self.elsewhere is None and self.goes_on == self.forbid

    def then(self, paths):
        """The next child that runs the grader's cells (Subject.elsewhere) switches `paths` off before them, and, once
        its block ends, runs the notebook's cells for a block that forbids the same paths (Subject.forbidding), in
        place of a fresh child for it: one process for both. Nothing of the notebook's runs before the grader's cells;
        its cells run in a fresh namespace, after them (runner.child). () for none (grade.run_checks)."""
        self.ahead = tuple(paths)

    def _reply(self, reply):
        """A reply frame, validated: exactly one known key, and an error that is plain data."""
        if not self.sandbox.protect:
            return reply
        if len(reply) != 1 or not {"ok", "error", "over_budget"} & reply.keys():  # too_slow, stalled: ours alone
            raise Malformed("a malformed reply")
        if "error" in reply:
            error = _student_error(reply["error"])
            if error is None:
                raise Malformed("a malformed error reply")
            return {"error": error}
        if "over_budget" in reply:
            return {"over_budget": str(reply["over_budget"])[:500]}
        return reply

    def close(self):
        if self.data is not None:
            data, self.data = self.data, None
            self.sandbox.stop_child(data)


def _student_error(e):
    """A student's exception as sent by the sandbox ({type, mro, message}), as plain strings of
    bounded length; None for anything else."""
    if not (
        isinstance(e, dict)
        and isinstance(e.get("type"), str)
        and isinstance(e.get("message"), str)
        and isinstance(e.get("mro"), list)
        and all(isinstance(m, str) for m in e["mro"])
    ):
        return None
    return {"type": e["type"][:200], "mro": [m[:200] for m in e["mro"][:64]], "message": e["message"][:2000]}
