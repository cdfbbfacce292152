"""The sandboxed worker:
python -m sandbox.runner CONTROL_FD SCRATCH [--private-tmp] [--pidns] [--cgroup=DIR] [--uid=N] [--no-triton]
    [--forbids=PATH,...] [--unprotected]

SCRATCH is the only writable folder the worker cleans; --private-tmp adds /dev/shm (only ours
inside bubblewrap). --uid=N (the "uid" mode, where namespaces are refused): the worker runs as
root and each child as the unprivileged uid N, which owns nothing of the course.

It imports the heavy libraries and builds an IPython shell once, then, for each submission,
forks a child that runs the student's cells and answers the grader's requests over a fresh
socket the grader passed in. Between submissions it kills whatever the child left behind,
wipes every writable place and checks that nothing of its own changed, so no submission can
see or touch another.

The child cannot reach the worker: the worker is not dumpable (no ptrace, no /proc/<pid>/mem
without CAP_SYS_PTRACE, which no child has), and each child runs under a seccomp filter that
refuses ptrace and process_vm_readv/writev, with no capabilities, in its own IPC namespace
with its own size-limited /dev/shm where the kernel allows one (see isolate()).
--unprotected (tests only) leaves all that out, to show that the attacks it stops are real.

Control messages (JSON over a SOCK_SEQPACKET socket) from the grader: start (with the data
socket attached), confine (see confine()), bound (see bound()), cpu (cpu_seconds()) and kill; the worker
answers ready, confined, bounded or refused, cpu, and exited after each child.
"""

import ctypes
import gc
import hashlib
import importlib
import itertools
import json
import marshal
import os
import platform
import resource
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
import types

PRIVATE = ("/dev/shm",)  # with --private-tmp (bubblewrap) this is ours alone, as is the scratch folder
SHARED = ("/dev/shm", "/tmp", "/var/tmp")  # writable by anyone: in the uid mode, what the uid made goes
O_PATH = getattr(os, "O_PATH", 0o10000000)
# What a child left is removed within this (the grader waits 30 s for the worker's answer).
WIPE_SECONDS = 20
STOP_SECONDS = 5  # a child's threads stop for its bound within this (bound())
HONEST_HELD_MB = 8  # a fresh child running honest cells holds less beyond the pristine worker (bound())
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 38, 22, 2
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 0x4000, 1 << 18
# Syscalls no child may make, by architecture: (audit arch, socket, then ptrace, process_vm_readv,
# process_vm_writev, pidfd_getfd). Anything else one could reach the worker with already needs
# ptrace access to it, which non-dumpability refuses. socket() is refused for IP and packet
# sockets only: the network, in the uid mode, which has no network namespace.
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 101, 310, 311, 438), "aarch64": (0xC00000B7, 198, 117, 270, 271, 438)}
AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
# A memory bound of N MiB counts from the fresh worker, not from what the child maps when it is set
# (see bound()): an honest lesson 06 or 08 notebook's child maps 0.5 to 7.5 MiB more than a fresh one
# when its bound is set (its cells, and the checks before it).


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def seccomp_program():
    """The BPF filter (bytes of sock_filter) that refuses the syscalls above with EPERM. Other
    ABIs (i386 via int 0x80, x32) are refused whole: Python never uses them."""
    arch, socket_nr, *denied = SECCOMP_ARCH[platform.machine()]  # KeyError: fail closed elsewhere
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (ld, 0, 0, 0)]  # [4]: arch, [0]: nr
    if arch == 0xC000003E:
        prog.append((jge, 0, 1, 0x40000000))  # the x32 ABI's syscall numbers
        prog.append((ret, 0, 0, eperm))
    for nr in denied:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [
        (jeq, 0, 5, socket_nr),
        (ld, 0, 0, 16),  # [16]: the first argument, the address family
        (jeq, 2, 0, AF_INET),
        (jeq, 1, 0, AF_INET6),
        (jeq, 0, 1, AF_PACKET),
        (ret, 0, 0, eperm),
    ]
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def install_seccomp(program):
    """No new privileges (setuid binaries stay unprivileged), then the filter, for this process
    and everything it starts."""
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def drop_capabilities():
    """Empty effective, permitted and inheritable sets (a child of a root worker is root)."""
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))  # version 3, this thread
    _check(LIBC.capset(header, ctypes.create_string_buffer(24)), "capset")


