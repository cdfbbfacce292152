"""RESULTS/report.html: the class at a glance, for the instructor (`python -m autograder report`).

- per lesson, a histogram of the students' final scores and their mean, counted by RESULTS's rule (counting.
  final_scores: the same numbers as totals.csv and the export), and who never handed it in (counting.MISSING);
- per function, the pass rate and the most common named mistakes, with counts and the students who made
  each (the checks name the mistake, so equal messages are the same mistake); `report --no-names` leaves
  the names out, for a projector;
- every function of every lesson on one table, lowest pass rate first (functions_across_lessons);
- per lesson, its manual scores (--gradebook) and, per written question, how many answers are graded and who
  still needs a grade;
- with a roster that has a section column, each lesson's mean final score and pass count per section (by_section);
- per function, groups of students whose answer cells are identical. Only the graded answer cells
  count, compared after normalising whitespace, without the lines the released stub gives (the
  signature and docstring); stubs and answers too short to mean anything are left out. The page
  says "identical" and nothing more: short, canonical answers are often written the same way.

With --submissions, each result that names the notebook it graded (sha256) is compared with the
notebook SUBMISSIONS holds now: one graded from another notebook (an older result put back with its
folder, a later submission not graded yet) is named at the top of the page (submission_mismatches).

The page is one file: no scripts, no external requests.
"""

import hashlib
import html
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

from autograder import notebook as nbk
from autograder.adapters.roster import Roster
from autograder.config import RunConfig
from autograder.counting import Counting, final_scores
from autograder.results import NEEDS_GRADING, UNANSWERED, write_atomic

