"""check_submission.py, the check students run before submitting: release puts it in every lesson folder,
it holds nothing of solutions/ or checks/, and it says what the grader would say, in the grader's words."""

import copy
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import check_submission as cs
from autograder import grade
from autograder import notebook as nbk
from autograder.checking.memory import HEADROOM_STATEMENT
from autograder.release import TRIPWIRES, release, script_facts
from tests.harness.lessons import LESSONS, fill
from tests.harness.mutants import MEMORY_BOUND

ROOT = Path(__file__).resolve().parents[2]
LESSON = "01_attention"


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    release(out)
    return out


def script(released, lesson, notebook, *args):
    """Run the released check_submission.py on a notebook dict saved in the lesson's folder: (exit status, output)."""
    folder = released / lesson
    nbk.write(notebook, folder / "mine.ipynb")
    done = subprocess.run(
        [sys.executable, "check_submission.py", "mine.ipynb", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout


def notebook(released, lesson=LESSON):
    return nbk.read(released / lesson / f"{lesson}.ipynb")


def test_every_released_folder_has_the_check_for_its_lesson(released):
    for lesson in LESSONS:
        text = (released / lesson / "check_submission.py").read_text()
        facts = script_facts(notebook(released, lesson), lesson)
        assert f"LESSON = {facts!r}" in text
        assert [t for t, _ in nbk.lesson_tests(lesson)] == list(facts["tests"])


def test_released_folders_hold_nothing_from_solutions_or_checks(released):
    """No line of solutions/ or autograder/checking/ (beyond short ones such as imports) is in a released
    file other than the notebook (whose stubs keep the functions' signatures and docstrings) and lesson 06's
    tripwires.py (the grader's switch, released by design: the same file as autograder's)."""
    private = {
        line.strip()
        for f in [*(ROOT / "solutions").glob("*.py"), *(ROOT / "autograder" / "checks").glob("*.py")]
        for line in f.read_text().splitlines()
        if len(line.strip()) >= 40 and not line.strip().startswith("#")
    }
    assert private
    for f in released.rglob("*.py"):
        if f.name == TRIPWIRES.name:
            assert f.read_bytes() == TRIPWIRES.read_bytes()
            continue
        text = f.read_text()
        assert not {line.strip() for line in text.splitlines()} & private, f
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, f


def test_the_template_refuses_to_run_itself(capsys):
    with pytest.raises(SystemExit) as e:
        cs.main(["x.ipynb"])
    assert e.value.code == 2 and "released lesson folder" in capsys.readouterr().err


def test_an_honest_notebook_passes_and_the_released_one_does_not(released):
    rc, out = script(released, LESSON, fill(notebook(released), LESSON))
    assert rc == 0, out
    assert out.count("passed") == 3 and "ready to submit" in out
    rc, out = script(released, LESSON, notebook(released))
    # softmax's and causal_mask's tests meet their stubs; scaled_dot_product_attention's names the stub it waits for
    assert rc == 1 and out.count("FAILED: NotImplementedError (an answer is still the released stub)") == 2, out
    assert "FAILED: NotImplementedError: scaled_dot_product_attention: NOT TESTED YET" in out and "softmax" in out, out


def test_a_failing_visible_test_names_its_assertion(released):
    nb = fill(
        notebook(released),
        LESSON,
        {
            "causal_mask": "def causal_mask(n_queries, n_keys=None):\n"
            "    import numpy as np\n"
            "    return np.ones((n_queries, n_keys or n_queries), bool)\n"
        },
    )
    rc, out = script(released, LESSON, nb)
    assert rc == 1 and "PROBLEM test_causal_mask: FAILED: AssertionError" in out and "ok      test_softmax" in out


def test_a_hanging_cell_is_stopped_and_named(released):
    nb = fill(notebook(released), LESSON)
    nb["cells"].insert(
        2,
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "while True:\n    pass\n",
        },
    )
    # 5 s, not the default 900: the loop is the first code cell, so only Python and IPython's start come before it
    rc, out = script(released, LESSON, nb, "--timeout", "5")
    # named by its first line and its number counting markdown cells, which Jupyter does not show
    said = "the cell that begins 'while True:' (cell 3, counting markdown cells) did not finish within 5 s"
    assert rc == 1 and f"{said}; the tests after it did not run" in out, out


def test_a_crash_names_the_test_it_stopped_and_its_usual_cause(released):
    # a Triton kernel storing without a mask corrupts memory: glibc aborts, or a segfault, in the test that calls it
    nb = fill(
        notebook(released),
        LESSON,
        {"causal_mask": "def causal_mask(n_queries, n_keys=None):\n    import os\n    os.abort()\n"},
    )
    rc, out = script(released, LESSON, nb)
    assert rc == 1 and "(test_causal_mask) stopped the notebook (exit status -6" in out, out
    assert "crashed" in out and "without mask=" in out and "the tests after it did not run" in out, out


def problems(nb, lesson_nb, folder):
    """The problem lines check gives nb (saved in folder), for the lesson of the released notebook lesson_nb."""
    nbk.write(nb, folder / "x.ipynb")
    return [
        line
        for bad, line in cs.check(folder / "x.ipynb", cs.lesson_facts(lesson_nb, LESSON), run=False, folder=folder)
        if bad
    ]


def cell(nb, grade_id):
    return next(c for c in nb["cells"] if nbk.grade_id(c) == grade_id)


def test_the_wrong_lesson_and_lost_metadata_in_the_graders_words(released, tmp_path):
    [line] = problems(notebook(released, "02_heads"), notebook(released), tmp_path)
    assert line.startswith(f"this is not lesson {LESSON}")
    nb = fill(notebook(released), LESSON)
    for c in nb["cells"]:
        c["metadata"].pop("nbgrader", None)
    [line] = problems(nb, notebook(released), tmp_path)
    assert line.startswith(cs.LOST_METADATA)
    assert cs.LOST_METADATA in grade.submission_cells(nb)[2]  # the grader's own note
    assert (cs.TOO_BIG, cs.MAX_NOTEBOOK_BYTES, cs.DEMO_TAG, cs.TEXT_STUB) == (
        nbk.TOO_BIG,
        nbk.MAX_NOTEBOOK_BYTES,
        nbk.DEMO_TAG,
        nbk.TEXT_STUB,
    )
    # The check and the grader take the same cells for written questions (the check cannot import the grader).
    cells = [c for lesson in LESSONS for c in nbk.read(nbk.lesson_path(lesson))["cells"]]
    assert [cs.is_written(c) for c in cells] == [nbk.is_written(c) for c in cells] and sum(
        map(nbk.is_written, cells)
    ) == 4


def test_cells_the_grader_would_not_read(released, tmp_path):
    nb = fill(notebook(released), LESSON)
    honest = copy.deepcopy(nb)
    assert problems(honest, notebook(released), tmp_path) == []
    nbk.set_source(cell(nb, "test_softmax"), nbk.source(cell(nb, "test_softmax")) + "\ndef softmax(x): ...\n")
    cell(nb, "causal_mask")["metadata"].pop("nbgrader")
    demo = next(c for c in nb["cells"] if nbk.is_demo(c))
    nbk.set_source(demo, "def scaled_dot_product_attention(q, k, v, mask=None):\n    return q\n")
    found = problems(nb, notebook(released), tmp_path)
    assert any("the test cell 'test_softmax', was edited" in line for line in found)
    assert any("answer cell 'causal_mask' has lost its nbgrader metadata" in line for line in found)
    assert any("defines scaled_dot_product_attention but is a demo cell" in line for line in found)
    assert len(found) == 3, found
    # the grader indeed reads neither the test cell nor the demo
    assert not any("def softmax(x): ..." in s or "return q" in s for s in grade.submission_cells(nb)[0])


def test_code_past_what_the_grader_reads_in_its_words(released, tmp_path):
    """Code cells longer in all than the grader parses on its side (Subject.readable_sources, which bounds its work)
    are a problem before submission, in the grader's words; a notebook just under it is read, and a cell longer than
    the grader parses counts for nothing."""
    from autograder.checking import Subject

    nb = fill(notebook(released), LESSON)
    room = cs.MAX_CODE_CHARS - sum(map(len, grade.submission_cells(nb)[0]))
    scratch = ["#" * cs.MAX_CELL_CHARS] * (room // cs.MAX_CELL_CHARS) + ["#" * (room % cs.MAX_CELL_CHARS)]
    nb["cells"] += [
        {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
        for c in scratch + ["#" * (cs.MAX_CELL_CHARS + 1)]
    ]
    read = lambda: Subject(None, sources=grade.submission_cells(nb)[0]).readable_sources()
    assert problems(nb, notebook(released), tmp_path) == [] and read()
    nbk.set_source(nb["cells"][-2], nbk.source(nb["cells"][-2]) + "#")
    [line] = problems(nb, notebook(released), tmp_path)
    assert line == cs.TOO_MUCH_CODE.format(cs.MAX_CODE_CHARS + 1)
    with pytest.raises(AssertionError) as grader:
        read()
    assert str(grader.value) == line


@pytest.mark.slow
def test_the_check_shows_the_graders_words_for_a_forbidden_path(released, tmp_path):
    """Lesson 06 with flash_attention reaching PyTorch's attention kernel through a table filled later: the check runs
    the visible test, which switches the kernels off as the grader does (tripwires.py beside the script, wherever
    the notebook is), and prints the grader's own message."""
    from autograder import lessons
    from autograder.checking import mistakes
    from autograder.sandbox import tripwires

    trick = next(m.code for m in mistakes.mutants("06_gpu")["flash_attention"] if m.what.startswith("a dispatch table"))
    nbk.write(fill(notebook(released, "06_gpu"), "06_gpu", {"flash_attention": trick}), tmp_path / "mine.ipynb")
    done = subprocess.run(
        [sys.executable, str(released / "06_gpu" / "check_submission.py"), "mine.ipynb"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    rule = lessons.forbids("06_gpu")["flash_attention"]
    words = tripwires.message(
        "flash_attention", "reached PyTorch's attention kernel (aten::scaled_dot_product_attention)", rule["instead"]
    )
    assert f"test_flash_attention: FAILED: AssertionError: {words}" in done.stdout, done.stdout[-3000:]


def written(nb, grade_id="why_scale", points=2, text="YOUR ANSWER HERE"):
    """nb with a written question after its first cell: a markdown answer cell graded by hand (nbgrader's
    manually graded answer: solution and grade, its points)."""
    nb = copy.deepcopy(nb)
    nb["cells"].insert(
        1,
        {
            "cell_type": "markdown",
            "source": text,
            "metadata": {
                "nbgrader": {"grade": True, "solution": True, "grade_id": grade_id, "points": points, "locked": False}
            },
        },
    )
    return nb


def test_written_questions_are_checked_kept_and_answered(released, tmp_path):
    """release records each written question (grade_id: points); the check names one whose cell lost its
    metadata and one still holding the released stub, and is quiet about an answered one."""
    lesson_nb = written(notebook(released))
    facts = cs.lesson_facts(lesson_nb, LESSON)
    assert facts["written"] == {"why_scale": 2.0} and "why_scale" not in facts["answers"]
    check = lambda nb: problems(nb, lesson_nb, tmp_path)  # noqa: E731
    answered = fill(notebook(released), LESSON)
    assert check(written(answered, text="Without it the logits grow like sqrt(d_k).")) == []
    [line] = check(written(answered))
    assert line.startswith("the written question 'why_scale' (2 points) still holds YOUR ANSWER HERE")
    lost = written(answered, text="My answer.")
    lost["cells"][1]["metadata"] = {}
    [line] = check(lost)
    assert line.startswith("the written question 'why_scale' (2 points) has lost its nbgrader metadata")


def test_release_keeps_a_written_question_and_tells_the_check(tmp_path):
    """A written question in a lesson's source: the student copy keeps its cell and metadata with the answer
    replaced by the stub, and the released check_submission.py knows its points."""
    from autograder.release import check_script, student_copy

    src = written(
        nbk.read(nbk.lesson_path(LESSON)),
        text=f"Why scale?\n{nbk.BEGIN_SOLUTION}\nThe logits grow like sqrt(d_k).\n{nbk.END_SOLUTION}\n",
    )
    copy_ = student_copy(src)
    cell_ = copy_["cells"][1]
    assert nbk.TEXT_STUB in nbk.source(cell_) and "sqrt" not in nbk.source(cell_) and cs.is_written(cell_)
    assert "'written': {'why_scale': 2.0}" in check_script(copy_, LESSON)


def test_the_check_and_the_grader_agree_on_what_demonstrations_define(released, tmp_path):
    """Demo cells are not run when grading. An answer whose cell reads a name only a demo defines is lost: the
    check says so, naming that demo cell, and so does the grader, which gives it nothing. A scratch cell that
    reads one only raises: the grader runs it and goes on (full marks), and the check notes it without failing. An
    answer reading a name only a test cell binds passes this check's run but not the grader: the check says so."""
    demos = cs.demo_only(notebook(released))  # x: the first demo binds it (a later test cell too); dots: a plot's
    code = {
        nbk.grade_id(c): nbk.source(c) for c in nbk.code_cells(fill(notebook(released), LESSON)) if nbk.is_answer(c)
    }
    lost = fill(notebook(released), LESSON, {"softmax": "BIG = x.max()\n" + code["softmax"]})
    scratch = fill(notebook(released), LESSON)
    scratch["cells"].append(
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "print(softmax(dots))\n",
        }
    )

    def said(name, label):
        return f"'{name}' is defined only in the demonstration cell {label.removeprefix('the cell ')}, which is not run"

    rc, out = script(released, LESSON, lost)
    assert rc == 1 and said("x", demos["x"]) in out and "so softmax is not defined: the grader finds no answer" in out
    rc, out = script(released, LESSON, scratch)
    scratch_label = (
        f"the cell that begins 'print(softmax(dots))' (cell {len(scratch['cells'])}, counting markdown cells)"
    )
    assert rc == 0 and f"note    {scratch_label} raised NameError" in out, out
    assert said("dots", demos["dots"]) in out, out
    # a name only a test cell binds: this check's run defines it (it runs the test cells), the grader's does not
    tested = fill(
        notebook(released),
        LESSON,
        {
            "scaled_dot_product_attention": code["scaled_dot_product_attention"].replace(
                '"""\n', '"""\n    lower.shape\n', 1
            )
        },
    )
    [line] = problems(tested, notebook(released), tmp_path)
    assert (
        "uses 'lower', which only the test cell that begins" in line and "grader runs its own tests instead" in line
    ), line
    for student, nb in (("lost", lost), ("scratch", scratch), ("tested", tested)):
        nbk.write(nb, tmp_path / "subs" / student / LESSON / f"{LESSON}.ipynb")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(tmp_path / "subs"),
            "--out",
            str(tmp_path / "results"),
            "--quiet",
        ],
        check=True,
        timeout=600,
    )
    rows = {(r["student"], r["test"]): r for r in csv.DictReader(open(tmp_path / "results" / "grades.csv"))}
    assert (
        float(rows["lost", "test_softmax"]["points"]) == 0
        and said("x", demos["x"]) in rows["lost", "test_softmax"]["message"]
    )
    assert all(r["status"] == "passed" for (student, _), r in rows.items() if student == "scratch"), rows
    assert float(rows["tested", "test_scaled_dot_product_attention"]["points"]) == 0


def test_the_limits_are_stated_and_a_graded_case_is_timed_against_them(released, tmp_path):
    """check_submission.py states the limits a student can hit, and times one case at the graded size against the
    limit on a call (issue 33: a correct backward too slow for the graded sizes was told "an infinite loop?")."""
    lesson = "09_flash_backward"
    answered = fill(notebook(released, lesson), lesson)
    rc, out = script(released, lesson, answered)
    assert rc == 0 and f"limits  when graded, {grade.lesson_limits(lesson).statement()}" in out, out
    assert "flash_attention_backward at the size it is graded:" in out and "within the 30 s" in out, out
    folder = tmp_path / lesson  # the same check, with no CPU time to spare on a call
    folder.mkdir()
    text = (released / lesson / "check_submission.py").read_text()
    (folder / "check_submission.py").write_text(text.replace("'call_seconds': 30,", "'call_seconds': 0,", 1))
    nbk.write(answered, folder / "mine.ipynb")
    done = subprocess.run(
        [sys.executable, "check_submission.py", "mine.ipynb"], cwd=folder, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1 and "too slow for the graded sizes" in done.stdout, done.stdout


def test_every_lesson_states_the_limits_a_student_can_hit():
    bounded = {lesson for lesson, _ in MEMORY_BOUND}
    for lesson in LESSONS:
        intro = " ".join(nbk.source(nbk.read(nbk.lesson_path(lesson))["cells"][0]).split())
        assert grade.lesson_limits(lesson).statement() in intro, lesson
        assert (HEADROOM_STATEMENT in intro) == (lesson in bounded), lesson  # memory kept counts, up to HEADROOM_MB