def isolate(shm_bytes):
    """A fresh IPC namespace (SysV objects die with the child) and a fresh /dev/shm of at most
    shm_bytes, for this child only. Unprivileged (bubblewrap), that takes a user namespace of
    our own, mapping only our ids. Returns False where the kernel refuses (README)."""
    uid, gid = os.geteuid(), os.getegid()
    if LIBC.unshare(CLONE_NEWIPC | CLONE_NEWNS) != 0:
        if LIBC.unshare(CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNS) != 0:
            return False
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)  # our mounts must not propagate out
    # Where this is refused, the child shares the sandbox's /dev/shm, which the worker wipes.
    return LIBC.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_bytes}".encode()) == 0


def preload(triton=True):
    """Import what notebooks import, so no child pays for it; returns a pristine shell. triton: Triton too, with what
    the lessons that import it (06, 09) import besides (--no-triton: none of the lessons graded imports it, and a worker
    starts about a third of a second sooner without it; a cell that imports it anyway gets it in its own child)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch
    import torch.nn.functional  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from . import server, wire  # noqa: F401  (imported here, so that children import nothing of ours)

    if triton:
        # Each child runs the cells again (a check's fresh process), so what they import costs every child: lessons 06
        # and 09 time kernels with torch.utils.benchmark, which brings setuptools' hundred modules (0.04 CPU s a child,
        # 4 children a lesson 06 submission), and run them in Triton's interpreter (issue 33). Autograd's first
        # backward from a given gradient (lesson 09's FlashAttention, in two children a submission) imports
        # symbolic_shapes, and sympy with it: 480 modules, 0.27 CPU s a child. A kernel's first launch imports Triton's
        # code generator and its Gluon dialect (0.04 CPU s in each child that launches one), and in the interpreter
        # rewrites Triton's own @triton.jit functions (warm_kernel: 0.008 CPU s in each such child).
        for name in (
            "triton",
            "triton.runtime.interpreter",
            "triton.compiler.code_generator",
            "triton.experimental.gluon",
            "torch.utils.benchmark",
            "torch.utils.flop_counter",
            "torch.fx.experimental.symbolic_shapes",
        ):
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        if os.environ.get("TRITON_INTERPRET") == "1" and "triton" in sys.modules:
            try:
                from .warm_kernel import warm

                warm()
            except Exception:  # noqa: BLE001 - a Triton that launches it otherwise: each child warms its own
                pass

    class Shell(InteractiveShell):
        prepared = False  # the cell about to run is IPython's static transformation of itself (prepared_cells)

        def transform_cell(self, raw_cell):
            """A cell the grader transformed already runs as it came, while no cell changed the shell's transformers
            (IPython's static transformation is the same in every child; done again, it is a third of the cells'
            time, in each child a check starts)."""
            if self.prepared and transformers(self) == pristine:
                return raw_cell
            return super().transform_cell(raw_cell)

        def enable_matplotlib(self, gui=None):
            """`%matplotlib inline` (or `%pylab`) keeps Agg: nothing is shown here, and the inline backend's hooks would
            add to what a notebook holds under a memory bound; the base class raises from enable_gui, which stopped
            the cell before the answer it holds."""
            return gui, "agg"

    torch.set_num_threads(1)
    config = Config()
    config.HistoryManager.enabled = False
    shell = Shell.instance(config=config)
    pristine = transformers(shell)
    return shell


def transformers(shell):
    """What transforms a cell's text before it runs (InteractiveShell.transform_cell), for comparison by identity."""
    manager = shell.input_transformer_manager
    return [manager] + [
        tuple(map(id, hooks))
        for hooks in (
            manager.cleanup_transforms,
            manager.line_transforms,
            manager.token_transformers,
            shell.input_transformers_post,
        )
    ]


