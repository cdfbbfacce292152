"""The counting rule and the final scores: how RESULTS turns stored results into the score of a student on a
lesson, one count for everything (the export, totals.csv, the feedback pages, the class report).

A lesson's score is the sum of its tests' points. A test the grader itself could not run
(TestRow.needs_regrade) counts neither as 0 nor as full marks: the student's lesson is left blank
(out of the total and its maximum too) and listed under `regrade`, to be graded again. So is a stored
result the store refused (results.load_term): its row says `<lesson>: refused: <why>`.

A lesson never handed in (a roster student's lesson with no result, or a result whose every test is `missing`)
is one state everywhere: MISSING in its flags, 0 of the lesson's points, or blank (out of the total) when the
rule says so (blank_missing).

The rule (Counting) is RESULTS's, kept with its other settings (config.read_settings): written questions (their
scores the gradebook's manual ones; one not graded yet leaves the lesson blank, `needs grading`), late penalties
(Late: deadlines, policy, extensions, grace), a lesson never handed in blank or 0, stale manual scores kept or
dropped. `python -m autograder rule` sets it; every other command reads it (config.rule_from_flags).

Late penalties (LESSON=ISO8601 deadlines, a policy 10%/day[,max=50%]): each started day (or hour) after the
deadline costs that share of the points earned, up to the cap. A grace (15m, 2h, 1d) lets work that late count
as on time (later work is counted from the deadline), and extensions (student,lesson,deadline or
student,lesson,exempt) give a student their own deadline or none. Submission times come from the stored results
(submitted_at) or SUBMISSIONS/<student>/<lesson>/timestamp.txt, which `collect` writes from real sources only; a
submission without one is counted unpenalised, flagged and named in a warning. Raw and penalised scores are both
kept: in the plain CSV, and in RESULTS/late-penalties.csv.
"""

import csv
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from autograder.results import NEEDS_GRADING, UNANSWERED, Result, UsageError, csv_text, read_timestamp, write_atomic

TOTALS, PENALTIES = "totals.csv", "late-penalties.csv"
EXEMPT = "exempt"  # an extension's deadline that takes none
MISSING = "never handed in"  # a lesson with no notebook: no result on a roster student's row, or every test missing
POLICY = re.compile(r"(?P<rate>\d+(?:\.\d+)?)%/(?P<unit>day|hour)(?:,\s*max=(?P<cap>\d+(?:\.\d+)?)%)?")


