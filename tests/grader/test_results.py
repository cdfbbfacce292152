"""The results store (autograder/results.py) and the grader's hostile-input guards, without a sandbox:
stored results that are damaged, CSV injection, control characters, refused files, malformed
notebooks, partial credit rows, merge's shard-set checks."""

import copy
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder import report
from autograder import results as store
from autograder.checking import Check, PartialCredit, Subject
from autograder.grade import run_check, run_checks, submission_cells
from autograder.merge import shard_set_problems

TESTS = [("test_softmax", 2.0), ("test_causal_mask", 1.0)]


def result(student="alice", lesson="01_attention", **extra):
    return dict(
        dict(
            student=student,
            lesson=lesson,
            notebook=None,
            sha256=None,
            fingerprint="f",
            grader="g",
            submitted_at=None,
            notes=[],
            cells={},
            tests=[dict(test=t, points=p, max_points=p, status="passed", message="") for t, p in TESTS],
        ),
        **extra,
    )


def test_a_result_round_trips_and_damaged_ones_are_reported_not_raised(tmp_path):
    saved = store.save_result(tmp_path, result())
    assert store.load_result(tmp_path, "alice", "01_attention") == (saved, None)
    damaged = {
        "not-json": "{",
        "a-list": "[]",
        "bad-status": json.dumps(
            result("bad-status") | {"tests": [dict(test="t", points=0, max_points=1, status="hacked", message="")]}
        ),
        "too-many-points": json.dumps(
            result("too-many-points") | {"tests": [dict(test="t", points=5, max_points=1, status="passed", message="")]}
        ),
        "string-error": json.dumps(result("string-error") | {"cells": {"errors": "boom", "skipped": {}}}),
        "other-student": json.dumps(result("mallory")),
        "huge": " " * (store.MAX_STORED_BYTES + 1),
    }
    folder = tmp_path / store.STORE / "01_attention"
    for name, text in damaged.items():
        (folder / f"{name}.json").write_text(text)
    (folder / "linked.json").symlink_to(folder / "alice.json")
    problems = []
    loaded = store.load_results(tmp_path, problems)
    assert [r.student for r in loaded] == ["alice"]
    assert len(problems) == len(damaged) + 1 and all("unreadable stored result" in p for p in problems)
    # the report turns them into errors flagged for regrading, never zeros, and never crashes
    rows = {r.student: r for r in report.gather(tmp_path)}
    assert rows["huge"].tests[0].status == "error" and "damaged" in rows["huge"].tests[0].message
    assert all(t.needs_regrade for t in rows["not-json"].tests)


def test_stored_text_is_cleaned_and_capped():
    r = store.Result.from_json(
        result(
            notes=["\x1b[31mred\x1b[0m \u202eevil\x07"],
            cells={
                "skipped": {},
                "errors": {
                    "cell 3 (x = 1)": "a forged string error " * 3_000_000,
                    "cell 4": {"type": "\x1b]0;title\x07Err", "message": ["not", "text"]},
                },
            },
        )
    ).to_json()
    assert r["notes"] == ["red evil"]
    forged = r["cells"]["errors"]["cell 3 (x = 1)"]
    assert forged["type"] == "error" and len(forged["message"]) <= store.NOTE_CAP
    assert r["cells"]["errors"]["cell 4"] == {"type": "Err", "message": "(list)"}
    assert len(store.clean("x" * 100_000)) == store.MESSAGE_CAP
    assert store.clean("a\tb\r\nc\x00", newlines=False) == "a b c"


@pytest.mark.parametrize(
    "value, written",
    [
        ('=HYPERLINK("http://evil")', '\'=HYPERLINK("http://evil")'),
        ("+1", "'+1"),
        ("-2", "'-2"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "' =1"),
        ("\r=1", "' =1"),
        ("'quoted", "''quoted"),
        (" =1", "' =1"),
        ("\x01=cmd", "'=cmd"),
        ("plain", "plain"),
        ("a=b", "a=b"),
        (2.5, "2.5"),
        (3.0, "3"),
    ],
)
def test_csv_cells_cannot_be_formulas(value, written):
    assert store.csv_cell(value) == written


