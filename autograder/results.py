"""The results store: the one module that reads and writes what grading stores.

grade, report and merge use it, and so do collect, export, the class report, the gradebook and
the Gradescope code; none of them reads another's private names or files.

A RESULTS folder holds a term:

    RESULTS/.results/<lesson>/<student>.json   one result per (student, lesson): save_result, load_result,
                                               load_results, result_path
    RESULTS/.results/run.json                  what the folder holds (Run: shard, manifest, lessons): read_run,
                                               write_run
    RESULTS/.results/index.json                the folder's nonce and the digest of the result it holds last for each
                                               (student, lesson), signed: what save_result wrote, nothing older
    RESULTS/grades.csv                         one row per (student, lesson, test): write_grades, read_grades
    the results key (outside RESULTS: $MHA_RESULTS_KEY, else ~/.config/mha-course/results.key, mode 0600)
                                               signs every stored verdict: key_path, results_key, digest
    (prepare_out checks and makes a RESULTS folder; write_atomic writes any file in it)
    class.json (anywhere, the instructor's)    the class list shards split: write_manifest, read_manifest
    SUBMISSIONS/<student>/<lesson>/timestamp.txt  the submission time a real source gave (collect writes it,
                                               nbgrader's own name and format): read_timestamp, write_timestamp

A result, typed as Result (its tests TestRow, their aspects Aspect; frozen dataclasses, each read and
validated by its from_json, naming the field wrong, and written by its to_json, the JSON below):

    {student, lesson, notebook (path or None), sha256 (of the notebook's bytes, or None),
     fingerprint (of everything the verdict depends on), grader (the lesson's part of it),
     submitted_at (ISO 8601 or None), notes: [str],
     cells: {skipped: {label: why}, errors: {label: {type, message}}},
     tests: [{test, points, max_points, status, message,
              aspects?: [{aspect, points, max_points, passed, message}], grader_error?: bool}],
     grader_errors?: [traceback str] (our own bugs, for RESULTS/grader-errors.log),
     written?: [{question, max_points, status, message}] (the lesson's written questions, graded by a person:
               status NEEDS_GRADING when the notebook was read, UNANSWERED when its answer is still the stub or
               empty (0 unless a TA scores it); their scores are the gradebook's, never ours),
     digest (HMAC-SHA256, under the results key, of the folder's nonce and the canonical JSON of every
             other field)}

    status is one of STATUSES. grader_error marks a test the grader itself could not run (a missing
    Triton, a sandbox that did not start, a bug of ours, a shard that was not merged): never count
    it as 0, flag it for regrading (TestRow.needs_regrade). Points of a test are the sum of its aspects'.

Student identifiers are the SUBMISSIONS folder names, the same string everywhere: the result file
name and its "student" field, feedback/<student>/, the gradebook, Gradescope, merge and exports.
A name with a control character or a leading dot is refused (check_student), so it never needs
escaping. Only the CSV text differs: csv_cell() neutralises a field that starts with = + - @ TAB CR
(or a quote) by prefixing one single quote (OWASP's CSV-injection advice), and read_csv() removes
it again. To join a CSV with RESULTS, read it with read_csv() (or read_grades()), never raw.

Every stored text goes through clean(): control characters stripped (newlines only where a field
keeps them), and capped, so no submission can bloat or garble a report.

A stored result is trusted only when its digest verifies and the folder's signed index records that
digest as its (student, lesson)'s last: one edited after grading (a test set to full marks, its grader
field removed), written before results were signed, copied from another RESULTS folder (another nonce)
or an older result of the same student put back (not the digest the index records) is refused by
load_result like a damaged one (grade --resume regrades it, merge refuses the shard set, export and
report name it and exit 1); a result the index records whose file is gone is refused as deleted.
merge carries results into its own folder by signing them again there (save_result). An index that
does not verify means the key is not the one the folder was graded with (or the index was edited):
every result of the folder is refused, said once (load_term), and prepare_out refuses to grade into
it. Rolling a whole RESULTS folder back (its index with it) is not detected here: `report --submissions`
compares each result's sha256 with the notebook SUBMISSIONS holds. The key
lives outside RESULTS, where the sandbox cannot see it (bwrap shows student code the system and
Python folders only, never the home folder or the course), and every shard and the merge must use
the same one: $MHA_RESULTS_KEY names it on a cluster. lesson_problem checks a result against the
lesson's tests and maximum points.

Bad input from the instructor (a missing folder, an unreadable manifest) raises UsageError: the
CLI prints its one line and exits 2.

The API, by use:
    write a run     prepare_out(out, submissions), save_result(out, r), write_run, write_grades, write_atomic,
                    write_derived (a file made again from results on every run: unchanged ones are kept)
    read a term     load_term(out, lesson_tests) -> Term(results, refused {(student, lesson): why}, lines),
                    load_results(out, problems) ([Result], valid only; damaged files described in problems),
                    load_result(out, student, lesson) -> (Result, why), stored_pairs, read_run, read_grades
    CSV exports     csv_text(rows, columns), csv_cell(value), read_csv(path)
    clean text      clean(text, cap, newlines), check_student(name), cell_error(value)
    typed results   Result / TestRow / Aspect: from_json(raw), the one reader (ResultError naming the field),
                    to_json(), the one writer; Result.points, .max_points, .submitted; TestRow.needs_regrade;
                    Run, the same for run.json.
                    Everything past the store (grade's summary, report, merge, export and the other adapters)
                    takes Results, never their dicts; only grade_one builds the JSON form, from the sandbox's
                    replies, for save_result to read.
"""

