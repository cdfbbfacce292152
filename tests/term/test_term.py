"""A term with the real grader: lessons graded one after another into one RESULTS, hostile files
beside honest students, fingerprints that make --resume regrade what changed, a class manifest
and shards that merge only when whole, and SIGTERM in the middle of a run."""

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest

from autograder import grade as grader
from autograder import notebook as nbk
from autograder import results as store
from autograder.__main__ import main
from autograder.config import RunConfig
from autograder.release import release
from autograder.worker import choose_mode
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
L1, L2 = "01_attention", "02_heads"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n"
HONEST = {"alice": "solved", "=bob": "blank", "carol": "wrong", "dave": "renamed", "erin": "solved", "frank": "wrong"}


def run(*args, check=True, env=None):
    p = subprocess.run(
        [sys.executable, "-m", "autograder", *map(str, args)], capture_output=True, text=True, timeout=600, env=env
    )
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture
def cli(capsys):
    """The command line in this process (no interpreter and torch to start): (exit status, stderr)."""

    def call(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        call.out = captured.out  # the last command's stdout (grade's summary), for the test that reads it
        return code, captured.err

    return call


def put(subs, student, nb, lesson=L1, name=None):
    nbk.write(nb, subs / student / lesson / (name or f"{lesson}.ipynb"))
    return subs / student / lesson / (name or f"{lesson}.ipynb")


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """An honest class of lesson 01 (a solved, blank, wrong and renamed notebook), graded once clean."""
    root = tmp_path_factory.mktemp("term")
    release(root / "release", [L1, L2])
    rel = nbk.read(root / "release" / L1 / f"{L1}.ipynb")
    notebooks = {"solved": fill(rel, L1), "blank": rel, "wrong": fill(rel, L1, {"softmax": WRONG_SOFTMAX})}
    notebooks["renamed"] = notebooks["solved"]
    for student, kind in HONEST.items():
        put(root / "subs", student, notebooks[kind], name="01_attention (1).ipynb" if kind == "renamed" else None)
    clean = run("grade", root / "subs", "--out", root / "clean", "--jobs", "2", "--quiet")
    return root, notebooks, clean


def test_lessons_graded_one_after_another_build_one_term(term, tmp_path, cli):
    root, notebooks, clean = term
    grades = store.read_grades(root / "clean" / "grades.csv")
    assert {r["lesson"] for r in grades} == {L1}  # lesson 02, which nobody submitted, is not written as zeros
    text = (root / "clean" / "grades.csv").read_text()
    assert "\n'=bob," in text and "\n=bob" not in text  # the CSV cannot run a formula; the id stays "=bob"
    assert (root / "clean" / "feedback" / "=bob" / f"{L1}.html").exists()
    assert "1 x renamed notebook: dave/01_attention" in clean.stderr
    assert sorted(r["student"] for r in store.read_csv(root / "clean" / "totals.csv")) == sorted(HONEST)
    points = {s: sum(float(r["points"]) for r in grades if r["student"] == s) for s in HONEST}
    assert points["alice"] == points["dave"] == points["erin"] == 6 and points["=bob"] == 0
    assert 4 <= points["carol"] == points["frank"] < 6  # softmax without the max shift (partial credit)

    subs = tmp_path / "subs"
    shutil.copytree(root / "subs", subs, symlinks=True)
    out = tmp_path / "results"
    shutil.copytree(root / "clean", out)
    put(subs, "alice", fill(nbk.read(root / "release" / L2 / f"{L2}.ipynb"), L2), lesson=L2)
    code, err = cli("grade", subs, "--out", out, "--lesson", L2, "--quiet")
    assert code == 0, err
    after = store.read_grades(out / "grades.csv")
    assert [r for r in after if r["lesson"] == L1] == grades  # lesson 01 kept as it was
    l2 = {r["student"]: r for r in after if r["lesson"] == L2 and r["test"] == "test_split_heads"}
    assert l2["alice"]["status"] == "passed" and l2["erin"]["status"] == "missing"
    assert "5 x never handed in" in err


def test_hostile_files_are_refused_one_by_one_beside_honest_students(term, tmp_path, cli):
    root, notebooks, _ = term
    subs = tmp_path / "subs"
    honest = put(subs, "alice", notebooks["solved"])
    put(tmp_path / "elsewhere", "x", notebooks["solved"])
    (subs / "symlink" / L1).mkdir(parents=True)
    (subs / "symlink" / L1 / f"{L1}.ipynb").symlink_to(honest)
    (subs / "hardlink" / L1).mkdir(parents=True)
    os.link(tmp_path / "elsewhere" / "x" / L1 / f"{L1}.ipynb", subs / "hardlink" / L1 / f"{L1}.ipynb")
    (subs / "fifo" / L1).mkdir(parents=True)
    os.mkfifo(subs / "fifo" / L1 / f"{L1}.ipynb")
    (subs / "linked-folder").symlink_to(subs / "alice")
    (subs / "linked-lesson").mkdir()
    (subs / "linked-lesson" / L1).symlink_to(subs / "alice" / L1)
    broken = json.loads(json.dumps(notebooks["solved"]))
    next(c for c in broken["cells"] if c["cell_type"] == "code")["source"] = ["import numpy as np\n", 7]
    put(subs, "int-in-source", broken)
    (subs / "__MACOSX" / "alice").mkdir(parents=True)
    code, err = cli("grade", subs, "--out", tmp_path / "results", "--quiet")
    assert code == 0, err
    rows = store.read_grades(tmp_path / "results" / "grades.csv")
    by_student = {r["student"]: r for r in rows if r["test"] == "test_softmax"}
    assert by_student.pop("alice")["status"] == "passed" and "__MACOSX" not in by_student
    for student, words in (
        ("symlink", "symbolic link"),
        ("hardlink", "hard link"),
        ("fifo", "not a regular file"),
        ("linked-folder", "student folder is a symbolic link"),
        ("linked-lesson", "lesson folder is a symbolic link"),
        ("int-in-source", "source"),
    ):
        assert by_student[student]["status"] == "error" and words in by_student[student]["message"], by_student[student]
        assert "refused" in by_student[student]["message"] or student == "int-in-source"
    assert "5 x refused file or folder" in err and "1 x unreadable notebook" in err
    assert "ignored system folder: __MACOSX" in err


def test_resume_regrades_exactly_what_changed(term, tmp_path, monkeypatch):
    """In-process, with the fingerprinted sources copied, so that a check can change between runs."""
    root, notebooks, _ = term
    subs = tmp_path / "subs"
    for student in ("alice", "carol"):  # carol's wrong softmax will be corrected
        shutil.copytree(root / "subs" / student, subs / student)
    code = tmp_path / "code"
    for package in ("autograder", "solutions"):
        shutil.copytree(grader.ROOT / package, code / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setattr(grader, "ROOT", code)
    mode, out = choose_mode("auto"), tmp_path / "results"

    def again(**kw):
        return grader.grade(RunConfig(out, subs, lessons=(L1,), resume=True, mode=mode, progress=False, **kw))

    assert again()["reasons"] == {"not graded before": 2}
    first = (out / "grades.csv").read_text()
    assert (again()["graded"], again()["reused"]) == (0, 2)
    with open(code / "autograder" / "lessons" / "attention" / "checks.py", "a") as f:
        f.write("\n# a check fixed between two runs\n")
    put(subs, "carol", notebooks["solved"])
    changed = again()
    assert changed["reasons"] == {"checks, tests or grader changed": 1, "submission changed": 1}
    assert again(force=True, students=("alice",))["reasons"] == {"forced (--force)": 1}
    assert (out / "grades.csv").read_text() != first  # carol's new notebook scores 6
    assert {
        r["student"]: r["points"] for r in store.read_grades(out / "grades.csv") if r["test"] == "test_softmax"
    } == {"alice": "2", "carol": "2"}


@pytest.fixture(scope="module")
def sharded(term, tmp_path_factory):
    """The class's manifest and its two shards, graded once: (manifest, [shard 0, shard 1]). A test that changes a
    shard works on a copy."""
    root, _, _ = term
    folder = tmp_path_factory.mktemp("sharded")
    manifest, shards = folder / "class.json", [folder / f"shard{i}" for i in range(2)]
    assert main(["manifest", str(root / "subs"), "--out", str(manifest)]) == 0
    for i, out in enumerate(shards):
        args = ["grade", root / "subs", "--out", out, "--shard", f"{i}/2", "--manifest", manifest, "--quiet"]
        assert main([str(a) for a in args]) == 0
    return manifest, shards


def test_shards_merge_only_when_the_set_is_whole(term, sharded, tmp_path, cli):
    root, _, _ = term
    manifest, shards = sharded
    assert json.loads(manifest.read_text())["students"] == sorted(HONEST)
    code, err = cli("merge", shards[0], "--out", tmp_path / "partial", "--manifest", manifest)
    assert code == 2 and "missing shard 1/2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "partial" / "grades.csv").exists()
    assert cli("merge", shards[0], "--out", tmp_path / "partial", "--manifest", manifest, "--allow-partial")[0] == 0
    gaps = [r for r in store.read_grades(tmp_path / "partial" / "grades.csv") if "was not merged" in r["message"]]
    assert {r["student"] for r in gaps} == set(sorted(HONEST)[1::2]) and {r["status"] for r in gaps} == {"error"}
    code, err = cli("merge", *shards, "--out", tmp_path / "merged", "--manifest", manifest)
    assert code == 0, err
    assert (tmp_path / "merged" / "grades.csv").read_text() == (root / "clean" / "grades.csv").read_text()


def _inflate(path):
    """The attack on a stored result: its grader field removed, one test set to 1000/1000."""
    r = json.loads(path.read_text())
    r.pop("grader")
    r["tests"][0].update(points=1000.0, max_points=1000.0, status="passed")
    path.write_text(json.dumps(r))


def test_a_result_edited_after_grading_is_refused_by_merge_and_regraded_by_resume(term, sharded, tmp_path, cli):
    root, _, _ = term
    manifest, graded = sharded
    shards = [tmp_path / shard.name for shard in graded]
    for shard, copy in zip(graded, shards):
        shutil.copytree(shard, copy)  # a whole folder, copied with its index: still valid
    victim = store.result_path(shards[0], "carol", L1)  # shard 0 holds =bob, carol and erin
    _inflate(victim)
    code, err = cli("merge", *shards, "--out", tmp_path / "merged", "--manifest", manifest)
    assert code == 2 and f"{victim}: refused: its verdict was changed after grading" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "merged" / "grades.csv").exists()
    code, err = cli(
        "grade", root / "subs", "--out", shards[0], "--shard", "0/2", "--manifest", manifest, "--resume", "--quiet"
    )
    assert code == 0 and "stored result damaged or refused, graded again" in err, err
    assert cli("merge", *shards, "--out", tmp_path / "merged", "--manifest", manifest)[0] == 0
    assert (tmp_path / "merged" / "grades.csv").read_text() == (root / "clean" / "grades.csv").read_text()
    _inflate(store.result_path(tmp_path / "merged", "carol", L1))  # and in the merged folder itself
    code, err = cli("grade", root / "subs", "--out", tmp_path / "merged", "--manifest", manifest, "--resume", "--quiet")
    assert code == 0 and "refused" in err, err
    assert (tmp_path / "merged" / "grades.csv").read_text() == (root / "clean" / "grades.csv").read_text()


def test_an_older_result_put_back_is_refused_by_export_and_report_and_regraded_by_resume(term, tmp_path, cli):
    """carol's first grade (4 points of 6) is put back after she resubmitted and was regraded (6/6): signed,
    but not the result the folder recorded last. export and report name her and exit 1; grade --resume
    regrades her as a refused result (not as a changed submission), and its line does not tell it to regrade."""
    root, notebooks, _ = term
    subs, out = tmp_path / "subs", tmp_path / "results"
    shutil.copytree(root / "subs", subs, symlinks=True)
    shutil.copytree(root / "clean", out)  # a whole folder, copied with its index: still valid
    older = store.result_path(out, "carol", L1).read_bytes()
    put(subs, "carol", notebooks["solved"])
    assert cli("grade", subs, "--out", out, "--resume", "--quiet")[0] == 0
    regraded = (out / "grades.csv").read_text()
    store.result_path(out, "carol", L1).write_bytes(older)
    code, err = cli("export", out, "--format", "csv", "--out", tmp_path / "scores.csv")
    refused = (
        "stored result refused, left blank (regrade it: grade --resume): it is not the result this folder recorded last"
    )
    assert code == 1 and refused in err and "(1): carol 01_attention" in err, err
    assert "refused" in next(r for r in store.read_csv(tmp_path / "scores.csv") if r["student"] == "carol")["regrade"]
    code, err = cli("report", out)
    assert code == 1 and refused in err and refused in (out / "report.html").read_text()
    code, err = cli("grade", subs, "--out", out, "--resume", "--quiet")
    assert code == 0 and "(1 stored result damaged or refused)" in err and "submission changed" not in err, err
    line = next(line for line in err.splitlines() if "graded again" in line)
    assert "carol.json" in line and "regrade it" not in line, line
    assert (out / "grades.csv").read_text() == regraded


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_cleanly_and_resume_finishes_the_same(term, tmp_path, signum):
    root, _, _ = term
    tmp, out = tmp_path / "tmp", tmp_path / "results"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen(
        [sys.executable, "-m", "autograder", "grade", str(root / "subs"), "--out", str(out), "--jobs", "1", "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while not list((out / store.STORE).glob(f"{L1}/*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert f"interrupted by {signum.name}" in err.strip().splitlines()[-1]
    kept = len(list((out / store.STORE).glob(f"{L1}/*.json")))
    assert 1 <= kept < len(HONEST)
    assert list(tmp.iterdir()) == [], "temporary folders were left behind"
    alive = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
    assert alive == [], "sandbox processes outlived the run"
    if signum == signal.SIGINT:
        return  # the same stop as SIGTERM's; resuming it once is enough
    p = run("grade", root / "subs", "--out", out, "--resume", "--quiet", env=env)
    assert f"({len(HONEST) - kept} not graded before)" in p.stderr
    assert (out / "grades.csv").read_text() == (root / "clean" / "grades.csv").read_text()


def test_a_classmates_name_inside_an_upload_takes_nothing_from_the_classmate(term, tmp_path, cli):
    """Alice's Canvas upload holds a zip with a blank notebook named as bob's Canvas resubmission 9. Collected
    with the roster and graded, bob keeps his 6/6: the blank notebook is alice's, and the conflict is reported."""
    root, notebooks, _ = term
    dl, subs, out = tmp_path / "canvas", tmp_path / "subs", tmp_path / "results"
    nbk.write(notebooks["blank"], tmp_path / "blank.ipynb")
    inner, upload = io.BytesIO(), io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("stonebob_102_9002_01_attention-9.ipynb", (tmp_path / "blank.ipynb").read_bytes())
    with zipfile.ZipFile(upload, "w") as z:
        z.writestr("work.zip", inner.getvalue())
    dl.mkdir()
    (dl / "liddellalice_101_9001_work.zip").write_bytes(upload.getvalue())
    nbk.write(notebooks["solved"], dl / "stonebob_102_9002_01_attention.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text('student,name,lms_id\nalice,"Liddell, Alice",101\nbob,Bob Stone,102\n')
    code, err = cli("collect", dl, "--out", subs, "--roster", roster)
    assert code == 0, err
    code, err = cli("grade", subs, "--out", out, "--quiet")
    assert code == 0, err
    grades = store.read_grades(out / "grades.csv")
    points = {s: sum(float(r["points"]) for r in grades if r["student"] == s) for s in ("alice", "bob")}
    assert points == {"alice": 0, "bob": 6}
    flagged = [r for r in store.read_csv(subs / "collection.csv") if "names another student" in r["anomaly"]]
    assert [r["student"] for r in flagged] == ["alice"]


def number(text):
    """A CSV cell as a number, or its text (e.g. 'needs grading', or '' for a blank)."""
    try:
        return float(text)
    except ValueError:
        return text


def written(nb, text):
    """nb with its written questions answered (text in each markdown answer cell graded by hand)."""
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if nbk.is_written(cell):
            nbk.set_source(cell, text)
    return nb


def test_a_term_adds_up_for_every_roster_student(term, tmp_path, cli):
    """A term of three lessons for a roster of three (section A: alice, bob; B: carol), bob never handing in:
    lesson 01 collected from a Canvas download with times, 02 from a Moodle download, 03 (with a written question)
    from nbgrader's exchange; graded with --written into nbgrader's gradebook. Until a TA grades the written
    question, lesson 03 is 'needs grading' in totals.csv and blank in the Canvas export; then the TA's scores
    (carol's softmax, both written answers) come from the gradebook into the feedback pages, totals.csv and the
    exports. carol resubmits lesson 01 a day past her extension: regraded, her manual score is stale, dropped,
    and the late penalty taken. The Canvas and Moodle feedback zips, and the report, name every roster student."""
    from autograder.adapters.gradebook import _open

    L3 = "03_multi_head"
    root, notebooks, _ = term
    subs, out, db = tmp_path / "subs", tmp_path / "results", tmp_path / "course/gradebook.db"
    release(root / "release", [L3])
    solved = {lsn: fill(nbk.read(root / "release" / lsn / f"{lsn}.ipynb"), lsn) for lsn in (L2, L3)}
    blank2 = nbk.read(root / "release" / L2 / f"{L2}.ipynb")
    (tmp_path / "roster.csv").write_text(
        'student,name,email,lms_id,section\nalice,"Liddell, Alice",a@x.org,101,A\n'
        "bob,Bob Stone,b@x.org,102,A\ncarol,Carol Danvers,c@x.org,103,B\n"
    )
    roster = ["--roster", tmp_path / "roster.csv"]

    def collect(download, *more):
        code, err = cli("collect", download, "--out", subs, *roster, *more)
        assert code == 0, err

    canvas, moodle, exchange = tmp_path / "canvas", tmp_path / "moodle", tmp_path / "exchange"
    nbk.write(notebooks["solved"], canvas / "liddellalice_101_9001_01_attention.ipynb")
    nbk.write(notebooks["wrong"], canvas / "danverscarol_103_9003_01_attention.ipynb")
    (tmp_path / "times.csv").write_text(
        "student,lesson,submitted_at\nalice,01_attention,2026-10-01T22:00:00+00:00\n"
        "carol,01_attention,2026-10-02T10:00:00+00:00\n"
    )  # within her extension
    collect(canvas, "--times", tmp_path / "times.csv")
    nbk.write(solved[L2], moodle / "Alice Liddell_501_assignsubmission_file_" / f"{L2}.ipynb")
    nbk.write(blank2, moodle / "Carol Danvers_503_assignsubmission_file_" / f"{L2}.ipynb")
    collect(moodle)
    for student, answer in (
        ("alice", "Same 4D^2 weights and T^2 D FLOPs; 8 heads give 8 attention patterns."),
        ("carol", "More heads, more parameters."),
    ):
        entry = exchange / "course" / "inbound" / f"{student}+{L3}+2026-10-08 10:00:00.000000 UTC+r1"
        nbk.write(written(solved[L3], answer), entry / f"{L3}.ipynb")
        (entry / "timestamp.txt").write_text("2026-10-08 10:00:00.000000 UTC")
    collect(exchange)
    db.parent.mkdir()
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--written", "--quiet")
    assert code == 0, err
    summary = cli.out
    auto = {(r["student"], r["lesson"], r["test"]): float(r["points"]) for r in store.read_grades(out / "grades.csv")}
    points = {
        (s, lsn): sum(p for (s2, l2, _), p in auto.items() if (s2, l2) == (s, lsn))
        for s in ("alice", "carol")
        for lsn in (L1, L2, L3)
    }
    carol_auto = points["carol", L1]
    assert (
        points
        == {
            ("alice", L1): 6,
            ("alice", L2): 8,
            ("alice", L3): 8,
            ("carol", L1): carol_auto,
            ("carol", L2): 0,
            ("carol", L3): 8,
        }
        and 4 <= carol_auto < 6
        and auto["carol", L1, "test_softmax"] < 2
    )
    # grade's last line sums totals.csv: alice 14 of 14 and carol's of 14 (lesson 03 to grade), bob 0 of 24.
    assert (
        f"holds 6 results (2 students; 3 in totals.csv with the roster), {14 + round(carol_auto, 2):g}/52 points "
        "in totals.csv (2 lesson scores left out" in summary
    )
    # Not graded by a person yet: 'needs grading', out of the total, never a 0; blank and flagged in the export.
    totals = {r["student"]: r for r in store.read_csv(out / "totals.csv")}
    assert {s: tuple(number(r[c]) for c in (L1, L2, L3, "total", "max_points")) for s, r in totals.items()} == {
        "alice": (6, 8, "needs grading", 14, 14),
        "bob": (0, 0, 0, 0, 24),
        "carol": (carol_auto, 0, "needs grading", carol_auto, 14),
    }
    assert f"{L3}: needs grading: written_heads" in totals["alice"]["flags"]
    page = (out / "feedback" / "alice" / f"{L3}.html").read_text()
    assert "<b>8 / 10</b>" in page and "needs grading" in page and "Written questions not graded yet" in page
    assert "Rubric" not in page and "Model answer" not in page
    code, err = cli(
        "export", out, "--format", "canvas", "--out", tmp_path / "before.csv", *roster, "--written", "--gradebook", db
    )
    assert code == 0, err
    assert (
        "left blank, written questions to grade in formgrader first: written_heads (2): alice 03_multi_head; "
        "carol 03_multi_head" in err
    )
    with open(tmp_path / "before.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["ID"]: tuple(number(r[c]) for c in (L1, L2, L3)) for r in rows[1:]} == {
        "101": (6, 8, ""),
        "102": (0, 0, 0),
        "103": (carol_auto, 0, ""),
    }
    assert tuple(number(rows[0][c]) for c in (L1, L2, L3)) == (6, 8, 10)

    with _open(db) as gb:  # the TAs' reviews, as formgrader saves them (which clears needs_manual_grade)
        assert gb.find_grade("written_heads", L3, L3, "alice").needs_manual_grade
        for student, test, lesson, score in (
            ("carol", "test_softmax", L1, 1.5),
            ("alice", "written_heads", L3, 2.0),
            ("carol", "written_heads", L3, 1.0),
        ):
            g = gb.find_grade(test, lesson, lesson, student)
            g.manual_score, g.needs_manual_grade = score, False
        gb.db.commit()
    # carol resubmits lesson 01, correct now, a day past her extension (a second Canvas download), and is regraded.
    again = tmp_path / "canvas2"
    nbk.write(notebooks["solved"], again / "danverscarol_103_9013_01_attention.ipynb")
    (tmp_path / "times2.csv").write_text("student,lesson,submitted_at\ncarol,01_attention,2026-10-03T01:00:00+00:00\n")
    collect(again, "--times", tmp_path / "times2.csv")
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--written", "--resume")
    assert code == 0, err
    assert "graded 1 submission(s)" in err and "1 submission changed" in err and "reused 5 unchanged" in err
    with _open(db) as gb:
        assert gb.find_grade("test_softmax", L1, L1, "carol").needs_manual_grade  # stale: formgrader lists it again
        assert not gb.find_grade("written_heads", L3, L3, "alice").needs_manual_grade
    pages = {
        (s, lsn): (out / "feedback" / s / f"{lsn}.html").read_text() for s in ("alice", "carol") for lsn in (L1, L2, L3)
    }
    assert "<b>10 / 10</b>" in pages["alice", L3] and "scored by hand: 2" in pages["alice", L3]
    assert "<b>9 / 10</b>" in pages["carol", L3] and "scored by hand: 1" in pages["carol", L3]
    assert "<b>5.5 / 6</b>" in pages["carol", L1] and "scored by hand: 1.5 (the grader gave 2)" in pages["carol", L1]
    assert "<b>6 / 6</b>" in pages["alice", L1] and "<b>0 / 8</b>" in pages["carol", L2]
    assert "scored by hand" not in pages["alice", L1] + pages["alice", L2] + pages["carol", L2]

    common = [out, *roster, "--submissions", subs, "--gradebook", db]
    (tmp_path / "extensions.csv").write_text("student,lesson,deadline\ncarol,01_attention,2026-10-02T23:59:00+00:00\n")
    code, err = cli(
        "rule",
        *common,
        "--extensions",
        tmp_path / "extensions.csv",
        "--deadline",
        "01_attention=2026-10-01T23:59:00+00:00",
        "--late-policy",
        "10%/day",
        "--stale-overrides",
        "drop",
    )
    assert code == 0, err
    code, err = cli("export", "--format", "canvas", "--out", tmp_path / "canvas.csv", *common)
    assert code == 0, err
    assert "never handed in, counted as 0 (3): bob 01_attention, 02_heads, 03_multi_head" in err
    assert "stale manual scores" in err and "dropped: the new result counts: carol 01_attention test_softmax" in err
    with open(tmp_path / "canvas.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["ID"] for r in rows[1:]] == ["102", "103", "101"]  # by name: Bob Stone, Carol Danvers, "Liddell, Alice"
    assert {r["ID"]: tuple(number(r[c]) for c in (L1, L2, L3)) for r in rows[1:]} == {
        "101": (6, 8, 10),
        "102": (0, 0, 0),
        "103": (5.4, 0, 9),
    }  # carol: 6 less 10%, 1 started day past her extension
    totals = {r["student"]: (float(r["total"]), float(r["max_points"])) for r in store.read_csv(out / "totals.csv")}
    assert totals == {"alice": (24, 24), "bob": (0, 24), "carol": (14.4, 24)}  # the export's: 5.4 + 0 + 9
    assert [r["flags"] for r in store.read_csv(out / "totals.csv") if r["student"] == "carol"] == [
        f"{L1}: stale override dropped: test_softmax; late 1 day: -10%; {L3}: manual: written_heads"
    ]
    late = (
        "Handed in 1 day after your deadline (2026-10-02T23:59:00+00:00): 10% off the points earned, so 5.4 of 6 count."
    )
    assert late in (out / "feedback" / "carol" / f"{L1}.html").read_text()  # her page, as the export counts
    assert [
        (r["student"], r["lesson"], r["late_units"], r["raw"], r["penalised"])
        for r in store.read_csv(out / "late-penalties.csv")
    ] == [("alice", L1, "0", "6", "6"), ("carol", L1, "1", "6", "5.4")]
    code, err = cli("rule", *common, "--stale-overrides", "keep")  # stale kept: 1.5 wins
    assert code == 0 and "changed: stale manual scores kept (before: stale manual scores dropped)" in cli.out, err
    code, err = cli("export", "--format", "csv", "--out", tmp_path / "plain.csv", *common)
    assert code == 0, err
    plain = {r["student"]: r for r in store.read_csv(tmp_path / "plain.csv")}
    assert {
        s: tuple(number(r[c]) for c in (f"{L1} raw", L1, L2, L3, "total", "max_points")) for s, r in plain.items()
    } == {"alice": (6, 6, 8, 10, 24, 24), "bob": (0, 0, 0, 0, 0, 24), "carol": (5.5, 4.95, 0, 9, 13.95, 24)}
    assert (
        "manual: test_softmax" in plain["carol"]["flags"]
        and "stale override kept: test_softmax" in plain["carol"]["flags"]
    )
    assert "manual: written_heads" in plain["alice"]["flags"] and "never handed in" in plain["bob"]["flags"]
    # Without --gradebook, export (as report) counts the gradebook RESULTS was graded with: the same numbers.
    code, err = cli(
        "export",
        "--format",
        "csv",
        "--out",
        tmp_path / "again.csv",
        *(a for a in common if a not in (db, "--gradebook")),
    )
    assert code == 0, err
    assert store.read_csv(tmp_path / "again.csv") == store.read_csv(tmp_path / "plain.csv")
    totals = {r["student"]: r for r in store.read_csv(out / "totals.csv")}  # the same scores as the last export
    assert {s: tuple(number(r[c]) for c in (L1, L2, L3, "total")) for s, r in totals.items()} == {
        s: tuple(number(r[c]) for c in (L1, L2, L3, "total")) for s, r in plain.items()
    }

    code, err = cli("feedback-upload", out, "--submissions", subs, "--format", "canvas", "--out", tmp_path / "zips")
    assert code == 0, err
    assert f"{L1}: never handed in, so no upload to attach feedback to: bob" in err
    assert f"{L2}, {L3}: collected from no Canvas download, so no zip" in err and "did not name" not in err
    with zipfile.ZipFile(tmp_path / "zips" / f"{L1}_feedback_canvas.zip") as z:
        assert sorted(z.namelist()) == [
            f"danverscarol_103_9013_{L1}_feedback.html",
            f"liddellalice_101_9001_{L1}_feedback.html",
        ]
        page = z.read(f"danverscarol_103_9013_{L1}_feedback.html").decode()
    assert page == (out / "feedback" / "carol" / f"{L1}.html").read_text() and "<b>5.5 / 6</b>" in page
    assert "10% off the points earned, so 4.95 of 5.5 count." in page  # the last export's: her stale 1.5 kept
    code, err = cli(
        "feedback-upload", out, "--submissions", subs, "--format", "moodle", "--out", tmp_path / "zips", "--lesson", L2
    )
    assert code == 0, err
    with zipfile.ZipFile(tmp_path / "zips" / f"{L2}_feedback_moodle.zip") as z:
        assert sorted(z.namelist()) == [
            f"Alice Liddell_501_assignsubmission_file_/{L2}_feedback.html",
            f"Carol Danvers_503_assignsubmission_file_/{L2}_feedback.html",
        ]
    assert f"{L2}: never handed in, so no upload to attach feedback to: bob" in err

    code, err = cli("report", out, "--submissions", subs, *roster)  # the gradebook RESULTS was graded with
    assert code == 0, err
    report = (out / "report.html").read_text()
    assert report.count("Never handed in: 1 student: bob") == 3
    assert "Written question written_heads: 2/2 graded" in report
    assert (
        "Scored by hand in the gradebook: 3 tests (alice written_heads, carol test_softmax, carol written_heads)"
        not in report
    )  # per lesson: 01's carol test_softmax, 03's two written answers
    assert "Scored by hand in the gradebook: 1 test (carol test_softmax)" in report
    assert (
        "Stale manual scores (the autograded result or the written answer changed since): carol test_softmax" in report
    )
    sections = report[report.index("id='sections'") : report.index("id='identical'")]
    # As the last export counts: alice 6/6 and bob, who never handed it in, 0 (he was left out before); carol
    # 4.95/6 = 82.5% (her stale 1.5 kept, 10% off for a day late); lesson 03 with the TAs' written scores.
    assert "<td>A</td><td>01_attention</td><td class='n'>2</td><td class='n'>50%</td><td class='n'>1/2</td>" in sections
    assert "<td>B</td><td>01_attention</td><td class='n'>1</td><td class='n'>82%</td>" in sections
    assert "<td>B</td><td>02_heads</td><td class='n'>1</td><td class='n'>0%</td>" in sections
    assert "<td>B</td><td>03_multi_head</td><td class='n'>1</td><td class='n'>90%</td>" in sections
    # Each lesson's mean is totals.csv's: 01 (6 + 0 + 4.95) / 18, 02 8 / 24, 03 (10 + 0 + 9) / 30.
    assert [report.count(f"Mean score: {m}% of 3 students") for m in (61, 33, 63)] == [1, 1, 1]
    assert "late penalties: 10%/day after 01_attention 2026-10-01T23:59:00+00:00, 1 extension(s)" in report
    # An export given no roster, nor the SUBMISSIONS that keeps one, still has the class RESULTS was counted for.
    code, err = cli("export", out, "--format", "csv", "--out", tmp_path / "bare.csv", "--gradebook", db, "--written")
    assert code == 0 and "trial" not in err, err  # --written is RESULTS's rule already: no trial
    assert [(r["student"], r["total"], r["max_points"]) for r in store.read_csv(tmp_path / "bare.csv")] == [
        ("alice", "24", "24"),
        ("bob", "0", "24"),
        ("carol", "13.95", "24"),
    ]  # RESULTS's rule: 4.95 + 0 + 9


def test_a_notebook_of_another_lesson_says_which_lesson_it_looks_like(tmp_path, cli):
    """A lesson 03 notebook handed in as lesson 01 (Gradescope's lesson 01 assignment stages it so): its tests fail
    on names it never defines, and the page and the run name lesson 03, not only the NameErrors."""
    L3 = "03_multi_head"
    release(tmp_path / "release", [L3])
    put(tmp_path / "subs", "alice", fill(nbk.read(tmp_path / "release" / L3 / f"{L3}.ipynb"), L3), name="work.ipynb")
    code, err = cli("grade", tmp_path / "subs", "--out", tmp_path / "results", "--lesson", L1, "--quiet")
    assert code == 0, err
    assert "1 x notebook of another lesson: alice/01_attention" in err
    page = (tmp_path / "results" / "feedback" / "alice" / f"{L1}.html").read_text()
    assert f"this notebook looks like {L3} (its answer cells are {L3}&#x27;s), not {L1}" in page


def test_a_term_of_eight_agrees_with_one_table_in_every_artifact_through_the_slips(term, tmp_path, cli):
    """A roster of 8 over lessons 01-03, collected per lesson from plain downloads with times, graded with the
    written question, scored by TAs in the gradebook, with late work, an extension and a grace period. On the way,
    each slip an instructor made once exited 0 with a wrong number; now each stops (or stays a trial) and the
    numbers hold. totals.csv, both Canvas files (the new import and a filled Canvas export), the feedback pages and
    report.html are checked against one table.
    ada all solved; bo skips 02; cy, on the roster, hands in nothing; di's softmax is wrong; ed is a day past his
    extension on 01 and leaves 03 blank; fay is 11 minutes late on 01 (grace 15m); gus uploads his 03 notebook to
    01 and nothing for 03; hal's 01 is named lesson1_final.ipynb."""
    from autograder.adapters.gradebook import _open

    L3 = "03_multi_head"
    root, notebooks, _ = term
    release(root / "release", [L3])
    rel = {lsn: nbk.read(root / "release" / lsn / f"{lsn}.ipynb") for lsn in (L1, L2, L3)}
    solved = {
        L1: notebooks["solved"],
        L2: fill(rel[L2], L2),
        L3: written(fill(rel[L3], L3), "Same weights; 8 patterns."),
    }
    ids = dict(zip(["ada", "bo", "cy", "di", "ed", "fay", "gus", "hal"], range(201, 209)))
    (tmp_path / "roster.csv").write_text(
        "student,name,email,lms_id\n" + "".join(f"{s},{s.title()} Doe,{s}@x.org,{i}\n" for s, i in ids.items())
    )
    roster, subs, out, db = (
        ["--roster", tmp_path / "roster.csv"],
        tmp_path / "subs",
        tmp_path / "results",
        tmp_path / "course/gradebook.db",
    )
    uploads = {
        L1: {
            "ada": solved[L1],
            "bo": solved[L1],
            "di": notebooks["wrong"],
            "ed": solved[L1],
            "fay": solved[L1],
            "gus": solved[L3],
            "hal": solved[L1],
        },
        L2: {s: solved[L2] for s in ("ada", "di", "ed", "fay", "gus", "hal")},
        L3: dict({s: solved[L3] for s in ("ada", "bo", "di", "fay", "hal")}, ed=rel[L3]),
    }
    names = {("hal", L1): "lesson1_final.ipynb", ("gus", L1): f"{L1}.ipynb"}
    times = {"ed": "2026-10-04T12:00:00Z", "fay": "2026-10-02T00:10:00Z"}
    (tmp_path / "times.csv").write_text(
        "lms_id,lesson,submitted_at\n"
        + "".join(f"{ids[s]},{L1},{times.get(s, '2026-10-01T20:00:00Z')}\n" for s in uploads[L1] if s != "gus")
    )
    for lesson, who in uploads.items():
        for student, nb in who.items():
            nbk.write(nb, tmp_path / f"dl-{lesson}" / student / names.get((student, lesson), f"{lesson}.ipynb"))
        code, err = cli(
            "collect",
            tmp_path / f"dl-{lesson}",
            "--out",
            subs,
            *roster,
            "--lesson",
            lesson,
            *(["--times", tmp_path / "times.csv"] if lesson == L1 else []),
        )
        assert code == 0, err
    log = {r["file"]: r for r in store.read_csv(subs / "collection.csv")}
    assert "a 03_multi_head notebook in a download collected for 01_attention" in log[f"gus/{L1}.ipynb"]["detail"]
    assert "named 'lesson1_final.ipynb', not 01_attention.ipynb" in log["hal/lesson1_final.ipynb"]["detail"]
    db.parent.mkdir()
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--written", "--quiet", *roster)
    assert code == 0, err
    with _open(db) as gb:  # the TAs score the written answers in formgrader
        for student, score in (("ada", 2.0), ("bo", 1.0), ("di", 2.0), ("fay", 1.5), ("hal", 2.0)):
            g = gb.find_grade("written_heads", L3, L3, student)
            g.manual_score, g.needs_manual_grade = score, False
        gb.db.commit()
    # The slips: an extension for a name nobody has stops the rule; then the right one is set.
    rule = [
        "rule",
        out,
        *roster,
        "--submissions",
        subs,
        "--deadline",
        f"{L1}=2026-10-01T23:59:00+00:00",
        "--late-policy",
        "10%/day",
        "--grace",
        "15m",
        "--extensions",
        tmp_path / "ext.csv",
    ]
    (tmp_path / "ext.csv").write_text(f"student,lesson,deadline\nedd,{L1},2026-10-03T23:59:00+00:00\n")
    code, err = cli(*rule)
    assert code == 2 and "no student 'edd' in the roster or the results" in err and err.count("\n") == 1, err
    (tmp_path / "ext.csv").write_text(f"student,lesson,deadline\ned,{L1},2026-10-03T23:59:00+00:00\n")
    code, err = cli(*rule)
    assert code == 0 and "changed: late penalties: 10%/day after 01_attention" in cli.out, err
    di = sum(
        float(r["points"]) for r in store.read_grades(out / "grades.csv") if (r["student"], r["lesson"]) == ("di", L1)
    )
    assert 4 <= di < 6
    table = {
        "ada": (6, 8, 10),
        "bo": (6, 0, 9),
        "cy": (0, 0, 0),
        "di": (di, 8, 10),
        "ed": (5.4, 8, 0),
        "fay": (6, 8, 9.5),
        "gus": (0, 8, 0),
        "hal": (6, 8, 10),
    }
    never = {("bo", L2), ("cy", L1), ("cy", L2), ("cy", L3), ("gus", L1), ("gus", L3)}

    def check_totals():
        rows = {r["student"]: r for r in store.read_csv(out / "totals.csv")}
        assert {s: tuple(number(r[c]) for c in (L1, L2, L3)) for s, r in rows.items()} == table
        assert {s: number(r["total"]) for s, r in rows.items()} == {s: round(sum(v), 2) for s, v in table.items()}
        assert {
            (s, lsn) for s, r in rows.items() for lsn in (L1, L2, L3) if f"{lsn}: never handed in" in r["flags"]
        } == never

    check_totals()
    # A trial export with another rule writes only its file; a grade that forgets --written, or says --no-written,
    # changes nothing or is refused.
    kept = (out / "totals.csv").read_bytes(), (out / "report.html").read_bytes()
    code, err = cli(
        "export", out, "--format", "csv", "--out", tmp_path / "scratch.csv", "--no-written", "--late-policy", "none"
    )
    assert code == 0 and "a trial, counted otherwise than" in err, err
    assert ((out / "totals.csv").read_bytes(), (out / "report.html").read_bytes()) == kept
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--no-written", "--resume", "--quiet")
    assert code == 2 and "counts otherwise than these flags say: written questions not counted" in err, err
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--resume", "--quiet")  # --written forgotten
    assert code == 0, err
    check_totals()
    # The Canvas files: a new import, and Canvas's own export filled (first with a column worth 8 for lesson 03).
    code, err = cli("export", out, "--format", "canvas", "--out", tmp_path / "canvas.csv", *roster)
    assert code == 0, err
    assert (
        "never handed in, counted as 0 (6): bo 02_heads; cy 01_attention, 02_heads, 03_multi_head; gus "
        "01_attention, 03_multi_head" in err
    )
    canvas = list(csv.DictReader(open(tmp_path / "canvas.csv", newline="")))
    assert tuple(number(canvas[0][c]) for c in (L1, L2, L3)) == (6, 8, 10)
    by_id = {int(r["ID"]): r for r in canvas[1:]}
    assert {s: tuple(number(by_id[i][c]) for c in (L1, L2, L3)) for s, i in ids.items()} == table
    export = tmp_path / "Grades-export.csv"
    header = "Student,ID,SIS User ID,SIS Login ID,Section,Lesson 1 (501),Lesson 2 (502),Lesson 3 (503)\n"
    people = "".join(f"{s.title()} Doe,{i},{s},,A,,,\n" for s, i in ids.items())
    export.write_text(header + "    Points Possible,,,,,6,8,8\n" + people)
    args = [
        "export",
        out,
        "--format",
        "canvas",
        "--canvas-gradebook",
        export,
        "--out",
        tmp_path / "filled.csv",
        *roster,
    ]
    code, err = cli(*args)
    assert code == 2 and "Lesson 3 (503) has Points Possible 8, but 03_multi_head is out of 10" in err
    assert not (tmp_path / "filled.csv").exists()
    export.write_text(header + "    Points Possible,,,,,6,8,10\n" + people)
    code, err = cli(*args)
    assert code == 0, err
    filled = {int(r["ID"]): r for r in csv.DictReader(open(tmp_path / "filled.csv", newline="")) if r["ID"]}
    assert {s: tuple(number(filled[i][f"Lesson {n} (50{n})"]) for n in (1, 2, 3)) for s, i in ids.items()} == table
    # The feedback pages: each lesson handed in shows its points (before a late penalty, which it states).
    full = {L1: 6, L2: 8, L3: 10}
    for (student, lesson), got in {
        (s, lsn): v for s, row in table.items() for lsn, v in zip((L1, L2, L3), row)
    }.items():
        if (student, lesson) in never:
            continue
        page = (out / "feedback" / student / f"{lesson}.html").read_text()
        if (student, lesson) == ("ed", L1):
            assert "<b>6 / 6</b>" in page and "so 5.4 of 6 count" in page
        else:
            assert f"<b>{got:g} / {full[lesson]}</b>" in page, (student, lesson)
    # report.html: each lesson's mean is the table's, and who never handed it in.
    report = (out / "report.html").read_text()
    for i, lesson in enumerate((L1, L2, L3)):
        mean = round(100 * sum(row[i] for row in table.values()) / full[lesson] / len(table))
        assert f"Mean score: {mean}% of 8 students" in report, lesson
    assert "Never handed in: 3 students: bo, cy, gus" not in report  # per lesson, not summed
    for lesson, who in ((L1, "cy, gus"), (L2, "bo, cy"), (L3, "cy, gus")):
        assert f"Never handed in: 2 students: {who}</p>" in report[report.index(f"<h2 id='{lesson}'>") :]
    # A wrong key: export refuses in one line and writes nothing.
    (tmp_path / "other.key").write_text("cd" * 32 + "\n")
    (tmp_path / "other.key").chmod(0o600)
    os.environ["MHA_RESULTS_KEY"], before = str(tmp_path / "other.key"), os.environ.get("MHA_RESULTS_KEY")
    try:
        code, err = cli("export", out, "--format", "canvas", "--out", tmp_path / "keyless.csv", *roster)
    finally:
        os.environ.pop("MHA_RESULTS_KEY") if before is None else os.environ.__setitem__("MHA_RESULTS_KEY", before)
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "keyless.csv").exists()
    check_totals()
