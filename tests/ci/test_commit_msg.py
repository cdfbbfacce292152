"""The commit-msg hook (.ci/commit_msg.py): what it refuses and what it lets through, and its exit status."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".ci" / "commit_msg.py"
spec = importlib.util.spec_from_file_location("commit_msg", HOOK)
commit_msg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(commit_msg)


@pytest.mark.parametrize(
    "message, words",
    [
        ("", "empty"),
        ("# only a comment\n\n", "empty"),
        ("x" * 73 + "\n\nbody", "73 characters"),
        ("Merge branch 'l20'", "names a branch"),
        ("Merge branch 'main' into move\n\n# Conflicts:\n#\tREADME.md\n", "names a branch"),
        ("Merge remote-tracking branch 'origin/main'", "names a branch"),
        ("Merge branches 'a' and 'b'", "names a branch"),
    ],
)
def test_a_bad_subject_is_refused_with_its_reason(message, words):
    assert words in (commit_msg.problem(message) or "")


@pytest.mark.parametrize(
    "message",
    [
        "Move each lesson's grader code and tests into per-lesson places",
        "x" * 72,
        "# a comment git adds\nFix imports\n\nWhy, in the body, as long as it needs to be." + "y" * 200,
        "Merge move: one package per lesson, tests by lesson",
    ],
)
def test_a_good_subject_passes(message):
    assert commit_msg.problem(message) is None


def test_the_hook_exits_1_on_a_refused_message(tmp_path):
    (tmp_path / "bad").write_text("Merge branch 's21b'\n")
    (tmp_path / "good").write_text("Add ruff\n")
    bad = subprocess.run([sys.executable, str(HOOK), str(tmp_path / "bad")], capture_output=True, text=True)
    good = subprocess.run([sys.executable, str(HOOK), str(tmp_path / "good")], capture_output=True, text=True)
    assert bad.returncode == 1 and "names a branch" in bad.stderr
    assert good.returncode == 0 and good.stderr == ""
