"""The nbgrader gradebook, filled from trusted results, so that `nbgrader export` and the
formgrader show the scores the grader decided; and the autograded notebooks formgrader opens
(formgrader.py). Student code never touches either.

The grader owns every grade's auto_score; a written question (a markdown answer) has none: it needs a
manual grade until a TA saves one in formgrader (one left unanswered scores an auto_score of 0 and needs
none), and read_reviews reads that score like any other. An instructor's review (manual_score, extra
credit, comments, made in formgrader or through nbgrader.api) is never touched: a regrade or a --resume
keeps it, and nbgrader shows it in place of the auto_score.

An override is stale when a regrade changes the autograded score it was made against, or, for a written
question, a resubmission changes the answer its autograded notebook showed the TA: the update
marks its grade needs_manual_grade (formgrader lists it to review again, and clears the mark when a
TA saves a score), and read_reviews reports it, so export and totals.csv name it.
"""

import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.util import find_spec
from pathlib import Path

from autograder import notebook as nbk
from autograder.config import read_settings, set_gradebook, settings_path
from autograder.results import UNANSWERED, UsageError, read_csv


def check_gradebook(gradebook):
    """UsageError, before any work, for a --gradebook that could not be written once the results
    are: a folder, a file in a folder that does not exist, or no nbgrader to write it with."""
    if not gradebook:
        return
    path = Path(gradebook)
    if path.is_dir():
        raise UsageError(f"--gradebook {gradebook} is a folder: name the gradebook file (e.g. gradebook.db)")
    if not path.parent.is_dir():
        raise UsageError(f"--gradebook {gradebook}: the folder {path.parent} does not exist (create it first)")
    if find_spec("nbgrader") is None:
        raise UsageError("--gradebook needs nbgrader: pip install 'nbgrader>=0.9,<0.10' (or the course's [dev] extra)")


def check_same_gradebook(out, gradebook):
    """UsageError, before any work, when RESULTS (out) was last written with a gradebook and this run names
    none: rewriting totals.csv and the feedback pages without it would silently drop the TAs' manual scores."""
    before = remembered_gradebook(out)
    if before and not gradebook:
        raise UsageError(
            f"{out} holds the manual scores of --gradebook {before}: pass --gradebook {before} again "
            f"(or remove its gradebook from {settings_path(out)} to rewrite it without them)"
        )
    totals = Path(out) / "totals.csv"  # written by an export --gradebook, or before RESULTS remembered its gradebook
    if (
        not gradebook
        and totals.is_file()
        and any(
            "manual: " in row.get("flags", "") or "extra credit: " in row.get("flags", "") for row in read_csv(totals)
        )
    ):
        raise UsageError(
            f"{totals} holds manual scores from a gradebook: pass --gradebook with that gradebook "
            f"(or delete {totals} to rewrite it without them)"
        )


def remembered_gradebook(out):
    """The gradebook RESULTS (out) was last written with (remember_gradebook: its settings), or None."""
    return read_settings(out).gradebook


def remember_gradebook(out, gradebook):
    """Record in RESULTS (out) the gradebook its totals.csv and feedback pages now hold (check_same_gradebook)."""
    set_gradebook(out, gradebook)


@dataclass
class Review:
    """A submission's scores from the gradebook: {test: manual score}, {test: extra credit}, and the
    tests whose manual score is stale (made before the autograded result last changed)."""

    manual: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    stale: list = field(default_factory=list)


def _open(db_path):
    from nbgrader.api import Gradebook

    if not shutil.which("alembic"):  # nbgrader runs `alembic`; it sits next to this Python
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return Gradebook(f"sqlite:///{Path(db_path).resolve()}")


def read_reviews(db_path):
    """{(student, lesson): Review} of every submission with a manual score or extra credit in the
    gradebook at db_path; UsageError when there is no such file (it is never created here)."""
    from nbgrader.api import Grade

    if not Path(db_path).is_file():
        raise UsageError(f"--gradebook {db_path}: no such gradebook (grade --gradebook {db_path} creates it)")
    reviews = {}
    with _open(db_path) as gb:
        for g in gb.db.query(Grade):
            if g.manual_score is None and not g.extra_credit:
                continue
            review = reviews.setdefault((g.student.id, g.assignment.name), Review())
            if g.manual_score is not None:
                review.manual[g.name] = float(g.manual_score)
                if g.needs_manual_grade:  # see update_gradebook: the autograded result changed under it
                    review.stale.append(g.name)
            if g.extra_credit:
                review.extra[g.name] = float(g.extra_credit)
    return reviews


