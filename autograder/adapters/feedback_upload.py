"""Feedback back to the LMS: per lesson, the zip Canvas's "Re-upload submissions" or Moodle's "Upload
multiple feedback files in a zip" takes, with each student's feedback page (RESULTS/feedback/<student>/
<lesson>.html, written by grade) under the name of the upload collect stored for them (collection.csv's
`file` column), so the LMS attaches it to that student's submission.

- Canvas reads a re-uploaded file's base name, split on "_": its first two all-digit parts are the user id
  and the id of an attachment of that user's submission (the download's `smithjohn[_late]_<user id>_<id>_
  <file>`), and adds the file to the submission as a comment. The page keeps the download's prefix:
  `smithjohn_101_9001_01_attention_feedback.html`.
- Moodle reads `Full Name_<participant>_assignsubmission_file_/<file>` (or the same prefix on a flat
  name) and imports each file that the submission does not hold as a feedback file:
  `Alice Liddell_501_assignsubmission_file_/01_attention_feedback.html`.
"""

import zipfile
from pathlib import Path

from autograder.adapters import canvas, moodle
from autograder.adapters.collect import LOG_FILE
from autograder.adapters.roster import stored_roster
from autograder.results import UsageError, read_csv

FORMATS = {"canvas": canvas, "moodle": moodle}


def upload_name(kind, file):
    """The name the LMS of kind takes for the feedback page of the upload stored as file (collection.csv's
    `file`: the path inside the download, '/'-separated), less the '<lesson>_feedback.html' it ends with;
    None when no part of the path is named the way that LMS names an upload."""
    for part in reversed(file.split("/")):
        if m := FORMATS[kind].NAME.fullmatch(part):
            return part + "/" if kind == "moodle" and not m["file"] else part[: m.start("file")]
    return None


def feedback_upload(results, submissions, kind, out, lessons=None):
    """Write OUT/<lesson>_feedback_<kind>.zip for each lesson collected (or only lessons) and return
    ([zip paths], [lines]): each line names a student left out of a zip (no feedback page, or an upload
    this LMS did not name, or, with the roster collect kept, a roster student who handed nothing in), never a
    stop. UsageError (one line, exit 2) without a collection.csv, or when no student's page could be written."""
    if kind not in FORMATS:
        raise UsageError(f"--format {kind}: the feedback upload is for canvas or moodle")
    log = Path(submissions) / LOG_FILE
    if not log.is_file():
        raise UsageError(f"{submissions} has no {LOG_FILE}: collect the LMS download into it first")
    latest = {}  # (lesson, student) -> the file collected last (later downloads are later rows)
    for row in read_csv(log):
        if row["action"] == "collected" and row["student"] and (not lessons or row["lesson"] in lessons):
            latest[row["lesson"], row["student"]] = row["file"]
    zips, lines, pages = {}, [], {}
    # A lesson none of whose uploads this LMS named came from another LMS: one line, not one per student.
    other = sorted({lsn for lsn, _ in latest} - {lsn for (lsn, _), f in latest.items() if upload_name(kind, f)})
    if other and len(other) < len({lsn for lsn, _ in latest}):
        lines.append(
            f"{', '.join(other)}: collected from no {kind.capitalize()} download, so no zip (give their "
            "LMS's --format, with --lesson)"
        )
        latest = {k: f for k, f in latest.items() if k[0] not in other}
    for (lesson, student), file in sorted(latest.items()):
        page = Path(results) / "feedback" / student / f"{lesson}.html"
        name = upload_name(kind, file)
        if not page.is_file():
            lines.append(f"{student}: no feedback page for {lesson} in {results} (not graded?); left out")
        elif name is None:
            lines.append(
                f"{student}: {lesson} was collected from {file}, which {kind.capitalize()} did not name; left out"
            )
        else:
            pages.setdefault(lesson, []).append((f"{name}{lesson}_feedback.html", page))
    if not pages:  # every student left out: one line naming why, never an exit 0 with nothing to upload
        raise UsageError(_nothing_written(kind, latest, lines, lessons))
    roster = stored_roster(submissions)
    for lesson in sorted({lsn for lsn, _ in latest}):
        absent = [r["student"] for r in roster.rows if (lesson, r["student"]) not in latest] if roster else []
        if absent:
            lines.append(f"{lesson}: never handed in, so no upload to attach feedback to: {', '.join(absent)}")
    Path(out).mkdir(parents=True, exist_ok=True)
    for lesson, files in pages.items():
        path = Path(out) / f"{lesson}_feedback_{kind}.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, page in files:
                z.write(page, name)
        zips[lesson] = path
    return list(zips.values()), lines


def _nothing_written(kind, latest, lines, lessons):
    """The one line that says why feedback_upload could write no page at all."""
    if not latest:
        return (
            f"no upload was collected{' for ' + ', '.join(lessons) if lessons else ''}: nothing to attach feedback to"
        )
    unnamed = [file for (lesson, student), file in latest.items() if upload_name(kind, file) is None]
    if len(unnamed) == len(latest):
        other = [k for k in FORMATS if k != kind and all(upload_name(k, f) for f in unnamed)]
        n = len(unnamed)
        which = f"none of the {n} uploads collected was" if n > 1 else "the upload collected is not"
        return (
            f"{which} named the way {kind.capitalize()} names one"
            + (
                f" (a {other[0].capitalize()} download: give --format {other[0]})"
                if other
                else " (collected from a plain folder?)"
            )
            + ": nothing written"
        )
    return f"no feedback page could be written ({lines[0]}; and {len(lines) - 1} more): nothing written"
