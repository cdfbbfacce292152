"""RESULTS/totals.csv and `python -m autograder export`: Canvas's gradebook import (new columns, or the
columns of a gradebook exported from Canvas), a plain CSV, late penalties from stored submission
times, and tests the grader could not run, which never count as 0."""

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autograder.__main__ import main
from autograder.counting import score, write_final
from autograder.results import Result, load_results, result_path, save_result, write_timestamp

# Canvas's documented gradebook import: these identity columns first, then one column per assignment
# ("Name (assignment id)" for an existing one); an optional "Points Possible" row under the header.
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
ROSTER = """student,name,email,lms_id,sis_login_id,section
alice,"Liddell, Alice",alice@example.org,101,aliddell,A
bob,"Stone, Bob",bob@example.org,102,bstone,A
carol,"=HYPERLINK(""http://x"")",carol@example.org,103,cdanvers,B
"""
TESTS = {
    "01_attention": [("test_softmax", 2), ("test_causal_mask", 1), ("test_scaled_dot_product_attention", 3)],
    "02_heads": [
        ("test_split_heads", 2),
        ("test_merge_heads", 1),
        ("test_attention", 2),
        ("test_per_head_attention", 3),
    ],
}


def result(student, lesson, points, status=None, grader_error=(), submitted_at=None):
    tests = []
    for (test, full), got in zip(TESTS[lesson], points):
        t = dict(
            test=test,
            points=float(got),
            max_points=float(full),
            status=status or ("passed" if got == full else "failed"),
            message="" if got == full else "wrong",
        )
        if test in grader_error:
            t.update(points=0.0, status="error", message="the grader failed on this test", grader_error=True)
        tests.append(t)
    return dict(
        student=student,
        lesson=lesson,
        notebook=None,
        sha256=None,
        fingerprint=None,
        grader=None,
        submitted_at=submitted_at,
        notes=[],
        cells={},
        tests=tests,
    )


@pytest.fixture
def term(tmp_path):
    """RESULTS of two lessons: alice full marks then late; bob with a test the grader could not run;
    carol missing lesson 02."""
    out = tmp_path / "RESULTS"
    for r in (
        result("alice", "01_attention", [2, 1, 3]),
        result("alice", "02_heads", [2, 1, 2, 1]),
        result("bob", "01_attention", [2, 0, 3], grader_error={"test_scaled_dot_product_attention"}),
        result("bob", "02_heads", [2, 1, 0, 3]),
        result("carol", "01_attention", [1, 1, 0]),
        result("carol", "02_heads", [0, 0, 0, 0], status="missing"),
    ):
        save_result(out, r)
    (tmp_path / "roster.csv").write_text(ROSTER)
    return tmp_path


def read(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_totals(term):
    path = write_final(term / "RESULTS", load_results(term / "RESULTS"))
    rows = {r["student"]: r for r in csv.DictReader(open(path, newline=""))}
    assert read(path)[0] == [
        "student",
        "01_attention",
        "02_heads",
        "total",
        "max_points",
        "percentage",
        "regrade",
        "flags",
    ]
    assert rows["alice"] == dict(
        student="alice",
        **{"01_attention": "6", "02_heads": "6"},
        total="12",
        max_points="14",
        percentage="85.71",
        regrade="",
        flags="",
    )
    # The grader could not run one of bob's tests: lesson 01 is left out of his total, not counted as 0.
    assert rows["bob"]["01_attention"] == "" and rows["bob"]["02_heads"] == "6"
    assert rows["bob"]["total"] == "6" and rows["bob"]["max_points"] == "8"
    assert rows["bob"]["regrade"] == "01_attention: test_scaled_dot_product_attention"
    # Not submitting is a 0, flagged as never handed in, as a roster student's lesson with no result is.
    assert rows["carol"]["02_heads"] == "0" and rows["carol"]["percentage"] == "14.29"
    assert rows["carol"]["flags"] == "02_heads: never handed in"


def test_every_roster_student_has_a_row(term, capsys):
    """dave is on the roster and never handed anything in; erin handed in work and is not on it."""
    (term / "roster.csv").write_text(ROSTER + "dave,Dave Bowman,dave@example.org,104,dbowman,B\n")
    save_result(term / "RESULTS", result("erin", "01_attention", [2, 1, 3]))
    args = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "csv",
        "--out",
        str(term / "scores.csv"),
        "--roster",
        str(term / "roster.csv"),
    ]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "never handed in, counted as 0 (3): carol 02_heads; dave 01_attention, 02_heads" in err
    assert "not in the roster, kept: erin" in err
    for path in (term / "scores.csv", term / "RESULTS/totals.csv"):
        rows = {r["student"]: r for r in csv.DictReader(open(path, newline=""))}
        assert set(rows) == {"alice", "bob", "carol", "dave", "erin"}
        assert (rows["dave"]["01_attention"], rows["dave"]["total"], rows["dave"]["max_points"]) == ("0", "0", "14")
        assert rows["dave"]["flags"] == "01_attention: never handed in; 02_heads: never handed in"
        assert rows["alice"]["flags"] == "" and rows["alice"]["total"] == "12"
    assert main(args + ["--missing-blank"]) == 0
    err = capsys.readouterr().err
    assert "never handed in, left blank (3): carol 02_heads; dave 01_attention, 02_heads" in err
    assert "a trial, counted otherwise than" in err and "a lesson never handed in blank" in err
    assert [line.split(": ")[-1] for line in err.splitlines() if "to be graded again" in line] == ["bob 01_attention"]
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert (rows["dave"]["01_attention"], rows["dave"]["max_points"], rows["dave"]["percentage"]) == ("", "0", "")
    assert rows["dave"]["regrade"] == "" and "never handed in" in rows["dave"]["flags"]
    assert (rows["carol"]["02_heads"], rows["carol"]["max_points"]) == ("", "6"), "one state: no result or all missing"
    assert (
        main(
            [
                "export",
                str(term / "RESULTS"),
                "--format",
                "canvas",
                "--out",
                str(term / "canvas.csv"),
                "--roster",
                str(term / "roster.csv"),
            ]
        )
        == 0
    )
    by_id = {r[1]: r for r in read(term / "canvas.csv")[2:]}
    assert by_id["104"][5:] == ["0", "0"], "Canvas gets dave's zeros, not blanks"


