"""The results store: the one module that reads and writes what grading stores.

grade, report and merge use it, and so do collect, export, the class report, the gradebook and
the Gradescope code; none of them reads another's private names or files.

A RESULTS folder holds a term:

    RESULTS/.results/<lesson>/<student>.json   one result per (student, lesson): save_result, load_result,
                                               load_results, result_path
    RESULTS/.results/run.json                  what the folder holds (shard, manifest, lessons): read_run, write_run
    RESULTS/grades.csv                         one row per (student, lesson, test): write_grades, read_grades
    the results key (outside RESULTS: $MHA_RESULTS_KEY, else ~/.config/mha-course/results.key, mode 0600)
                                               signs every stored verdict: key_path, results_key, digest
    (prepare_out checks and makes a RESULTS folder; write_atomic writes any file in it)
    class.json (anywhere, the instructor's)    the class list shards split: write_manifest, read_manifest
    SUBMISSIONS/<student>/<lesson>/timestamp.txt  the submission time a real source gave (collect writes it,
                                               nbgrader's own name and format): read_timestamp, write_timestamp

A result (every field checked by validate_result on read):

    {student, lesson, notebook (path or None), sha256 (of the notebook's bytes, or None),
     fingerprint (of everything the verdict depends on), grader (the lesson's part of it),
     submitted_at (ISO 8601 or None), notes: [str],
     cells: {skipped: {label: why}, errors: {label: {type, message}}},
     tests: [{test, points, max_points, status, message,
              aspects?: [{aspect, points, max_points, passed, message}], grader_error?: bool}],
     grader_errors?: [traceback str] (our own bugs, for RESULTS/grader-errors.log),
     digest (HMAC-SHA256, under the results key, of the canonical JSON of every other field)}

    status is one of STATUSES. grader_error marks a test the grader itself could not run (a missing
    Triton, a sandbox that did not start, a bug of ours, a shard that was not merged): never count
    it as 0, flag it for regrading (needs_regrade). Points of a test are the sum of its aspects'.

Student identifiers are the SUBMISSIONS folder names, the same string everywhere: the result file
name and its "student" field, feedback/<student>/, the gradebook, Gradescope, merge and exports.
A name with a control character or a leading dot is refused (check_student), so it never needs
escaping. Only the CSV text differs: csv_cell() neutralises a field that starts with = + - @ TAB CR
(or a quote) by prefixing one single quote (OWASP's CSV-injection advice), and read_csv() removes
it again. To join a CSV with RESULTS, read it with read_csv() (or read_grades()), never raw.

Every stored text goes through clean(): control characters stripped (newlines only where a field
keeps them), and capped, so no submission can bloat or garble a report.

A stored result is trusted only when its digest verifies: one edited after grading (a test set to
full marks, its grader field removed), or written before results were signed, is refused by
load_result like a damaged one (grade --resume regrades it, merge refuses the shard set). The key
lives outside RESULTS, where the sandbox cannot see it (bwrap shows student code the system and
Python folders only, never the home folder or the course), and every shard and the merge must use
the same one: $MHA_RESULTS_KEY names it on a cluster. lesson_problem checks a result against the
lesson's tests and maximum points.

Bad input from the instructor (a missing folder, an unreadable manifest) raises UsageError: the
CLI prints its one line and exits 2.

The API, by use:
    write a run     prepare_out(out, submissions), save_result(out, r), write_run, write_grades, write_atomic,
                    write_derived (a file made again from results on every run: unchanged ones are kept)
    read a term     load_results(out, problems) (valid results only; damaged files described in problems),
                    load_result(out, student, lesson) -> (result, why), stored_pairs, read_run, read_grades,
                    needs_regrade(test)
    CSV exports     csv_text(rows, columns), csv_cell(value), read_csv(path)
    clean text      clean(text, cap, newlines), check_student(name), cell_error(value)
"""
import csv
import hashlib
import hmac
import io
import json
import math
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

STORE = ".results"
RUN_FILE = "run.json"
TIMESTAMP_FILE = "timestamp.txt"
STATUSES = ("passed", "failed", "error", "missing")
COLUMNS = ["student", "lesson", "test", "points", "max_points", "status", "message"]
MESSAGE_CAP, NOTE_CAP, NAME_CAP = 4000, 1000, 200
MAX_STORED_BYTES = 2 << 20  # a result is a few kB; anything bigger was not written by us
MANIFEST_FORMAT = "mha-course-class-manifest/1"
KEY_ENV = "MHA_RESULTS_KEY"


class UsageError(ValueError):
    """Bad input to a command (a path, a flag, a file the instructor named): one line, exit status 2."""


class ResultError(ValueError):
    """A stored result that is not what save_result writes: reported, and graded again."""


# ---- clean text ----------------------------------------------------------------------------

