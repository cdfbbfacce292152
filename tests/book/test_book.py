"""The online book (book/build.py, `make book`): it builds with warnings as errors, shows every lesson
as students see it (exercises labelled, figures numbered and described, the release as its download), leaks
no solution and no hidden test (downloads included), and works offline in a real browser, where
nothing is clipped at a laptop's or a phone's width.

The slow tests share one build and one browser session per test session. The browser tests drive
headless Chromium through the DevTools protocol (tornado's websocket client) and need
/usr/bin/chromium (`make setup` installs it when it can); they are skipped, saying so, where Chromium
is missing. They leave a screenshot of every page's first screen at each width in book/_build/screenshots/.
"""

import ast
import asyncio
import base64
import functools
import html
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from autograder import notebook as nbk
from autograder.release import student_copy
from tests.harness import book_build
from tests.harness.lessons import LESSONS

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
SITE = BOOK / "_build" / "html"
SCREENSHOTS = BOOK / "_build" / "screenshots"
MIN_SECRET = 16  # shorter lines (`return out`) are not distinctive


@pytest.fixture(scope="session")
def site():
    """Build the book once (exactly what `make book` runs); the path of the site."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(BOOK / "build.py")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"`make book` failed (exit status {proc.returncode}):\n{out[-8000:]}", pytrace=False)
    print(f"book built in {time.perf_counter() - start:.1f} s")
    assert "warnings are errors" in out, "the build must treat Sphinx warnings as errors"
    return SITE


def pages(site):
    return sorted(p for p in site.rglob("*.html") if not p.relative_to(site).as_posix().startswith("_static/"))


def page_text(path):
    """A page's text: tags stripped, entities decoded, whitespace normalized."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8"))).split())


def executed_copy(lesson):
    """The student copy with outputs that the build made of the lesson (its cache entry)."""
    build = book_build()
    return nbk.read(build.NB_CACHE / f"{lesson}-{build.lesson_hash(lesson)}.ipynb")


def lesson_page(site, lesson):
    return site / "lessons" / lesson / f"{lesson}.html"


# ---------------------------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_book_has_every_page(site):
    for name in ("index", "api", "instructor", "results", "search", "genindex"):
        assert (site / f"{name}.html").is_file(), f"the book has no {name}.html"
    for lesson in LESSONS:
        assert lesson_page(site, lesson).is_file(), f"no page for {lesson}"
    intro = page_text(site / "index.html")
    for needle in ("make setup", "JupyterLab", "graded"):
        assert needle in intro, f"the intro page should mention {needle!r}"
    # Running a downloaded lesson: two commands, without the repository or the solution package.
    install = next((line for line in intro.split("jupyter lab")[0].split("pip install")[1:]), "")
    assert install, "the intro page should say how to install what a lesson needs (pip install ...)"
    for package in ("numpy", "matplotlib", "jupyterlab", "torch", "download.pytorch.org/whl/cpu"):
        assert package in install, f"the intro's pip install should install {package}"
    assert "solutions" not in install and "mha" not in install and "-e" not in install.split(), (
        "students never install the solution package"
    )
    assert "jupyter lab" in intro
    for name in ("Release the lessons", "Collect submissions"):
        assert name in page_text(site / "instructor.html"), name
    guide_text = page_text(site / "instructor.html")
    assert guide_text.index("Release the lessons") < guide_text.index("Collect submissions"), (
        "the instructor guide releases before it collects"
    )
    guide = page_text(site / "instructor.html")
    for needle in (
        "autograder release",
        "autograder grade",
        "autograder merge",
        "--shard",
        "--resume",
        "--jobs",
        "nbgrader autograde",
        "nbgrader_config.py",
        "bubblewrap",
        "unshare",
        "--unsafe",
        "grades.csv",
    ):
        assert needle in guide, f"the instructor guide should cover {needle!r}"
    assert not (site / "_sources").exists(), "page sources are not published (html_copy_source: false)"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_page_is_the_student_copy_with_the_reference_figures(site, lesson):
    page = lesson_page(site, lesson).read_text(encoding="utf-8")
    text = page_text(lesson_page(site, lesson))
    assert "YOUR CODE HERE" in text and "NotImplementedError" in text, "the exercises should show their stubs"
    copy = nbk.read(BOOK / "_generated" / "lessons" / lesson / f"{lesson}.ipynb")
    assert copy == student_copy(copy, keep_outputs=True), "the book's notebook must be a student copy"
    for cell in copy["cells"]:
        if nbk.is_answer(cell) or nbk.is_test(cell):
            assert not cell.get("outputs"), "answer and test cells must have no outputs in the book"
    figures = sorted((BOOK / "_generated" / "lessons" / lesson / "figures").glob("figure-*"))
    executed = executed_copy(lesson)
    made = sum(
        any(m.startswith("image/") for m in o.get("data", {}))
        for c in nbk.code_cells(executed)
        for o in c.get("outputs", [])
    )
    assert len(figures) == made, f"the lesson makes {made} figure(s); the book has {len(figures)}"
    assert len(re.findall(r"<img [^>]*src=\"[^\"]*_images/figure-", page)) == made, (
        f"the lesson's {made} reference figure(s) should be on its page"
    )
    assert not re.search(r"<[\w.]+ (object )?at 0x[0-9a-f]+>", text), "an object's address is shown as an output"
    for name in [gid.removeprefix("test_") for gid, _ in nbk.graded_tests(copy)]:
        assert name in text, f"the exercise {name} is missing from the page"


# ---------------------------------------------------------------------------------------------
# Lesson pages for readers: labels, figures, downloads, glossary
# ---------------------------------------------------------------------------------------------