def test_export_uses_the_roster_collect_kept(term, capsys):
    subs = term / "SUBMISSIONS"
    (term / "dl/dave").mkdir(parents=True)
    (term / "roster.csv").write_text(ROSTER + "dave,Dave Bowman,dave@example.org,104,dbowman,B\n")
    assert main(["collect", str(term / "dl"), "--out", str(subs), "--roster", str(term / "roster.csv")]) == 0
    (term / "roster.csv").unlink()
    assert (
        main(
            [
                "export",
                str(term / "RESULTS"),
                "--format",
                "csv",
                "--out",
                str(term / "scores.csv"),
                "--submissions",
                str(subs),
            ]
        )
        == 0
    )
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert rows["dave"]["01_attention"] == "0" and "never handed in" in rows["dave"]["flags"]


def test_grade_writes_totals_for_every_roster_student(term, capsys):
    from autograder.adapters import report_outputs
    from autograder.adapters.roster import load_roster

    (term / "roster.csv").write_text(ROSTER + "dave,Dave Bowman,dave@example.org,104,dbowman,B\n")
    write_totals_of_grade = report_outputs(roster=load_roster(term / "roster.csv"))[0]
    write_totals_of_grade(term / "RESULTS", load_results(term / "RESULTS"), [])
    rows = {r["student"]: r for r in csv.DictReader(open(term / "RESULTS/totals.csv", newline=""))}
    assert rows["dave"]["total"] == "0" and rows["dave"]["max_points"] == "14"
    # grade takes --roster: a roster it cannot read stops it before any grading.
    assert (
        main(["grade", str(term / "SUBMISSIONS"), "--out", str(term / "R2"), "--roster", str(term / "nope.csv")]) == 2
    )
    assert "cannot read the roster" in capsys.readouterr().err and not (term / "R2").exists()


def _gradebook_with_reviews(term):
    """nbgrader's gradebook of the term, filled as grade --gradebook does, then a TA's review: carol's
    test_scaled_dot_product_attention 2 (of 3, autograded 0), bob's (the grader could not run it) 3, and
    0.5 extra credit on alice's 02_heads test_merge_heads. Returns (its path, the results)."""
    from autograder.adapters.gradebook import _open, update_gradebook

    db, results = term / "gradebook.db", load_results(term / "RESULTS")
    update_gradebook(db, results, TESTS, term / "course")
    with _open(db) as gb:
        for student, lesson, test, manual, extra in (
            ("carol", "01_attention", "test_scaled_dot_product_attention", 2.0, None),
            ("bob", "01_attention", "test_scaled_dot_product_attention", 3.0, None),
            ("alice", "02_heads", "test_merge_heads", None, 0.5),
        ):
            g = gb.find_grade(test, lesson, lesson, student)
            g.manual_score, g.extra_credit, g.needs_manual_grade = manual, extra, False  # as formgrader saves it
        gb.db.commit()
    return db, results


def test_the_gradebooks_manual_scores_reach_the_export_and_totals(term, capsys):
    db, results = _gradebook_with_reviews(term)
    args = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "csv",
        "--out",
        str(term / "scores.csv"),
        "--gradebook",
        str(db),
    ]
    assert main(args) == 0
    assert "stale" not in capsys.readouterr().err
    for path in (term / "scores.csv", term / "RESULTS/totals.csv"):
        rows = {r["student"]: r for r in csv.DictReader(open(path, newline=""))}
        assert (rows["carol"]["01_attention"], rows["carol"]["total"]) == ("4", "4"), "1 + 1 + the manual 2"
        assert (
            rows["carol"]["flags"]
            == "01_attention: manual: test_scaled_dot_product_attention; 02_heads: never handed in"
        )
        # A manual score decides a test the grader could not run: no regrade left.
        assert (rows["bob"]["01_attention"], rows["bob"]["total"], rows["bob"]["regrade"]) == ("5", "11", "")
        assert (rows["alice"]["02_heads"], rows["alice"]["total"], rows["alice"]["max_points"]) == ("6.5", "12.5", "14")
        assert rows["alice"]["flags"] == "02_heads: extra credit: test_merge_heads"
    # grade --gradebook writes totals.csv after the gradebook, with its reviews.
    from autograder.adapters import report_outputs

    (term / "RESULTS/totals.csv").unlink()
    for write in report_outputs(gradebook=db, course_root=term / "course")[:2]:
        write(term / "RESULTS", results, [])
    rows = {r["student"]: r for r in csv.DictReader(open(term / "RESULTS/totals.csv", newline=""))}
    assert (rows["carol"]["total"], rows["bob"]["total"], rows["alice"]["total"]) == ("4", "11", "12.5")
    # A later grade into RESULTS without --gradebook would rewrite totals.csv and the feedback without those
    # scores: it is refused before any work, naming the flag, and totals.csv keeps them.
    before = (term / "RESULTS/totals.csv").read_text()
    for command in (["grade", str(term / "SUBMISSIONS"), "--written", "--resume"], ["merge", str(term / "RESULTS")]):
        assert main(command + ["--out", str(term / "RESULTS")]) == 2
        assert f"holds the manual scores of --gradebook {db.resolve()}: pass --gradebook" in capsys.readouterr().err
    assert (term / "RESULTS/totals.csv").read_text() == before
    # A RESULTS that does not remember its gradebook (an export --gradebook wrote the hand scores into totals.csv, or
    # an older grade did): its totals.csv's flags say so, and grade without --gradebook is refused the same way.
    from autograder.config import Settings, read_settings, write_settings

    write_settings(term / "RESULTS", Settings(read_settings(term / "RESULTS").rule))  # no gradebook recorded
    assert main(["grade", str(term / "SUBMISSIONS"), "--written", "--resume", "--out", str(term / "RESULTS")]) == 2
    assert "totals.csv holds manual scores from a gradebook: pass --gradebook" in capsys.readouterr().err


