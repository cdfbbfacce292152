"""nbgrader's exchange, as collect.py reads it: `inbound/<student>+<lesson>+<timestamp>[+<random>]/`
(what students submitted) and a course's `submitted/<student>/<lesson>/`, each with nbgrader's
timestamp.txt ("2024-10-01 12:00:00.123456 UTC"). The interface is canvas.py's (NAME, who, read).
"""

import re

NAME = re.compile(r"(?P<student>[^+]+)\+(?P<lesson>[^+]+)\+(?P<time>[^+]+)(?:\+[^+]*)?")
FOLDERS = ("inbound", "submitted")  # exchange/<course>/inbound/<entry>, <course>/submitted/<student>
SUBMITTED = "submitted"


def who(m):
    """[(kind, value)] the entry's name says: the student's id."""
    return [("id", m["student"])]


def read(m, clues, last):
    """Set the entry's lesson and its time (which orders resubmissions) on clues (a collect.Clues)."""
    clues.folder_lesson, clues.version = m["lesson"], (0, m["time"])


def iso_time(text):
    """nbgrader's timestamp as ISO 8601 (its zone, UTC, written as an offset); other text as it is."""
    return text[:-4] + "+00:00" if text.endswith(" UTC") else text