import csv
import fcntl
import hashlib
import hmac
import io
import json
import math
import os
import re
import secrets
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

STORE = ".results"
RUN_FILE = "run.json"
INDEX_FILE = "index.json"
INDEX_FORMAT = "mha-course-results-index/1"
TIMESTAMP_FILE = "timestamp.txt"
STATUSES = ("passed", "failed", "error", "missing")
NEEDS_GRADING = "needs grading"  # a written question answered: a person grades it (nbgrader's gradebook)
UNANSWERED = "unanswered"  # a written question left as released: 0 without waiting for a person (as nbgrader does)
WRITTEN_STATUSES = (NEEDS_GRADING, UNANSWERED, "missing", "error")  # missing, error: no notebook to read the answer in
COLUMNS = ["student", "lesson", "test", "points", "max_points", "status", "message"]
MESSAGE_CAP, NOTE_CAP, NAME_CAP = 4000, 1000, 200
MAX_STORED_BYTES = 2 << 20  # a result is a few kB; anything bigger was not written by us
MANIFEST_FORMAT = "mha-course-class-manifest/1"
KEY_ENV = "MHA_RESULTS_KEY"
REGRADE = "; regrade it (grade --resume)"  # the end of load_result's refusals, for a caller that is regrading


class UsageError(ValueError):
    """Bad input to a command (a path, a flag, a file the instructor named): one line, exit status 2."""


class ResultError(ValueError):
    """A stored result that is not what save_result writes: reported, and graded again."""


class MisplacedError(ResultError):
    """A stored result of another student or lesson than its file name says (files swapped)."""


# ---- clean text ----------------------------------------------------------------------------

# C0 and C1 controls (newline aside), DEL, and the bidirectional overrides that reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")


def clean(text: object, cap: int = MESSAGE_CAP, newlines: bool = True) -> str:
    """text as printable str: ANSI sequences and control characters removed, tabs as spaces,
    newlines kept only when newlines=True, at most cap characters. A value that is not text is
    named by its type, never str()-ed whole: a forged 50 MB structure costs nothing."""
    if not isinstance(text, str):
        text = "" if text is None else repr(text) if isinstance(text, (int, float)) else f"({type(text).__name__})"
    text = _ANSI.sub("", text[: cap * 2]).replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    text = _CONTROL.sub("", text if newlines else text.replace("\n", " "))
    return text if len(text) <= cap else text[: cap - 10] + " [... cut]"


def check_student(name: str) -> str | None:
    """The reason a folder name cannot be a student identifier, or None when it can."""
    if not name or name.startswith(".") or name in ("__MACOSX",):
        return "a hidden or system folder, not a student"
    if _CONTROL.search(name) or "\n" in name or len(name) > NAME_CAP:
        return "its name holds control characters or is too long: rename the folder"
    return None


# ---- files ---------------------------------------------------------------------------------


def write_atomic(path: str | Path, text: str, durable: bool = True) -> None:
    """Write text to path so that a reader (or a crash) sees the old file or the new, never half.
    durable=False skips the fsync, for files made again from stored results on every run."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_out(out: str | Path, submissions: str | Path | None = None) -> Path:
    """RESULTS made ready to write (UsageError when it cannot be); never overlapping SUBMISSIONS,
    where it would become a student."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output folder {out} exists and is not a folder")
    if submissions is not None:
        o, s = out.resolve(), Path(submissions).resolve()
        if o == s or o.is_relative_to(s) or s.is_relative_to(o):
            raise UsageError(
                f"the output folder {out} and the submissions folder {submissions} overlap: "
                "give --out a folder of its own"
            )
    try:
        (out / STORE).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out}: {e.strerror}") from None
    if index_path(out).exists():  # never grade on top of results signed with another key
        _, why = _read_index(out, results_key())
        if why:
            raise UsageError(f"{out}: {why}")
    return out