def test_a_stale_override_is_named_and_the_flag_chooses_whether_it_wins(term, capsys):
    """carol resubmits a correct test_scaled_dot_product_attention (3 of 3) after her manual 2."""
    from autograder.adapters.gradebook import read_reviews, update_gradebook

    db, results = _gradebook_with_reviews(term)
    regraded = save_result(term / "RESULTS", result("carol", "01_attention", [1, 1, 3]))
    update_gradebook(db, [regraded], {"01_attention": TESTS["01_attention"]}, term / "course")
    assert read_reviews(db)["carol", "01_attention"].stale == ["test_scaled_dot_product_attention"]
    assert read_reviews(db)["bob", "01_attention"].stale == [], "a regrade that changes nothing keeps it fresh"
    # grade --gradebook (its writer after the regrade) warns as export does, and carol's page says it is stale.
    from autograder.adapters import report_outputs

    for write in report_outputs(gradebook=db, course_root=term / "course"):
        write(term / "RESULTS", load_results(term / "RESULTS"), [])
    assert "warning: stale manual scores" in capsys.readouterr().err
    page = (term / "RESULTS/feedback/carol/01_attention.html").read_text()
    assert "scored by hand: 2 (the grader gave 3), before your work last changed: to be reviewed again (stale)" in page
    assert "stale" not in (term / "RESULTS/feedback/bob/01_attention.html").read_text()
    out = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "csv",
        "--out",
        str(term / "scores.csv"),
        "--gradebook",
        str(db),
    ]
    rule = ["rule", str(term / "RESULTS"), "--gradebook", str(db), "--stale-overrides"]
    for extra, total, verb in (([], "4", "kept"), (["--stale-overrides", "drop"], "5", "dropped")):
        assert (
            main(rule + [{"kept": "keep", "dropped": "drop"}[verb]]) == 0
        )  # RESULTS's rule, which the export, totals.csv and the pages count by
        assert main(out) == 0
        err = capsys.readouterr().err
        assert "stale manual scores" in err and "carol 01_attention test_scaled_dot_product_attention" in err
        rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
        assert rows["carol"]["01_attention"] == total
        assert f"stale override {verb}: test_scaled_dot_product_attention" in rows["carol"]["flags"]
        page = (term / "RESULTS/feedback/carol/01_attention.html").read_text()  # the page counts as the export
        assert (
            f"<b>{total} / 6</b>" in page
            and (
                f"<td>{3 if extra else 2:g} / 3<br><i>scored by hand: 2 (the grader "
                "gave 3), before your work last changed: "
            )
            in page
        )
        assert ("not counted, what the grader gave counts until it is reviewed again (stale)" in page) == bool(extra)
    assert main(["report", str(term / "RESULTS"), "--gradebook", str(db)]) == 0
    page = (term / "RESULTS/report.html").read_text()
    assert "Scored by hand in the gradebook: 2 tests (bob test_scaled_dot_product_attention, carol " in page
    assert (
        "Stale manual scores (the autograded result or the written answer changed since): "
        "carol test_scaled_dot_product_attention" in page
    )
    assert "Extra credit: 1 test (alice test_merge_heads)" in page
    # A TA who saves the score again in formgrader (which clears needs_manual_grade) makes it fresh.
    from autograder.adapters.gradebook import _open

    with _open(db) as gb:
        gb.find_grade(
            "test_scaled_dot_product_attention", "01_attention", "01_attention", "carol"
        ).needs_manual_grade = False
        gb.db.commit()
    assert main(rule + ["keep"]) == 0  # the one command that changes the rule says what changed
    assert "changed: stale manual scores kept (before: stale manual scores dropped)" in capsys.readouterr().out
    assert main(out) == 0
    assert "stale manual scores (" not in capsys.readouterr().err  # no stale score now
    assert main(out[:-1] + [str(term / "nope.db")]) == 2
    assert "no such gradebook" in capsys.readouterr().err


def test_merge_writes_totals_for_every_roster_student(term, capsys):
    (term / "roster.csv").write_text(ROSTER + "dave,Dave Bowman,dave@example.org,104,dbowman,B\n")
    assert (
        main(
            [
                "merge",
                str(term / "RESULTS"),
                "--out",
                str(term / "MERGED"),
                "--roster",
                str(term / "roster.csv"),
                "--allow-partial",
            ]
        )
        == 0
    )
    rows = {r["student"]: r for r in csv.DictReader(open(term / "MERGED/totals.csv", newline=""))}
    assert set(rows) == {"alice", "bob", "carol", "dave"} and rows["dave"]["total"] == "0"
    assert "never handed in" in rows["dave"]["flags"]
    # merge's (and grade's) summary line counts as totals.csv does: dave's 14 in the maximum, and the lessons to grade
    # again (this partial merge's gaps) left out, where it summed the stored results' points whatever totals.csv said.
    assert (sum(float(r["total"]) for r in rows.values()), sum(float(r["max_points"]) for r in rows.values())) == (
        0,
        14,
    )
    assert (
        "holds 6 results (3 students; 4 in totals.csv with the roster), 0/14 points in totals.csv (6 lesson scores "
        "left out: still to grade, or "
        "to grade again)" in capsys.readouterr().out
    )


