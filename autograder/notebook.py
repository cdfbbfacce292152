"""Reading lesson notebooks: cells, nbgrader metadata, solution regions and hidden tests.

Plain JSON, no nbformat: submissions may be damaged, and this must fail with a clear
NotebookError rather than a traceback.
"""
import json
import re
from pathlib import Path

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
DEMO_TAG = "demo"  # code cells that only demonstrate (plots, timings, training): grading skips them
LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"


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
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a notebook: it has no list of cells")
    if nb.get("nbformat") != 4:
        raise NotebookError(f"unsupported notebook format {nb.get('nbformat')!r} (expected 4)")
    return nb


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


def is_demo(cell):
    tags = cell.get("metadata", {}).get("tags", [])
    return isinstance(tags, list) and DEMO_TAG in tags


def code_cells(nb):
    return [c for c in nb["cells"] if isinstance(c, dict) and c.get("cell_type") == "code"]


def graded_tests(nb):
    """[(grade_id, points)] of the test cells, in notebook order."""
    return [(grade_id(c), float(meta(c).get("points", 0))) for c in code_cells(nb) if is_test(c)]


def replace_regions(text, begin, end, stub):
    """Replace each begin..end region (marker lines included) by stub, indented like begin."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == begin:
            inside = True
            if stub is not None:
                indent = line[:len(line) - len(line.lstrip())]
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
    return "".join(line for line in text.splitlines(keepends=True)
                   if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION))


def hidden_block(lesson, name):
    """The one form a hidden test takes: a call of the lesson's check."""
    return (f"{BEGIN_HIDDEN}\nfrom autograder.checks import verify\n"
            f"verify({lesson!r}, {name!r}, globals())\n{END_HIDDEN}")


def with_hidden_block(text, lesson, name):
    """text (a test cell) with its hidden block replaced by (or ended with) the canonical one."""
    visible = strip_hidden_tests(text) if BEGIN_HIDDEN in text else text
    return visible.rstrip() + "\n\n" + hidden_block(lesson, name)


def lesson_names(root=LESSONS_DIR):
    return sorted(p.name for p in Path(root).iterdir() if re.fullmatch(r"\d\d_\w+", p.name) and lesson_path(p.name, root).exists())
