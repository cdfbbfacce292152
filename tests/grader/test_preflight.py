"""What grade and gradescope-bundle refuse before any work: a reference (solutions/, the stand-ins the
checks send into the sandbox) that disagrees with PyTorch (autograder/selfcheck.py), and a
--gradebook that could not be written once the results are."""

import importlib
import json
import linecache
import os
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest

import solutions.attention
from autograder import selfcheck
from autograder.__main__ import main
from autograder.checking import LESSONS
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import graded_names

LESSON = "01_attention"
REPO = selfcheck.__file__.rsplit("/autograder/", 1)[0]


def wrong_softmax(x, axis=-1):  # the classic mistake: always the last axis
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    release(root / "release", [LESSON])
    (root / "subs" / "ann" / LESSON).mkdir(parents=True)
    shutil.copy(root / "release" / LESSON / f"{LESSON}.ipynb", root / "subs" / "ann" / LESSON)
    return root / "subs"


def one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_every_graded_name_and_every_stand_in_is_probed():
    from autograder.checking import stand_ins

    for lesson, module in LESSONS.items():
        probed = {target for target, _ in selfcheck.PROBES[lesson]}
        assert {f"solutions.{module}.{name}" for name in graded_names(lesson)} <= probed, lesson
    every = {target for probes in selfcheck.PROBES.values() for target, _ in probes}
    helpers = {
        name
        for name, value in vars(stand_ins).items()
        if callable(value) and getattr(value, "__module__", "") == stand_ins.__name__
    }
    assert {f"{selfcheck.STAND_INS}.{name}" for name in helpers} <= every


def test_the_reference_as_committed_passes():
    for lesson in LESSONS:
        start = time.process_time()
        selfcheck.check_reference([lesson])
        print(f"{lesson}: self-check {time.process_time() - start:.3f} s of CPU")


def _survey(lesson):
    """Each mutant and correct variant of tests/harness/mutants.py in place of the reference it mimics:
    {"refused": {name: [what]}, "passed": {name: [what]}, "variants_refused": [what: message]}."""
    from tests.harness import mutants
    from tests.harness.lessons import fresh_namespace

    ref = importlib.import_module(f"solutions.{LESSONS[lesson]}")
    base, out = fresh_namespace(lesson), {"refused": {}, "passed": {}, "variants_refused": []}
    module = mutants.for_lesson(lesson)
    for kind in ("VARIANTS", "MUTANTS"):
        for name, items in getattr(module, kind, {}).items():
            for what, *_, code in items:
                ns, filename = dict(base), f"<reference {name}: {what}>"
                linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
                exec(compile(code, filename, "exec"), ns)
                saved = getattr(ref, name)
                setattr(ref, name, ns[name])
                try:
                    selfcheck.check_reference([lesson])
                    why = None
                except selfcheck.ReferenceBroken as e:
                    why = str(e)
                finally:
                    setattr(ref, name, saved)
                if kind == "VARIANTS":
                    if why:
                        out["variants_refused"].append(f"{name} ({what}): {why}")
                else:
                    out["refused" if why else "passed"].setdefault(name, []).append(what)
                    assert not why or f"lesson {lesson}: the reference solutions." in why, why  # or what uses it
    return out


