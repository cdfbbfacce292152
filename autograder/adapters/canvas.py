"""Canvas, both ways.

In: its submission download, as collect.py reads it: each upload is named
`smithjohn[_late]_<user id>_<submission id>_<file>`, and a resubmission `<file>-1`, `<file>-2`
(on the upload's name: a notebook or a zip). An LMS module gives collect.py the pattern of a name the LMS
gives an upload (NAME, matched whole), who that name says it is (who) and what else it says about the file (read).

Out: the gradebook import `export --format canvas` writes (gradebook_import). With --canvas-gradebook (a CSV
exported from Canvas's gradebook) the lesson columns of that file ("Name (assignment id)") are filled, so the
import updates the existing assignments; without it, Canvas's documented import layout: Student, ID, SIS User
ID, SIS Login ID, Section, then one new column per lesson, with a "Points Possible" row.
"""

import csv
import os
import re

from autograder.adapters.roster import squash
from autograder.results import UsageError, csv_text

NAME = re.compile(r"(?P<name>[A-Za-z0-9-]+?)(?P<late>_late)?_(?P<uid>\d+)_(?P<sid>\d{3,})_(?P<file>.+)", re.I)
RESUBMISSION = re.compile(r"(?P<stem>.+)-(?P<n>\d+)")
IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # how Canvas's own export writes that row
ASSIGNMENT = re.compile(r"(?P<name>.*\S)\s*\((?P<id>\d+)\)")  # a gradebook column: "Name (assignment id)"


class CanvasError(UsageError):
    """Bad input to the Canvas export: one line, exit status 2."""


def who(m):
    """[(kind, value)] the name says, strongest first: Canvas's user id, then the login-like name."""
    return [("lms_id", m["uid"]), ("name", m["name"])]


def read(m, clues, last):
    """Set what the name says on clues (a collect.Clues): late, the resubmission number and, when the
    name is the file's own (last), the name the student gave it."""
    clues.late = bool(m["late"])
    stem, suffix = os.path.splitext(m["file"])
    if r := RESUBMISSION.fullmatch(stem):
        stem, clues.version = r["stem"], (int(r["n"]), "")
    if last:
        clues.file_name = stem + suffix


def roster_for(roster, results):
    """{student: roster row}; CanvasError for none, a warning line for students it lacks."""
    if roster is None:
        raise CanvasError("--format canvas needs --roster (Canvas matches rows by its user ID, the roster's lms_id)")
    roster.require(("lms_id",), "Canvas's import matches rows by (its user ID)")
    rows = {r["student"]: r for r in roster.rows}
    missing = sorted({r.student for r in results} - set(rows))
    return rows, [f"not in the roster, left out: {', '.join(missing)}"] if missing else []


def canvas_value(s):
    return "" if s is None or s.points is None else round(s.points, 2)


def points_possible(scores, lessons):
    """{lesson: its maximum, as the scores count it (with the written questions when the rule counts them)}."""
    return {lsn: max((s.max_points for (_, l2), s in scores.items() if l2 == lsn), default=0) for lsn in lessons}


def canvas_new(students_rows, lessons, scores):
    """Canvas's documented import layout: identity columns, a new assignment per lesson."""
    rows = [dict({"Student": POINTS_POSSIBLE}, **points_possible(scores, lessons))]
    for student, r in sorted(students_rows.items(), key=lambda kv: kv[1]["name"] or kv[0]):
        row = {
            "Student": r["name"] or student,
            "ID": r["lms_id"],
            "SIS User ID": r["sis_user_id"] or student,
            "SIS Login ID": r["sis_login_id"],
            "Section": r["section"],
        }
        row.update({lsn: canvas_value(scores.get((student, lsn))) for lsn in lessons})
        rows.append(row)
    return csv_text(rows, IDENTITY + lessons)


def read_gradebook(path):
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CanvasError(f"cannot read the Canvas gradebook {path}: {e}") from None
    if not lines or not {"Student", "ID", "Section"} <= {h.strip() for h in lines[0]}:
        raise CanvasError(
            f"{path} is not a gradebook exported from Canvas (its first row must name Student, ID, "
            "SIS User ID, SIS Login ID, Section and the assignments)"
        )
    return [h.strip() for h in lines[0]], lines[1:]


