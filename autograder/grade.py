"""python -m autograder grade SUBMISSIONS --out RESULTS: grade SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb.

Tests come from the source notebooks, never from submissions. A submission's code runs in a
sandboxed child (worker.py); the checks run here and decide every verdict from plain data.

RESULTS holds a term (results.py): each (student, lesson) result is written atomically as soon as
it is done, so a crash, a kill or a SIGTERM loses nothing finished. Grading a lesson adds or
replaces that lesson's results and keeps the others; grades.csv, feedback and the gradebook are
then rewritten from everything stored (report.py). Each result carries a fingerprint of what its
verdict depends on, and --resume reuses a result only while that still matches.

Everything in SUBMISSIONS is hostile: only regular files with one name are read (lstat and
O_NOFOLLOW), notebooks are size-capped and validated before use, and whatever one submission does
ends as that submission's status `error`, never the run.
"""

import ast
import hashlib
import importlib
import json
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path

from autograder import check_submission, counting
from autograder import lessons as manifests
from autograder import notebook as nbk
from autograder import results as store
from autograder.config import RunConfig
from autograder.release import lesson_files
from autograder.sandbox.runner import remove_tree
from autograder.sandbox.wire import WireError
from autograder.worker import Limits, Sandbox, SandboxError, Session, weak_mode_warning

ROOT = Path(__file__).resolve().parent.parent
LESSONS = manifests.solutions_modules()  # {lesson: its solutions and checks module}; the checks (torch) load lazily
IGNORED = ("__MACOSX", ".ipynb_checkpoints")
# grade --kernels-graded: the aspect a launcher's test gains (grade_kernels), and its weight against the check's own
KERNEL_ASPECT, KERNEL_WEIGHT = "compiles for an A100", 1
CACHE = "cache.json"  # in RESULTS/.results: Cache


class GradeError(store.UsageError):
    """Bad input to the grader itself: reported before any work starts."""


class Interrupted(Exception):
    """SIGTERM or SIGINT: the run stopped cleanly; exit status 128 + the signal's number."""

    def __init__(self, signum, kept):
        super().__init__(
            f"interrupted by {signal.Signals(signum).name}: {kept} results kept; "
            "run the same command with --resume to finish"
        )
        self.status = 128 + signum


# ---- the class: students, lessons and where their notebooks are ------------------------------


