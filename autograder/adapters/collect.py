"""python -m autograder collect DOWNLOAD --out SUBMISSIONS: an LMS download (a folder or a zip) into
SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb, every anomaly reported, nothing guessed silently.

It reads, in folders and zips (and zips students uploaded, one level down), what each LMS names an upload
(one small module each: canvas.py, moodle.py, exchange.py for nbgrader's exchange, read in that order), and
plain `<student>/<lesson>/<file>`, `<student>/<file>`, `<student>_<lesson>.ipynb`; this module files them.
A notebook's lesson is the one whose answer cells (nbgrader grade_ids) it holds; its name and folder are
used when it has lost that metadata, and any disagreement is reported.

Submission times come only from real sources: nbgrader's timestamp.txt, a Moodle grading worksheet
(in the download or given with --times) and --times CSVs (student, lesson, submitted_at). A file's
modification time is when it was downloaded, so it is never used. A time without a zone (Moodle's) is
read in --timezone (UTC unless given). Each goes to SUBMISSIONS/<student>/<lesson>/timestamp.txt
(results.write_timestamp: nbgrader's name), and every file looked at, collected or not, with what was
done with it, to SUBMISSIONS/collection.csv. A stored time is kept when a student is collected again,
unless the new download brings a newer real one ("time kept" or "time replaced" says which, and what).

Archives are read in memory, never unpacked: a member whose path leaves the archive, a symbolic link
or a size out of proportion (a zip bomb) refuses the download (or, inside a student's own zip, that zip).
"""

import csv
import hashlib
import io
import os
import re
import stat
import sys
import zipfile
import zlib
from collections import defaultdict
from dataclasses import InitVar, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from autograder import notebook as nbk
from autograder.adapters import canvas, exchange, moodle
from autograder.adapters.roster import SAFE_ID, STORED
from autograder.results import UsageError, csv_text, read_csv, read_timestamp, write_atomic, write_timestamp

MAX_FILE_BYTES = 256 * 2**20  # one archive member: far above any notebook, far below a machine's memory
MAX_ARCHIVE_BYTES = 4 * 2**30  # everything one archive says it unpacks to
MAX_RATIO = 200  # unpacked/packed size of a member above 1 MiB: notebooks pack ~5-10x
LOG_FILE = "collection.csv"
LOG_COLUMNS = ["download", "file", "student", "lesson", "action", "anomaly", "detail", "submitted_at", "time_source"]

# The LMS modules, in the order a name is tried: the tail of a Canvas or Moodle name is the file name the
# student chose, which must never make it another LMS's name (Canvas's prefix fits no other).
LMS = (canvas, moodle, exchange)
JUNK_NAMES = {".ds_store", "thumbs.db", "desktop.ini"}


class CollectError(UsageError):
    """A download that must not be used as it is: not a zip, an unsafe archive, a bad --times file."""


def parse_time(text):
    """A datetime from ISO 8601, nbgrader's timestamp ("2024-10-01 12:00:00.123456 UTC") or Moodle's
    worksheet ("Tuesday, 1 October 2024, 11:59 PM"); None when it is none of them."""
    text = exchange.iso_time(str(text).strip())
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    for form in moodle.TIME_FORMATS:
        try:
            return datetime.strptime(text, form)
        except ValueError:
            pass
    return None


# ---------------------------------------------------------------------------------------------
# Walking a download: files with their logical path (archive names included), and anomalies
# ---------------------------------------------------------------------------------------------


@dataclass
class File:
    parts: tuple  # path from DOWNLOAD's root; an archive's name is a folder of its members
    data: bytes | None  # read for notebooks, timestamp.txt and CSVs only

    @property
    def shown(self):
        return "/".join(self.parts)


@dataclass
class Row:
    """One line of collection.csv: a file, what was done with it, and its anomalies."""

    file: str
    action: str  # collected, ignored, not collected
    anomaly: InitVar[str] = ""
    detail: InitVar[str] = ""
    student: str = ""
    lesson: str = ""
    notes: list = field(default_factory=list)  # (anomaly, detail)
    submitted_at: str = ""
    time_source: str = ""

    def __post_init__(self, anomaly, detail):
        if anomaly or detail:
            self.add(anomaly, detail)

    def add(self, anomaly, detail):
        self.notes.append((anomaly, detail))

    def csv(self, download):
        return dict(
            download=str(download),
            file=self.file,
            student=self.student,
            lesson=self.lesson,
            action=self.action,
            anomaly="; ".join(a for a, _ in self.notes if a),
            detail="; ".join(d for _, d in self.notes if d),
            submitted_at=self.submitted_at,
            time_source=self.time_source,
        )


