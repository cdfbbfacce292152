"""python -m autograder audit: the known mistakes and variants against a lesson's visible and hidden tests."""

import json
import subprocess
import sys
from pathlib import Path

from autograder import audit
from autograder import notebook as nbk
from autograder.checking import mistakes

REPO = Path(__file__).resolve().parents[2]
LESSON = "01_attention"
# Counted from the definitions, so adding a known mistake to lesson 01 does not break these tests.
N_SOFTMAX = len(mistakes.mutants(LESSON)["softmax"])
N_CAUSAL = len(mistakes.mutants(LESSON)["causal_mask"])
N_ALL = sum(len(ms) for ms in mistakes.mutants(LESSON).values())


def _audit(*args):
    return subprocess.run(
        [sys.executable, "-m", "autograder", "audit", LESSON, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _row(out, name):
    """{column: value} of one function's row of the counts table."""
    [row] = [line for line in out.splitlines() if line.startswith(f"{name} ")]
    cells = row.split()
    return {"function": cells[0], **dict(zip(audit.COLUMNS, cells[1:]))}


def test_audit_of_the_lesson_catches_every_mistake():
    run = _audit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert _row(run.stdout, "softmax") == {
        "function": "softmax",
        "mistakes": str(N_SOFTMAX),
        "caught": str(N_SOFTMAX),
        "hidden-only": "0",
        "unnamed": "0",
        "not caught": "0",
        "misblames": "0",
        "variants losing": "0/2",
    }
    assert run.stdout.rstrip().endswith("nothing to fix (exit 0)")


def test_audit_reports_a_visible_test_that_checks_nothing(tmp_path):
    """An instructor's edit that empties softmax's visible test: every softmax mistake is NOT CAUGHT, named
    with the hidden check's verdict, and the command fails; the other functions keep their row."""
    nb = nbk.read(nbk.lesson_path(LESSON))
    [cell] = [c for c in nbk.code_cells(nb) if nbk.is_test(c) and nbk.grade_id(c) == "test_softmax"]
    nbk.set_source(cell, "assert True  # checks nothing\n")
    edited = tmp_path / f"{LESSON}.ipynb"
    edited.write_text(json.dumps(nb))
    run = _audit("--notebook", str(edited))
    assert run.returncode == 1, run.stdout + run.stderr
    assert _row(run.stdout, "softmax")["caught"] == "0"
    assert _row(run.stdout, "softmax")["not caught"] == str(N_SOFTMAX)
    assert "NOT CAUGHT  no max shift: its visible test passes; the hidden check catches it" in run.stdout
    assert _row(run.stdout, "causal_mask")["caught"] == str(N_CAUSAL)
    assert run.stdout.rstrip().endswith(f"{N_SOFTMAX} to fix (exit 1)")


def _results(lesson, **own):
    """Audit results where every mistake's own visible test fails naming its keyword, every variant keeps
    every mark and the hidden check catches what it is asked about; own: {what: own test's message}."""
    out = {("<solutions>", ""): {}}
    for name, ms in mistakes.mutants(lesson).items():
        for m in ms:
            message = own.get(m.what, f"AssertionError: {m.keyword}")
            out[name, m.what] = {f"test_{name}": message} if message else {}
            if m.keyword.lower() not in message.lower():
                out[name, m.what][audit.HIDDEN + name] = f"0: {m.keyword}"
    for name, vs in mistakes.variants(lesson).items():
        out.update({(name, what): {} for what, _ in vs})
    return out


def test_a_visible_test_that_fails_without_naming_the_mistake_does_not_catch_it():
    judged, problems = audit.judge(LESSON, _results(LESSON, **{"no max shift": "AssertionError: wrong values"}))
    assert ("UNNAMED", "no max shift") == judged["softmax"][0][:2]
    assert len(problems) == 1 and "'no max shift' UNNAMED" in problems[0] and "wrong values'" in problems[0]
    assert (
        _row(
            "\n".join(audit.table(LESSON, _results(LESSON, **{"no max shift": "AssertionError: wrong values"}))),
            "softmax",
        )["unnamed"]
        == "1"
    )


def test_only_a_declared_escape_is_left_to_the_hidden_check(monkeypatch):
    escaped = _results(LESSON, **{"no max shift": "", "float mask": ""})
    judged, problems = audit.judge(LESSON, escaped)
    assert {p.split(":")[0] for p in problems} == {"softmax", "causal_mask"}, problems
    monkeypatch.setattr(mistakes, "hidden_only", lambda lesson: {"no max shift": "a reason"})
    judged, problems = audit.judge(LESSON, escaped)
    assert ("hidden-only", "no max shift") == judged["softmax"][0][:2]
    assert [p.split(":")[0] for p in problems] == ["causal_mask"], problems  # the undeclared one still fails
    escaped["softmax", "no max shift"][audit.HIDDEN + "softmax"] = ""  # the hidden check misses it too
    assert any("'no max shift' HIDDEN-ONLY, HIDDEN MISSES" in p for p in audit.judge(LESSON, escaped)[1])


def test_hidden_only_is_capped_at_five_percent(monkeypatch):
    """Lesson 01 has 20 to 39 mistakes: one may be declared hidden-only, two may not."""
    assert 20 <= N_ALL < 40
    monkeypatch.setattr(mistakes, "hidden_only", lambda lesson: {"no max shift": "a reason"})
    assert audit.judge(LESSON, _results(LESSON))[1] == []
    monkeypatch.setattr(mistakes, "hidden_only", lambda lesson: {"no max shift": "a reason", "float mask": "another"})
    [problem] = audit.judge(LESSON, _results(LESSON))[1]
    assert f"HIDDEN_ONLY declares 2 of {N_ALL} mistakes: at most 5% (1)" in problem


def test_audit_refuses_a_missing_notebook(tmp_path):
    run = _audit("--notebook", str(tmp_path / "nope.ipynb"))
    assert run.returncode == 2 and "no such file" in run.stderr


def test_audit_refuses_another_lessons_notebook():
    run = _audit("--notebook", str(nbk.lesson_path("02_heads")))
    assert run.returncode == 2 and "no answer cell for softmax" in run.stderr and "Traceback" not in run.stderr, (
        run.stderr
    )


# The audit command's fast run (autograder.audit.run_lesson(fast=True)), which tests/harness/visible.py asserts on,
# must give what the exact run gives: every visible test's verdict and every hidden check's.
def test_the_fast_run_gives_the_exact_runs_verdicts():
    from autograder import audit

    assert audit.run_lesson(LESSON, hidden=True, fast=True) == audit.run_lesson(LESSON, hidden=True)


def test_the_fast_run_sees_a_mistake_that_changes_a_module(monkeypatch):
    """A causal_mask that also replaces np.swapaxes breaks scaled_dot_product_attention's visible test, which
    never names causal_mask: the fast run must not stop after causal_mask's own test, as it does when
    nothing but its names changed."""
    from autograder import audit
    from autograder.checking import mistakes

    solution = (
        "def causal_mask(n_queries, n_keys=None):\n    n_keys = n_queries if n_keys is None else n_keys\n"
        "    return np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries)\n"
    )
    planted = {
        "causal_mask": [
            mistakes.Mistake("right, but np.swapaxes replaced", "mask", solution + "np.swapaxes = lambda a, i, j: a\n"),
            mistakes.Mistake("right", "mask", solution),
        ]
    }
    monkeypatch.setattr(mistakes, "mutants", lambda lesson: planted)
    monkeypatch.setattr(mistakes, "variants", lambda lesson: {})
    fast, exact = audit.run_lesson(LESSON, fast=True), audit.run_lesson(LESSON)
    assert "test_scaled_dot_product_attention" in exact["causal_mask", "right, but np.swapaxes replaced"]
    assert fast == exact


def test_a_cells_reads_are_what_it_may_take_from_earlier_cells():
    """The fast run's dependencies, by Python's scoping: a function's locals are its own, a name the cell binds
    on every path before reading it is its own, what a function reads when called counts for its callers."""
    from autograder import audit

    reads, binds, calls = audit._names(
        "def f(q):\n    out = q * scale\n    return out\n"  # q, out local; scale read when called
        "x = f(1)\nprint(x)\n"  # x bound before it is read
        "if flag:\n    y = 1\nelse:\n    y = 2\nprint(y)\n"  # y bound on both paths
        "if flag:\n    z = 1\nprint(z)\n"  # z maybe not: an earlier cell's z
        "try:\n    w = g()\nexcept ValueError as e:\n    raise AssertionError(e)\nprint(w)\n"
        "with ctx() as c:\n    v = 1\nprint(c, v)\n"  # the context may swallow the body's error
        "record = lambda *a: launches.append(a)\n"
    )
    assert reads == {"scale", "print", "flag", "z", "g", "ValueError", "AssertionError", "ctx", "v", "launches"}
    assert binds == {"f", "x", "y", "z", "w", "e", "c", "v", "record"}
    assert calls["f"] == ({"scale"}, set()) and calls["record"] == ({"launches"}, set())
    assert audit._names("def f():\n    global g\n    g = 1\n")[2]["f"] == (set(), {"g"})
    assert "*" in audit._names("print(globals()['x'])")[0]
    assert audit._called({"h"}, set(), {"h": ({"f"}, set()), "f": ({"scale"}, {"g"})}) == ({"h", "f", "scale"}, {"g"})


def test_in_is_read_only_through_the_lessons_own_rules(tmp_path):
    from autograder import audit

    (tmp_path / "rules.py").write_text("def check(cells):\n    return None\n")
    assert audit._in_reads("import rules\nproblem = rules.check(In)\n", tmp_path) == [("rules", "check")]
    assert audit._in_reads("x = 1\n", tmp_path) == []
    assert audit._in_reads("import rules\nproblem = rules.check(In)\nprint(In[-1])\n", tmp_path) is None
    assert audit._in_reads("import other\nproblem = other.check(In)\n", tmp_path) is None  # not the lesson's file
    assert audit._in_reads("import rules\nrules = fake\nproblem = rules.check(In)\n", tmp_path) is None


def test_a_later_cell_may_start_from_another_random_state_only_when_it_seeds_it_first():
    from autograder import audit

    assert audit._seeds_first("torch.manual_seed(1)\nx = torch.randn(3)\n")
    assert audit._seeds_first("if HAS_TRITON:\n    torch.manual_seed(4)\nelse:\n    print('no Triton')\n")
    assert not audit._seeds_first("x = torch.randn(3)\ntorch.manual_seed(1)\n")
    assert not audit._seeds_first("if HAS_TRITON:\n    torch.manual_seed(4)\nelse:\n    print(torch.randn(1))\n")
    # rng hashes after each cell: the second cell draws nothing, the third draws after seeding, the fourth does not seed
    plan = {"states": [("a",), ("a",), ("b",), ("c",)], "seeds": [False, False, True, False]}
    assert audit._reseeded(plan, 0)
    plan["seeds"][2] = False
    assert not audit._reseeded(plan, 0)
    assert not audit._reseeded(plan, 2) and audit._reseeded(plan, 3)