class RuleError(UsageError):
    """A counting rule, or a file it reads (extensions), that cannot be used: one line, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------


@dataclass
class Score:
    points: float | None  # None: some test must be graded again, so no score yet
    max_points: float
    regrade: list  # tests the grader could not run
    submitted: bool  # any test other than `missing`
    raw: float | None = None  # before a late penalty
    late: int = 0  # started days (or hours) after the deadline
    penalty: float = 0.0  # share of the points taken, 0..1
    refused: str = ""  # why the stored result was refused (then points is None)
    flag: str = ""  # manual scores, why its late penalty was not taken (no submission time, exempt)
    stale: list = field(default_factory=list)  # tests whose manual score predates their autograded result
    pending: list = field(default_factory=list)  # written questions counted but not graded yet (then points is None)
    late_note: str = ""  # the late penalty taken, in a sentence for the student's feedback page
    missing: bool = False  # never handed in (MISSING): 0, or no score when the rule leaves it blank


def score(
    result: Result, review=None, drop_stale: bool = False, written: bool = False, blank_missing: bool = False
) -> Score:
    """A Result's Score; with a gradebook Review, a test's manual score replaces its autograded points
    (a stale one only unless drop_stale; a test the grader could not run is decided by one) and extra
    credit adds to the lesson's points, not to its maximum, as nbgrader counts them. written: its written
    questions count (their points in the maximum, their scores the Review's manual ones): one not graded yet
    leaves the lesson without a score (pending), one whose notebook was missing or refused counts 0, as its
    tests do. Without written they count nowhere. A result never handed in (every test missing) is MISSING:
    0 of its points, or no score with blank_missing, as a roster student's lesson with no result (table).
    review is duck-typed (gradebook.Review: manual {test: score}, extra {test: points}, stale [test])."""
    given, extra, stale = (review.manual, review.extra, review.stale) if review else ({}, {}, [])
    manual = {t: p for t, p in given.items() if not (drop_stale and t in stale)}
    regrade = [t.test for t in result.tests if t.needs_regrade and t.test not in manual]
    questions = result.written if written else ()
    pending = [w.question for w in questions if w.status == NEEDS_GRADING and w.question not in manual]
    tests = {t.test for t in result.tests} | {w.question for w in questions}
    points = (
        None
        if regrade or pending
        else sum(manual.get(t.test, t.points) for t in result.tests)
        + sum(manual.get(w.question, 0.0) for w in questions)
        + sum(p for t, p in extra.items() if t in tests)
    )
    missing = not result.submitted
    if missing and blank_missing:
        points = None
    flags = [MISSING] if missing else []
    flags += [f"manual: {', '.join(sorted(t for t in manual if t in tests))}"] if set(manual) & tests else []
    flags += [f"stale override {'dropped' if drop_stale else 'kept'}: {t}" for t in sorted(stale) if t in tests]
    flags += [f"extra credit: {t}" for t in sorted(extra) if t in tests]
    flags += [f"{NEEDS_GRADING}: {', '.join(pending)}"] if pending else []
    unanswered = [w.question for w in questions if w.status == UNANSWERED and w.question not in manual]
    flags += [f"{UNANSWERED} (0): {', '.join(unanswered)}"] if unanswered else []
    return Score(
        points,
        result.max_points + sum(w.max_points for w in questions),
        regrade,
        result.submitted,
        raw=points,
        flag="; ".join(flags),
        stale=sorted(t for t in stale if t in tests),
        pending=pending,
        missing=missing,
    )


def table(
    results: list,
    refused: dict | None = None,
    roster=None,
    blank_missing: bool = False,
    reviews=None,
    drop_stale: bool = False,
    written: bool = False,
) -> tuple:
    """(students, lessons, {(student, lesson): Score}) of a list of Results and of the refused stored
    results {(student, lesson): why}, which have no score. With a roster, every roster student has a
    score in every lesson: one never handed in is MISSING, 0 of the lesson's points (blank_missing:
    no score, out of the total). reviews: the gradebook's {(student, lesson): Review}; written: the
    written questions count (see score)."""
    reviews = reviews or {}
    scores = {
        (r.student, r.lesson): score(r, reviews.get((r.student, r.lesson)), drop_stale, written, blank_missing)
        for r in results
    }
    for pair, why in (refused or {}).items():
        scores.setdefault(pair, Score(None, 0.0, [], False, refused=why))
    lessons = sorted({lsn for _, lsn in scores})
    full = {lsn: max(s.max_points for (_, l2), s in scores.items() if l2 == lsn) for lsn in lessons}
    for student in (r["student"] for r in (roster.rows if roster else ())):
        for lsn in lessons:
            scores.setdefault(
                (student, lsn),
                Score(
                    None if blank_missing else 0.0,
                    full[lsn],
                    [],
                    False,
                    raw=None if blank_missing else 0.0,
                    flag=MISSING,
                    missing=True,
                ),
            )
    return sorted({s for s, _ in scores}), lessons, scores


def totals_rows(students: list, lessons: list, scores: dict, detail: bool = False, pending: str = "") -> list:
    """One dict per student: a column per lesson, total, max_points, percentage, regrade; with detail,
    also `<lesson> raw` and `<lesson> penalty %` (the late penalty taken). A lesson whose written questions
    are not graded yet says `pending` (totals.csv: NEEDS_GRADING; an export: blank, flagged) and is out of
    the total and its maximum."""
    rows = []
    for student in students:
        row, got, full, regrade, flags = {"student": student}, 0.0, 0.0, [], []
        for lesson in lessons:
            s = scores.get((student, lesson))
            if s is None:
                regrade.append(f"{lesson}: not graded")
                continue
            if s.flag:
                flags.append(f"{lesson}: {s.flag}")
            if s.points is None and s.missing:
                continue
            if s.points is None and s.pending and not s.regrade and not s.refused:
                row[lesson] = pending
                continue
            if s.points is None:
                regrade.append(f"{lesson}: refused: {s.refused}" if s.refused else f"{lesson}: {', '.join(s.regrade)}")
                continue
            row[lesson] = round(s.points, 2)
            if detail:
                row[f"{lesson} raw"], row[f"{lesson} penalty %"] = round(s.raw, 2), round(100 * s.penalty, 2)
            got, full = got + s.points, full + s.max_points
        row.update(
            total=round(got, 2),
            max_points=round(full, 2),
            percentage=round(100 * got / full, 2) if full else "",
            regrade="; ".join(regrade),
        )
        if detail or flagged(scores):
            row["flags"] = "; ".join(flags)
        rows.append(row)
    return rows


def flagged(scores: dict) -> bool:
    return any(s.flag for s in scores.values())


def totals_columns(lessons: list, scores: dict, detail: bool = False) -> list:
    per = [[lsn, f"{lsn} raw", f"{lsn} penalty %"] if detail else [lsn] for lsn in lessons]
    return (
        ["student"]
        + [c for cols in per for c in cols]
        + ["total", "max_points", "percentage", "regrade"]
        + (["flags"] if detail or flagged(scores) else [])
    )


def stale_warning(stale: list, drop_stale: bool = False) -> list:
    """[the warning line] naming the stale manual scores ("student lesson test" each), or [] when there are none."""
    if not stale:
        return []
    fate = (
        "dropped: the new result counts"
        if drop_stale
        else "kept: they still win (rule RESULTS --stale-overrides drop uses the new result)"
    )
    return [
        "stale manual scores (the autograded result or the written answer changed since they were made; review "
        f"them in formgrader), {fate}: {', '.join(stale)}"
    ]


def grouped(cause: str, items) -> list:
    """Warning lines for many results with one cause, readable at 600: one line per cause (and detail, when items
    carry a third element, e.g. why a result was refused), with its count, each student named once with their
    lessons: "cause[: detail] (3): bob 01_attention, 02_heads; carol 01_attention".
    items: (student, lesson[, detail])."""
    by_detail = {}
    for student, lesson, *detail in sorted(items):
        by_detail.setdefault(detail[0] if detail else "", {}).setdefault(student, []).append(lesson)
    return [
        f"{cause}{f': {detail}' if detail else ''} ({sum(map(len, who.values()))}): "
        + "; ".join(f"{s} {', '.join(lessons)}" for s, lessons in who.items())
        for detail, who in sorted(by_detail.items())
    ]


@dataclass
class Late:
    """A late policy, parsed: {lesson: aware deadline}, its text (N%/day[,max=M%]), extensions {(student, lesson):
    aware deadline or EXEMPT}, grace (timedelta), SUBMISSIONS where collect wrote timestamp.txt (or None)."""

    deadlines: dict
    policy: str
    extensions: dict = field(default_factory=dict)
    grace: timedelta = timedelta(0)
    submissions: str | None = None

    def said(self):
        """One line for people: the policy, each deadline, how many extensions, the grace (as --grace takes it)."""
        deadlines = ", ".join(f"{lsn} {d.isoformat()}" for lsn, d in sorted(self.deadlines.items()))
        return (
            f"{self.policy} after {deadlines}"
            + (f", {len(self.extensions)} extension(s)" if self.extensions else "")
            + (f", {self.grace_said()}" if self.grace else "")
        )

    def grace_said(self):
        """The grace as --grace takes it ('grace 15m', '2h', '1d'), or 'no grace'."""
        minutes = self.grace.total_seconds() / 60
        if not minutes:
            return "no grace"
        return "grace " + (
            f"{minutes / 1440:g}d"
            if minutes % 1440 == 0
            else f"{minutes / 60:g}h"
            if minutes % 60 == 0
            else f"{minutes:g}m"
        )

    def changes(self, before: "Late", then: str) -> list:
        """What differs from `before`, item by item: the policy, each lesson's deadline, the grace, each student's
        extension (see Counting.changes)."""

        def each(kind, mine, theirs):
            return [
                f"{kind} {' '.join(key) if isinstance(key, tuple) else key}: {_moment(mine.get(key))} "
                f"({then}{_moment(theirs.get(key))})"
                for key in sorted(set(mine) | set(theirs))
                if mine.get(key) != theirs.get(key)
            ]

        return (
            ([f"late policy {self.policy} ({then}{before.policy})"] if self.policy != before.policy else [])
            + each("deadline of", self.deadlines, before.deadlines)
            + ([f"{self.grace_said()} ({then}{before.grace_said()})"] if self.grace != before.grace else [])
            + each("extension of", self.extensions, before.extensions)
        )


@dataclass
class Counting:
    """How scores are counted beyond the results and the gradebook: a roster student's lesson never handed in
    blank (else 0), stale manual scores dropped (else kept), late penalties (a Late, or None), the written
    questions counted (--written)."""

    blank_missing: bool = False
    drop_stale: bool = False
    late: Late | None = None
    written: bool = False

    def to_json(self):
        late = self.late and dict(
            deadlines={lsn: d.isoformat() for lsn, d in sorted(self.late.deadlines.items())},
            policy=self.late.policy,
            extensions=[
                [s, lsn, d if d == EXEMPT else d.isoformat()] for (s, lsn), d in sorted(self.late.extensions.items())
            ],
            grace_seconds=self.late.grace.total_seconds(),
            submissions=self.late.submissions,
        )
        return dict(blank_missing=self.blank_missing, drop_stale=self.drop_stale, late=late, written=self.written)

    @classmethod
    def from_json(cls, data):
        late = data["late"]
        return cls(
            bool(data["blank_missing"]),
            bool(data["drop_stale"]),
            late
            and Late(
                {lsn: datetime.fromisoformat(d) for lsn, d in late["deadlines"].items()},
                late["policy"],
                {(s, lsn): d if d == EXEMPT else datetime.fromisoformat(d) for s, lsn, d in late["extensions"]},
                timedelta(seconds=late["grace_seconds"]),
                late["submissions"],
            ),
            bool(data["written"]),
        )

    def parts(self):
        """What this counting does beyond the results and the gradebook, in words: late penalties, a lesson never
        handed in, stale manual scores, written questions."""
        return [
            f"late penalties: {self.late.said()}" if self.late else "no late penalties",
            "a lesson never handed in blank" if self.blank_missing else "a lesson never handed in 0",
            f"stale manual scores {'dropped' if self.drop_stale else 'kept'}",
            f"written questions {'counted' if self.written else 'not counted'}",
        ]

    def said(self) -> str:
        return "; ".join(self.parts())

    def changes(self, before: "Counting", then: str = "before: ") -> list:
        """What differs from `before`, each "<now> (before: <then>)": a part of parts(), or, where both have late
        penalties, the policy, one lesson's deadline, the grace or one student's extension (Late.changes; a rule
        that names the same number of extensions but other ones differs too). then names `before` in the text."""
        late = self.late and before.late
        said = [
            f"{mine} ({then}{theirs})"
            for i, (mine, theirs) in enumerate(zip(self.parts(), before.parts()))
            if mine != theirs and not (late and i == 0)  # parts()[0]: the late penalties, itemised below
        ]
        return said + (self.late.changes(before.late, then) if late else [])


def _moment(when) -> str:
    return "none" if when is None else when if when == EXEMPT else when.isoformat()


def missing_note(s: Score, counting: "Counting") -> str:
    """The sentence on a page of a lesson never handed in, as totals.csv and the export count it."""
    return (
        f"{MISSING.capitalize()}: this lesson is left blank, out of your total."
        if counting.blank_missing
        else f"{MISSING.capitalize()}: this lesson counts 0 of its {s.max_points:g} points."
    )


def final_scores(
    results: list, refused: dict | None = None, roster=None, reviews=None, counting: "Counting | None" = None
) -> tuple:
    """The final score of every student on every lesson, as an instructor exports it: (students, lessons,
    {(student, lesson): Score}, the late-penalties.csv rows, warning lines). table's scores (the gradebook's
    manual scores and extra credit, the roster's students who never handed a lesson in) counted as counting (a
    Counting; default: Counting()) says: written questions, stale manual scores, late penalties. The export,
    totals.csv and the class report all count with this."""
    counting = counting or Counting()
    students, lessons, scores = table(
        results, refused, roster, counting.blank_missing, reviews, counting.drop_stale, counting.written
    )
    rows, warnings = apply_penalties(results, scores, counting.late) if counting.late else ([], [])
    return students, lessons, scores, rows, warnings


def write_final(
    out, results: list, refused: dict | None = None, roster=None, reviews=None, counting: "Counting | None" = None
) -> Path:
    """What the final scores (final_scores) make in RESULTS (out): the feedback pages (report.write_feedback: the
    gradebook's reviews, the written questions as counting counts them, the late penalty taken) and totals.csv,
    one row per student (every roster student, with a roster), a column per lesson (its
    final score: final_scores, as the export counts, late penalties too), total, max_points, percentage, regrade
    (what must be graded again, never counted; refused {(student, lesson): why} too) and, where a score is
    flagged (a lesson never handed in, a manual score from the gradebook's reviews, written questions still to
    grade: NEEDS_GRADING in the lesson's column, a submission without a time), flags. counting: RESULTS's rule
    (config.read_settings(out).rule; default: Counting()). With late penalties, RESULTS/late-penalties.csv beside
    it (else none). Returns totals.csv's path."""
    from autograder.report import write_feedback  # not at import: report loads the checks (torch)

    counting = counting or Counting()
    students, lessons, scores, penalties, _ = final_scores(results, refused, roster, reviews, counting)
    write_feedback(
        out,
        results,
        reviews,
        counting.written,
        {pair: s.late_note or missing_note(s, counting) for pair, s in scores.items() if s.late_note or s.missing},
        counting.drop_stale,
    )
    path = Path(out) / TOTALS
    write_atomic(
        path, csv_text(totals_rows(students, lessons, scores, pending=NEEDS_GRADING), totals_columns(lessons, scores))
    )
    if penalties:
        write_atomic(Path(out) / PENALTIES, csv_text(penalties, list(penalties[0])))
    else:  # one left by an earlier export would contradict totals.csv
        (Path(out) / PENALTIES).unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------------------------
# Late penalties
# ---------------------------------------------------------------------------------------------


def parse_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ValueError, ZoneInfoNotFoundError):
        raise RuleError(f"unknown time zone {name!r} (use a name like UTC or Europe/Berlin)") from None


def parse_moment(when: str, shown: str, zone: ZoneInfo) -> datetime:
    """An aware datetime from an ISO 8601 time (`zone` when it names none); shown names it in errors."""
    try:
        moment = datetime.fromisoformat(when.strip())
    except ValueError:
        raise RuleError(f"{shown}: {when!r} is not an ISO 8601 time (e.g. 2026-10-01T23:59:00+02:00)") from None
    if "T" not in when.strip().upper().replace(" ", "T"):  # a date alone would mean its first second
        raise RuleError(
            f"{shown}: give the time too (e.g. {when.strip()}T23:59:00), a date alone would mean midnight at its start"
        )
    return moment if moment.tzinfo else moment.replace(tzinfo=zone)


def parse_deadlines(specs, lessons, zone: ZoneInfo) -> dict:
    """{lesson: aware datetime} from LESSON=ISO8601 strings; a time without a zone is in `zone`."""
    deadlines = {}
    for spec in specs:
        lesson, sep, when = spec.partition("=")
        if not sep or lesson not in lessons:
            raise RuleError(
                f"--deadline takes LESSON=ISO8601 with a lesson of these results ({', '.join(lessons)}); got {spec!r}"
            )
        if lesson in deadlines:
            raise RuleError(f"--deadline given twice for {lesson}")
        deadlines[lesson] = parse_moment(when, f"--deadline {spec!r}", zone)
    return deadlines


def parse_extensions(path, deadlines: dict, zone, students=None) -> dict:
    """{(student, lesson): aware datetime, or EXEMPT} from a CSV student,lesson,deadline where deadline
    is an ISO 8601 time or `exempt`; each of its lessons must have a --deadline, and each of its students be one of
    `students` (the roster's and RESULTS's; None: any): a typo would silently take a student's extension away."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's CSV may start with a BOM
            reader = csv.DictReader(f)
            rows = [{k.strip().casefold(): (v or "") for k, v in row.items() if k} for row in reader]
            header = {k.strip().casefold() for k in reader.fieldnames or ()}
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise RuleError(f"cannot read the extensions {path}: {e}") from None
    if not {"student", "lesson", "deadline"} <= header:
        raise RuleError(f"the extensions {path} need the columns student, lesson, deadline (a time or 'exempt')")
    found = {}
    for number, row in enumerate(rows, 2):
        student, lesson, when = (row[c].strip() for c in ("student", "lesson", "deadline"))
        shown = f"the extensions {path}, line {number}"
        if lesson not in deadlines:
            raise RuleError(f"{shown}: {lesson!r} has no --deadline (lessons with one: {', '.join(deadlines)})")
        if students is not None and student not in students:
            raise RuleError(
                f"{shown}: no student {student!r} in the roster or the results (a typo? "
                f"--allow-mismatch keeps it anyway)"
            )
        if (student, lesson) in found:
            raise RuleError(f"{shown}: a second extension for {student} {lesson}")
        found[student, lesson] = EXEMPT if when.casefold() == EXEMPT else parse_moment(when, shown, zone)
    return found


def parse_grace(text: str) -> timedelta:
    """A timedelta from '15m', '2h' or '1d' (minutes, hours, days)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(m|min|h|d)", (text or "").strip())
    if not m:
        raise RuleError(f"--grace takes a duration like 15m, 2h or 1d; got {text!r}")
    unit = {"m": "minutes", "min": "minutes", "h": "hours", "d": "days"}[m[2]]
    return timedelta(**{unit: float(m[1])})


def parse_policy(text: str) -> tuple:
    """(share per unit, timedelta unit, cap share) from '10%/day' or '5%/hour,max=50%'."""
    m = POLICY.fullmatch(text.replace(" ", ""))
    if not m or float(m["rate"]) > 100 or (m["cap"] and float(m["cap"]) > 100):
        raise RuleError(
            f"--late-policy takes N%/day or N%/hour, optionally ',max=M%' (e.g. 10%/day,max=50%); got {text!r}"
        )
    return (
        float(m["rate"]) / 100,
        timedelta(days=1) if m["unit"] == "day" else timedelta(hours=1),
        float(m["cap"]) / 100 if m["cap"] else 1.0,
    )


def submission_time(result: Result, submissions: str | None) -> datetime | None:
    """The stored submission time of a Result (aware datetime) or None."""
    text = result.submitted_at
    if not text and submissions:
        text, _ = read_timestamp(Path(submissions) / result.student / result.lesson)
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=ZoneInfo("UTC"))