def test_student_ids_stay_identical_through_grades_csv(tmp_path):
    names = ["=cmd|' /C calc'!A0", "-rf", "+x", "@me", "'quoted", "o'brien", "plain"]
    store.write_grades(
        tmp_path / "grades.csv",
        [
            store.Result.from_json(
                result(s)
                | {
                    "tests": [
                        dict(
                            test="test_softmax",
                            points=1,
                            max_points=2,
                            status="failed",
                            message='=HYPERLINK("x")\nline 2',
                        )
                    ]
                }
            )
            for s in names
        ],
    )
    text = (tmp_path / "grades.csv").read_text()
    assert "\n=" not in text and "\n-" not in text and "\n+" not in text and "\n@" not in text
    rows = store.read_grades(tmp_path / "grades.csv")
    assert [r["student"] for r in rows] == names
    assert rows[0]["message"] == '=HYPERLINK("x") | line 2'


@pytest.mark.parametrize(
    "name, ok",
    [
        ("alice", True),
        ("=bob", True),
        ("__MACOSX", False),
        (".hidden", False),
        ("a\x1b[31mb", False),
        ("a\nb", False),
        ("x" * 300, False),
    ],
)
def test_student_identifiers(name, ok):
    assert (store.check_student(name) is None) == ok


@pytest.mark.parametrize(
    "text, want",
    [
        ("2026-01-31T23:59:00+01:00", "2026-01-31T22:59:00+00:00"),
        ("2026-01-31 23:59:00.000000 UTC", "2026-01-31T23:59:00+00:00"),
        ("2026-01-31 23:59:00", "2026-01-31T23:59:00+00:00"),
        ("soon", None),
    ],
)
def test_submission_times(tmp_path, text, want):
    (tmp_path / store.TIMESTAMP_FILE).write_text(text + "\n")
    when, problem = store.read_timestamp(tmp_path)
    assert when == want and (problem is None) == (want is not None)


def test_manifest_round_trip_and_refusals(tmp_path):
    mid = store.write_manifest(tmp_path / "class.json", ["b", "a"], ["01_attention"])
    m = store.read_manifest(tmp_path / "class.json")
    assert m == {"students": ["a", "b"], "lessons": ["01_attention"], "id": mid}
    for bad in ("[]", "{", json.dumps({"format": store.MANIFEST_FORMAT, "students": ["a", "a"], "lessons": []})):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(store.UsageError):
            store.read_manifest(tmp_path / "bad.json")


# ---- files in SUBMISSIONS --------------------------------------------------------------------


@pytest.fixture
def notebook_bytes():
    return json.dumps(nbk.read(nbk.lesson_path("01_attention"))).encode()


def test_only_regular_files_with_one_name_are_read(tmp_path, notebook_bytes):
    real = tmp_path / "real.ipynb"
    real.write_bytes(notebook_bytes)
    assert nbk.read_submitted_bytes(real) == notebook_bytes
    (tmp_path / "link.ipynb").symlink_to(real)
    os.link(real, tmp_path / "hard.ipynb")
    os.mkfifo(tmp_path / "fifo.ipynb")
    with open(tmp_path / "big.ipynb", "wb") as f:
        f.truncate(nbk.MAX_NOTEBOOK_BYTES + 1)
    for name, words in (
        ("link", "symbolic link"),
        ("hard", "hard link"),
        ("fifo", "not a regular file"),
        ("big", "larger than 20 MB"),
    ):
        with pytest.raises(nbk.NotebookError, match=words) as e:
            nbk.read_submitted_bytes(tmp_path / f"{name}.ipynb")
        assert str(e.value).startswith("refused")
    with pytest.raises(nbk.NotebookError, match="not a regular file"):
        nbk.read_submitted_bytes("/dev/zero")


