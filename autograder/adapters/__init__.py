"""Adapters: the grader's edges, each between the core and one outside system.

The core (release, grade, results, report, merge, sandbox/, worker, checks/) grades and stores; an
adapter turns someone else's format into the core's or back, using only the core's public functions
(results.py's stored formats, notebook.py, release.student_copy, report.feedback_text, report.write_feedback and
report.results_json, grade.grade):

  collect.py, roster.py     an LMS download and its roster in: collect.py files what canvas.py,
                            moodle.py and exchange.py (nbgrader's) read of each LMS's names
  export.py                 the final scores, totals.csv and the export: a plain CSV, or canvas.py's
                            gradebook import
  classreport.py            the class report (HTML) from stored results
  feedback_upload.py        the feedback pages back to the LMS: the zip Canvas or Moodle attaches, named
                            as collect.py's collection.csv says the download named each upload
  gradebook.py, formgrader.py, nbgrader_feedback.py   nbgrader's gradebook, formgrader and feedback
  gradescope.py             a Gradescope autograder bundle and its run_autograder entry point

The core never imports an adapter: `python -m autograder` dispatches to them lazily, and hands grade
and merge the writers of report_outputs() below, which report.write_all calls after the core's files.
Adapters import one another only where one outside system spans two modules (roster.py, shared by the
LMS's collect and export; export.py's counting of scores, which the class report shares; canvas.py, moodle.py and exchange.py, read by collect, and canvas.py's import, written by export; formgrader.py, written by
the gradebook's update). tests/grader/test_layout.py
checks the imports.
"""
import sys
from dataclasses import replace

from autograder import notebook as nbk
from autograder.adapters.classreport import write_report
from autograder.adapters.export import counting_of, remember_counting, score, stale_warning, write_final
from autograder.adapters.gradebook import read_reviews, remember_gradebook, update_gradebook
from autograder.adapters.roster import remember_roster


def report_outputs(gradebook=None, course_root=None, roster=None, written=False):
    """The writers report.write_all calls after the core's files, each write(out, results ([Result]), warnings):
    with a gradebook (nbgrader's database file) its scores and the autograded notebooks under course_root
    (default: the gradebook's folder); the feedback pages again and totals.csv (export.write_final: a row for
    every student of the roster, when one is given; the gradebook's manual scores and extra credit counted and
    flagged; written: the written questions count); the class report (with the gradebook's scores and the
    roster). All count as RESULTS's last export counted (export.counting_of: its late penalties too), with this
    run's written, which RESULTS then remembers.
    """
    reviews = {}

    def to_gradebook(out, results, warnings):
        tests = {lesson: nbk.lesson_tests(lesson) for lesson in sorted({r.lesson for r in results})}
        update_gradebook(gradebook, results, tests, course_root)
        reviews.update(read_reviews(gradebook))   # after the update: stale overrides are marked (kept, as nbgrader does)
        remember_gradebook(out, gradebook)   # a later run without --gradebook is refused (check_same_gradebook)
        for line in stale_warning([f"{r.student} {r.lesson} {t}" for r in results
                                   for t in score(r, reviews.get((r.student, r.lesson)), written=written).stale]):
            print(f"warning: {line}", file=sys.stderr)   # as export warns: the scores it sends are the same

    def to_totals(out, results, warnings):
        counting = replace(counting_of(out), written=written)   # the last export's late policy, this run's --written
        for line in remember_counting(out, counting):
            print(f"warning: {line}", file=sys.stderr)
        write_final(out, results, roster=roster, reviews=reviews, counting=counting)
        if roster:
            remember_roster(out, roster)
    students = [r["student"] for r in roster.rows] if roster else None
    sections = {r["student"]: r["section"] for r in roster.rows} if roster and "section" in roster.columns else None
    return ([to_gradebook] if gradebook else []) + [to_totals, lambda out, results, warnings: write_report(
        out, results, warnings=warnings, sections=sections, roster=students, reviews=reviews)]