# C0 and C1 controls (newline aside), DEL, and the bidirectional overrides that reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")


def clean(text, cap=MESSAGE_CAP, newlines=True):
    """text as printable str: ANSI sequences and control characters removed, tabs as spaces,
    newlines kept only when newlines=True, at most cap characters. A value that is not text is
    named by its type, never str()-ed whole: a forged 50 MB structure costs nothing."""
    if not isinstance(text, str):
        text = "" if text is None else repr(text) if isinstance(text, (int, float)) else f"({type(text).__name__})"
    text = _ANSI.sub("", text[:cap * 2]).replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    text = _CONTROL.sub("", text if newlines else text.replace("\n", " "))
    return text if len(text) <= cap else text[:cap - 10] + " [... cut]"


def check_student(name):
    """The reason a folder name cannot be a student identifier, or None when it can."""
    if not name or name.startswith(".") or name in ("__MACOSX",):
        return "a hidden or system folder, not a student"
    if _CONTROL.search(name) or "\n" in name or len(name) > NAME_CAP:
        return "its name holds control characters or is too long: rename the folder"
    return None


# ---- files ---------------------------------------------------------------------------------

def write_atomic(path, text, durable=True):
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


def prepare_out(out, submissions=None):
    """RESULTS made ready to write (UsageError when it cannot be); never overlapping SUBMISSIONS,
    where it would become a student."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output folder {out} exists and is not a folder")
    if submissions is not None:
        o, s = out.resolve(), Path(submissions).resolve()
        if o == s or o.is_relative_to(s) or s.is_relative_to(o):
            raise UsageError(f"the output folder {out} and the submissions folder {submissions} overlap: "
                             "give --out a folder of its own")
    try:
        (out / STORE).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out}: {e.strerror}") from None
    return out


def write_derived(path, text):
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


def sha256_text(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


# ---- the results key and the digest --------------------------------------------------------

def key_path():
    """Where the results key is: $MHA_RESULTS_KEY, else $XDG_CONFIG_HOME (or ~/.config)/mha-course/results.key."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "mha-course" / "results.key"


def results_key(create=False):
    """The key (32 bytes) that signs stored results, or None when there is none and create=False.
    create=True makes it on first use, mode 0600, atomically (shards starting together agree on one)."""
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
            raise UsageError(f"cannot make the results key {path}: {e.strerror} (set {KEY_ENV} to a file of yours)") from None
        return results_key()
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the results key {path} ({clean(str(e), 100, newlines=False)}): "
                         f"set {KEY_ENV} to the key the results were graded with") from None
    if not re.fullmatch(r"[0-9a-f]{64}", text.strip()):
        raise UsageError(f"{path} is not a results key (64 hex digits): restore it, or delete it and regrade")
    return bytes.fromhex(text.strip())


