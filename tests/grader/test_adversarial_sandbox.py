"""Attacks on the sandbox itself (issue 11), graded by the real command beside honest students.

Each attacker rides on the wrong softmax of tests/grader/test_adversarial.py and, when its attack works,
switches to a correct answer (IF_IT_WORKED), or hurts the grader (its memory, the whole run).
Every attack of a lesson is graded in one run, which must see them all fail; one more run under
the test-only switch AUTOGRADER_TEST_UNPROTECTED=1 (the grader without the defences these
attacks are about) must see every one succeed, so that each attacker can fail. The uid mode
(where namespaces are refused) gets the file-reading and takeover attacks too.
"""

import csv
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import release
from autograder.worker import UNPROTECTED_ENV, _Cgroups
from tests.grader.test_adversarial import IF_IT_WORKED, LESSON, REPO, TRICKS, WRONG_SOFTMAX, with_cells
from tests.harness import watch
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
MIB = 2**20
GRADER_MEMORY_MIB = 600  # the grader's own memory per job (issue 11)
SHM_KEY = 0x4D484121
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
FAILED = 2**64 - 1  # (void *) -1

# student -> cells run last (after the wrong softmax, which IF_IT_WORKED replaces)
ATTACKS = {
    # takeover: run code inside the worker, which grades every later submission
    "takeover-ptrace": [
        LIBC
        + """
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
worker = os.getppid()
attached = libc.ptrace(16, worker, None, None) == 0  # PTRACE_ATTACH
if attached:
    os.waitpid(worker, 0x40000000)  # __WALL: it stopped
    libc.ptrace(17, worker, None, None)  # PTRACE_DETACH
if attached:
"""
        + IF_IT_WORKED
    ],
    "takeover-proc-mem": [
        """
import os
start = int(open("/proc/self/maps").readline().split("-")[0], 16)  # a fork: the worker's layout
try:
    with open(f"/proc/{os.getppid()}/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        read = len(mem.read(16)) == 16
except OSError:
    read = False
if read:
"""
        + IF_IT_WORKED
    ],
    "takeover-process-vm": [
        LIBC
        + """
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
start = int(open("/proc/self/maps").readline().split("-")[0], 16)
buf = ctypes.create_string_buffer(16)
local, remote = iovec(ctypes.addressof(buf), 16), iovec(start, 16)
libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                  ctypes.c_ulong]
if libc.process_vm_readv(os.getppid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 16:
"""
        + IF_IT_WORKED
    ],
    "takeover-debugger": [
        """
import os
debuggers = [p for p in ("/usr/bin/gdb", "/usr/bin/strace", "/usr/bin/gcore")
             if os.path.isfile(p) and os.path.getsize(p)]
if debuggers:
"""
        + IF_IT_WORKED
    ],
    # leftovers: a SysV segment the next submission in the same worker reads (graded in name order)
    "leftover-1-sysv-writer": [
        LIBC
        + f"""
shmid = libc.shmget({SHM_KEY}, 1 << 20, 0o1000 | 0o666)  # IPC_CREAT
if shmid >= 0:
    addr = libc.shmat(shmid, None, 0)
    if addr != {FAILED}:
        ctypes.memmove(addr, b"planted", 7)
        libc.shmdt(ctypes.c_void_p(addr))
"""
    ],
    "leftover-2-sysv-reader": [
        LIBC
        + f"""
shmid = libc.shmget({SHM_KEY}, 0, 0)
addr = libc.shmat(shmid, None, 0o10000) if shmid >= 0 else None  # SHM_RDONLY
if addr not in (None, {FAILED}) and ctypes.string_at(addr, 7) == b"planted":
"""
        + IF_IT_WORKED
    ],
    # shared memory beyond --memory (512 MiB in these runs): 768 MiB
    "shm-devshm-over-memory": [
        """
import os
written = 0
for i in range(12):  # files of 64 MiB: the file size limit
    try:
        with open(f"/dev/shm/blob{i}", "wb") as f:
            for _ in range(64):
                f.write(b"\\1" * 2**20)
        written += 64
    except OSError:
        break
for i in range(12):
    try:
        os.unlink(f"/dev/shm/blob{i}")
    except OSError:
        pass
if written >= 768:
"""
        + IF_IT_WORKED
    ],
    "shm-sysv-over-memory": [
        LIBC
        + f"""
ids, total = [], 0
try:
    for _ in range(6):
        shmid = libc.shmget(0, 128 << 20, 0o1000 | 0o600)  # IPC_PRIVATE
        if shmid < 0:
            break
        ids.append(shmid)
        addr = libc.shmat(shmid, None, 0)
        if addr == {FAILED}:
            break
        ctypes.memset(addr, 1, 128 << 20)
        libc.shmdt(ctypes.c_void_p(addr))  # detached, it no longer counts in the address space
        total += 128
finally:
    for shmid in ids:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
if total >= 768:
"""
        + IF_IT_WORKED
    ],
}
# Clean-up (issue 19): what a submission leaves in its scratch folder, or how its process ends, is
# graded as the submission it is (the wrong softmax's points, status failed), never "the grader failed",
# and the next student in the same worker keeps full marks. Each cell goes back to its folder at the end.
HOME_FD = "import os, socket, time\nhome = os.open('.', os.O_RDONLY)\n"
CLEANUP_ATTACKS = {
    "cleanup-deep-tree": [HOME_FD + "for _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nos.fchdir(home)"],
    "cleanup-long-names": [
        HOME_FD + "for _ in range(40):  # 10,000 characters of path\n    os.mkdir('L' * 250)\n"
        "    os.chdir('L' * 250)\nos.fchdir(home)"
    ],
    "cleanup-many-files": [HOME_FD + "os.mkdir('many')\nfor i in range(100_000):\n    open(f'many/{i}', 'w').close()"],
    "cleanup-locked": [
        HOME_FD
        + """
os.makedirs("locked/inner")
open("locked/inner/f", "w").close()
os.makedirs("readonly")
open("readonly/f", "w").close()
os.chmod("readonly/f", 0)
os.chmod("readonly", 0o500)
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
os.mkfifo("fifo")
held = socket.socket(socket.AF_UNIX)
held.bind("sock")
os.symlink("loop-b", "loop-a")
os.symlink("loop-a", "loop-b")
os.symlink("..", "up")
os.symlink("/", "root")
kept = open("kept-open", "w")
os.chmod(".", 0)  # its folder, and the scratch folder above it
os.chmod("..", 0)
"""
    ],
    "cleanup-keeps-writing": [
        HOME_FD
        + """
if os.fork() == 0:  # a daemon that keeps making folders and files while the worker wipes
    os.setsid()
    for i in range(100_000):
        try:
            os.makedirs(f"w/{i % 50}/{i}", exist_ok=True)
            open(f"w/{i % 50}/{i}/f", "w").close()
        except OSError:
            time.sleep(0.01)
    os._exit(0)
time.sleep(0.5)
""",
        "import os\nos._exit(0)  # and the process ends in its last cell",
    ],
}
UNANSWERED_DEEP_TREE = "cleanup-unanswered-deep-tree"  # the issue's: the released notebook, unanswered