def test_canvas_import_layout(term, capsys):
    out = term / "canvas.csv"
    assert (
        main(
            [
                "export",
                str(term / "RESULTS"),
                "--format",
                "canvas",
                "--roster",
                str(term / "roster.csv"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "left blank, to be graded again" in capsys.readouterr().err
    assert (term / "RESULTS" / "totals.csv").is_file()
    rows = read(out)
    assert rows[0] == CANVAS_COLUMNS + ["01_attention", "02_heads"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][5:] == ["6", "8"]
    by_id = {r[1]: r for r in rows[2:]}
    assert by_id["101"] == ["Liddell, Alice", "101", "alice", "aliddell", "A", "6", "6"]
    assert by_id["102"][5:] == ["", "6"], "a test to grade again leaves the cell blank (no change in Canvas)"
    assert by_id["103"][0].startswith("'="), "a formula in a name is neutralised"


def test_canvas_fills_an_exported_gradebook(term):
    gradebook = term / "export.csv"
    gradebook.write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Lesson 01: attention (5501),02_heads (5502),Essay (5503),"
        "Current Score,Final Score\n"
        "    Points Possible,,,,,6,8,10,(read only),(read only)\n"
        '"Liddell, Alice",101,alice,aliddell,A,,,9,90,90\n'
        '"Stone, Bob",102,bob,bstone,A,5,,7,70,70\n'
        '"Who, Else",199,else,else,B,4,3,8,80,80\n'
    )
    out = term / "canvas.csv"
    assert (
        main(
            [
                "export",
                str(term / "RESULTS"),
                "--format",
                "canvas",
                "--roster",
                str(term / "roster.csv"),
                "--canvas-gradebook",
                str(gradebook),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = read(out)
    assert rows[0] == CANVAS_COLUMNS + ["Lesson 01: attention (5501)", "02_heads (5502)"]
    assert rows[1][0].strip() == "Points Possible"
    by_id = {r[1]: r for r in rows[2:]}
    assert by_id["101"][5:] == ["6", "6"]
    assert by_id["102"][5:] == ["5", "6"], "a lesson to grade again keeps Canvas's value"
    assert by_id["199"][5:] == ["4", "3"], "a student we did not grade keeps Canvas's values"


def test_late_penalties(term, capsys):
    subs = term / "SUBMISSIONS"
    deadline = "2025-10-01T23:59:00+00:00"
    write_timestamp(subs / "alice/02_heads", datetime(2025, 10, 3, 12, 0, tzinfo=timezone.utc))  # 2 days late
    write_timestamp(subs / "bob/02_heads", datetime(2025, 10, 1, 20, 0, tzinfo=timezone.utc))  # on time
    rule = [
        "rule",
        str(term / "RESULTS"),
        "--deadline",
        f"02_heads={deadline}",
        "--late-policy",
        "10%/day,max=15%",
        "--submissions",
        str(subs),
    ]
    args = ["export", str(term / "RESULTS"), "--format", "csv", "--out", str(term / "scores.csv")]
    assert main(rule) == 0 and main(args) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    # 2 days at 10% a day, capped at 15%: 6 points become 5.1; the raw 6 is kept beside it.
    assert (rows["alice"]["02_heads"], rows["alice"]["02_heads raw"], rows["alice"]["02_heads penalty %"]) == (
        "5.1",
        "6",
        "15",
    )
    assert rows["bob"]["02_heads"] == "6" and rows["bob"]["02_heads penalty %"] == "0"
    assert rows["carol"]["02_heads"] == "0", "no submission, no time needed"
    penalties = {r["student"]: r for r in csv.DictReader(open(term / "RESULTS/late-penalties.csv", newline=""))}
    assert penalties["alice"]["raw"] == "6" and penalties["alice"]["penalised"] == "5.1"
    # Her feedback page says what the export counts; bob's, on time, says nothing of lateness.
    assert (
        f"Handed in 2 days after your deadline ({deadline}): 15% off the points earned, so 5.1 of 6 count."
        in (term / "RESULTS/feedback/alice/02_heads.html").read_text()
    )
    assert "Handed in" not in (term / "RESULTS/feedback/bob/02_heads.html").read_text()
    assert "late penalties: 10%/day,max=15% after 02_heads" in (term / "RESULTS/report.html").read_text(), (
        "the class report counts by RESULTS's rule, as totals.csv and the feedback pages"
    )
    assert penalties["alice"]["penalty_percent"] == "15" and penalties["alice"]["late_units"] == "2"
    # A submission without a time is exported unpenalised and flagged, named in a warning; bob, who has
    # one, is still penalised the same way, and the export goes on.
    (subs / "alice/02_heads/timestamp.txt").unlink()
    write_timestamp(subs / "bob/02_heads", datetime(2025, 10, 2, 20, 0, tzinfo=timezone.utc))  # 1 day late
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "no submission time for 1 submission(s) of 02_heads: alice: exported unpenalised" in err
    assert "give --submissions" not in err, "the hint names only what was not done: --submissions was given"
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert rows["alice"]["02_heads"] == "6" and rows["alice"]["flags"] == "02_heads: no submission time: not penalised"
    assert rows["bob"]["02_heads"] == "5.4" and rows["bob"]["flags"] == "02_heads: late 1 day: -10%"
    penalties = {r["student"]: r for r in csv.DictReader(open(term / "RESULTS/late-penalties.csv", newline=""))}
    assert penalties["alice"]["submitted_at"] == "" and penalties["alice"]["penalised"] == "6"


def test_extensions_and_grace(term, capsys):
    subs = term / "SUBMISSIONS"
    write_timestamp(subs / "alice/02_heads", datetime(2025, 10, 3, 12, 0, tzinfo=timezone.utc))  # 2 days late
    write_timestamp(subs / "bob/02_heads", datetime(2025, 10, 2, 0, 10, tzinfo=timezone.utc))  # 11 minutes late
    write_timestamp(subs / "alice/01_attention", datetime(2025, 10, 5, 12, 0, tzinfo=timezone.utc))
    (term / "ext.csv").write_text(
        "\ufeffStudent,Lesson,Deadline\nalice,02_heads,2025-10-04T00:00:00\nalice,01_attention,exempt\n"
    )
    args = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "csv",
        "--out",
        str(term / "scores.csv"),
        "--deadline",
        "02_heads=2025-10-01T23:59:00+00:00",
        "--deadline",
        "01_attention=2025-10-01T23:59:00+00:00",
        "--late-policy",
        "10%/day",
        "--submissions",
        str(subs),
    ]
    assert main(args + ["--extensions", str(term / "ext.csv"), "--grace", "15m"]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert rows["alice"]["02_heads"] == "6", "on time by her own deadline"
    assert rows["alice"]["01_attention"] == "6" and rows["alice"]["flags"] == "01_attention: exempt from the deadline"
    assert rows["bob"]["02_heads"] == "6", "within the grace period"
    # Past the grace period, lateness counts from the deadline: 11 minutes is a started day.
    assert main(args + ["--extensions", str(term / "ext.csv"), "--grace", "5m"]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert rows["bob"]["02_heads"] == "5.4" and rows["alice"]["02_heads"] == "6"
    capsys.readouterr()
    for content, extra, message in [
        ("student,lesson,deadline\nalice,03_multi_head,exempt\n", [], "'03_multi_head' has no --deadline"),
        ("student,lesson,deadline\nalice,02_heads,soon\n", [], "line 2: 'soon' is not an ISO 8601 time"),
        ("student,lesson\nalice,02_heads\n", [], "need the columns student, lesson, deadline"),
        ("student,lesson,deadline\n", ["--grace", "a while"], "--grace takes a duration"),
    ]:
        (term / "ext.csv").write_text(content)
        assert main(args + ["--extensions", str(term / "ext.csv")] + extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--format", "blackboard"], "unknown format"),
        (["--format", "canvas", "--roster", "missing.csv"], "cannot read the roster"),
        (["--format", "canvas", "--roster", "dup.csv"], "duplicate student"),
        (["--format", "canvas"], "needs --roster"),
        (["--format", "canvas", "--roster", "noid.csv"], "has no 'lms_id' column, which Canvas's import matches"),
        (["--format", "csv", "--deadline", "01_attention=next friday", "--late-policy", "10%/day"], "not an ISO 8601"),
        (["--format", "csv", "--deadline", "09_nope=2025-10-01", "--late-policy", "10%/day"], "LESSON=ISO8601"),
        (
            ["--format", "csv", "--deadline", "01_attention=2025-10-01T23:59", "--late-policy", "lots"],
            "--late-policy takes",
        ),
        (["--format", "csv", "--deadline", "01_attention=2025-10-01T23:59"], "need both"),
        (["--format", "csv", "--deadline", "01_attention=2025-10-01", "--late-policy", "10%/day"], "give the time too"),
        (
            ["--format", "canvas", "--roster", "roster.csv", "--canvas-gradebook", "roster.csv"],
            "not a gradebook exported",
        ),
    ],
    ids=[
        "format",
        "unreadable-roster",
        "duplicate-id",
        "no-roster",
        "roster-without-lms-id",
        "bad-deadline",
        "unknown-lesson",
        "bad-policy",
        "policy-missing",
        "date-only",
        "not-a-gradebook",
    ],
)
def test_bad_input_is_one_line_and_exit_2(term, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(term)
    (term / "dup.csv").write_text("student,lms_id\nalice,1\nalice,2\n")
    (term / "noid.csv").write_text("student,name\nalice,Alice Liddell\n")
    assert main(["export", "RESULTS", "--out", "out.csv"] + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not Path("out.csv").exists()


def test_export_of_an_empty_folder_is_refused(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--format", "csv", "--out", str(tmp_path / "x.csv")]) == 2
    assert "holds no grading results" in capsys.readouterr().err


def _tamper(path):
    """A stored result edited after grading: every test at full marks."""
    r = json.loads(path.read_text())
    for t in r["tests"]:
        t.update(points=t["max_points"], status="passed")
    path.write_text(json.dumps(r))


def test_a_refused_or_deleted_result_is_named_and_marked_never_a_silent_blank(term, capsys):
    results = term / "RESULTS"
    _tamper(result_path(results, "carol", "01_attention"))
    result_path(results, "alice", "02_heads").unlink()
    assert main(["export", str(results), "--format", "csv", "--out", str(term / "scores.csv")]) == 1
    err = capsys.readouterr().err
    assert (
        "stored result refused, left blank (regrade it: grade --resume): its verdict was changed after grading" in err
    )
    assert ": it was deleted (the folder's index records it) (1): alice 02_heads" in err
    rows = {r["student"]: r for r in csv.DictReader(open(term / "scores.csv", newline=""))}
    assert (
        rows["carol"]["01_attention"] == ""
        and "01_attention: refused: its verdict was changed" in rows["carol"]["regrade"]
    )
    assert rows["alice"]["02_heads"] == "" and "02_heads: refused: it was deleted" in rows["alice"]["regrade"]
    result_path(results, "alice", "02_heads").parent.joinpath("bob.json").unlink()  # bob's 02: his only other result
    out = term / "canvas.csv"
    assert (
        main(["export", str(results), "--format", "canvas", "--roster", str(term / "roster.csv"), "--out", str(out)])
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "refused, left blank (regrade it: grade --resume): its verdict was changed" in err
        and "carol 01_attention" in err
    )
    assert "it was deleted (the folder's index records it) (2): alice 02_heads; bob 02_heads" in err
    by_id = {r[1]: r for r in read(out)[2:]}
    assert by_id["103"][5] == "" and by_id["102"][6] == ""


def with_written(r, status="needs grading"):
    """The result dict r with one written question."""
    return dict(r, written=[dict(question="why_scale", max_points=2.0, status=status, message="answered")])


def test_written_questions_count_only_with_written_and_wait_for_a_manual_score():
    """Off, a written question counts nowhere (a manual score for it neither); on, its points join the maximum
    and its score is the gradebook's: until then the lesson has none ('needs grading' in totals.csv, blank in an
    export), never a 0; a notebook never handed in counts 0 for it, as for its tests. The feedback page agrees."""
    from autograder.adapters.gradebook import Review
    from autograder.counting import totals_rows
    from autograder.report import feedback_page

    r = Result.from_json(with_written(result("alice", "01_attention", [2, 1, 3])))
    graded = Review(manual={"why_scale": 1.5})
    absent = Result.from_json(
        with_written(result("carol", "01_attention", [0, 0, 0], status="missing"), status="missing")
    )
    got = {
        name: (s.points, s.max_points, s.pending, s.flag)
        for name, s in {
            "off": score(r),
            "off, graded": score(r, graded),
            "on": score(r, written=True),
            "on, graded": score(r, graded, written=True),
            "on, never handed in": score(absent, written=True),
        }.items()
    }
    assert got == {
        "off": (6, 6, [], ""),
        "off, graded": (6, 6, [], ""),
        "on": (None, 8, ["why_scale"], "needs grading: why_scale"),
        "on, graded": (7.5, 8, [], "manual: why_scale"),
        "on, never handed in": (0, 8, [], "never handed in"),
    }
    scores = {("alice", "01_attention"): score(r, written=True), ("carol", "01_attention"): score(absent, written=True)}
    for pending, shown in (("needs grading", "needs grading"), ("", "")):
        rows = {
            row["student"]: row for row in totals_rows(["alice", "carol"], ["01_attention"], scores, pending=pending)
        }
        assert (rows["alice"]["01_attention"], rows["alice"]["total"], rows["alice"]["max_points"]) == (shown, 0, 0)
        assert rows["alice"]["flags"] == "01_attention: needs grading: why_scale" and rows["alice"]["regrade"] == ""
        assert (rows["carol"]["01_attention"], rows["carol"]["total"], rows["carol"]["max_points"]) == (0, 0, 8)
    pages = {
        "off": feedback_page(r),
        "on": feedback_page(r, written=True),
        "on, graded": feedback_page(r, graded, written=True),
    }
    assert "<b>6 / 6</b>" in pages["off"] and ">not counted<" in pages["off"] and "needs grading" not in pages["off"]
    assert (
        "<b>6 / 8</b>" in pages["on"]
        and ">needs grading<" in pages["on"]
        and "not graded yet (why_scale)" in pages["on"]
    )
    assert (
        "<b>7.5 / 8</b>" in pages["on, graded"]
        and "scored by hand: 1.5" in pages["on, graded"]
        and "not graded yet" not in pages["on, graded"]
    )
    assert ">graded<" in pages["on, graded"] and "needs grading" not in pages["on, graded"], "a TA scored it"


def test_an_unanswered_written_question_scores_0_without_waiting_and_a_ta_may_still_score_it(tmp_path):
    """Left as released: the lesson is scored at once (0 for it, flagged), formgrader does not list it as needing a
    grade (nbgrader's own autograde scores an unchanged answer 0), the page says so; a TA's score still wins."""
    from autograder.adapters.gradebook import Review, _open, update_gradebook
    from autograder.report import feedback_page

    r = Result.from_json(with_written(result("alice", "01_attention", [2, 1, 3]), status="unanswered"))
    blank, scored = score(r, written=True), score(r, Review(manual={"why_scale": 1.0}), written=True)
    assert (blank.points, blank.max_points, blank.pending, blank.flag) == (6, 8, [], "unanswered (0): why_scale")
    assert (scored.points, scored.flag) == (7, "manual: why_scale")
    page = feedback_page(r, written=True)
    assert "<b>6 / 8</b>" in page and ">unanswered<" in page and "0 / 2" in page and "not graded yet" not in page
    from autograder.adapters.classreport import written_lines

    assert written_lines([r], {}, "01_attention", True) == [
        "Written question why_scale: 0/0 graded; unanswered (0): 1 student (alice)"
    ]
    tests = {"01_attention": TESTS["01_attention"] + [("why_scale", 2)]}
    update_gradebook(tmp_path / "gradebook.db", [r], tests, tmp_path / "course")
    with _open(tmp_path / "gradebook.db") as gb:
        g = gb.find_grade("why_scale", "01_attention", "01_attention", "alice")
        assert (g.auto_score, g.needs_manual_grade, g.score) == (0, False, 0)


def test_a_manual_score_on_a_test_is_said_on_the_feedback_page():
    from autograder.adapters.gradebook import Review
    from autograder.report import feedback_page

    r = Result.from_json(result("carol", "01_attention", [1, 1, 0]))
    page = feedback_page(r, Review(manual={"test_scaled_dot_product_attention": 2.5}, extra={"test_softmax": 0.5}))
    assert "<b>5 / 6</b>" in page and "scored by hand: 2.5 (the grader gave 0)" in page and "extra credit: +0.5" in page
    assert "<b>2 / 6</b>" in feedback_page(r) and "by hand" not in feedback_page(r)


def test_written_questions_are_stored_with_the_result_and_a_bad_one_refused(tmp_path):
    from autograder.results import ResultError, load_result

    save_result(tmp_path, with_written(result("alice", "01_attention", [2, 1, 3])))
    stored, why = load_result(tmp_path, "alice", "01_attention")
    assert why is None and stored.to_json()["written"] == with_written({})["written"]
    with pytest.raises(ResultError, match=r"written\[0\].status 'graded' is not one of needs grading"):
        save_result(tmp_path, with_written(result("alice", "01_attention", [2, 1, 3]), status="graded"))
    save_result(tmp_path, result("alice", "02_heads", [2, 1, 2, 3]))  # no written question: stored as before
    assert "written" not in json.loads(result_path(tmp_path, "alice", "02_heads").read_text())


def test_the_grader_carries_each_written_question_as_needs_grading():
    """grade reads each written question of the lesson from the notebook: answered, or its cell gone, needs
    grading (a person decides, never a silent 0); still the stub, unanswered (0 unless a TA scores it); without a
    notebook, the status given."""
    from autograder import notebook as nbk
    from autograder.grade import written_rows
    from autograder.release import student_copy

    lesson = "03_multi_head"
    nb = student_copy(nbk.read(nbk.lesson_path(lesson)))
    [(question, points)] = nbk.lesson_written(lesson)
    assert points == 2 and written_rows(lesson, nb) == [
        dict(
            question=question,
            max_points=2.0,
            status="unanswered",
            message="not answered: its cell still holds YOUR ANSWER HERE; 0 points unless your instructor scores it",
        )
    ]
    cell = next(c for c in nb["cells"] if nbk.is_written(c))
    nbk.set_source(cell, "Eight distributions per position.")
    assert written_rows(lesson, nb)[0]["message"] == "answered; graded by a person"
    assert written_rows(lesson, nb)[0]["status"] == "needs grading"
    cell["metadata"] = {}
    assert written_rows(lesson, nb)[0]["message"].startswith("its answer cell is not in your notebook")
    assert written_rows(lesson, nb)[0]["status"] == "needs grading", "the answer may be in another cell: a person looks"
    assert written_rows(lesson, None, "missing", "not submitted") == [
        dict(question=question, max_points=2.0, status="missing", message="not submitted")
    ]


def test_a_written_answer_changed_by_a_resubmission_makes_its_manual_score_stale(tmp_path):
    """A TA graded alice's answer; a regrade of the same answer keeps the score fresh; a resubmission with
    another answer keeps the score but marks it stale (formgrader lists it again, export and the report name
    it, --stale-overrides drop makes the lesson wait for a grade again), and it stays stale until a TA saves one."""
    import hashlib

    from autograder import notebook as nbk
    from autograder.adapters.gradebook import _open, read_reviews, update_gradebook
    from autograder.grade import written_rows
    from autograder.release import student_copy

    lesson = "03_multi_head"
    [(question, _)] = nbk.lesson_written(lesson)
    nb = student_copy(nbk.read(nbk.lesson_path(lesson)))
    cells = {lesson: nbk.lesson_tests(lesson)}

    def regrade(answer):
        nbk.set_source(next(c for c in nb["cells"] if nbk.is_written(c)), answer)
        data = json.dumps(nb).encode()
        (tmp_path / "03.ipynb").write_bytes(data)
        tests = [dict(test=t, points=p, max_points=p, status="passed", message="") for t, p in cells[lesson]]
        r = Result.from_json(
            dict(
                student="alice",
                lesson=lesson,
                notebook=str(tmp_path / "03.ipynb"),
                sha256=hashlib.sha256(data).hexdigest(),
                fingerprint=None,
                grader=None,
                submitted_at=None,
                notes=[],
                cells={},
                tests=tests,
                written=written_rows(lesson, nb),
            )
        )
        update_gradebook(tmp_path / "gradebook.db", [r], cells, tmp_path / "course")
        return r, read_reviews(tmp_path / "gradebook.db").get(("alice", lesson))

    def ta_saves(points):
        with _open(tmp_path / "gradebook.db") as gb:
            g = gb.find_grade(question, lesson, lesson, "alice")
            g.manual_score, g.needs_manual_grade = points, False  # as formgrader saves it
            gb.db.commit()

    first = "Eight heads give eight distributions per position; one wide head gives one."
    assert regrade(first)[1] is None, "not graded yet: no review"
    ta_saves(1.5)
    assert regrade(first)[1].stale == [], "the same answer graded again keeps its score fresh"
    r, review = regrade("A different answer, written after the TA graded the first.")
    assert (review.manual, review.stale) == ({question: 1.5}, [question])
    assert regrade("A different answer, written after the TA graded the first.")[1].stale == [question], (
        "stale until a TA saves a score again"
    )
    kept, dropped = score(r, review, written=True), score(r, review, drop_stale=True, written=True)
    assert (kept.points, kept.pending, dropped.points, dropped.pending) == (r.max_points + 1.5, [], None, [question])
    ta_saves(2.0)
    assert regrade("A different answer, written after the TA graded the first.")[1].stale == []


# ---- the slips of a term (issue 37): each once exited 0 with a wrong number --------------------------------------


def test_an_extension_for_a_student_nobody_knows_stops_the_rule(term, capsys):
    """`ghoper` for alice's classmate: once ignored, so the student it was meant for lost 20%."""
    (term / "ext.csv").write_text("student,lesson,deadline\nghoper,02_heads,2025-10-09T23:59:00+00:00\n")
    rule = [
        "rule",
        str(term / "RESULTS"),
        "--roster",
        str(term / "roster.csv"),
        "--deadline",
        "02_heads=2025-10-01T23:59:00+00:00",
        "--late-policy",
        "10%/day",
        "--extensions",
        str(term / "ext.csv"),
    ]
    before = sorted(p.name for p in (term / "RESULTS/.results").iterdir())
    assert main(rule) == 2
    err = capsys.readouterr().err.strip()
    assert "line 2: no student 'ghoper' in the roster or the results" in err and "\n" not in err
    assert sorted(p.name for p in (term / "RESULTS/.results").iterdir()) == before, "no rule written"
    assert main(rule + ["--allow-mismatch"]) == 0  # the instructor goes on knowingly
    assert "1 extension(s)" in capsys.readouterr().out


def test_an_extension_for_a_student_nobody_knows_stops_grade_and_merge_on_a_fresh_folder(term, capsys):
    """A RESULTS folder with no results yet still knows the class: the roster, SUBMISSIONS's student folders and the
    results merged into it. `ghoper` there was once kept silently, and the student it was meant for lost 20%."""
    (term / "SUBMISSIONS" / "dana" / "02_heads").mkdir(parents=True)  # a student folder, on no roster; no notebook
    late = ["--deadline", "02_heads=2025-10-01T23:59:00+00:00", "--late-policy", "10%/day"]
    late += ["--extensions", str(term / "ext.csv")]
    grade = ["grade", str(term / "SUBMISSIONS"), "--out", str(term / "FRESH"), "--roster", str(term / "roster.csv")]
    merge = ["merge", str(term / "RESULTS"), "--out", str(term / "MERGED"), "--allow-partial"]
    for command, known in ((grade, "dana"), (grade, "bob"), (merge, "carol")):
        (term / "ext.csv").write_text("student,lesson,deadline\nghoper,02_heads,2025-10-09T23:59:00+00:00\n")
        assert main(command + late) == 2
        err = capsys.readouterr().err.strip()
        assert "line 2: no student 'ghoper' in the roster or the results" in err and "\n" not in err, err
        assert not (term / "FRESH").exists() and not (term / "MERGED").exists(), "nothing written"
        (term / "ext.csv").write_text(f"student,lesson,deadline\n{known},02_heads,2025-10-09T23:59:00+00:00\n")
        if command is grade:  # past the extensions, grade stops at the class (no notebook): nothing is graded here
            assert main(command + late) == 2
            assert "no notebook of any lesson" in capsys.readouterr().err
        else:
            assert main(command + late) == 0 and (term / "MERGED" / "totals.csv").is_file()
            capsys.readouterr()
    (term / "ext.csv").write_text("student,lesson,deadline\ndana,02_head,2025-10-09T23:59:00+00:00\n")  # no such lesson
    assert main(grade + late) == 2
    err = capsys.readouterr().err.strip()
    assert "line 2: '02_head' has no --deadline" in err and "\n" not in err, err


def test_a_canvas_column_worth_other_points_stops_the_export(term, capsys):
    gradebook = term / "export.csv"
    gradebook.write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,01_attention (5501),02_heads (5502)\n"
        "    Points Possible,,,,,6,10\n"
        '"Liddell, Alice",101,alice,aliddell,A,,\n'
    )
    args = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "canvas",
        "--roster",
        str(term / "roster.csv"),
        "--canvas-gradebook",
        str(gradebook),
        "--out",
        str(term / "canvas.csv"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "02_heads (5502) has Points Possible 10, but 02_heads is out of 8 here" in err and "\n" not in err
    assert not (term / "canvas.csv").exists()
    assert main(args + ["--allow-mismatch"]) == 0 and (term / "canvas.csv").is_file()


def test_a_lesson_skipped_is_never_handed_in_in_every_artifact_under_every_rule(term, capsys):
    """carol's 02_heads result has every test missing (she handed in 01 only); dave, on the roster, has no result
    at all. Both are one state: flagged, named in the warning, 0, or blank with --missing-blank, in totals.csv,
    the export and report.html alike."""
    (term / "roster.csv").write_text(ROSTER + "dave,Dave Bowman,dave@example.org,104,dbowman,B\n")
    out, roster = term / "RESULTS", ["--roster", str(term / "roster.csv")]
    for flag, cell, said in (("--no-missing-blank", "0", "counted as 0"), ("--missing-blank", "", "left blank")):
        assert main(["rule", str(out), *roster, flag]) == 0
        assert main(["export", str(out), "--format", "csv", "--out", str(term / "plain.csv"), *roster]) == 0
        assert f"never handed in, {said} (3): carol 02_heads; dave 01_attention, 02_heads" in capsys.readouterr().err
        for path in (term / "plain.csv", out / "totals.csv"):
            rows = {r["student"]: r for r in csv.DictReader(open(path, newline=""))}
            assert (rows["carol"]["02_heads"], rows["dave"]["02_heads"]) == (cell, cell)
            assert "02_heads: never handed in" in rows["carol"]["flags"] and "never handed in" in rows["dave"]["flags"]
        assert "Never handed in: 2 students: carol, dave" in (out / "report.html").read_text()
        page = (out / "feedback" / "carol" / "02_heads.html").read_text()
        assert ("left blank, out of your total" if cell == "" else "counts 0 of its 8 points") in page


def test_a_trial_export_writes_only_its_file_and_grade_refuses_another_rule(term, capsys):
    out = term / "RESULTS"
    assert (
        main(
            [
                "rule",
                str(out),
                "--written",
                "--deadline",
                "02_heads=2025-10-01T23:59:00+00:00",
                "--late-policy",
                "10%/day",
                "--grace",
                "1h",
            ]
        )
        == 0
    )
    kept = {
        p: p.read_bytes()
        for p in [out / "totals.csv", out / "report.html", *sorted((out / "feedback").rglob("*"))]
        if p.is_file()
    }
    capsys.readouterr()
    assert (
        main(
            [
                "export",
                str(out),
                "--format",
                "csv",
                "--out",
                str(term / "scratch.csv"),
                "--no-written",
                "--late-policy",
                "none",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "a trial, counted otherwise than" in err and "written questions not counted" in err
    assert (term / "scratch.csv").is_file()
    assert {p: p.read_bytes() for p in kept} == kept, "RESULTS's totals.csv, pages and report unchanged"
    for command in (
        ["grade", str(term / "SUBMISSIONS"), "--out", str(out), "--no-written"],
        ["grade", str(term / "SUBMISSIONS"), "--out", str(out), "--resume", "--grace", "2h"],
        ["report", str(out), "--late-policy", "5%/day"],
    ):
        assert main(command) == 2, command
        err = capsys.readouterr().err.strip()
        assert "counts otherwise than these flags say" in err and "\n" not in err


def test_an_export_by_the_rule_says_what_it_rewrote(term, capsys):
    """Not a trial: the export rewrites totals.csv, the pages and the report by RESULTS's rule, and says so."""
    out = term / "RESULTS"
    assert main(["export", str(out), "--format", "csv", "--out", str(term / "scores.csv")]) == 0
    assert f"wrote {term / 'scores.csv'}, {out}/totals.csv, feedback/ and {out}/report.html" in capsys.readouterr().out


def test_a_wrong_key_writes_nothing(term, capsys, monkeypatch):
    out = term / "RESULTS"
    assert main(["export", str(out), "--format", "csv", "--out", str(term / "a.csv")]) == 0
    kept = (out / "totals.csv").read_bytes()
    (term / "other.key").write_text("ab" * 32 + "\n")
    (term / "other.key").chmod(0o600)
    monkeypatch.setenv("MHA_RESULTS_KEY", str(term / "other.key"))
    capsys.readouterr()
    for command in (
        ["export", str(out), "--format", "canvas", "--roster", str(term / "roster.csv"), "--out", str(term / "b.csv")],
        ["report", str(out)],
        ["rule", str(out), "--written"],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {out}: ") and "key" in err and "\n" not in err
    assert not (term / "b.csv").exists() and (out / "totals.csv").read_bytes() == kept


def test_the_stale_manual_score_is_told_one_way(term, capsys):
    """RESULTS drops stale overrides: grade's warning says so, as totals.csv and the pages count it."""
    from autograder.adapters import report_outputs
    from autograder.adapters.gradebook import update_gradebook
    from autograder.config import read_settings

    db, _ = _gradebook_with_reviews(term)
    assert main(["rule", str(term / "RESULTS"), "--gradebook", str(db), "--stale-overrides", "drop"]) == 0
    regraded = save_result(term / "RESULTS", result("carol", "01_attention", [1, 1, 3]))
    update_gradebook(db, [regraded], {"01_attention": TESTS["01_attention"]}, term / "course")
    capsys.readouterr()
    for write in report_outputs(gradebook=db, course_root=term / "course", rule=read_settings(term / "RESULTS").rule):
        write(term / "RESULTS", load_results(term / "RESULTS"), [])
    err = capsys.readouterr().err
    assert "dropped: the new result counts" in err and "kept: they still win" not in err
    rows = {r["student"]: r for r in csv.DictReader(open(term / "RESULTS/totals.csv", newline=""))}
    assert "stale override dropped: test_scaled_dot_product_attention" in rows["carol"]["flags"]


def test_600_results_with_one_cause_print_one_grouped_line(tmp_path, capsys):
    out = tmp_path / "RESULTS"
    for i in range(300):
        for lesson in TESTS:
            save_result(out, result(f"s{i:03d}", lesson, [0] * len(TESTS[lesson]), status="missing"))
    assert main(["export", str(out), "--format", "csv", "--out", str(tmp_path / "x.csv")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "never handed in" in line]
    assert len(lines) == 1 and lines[0].count("s000") == 1 and "(600): s000 01_attention, 02_heads; s001" in lines[0]


def test_a_manual_score_for_a_student_results_does_not_know_stops_the_export(term, capsys):
    """The gradebook holds a TA's score for zed, whom neither the roster nor RESULTS knows (another class's
    gradebook, or a student renamed): it would count nowhere, silently."""
    from autograder.adapters.gradebook import _open, update_gradebook

    db, _ = _gradebook_with_reviews(term)
    zed = save_result(term / "OTHER", result("zed", "01_attention", [2, 1, 0]))
    update_gradebook(db, [zed], TESTS, term / "course")
    with _open(db) as gb:
        g = gb.find_grade("test_scaled_dot_product_attention", "01_attention", "01_attention", "zed")
        g.manual_score, g.needs_manual_grade = 3.0, False
        gb.db.commit()
    args = [
        "export",
        str(term / "RESULTS"),
        "--format",
        "csv",
        "--out",
        str(term / "scores.csv"),
        "--gradebook",
        str(db),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "has a manual score for student 'zed'" in err and "\n" not in err and not (term / "scores.csv").exists()
    assert main(args + ["--allow-mismatch"]) == 0


def test_a_rule_whose_output_is_cut_off_has_counted_totals_by_it(term, monkeypatch):
    """`rule ... | head` closes stdout early: the rule it saved and totals.csv agree all the same (everything is
    written before a word is printed)."""
    out, roster = term / "RESULTS", ["--roster", str(term / "roster.csv")]

    def closed_pipe(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("builtins.print", closed_pipe)
    with pytest.raises(BrokenPipeError):
        main(["rule", str(out), *roster, "--missing-blank"])
    monkeypatch.undo()
    rows = {r["student"]: r for r in csv.DictReader(open(out / "totals.csv", newline=""))}
    assert rows["carol"]["02_heads"] == ""  # left blank, as the saved rule says
