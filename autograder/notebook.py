"""Reading lesson notebooks: cells, nbgrader metadata, solution regions and hidden tests.

Plain JSON, no nbformat: submissions may be damaged, and this must fail with a clear
NotebookError rather than a traceback.
"""

import json
import os
import re
import stat
from collections import Counter
from functools import lru_cache
from pathlib import Path

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
DEMO_TAG = "demo"  # code cells that only demonstrate (plots, timings, training): grading skips them
# The first line of every demo cell (sync writes it from the tag), so that students see which cells grading skips.
DEMO_HEADER = "# Demonstration (not run when grading): no answer may use a name defined here"
LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
# A submitted notebook is read only up to these sizes, before JSON parsing: an honest notebook that
# keeps its figures and outputs is a few MB; 20 MB of empty lists would cost the grader about 1 GiB.
MAX_NOTEBOOK_BYTES = 20 << 20
MAX_VALUES = 2_000_000  # JSON values, estimated from commas and brackets (those in strings too)
TOO_BIG = f"is larger than {MAX_NOTEBOOK_BYTES >> 20} MB; clear large outputs and submit it again"


class NotebookError(ValueError):
    pass


def lesson_path(lesson, root=LESSONS_DIR):
    return Path(root) / lesson / f"{lesson}.ipynb"


def read(path):
    """A notebook as a dict, or NotebookError naming what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotebookError(f"no notebook at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise NotebookError(f"not a readable notebook (corrupt JSON?): {type(e).__name__}: {str(e)[:200]}") from None
    return parse(text)


def parse(text):
    """A notebook's text as a dict, or NotebookError naming what is wrong."""
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise NotebookError(f"not a readable notebook (corrupt JSON?): {type(e).__name__}: {str(e)[:200]}") from None
    check_notebook(nb)
    return nb


def refusal(st, what="the notebook"):
    """Why a file (an os.lstat result) is not read as a submission, or None: only a regular file
    with one name and a sane size is. A symlink or a hard link could point at another student's
    work or the instructor's solutions; a FIFO or a device would hang or flood the grader."""
    if stat.S_ISLNK(st.st_mode):
        return f"{what} is a symbolic link; submit the file itself"
    if stat.S_ISDIR(st.st_mode):
        return f"{what} is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        return f"{what} is not a regular file (a FIFO, socket or device)"
    if st.st_nlink > 1:
        return f"{what} is a hard link ({st.st_nlink} names for one file); submit a plain copy"
    if st.st_size > MAX_NOTEBOOK_BYTES:
        return f"{what} {TOO_BIG}"
    return None


def read_submitted_bytes(path):
    """The bytes of a submitted notebook; NotebookError("refused: ...") unless it is a regular file
    (checked with lstat, opened with O_NOFOLLOW, checked again on the open file)."""
    try:
        why = refusal(os.lstat(path))
        if why:
            raise NotebookError(f"refused: {why}")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise NotebookError(f"no notebook at {Path(path).name}") from None
    except OSError as e:  # ELOOP: it became a symlink between lstat and open
        raise NotebookError(f"refused: the notebook could not be opened safely ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        why = refusal(os.fstat(f.fileno()))
        if why:
            raise NotebookError(f"refused: {why}")
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"refused: the notebook {TOO_BIG}")
    return data


