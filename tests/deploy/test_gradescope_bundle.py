"""The Gradescope autograder zip, run as Gradescope runs it: unpacked into a root laid out like
/autograder (source/, submission/, results/), run_autograder called on a correct, a wrong and a
broken submission, and every results.json validated against Gradescope's documented format.
Most tests grade with this venv (GRADESCOPE_PYTHON); test_setup_sh_builds_a_grader_from_nothing
runs setup.sh for real, as root, and grades with the venv it made, in an environment without ours."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile

import jsonschema
import pytest

from autograder import notebook as nbk
from autograder.adapters import gradescope
from autograder.adapters.gradescope import setup_script
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
LESSON = "01_attention"

# From https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output format"): every
# field it documents, nothing else; a score on the top level or on every test.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
TEST = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number"},
        "max_score": {"type": "number"},
        "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string"},
        "name_format": FORMAT,
        "number": {"type": "string"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "tags": {"type": "array", "items": {"type": "string"}},
        "visibility": VISIBILITY,
        "extra_data": {"type": "object"},
    },
}
RESULTS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "test_output_format": FORMAT,
        "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": TEST},
        "leaderboard": {"type": "array"},
    },
    "anyOf": [
        {"required": ["score"]},
        {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}},
    ],
}
# What this course promises on top: the fields the issue names, on every test.
OURS = {
    "type": "object",
    "required": ["score", "output", "tests", "visibility"],
    "properties": {
        "tests": {
            "minItems": 1,
            "items": {"required": ["name", "score", "max_score", "output", "visibility", "status"]},
        }
    },
}


def autograder(*args):
    p = subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("gradescope")
    autograder(
        "gradescope-bundle",
        "--lesson",
        LESSON,
        "--out",
        str(root / "autograder.zip"),
        "--test-visibility",
        "after_due_date",
        "--visibility",
        "visible",
    )
    release(root / "release", [LESSON])
    return root, nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")


def unpack(tmp_path, bundle_zip):
    """A Gradescope root (source/ holding the zip, submission/, results/, run_autograder)."""
    root = tmp_path / "autograder"
    for d in ("source", "submission", "results"):
        (root / d).mkdir(parents=True)
    with zipfile.ZipFile(bundle_zip) as z:
        for info in z.infolist():
            z.extract(info, root / "source")
            os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777 or 0o644)
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    os.chmod(root / "run_autograder", 0o755)
    return root


def run_autograder(tmp_path, bundle_zip, files, root=None, env=None):
    """Upload files {name: bytes} into a Gradescope root (a new one unless given), run run_autograder;
    results.json, checked against Gradescope's format."""
    root = root or unpack(tmp_path, bundle_zip)
    for name, data in files.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_bytes(data)
    env = env or dict(os.environ, GRADESCOPE_ROOT=str(root), GRADESCOPE_PYTHON=sys.executable)
    p = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(data, RESULTS)
    jsonschema.validate(data, OURS)
    return data


def notebook_bytes(nb):
    return (json.dumps(nb, indent=1) + "\n").encode()


def test_the_zip_holds_the_two_scripts_and_only_this_lesson(bundle):
    root, _ = bundle
    with zipfile.ZipFile(root / "autograder.zip") as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        setup = z.read("setup.sh").decode()
    assert {
        "setup.sh",
        "run_autograder",
        "course/pyproject.toml",
        f"course/lessons/{LESSON}/{LESSON}.ipynb",
        "course/solutions/attention.py",
        "course/autograder/lessons/attention/checks.py",
    } <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert {n.split("/")[2] for n in names if n.startswith("course/lessons/")} == {LESSON}
    assert not any(n.startswith(("course/tests/", "course/.")) or "__pycache__" in n for n in names)
    assert "bubblewrap" in setup and "download.pytorch.org/whl/cpu" in setup and "torch==" in setup
    assert "[gpu]" not in setup and "[gpu]" in setup_script("06_gpu")  # Triton only where lesson 06 needs it


