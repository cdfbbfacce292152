"""Plain nbgrader with the repository's nbgrader_config.py: generate_assignment, autograde,
generate_feedback and export work, feedback hides the hidden tests, and nbgrader's release
equals the course's."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import student_copy
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LESSON = "01_attention"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course folder using the repository's config, with its lessons as the source directory."""
    root = tmp_path_factory.mktemp("nbgrader")
    (root / "nbgrader_config.py").write_text(
        f"exec(open({str(REPO / 'nbgrader_config.py')!r}).read())\n"
        f"c.CourseDirectory.source_directory = {str(REPO / 'lessons')!r}\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def nbgrader(*args):
        p = subprocess.run(
            [str(Path(sys.executable).parent / "nbgrader"), *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]

    nbgrader("generate_assignment", LESSON, "--force")
    released = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    wrong_softmax = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n"
    for student, nb in (
        ("solved", fill(released, LESSON)),
        ("wrong", fill(released, LESSON, {"softmax": wrong_softmax})),
        ("blank", released),
    ):
        nbk.write(nb, root / "submitted" / student / LESSON / f"{LESSON}.ipynb")
    nbgrader("autograde", LESSON, "--force")
    nbgrader("generate_feedback", LESSON, "--force")
    nbgrader("export")
    return root, released


def test_nbgrader_release_equals_the_course_release(course):
    _, released = course
    ours = student_copy(nbk.read(nbk.lesson_path(LESSON)))
    assert [nbk.source(c).rstrip() for c in released["cells"]] == [nbk.source(c).rstrip() for c in ours["cells"]]


def test_autograde_and_export_give_the_expected_scores(course):
    root, _ = course
    with open(root / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {"solved": 6.0, "wrong": 4.0, "blank": 0.0}


def test_feedback_hides_the_hidden_tests(course):
    root, _ = course
    for student in ("solved", "wrong", "blank"):
        page = (root / "feedback" / student / LESSON / f"{LESSON}.html").read_text()
        assert "HIDDEN TESTS" not in page and "verify(" not in page and "autograder" not in page
    assert (
        "AssertionError: softmax returned inf/nan for large inputs"
        in (root / "feedback" / "wrong" / LESSON / f"{LESSON}.html").read_text()
    )


def test_nbgrader_releases_a_written_question_without_its_rubric(course):
    """Lesson 04's written question through nbgrader's generate_assignment: the same student copy as the course's
    release, the answer cell still a manually graded answer (solution, grade, its points) holding YOUR ANSWER HERE,
    and neither the model answer nor the rubric anywhere in the release."""
    root, _ = course
    lesson = "04_gqa"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(
        [str(Path(sys.executable).parent / "nbgrader"), "generate_assignment", lesson, "--force"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    path = root / "release" / lesson / f"{lesson}.ipynb"
    released, ours = nbk.read(path), student_copy(nbk.read(nbk.lesson_path(lesson)))
    assert [nbk.source(c).rstrip() for c in released["cells"]] == [nbk.source(c).rstrip() for c in ours["cells"]]
    [cell] = [c for c in released["cells"] if nbk.is_written(c)]
    assert (nbk.grade_id(cell), nbk.meta(cell)["points"], nbk.source(cell).strip()) == ("written_gqa", 2, nbk.TEXT_STUB)
    assert "Rubric" not in path.read_text() and "Model answer" not in path.read_text()