def _broken(nb, how):
    nb = copy.deepcopy(nb)
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    if how == "source holds an int":
        code["source"] = ["x = 1\n", 7]
    elif how == "cell metadata is a list":
        code["metadata"] = []
    elif how == "nbgrader metadata is a string":
        code["metadata"] = {"nbgrader": "yes"}
    elif how == "notebook metadata is a list":
        nb["metadata"] = []
    elif how == "kernelspec is a string":
        nb["metadata"]["kernelspec"] = "python3"
    elif how == "cells is a dict":
        nb["cells"] = {}
    elif how == "a cell is a string":
        nb["cells"].append("cell")
    return json.dumps(nb).encode()


@pytest.mark.parametrize(
    "how",
    [
        "source holds an int",
        "cell metadata is a list",
        "nbgrader metadata is a string",
        "notebook metadata is a list",
        "kernelspec is a string",
        "cells is a dict",
        "a cell is a string",
    ],
)
def test_malformed_notebook_fields_are_a_clear_error(notebook_bytes, how):
    with pytest.raises(nbk.NotebookError):
        nbk.parse_submission(_broken(json.loads(notebook_bytes), how))


def test_notebooks_that_would_blow_the_graders_memory_are_refused_before_parsing(notebook_bytes):
    for item in (b"[],", b'"ab",', b"{},"):  # each would take the grader past 300 MiB
        with pytest.raises(nbk.NotebookError, match="JSON values"):
            nbk.parse_submission(b'{"cells": [' + item * (nbk.MAX_NOTEBOOK_BYTES // len(item) - 10) + b"[]]}")
    with pytest.raises(nbk.NotebookError, match="corrupt JSON"):
        nbk.parse_submission(b"[" * 100_000)
    with pytest.raises(nbk.NotebookError, match="UTF-8"):
        nbk.parse_submission(b"\xff\xfe")
    cells, labels, notes = submission_cells(nbk.parse_submission(notebook_bytes))
    assert cells and len(labels) == len(cells) and not notes


# ---- partial credit and feedback -------------------------------------------------------------


def _check(body, aspects={"core": 2, "masks": 1, "errors": 1}):
    return Check("f", body, aspects=aspects)


def test_partial_credit_rows_sum_to_the_tests_points():
    def body(s):
        with s.aspect("core"):
            pass
        with s.aspect("masks"):
            raise AssertionError("the mask is ignored")
        with s.aspect("errors"):
            pass

    row = run_check(_check(body), Subject(lambda request: {"ok": None}), 2.0)
    assert (row["status"], row["points"], row["message"]) == ("failed", 1.5, "the mask is ignored")
    assert [(a["aspect"], a["points"], a["max_points"], a["passed"]) for a in row["aspects"]] == [
        ("core", 1.0, 1.0, True),
        ("masks", 0.0, 0.5, False),
        ("errors", 0.5, 0.5, True),
    ]
    page = report.feedback_page(store.Result.from_json(result() | {"tests": [dict(test="test_f", **row)]}))
    assert "masks: 0 / 0.5" in page and "the mask is ignored" in page and "errors: 0.5 / 0.5" in page


def test_a_failed_core_scores_nothing_and_lists_every_aspect():
    def body(s):
        with s.aspect("core"):
            raise AssertionError("wrong values")

    row = run_check(_check(body), Subject(lambda request: {"ok": None}), 4.0)
    assert row["points"] == 0 and row["status"] == "failed" and len(row["aspects"]) == 3
    assert not isinstance(row, PartialCredit) and row["aspects"][1]["message"] == "earned only when core passes"


def test_unavailable_checks_and_bugs_of_ours_are_errors_flagged_for_regrading():
    row = run_check(_check(lambda s: None), Subject(lambda request: {}), 2.0, "Triton is not installed")
    assert row["status"] == "error" and row["grader_error"] and "Triton is not installed" in row["message"]
    row = run_check(Check("f", lambda s: 1 / 0), Subject(lambda request: {}), 2.0)
    assert row["status"] == "error" and row["grader_error"] and "ZeroDivisionError" in row["traceback"]


def test_checks_that_pause_share_one_process_with_the_parts_that_need_the_same():
    """grade.run_checks: every check runs up to its pause (Check.steps), then the parts that yield the same label run
    one after another; the rows keep the tests' order."""
    ran = []

    def check(name, labels):
        def body(s):
            ran.append((name, 0))
            for i, label in enumerate(labels, 1):
                yield label
                ran.append((name, i))

        return Check(name, body)

    jobs = [check("a", ["x"]), check("b", []), check("c", ["y", "x"]), Check("d", lambda s: ran.append(("d", 0)))]
    jobs.append(check("e", ["x"]))
    rows = run_checks([(c, Subject(lambda request: {"ok": None}), 1.0, None) for c in jobs])
    assert ran == [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0), ("a", 1), ("e", 1), ("c", 1), ("c", 2)]
    assert [r["status"] for r in rows] == ["passed"] * 5


def test_a_paused_check_gives_back_what_it_isolates_and_never_pauses_inside_a_block():
    """The names a check isolates are restored while others run and isolated again at its next request; a pause inside
    a forbidding, elsewhere or memory_bound block is a bug of ours (a grader error), never a verdict."""
    sent = []

    def transport(request):
        sent.append(" ".join([request["op"], *request.get("target", {}).values()]))
        return {"ok": None}

    def isolating(s):
        s.call("f")
        yield "x"
        s.call("f")

    rows = run_checks(
        [
            (Check("f", isolating, isolate=["g"]), Subject(transport), 1.0, None),
            (Check("h", lambda s: s.call("h")), Subject(transport), 1.0, None),
        ]
    )
    assert [r["status"] for r in rows] == ["passed", "passed"]
    assert sent == ["isolate", "call f", "restore", "call h", "isolate", "call f", "restore"]

    def inside(s):
        with s.elsewhere(["pass"]):
            yield s.next_process(cells=["pass"])

    row = run_check(Check("f", inside), Subject(lambda request: {"ok": None}), 2.0)
    assert row["status"] == "error" and row["grader_error"] and "paused inside" in row["traceback"]


# ---- merge -----------------------------------------------------------------------------------


def test_merge_names_every_gap_and_inconsistency():
    def run(shard, lessons=("01_attention",), manifest=None):
        return store.Run(shard, manifest, tuple(lessons))

    whole = {"a": run("0/3"), "b": run("1/3"), "c": run("2/3")}
    stored = {"a": [store.Result.from_json(result("s1"))], "b": [store.Result.from_json(result("s2"))], "c": []}
    assert shard_set_problems(whole, stored, None) == []
    assert shard_set_problems({"a": run("0/3"), "c": run("2/3")}, stored, None) == ["missing shard 1/3"]
    assert "shard 0/3 given twice (a, b)" in shard_set_problems(
        {"a": run("0/3"), "b": run("0/3"), "c": run("2/3")}, stored, None
    )
    problems = shard_set_problems(whole | {"c": run("2/3", ("01_attention", "02_heads"))}, stored, None)
    assert any("different lessons" in p for p in problems)
    problems = shard_set_problems(whole, stored | {"c": [store.Result.from_json(result("s1"))]}, None)
    assert any("student s1 is in two shards" in p for p in problems)
    problems = shard_set_problems(whole, stored | {"c": [store.Result.from_json(result("s3", grader="other"))]}, None)
    assert any("2 different versions" in p for p in problems)
    problems = shard_set_problems(whole, stored, {"students": ["s1", "s2", "s9"], "id": None})
    assert any("in no shard: s9" in p for p in problems)


# ---- signed results ----------------------------------------------------------------------------


def _edit(path, change):
    r = json.loads(path.read_text())
    change(r)
    path.write_text(json.dumps(r))


def _inflate(r):
    """The attack: the grader field removed, one test set to 1000/1000."""
    r.pop("grader")
    r["tests"][0].update(points=1000.0, max_points=1000.0, status="passed")


def test_a_verdict_changed_after_grading_or_never_signed_is_refused(tmp_path):
    saved = store.save_result(tmp_path, result())
    assert store.load_result(tmp_path, "alice", "01_attention") == (saved, None)  # an honest one verifies
    key = store.key_path()
    assert key.stat().st_mode & 0o777 == 0o600 and not key.is_relative_to(tmp_path)
    path = store.result_path(tmp_path, "alice", "01_attention")
    _edit(path, _inflate)
    got, why = store.load_result(tmp_path, "alice", "01_attention")
    assert got is None and "changed after grading" in why and str(path) in why and "regrade" in why
    store.save_result(tmp_path, result("bob"))
    _edit(store.result_path(tmp_path, "bob", "01_attention"), lambda r: r.pop("digest"))  # written before signing
    got, why = store.load_result(tmp_path, "bob", "01_attention")
    assert got is None and "no digest" in why and "grade --resume" in why


def test_a_result_that_does_not_fit_its_lesson_is_refused(tmp_path):
    tests = nbk.lesson_tests("01_attention")
    honest = result(tests=[dict(test=t, points=p, max_points=p, status="passed", message="") for t, p in tests])
    store.save_result(tmp_path, honest)
    store.save_result(tmp_path, result("bob"))  # signed, but its tests are not lesson 01's
    store.save_result(tmp_path, dict(honest, student="carol", grader=None))
    problems = []
    loaded = store.load_results(tmp_path, problems, report.lesson_tests())
    assert [r.student for r in loaded] == ["alice"]
    assert any("bob.json" in p and "not the lesson's" in p for p in problems)
    assert any("carol.json" in p and "names no grader" in p for p in problems)


def test_the_key_is_outside_everything_the_sandbox_sees(monkeypatch, tmp_path):
    from autograder.worker import _system_binds

    monkeypatch.delenv(store.KEY_ENV)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    default = store.key_path()
    assert default == Path.home() / ".config" / "mha-course" / "results.key"
    assert not any(default.resolve().is_relative_to(Path(p).resolve()) for p in _system_binds())


def test_merge_refuses_a_shard_whose_result_was_edited(tmp_path):
    from autograder.config import RunConfig
    from autograder.merge import MergeError, merge

    tests = nbk.lesson_tests("01_attention")
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, (out, student) in enumerate(zip(shards, ("alice", "bob"))):
        store.prepare_out(out)
        store.save_result(
            out,
            result(
                student, tests=[dict(test=t, points=p, max_points=p, status="passed", message="") for t, p in tests]
            ),
        )
        store.write_run(out, f"{i}/2", None, ["01_attention"])
    assert len(merge(RunConfig(tmp_path / "merged"), shards)) == 2  # honest shards merge
    _edit(store.result_path(shards[1], "bob", "01_attention"), _inflate)
    with pytest.raises(MergeError, match="bob.json: refused: its verdict was changed after grading"):
        merge(RunConfig(tmp_path / "again"), shards)
    assert not (tmp_path / "again" / "grades.csv").exists()
    merged = {r.student: r for r in merge(RunConfig(tmp_path / "partial", allow_partial=True), shards)}
    assert all(t.needs_regrade for t in merged["bob"].tests)  # left out, flagged for regrading


def test_integers_in_a_students_exception_are_masked_but_the_graders_own_shapes_are_not():
    from autograder.checking import StudentError, student_message

    e = StudentError("IndexError", ["IndexError"], "index 7 is out of bounds for axis -1 with size 12 (dtype float32)")
    assert not any(ch.isdigit() for ch in e.message.replace("float32", "")) and "float32" in e.message
    assert student_message("got (3, 5, 4) and 0.5 and [1, 2]") == "got (\u2026, \u2026, \u2026) and \u2026 and \u2026"

    def body(s):
        raise AssertionError("wrong shape: expected (2, 5, 4), got (3, 5, 4)")

    row = run_check(_check(body), Subject(lambda request: {}), 2.0)
    assert "got (3, 5, 4)" in row["message"]  # the check's own text keeps its numbers


# ---- replayed, deleted and moved results; the key ------------------------------------------------


def _fitting(student, points=None):
    """A signed-looking result that fits lesson 01 (its tests, its points), `points` earned in each."""
    return result(
        student,
        tests=[
            dict(
                test=t,
                points=p if points is None else points,
                max_points=p,
                status="passed" if points is None else "failed",
                message="",
            )
            for t, p in nbk.lesson_tests("01_attention")
        ],
    )


def test_a_result_copied_from_another_folder_or_put_back_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    store.save_result(a, _fitting("alice"))
    store.save_result(a, _fitting("bob"))
    store.save_result(b, _fitting("alice", points=0.0))
    (b / store.STORE / "01_attention" / "bob.json").write_bytes(
        store.result_path(a, "bob", "01_attention").read_bytes()
    )
    store.result_path(b, "alice", "01_attention").write_bytes(
        store.result_path(a, "alice", "01_attention").read_bytes()
    )
    got, why = store.load_result(b, "bob", "01_attention")  # b never graded bob: copied from a
    assert got is None and "never recorded a result for it" in why and "regrade" in why
    got, why = store.load_result(b, "alice", "01_attention")  # a's full marks over b's zero
    assert got is None and "not the result this folder recorded last" in why
    old = store.result_path(a, "bob", "01_attention").read_bytes()
    store.save_result(a, _fitting("bob", points=0.0))  # bob regraded in a: 0 points
    store.result_path(a, "bob", "01_attention").write_bytes(old)  # his older full marks put back
    got, why = store.load_result(a, "bob", "01_attention")
    assert got is None and "an older result put back" in why
    term = store.load_term(a, report.lesson_tests())
    assert [r.student for r in term.results] == ["alice"] and list(term.refused) == [("bob", "01_attention")]
    rows = {r.student: r for r in report.gather(a)}  # the report flags it for regrading, saying why
    assert all(t.needs_regrade for t in rows["bob"].tests) and "put back" in rows["bob"].tests[0].message


def test_a_deleted_result_is_named_not_forgotten(tmp_path):
    store.save_result(tmp_path, _fitting("alice"))
    store.save_result(tmp_path, _fitting("bob"))
    store.result_path(tmp_path, "bob", "01_attention").unlink()
    assert store.load_result(tmp_path, "bob", "01_attention") == (None, None)  # to grade --resume: not graded before
    term = store.load_term(tmp_path)
    assert "deleted" in term.refused["bob", "01_attention"] and any("bob.json" in line for line in term.lines)
    rows = {r.student: r for r in report.gather(tmp_path)}
    assert "deleted" in rows["bob"].tests[0].message and all(t.needs_regrade for t in rows["bob"].tests)


def test_a_result_moved_onto_another_student_is_refused_not_unreadable(tmp_path):
    store.save_result(tmp_path, _fitting("alice"))
    store.save_result(tmp_path, _fitting("bob", points=0.0))
    store.result_path(tmp_path, "bob", "01_attention").write_bytes(
        store.result_path(tmp_path, "alice", "01_attention").read_bytes()
    )
    got, why = store.load_result(tmp_path, "bob", "01_attention")
    assert got is None and "refused" in why and "unreadable" not in why and "moved here" in why


def test_a_wrong_key_is_said_once_and_grading_into_the_folder_is_refused(tmp_path, monkeypatch):
    for student in ("alice", "bob", "carol", "dave"):
        store.save_result(tmp_path, _fitting(student))
    other = tmp_path / "elsewhere" / "results.key"
    monkeypatch.setenv(store.KEY_ENV, str(other))
    store.results_key(create=True)
    term = store.load_term(tmp_path)
    assert term.results == [] and len(term.refused) == 4
    assert len(term.lines) == 1 and "all 4 stored results refused" in term.lines[0]
    assert "probably not the one" in term.lines[0] and str(other) in term.lines[0] and store.KEY_ENV in term.lines[0]
    with pytest.raises(store.UsageError, match="probably not the one"):
        store.prepare_out(tmp_path)
    monkeypatch.setenv(store.KEY_ENV, str(tmp_path / "none" / "results.key"))  # no key at all: also said once
    term = store.load_term(tmp_path)
    assert len(term.lines) == 1 and "there is no results key" in term.lines[0]


def test_a_key_other_users_can_read_gets_a_warning(tmp_path, monkeypatch, capsys):
    key = tmp_path / "shared.key"
    monkeypatch.setenv(store.KEY_ENV, str(key))
    store.results_key(create=True)
    assert "readable by other users" not in capsys.readouterr().err
    key.chmod(0o644)
    assert store.results_key() is not None
    err = capsys.readouterr().err
    assert "readable by other users" in err and str(key) in err and "chmod 600" in err


def test_merge_carries_results_into_its_folder_and_refuses_one_copied_between_shards(tmp_path):
    from autograder.config import RunConfig
    from autograder.merge import MergeError, merge

    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, (out, student) in enumerate(zip(shards, ("alice", "bob"))):
        store.save_result(out, _fitting(student, points=0.0))
        store.write_run(out, f"{i}/2", None, ["01_attention"])
    merge(RunConfig(tmp_path / "merged"), shards)
    term = store.load_term(tmp_path / "merged", report.lesson_tests())  # signed again for the merged folder
    assert [r.student for r in term.results] == ["alice", "bob"] and not term.refused
    store.save_result(tmp_path / "elsewhere", _fitting("bob"))  # bob's full marks from another folder
    store.result_path(shards[1], "bob", "01_attention").write_bytes(
        store.result_path(tmp_path / "elsewhere", "bob", "01_attention").read_bytes()
    )
    with pytest.raises(MergeError, match="bob.json: refused: it is not the result this folder recorded last"):
        merge(RunConfig(tmp_path / "again"), shards)


@pytest.mark.parametrize(
    "damage, field",
    [
        (lambda r: r["tests"][1].update(points=-1), "tests[1].points"),
        (lambda r: r["tests"][0].update(status="hacked"), "tests[0].status"),
        (lambda r: r["tests"][0].update(message=["not text"]), "tests[0].message"),
        (
            lambda r: r["tests"][0].update(aspects=[dict(aspect="a", points=0, max_points="1")]),
            "tests[0].aspects[0].max_points",
        ),
        (lambda r: r["tests"][1].update(aspects={"a": 1}), "tests[1].aspects"),
        (lambda r: r.update(notes=["ok", 3]), "notes[1]"),
        (lambda r: r.update(grader=7), "grader"),
    ],
    ids=["points", "status", "message", "aspect", "aspects", "note", "grader"],
)
def test_a_malformed_stored_result_is_refused_by_its_reader_naming_the_file_and_field(tmp_path, damage, field):
    raw = result()
    damage(raw)
    with pytest.raises(store.ResultError, match=f"^{re.escape(field)} "):
        store.Result.from_json(raw)
    path = store.result_path(tmp_path, "alice", "01_attention")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(raw))
    got, why = store.load_result(tmp_path, "alice", "01_attention")
    assert got is None and why.startswith(f"{path}: unreadable stored result ({field} ") and "\n" not in why