def assert_cleanup_attacks_are_graded(rows):
    """Each clean-up attacker gets what its answers earn, as failed or passed tests (never error)."""
    graded = {r["student"] for r in rows}
    for student in [*CLEANUP_ATTACKS, UNANSWERED_DEEP_TREE]:
        assert student in graded, f"{student} has no row in grades.csv"
        s = statuses(rows, student)
        assert all(status in ("passed", "failed") for status, _ in s.values()), (student, s)
        expected = 0 if student == UNANSWERED_DEEP_TREE else points(rows, "baseline")
        assert points(rows, student) == expected, (student, s)


# Student code that writes a frame of its own on every socket it holds (the data socket among them).
SEND_FRAME = """
import os, socket, stat, struct
def send_frame(payload):
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                socket.socket(fileno=os.dup(fd)).sendall(struct.pack(">I", len(payload)) + payload)
        except OSError:
            pass
"""
# attacks inside the graded function (replacing the wrong softmax)
FUNCTION_ATTACKS = {
    # 30 MB of nested empty lists as a reply frame: about 700 MB once parsed
    "grader-memory-nested-lists": SEND_FRAME
    + """
def softmax(x, axis=-1):
    send_frame(b'{"ok":[' + b"[]," * 10_000_000 + b'[]]}')
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)
""",
    "exception-named-timeout": """
class Timeout(Exception):
    pass
def softmax(x, axis=-1):
    raise Timeout("the grader ran out of time")
""",
}
# forged cell frames: one such student once stopped the whole run (graded in a run of its own
# when unprotected, since there it ends the run)
FORGED_FRAMES = [
    SEND_FRAME
    + """
import json
for frame in ({"cell": -1000, "state": "start"}, {"cell": "0", "state": "done"},
              {"cell": 0, "state": "done", "error": "x"}):
    send_frame(json.dumps(frame).encode())
"""
]
HONEST = ("honest-0", "honest-1")
# Attacks on the grading pipeline (engineer P's defences in grade.py, notebook.py, results.py),
# graded in the same protected run: symlinks, malformed notebook fields, a notebook of nested
# lists, CSV formulas and control characters in names and messages.
PIPELINE_NAMES = {
    "p-symlink-to-source",
    "p-symlink-to-honest",
    "p-bad-fields",
    "p-nested-lists-notebook",
    "p-csv-formula",
    "=p-formula-name",
    "p-ansi-\x1b[2J-name",
}
CSV_FORMULA = """
def softmax(x, axis=-1):
    raise ValueError('=HYPERLINK("http://example.invalid/","click")')
"""


