"""RESULTS/report.html (`python -m autograder report`): pass rates, named mistakes with counts, a
histogram per lesson, groups of identical answers (answer cells only; stubs and short answers left
out), rendered and opened in headless Chromium."""

import copy
import hashlib
import json
import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder import results as store
from autograder.__main__ import main
from autograder.adapters import classreport
from autograder.results import save_result

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "build" / "screenshots" / "class-report.png"
CHROMIUM = next(
    (
        c
        for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
        if c and os.path.exists(c)
    ),
    None,
)
LESSON = "01_attention"
# A softmax written the student's own way: long enough to mean something.
OWN_SOFTMAX = """def softmax(x, axis=-1):
    \"\"\"Softmax of x along `axis`, safe for huge and -inf entries. Same shape as x.\"\"\"
    shifted = np.asarray(x) - np.max(x, axis=axis, keepdims=True)
    exps = np.exp(shifted)
    total = np.sum(exps, axis=axis, keepdims=True)
    return exps / total
"""


def submission(softmax=None, stub=False):
    """Lesson 01 as a student hands it in: the reference answers (no markers), the released stubs,
    or a softmax of their own."""
    nb = copy.deepcopy(nbk.read(nbk.lesson_path(LESSON)))
    for cell in nbk.code_cells(nb):
        if nbk.is_answer(cell):
            text = nbk.source(cell)
            text = nbk.strip_solutions(text) if stub else nbk.without_markers(text)
            if softmax and nbk.grade_id(cell) == "softmax":
                text = softmax
            nbk.set_source(cell, text)
    return json.dumps(nb)


def result(student, softmax_ok, aspects=None):
    sm = dict(
        test="test_softmax",
        points=2.0 if softmax_ok else 0.0,
        max_points=2.0,
        status="passed" if softmax_ok else "failed",
        message="" if softmax_ok else "weights do not sum to 1 over the keys (2, 5): softmax over the wrong axis?",
    )
    sdpa = dict(test="test_scaled_dot_product_attention", points=3.0, max_points=3.0, status="passed", message="")
    if aspects:
        sdpa.update(
            points=2.0,
            status="failed",
            message="masks: masked keys get weight",
            aspects=[
                dict(aspect="scores", points=2.0, max_points=2.0, passed=True, message=""),
                dict(
                    aspect="masks",
                    points=0.0,
                    max_points=1.0,
                    passed=False,
                    message="masked keys get weight: True means may attend",
                ),
            ],
        )
    mask = dict(test="test_causal_mask", points=1.0, max_points=1.0, status="passed", message="")
    return dict(
        student=student,
        lesson=LESSON,
        notebook=None,
        sha256=None,
        fingerprint=None,
        grader=None,
        submitted_at=None,
        notes=[],
        cells={},
        tests=[sm, mask, sdpa],
    )


@pytest.fixture
def graded(tmp_path):
    out, subs = tmp_path / "RESULTS", tmp_path / "SUBMISSIONS"
    students = {  # student: (notebook, softmax passed, a partly failing test)
        "alice": (submission(OWN_SOFTMAX), True, False),
        "bob": (submission(OWN_SOFTMAX.replace("    ", "\t").replace(" = ", "  =  ")), True, True),  # whitespace only
        "carol": (submission(stub=True), False, False),
        "gina": (submission(stub=True), False, False),
        "dave": (submission("def softmax(x, axis=-1):\n    return x\n"), False, True),
        "hank": (submission("def softmax(x, axis=-1):\n    return x\n"), False, False),
        "erin": (submission(), True, False),
        "frank": (submission(), False, False),
    }
    for student, (text, ok, partly) in students.items():
        path = subs / student / LESSON / f"{LESSON}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        save_result(out, result(student, ok, partly))
    return tmp_path


