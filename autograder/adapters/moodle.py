"""Moodle's assignment download, as collect.py reads it: each upload is in a folder (or under a flat
name) `John Smith_<participant>_assignsubmission_file_/<file>`, and the grading worksheet (a CSV
with an Identifier column) gives each participant's email, name and submission time, in Moodle's
own time format and without a zone. The interface is canvas.py's (NAME, who, read).
"""

import re

NAME = re.compile(r"(?P<name>.+?)_(?P<pid>\d+)_assign(?:submission|feedback)_[a-z]+_(?P<file>.*)")
TIME_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %I:%M %p", "%d %B %Y, %H:%M")


def who(m):
    """[(kind, value)] the name says, strongest first: the participant number, then the full name."""
    return [("participant", m["pid"]), ("name", m["name"])]


def read(m, clues, last):
    """Set the participant number on clues (a collect.Clues) and, when the name is the file's own, its name."""
    clues.participant = m["pid"]
    if last:
        clues.file_name = m["file"]


def is_worksheet(header):
    """Whether a CSV's first row is a grading worksheet's."""
    return "identifier" in [h.strip().casefold() for h in header]


def read_worksheet(rows, parse_time):
    """{participant id: {email, name, time}} from a grading worksheet's rows; parse_time(text) reads its
    times (a datetime without a zone, or None)."""
    header = [h.strip().casefold() for h in rows[0]]
    col = {
        name: header.index(name)
        for name in ("identifier", "full name", "email address", "last modified (submission)")
        if name in header
    }
    out = {}
    for values in rows[1:]:
        get = lambda name: values[col[name]].strip() if name in col and col[name] < len(values) else ""  # noqa: E731
        m = re.search(r"(\d+)", get("identifier"))
        if m:
            out[m[1]] = {
                "email": get("email address"),
                "name": get("full name"),
                "time": parse_time(get("last modified (submission)")),
            }
    return out
