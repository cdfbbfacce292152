"""Student copies of the lessons: `python -m autograder release OUT [--lesson L ...]`.

Each answer region becomes a stub that raises NotImplementedError, hidden tests disappear,
outputs are cleared, and the files the manifest declares come along (lesson_files: nothing else of
the lesson's folder, not its lesson.toml). The result is checked: no solution marker, hidden test,
or import of solutions/autograder may remain.
"""

import importlib
import importlib.util
import re
import shutil
from pathlib import Path

from autograder import check_submission, lessons
from autograder import notebook as nbk

# The course's own modules that a notebook imports from its folder: the grader's switch for forbidden paths
# (sandbox/tripwires.py: lesson 06's visible tests) and triton_fit (lessons 06 and 09 compile their kernels for real
# GPUs with it). A lesson whose cells import one gets the module itself beside its notebook. In the course, `sync`
# keeps a copy in lessons/<lesson>/ (for the source notebook's runs and the book), and `sync --check` fails when it
# differs.
TRIPWIRES = Path(__file__).resolve().parent / "sandbox" / "tripwires.py"
TRITON_FIT = Path(__file__).resolve().parent / "triton_fit.py"
OWN_MODULES = (TRIPWIRES, TRITON_FIT)
CHECK_SCRIPT = Path(check_submission.__file__)
LEAK = re.compile(r"BEGIN SOLUTION|END SOLUTION|HIDDEN TESTS|^\s*(from|import)\s+(solutions|autograder)\b", re.M)


def own_modules(nb):
    """[path] of the course's own modules (OWN_MODULES) that a code cell of the notebook dict imports."""
    code = "\n".join(nbk.source(c) for c in nbk.code_cells(nb))
    return [m for m in OWN_MODULES if re.search(rf"^\s*(import|from)\s+{m.stem}\b", code, re.M)]


def lesson_files(lesson, root=nbk.LESSONS_DIR):
    """{name: file} of what a lesson's notebook has beside it, for students (release) and for its code when
    it is graded (grade.stage_data): the manifest's data files, and the course's own modules its cells import."""
    folder = nbk.lesson_path(lesson, root).parent
    files = {name: folder / name for name in lessons.read(lesson, root)["data"]}
    files.update((m.name, m) for m in own_modules(nbk.read(nbk.lesson_path(lesson, root))))
    return files


def student_copy(nb, keep_outputs=False):
    """The notebook dict as students get it (a new dict; nb is untouched). keep_outputs keeps
    the outputs of cells other than answers and tests (the book shows the reference's figures)."""
    out = dict(nb, cells=[])
    for cell in nb["cells"]:
        cell = dict(cell, metadata=dict(cell.get("metadata", {})))
        text = nbk.source(cell)
        if cell.get("cell_type") == "code":
            if not keep_outputs or nbk.is_answer(cell) or nbk.is_test(cell):
                cell["outputs"], cell["execution_count"] = [], None
            if nbk.is_answer(cell):
                text = nbk.strip_solutions(text)
            if nbk.is_test(cell):
                text = nbk.strip_hidden_tests(text)
        elif nbk.is_answer(cell) and nbk.BEGIN_SOLUTION in text:
            text = nbk.replace_regions(text, nbk.BEGIN_SOLUTION, nbk.END_SOLUTION, nbk.TEXT_STUB)
        nbk.set_source(cell, text)
        out["cells"].append(cell)
    leaks = [m.group(0) for c in out["cells"] for m in [LEAK.search(nbk.source(c))] if m]
    if leaks:
        raise nbk.NotebookError(f"the student copy would still contain {leaks[0]!r}")
    return out


def check_script(nb, lesson):
    """The text of check_submission.py for a released notebook dict: the template with its LESSON filled in."""
    text = CHECK_SCRIPT.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("LESSON = None"))
    return text.replace(line, f"LESSON = {script_facts(nb, lesson)!r}", 1)


def script_facts(nb, lesson):
    """The LESSON of check_submission.py for a released notebook dict: its cells' facts (lesson_facts), the limits
    a student can hit, and a case at the graded size of each name whose time it shows."""
    limits = lessons.limits(lesson)
    return {
        **check_submission.lesson_facts(nb, lesson),
        "limits": limits.statement(),
        "call_seconds": limits.call_seconds,
        "timed": timed_cases(lesson),
    }


def timed_cases(lesson):
    """{graded name: one case at the size its hidden checks grade it} of the lesson (its checks module's TIMED), for
    check_submission.py to time against the limit on a call."""
    from autograder.checking import LESSONS  # the checks import torch: only when a script is written

    module = f"autograder.lessons.{LESSONS[lesson]}.checks"
    if importlib.util.find_spec(f"autograder.lessons.{LESSONS[lesson]}") is None:
        return {}  # a lesson whose grader package is still to be written: nothing to time yet
    return dict(getattr(importlib.import_module(module), "TIMED", {}))


def release(out_dir, names=None, root=nbk.LESSONS_DIR):
    """Write OUT/<lesson>/<lesson>.ipynb, the lesson's files (lesson_files) and check_submission.py (the
    students' check before submitting, check_script); returns the notebook paths."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} exists and is not a folder")
    written = []
    for lesson in names or nbk.lesson_names(root):
        src = nbk.lesson_path(lesson, root)
        dest = out_dir / lesson
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for name, f in lesson_files(lesson, root).items():
            shutil.copy2(f, dest / name)
        copy = student_copy(nbk.read(src))
        nbk.write(copy, dest / src.name)
        (dest / CHECK_SCRIPT.name).write_text(check_script(copy, lesson), encoding="utf-8")
        written.append(dest / src.name)
    return written