REPORT = "report.html"
COUNTED = (
    "the final scores, as the export and totals.csv count them: the gradebook's manual scores and extra credit "
    "count, a lesson still to grade (by a person or again) is left out"
)
MIN_ANSWER_CHARS = 80  # of the student's own code, spaces aside: `return x.sum(-1)` says nothing
TOP_MISTAKES = 5
STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%;margin-bottom:1rem}td,th{border-bottom:1px solid #ddd;padding:.4rem;
text-align:left;vertical-align:top}td.n{text-align:right;white-space:nowrap}h2{margin-top:2.5rem}
.muted{color:#666}img{max-width:100%}code{background:#f6f8fa;padding:0 .2rem}ul{margin:0;padding-left:1.2rem}
.warning{background:#ffebe9;color:#82071e;padding:.5rem 1rem;border-radius:4px}"""


def mistakes(test):
    """The named mistakes of one failed TestRow: the core aspect's message when the core failed (the
    other aspects are then not earned, which says nothing new), else each failed aspect's message."""
    aspects = test.aspects or ()
    if aspects and not aspects[0].passed:
        lines = [aspects[0].message or test.message]
    elif aspects:
        lines = [f"{a.aspect}: {a.message}" for a in aspects if not a.passed and a.message]
    else:
        lines = [line for line in test.message.splitlines() if line.strip()][:1]
    # Shapes vary between students; the mistake does not.
    return [re.sub(r"\(\d+(?:, ?\d+)*,?\)", "(...)", line.strip())[:300] for line in lines]


def function_stats(results, reviews=None, drop_stale=False):
    """{(lesson, test): {passed, counted, regrade, points, max_points, mistakes: Counter,
    who: {mistake: {students}}}} of [Result]; a test's points are its manual score where the gradebook's
    reviews ({(student, lesson): Review}) have one (a stale one too, unless drop_stale), as the export counts.
    A test never handed in is not counted: the lesson names who never handed it in (never_submitted), with or
    without a stored result, one count."""
    stats = defaultdict(
        lambda: {
            "passed": 0,
            "counted": 0,
            "regrade": 0,
            "points": 0.0,
            "max_points": 0.0,
            "mistakes": Counter(),
            "who": defaultdict(set),
        }
    )
    for r in results:
        review = (reviews or {}).get((r.student, r.lesson))
        manual = {t: p for t, p in review.manual.items() if not (drop_stale and t in review.stale)} if review else {}
        for t in r.tests:
            s = stats[(r.lesson, t.test)]
            if t.status == "missing":
                continue
            if t.needs_regrade:
                s["regrade"] += 1
            else:
                s["counted"] += 1
                s["passed"] += t.status == "passed"
                s["points"] += manual.get(t.test, t.points)
                s["max_points"] += t.max_points
                if t.status != "passed":
                    s["mistakes"].update(mistakes(t))
                    for m in mistakes(t):
                        s["who"][m].add(r.student)
    return stats


def pass_rate(s):
    """'passed/counted (pct%)' of one function's stats, or '-' when nobody's test counted."""
    return f"{s['passed']}/{s['counted']} ({100 * s['passed'] / s['counted']:.0f}%)" if s["counted"] else "-"


def functions_across_lessons(stats):
    """[(lesson, function, pass rate text)] of every function with a counted test, lowest pass rate first."""
    rows = [
        (s["passed"] / s["counted"], lesson, test.removeprefix("test_"), pass_rate(s))
        for (lesson, test), s in stats.items()
        if s["counted"]
    ]
    return [(lesson, name, rate) for _, lesson, name, rate in sorted(rows)]


def by_section(results, sections, scores):
    """[(section, lesson, students with a score, mean score %, students who passed every test)] for the
    roster's sections ({student: section}; students without one, or off the roster, are '(none)'), of the final
    scores ({(student, lesson): Score} of counting.final_scores, with every roster student: one who never handed a
    lesson in counts 0, unless the export leaves it blank); a lesson still to grade, by a person or again, has no
    score yet and is left out."""
    passed = {(r.student, r.lesson): all(t.status == "passed" for t in r.tests) for r in results}
    rows = defaultdict(list)
    for (student, lesson), s in scores.items():
        if s.points is not None:
            rows[(sections.get(student) or "(none)", lesson)].append((percent(s), passed.get((student, lesson), False)))
    return [
        (section, lesson, len(v), sum(p for p, _ in v) / len(v), sum(ok for _, ok in v))
        for (section, lesson), v in sorted(rows.items())
    ]


def percent(s):
    """A final Score (with points) in % of its lesson's points."""
    return 100 * s.points / s.max_points if s.max_points else 0.0


def never_submitted(scores):
    """{lesson: sorted students who never handed it in} (counting.MISSING: the state totals.csv and the export
    flag: a roster student with no result, or a result whose every test is `missing`)."""
    missing = defaultdict(list)
    for (student, lesson), s in sorted(scores.items()):
        if s.missing:
            missing[lesson].append(student)
    return missing


def histogram(percentages, lesson):
    """An inline SVG of the lesson's score distribution: ten bins of 10% (100% in the last), bars in #4c72b0, the
    counts on a y axis of whole students. Drawn as text: no plotting library to start for a report."""
    counts = [0] * 10
    for p in percentages:
        counts[min(9, max(0, int(p // 10)))] += 1
    top = max(counts) or 1
    left, bottom, width, height = 50, 200, 520, 160  # the plot area, in the 600 x 240 picture
    bars = "".join(
        f"<rect x='{left + i * width / 10:.1f}' y='{bottom - height * n / top:.1f}' width='{width / 10:.1f}' "
        f"height='{height * n / top:.1f}' fill='#4c72b0' stroke='white'><title>{10 * i}-{10 * i + 10}%: {n}"
        "</title></rect>"
        for i, n in enumerate(counts)
        if n
    )
    step = max(1, math.ceil(top / 5))
    ticks = "".join(
        f"<text x='{left - 6}' y='{bottom - height * k / top + 4:.1f}' text-anchor='end'>{k}</text>"
        for k in range(0, top + 1, step)
    )
    ticks += "".join(
        f"<text x='{left + width * k / 100:.1f}' y='{bottom + 16}' text-anchor='middle'>{k}</text>"
        for k in range(0, 101, 20)
    )
    title = html.escape(f"{lesson}: {plural(len(percentages), 'student')}")
    return (
        f"<svg width='600' height='240' role='img' font-size='11' "
        f"font-family='sans-serif' aria-label='histogram of the scores of {title}'>"
        f"<text x='{left + width / 2}' y='20' text-anchor='middle' font-size='13'>{title}</text>{bars}"
        f"<path d='M{left},{bottom - height}V{bottom}H{left + width}' fill='none' stroke='black'/>{ticks}"
        f"<text x='{left + width / 2}' y='{bottom + 34}' text-anchor='middle'>score (% of the lesson's points)</text>"
        f"<text x='14' y='{bottom - height / 2}' text-anchor='middle' transform='rotate(-90 14 "
        f"{bottom - height / 2})'>students</text></svg>"
    )


def lesson_percentages(scores):
    """{lesson: [final score % of each student who has one]} of final scores {(student, lesson): Score}: a roster
    student who never handed the lesson in counts 0, a lesson still to grade (by a person or again) is left out."""
    out = defaultdict(list)
    for (_, lesson), s in sorted(scores.items()):
        if s.points is not None:
            out[lesson].append(percent(s))
    return out


# ---------------------------------------------------------------------------------------------
# Identical answers
# ---------------------------------------------------------------------------------------------


def normal_lines(text):
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def own_code(answer, stub_lines):
    """The student's code in an answer cell: its normalised lines, less the lines the stub gave."""
    return "\n".join(line for line in normal_lines(answer) if line not in stub_lines)


def lesson_answers(lesson):
    """{grade_id: (stub lines, the reference's own code)} of a lesson's answer cells."""
    nb = nbk.read(nbk.lesson_path(lesson))
    out = {}
    for cell in nbk.code_cells(nb):
        if nbk.is_answer(cell):
            source = nbk.source(cell)
            stub = set(normal_lines(nbk.strip_solutions(source)))
            out[nbk.grade_id(cell)] = (stub, own_code(nbk.without_markers(source), stub))
    return out


def submission_mismatches(results, submissions):
    """Lines naming each result whose notebook (sha256) is not the one SUBMISSIONS holds for it now;
    [] without submissions. A result without a sha256 (nothing was submitted) is not compared."""
    if not submissions:
        return []
    from autograder.grade import locate  # the core's own way to find a student's notebook

    lines = []
    for r in results:
        if r.sha256:
            now, _ = locate(submissions, r.student, r.lesson).key()
            if now != r.sha256:
                lines.append(
                    f"{r.student} {r.lesson}: its result was graded from another notebook than "
                    f"{submissions} holds ({'none there now' if now is None else 'sha256 differs'}): "
                    "regrade it (grade --resume)"
                )
    return lines


def notebook_of(result, submissions):
    if submissions:
        path = Path(submissions) / result.student / result.lesson / f"{result.lesson}.ipynb"
        if path.is_file():
            return path
    return Path(result.notebook) if result.notebook else None


def identical_groups(results, submissions):
    """[(lesson, grade_id, [students], same as the reference)] for groups of 2 or more, largest first."""
    answers_of, groups = {}, defaultdict(list)
    reference = {}
    for r in results:
        lesson = r.lesson
        if lesson not in answers_of:
            try:
                answers_of[lesson] = lesson_answers(lesson)
            except (nbk.NotebookError, OSError):
                answers_of[lesson] = {}
        path = notebook_of(r, submissions)
        if not path or not answers_of[lesson]:
            continue
        try:
            nb = nbk.parse_submission(nbk.read_submitted_bytes(path))
        except nbk.NotebookError:
            continue
        for cell in nbk.code_cells(nb):
            gid = nbk.grade_id(cell)
            if not nbk.is_answer(cell) or gid not in answers_of[lesson]:
                continue
            stub, ref = answers_of[lesson][gid]
            code = own_code(nbk.source(cell), stub)
            if "NotImplementedError" in code or len(re.sub(r"\s", "", code)) < MIN_ANSWER_CHARS:
                continue
            key = (lesson, gid, hashlib.sha256(code.encode()).hexdigest())
            groups[key].append(r.student)
            reference[key] = code == ref
    found = [
        (lesson, gid, sorted(set(students)), reference[(lesson, gid, h)])
        for (lesson, gid, h), students in groups.items()
        if len(set(students)) > 1
    ]
    return sorted(found, key=lambda g: (g[0], -len(g[2]), g[1]))


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def manual_lines(reviews, lesson, names):
    """Lines on a lesson's manual scores and extra credit in nbgrader's gradebook ({(student, lesson): Review}),
    the stale ones (made before a regrade changed the test's autograded result, or the written answer) named."""
    mine = {s: rv for (s, lsn), rv in sorted(reviews.items()) if lsn == lesson}
    manual = [(s, t) for s, rv in mine.items() for t in sorted(rv.manual)]
    extra = [(s, t) for s, rv in mine.items() for t in sorted(rv.extra)]
    stale = [f"{s} {t}" if names else t for s, rv in mine.items() for t in rv.stale]
    lines = [
        f"{what}: {plural(len(pairs), 'test')}" + (f" ({', '.join(f'{s} {t}' for s, t in pairs)})" if names else "")
        for what, pairs in (("Scored by hand in the gradebook", manual), ("Extra credit", extra))
        if pairs
    ]
    return lines + (
        [f"Stale manual scores (the autograded result or the written answer changed since): {', '.join(stale)}"]
        if stale
        else []
    )


def written_lines(results, reviews, lesson, names):
    """A line per written question of a lesson: how many answers are graded (a manual score in the gradebook's
    reviews) and who still waits for a grade (needs grading); those left unanswered (0 unless a TA scores them)."""
    lines = []
    rows = [(r.student, w) for r in results if r.lesson == lesson for w in r.written]
    for question in dict.fromkeys(w.question for _, w in rows):
        answered = [s for s, w in rows if w.question == question and w.status == NEEDS_GRADING]
        waiting = [s for s in answered if question not in getattr(reviews.get((s, lesson)), "manual", {})]
        blank = [s for s, w in rows if w.question == question and w.status == UNANSWERED]
        lines.append(
            f"Written question {question}: {len(answered) - len(waiting)}/{len(answered)} graded"
            + (f"; {NEEDS_GRADING}: {plural(len(waiting), 'answer')}" if waiting else "")
            + (f" ({', '.join(waiting)})" if waiting and names else "")
            + (f"; {UNANSWERED} (0): {plural(len(blank), 'student')}" if blank else "")
            + (f" ({', '.join(blank)})" if blank and names else "")
        )
    return lines


def render(results, submissions=None, warnings=(), names=True, sections=None, roster=None, reviews=None, counting=None):
    """The page; names=False leaves out who made each mistake, sections ({student: section}) adds by_section,
    roster (its students) adds those who never handed a lesson in, named under it, reviews (gradebook.read_reviews)
    its manual scores. The scores are the export's (counting.final_scores): with reviews, roster and sections (their
    students who never handed a lesson in count 0) and counting (a counting.Counting: late penalties, written
    questions, a lesson never handed in blank, stale manual scores dropped)."""
    e = html.escape
    everyone = sorted(set(roster or ()) | set(sections or ()))
    students, lessons, scores, _, _ = final_scores(
        results, roster=Roster(rows=[{"student": s} for s in everyone]), reviews=reviews, counting=counting
    )
    counting = counting or Counting()
    stats, percentages = function_stats(results, reviews, counting.drop_stale), lesson_percentages(scores)
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Class report</title>"
        f"<style>{STYLE}</style></head><body><h1>Class report</h1>"
        f"<p>{plural(len(students), 'student')}, {plural(len(lessons), 'lesson')}, "
        f"{plural(len(results), 'graded submission')}.</p>"
    ]
    parts += [f"<p class='warning'><b>{e(line)}</b></p>" for line in warnings]  # e.g. a sandbox that hides no file
    parts.append(f"<p class='muted' id='scores'>Scores: {e(COUNTED)}; {e(counting.said())}.</p>")
    missing = never_submitted(scores)
    for lesson in lessons:
        parts.append(f"<h2 id='{e(lesson)}'>{e(lesson)}</h2>")
        if missing.get(lesson):
            who = missing[lesson]
            parts.append(
                f"<p class='warning'>Never handed in: {plural(len(who), 'student')}"
                + (f": {e(', '.join(who))}" if names else "")
                + "</p>"
            )
        parts += [
            f"<p class='muted'>{e(line)}</p>"
            for line in manual_lines(reviews or {}, lesson, names)
            + written_lines(results, reviews or {}, lesson, names)
        ]
        if percentages.get(lesson):
            got = percentages[lesson]
            parts.append(
                f"<p>Mean score: {sum(got) / len(got):.0f}% of {plural(len(got), 'student')} "
                "<span class='muted'>(see <a href='#scores'>Scores</a>)</span></p>"
            )
            parts.append(histogram(got, lesson))
        parts.append(
            "<table><tr><th>function</th><th>passed</th><th>mean points</th><th>most common mistakes</th></tr>"
        )
        for (lsn, test), s in stats.items():
            if lsn != lesson:
                continue
            rate = pass_rate(s)
            mean = f"{s['points'] / s['counted']:.2f} / {s['max_points'] / s['counted']:g}" if s["counted"] else "-"
            extra = [f"{n} to grade again" for n in [s["regrade"]] if n]
            common = "".join(
                f"<li>{count} &times; {e(m)}"
                + (f"<br><span class='muted'>{e(', '.join(sorted(s['who'][m])))}</span>" if names else "")
                + "</li>"
                for m, count in s["mistakes"].most_common(TOP_MISTAKES)
            )
            parts.append(
                f"<tr><td><code>{e(test.removeprefix('test_'))}</code>"
                + (f"<br><span class='muted'>{e(', '.join(extra))}</span>" if extra else "")
                + f"</td><td class='n'>{rate}</td><td class='n'>{mean}</td>"
                f"<td>{f'<ul>{common}</ul>' if common else ''}</td></tr>"
            )
        parts.append("</table>")
    parts.append(
        "<h2 id='functions'>Functions across lessons</h2><p class='muted'>Lowest pass rate first.</p>"
        "<table><tr><th>lesson</th><th>function</th><th>passed</th></tr>"
    )
    parts += [
        f"<tr><td>{e(lesson)}</td><td><code>{e(name)}</code></td><td class='n'>{rate}</td></tr>"
        for lesson, name, rate in functions_across_lessons(stats)
    ]
    parts.append("</table>")
    if sections:
        parts.append(
            "<h2 id='sections'>By section</h2><p class='muted'>Final scores (see "
            "<a href='#scores'>Scores</a>).</p><table><tr><th>section</th><th>lesson</th><th>students</th>"
            "<th>mean score</th><th>passed every test</th></tr>"
        )
        parts += [
            f"<tr><td>{e(section)}</td><td>{e(lesson)}</td><td class='n'>{n}</td><td class='n'>{mean:.0f}%</td>"
            f"<td class='n'>{ok}/{n}</td></tr>"
            for section, lesson, n, mean, ok in by_section(results, sections, scores)
        ]
        parts.append("</table>")
    groups = identical_groups(results, submissions)
    parts.append(
        "<h2 id='identical'>Identical answers</h2><p class='muted'>Answer cells whose code is the same after "
        "normalising whitespace, without the lines the released stub gives; stubs and answers under "
        f"{MIN_ANSWER_CHARS} characters are left out. Short, canonical answers are often written the same "
        "way: this says they are identical, nothing more.</p>"
    )
    if groups:
        parts.append("<table><tr><th>lesson</th><th>answer</th><th>students</th></tr>")
        for lesson, gid, students, same_as_reference in groups:
            note = " <span class='muted'>(identical to the reference solution)</span>" if same_as_reference else ""
            parts.append(
                f"<tr><td>{e(lesson)}</td><td><code>{e(gid)}</code>{note}</td>"
                f"<td>identical: {e(', '.join(students)) if names else plural(len(students), 'student')}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append(
            "<p>No identical answers."
            + (
                ""
                if submissions or any(r.notebook for r in results)
                else " (No notebooks to compare: give --submissions.)"
            )
            + "</p>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(config: RunConfig, results: list, warnings=(), reviews: dict | None = None) -> Path:
    """Write RESULTS/report.html (RESULTS is config.results) of results ([Result]), as render makes it: counted by
    config.rule (RESULTS's, config.read_settings), with config.roster's students and sections, the notebooks
    under config.submissions (identical answers; else each result's own), students named unless not
    config.names. warnings: lines shown first; reviews: the gradebook's {(student, lesson): Review}. Returns its
    path."""
    roster = config.roster
    sections = {r["student"]: r["section"] for r in roster.rows} if roster and "section" in roster.columns else None
    students = [r["student"] for r in roster.rows] if roster else None
    page = render(results, config.submissions, warnings, config.names, sections, students, reviews, config.rule)
    path = Path(config.results) / REPORT
    write_atomic(path, page)
    return path