def match_columns(header, lessons, assignments):
    """{lesson: gradebook column}: named with --assignment LESSON=NAME, or the one assignment column
    whose name holds the lesson's ("01_attention", "Lesson 1: ...")."""
    columns = [h for h in header if ASSIGNMENT.fullmatch(h)]
    out = {}
    for lesson in lessons:
        if lesson in assignments:
            want = assignments[lesson]
            found = [c for c in columns if c == want or ASSIGNMENT.fullmatch(c)["name"] == want]
        else:
            number = int(lesson[:2]) if lesson[:2].isdigit() else None
            keys = [squash(lesson)] + ([f"lesson{number}", f"lesson{number:02d}"] if number is not None else [])
            found = [
                c
                for c in columns
                if any(re.search(re.escape(k) + r"(?!\d)", squash(ASSIGNMENT.fullmatch(c)["name"])) for k in keys)
            ]
        if len(found) != 1:
            raise CanvasError(
                f"{'no' if not found else 'several'} Canvas assignment column(s) for {lesson}"
                f"{': ' + ', '.join(found) if found else ''}; name it with --assignment "
                f"{lesson}=NAME (columns: {', '.join(columns) or 'none'})"
            )
        out[lesson] = found[0]
    return out


def canvas_fill(path, students_rows, lessons, scores, assignments, allow_mismatch=False):
    """The exported gradebook's identity columns and its lesson columns, filled where we have a score;
    every other cell keeps Canvas's value (read-only columns are left out: Canvas ignores them). CanvasError when
    a column's Points Possible differs from its lesson's maximum here (a score out of 10 in a column worth 8),
    unless allow_mismatch."""
    header, lines = read_gradebook(path)
    columns = match_columns(header, lessons, assignments)
    full = points_possible(scores, lessons)
    for values in lines:
        row = dict(zip(header, values))
        if row.get("Student", "").strip() != "Points Possible":
            continue
        for lesson, column in columns.items():
            try:
                theirs = float(row.get(column, "").strip())
            except ValueError:
                continue  # Canvas left it empty: nothing to disagree with
            if abs(theirs - full[lesson]) > 1e-9 and not allow_mismatch:
                raise CanvasError(
                    f"the Canvas gradebook {path}: {column} has Points Possible {theirs:g}, but {lesson} "
                    f"is out of {full[lesson]:g} here: make them agree (in Canvas, or the rule's written "
                    "questions), or pass --allow-mismatch to fill it anyway"
                )
    keep = header[: header.index("Section") + 1] + list(columns.values())
    by_id = {}
    for student, r in students_rows.items():
        for key in ("lms_id", "sis_user_id", "sis_login_id"):
            if r[key]:
                by_id[(key, r[key])] = student
        by_id.setdefault(("sis_user_id", student), student)
    out, seen, warnings = [], set(), []
    for values in lines:
        row = dict(zip(header, values))
        ident = row.get("Student", "").strip()
        if ident in ("Points Possible", "Student, Test"):
            out.append(row)
            continue
        student = (
            by_id.get(("lms_id", row.get("ID", "")))
            or by_id.get(("sis_user_id", row.get("SIS User ID", "")))
            or by_id.get(("sis_login_id", row.get("SIS Login ID", "")))
        )
        if student:
            seen.add(student)
            for lesson, column in columns.items():
                value = canvas_value(scores.get((student, lesson)))
                if value != "":
                    row[column] = value
        out.append(row)
    missing = sorted(s for s in {s for s, _ in scores} & set(students_rows) if s not in seen)
    if missing:
        warnings.append(f"in the roster but not in the Canvas gradebook, left out: {', '.join(missing)}")
    return csv_text(out, keep), warnings


def gradebook_import(roster, results, lessons, scores, gradebook=None, assignments=None, allow_mismatch=False):
    """(CSV text, warnings) for Canvas's gradebook import of scores {(student, lesson): export.Score}: the
    exported gradebook's columns filled (gradebook, a path) or Canvas's documented layout."""
    students_rows, warnings = roster_for(roster, results)
    if gradebook:
        text, more = canvas_fill(gradebook, students_rows, lessons, scores, assignments or {}, allow_mismatch)
        return text, warnings + more
    return canvas_new(students_rows, lessons, scores), warnings