def wanted(name):
    return name.lower().endswith((".ipynb", ".csv")) or name.lower() == "timestamp.txt"


def junk(parts):
    """(anomaly, detail) for files that are never submissions, else None."""
    if "__MACOSX" in parts or parts[-1].startswith("._"):
        return "__MACOSX", "macOS metadata, not a submission"
    if ".ipynb_checkpoints" in parts:
        return "checkpoint", "Jupyter's autosave copy (.ipynb_checkpoints), not the submission"
    if parts[-1].lower() in JUNK_NAMES or any(p.startswith(".") for p in parts):
        return "hidden file", "a hidden or system file"
    return None


def owned_by_student(parts):
    """Whether an archive at parts is a student's upload (an LMS names it after them)."""
    return any(map(lms_entry, parts))


def walk(download):
    """Every File and anomaly Row of DOWNLOAD (a folder or a zip), in a stable order."""
    root = Path(download)
    if root.is_file():
        yield from walk_zip(root, (root.name,), student=False)
        return
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel = here.relative_to(root).parts
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                dirnames.remove(name)
                yield Row("/".join(rel + (name,)), "ignored", "symlink", "a symbolic link: not followed")
        dirnames.sort()
        for name in sorted(filenames):
            path, parts = here / name, rel + (name,)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                yield Row("/".join(parts), "ignored", "symlink", "a symbolic link: not followed")
            elif junk(parts):
                yield Row("/".join(parts), "ignored", *junk(parts))
            elif not stat.S_ISREG(mode):
                yield Row("/".join(parts), "ignored", "not a file", "a FIFO, socket or device")
            elif name.lower().endswith(".zip"):
                yield from walk_zip(path, parts, student=owned_by_student(parts))
            elif not wanted(name):
                yield File(parts, None)
            else:
                try:  # a regular file of a sane size, opened without following links
                    yield File(parts, nbk.read_submitted_bytes(path))
                except nbk.NotebookError as e:
                    yield Row("/".join(parts), "not collected", "refused", str(e))


def unsafe_member(info):
    """Why an archive member must not be read, or None."""
    name = info.filename.replace("\\", "/")
    if name.startswith("/") or re.match(r"[A-Za-z]:", name) or ".." in name.split("/"):
        return f"its entry {info.filename!r} escapes the output folder"
    if stat.S_ISLNK(info.external_attr >> 16):
        return f"its entry {info.filename!r} is a symbolic link"
    if info.file_size > MAX_FILE_BYTES or (
        info.file_size > 2**20 and info.file_size > MAX_RATIO * max(info.compress_size, 1)
    ):
        return f"its entry {info.filename!r} unpacks to {info.file_size} bytes from {info.compress_size} (a zip bomb?)"
    return None


def walk_zip(source, parts, student, depth=0):
    """The members of one archive. An unsafe archive raises CollectError, or, when it is a student's
    upload, becomes one anomaly; a student's archive inside it is opened, deeper ones are not."""
    shown = "/".join(parts)

    def refuse(why):
        if student:
            return [Row(shown, "not collected", "unsafe archive", f"the archive was not opened: {why}")]
        raise CollectError(f"{shown}: {why}; nothing was collected")

    try:
        archive = zipfile.ZipFile(source if isinstance(source, Path) else io.BytesIO(source))
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        yield from refuse(f"not a zip archive ({e})")
        return
    with archive:
        infos = archive.infolist()
        problem = next(filter(None, map(unsafe_member, infos)), None)
        if problem is None and sum(i.file_size for i in infos) > MAX_ARCHIVE_BYTES:
            problem = f"it unpacks to {sum(i.file_size for i in infos)} bytes (a zip bomb?)"
        if problem:
            yield from refuse(problem)
            return
        for info in sorted(infos, key=lambda i: i.filename):
            inner = parts + tuple(p for p in info.filename.replace("\\", "/").split("/") if p not in ("", "."))
            if info.is_dir() or len(inner) == len(parts):
                continue
            if junk(inner):
                yield Row("/".join(inner), "ignored", *junk(inner))
                continue
            is_zip = inner[-1].lower().endswith(".zip")
            if not (wanted(inner[-1]) or is_zip):
                yield File(inner, None)
                continue
            try:
                data = archive.read(info)
            except (zipfile.BadZipFile, RuntimeError, OSError, EOFError, zlib.error, NotImplementedError) as e:
                yield Row("/".join(inner), "not collected", "unreadable", f"could not be read from the archive: {e}")
                continue
            if not is_zip:
                yield File(inner, data)
            elif depth == 0:
                yield from walk_zip(data, inner, student=student or owned_by_student(inner), depth=1)
            else:
                yield Row(
                    "/".join(inner),
                    "not collected",
                    "archive in archive",
                    "an archive inside an archive inside the download: not opened",
                )