def test_report_content(graded):
    assert main(["report", str(graded / "RESULTS"), "--submissions", str(graded / "SUBMISSIONS")]) == 0
    page = (graded / "RESULTS" / "report.html").read_text()
    assert "3/8 (38%)" in page, "softmax passed by 3 of 8"
    assert "5 &times; weights do not sum to 1 over the keys (...): softmax over the wrong axis?" in page
    assert "2 &times; masks: masked keys get weight: True means may attend" in page
    assert page.count("<svg ") == 1 and "data:image" not in page
    groups = classreport.identical_groups(
        [
            store.Result.from_json(result(s, True))
            for s in ("alice", "bob", "carol", "dave", "erin", "frank", "gina", "hank")
        ],
        graded / "SUBMISSIONS",
    )
    softmax = [(names, ref) for lesson, gid, names, ref in groups if gid == "softmax"]
    # alice and bob differ only in whitespace; the stubs (carol, gina) and one-liners (dave, hank) are left out.
    assert (["alice", "bob"], False) in softmax and (["erin", "frank"], True) in softmax and len(softmax) == 2
    assert "identical: alice, bob" in page and "identical to the reference solution" in page
    assert not any({"carol", "gina"} & set(names) for _, _, names, _ in groups), "stubs are never identical answers"
    # One self-contained file: nothing fetched from anywhere.
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_report_says_who_made_each_mistake_unless_told_not_to(graded):
    """Per named mistake the students behind it; --no-names (a projector) leaves every name out, the
    identical answers' too; every function on one table, lowest pass rate first."""
    results, subs = graded / "RESULTS", str(graded / "SUBMISSIONS")
    assert main(["report", str(results), "--submissions", subs]) == 0
    page = (results / "report.html").read_text()
    assert "softmax over the wrong axis?<br><span class='muted'>carol, dave, frank, gina, hank</span>" in page
    assert "True means may attend<br><span class='muted'>bob, dave</span>" in page
    across = page[page.index("id='functions'") : page.index("id='identical'")]
    assert (
        [
            across.index(f"<code>{f}</code>") < across.index(f"<code>{g}</code>")
            for f, g in (("softmax", "scaled_dot_product_attention"), ("scaled_dot_product_attention", "causal_mask"))
        ]
        == [True, True]
        and "3/8 (38%)" in across
        and "6/8 (75%)" in across
        and "8/8 (100%)" in across
    )
    assert main(["report", str(results), "--submissions", subs, "--no-names"]) == 0
    page = (results / "report.html").read_text()
    assert not [s for s in ("alice", "bob", "carol", "dave", "erin", "frank", "gina", "hank") if s in page]
    assert "5 &times; weights do not sum to 1" in page and "identical: 2 students" in page


def test_report_splits_by_roster_section(graded):
    results = store.load_term(graded / "RESULTS").results
    sections = {"alice": "A", "bob": "A", "carol": "A", "dave": "B", "erin": "B", "frank": "B"}
    rows = classreport.by_section(results, sections, final(results, sections))
    # A: alice 100%, bob 5/6, carol 4/6; B: dave 3/6, erin 100%, frank 4/6; gina 4/6 and hank 4/6 have none.
    assert [(s, n, round(mean, 1), ok) for s, _, n, mean, ok in rows] == [
        ("(none)", 2, 66.7, 0),
        ("A", 3, 83.3, 1),
        ("B", 3, 72.2, 1),
    ]
    page = classreport.render(results, sections=sections)
    assert "<h2 id='sections'>By section</h2>" in page and "<td class='n'>83%</td><td class='n'>1/3</td>" in page
    assert "id='sections'" not in classreport.render(results)
    (graded / "roster.csv").write_text("student,section\n" + "".join(f"{s},{x}\n" for s, x in sections.items()))
    assert main(["report", str(graded / "RESULTS"), "--roster", str(graded / "roster.csv")]) == 0
    assert "<td class='n'>83%</td><td class='n'>1/3</td>" in (graded / "RESULTS" / "report.html").read_text()


def final(results, students, reviews=None, counting=None):
    """The export's final scores {(student, lesson): Score} of results, with the roster of these students."""
    from autograder.adapters.roster import Roster
    from autograder.counting import final_scores

    return final_scores(
        results, roster=Roster(rows=[{"student": s} for s in students]), reviews=reviews, counting=counting
    )[2]


def test_report_sections_count_as_the_export_does(graded):
    """A roster student who never submitted counts 0 (as in the export), and a TA's manual score counts: ivan (B)
    never handed in, dave's manual 6/6 replaces his 3/6. B: dave 100%, erin 100%, frank 4/6, ivan 0."""
    from autograder.adapters.gradebook import Review

    results = store.load_term(graded / "RESULTS").results
    sections = {"alice": "A", "bob": "A", "carol": "A", "dave": "B", "erin": "B", "frank": "B", "ivan": "B"}
    [dave] = [r for r in results if r.student == "dave"]
    reviews = {("dave", dave.lesson): Review(manual={t.test: t.max_points for t in dave.tests})}
    rows = {
        s: (n, round(mean, 1), ok)
        for s, _, n, mean, ok in classreport.by_section(results, sections, final(results, sections, reviews))
    }
    assert rows["B"] == (4, 66.7, 1), "dave 100, erin 100, frank 66.7, ivan 0; only erin passed every test"
    page = classreport.render(results, sections=sections, reviews=reviews)
    assert "<td>B</td><td>01_attention</td><td class='n'>4</td><td class='n'>67%</td><td class='n'>1/4</td>" in page
    # scaled_dot_product_attention's mean points count dave's manual 3 of 3: (22 + 1) / 8 (the grader's: 22 / 8).
    assert "<td class='n'>2.88 / 3</td>" in page and "2.75 / 3" not in page