def memory_cgroup():
    """Whether this host lets the grader make a memory cgroup (SysV memory counts only there)."""
    cg = _Cgroups(1, memory=True)
    try:
        return "memory" in cg.paths
    finally:
        cg.remove()


def make_class(root, attacks, function_attacks=(), forged=False, pipeline=False, repo=REPO, cleanup=False):
    release(root / "release", [LESSON])
    rel = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    subs = root / "submissions"

    def put(student, nb):
        nbk.write(nb, subs / student / LESSON / f"{LESSON}.ipynb")

    wrong = fill(rel, LESSON, {"softmax": WRONG_SOFTMAX})
    put("baseline", wrong)
    for student in HONEST:
        put(student, fill(rel, LESSON))
    if cleanup:
        attacks = {**attacks, **CLEANUP_ATTACKS}
        put(UNANSWERED_DEEP_TREE, with_cells(rel, CLEANUP_ATTACKS["cleanup-deep-tree"], after=-1))
    for name, cells in attacks.items():
        cells = [c.replace("{REPO}", str(repo)).replace("{ROOT}", str(root)) for c in cells]
        put(name, with_cells(wrong, cells, after=-1))
    for name in function_attacks:
        put(name, fill(rel, LESSON, {"softmax": FUNCTION_ATTACKS[name]}))
    if forged:
        put("forged-frames", with_cells(wrong, FORGED_FRAMES))
    if pipeline:
        notebook = lambda student: subs / student / LESSON / f"{LESSON}.ipynb"  # noqa: E731
        for student, target in (
            ("p-symlink-to-source", REPO / "lessons" / LESSON / f"{LESSON}.ipynb"),
            ("p-symlink-to-honest", notebook(HONEST[0])),
        ):
            notebook(student).parent.mkdir(parents=True)
            notebook(student).symlink_to(target)
        bad = fill(rel, LESSON)
        bad["metadata"]["kernelspec"] = "python3"
        bad["cells"][0]["metadata"] = []
        nbk.code_cells(bad)[0]["source"] = ["import numpy as np\n", 7]
        put("p-bad-fields", bad)
        notebook("p-nested-lists-notebook").parent.mkdir(parents=True)
        notebook("p-nested-lists-notebook").write_text('{"cells": [' + "[]," * 6_000_000 + "[]]}")
        put("p-csv-formula", fill(rel, LESSON, {"softmax": CSV_FORMULA}))
        put("=p-formula-name", wrong)
        put("p-ansi-\x1b[2J-name", wrong)
    return subs