# ---------------------------------------------------------------------------------------------
# Who and which lesson a file is
# ---------------------------------------------------------------------------------------------


def lms_entry(name):
    """(LMS module, match) when `name` is one an LMS gives a student's upload (a Canvas or a Moodle name, an
    nbgrader exchange entry, tried in LMS's order); else None."""
    for lms in LMS:
        if m := lms.NAME.fullmatch(name):
            return lms, m
    return None


def is_archive(name):
    return name.lower().endswith(".zip")


class Layout:
    """Where each file's student is named in a download: the outermost name the LMS gave an upload (a Canvas
    or Moodle name, an nbgrader exchange entry, `submitted/<student>`) or, in plain folders, the first level
    of folders that holds a student's work. Everything below that name is the student's own upload: its
    folder and file names, archives and notebooks never name a student or order resubmissions.

    paths: every file's parts (archive names are folders of their members). A level of plain folders holds
    students when one of them holds a notebook, an archive or a lesson folder itself, or (with a roster) is
    named like a roster student; otherwise its folders are containers (`course/`, a zipped download folder).
    """

    def __init__(self, paths, lessons, known=lambda name: False):
        self.lessons, self.known = lessons, known
        self.children = defaultdict(set)  # folder parts -> {(name, is a file)}
        for parts in paths:
            for i in range(len(parts)):
                self.children[parts[:i]].add((parts[i], i == len(parts) - 1))
        self.levels = {}

    def plain(self, name):
        return not (lms_entry(name) or name in exchange.FOLDERS or is_archive(name) or self.is_lesson(name))

    def is_lesson(self, name):
        return match_lesson(name, self.lessons, loose=False)[0] is not None

    def holds_work(self, folder):
        return any(
            is_file and name.lower().endswith(".ipynb") or is_archive(name) or (not is_file and self.is_lesson(name))
            for name, is_file in self.children[folder]
        )

    def holds_students(self, folder):
        if folder not in self.levels:
            self.levels[folder] = any(
                not is_file and self.plain(name) and (self.holds_work(folder + (name,)) or self.known(name))
                for name, is_file in self.children[folder]
            )
        return self.levels[folder]

    def owner(self, parts):
        """The index in parts of the name that says whose the file is, or None (a file no upload holds)."""
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            if lms_entry(name):
                return i
            if last:
                return None
            if name == exchange.SUBMITTED:
                return i + 1 if i + 2 < len(parts) else None
            if self.plain(name) and self.holds_students(parts[:i]):
                return i
        return None


@dataclass
class Clues:
    """What a file's path says: who (strongest first), which lesson, and its version."""

    who: list = field(default_factory=list)  # (kind, value): lms_id, participant, id, name
    folder_lesson: str | None = None
    file_name: str = ""  # the name the student gave the file
    folder: tuple = ()  # the upload's folder (where nbgrader's timestamp.txt lies)
    version: tuple = (0, "")  # (Canvas resubmission number, nbgrader timestamp)
    late: bool = False
    participant: str | None = None
    owner: int | None = None  # the index of the part that names the student (Layout.owner)


def entry_who(name):
    """(LMS module, who, match) of a name where an upload is named: what the LMS says, or (None, ...) what a
    plain folder says."""
    found = lms_entry(name)
    if found is None:
        return None, [("id", name)], None
    lms, m = found
    return lms, lms.who(m), m


def flat_who(file_name, lessons):
    """(who, the file's own name) of a flat `<student>_<lesson>.ipynb`; ([], file_name) when it names no one."""
    stem = Path(file_name).stem
    lesson, _ = match_lesson(stem, lessons)
    prefix = stem[: stem.casefold().find(lesson.casefold())].strip("_- .") if lesson else ""
    if not prefix:
        return [], file_name
    return [("id", prefix), ("name", prefix)], stem[len(prefix) :].strip("_- .") + ".ipynb"


