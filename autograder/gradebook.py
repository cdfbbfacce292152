"""The nbgrader gradebook, filled from trusted results, so that `nbgrader export` and the
formgrader show the scores the grader decided. Student code never touches it."""
import os
import shutil
import sys
from pathlib import Path


def update_gradebook(db_path, results, tests):
    """Create the lessons' structure (assignment, notebook, grade cells) and set every auto_score."""
    from nbgrader.api import Gradebook, MissingEntry

    if not shutil.which("alembic"):  # nbgrader runs `alembic`; it sits next to this Python
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with Gradebook(f"sqlite:///{Path(db_path).resolve()}") as gb:
        for lesson, cells in tests.items():
            gb.update_or_create_assignment(lesson)
            gb.update_or_create_notebook(lesson, lesson)
            for test, points in cells:
                gb.update_or_create_grade_cell(test, lesson, lesson, max_score=points, cell_type="code")
        for r in results:
            if all(t["status"] == "missing" for t in r["tests"]):
                continue
            student, lesson = r["student"], r["lesson"]
            gb.update_or_create_student(student)
            try:
                gb.find_submission(lesson, student)
            except MissingEntry:
                gb.add_submission(lesson, student)
            for t in r["tests"]:
                try:
                    grade = gb.find_grade(t["test"], lesson, lesson, student)
                except MissingEntry:  # a grade cell added after this submission: rebuild it
                    gb.remove_submission(lesson, student)
                    gb.add_submission(lesson, student)
                    grade = gb.find_grade(t["test"], lesson, lesson, student)
                grade.auto_score = t["points"]
                grade.needs_manual_grade = False
            gb.db.commit()
