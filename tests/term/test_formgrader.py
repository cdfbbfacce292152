"""--gradebook and nbgrader's formgrader, for real: a tiny class graded into a course root, a
Jupyter server with nbgrader's extensions started here on 127.0.0.1 (token auth, a free port),
every submission page opened; an instructor's override made through nbgrader.api survives a
regrade (--resume --force) and shows in `nbgrader export`."""

import csv
import html
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
LESSON = "01_attention"
BIN = Path(sys.executable).parent


def grade(course, subs, *extra):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(subs),
            "--out",
            str(course.parent / "results"),
            "--lesson",
            LESSON,
            "--gradebook",
            str(course.parent / "db" / "gradebook.db"),
            "--course-root",
            str(course),
            "--roster",
            str(course.parent / "roster.csv"),
            "--quiet",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    with open(course.parent / "results" / "grades.csv", newline="") as f:
        return {(r["student"], r["test"]): r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course root (its gradebook elsewhere) and a graded class: ann (solved), ben (a wrong softmax, and a markdown
    cell that tries to run script in the instructor's browser), cat (broken JSON), and dan, on the roster, who handed
    nothing in. grade writes the course's nbgrader_config.py, as the README says."""
    root = tmp_path_factory.mktemp("formgrader")
    course, subs = root / "course", root / "submissions"
    course.mkdir()
    (root / "roster.csv").write_text(
        'student,name,email,lms_id\nann,"Lee, Ann",ann@x.org,1\nben,Ben Okri,ben@x.org,2\n'
        "cat,Cat Stevens,,3\ndan,Dan Brown,dan@x.org,4\n"
    )
    (root / "db").mkdir()  # the gradebook outside the course root: --course-root says where autograded/ goes
    release(root / "release", [LESSON])
    rel = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    ben = fill(rel, LESSON, {"softmax": mutants.for_lesson(LESSON).MUTANTS["softmax"][0][2]})
    ben["cells"].append(
        {
            "cell_type": "markdown",
            "id": "ben-note",
            "metadata": {},
            "source": "<script>alert('owned')</script> see my notes",
        }
    )
    for student, nb in (("ann", fill(rel, LESSON)), ("ben", ben)):
        nbk.write(nb, subs / student / LESSON / f"{LESSON}.ipynb")
    (subs / "cat" / LESSON).mkdir(parents=True)
    (subs / "cat" / LESSON / f"{LESSON}.ipynb").write_text('{"cells": [')
    return course, subs, grade(course, subs)


@pytest.fixture(scope="module")
def server(course):
    """jupyter server + nbgrader's formgrader on 127.0.0.1; yields (base url, token); killed after."""
    root = course[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(root.parent / "jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(root.parent / "jupyter-runtime"),
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
    )
    cmd = [
        str(BIN / "jupyter"),
        "server",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(root.parent / "jupyter.log", "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (root.parent / "jupyter.log").read_text()[
                -3000:
            ]
            try:
                if get(url, token, "/api/status")[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect (to the login page) is the answer itself


def get(url, token, path):
    req = urllib.request.Request(url + path, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def gradebook(course):
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course.parent / 'db' / 'gradebook.db'}")


def test_autograded_notebooks_carry_the_verdicts_nbgrader_reads(course):
    from nbgrader import nbgraderformat
    from nbgrader.utils import determine_grade

    root, _, grades = course
    for student in ("ann", "ben", "cat"):
        path = root / "autograded" / student / LESSON / f"{LESSON}.ipynb"
        with open(path) as f:
            nb = nbgraderformat.read(f, as_version=4)  # nbgrader's reader validates its metadata
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert [c.metadata.nbgrader.grade_id for c in tests] == [t for t, _ in nbk.lesson_tests(LESSON)]
        for cell in tests:
            row = grades[student, cell.metadata.nbgrader.grade_id]
            assert determine_grade(cell)[0] == pytest.approx(float(row["points"])) == cell.metadata.autograder.points
        text = json.dumps(nb)
        assert "BEGIN SOLUTION" not in text and "verify(" not in text  # no solution, no hidden test
    ben = path.parent.parent.parent / "ben" / LESSON / f"{LESSON}.ipynb"
    assert "alert('owned')" in ben.read_text()  # kept for the instructor, as text (next test)


def test_formgrader_opens_every_submission_and_shows_the_feedback(course, server):
    root, _, grades = course
    url, token = server
    with gradebook(root) as gb:
        ids = {s: gb.find_submission_notebook(LESSON, LESSON, s).id for s in ("ann", "ben", "cat")}
    for student, sid in ids.items():
        status, page = get(url, token, f"/formgrader/submissions/{sid}/")
        assert status == 200, page[-2000:]
        shown = html.unescape(page)
        for (s, test), row in grades.items():
            if s == student and row["message"]:
                assert row["message"][:120] in shown, (student, test)
    assert "<script>alert('owned')" not in get(url, token, f"/formgrader/submissions/{ids['ben']}/")[1]
    status, body = get(url, token, f"/formgrader/api/grades?submission_id={ids['ben']}")
    scores = {g["name"]: g["auto_score"] for g in json.loads(body)}
    assert status == 200 and scores == {t: float(grades["ben", t]["points"]) for t, _ in nbk.lesson_tests(LESSON)}
    assert get(url, token + "x", f"/formgrader/submissions/{ids['ben']}/")[0] in (302, 403)  # the token is needed


def test_an_override_survives_regrading_and_shows_in_the_export(course):
    root, subs, grades = course
    auto = float(grades["ben", "test_softmax"]["points"])
    with gradebook(root) as gb:
        g = gb.find_grade("test_softmax", LESSON, LESSON, "ben")
        assert g.auto_score == pytest.approx(auto) != 1.5
        g.manual_score = 1.5
        gb.find_comment("softmax", LESSON, LESSON, "ben").manual_comment = "the max subtraction is missing"
        gb.db.commit()
    grade(root, subs, "--resume", "--force")  # the resume path, regrading every submission
    with gradebook(root) as gb:
        g = gb.find_grade("test_softmax", LESSON, LESSON, "ben")
        assert (g.auto_score, g.manual_score, g.score) == (pytest.approx(auto), 1.5, 1.5)
        assert gb.find_comment("softmax", LESSON, LESSON, "ben").manual_comment == "the max subtraction is missing"
    # (A running formgrader keeps its own gradebook session: it shows changes made by other
    # processes after a restart. The export reads the database afresh.)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(
        [str(BIN / "nbgrader"), "export"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    with open(root / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == LESSON}
    ben = sum(float(r["points"]) for (s, t), r in grades.items() if s == "ben" and t != "test_softmax") + 1.5
    assert float(rows["ben"]["score"]) == pytest.approx(ben)
    assert float(rows["ann"]["score"]) == sum(p for _, p in nbk.lesson_tests(LESSON))


def test_formgrader_lists_the_lessons_and_the_roster_from_the_config_grade_wrote(course, server):
    """The README's steps: grade --gradebook writes COURSE/nbgrader_config.py; formgrader started there (as root with
    --allow-root) lists the course's lessons as assignments (Manage Assignments, Manual Grading) and the roster's
    students by name, dan too."""
    root, _, _ = course
    config = (root / "nbgrader_config.py").read_text()
    assert "c.CourseDirectory.source_directory = " in config and "gradebook.db" in config
    status, body = get(*server, "/formgrader/api/assignments")
    assert status == 200 and LESSON in {a["name"] for a in json.loads(body)}, body[:2000]
    status, body = get(*server, "/formgrader/api/students")
    names = {s["id"]: (s["first_name"], s["last_name"], s["email"], s["lms_user_id"]) for s in json.loads(body)}
    assert names == {
        "ann": ("Ann", "Lee", "ann@x.org", "1"),
        "ben": ("Ben", "Okri", "ben@x.org", "2"),
        "cat": ("Cat", "Stevens", None, "3"),
        "dan": ("Dan", "Brown", "dan@x.org", "4"),
    }
    status, body = get(*server, f"/formgrader/api/submissions/{LESSON}")
    assert status == 200 and {s["student"] for s in json.loads(body) if s["autograded"]} >= {"ann", "ben"}, body[:2000]