def grade(root, subs, extra=(), env=None, cwd=REPO, wrap=()):
    """The real command; returns (process, rows of grades.csv or None, the grader's peak memory in MiB)."""
    cmd = [
        *wrap,
        sys.executable,
        "-m",
        "autograder",
        "grade",
        str(subs),
        "--out",
        str(root / "results"),
        "--lesson",
        LESSON,
        "--jobs",
        "1",
        "--memory",
        "512",
        "--cell-timeout",
        "20",
        "--call-timeout",
        "20",
        "--quiet",
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err, peak = watch.communicate(proc, timeout=900)
    proc.stderr_text = err
    csv_path = root / "results" / "grades.csv"
    rows = list(csv.DictReader(csv_path.open(newline=""))) if csv_path.exists() and proc.returncode == 0 else None
    return proc, rows, peak


def points(rows, student):
    return sum(float(r["points"]) for r in rows if r["student"] == student)


def statuses(rows, student):
    return {r["test"]: (r["status"], r["message"]) for r in rows if r["student"] == student}


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    root = tmp_path_factory.mktemp("protected")
    subs = make_class(root, ATTACKS, FUNCTION_ATTACKS, forged=True, pipeline=True, cleanup=True)
    env = {k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV}
    return (*grade(root, subs, env=env), root / "results")


@pytest.fixture(scope="module")
def unprotected(tmp_path_factory):
    root = tmp_path_factory.mktemp("unprotected")
    subs = make_class(root, ATTACKS, ["grader-memory-nested-lists"])
    env = dict(os.environ, **{UNPROTECTED_ENV: "1"})
    run = grade(root, subs, env=env)
    forged_root = tmp_path_factory.mktemp("unprotected-forged")
    forged = grade(forged_root, make_class(forged_root, {}, forged=True), env=env)
    return run, forged


def assert_completed_with_honest_full_marks(p, rows):
    assert p.returncode == 0 and rows, p.stderr_text[-3000:]
    assert points(rows, "baseline") < 6
    for student in HONEST:
        assert points(rows, student) == 6, statuses(rows, student)


def test_the_protected_run_completes_and_honest_students_keep_full_marks(protected):
    assert_completed_with_honest_full_marks(*protected[:2])


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_attack_fails(protected, attack):
    _, rows, _, _ = protected
    if attack == "shm-sysv-over-memory" and not memory_cgroup():
        pytest.skip("no memory cgroup can be made here: SysV memory counts only while attached (README)")
    assert points(rows, attack) <= points(rows, "baseline"), statuses(rows, attack)


def test_what_a_submission_leaves_is_its_own_verdict(protected):
    assert_cleanup_attacks_are_graded(protected[1])


def test_forged_frames_cost_only_their_cell(protected):
    _, rows, _, _ = protected
    assert points(rows, "forged-frames") == points(rows, "baseline"), statuses(rows, "forged-frames")


def test_a_huge_reply_does_not_blow_up_the_grader(protected):
    _, rows, peak, _ = protected
    assert peak < GRADER_MEMORY_MIB, f"the grader reached {peak} MiB"
    status, message = statuses(rows, "grader-memory-nested-lists")["test_softmax"]
    assert status == "error" and "items" in message, message


def test_a_student_exception_named_timeout_is_the_students(protected):
    _, rows, _, _ = protected
    status, message = statuses(rows, "exception-named-timeout")["test_softmax"]
    assert status == "failed" and "Timeout" in message and "grader" not in message.replace("the grader ran", ""), (
        message
    )


@pytest.mark.parametrize("student", sorted(PIPELINE_NAMES))
def test_pipeline_attacks_fail(protected, student):
    """Engineer P's defences: a refused or broken notebook scores nothing, whatever it points to."""
    _, rows, _, _ = protected
    got = {r["student"] for r in rows}
    name = next((n for n in got if n.lstrip("'") == student or n == student.replace("\x1b", "")), student)
    assert points(rows, name) <= points(rows, "baseline"), statuses(rows, name)


def test_pipeline_output_is_clean(protected):
    """No CSV formula and no control character reaches grades.csv or the feedback."""
    _, rows, _, results = protected
    text = (results / "grades.csv").read_text(encoding="utf-8")
    fields = [f for row in csv.reader(text.splitlines()) for f in row]
    assert not [f for f in fields if f[:1] in ("=", "+", "-", "@", "\t", "\r")], "a field a spreadsheet would run"
    pages = [p.read_text(encoding="utf-8", errors="replace") for p in (results / "feedback").rglob("*.html")]
    assert "\x1b" not in text and not any("\x1b" in page for page in pages)
    assert max(map(len, pages)) < 2_000_000


def test_without_the_defences_every_attack_succeeds(unprotected):
    """The same attackers against the grader without them: each one must work, so each can fail."""
    (p, rows, peak), (forged, forged_rows, _) = unprotected
    assert p.returncode == 0 and rows, p.stderr_text[-3000:]
    baseline = points(rows, "baseline")
    for attack in ATTACKS:
        if attack == "takeover-debugger" and not any(Path(d).is_file() for d in ("/usr/bin/gdb", "/usr/bin/strace")):
            continue  # no debugger on this host to mount
        if attack == "leftover-1-sysv-writer":
            continue  # its effect is the reader's score
        assert points(rows, attack) > baseline, (attack, statuses(rows, attack))
    assert peak > GRADER_MEMORY_MIB, f"the nested lists took the grader to only {peak} MiB"
    assert (
        forged.returncode != 0
        or forged_rows is None
        or any(s == "error" and "grader failed" in m for s, m in statuses(forged_rows, "forged-frames").values())
    ), "forged frames were harmless even without validation"


# ---- the uid mode: where namespaces are refused ------------------------------------------------

UID_ATTACKS = {
    name: ATTACKS[name]
    for name in (
        "takeover-ptrace",
        "takeover-proc-mem",
        "takeover-process-vm",
        "leftover-1-sysv-writer",
        "leftover-2-sysv-reader",
    )
}
UID_ATTACKS["read-source-and-solutions"] = TRICKS["read_source_and_solutions"]
UID_ATTACKS["tamper-results"] = TRICKS["tamper_gradebook_and_results"]
# Docker's default seccomp profile refuses unshare(2): so does this one, put on the grader (and
# so on its worker and every child) before it starts, so that the uid mode runs as it would there.
NO_NAMESPACES = """
import ctypes, os, platform, struct, sys
arch, nr = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}[platform.machine()]
prog = [(0x20, 0, 0, 4), (0x15, 0, 3, arch), (0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, 0x50001),
        (0x06, 0, 0, 0x7FFF0000)]
code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
libc = ctypes.CDLL(None)
libc.prctl(38, 1, 0, 0, 0)
assert libc.prctl(22, 2, ctypes.c_char_p(struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(code))), 0, 0) == 0
os.execv(sys.argv[1], sys.argv[1:])
"""


def _course_as_in_a_container():
    """A command prefix for a private mount namespace laid out as a Docker or Gradescope image
    would be: the course only in the grader's private copy (this repository's own packages and
    lessons, which an editable install points to, are hidden), and the Python install readable
    by any uid (pyenv under /root is not: /root becomes a traversable tmpfs holding its bind);
    then no namespace may be made (NO_NAMESPACES). None where that cannot be made here."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    closed = [p for p in reversed(stdlib.parents) if not os.stat(p).st_mode & stat.S_IXOTH]
    if len(closed) > 1 or not shutil.which("unshare"):
        return None
    find = (
        "import importlib.util as u\nfor n in ('solutions', 'autograder'):\n"
        " print(*u.find_spec(n).submodule_search_locations)"
    )
    installed = subprocess.run([sys.executable, "-c", find], cwd="/", capture_output=True, text=True).stdout.split()
    hidden = dict.fromkeys([str(REPO / d) for d in ("solutions", "autograder", "lessons")] + installed)
    script = "set -e; " + "".join(f"mount -t tmpfs -o mode=700 tmpfs {d}; " for d in hidden)
    if closed:
        top, inner = closed[0], closed[0] / stdlib.relative_to(closed[0]).parts[0]
        script += (
            f"keep=$(mktemp -d); mount --bind {inner} $keep; mount -t tmpfs -o mode=755 tmpfs {top}; "
            f"mkdir {inner}; mount --move $keep {inner}; "
        )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script + 'exec "$@"',
        "sh",
        sys.executable,
        "-c",
        NO_NAMESPACES,
    ]


@pytest.fixture(scope="module")
def uid_mode(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the uid mode needs root (as in Docker or on Gradescope)")
    wrap = _course_as_in_a_container()
    if wrap is None:
        pytest.skip("no private mount namespace can be laid out like a container here")
    root = tmp_path_factory.mktemp("uid")  # pytest's folders are mode 0700: no other uid may enter
    course = root / "course"
    for name in ("autograder", "solutions", "lessons"):  # the course as the grader reads it, private
        shutil.copytree(REPO / name, course / name, ignore=shutil.ignore_patterns("__pycache__"))
    subs = make_class(root, UID_ATTACKS, repo=course, cleanup=True)
    return grade(
        root,
        subs,
        extra=["--sandbox", "uid"],
        cwd=course,
        wrap=wrap,
        env={k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV},
    )


def test_uid_mode_grades_honest_students(uid_mode):
    assert_completed_with_honest_full_marks(*uid_mode[:2])


@pytest.mark.parametrize("attack", sorted(UID_ATTACKS))
def test_uid_mode_stops_file_reading_and_takeover(uid_mode, attack):
    _, rows, _ = uid_mode
    assert points(rows, attack) <= points(rows, "baseline"), statuses(rows, attack)


def test_uid_mode_grades_what_a_submission_leaves_as_its_own(uid_mode):
    assert_cleanup_attacks_are_graded(uid_mode[1])


# ---- the unshare mode, asked for: it hides no file, and says so ----------------------------------


@pytest.fixture(scope="module")
def unshare_mode(tmp_path_factory):
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    root = tmp_path_factory.mktemp("unshare")
    subs = make_class(root, {}, cleanup=True)
    return (
        *grade(
            root,
            subs,
            extra=["--sandbox", "unshare"],
            env={k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV},
        ),
        root / "results",
    )


def test_unshare_mode_grades_what_a_submission_leaves_as_its_own(unshare_mode):
    p, rows, _, _ = unshare_mode
    if p.returncode == 2 and "no sandbox" in p.stderr_text:
        pytest.skip(f"unshare does not work here: {p.stderr_text.strip()}")
    assert_completed_with_honest_full_marks(p, rows)
    assert_cleanup_attacks_are_graded(rows)


def test_unshare_mode_warns_once_what_it_does_not_protect(unshare_mode):
    p, rows, _, results = unshare_mode
    if p.returncode == 2 and "no sandbox" in p.stderr_text:
        pytest.skip(f"unshare does not work here: {p.stderr_text.strip()}")
    warned = [line for line in p.stderr_text.splitlines() if "hides no file" in line]
    assert len(warned) == 1 and "solutions/" in warned[0] and "gradebook" in warned[0], p.stderr_text[-2000:]
    assert "hides no file" in (results / "report.html").read_text(encoding="utf-8")


# ---- auto where bubblewrap fails: never a mode that hides nothing -------------------------------

IMPORT_SOLUTIONS = "from solutions.attention import softmax  # the reference itself, if it can be imported"


@pytest.fixture(scope="module")
def auto_without_bwrap(tmp_path_factory):
    """`--sandbox auto` with a bwrap first on PATH that fails as on Ubuntu's AppArmor or in a container."""
    root = tmp_path_factory.mktemp("auto-no-bwrap")
    fake = root / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    attacks = {
        "read-source-and-solutions": TRICKS["read_source_and_solutions"],
        "tamper-results": TRICKS["tamper_gradebook_and_results"],
    }
    subs = make_class(root, attacks)
    rel = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    nbk.write(fill(rel, LESSON, {"softmax": IMPORT_SOLUTIONS}), subs / "import-solutions" / LESSON / f"{LESSON}.ipynb")
    env = {k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV}
    env["PATH"] = f"{fake}:{env.get('PATH', '/usr/bin:/bin')}"
    return (*grade(root, subs, extra=["--sandbox", "auto"], env=env), [*attacks, "import-solutions"], root)


def test_auto_never_falls_back_to_a_mode_that_hides_nothing(auto_without_bwrap):
    """Either a mode that hides the course (the uid mode, as root with the course private), or one line
    saying what to install; never the unshare mode, where these attackers earn the points."""
    p, rows, _, attackers, root = auto_without_bwrap
    if p.returncode == 2:
        lines = p.stderr_text.strip().splitlines()
        assert len(lines) == 1 and "bubblewrap" in lines[0] and "no sandbox" in lines[0], p.stderr_text
        assert not (root / "results" / "grades.csv").exists()
        return
    assert_completed_with_honest_full_marks(p, rows)
    for attacker in attackers:
        assert points(rows, attacker) <= points(rows, "baseline"), statuses(rows, attacker)
    assert not (root / "results" / "planted").exists() and not (REPO / "planted").exists()