def prepared_cells(cells, budget):
    """(cells, indices): each cell of more than one line, while their characters stay within budget in all, as IPython's
    static transformation gives it (%magics, !commands), and the indices of those (runner.child runs them without
    transforming them again); any other cell as it is: a single line's transformation depends on the shell's state, and
    one that raises is the child's to report. Runs on the grader's side, once a notebook: its work is bounded by
    budget, as its other readings of the cells are."""
    out, prepared = [], []
    for i, cell in enumerate(cells):
        budget -= len(cell)
        text = _transformed(cell) if budget >= 0 and "\n" in cell.strip() else None
        if text is not None and len(text.splitlines()) > 1:  # one line: transform_cell's dynamic part applies
            out.append(text)
            prepared.append(i)
        else:
            out.append(cell)
    return out, prepared


_TRANSFORMED = threading.local()  # per grading thread: nothing shared
# The notebook's own cells (all but the answers) are the same in every submission: the last TRANSFORMED_KEPT cells of
# up to TRANSFORMED_CHARS characters are kept (at most some 2 MB a thread)
TRANSFORMED_KEPT, TRANSFORMED_CHARS = 256, 4000


def _transformed(cell):
    """IPython's static transformation of cell, or None where it raises (the child transforms it, and reports what it
    raises); the same short cell again (another submission of the lesson) is transformed once."""
    from IPython.core.inputtransformer2 import TransformerManager

    if not hasattr(_TRANSFORMED, "kept"):
        _TRANSFORMED.kept, _TRANSFORMED.manager = {}, TransformerManager()
    kept = _TRANSFORMED.kept
    if cell in kept:
        return kept[cell]
    try:
        text = _TRANSFORMED.manager.transform_cell(cell)
    except Exception:  # noqa: BLE001 - see above
        text = None
    if len(cell) <= TRANSFORMED_CHARS:
        while len(kept) >= TRANSFORMED_KEPT:
            kept.pop(next(iter(kept)))
        kept[cell] = text
    return text


def fingerprint(shell):
    """What the worker relies on between submissions: the code of the sandbox package, the set of
    imported modules, the pristine shell and the builtins. It changes only if something reached
    into the worker, which then restarts rather than grade the next submission with it."""
    h = hashlib.sha256(" ".join(sorted(sys.modules)).encode())
    for name in (__name__, f"{__package__}.server", f"{__package__}.wire", f"{__package__}.helpers"):
        for obj in list(vars(sys.modules[name]).values()):
            for fn in [obj] + (list(vars(obj).values()) if isinstance(obj, type) else []):
                if isinstance(fn, types.FunctionType):
                    h.update(marshal.dumps(fn.__code__) + repr((id(fn), fn.__defaults__)).encode())
    import builtins

    for space in (shell.user_ns, vars(builtins)):
        h.update(repr(sorted((k, id(v)) for k, v in space.items())).encode())
    hooks = (
        shell.input_transformers_post,
        shell.input_transformer_manager.cleanup_transforms,
        shell.input_transformer_manager.line_transforms,
        shell.ast_transformers,
        shell.custom_exceptions,
    )
    h.update(repr([[id(x) for x in hook] for hook in hooks]).encode())
    return h.digest()


class Sink:
    """A bounded stdout/stderr: keeps the first `limit` characters, drops the rest."""

    def __init__(self, limit=20_000):
        self.kept, self.limit, self.dropped = [], limit, 0

    def write(self, s):
        s = str(s)
        room = self.limit - sum(map(len, self.kept))
        self.kept.append(s[: max(room, 0)])
        self.dropped += max(len(s) - room, 0)
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False