def write_derived(path: str | Path, text: str) -> None:
    """A file made from stored results (a feedback page): written, without fsync, only when it
    changes, so a run over a term rewrites only what it graded."""
    try:
        if Path(path).read_text(encoding="utf-8") == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text, durable=False)


def _read_small(path, cap=MAX_STORED_BYTES):
    """The text of a regular file we wrote, refusing links and anything oversized."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > cap:
            raise ResultError("not a regular file of a plausible size")
        return f.read(cap + 1).decode("utf-8")


def sha256_text(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


# ---- the results key and the digest --------------------------------------------------------


def key_path() -> Path:
    """Where the results key is: $MHA_RESULTS_KEY, else $XDG_CONFIG_HOME (or ~/.config)/mha-course/results.key."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "mha-course" / "results.key"


def key_source() -> str:
    """What chose key_path(), in words, for messages."""
    if os.environ.get(KEY_ENV):
        return f"${KEY_ENV}"
    return "$XDG_CONFIG_HOME/mha-course/results.key" if os.environ.get("XDG_CONFIG_HOME") else "the default place"


_warned_open_keys = set()


def results_key(create: bool = False) -> bytes | None:
    """The key (32 bytes) that signs stored results, or None when there is none and create=False.
    create=True makes it on first use, mode 0600, atomically (shards starting together agree on one).
    A key other users may read is used, with one warning per run: they could sign any verdict."""
    path = key_path()
    try:
        text = _read_small(path, 1000)
    except FileNotFoundError:
        if not create:
            return None
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # never replaces a key another shard made meanwhile
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        except OSError as e:
            raise UsageError(
                f"cannot make the results key {path}: {e.strerror} (set {KEY_ENV} to a file of yours)"
            ) from None
        return results_key()
    except (OSError, ValueError) as e:
        raise UsageError(
            f"cannot read the results key {path} ({clean(str(e), 100, newlines=False)}): "
            f"set {KEY_ENV} to the key the results were graded with"
        ) from None
    if not re.fullmatch(r"[0-9a-f]{64}", text.strip()):
        raise UsageError(f"{path} is not a results key (64 hex digits): restore it, or delete it and regrade")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077 and path not in _warned_open_keys:
        _warned_open_keys.add(path)
        print(
            f"warning: the results key {path} is readable by other users (mode {mode:o}): anyone who reads it "
            f"can sign a verdict; chmod 600 {path}",
            file=sys.stderr,
        )
    return bytes.fromhex(text.strip())