def test_the_report_the_export_and_totals_count_the_same_final_scores(graded, capsys):
    """The class report's per-lesson mean, histogram and sections are the export's final scores, late penalties
    too, as totals.csv has them; RESULTS remembers the export's late policy, so a later totals.csv and report
    (grade's, report's) keep counting it, and an export without one takes it off again, saying so. erin hands
    lesson 01 in 2 days late (10%/day: 6 becomes 4.8); ivan, on the roster, never hands it in (0)."""
    from autograder.adapters import report_outputs
    from autograder.adapters.roster import load_roster

    out, subs = graded / "RESULTS", graded / "SUBMISSIONS"
    sections = {
        "alice": "A",
        "bob": "A",
        "carol": "A",
        "gina": "A",
        "dave": "B",
        "erin": "B",
        "frank": "B",
        "hank": "B",
        "ivan": "B",
    }
    (graded / "roster.csv").write_text("student,section\n" + "".join(f"{s},{x}\n" for s, x in sections.items()))
    store.write_timestamp(subs / "erin" / LESSON, datetime(2026, 10, 3, 12, 0, tzinfo=timezone.utc))
    for name in sections:  # on time: the others
        if name not in ("erin", "ivan"):
            store.write_timestamp(subs / name / LESSON, datetime(2026, 10, 1, 12, 0, tzinfo=timezone.utc))
    roster = ["--roster", str(graded / "roster.csv")]
    late = [
        "--deadline",
        f"{LESSON}=2026-10-01T23:59:00+00:00",
        "--late-policy",
        "10%/day",
        "--submissions",
        str(subs),
        "--grace",
        "90m",
    ]
    assert main(["rule", str(out), *roster, *late]) == 0
    assert main(["export", str(out), "--format", "csv", "--out", str(graded / "plain.csv"), *roster]) == 0
    # alice 6, bob 5, carol 4, gina 4 (A); dave 3, erin 4.8, frank 4, hank 4, ivan 0 (B); of 6 each.
    expected = {"alice": 6, "bob": 5, "carol": 4, "gina": 4, "dave": 3, "erin": 4.8, "frank": 4, "hank": 4, "ivan": 0}

    def check(erin, mean, b_mean):
        plain = {r["student"]: float(r[LESSON]) for r in store.read_csv(out / "totals.csv")}
        assert plain == dict(expected, erin=erin)
        page = (out / "report.html").read_text()
        assert (
            f"Mean score: {mean}% of 9 students" in page
            and "histogram of the scores of 01_attention: 9 students" in page
        )
        assert round(100 * sum(plain.values()) / 6 / len(plain)) == mean  # the report's mean is totals.csv's
        assert f"<td>B</td><td>{LESSON}</td><td class='n'>5</td><td class='n'>{b_mean}%</td>" in page
        return page

    assert main(["report", str(out), *roster]) == 0
    page = check(4.8, 64, 53)  # B: (50 + 80 + 66.7 + 66.7 + 0) / 5
    assert f"late penalties: 10%/day after {LESSON} 2026-10-01T23:59:00+00:00, grace 90m" in page
    assert "late-penalties.csv" in os.listdir(out)
    results = store.load_term(out).results  # a later grade run's totals.csv and report count the same
    from autograder.config import read_settings  # as grade's CLI hands its writers RESULTS's rule

    for write in report_outputs(roster=load_roster(graded / "roster.csv"), rule=read_settings(out).rule):
        write(out, results, [])
    check(4.8, 64, 53)
    capsys.readouterr()
    assert main(["rule", str(out), *roster, "--late-policy", "none"]) == 0
    assert "changed: no late penalties (before: late penalties: 10%/day" in capsys.readouterr().out
    assert main(["report", str(out), *roster]) == 0
    assert "no late penalties" in check(6, 67, 57) and "late-penalties.csv" not in os.listdir(out)
    capsys.readouterr()
    assert main(["report", str(out), "--written"]) == 2  # not RESULTS's rule: refused, saying what differs
    err = capsys.readouterr().err.strip()
    assert (
        f"{out} counts otherwise than these flags say: written questions counted ({out}: written questions not "
        "counted); change its rule with `python -m autograder rule"
        in err
        and "\n" not in err
    )
    (out / store.STORE / "settings.json").write_text('{"late": 1}')
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "settings.json is damaged" in err and "\n" not in err


