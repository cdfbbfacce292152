"""Keep the notebooks' code identical to solutions/, the one source of truth.

For every code cell of a lesson notebook, each top-level def or class whose name solutions/
defines (the lesson's own module first) is rewritten from solutions/. In answer cells the
bodies are wrapped in solution markers, after the docstring (and a leading
super().__init__()), so students see signatures and docstrings. A demo cell starts with
notebook.DEMO_HEADER, so students see that grading skips it. Hidden-test blocks are
rewritten to the canonical verify() call. A lesson whose notebook imports one of the course's own
modules (autograder/sandbox/tripwires.py, autograder/triton_fit.py) gets a copy of it beside it
(lessons/<lesson>/tripwires.py, so that the source notebook runs in place), byte for byte; git ignores
these copies.

    python -m autograder sync          # rewrite the notebooks
    python -m autograder sync --check  # fail if anything would change (CI)
"""

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

from autograder import notebook as nbk
from autograder.checking import LESSONS
from autograder.release import own_modules

ROOT = Path(__file__).resolve().parent.parent  # the course: what the messages name paths from


def solution_source(lesson, name):
    """Source of `name` in the lesson's solutions module, or in another one; None if none has it."""
    modules = [LESSONS[lesson]] + [m for m in LESSONS.values() if m != LESSONS[lesson]]
    for mod in modules:
        obj = _python_function(getattr(importlib.import_module(f"solutions.{mod}"), name, None))
        if (
            obj is not None
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == f"solutions.{mod}"
        ):
            return textwrap.dedent(inspect.getsource(obj)).rstrip("\n")
    return None


def _python_function(obj):
    """A Triton kernel (@triton.jit gives a JITFunction, or an InterpretedFunction under
    TRITON_INTERPRET=1) is synced as the Python function it wraps, its .fn; anything else as is."""
    fn = getattr(obj, "fn", None)
    if type(obj).__module__.split(".")[0] == "triton" and inspect.isfunction(fn):
        return fn
    return obj


def with_markers(src):
    """Wrap each function body (each method's, for a class) in solution markers."""
    tree = ast.parse(src)
    node = tree.body[0]
    functions = (
        [node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        else [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    )
    lines = src.splitlines()
    inserts = []  # (line index, marker, indent)
    for fn in functions:
        body = list(fn.body)
        keep = fn.body[0].lineno - 1  # students keep the lines before the first hidden one
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            keep = body.pop(0).end_lineno
        if body and _is_super_init(body[0]):
            keep = body.pop(0).end_lineno
        if not body:
            continue
        indent = " " * body[0].col_offset
        inserts += [(keep, nbk.BEGIN_SOLUTION, indent), (body[-1].end_lineno, nbk.END_SOLUTION, indent)]
    for index, marker, indent in sorted(inserts, reverse=True):
        lines.insert(index, indent + marker)
    return "\n".join(lines)


def _is_super_init(stmt):
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "__init__"
    )


def synced_cell_source(lesson, cell):
    """The cell's source as it should be."""
    text = nbk.source(cell)
    if nbk.is_demo(cell):
        text = nbk.with_demo_header(text)
    if nbk.is_test(cell):
        name = nbk.grade_id(cell).removeprefix("test_")
        return nbk.with_hidden_block(text, lesson, name)
    code = nbk.without_markers(text) if nbk.is_answer(cell) else text
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return text
    lines = code.splitlines()
    for node in reversed(tree.body):  # bottom-up, so earlier line numbers stay valid
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        src = solution_source(lesson, node.name)
        if src is None:
            continue
        if nbk.is_answer(cell):
            src = with_markers(src)
        start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        lines[start : node.end_lineno] = src.splitlines()
    return "\n".join(lines).rstrip("\n")


def sync(names=None, check=False, root=nbk.LESSONS_DIR):
    """Rewrite (or, with check, only list) the cells that differ from solutions/, and the copies of the
    course's own modules (release.OWN_MODULES) that differ from autograder's. Returns them."""
    changed = []
    for lesson in names or nbk.lesson_names(root):
        path = nbk.lesson_path(lesson, root)
        nb = nbk.read(path)
        dirty = False
        for cell in nbk.code_cells(nb):
            want = synced_cell_source(lesson, cell)
            if want != nbk.source(cell).rstrip("\n"):
                changed.append(f"{lesson}: cell {nbk.grade_id(cell) or cell.get('id', '?')}")
                nbk.set_source(cell, want)
                dirty = True
        if dirty and not check:
            nbk.write(nb, path)
        changed += copy_own_modules(lesson, nb, check, root)
    return changed


def copy_own_modules(lesson, nb, check=False, root=nbk.LESSONS_DIR):
    """Write (or, with check, only list) the lesson folder's copies of the course's own modules its notebook
    imports (release.OWN_MODULES), so the source notebook runs in place. The copies are not in git (one copy
    of each module is): `make setup`, `sync` and the test session write them."""
    changed = []
    for module in own_modules(nb):
        copy = nbk.lesson_path(lesson, root).parent / module.name
        if copy.is_symlink() or not copy.is_file() or copy.read_bytes() != module.read_bytes():
            changed.append(f"{lesson}: {copy.name} differs from {module.relative_to(ROOT)}")
            if not check:
                copy.unlink(missing_ok=True)  # a link, or a stale copy: written anew, never through a link
                copy.write_bytes(module.read_bytes())
    return changed