def digest(result: dict, key: bytes, nonce: str = "") -> str:
    """HMAC-SHA256 of a folder's nonce and a result's canonical JSON (sorted keys, no spaces; its own
    digest left out): valid only in the folder whose index holds that nonce."""
    body = json.dumps({k: v for k, v in result.items() if k != "digest"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, f"{nonce}\0{body}".encode(), hashlib.sha256).hexdigest()


# ---- the folder's index --------------------------------------------------------------------

_index_lock = threading.Lock()  # save_result runs in grading threads: one index update at a time
_index_cache = {}  # index path -> (stat, key, (index, why)): grade --resume reads it per result


def index_path(out: str | Path) -> Path:
    return Path(out) / STORE / INDEX_FILE


def _index_mac(index, key):
    body = json.dumps([INDEX_FORMAT, index["nonce"], index["entries"]], sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def folder_problem(out: str | Path) -> str | None:
    """Why no result of RESULTS can be trusted with the key at hand, said once for the folder (the key is
    probably not the one it was graded with, there is none, the index is damaged or missing), or None."""
    index, why = _read_index(out, results_key())
    if why is None and index is None:
        return (
            f"it has no index of its results ({index_path(out)}): they were written before results were "
            "indexed, or the index was deleted"
        )
    return why


def _read_index(out, key):
    """(index {nonce, entries {"lesson/student": digest}}, None), (None, None) when there is none, or
    (None, why) when it cannot be trusted with this key."""
    path = index_path(out)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _index_cache.get(path)
    if cached and cached[0] == stamp and cached[1] == key:
        return cached[2]
    where = f"the index {path}"
    try:
        raw = json.loads(_read_small(path, 64 << 20))
        ok = (
            isinstance(raw, dict)
            and raw.get("format") == INDEX_FORMAT
            and isinstance(raw.get("nonce"), str)
            and isinstance(raw.get("entries"), dict)
            and isinstance(raw.get("mac"), str)
            and all(isinstance(v, str) for v in raw["entries"].values())
        )
        why = None if ok else f"{where} is damaged"
    except (OSError, ValueError, RecursionError) as e:
        why = f"{where} is unreadable ({clean(str(e), 100, newlines=False)})"
    if why is None and key is None:
        why = f"there is no results key at {key_path()} (from {key_source()}) to verify {where}"
    elif why is None and not hmac.compare_digest(raw["mac"], _index_mac(raw, key)):
        why = (
            f"{where} is not signed by the results key {key_path()} (from {key_source()}): the key is probably "
            f"not the one these results were graded with (set {KEY_ENV} to that key's file), or the index was "
            f"edited; if the key is lost, delete {path} and regrade with --resume"
        )
    found = ({"nonce": raw["nonce"], "entries": raw["entries"]}, None) if why is None else (None, why)
    _index_cache[path] = (stamp, key, found)
    return found


def _record(out, result, key):
    """Sign result for RESULTS (its nonce) and record its digest in the folder's index; returns the digest.
    The index is made on first use; under a lock (threads) and flock (processes)."""
    path = index_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _index_lock, open(path.parent / ".index.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index, why = _read_index(out, key)
        if why:  # prepare_out refused this before grading; a folder damaged since starts afresh
            index = None
        index = (
            {"nonce": index["nonce"], "entries": dict(index["entries"])}
            if index
            else {"nonce": secrets.token_hex(16), "entries": {}}
        )  # a copy: the cached one stays what the disk holds
        signed = digest(result, key, index["nonce"])
        write_atomic(
            result_path(out, result["student"], result["lesson"]),
            json.dumps(dict(result, digest=signed), indent=1) + "\n",
        )
        index["entries"][f"{result['lesson']}/{result['student']}"] = signed
        write_atomic(
            path, json.dumps(dict(format=INDEX_FORMAT, mac=_index_mac(index, key), **index)) + "\n", durable=False
        )  # a crash before it lands leaves the result refused, so regraded: never trusted
        st = os.stat(path)
        _index_cache[path] = ((st.st_ino, st.st_size, st.st_mtime_ns), key, (index, None))  # not read back
    return signed


def _unsigned(raw, student, lesson, index):
    """Why a stored result's verdict cannot be trusted, or None when the folder's index records it
    and its digest verifies (index: as _read_index gave it, trusted)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("digest"), str):
        return "it carries no digest (written before results were signed, or by hand)"
    recorded = index["entries"].get(f"{lesson}/{student}")
    if recorded is None:
        return "this folder never recorded a result for it (copied from another RESULTS folder?)"
    if not hmac.compare_digest(raw["digest"], recorded):
        return (
            "it is not the result this folder recorded last (an older result put back, or one copied from "
            "another RESULTS folder)"
        )
    if not hmac.compare_digest(raw["digest"], digest(raw, results_key(), index["nonce"])):
        return "its verdict was changed after grading (its digest does not match)"
    return None


def lesson_problem(result: "Result", tests: list) -> str | None:
    """Why a Result does not fit its lesson's tests [(name, max_points)], or None."""
    got = [(t.test, t.max_points) for t in result.tests]
    if [name for name, _ in got] != [name for name, _ in tests]:
        return "its tests are not the lesson's"
    if any(abs(a - float(b)) > 1e-9 for (_, a), (_, b) in zip(got, tests)):
        return "its maximum points are not the lesson's"
    if result.grader is None and not any(t.needs_regrade for t in result.tests):
        return "it names no grader"
    return None


# ---- results -------------------------------------------------------------------------------


def result_path(out: str | Path, student: str, lesson: str) -> Path:
    return Path(out) / STORE / lesson / f"{student}.json"


def _number(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ResultError(f"{what} is not a non-negative number")
    return float(value)


def _text(value, what, cap=MESSAGE_CAP, optional=False):
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ResultError(f"{what} is not text")
    return clean(value, cap)


@dataclass(frozen=True)
class Aspect:
    """One aspect of a test (a part of its points): the typed form of {aspect, points, max_points, passed,
    message}. from_json is its one reader (validates and cleans), to_json its one writer."""

    aspect: str
    points: float
    max_points: float
    passed: bool
    message: str = ""

    @classmethod
    def from_json(cls, a, where="an aspect") -> "Aspect":
        """A cleaned Aspect from its stored dict; ResultError naming `where` and the field when it is not one."""
        if not isinstance(a, dict):
            raise ResultError(f"{where} is not a JSON object")
        return cls(
            _text(a.get("aspect"), f"{where}.aspect", NAME_CAP),
            _number(a.get("points"), f"{where}.points"),
            _number(a.get("max_points"), f"{where}.max_points"),
            bool(a.get("passed")),
            _text(a.get("message", ""), f"{where}.message"),
        )

    def to_json(self) -> dict:
        return {
            "aspect": self.aspect,
            "points": self.points,
            "max_points": self.max_points,
            "passed": self.passed,
            "message": self.message,
        }


@dataclass(frozen=True)
class TestRow:
    """One test of a result: {test, points, max_points, status (one of STATUSES), message, aspects?,
    grader_error?}. aspects is None when the test has none; grader_error is stored only when True."""

    __test__ = False  # not a pytest class
    test: str
    points: float
    max_points: float
    status: str
    message: str
    aspects: tuple = None
    grader_error: bool = False

    @classmethod
    def from_json(cls, t, where="a test") -> "TestRow":
        """A cleaned TestRow from its stored dict; ResultError naming `where` and the field when it is not one."""
        if not isinstance(t, dict):
            raise ResultError(f"{where} is not a JSON object")
        status = t.get("status")
        if status not in STATUSES:
            raise ResultError(f"{where}.status {clean(str(status), 40)!r} is not one of {', '.join(STATUSES)}")
        points, max_points = (
            _number(t.get("points"), f"{where}.points"),
            _number(t.get("max_points"), f"{where}.max_points"),
        )
        if points > max_points + 1e-9:
            raise ResultError(f"{where}.points above max_points")
        aspects = t.get("aspects")
        if "aspects" in t:
            if not isinstance(aspects, list):
                raise ResultError(f"{where}.aspects is not a list")
            aspects = tuple(Aspect.from_json(a, f"{where}.aspects[{i}]") for i, a in enumerate(aspects[:50]))
        return cls(
            _text(t.get("test"), f"{where}.test", NAME_CAP),
            points,
            max_points,
            status,
            _text(t.get("message"), f"{where}.message"),
            aspects,
            bool(t.get("grader_error")),
        )

    def to_json(self) -> dict:
        row = {
            "test": self.test,
            "points": self.points,
            "max_points": self.max_points,
            "status": self.status,
            "message": self.message,
        }
        if self.grader_error:
            row["grader_error"] = True
        if self.aspects is not None:
            row["aspects"] = [a.to_json() for a in self.aspects]
        return row

    @property
    def needs_regrade(self) -> bool:
        """True when the status says nothing about the student: the grader could not run the test."""
        return self.status == "error" and self.grader_error


@dataclass(frozen=True)
class WrittenRow:
    """One written question of a result (a markdown answer a person grades): {question, max_points, status (one
    of WRITTEN_STATUSES), message}. It has no points: its score is the gradebook's manual score, never the grader's."""

    question: str
    max_points: float
    status: str
    message: str

    @classmethod
    def from_json(cls, w, where="a written question") -> "WrittenRow":
        if not isinstance(w, dict):
            raise ResultError(f"{where} is not a JSON object")
        if w.get("status") not in WRITTEN_STATUSES:
            raise ResultError(
                f"{where}.status {clean(str(w.get('status')), 40)!r} is not one of {', '.join(WRITTEN_STATUSES)}"
            )
        return cls(
            _text(w.get("question"), f"{where}.question", NAME_CAP),
            _number(w.get("max_points"), f"{where}.max_points"),
            w["status"],
            _text(w.get("message"), f"{where}.message"),
        )

    def to_json(self) -> dict:
        return {
            "question": self.question,
            "max_points": self.max_points,
            "status": self.status,
            "message": self.message,
        }


@dataclass(frozen=True)
class Result:
    """One stored result (the format in this module's docstring, digest aside): from_json is its one
    reader, which validates and cleans (ResultError naming the field), to_json its one writer, whose
    dict is what save_result signs and stores, so the stored bytes are those of before it was typed."""

    student: str
    lesson: str
    tests: tuple
    notebook: str = None
    sha256: str = None
    fingerprint: str = None
    grader: str = None
    submitted_at: str = None
    notes: tuple = ()
    skipped: dict = field(default_factory=dict)  # cells.skipped {label: why}
    errors: dict = field(default_factory=dict)  # cells.errors {label: {type, message}}
    grader_errors: tuple = None  # tracebacks of our own bugs, stored only when there are
    written: tuple = ()  # WrittenRow of each written question, stored only when there are

    @classmethod
    def from_json(cls, r, student=None, lesson=None) -> "Result":
        """A cleaned Result from its stored dict; MisplacedError when it is not (student, lesson)'s,
        ResultError naming the first field wrong."""
        if not isinstance(r, dict):
            raise ResultError("not a JSON object")
        who = {key: _text(r.get(key), key, NAME_CAP) for key in ("student", "lesson")}
        if student is not None and who["student"] != student or lesson is not None and who["lesson"] != lesson:
            raise MisplacedError("its student or lesson does not match its file name")
        about = {
            key: _text(r.get(key), key, 1000, optional=True)
            for key in ("notebook", "sha256", "fingerprint", "grader", "submitted_at")
        }
        notes = r.get("notes", [])
        if not isinstance(notes, list):
            raise ResultError("notes is not a list")
        cells = r.get("cells") or {}
        skipped, errors = (cells.get("skipped") or {}, cells.get("errors") or {}) if isinstance(cells, dict) else (0, 0)
        if not isinstance(skipped, dict) or not isinstance(errors, dict):
            raise ResultError("cells is not {skipped: {}, errors: {}}")
        tests = r.get("tests")
        if not isinstance(tests, list) or not tests:
            raise ResultError("tests is not a list of tests")
        tracebacks, written = r.get("grader_errors"), r.get("written", [])
        if not isinstance(written, list):
            raise ResultError("written is not a list of written questions")
        return cls(
            **who,
            **about,
            notes=tuple(_text(n, f"notes[{i}]", NOTE_CAP) for i, n in enumerate(notes[:50])),
            skipped={
                clean(str(k), NOTE_CAP): _text(v, "cells.skipped", NOTE_CAP) for k, v in list(skipped.items())[:200]
            },
            errors={clean(str(k), NOTE_CAP): cell_error(v) for k, v in list(errors.items())[:200]},
            tests=tuple(TestRow.from_json(t, f"tests[{i}]") for i, t in enumerate(tests[:200])),
            grader_errors=tuple(clean(str(tb), 20_000) for tb in tracebacks[:20])
            if isinstance(tracebacks, list)
            else None,
            written=tuple(WrittenRow.from_json(w, f"written[{i}]") for i, w in enumerate(written[:50])),
        )

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def max_points(self) -> float:
        return sum(t.max_points for t in self.tests)

    @property
    def submitted(self) -> bool:
        """False when nothing was handed in (every test `missing`)."""
        return any(t.status != "missing" for t in self.tests)

    def to_json(self) -> dict:
        out = {
            "student": self.student,
            "lesson": self.lesson,
            "notebook": self.notebook,
            "sha256": self.sha256,
            "fingerprint": self.fingerprint,
            "grader": self.grader,
            "submitted_at": self.submitted_at,
            "notes": list(self.notes),
            "cells": {"skipped": dict(self.skipped), "errors": dict(self.errors)},
            "tests": [t.to_json() for t in self.tests],
        }
        if self.grader_errors is not None:
            out["grader_errors"] = list(self.grader_errors)
        if self.written:
            out["written"] = [w.to_json() for w in self.written]
        return out


def cell_error(value: object) -> dict:
    """A cell's error as {type, message}, whatever the sandbox sent (a forged string, a huge list)."""
    if isinstance(value, dict):
        return {
            "type": clean(value.get("type"), 100, newlines=False) or "error",
            "message": clean(value.get("message"), NOTE_CAP),
        }
    return {"type": "error", "message": clean(value, NOTE_CAP)}


def save_result(out, result) -> Result:
    """Validate, clean, sign and write one result (a Result, or its JSON dict as grading builds it)
    atomically, recorded in the folder's index as its (student, lesson)'s last; returns the Result."""
    typed = result if isinstance(result, Result) else Result.from_json(result)
    _record(out, typed.to_json(), results_key(create=True))
    return typed


def load_result(out, student, lesson, tests=None) -> tuple:
    """(Result, None), (None, None) when nothing is stored (grade --resume grades it: "not graded
    before"), or (None, why) when the stored file is malformed, unsigned, changed after grading, not
    the one the folder's index records (copied, put back), or (given the lesson's tests
    [(name, max_points)]) not the lesson's: then it is refused, and graded again."""
    path = result_path(out, student, lesson)
    key = results_key()
    index, folder_why = _read_index(out, key)
    try:
        raw = json.loads(_read_small(path))
        result = Result.from_json(raw, student, lesson)
    except FileNotFoundError:  # never written (a run stopped first), or deleted: load_term tells them apart
        return None, None
    except MisplacedError as e:
        if isinstance(raw.get("digest"), str):  # a signed result moved here, not a damaged file
            return None, f"{path}: refused: it is another student's or lesson's result, moved here ({e}){REGRADE}"
        return None, f"{path}: unreadable stored result ({e})"
    except (OSError, ValueError, RecursionError) as e:  # ResultError, JSON and UTF-8 errors are ValueErrors
        return None, f"{path}: unreadable stored result ({clean(str(e), 200, newlines=False)})"
    why = (
        (folder_problem(out) if index is None else None)
        or _unsigned(raw, student, lesson, index)
        or (lesson_problem(result, tests) if tests is not None else None)
    )
    if why:
        return None, f"{path}: refused: {why}{REGRADE}"
    return result, None


def stored_pairs(out: str | Path) -> set:
    """{(student, lesson)} of every result file in RESULTS (valid or not), and of every result its index
    records (a deleted one)."""
    store = Path(out) / STORE
    pairs = set()
    if store.is_dir():
        for lesson_dir in store.iterdir():
            if lesson_dir.is_dir() and not lesson_dir.is_symlink():
                pairs |= {
                    (f.name[:-5], lesson_dir.name)
                    for f in lesson_dir.iterdir()
                    if f.name.endswith(".json") and not f.name.startswith(".")
                }
    index, _ = _read_index(out, results_key())
    for pair in (index or {"entries": {}})["entries"]:
        lesson, _, student = pair.partition("/")
        if not check_student(student):
            pairs.add((student, lesson))
    return pairs


@dataclass
class Term:
    """What a RESULTS folder holds: the valid results (Result, sorted by student, lesson), the refused ones
    {(student, lesson): why} (damaged, edited, copied, put back, deleted), and the lines to show: one
    per refused result, or one for the whole folder when its key or index is wrong."""

    results: list = field(default_factory=list)
    refused: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)


def load_term(out, lesson_tests=None) -> Term:
    """Every stored result of RESULTS, valid or refused (Term). lesson_tests(lesson) -> [(name, max_points)],
    or None for a lesson it does not know: checked too."""
    term = Term()
    folder_why = folder_problem(out) if (Path(out) / STORE).is_dir() else None
    index, _ = _read_index(out, results_key())
    for student, lesson in sorted(stored_pairs(out)):
        result, why = load_result(out, student, lesson, lesson_tests(lesson) if lesson_tests else None)
        if not result and not why:  # the index records it, its file is gone
            why = (
                f"{result_path(out, student, lesson)}: refused: it was deleted (the folder's index records it){REGRADE}"
            )
        if result:
            term.results.append(result)
        elif why:
            term.refused[student, lesson] = (
                why.removeprefix(f"{result_path(out, student, lesson)}: ")
                .removeprefix("refused: ")
                .removesuffix(REGRADE)
            )
            if not folder_why:
                term.lines.append(why)
    if folder_why and term.refused:
        term.lines.append(f"{out}: all {len(term.refused)} stored results refused: {folder_why}")
    return term


def load_results(out, problems=None, lesson_tests=None) -> list:
    """Every valid stored Result, sorted by (student, lesson). A malformed or refused one is left out
    and described in `problems` (a list to append to), so the caller reports it and grades it again.
    lesson_tests(lesson) -> [(name, max_points)], or None for a lesson it does not know: checked too."""
    term = load_term(out, lesson_tests)
    if problems is not None:
        problems += term.lines
    return term.results


# ---- the run record and the manifest -------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What a RESULTS folder holds (RESULTS/.results/run.json): shard ("i/N", or None unsharded), the class
    manifest's id (or None), the lessons graded into it, and what a partial merge left out (lines).
    from_json is its one reader (ResultError naming the field), to_json its one writer."""

    shard: str = None
    manifest: str = None
    lessons: tuple = ()
    partial: tuple = ()

    @classmethod
    def from_json(cls, run) -> "Run":
        if not isinstance(run, dict):
            raise ResultError("not a JSON object")
        shard, manifest = run.get("shard"), run.get("manifest")
        if shard is not None and not (isinstance(shard, str) and re.fullmatch(r"\d+/\d+", shard)):
            raise ResultError("shard is not i/N")
        if manifest is not None and not isinstance(manifest, str):
            raise ResultError("manifest is not text")
        lists = {"lessons": run.get("lessons"), "partial": run.get("partial", [])}
        for key, value in lists.items():
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ResultError(f"{key} is not a list of text")
        return cls(shard, manifest, tuple(lists["lessons"]), tuple(lists["partial"]))

    def to_json(self) -> dict:
        return {
            "shard": self.shard,
            "manifest": self.manifest,
            "lessons": sorted(self.lessons),
            "partial": list(self.partial),
        }


def read_run(out) -> Run:
    """RESULTS/.results/run.json as a Run (an empty one when there is none); UsageError naming the file
    and the field when it is damaged."""
    path = Path(out) / STORE / RUN_FILE
    try:
        return Run.from_json(json.loads(_read_small(path)))
    except FileNotFoundError:
        return Run()
    except (OSError, ValueError, RecursionError) as e:  # ResultError is a ValueError
        why = clean(str(e), 200, newlines=False)
        raise UsageError(f"{path} is damaged ({why}): delete it and grade again") from None


def write_run(out: str | Path, shard: str | None, manifest: str | None, lessons, partial=()) -> None:
    write_atomic(
        Path(out) / STORE / RUN_FILE,
        json.dumps(Run(shard, manifest, tuple(lessons), tuple(partial)).to_json(), indent=1) + "\n",
    )


def write_manifest(path: str | Path, students, lessons) -> str:
    """The class list every shard splits the same way; returns its id."""
    manifest = {"format": MANIFEST_FORMAT, "students": sorted(students), "lessons": list(lessons)}
    write_atomic(path, json.dumps(manifest, indent=1) + "\n")
    return manifest_id(manifest)


def read_manifest(path: str | Path) -> dict:
    """{students, lessons, id}; UsageError when it is not a manifest this module wrote."""
    try:
        m = json.loads(_read_small(path, 64 << 20))
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"cannot read the manifest {path}: {clean(str(e), 200, newlines=False)}") from None
    if not (
        isinstance(m, dict)
        and m.get("format") == MANIFEST_FORMAT
        and isinstance(m.get("students"), list)
        and isinstance(m.get("lessons"), list)
        and all(isinstance(s, str) for s in m["students"] + m["lessons"])
    ):
        raise UsageError(f"{path} is not a class manifest (make one with `python -m autograder manifest`)")
    if len(set(m["students"])) != len(m["students"]):
        raise UsageError(f"the manifest {path} lists a student twice")
    bad = next((s for s in m["students"] if check_student(s)), None)
    if bad is not None:
        raise UsageError(f"the manifest {path} lists {clean(bad, 60, newlines=False)!r}: {check_student(bad)}")
    return {"students": m["students"], "lessons": m["lessons"], "id": manifest_id(m)}


def manifest_id(m: dict) -> str:
    return sha256_text(json.dumps([sorted(m["students"]), list(m["lessons"])]))[:16]


# ---- submission times ----------------------------------------------------------------------


def write_timestamp(lesson_folder: str | Path, when: datetime) -> None:
    """nbgrader's timestamp.txt: the submission time, a timezone-aware datetime."""
    write_atomic(Path(lesson_folder) / TIMESTAMP_FILE, when.astimezone(timezone.utc).isoformat() + "\n")


def read_timestamp(lesson_folder: str | Path) -> tuple:
    """(ISO 8601 UTC string or None, problem or None) from lesson_folder/timestamp.txt: ISO 8601, or
    nbgrader's "2026-01-31 23:59:00.000000 UTC"; a time without a zone is taken as UTC."""
    path = Path(lesson_folder) / TIMESTAMP_FILE
    try:
        text = _read_small(path, 1000).strip()
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{TIMESTAMP_FILE} unreadable: {clean(str(e), 100, newlines=False)}"
    try:
        when = datetime.fromisoformat(text.removesuffix(" UTC").replace(" ", "T", 1))
    except ValueError:
        return None, f"{TIMESTAMP_FILE} holds no date: {clean(text, 60, newlines=False)!r}"
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(), None


# ---- CSV -----------------------------------------------------------------------------------

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> str:
    """A value as CSV text a spreadsheet will not run: one line without control characters, and,
    when it starts (after spaces) with = + - @ TAB CR, or with a single quote (so that read_csv can
    undo it), a single quote in front. Numbers are written as they are."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.10g}"
    original = "" if value is None else str(value)
    text = clean(original, 100_000, newlines=False)
    if original.lstrip(" ").startswith(_FORMULA_START) or text.lstrip(" ").startswith(_FORMULA_START + ("'",)):
        text = "'" + text
    return text


def csv_text(rows, columns) -> str:
    """CSV text of rows (dicts) with the given columns, every cell through csv_cell."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([csv_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def read_csv(path: str | Path) -> list:
    """The rows of a CSV this module wrote, as dicts of str, with the injection guard removed,
    so values equal the identifiers in RESULTS."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v[1:] if v.startswith("'") else v for k, v in row.items()} for row in csv.DictReader(f)]


def write_grades(path: str | Path, results: list) -> None:
    """grades.csv from [Result]: one row per (student, lesson, test), COLUMNS, points summed over aspects."""
    rows = [
        dict(
            student=r.student,
            lesson=r.lesson,
            test=t.test,
            points=t.points,
            max_points=t.max_points,
            status=t.status,
            message=" | ".join(t.message.splitlines()),
        )
        for r in results
        for t in r.tests
    ]
    write_atomic(path, csv_text(rows, COLUMNS))


def read_grades(path: str | Path) -> list:
    return read_csv(path)