def test_report_roster_names_who_never_submitted(graded):
    """ivan and judy are on the roster and never handed the lesson in; --no-names counts them."""
    roster = graded / "roster.csv"
    roster.write_text("student,section\n" + "".join(f"{s},A\n" for s in ("alice", "bob", "ivan", "judy")))
    for extra, line in (
        ([], "Never handed in: 2 students: ivan, judy</p>"),
        (["--no-names"], "Never handed in: 2 students</p>"),
    ):
        assert main(["report", str(graded / "RESULTS"), "--roster", str(roster)] + extra) == 0
        assert line in (graded / "RESULTS" / "report.html").read_text()
    assert "Never handed in" not in classreport.render(store.load_term(graded / "RESULTS").results)


def test_never_handed_in_is_one_count_whether_or_not_a_result_was_stored(graded):
    """kim's lesson is a stored result whose every test is missing (grade --lesson wrote it), ivan has no result:
    both never handed it in, and the lesson says so once, with no per-function count of only one of them."""
    missing = result("kim", False)
    missing["tests"] = [dict(t, points=0.0, status="missing", message="not submitted") for t in missing["tests"]]
    save_result(graded / "RESULTS", missing)
    roster = graded / "roster.csv"
    roster.write_text("student\n" + "".join(f"{s}\n" for s in ("alice", "bob", "ivan", "kim")))
    assert main(["report", str(graded / "RESULTS"), "--roster", str(roster)]) == 0
    page = (graded / "RESULTS" / "report.html").read_text()
    assert "Never handed in: 2 students: ivan, kim</p>" in page
    assert "not submitted" not in page


def test_report_in_headless_chromium(graded):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (/usr/bin/chromium): `make setup` installs it as root")
    assert main(["report", str(graded / "RESULTS"), "--submissions", str(graded / "SUBMISSIONS")]) == 0
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    profile = graded / "profile"
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--window-size=1100,1400",
            f"--screenshot={SCREENSHOT}",
            (graded / "RESULTS" / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert SCREENSHOT.is_file(), f"Chromium wrote no screenshot (status {run.returncode}):\n{run.stderr[-2000:]}"
    from matplotlib.image import imread

    pixels = imread(SCREENSHOT)[..., :3]
    # The histogram's bars (#4c72b0) are on screen: the inline SVG was drawn.
    bars = (abs(pixels - [0x4C / 255, 0x72 / 255, 0xB0 / 255]).max(axis=-1) < 0.03).sum()
    assert bars > 500, "the histogram is not visible in the rendered page"


def test_a_refused_result_or_another_notebook_is_named_and_exits_1(graded, capsys):
    out, subs = graded / "RESULTS", graded / "SUBMISSIONS"
    graded_from = subs / "dave" / LESSON / f"{LESSON}.ipynb"
    save_result(out, dict(result("dave", False), sha256=hashlib.sha256(graded_from.read_bytes()).hexdigest()))
    assert main(["report", str(out), "--submissions", str(subs)]) == 0  # dave's notebook is the one graded
    path = store.result_path(out, "carol", LESSON)
    r = json.loads(path.read_text())
    r["tests"][0].update(points=2.0, status="passed")  # carol's softmax set to full marks by hand
    path.write_text(json.dumps(r))
    graded_from.write_text(submission())  # SUBMISSIONS now holds another notebook than dave's result graded
    capsys.readouterr()
    assert main(["report", str(out), "--submissions", str(subs)]) == 1
    err = capsys.readouterr().err
    refused = "stored result refused, left blank (regrade it: grade --resume): its verdict was changed after grading"
    assert refused in err and "(1): carol 01_attention" in err
    assert "dave 01_attention: its result was graded from another notebook" in err
    page = (out / "report.html").read_text()
    assert refused in page and "dave 01_attention: its result was graded from another notebook" in page
    assert "1 to grade again" in page, "carol is counted to grade again, not left out"