class Anomalies:
    """What in SUBMISSIONS was odd, by kind, listed with counts at the end of a run."""

    def __init__(self):
        self.found, self.lock = defaultdict(list), threading.Lock()

    def add(self, kind, where):
        with self.lock:
            self.found[kind].append(store.clean(where, 200, newlines=False))

    def lines(self, examples=4):
        out = []
        for kind, where in sorted(self.found.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            more = f", ... ({len(where) - examples} more)" if len(where) > examples else ""
            out.append(f"  {len(where)} x {kind}: {', '.join(where[:examples])}{more}")
        return out


def _entries(folder):
    """{name: os.DirEntry} of a folder, never following links; {} when it cannot be read."""
    try:
        with os.scandir(folder) as it:
            return {e.name: e for e in it}
    except OSError:
        return {}


def _is_dir(entry):
    return entry.is_dir(follow_symlinks=False)


def find_students(submissions: str | Path, anomalies: Anomalies) -> dict:
    """{student: refusal or None} of SUBMISSIONS' student folders (a symlinked one is refused)."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise GradeError(f"submissions folder {submissions} does not exist or is not a folder")
    if not os.access(submissions, os.R_OK | os.X_OK):
        raise GradeError(f"cannot read the submissions folder {submissions}")
    students = {}
    for name, entry in sorted(_entries(submissions).items()):
        link = entry.is_symlink()
        if not (link or _is_dir(entry)):
            if name.endswith(".ipynb"):
                anomalies.add("notebook outside any student folder (run `python -m autograder collect`)", name)
            continue
        why = store.check_student(name)
        if why:
            if name not in IGNORED and not name.startswith("."):
                anomalies.add("folder not graded: " + why, name)
            elif name in IGNORED:
                anomalies.add("ignored system folder", name)
            continue
        students[name] = "refused: your student folder is a symbolic link" if link else None
    if not students:
        raise GradeError(
            f"no student folders in {submissions} (expected {submissions}/<student>/<lesson>/<lesson>.ipynb)"
        )
    lessons = sorted(set(students) & set(LESSONS))
    if lessons:  # one student's folder, or a release: grading it would add "students" named after lessons
        raise GradeError(
            f"{submissions} holds lesson folders ({', '.join(lessons)}), not student folders: "
            f"give the folder above them, SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb"
        )
    return students


class Submission:
    """Where one (student, lesson) notebook is: path (or None), refused (why, or None), notes for
    the student, anomalies (kinds, for the instructor) and the submission time."""

    def __init__(self, path=None, refused=None, notes=(), anomalies=(), submitted_at=None):
        self.path, self.refused, self.notes, self.anomalies = path, refused, list(notes), list(anomalies)
        self.submitted_at = submitted_at

    @property
    def present(self):
        return self.path is not None or self.refused is not None

    def key(self):
        """(sha256 of the notebook's bytes or None, what stands for it in the fingerprint)."""
        if self.refused or self.path is None:
            return None, self.refused or "missing"
        try:
            digest = hashlib.sha256(nbk.read_submitted_bytes(self.path)).hexdigest()
        except nbk.NotebookError as e:
            return None, str(e)
        return digest, digest


def locate(submissions: str | Path, student: str, lesson: str, student_refused: str | None = None) -> "Submission":
    """The Submission of one student's lesson: SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb, or,
    with a note, the one obvious alternative (a renamed notebook, a folder in another case, the
    notebook beside the lesson folders). Nothing is followed: links are refused when read."""
    if student_refused:
        return Submission(refused=student_refused, anomalies=["refused file or folder"])
    home = Path(submissions) / student
    entries = _entries(home)
    folder = entries.get(lesson) or next((e for n, e in entries.items() if n.lower() == lesson.lower()), None)
    if folder is None:
        loose = next((e for n, e in entries.items() if n.lower() == f"{lesson}.ipynb"), None)
        if loose is None:
            return Submission(notes=[f"no {lesson}.ipynb submitted"], anomalies=[counting.MISSING])
        return Submission(
            home / loose.name,
            notes=[f"graded {loose.name} from your folder: it belongs in {lesson}/"],
            anomalies=["notebook outside its lesson folder"],
        )
    notes, kinds = [], []
    if folder.name != lesson:
        notes.append(f"graded your folder {folder.name}/: it should be named {lesson}/")
        kinds.append("lesson folder named differently")
    if folder.is_symlink():
        return Submission(
            refused="refused: your lesson folder is a symbolic link",
            notes=notes,
            anomalies=kinds + ["refused file or folder"],
        )
    if not _is_dir(folder):
        return Submission(notes=[f"{folder.name} is a file, not a folder"], anomalies=[counting.MISSING])
    path = Path(folder.path)
    when, problem = store.read_timestamp(path)
    if problem:
        kinds.append(f"unreadable {store.TIMESTAMP_FILE}")
    inside = _entries(path)
    if f"{lesson}.ipynb" in inside:
        return Submission(path / f"{lesson}.ipynb", notes=notes, anomalies=kinds, submitted_at=when)
    others = sorted(n for n in inside if n.endswith(".ipynb") and not n.startswith("."))
    if len(others) == 1:
        notes.append(f"graded {others[0]}: the notebook should be named {lesson}.ipynb")
        return Submission(path / others[0], notes=notes, anomalies=kinds + ["renamed notebook"], submitted_at=when)
    if others:
        return Submission(
            notes=notes
            + [f"{len(others)} notebooks in {folder.name}/ and none named {lesson}.ipynb: which one to grade?"],
            anomalies=kinds + ["several notebooks, none by name"],
        )
    return Submission(notes=notes + [f"no {lesson}.ipynb submitted"], anomalies=kinds + [counting.MISSING])


def parse_shard(text: str) -> tuple:
    try:
        i, n = (int(x) for x in text.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise GradeError(f"--shard takes i/N with 0 <= i < N, got {text!r}") from None
    return i, n


# ---- fingerprints --------------------------------------------------------------------------


def _module_file(name):
    base = ROOT / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


class Cache:
    """What does not change between runs of one RESULTS folder, in RESULTS/.results/cache.json, each entry keyed by
    what it depends on, so that a change is never missed: a source file's sha256 and imports by its (path, size,
    mtime_ns) (files), and each lesson's reference self-check passed by the hash of the code it ran (references).
    A cache that is missing or unreadable is an empty one (everything is computed again); save() writes it when it
    changed. It holds no verdict: results are the signed store's."""

    def __init__(self, out=None):
        self.path = Path(out) / store.STORE / CACHE if out else None
        self.data, self.changed = {"files": {}, "references": {}}, False
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8")) if self.path else {}
            if isinstance(loaded.get("files"), dict) and isinstance(loaded.get("references"), dict):
                self.data = loaded
        except (OSError, ValueError, AttributeError):
            pass

    def source(self, path: Path) -> tuple:
        """(sha256, [imported names of solutions and autograder]) of one of our source files."""
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        known = self.data["files"].get(str(path))
        if known and known[:2] == stamp:
            return known[2], known[3]
        data = path.read_bytes()
        names = []
        for node in ast.walk(ast.parse(data)):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        names = sorted({n for n in names if n.split(".")[0] in ("solutions", "autograder")})
        self.data["files"][str(path)] = stamp + [hashlib.sha256(data).hexdigest(), names]
        self.changed = True
        return self.data["files"][str(path)][2], names

    def save(self) -> None:
        if self.path and self.changed:
            store.write_atomic(self.path, json.dumps(self.data), durable=False)
            self.changed = False


def _code_closure(modules, cache=None):
    """The source files of our modules (solutions, autograder) that `modules` import, transitively."""
    cache = cache or Cache()
    seen, todo = set(), [m for m in modules]
    while todo:
        path = _module_file(todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        todo += cache.source(path)[1]
    return sorted(seen)


def _version():
    try:
        return metadata.version("mha-course")
    except metadata.PackageNotFoundError:
        return "unknown"


def lesson_limits(lesson, given=None) -> Limits:
    """The Limits a lesson is graded under: worker.DEFAULT_LIMITS, then its manifest's [limits], then
    `given` {field: value} (grade's flags: --memory, --cell-timeout, ...), each over the one before."""
    return manifests.limits(lesson, nbk.lesson_path(lesson).parent.parent).over(given, "grade's limits")


def lesson_fingerprint(
    lesson: str, tests: list, mode: str, limits: dict | None, cache: Cache | None = None, kernels: str = ""
) -> str:
    """What a lesson's verdicts depend on besides the submission: its tests and points (and its written
    questions'), the code
    of its checks, of solutions/ they import, of the grader and the sandbox, what of its manifest
    grading reads (lessons.grading_keys: not the book's text), the files its notebook has beside it,
    the sandbox mode, the limits it is graded under (lesson_limits) and the package's version. cache: the files'
    hashes and imports, read again only where a file's size or time changed. kernels: grade --kernels ("note" or
    "graded")."""
    cache = cache or Cache()
    package = f"autograder.lessons.{LESSONS[lesson]}"  # its checks, and the mistakes they import by name
    files = _code_closure([f"{package}.checks", f"{package}.mistakes", "autograder.worker"], cache)
    files += [ROOT / "autograder" / f"{m}.py" for m in ("grade", "notebook", "results")]  # not their lazy imports
    files += sorted((ROOT / "autograder" / "sandbox").glob("*.py"))
    named = {p: p.relative_to(ROOT) for p in files}
    root = nbk.lesson_path(lesson).parent.parent
    named.update((f, f"{lesson}/{name}") for name, f in lesson_files(lesson, root).items())  # named within the lesson
    parts = [
        _version(),
        lesson,
        repr(tests),
        mode,
        repr(sorted(lesson_limits(lesson, limits).to_json().items())),
        repr(manifests.grading_keys(lesson, root)),
    ]
    written = nbk.lesson_written(lesson)
    parts += [repr(written)] if written else []  # a lesson without written questions keeps its fingerprint
    parts += ["kernels" if kernels == "note" else f"kernels {kernels}"] if kernels else []  # and without, it stays
    parts += [
        f"{name}:{cache.source(p)[0] if p.suffix == '.py' else hashlib.sha256(p.read_bytes()).hexdigest()}"
        for p, name in named.items()
    ]
    return store.sha256_text(*parts)


def imports_triton(lessons: list) -> bool:
    """Whether a code cell of one of these lessons' notebooks imports Triton: only then do the run's sandboxes import
    it before their children fork (Sandbox(triton=...)), which costs every start-up about a third of a second."""
    return any(
        re.search(r"^\s*(import|from)\s+triton\b", nbk.source(cell), re.M)
        for lesson in lessons
        for cell in nbk.code_cells(nbk.read(nbk.lesson_path(lesson)))
    )


def forbidden_paths(lessons: list) -> tuple:
    """The paths the lessons' checks switch off ([forbids]): the run's sandboxes find them before their children fork
    (Sandbox(forbids=...)), not each child that switches them off."""
    return tuple(
        sorted({path for lesson in lessons for rule in manifests.forbids(lesson).values() for path in rule["paths"]})
    )


def check_reference_kernels(lessons: list) -> None:
    """grade --kernels-graded: the lesson's own kernels (its source notebook's answers) compile for the target and fit
    it, else UsageError: grading the kernels against a card the lesson's own tiles do not fit would cost a correct
    kernel its points."""
    from autograder import triton_fit
    from autograder.selfcheck import UsageError

    for lesson in lessons:
        cells = [nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson)))]
        jobs, problems = triton_fit.lesson_kernel_jobs(cells)
        said = problems + [
            f"{r['kernel']} {triton_fit.describe(r)}" for r in triton_fit.compile_jobs(jobs) if not r["fits"]
        ]
        if said:
            raise UsageError(f"grade --kernels-graded: {lesson}'s own kernels do not pass: {'; '.join(said)}")


def check_references(lessons: list, cache: Cache) -> None:
    """selfcheck.check_reference of each lesson whose reference code (its solutions module, its checks and the
    probes, with what they import, and the versions of torch and numpy) changed since it last passed here."""
    import numpy
    import torch

    from autograder.selfcheck import check_reference

    for lesson in lessons:
        package = f"autograder.lessons.{LESSONS[lesson]}"  # its probes load by name, not by an import statement
        files = _code_closure(
            [
                "autograder.selfcheck",
                f"solutions.{LESSONS[lesson]}",
                f"{package}.probes",
                f"{package}.checks",
                f"{package}.mistakes",
            ],
            cache,
        )
        key = store.sha256_text(
            torch.__version__, numpy.__version__, *(f"{p.relative_to(ROOT)}:{cache.source(p)[0]}" for p in files)
        )
        if cache.data["references"].get(lesson) != key:
            check_reference([lesson])  # ReferenceBroken: nothing graded, nothing cached
            cache.data["references"][lesson] = key
            cache.changed = True


def fingerprint(grader: str, sub_key: str, submitted_at: str | None) -> str:
    return store.sha256_text(grader, sub_key, submitted_at)


def unavailable(lesson: str) -> dict:
    """{graded name: why} of checks that cannot run here (a check module's UNAVAILABLE, e.g.
    Triton not installed): their tests get status error, for the instructor, never failed."""
    module = importlib.import_module(f"autograder.lessons.{LESSONS[lesson]}.checks")
    found = getattr(module, "UNAVAILABLE", None) or {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


# ---- one (student, lesson) -----------------------------------------------------------------


def submission_cells(nb: dict) -> tuple:
    """The code the grader runs, every code cell but tests and demos, in order: (sources, labels,
    notes). A label names a cell for feedback: its number in the notebook and its first line.
    nb has passed nbk.parse_submission, so its fields have the types Jupyter writes."""
    cells, labels, notes = [], [], []
    language = (nb.get("metadata", {}).get("kernelspec") or {}).get("language", "python")
    if str(language).lower() != "python":
        notes.append(
            f"the notebook's kernel is for {store.clean(str(language), 40, newlines=False)!r}, "
            "not Python; it was run as Python"
        )
    if not any(nbk.meta(c) for c in nb["cells"]):
        notes.append("the notebook has lost its nbgrader metadata; every code cell was run")
    for number, cell in enumerate(nb["cells"], 1):
        if cell["cell_type"] != "code" or nbk.is_test(cell) or nbk.is_demo(cell):
            continue
        if str(nbk.grade_id(cell) or "").startswith("test_"):
            continue
        cells.append(nbk.source(cell))
        labels.append(store.clean(check_submission.cell_label(number, cell), 120, newlines=False))
    return cells, labels, notes


def unanimous(tests: list, status: str, message: str, grader_error: bool = False) -> list:
    rows = [dict(test=t, points=0.0, max_points=p, status=status, message=message) for t, p in tests]
    for row in rows:
        if grader_error:
            row["grader_error"] = True
    return rows


def aspect_rows(weights: dict, max_points: float, passed: list | None = None, failed: str | None = None) -> list:
    """The aspects of a test for feedback, points scaled to the test's: passed (all earned),
    failed (core failed: nothing earned) or from PartialCredit rows."""
    total = sum(weights.values()) or 1
    scale = lambda w: round(max_points * w / total, 2)  # noqa: E731
    if failed is not None:
        core = next(iter(weights))
        return [
            dict(
                aspect=a,
                points=0.0,
                max_points=scale(w),
                passed=False,
                message=failed if a == core else f"earned only when {core} passes",
            )
            for a, w in weights.items()
        ]
    return [
        dict(
            aspect=r["aspect"],
            points=scale(r["weight"]) if r["passed"] else 0.0,
            max_points=scale(r["weight"]),
            passed=bool(r["passed"]),
            message=str(r.get("message", "")),
        )
        for r in passed
    ]


def run_check(check, subject, max_points: float, why_unavailable: str | None = None) -> dict:
    """One test's row: status, points and message (a bug of ours comes back in 'traceback')."""
    return run_checks([(check, subject, max_points, why_unavailable)])[0]


def run_checks(jobs, session=None) -> list:
    """The rows of jobs [(check, subject, max points, why it is unavailable or None)], in order. Each check runs up to
    its first pause (Check.steps: the label of the process its next part needs); then, while some wait, the parts of
    all that wait with the first one's label run one after the other, and those they lead to with the same label, so
    that they share one process (each switch of kind costs a fresh process that runs the notebook's cells again).
    session (the sandbox's Session the subjects reach): parts that run the grader's cells go first, where parts that
    switch paths off wait too, in one process that switches those paths off before the grader's cells and goes on to
    run the notebook's (Session.then): not where a check under a memory bound switches the same paths off, whose
    bound must count the notebook's process alone."""
    rows, waiting = [None] * len(jobs), []

    def advance(i, steps):
        try:
            waiting.append((next(steps), i, steps))
        except StopIteration as done:
            rows[i] = done.value

    def run(label):
        while group := [(i, steps) for other, i, steps in waiting if other == label]:
            waiting[:] = [w for w in waiting if w[0] != label]
            for i, steps in group:
                advance(i, steps)

    bounded = {
        p for check, *_ in jobs if getattr(check, "memory_bound", False) and check.forbid for p in check.forbid["paths"]
    }
    with warnings.catch_warnings():  # the references' own numpy warnings (e.g. -inf rows)
        warnings.simplefilter("ignore")
        for i, job in enumerate(jobs):
            advance(i, _check_steps(*job))
        while waiting:
            labels = [label for label, _, _ in waiting]
            grader = next((label for label in labels if label[0] == "elsewhere"), None)
            forbid = next((label for label in labels if label[0] == "forbid" and not bounded & set(label[1])), None)
            if session is not None and grader and forbid:
                session.then(forbid[1])
                run(grader)
                session.then(())
                run(forbid)
            else:
                run(labels[0])
    return rows


def _check_steps(check, subject, max_points, why_unavailable):
    """run_check, pausing where the check does (Check.steps): a generator that yields its labels and returns the row."""
    from autograder.checking import OverBudget, PartialCredit, Regrade, StudentError, Unchecked

    row = dict(points=0.0, max_points=max_points, status="failed", message="")
    weights = getattr(check, "aspects", None) or {}
    if why_unavailable:
        return dict(
            row,
            status="error",
            grader_error=True,
            message=f"not graded yet: {why_unavailable}. Your instructor will grade it where it can run.",
        )
    try:
        yield from check.steps(subject)
        row.update(points=max_points, status="passed")
        if weights:
            row["aspects"] = aspect_rows(
                weights, max_points, [dict(aspect=a, weight=w, passed=True) for a, w in weights.items()]
            )
    except PartialCredit as e:
        row.update(
            points=round(max_points * e.earned / e.total, 2),
            message=str(e),
            aspects=aspect_rows(weights, max_points, e.rows),
        )
    except AssertionError as e:
        row["message"] = str(e)
        if weights:
            row["aspects"] = aspect_rows(weights, max_points, failed=str(e))
    except Regrade as e:
        row.update(status="error", grader_error=True, message=str(e))
    except Unchecked as e:
        row.update(status="error", message=str(e))
    except OverBudget as e:
        row["message"] = f"your code used more memory than this check allows: {e}"
    except StudentError as e:
        row["message"] = f"your code raised {e.type}: {e.message}"
    except (SandboxError, WireError) as e:
        row.update(status="error", message=f"your code could not be checked: {e}")
    except Exception:  # a bug of ours: the student must not pay for it, the instructor must see it
        row.update(
            status="error",
            grader_error=True,
            traceback=traceback.format_exc(),
            message="the grader failed on this test (the instructor has the details)",
        )
    return row


def cell_problem(name: str, cells: list, labels: list, session: Session) -> str:
    """Why the cell that defines `name` did not run (a SyntaxError, an error raised before the def, a
    hang), so the feedback names that cell and error rather than a mistake in the function; or ''."""
    define = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", re.M)
    for i, src in enumerate(cells):
        if not define.search(src) or i >= len(labels):
            continue
        if i in session.skipped:
            return f"{labels[i]} was skipped: it {session.skipped[i]}"
        if i in session.cell_errors:
            err = store.cell_error(session.cell_errors[i])
            return f"{labels[i]} did not run to the end: it raised {err['type']}: {err['message']}"
    return ""


def written_rows(lesson: str, nb: dict | None = None, status: str | None = None, message: str = "") -> list:
    """The lesson's written questions (nbk.lesson_written) for one submission, as stored (results.WrittenRow):
    with its notebook nb, each NEEDS_GRADING (a person grades it: never a silent 0), or UNANSWERED when its
    answer is still the stub or empty (0, said, unless a TA scores it), the message saying which; without one,
    each `status` with `message`. An answer cell without its metadata needs a person: the answer may be elsewhere."""
    questions = nbk.lesson_written(lesson)
    if nb is None:
        return [dict(question=q, max_points=p, status=status, message=message) for q, p in questions]
    answers = {nbk.grade_id(c): nbk.source(c) for c in nb["cells"] if nbk.is_written(c)}
    rows = []
    for q, p in questions:
        text, status = answers.get(q), store.NEEDS_GRADING
        if text is None:
            said = (
                "its answer cell is not in your notebook (deleted, or its nbgrader metadata lost); graded by a person"
            )
        elif not text.strip() or nbk.TEXT_STUB in text:
            status = store.UNANSWERED
            said = (
                f"not answered: its cell still holds {nbk.TEXT_STUB}"
                if text.strip()
                else "not answered: its cell is empty"
            ) + "; 0 points unless your instructor scores it"
        else:
            said = "answered; graded by a person"
        rows.append(dict(question=q, max_points=p, status=status, message=said))
    return rows


def kernel_verdicts(session: Session, cells: list, graded: bool = False) -> list:
    """[(is_problem, line)] on the lesson's Triton kernels among the submission's cells (triton_fit.check_kernels):
    compiled for an A100 by the triton_fit.py staged beside the notebook, in the submission's own sandbox (compiling
    runs the student's code: under its limits, like every other step). graded: in a fresh process that ran none of
    the notebook's code, and a kernel the compiler gave no verdict on is a problem (the verdict is worth points)."""
    import contextlib
    import json

    from autograder import triton_fit
    from autograder.checking import OverBudget, StudentError, Subject, Unchecked

    subject = Subject(session.transport, "kernels", sources=cells)

    def compiler(jobs, timeout):
        return json.loads(subject.helper("compile_kernels", json.dumps(jobs), timeout))

    try:  # the compiler's own time limit comes first: the call's would end the child without a verdict
        with subject.elsewhere([]) if graded else contextlib.nullcontext():
            return triton_fit.check_kernels(cells, max(5, session.sandbox.limits.call_seconds - 5), compiler, graded)
    except (StudentError, Unchecked, OverBudget, ValueError, TypeError) as e:  # the grades stand; the note says why
        return [(graded, f"Triton kernels: not compiled for a GPU here ({type(e).__name__}: {str(e)[:200]})")]


def grade_kernels(rows: list, checks, said: list) -> None:
    """grade --kernels-graded: in the test of each function that launches a kernel students write
    (triton_fit.LAUNCHED_BY), one more aspect, KERNEL_ASPECT, worth KERNEL_WEIGHT against the check's own: earned when
    that kernel compiles for the target and fits it (said: kernel_verdicts), and only when the check's core passed."""
    from autograder import triton_fit

    for kernel, name in triton_fit.LAUNCHED_BY.items():
        row = next((r for r in rows if r["test"] == f"test_{name}"), None)
        if row is None or "aspects" not in row:  # not this lesson's, not graded here, or its code failed outright
            continue
        weights = {**checks[name].aspects, KERNEL_ASPECT: KERNEL_WEIGHT}
        lines = [(bad, line) for bad, line in said if line.startswith((f"{kernel} ", f"{kernel}:", "Triton kernels:"))]
        wrong = [line for bad, line in lines if bad]
        if not lines:
            wrong = [
                f"{kernel}: not found among your answer cells as a @triton.jit function, so not compiled for a GPU"
            ]
        earned = [
            dict(aspect=a["aspect"], weight=weights[a["aspect"]], passed=a["passed"], message=a["message"])
            for a in row["aspects"]
        ]
        core = earned[0]["passed"]
        earned.append(
            dict(
                aspect=KERNEL_ASPECT,
                weight=KERNEL_WEIGHT,
                passed=core and not wrong,
                message="; ".join(wrong) if core else f"earned only when {earned[0]['aspect']} passes",
            )
        )
        row["aspects"] = aspect_rows(weights, row["max_points"], earned)
        if all(a["passed"] for a in row["aspects"]):
            continue
        row["points"] = round(sum(a["points"] for a in row["aspects"]), 2)
        row["status"] = "failed"
        if core and wrong:
            row["message"] = " ".join(filter(None, [row["message"], f"{KERNEL_ASPECT}: {wrong[0]}"]))


def grade_one(
    sandbox: Sandbox,
    student: str,
    lesson: str,
    sub: "Submission",
    tests: list,
    data_files: list,
    grader: str,
    kernels: str = "",
) -> dict:
    """The result of one (student, lesson) in its stored JSON form: save_result reads it with Result.from_json,
    which validates what the sandbox's replies put in it. kernels: grade --kernels, "note" (kernel_verdicts in its
    notes) or "graded" (grade_kernels too)."""
    sha, key = sub.key()
    result = dict(
        student=student,
        lesson=lesson,
        notebook=str(sub.path) if sub.path else None,
        sha256=sha,
        fingerprint=fingerprint(grader, key, sub.submitted_at),
        grader=grader,
        submitted_at=sub.submitted_at,
        notes=list(sub.notes),
        cells={},
    )
    if sub.refused:
        result["tests"] = unanimous(tests, "error", f"your notebook was not graded: {sub.refused}")
        result["written"] = written_rows(lesson, None, "error", result["tests"][0]["message"])
        return result
    if sub.path is None:
        result["tests"] = unanimous(tests, "missing", sub.notes[-1] if sub.notes else "not submitted")
        result["written"] = written_rows(lesson, None, "missing", result["tests"][0]["message"])
        return result
    try:
        nb = nbk.parse_submission(nbk.read_submitted_bytes(sub.path))
    except nbk.NotebookError as e:
        refused = str(e).startswith("refused")
        what = "was not graded" if refused else "could not be read"
        result["tests"] = unanimous(tests, "error", f"your notebook {what}: {e}")
        result["written"] = written_rows(lesson, None, "error", result["tests"][0]["message"])
        result["anomaly"] = "refused file or folder" if refused else "unreadable notebook"
        return result
    result["written"] = written_rows(lesson, nb)
    other = nbk.content_lesson(nb, nbk.lesson_answers(tuple(LESSONS)))
    if other and other != lesson:  # the wrong notebook handed in: its tests will fail on names it never defines
        result["notes"].insert(
            0,
            f"this notebook looks like {other} (its answer cells are {other}'s), not {lesson}: "
            f"was it handed in to the wrong assignment? Hand in {lesson}.ipynb",
        )
        result["anomaly"] = "notebook of another lesson"
    cells, labels, notes = submission_cells(nb)
    result["notes"] += notes
    session = Session(sandbox, lesson, cells, data_files)
    try:
        try:
            session.open()
        except SandboxError as e:
            result["tests"] = unanimous(tests, "error", f"your notebook could not be run: {e}")
            return result
        from autograder.checking import Subject, checks_for

        checks, gone = checks_for(lesson), unavailable(lesson)
        rows, demos = [], None
        names = [test.removeprefix("test_") for test, _ in tests]
        jobs = [
            (checks[name], Subject(session.transport, f"{lesson}/{name}", sources=cells), max_points, gone.get(name))
            for name, (_, max_points) in zip(names, tests)
        ]
        for (test, _), name, row in zip(tests, names, run_checks(jobs, session)):
            if "traceback" in row:
                result.setdefault("grader_errors", []).append(row.pop("traceback"))
            why = row["status"] != "passed" and cell_problem(name, cells, labels, session)
            if why:
                row["message"] = f"{why}. {row['message']}"
            if row["status"] != "passed" and "NameError" in row["message"]:  # an answer that uses what only a demo
                demos = check_submission.demo_only(nb) if demos is None else demos  # (which grading skips) defines
                row["message"] += check_submission.demo_hint(row["message"], demos)
            rows.append(dict(test=test, **row))
        result["tests"] = rows
        if kernels:
            said = kernel_verdicts(session, cells, graded=kernels == "graded")
            how = "graded: an aspect of the test of its launcher" if kernels == "graded" else "a note, not graded"
            result["notes"] += [f"Triton kernels ({how}): {line}" for _, line in said]
            if kernels == "graded":
                grade_kernels(rows, checks, said)
        result["cells"] = {
            "skipped": {labels[i]: why for i, why in session.skipped.items() if i < len(labels)},
            "errors": {
                labels[i]: store.cell_error(err)
                for i, err in session.cell_errors.items()
                if isinstance(i, int) and 0 <= i < len(labels)
            },
        }
    finally:
        try:
            session.close()
        except SandboxError as e:  # what the notebook left killed or hung its sandbox after it was graded:
            if "tests" not in result:  # its verdict stands (the sandbox is replaced for the next one)
                raise
            result["notes"].append(
                f"after your notebook was graded, its sandbox could not be cleaned up ({e}): "
                "your code left something behind that the grader had to remove by force"
            )
    return result


def stage_data(names, dest: Path) -> dict:
    """Copy each lesson's files (release.lesson_files: what students get beside the notebook) into
    dest/<lesson>/; returns {lesson: their names}."""
    staged = {}
    for lesson in names:
        (dest / lesson).mkdir(parents=True)
        for name, f in lesson_files(lesson).items():
            shutil.copy2(f, dest / lesson / name)
        staged[lesson] = sorted(lesson_files(lesson))
    return staged


class Progress:
    def __init__(self, total, stream=sys.stderr):
        self.total, self.done, self.stream, self.start = total, 0, stream, time.monotonic()
        self.lock = threading.Lock()

    def update(self, student, lesson, result):
        with self.lock:
            self.done += 1
            got = sum(t.points for t in result.tests)
            full = sum(t.max_points for t in result.tests)
            bar = "#" * int(30 * self.done / max(self.total, 1))
            rate = (time.monotonic() - self.start) / self.done
            self.stream.write(
                f"[{bar:<30}] {self.done}/{self.total}  {store.clean(student, 60, newlines=False)} "
                f"{lesson}: {got:g}/{full:g}  ({rate:.1f} s each)\n"
            )
            self.stream.flush()


# ---- a run ---------------------------------------------------------------------------------


def plan(
    submissions: str | Path,
    out: str | Path | None,
    lessons=None,
    all_lessons: bool = False,
    students=None,
    shard: tuple | None = None,
    manifest: str | None = None,
) -> tuple:
    """Check the input and decide what to grade: (class {student: refusal or None}, lessons, selected
    students, manifest id, anomalies, RESULTS, shard as text). UsageError on bad input, before any
    work. out=None: only the class and its lessons (for the manifest)."""
    for lesson in lessons or []:
        if lesson not in LESSONS or not nbk.lesson_path(lesson).exists():
            raise GradeError(f"unknown lesson {lesson!r}; lessons are {', '.join(nbk.lesson_names())}")
    anomalies = Anomalies()
    found = find_students(submissions, anomalies)
    m = store.read_manifest(manifest) if manifest else None
    if m:
        unknown = [x for x in m["lessons"] if x not in LESSONS]
        if unknown:
            raise GradeError(f"the manifest {manifest} names unknown lessons: {', '.join(unknown)}")
        for name in sorted(set(found) - set(m["students"])):
            anomalies.add("student folder not in the manifest (not graded)", name)
        klass = {s: found.get(s) for s in m["students"]}
    else:
        klass = found
    if lessons:
        lessons = [x for x in LESSONS if x in lessons]
    elif all_lessons:
        lessons = [x for x in LESSONS if nbk.lesson_path(x).exists()]
    elif m:
        lessons = [x for x in LESSONS if x in m["lessons"]]
    else:  # only lessons someone handed in: a lesson not yet set is not written as zeros
        lessons = [
            x
            for x in LESSONS
            if nbk.lesson_path(x).exists()
            and any(locate(submissions, s, x).present for s, why in klass.items() if not why)
        ]
        if not lessons:
            raise GradeError(
                f"no notebook of any lesson in {submissions} (expected {submissions}/<student>/<lesson>/"
                "<lesson>.ipynb); name lessons with --lesson to grade them anyway"
            )
    if out is None:  # the manifest command: the class and its lessons only
        return klass, lessons, sorted(klass), None, anomalies, None, None
    out = store.prepare_out(out, submissions)
    selected = sorted(klass)
    if shard:
        selected = selected[shard[0] :: shard[1]]
    if students:
        unknown = [s for s in students if s not in klass]
        if unknown:
            raise GradeError(f"--student {unknown[0]!r}: no such student in {'the manifest' if m else submissions}")
        selected = [s for s in selected if s in set(students)]
    run = store.read_run(out)
    want_shard = f"{shard[0]}/{shard[1]}" if shard else None
    if run.lessons and (run.shard, run.manifest) != (want_shard, m["id"] if m else None):
        raise GradeError(
            f"{out} holds results of {run.shard and 'shard ' + run.shard or 'an unsharded run'}"
            f"{' from another manifest' if run.manifest != (m and m['id']) else ''}: grade into a "
            f"folder of its own (or delete {out}/{store.STORE}/{store.RUN_FILE} to start it afresh)"
        )
    return klass, lessons, selected, (m["id"] if m else None), anomalies, out, want_shard


def grade(config: RunConfig, outputs=()) -> dict:
    """Grade config.submissions into config.results (a RunConfig: lessons, students, shard, manifest, jobs, resume,
    force, mode, limits, gradescope, progress, and the rule's written questions for the feedback pages). Returns a
    summary dict (see __main__). Raises GradeError on bad input, before any work, and Interrupted after a clean stop
    on SIGTERM or SIGINT. outputs: the adapters' writers report.write_all calls after the core's files
    (autograder.adapters.report_outputs)."""
    c = config
    klass, lessons, selected, manifest_id, anomalies, out, shard_text = plan(
        c.submissions, c.results, c.lessons, c.all_lessons, c.students, c.shard, c.manifest
    )
    run_tmp = Path(tempfile.mkdtemp(prefix="mha-grade-"))
    old_tempdir, tempfile.tempdir = tempfile.tempdir, str(run_tmp)  # every sandbox folder lands in run_tmp
    try:
        data_files = stage_data(lessons, run_tmp / "data")
        warm = Warm(
            c.mode,
            lesson_limits(lessons[0], c.limits),
            run_tmp / "data",
            imports_triton(lessons),
            forbidden_paths(lessons),
        )
        try:
            return _grade(
                c.submissions,
                out,
                lessons,
                c.jobs,
                c.resume,
                c.mode,
                c.limits,
                c.gradescope,
                outputs,
                c.progress,
                c.force,
                c.rule.written,
                klass,
                selected,
                manifest_id,
                anomalies,
                shard_text,
                data_files,
                warm,
                c.kernels,
            )
        finally:
            warm.close()
    finally:
        tempfile.tempdir = old_tempdir
        remove_tree(run_tmp)  # whatever a submission left there, at any depth


def _grade(
    submissions,
    out,
    lessons,
    jobs,
    resume,
    mode,
    limits,
    gradescope,
    outputs,
    progress,
    force,
    written,
    klass,
    selected,
    manifest_id,
    anomalies,
    shard_text,
    data_files,
    warm,
    kernels="",
):
    """grade's work once its plan is made and a sandbox is starting (warm, with data_files in its data folder)."""
    cache = Cache(out)
    check_references(lessons, cache)  # a reference changed by mistake would grade the whole class wrong
    if kernels == "graded":
        check_reference_kernels(lessons)
    tests = {lesson: nbk.lesson_tests(lesson) for lesson in lessons}
    graders = {lesson: lesson_fingerprint(lesson, tests[lesson], mode, limits, cache, kernels) for lesson in lessons}
    cache.save()
    weak = [line for line in [weak_mode_warning(mode)] if line]  # a mode that hides no file: said once, here
    warnings_ = weak + [
        f"warning: {lesson} test_{name} cannot be checked here ({why}): it gets status error, "
        "flagged for regrading, never failed"
        for lesson in lessons
        for name, why in unavailable(lesson).items()
    ]
    for line in warnings_:
        print(line, file=sys.stderr)
    # The references are small tensors computed by many threads at once: one torch thread each
    # is faster than threads fighting for the cores.
    import torch

    torch.set_num_threads(1)

    todo, reasons, reused, problems = [], Counter(), 0, []
    for student in selected:
        for lesson in lessons:
            sub = locate(submissions, student, lesson, klass[student])
            for kind in sub.anomalies:
                anomalies.add(kind, f"{student}/{lesson}")
            why = "regraded" if not resume else "forced (--force)" if force else None
            if why is None:
                done, damaged = store.load_result(out, student, lesson, tests[lesson])
                sha, key = sub.key()
                if damaged:
                    anomalies.add("stored result damaged or refused, graded again", damaged.removesuffix(store.REGRADE))
                    why = "stored result damaged or refused"
                elif not done:
                    why = "not graded before"
                elif done.fingerprint == fingerprint(graders[lesson], key, sub.submitted_at):
                    why = "grader failed last time" if any(t.needs_regrade for t in done.tests) else None
                elif done.sha256 != sha:
                    why = "submission changed"
                else:
                    why = (
                        "submission time changed"
                        if done.submitted_at != sub.submitted_at
                        else "checks, tests or grader changed"
                    )
            if why:
                todo.append((student, lesson, sub))
                reasons[why] += 1
            else:
                reused += 1
    kept = _run(todo, out, tests, graders, lessons, limits, jobs, progress, anomalies, data_files, warm, kernels)
    store.write_run(out, shard_text, manifest_id, set(store.read_run(out).lessons) | set(lessons))

    from autograder import report

    results = report.write_all(
        out, {(s, x) for s in selected for x in lessons}, gradescope, outputs, problems, warnings=weak, written=written
    )
    stale = [
        f"{r.student}/{r.lesson}" for r in results if r.lesson in graders and r.grader and r.grader != graders[r.lesson]
    ]
    for where in stale:
        anomalies.add("result graded by another version of the checks (grade --resume updates it)", where)
    for why in problems:
        anomalies.add("damaged stored result (its tests are errors to regrade)", why)
    return dict(
        results=results,
        graded=kept,
        reused=reused,
        reasons=reasons,
        anomalies=anomalies.lines(),
        lessons=lessons,
        students=selected,
        warnings=warnings_,
    )


class Warm:
    """A sandbox started in the background (its worker imports torch) while the grader loads its own checks and
    decides what to grade: on two cores, a regrade pays for one start-up, not two in a row. take(limits) hands it
    to the first worker thread whose lesson has those limits, and new(limits) starts another of the run's (its mode,
    data folder and preloads) for the others; close() ends it when none took it. A sandbox that
    failed to start is left to the worker, which starts its own and reports why. The thread that started it lives
    until close(): bwrap's --die-with-parent ends the sandbox with the thread that started it, not the process."""

    def __init__(self, mode: str, limits: Limits, data_dir: Path, triton: bool, forbids: tuple = ()) -> None:
        self.mode, self.data_dir, self.triton, self.forbids = mode, data_dir, triton, forbids
        self.limits, self.sandbox, self.lock = limits, None, threading.Lock()
        self.started, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()

    def _hold(self):
        try:
            self.sandbox = self.new(self.limits)
        except SandboxError:
            pass
        finally:
            self.started.set()
        self.done.wait()

    def new(self, limits: Limits) -> Sandbox:
        """A sandbox of the run (its mode, data and preloads) under `limits`, started now; SandboxError."""
        return Sandbox(self.mode, limits, self.data_dir, self.triton, self.forbids)

    def take(self, limits: Limits) -> Sandbox | None:
        with self.lock:
            if limits != self.limits:
                return None
            self.started.wait()
            sandbox, self.sandbox = self.sandbox, None
            return sandbox

    def close(self) -> None:
        """After every sandbox it handed out is closed: end its own, if nobody took it, and its thread."""
        with self.lock:
            self.started.wait()
            if self.sandbox is not None:
                self.sandbox.close()
                self.sandbox = None
            self.done.set()
        self.thread.join()


def _run(
    todo,
    out,
    tests,
    graders,
    lessons,
    limits,
    jobs,
    progress,
    anomalies,
    data_files,
    warm,
    kernels="",
):
    """Grade todo in `jobs` threads, one sandbox each (the first may be warm's, the others warm.new's), started under
    the limits of the lesson it grades (lesson_limits; todo is taken lesson limits by lesson limits, so a thread
    rarely starts another); returns how many results were written.
    SIGTERM/SIGINT: stop, kill the sandboxes, raise Interrupted."""
    if not todo:
        return 0
    limits_of = {lesson: lesson_limits(lesson, limits) for lesson in lessons}
    same = {lesson: list(limits_of.values()).index(v) for lesson, v in limits_of.items()}  # lessons alike share a rank
    todo = sorted(todo, key=lambda item: same[item[1]])  # stable: otherwise in the order given
    stop, lock, live, failures, written = threading.Event(), threading.Lock(), set(), [], [0]
    bar = Progress(len(todo)) if progress else None
    work = queue.Queue()
    for item in todo:
        work.put(item)

    def kill_sandboxes():
        with lock:
            for sb in live:
                try:
                    os.killpg(sb.proc.pid, signal.SIGKILL)
                except OSError:
                    pass

    received = []

    def on_signal(signum, frame):
        # Returns, never raises: an exception raised inside Thread.join marks a live thread stopped
        # (CPython 3.11), and the run would exit under a worker still writing a result and its index.
        if not stop.is_set():
            received.append(signum)
            stop.set()
            kill_sandboxes()

    def worker():
        sandbox = None
        try:
            while not stop.is_set():
                try:
                    student, lesson, sub = work.get_nowait()
                except queue.Empty:
                    return
                result = None
                for attempt in range(2):  # a worker killed by a submission is replaced once
                    try:
                        if sandbox is not None and sandbox.limits != limits_of[lesson]:  # another lesson's
                            with lock:
                                live.discard(sandbox)
                            sandbox.close()
                            sandbox = None
                        if sandbox is None or not sandbox.alive():
                            sandbox = warm.take(limits_of[lesson]) or warm.new(limits_of[lesson])
                            with lock:
                                live.add(sandbox)
                        result = grade_one(
                            sandbox, student, lesson, sub, tests[lesson], data_files[lesson], graders[lesson], kernels
                        )
                        break
                    except SandboxError as e:
                        if sandbox:
                            with lock:
                                live.discard(sandbox)
                            sandbox.close()
                        sandbox = None
                        result = _failed(
                            student, lesson, sub, tests[lesson], graders[lesson], f"could not be graded: {e}"
                        )
                    except Exception:  # a bug of ours outside the checks: this submission only
                        result = _failed(
                            student,
                            lesson,
                            sub,
                            tests[lesson],
                            graders[lesson],
                            "the grader failed on this notebook (the instructor has the details)",
                            traceback.format_exc(),
                        )
                        break
                if stop.is_set():  # its sandbox was killed under it: not a verdict
                    return
                kind = result.pop("anomaly", None)
                try:
                    result = store.save_result(out, result)
                except store.ResultError:
                    result = store.save_result(
                        out,
                        _failed(
                            student,
                            lesson,
                            sub,
                            tests[lesson],
                            graders[lesson],
                            "the grader made a malformed result",
                            traceback.format_exc(),
                        ),
                    )
                if kind:
                    anomalies.add(kind, f"{student}/{lesson}")
                with lock:
                    written[0] += 1
                if bar:
                    bar.update(student, lesson, result)
        except BaseException as e:  # pragma: no cover - a disk full, reported by the main thread
            failures.append(e)
        finally:
            if sandbox:
                with lock:
                    live.discard(sandbox)
                sandbox.close()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(todo))))]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive() and not received:
                t.join(0.5)
        if received:
            deadline = time.monotonic() + 20  # the workers see their sandboxes die and stop
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            kill_sandboxes()
            raise Interrupted(received[0], written[0])
        if failures:
            raise failures[0]
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return written[0]


def _failed(student, lesson, sub, tests, grader, message, tb=None):
    """A result for a submission the grader itself could not grade: flagged for regrading."""
    sha, key = sub.key()
    result = dict(
        student=student,
        lesson=lesson,
        notebook=str(sub.path) if sub.path else None,
        sha256=sha,
        fingerprint=fingerprint(grader, key, sub.submitted_at),
        grader=grader,
        submitted_at=sub.submitted_at,
        notes=list(sub.notes),
        cells={},
        tests=unanimous(tests, "error", message, grader_error=True),
    )
    if tb:
        result["grader_errors"] = [tb]
    return result
