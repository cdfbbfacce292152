"""Submissions that try to fool, crash or slow down the grader, graded by the real command.

Every trick rides on a known wrong answer (softmax without the max shift); the submission
must earn no more than the same wrong answer without the trick. Honest students graded in
the same run must get full marks, nothing outside RESULTS may change, and no process may
outlive the run.
"""

import copy
import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
LESSON = "01_attention"
REPO = Path(__file__).resolve().parents[2]

WRONG_SOFTMAX = """
def softmax(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)
"""
# What an exploit that worked would do: switch to a correct answer (so the test can fail).
IF_IT_WORKED = """
    def softmax(x, axis=-1):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)
"""

# name -> (cells inserted after the imports, answer replacements beyond the wrong softmax)
TRICKS = {
    "patch_numpy_testing": [
        "import numpy.testing\nnumpy.testing.assert_allclose = lambda *a, **k: None\n"
        "np.allclose = lambda *a, **k: True\nnp.testing.assert_array_equal = lambda *a, **k: None"
    ],
    "patch_torch_math_builtins": [
        "import torch, math, builtins\ntorch.allclose = lambda *a, **k: True\n"
        "math.isclose = lambda *a, **k: True\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.len = lambda x: 2"
    ],
    "always_equal_object": [],
    "ndarray_subclass": [],
    "rigged_array": [],
    "snoop_caller_frames": [],
    "input_transformer": ["ip = get_ipython()\nip.input_transformers_post.append(lambda lines: ['pass\\n'])"],
    "custom_exception_handler": ["get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)"],
    "read_source_and_solutions": [
        """
import os
found = [p for p in ["../../../source/01_attention/01_attention.ipynb", "../source/01_attention/01_attention.ipynb",
                     "{REPO}/lessons/01_attention/01_attention.ipynb", "{REPO}/solutions/attention.py",
                     "{REPO}/autograder/lessons/attention/checks.py",
                     "{ROOT}/submissions/honest-0/01_attention/01_attention.ipynb"]
         if os.path.exists(p)]
for module in ("solutions.attention", "autograder.lessons.attention.checks"):
    try:
        __import__(module)
        found.append(module)
    except ImportError:
        pass
if found:
"""
        + IF_IT_WORKED
    ],
    "tamper_gradebook_and_results": [
        """
import sqlite3
wrote = []
for path in ["{ROOT}/results/grades.csv", "{ROOT}/results/planted", "{ROOT}/submissions/honest-0/planted",
             "{REPO}/planted", "{ROOT}/gradebook.db"]:
    try:
        with open(path, "a"):
            wrote.append(path)
    except OSError:
        pass
if wrote:
"""
        + IF_IT_WORKED
    ],
    "detect_grader_env": [
        """
import os
graded = any(k.startswith(("NBGRADER", "GRADER", "CI", "PYTEST")) for k in os.environ)
if graded:
    raise SystemExit("detected the grader")
"""
    ],
    "network": [
        """
import socket
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2)
    reachable = True
except OSError:
    reachable = False
if reachable:
"""
        + IF_IT_WORKED
    ],
    "fake_reply_on_data_socket": [
        """
import os, socket, json, struct
for fd in range(3, 64):
    try:
        s = socket.socket(fileno=os.dup(fd))
        payload = json.dumps({"ok": None}).encode()
        s.sendall(struct.pack(">I", len(payload)) + payload)
    except OSError:
        pass
"""
    ],
    "os_exit_at_top_level": ["import os\nos._exit(0)"],
    "system_exit": ["import sys\nsys.exit(3)", "raise SystemExit"],
    "infinite_loop_swallowing_interrupts": [
        """
while True:
    try:
        pass
    except BaseException:
        pass
"""
    ],
    "memory_bomb": ["blob = []\nwhile True:\n    blob.append(bytearray(100 * 2**20))"],
    "fork_bomb": ["import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"],
    "huge_output": ["print('x' * 50_000_000)\nfor _ in range(200):\n    print('y' * 100_000)"],
    "kill_the_worker": ["import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"],
    "leave_a_daemon": [
        """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(600):
            open("/tmp/planted", "w").write("x")
            time.sleep(0.1)
        os._exit(0)
    os._exit(0)
"""
    ],
}
AT_THE_END = {"read_source_and_solutions", "tamper_gradebook_and_results", "network"}
# tricks inside the graded function itself (replacing the wrong softmax)
FUNCTION_TRICKS = {
    "always_equal_object": """
class Equal:
    def __eq__(self, other): return True
    def __array__(self, *a, **k): raise TypeError
def softmax(x, axis=-1):
    return Equal()
""",
    "ndarray_subclass": """
class Evil(np.ndarray):
    def __eq__(self, other): return np.ones(np.shape(other), bool)
    def __sub__(self, other): return np.zeros(np.shape(other))
def softmax(x, axis=-1):
    e = np.exp(x)
    return (e / e.sum(axis=axis, keepdims=True)).view(Evil)
""",
    "snoop_caller_frames": """
import sys
def softmax(x, axis=-1):
    frame = sys._getframe(1)
    while frame:  # a hidden test run in the student's process has the expected values on the stack
        for value in frame.f_locals.values():
            if isinstance(value, np.ndarray) and value.shape == np.shape(x) and value is not x:
                return value
        frame = frame.f_back
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)
""",
    "rigged_array": """
class Rigged:
    def __init__(self, x): self.x = x
    def __array__(self, *a, **k): return np.full_like(self.x, 1.0 / self.x.shape[-1])
    def __len__(self): return len(self.x)
def softmax(x, axis=-1):
    return Rigged(x)
""",
}
# correct answers that make noise: they must keep full marks
NOISY_BUT_CORRECT = [
    """
import sys, warnings
warnings.warn("a warning from the student's code")
print("noise on stderr", file=sys.stderr)
"""
]
CRASH_IN_FUNCTION = {
    "exit_inside_function": "import os\ndef causal_mask(n_queries, n_keys=None):\n    os._exit(1)",
    "loop_inside_function": "def causal_mask(n_queries, n_keys=None):\n    while True:\n        pass",
}


