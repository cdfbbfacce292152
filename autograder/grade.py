"""python -m autograder grade SUBMISSIONS --out RESULTS: grade every SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb.

Tests come from the source notebooks, never from submissions. A submission's code runs in a
sandboxed child (worker.py); the checks run here and decide every verdict from plain data.
Each (student, lesson) result is written atomically as soon as it is done, so a crash or kill
loses nothing finished and --resume skips it; grades.csv, feedback and the gradebook are
(re)written from those results at the end, and by `merge`.
"""
import hashlib
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

from autograder import notebook as nbk
from autograder.checks import LESSONS, Subject, Unchecked, checks_for
from autograder.sandbox.wire import WireError
from autograder.worker import Sandbox, SandboxError, Session

RESULTS_SUBDIR = ".results"


class GradeError(ValueError):
    """Bad input to the grader itself: reported before any work starts."""


def lesson_tests(lesson, root=nbk.LESSONS_DIR):
    """[(test grade_id, max points)] from the source notebook."""
    return nbk.graded_tests(nbk.read(nbk.lesson_path(lesson, root)))


def find_students(submissions):
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise GradeError(f"submissions folder {submissions} does not exist or is not a folder")
    try:
        students = sorted(p.name for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as e:
        raise GradeError(f"cannot read the submissions folder {submissions}: {e}") from None
    if not students:
        raise GradeError(f"no student folders in {submissions} (expected {submissions}/<student>/<lesson>/<lesson>.ipynb)")
    return students


def check_out_dir(out):
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GradeError(f"the output folder {out} exists and is not a folder")
    try:
        (out / RESULTS_SUBDIR).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GradeError(f"cannot write to the output folder {out}: {e}") from None
    return out


def parse_shard(text):
    try:
        i, n = (int(x) for x in text.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise GradeError(f"--shard takes i/N with 0 <= i < N, got {text!r}") from None
    return i, n


def locate(submissions, student, lesson):
    """(path, note): the notebook, a lone renamed one (with a note), or (None, why)."""
    folder = Path(submissions) / student / lesson
    path = folder / f"{lesson}.ipynb"
    if path.is_file():
        return path, None
    others = sorted(p for p in folder.glob("*.ipynb") if p.is_file()) if folder.is_dir() else []
    if len(others) == 1:
        return others[0], f"graded {others[0].name}: the notebook should be named {lesson}.ipynb"
    if len(others) > 1:
        return None, f"{len(others)} notebooks in {lesson}/ and none named {lesson}.ipynb: which one to grade?"
    return None, f"no {lesson}.ipynb submitted"


def submission_cells(nb):
    """The code the grader runs, every code cell but tests and demos, in order: (sources, labels,
    notes). A label names a cell for feedback: its number in the notebook and its first line."""
    cells, labels, notes = [], [], []
    language = (nb.get("metadata", {}).get("kernelspec") or {}).get("language", "python")
    if str(language).lower() != "python":
        notes.append(f"the notebook's kernel is for {language!r}, not Python; it was run as Python")
    if not any(nbk.meta(c) for c in nb["cells"] if isinstance(c, dict)):
        notes.append("the notebook has lost its nbgrader metadata; every code cell was run")
    for number, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        if nbk.is_test(cell) or nbk.is_demo(cell) or str(nbk.grade_id(cell) or "").startswith("test_"):
            continue
        cells.append(nbk.source(cell))
        first = next((line.strip() for line in cells[-1].splitlines() if line.strip()), "")
        labels.append(f"cell {number} ({first[:60]})")
    return cells, labels, notes


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def result_path(out, student, lesson):
    return Path(out) / RESULTS_SUBDIR / lesson / f"{student}.json"


def write_atomic(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def unanimous(tests, status, message):
    return [dict(test=t, points=0.0, max_points=p, status=status, message=message) for t, p in tests]


def grade_one(sandbox, submissions, student, lesson, tests, data_files):
    """The result dict of one (student, lesson)."""
    path, note = locate(submissions, student, lesson)
    result = dict(student=student, lesson=lesson, notebook=str(path) if path else None,
                  sha256=sha256(path), notes=[note] if note else [], cells={})
    if path is None:
        result["tests"] = unanimous(tests, "missing", note)
        return result
    try:
        cells, labels, notes = submission_cells(nbk.read(path))
    except nbk.NotebookError as e:
        result["tests"] = unanimous(tests, "error", f"your notebook could not be read: {e}")
        return result
    result["notes"] += notes
    session = Session(sandbox, lesson, cells, data_files)
    try:
        session.open()
    except SandboxError as e:
        result["tests"] = unanimous(tests, "error", f"your notebook could not be run: {e}")
        session.close()
        return result
    checks, rows = checks_for(lesson), []
    for test, max_points in tests:
        name = test.removeprefix("test_")
        row = dict(test=test, points=0.0, max_points=max_points, status="failed", message="")
        try:
            with warnings.catch_warnings():  # the references' own numpy warnings (e.g. -inf rows)
                warnings.simplefilter("ignore")
                checks[name](Subject(session.transport, f"{lesson}/{name}"))
            row.update(points=max_points, status="passed")
        except AssertionError as e:
            row["message"] = str(e)
        except Unchecked as e:
            row.update(status="error", message=str(e))
        except (SandboxError, WireError) as e:
            row.update(status="error", message=f"your code could not be checked: {e}")
        except Exception:  # a bug of ours: the student must not pay for it, the instructor must see it
            row.update(status="error", message="the grader failed on this test (the instructor has the details)")
            result.setdefault("grader_errors", []).append(traceback.format_exc())
        rows.append(row)
    session.close()
    result["tests"] = rows
    result["cells"] = {"skipped": {labels[i]: why for i, why in session.skipped.items()},
                       "errors": {labels[i]: err for i, err in session.cell_errors.items()}}
    return result


def stage_data(lessons, dest):
    """Copy each lesson's data files (what students also get) into dest/<lesson>/; returns their names."""
    names = {}
    for lesson in lessons:
        src = nbk.lesson_path(lesson).parent
        files = [f for f in src.iterdir() if f.is_file() and f.suffix != ".ipynb" and not f.name.startswith(".")]
        (dest / lesson).mkdir(parents=True)
        for f in files:
            shutil.copy2(f, dest / lesson / f.name)
        names[lesson] = [f.name for f in files]
    return names


class Progress:
    def __init__(self, total, stream=sys.stderr):
        self.total, self.done, self.stream, self.start = total, 0, stream, time.monotonic()
        self.lock = threading.Lock()

    def update(self, student, lesson, result):
        with self.lock:
            self.done += 1
            got = sum(t["points"] for t in result["tests"])
            full = sum(t["max_points"] for t in result["tests"])
            bar = "#" * int(30 * self.done / max(self.total, 1))
            rate = (time.monotonic() - self.start) / self.done
            self.stream.write(f"[{bar:<30}] {self.done}/{self.total}  {student} {lesson}: {got:g}/{full:g}"
                              f"  ({rate:.1f} s each)\n")
            self.stream.flush()


def grade(submissions, out, lessons=None, jobs=1, resume=False, shard=None, mode="bwrap", limits=None,
          gradescope=False, gradebook=None, progress=True):
    """Grade a class; returns the list of results. Raises GradeError on bad input, before any work."""
    lessons = list(lessons or nbk.lesson_names())
    for lesson in lessons:
        if lesson not in LESSONS or not nbk.lesson_path(lesson).exists():
            raise GradeError(f"unknown lesson {lesson!r}; lessons are {', '.join(nbk.lesson_names())}")
    students = find_students(submissions)
    out = check_out_dir(out)
    if shard:
        i, n = shard
        students = students[i::n]
    tests = {lesson: lesson_tests(lesson) for lesson in lessons}
    # The references are small tensors computed by many threads at once: one torch thread each
    # is faster than threads fighting for the cores.
    import torch
    torch.set_num_threads(1)
    todo = []
    for student in students:
        for lesson in lessons:
            if resume:
                done = _load(result_path(out, student, lesson))
                path, _ = locate(submissions, student, lesson)
                if done and done.get("sha256") == sha256(path):
                    continue
            todo.append((student, lesson))

    staging = Path(tempfile.mkdtemp(prefix="mha-course-data-"))
    bar = Progress(len(todo)) if progress else None
    try:
        data_files = stage_data(lessons, staging)
        work = queue.Queue()
        for item in todo:
            work.put(item)
        failures = []

        def worker():
            sandbox = None
            try:
                while True:
                    try:
                        student, lesson = work.get_nowait()
                    except queue.Empty:
                        return
                    for attempt in range(2):  # a worker killed by a submission is replaced once
                        try:
                            if sandbox is None or not sandbox.alive():
                                sandbox = Sandbox(mode, limits, staging)
                            result = grade_one(sandbox, submissions, student, lesson, tests[lesson],
                                               data_files[lesson])
                            break
                        except SandboxError as e:
                            if sandbox:
                                sandbox.close()
                            sandbox = None
                            result = dict(student=student, lesson=lesson, notes=[], cells={}, sha256=None,
                                          tests=unanimous(tests[lesson], "error", f"could not be graded: {e}"))
                    write_atomic(result_path(out, student, lesson), json.dumps(result, indent=1))
                    if bar:
                        bar.update(student, lesson, result)
            except BaseException as e:  # pragma: no cover - reported below
                failures.append(e)
            finally:
                if sandbox:
                    sandbox.close()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(todo) or 1)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    from autograder import report
    return report.write_all(out, students, lessons, tests, gradescope=gradescope, gradebook=gradebook)


def _load(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
