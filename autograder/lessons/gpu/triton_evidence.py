"""Lesson 06's source evidence, as the grader reads it: the rules live in autograder/source_rules.py
(standard library only), which `release` also copies beside the lesson's notebook, so that its visible
tests refuse first, with the same message, what the grader refuses here.

The reading is the grader's own work, bounded like the student's (issue 33): it runs once per notebook in a process
of its own under a CPU-time and a memory limit (READING_LIMITS), and a reading cut off by them is the grader's to
regrade (checks.Regrade: status error, flagged), never a pass and never a fail."""
import json
import subprocess
import sys
import threading
from pathlib import Path

from autograder import source_rules
from autograder.checking import Regrade

READING_CPU_SECONDS = 20  # a 300,000-character notebook at the rules' caps reads in about 3 s
READING_MB = 2048
READING_WALL_SECONDS = 4 * READING_CPU_SECONDS  # a busy machine's backstop
# The reading process bounds itself before it reads (a preexec_fn is not safe beside the grader's threads).
_READ = ("import json, resource, sys\n"
         f"for limit, value in ((resource.RLIMIT_CPU, {READING_CPU_SECONDS}), (resource.RLIMIT_AS, {READING_MB << 20})):\n"
         "    resource.setrlimit(limit, (value, value))\n"
         "sys.path.insert(0, sys.argv[1])\nimport source_rules\n"
         "print(json.dumps(source_rules.problems(json.load(sys.stdin))))")
_LAST = threading.local()  # (sources, their problems): the checks of one notebook read it once, per grading thread


def problems(sources):
    """{graded name: why the rules refuse it} (source_rules.problems), read in a bounded process of its own."""
    key = tuple(str(s) for s in sources)
    if getattr(_LAST, "read", (None,))[0] != key:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _READ, str(Path(source_rules.__file__).parent)],
                                  input=json.dumps(key), capture_output=True, text=True,
                                  timeout=READING_WALL_SECONDS)
            found = json.loads(done.stdout) if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            found = None
        if not isinstance(found, dict):
            raise Regrade(f"the grader could not read your code cells within its own bound ({READING_CPU_SECONDS} s "
                          f"of CPU time, {READING_MB} MB): your instructor will grade them again")
        _LAST.read = (key, found)
    return _LAST.read[1]


def problem(sources):
    """None when the sources show a triton_attention that launches a Triton kernel; else why not."""
    return problems(sources).get("triton_attention")


def softmax_problem(sources):
    """None when the sources show a triton_softmax that launches a Triton kernel; else why not."""
    return problems(sources).get("triton_softmax")


def flash_problem(sources):
    """None unless flash_attention, or anything it reaches by name in the cells, calls fused attention."""
    return problems(sources).get("flash_attention")


def online_problem(sources):
    """None unless online_softmax, or anything it reaches by name in the cells, calls PyTorch's softmax."""
    return problems(sources).get("online_softmax")