def test_the_typed_result_reads_and_writes_the_stored_format_unchanged(tmp_path):
    saved = store.save_result(
        tmp_path,
        result(
            cells={"skipped": {"cell 2": "why"}, "errors": {}},
            tests=[
                dict(
                    test="test_softmax",
                    points=1,
                    max_points=2,
                    status="failed",
                    message="m",
                    aspects=[
                        dict(aspect="rows sum to 1", points=1, max_points=1, passed=True, message=""),
                        dict(aspect="stable", points=0, max_points=1, passed=False, message="overflow"),
                    ],
                ),
                dict(
                    test="test_causal_mask",
                    points=0,
                    max_points=1,
                    status="error",
                    message="no sandbox",
                    grader_error=True,
                ),
            ],
        ),
    )
    raw = json.loads(store.result_path(tmp_path, "alice", "01_attention").read_text())
    typed = store.Result.from_json(raw, "alice", "01_attention")
    assert typed.tests[0].aspects[1].message == "overflow" and typed.tests[1].needs_regrade
    assert typed.tests[0].aspects is not None and typed.tests[1].aspects is None
    assert typed == saved and dict(saved.to_json(), digest=raw["digest"]) == raw  # the bytes it signs
    assert store.load_result(tmp_path, "alice", "01_attention") == (saved, None)
    with pytest.raises(AttributeError):
        typed.tests[0].points = 2.0  # frozen


