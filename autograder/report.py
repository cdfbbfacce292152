"""Everything written from stored results (results.py): grades.csv, feedback pages, Gradescope files,
the grader's error log, then whatever the adapters' writers given as `outputs` add (totals.csv, the
class report, the nbgrader gradebook: autograder.adapters.report_outputs). Always from everything RESULTS
holds, so a term graded lesson after lesson keeps every lesson's rows. The core imports no adapter."""

import html
import json
from pathlib import Path

from autograder import notebook as nbk
from autograder import results as store
from autograder.checking import LESSONS


def gather(out, expected=(), problems=None):
    """One Result per (student, lesson) of the term in RESULTS: every stored result, and for each
    student and lesson it knows (or `expected`) with no valid result, a placeholder whose tests
    are errors flagged for regrading (never zeros), naming why (a refused result says its reason).
    problems: list to append refused results to."""
    problems = [] if problems is None else problems
    term = store.load_term(out, lesson_tests())
    problems += term.lines
    results = {}
    for r in term.results:
        if r.lesson in LESSONS:
            results[r.student, r.lesson] = r
        else:
            problems.append(f"{r.student}/{r.lesson}: a result for an unknown lesson, left out")
    refused = {k: why for k, why in term.refused.items() if k[1] in LESSONS and not store.check_student(k[0])}
    known = set(results) | set(expected) | set(refused)
    lessons = [x for x in LESSONS if x in {x for _, x in known} | set(store.read_run(out).lessons)]
    students = sorted({s for s, _ in known})
    for student in students:
        for lesson in lessons:
            if (student, lesson) not in results:
                why = (
                    refused_message(refused[student, lesson])
                    if (student, lesson) in refused
                    else "no result is stored for this lesson"
                )
                results[student, lesson] = placeholder(
                    student, lesson, f"not graded: {why}; grade it with --lesson {lesson} --resume"
                )
    return [results[k] for k in sorted(results)]


def refused_message(why):
    """A placeholder's words for a refused stored result: said as damaged (what an instructor acts on), and why."""
    return f"its stored result is damaged or refused ({why})"


def lesson_tests():
    """lesson -> its tests [(name, max_points)] (None for a lesson the course does not have), each
    read once: what load_results checks every stored result against."""
    known = {}

    def tests(lesson):
        if lesson not in known:
            known[lesson] = nbk.lesson_tests(lesson) if lesson in LESSONS and nbk.lesson_path(lesson).exists() else None
        return known[lesson]

    return tests


def placeholder(student, lesson, message) -> store.Result:
    """A Result standing for one that is not there: every test of the lesson an error flagged for regrading."""
    return store.Result(
        student,
        lesson,
        tuple(
            store.TestRow(t, 0.0, float(p), "error", message, grader_error=True) for t, p in nbk.lesson_tests(lesson)
        ),
    )


def write_all(out, expected=(), gradescope=False, outputs=(), problems=None, warnings=(), written=False):
    """Rewrite grades.csv, feedback, the error log (and Gradescope files) from everything stored in
    RESULTS, then call each of `outputs` as write(out, results, warnings); returns the results ([Result]).
    warnings: lines for the top of the class report (a sandbox mode that hides no file); written: the
    written questions count (feedback_page)."""
    out = Path(out)
    results = gather(out, expected, problems)
    store.write_grades(out / "grades.csv", results)
    # Failures of the grader itself (never of a student's code), for the instructor.
    errors = [f"== {r.student} {r.lesson}\n{tb}" for r in results for tb in r.grader_errors or ()]
    log = out / "grader-errors.log"
    if errors:
        store.write_atomic(log, "\n".join(errors))
    else:
        log.unlink(missing_ok=True)
    write_feedback(out, results, written=written)
    if gradescope:
        for student in sorted({r.student for r in results}):
            mine = [r for r in results if r.student == student]
            store.write_derived(out / "gradescope" / student / "results.json", json.dumps(results_json(mine), indent=1))
    for write in outputs:
        write(out, results, warnings)
    return results


