"""The class roster: a CSV an instructor keeps, read by `collect` (to name students) and `export`
(to fill an LMS's identity columns).

Columns (header names, any case; extra columns are ignored):
  student       the student's id: their folder under SUBMISSIONS and RESULTS (required)
  name          full name, e.g. "Smith, John" or "John Smith"
  email
  lms_id        the LMS's user id (Canvas's "ID", the number in Canvas download names)
  sis_user_id, sis_login_id, section   optional, copied into Canvas's columns as they are
"""

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder.results import STORE, UsageError, write_atomic

COLUMNS = ("student", "name", "email", "lms_id", "sis_user_id", "sis_login_id", "section")
ALIASES = {
    "student_id": "student",
    "id": "student",
    "full name": "name",
    "email address": "email",
    "canvas_id": "lms_id",
    "moodle_id": "lms_id",
    "user_id": "lms_id",
}
# A student id becomes a folder name: no separators, no leading dot, nothing a shell or a URL mangles.
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")


STORED = "roster.csv"  # collect keeps the roster it used in SUBMISSIONS under this name


def stored_roster(submissions):
    """The roster collect kept in the SUBMISSIONS folder, or None where there is none."""
    path = Path(submissions) / STORED if submissions else None
    return load_roster(path) if path and path.is_file() else None


def remember_roster(out, roster):
    """Keep in RESULTS (out) a copy of the roster its totals.csv is now written with (kept_roster)."""
    columns = [c for c in COLUMNS if c in roster.columns]
    text = io.StringIO()
    csv.writer(text).writerows([columns] + [[row[c] for c in columns] for row in roster.rows])
    write_atomic(Path(out) / STORE / STORED, text.getvalue())


def kept_roster(out):
    """The roster RESULTS (out) last wrote its totals.csv with (remember_roster), or None: a later export or
    report given no roster (nor a SUBMISSIONS that holds one) still counts every student of the class."""
    path = Path(out) / STORE / STORED
    return load_roster(path) if path.is_file() else None


class RosterError(UsageError):
    """A roster that cannot be used: unreadable, no student column, a duplicate id."""


def squash(text):
    """A name or id compared loosely: lower case, letters and digits only ("Smith, John" -> "smithjohn")."""
    return re.sub(r"[\W_]+", "", str(text).casefold())


def name_keys(name):
    """Every squashed order of a name: "John Smith" and "Smith, John" both give smithjohn and johnsmith
    (Canvas writes the sortable name, last name first; Moodle writes first name first)."""
    if "," in name:
        last, _, first = name.partition(",")
        words = first.split() + last.split()
    else:
        words = name.split()
    keys = {squash(name)}
    if len(words) > 1:
        keys |= {squash("".join(words)), squash("".join(words[-1:] + words[:-1]))}
    return keys - {""}


@dataclass
class Roster:
    rows: list = field(default_factory=list)  # dicts with every key of COLUMNS (missing ones are "")
    columns: frozenset = frozenset(COLUMNS)  # the columns of COLUMNS its header has
    path: str = ""

    def require(self, columns, why):
        """RosterError (a one-line error, exit 2) when the roster has none of `columns`; why says who needs them."""
        if not self.columns & set(columns):
            raise RosterError(
                f"the roster {self.path} has no {' or '.join(map(repr, columns))} column, which {why} "
                f"(its columns: {', '.join(c for c in COLUMNS if c in self.columns)})"
            )

    def by(self, column, value):
        """Rows whose `column` equals value (ids compared exactly, names and emails loosely)."""
        if not value:
            return []
        if column == "name":
            keys = name_keys(value)
            return [r for r in self.rows if r["name"] and keys & name_keys(r["name"])]
        if column == "email":
            return [r for r in self.rows if r["email"] and r["email"].casefold() == value.casefold()]
        return [r for r in self.rows if r[column] == value]

    def get(self, student):
        return next((r for r in self.rows if r["student"] == student), None)


def load_roster(path):
    """The roster at path; RosterError names the line and the problem."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            lines = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise RosterError(f"cannot read the roster {path}: {e}") from None
    if not header:
        raise RosterError(f"the roster {path} is empty (expected a header with at least a 'student' column)")
    names = [ALIASES.get(h.strip().casefold(), h.strip().casefold()) for h in header]
    if "student" not in names:
        raise RosterError(f"the roster {path} has no 'student' column (its columns: {', '.join(header)})")
    roster = Roster(columns=frozenset(names) & set(COLUMNS), path=str(path))
    seen = {c: {} for c in ("student", "lms_id", "email")}
    for number, values in enumerate(lines, 2):
        if not any(v.strip() for v in values):
            continue
        row = dict.fromkeys(COLUMNS, "")
        row.update({n: v.strip() for n, v in zip(names, values) if n in COLUMNS})
        if not SAFE_ID.fullmatch(row["student"]):
            raise RosterError(
                f"the roster {path}, line {number}: student id {row['student']!r} cannot name a folder "
                "(letters, digits and . _ @ + - only)"
            )
        for column, ids in seen.items():
            # Folders that differ only in case collide on some file systems: compare student ids without case.
            key = row[column] if column == "lms_id" else row[column].casefold()
            if key and key in ids:
                raise RosterError(
                    f"the roster {path}, line {number}: duplicate {column} {row[column]!r} (also on line {ids[key]})"
                )
            ids[key] = number
        roster.rows.append(row)
    if not roster.rows:
        raise RosterError(f"the roster {path} lists no students")
    return roster
