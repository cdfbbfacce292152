"""The lessons' machinery: notebooks in sync with solutions/, manifests read once and picked up everywhere, what a
release and a grading run give each lesson. Each lesson's own notebook tests: tests/harness/notebooks.py."""

import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from autograder import lessons
from autograder import notebook as nbk
from autograder.release import TRIPWIRES, TRITON_FIT, lesson_files, release
from autograder.sync import sync
from tests.harness.lessons import LESSONS


def test_notebooks_are_in_sync_with_solutions():
    assert sync(check=True) == [], "run `python -m autograder sync` and commit"


@pytest.mark.parametrize("lesson", LESSONS)
def test_students_can_tell_a_demonstration(lesson):
    """Grading skips demo cells: each starts with DEMO_HEADER (sync writes it from the tag), and the lesson's
    "how to work" paragraph says what that means for answers."""
    nb = nbk.read(nbk.lesson_path(lesson))
    assert all(nbk.source(c).startswith(nbk.DEMO_HEADER + "\n") for c in nbk.code_cells(nb) if nbk.is_demo(c))
    how = next(nbk.source(c) for c in nb["cells"] if "**How to work:**" in nbk.source(c))
    assert "`" + nbk.DEMO_HEADER.split(":")[0] + "`" in how and "no answer may use a name they define" in how
    assert nbk.with_demo_header(nbk.with_demo_header("y = 2")) == nbk.DEMO_HEADER + "\ny = 2"  # once


# ---- a lesson is described once (lessons/NN_name/lesson.toml) ------------------------------------


def missing_pieces(lesson, root=nbk.LESSONS_DIR):
    """What a lesson with a manifest lacks, in words, of the five pieces CONTRIBUTING.md names: its solutions module
    and each graded name there; its notebook with an answer and a test cell (the manifest's points) per graded name,
    and its data files; its grader package (autograder/lessons/<module>/: checks with a check per graded name,
    mistakes with mutants and variants per graded name, probes); and its test file tests/lessons/test_<module>.py,
    which names the lesson (LESSON). root: the lessons' folder; the other pieces are looked for beside it."""
    from autograder.checking import mistakes

    manifest = lessons.read(lesson, root)
    module, graded = manifest["solutions"], lessons.points(lesson, root)
    missing = []
    try:
        solutions = importlib.import_module(f"solutions.{module}")
        missing += [f"solutions/{module}.py defines no {n}" for n in graded if not hasattr(solutions, n)]
    except ImportError:
        missing.append(f"no solutions module solutions/{module}.py")
    try:
        nb = nbk.read(nbk.lesson_path(lesson, root))
        ids = {nbk.grade_id(c) for c in nbk.code_cells(nb) if nbk.is_answer(c)}
        tests = dict(nbk.graded_tests(nb))
        missing += [f"the notebook has no answer cell {n}" for n in graded if n not in ids]
        missing += [
            f"the notebook's test_{n} has {tests.get(f'test_{n}')} points, the manifest {p}"
            for n, p in graded.items()
            if tests.get(f"test_{n}") != p
        ]
        missing += [
            f"the notebook grades {t}, which the manifest does not name"
            for t in tests
            if t.removeprefix("test_") not in graded
        ]
        beside = set(lesson_files(lesson, root))  # the manifest's data, and the course's modules its cells import
    except nbk.NotebookError:
        missing.append(f"no notebook lessons/{lesson}/{lesson}.ipynb")
        beside = set(manifest["data"])
    try:
        checks = importlib.import_module(f"autograder.lessons.{module}.checks").CHECKS
        missing += [f"autograder/lessons/{module}/checks.py has no check of {n}" for n in graded if n not in checks]
    except ImportError:
        missing.append(f"no checks module autograder/lessons/{module}/checks.py")
    if mistakes.for_lesson(lesson) is None:
        missing.append(f"no mistakes module autograder/lessons/{module}/mistakes.py")
    else:
        known, variants = mistakes.mutants(lesson), mistakes.variants(lesson)
        missing += [f"autograder/lessons/{module}/mistakes.py has no mutant of {n}" for n in graded if not known.get(n)]
        missing += [
            f"autograder/lessons/{module}/mistakes.py has no variant of {n}" for n in graded if not variants.get(n)
        ]
    course = Path(root).resolve().parent
    for piece in ("__init__.py", "probes.py"):
        if not (course / "autograder" / "lessons" / module / piece).is_file():
            missing.append(f"no autograder/lessons/{module}/{piece}")
    test_file = course / "tests" / "lessons" / f"test_{module}.py"
    if not test_file.is_file():
        missing.append(f"no test file tests/lessons/test_{module}.py")
    elif f'LESSON = "{lesson}"' not in test_file.read_text(encoding="utf-8"):
        missing.append(f'tests/lessons/test_{module}.py does not say LESSON = "{lesson}"')
    folder = Path(root) / lesson
    extra = {p.name for p in folder.iterdir() if p.is_file()} - {f"{lesson}.ipynb", lessons.MANIFEST, *beside}
    missing += [f"{lesson}/{name} is not in the manifest's data" for name in sorted(extra)]
    return missing


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_has_every_piece(lesson):
    assert missing_pieces(lesson) == []