def parse_submission(data):
    """A submitted notebook's bytes as a validated notebook dict; NotebookError naming the first
    field that is not what Jupyter writes (so nothing later trips over a wrong type)."""
    if data.count(b",") + data.count(b"[") + data.count(b"{") > MAX_VALUES:  # parsed, each costs ~60-100 bytes
        raise NotebookError(f"not a plausible notebook: more than {MAX_VALUES:,} JSON values")
    try:
        nb = parse(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise NotebookError(f"not a readable notebook (not UTF-8 text): {str(e)[:200]}") from None
    if not isinstance(nb.get("metadata", {}), dict):
        raise NotebookError("the notebook's metadata is not a JSON object")
    kernelspec = nb.get("metadata", {}).get("kernelspec", {})
    if not isinstance(kernelspec, (dict, type(None))):
        raise NotebookError("the notebook's kernelspec is not a JSON object")
    for number, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise NotebookError(f"cell {number} is not a notebook cell (no cell_type)")
        src = cell.get("source", "")
        if not (isinstance(src, str) or isinstance(src, list) and all(isinstance(x, str) for x in src)):
            raise NotebookError(f"cell {number}'s source is neither text nor a list of lines")
        m = cell.get("metadata", {})
        if not (
            isinstance(m, dict) and isinstance(m.get("nbgrader", {}), dict) and isinstance(m.get("tags", []), list)
        ):
            raise NotebookError(f"cell {number}'s metadata is malformed")
    return nb


def check_notebook(nb):
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a notebook: it has no list of cells")
    if nb.get("nbformat") != 4:
        raise NotebookError(f"unsupported notebook format {str(nb.get('nbformat'))[:20]!r} (expected 4)")


def write(nb, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def source(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def set_source(cell, text):
    cell["source"] = text.splitlines(keepends=True)


def meta(cell):
    """The cell's nbgrader metadata ({} when it has none)."""
    m = cell.get("metadata", {})
    m = m.get("nbgrader", {}) if isinstance(m, dict) else {}
    return m if isinstance(m, dict) else {}


def grade_id(cell):
    return meta(cell).get("grade_id")


def is_answer(cell):
    return bool(meta(cell).get("solution"))


def is_test(cell):
    m = meta(cell)
    return bool(m.get("grade")) and not m.get("solution")


def is_written(cell):
    """Whether a cell is a written question's answer: a markdown cell a person grades (nbgrader's manually
    graded answer: solution and grade, with its points; its solution region holds the model answer and rubric)."""
    return cell.get("cell_type") == "markdown" and bool(meta(cell).get("solution")) and bool(meta(cell).get("grade"))


def is_demo(cell):
    m = cell.get("metadata", {})
    tags = m.get("tags", []) if isinstance(m, dict) else []
    return isinstance(tags, list) and DEMO_TAG in tags


def with_demo_header(text):
    """A demo cell's source with DEMO_HEADER as its first line (once: an older header line is replaced)."""
    lines = text.splitlines()
    if lines and lines[0].startswith(DEMO_HEADER.split(":")[0]):
        lines = lines[1:]
    return "\n".join([DEMO_HEADER, *lines])


def code_cells(nb):
    return [c for c in nb["cells"] if isinstance(c, dict) and c.get("cell_type") == "code"]


def graded_tests(nb):
    """[(grade_id, points)] of the test cells, in notebook order."""
    return [(grade_id(c), float(meta(c).get("points", 0))) for c in code_cells(nb) if is_test(c)]


def written_questions(nb):
    """[(grade_id, points)] of the written questions (is_written), in notebook order."""
    return [
        (grade_id(c), float(meta(c).get("points", 0))) for c in nb["cells"] if isinstance(c, dict) and is_written(c)
    ]


def replace_regions(text, begin, end, stub):
    """Replace each begin..end region (marker lines included) by stub, indented like begin."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == begin:
            inside = True
            if stub is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out += [indent + s + "\n" for s in stub.splitlines()]
        elif line.strip() == end and inside:
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise NotebookError(f"'{begin}' without '{end}'")
    return "".join(out)


def strip_solutions(text):
    return replace_regions(text, BEGIN_SOLUTION, END_SOLUTION, CODE_STUB)


def strip_hidden_tests(text):
    return replace_regions(text, BEGIN_HIDDEN, END_HIDDEN, None).rstrip() + "\n"


def without_markers(text):
    """The code with its solution markers removed (what solutions/ holds)."""
    return "".join(
        line for line in text.splitlines(keepends=True) if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION)
    )


def hidden_block(lesson, name):
    """The one form a hidden test takes: a call of the lesson's check."""
    return (
        f"{BEGIN_HIDDEN}\nfrom autograder.checking import verify\nverify({lesson!r}, {name!r}, globals())\n{END_HIDDEN}"
    )


def with_hidden_block(text, lesson, name):
    """text (a test cell) with its hidden block replaced by (or ended with) the canonical one."""
    visible = strip_hidden_tests(text) if BEGIN_HIDDEN in text else text
    return visible.rstrip() + "\n\n" + hidden_block(lesson, name)


def lesson_tests(lesson, root=LESSONS_DIR):
    """[(test grade_id, max points)] of a lesson, from its source notebook (never a submission)."""
    return graded_tests(read(lesson_path(lesson, root)))


def lesson_written(lesson, root=LESSONS_DIR):
    """[(written question grade_id, max points)] of a lesson, from its source notebook: graded by hand, never
    part of lesson_tests (a lesson's autograded points)."""
    return written_questions(read(lesson_path(lesson, root)))


def lesson_names(root=LESSONS_DIR):
    return sorted(
        p.name for p in Path(root).iterdir() if re.fullmatch(r"\d\d_\w+", p.name) and lesson_path(p.name, root).exists()
    )


@lru_cache(maxsize=4)
def lesson_answers(lessons: tuple) -> dict:
    """{lesson: frozenset of its answer cells' grade_ids}, from the source notebooks (read once per process)."""
    return {
        lesson: frozenset(grade_id(c) for c in code_cells(read(lesson_path(lesson))) if is_answer(c))
        for lesson in lessons
    }


def content_lesson(nb, answers: dict):
    """The lesson whose answer cells the notebook holds (most of them; answers: lesson_answers), or None."""
    ids = {grade_id(c) for c in code_cells(nb) if is_answer(c)}
    scores = Counter({lesson: len(ids & mine) for lesson, mine in answers.items()})
    ranked = scores.most_common(2)
    if not ranked or ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]