def test_correct_submission_gets_full_marks(bundle, tmp_path):
    root, rel = bundle
    data = run_autograder(tmp_path, root / "autograder.zip", {f"{LESSON}.ipynb": notebook_bytes(fill(rel, LESSON))})
    assert data["score"] == sum(t["max_score"] for t in data["tests"]) > 0
    assert {t["status"] for t in data["tests"]} == {"passed"}
    assert {t["visibility"] for t in data["tests"]} == {"after_due_date"} and data["visibility"] == "visible"
    assert [t["name"] for t in data["tests"]] == [t for t, _ in nbk.graded_tests(nbk.read(nbk.lesson_path(LESSON)))]


def test_wrong_submission_loses_only_its_points_and_is_told_why(bundle, tmp_path):
    root, rel = bundle
    what, keyword, code = mutants.for_lesson(LESSON).MUTANTS["softmax"][0]
    upload = {f"work/{LESSON}.ipynb": notebook_bytes(fill(rel, LESSON, {"softmax": code}))}
    data = run_autograder(tmp_path, root / "autograder.zip", upload)
    by_name = {t["name"]: t for t in data["tests"]}
    assert by_name["test_softmax"]["status"] == "failed"
    assert by_name["test_softmax"]["score"] < by_name["test_softmax"]["max_score"]  # partial credit at most
    assert keyword.lower() in by_name["test_softmax"]["output"].lower(), what
    assert all(t["status"] == "passed" for n, t in by_name.items() if n != "test_softmax")
    assert data["score"] == sum(t["score"] for t in data["tests"])


def test_broken_submission_scores_zero_with_a_reason(bundle, tmp_path):
    root, _ = bundle
    data = run_autograder(tmp_path, root / "autograder.zip", {f"{LESSON}.ipynb": b'{"cells": [ not json'})
    assert data["score"] == 0 and {t["status"] for t in data["tests"]} == {"failed"}
    assert all("could not be read" in t["output"] for t in data["tests"])


def graded_as(root, monkeypatch, rows, written=()):
    """A Gradescope root whose grading returns these test rows and written questions (the grader itself not run),
    read when it grades."""
    import autograder.grade
    from autograder.results import Result

    monkeypatch.setattr(
        autograder.grade,
        "grade",
        lambda *a, **k: {
            "results": [
                Result.from_json(
                    dict(student="submission", lesson=LESSON, notes=[], cells={}, tests=rows, written=list(written))
                )
            ]
        },
    )
    monkeypatch.setattr("autograder.worker.choose_mode", lambda *a: "bwrap")
    for d in ("source", "submission", "results"):
        (root / d).mkdir()
    (root / "source" / "gradescope.json").write_text(
        json.dumps(
            dict(
                lesson=LESSON,
                visibility="visible",
                test_visibility="visible",
                stdout_visibility="hidden",
                max_score=sum(r["max_points"] for r in rows),
            )
        )
    )


def test_a_test_the_grader_could_not_check_writes_no_results(tmp_path, monkeypatch):
    """Never a zero for the grader's own failure: no results.json, exit 1, Gradescope shows a failed run."""
    row = dict(
        test="test_softmax", points=0.0, max_points=2.0, status="error", message="Triton is missing", grader_error=True
    )
    graded_as(tmp_path, monkeypatch, [row])
    assert gradescope.run(tmp_path) == 1 and not (tmp_path / "results" / "results.json").exists()
    row.update(status="failed", grader_error=False)  # the same row as the student's failure is scored
    assert gradescope.run(tmp_path) == 0
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    jsonschema.validate(data, RESULTS)
    assert data["score"] == 0 and data["tests"][0]["output"] == "Triton is missing"


def test_a_written_question_is_said_in_the_output_never_scored(tmp_path, monkeypatch):
    """Gradescope has no test a person grades later: the written question is a line of results.json's output,
    named with its points and 'needs grading', and neither a test nor part of the score (never a silent 0)."""
    row = dict(test="test_softmax", points=2.0, max_points=2.0, status="passed", message="")
    graded_as(
        tmp_path,
        monkeypatch,
        [row],
        [
            dict(
                question="written_heads", max_points=2.0, status="needs grading", message="answered; graded by a person"
            )
        ],
    )
    assert gradescope.run(tmp_path) == 0
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    jsonschema.validate(data, RESULTS)
    jsonschema.validate(data, OURS)
    assert (data["score"], [t["name"] for t in data["tests"]]) == (2.0, ["test_softmax"])
    assert data["output"].splitlines()[:2] == [
        f"{LESSON}: 2 / 2 points",
        f"{LESSON}: written question written_heads (2 points, needs grading in Gradescope, not in this score): "
        "answered; graded by a person",
    ]