def test_every_lesson_folder_has_a_manifest():
    assert nbk.lesson_names() == [x for x in nbk.lesson_names() if x in LESSONS], (
        "a lesson notebook without lesson.toml"
    )


def toy_lesson(root, graded='[graded.toy_fn]\npoints = 2\ncontract = "Does the toy thing."\n', extra=""):
    folder = Path(root) / "99_toy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lessons.MANIFEST).write_text(
        f'title = "A toy"\nsummary = "Nothing."\nsolutions = "toy"\nextras = ["gpu"]\n{extra}\n{graded}',
        encoding="utf-8",
    )
    return "99_toy"


def test_a_lesson_missing_its_pieces_is_listed(tmp_path):
    lesson = toy_lesson(tmp_path)
    (tmp_path / lesson / "notes.txt").write_text("stray")
    assert missing_pieces(lesson, tmp_path) == [
        "no solutions module solutions/toy.py",
        f"no notebook lessons/{lesson}/{lesson}.ipynb",
        "no checks module autograder/lessons/toy/checks.py",
        "no mistakes module autograder/lessons/toy/mistakes.py",
        "no autograder/lessons/toy/__init__.py",
        "no autograder/lessons/toy/probes.py",
        "no test file tests/lessons/test_toy.py",
        f"{lesson}/notes.txt is not in the manifest's data",
    ]
    # A real lesson's notebook, with the manifest's points changed and a graded name it lacks.
    real = (nbk.LESSONS_DIR / "01_attention" / lessons.MANIFEST).read_text(encoding="utf-8")
    (tmp_path / "01_attention").mkdir()
    (tmp_path / "01_attention" / "01_attention.ipynb").write_bytes(nbk.lesson_path("01_attention").read_bytes())
    (tmp_path / "01_attention" / lessons.MANIFEST).write_text(
        real.replace("points = 2", "points = 5", 1) + '\n[graded.lost]\npoints = 1\ncontract = "x"\n', encoding="utf-8"
    )
    found = missing_pieces("01_attention", tmp_path)
    assert "the notebook's test_softmax has 2.0 points, the manifest 5" in found
    assert {
        "solutions/attention.py defines no lost",
        "the notebook has no answer cell lost",
        "autograder/lessons/attention/checks.py has no check of lost",
        "autograder/lessons/attention/mistakes.py has no mutant of lost",
    } <= set(found)


def toy_notebook(folder):
    """A one-exercise notebook for the toy lesson: toy_fn's answer cell and its test cell (2 points)."""

    def cell(source, **nbgrader):
        return {
            "cell_type": "code",
            "execution_count": None,
            "id": nbgrader["grade_id"],
            "outputs": [],
            "metadata": {"nbgrader": dict(schema_version=3, locked=False, **nbgrader)},
            "source": source,
        }

    nbk.write(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [
                cell(
                    "def toy_fn():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n",
                    grade_id="toy_fn",
                    solution=True,
                    grade=False,
                ),
                cell("assert toy_fn() == 1\n", grade_id="test_toy_fn", solution=False, grade=True, points=2),
            ],
        },
        Path(folder) / "99_toy.ipynb",
    )


