"""nbgrader's autograded notebooks, written from trusted results, so that formgrader opens every
submission: COURSE_ROOT/autograded/<student>/<lesson>/<lesson>.ipynb (nbgrader's own layout).

The notebook is the lesson's student copy (the course's own markdown and provided code) with
- each answer cell's code taken from the submission: its text only, never its outputs or metadata;
- each written question's answer (a markdown cell a person grades, in formgrader) taken from the submission,
  shown as a code block like any markdown a student wrote (never its rubric: only the source notebook has it);
- each test cell's verdict and message as its output, in the form nbgrader reads
  (nbgrader.utils.determine_grade gives the same points): a line for a pass, the message and an
  execute_result holding the points for partial credit, an error for no credit;
- the cells the student added or changed at the end, as code without outputs (markdown shown as a
  code block), so nothing a student wrote is rendered as HTML in the instructor's browser.
The points also go to each test cell's metadata, under "autograder" (nbgrader's own dict admits
no extra key). Scores, comments and overrides live in the gradebook (gradebook.py), not here.

COURSE_ROOT/nbgrader_config.py (write_config, when there is none): formgrader's course, its gradebook, and the
course's lessons/ as nbgrader's source directory, so that formgrader lists every lesson as an assignment.
"""

import hashlib
import json
import re
import uuid
from pathlib import Path

from autograder import notebook as nbk
from autograder.release import student_copy
from autograder.report import feedback_text
from autograder.results import write_atomic


def autograded_path(course_root, student, lesson):
    return Path(course_root) / "autograded" / student / lesson / f"{lesson}.ipynb"


def verdict_outputs(t):
    """A test cell's outputs for one TestRow (see the module docstring)."""
    got = f"{t.points:g}/{t.max_points:g} points"
    lines = feedback_text(t).splitlines()
    if t.status == "passed":
        return [_stream(f"passed: {got}\n")]
    if t.points > 0:
        return [
            _stream("\n".join([f"partial credit: {got}"] + lines) + "\n"),
            {
                "output_type": "execute_result",
                "execution_count": None,
                "metadata": {},
                "data": {"text/plain": f"{t.points:g}"},
            },
        ]
    return [
        {
            "output_type": "error",
            "ename": t.status,
            "evalue": "\n".join(lines),
            "traceback": [f"{t.status}: {got}"] + lines,
        }
    ]


def _stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def _fenced(text):
    """Markdown that shows text as it is: a code fence longer than any run of backticks in it."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}"


def _new_cell(cell_type, text):
    cell = {"cell_type": cell_type, "id": uuid.uuid4().hex[:8], "metadata": {}, "source": text}
    if cell_type == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def submitted_cells(result):
    """(the submission's cells, a note or None): [] with a note when it cannot be read, or is no
    longer the notebook that was graded."""
    path = result.notebook
    if not path:
        return [], "the grader kept no submitted notebook for this result (see the test messages)"
    try:  # read as the grader reads submissions: no links, a plausible size, cells of the right types
        data = nbk.read_submitted_bytes(path)
        if result.sha256 and hashlib.sha256(data).hexdigest() != result.sha256:
            return [], f"the submitted notebook at {path} changed after it was graded: grade it again"
        return nbk.parse_submission(data)["cells"], None
    except nbk.NotebookError as e:
        return [], f"the submitted notebook could not be read: {e}"


def autograded_notebook(result, source):
    """The autograded notebook (a dict) of one result, from the lesson's source notebook."""
    nb = student_copy(source)
    cells, note = submitted_cells(result)
    cells = [c for c in cells if c["cell_type"] in ("code", "markdown")]
    answers = {}
    for c in cells:
        if (c["cell_type"] == "code" or nbk.is_written(c)) and isinstance(nbk.grade_id(c), str):
            answers.setdefault(nbk.grade_id(c), c)
    rows = {t.test: t for t in result.tests}
    used, known = set(), {nbk.source(c) for c in nb["cells"]}
    for cell in nb["cells"]:
        gid = nbk.grade_id(cell)
        if cell["cell_type"] == "code" and nbk.is_answer(cell) and gid in answers:
            nbk.set_source(cell, nbk.source(answers[gid]))
            used.add(id(answers[gid]))
        if nbk.is_written(cell) and gid in answers and nbk.is_written(answers[gid]):
            nbk.set_source(cell, _fenced(nbk.source(answers[gid])))
            used.add(id(answers[gid]))
        if cell["cell_type"] == "code" and gid in rows:
            cell["outputs"] = verdict_outputs(rows[gid])
            cell["metadata"]["autograder"] = {k: getattr(rows[gid], k) for k in ("status", "points", "max_points")}
    extra = [c for c in cells if id(c) not in used and nbk.source(c).strip() and nbk.source(c) not in known]
    if note:
        nb["cells"].insert(0, _new_cell("markdown", "**Autograder:**\n\n" + _fenced(note)))
    if extra:
        nb["cells"].append(_new_cell("markdown", "**Cells the student added or changed** (not graded, shown as text):"))
        nb["cells"] += [
            _new_cell("code", nbk.source(c))
            if c["cell_type"] == "code"
            else _new_cell("markdown", _fenced(nbk.source(c)))
            for c in extra
        ]
    return nb


def written_answers(nb):
    """{question: the answer an autograded notebook (a dict) shows} of its written questions."""
    return {nbk.grade_id(c): nbk.source(c) for c in nb["cells"] if nbk.is_written(c)}


def changed_answers(course_root, result, source):
    """The written questions of a Result whose answer is not the one its autograded notebook under course_root
    shows now, which is what a TA graded in formgrader: none when there is no such notebook yet (or it cannot be
    read), or when the submission cannot be read (nothing to compare, so a TA's score is never doubted for it)."""
    path = autograded_path(course_root, result.student, result.lesson)
    if not result.written or not path.is_file() or submitted_cells(result)[1]:
        return set()
    try:
        before = written_answers(nbk.read(path))
    except nbk.NotebookError:
        return set()
    after = written_answers(autograded_notebook(result, source))
    return {q for q, answer in after.items() if q in before and before[q] != answer}


def write_autograded(course_root, results):
    """Write every Result's autograded notebook; returns their paths."""
    sources, written = {}, []
    for r in results:
        if not r.submitted:
            continue  # nothing submitted: nbgrader has no submission to show either
        lesson = r.lesson
        if lesson not in sources:
            sources[lesson] = nbk.read(nbk.lesson_path(lesson))
        path = autograded_path(course_root, r.student, lesson)
        write_atomic(path, json.dumps(autograded_notebook(r, sources[lesson]), indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


CONFIG = "nbgrader_config.py"


def write_config(course_root, gradebook) -> Path | None:
    """COURSE_ROOT/nbgrader_config.py for formgrader, unless one is there (the instructor's stays as it is): the
    course root, the gradebook, and this course's lessons/ as the source directory (where formgrader finds the
    assignments it lists). Returns its path when written."""
    path = Path(course_root) / CONFIG
    if path.exists():
        return None
    write_atomic(
        path,
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(Path(course_root).resolve())!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(Path(gradebook).resolve())!r}\n"
        f"c.CourseDirectory.source_directory = {str(nbk.LESSONS_DIR.resolve())!r}\n",
    )
    return path