def test_visible_test_cells_say_what_they_check():
    """interfaces 11: a visible-test cell's first line is `# Visible tests: <summary>` (the book
    folds the cell under that summary)."""
    build = book_build()
    missing = [
        f"{lesson}: {nbk.grade_id(c)}"
        for lesson in LESSONS
        for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson)))
        if nbk.is_test(c) and not build.visible_tests_summary(c)
    ]
    assert not missing, (
        "these test cells do not start with `# Visible tests: <what they check>` "
        "(the book's fold shows a generic summary):\n" + "\n".join(missing)
    )


def _demo_notebook(figure_meta=None):
    answer = {
        "cell_type": "code",
        "id": "a",
        "metadata": {"nbgrader": {"solution": True, "grade_id": "f"}},
        "source": "def f(x):\n    raise NotImplementedError()\n",
        "outputs": [],
        "execution_count": None,
    }
    test = {
        "cell_type": "code",
        "id": "t",
        "metadata": {"nbgrader": {"grade": True, "grade_id": "test_f", "points": 1}},
        "source": "# Visible tests: `f` doubles\nassert f(1) == 2\n",
        "outputs": [],
        "execution_count": None,
    }
    png = base64.b64encode(b"\x89PNG fake").decode()
    demo = {
        "cell_type": "code",
        "id": "d",
        "metadata": {"tags": ["demo"], **({"figure": figure_meta} if figure_meta else {})},
        "source": "t = time.perf_counter()\ntorch.manual_seed(0)\nplt.show()\n",
        "execution_count": 1,
        "outputs": [
            {
                "output_type": "execute_result",
                "execution_count": 1,
                "metadata": {},
                "data": {"text/plain": "<torch._C.Generator at 0x7f3a2c1b5d30>"},
            },
            {
                "output_type": "display_data",
                "data": {"image/png": png, "text/plain": "<Figure>"},
                "metadata": {"image/png": {"width": 672, "height": 274}},
            },
        ],
    }
    title = {
        "cell_type": "markdown",
        "id": "m",
        "metadata": {},
        "source": "# Lesson 03 — Title\n\nA KV cache and a `KV cache` and $KV cache$; the KV caches.\n",
    }
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"book": {"machine": "CPU X, 2 logical CPU cores", "date": "2026-01-01"}},
        "cells": [title, answer, test, demo],
    }


def test_book_page_labels_folds_and_captions():
    build = book_build()
    glossary = build.Glossary("```{glossary}\nKV cache\nkey/value cache\n  Keys and values kept.\n```\n")
    page, files = build.book_page(
        _demo_notebook({"caption": "What it shows.", "alt": "Two lines rise."}), "03_multi_head", glossary
    )
    title, label, answer, test, demo = page["cells"]
    text = nbk.source(title)
    assert "{download}`Download 03_multi_head.zip <03_multi_head.zip>`" in text, "the download goes under the title"
    assert text.count("{term}") == 1 and "A {term}`KV cache <KV cache>` and a `KV cache` and $KV cache$" in text, (
        "only the first use in prose is linked, never in code or maths"
    )
    assert "Your answer" in nbk.source(label) and answer["source"] == _demo_notebook()["cells"][1]["source"]
    assert "hide-input" in test["metadata"]["tags"]
    assert test["metadata"]["mystnb"]["code_prompt_show"] == "Visible tests: f doubles"
    outputs = demo["outputs"]
    assert len(outputs) == 1, "the generator's address is dropped, the image becomes a figure"
    figure = outputs[0]["data"]["text/markdown"]
    assert figure.startswith("```{figure} figures/figure-3-1.png\n:alt: Two lines rise.\n:width: 672px\n")
    assert (
        "**Figure 3.1.** What it shows. Timed when this book was built, on CPU X, 2 logical CPU cores (2026-01-01)"
        in figure
    )
    assert files == {"figures/figure-3-1.png": b"\x89PNG fake"}
    assert demo["metadata"]["mystnb"]["markdown_format"] == "myst"
    # Without metadata (yet): a number, a placeholder that the figure test names, no crash.
    page, _ = build.book_page(_demo_notebook(), "03_multi_head", glossary)
    assert ":alt: Figure 3.1 (no description yet)" in page["cells"][4]["outputs"][0]["data"]["text/markdown"]


def test_glossary_links_the_first_use_of_each_entry():
    build = book_build()
    glossary = build.Glossary((BOOK / "glossary.md").read_text(encoding="utf-8"))
    names = [terms[0] for terms in glossary.entries]
    for needed in (
        "attention",
        "head",
        "KV cache",
        "GQA",
        "MQA",
        "MLA",
        "sliding window",
        "prefill",
        "decode",
        "FLOP",
        "roofline",
        "online softmax",
        "tile",
        "induction head",
    ):
        assert any(needed in terms for terms in glossary.entries), f"the glossary has no entry {needed!r}"
    assert len(names) == len(set(names))
    linked = set()
    md = (
        "## Multi-head attention\n\nMulti-head attention splits attention into heads; "
        "see [multi-head attention](x.md), `heads` and:\n\n```python\nattention = 1\n```\n"
        "A multi-headed view, then attention again and FLOPs.\n"
    )
    out = glossary.link(md, linked)
    assert out.startswith(
        "## Multi-head attention\n\n{term}`Multi-head attention <multi-head attention>` splits "
        "{term}`attention <attention>` into {term}`heads <head>`;"
    ), out
    assert "[multi-head attention](x.md)" in out and "```python\nattention = 1\n```" in out
    assert "multi-headed" in out and "attention again" in out and "{term}`FLOPs <FLOP>`" in out
    assert glossary.link("attention", linked) == "attention", "an entry is linked once per lesson"


def test_repository_link_is_one_setting(tmp_path):
    build = book_build()
    config, url = build.site_config()
    assert url == "" and "use_repository_button: false" in config, "empty by default, and then hidden"
    (tmp_path / "_config.yml").write_text(
        (BOOK / "_config.yml").read_text().replace('url: ""', 'url: "https://example.org/c"')
    )
    config, url = build.site_config(tmp_path / "_config.yml")
    assert url == "https://example.org/c" and "use_repository_button: true" in config
    assert "repository_url: https://example.org/c" in config


