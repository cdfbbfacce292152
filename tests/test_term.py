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
from autograder.__main__ import main
from autograder import notebook as nbk
from autograder import results as store
from autograder.release import release
from autograder.worker import choose_mode
from tests.lessons import fill

pytestmark = pytest.mark.slow
L1, L2 = "01_attention", "02_heads"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n"
HONEST = {"alice": "solved", "=bob": "blank", "carol": "wrong", "dave": "renamed", "erin": "solved", "frank": "wrong"}


def run(*args, check=True, env=None):
    p = subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], capture_output=True, text=True,
                       timeout=600, env=env)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture
def cli(capsys):
    """The command line in this process (no interpreter and torch to start): (exit status, stderr)."""
    def call(*args):
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err
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
    assert "5 x missing lesson" in err


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
    for student, words in (("symlink", "symbolic link"), ("hardlink", "hard link"), ("fifo", "not a regular file"),
                           ("linked-folder", "student folder is a symbolic link"),
                           ("linked-lesson", "lesson folder is a symbolic link"), ("int-in-source", "source")):
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
        return grader.grade(subs, out, [L1], resume=True, mode=mode, progress=False, **kw)

    assert again()["reasons"] == {"not graded before": 2}
    first = (out / "grades.csv").read_text()
    assert (again()["graded"], again()["reused"]) == (0, 2)
    with open(code / "autograder" / "checks" / "attention.py", "a") as f:
        f.write("\n# a check fixed between two runs\n")
    put(subs, "carol", notebooks["solved"])
    changed = again()
    assert changed["reasons"] == {"checks, tests or grader changed": 1, "submission changed": 1}
    assert again(force=True, students=["alice"])["reasons"] == {"forced (--force)": 1}
    assert (out / "grades.csv").read_text() != first  # carol's new notebook scores 6
    assert {r["student"]: r["points"] for r in store.read_grades(out / "grades.csv")
            if r["test"] == "test_softmax"} == {"alice": "2", "carol": "2"}


def test_shards_merge_only_when_the_set_is_whole(term, tmp_path, cli):
    root, _, _ = term
    manifest = tmp_path / "class.json"
    assert cli("manifest", root / "subs", "--out", manifest)[0] == 0
    assert json.loads(manifest.read_text())["students"] == sorted(HONEST)
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        code, err = cli("grade", root / "subs", "--out", out, "--shard", f"{i}/2", "--manifest", manifest, "--quiet")
        assert code == 0, err
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


def test_a_result_edited_after_grading_is_refused_by_merge_and_regraded_by_resume(term, tmp_path, cli):
    root, _, _ = term
    manifest = tmp_path / "class.json"
    assert cli("manifest", root / "subs", "--out", manifest)[0] == 0
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        code, err = cli("grade", root / "subs", "--out", out, "--shard", f"{i}/2", "--manifest", manifest, "--quiet")
        assert code == 0, err
    victim = store.result_path(shards[0], "carol", L1)  # shard 0 holds =bob, carol and erin
    _inflate(victim)
    code, err = cli("merge", *shards, "--out", tmp_path / "merged", "--manifest", manifest)
    assert code == 2 and f"{victim}: refused: its verdict was changed after grading" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "merged" / "grades.csv").exists()
    code, err = cli("grade", root / "subs", "--out", shards[0], "--shard", "0/2", "--manifest", manifest,
                    "--resume", "--quiet")
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
    assert code == 1 and "carol.json: refused: it is not the result this folder recorded last" in err, err
    assert "refused" in next(r for r in store.read_csv(tmp_path / "scores.csv") if r["student"] == "carol")["regrade"]
    code, err = cli("report", out)
    assert code == 1 and "carol.json: refused" in err and "carol.json: refused" in (out / "report.html").read_text()
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
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(root / "subs"), "--out", str(out),
                             "--jobs", "1", "--quiet"], stderr=subprocess.PIPE, text=True, env=env)
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
    roster.write_text("student,name,lms_id\nalice,\"Liddell, Alice\",101\nbob,Bob Stone,102\n")
    code, err = cli("collect", dl, "--out", subs, "--roster", roster)
    assert code == 0, err
    code, err = cli("grade", subs, "--out", out, "--quiet")
    assert code == 0, err
    grades = store.read_grades(out / "grades.csv")
    points = {s: sum(float(r["points"]) for r in grades if r["student"] == s) for s in ("alice", "bob")}
    assert points == {"alice": 0, "bob": 6}
    flagged = [r for r in store.read_csv(subs / "collection.csv") if "names another student" in r["anomaly"]]
    assert [r["student"] for r in flagged] == ["alice"]