def test_a_new_lesson_is_picked_up_everywhere(tmp_path):
    """A throw-away lesson's manifest in a copy of the course: LESSONS, the tests' list, the book's
    list and Gradescope's extras all name it, its release and its grading get the data file it declares
    (and nothing else of its folder), and it is graded under the limits it sets, with nothing else edited."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "autograder", tmp_path / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tests" / "harness").mkdir(parents=True)
    (tmp_path / "book").mkdir()
    for rel in ("tests/__init__.py", "tests/harness/__init__.py", "tests/harness/lessons.py", "book/build.py"):
        shutil.copy(root / rel, tmp_path / rel)
    for lesson in LESSONS:
        shutil.copytree(
            root / "lessons" / lesson, tmp_path / "lessons" / lesson, ignore=shutil.ignore_patterns("*.ipynb")
        )
    lesson = toy_lesson(
        tmp_path / "lessons",
        extra='data = ["toy.npz"]',
        graded='[graded.toy_fn]\npoints = 2\ncontract = "Does the toy thing."\n\n'
        "[limits]\nmemory_mb = 4096\nnotebook_seconds = 900\n",
    )
    toy_notebook(tmp_path / "lessons" / lesson)
    (tmp_path / "lessons" / lesson / "toy.npz").write_bytes(b"toy data")
    (tmp_path / "lessons" / lesson / "notes.txt").write_text("the instructor's notes, not for students")
    probe = (
        "import json, os, sys, tempfile; sys.path.insert(0, 'book'); import build; from pathlib import Path; "
        "from autograder import checking, grade, release; "
        "from autograder.adapters import gradescope; import tests.harness.lessons as t; "
        "release.release('out', ['99_toy']); staged = grade.stage_data(['99_toy'], Path(tempfile.mkdtemp())); "
        "print(json.dumps([checking.LESSONS, t.LESSONS, build.manifests.catalogue(), gradescope.EXTRAS, "
        "sorted(os.listdir('out/99_toy')), staged, grade.lesson_limits('99_toy').to_json()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lessons_, tests_list, book, extras, released_files, staged, limits = json.loads(out.stdout.splitlines()[-1])
    assert lessons_["99_toy"] == "toy" and list(lessons_)[:-1] == LESSONS
    assert tests_list == LESSONS + ["99_toy"]
    assert book["99_toy"] == {"title": "A toy", "summary": "Nothing.", "graded": {"toy_fn": "Does the toy thing."}}
    assert extras["99_toy"] == ["gpu"]
    assert released_files == ["99_toy.ipynb", "check_submission.py", "toy.npz"] and staged == {"99_toy": ["toy.npz"]}
    from autograder.worker import DEFAULT_LIMITS

    assert limits == replace(DEFAULT_LIMITS, memory_mb=4096, notebook_seconds=900).to_json()


@pytest.mark.parametrize(
    "text, error",
    [
        ('title = "T"\nsummary = "S"\nsolutions = "toy"\n', "graded: missing"),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\ncolour = "red"\n[graded.f]\npoints = 1\ncontract = "c"\n',
            "colour: unknown key",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 0\ncontract = "c"\n',
            "graded.f.points: should be a positive number",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\ndata = ["gone.npz"]\n'
            '[graded.f]\npoints = 1\ncontract = "c"\n',
            "data: gone.npz is not a file",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 1\ncontract = "c"\n'
            '[needs.triton]\nnames = ["g"]\nreason = "r"\n',
            "needs.triton.names: g is not a graded name",
        ),
        ('title = "T\nsummary = "S"\n', "not valid TOML"),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 1\ncontract = "c"\n'
            "[limits]\nseconds = 5\n",
            "limits.seconds: unknown limit; a lesson may set memory_mb, cpu_seconds",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 1\ncontract = "c"\n'
            "[limits]\nmemory_mb = 0\n",
            "limits.memory_mb: should be a positive whole number, not 0",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 1\ncontract = "c"\n[limits]\n'
            'cell_seconds = "90"\n',
            "limits.cell_seconds: should be a positive whole number, not '90'",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\n[graded.f]\npoints = 1\ncontract = "c"\n[limits]\n'
            "call_seconds = true\n",
            "limits.call_seconds: should be a positive whole number, not True",
        ),
        (
            'title = "T"\nsummary = "S"\nsolutions = "toy"\nlimits = 3\n[graded.f]\npoints = 1\ncontract = "c"\n',
            "limits: should be a table",
        ),
    ],
)
def test_a_bad_manifest_gets_one_line_naming_the_file_and_the_key(tmp_path, text, error):
    (tmp_path / "99_toy").mkdir()
    (tmp_path / "99_toy" / lessons.MANIFEST).write_text(text, encoding="utf-8")
    with pytest.raises(lessons.LessonError) as e:
        lessons.read("99_toy", tmp_path)
    assert str(e.value).startswith(str(tmp_path / "99_toy" / lessons.MANIFEST)) and error in str(e.value)
    assert "\n" not in str(e.value)


# ---- what the manifest decides: the files beside a notebook, the limits, what a regrade depends on ----------


def copy_lessons(root, *names):
    """lessons/<name> for each name, copied under root (a course's lessons folder elsewhere)."""
    import shutil

    for name in names:
        shutil.copytree(nbk.LESSONS_DIR / name, Path(root) / name)
    return Path(root)


@pytest.fixture
def lessons_in(tmp_path, monkeypatch):
    """The lessons named, copied to tmp_path/lessons, where notebook paths (and so the manifests the grader
    reads) now point; edits to a manifest there are read afresh."""
    real = nbk.lesson_path

    def use(*names):
        root = copy_lessons(tmp_path / "lessons", *names)
        monkeypatch.setattr(nbk, "lesson_path", lambda lesson, r=root: real(lesson, r))
        return root

    yield use
    lessons.read.cache_clear()


def edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    lessons.read.cache_clear()


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    release(out, LESSONS)
    return out


def test_a_release_holds_exactly_what_the_manifest_declares(released, tmp_path):
    for lesson in LESSONS:
        want = (
            {f"{lesson}.ipynb", "check_submission.py", *lessons.read(lesson)["data"]}
            | ({TRIPWIRES.name} if lessons.forbids(lesson) else set())
            | (  # its visible tests switch off what it forbids
                {TRITON_FIT.name} if lesson in ("06_gpu", "09_flash_backward") else set()
            )
        )
        assert {p.name for p in (released / lesson).iterdir()} == want, lesson
    for module in (TRIPWIRES, TRITON_FIT):
        assert (released / "06_gpu" / module.name).read_bytes() == module.read_bytes()
    # A file the manifest does not declare stays in the course, and so does the manifest.
    root = copy_lessons(tmp_path / "lessons", "07_head_specialization")
    (root / "07_head_specialization" / "notes.txt").write_text("the instructor's notes")
    release(tmp_path / "out", ["07_head_specialization"], root)
    assert sorted(p.name for p in (tmp_path / "out" / "07_head_specialization").iterdir()) == [
        "07_head_specialization.ipynb",
        "check_submission.py",
        "induction_model.npz",
        "induction_model_gqa.npz",
    ]
    lessons.read.cache_clear()


def test_the_grader_gives_a_notebook_the_files_a_release_gives(tmp_path):
    from autograder.grade import stage_data

    staged = stage_data(["06_gpu", "07_head_specialization"], tmp_path)
    assert staged == {
        "06_gpu": sorted([TRIPWIRES.name, TRITON_FIT.name]),
        "07_head_specialization": sorted(lessons.read("07_head_specialization")["data"]),
    }
    assert sorted(p.name for p in (tmp_path / "07_head_specialization").iterdir()) == staged["07_head_specialization"]


def test_sync_keeps_the_lessons_copy_of_tripwires_equal_to_the_graders(tmp_path):
    import os

    root = copy_lessons(tmp_path / "lessons", "06_gpu")
    copy = root / "06_gpu" / TRIPWIRES.name
    assert not (nbk.LESSONS_DIR / "06_gpu" / TRIPWIRES.name).is_symlink(), "a plain file, written by sync"
    stale = [f"06_gpu: {TRIPWIRES.name} differs from autograder/sandbox/{TRIPWIRES.name}"]
    copy.write_text(TRIPWIRES.read_text(encoding="utf-8") + "\n# an edit made to the copy\n", encoding="utf-8")
    assert sync(["06_gpu"], check=True, root=root) == stale
    assert sync(["06_gpu"], root=root) == stale
    assert copy.read_bytes() == TRIPWIRES.read_bytes() and sync(["06_gpu"], check=True, root=root) == []
    copy.unlink()
    os.symlink(TRIPWIRES, copy)  # a link breaks where a clone has no links: sync writes the file itself
    assert sync(["06_gpu"], root=root) == stale and not copy.is_symlink()
    assert copy.read_bytes() == TRIPWIRES.read_bytes() and TRIPWIRES.is_file()


def test_a_lessons_limits_come_from_its_manifest_and_the_flags_win(lessons_in):
    from autograder.grade import lesson_limits
    from autograder.worker import DEFAULT_LIMITS

    root = lessons_in("01_attention")
    assert lesson_limits("01_attention") == DEFAULT_LIMITS
    edit(
        root / "01_attention" / lessons.MANIFEST,
        "\n[graded.",
        "\n[limits]\nmemory_mb = 4096\ncell_seconds = 90\n\n[graded.",
    )
    assert lesson_limits("01_attention") == replace(DEFAULT_LIMITS, memory_mb=4096, cell_seconds=90)
    assert lesson_limits("01_attention", {"memory_mb": 2048}) == replace(
        DEFAULT_LIMITS, memory_mb=2048, cell_seconds=90
    )


def test_limits_are_one_frozen_type_whose_one_reader_names_the_field(lessons_in):
    """Limits is frozen, and over() is the one reader of the manifest's [limits] and of grade's flags: an unknown
    field or a bad value is one line naming it. The fingerprint hashes the same text as the dict it replaced."""
    from dataclasses import FrozenInstanceError

    from autograder.grade import lesson_limits
    from autograder.worker import DEFAULT_LIMITS, LimitsError

    lessons_in("01_attention")
    with pytest.raises(FrozenInstanceError):
        DEFAULT_LIMITS.memory_mb = 1
    with pytest.raises(LimitsError, match=r"^grade's limits\.memory: unknown limit; a lesson may set memory_mb, "):
        lesson_limits("01_attention", {"memory": 4096})
    with pytest.raises(LimitsError, match=r"^grade's limits\.cell_seconds: should be a positive whole number, not 0$"):
        lesson_limits("01_attention", {"cell_seconds": 0})
    assert sorted(DEFAULT_LIMITS.to_json().items()) == sorted(
        dict(
            memory_mb=3072,
            cpu_seconds=600,
            file_mb=64,
            processes=256,
            cell_seconds=60,
            call_seconds=30,
            notebook_seconds=600,
        ).items()
    )


def test_the_fingerprint_follows_what_grading_reads_not_the_books_text(lessons_in):
    """grade --resume regrades a lesson when its fingerprint changes: a book edit must not do that."""
    from autograder.grade import lesson_fingerprint

    lesson = "07_head_specialization"
    folder = lessons_in(lesson) / lesson
    tests = nbk.lesson_tests(lesson)

    def fp():
        return lesson_fingerprint(lesson, tests, "bwrap", {})

    first = fp()
    manifest = folder / lessons.MANIFEST
    edit(manifest, 'title = "', 'title = "Now: ')
    edit(manifest, 'summary = "', 'summary = "Reworded. ')
    edit(manifest, 'contract = "', 'contract = "Said better. ')
    assert fp() == first, "the book's text changed the fingerprint: every student would be regraded"
    for change in [
        lambda: edit(manifest, "points = 2", "points = 3"),
        lambda: edit(manifest, "\n[graded.", "\n[limits]\nmemory_mb = 4096\n\n[graded."),
        lambda: (folder / "induction_model.npz").write_bytes(b"another checkpoint"),
    ]:
        before = fp()
        change()
        assert fp() != before


@pytest.mark.slow
def test_one_run_grades_each_lesson_under_its_own_limits(lessons_in, tmp_path, monkeypatch):
    """Two lessons in one run, one thread: lesson 02's manifest raises its limits, and its submissions run in a
    sandbox with those; lesson 01's in one with the defaults."""
    from autograder import grade as grader
    from autograder.worker import DEFAULT_LIMITS, choose_mode

    root = lessons_in("01_attention", "02_heads")
    edit(
        root / "02_heads" / lessons.MANIFEST,
        "\n[graded.",
        "\n[limits]\ncell_seconds = 50\nmemory_mb = 3000\n\n[graded.",
    )
    release(tmp_path / "release", ["01_attention", "02_heads"], root)
    for student in ("ann", "ben"):
        for lesson in ("01_attention", "02_heads"):
            nbk.write(
                nbk.read(tmp_path / "release" / lesson / f"{lesson}.ipynb"),
                tmp_path / "subs" / student / lesson / f"{lesson}.ipynb",
            )
    seen, real = [], grader.grade_one

    def grade_one(sandbox, student, lesson, *args):
        seen.append((student, lesson, sandbox.limits))
        return real(sandbox, student, lesson, *args)

    monkeypatch.setattr(grader, "grade_one", grade_one)
    from autograder.config import RunConfig

    run = grader.grade(RunConfig(tmp_path / "results", tmp_path / "subs", mode=choose_mode("auto"), progress=False))
    assert run["graded"] == 4
    want = {"01_attention": DEFAULT_LIMITS, "02_heads": replace(DEFAULT_LIMITS, cell_seconds=50, memory_mb=3000)}
    assert sorted((s, x) for s, x, _ in seen) == [(s, x) for s in ("ann", "ben") for x in want]
    assert all(limits == want[lesson] for _, lesson, limits in seen), seen