def test_results_plots_what_runs_over_sequence_lengths(tmp_path):
    build = book_build()
    rows = [
        {"seq_len": t, "method": m, "dtype": "float16", "head_dim": 64, "causal": False, "ms": 1.0, "tflops": t / 100}
        for t in (1024, 2048)
        for m in ("sdpa", "flash")
    ]
    (tmp_path / "gpu_attention_nvidia-h200.json").write_text(
        json.dumps({"benchmark": "gpu_attention", "device": "NVIDIA H200", "date": "2026-01-02", "results": rows})
    )
    page, figures = build.results_page(tmp_path, "figs")
    assert "**Where:** device NVIDIA H200" in page and "**When:** 2026\\-01\\-02" in page
    assert "**What:** Forward attention throughput on a GPU" in page
    ((name, png),) = figures.items()
    assert png[:4] == b"\x89PNG" and f"figs/{name}" in page and ":alt: Line plots of forward TFLOP/s" in page


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_exercises_are_labelled(site, lesson):
    page = lesson_page(site, lesson).read_text(encoding="utf-8")
    source = nbk.read(nbk.lesson_path(lesson))
    answers = sum(nbk.is_answer(c) for c in nbk.code_cells(source))
    tests = [c for c in nbk.code_cells(source) if nbk.is_test(c)]
    labels = re.findall(r'<div class="cell-label answer-label[^"]*">\s*<p>Your answer</p>', page)
    assert len(labels) == answers, f"{len(labels)} 'Your answer' labels for {answers} answer cells"
    folds = re.findall(
        r'<details class="admonition hide above-input">\s*<summary[^>]*>\s*'
        r'<p class="collapsed admonition-title">Visible tests: ([^<]+)</p>',
        page,
    )
    assert len(folds) == len(tests), f"{len(folds)} folded 'Visible tests' for {len(tests)} test cells"


@pytest.mark.slow
def test_figures_have_numbers_captions_and_alt_text(site):
    """interfaces 11: a figure-making cell carries metadata "figure": {"caption", "alt"}; figures are
    at most about 8 inches wide (800 px at matplotlib's 100 dpi)."""
    problems = []
    for lesson in LESSONS:
        executed = executed_copy(lesson)
        page = lesson_page(site, lesson).read_text(encoding="utf-8")
        for i, cell in enumerate(executed["cells"]):
            images = [o for o in cell.get("outputs", []) if any(m.startswith("image/") for m in o.get("data", {}))]
            if not images:
                continue
            specs = book_build().figure_specs(cell)
            where = f"{lesson}: cell {i} ({nbk.source(cell).splitlines()[0][:50]!r})"
            if len(specs) < len(images) or not all(s.get("caption") and s.get("alt") for s in specs):
                problems.append(f"{where}: {len(images)} figure(s), needs metadata 'figure' with caption and alt")
            for o in images:
                width = max(
                    o.get("metadata", {}).get(m, {}).get("width", 0) for m in o["data"] if m.startswith("image/")
                )
                if width > 850:  # a tight bounding box may add a little to the figure's 8 inches
                    problems.append(f"{where}: drawn {width / 100:.1f} in wide (at most about 8)")
        for m in re.finditer(r"<img [^>]*>", page):
            alt = re.search(r'alt="([^"]*)"', m.group(0))
            if alt is None or not alt.group(1).strip() or re.search(r"\.(png|svg|jpe?g)$|^[0-9a-f]{16,}", alt.group(1)):
                problems.append(f"{lesson}: an image without real alt text: {m.group(0)[:120]}")
        captions = re.findall(r"<figcaption>\s*<p>(.*?)</p>", page, re.S)
        if len(captions) != len(re.findall(r"<img [^>]*_images/figure-", page)):
            problems.append(f"{lesson}: {len(captions)} captions for its figures")
        problems += [
            f"{lesson}: a caption with only a number: {html.unescape(re.sub('<[^>]+>', '', c)).strip()}"
            for c in captions
            if re.fullmatch(r"Figure [\d.]+\.", " ".join(html.unescape(re.sub("<[^>]+>", "", c)).split()))
        ]
    assert not problems, "figures the book cannot describe (interfaces 11):\n" + "\n".join(problems)


def _download(site, lesson):
    """The lesson's download, as the page links it: (file name, bytes)."""
    page = lesson_page(site, lesson).read_text(encoding="utf-8")
    links = re.findall(r'<a class="reference download internal"[^>]*href="([^"]+\.zip)"', page)
    assert len(links) == 1, f"{lesson}: the page should link one download, found {links}"
    path = (lesson_page(site, lesson).parent / html.unescape(links[0])).resolve()
    assert path.is_file() and site.resolve() in path.parents, f"{lesson}: the download link is broken: {links[0]}"
    return path.name, path.read_bytes()


def download_differences(data, folder):
    """How a download (zip bytes) differs from a release folder: files missing, extra (or held twice),
    or with other bytes. [] when it holds exactly the folder's files, byte for byte."""
    import io
    import zipfile

    want = {f.relative_to(folder).as_posix(): f for f in folder.rglob("*") if f.is_file()}
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        problems = [f"missing: {n}" for n in sorted(set(want) - set(names))]
        problems += [f"extra: {n}" for n in sorted(set(names) - set(want))]
        problems += [f"held {names.count(n)} times: {n}" for n in sorted(set(names)) if names.count(n) > 1]
        problems += [f"other bytes: {n}" for n in sorted(set(names) & set(want)) if zf.read(n) != want[n].read_bytes()]
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_download_is_the_release_byte_for_byte(site, lesson, tmp_path):
    """The zip a reader downloads holds exactly the release folder, byte for byte: the release copy
    (nbformat-valid, no solution, no hidden test) and the lesson's files. That it runs, filled with the
    solutions, is the release's to show, so nothing runs here: every file beside a lesson's notebook
    is released (test_every_lesson_has_every_piece), the source notebook runs every cell, demos
    included, with the solutions in its folder (test_source_notebook_passes_all_its_tests), and
    the release copy runs from its folder (test_release_copy_runs_and_fails_only_at_the_exercises)
    and, filled with the solutions, passes every visible test (the audit, test_solutions_pass_every_visible_test)."""
    import nbformat

    from autograder.release import release

    name, data = _download(site, lesson)
    assert name == f"{lesson}.zip"
    release(tmp_path, [lesson])
    differences = download_differences(data, tmp_path)
    assert not differences, "the download should hold exactly the release folder:\n" + "\n".join(differences)
    text = (tmp_path / lesson / f"{lesson}.ipynb").read_text(encoding="utf-8")  # the download's, byte for byte
    nbformat.validate(nbformat.reads(text, as_version=4))
    assert not leaks_in(text, secrets()), "the download holds solution code or hidden tests"


