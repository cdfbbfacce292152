"""The settings RESULTS keeps between runs, in one file, and the flags a run gives to agree with them.

RESULTS/.results/settings.json (Settings: read_settings, write_settings) holds what every command on the folder
must agree on:
    rule        the counting rule (counting.Counting): written questions, deadlines, late policy, grace,
                extensions, a lesson never handed in blank or 0, stale manual scores kept or dropped
    gradebook   the nbgrader gradebook whose manual scores its totals.csv and feedback pages hold

`python -m autograder rule RESULTS [flags]` sets or changes the rule and says what changed; it is the only
command that does. grade, merge and report read it, and refuse flags that disagree with it in one line
(RuleFlags.refuse); an export given flags that disagree counts them as a trial, written only to its own file
(RuleFlags.rule_over). A folder without settings counts by the default rule (Counting()); its first grade or merge
records it, with --written when given.

The other files of RESULTS/.results are not settings, and stay apart on purpose:
    run.json    the grading's record of what the folder holds (results.Run: shard, manifest, lessons, a partial
                merge's gaps), rewritten by each grade and merge from what it did, never set by a person. Its life
                is the results': deleting it starts the folder afresh (grade says so), which must not drop the rule.
    cache.json  what grade computes again when it is gone (grade.Cache: source files' hashes, the reference
                self-checks passed): losing it costs time, never a setting or a verdict, so it is written without
                fsync and an unreadable one counts as empty; settings are written durably and refused when damaged.
    roster.csv  a copy of the class's roster (roster.remember_roster): data a later export counts, not a choice.
"""

import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from autograder.counting import (
    Counting,
    Late,
    RuleError,
    parse_deadlines,
    parse_extensions,
    parse_grace,
    parse_policy,
    parse_zone,
)
from autograder.results import STORE, UsageError, clean, write_atomic

SETTINGS = "settings.json"
FORMAT = "mha-course-results-settings/1"
NO_LATE = "none"  # --late-policy none: no late penalties


@dataclass(frozen=True)
class Settings:
    """What RESULTS keeps between runs: its counting rule and the gradebook of its manual scores (a path or None)."""

    rule: Counting = field(default_factory=Counting)
    gradebook: str | None = None

    def to_json(self) -> dict:
        return {"format": FORMAT, "rule": self.rule.to_json(), "gradebook": self.gradebook}

    @classmethod
    def from_json(cls, data: dict) -> "Settings":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not {FORMAT}")
        rule = Counting.from_json(data["rule"])
        if rule.late:
            parse_policy(rule.late.policy)
        gradebook = data.get("gradebook")
        if gradebook is not None and not isinstance(gradebook, str):
            raise ValueError("gradebook is not a path")
        return cls(rule, gradebook)


def settings_path(out) -> Path:
    return Path(out) / STORE / SETTINGS


def read_settings(out) -> Settings:
    """RESULTS's Settings (the default ones when it has none); UsageError naming the file when it is damaged."""
    path = settings_path(out)
    if not path.is_file():
        return Settings()
    try:
        return Settings.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise UsageError(
            f"{path} is damaged ({type(e).__name__}: {clean(str(e), 200, newlines=False)}): set the "
            "rule again with `python -m autograder rule`, or delete it to count by the default rule"
        ) from None


def write_settings(out, settings: Settings) -> None:
    write_atomic(settings_path(out), json.dumps(settings.to_json(), indent=1) + "\n")


def set_rule(out, rule: Counting) -> list:
    """Make `rule` RESULTS's (out) counting rule; returns what changed, in words (Counting.changes)."""
    settings = read_settings(out)
    changed = rule.changes(settings.rule)
    write_settings(out, Settings(rule, settings.gradebook))
    return changed


def set_gradebook(out, gradebook: str) -> None:
    """Record the gradebook whose manual scores RESULTS's totals.csv and feedback pages now hold."""
    settings = read_settings(out)
    write_settings(out, Settings(settings.rule, str(Path(gradebook).resolve())))


