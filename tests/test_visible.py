"""Visible tests teach before grading: every known-wrong answer (tests/mutants) fails its own
function's visible test in the RELEASED notebook, with a message that names the same mistake as
the hidden check (its keyword), and no other function's visible test fails (no misblame); every
correct variant passes them all.

A lesson runs once, cell by cell, with the solutions; just before each answer cell it forks one
child per mutant and variant of that function, which runs the rest of the notebook (demo cells
skipped, the visible test cells recorded) with that answer instead.

    .venv/bin/python -m tests.test_visible [LESSON ...]   # the catch rate and misblame per lesson
"""
import contextlib
import functools
import io
import json
import os
import re
import signal
import sys
import warnings

import pytest

from autograder import notebook as nbk
from autograder.release import student_copy
from tests import mutants
from tests.lessons import LESSONS, fill

MAX_HIDDEN_ONLY = 0.05  # the share of a lesson's mutants that only the hidden checks may catch
CHILD_SECONDS = 120


def _cells(lesson):
    """[(kind, grade_id, code)] of the released notebook with the solutions filled in; kind is
    answer, test or code (provided and setup cells). Demo cells are left out, magics dropped."""
    nb = fill(student_copy(nbk.read(nbk.lesson_path(lesson))), lesson)
    out = []
    for cell in nbk.code_cells(nb):
        if nbk.is_demo(cell):
            continue
        kind = "answer" if nbk.is_answer(cell) else "test" if nbk.is_test(cell) else "code"
        code = re.sub(r"^\s*[%!].*$", "", nbk.source(cell), flags=re.M)
        out.append((kind, nbk.grade_id(cell), code))
    return out


def _run(cells, ns, failures):
    """Run cells in ns; a test cell's failure is recorded as {grade_id: message}, others raise.
    A warning counts as a failure too: plain nbgrader zeroes a cell that writes to stderr."""
    for kind, gid, code in cells:
        ns.setdefault("In", [""]).append(code)  # IPython's In: the cells run so far, which source_rules reads
        if kind == "test":
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    exec(compile(code, f"<{gid}>", "exec"), ns)
                if caught:
                    failures[gid] = f"{caught[0].category.__name__} written to stderr: {caught[0].message}"[:2000]
            except Exception as e:  # noqa: BLE001 - any exception fails a visible test
                failures[gid] = f"{type(e).__name__}: {e}"[:2000]
        else:
            exec(compile(code, f"<{gid or 'cell'}>", "exec"), ns)


GRADER_MODULES = ("sandbox.helpers", "autograder.sandbox.helpers", "autograder.checks.stand_ins")


def _child(cells, ns, code, gid):
    """In a forked child: this answer instead of the solution, then the rest of the notebook."""
    for module in GRADER_MODULES:  # a student's kernel has none of the grader's code loaded (earlier tests did)
        sys.modules.pop(module, None)
    failures = {}
    try:
        ns["In"] = [*ns.get("In", [""]), code]
        exec(compile(code, f"<{gid}>", "exec"), ns)
        _run(cells, ns, failures)
    except Exception as e:  # noqa: BLE001 - a provided cell broke: blame the answer's own test
        failures.setdefault(f"test_{gid}", f"a later cell raised {type(e).__name__}: {e}"[:2000])
    return failures