def test_download_check_finds_a_changed_file(tmp_path):
    """download_differences must be able to fail: a data file with one byte changed, a notebook cell
    edited, a file left out or added are each found (lesson 07: it has data files)."""
    import zipfile

    from autograder.release import release

    lesson = "07_head_specialization"
    release(tmp_path / "release", [lesson])
    folder = tmp_path / "release"
    assert download_differences(book_build().lesson_download(lesson), folder) == []

    def zipped(change):
        files = {f.relative_to(folder).as_posix(): f.read_bytes() for f in folder.rglob("*") if f.is_file()}
        change(files)
        with zipfile.ZipFile(tmp_path / "changed.zip", "w") as zf:
            for n, b in files.items():
                zf.writestr(n, b)
        return download_differences((tmp_path / "changed.zip").read_bytes(), folder)

    data, notebook = f"{lesson}/induction_model.npz", f"{lesson}/{lesson}.ipynb"

    def flip_a_byte(files):
        files[data] = files[data][:-1] + bytes([files[data][-1] ^ 1])

    def edit_a_cell(files):
        nb = json.loads(files[notebook])
        nb["cells"][-1]["source"] = ["print('edited')\n"]
        files[notebook] = json.dumps(nb, indent=1).encode()

    assert zipped(flip_a_byte) == [f"other bytes: {data}"]
    assert zipped(edit_a_cell) == [f"other bytes: {notebook}"]
    assert zipped(lambda files: files.pop(data)) == [f"missing: {data}"]
    assert zipped(lambda files: files.update({f"{lesson}/notes.txt": b""})) == [f"extra: {lesson}/notes.txt"]


@pytest.mark.slow
def test_glossary_is_linked_from_every_lesson(site):
    assert (site / "glossary.html").is_file()
    for lesson in LESSONS:
        page = lesson_page(site, lesson).read_text(encoding="utf-8")
        targets = re.findall(r'href="\.\./\.\./glossary\.html#(term-[^"]+)"', page)
        assert len(targets) >= 3, f"{lesson}: only {len(targets)} glossary links"
        assert len(targets) == len(set(targets)), f"{lesson}: an entry is linked more than once: {targets}"


@pytest.mark.slow
def test_api_reference_has_signatures_and_docstrings(site):
    import inspect

    page = page_text(site / "api.html")
    assert "sig-prename" not in (site / "api.html").read_text(encoding="utf-8"), (
        "names are shown as students call them, without a module they never import"
    )
    for lesson in LESSONS:
        module = importlib.import_module(f"solutions.{lesson.split('_', 1)[1]}")
        for gid, _ in nbk.graded_tests(nbk.read(nbk.lesson_path(lesson))):
            obj = getattr(module, gid.removeprefix("test_"))
            assert obj.__name__ in page
            first = (inspect.getdoc(obj) or "").splitlines()[0] if inspect.getdoc(obj) else ""
            assert " ".join(first.split()) in page, f"the docstring of {obj.__name__} is not on the API page"


@pytest.mark.slow
def test_results_page_renders_every_result(site):
    page = html.unescape((site / "results.html").read_text(encoding="utf-8"))
    results = ROOT / "benchmarks" / "results"
    files = sorted(results.rglob("*.json")) if results.is_dir() else []
    sections = re.split(r"<h2[ >]", page)[1:]
    for f in files:
        assert f.relative_to(results).as_posix() in page, f"{f.name} is not on the results page"
        if _is_json(f):
            section = next((sec for sec in sections if f.name in sec.split("</h2>")[0]), "")
            assert "<table" in section, f"{f.name} should be shown as a table under its own heading"
            assert "What:" in section and "Where:" in section and "When:" in section, (
                f"{f.name}: say what was measured, where and when"
            )
    build = book_build()
    if not any(build.measured_on_gpu(json.loads(f.read_text())) for f in files if _is_json(f)):
        assert "No GPU results have been measured yet" in page


def _is_json(f):
    try:
        json.loads(f.read_text(encoding="utf-8"))
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# Rendering of benchmark results (fast: no build)
# ---------------------------------------------------------------------------------------------


def test_results_render_any_json_shape():
    build = book_build()
    records = [{"seq_len": 128, "ms": 0.51234, "impl": "naive"}, {"seq_len": 256, "ms": 1.9, "impl": "flash|tiled"}]
    md = build.render_json({"device": "cpu", "runs": records, "matrix": [[1, 2], [3, 4]], "cfg": {"dtype": "$x$"}}, 3)
    assert "| seq\\_len | ms | impl |" in md and "| 128 | 0.5123 | naive |" in md
    assert "flash\\|tiled" in md, "a | inside a value must not split the table cell"
    assert "\\$x\\$" in md, "a $ in a value must not start maths"
    assert "### runs" in md and "### matrix" in md and "| row | 0 | 1 |" in md
    assert build.render_json([1, 2.5, "a"], 2).count("\n|") >= 3
    assert build.render_json(3.0, 2).strip() == "3"