def test_a_term_adds_up_for_every_roster_student(term, tmp_path, cli):
    """Collected from a Canvas download with times, a roster student (bob) who never submits, graded into
    nbgrader's gradebook, a TA's manual score on carol's softmax and an extension for her: the Canvas
    export is, for every roster student, the lesson's points with the manual score in place of the
    autograded one, less the late penalty; the plain CSV and the report agree."""
    from autograder.adapters.gradebook import _open
    root, notebooks, _ = term
    dl, subs, out, db = tmp_path / "canvas", tmp_path / "subs", tmp_path / "results", tmp_path / "course/gradebook.db"
    dl.mkdir()
    nbk.write(notebooks["solved"], dl / "liddellalice_101_9001_01_attention.ipynb")
    nbk.write(notebooks["wrong"], dl / "danverscarol_103_9003_01_attention.ipynb")
    (tmp_path / "roster.csv").write_text("student,name,email,lms_id\nalice,\"Liddell, Alice\",a@x.org,101\n"
                                         "bob,Bob Stone,b@x.org,102\ncarol,Carol Danvers,c@x.org,103\n")
    (tmp_path / "times.csv").write_text("student,lesson,submitted_at\nalice,01_attention,2026-10-01T22:00:00+00:00\n"
                                        "carol,01_attention,2026-10-03T01:00:00+00:00\n")   # 2 started days late
    (tmp_path / "extensions.csv").write_text("student,lesson,deadline\ncarol,01_attention,2026-10-02T23:59:00+00:00\n")
    code, err = cli("collect", dl, "--out", subs, "--roster", tmp_path / "roster.csv", "--times", tmp_path / "times.csv")
    assert code == 0, err
    db.parent.mkdir()
    code, err = cli("grade", subs, "--out", out, "--gradebook", db, "--quiet")
    assert code == 0, err
    auto = {(r["student"], r["test"]): float(r["points"]) for r in store.read_grades(out / "grades.csv")}
    assert sum(p for (s, _), p in auto.items() if s == "alice") == 6 and auto["carol", "test_softmax"] < 2
    with _open(db) as gb:   # the TA's review, as formgrader saves it
        g = gb.find_grade("test_softmax", L1, L1, "carol")
        g.manual_score, g.needs_manual_grade = 1.5, False
        gb.db.commit()
    carol_raw = sum(p for (s, t), p in auto.items() if s == "carol" and t != "test_softmax") + 1.5
    expected = {"101": 6.0, "102": 0.0, "103": round(carol_raw * 0.9, 2)}   # carol: 1 started day past her extension
    common = [out, "--roster", tmp_path / "roster.csv", "--submissions", subs, "--gradebook", db,
              "--deadline", "01_attention=2026-10-01T23:59:00+00:00", "--late-policy", "10%/day",
              "--extensions", tmp_path / "extensions.csv"]
    code, err = cli("export", "--format", "canvas", "--out", tmp_path / "canvas.csv", *common)
    assert code == 0, err
    assert "never handed in, counted as 0: bob 01_attention" in err
    with open(tmp_path / "canvas.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["ID"]: float(r[L1]) for r in rows[1:]} == pytest.approx(expected) and float(rows[0][L1]) == 6
    code, err = cli("export", "--format", "csv", "--out", tmp_path / "plain.csv", *common)
    assert code == 0, err
    plain = {r["student"]: r for r in store.read_csv(tmp_path / "plain.csv")}
    assert float(plain["carol"][f"{L1} raw"]) == pytest.approx(carol_raw) and float(plain["carol"][f"{L1} penalty %"]) == 10
    assert "manual: test_softmax" in plain["carol"]["flags"] and "never handed in" in plain["bob"]["flags"]
    assert {s: float(r["total"]) for s, r in plain.items()} == pytest.approx(
        {"alice": 6.0, "bob": 0.0, "carol": expected["103"]})
    totals = {r["student"]: float(r["total"]) for r in store.read_csv(out / "totals.csv")}
    assert totals == pytest.approx({"alice": 6.0, "bob": 0.0, "carol": carol_raw})   # raw scores, manual counted
    code, err = cli("report", out, "--submissions", subs)
    assert code == 0, err
    assert "Never submitted: 1 roster student: bob" in (out / "report.html").read_text()