def read_clues(parts, lessons, layout=None):
    """The Clues of the file at parts; layout is the download's (a Layout of this one path when None)."""
    layout = layout or Layout([parts], lessons)
    c = Clues(file_name=parts[-1])
    folders = [p for p in parts[:-1] if not is_archive(p)]
    if folders and layout.is_lesson(folders[-1]):
        c.folder_lesson = folders[-1]
    c.owner = i = layout.owner(parts)
    if i is None:
        c.who, c.file_name = flat_who(parts[-1], lessons)
        return c
    lms, c.who, m = entry_who(parts[i])
    c.folder = parts[: i + 1]
    if lms:
        lms.read(m, c, last=i == len(parts) - 1)
    return c


def names_inside(parts, clues, lessons, roster):
    """[(name, who)] for each name inside an upload that looks like a student's: an LMS name, nbgrader's
    `submitted/<student>`, and (with a roster, which says what a student id looks like) any folder or a
    flat `<student>_<lesson>.ipynb`. They choose no one; a conflict with the uploader is reported."""
    if clues.owner is None:
        return []
    out = []
    for j in range(clues.owner + 1, len(parts)):
        name, last = parts[j], j == len(parts) - 1
        lms, who, _ = entry_who(name)
        if lms is None:
            if j > clues.owner + 1 and parts[j - 1] == exchange.SUBMITTED and not last:
                who = [("id", name)]
            elif roster is None or is_archive(name) or match_lesson(name, lessons, loose=False)[0]:
                continue
            elif last:
                who = flat_who(name, lessons)[0]
        if who:
            out.append((name, who))
    return out


def match_lesson(text, lessons, loose=True):
    """(lesson, anomaly) that a file or folder name says: exact, in the wrong case, or (loose)
    within a longer name ("Copy of 01_attention (1)"); (None, None) when it names none."""
    text = Path(text).stem if text.lower().endswith(".ipynb") else text
    for lesson in lessons:
        if text == lesson:
            return lesson, None
    for lesson in lessons:
        if text.casefold() == lesson.casefold():
            return lesson, "wrong case"
    if loose:
        for lesson in lessons:
            if lesson.casefold() in text.casefold():
                return lesson, "renamed"
    return None, None


def slug(text):
    """A folder name for a student known only by the download's name for them."""
    text = re.sub(r"[^A-Za-z0-9._@+-]+", "_", text.strip()).strip("._-").lower()
    return text[:100] if text and SAFE_ID.fullmatch(text[:100]) else None


# The roster columns each kind of clue is matched against (Students.lookup).
CLUE_COLUMNS = {
    "lms_id": ("lms_id",),
    "name": ("name",),
    "participant": ("email", "lms_id"),
    "id": ("student", "lms_id", "email", "name"),
}


class Students:
    """Turns a file's clues into a student id, with the roster when there is one."""

    def __init__(self, roster, worksheet):
        self.roster, self.worksheet = roster, worksheet

    def resolve(self, who):
        """(student, anomaly, detail): anomaly is None, 'wrong case', 'unmatched' or 'ambiguous'."""
        if self.roster is None:
            kinds = dict(who)
            if kinds.get("id") and SAFE_ID.fullmatch(kinds["id"]):
                return kinds["id"], None, ""
            value = kinds.get("id") or kinds.get("name")
            student = slug(value) if value else None
            if student is None:
                return (
                    None,
                    "unmatched",
                    f"no usable student name in {value!r}" if value else "no student named by its path",
                )
            return student, None, ""
        for kind, value in who:
            rows, anomaly = self.lookup(kind, value)
            if len(rows) == 1:
                return rows[0]["student"], anomaly, f"{kind} {value!r} is {rows[0]['student']}" if anomaly else ""
            if len(rows) > 1:
                return (
                    None,
                    "ambiguous",
                    (f"{kind} {value!r} matches several roster students: " + ", ".join(r["student"] for r in rows)),
                )
        said = ", ".join(f"{k} {v!r}" for k, v in who)
        return None, "unmatched", f"no roster student has {said}" if said else "no student named by its path"

    def lookup(self, kind, value):
        r = self.roster
        if kind == "lms_id":
            return r.by("lms_id", value), None
        if kind == "name":
            return r.by("name", value), None
        if kind == "participant":
            sheet = self.worksheet.get(value, {})
            rows = r.by("email", sheet.get("email", "")) or r.by("lms_id", value)
            return rows, None
        rows = r.by("student", value)
        if rows:
            return rows, None
        rows = [row for row in r.rows if row["student"].casefold() == value.casefold()]
        if rows:
            return rows, "wrong case"
        return r.by("lms_id", value) or r.by("email", value) or r.by("name", value), None


# ---------------------------------------------------------------------------------------------
# Submission times
# ---------------------------------------------------------------------------------------------