def test_gpu_results_are_recognised():
    build = book_build()
    assert build.measured_on_gpu({"device": "NVIDIA H200", "ms": 1})
    assert build.measured_on_gpu({"runs": [{"device": "cuda:0"}]})
    assert build.measured_on_gpu({"meta": {"gpu_name": "A100-SXM4-80GB"}})
    assert not build.measured_on_gpu({"device": "cpu", "note": "a GPU would be faster"})
    assert not build.measured_on_gpu({"gpu": "none: not available"})
    assert not build.measured_on_gpu([{"device": "cpu"}])


def test_results_page_says_when_nothing_was_measured(tmp_path):
    build = book_build()
    page, figures = build.results_page(tmp_path, "figs")
    assert "No benchmark results have been recorded yet" in page and "No GPU results" in page and not figures
    (tmp_path / "cpu.json").write_text(json.dumps({"device": "cpu", "speedup": 1.5}))
    (tmp_path / "plot.png").write_bytes(b"\x89PNG")
    (tmp_path / "broken.json").write_text("{")
    page, figures = build.results_page(tmp_path, "figs")
    assert "No GPU results have been measured yet" in page and "cpu\\.json" in page and "not valid JSON" in page
    assert list(figures) == ["plot.png"] and "figs/plot.png" in page
    (tmp_path / "gpu.json").write_text(json.dumps({"device": "NVIDIA H200", "speedup": 9.0}))
    page, _ = build.results_page(tmp_path, "figs")
    assert "No GPU results" not in page and "GPU results: `gpu.json`" in page


# ---------------------------------------------------------------------------------------------
# Leaks: no solution code and no hidden test anywhere in the site
# ---------------------------------------------------------------------------------------------


def normalize(line):
    return " ".join(line.split())


def regions(text, begin, end):
    """The lines strictly between each begin and end marker line."""
    inside, out = False, []
    for line in text.splitlines():
        if line.strip() == begin:
            inside = True
        elif line.strip() == end:
            inside = False
        elif inside:
            out.append(line)
    return out


@functools.lru_cache(maxsize=None)
def secrets():
    """{distinctive line: where it comes from}: every line of the source notebooks' solution regions
    and hidden tests, and of the function bodies in solutions/, that appears nowhere in what
    students are meant to see (the student copies, docstrings and signatures)."""
    found, visible = {}, set()
    for lesson in LESSONS:
        nb = nbk.read(nbk.lesson_path(lesson))
        for cell in nb["cells"]:
            text = nbk.source(cell)
            for line in regions(text, nbk.BEGIN_SOLUTION, nbk.END_SOLUTION):
                found.setdefault(normalize(line), f"{lesson}: solution of {nbk.grade_id(cell)}")
            for line in regions(text, nbk.BEGIN_HIDDEN, nbk.END_HIDDEN):
                found.setdefault(normalize(line), f"{lesson}: hidden test {nbk.grade_id(cell)}")
        for cell in student_copy(nb)["cells"]:  # what students are meant to see
            visible.update(normalize(line) for line in nbk.source(cell).splitlines())
    for path in sorted((ROOT / "solutions").glob("*.py")):
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            body = node.body
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:  # docstrings are public (notebooks, API reference)
                visible.update(normalize(line) for line in doc.splitlines())
                body = body[1:]
            visible.update(normalize(line) for line in lines[node.lineno - 1 : (body or node.body)[0].lineno - 1])
            if body:
                for line in lines[body[0].lineno - 1 : node.end_lineno]:
                    found.setdefault(normalize(line), f"solutions/{path.name}: body of {node.name}")
    visible = " ".join(visible)  # a hint may quote a line of the solution, even across lines
    return {
        line: where
        for line, where in found.items()
        if len(line) >= MIN_SECRET and re.search(r"[A-Za-z]", line) and line not in visible
    }


ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)", re.S)
DATA_URI = re.compile(r"data:(?:text|application)/[\w.+-]+;base64,([A-Za-z0-9+/=]+)")


def unescape_js(text):
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "", "f": ""}
    return ESCAPE.sub(
        lambda m: (
            chr(int(m.group(1)[1:], 16))
            if m.group(1)[0] in "ux" and len(m.group(1)) > 1
            else simple.get(m.group(1), m.group(1))
        ),
        text,
    )


def views(text):
    """The ways a line of code can appear in a file: as is, HTML-escaped, split into highlighting
    spans, JSON/JS string escaped, or base64 in a data: URI. All whitespace-normalized, each once."""
    decoded = [text, unescape_js(text)]
    decoded += [base64.b64decode(m.group(1) + "==").decode("utf-8", "ignore") for m in DATA_URI.finditer(text)]
    seen = set()
    for t in decoded:
        for view in (t, html.unescape(t), html.unescape(re.sub(r"<[^>]*>", "", t))):
            view = normalize(view)
            if hash(view) not in seen:
                seen.add(hash(view))
                yield view


WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=None)
def inner_words(line):
    """The words of a line that any text containing the line must contain as words too (the first
    and the last may be glued to their neighbours)."""
    return frozenset(WORD.findall(line)[1:-1])


def leaks_in(text, lines):
    """The lines (of `lines`) that occur in text, in any of its views."""
    found = set()
    for view in views(text):
        words = set(WORD.findall(view))  # a quick filter: substring search only where it can match
        found.update(line for line in lines if line not in found and inner_words(line) <= words and line in view)
    return found


def readable(path):
    """[(member, text)] of a file: ("", its text), or for a zip (the lessons' downloads) each member's."""
    import zipfile

    data = path.read_bytes()
    if path.suffix == ".zip" and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            return [(f"!{name}", zf.read(name).decode("utf-8", "ignore")) for name in zf.namelist()]
    return [("", data.decode("utf-8", "ignore"))]


