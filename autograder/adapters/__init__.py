"""Adapters: the grader's edges, each between the core and one outside system.

The core (release, grade, results, report, merge, sandbox/, worker, checks/) grades and stores; an
adapter turns someone else's format into the core's or back, using only the core's public functions
(results.py's stored formats, notebook.py, release.student_copy, report.feedback_text, grade.grade):

  collect.py, roster.py     an LMS download (Canvas, Moodle, nbgrader's exchange) and its roster in
  export.py                 totals.csv and the LMS's gradebook import (Canvas CSV) out
  classreport.py            the class report (HTML) from stored results
  gradebook.py, formgrader.py, nbgrader_feedback.py   nbgrader's gradebook, formgrader and feedback
  gradescope.py             a Gradescope autograder bundle and its run_autograder entry point

"""
