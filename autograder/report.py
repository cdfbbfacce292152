"""Everything written from trusted results: grades.csv, feedback pages, Gradescope files, the
nbgrader gradebook; and `merge`, which combines the results of sharded runs."""
import csv
import html
import io
import json
import shutil
from pathlib import Path

from autograder.checks import LESSONS
from autograder.grade import RESULTS_SUBDIR, GradeError, _load, check_out_dir, lesson_tests, result_path, write_atomic

COLUMNS = ["student", "lesson", "test", "points", "max_points", "status", "message"]


def collect(out, students, lessons, tests):
    """One result per expected (student, lesson); a missing file becomes an error result."""
    results = []
    for student in students:
        for lesson in lessons:
            result = _load(result_path(out, student, lesson))
            if not result or [t["test"] for t in result.get("tests", [])] != [t for t, _ in tests[lesson]]:
                result = dict(student=student, lesson=lesson, notes=[], cells={}, tests=[
                    dict(test=t, points=0.0, max_points=p, status="error",
                         message="not graded: the run was interrupted; grade again with --resume")
                    for t, p in tests[lesson]])
            results.append(result)
    return results


def write_all(out, students, lessons, tests, gradescope=False, gradebook=None):
    out = Path(out)
    lessons = [lesson for lesson in LESSONS if lesson in lessons]
    results = collect(out, students, lessons, tests)
    write_csv(out / "grades.csv", results)
    # Failures of the grader itself (never of a student's code), for the instructor.
    errors = [f"== {r['student']} {r['lesson']}\n{tb}" for r in results for tb in r.get("grader_errors", [])]
    if errors:
        write_atomic(out / "grader-errors.log", "\n".join(errors))
    for r in results:
        write_atomic(out / "feedback" / r["student"] / f"{r['lesson']}.html", feedback_page(r))
    if gradescope:
        for student in students:
            mine = [r for r in results if r["student"] == student]
            write_atomic(out / "gradescope" / student / "results.json", json.dumps(gradescope_json(mine), indent=1))
    if gradebook:
        from autograder.gradebook import update_gradebook
        update_gradebook(gradebook, results, tests)
    return results


def write_csv(path, results):
    buf = io.StringIO()
    w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in results:
        for t in r["tests"]:
            w.writerow(dict(student=r["student"], lesson=r["lesson"], test=t["test"], points=f"{t['points']:g}",
                            max_points=f"{t['max_points']:g}", status=t["status"], message=t["message"]))
    write_atomic(path, buf.getvalue())


STYLE = """body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.5rem;text-align:left;
vertical-align:top}.passed{color:#1a7f37}.failed,.error{color:#cf222e}.missing{color:#9a6700}
.note{background:#fff8c5;padding:.5rem 1rem;border-radius:4px}code{background:#f6f8fa;padding:0 .2rem}"""


def feedback_page(r):
    """The student's page: each test, its points and its teaching message; never hidden code,
    hidden inputs or expected values (check messages are written not to contain them)."""
    e = html.escape
    got = sum(t["points"] for t in r["tests"])
    full = sum(t["max_points"] for t in r["tests"])
    rows = "".join(
        f"<tr><td><code>{e(t['test'])}</code></td><td class='{e(t['status'])}'>{e(t['status'])}</td>"
        f"<td>{t['points']:g} / {t['max_points']:g}</td><td>{e(t['message'])}</td></tr>" for t in r["tests"])
    notes = list(r.get("notes", []))
    cells = r.get("cells", {})
    notes += [f"{cell} was skipped: it {why}" for cell, why in cells.get("skipped", {}).items()]
    notes += [f"{cell} raised {err.get('type')}: {err.get('message', '')}" for cell, err in cells.get("errors", {}).items()]
    note_html = "".join(f"<p class='note'>{e(n)}</p>" for n in notes)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(r['lesson'])}: feedback for "
            f"{e(r['student'])}</title><style>{STYLE}</style></head><body><h1>{e(r['lesson'])}</h1>"
            f"<p>Feedback for <b>{e(r['student'])}</b>: <b>{got:g} / {full:g}</b> points.</p>{note_html}"
            f"<table><tr><th>test</th><th>status</th><th>points</th><th>what to look at</th></tr>{rows}</table>"
            "<p>The grader ran your notebook's code cells except tests and demonstrations, then checked each "
            "function on its own inputs.</p></body></html>\n")


def gradescope_json(results):
    tests = [dict(name=f"{r['lesson']}: {t['test']}", score=t["points"], max_score=t["max_points"],
                  status="passed" if t["status"] == "passed" else "failed", output=t["message"])
             for r in results for t in r["tests"]]
    return dict(score=sum(t["score"] for t in tests), tests=tests)


def merge(dirs, out, gradescope=False, gradebook=None):
    """Combine the results of several (sharded) runs into OUT, as one run would have written them."""
    out = check_out_dir(out)
    students, lessons = set(), set()
    for d in dirs:
        store = Path(d) / RESULTS_SUBDIR
        if not store.is_dir():
            raise GradeError(f"{d} holds no grading results (no {RESULTS_SUBDIR}/ folder)")
        for f in store.glob("*/*.json"):
            if Path(d).resolve() != out.resolve():
                dest = out / RESULTS_SUBDIR / f.parent.name / f.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest)
            students.add(f.stem)
            lessons.add(f.parent.name)
    unknown = lessons - set(LESSONS)
    if unknown:
        raise GradeError(f"results for unknown lessons: {', '.join(sorted(unknown))}")
    tests = {lesson: lesson_tests(lesson) for lesson in lessons}
    return write_all(out, sorted(students), lessons, tests, gradescope=gradescope, gradebook=gradebook)