STYLE = """body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.5rem;text-align:left;
vertical-align:top}.passed,.graded{color:#1a7f37}.failed,.error{color:#cf222e}.missing,.needs-grading,.unanswered{color:#9a6700}
.note{background:#fff8c5;padding:.5rem 1rem;border-radius:4px}code{background:#f6f8fa;padding:0 .2rem}
.msg{white-space:pre-line}ul.aspects{margin:.3rem 0 0;padding-left:1.2rem}"""


def _aspects_html(t):
    e = html.escape
    items = "".join(
        f"<li class='{'passed' if a.passed else 'failed'}'>{e(a.aspect)}: {a.points:g} / "
        f"{a.max_points:g}{(' &mdash; ' + e(a.message)) if a.message and not a.passed else ''}"
        "</li>"
        for a in t.aspects or ()
    )
    return f"<ul class='aspects'>{items}</ul>" if items else ""


def write_feedback(out, results, reviews=None, written=False, late=None, drop_stale=False):
    """RESULTS/feedback/<student>/<lesson>.html of each Result (feedback_page; reviews: the gradebook's
    {(student, lesson): review} of manual scores, late: {(student, lesson): the sentence on its late penalty},
    from the adapters, which read the gradebook and count the late penalties)."""
    for r in results:
        store.write_derived(
            Path(out) / "feedback" / r.student / f"{r.lesson}.html",
            feedback_page(
                r,
                (reviews or {}).get((r.student, r.lesson)),
                written,
                (late or {}).get((r.student, r.lesson), ""),
                drop_stale,
            ),
        )


def feedback_page(r, review=None, written=False, late="", drop_stale=False):
    """A Result's page for its student: each test, its points (and each aspect's) and its teaching message;
    never hidden code, hidden inputs or expected values (check messages are written not to contain
    them). review (a gradebook's, with .manual and .extra {test or question: points}): a manual score
    replaces the grader's and is said to be one, extra credit is added. Written questions are listed: with
    written they count (a manual score, or 'needs grading' and the total so far), without it they do not.
    late: a sentence on how the lesson counts, shown as a note: the late penalty taken (what the export sends: the
    points counted), or that it was never handed in (0, or left blank).
    drop_stale: a stale manual score is shown but not counted, as the export counts with --stale-overrides drop.
    Every text is stored cleaned and capped (results.clean), and escaped here."""
    e = html.escape
    given, extra, stale = (review.manual, review.extra, review.stale) if review else ({}, {}, ())
    manual = {name: p for name, p in given.items() if not (drop_stale and name in stale)}  # the scores that count
    counted = r.written if written else ()
    got = (
        sum(manual.get(t.test, t.points) for t in r.tests)
        + sum(manual.get(w.question, 0.0) for w in counted)
        + sum(extra.get(t.test, 0.0) for t in r.tests)
        + sum(extra.get(w.question, 0.0) for w in counted)
    )
    full = r.max_points + sum(w.max_points for w in counted)
    pending = [w.question for w in counted if w.status == store.NEEDS_GRADING and w.question not in manual]

    def by_hand(name, points):
        dropped = "not counted, what the grader gave counts until it is"  # --stale-overrides drop
        said = (
            f"scored by hand: {given[name]:g}"
            + (f" (the grader gave {points:g})" if points is not None else "")
            + (
                f", before your work last changed: {'to be' if name in manual else dropped} reviewed again (stale)"
                if name in stale
                else ""
            )
            if name in given
            else ""
        )
        return "; ".join(filter(None, [said, f"extra credit: +{extra[name]:g}" if extra.get(name) else ""]))

    def row(name, status, points, max_points, message, more=""):
        hand = by_hand(name, points)
        shown = manual.get(name, points)
        return (
            f"<tr><td><code>{e(name)}</code></td><td class='{e(status).replace(' ', '-')}'>{e(status)}</td>"
            f"<td>{'&mdash;' if shown is None else f'{shown:g}'} / {max_points:g}"
            f"{f'<br><i>{e(hand)}</i>' if hand else ''}</td><td><div class='msg'>{e(message)}</div>{more}</td></tr>"
        )

    rows = "".join(
        row(
            t.test,
            t.status,
            t.points,
            t.max_points,
            "" if t.aspects and t.status == "failed" else t.message,
            _aspects_html(t),
        )
        for t in r.tests
    )
    # A written question a TA has scored is graded: its stored status (needs grading) is the grader's, made before.
    rows += "".join(
        row(
            w.question,
            ("graded" if w.question in manual else w.status) if written else "not counted",
            0.0 if w.status == store.UNANSWERED else None,
            w.max_points,
            f"Written question: {w.message}" + ("" if written else " (read by your instructor; it does not count)"),
        )
        for w in r.written
    )
    note_html = "".join(f"<p class='note'>{e(n)}</p>" for n in ([late] if late else []) + result_notes(r))
    note_html += (
        (
            f"<p class='note'>Written questions not graded yet ({e(', '.join(pending))}): these are your points "
            "so far, not your score.</p>"
        )
        if pending
        else ""
    )
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(r.lesson)}: feedback for "
        f"{e(r.student)}</title><style>{STYLE}</style></head><body><h1>{e(r.lesson)}</h1>"
        f"<p>Feedback for <b>{e(r.student)}</b>: <b>{got:g} / {full:g}</b> points"
        f"{' (scores in italics were given by hand)' if given or extra else ''}.</p>{note_html}"
        f"<table><tr><th>test</th><th>status</th><th>points</th><th>what to look at</th></tr>{rows}</table>"
        "<p>The grader ran your notebook's code cells except tests and demonstrations, then checked each "
        "function on its own inputs.</p></body></html>\n"
    )


