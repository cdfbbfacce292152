"""feedback-upload: the zip each LMS takes to attach the feedback pages to the submissions, named as the
download named each student's upload (collection.csv's file), checked with the LMS's own reading of a name."""

import re
import zipfile

from autograder.__main__ import main
from autograder.adapters import moodle
from tests.term.test_collect import ROSTER, notebook, put, zip_folder


def pages(results, *students, lesson="01_attention"):
    """What grade writes: RESULTS/feedback/<student>/<lesson>.html."""
    return {
        s: put(results, f"feedback/{s}/{lesson}.html", f"<p>feedback for {s}</p>".encode()).read_bytes()
        for s in students
    }


def canvas_reads(name):
    """(user id, attachment id) as Canvas's re-upload reads a file's base name: its first two all-digit
    '_'-separated parts (Assignment#infer_comment_context_from_filename)."""
    return tuple([p for p in name.rsplit("/", 1)[-1].split("_") if re.fullmatch(r"\d+", p)][:2])


def test_canvas_zip_names_each_page_after_the_students_upload(tmp_path, capsys):
    dl = tmp_path / "canvas"
    put(dl, "liddellalice_101_9001_01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "liddellalice_101_9011_01_attention-1.ipynb", notebook("01_attention", 1))  # the resubmission
    put(dl, "stonebob_late_102_9002_01_attention.ipynb", notebook("01_attention", 2))
    put(dl, "danverscarol_103_9003_01_attention.ipynb", notebook("01_attention", 3))
    roster, subs, results = put(tmp_path, "roster.csv", ROSTER.encode()), tmp_path / "SUBMISSIONS", tmp_path / "R"
    assert (
        main(
            [
                "collect",
                str(zip_folder(dl, tmp_path / "submissions.zip")),
                "--out",
                str(subs),
                "--roster",
                str(roster),
                "--lesson",
                "01_attention",
            ]
        )
        == 0
    )
    html = pages(results, "alice", "bob")  # carol was not graded
    capsys.readouterr()
    assert (
        main(
            [
                "feedback-upload",
                str(results),
                "--submissions",
                str(subs),
                "--format",
                "canvas",
                "--out",
                str(tmp_path / "up"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    with zipfile.ZipFile(tmp_path / "up" / "01_attention_feedback_canvas.zip") as z:
        got = {n: z.read(n) for n in z.namelist()}
    assert got == {
        "liddellalice_101_9011_01_attention_feedback.html": html["alice"],
        "stonebob_late_102_9002_01_attention_feedback.html": html["bob"],
    }
    assert sorted(map(canvas_reads, got)) == [("101", "9011"), ("102", "9002")]  # the latest upload's id
    assert "warning: carol: no feedback page for 01_attention" in err and "alice" not in err
    # The Canvas download given as Moodle's: every file left out, so nothing is written and the line says which.
    assert (
        main(
            [
                "feedback-upload",
                str(results),
                "--submissions",
                str(subs),
                "--format",
                "moodle",
                "--out",
                str(tmp_path / "up-m"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "error: none of the 3 uploads collected was named the way Moodle names one "
        "(a Canvas download: give --format canvas): nothing written\n"
    )
    assert not (tmp_path / "up-m").exists()


def test_moodle_zip_puts_each_page_in_the_students_folder(tmp_path, capsys):
    dl = tmp_path / "moodle"
    put(dl, "Bob Stone_502_assignsubmission_file_/01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "Carol Danvers_503_assignsubmission_file_01_attention.ipynb", notebook("01_attention", 1))
    put(dl, "Dave Bowman_504_assignsubmission_file_/01_attention.ipynb", notebook("01_attention", 2))
    roster, subs, results = put(tmp_path, "roster.csv", ROSTER.encode()), tmp_path / "SUBMISSIONS", tmp_path / "R"
    assert (
        main(
            [
                "collect",
                str(zip_folder(dl, tmp_path / "moodle.zip")),
                "--out",
                str(subs),
                "--roster",
                str(roster),
                "--lesson",
                "01_attention",
            ]
        )
        == 0
    )
    html = pages(results, "bob", "carol")
    capsys.readouterr()
    assert (
        main(
            [
                "feedback-upload",
                str(results),
                "--submissions",
                str(subs),
                "--format",
                "moodle",
                "--out",
                str(tmp_path / "up"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    with zipfile.ZipFile(tmp_path / "up" / "01_attention_feedback_moodle.zip") as z:
        got = {n: z.read(n) for n in z.namelist()}
    assert got == {
        "Bob Stone_502_assignsubmission_file_/01_attention_feedback.html": html["bob"],
        "Carol Danvers_503_assignsubmission_file_01_attention_feedback.html": html["carol"],
    }
    # Moodle's import reads Full Name_<participant>_assignsubmission_file_<file>, the folder's '/' or not
    assert sorted(moodle.NAME.fullmatch(n.replace("/", ""))["pid"] for n in got) == ["502", "503"]
    assert "warning: dave: no feedback page for 01_attention" in err


def test_an_upload_the_lms_did_not_name_is_named_and_no_collection_is_one_line(tmp_path, capsys):
    subs, results = tmp_path / "SUBMISSIONS", tmp_path / "R"
    put(tmp_path, "plain/alice/01_attention/01_attention.ipynb", notebook("01_attention"))
    assert (
        main(
            [
                "feedback-upload",
                str(results),
                "--submissions",
                str(subs),
                "--format",
                "canvas",
                "--out",
                str(tmp_path / "up"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith(f"error: {subs} has no collection.csv")
    assert main(["collect", str(tmp_path / "plain"), "--out", str(subs)]) == 0
    pages(results, "alice")
    capsys.readouterr()
    # Nothing could be written: one line saying why, exit 2, never an exit 0 with no zip.
    assert (
        main(
            [
                "feedback-upload",
                str(results),
                "--submissions",
                str(subs),
                "--format",
                "canvas",
                "--out",
                str(tmp_path / "up"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "error: the upload collected is not named the way Canvas names one "
        "(collected from a plain folder?): nothing written\n"
    )
    assert not (tmp_path / "up" / "01_attention_feedback_canvas.zip").exists()
