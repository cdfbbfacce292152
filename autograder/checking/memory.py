"""The in-process memory bound (LocalSubject.memory_bound), counted like the grader's: the cells'
memory is part of the bound, and what ran before in the same process gives no headroom.

glibc keeps memory a process has freed mapped (free chunks of its heaps) and reuses it without
mapping more, so under an address-space limit counted from what the process maps now, memory
freed by an earlier test would be headroom. For the block, the free chunks glibc holds are taken
(malloc'd, and freed after it: _soak), so the block must map what it uses, and the limit is

    mapped now + mb - what the namespace's cells keep

where what the cells keep (a buffer they made) is what they added to the memory in use (mapped,
less the bytes glibc holds free: mallinfo2) while they ran, recorded once by record_cells() (the
tests do; a notebook's own kernel has no record: only what the block maps counts). It does not
depend on what ran in the process since. Without glibc (macOS) nothing is taken.

Nor does what a call maps depend on the allocator's history: glibc raises its mmap threshold (up to
32 MiB) to the size of each larger mapped block freed, and the large blocks that follow come from the
heap, where one freed stays mapped between others; an honest call then mapped up to twice what it held,
by how earlier frees fell (issue 19: a correct flash_attention took 21 to 27 of its 28 MiB, and lost its
"tiled" aspect in 1 run of 6). The first bound pins the threshold at glibc's default (which ends the
raising, for good): every block over it is mapped alone and unmapped when freed, so a bound counts what
a call holds.
"""

import ctypes
import gc
import math
import resource

from autograder.sandbox.runner import HONEST_HELD_MB, allowed, vm_size

KEPT = "__memory_kept__"  # the namespace's key for record_cells()
_SOAK_SIZES = [2**k for k in range(26, 15, -1)]  # 64 MiB down to 64 KiB: smaller chunks are left free
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
PINNED_THRESHOLD = 128 * 1024  # glibc's default mmap threshold; the heap's top is given back above it too


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    libc.mallopt.restype, libc.mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return libc


_LIBC = _glibc()


def _free_bytes():
    """The bytes glibc holds free in all its arenas (their top chunks included)."""
    return _LIBC.mallinfo2().fordblks if _LIBC else 0


def in_use():
    """Bytes this process maps for what is alive, less what glibc holds free. Garbage is collected
    first: a cycle left by an earlier test (a traceback holding its namespace) would otherwise be
    freed by whatever runs next, and its memory be read as the next cells' headroom."""
    gc.collect()
    return vm_size() - _free_bytes()


def record_cells(namespace, before):
    """After a namespace's cells ran (before: in_use() before they ran): what they keep will count
    against its memory bounds."""
    namespace[KEPT] = max(in_use() - before, 0)


def _pin_allocator():
    """Large blocks mapped alone from now on (the module's docstring says why)."""
    if _LIBC:
        _LIBC.mallopt(M_MMAP_THRESHOLD, PINNED_THRESHOLD)
        _LIBC.mallopt(M_TRIM_THRESHOLD, PINNED_THRESHOLD)


def _soak():
    """malloc the free chunks glibc holds, largest first, as long as one comes without mapping more;
    returns them for _release()."""
    held, vm = [], vm_size()
    for size in _SOAK_SIZES if _LIBC else ():
        while _free_bytes() >= size:
            p = _LIBC.malloc(size - 64)
            if not p or vm_size() > vm:  # no free chunk that large: it was mapped anew
                _LIBC.free(p)
                vm = vm_size()
                break
            held.append(p)
    return held


def _release(held):
    for p in held:
        _LIBC.free(p)


class LocalBound:
    """One in-process bound at a time: enter(namespace, mb) lowers this process's soft address-space
    limit (never the hard one: no trust is needed here), leave() restores it. pin: the first bound pins the
    allocator (the module's docstring says why); False for a process forked fresh for one check, as the grader's
    children are, which keep glibc's own thresholds as they do (and map far less often)."""

    pin = True

    def __init__(self):
        self._saved = None  # (soft limit, soaked chunks) while bounded

    def enter(self, namespace, mb, headroom=0, inputs=0):
        """As runner.bound: what the cells keep is part of mb, unless headroom allows it on top; the grader's inputs
        (inputs MiB) are on top."""
        if self._saved is not None:
            raise RuntimeError("memory bounds do not nest")
        kept = namespace.get(KEPT, 0)
        allowance, over = allowed(kept, mb, headroom)
        if over:
            return {
                "refused": f"your notebook's cells keep {kept >> 20} MiB, and this check {over}",
                "held_mb": kept >> 20,
            }
        if self.pin:
            _pin_allocator()
        gc.collect()  # garbage freed during the block would be headroom under the limit (in_use() says why)
        held = _soak()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        self._saved = (soft, held)
        limit = vm_size() + (mb + inputs) * 2**20 - (kept - allowance)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        return {"ok": None, "held_mb": kept >> 20}

    def leave(self):
        if self._saved is not None:
            (soft, held), self._saved = self._saved, None
            resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))
            _release(held)
        return {"ok": None}


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


# What the lessons with a memory-bound check say of HEADROOM_MB beside their limits (a test holds them to it).
HEADROOM_STATEMENT = (
    "The checks of how an answer uses memory also count what your notebook keeps beyond a fresh process (large arrays "
    f"at top level), up to {HEADROOM_MB} MB: keep large scratch data out of the notebook you submit."
)

HELD_NOTE_MB = 16  # an honest process holds less than 8 MiB beyond a fresh one when a bound begins


def held_first(s, message):
    """The message of a failure under a memory bound, led by what the process already held before it when that is
    much: then memory the notebook keeps is the likelier cause, and a student reading the mistake first would look
    for it in an answer that may well be right."""
    if s.held_mb < HELD_NOTE_MB:
        return message
    return (
        f"your notebook's process already held {s.held_mb} MiB more than a fresh one before the call, and memory your "
        f"cells keep counts too: free large arrays they keep at top level. If that is not it: {message}"
    )