def digest(result, key):
    """HMAC-SHA256 of a result's canonical JSON (sorted keys, no spaces; its own digest left out)."""
    body = json.dumps({k: v for k, v in result.items() if k != "digest"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _unsigned(raw):
    """Why a stored result's verdict cannot be trusted, or None when its digest verifies."""
    key = results_key()
    if not isinstance(raw, dict) or not isinstance(raw.get("digest"), str):
        return "it carries no digest (written before results were signed, or by hand)"
    if key is None:
        return f"there is no results key at {key_path()} to verify it (set {KEY_ENV} to the key it was graded with)"
    if not hmac.compare_digest(raw["digest"], digest(raw, key)):
        return "its verdict was changed after grading (its digest does not match)"
    return None


def lesson_problem(result, tests):
    """Why a result does not fit its lesson's tests [(name, max_points)], or None."""
    got = [(t["test"], t["max_points"]) for t in result["tests"]]
    if [name for name, _ in got] != [name for name, _ in tests]:
        return "its tests are not the lesson's"
    if any(abs(a - float(b)) > 1e-9 for (_, a), (_, b) in zip(got, tests)):
        return "its maximum points are not the lesson's"
    if result.get("grader") is None and not any(map(needs_regrade, result["tests"])):
        return "it names no grader"
    return None


# ---- results -------------------------------------------------------------------------------

def result_path(out, student, lesson):
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


def validate_result(r, student=None, lesson=None):
    """A cleaned copy of a result dict; ResultError naming the first thing wrong."""
    if not isinstance(r, dict):
        raise ResultError("not a JSON object")
    out = {key: _text(r.get(key), key, NAME_CAP) for key in ("student", "lesson")}
    if student is not None and out["student"] != student or lesson is not None and out["lesson"] != lesson:
        raise ResultError("its student or lesson does not match its file name")
    for key in ("notebook", "sha256", "fingerprint", "grader", "submitted_at"):
        out[key] = _text(r.get(key), key, 1000, optional=True)
    notes = r.get("notes", [])
    if not isinstance(notes, list):
        raise ResultError("notes is not a list")
    out["notes"] = [_text(n, "a note", NOTE_CAP) for n in notes[:50]]
    cells = r.get("cells") or {}
    skipped, errors = (cells.get("skipped") or {}, cells.get("errors") or {}) if isinstance(cells, dict) else (0, 0)
    if not isinstance(skipped, dict) or not isinstance(errors, dict):
        raise ResultError("cells is not {skipped: {}, errors: {}}")
    out["cells"] = {"skipped": {clean(str(k), NOTE_CAP): _text(v, "a skipped cell", NOTE_CAP)
                                for k, v in list(skipped.items())[:200]},
                    "errors": {clean(str(k), NOTE_CAP): cell_error(v) for k, v in list(errors.items())[:200]}}
    tests = r.get("tests")
    if not isinstance(tests, list) or not tests:
        raise ResultError("tests is not a list of tests")
    out["tests"] = [_validate_test(t) for t in tests[:200]]
    if isinstance(r.get("grader_errors"), list):  # tracebacks of our own bugs, for the instructor
        out["grader_errors"] = [clean(str(tb), 20_000) for tb in r["grader_errors"][:20]]
    return out


def _validate_test(t):
    if not isinstance(t, dict):
        raise ResultError("a test is not a JSON object")
    row = {"test": _text(t.get("test"), "test", NAME_CAP), "points": _number(t.get("points"), "points"),
           "max_points": _number(t.get("max_points"), "max_points"), "status": t.get("status"),
           "message": _text(t.get("message"), "message")}
    if row["status"] not in STATUSES:
        raise ResultError(f"status {clean(str(row['status']), 40)!r} is not one of {', '.join(STATUSES)}")
    if row["points"] > row["max_points"] + 1e-9:
        raise ResultError("points above max_points")
    if t.get("grader_error"):
        row["grader_error"] = True
    if "aspects" in t:
        if not isinstance(t["aspects"], list):
            raise ResultError("aspects is not a list")
        row["aspects"] = [_validate_aspect(a) for a in t["aspects"][:50]]
    return row


def _validate_aspect(a):
    if not isinstance(a, dict):
        raise ResultError("an aspect is not a JSON object")
    return {"aspect": _text(a.get("aspect"), "aspect", NAME_CAP), "points": _number(a.get("points"), "aspect points"),
            "max_points": _number(a.get("max_points"), "aspect max_points"), "passed": bool(a.get("passed")),
            "message": _text(a.get("message", ""), "aspect message")}


def cell_error(value):
    """A cell's error as {type, message}, whatever the sandbox sent (a forged string, a huge list)."""
    if isinstance(value, dict):
        return {"type": clean(value.get("type"), 100, newlines=False) or "error",
                "message": clean(value.get("message"), NOTE_CAP)}
    return {"type": "error", "message": clean(value, NOTE_CAP)}


def save_result(out, result):
    """Validate, clean, sign and write one result atomically; returns the cleaned result (unsigned)."""
    result = validate_result(result)
    signed = dict(result, digest=digest(result, results_key(create=True)))
    write_atomic(result_path(out, result["student"], result["lesson"]), json.dumps(signed, indent=1) + "\n")
    return result


def load_result(out, student, lesson, tests=None):
    """(result, None), (None, None) when nothing is stored, or (None, why) when the stored file is
    malformed, unsigned, changed after grading or (given the lesson's tests [(name, max_points)])
    not the lesson's: then it is refused, and graded again."""
    path = result_path(out, student, lesson)
    try:
        raw = json.loads(_read_small(path))
        result = validate_result(raw, student, lesson)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, RecursionError) as e:  # ResultError, JSON and UTF-8 errors are ValueErrors
        return None, f"{path}: unreadable stored result ({clean(str(e), 200, newlines=False)})"
    why = _unsigned(raw) or (lesson_problem(result, tests) if tests is not None else None)
    if why:
        return None, f"{path}: refused: {why}; regrade it (grade --resume)"
    return result, None


def stored_pairs(out):
    """{(student, lesson)} of every result file in RESULTS (valid or not)."""
    store = Path(out) / STORE
    pairs = set()
    if store.is_dir():
        for lesson_dir in store.iterdir():
            if lesson_dir.is_dir() and not lesson_dir.is_symlink():
                pairs |= {(f.name[:-5], lesson_dir.name) for f in lesson_dir.iterdir()
                          if f.name.endswith(".json") and not f.name.startswith(".")}
    return pairs


def load_results(out, problems=None, lesson_tests=None):
    """Every valid stored result, sorted by (student, lesson). A malformed or refused one is left out
    and described in `problems` (a list to append to), so the caller reports it and grades it again.
    lesson_tests(lesson) -> [(name, max_points)], or None for a lesson it does not know: checked too."""
    results = []
    for student, lesson in sorted(stored_pairs(out)):
        result, why = load_result(out, student, lesson, lesson_tests(lesson) if lesson_tests else None)
        if result:
            results.append(result)
        elif why and problems is not None:
            problems.append(why)
    return results


def needs_regrade(test):
    """True for a test whose status says nothing about the student: the grader could not run it."""
    return test["status"] == "error" and bool(test.get("grader_error"))


# ---- the run record and the manifest -------------------------------------------------------

def read_run(out):
    """RESULTS/.results/run.json: {shard: "i/N" or None, manifest: id or None, lessons: [...], partial: [...]}."""
    path = Path(out) / STORE / RUN_FILE
    try:
        run = json.loads(_read_small(path))
    except FileNotFoundError:
        return {"shard": None, "manifest": None, "lessons": [], "partial": []}
    except (OSError, ValueError, RecursionError) as e:
        why = clean(str(e), 200, newlines=False)
        raise UsageError(f"{path} is damaged ({why}): delete it and grade again") from None
    ok = (isinstance(run, dict) and isinstance(run.get("lessons"), list)
          and all(isinstance(x, str) for x in run["lessons"] + run.get("partial", []))
          and (run.get("shard") is None or isinstance(run.get("shard"), str) and re.fullmatch(r"\d+/\d+", run["shard"]))
          and (run.get("manifest") is None or isinstance(run.get("manifest"), str)))
    if not ok:
        raise UsageError(f"{path} is damaged: delete it and grade again")
    return {"shard": run.get("shard"), "manifest": run.get("manifest"), "lessons": run["lessons"],
            "partial": run.get("partial", [])}


def write_run(out, shard, manifest, lessons, partial=()):
    write_atomic(Path(out) / STORE / RUN_FILE, json.dumps(
        {"shard": shard, "manifest": manifest, "lessons": sorted(lessons), "partial": list(partial)}, indent=1) + "\n")


def write_manifest(path, students, lessons):
    """The class list every shard splits the same way; returns its id."""
    manifest = {"format": MANIFEST_FORMAT, "students": sorted(students), "lessons": list(lessons)}
    write_atomic(path, json.dumps(manifest, indent=1) + "\n")
    return manifest_id(manifest)


def read_manifest(path):
    """{students, lessons, id}; UsageError when it is not a manifest this module wrote."""
    try:
        m = json.loads(_read_small(path, 64 << 20))
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"cannot read the manifest {path}: {clean(str(e), 200, newlines=False)}") from None
    if not (isinstance(m, dict) and m.get("format") == MANIFEST_FORMAT and isinstance(m.get("students"), list)
            and isinstance(m.get("lessons"), list) and all(isinstance(s, str) for s in m["students"] + m["lessons"])):
        raise UsageError(f"{path} is not a class manifest (make one with `python -m autograder manifest`)")
    if len(set(m["students"])) != len(m["students"]):
        raise UsageError(f"the manifest {path} lists a student twice")
    bad = next((s for s in m["students"] if check_student(s)), None)
    if bad is not None:
        raise UsageError(f"the manifest {path} lists {clean(bad, 60, newlines=False)!r}: {check_student(bad)}")
    return {"students": m["students"], "lessons": m["lessons"], "id": manifest_id(m)}