def read_csv_rows(data, shown):
    try:
        text = data.decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text)))
    except (UnicodeDecodeError, csv.Error) as e:
        raise CollectError(f"cannot read {shown}: {e}") from None
    return rows


def first_line(data):
    try:
        return next(csv.reader(io.StringIO(data.decode("utf-8-sig"))), [])
    except (UnicodeDecodeError, csv.Error):
        return []


def read_times(rows, shown, default_lesson):
    """[(who, lesson, datetime)] from a --times CSV: student (or lms_id, email, name), lesson, submitted_at."""
    header = [h.strip().casefold() for h in rows[0]]
    who_col = next((c for c in ("student", "lms_id", "email", "name") if c in header), None)
    time_col = next((c for c in ("submitted_at", "submitted", "time") if c in header), None)
    if who_col is None or time_col is None:
        raise CollectError(
            f"{shown}: expected columns student (or lms_id, email, name) and submitted_at; found {', '.join(rows[0])}"
        )
    if "lesson" not in header and not default_lesson:
        raise CollectError(f"{shown} has no lesson column: add one, or give --lesson")
    out = []
    for number, values in enumerate(rows[1:], 2):
        row = dict(zip(header, (v.strip() for v in values)))
        if not any(row.values()):
            continue
        moment = parse_time(row.get(time_col, ""))
        if moment is None:
            raise CollectError(
                f"{shown}, line {number}: {row.get(time_col)!r} is not a time (use ISO 8601, "
                "e.g. 2025-10-01T23:59:00+00:00)"
            )
        out.append(
            (
                (who_col if who_col != "student" else "id", row.get(who_col, "")),
                row.get("lesson") or default_lesson,
                moment,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Collecting
# ---------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    file: File
    clues: Clues
    student: str
    lesson: str
    notes: list  # (anomaly, detail) that still let it be collected
    submitted: datetime | None = None


def collect(download, out, roster=None, lesson=None, times=(), zone="UTC", allow_mismatch=False, stream=None):
    """Collect DOWNLOAD into OUT; returns the collection.csv rows of this run. CollectError (before
    anything is written) for an unusable download or --times file, or a --times line whose lesson is not the
    course's or whose student is not on the roster (unless allow_mismatch: a typo would make a time vanish and a
    late submission count on time). Times without a zone are in `zone`."""
    download, out = Path(download), Path(out)
    try:
        zone = ZoneInfo(zone)
    except (ValueError, ZoneInfoNotFoundError):
        raise CollectError(f"unknown time zone {zone!r} (use a name like UTC or Europe/Berlin)") from None
    if not download.exists():
        raise CollectError(f"the download {download} does not exist")
    if out.exists() and not out.is_dir():
        raise CollectError(f"the output folder {out} exists and is not a folder")
    if download.is_dir() and out.resolve().is_relative_to(download.resolve()):
        raise CollectError(f"the output folder {out} is inside the download {download}: choose another")
    lessons = nbk.lesson_names()
    if lesson and lesson not in lessons:
        raise CollectError(f"unknown lesson {lesson!r}; lessons are {', '.join(lessons)}")
    answers = nbk.lesson_answers(tuple(lessons))

    items = list(walk(download))  # reads everything first: an unsafe archive stops us before any write
    rows = [i for i in items if isinstance(i, Row)]
    files = [i for i in items if isinstance(i, File)]
    worksheet, given_times, stamps = {}, [], {}
    for path in times:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise CollectError(f"cannot read the times file {path}: {e}") from None
        sheet = read_csv_rows(data, path)
        if not sheet:
            raise CollectError(f"the times file {path} is empty")
        if moodle.is_worksheet(sheet[0]):
            worksheet.update(moodle.read_worksheet(sheet, parse_time))
        else:
            given_times += [(who, lsn, t, Path(path).name) for who, lsn, t in read_times(sheet, path, lesson)]
    for (kind, value), lsn, _, source in given_times:
        unknown = (
            f"lesson {lsn!r}"
            if lsn not in lessons
            else f"{kind} {value!r}"
            if roster and not Students(roster, {}).resolve([(kind, value)])[0]
            else None
        )
        if unknown and not allow_mismatch:
            raise CollectError(
                f"the times file {source} names {unknown}, which "
                f"{'the course does not have' if lsn not in lessons else 'is not on the roster'} "
                "(a typo?): fix it, or pass --allow-mismatch to collect without that time"
            )
    known = (lambda name: bool(Students(roster, {}).lookup("id", name)[0])) if roster else (lambda name: False)
    layout = Layout([f.parts for f in files], lessons, known)
    notebooks = []
    for f in files:
        name, owner = f.parts[-1].lower(), layout.owner(f.parts)
        if name == "timestamp.txt" and not nbgrader_stamp(f.parts, owner):
            rows.append(
                Row(
                    f.shown,
                    "ignored",
                    "timestamp in an upload",
                    "a timestamp.txt inside a student's upload: not a submission time",
                )
            )
        elif name == "timestamp.txt":
            stamps[f.parts[:-1]] = parse_time(f.data.decode("utf-8", "replace"))
            rows.append(Row(f.shown, "ignored", "", "nbgrader's submission time"))
        elif name.endswith(".csv") and moodle.is_worksheet(first_line(f.data)) and owner is not None:
            rows.append(
                Row(
                    f.shown,
                    "not collected",
                    "worksheet in an upload",
                    "a grading worksheet inside a student's upload: not a source of submission times or of who is who",
                )
            )
        elif name.endswith(".csv") and moodle.is_worksheet(first_line(f.data)):
            worksheet.update(moodle.read_worksheet(read_csv_rows(f.data, f.shown), parse_time))
            rows.append(Row(f.shown, "ignored", "", "Moodle grading worksheet: submission times"))
        elif not name.endswith(".ipynb"):
            rows.append(Row(f.shown, "not collected", "not a notebook", "only .ipynb files are graded"))
        else:
            notebooks.append(f)

    students = Students(roster, worksheet)
    candidates = []
    for f in notebooks:
        c = read_clues(f.parts, lessons, layout)
        if roster and c.who:
            roster.require(
                sorted({col for kind, _ in c.who for col in CLUE_COLUMNS[kind]}),
                f"the download names its students by (as in {f.shown}): add the LMS's user ids",
            )
        row = Row(f.shown, "not collected")
        rows.append(row)
        if not f.data.strip():
            row.add("empty", "an empty file")
            continue
        if len(f.data) > nbk.MAX_NOTEBOOK_BYTES:
            row.add("too large", f"the notebook {nbk.TOO_BIG}")
            continue
        try:
            nb = nbk.parse_submission(f.data)
        except nbk.NotebookError as e:
            row.add("unreadable notebook", str(e)[:200])
            continue
        student, anomaly, detail = students.resolve(c.who)
        notes = [(anomaly, detail)] if anomaly else []
        if student is None:
            row.add(anomaly, detail)
            continue
        row.student = student
        others = sorted(
            {
                (name, other)
                for name, who in names_inside(f.parts, c, lessons, roster)
                if (other := students.resolve(who)[0]) not in (None, student)
            }
        )
        if others:
            notes.append(
                (
                    "names another student",
                    "; ".join(
                        f"inside {'/'.join(f.parts[: c.owner + 1])}, {name!r} looks like {other}'s"
                        for name, other in others
                    )
                    + f": the LMS says {student} uploaded it, so it is {student}'s",
                )
            )
        chosen, why = choose_lesson(c, nb, lesson, lessons, answers)
        if chosen is None:
            row.add(*why)
            continue
        row.lesson = chosen
        notes += why
        if c.late:
            notes.append(("late", "Canvas marked it late"))
        candidates.append((row, Candidate(f, c, student, chosen, notes)))

    chosen = pick(candidates)
    have_times = bool(stamps or worksheet or given_times)
    zoneless = defaultdict(int)  # source: how many of its times named no zone, so were read in `zone`
    for cand in chosen.values():
        moment, source = submission_time(cand, stamps, worksheet, given_times, students)
        row = next(r for r, c in candidates if c is cand)
        if moment:
            if not moment.tzinfo:
                zoneless[source] += 1
            cand.submitted = moment if moment.tzinfo else moment.replace(tzinfo=zone)
            row.submitted_at, row.time_source = cand.submitted.isoformat(), source
    write(out, chosen, rows, download, have_times, {lsn for _, lsn in chosen} | ({lesson} if lesson else set()))
    if roster:  # export and report read it from SUBMISSIONS when no --roster is given
        write_atomic(out / STORED, Path(roster.path).read_text(encoding="utf-8-sig"))
    report(rows, chosen, stream or sys.stdout, out, roster)
    if zoneless:  # a wrong zone moves every time, silently, and a later collect keeps an earlier time (keep_time)
        print(
            f"times without a zone ({', '.join(f'{n} from {s}' for s, n in sorted(zoneless.items()))}): read in "
            f"{zone.key}; if the LMS shows them in another zone, give --timezone (see the README)",
            file=stream or sys.stdout,
        )
    return rows


def choose_lesson(c, nb, lesson, lessons, answers):
    """(lesson, [(anomaly, detail)]) or (None, (anomaly, detail))."""
    named, naming = match_lesson(c.file_name, lessons)
    folder, folder_case = match_lesson(c.folder_lesson, lessons, loose=False) if c.folder_lesson else (None, None)
    inside = nbk.content_lesson(nb, answers)
    notes = []
    if naming:
        notes.append((naming, f"named {c.file_name!r}, not {named}.ipynb"))
    if folder_case:
        notes.append(("wrong case", f"in a folder {c.folder_lesson!r}, not {folder}"))
    said = {x for x in (named, folder, lesson) if x}
    if inside:
        result = inside
        if said and said != {inside}:
            notes.append(
                (
                    "wrong lesson",
                    f"its name or folder says {', '.join(sorted(said))}, but its answer cells "
                    f"are {inside}'s: collected as {inside}",
                )
            )
    elif len(said) == 1:
        result = said.pop()
    elif said:
        return None, (
            "wrong lesson",
            f"its name and folder disagree ({', '.join(sorted(said))}) and its "
            "answer cells have lost their nbgrader metadata",
        )
    else:
        return None, (
            "unknown lesson",
            f"{c.file_name!r} names no lesson and its cells have lost their nbgrader "
            "metadata: rename it to <lesson>.ipynb or give --lesson",
        )
    if lesson and result != lesson:
        return None, ("wrong lesson", f"a {result} notebook in a download collected for {lesson}")
    if not naming and c.file_name and c.file_name != f"{result}.ipynb":  # lesson1_final.ipynb, Moodle's my work.ipynb
        notes.append(("renamed", f"named {c.file_name!r}, not {result}.ipynb"))
    return result, notes


def pick(candidates):
    """{(student, lesson): Candidate}: the one submission per student and lesson, or none where it is
    not clear which; each row says what happened to its file."""
    groups = defaultdict(list)
    for row, cand in candidates:
        groups[(cand.student, cand.lesson)].append((row, cand))
    chosen = {}
    for key, group in groups.items():
        group.sort(key=lambda rc: rc[1].clues.version)
        top = group[-1][1].clues.version
        latest = [rc for rc in group if rc[1].clues.version == top]
        distinct = {hashlib.sha256(c.file.data).hexdigest() for _, c in latest}
        for row, cand in group:
            row.notes += cand.notes
        if len(distinct) > 1:
            for row, _ in group:
                row.add(
                    "two candidates",
                    f"{len(latest)} different notebooks for {key[1]}: "
                    + ", ".join(c.file.shown for _, c in latest)
                    + "; none collected, put the right one in place",
                )
            continue
        row, cand = latest[-1]
        row.action = "collected"
        chosen[key] = cand
        for other, oc in group:
            if other is row:
                continue
            if oc.clues.version != top:
                other.add("resubmission", f"an earlier submission: {cand.file.shown} is newer")
            else:
                other.add("duplicate", f"the same notebook as {cand.file.shown}")
        if top != group[0][1].clues.version:
            row.add("resubmission", f"the latest of {len(group)} submissions")
    return chosen


def nbgrader_stamp(parts, owner):
    """Whether a timestamp.txt at parts is nbgrader's: at the top of an exchange entry, or in a plain (or
    `submitted/`) student folder or its lesson folder, outside archives. Canvas and Moodle write none, and
    one a student put in an upload is theirs."""
    if owner is None:
        return True
    lms = entry_who(parts[owner])[0]
    if lms is exchange:
        return len(parts) == owner + 2
    return lms is None and len(parts) <= owner + 3 and not any(map(is_archive, parts[owner:-1]))


def submission_time(cand, stamps, worksheet, given_times, students):
    """(datetime, source) from the first real source that has one, or (None, "")."""
    for who, lsn, moment, source in given_times:
        if lsn == cand.lesson and students.resolve([who])[0] == cand.student:
            return moment, source
    for folder in (cand.file.parts[:-1], cand.clues.folder):
        if stamps.get(folder):
            return stamps[folder], "nbgrader timestamp.txt"
    sheet = worksheet.get(cand.clues.participant or "", {})
    if sheet.get("time"):
        return sheet["time"], "Moodle grading worksheet"
    return None, ""


def write(out, chosen, rows, download, have_times, lessons):
    """The notebooks, their timestamp.txt and collection.csv. Cumulative: other lessons' and other
    downloads' lines are kept (merged_log), and so is a stored submission time (keep_time). have_times: the
    download came with time sources, so a submission they do not list and that has no stored time is an
    anomaly. lessons: those this run collects (the --lesson, and every lesson it filed)."""
    out.mkdir(parents=True, exist_ok=True)
    by_file = {r.file: r for r in rows}
    for (student, lesson), cand in sorted(chosen.items()):
        dest, row = out / student / lesson / f"{lesson}.ipynb", by_file[cand.file.shown]
        changed = not dest.is_file() or dest.read_bytes() != cand.file.data
        if changed and dest.is_file():
            row.add("replaced", f"replaced the copy collected before in {dest.parent}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(cand.file.data)
        if keep_time(dest.parent, cand.submitted, row, changed, have_times):
            write_timestamp(dest.parent, cand.submitted)
    log = out / LOG_FILE
    old = read_csv(log) if log.is_file() else []
    write_atomic(log, csv_text(merged_log(old, [r.csv(download) for r in rows], str(download), lessons), LOG_COLUMNS))


def merged_log(old, new, download, lessons):
    """collection.csv's rows after this run: the earlier ones of other downloads, then this run's (new), which
    replace the earlier ones of the same download, but for an upload an earlier run filed under a lesson this run
    does not collect: that one stays collected. Canvas names every assignment's download submissions.zip, so one
    path may hold each lesson's in turn, and a download is collected again with another --lesson to file a
    notebook uploaded to the wrong assignment; feedback-upload finds an upload only by its collected row."""
    earlier = {
        r["file"]: r
        for r in old
        if r.get("download") == download and r["action"] == "collected" and r["lesson"] not in lessons
    }
    new = [r for r in new if r["action"] == "collected" or r["file"] not in earlier]
    listed = {r["file"] for r in new}
    others = [r for r in old if r.get("download") != download]
    return others + [r for file, r in earlier.items() if file not in listed] + new


def keep_time(folder, new, row, changed, have_times):
    """Whether to write the new submission time (aware datetime or None) over the one stored in folder:
    only a newer real one replaces it, since a plain folder or an LMS that writes no times brings none,
    and a time, once lost, is lost for every late penalty. Row says what was kept (for a changed notebook
    or an older time) or replaced, or that there is no time at all although the download had time sources;
    an unchanged notebook's stored time still holds, whatever sources a new download of the whole
    assignment came with."""
    stored, _ = read_timestamp(folder)
    if stored is None or (new and new.astimezone(timezone.utc).isoformat() == stored):
        if new is None and have_times:
            row.add("no submission time", "the download's time sources do not list this submission")
        return new is not None
    if new and new > datetime.fromisoformat(stored):
        row.add("time replaced", f"the submission time {stored} stored before became {new.isoformat()}")
        return True
    if new or changed:
        row.add(
            "time kept",
            f"kept the submission time {stored} stored before: this download brings "
            + (f"an older one ({new.isoformat()})" if new else "none"),
        )
    row.submitted_at, row.time_source = stored, "stored before"
    return False


def report(rows, chosen, stream, out, roster):
    """The anomalies on the terminal, grouped by kind with counts."""
    kinds = defaultdict(list)
    for r in rows:
        mine = defaultdict(list)
        for anomaly, detail in r.notes:
            if anomaly:
                mine[anomaly].append(detail)
        for anomaly, details in mine.items():
            kinds[anomaly].append((r, "; ".join(details)))
    students = {s for s, _ in chosen}
    print(f"collected {len(chosen)} notebooks of {len(students)} students into {out}", file=stream)
    if roster is None:
        print("no --roster: students are named as the download names them", file=stream)
    for lesson in sorted({lesson for _, lesson in chosen}) if roster else ():  # who has not handed it in, by name
        absent = [r["student"] for r in roster.rows if (r["student"], lesson) not in chosen]
        if absent:
            print(
                f"nothing of {lesson} in this download from {len(absent)} roster student{'s' * (len(absent) > 1)}: "
                f"{', '.join(absent)}",
                file=stream,
            )
    for kind, found in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"{kind} ({len(found)}):", file=stream)
        for r, detail in found[:10]:
            who = " ".join(filter(None, [r.student, r.lesson]))
            print(f"  {r.file}" + (f" [{who}]" if who else "") + f": {r.action}; {detail}", file=stream)
        if len(found) > 10:
            print(f"  ... and {len(found) - 10} more", file=stream)
    if kinds:
        print(f"every file and what was done with it: {out / LOG_FILE}", file=stream)
