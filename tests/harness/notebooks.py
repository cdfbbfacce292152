"""Each lesson's notebook: in sync with solutions/, complete, runnable as source and as release
(tests/lessons/test_<module>.py imports these; tests/grader/test_lessons.py tests the machinery)."""

import ast
import importlib
import inspect
import json
import re
import time

import nbformat
import pytest

from autograder import lessons
from autograder import notebook as nbk
from autograder.checking import LESSONS as ALL_LESSONS
from autograder.release import release
from tests.harness import book_build, each, one_lesson
from tests.harness.lessons import errors, execute, graded_names

__all__ = [
    "test_notebook_structure",
    "test_notebook_imports_what_its_solutions_module_imports",
    "test_source_notebook_passes_all_its_tests",
    "released",
    "test_release_copy_has_no_solution_code_and_no_hidden_tests",
    "test_release_copy_runs_and_fails_only_at_the_exercises",
    "test_the_python_3_10_reader_reads_every_manifest_as_tomllib_does",
]


@each("lesson", one_lesson)
def test_notebook_structure(lesson):
    nb = nbk.read(nbk.lesson_path(lesson))
    cells = nbk.code_cells(nb)
    for c in cells:
        assert not c.get("outputs") and c.get("execution_count") is None, "commit notebooks without outputs"
    ids = [nbk.grade_id(c) for c in nb["cells"] if nbk.grade_id(c)]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"
    tests = dict(nbk.graded_tests(nb))
    for name in graded_names(lesson):
        assert tests[f"test_{name}"] > 0
        assert name in ids, f"test_{name} has no answer cell {name}"
    for c in cells:
        if nbk.is_test(c):
            visible = nbk.strip_hidden_tests(nbk.source(c))
            assert re.search(r"^\s*assert ", visible, re.M), f"{nbk.grade_id(c)} has no visible test"
            assert not re.search(r"\b(solutions|autograder)\b", visible), "visible tests must not import the grader"


@each("lesson", one_lesson)
def test_notebook_imports_what_its_solutions_module_imports(lesson):
    """An answer cell is solutions/ code; the names it relies on must be imported by the notebook."""
    module = importlib.import_module(f"solutions.{ALL_LESSONS[lesson]}")
    text = "\n".join(nbk.source(c) for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson))))
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "solutions" not in ast.unparse(node):
            if not (isinstance(node, ast.ImportFrom) and node.module == "triton"):
                assert ast.unparse(node) in text or ast.get_source_segment(inspect.getsource(module), node) in text, (
                    f"the notebook should `{ast.unparse(node)}` like solutions/{ALL_LESSONS[lesson]}.py"
                )


@pytest.mark.slow
@each("lesson", one_lesson)
def test_source_notebook_passes_all_its_tests(lesson):
    """Run as the book runs it (book/build.py's KERNEL_ARGS), so that the book's test takes this run from the book's
    cache (build.keep_run) instead of running the notebook again."""
    book = book_build()
    key = book.lesson_hash(lesson)
    start = time.perf_counter()
    nb = execute(nbk.lesson_path(lesson), kernel_args=book.KERNEL_ARGS)
    assert errors(nb) == []
    # The budget is 30 s on 2 cores; allow headroom for a loaded CI machine.
    assert time.perf_counter() - start < 90, "the notebook is too slow to run top to bottom"
    book.keep_run(lesson, key, json.loads(nbformat.writes(nb)))


@pytest.fixture(scope="module")
def released(tmp_path_factory, request):
    """The release of the importing file's lesson."""
    out = tmp_path_factory.mktemp("release")
    release(out, [request.module.LESSON])
    return out


@each("lesson", one_lesson)
def test_release_copy_has_no_solution_code_and_no_hidden_tests(released, lesson):
    path = released / lesson / f"{lesson}.ipynb"
    text = path.read_text()
    for marker in ("BEGIN SOLUTION", "HIDDEN TESTS", "verify(", "import solutions", "autograder"):
        assert marker not in text
    # Each answer cell is compared with its own released copy: a line the lesson also gives in another cell
    # (lesson 09's given Triton forward validates its inputs as the answers do) is not a leak.
    released_cells = {nbk.grade_id(c): c for c in nbk.code_cells(nbk.read(path)) if nbk.is_answer(c)}
    for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson))):
        if nbk.is_answer(c):
            released_lines = {line.strip() for line in nbk.source(released_cells[nbk.grade_id(c)]).splitlines()}
            region = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", nbk.source(c), re.S)
            for line in "".join(region).splitlines():
                line = line.strip()
                if len(line) > 12 and not line.startswith(("#", "return", "raise", '"""')):
                    assert line not in released_lines, f"solution line leaked into the release: {line}"


@pytest.mark.slow
@each("lesson", one_lesson)
def test_release_copy_runs_and_fails_only_at_the_exercises(released, lesson):
    nb = execute(released / lesson / f"{lesson}.ipynb", allow_errors=True)
    failed = errors(nb)
    assert failed, "a blank release copy should fail its tests"
    assert {name for _, name in failed} == {"NotImplementedError"}, f"unexpected errors: {failed}"
    tests_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and nbk.is_test(c)]
    assert set(tests_cells) <= {i for i, _ in failed}, "every test cell should fail on a blank copy"
    # A demonstration that runs a stub says which one (answered(...), or lesson 08's pasted(...)), never a bare error.
    bare = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and nbk.is_demo(c)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error" and "is still the stub" not in o["evalue"]
    ]
    assert not bare, f"demonstrations {bare} stop with a bare error on a blank copy: call answered(...) first"


@each("lesson", one_lesson)
def test_the_python_3_10_reader_reads_every_manifest_as_tomllib_does(lesson):
    import tomllib

    text = (nbk.LESSONS_DIR / lesson / lessons.MANIFEST).read_text(encoding="utf-8")
    assert lessons._toml_subset(text) == tomllib.loads(text)
