"""The lessons, each described once: lessons/NN_name/lesson.toml.

A manifest holds what the course knows about a lesson beyond its notebook and code:

    title = "Scaled dot-product attention"
    summary = "One line on what it teaches (the book's lesson table)."
    solutions = "attention"    # solutions/attention.py, autograder/lessons/attention/checks.py
    extras = []                # pyproject extras its grading needs (Gradescope's setup.sh installs them)
    data = []                  # files of the lesson's folder its notebook reads: students get them beside the
                               # notebook (release), and so does its code when it is graded

    [limits]                   # optional: the grader's limits for this lesson, over autograder.worker's
    memory_mb = 4096           # DEFAULT_LIMITS (any field of Limits, positive whole numbers); grade's own
    notebook_seconds = 900     # flags (--memory, --cell-timeout, ...) override both

    [graded.softmax]           # one table per graded name, in the notebook's order
    points = 2                 # equal to the notebook's test cell points (a test checks it)
    contract = "Numerically stable for large and `-inf` entries."   # the book's API page, MyST Markdown

    [needs.triton]             # an optional package; without it these checks cannot run (status error)
    names = ["triton_attention"]
    reason = "Triton is not installed where the grader runs (...)"

    [forbids.flash_attention]  # what a graded function may not reach, switched off where that aspect is graded
    aspect = "tiled"           # the check's aspect it costs (autograder.checking: Subject.aspect runs that aspect's
    paths = ["attention kernels"]  # calls in a process with these paths off: autograder/sandbox/tripwires.py)
    instead = "write the tiled loop yourself"   # what the message tells the student to do instead

`LESSONS` (autograder.checking), Gradescope's extras, the book's lesson list, the tests' lesson list, the
files a release and a grading run give the notebook, and each lesson's limits are derived from these files;
title, summary and contract are the book's text, and editing them regrades nobody (grading_keys). Python 3.10
has no tomllib: there a small reader takes the subset above (tables, and strings, numbers and lists of strings
on one line each).
"""

import ast
import functools
import importlib.util
import re
from pathlib import Path

from autograder import notebook as nbk
from autograder.sandbox import tripwires
from autograder.worker import DEFAULT_LIMITS, Limits, LimitsError

MANIFEST = "lesson.toml"
KEYS = {
    "title": str,
    "summary": str,
    "solutions": str,
    "extras": list,
    "data": list,
    "graded": dict,
    "needs": dict,
    "limits": dict,
    "forbids": dict,
}
FORBID_KEYS = {"aspect": str, "paths": list, "instead": str}
REQUIRED = ("title", "summary", "solutions", "graded")


class LessonError(ValueError):
    """A manifest that cannot be used; the message is one line naming the file and the key."""


def names(root=nbk.LESSONS_DIR):
    """The lessons that have a manifest, in order."""
    return sorted(p.parent.name for p in Path(root).glob(f"*/{MANIFEST}") if re.fullmatch(r"\d\d_\w+", p.parent.name))


@functools.lru_cache(maxsize=None)
def read(lesson, root=nbk.LESSONS_DIR):
    """The lesson's manifest as a validated dict (every key of KEYS present, defaults filled in)."""
    path = Path(root) / lesson / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise LessonError(f"{path}: cannot read it ({type(e).__name__})") from None
    try:
        data = _toml(text)
    except ValueError as e:
        raise LessonError(f"{path}: not valid TOML: {e}") from None
    return validate(data, path)


