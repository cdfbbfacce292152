"""The grader's side of the sandbox: start a sandboxed worker, run a submission in it.

Modes, strongest first (see README, "The sandbox and what it protects"):
- bwrap: bubblewrap. New user, PID, network, IPC and mount namespaces; the file system is only
  the system's libraries, Python and its packages, read-only, plus an empty, writable /scratch
  (HOME and TMPDIR); /tmp exists but is read-only; no capabilities; dies with the grader. A pids cgroup caps processes where one can be made.
- unshare: util-linux unshare. No network, its own PID namespace (everything dies with the
  worker), resource limits. The file system is NOT hidden: run the grader as a user who
  cannot read the course repository.
- none (--unsafe only): a plain subprocess with resource limits.
Every mode: memory, CPU time, file size and process limits on the child, wall-clock limits
per cell, per call and per notebook, enforced from here by killing.
"""
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.sandbox import wire

SANDBOX_PKG = Path(__file__).resolve().parent / "sandbox"
SCRATCH = "/scratch"  # inside bubblewrap: the only writable folder (with /dev/shm)
DEFAULT_LIMITS = dict(memory_mb=3072, cpu_seconds=600, file_mb=64, processes=256,
                      cell_seconds=60, call_seconds=30, notebook_seconds=600)


class SandboxError(RuntimeError):
    """The sandbox could not be started or stopped answering."""


class Timeout(Exception):
    pass


class Died(Exception):
    """The child ended (os._exit, a signal, a resource limit) while we waited for it."""


def _works(cmd):
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_mode(requested="auto", unsafe=False):
    """The sandbox mode to use; raises SandboxError (fail closed) when none works."""
    py = sys.executable
    probes = {"bwrap": _bwrap_base() + ["--", py, "-c", "pass"],
              "unshare": _unshare_base() + [py, "-c", "pass"]}
    candidates = ["bwrap", "unshare"] if requested == "auto" else [requested]
    for mode in candidates:
        if mode == "none" or (mode in probes and shutil.which(probes[mode][0]) and _works(probes[mode])):
            if mode == "none" and not unsafe:
                break
            return mode
    hint = ("install bubblewrap (apt-get install bubblewrap) or util-linux's unshare with user namespaces, "
            "or pass --unsafe to grade without a sandbox (only for code you trust)")
    raise SandboxError(f"no sandbox available for mode {requested!r}: {hint}")


def _system_binds():
    """Read-only binds: system libraries, the Python install and its packages, a few /etc files."""
    paths = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
             "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime", "/etc/fonts",
             sys.base_prefix, sys.prefix, os.path.realpath(sys.executable)]
    return [p for p in dict.fromkeys(paths) if os.path.exists(p)]


def _hidden_packages():
    """Folders of our own packages that the Python binds would expose (a non-editable install)."""
    hidden = []
    for name in ("solutions", "autograder"):
        spec = importlib.util.find_spec(name)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            if any(Path(loc).resolve().is_relative_to(Path(b).resolve()) for b in _system_binds()):
                hidden.append(str(Path(loc).resolve()))
    return hidden


def _bwrap_base():
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
           "--uid", "65534", "--gid", "65534", "--proc", "/proc", "--dev", "/dev",
           "--tmpfs", "/tmp", "--size", str(1 << 30), "--tmpfs", SCRATCH, "--tmpfs", "/dev/shm"]
    for p in _system_binds():
        cmd += ["--ro-bind", p, p]
    for p in _hidden_packages():
        cmd += ["--tmpfs", p]
    for dev in sorted(Path("/dev").glob("nvidia*")):  # a GPU, where there is one
        cmd += ["--dev-bind", str(dev), str(dev)]
    return cmd


def _unshare_base():
    cmd = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    return cmd + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])


def _env(scratch):
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{scratch}/.mpl",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRITON_CACHE_DIR": f"{scratch}/.triton"}
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run in its interpreter on a CPU
    return env