def set_limits(limits):
    mb = 2**20
    vm = vm_size()
    # The address space already mapped (torch's libraries) plus the memory budget.
    for rlimit, value in (
        (resource.RLIMIT_AS, vm + limits["memory_mb"] * mb),
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(rlimit, (value, value))


def child(data, shell, start, scratch, opts):
    """Run the cells of the first frame, then serve requests until the grader closes the socket. A frame of cells
    among the requests runs them in the namespace the shell began with (a child that ran the grader's cells goes on to
    run the notebook's with the same paths off: Session._serve)."""
    from .server import ObjectServer
    from .wire import recv_frame, send_frame

    os.setsid()
    if opts["protect"]:
        with open("/proc/self/oom_score_adj", "w") as f:  # under a memory cgroup, the child goes first
            f.write("1000")
        isolate(min(start["limits"]["memory_mb"], 1024) * 2**20)
        if opts["uid"]:  # after isolate(), which may need root
            os.setgroups([])
            os.setgid(opts["uid"])
            os.setuid(opts["uid"])
        drop_capabilities()
        install_seccomp(opts["seccomp"])
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

    def channel(payload):  # host_callback: the grader runs its handler and answers
        send_frame(data, {"callback": payload})
        reply = recv_frame(data)
        if not isinstance(reply, dict) or "callback_reply" not in reply:
            raise RuntimeError("the grader did not answer the callback")
        return reply["callback_reply"]

    frame = recv_frame(data)
    if frame.get("forbid"):  # before any cell: no student code may have looked up a kernel first
        from .tripwires import install

        install(frame["forbid"])
    fresh = dict(shell.user_ns)
    while frame is not None:
        # Cells: the first frame; then, in a child that ran the grader's own cells, the notebook's (Session._serve)
        if "op" not in frame:
            shell.user_ns.clear()  # nothing the grader's cells defined is the notebook's
            shell.user_ns.update(fresh)
            shell.history_manager.output_hist.clear()  # nor what they showed (Out, _oh: fresh holds that dict itself)
            run_cells(data, shell, frame["cells"], set(frame.get("prepared", ())))
            server = ObjectServer(shell.user_ns)
            server.channel = channel
        else:
            send_frame(data, server.handle(frame))
        frame = recv_frame(data)


def run_cells(data, shell, cells, prepared):
    """Run cells (prepared: the indices of those IPython's static transformation gave), telling the grader as each
    starts and ends, then that all are done."""
    from .server import describe
    from .wire import send_frame

    for i, src in enumerate(cells):
        send_frame(data, {"cell": i, "state": "start"})
        shell.prepared = i in prepared
        try:
            result = shell.run_cell(src, store_history=False)
            error = result.error_before_exec or result.error_in_exec
        except BaseException as e:  # a cell that broke the shell itself
            error = e
        send_frame(data, {"cell": i, "state": "done", "error": describe(error) if error else None})
    shell.prepared = False
    send_frame(data, {"cells": "done"})


def _unlock(dir_fd, name):
    """Give the folder `name` in dir_fd (never a link: O_NOFOLLOW) its owner's rwx back, whatever
    mode a child left it in (0 included), through an O_PATH descriptor, which needs no permission
    on the folder itself."""
    fd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except PermissionError:  # a non-dumpable worker's /proc/self/fd is root's: then by name, as an
        os.chmod(name, 0o700, dir_fd=dir_fd)  # unprivileged worker, which may chmod only its own uid's files
    finally:
        os.close(fd)


def _remove_one(top_fd, name, spare):
    """Remove the entry `name` of the folder top_fd: anything but a folder is unlinked (a link is
    never followed); a folder is unlocked, its files unlinked, its subfolders moved up into top_fd
    (so no path and no stack grows with the depth of a tree) and it is removed once empty.
    Returns how many entries it removed or moved (0: no progress)."""
    try:
        os.unlink(name, dir_fd=top_fd)
        return 1
    except IsADirectoryError:
        pass
    _unlock(top_fd, name)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top_fd)
    done = 0
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    os.unlink(entry.name, dir_fd=fd)
                    done += 1
                except IsADirectoryError:
                    done += _move_up(fd, entry.name, top_fd, spare)
                except OSError:
                    pass  # left for the next pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=top_fd)
    except OSError:
        return done
    return done + 1


def _move_up(fd, name, top_fd, spare):
    """Move the folder `name` of fd into top_fd, under a name of ours; returns 1, or 0 when it cannot."""
    try:
        _unlock(fd, name)  # moving a folder rewrites its "..": it must be writable
    except OSError:
        return 0
    for _ in range(100):  # a name a child already took is skipped
        try:
            os.rename(name, f".wipe-{next(spare)}", src_dir_fd=fd, dst_dir_fd=top_fd)
            return 1
        except FileNotFoundError:
            return 0
        except OSError:
            continue
    return 0