def validate(data, path):
    def bad(key, problem):
        raise LessonError(f"{path}: {key}: {problem}")

    for key in data:
        if key not in KEYS:
            bad(key, f"unknown key; a manifest has {', '.join(KEYS)}")
    for key in REQUIRED:
        if key not in data:
            bad(key, "missing")
    for key, kind in KEYS.items():
        if key in data and not isinstance(data[key], kind):
            bad(key, f"should be a {'table' if kind is dict else kind.__name__}")
    if not data["solutions"].isidentifier():
        bad("solutions", f"{data['solutions']!r} is not a module name")
    for key in ("extras", "data"):
        if not all(isinstance(v, str) and v for v in data.get(key, [])):
            bad(key, "should be a list of non-empty strings")
    for name in data.get("data", []):
        if not (Path(path).parent / name).is_file():
            bad("data", f"{name} is not a file of the lesson's folder")
    if not data["graded"]:
        bad("graded", "names no graded function")
    for name, entry in data["graded"].items():
        key = f"graded.{name}"
        if not name.isidentifier() or not isinstance(entry, dict):
            bad(key, "should be a table named after a graded function")
        if set(entry) - {"points", "contract"}:
            bad(key, f"unknown key {sorted(set(entry) - {'points', 'contract'})[0]}; use points and contract")
        points = entry.get("points")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
            bad(f"{key}.points", "should be a positive number")
        if not isinstance(entry.get("contract"), str) or not entry["contract"].strip():
            bad(f"{key}.contract", "should be a non-empty string (the book's line on it)")
    for package, entry in data.get("needs", {}).items():
        key = f"needs.{package}"
        if not isinstance(entry, dict) or set(entry) != {"names", "reason"}:
            bad(key, "should be a table with names and reason")
        if not isinstance(entry["reason"], str) or not entry["reason"]:
            bad(f"{key}.reason", "should be a non-empty string")
        unknown = (
            [n for n in entry["names"] if n not in data["graded"]]
            if isinstance(entry["names"], list)
            else ["(not a list)"]
        )
        if unknown:
            bad(f"{key}.names", f"{unknown[0]} is not a graded name of this lesson")
    for name, entry in data.get("forbids", {}).items():
        key = f"forbids.{name}"
        if name not in data["graded"]:
            bad(key, f"{name} is not a graded name of this lesson")
        if not isinstance(entry, dict) or set(entry) != set(FORBID_KEYS):
            bad(key, f"should be a table with {', '.join(FORBID_KEYS)}")
        for field, kind in FORBID_KEYS.items():
            if not isinstance(entry[field], kind) or not entry[field]:
                bad(f"{key}.{field}", f"should be a non-empty {kind.__name__}")
        unknown = [p for p in entry["paths"] if p not in tripwires.PATHS]
        if unknown:
            bad(
                f"{key}.paths",
                f"{unknown[0]!r} is not a path autograder/sandbox/tripwires.py knows ({', '.join(tripwires.PATHS)})",
            )
    try:
        DEFAULT_LIMITS.over(data.get("limits"))  # Limits' own reader names the field
    except LimitsError as e:
        raise LessonError(f"{path}: {e}") from None
    return {"extras": [], "data": [], "needs": {}, "limits": {}, "forbids": {}, **data}


def solutions_modules():
    """{lesson: its solutions (and checks) module name}: autograder.checking.LESSONS."""
    return {lesson: read(lesson)["solutions"] for lesson in names()}


def extras():
    """{lesson: [pyproject extras]} of the lessons whose grading needs some."""
    return {lesson: read(lesson)["extras"] for lesson in names() if read(lesson)["extras"]}


def points(lesson, root=nbk.LESSONS_DIR):
    """{graded name: points}, in the manifest's order."""
    return {name: entry["points"] for name, entry in read(lesson, root)["graded"].items()}


def forbids(lesson, root=nbk.LESSONS_DIR):
    """{graded name: {"aspect", "paths", "instead"}}: what each graded function may not reach, and the aspect it
    costs (autograder.checking enforces it)."""
    return read(lesson, root)["forbids"]


def catalogue():
    """The book's list: {lesson: {"title", "summary", "graded": {name: contract}}}."""
    return {
        lesson: {
            "title": read(lesson)["title"],
            "summary": read(lesson)["summary"],
            "graded": {n: e["contract"] for n, e in read(lesson)["graded"].items()},
        }
        for lesson in names()
    }


def limits(lesson, root=nbk.LESSONS_DIR) -> Limits:
    """The Limits the lesson is graded under: autograder.worker.DEFAULT_LIMITS with its manifest's [limits]
    (often none) over them."""
    return DEFAULT_LIMITS.over(read(lesson, root)["limits"])


def grading_keys(lesson, root=nbk.LESSONS_DIR):
    """What of the manifest a verdict depends on (grade's fingerprint hashes it): the solutions module, the
    graded names and points, the data files' names, the optional packages' checks, the limits and what is forbidden
    (only where something is: a lesson without forbids keeps its fingerprint). Not the
    title, the summary, the contracts (the book's text) or the extras (what Gradescope installs)."""
    m = read(lesson, root)
    return {
        "solutions": m["solutions"],
        "points": points(lesson, root),
        "data": m["data"],
        "needs": m["needs"],
        "limits": m["limits"],
        **({"forbids": m["forbids"]} if m["forbids"] else {}),
    }


def unavailable(lesson, installed=None):
    """{graded name: why} of the lesson's checks whose package (needs) is missing here.
    installed: {package: bool} as the lesson's code found it; by default, whether it can be imported."""
    found = {}
    for package, entry in read(lesson)["needs"].items():
        here = (installed or {}).get(package)
        if not (here if here is not None else importlib.util.find_spec(package) is not None):
            found.update(dict.fromkeys(entry["names"], entry["reason"]))
    return found


# ---- TOML ---------------------------------------------------------------------------------------


def _toml(text):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return _toml_subset(text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(str(e)) from None


def _toml_subset(text):
    """The TOML this module's docstring shows: [a.b] tables, key = string, number, bool or list on one line."""
    data = table = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([\w.]+)\]\s*(#.*)?", line)
        if header:
            table = data
            for part in header.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"line {number}: expected key = value")
        try:
            parsed = ast.literal_eval(
                re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", value.strip()))
                if not value.strip().startswith('"')
                else value.strip()
            )
        except (ValueError, SyntaxError):
            raise ValueError(f"line {number}: unreadable value") from None
        table[key.strip()] = parsed
    return data