def apply_penalties(results: list, scores: dict, late: "Late") -> tuple:
    """Penalise scores in place by a Late; returns (the late-penalties.csv rows, warning lines). A submitted
    result of a lesson with a deadline and no submission time, or an exempt one, is not penalised and is flagged
    (Score.flag); work within the grace of its deadline is on time; extensions replace a lesson's deadline for
    a student."""
    rate, unit, cap = parse_policy(late.policy)
    rows, untimed = [], {}
    for r in results:
        pair = (r.student, r.lesson)
        s, deadline = scores[pair], late.extensions.get(pair, late.deadlines.get(r.lesson))
        if deadline is None or not s.submitted:
            continue
        moment = None if deadline == EXEMPT else submission_time(r, late.submissions)
        if moment is None:
            s.flag = "; ".join(
                filter(
                    None,
                    [s.flag, "exempt from the deadline" if deadline == EXEMPT else "no submission time: not penalised"],
                )
            )
            if deadline != EXEMPT:
                untimed.setdefault(r.lesson, []).append(r.student)
        else:
            behind = moment - deadline
            s.late = math.ceil(behind / unit) if behind > late.grace else 0
            s.penalty = min(cap, rate * s.late)
            if s.points is not None:
                s.points = round(s.raw * (1 - s.penalty), 4)
            if s.penalty:  # said where the score is: totals.csv's flags, the student's page
                late_units = f"{s.late} {'day' if unit == timedelta(days=1) else 'hour'}{'s' if s.late > 1 else ''}"
                s.flag = "; ".join(filter(None, [s.flag, f"late {late_units}: -{100 * s.penalty:g}%"]))
                s.late_note = (
                    ""
                    if s.points is None
                    else (
                        f"Handed in {late_units} after your deadline ({deadline.isoformat()}): "
                        f"{100 * s.penalty:g}% off the points earned, so {s.points:g} of {s.raw:g} count."
                    )
                )
        rows.append(
            dict(
                student=r.student,
                lesson=r.lesson,
                submitted_at=moment.isoformat() if moment else "",
                deadline=deadline if deadline == EXEMPT else deadline.isoformat(),
                late_units=s.late,
                penalty_percent=round(100 * s.penalty, 2),
                raw=s.raw if s.raw is not None else "",
                penalised=s.points if s.points is not None else "",
                flag=s.flag,
            )
        )
    hint = "collect with --times or a Moodle worksheet that lists them" + (
        "" if late.submissions else ", or give --submissions where collect wrote timestamp.txt"
    )
    warnings = [
        f"no submission time for {len(who)} submission(s) of {lesson}: {', '.join(who)}: exported "
        f"unpenalised and flagged; {hint}"
        for lesson, who in sorted(untimed.items())
    ]
    return rows, warnings