def manifest_id(m):
    return sha256_text(json.dumps([sorted(m["students"]), list(m["lessons"])]))[:16]


# ---- submission times ----------------------------------------------------------------------

def write_timestamp(lesson_folder, when):
    """nbgrader's timestamp.txt: the submission time, a timezone-aware datetime."""
    write_atomic(Path(lesson_folder) / TIMESTAMP_FILE, when.astimezone(timezone.utc).isoformat() + "\n")


def read_timestamp(lesson_folder):
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


def csv_cell(value):
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


def csv_text(rows, columns):
    """CSV text of rows (dicts) with the given columns, every cell through csv_cell."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([csv_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def read_csv(path):
    """The rows of a CSV this module wrote, as dicts of str, with the injection guard removed,
    so values equal the identifiers in RESULTS."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v[1:] if v.startswith("'") else v for k, v in row.items()} for row in csv.DictReader(f)]


def write_grades(path, results):
    """grades.csv: one row per (student, lesson, test), COLUMNS, points summed over aspects."""
    rows = [dict(student=r["student"], lesson=r["lesson"], test=t["test"], points=t["points"],
                 max_points=t["max_points"], status=t["status"], message=" | ".join(t["message"].splitlines()))
            for r in results for t in r["tests"]]
    write_atomic(path, csv_text(rows, COLUMNS))


def read_grades(path):
    return read_csv(path)