def wipe(places, modes=None, seconds=60):
    """Empty the given folders (never the folders themselves) of whatever a child left there: trees
    of any depth, names past PATH_MAX, folders and files it made unreadable or unwritable, links
    (never followed, loops included), FIFOs, sockets, millions of files. Iterative and by file
    descriptor, so nothing recurses and no path grows; passes are repeated until a folder is empty
    (a process still writing refills it). modes: {folder: mode} to give each folder back first
    (a child may chmod its own scratch). Never raises; returns False when something could not be
    removed within `seconds` (then the worker is replaced rather than grade beside it)."""
    deadline, spare, clean = time.monotonic() + seconds, itertools.count(), True
    for top in places:
        try:
            if modes and top in modes:
                os.chmod(top, modes[top])
            top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        except OSError:
            clean = False
            continue
        try:
            while names := os.listdir(top_fd):
                done = 0
                for name in names:
                    if time.monotonic() > deadline:
                        break
                    try:
                        done += _remove_one(top_fd, name, spare)
                    except OSError:
                        pass  # gone already, or left for the next pass
                if not done:  # nothing removable left, or no time
                    clean = False
                    break
        except Exception:  # never the worker's end: it is replaced instead
            clean = False
        finally:
            os.close(top_fd)
    return clean


def remove_tree(path, seconds=60):
    """Remove a folder and everything in it (see wipe()); never raises, returns whether it is gone."""
    done = wipe([path], seconds=seconds)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return done
    except OSError:
        return False
    return done


def vm_size(pid="self"):
    """A process's mapped address space (VmSize), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmSize:")).split()[1]) * 1024


def allowed(held, mb, headroom):
    """(allowance, over): what of held (bytes beyond a fresh process) a bound of mb MiB with headroom
    MiB (bound()) puts on top of mb, and, when held is over budget, the end of a sentence saying
    what the check allows (else None)."""
    allowance = held if headroom and held >= HONEST_HELD_MB * 2**20 else 0
    if held - allowance < mb * 2**20 and allowance <= headroom * 2**20:
        return allowance, None
    allows = f"{headroom} MiB before it and {mb} MiB in it" if allowance else f"{mb} MiB in all"
    return allowance, f"allows {allows}: free large arrays your cells keep at top level"


def _stopped(pid):
    """Whether every thread of pid is stopped or dead, so that none can map or unmap memory."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in "TtZX":
                    return False
        except FileNotFoundError:  # a thread that ended meanwhile maps nothing
            pass
    return True


def _continue(pid):
    """SIGCONT, to a child that may have ended."""
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


def confine(pid, opts):
    """From here, outside the child's reach: no process of its own from now on (its process limit to none: it has no
    CAP_SYS_RESOURCE to raise it again; a root child, above that limit, has what it starts killed by supervise()), then
    none left of those it had (every other process of the sandbox is killed), so that only the child itself does the
    work of the calls that follow: a Python of its own, started by a cell, would run where no tripwire and no bound
    is. Leaves the child stopped (SIGSTOP, so that none of those it had continues it while they are killed): the
    caller continues it (_continue). Raises OSError when the child has ended."""
    resource.prlimit(pid, resource.RLIMIT_NPROC, (0, 0))
    os.kill(pid, signal.SIGSTOP)
    reap(opts, keep=(pid,))


def confine_reply(pid, opts):
    """The reply to the grader's "confine", sent once the cells ran with paths off, before the calls (confine())."""
    try:
        confine(pid, opts)
    except OSError:
        return {"op": "refused", "why": "your notebook's process ended"}
    finally:
        _continue(pid)
    return {"op": "confined"}