def test_leak_check_finds_a_planted_leak():
    """The check itself must be able to fail: a solution line hidden in highlighted HTML, in a JSON
    string, in an .ipynb and in a data: URI is found."""
    lines = secrets()
    assert lines, "no solution or hidden-test lines to look for"
    for lesson in LESSONS:
        assert any(where.startswith(f"{lesson}: solution") for where in lines.values()), lesson
        assert any(where.startswith(f"{lesson}: hidden test") for where in lines.values()), lesson
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    line = max(lines, key=len)
    assert leaks_in(highlight(f"    {line}\n", PythonLexer(), HtmlFormatter()), lines)
    assert leaks_in(json.dumps({"text": f"<p>{html.escape(line)}</p>\n"}), lines)
    assert leaks_in(json.dumps({"source": [line.replace(" ", "  ", 1) + "\n"]}, ensure_ascii=True), lines)
    assert leaks_in("src='data:text/plain;base64," + base64.b64encode(line.encode()).decode() + "'", lines)
    with tempfile.TemporaryDirectory() as tmp:  # a solution inside a download
        import zipfile

        with zipfile.ZipFile(Path(tmp) / "lesson.zip", "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("lesson/lesson.ipynb", json.dumps({"source": [line + "\n"]}))
        assert any(leaks_in(text, lines) for _, text in readable(Path(tmp) / "lesson.zip"))
    assert not leaks_in("nothing to see here", lines)


def test_files_release_adds_hold_no_secret():
    """What release copies beside the notebooks (the grader's tripwires) is in every download of the book:
    it holds no solution and no hidden-test line (a quick check of what the slow site scan finds)."""
    from autograder.release import TRIPWIRES

    assert not leaks_in(TRIPWIRES.read_text(encoding="utf-8"), secrets())


@pytest.mark.slow
def test_no_solution_or_hidden_test_in_the_site(site):
    """Every file of the site (pages, search index, JSON, images, ...), and also of everything else
    the build keeps (its sources in book/_generated, its caches), except the npm MathJax package and
    the copies of its files that the site serves (byte for byte the package's: nothing of ours)."""
    import hashlib

    lines = secrets()
    npm = {hashlib.sha256(f.read_bytes()).digest() for f in (BOOK / "_build" / ".mathjax").rglob("*") if f.is_file()}
    leaks, scanned, zips = [], 0, 0
    for root in (BOOK / "_build", BOOK / "_generated"):
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(BOOK)
            if (
                path.is_file()
                and rel.parts[1] not in (".mathjax", "screenshots")
                and hashlib.sha256(path.read_bytes()).digest() not in npm
            ):
                for member, text in readable(path):
                    scanned += 1
                    zips += bool(member)
                    leaks += [f"{rel}{member}: {lines[line]}" for line in leaks_in(text, lines)]
    assert scanned > len(LESSONS) and zips >= 2 * len(LESSONS), "the downloads (zips) must be scanned too"
    assert not leaks, "solution code or hidden tests in the built book:\n" + "\n".join(leaks[:20])


@pytest.mark.slow
def test_site_references_no_other_host(site):
    """Static check: no script, style sheet, image or frame of the site comes from another host
    (links to papers are fine: a reader follows them, the page does not load them)."""
    bad = []
    tag = re.compile(
        r"<(script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(src|href)=[\"']"
        r"((?:https?:)?//[^\"']+)",
        re.I,
    )
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css"):
            text = path.read_text(encoding="utf-8", errors="ignore")
            bad += [
                f"{path.relative_to(site)}: {m.group(3)}"
                for m in tag.finditer(text)
                if not (m.group(1).lower() == "link" and re.search(r"rel=[\"'](canonical|alternate)", m.group(0)))
            ]
            bad += [
                f"{path.relative_to(site)}: {u}" for u in re.findall(r"url\(\s*[\"']?((?:https?:)?//[^)\"']+)", text)
            ]
            bad += [
                f"{path.relative_to(site)}: {u}" for u in re.findall(r"@import\s+[\"']((?:https?:)?//[^\"']+)", text)
            ]
    assert not bad, "the site loads things from other hosts:\n" + "\n".join(sorted(bad)[:20])
    page = (site / "index.html").read_text(encoding="utf-8")
    assert "_static/mathjax/tex-mml-chtml.js" in page, "MathJax must be served by the site itself"


# ---------------------------------------------------------------------------------------------
# In a browser: pages load, maths is typeset, images load, search works, nothing goes elsewhere
# ---------------------------------------------------------------------------------------------

CHROMIUM = next(
    (
        c
        for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
        if c and os.path.exists(c)
    ),
    None,
)

PAGE_CHECK = r"""
(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const math = [...document.querySelectorAll('.math')];
  if (math.length) {
    for (let i = 0; i < 300 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++) await sleep(50);
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  }
  const images = [...document.images];
  images.forEach(img => { img.loading = 'eager'; });
  await Promise.all(images.map(img => img.complete ? null : new Promise(r => {
    img.addEventListener('load', r); img.addEventListener('error', r); setTimeout(r, 15000); })));
  return {
    title: document.title,
    math: math.length,
    typeset: document.querySelectorAll('mjx-container').length,
    untypeset: math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60)),
    raw_tex: /\\\(|\\\[/.test(document.body.innerText),
    images: images.map(img => ({src: img.getAttribute('src'), width: img.naturalWidth})),
  };
})()
"""

SEARCH_RESULTS = r"""
(async () => {
  // Sphinx shows results one by one, then a summary ("Search finished, found N page(s) ...").
  for (let i = 0; i < 300; i++) {
    const summary = document.querySelector('#search-results .search-summary');
    if (summary && /\d/.test(summary.textContent)) break;
    await new Promise(r => setTimeout(r, 100));
  }
  return [...document.querySelectorAll('#search-results li')].map(li => (li.querySelector('a') || {href: ''}).href);
})()
"""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class DevTools:
    """A minimal Chrome DevTools Protocol client over one websocket (tornado)."""

    def __init__(self, ws):
        self.ws, self.ids, self.pending, self.events, self.waiters = ws, itertools.count(1), {}, [], []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self):
        while True:
            msg = await self.ws.read_message()
            if msg is None:
                for fut in self.pending.values():
                    if not fut.done():
                        fut.set_exception(ConnectionError("Chromium closed the DevTools connection"))
                return
            msg = json.loads(msg)
            if "id" in msg:
                fut = self.pending.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    if "error" in msg:
                        fut.set_exception(RuntimeError(f"DevTools error: {msg['error']}"))
                    else:
                        fut.set_result(msg.get("result", {}))
            else:
                self.events.append(msg)
                for match, fut in list(self.waiters):
                    if not fut.done() and match(msg):
                        fut.set_result(msg)

    async def send(self, method, session=None, timeout=60, **params):
        i = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        msg = {"id": i, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        await self.ws.write_message(json.dumps(msg))
        return await asyncio.wait_for(fut, timeout)

    def expect(self, method, session):
        """A future for the next event `method` of `session` (create it before causing the event)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((lambda m: m.get("method") == method and m.get("sessionId") == session, fut))
        return fut


class Browser:
    def __init__(self, tmp):
        self.profile = Path(tmp) / "profile"
        self.stderr = open(Path(tmp) / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            start_new_session=True,
        )

    def log(self):
        return (Path(self.stderr.name).read_text(errors="replace"))[-3000:]

    async def connect(self):
        from tornado.websocket import websocket_connect

        port_file = self.profile / "DevToolsActivePort"
        for _ in range(600):
            if port_file.exists() and len(port_file.read_text().split()) >= 2:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"Chromium exited with status {self.proc.returncode}:\n{self.log()}")
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"Chromium did not open its DevTools port:\n{self.log()}")
        port, path = port_file.read_text().split()[:2]
        ws = await websocket_connect(f"ws://127.0.0.1:{port}{path}", max_message_size=256 * 2**20)
        return DevTools(ws)

    def close(self):
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own process group only
            self.proc.wait(timeout=10)
        self.stderr.close()


WIDTHS = (1280, 390)  # a laptop and a phone

LAYOUT_CHECK = r"""
(() => {
  const doc = document.documentElement;
  const shown = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const text = e => e.textContent.trim().replace(/\s+/g, ' ').slice(0, 70);
  const tex = e => {             // the TeX that MathJax typeset into e
    let item = null;
    try { item = Array.from(MathJax.startup.document.math).find(m => m.typesetRoot === e); } catch (err) {}
    return item ? item.math.trim().replace(/\s+/g, ' ').slice(0, 90) : text(e);
  };
  // Headings, contents entries, sidebars and code: wider content than their box is clipped or scrolls.
  const clipped = [...document.querySelectorAll(
      'h1, h2, h3, h4, h5, h6, .bd-sidebar-primary, .bd-sidebar-secondary, .toc-entry, nav.bd-links li, ' +
      'div.cell pre, div.highlight pre, figcaption, .bd-article p, .bd-article li')]
    .filter(e => shown(e) && e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.tagName.toLowerCase()}${e.className ? '.' + String(e.className).split(' ')[0] : ''}: ` +
              `${e.scrollWidth} px in ${e.clientWidth} px: ${text(e)}`);
  const equations = [...document.querySelectorAll('mjx-container[display="true"]')]
    .filter(e => shown(e) && e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.scrollWidth} px in ${e.clientWidth} px: ${tex(e)}`);
  const images = [...document.querySelectorAll('.bd-article img')].map(img => ({
    src: img.getAttribute('src'), alt: img.getAttribute('alt'),
    caption: (img.closest('figure') && img.closest('figure').querySelector('figcaption'))
             ? img.closest('figure').querySelector('figcaption').textContent.trim() : null}));
  return {document: doc.scrollWidth, viewport: doc.clientWidth, clipped, equations, images};
})()
"""


async def browse(site, base, screenshots):
    report = {"pages": {}, "layout": {}, "requests": [], "failures": [], "exceptions": [], "console": [], "search": []}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        browser = Browser(tmp)
        try:
            cdp = await browser.connect()
            target = await cdp.send("Target.createTarget", url="about:blank")
            session = (await cdp.send("Target.attachToTarget", targetId=target["targetId"], flatten=True))["sessionId"]
            for domain in ("Network", "Page", "Runtime", "Log"):
                await cdp.send(f"{domain}.enable", session)

            async def goto(url):
                loaded = cdp.expect("Page.loadEventFired", session)
                nav = await cdp.send("Page.navigate", session, url=url)
                assert not nav.get("errorText"), f"{url}: {nav['errorText']}"
                await asyncio.wait_for(loaded, 30)

            async def evaluate(expression):
                r = await cdp.send(
                    "Runtime.evaluate",
                    session,
                    expression=expression,
                    awaitPromise=True,
                    returnByValue=True,
                    timeout=60,
                )
                assert "exceptionDetails" not in r, f"JavaScript failed: {r['exceptionDetails']}"
                return r["result"]["value"]

            async def resize(width, height):
                await cdp.send(
                    "Emulation.setDeviceMetricsOverride",
                    session,
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=width < 600,
                )

            screenshots.mkdir(parents=True, exist_ok=True)
            for width in WIDTHS:
                for page in pages(site):
                    rel = page.relative_to(site).as_posix()
                    await resize(width, 900)
                    await goto(f"{base}/{rel}")
                    checked = await evaluate(PAGE_CHECK)
                    if width == WIDTHS[0]:
                        report["pages"][rel] = checked
                    report["layout"][(rel, width)] = await evaluate(LAYOUT_CHECK)
                    # The first screen only: the checks above read the whole page; a full-page shot (a window as
                    # tall as the page, up to 60,000 px) costs more than the rest of the visit and shows no more.
                    shot = await cdp.send("Page.captureScreenshot", session, format="png")
                    name = rel.removesuffix(".html").replace("/", "_")
                    (screenshots / f"{name}-{width}.png").write_bytes(base64.b64decode(shot["data"]))

            await cdp.send(
                "Emulation.setDeviceMetricsOverride", session, width=1280, height=960, deviceScaleFactor=1, mobile=False
            )
            await goto(f"{base}/search.html?q=softmax")
            report["search"] = await evaluate(SEARCH_RESULTS)

            for e in cdp.events:
                p = e.get("params", {})
                if e["method"] == "Network.requestWillBeSent":
                    report["requests"].append(p["request"]["url"])
                elif e["method"] == "Network.responseReceived" and p["response"]["status"] >= 400:
                    report["failures"].append(f"{p['response']['status']} {p['response']['url']}")
                elif e["method"] == "Network.loadingFailed" and not p.get("canceled"):
                    report["failures"].append(f"{p.get('errorText')} ({p.get('type')})")
                elif e["method"] == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    report["exceptions"].append(d.get("exception", {}).get("description") or d.get("text"))
                elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                    report["console"].append(
                        " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                    )
                elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    report["console"].append(p["entry"].get("text", ""))
            try:
                await cdp.send("Browser.close", timeout=10)
            except (ConnectionError, RuntimeError, asyncio.TimeoutError):
                pass
        finally:
            browser.close()
    return report


@pytest.fixture(scope="session")
def browsed(site):
    """Every page of the site in headless Chromium, at each of WIDTHS: what the page checks report,
    and a screenshot of each page's first screen in book/_build/screenshots/<page>-<width>.png."""
    if CHROMIUM is None:
        pytest.skip(
            "Chromium is not installed (/usr/bin/chromium): `make setup` installs it as root with "
            "apt-get; without it the book's browser test cannot run"
        )
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        start = time.perf_counter()
        report = asyncio.run(asyncio.wait_for(browse(site, base, SCREENSHOTS), 900))
        print(f"browsed {len(report['layout'])} pages and widths in {time.perf_counter() - start:.1f} s")
        return report
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_site_in_a_browser(browsed):
    report = browsed
    problems = []
    for rel, r in report["pages"].items():
        if not r["title"]:
            problems.append(f"{rel}: no title (did it load?)")
        if r["math"] and (r["untypeset"] or not r["typeset"]):
            problems.append(f"{rel}: maths not typeset: {r['untypeset'][:3]}")
        if r["raw_tex"]:
            problems.append(f"{rel}: raw TeX delimiters left in the page text")
        problems += [f"{rel}: image did not load: {img['src']}" for img in r["images"] if img["width"] <= 0]
    for lesson in LESSONS:
        r = report["pages"].get(f"lessons/{lesson}/{lesson}.html")
        if r is None or not r["typeset"]:
            problems.append(f"{lesson}: its page shows no typeset maths")
    foreign = sorted(
        {
            u
            for u in report["requests"]
            if urlparse(u).scheme not in ("data", "blob", "about") and urlparse(u).hostname != "127.0.0.1"
        }
    )
    problems += [f"request to another host: {u}" for u in foreign]
    problems += [f"failed request: {f}" for f in report["failures"]]
    problems += [f"JavaScript error: {e}" for e in report["exceptions"]]
    problems += [f"console error: {e}" for e in sorted(set(report["console"]))]
    if not report["search"]:
        problems.append("searching for 'softmax' found nothing")
    elif "01_attention" in LESSONS and not any("01_attention" in u for u in report["search"]):
        problems.append(f"searching for 'softmax' does not find lesson 01: {report['search']}")
    assert not problems, "\n".join(problems)
    assert report["requests"], "no request was recorded: is Network logging on?"
    for rel in report["pages"]:
        for width in WIDTHS:
            shot = SCREENSHOTS / f"{rel.removesuffix('.html').replace('/', '_')}-{width}.png"
            assert shot.stat().st_size > 10_000, f"no screenshot of {rel} at {width} px"