def _survey_each(folder, lessons):
    """Each lesson's _survey in a process of its own, forked from this one once it has imported the course:
    folder/<lesson>.json, and what the process wrote to stdout and stderr in folder/<lesson>.log. One interpreter's
    imports, not one per lesson, for the same isolation: a mutant may leave torch or Triton changed for the next."""
    for lesson in lessons:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log = os.open(f"{folder}/{lesson}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                survey = _survey(lesson)
                with open(f"{folder}/{lesson}.json", "w") as f:
                    json.dump(survey, f)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status:
            with open(f"{folder}/{lesson}.log", "a") as f:
                f.write(f"\n(the process ended with exit status {status})\n")


@pytest.fixture(scope="module")
def surveys(tmp_path_factory, request):
    """{lesson: _survey(lesson), or why there is none} for the lessons of the selected tests, made by `python -m
    tests.grader.test_preflight FOLDER LESSON...`: a fresh interpreter, not this one, which holds what other tests
    left. There PyTorch looks for a GPU through NVML, which leaves CUDA free for the forked processes."""
    folder = tmp_path_factory.mktemp("surveys")
    lessons = [
        item.callspec.params["lesson"]
        for item in request.session.items
        if item.originalname == "test_wrong_references_are_refused_and_correct_variants_pass"
    ]
    p = subprocess.run(
        [sys.executable, "-m", "tests.grader.test_preflight", str(folder), *lessons],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env=dict(os.environ, PYTORCH_NVML_BASED_CUDA_CHECK="1"),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return {
        lesson: json.loads((folder / f"{lesson}.json").read_text())
        if (folder / f"{lesson}.json").exists()
        else (folder / f"{lesson}.log").read_text()[-3000:]
        for lesson in lessons
    }


@pytest.mark.slow
@pytest.mark.parametrize("lesson", list(LESSONS))
def test_wrong_references_are_refused_and_correct_variants_pass(surveys, lesson):
    """Known-wrong answers (tests/harness/mutants.py) put in place of the reference: most are refused, naming
    the lesson and the function; the correct variants (other styles, float64 inside) all pass.
    Those that pass are wrong only in how they compute (memory, tiling, Triton): evidence that
    the grader gathers from students, which a reference's values cannot show. In a process of
    its own (surveys): a mutant may leave torch or Triton changed for the next."""
    got = surveys[lesson]
    assert isinstance(got, dict), f"the survey of {lesson} did not finish: {got}"
    assert got["variants_refused"] == []
    mistakes = mutants.for_lesson(lesson).MUTANTS
    for name in graded_names(lesson):
        refused, passed = len(got["refused"].get(name, [])), got["passed"].get(name, [])
        # a mistake of how it computes declares the aspect it costs (tiled, never keeps P, by hand): the rest change
        # values, and most of each name's mistakes are of that kind
        how = {m[0] for m in mistakes.get(name, []) if getattr(m, "aspect", "")}
        values = [m for m in passed if m not in how]
        assert refused > len(values), (name, values)
    print(lesson, {name: f"{len(r)} refused" for name, r in got["refused"].items()}, "passed:", got["passed"])


def test_grade_and_bundle_refuse_a_changed_reference(submissions, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(solutions.attention, "softmax", wrong_softmax)
    assert main(["grade", str(submissions), "--out", str(tmp_path / "results"), "--quiet"]) == 2
    line = one_error_line(capsys)
    assert LESSON in line and "solutions.attention.softmax" in line and "nothing was graded" in line
    assert not (tmp_path / "results" / "grades.csv").exists()
    assert main(["gradescope-bundle", "--lesson", LESSON, "--out", str(tmp_path / "a.zip")]) == 2
    assert one_error_line(capsys) == line and not (tmp_path / "a.zip").exists()
    monkeypatch.undo()  # the honest reference: the bundle is written
    assert main(["gradescope-bundle", "--lesson", LESSON, "--out", str(tmp_path / "a.zip")]) == 0
    assert (tmp_path / "a.zip").exists()


def test_a_cloned_course_with_an_edited_reference_is_refused(submissions, tmp_path):
    """The issue's case: a copy of the course whose solutions/attention.py was edited, run from its folder."""
    clone = tmp_path / "clone"
    for part in ("autograder", "solutions", f"lessons/{LESSON}"):
        shutil.copytree(f"{REPO}/{part}", clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    source = clone / "solutions" / "attention.py"
    text = source.read_text()
    assert "np.sum(e, axis=axis, keepdims=True)" in text
    source.write_text(text.replace("np.sum(e, axis=axis, keepdims=True)", "np.sum(e, axis=-1, keepdims=True)"))
    env = dict(os.environ, PYTHONPATH=str(clone))
    for args in (
        ["grade", str(submissions), "--out", str(tmp_path / "results")],
        ["gradescope-bundle", "--lesson", LESSON, "--out", str(tmp_path / "a.zip")],
    ):
        p = subprocess.run(
            [sys.executable, "-m", "autograder", *args], capture_output=True, text=True, cwd=clone, env=env, timeout=300
        )
        assert p.returncode == 2, p.stderr[-2000:]
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and "lesson 01_attention" in err[0] and "solutions.attention.softmax" in err[0], err
    assert not (tmp_path / "results" / "grades.csv").exists() and not (tmp_path / "a.zip").exists()


def test_a_gradebook_in_a_missing_folder_is_refused_before_grading(submissions, tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "gradebook.db"
    assert main(["grade", str(submissions), "--out", str(tmp_path / "results"), "--gradebook", str(missing)]) == 2
    assert "does not exist" in one_error_line(capsys) and not (tmp_path / "results").exists()
    assert main(["grade", str(submissions), "--out", str(tmp_path / "results"), "--gradebook", str(tmp_path)]) == 2
    assert "is a folder" in one_error_line(capsys)
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "merged"), "--gradebook", str(missing)]) == 2
    assert "does not exist" in one_error_line(capsys) and not (tmp_path / "merged").exists()


if __name__ == "__main__":
    _survey_each(sys.argv[1], sys.argv[2:])