@dataclass(frozen=True)
class RuleFlags:
    """A command's flags about the counting rule; None (or empty) where not given, which means RESULTS's.
    deadlines are LESSON=ISO8601 texts (one per lesson, replacing that lesson's), policy N%/day[,max=M%] or
    NO_LATE, extensions a CSV's path (replacing them all), grace 15m, 2h or 1d, zone the zone of times that name
    none, submissions where collect wrote timestamp.txt."""

    written: bool | None = None
    blank_missing: bool | None = None
    drop_stale: bool | None = None
    deadlines: tuple = ()
    policy: str | None = None
    extensions: str | None = None
    grace: str | None = None
    zone: str = "UTC"
    submissions: str | None = None

    def given(self) -> bool:
        return any(v not in (None, ()) for k, v in self.__dict__.items() if k not in ("zone", "submissions"))

    def rule_over(self, stored: Counting, lessons, students=None, allow_mismatch: bool = False) -> Counting:
        """The rule these flags make of `stored`: each flag given replaces its part. lessons: those a deadline
        may name; students: those an extension may name (None: any), unless allow_mismatch. RuleError on bad input."""
        late = stored.late
        if self.policy == NO_LATE:
            if self.deadlines or self.extensions or self.grace:
                raise RuleError(f"--late-policy {NO_LATE} takes no --deadline, --extensions or --grace")
            late = None
        elif self.deadlines or self.policy or self.extensions or self.grace or self.submissions:
            zone = parse_zone(self.zone)
            deadlines = dict(late.deadlines if late else {})
            deadlines.update(parse_deadlines(self.deadlines, lessons, zone))
            policy = self.policy.replace(" ", "") if self.policy else late and late.policy
            if policy:
                parse_policy(policy)
            if bool(deadlines) != bool(policy):
                raise RuleError("late penalties need both --deadline LESSON=ISO8601 and --late-policy")
            if not deadlines and (self.extensions or self.grace):
                raise RuleError("--extensions and --grace change late penalties: give --deadline and --late-policy too")
            late = (
                deadlines
                and Late(
                    deadlines,
                    policy,
                    parse_extensions(self.extensions, deadlines, zone, None if allow_mismatch else students)
                    if self.extensions
                    else late.extensions
                    if late
                    else {},
                    parse_grace(self.grace) if self.grace else late.grace if late else timedelta(0),
                    str(Path(self.submissions).resolve()) if self.submissions else late and late.submissions,
                )
                or None
            )
        pick = lambda given, kept: kept if given is None else given  # noqa: E731
        return Counting(
            pick(self.blank_missing, stored.blank_missing),
            pick(self.drop_stale, stored.drop_stale),
            late,
            pick(self.written, stored.written),
        )

    def refuse(self, out, stored: Counting, lessons, students=None, allow_mismatch: bool = False) -> None:
        """UsageError, one line, when these flags make another rule than RESULTS's (out) `stored` one."""
        changes = self.rule_over(stored, lessons, students, allow_mismatch).changes(stored, f"{out}: ")
        if changes:
            raise UsageError(
                f"{out} counts otherwise than these flags say: {'; '.join(changes)}; change its rule "
                f"with `python -m autograder rule {out} ...` (it says what changes), or drop the flags"
            )


@dataclass(frozen=True)
class RunConfig:
    """One run of grade, merge, export or report, every setting declared once with its default (in the spirit of
    Otter's AutograderConfig); `python -m autograder` fills it from its flags. The counting rule is RESULTS's
    (read_settings), here as the run agrees with it."""

    results: Path  # RESULTS: graded into, merged into, exported or reported from
    submissions: Path | None = None  # SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb, with collect's times
    roster: object = None  # the class (roster.Roster): a row in totals.csv for each of its students
    gradebook: str | None = None  # nbgrader's gradebook: filled by grade, its manual scores counted
    course_root: str | None = None  # where the gradebook's autograded/ go (default: the gradebook's folder)
    rule: Counting = field(default_factory=Counting)  # how scores count (RESULTS's rule)
    allow_mismatch: bool = False  # go on past a file naming a student or lesson nobody knows
    lessons: tuple | None = None  # grade: these lessons (default: those someone handed in)
    all_lessons: bool = False  # grade: every lesson, handed in or not
    students: tuple | None = None  # grade: these students only
    shard: tuple | None = None  # grade: (i, N), the i-th of N slices of the students
    manifest: str | None = None  # grade: the class list every shard splits; merge: the one the shards must cover
    jobs: int = 1  # grade: submissions graded at once
    resume: bool = False  # grade: reuse each stored result whose fingerprint still matches
    force: bool = False  # grade: with resume, regrade those too
    mode: str = "bwrap"  # grade: the sandbox (worker.choose_mode)
    limits: dict | None = None  # grade: {Limits field: value} over the lessons' own
    gradescope: bool = False  # grade, merge: also RESULTS/gradescope/<student>/results.json
    allow_partial: bool = False  # merge: an incomplete shard set too, its gaps marked for regrading
    progress: bool = True  # grade: a progress line per submission
    kernels: str = ""  # grade: also compile each submission's Triton kernels: "note" (feedback) or "graded" (points)
    names: bool = True  # report: name who made each mistake (report --no-names leaves them out, for a projector)
