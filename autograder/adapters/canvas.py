"""Canvas's submission download, as collect.py reads it: each upload is named
`smithjohn[_late]_<user id>_<submission id>_<file>`, and a resubmission `<file>-1`, `<file>-2`
(on the upload's name: a notebook or a zip).

An LMS module gives collect.py the pattern of a name the LMS gives an upload (NAME, matched whole),
who that name says it is (who) and what else it says about the file (read).
"""
import os
import re

NAME = re.compile(r"(?P<name>[A-Za-z0-9-]+?)(?P<late>_late)?_(?P<uid>\d+)_(?P<sid>\d{3,})_(?P<file>.+)", re.I)
RESUBMISSION = re.compile(r"(?P<stem>.+)-(?P<n>\d+)")


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
