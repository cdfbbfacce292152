"""Adapters: the grader's edges, each between the core and one outside system.

The core (release, grade, results, report, merge, sandbox/, worker, checks/) grades and stores; an
adapter turns someone else's format into the core's or back, using only the core's public functions
(results.py's stored formats, notebook.py, release.student_copy, report.feedback_text, report.write_feedback and
report.results_json, grade.grade):

  collect.py, roster.py     an LMS download and its roster in: collect.py files what canvas.py,
                            moodle.py and exchange.py (nbgrader's) read of each LMS's names
  export.py                 the export of the final scores (the core's counting.py): a plain CSV, or
                            canvas.py's gradebook import
  classreport.py            the class report (HTML) from stored results
  feedback_upload.py        the feedback pages back to the LMS: the zip Canvas or Moodle attaches, named
                            as collect.py's collection.csv says the download named each upload
  gradebook.py, formgrader.py, nbgrader_feedback.py   nbgrader's gradebook, formgrader and feedback
  gradescope.py             a Gradescope autograder bundle and its run_autograder entry point

The core never imports an adapter: `python -m autograder` dispatches to them lazily, and hands grade
and merge the writers of report_outputs() below, which report.write_all calls after the core's files.
Adapters import one another only where one outside system spans two modules (roster.py, shared by the
LMS's collect and export; canvas.py, moodle.py and exchange.py, read by collect, and canvas.py's
import, written by export; formgrader.py, written by the gradebook's update).
tests/grader/test_layout.py checks the imports.
"""

import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from autograder import notebook as nbk
from autograder.adapters.classreport import write_report
from autograder.adapters.gradebook import read_reviews, remember_gradebook, update_gradebook
from autograder.adapters.roster import remember_roster
from autograder.config import RunConfig, set_rule
from autograder.counting import Counting, score, stale_warning, write_final

HOOKS = []  # [(writer, needs a gradebook)], in the order report.write_all calls them: registered by after_grading


def after_grading(needs_gradebook: bool = False):
    """Register a writer write(writing, out, results, warnings) that report.write_all calls after the core's files,
    through report_outputs, in the order registered (needs_gradebook: only when the run has a gradebook)."""

    def register(writer):
        HOOKS.append((writer, needs_gradebook))
        return writer

    return register


@dataclass
class Writing:
    """What the writers of one run share: its gradebook, course root, roster and rule (RESULTS's), and the
    gradebook's reviews, read once by the first writer that needs them."""

    gradebook: str | None = None
    course_root: str | None = None
    roster: object = None
    rule: Counting = field(default_factory=Counting)
    reviews: dict = field(default_factory=dict)


@after_grading(needs_gradebook=True)
def to_gradebook(w: Writing, out, results, warnings) -> None:
    """nbgrader's gradebook and the autograded notebooks (update_gradebook), then its reviews for the writers after;
    the stale manual scores warned of as the rule counts them, as export and totals.csv tell them."""
    tests = {lesson: nbk.lesson_tests(lesson) for lesson in sorted({r.lesson for r in results})}
    update_gradebook(w.gradebook, results, tests, w.course_root, w.roster)
    w.reviews.update(read_reviews(w.gradebook))  # after the update: stale overrides are marked (kept, as nbgrader does)
    remember_gradebook(out, w.gradebook)  # a later run without --gradebook is refused (check_same_gradebook)
    for line in stale_warning(
        [
            f"{r.student} {r.lesson} {t}"
            for r in results
            for t in score(r, w.reviews.get((r.student, r.lesson)), w.rule.drop_stale, w.rule.written).stale
        ],
        w.rule.drop_stale,
    ):
        print(f"warning: {line}", file=sys.stderr)


@after_grading()
def to_totals(w: Writing, out, results, warnings) -> None:
    """totals.csv and the feedback pages by the rule (counting.write_final), which a folder's first grade or merge
    records (later ones agree with it, or are refused before any work), and the roster they were written with."""
    set_rule(out, w.rule)
    write_final(out, results, roster=w.roster, reviews=w.reviews, counting=w.rule)
    if w.roster:
        remember_roster(out, w.roster)


@after_grading()
def to_report(w: Writing, out, results, warnings) -> None:
    """report.html, with the roster's students and sections and the gradebook's scores."""
    write_report(RunConfig(Path(out), roster=w.roster, rule=w.rule), results, warnings, w.reviews)


def report_outputs(gradebook=None, course_root=None, roster=None, rule: Counting | None = None) -> list:
    """The registered writers (HOOKS) bound to one run, each write(out, results ([Result]), warnings), for
    report.write_all: with a gradebook (nbgrader's database file) its scores and the autograded notebooks under
    course_root (default: the gradebook's folder); totals.csv and the feedback pages; the class report. All count by
    `rule`, RESULTS's (config.read_settings; default: Counting())."""
    writing = Writing(gradebook, course_root, roster, rule or Counting())
    return [partial(writer, writing) for writer, needs_gradebook in HOOKS if gradebook or not needs_gradebook]
