"""Shared helpers for the lesson tests: the lessons present, their code cells, running notebooks."""

import functools
import gc
import linecache
import os
import re

from autograder import lessons
from autograder import notebook as nbk
from autograder.checking import checks_for, memory

LESSONS = lessons.names()  # every lesson with a manifest: one without its notebook fails here


def graded_names(lesson):
    return [gid.removeprefix("test_") for gid, _ in nbk.graded_tests(nbk.read(nbk.lesson_path(lesson)))]


@functools.lru_cache(maxsize=None)
def answers(lesson):
    """{grade_id: the solution's answer cell}, as a student who solved it has it."""
    nb = nbk.read(nbk.lesson_path(lesson))
    return {nbk.grade_id(c): nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(nb) if nbk.is_answer(c)}


@functools.lru_cache(maxsize=None)
def namespace_source(lesson):
    """The code the grader runs for a filled-in notebook: every code cell but tests and demos."""
    nb = nbk.read(nbk.lesson_path(lesson))
    cells = [
        nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(nb) if not nbk.is_test(c) and not nbk.is_demo(c)
    ]
    return [re.sub(r"^\s*[%!].*$", "", c, flags=re.M) for c in cells]  # no magics in-process


@functools.lru_cache(maxsize=None)
def _imported(lesson):
    """The lesson's code run once in this process, so that what its imports map is there before a baseline."""
    exec(compile("\n".join(namespace_source(lesson)), f"<{lesson}>", "exec"), {"__name__": "__lesson__"})
    # What lives from here on (torch, the reference, the lesson's imports) is never garbage: frozen, it leaves
    # the collections the memory bounds run (memory.in_use) about 0.001 s instead of 0.1 s over 230,000 objects.
    gc.collect()
    gc.freeze()


def fresh_namespace(lesson, replace=None):
    """A namespace with the lesson's code run in it; replace: {graded name: answer cell code}."""
    ns = {"__name__": "__lesson__", "__cell_sources__": []}  # what LocalSubject gives checks as s.sources
    _imported(lesson)
    before = memory.in_use()
    replace = replace or {}
    nb = nbk.read(nbk.lesson_path(lesson))
    cells = [c for c in nbk.code_cells(nb) if not nbk.is_test(c) and not nbk.is_demo(c)]
    for i, (cell, code) in enumerate(zip(cells, namespace_source(lesson))):
        source = replace.get(nbk.grade_id(cell), code)
        filename = f"<{lesson}:{i}:{nbk.grade_id(cell)}>"
        # Triton reads a kernel's source with inspect when it compiles; keep it findable, as IPython does.
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        ns["__cell_sources__"].append(source)
        exec(compile(source, filename, "exec"), ns)
    memory.record_cells(ns, before)  # what the cells keep counts against the checks' memory bounds, as in the grader
    return ns


def checks(lesson):
    return checks_for(lesson)


def execute(path, allow_errors=False, timeout=300, kernel_args=()):
    """Run a notebook top to bottom in a fresh kernel (cwd: its folder, kernel_args on its command line); returns
    the executed notebook (an nbformat node)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    # The kernel gets the environment a student's has: not conftest's TRITON_INTERPRET, which each notebook
    # must set itself, before anything imports Triton (lesson 09's FLOP counter does).
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=allow_errors,
            extra_arguments=list(kernel_args),
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    return nb


def errors(nb):
    """[(cell index, exception name)] of the cells that raised."""
    return [
        (i, o.get("ename"))
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


def fill(release_nb, lesson, replace=None):
    """A submission: the release copy (a dict) with every answer cell filled from the source notebook's
    solution, or from replace[grade_id]."""
    from autograder.audit import fill

    return fill(release_nb, nbk.read(nbk.lesson_path(lesson)), replace)