def bound(pid, mb, opts, headroom=0, inputs=0):
    """Before a bounded block of calls: confine the child (confine(): daemons would work outside the bound, a process
    of its own would get a bound of its own), then, from here, outside the child's reach, lower its address-space
    limit (soft and hard) to what the pristine worker maps plus mb MiB.
    Counted from the pristine worker, not from the child: memory its cells mapped before the block
    (a buffer kept at top level, in a default argument, freed but still mapped) is part of the mb,
    never headroom on top of it; a child that unmapped part of what the worker maps is counted from
    itself, so what it gave up is no headroom either. The child is stopped (SIGSTOP) while it is
    measured and limited: a thread of its own that maps memory between the two would hold it beyond
    the limit, unseen. Known limit: a glibc thread arena's 64 MiB heap is mapped whole
    and committed as it grows, so its unused part is headroom that no limit sees: make a forbidden
    allocation larger than 64 MiB where it can be. Irreversible: the grader ends the child after
    the block. Refused when the child already maps mb MiB beyond the pristine worker.
    headroom (MiB, for a check that sizes its evidence from held_mb, Subject.memory_bound): a child
    holding HONEST_HELD_MB or more beyond the pristine worker (%matplotlib inline, a scratch tensor)
    gets what it holds on top of mb, up to headroom MiB, and is refused above it. inputs (MiB): what the grader's
    own inputs, made inside the block (helpers.drawn_calls), take on top of mb. Returns the reply
    for the grader, with what the child held beyond the pristine worker (MiB) when bounded."""
    try:
        confine(pid, opts)  # none may continue it while it is measured (SIGCONT), nor work outside the bound after
        deadline = time.monotonic() + STOP_SECONDS
        while not _stopped(pid):
            if time.monotonic() > deadline:
                return {
                    "op": "refused",
                    "why": f"your notebook's process did not stop within {STOP_SECONDS} s to have "
                    "its memory bounded: end the threads your cells started",
                }
            os.kill(pid, signal.SIGSTOP)  # again: a process it had may have continued it before it was killed
            time.sleep(0.001)
        held = vm_size(pid) - opts["pristine_vm"]
        allowance, over = allowed(held, mb, headroom)
        if over:
            return {
                "op": "refused",
                "held_mb": held >> 20,
                "why": f"your notebook's process already holds {held >> 20} MiB more than a fresh one, and this "
                f"check {over}",
            }
        limit = opts["pristine_vm"] + min(held, 0) + allowance + (mb + inputs) * 2**20
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    except (OSError, StopIteration, ValueError):
        return {"op": "refused", "why": "your notebook's process ended before its memory could be bounded"}
    finally:
        _continue(pid)
    return {"op": "bounded", "held_mb": max(held, 0) >> 20}


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid, opts):
    """The CPU time (user + system, seconds) the child and every live process of the sandbox have used, with what
    the child's reaped children used: read from the kernel, outside the child's reach. The grader's time limits count
    it (worker.Session), not the wall clock, so a busy grader does not change a verdict."""
    total = 0
    for p in _pids(opts) | {pid}:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(n) for n in fields[11:13] + (fields[13:15] if p == pid else []))
    return total / TICKS


def supervise(ctl, pid, opts):
    """Wait for the child, killing it when the grader says so, confining it (confine()), bounding its memory (bound())
    and telling the CPU time it used (cpu_seconds()); returns its wait status."""
    # In a PID namespace of our own the child may be root outside it (bubblewrap run as root maps its uid to 0), which
    # RLIMIT_NPROC does not hold: once confined, what it starts is killed here within a poll, long before a fresh
    # Python has imported torch (cheap: the namespace's /proc lists only the sandbox). The uid mode's uid is held.
    reaps = opts["pidns"]
    confined = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if confined and reaps:
            reap(opts, keep=(pid,))
        ready, _, _ = select.select([ctl], [], [], 0.02)
        if ready:
            msg = ctl.recv(65536)
            request = json.loads(msg) if msg else {}
            op = request.get("op")
            if op == "cpu":
                ctl.send(json.dumps({"op": "cpu", "seconds": cpu_seconds(pid, opts)}).encode())
            elif op == "confine":
                reply = confine_reply(pid, opts)
                confined = reply["op"] == "confined"
                ctl.send(json.dumps(reply).encode())
            elif op == "bound":
                confined = True
                ctl.send(
                    json.dumps(
                        bound(
                            pid,
                            int(request["mb"]),
                            opts,
                            int(request.get("headroom", 0)),
                            int(request.get("inputs", 0)),
                        )
                    ).encode()
                )
            elif op == "kill" or not msg:
                os.killpg(pid, signal.SIGKILL)
                if not msg:
                    os.waitpid(pid, 0)
                    sys.exit(0)


def _pids(opts):
    """Every live process of this sandbox but the worker, from our own records: the whole PID
    namespace (but its init, bubblewrap), our cgroup, and in the uid mode the child's uid."""
    found = set()
    try:
        with open(os.path.join(opts["cgroup"], "cgroup.procs")) as f:
            found.update(f.read().split())
    except (OSError, TypeError):
        pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if opts["pidns"]:
                found.add(pid)
            elif opts["uid"]:
                with open(f"/proc/{pid}/status") as f:
                    if next(line for line in f if line.startswith("Uid:")).split()[1] == str(opts["uid"]):
                        found.add(pid)
        except (OSError, StopIteration):
            pass
    live = set()
    for pid in found:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie does nothing: skip it
                    live.add(int(pid))
        except (OSError, IndexError):
            pass
    return live - {1, os.getpid()}