def _fork(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(CHILD_SECONDS)
        try:
            sys.stdout = sys.stderr = open(os.devnull, "w")
            payload = json.dumps(fn()).encode()
        except BaseException as e:  # noqa: BLE001
            payload = json.dumps({"<harness>": repr(e)}).encode()
        os.write(w, payload) if len(payload) < 60_000 else os.write(w, json.dumps({"<harness>": "too long"}).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"<harness>": "the child died (a hang or a crash)"}


@functools.lru_cache(maxsize=None)
def run_lesson(lesson):
    """{(name, what): {visible test grade_id: failure message}} for every mutant and variant."""
    import torch
    torch.set_num_threads(1)
    module = mutants.for_lesson(lesson)
    answers = {n: [("mutant", m[0], m[2]) for m in ms] for n, ms in module.MUTANTS.items()}
    for n, vs in getattr(module, "VARIANTS", {}).items():
        answers.setdefault(n, []).extend(("variant", v[0], v[1]) for v in vs)
    cells = _cells(lesson)
    ns = {"__name__": "__main__"}
    results, baseline = {}, {}
    cwd = os.getcwd()
    os.chdir(nbk.lesson_path(lesson).parent)  # data files are read relative to the notebook
    sys.path.insert(0, str(nbk.lesson_path(lesson).parent))  # and its modules imported from there, as in Jupyter
    quiet = contextlib.redirect_stdout(io.StringIO())
    try:
        with quiet:
            for i, (kind, gid, code) in enumerate(cells):
                if kind == "answer":
                    for _, what, answer in answers.get(gid, []):
                        results[gid, what] = _fork(lambda: _child(cells[i + 1:], ns, answer, gid))
                _run([(kind, gid, code)], ns, baseline)
    finally:
        os.chdir(cwd)
        sys.path.remove(str(nbk.lesson_path(lesson).parent))
    results["<solutions>", ""] = baseline
    return results


def _cases(kind):
    return mutants.cases(kind, LESSONS)


def _hidden_only(lesson):
    return getattr(mutants.for_lesson(lesson), "HIDDEN_ONLY", {})


def verdict(lesson, name, mutant):
    """(caught, misblamed): caught when the own visible test fails naming the keyword."""
    what, keyword = mutant[0], mutant[1]
    failures = run_lesson(lesson)[name, what]
    own = failures.get(f"test_{name}", "")
    caught = keyword.lower() in own.lower()
    misblamed = sorted(t for t in failures if t != f"test_{name}")
    return caught, own, misblamed, failures


pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lesson", LESSONS)
def test_solutions_pass_every_visible_test(lesson):
    assert run_lesson(lesson)["<solutions>", ""] == {}


@pytest.mark.parametrize("lesson, name, mutant", _cases("MUTANTS"))
def test_mutant_fails_its_own_visible_test_naming_the_mistake(lesson, name, mutant):
    caught, own, misblamed, failures = verdict(lesson, name, mutant)
    assert not misblamed, f"'{mutant[0]}' in {name} makes other visible tests fail: {failures}"
    if mutant[0] in _hidden_only(lesson):
        return
    assert own, f"'{mutant[0]}' passes the visible test of {name}"
    assert caught, f"the visible test of {name} fails for '{mutant[0]}' without naming {mutant[1]!r}: {own}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_few_mutants_are_hidden_only(lesson):
    module = mutants.for_lesson(lesson)
    total = sum(len(v) for v in module.MUTANTS.values())
    known = {m[0] for ms in module.MUTANTS.values() for m in ms}
    hidden = _hidden_only(lesson)
    assert set(hidden) <= known, f"HIDDEN_ONLY names unknown mutants: {set(hidden) - known}"
    assert all(isinstance(why, str) and why.strip() for why in hidden.values()), "each needs a one-line reason"
    assert len(hidden) <= MAX_HIDDEN_ONLY * total, f"{len(hidden)} of {total} mutants are hidden-only (max 5%)"


@pytest.mark.parametrize("lesson, name, variant", _cases("VARIANTS"))
def test_correct_variant_passes_every_visible_test(lesson, name, variant):
    assert run_lesson(lesson)[name, variant[0]] == {}


def summary(lessons):
    for lesson in lessons:
        module = mutants.for_lesson(lesson)
        rows = [(n, m) for n, ms in module.MUTANTS.items() for m in ms]
        caught = misblame = 0
        for name, m in rows:
            ok, own, blamed, _ = verdict(lesson, name, m)
            caught += ok
            misblame += bool(blamed)
            if not ok or blamed:
                print(f"  {name}: '{m[0]}' " + ("" if ok else f"NOT CAUGHT (own: {own[:100]!r}) ")
                      + (f"MISBLAME {blamed}" if blamed else ""))
        bad_variants = [w for (n, w), f in run_lesson(lesson).items() if f and n != "<solutions>"
                        and any(v[0] == w for v in getattr(module, "VARIANTS", {}).get(n, []))]
        print(f"{lesson}: caught {caught}/{len(rows)} ({100 * caught / max(len(rows), 1):.0f}%), "
              f"misblame {misblame}, hidden-only {len(_hidden_only(lesson))}, variants failing {len(bad_variants)}")


if __name__ == "__main__":
    summary(sys.argv[1:] or LESSONS)
