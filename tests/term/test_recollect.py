"""One download path collected more than once: Canvas names every assignment's download submissions.zip, and a
download is collected again with another --lesson to file a notebook uploaded to the wrong assignment. Each
collect must leave the uploads an earlier one filed under another lesson in collection.csv, or feedback-upload
silently writes no zip for that lesson."""

import zipfile

from autograder.__main__ import main
from autograder.adapters.feedback_upload import feedback_upload
from tests.term.test_collect import ROSTER, log_rows, notebook, put, zip_folder
from tests.term.test_feedback_upload import pages


def canvas_zip(tmp_path, dest, lesson, uploads):
    """A Canvas download of one assignment at dest: {name prefix: the lesson its notebook holds}."""
    folder = tmp_path / f"dl_{lesson}"
    for i, (prefix, holds) in enumerate(uploads.items()):
        put(folder, f"{prefix}_{holds}.ipynb", notebook(holds, i))
    return zip_folder(folder, dest)


def collect(download, subs, roster, *args):
    assert main(["collect", str(download), "--out", str(subs), "--roster", str(roster), *args]) == 0


def collected(subs):
    return sorted((r["student"], r["lesson"]) for r in log_rows(subs) if r["action"] == "collected")


def uploaded(zips):
    return {z.name: sorted(zipfile.ZipFile(z).namelist()) for z in zips}


def test_each_assignments_download_at_the_same_path_keeps_the_others(tmp_path):
    roster, subs, results = put(tmp_path, "roster.csv", ROSTER.encode()), tmp_path / "SUBMISSIONS", tmp_path / "R"
    download = tmp_path / "Downloads" / "submissions.zip"
    download.parent.mkdir()
    lesson1 = {"liddellalice_101_9001": "01_attention", "stonebob_102_9002": "01_attention"}
    canvas_zip(tmp_path, download, "01_attention", lesson1)
    collect(download, subs, roster, "--lesson", "01_attention")
    download.unlink()  # the next assignment's download, saved under the same name
    canvas_zip(tmp_path, download, "02_heads", {"liddellalice_101_9101": "02_heads"})
    collect(download, subs, roster, "--lesson", "02_heads")

    assert collected(subs) == [("alice", "01_attention"), ("alice", "02_heads"), ("bob", "01_attention")]
    pages(results, "alice", "bob")
    pages(results, "alice", lesson="02_heads")
    zips, _ = feedback_upload(results, subs, "canvas", tmp_path / "UPLOAD")
    assert uploaded(zips) == {
        "01_attention_feedback_canvas.zip": [
            "liddellalice_101_9001_01_attention_feedback.html",
            "stonebob_102_9002_01_attention_feedback.html",
        ],
        "02_heads_feedback_canvas.zip": ["liddellalice_101_9101_02_heads_feedback.html"],
    }


def test_a_wrong_lesson_upload_collected_again_for_its_lesson_keeps_the_others(tmp_path):
    roster, subs, results = put(tmp_path, "roster.csv", ROSTER.encode()), tmp_path / "SUBMISSIONS", tmp_path / "R"
    uploads = {"liddellalice_101_9001": "01_attention", "stonebob_102_9002": "02_heads"}  # bob's is lesson 02's
    download = canvas_zip(tmp_path, tmp_path / "submissions.zip", "01_attention", uploads)
    collect(download, subs, roster, "--lesson", "01_attention")
    assert collected(subs) == [("alice", "01_attention")]
    collect(download, subs, roster, "--lesson", "02_heads")  # bob's notebook, filed as the lesson it holds

    assert collected(subs) == [("alice", "01_attention"), ("bob", "02_heads")]
    assert (subs / "bob" / "02_heads" / "02_heads.ipynb").read_bytes() == notebook("02_heads", 1)
    pages(results, "alice")
    pages(results, "bob", lesson="02_heads")
    zips, _ = feedback_upload(results, subs, "canvas", tmp_path / "UPLOAD")
    assert uploaded(zips) == {
        "01_attention_feedback_canvas.zip": ["liddellalice_101_9001_01_attention_feedback.html"],
        "02_heads_feedback_canvas.zip": ["stonebob_102_9002_02_heads_feedback.html"],
    }


def test_a_new_download_of_the_same_assignment_still_replaces_its_rows(tmp_path):
    """The resubmission case: a later download of the same lesson at the same path is the whole assignment now."""
    roster, subs = put(tmp_path, "roster.csv", ROSTER.encode()), tmp_path / "SUBMISSIONS"
    download = tmp_path / "submissions.zip"
    canvas_zip(tmp_path, download, "01_attention", {"liddellalice_101_9001": "01_attention"})
    collect(download, subs, roster, "--lesson", "01_attention")
    download.unlink()
    canvas_zip(tmp_path, download, "01_attention_again", {"liddellalice_101_9011": "01_attention"})
    collect(download, subs, roster, "--lesson", "01_attention")

    assert [(r["file"], r["action"]) for r in log_rows(subs)] == [
        ("submissions.zip/liddellalice_101_9011_01_attention.ipynb", "collected")
    ]
