"""The sandboxed worker: python -m sandbox.runner CONTROL_FD SCRATCH [--private-tmp] [--pidns] [--cgroup=DIR]

SCRATCH is the only writable folder the worker cleans; --private-tmp adds /dev/shm (only ours
inside bubblewrap).

It imports the heavy libraries and builds an IPython shell once, then, for each submission,
forks a child that runs the student's cells and answers the grader's requests over a fresh
socket the grader passed in. Between submissions it kills whatever the child left behind
and wipes every writable place, so no submission can see or touch another.

Control messages (JSON over a SOCK_SEQPACKET socket) from the grader: start (with the data
socket attached) and kill; the worker answers ready, then exited after each child.
"""
import json
import os
import resource
import select
import shutil
import signal
import socket
import sys

PRIVATE = ("/dev/shm",)  # with --private-tmp (bubblewrap) this is ours alone, as is the scratch folder


def preload():
    """Import what notebooks import, so no child pays for it; returns a pristine shell."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch
    import torch.nn.functional  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    torch.set_num_threads(1)
    config = Config()
    config.HistoryManager.enabled = False
    return InteractiveShell.instance(config=config)


class Sink:
    """A bounded stdout/stderr: keeps the first `limit` characters, drops the rest."""

    def __init__(self, limit=20_000):
        self.kept, self.limit, self.dropped = [], limit, 0

    def write(self, s):
        s = str(s)
        room = self.limit - sum(map(len, self.kept))
        self.kept.append(s[:max(room, 0)])
        self.dropped += max(len(s) - room, 0)
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False


def set_limits(limits):
    mb = 2**20
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    # The address space already mapped (torch's libraries) plus the memory budget.
    for rlimit, value in ((resource.RLIMIT_AS, vm + limits["memory_mb"] * mb),
                          (resource.RLIMIT_CPU, limits["cpu_seconds"]),
                          (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
                          (resource.RLIMIT_NPROC, limits["processes"]),
                          (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(rlimit, (value, value))


def child(data, shell, start, scratch):
    """Run the submission's cells, then serve requests until the grader closes the socket."""
    from .server import ObjectServer, describe
    from .wire import recv_frame, send_frame

    os.setsid()
    os.makedirs(scratch, exist_ok=True)
    os.chdir(scratch)
    os.environ["HOME"] = scratch
    for name in start.get("data_files", []):  # the lesson's data files, read-only
        os.symlink(os.path.join(start["data_dir"], name), name)
    set_limits(start["limits"])
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdout, sys.stderr = Sink(), Sink()

    cells = recv_frame(data)["cells"]
    for i, src in enumerate(cells):
        send_frame(data, {"cell": i, "state": "start"})
        try:
            result = shell.run_cell(src, store_history=False)
            error = result.error_before_exec or result.error_in_exec
        except BaseException as e:  # a cell that broke the shell itself
            error = e
        send_frame(data, {"cell": i, "state": "done", "error": describe(error) if error else None})
    send_frame(data, {"cells": "done"})
    server = ObjectServer(shell.user_ns)
    while (request := recv_frame(data)) is not None:
        send_frame(data, server.handle(request))


def wipe(places):
    """Empty the given folders (never the folders themselves)."""
    for top in places:
        if not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            path = os.path.join(top, name)
            for root, dirs, _ in os.walk(path):  # a child may have made folders unreadable
                for d in dirs:
                    try:
                        os.chmod(os.path.join(root, d), 0o700)
                    except OSError:
                        pass
            try:
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
            except OSError:
                pass


def supervise(ctl, pid):
    """Wait for the child, killing it when the grader says so; returns its wait status."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        ready, _, _ = select.select([ctl], [], [], 0.02)
        if ready:
            msg = ctl.recv(65536)
            if not msg or json.loads(msg).get("op") == "kill":
                os.killpg(pid, signal.SIGKILL)
                if not msg:
                    os.waitpid(pid, 0)
                    sys.exit(0)


def _cgroup_procs(cgroup):
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return f.read().split()
    except (OSError, TypeError):
        return []


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    scratch = sys.argv[2]
    pidns = "--pidns" in sys.argv
    # Outside bubblewrap /dev/shm is shared with the machine: only our own scratch folder is wiped.
    places = (scratch,) + (PRIVATE if "--private-tmp" in sys.argv else ())
    cgroup = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--cgroup=")), None)
    shell = preload()
    ctl.send(json.dumps({"op": "ready"}).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, 65536, 1)
        if not msg:
            return
        start = json.loads(msg)
        if start.get("op") != "start" or len(fds) != 1:
            continue
        data = socket.socket(fileno=fds[0])
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ctl.close()
                child(data, shell, start, os.path.join(scratch, "work"))
            except BaseException:
                code = 1
            os._exit(code)
        data.close()
        status = supervise(ctl, pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if pidns:  # in our own PID namespace: end everything the child left, except us and init
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        for pid_text in _cgroup_procs(cgroup):  # without one: whatever is left in our pids cgroup
            if int(pid_text) != os.getpid():
                try:
                    os.kill(int(pid_text), signal.SIGKILL)
                except OSError:
                    pass
        wipe(places)
        ctl.send(json.dumps({"op": "exited", "status": status}).encode())


if __name__ == "__main__":
    main()