def update_gradebook(db_path, results, tests, course_root=None, roster=None):
    """Create the lessons' structure (assignment, notebook, grade and solution cells), set every
    auto_score, and write the autograded notebooks under course_root (default: the gradebook's folder), with
    formgrader's nbgrader_config.py there (formgrader.write_config) when it has none. With a roster, every roster
    student is in the gradebook with their name, email and LMS id, as formgrader shows them."""
    from sqlalchemy.exc import SAWarning

    from autograder.adapters.formgrader import changed_answers, write_autograded, write_config

    course_root = course_root or Path(db_path).resolve().parent
    with _open(db_path) as gb, warnings.catch_warnings():
        # nbgrader's add_submission trips SQLAlchemy's autoflush warnings; its rows are right
        warnings.simplefilter("ignore", SAWarning)
        for row in roster.rows if roster else ():
            first, last = split_name(row["name"])
            gb.update_or_create_student(
                row["student"],
                first_name=first,
                last_name=last,
                email=row["email"] or None,
                lms_user_id=row.get("lms_id") or None,
            )
        for lesson, cells in tests.items():
            gb.update_or_create_assignment(lesson)
            gb.update_or_create_notebook(lesson, lesson)
            for test, points in cells:
                gb.update_or_create_grade_cell(test, lesson, lesson, max_score=points, cell_type="code")
            # Written questions: markdown cells a TA scores in formgrader (their manual_score is the only score).
            for question, points in nbk.lesson_written(lesson):
                gb.update_or_create_grade_cell(question, lesson, lesson, max_score=points, cell_type="markdown")
                gb.update_or_create_solution_cell(question, lesson, lesson)
            # Answer cells, so that formgrader offers a comment box on each.
            for cell in nbk.code_cells(nbk.read(nbk.lesson_path(lesson))):
                if nbk.is_answer(cell):
                    gb.update_or_create_solution_cell(nbk.grade_id(cell), lesson, lesson)
        for r in results:
            if not r.submitted:
                continue
            notebook = _submission_notebook(gb, r)
            for t in r.tests:
                grade = next(g for g in notebook.grades if g.name == t.test)
                # A manual score made against another autograded result is stale until a TA saves one again
                # (formgrader clears needs_manual_grade then); the grader could not decide a grader_error, which a
                # TA's manual score decides (still fresh at the next regrade if the grader fails on it again).
                changed = grade.auto_score is not None and abs(grade.auto_score - t.points) > 1e-9
                stale = grade.manual_score is not None and (changed or bool(grade.needs_manual_grade))
                grade.auto_score = t.points
                grade.needs_manual_grade = (t.grader_error and grade.manual_score is None) or stale
            # Before write_autograded replaces the answers the TAs graded: which ones the resubmission changed.
            changed = changed_answers(course_root, r, nbk.read(nbk.lesson_path(r.lesson))) if r.written else set()
            for w in r.written:  # formgrader lists it until a TA saves a score (which clears the mark)
                grade = next(g for g in notebook.grades if g.name == w.question)
                # Unanswered: 0 without a TA, as nbgrader's autograde scores an unchanged answer; a TA may still
                # score it.
                grade.auto_score = 0.0 if w.status == UNANSWERED else None
                if grade.manual_score is None:
                    grade.needs_manual_grade = w.status != UNANSWERED
                else:
                    grade.needs_manual_grade = bool(grade.needs_manual_grade) or w.question in changed
            gb.db.commit()
    write_autograded(course_root, results)
    write_config(course_root, db_path)


def split_name(name: str) -> tuple:
    """(first, last) of a roster name, "Liddell, Alice" (Canvas's sortable form) or "Alice Liddell"; (None, None)
    for none."""
    if "," in name:
        last, _, first = name.partition(",")
        return first.strip() or None, last.strip() or None
    words = name.split()
    return (" ".join(words[:-1]) or None, words[-1]) if words else (None, None)


def _submission_notebook(gb, r):
    """The submission's notebook in the gradebook, made if new, with a grade (and a comment) for
    every cell the lesson has now: a cell added later gets its row without disturbing the others."""
    from nbgrader.api import Comment, Grade, MissingEntry

    student, lesson = r.student, r.lesson
    gb.update_or_create_student(student)
    try:
        submission = gb.find_submission(lesson, student)
    except MissingEntry:
        submission = gb.add_submission(lesson, student)
    if r.submitted_at:
        # nbgrader keeps naive UTC times (it compares them with naive due dates)
        submission.timestamp = datetime.fromisoformat(r.submitted_at).astimezone(timezone.utc).replace(tzinfo=None)
    notebook = gb.find_submission_notebook(lesson, lesson, student)
    cells = gb.find_notebook(lesson, lesson)
    have = {g.name for g in notebook.grades}
    for cell in cells.grade_cells:
        if cell.name not in have:
            gb.db.add(Grade(cell=cell, notebook=notebook))
    have = {c.name for c in notebook.comments}
    for cell in cells.solution_cells:
        if cell.name not in have:
            gb.db.add(Comment(cell=cell, notebook=notebook))
    gb.db.flush()
    return notebook