@pytest.mark.slow
def test_nothing_is_clipped_at_any_width(browsed):
    """At a laptop's and a phone's width, no page is wider than the screen, and no heading, contents
    entry, paragraph or code cell is wider than its box (code wraps; a display equation may scroll
    inside its own box on a phone)."""
    problems = []
    for (rel, width), r in sorted(browsed["layout"].items()):
        if r["document"] > r["viewport"]:
            problems.append(f"{rel} at {width} px: the page is {r['document']} px wide")
        problems += [f"{rel} at {width} px: {c}" for c in r["clipped"]]
    assert not problems, "clipped:\n" + "\n".join(problems[:40])


@pytest.mark.slow
def test_display_equations_fit_the_column_on_a_laptop(browsed):
    too_wide = [
        f"{rel}: {e}" for (rel, width), r in sorted(browsed["layout"].items()) if width == 1280 for e in r["equations"]
    ]
    assert not too_wide, (
        "display equations wider than the text column at 1280 px (break them with "
        "`\\\\` in an aligned environment):\n" + "\n".join(too_wide)
    )


@pytest.mark.slow
def test_every_image_is_described(browsed):
    problems = []
    for (rel, width), r in sorted(browsed["layout"].items()):
        if width != WIDTHS[0]:
            continue
        for img in r["images"]:
            alt = (img["alt"] or "").strip()
            if (
                not alt
                or re.search(r"\.(png|svg|jpe?g|gif)$", alt)
                or re.fullmatch(r"[0-9a-f]{16,}\S*", alt)
                or "no description yet" in alt
            ):
                problems.append(f"{rel}: {img['src']}: alt text {alt!r}")
            if not img["caption"] or re.fullmatch(r"(Fig\. \d+ )?Figure [\dR.]+\.", " ".join(img["caption"].split())):
                problems.append(f"{rel}: {img['src']}: caption {img['caption']!r}")
    assert not problems, "images without a description or a caption:\n" + "\n".join(problems)