def test_a_sandbox_that_does_not_start_is_one_line_with_its_own_error(tmp_path, monkeypatch, capsys):
    """The worker's own last words (here: the import that failed) in the error, and run_autograder's
    failure one line naming that cause once, whatever the number of tests."""
    from autograder.worker import DEFAULT_LIMITS, Sandbox, SandboxError

    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'IPython'\" >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(SandboxError) as e:
        Sandbox("none", DEFAULT_LIMITS, None)
    assert str(e.value) == "the none sandbox did not start: ModuleNotFoundError: No module named 'IPython'"
    monkeypatch.undo()

    graded_as(
        tmp_path,
        monkeypatch,
        [
            dict(
                test=f"test_{n}",
                points=0.0,
                max_points=2.0,
                status="error",
                grader_error=True,
                message=f"could not be graded: {e.value}",
            )
            for n in ("softmax", "causal_mask")
        ],
    )
    assert gradescope.run(tmp_path) == 1 and not (tmp_path / "results" / "results.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: the grader could not check 2 test(s) of {LESSON}: could not be graded: {e.value}"]


def _setup_skip_reason():
    """Why setup.sh cannot run here for real, or None."""
    if os.geteuid() != 0:
        return "setup.sh runs as root, as on Gradescope (apt-get, chmod of the course): run the tests as root"
    if not (shutil.which("apt-get") and shutil.which("dpkg") and os.path.exists("/usr/bin/python3")):
        return "setup.sh needs a Debian or Ubuntu system (apt-get, dpkg, /usr/bin/python3)"
    missing = subprocess.run(
        ["dpkg", "-s", "python3", "python3-venv", "python3-pip", "bubblewrap"], capture_output=True
    ).returncode
    if missing and subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=300).returncode:
        return "apt-get cannot reach its archive (apt-get update failed)"
    if subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "ipython"], capture_output=True, timeout=120
    ).returncode:
        return "pip cannot reach a package index"
    return None


def _torch_index_reachable():
    try:
        urllib.request.urlopen(gradescope.CPU_TORCH_INDEX + "/torch/", timeout=10).close()
        return True
    except OSError:
        return False


def test_setup_sh_builds_a_grader_from_nothing(bundle, tmp_path_factory):
    """setup.sh for real, as Gradescope runs it (root, GRADESCOPE_ROOT a temporary folder), twice (it
    must be safe to run again), then run_autograder with none of this venv's environment: a correct
    submission gets full marks. Where PyTorch's CPU index is unreachable, torch comes from pip's own
    configured index (GRADESCOPE_TORCH_INDEX=, as Gradescope never needs)."""
    why = _setup_skip_reason()
    if why:
        pytest.skip(why)
    root_dir, rel = bundle
    work = tmp_path_factory.mktemp("setup")
    root = unpack(work, root_dir / "autograder.zip")
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "GRADESCOPE_ROOT": str(root),
    }
    setup_env = dict(env, **({} if _torch_index_reachable() else {"GRADESCOPE_TORCH_INDEX": ""}))
    setup_env.update(
        {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "http_", "https_", "HTTP", "NO_PROXY"))}
    )
    try:
        for attempt in ("first", "again"):
            start = time.monotonic()
            p = subprocess.run(
                ["bash", str(root / "source" / "setup.sh")],
                cwd=root / "source",
                env=setup_env,
                capture_output=True,
                text=True,
                timeout=1500,
            )
            assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
            print(f"setup.sh ({attempt}): {time.monotonic() - start:.0f} s")
        assert (root / "source").stat().st_mode & 0o777 == 0o700
        data = run_autograder(work, None, {f"{LESSON}.ipynb": notebook_bytes(fill(rel, LESSON))}, root=root, env=env)
        assert data["score"] == sum(t["max_score"] for t in data["tests"]) > 0
        assert {t["status"] for t in data["tests"]} == {"passed"}
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a venv with torch: about a gigabyte
