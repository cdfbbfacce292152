"""The lesson notebooks: in sync with solutions/, complete, and runnable as source and as release."""
import ast
import inspect
import importlib
import re
import time

import pytest

from autograder import notebook as nbk
from autograder.checks import LESSONS as ALL_LESSONS
from autograder.release import release
from autograder.sync import sync
from tests.lessons import LESSONS, errors, execute, graded_names


def test_notebooks_are_in_sync_with_solutions():
    assert sync(check=True) == [], "run `python -m autograder sync` and commit"


@pytest.mark.parametrize("lesson", LESSONS)
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


@pytest.mark.parametrize("lesson", LESSONS)
def test_notebook_imports_what_its_solutions_module_imports(lesson):
    """An answer cell is solutions/ code; the names it relies on must be imported by the notebook."""
    module = importlib.import_module(f"solutions.{ALL_LESSONS[lesson]}")
    text = "\n".join(nbk.source(c) for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson))))
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "solutions" not in ast.unparse(node):
            if not (isinstance(node, ast.ImportFrom) and node.module == "triton"):
                assert ast.unparse(node) in text or ast.get_source_segment(inspect.getsource(module), node) in text, \
                    f"the notebook should `{ast.unparse(node)}` like solutions/{ALL_LESSONS[lesson]}.py"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_source_notebook_passes_all_its_tests(lesson):
    start = time.perf_counter()
    nb = execute(nbk.lesson_path(lesson))
    assert errors(nb) == []
    # The budget is 30 s on 2 cores; allow headroom for a loaded CI machine.
    assert time.perf_counter() - start < 90, "the notebook is too slow to run top to bottom"


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    release(out, LESSONS)
    return out


@pytest.mark.parametrize("lesson", LESSONS)
def test_release_copy_has_no_solution_code_and_no_hidden_tests(released, lesson):
    path = released / lesson / f"{lesson}.ipynb"
    text = path.read_text()
    for marker in ("BEGIN SOLUTION", "HIDDEN TESTS", "verify(", "import solutions", "autograder"):
        assert marker not in text
    released_lines = {line.strip() for c in nbk.read(path)["cells"] for line in nbk.source(c).splitlines()}
    source = nbk.read(nbk.lesson_path(lesson))
    for c in nbk.code_cells(source):
        if nbk.is_answer(c):
            region = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", nbk.source(c), re.S)
            for line in "".join(region).splitlines():
                line = line.strip()
                if len(line) > 12 and not line.startswith(("#", "return", "raise", "\"\"\"")):
                    assert line not in released_lines, f"solution line leaked into the release: {line}"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_release_copy_runs_and_fails_only_at_the_exercises(released, lesson):
    nb = execute(released / lesson / f"{lesson}.ipynb", allow_errors=True)
    failed = errors(nb)
    assert failed, "a blank release copy should fail its tests"
    assert {name for _, name in failed} == {"NotImplementedError"}, f"unexpected errors: {failed}"
    tests_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and nbk.is_test(c)]
    assert set(tests_cells) <= {i for i, _ in failed}, "every test cell should fail on a blank copy"