MAIN_FOLDER = Path(__file__).parent / "data" / "results-4677f98"


def test_a_results_folder_written_before_the_types_reads_unchanged_and_resume_regrades_nobody(tmp_path, monkeypatch):
    """tests/grader/data/results-4677f98: `grade SUBMISSIONS --out RESULTS --lesson 01_attention` as main wrote it at
    4677f98 (before the adapters took typed results), with the results key it was signed with: alice's
    mask aligned top-left (an aspect lost), bob who never handed it in, carol's unstable softmax, a cell
    that raises and a submission time. Every result reads, is written back to the same bytes, and
    `grade --resume` reuses all three. What the grader's own code hashes into each lesson's fingerprint
    (lesson_fingerprint: checks, grade.py, results.py, the sandbox) is pinned to the stored one: a new
    version of the checks regrades by design; the stored format must not."""
    from autograder import grade as grading

    folder = tmp_path / "term"
    shutil.copytree(MAIN_FOLDER, folder)
    key = folder / "results.key"
    key.chmod(0o600)
    monkeypatch.setenv(store.KEY_ENV, str(key))
    out = folder / "RESULTS"
    term = store.load_term(out, report.lesson_tests())
    assert (term.refused, term.lines) == ({}, []) and [r.student for r in term.results] == ["alice", "bob", "carol"]
    for r in term.results:
        text = store.result_path(out, r.student, r.lesson).read_text()
        assert json.dumps(dict(r.to_json(), digest=json.loads(text)["digest"]), indent=1) + "\n" == text
    run_json = (out / store.STORE / store.RUN_FILE).read_text()
    assert json.dumps(store.read_run(out).to_json(), indent=1) + "\n" == run_json
    carol = term.results[2]
    assert carol.submitted_at and carol.errors and carol.tests[0].aspects[1].passed is False
    stored_grader = {r.grader for r in term.results}
    assert len(stored_grader) == 1
    monkeypatch.setattr(grading, "lesson_fingerprint", lambda *args: next(iter(stored_grader)))
    from autograder.config import RunConfig

    run = grading.grade(RunConfig(out, folder / "SUBMISSIONS", lessons=("01_attention",), resume=True, progress=False))
    assert (run["graded"], run["reused"]) == (0, 3), run["reasons"]
    assert [r.to_json() for r in run["results"]] == [r.to_json() for r in term.results]


@pytest.mark.parametrize(
    "damage, field",
    [
        ({"shard": "first"}, "shard"),
        ({"manifest": 3}, "manifest"),
        ({"lessons": "01_attention"}, "lessons"),
        ({"partial": [None]}, "partial"),
    ],
)
def test_a_damaged_run_record_is_one_line_naming_the_file_and_field(tmp_path, damage, field):
    store.write_run(tmp_path, "0/2", None, {"02_heads", "01_attention"})
    assert store.read_run(tmp_path) == store.Run("0/2", None, ("01_attention", "02_heads"))
    path = tmp_path / store.STORE / store.RUN_FILE
    path.write_text(json.dumps(json.loads(path.read_text()) | damage))
    with pytest.raises(store.UsageError, match=f"^{re.escape(str(path))} is damaged \\({field} .*grade again$"):
        store.read_run(tmp_path)
