"""Scores an LMS can take, from stored results: `python -m autograder export RESULTS --format canvas|csv --out FILE`.

The scores are counting.final_scores's, counted by RESULTS's rule (config.read_settings(out).rule): the same as
totals.csv, the feedback pages and the class report, which an export with that rule refreshes. An export given a
rule of its own (rule_over: flags that disagree with RESULTS's) is a trial: it writes only FILE, and says so.
A lesson the grader could not grade, or whose stored result was refused, is blank and named, never a silent 0;
a lesson never handed in is MISSING, 0 or blank as the rule says, and named.

Canvas's gradebook import is canvas.py's (gradebook_import).
"""

from pathlib import Path

from autograder.adapters import canvas
from autograder.adapters.roster import remember_roster
from autograder.config import RunConfig
from autograder.counting import (
    MISSING,
    RuleError,
    final_scores,
    grouped,
    stale_warning,
    totals_columns,
    totals_rows,
    write_final,
)
from autograder.results import csv_text, write_atomic


class ExportError(RuleError):
    """Bad input to export: one line, exit status 2."""


def export(
    config: RunConfig,
    results: list,
    fmt: str,
    dest,
    trial: bool = False,
    gradebook=None,
    assignments=(),
    refused: dict | None = None,
    reviews=None,
) -> list:
    """Write the export of results (RESULTS is config.results), counted by config.rule, with config.roster's class,
    to dest; unless trial (a rule other than RESULTS's), also
    RESULTS/totals.csv and the feedback pages (the same scores: write_final) and, when penalised,
    RESULTS/late-penalties.csv. Returns warning lines, one per cause (grouped).
    refused: {(student, lesson): why} of stored results the store refused: marked in the rows, left blank in
    Canvas (the command names them). reviews: nbgrader's gradebook {(student, lesson): Review} (gradebook.read_reviews),
    whose manual scores and extra credit count. gradebook: a gradebook exported from Canvas, whose columns are
    filled (canvas.gradebook_import; a maximum that differs stops it unless config.allow_mismatch).
    ExportError on bad input, before anything is written."""
    out, rule, roster = config.results, config.rule, config.roster
    if fmt not in ("canvas", "csv"):
        raise ExportError(f"unknown format {fmt!r}: use canvas or csv")
    if not results and not refused:
        raise ExportError(f"{out} holds no grading results")
    dest = Path(dest)
    if dest.is_dir():
        raise ExportError(f"--out {dest} is a folder; name the CSV file to write")
    lessons = sorted({r.lesson for r in results} | {lsn for _, lsn in refused or {}})
    pairs = dict(a.partition("=")[::2] for a in assignments)
    if any(lsn not in lessons or not name for lsn, name in pairs.items()):
        raise ExportError(f"--assignment takes LESSON=NAME with a lesson of these results ({', '.join(lessons)})")
    students, lessons, scores, penalties, warnings = final_scores(results, refused, roster, reviews, rule)
    detail = bool(rule.late)
    if fmt == "csv":
        text = csv_text(
            totals_rows(students, lessons, scores, detail=detail), totals_columns(lessons, scores, detail=detail)
        )
    else:
        text, more = canvas.gradebook_import(roster, results, lessons, scores, gradebook, pairs, config.allow_mismatch)
        warnings += more
    warnings += grouped(
        "left blank, to be graded again (the grader could not run a test)",
        [
            (s, lsn)
            for (s, lsn), sc in scores.items()
            if sc.points is None and not sc.refused and not sc.missing and (sc.regrade or not sc.pending)
        ],
    )
    warnings += grouped(
        "left blank, written questions to grade in formgrader first",
        [
            (s, lsn, ", ".join(sc.pending))
            for (s, lsn), sc in scores.items()
            if sc.pending and sc.points is None and not sc.regrade
        ],
    )
    warnings += grouped(
        f"{MISSING}, {'left blank' if rule.blank_missing else 'counted as 0'}",
        [(s, lsn) for (s, lsn), sc in scores.items() if sc.missing],
    )
    if roster and fmt == "csv" and (outside := sorted(set(students) - {r["student"] for r in roster.rows})):
        warnings.append(f"not in the roster, kept: {', '.join(outside)}")
    warnings += stale_warning(
        [f"{s} {lsn} {t}" for (s, lsn), sc in sorted(scores.items()) for t in sc.stale], rule.drop_stale
    )
    if not trial:
        write_final(out, results, refused, roster, reviews, rule)
        if roster:
            remember_roster(out, roster)
    write_atomic(dest, text)
    return warnings