class _PidsCgroup:
    """A pids cgroup (v1 or v2) capping the sandbox's processes, where we may make one."""

    _count = itertools.count()

    def __init__(self, limit):
        self.path = None
        for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
            if os.access(root, os.W_OK) and os.path.exists(os.path.join(root, "cgroup.procs")):
                path = os.path.join(root, f"mha-autograder-{os.getpid()}-{next(self._count)}")
                try:
                    os.mkdir(path)
                    Path(path, "pids.max").write_text(str(limit))
                    self.path = path
                    return
                except OSError:
                    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else None
                    try:
                        os.rmdir(path)
                    except OSError:
                        pass

    def join(self):
        """In the new process, before exec: move it into the cgroup."""
        if self.path:
            Path(self.path, "cgroup.procs").write_text(str(os.getpid()))

    def remove(self):
        if self.path:
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.05)


class Sandbox:
    """One sandboxed worker. start() gives a fresh child per submission (see runner.py)."""

    def __init__(self, mode, limits=None, data_dir=None):
        self.mode, self.limits = mode, dict(DEFAULT_LIMITS, **(limits or {}))
        self.data_dir = data_dir
        self._tmp = tempfile.mkdtemp(prefix="mha-sandbox-")
        pkg = Path(self._tmp, "sandbox")  # a private copy of the sandbox code: nothing else of ours
        shutil.copytree(SANDBOX_PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
        self.ctl, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = child_end.fileno()
        runner = [sys.executable, "-m", "sandbox.runner", str(fd)]
        if mode == "bwrap":
            cmd = _bwrap_base() + ["--ro-bind", self._tmp, "/opt/grader", "--chdir", SCRATCH, "--clearenv"]
            for k, v in dict(_env(SCRATCH), PYTHONPATH="/opt/grader").items():
                cmd += ["--setenv", k, v]
            if data_dir:
                cmd += ["--ro-bind", str(data_dir), "/course"]
            # Everything read-only but /scratch and /dev/shm, which the worker wipes after every
            # submission. (/tmp may hold mount points of the binds: it must not be writable.)
            cmd += ["--remount-ro", "/tmp", "--remount-ro", "/", "--"] + runner + [SCRATCH, "--private-tmp", "--pidns"]
            popen_env = None
        else:
            scratch = Path(self._tmp, "scratch")
            scratch.mkdir()
            local = dict(_env(str(scratch)), PYTHONPATH=self._tmp)
            if mode == "unshare":
                cmd, popen_env = _unshare_base() + runner + [str(scratch), "--pidns"], local
            else:
                cmd, popen_env = runner + [str(scratch)], local
        self.course_dir = "/course" if mode == "bwrap" else (str(data_dir) if data_dir else None)
        self.cgroup = _PidsCgroup(self.limits["processes"])
        if self.cgroup.path and mode != "bwrap":
            cmd.append(f"--cgroup={self.cgroup.path}")
        self.proc = subprocess.Popen(cmd, pass_fds=[fd], env=popen_env, cwd=self._tmp, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=self.cgroup.join)
        child_end.close()
        reply = self._recv(120)
        if reply is None or reply.get("op") != "ready":
            err = self.proc.stderr.read1(4000).decode(errors="replace") if self.proc.poll() is not None else ""
            self.close()
            raise SandboxError(f"the {mode} sandbox did not start: {err.strip()[-800:] or 'no answer'}")

    def _recv(self, timeout):
        self.ctl.settimeout(timeout)
        try:
            msg = self.ctl.recv(65536)
        except (socket.timeout, OSError):
            return None
        return json.loads(msg) if msg else None

    def alive(self):
        return self.proc.poll() is None

    def start(self, lesson, data_files):
        """A fresh child for one submission; returns its data socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        limits = {k: self.limits[k] for k in ("memory_mb", "cpu_seconds", "file_mb", "processes")}
        start = {"op": "start", "limits": limits, "data_files": data_files,
                 "data_dir": f"{self.course_dir}/{lesson}" if self.course_dir else ""}
        try:
            socket.send_fds(self.ctl, [json.dumps(start).encode()], [theirs.fileno()])
        except OSError as e:
            raise SandboxError(f"the sandbox stopped answering: {e}") from None
        finally:
            theirs.close()
        return ours

    def stop_child(self, data):
        """Make sure the current child is gone and the worker is clean again."""
        data.close()  # a child waiting for a request now ends by itself
        try:
            self.ctl.send(json.dumps({"op": "kill"}).encode())
        except OSError:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reply = self._recv(max(deadline - time.monotonic(), 0.01))
            if reply is None:
                break
            if reply.get("op") == "exited":
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
        self.cgroup.remove()
        shutil.rmtree(self._tmp, ignore_errors=True)


class Session:
    """One submission in a sandbox: run its cells, then forward check requests to it.

    A cell that hangs past its limit or kills the process is skipped on a restart, so the rest
    of the notebook can still be graded; a check whose call hangs or crashes gets an error and
    the next check runs in a restarted child.
    """

    MAX_STARTS = 6

    def __init__(self, sandbox, lesson, cells, data_files=()):
        self.sandbox, self.lesson, self.cells, self.data_files = sandbox, lesson, list(cells), list(data_files)
        self.skipped = {}  # cell index -> why it was skipped
        self.cell_errors = {}  # cell index -> error description
        self.data = None
        self.starts = 0
        self.deadline = time.monotonic() + sandbox.limits["notebook_seconds"]

    def _recv(self, timeout):
        timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise Timeout("notebook")
        self.data.settimeout(timeout)
        try:
            msg = wire.recv_frame(self.data)
        except socket.timeout:
            raise Timeout("call") from None
        except (OSError, wire.WireError) as e:
            raise Died(str(e)) from None
        if msg is None:
            raise Died("the process ended")
        if not isinstance(msg, dict):
            raise Died("it sent a malformed message")
        return msg

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
            run = [i for i in range(len(self.cells)) if i not in self.skipped]
            self.cell_errors = {}
            current = None
            try:
                wire.send_frame(self.data, {"cells": [self.cells[i] for i in run]})
                while True:
                    msg = self._recv(self.sandbox.limits["cell_seconds"])
                    if msg.get("cells") == "done":
                        return
                    current = run[msg["cell"]] if isinstance(msg.get("cell"), int) and msg["cell"] < len(run) else None
                    if msg.get("state") == "done":
                        if msg.get("error") and current is not None:
                            self.cell_errors[current] = msg["error"]
                        current = None
            except Timeout as e:
                if str(e) == "notebook" or current is None:
                    raise SandboxError("the notebook ran past its time limit") from None
                self.skipped[current] = f"did not finish within {self.sandbox.limits['cell_seconds']} s"
            except (Died, OSError) as e:
                if current is None:
                    raise SandboxError(f"the notebook's process ended: {e}") from None
                self.skipped[current] = "ended the Python process (os._exit, a crash or a resource limit)"

    def transport(self, request):
        """Send one check request; a hang or crash becomes an error reply, and the child is restarted next time."""
        if self.data is None:
            self.open()
        try:
            wire.send_frame(self.data, request)
            return self._recv(self.sandbox.limits["call_seconds"])
        except Timeout as e:
            self.close()
            if str(e) == "notebook":
                return _error("Timeout", "the notebook's total time limit ran out")
            return _error("Timeout", f"your code did not finish within {self.sandbox.limits['call_seconds']} s "
                                     "(an infinite loop?)")
        except (Died, OSError):
            self.close()
            return _error("ProcessEnded", "your code ended the Python process (os._exit, sys.exit in a thread, "
                                          "a crash, or a memory or CPU limit)")

    def close(self):
        if self.data is not None:
            data, self.data = self.data, None
            self.sandbox.stop_child(data)


def _error(kind, message):
    return {"error": {"type": kind, "mro": [kind], "message": message}}