def reap(opts, keep=()):
    """SIGKILL every process of the sandbox but the worker and `keep`, until none is left alive
    (a fork bomb refills the list while we kill; the dying take a moment)."""
    deadline = time.monotonic() + 5
    while (pids := _pids(opts) - set(keep)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def remove_ipc(uid=None):
    """Remove the SysV shared memory, semaphores and message queues of `uid` (None: all of them,
    in an IPC namespace of our own), for where a child could not have one of its own."""
    for kind, rmid in (
        ("shm", lambda i: LIBC.shmctl(i, 0, None)),
        ("sem", lambda i: LIBC.semctl(i, 0, 0)),
        ("msg", lambda i: LIBC.msgctl(i, 0, None)),
    ):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                head, *rows = [line.split() for line in f]
        except (OSError, ValueError):
            continue
        for row in rows:
            fields = dict(zip(head, row))
            if uid is None or fields.get("uid") == str(uid):
                rmid(int(fields[head[1]]))


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    scratch = sys.argv[2]
    opt = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in sys.argv if a.startswith("--") and "=" in a}
    opts = {
        "pidns": "--pidns" in sys.argv,
        "cgroup": opt.get("--cgroup"),
        "uid": int(opt.get("--uid", 0)),
        "protect": "--unprotected" not in sys.argv,
    }
    # Outside bubblewrap /dev/shm is shared with the machine: only our own scratch folder is wiped.
    places = (scratch,) + (PRIVATE if "--private-tmp" in sys.argv else ())
    modes = {top: os.stat(top).st_mode & 0o7777 for top in places}  # a child may chmod them: given back
    if opts["protect"]:
        _check(LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        opts["seccomp"] = seccomp_program()
    shell = preload("--no-triton" not in sys.argv)
    if opt.get("--forbids"):  # the paths the lessons graded switch off in some children (tripwires.prepare)
        from .tripwires import prepare

        prepare(opt["--forbids"].split(","))
    # What the worker holds is never a child's garbage: a child's full collection would walk (and copy on write) every
    # object of torch and the rest here, some 0.12 CPU s whenever one falls in its cells or calls (issue 33).
    gc.collect()
    gc.freeze()
    opts["pristine_vm"] = vm_size()
    pristine = fingerprint(shell) if opts["protect"] else None
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
                child(data, shell, start, os.path.join(scratch, "work"), opts)
            except BaseException:  # before the student's code runs, this reaches the grader's log
                traceback.print_exc(limit=3)
                code = 1
            os._exit(code)
        data.close()
        status = supervise(ctl, pid, opts)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if opts["pidns"]:  # in our own PID namespace: end everything the child left, except us and init
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        reap(opts)
        # Whatever the child left must not end the worker (its verdict would become the grader's
        # failure): what cannot be removed in time makes the worker replaced instead.
        clean = wipe(places, modes, WIPE_SECONDS)
        if opts["protect"] and opts["uid"]:  # shared with the machine: what the child's uid left there
            remove_ipc(opts["uid"])
            for top in SHARED:
                clean = wipe_owned(top, opts["uid"]) and clean
        elif opts["protect"] and opts["pidns"]:
            remove_ipc()  # our IPC namespace (bwrap, unshare): everything in it is the children's
        tainted = not clean or opts["protect"] and fingerprint(shell) != pristine
        ctl.send(json.dumps({"op": "exited", "status": status, "restart": tainted}).encode())
        if tainted:
            return


def wipe_owned(top, uid):
    """Remove what `uid` made directly under `top` (a folder shared with the machine); returns
    False when something of it is left."""
    try:
        names = os.listdir(top)
    except OSError:
        return True
    clean = True
    for name in names:
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
            if st.st_uid != uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                clean = remove_tree(path, WIPE_SECONDS) and clean
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            clean = False
    return clean


if __name__ == "__main__":
    main()