def checksums(*roots):
    out = {}
    for root in roots:
        for p in Path(root).rglob("*"):
            if p.is_file() and ".venv" not in p.parts and "__pycache__" not in p.parts and ".git" not in p.parts:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def with_cells(nb, cells, after=0):
    """nb with extra code cells inserted after the `after`-th code cell (no nbgrader metadata)."""
    nb = copy.deepcopy(nb)
    index = nb["cells"].index(nbk.code_cells(nb)[after]) + 1
    for i, src in enumerate(cells):
        nb["cells"].insert(
            index + i,
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"trick{index + i}",  # unique where a notebook gets cells in two places
                "metadata": {},
                "outputs": [],
                "source": src,
            },
        )
    return nb


@pytest.fixture(scope="module")
def attack(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack")
    release(root / "release", [LESSON])
    rel = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    subs = root / "submissions"
    gradebook = root / "gradebook.db"

    def put(student, nb=None, raw=None, name=f"{LESSON}.ipynb"):
        path = subs / student / LESSON / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(raw) if raw is not None else nbk.write(nb, path)

    wrong = fill(rel, LESSON, {"softmax": WRONG_SOFTMAX})
    put("baseline", wrong)
    for name, cells in TRICKS.items():
        nb = fill(rel, LESSON, {"softmax": FUNCTION_TRICKS.get(name, WRONG_SOFTMAX)})
        cells = [c.replace("{REPO}", str(REPO)).replace("{ROOT}", str(root)) for c in cells]
        put(f"trick-{name}", with_cells(nb, cells, after=-1 if name in AT_THE_END else 0))
    for i, cells in enumerate(NOISY_BUT_CORRECT):
        put(f"noisy-{i}", with_cells(fill(rel, LESSON), cells))
    for name, code in CRASH_IN_FUNCTION.items():
        put(f"crash-{name}", fill(rel, LESSON, {"causal_mask": code}))
    # damaged submissions
    solved = fill(rel, LESSON)
    put("damaged-corrupt-json", raw=json.dumps(solved)[:5000])
    put("damaged-renamed", solved, name="01_attention (1).ipynb")
    (subs / "damaged-missing" / LESSON).mkdir(parents=True)
    kernel = copy.deepcopy(solved)
    kernel["metadata"]["kernelspec"] = {"name": "ir", "language": "R", "display_name": "R"}
    put("damaged-wrong-kernel", kernel)
    stripped = copy.deepcopy(solved)
    for c in stripped["cells"]:
        c["metadata"].pop("nbgrader", None)
    put("damaged-stripped-metadata", stripped)
    tampered = copy.deepcopy(wrong)
    tests = [c for c in nbk.code_cells(tampered) if nbk.is_test(c)]
    nbk.set_source(tests[0], "pass  # the visible tests, deleted")
    tampered["cells"].remove(tests[1])  # a test cell deleted
    tampered["cells"].insert(3, copy.deepcopy(tests[2]))  # another duplicated, out of order
    put("damaged-edited-tests", tampered)
    for i in range(3):
        put(f"honest-{i}", solved)

    before = checksums(REPO / "lessons", REPO / "solutions", REPO / "autograder", subs)
    tmp = root / "tmp"  # the sandboxes' folders, named on their command lines: ours, not another run's
    tmp.mkdir()
    p = subprocess.run(
        [
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
            "2",
            "--cell-timeout",
            "8",
            "--call-timeout",
            "8",
            "--memory",
            "1024",
            "--gradebook",
            str(gradebook),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, TMPDIR=str(tmp)),
    )
    after = checksums(REPO / "lessons", REPO / "solutions", REPO / "autograder", subs)
    leftovers = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
    with open(root / "results" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return dict(p=p, rows=rows, before=before, after=after, leftovers=leftovers, root=root, gradebook=gradebook)


def points(attack, student):
    return sum(float(r["points"]) for r in attack["rows"] if r["student"] == student)


def statuses(attack, student):
    return {r["test"]: (r["status"], r["message"]) for r in attack["rows"] if r["student"] == student}


def test_the_run_completes_and_leaves_nothing_behind(attack):
    assert attack["p"].returncode == 0, attack["p"].stderr[-3000:]
    assert attack["before"] == attack["after"], "files outside RESULTS changed"
    assert not (attack["root"] / "results" / "planted").exists() and not (REPO / "planted").exists()
    assert attack["leftovers"] == [], "sandbox processes outlived the run"


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_tricks_earn_no_more_than_the_honest_baseline(attack, trick):
    baseline = points(attack, "baseline")
    assert baseline < 6  # softmax (2 points) lost, in part or whole; the rest passed
    assert points(attack, f"trick-{trick}") <= baseline, statuses(attack, f"trick-{trick}")


def test_honest_students_in_the_same_run_get_full_marks(attack):
    for i in range(3):
        assert points(attack, f"honest-{i}") == 6, statuses(attack, f"honest-{i}")


def test_crashes_and_hangs_in_top_level_code_do_not_cost_other_answers(attack):
    # the wrong softmax still loses what it loses; the cell that hangs or exits is skipped
    for trick in (
        "os_exit_at_top_level",
        "system_exit",
        "infinite_loop_swallowing_interrupts",
        "memory_bomb",
        "fork_bomb",
        "huge_output",
        "leave_a_daemon",
    ):
        assert points(attack, f"trick-{trick}") == points(attack, "baseline"), (
            trick,
            statuses(attack, f"trick-{trick}"),
        )
    assert (
        "skipped"
        in (
            attack["root"] / "results" / "feedback" / "trick-infinite_loop_swallowing_interrupts" / f"{LESSON}.html"
        ).read_text()
    )


def test_crash_inside_a_function_is_an_error_for_that_test_only(attack):
    """A process that exits is the grader's error (regraded); a loop that computes past the CPU limit on a call is
    the answer's own failure, too slow for the graded sizes (issue 33: CPU time, not the wall clock). Either way
    the other tests keep their marks."""
    for name in CRASH_IN_FUNCTION:
        s = statuses(attack, f"crash-{name}")
        if name == "loop_inside_function":
            assert s["test_causal_mask"][0] == "failed" and "CPU time" in s["test_causal_mask"][1], s
        else:
            assert s["test_causal_mask"][0] == "error", s
        assert s["test_softmax"][0] == s["test_scaled_dot_product_attention"][0] == "passed", s


def test_correct_answers_that_write_to_stderr_keep_full_marks(attack):
    assert points(attack, "noisy-0") == 6, statuses(attack, "noisy-0")


@pytest.mark.parametrize(
    "student, status, words, score",
    [
        ("damaged-corrupt-json", "error", "could not be read", 0),
        ("damaged-missing", "missing", "no 01_attention.ipynb", 0),
        ("damaged-renamed", "passed", "", 6),
        ("damaged-wrong-kernel", "passed", "", 6),
        ("damaged-stripped-metadata", "passed", "", 6),
        ("damaged-edited-tests", None, "", "baseline"),  # the wrong softmax, graded by the real tests
    ],
)
def test_damaged_submissions_get_a_clear_status(attack, student, status, words, score):
    s = statuses(attack, student)
    assert len(s) == 3
    assert points(attack, student) == (points(attack, "baseline") if score == "baseline" else score), s
    if status:
        assert all(st == status and words in msg for st, msg in s.values()), s


def test_feedback_explains_damaged_submissions(attack):
    fb = attack["root"] / "results" / "feedback"
    assert "should be named" in (fb / "damaged-renamed" / f"{LESSON}.html").read_text()
    assert "not Python" in (fb / "damaged-wrong-kernel" / f"{LESSON}.html").read_text()


def test_gradebook_holds_the_trusted_scores(attack):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{attack['gradebook']}") as gb:
        for student in ("baseline", "honest-0", "trick-tamper_gradebook_and_results"):
            assert gb.find_submission(LESSON, student).score == points(attack, student)


PLACES = (
    '["planted", os.path.expanduser("~/planted"), os.path.join(tempfile.gettempdir(), "planted"), "/tmp/planted", '
    '"/dev/shm/planted", "/scratch/planted", "/planted", "/opt/grader/planted", "/course/planted", "../planted"]'
)
WRITER = f"""
import os, tempfile, time
for path in {PLACES}:
    try:
        with open(path, "w") as f:
            f.write("x")
    except OSError:
        pass
if os.fork() == 0:  # a daemon that keeps planting while the next submission runs
    os.setsid()
    for _ in range(300):
        for path in {PLACES}:
            try:
                open(path, "w").close()
            except OSError:
                pass
        time.sleep(0.05)
    os._exit(0)
"""
READER = (
    f"""
import os, tempfile
if any(os.path.exists(p) for p in {PLACES}):
"""
    + IF_IT_WORKED
)


def test_one_submission_cannot_reach_the_next(tmp_path):
    """Graded one after the other by the same worker, a reader finds nothing a writer left."""
    release(tmp_path / "release", [LESSON])
    rel = nbk.read(tmp_path / "release" / LESSON / f"{LESSON}.ipynb")
    wrong = fill(rel, LESSON, {"softmax": WRONG_SOFTMAX})
    for student, cells in (("a-writer", [WRITER]), ("b-reader", [READER])):
        nbk.write(with_cells(wrong, cells, after=-1), tmp_path / "subs" / student / LESSON / f"{LESSON}.ipynb")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(tmp_path / "subs"),
            "--out",
            str(tmp_path / "results"),
            "--jobs",
            "1",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    with open(tmp_path / "results" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    scores = {s: sum(float(r["points"]) for r in rows if r["student"] == s) for s in ("a-writer", "b-reader")}
    assert scores["b-reader"] == scores["a-writer"] < 6, rows  # the same wrong softmax, nothing found
