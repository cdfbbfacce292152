"""nbgrader configuration: the repository is an nbgrader course whose source directory is lessons/.

`nbgrader generate_assignment 01_attention`, `autograde`, `generate_feedback` and `export` work
as usual. Plain nbgrader runs the hidden tests inside the student's kernel, so it is not
tamper-proof: `python -m autograder grade` is the hardened path (see README).
"""

c = get_config()  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.course_id = "mha-course"
c.CourseDirectory.source_directory = "lessons"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

# The stub students see in every answer region.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Per-cell limit (nbgrader's timeout is per cell, not per notebook).
c.Execute.timeout = 120

# Feedback without the hidden tests: nbgrader's own shows their code and tracebacks.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "autograder.adapters.nbgrader_feedback.HideHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