def feedback_text(t):
    """A TestRow's feedback as text: its message, or with partial credit each aspect's points and,
    for a failed one, its message (the test's message joins those already)."""
    lines = [t.message] if t.message and not t.aspects else []
    lines += [
        f"{'passed' if a.passed else 'failed'}: {a.aspect} ({a.points:g}/{a.max_points:g})"
        + (f": {a.message}" if a.message and not a.passed else "")
        for a in t.aspects or ()
    ]
    return "\n".join(lines)


def result_notes(r):
    """What the grader noted about a submission as a whole: skipped cells, cells that raised."""
    return (
        list(r.notes)
        + [f"{cell} was skipped: it {why}" for cell, why in r.skipped.items()]
        + [f"{cell} raised {e['type']}: {e['message']}" for cell, e in r.errors.items()]
    )


def results_json(results, visibility="visible", test_visibility="visible", stdout_visibility="hidden"):
    """Gradescope's results.json for one student's Results (one per lesson), documented fields only. A written
    question is a line of its output, never a test: Gradescope has no test a person grades later (one would
    show as a 0), and the instructor grades it as a question of its own in Gradescope's manual grading."""
    several = len({r.lesson for r in results}) > 1
    tests = [
        dict(
            name=f"{r.lesson}: {t.test}" if several else t.test,
            score=t.points,
            max_score=t.max_points,
            status="passed" if t.status == "passed" else "failed",
            output=feedback_text(t),
            visibility=test_visibility,
        )
        for r in results
        for t in r.tests
    ]
    lines = [f"{r.lesson}: {r.points:g} / {r.max_points:g} points" for r in results]
    lines += [
        f"{r.lesson}: written question {w.question} ({w.max_points:g} points, {store.NEEDS_GRADING} in "
        f"Gradescope, not in this score): {w.message}"
        for r in results
        for w in r.written
    ]
    lines += [note for r in results for note in result_notes(r)]
    return dict(
        score=sum(t["score"] for t in tests),
        output="\n".join(lines),
        visibility=visibility,
        stdout_visibility=stdout_visibility,
        tests=tests,
    )
