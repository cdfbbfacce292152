"""Build the course's online book: `make book` (or `.venv/bin/python book/build.py`).

1. Run every lesson notebook (lessons/NN_name/NN_name.ipynb) with its reference solutions in a
   fresh python3 kernel (cwd: the lesson's folder), so that its figures are the reference's.
   Figures are drawn at twice their size (matplotlib's 'retina' format).
2. Make the student copy (autograder.release.student_copy with keep_outputs=True): solution code
   and hidden tests go, and so do the outputs of answer and test cells.
3. Assemble the book's sources in book/_generated/: the static pages of book/, one page per
   lesson (the student copy, labelled and captioned for readers: see book_page), the lesson's
   download (the release copy and its data files, zipped), the glossary, the API reference
   (signatures and docstrings of solutions/, never function bodies), the benchmark results (every
   JSON under benchmarks/results/, as tables and plots), and MathJax, fetched once with npm
   (`npm pack mathjax@3`) into book/_build/.mathjax so that the site needs no other host.
4. Run Jupyter Book (Sphinx) with warnings as errors; the site lands in book/_build/html.

Options: --fresh (run every notebook again and rebuild every page), --jobs N (notebooks run in
parallel; default: the number of CPUs), --results DIR (preview other benchmark results),
--allow-warnings (draft builds only: CI uses the default).
"""

import argparse
import ast
import base64
import concurrent.futures
import copy
import datetime
import hashlib
import importlib
import inspect
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
SRC = BOOK / "_generated"  # the assembled book sources (ignored)
BUILD = BOOK / "_build"  # Jupyter Book's output: BUILD/html is the site (ignored)
HTML = BUILD / "html"
NB_CACHE = BUILD / ".notebooks"  # student copies of executed lessons, by content hash (tests/lessons' too: keep_run)
MATHJAX_CACHE = BUILD / ".mathjax"  # the npm package, fetched once
MATHJAX_SPEC = "mathjax@3"
# What the site needs of MathJax's es5 folder: the component Sphinx loads, what it loads on demand
# (TeX extensions, the accessibility menu and its speech engine) and the CHTML fonts.
MATHJAX_PARTS = ["tex-mml-chtml.js", "input", "output/chtml", "a11y", "ui", "sre"]
RESULTS = ROOT / "benchmarks" / "results"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg"}
CACHE_VERSION = "2"  # bump when the way lessons are executed changes
# Figures at twice their size in pixels (shown at their size: sharp on any screen).
KERNEL_ARGS = ["--InlineBackend.figure_formats=retina"]

sys.path.insert(0, str(ROOT))
from autograder import lessons as manifests  # noqa: E402
from autograder import notebook as nbk  # noqa: E402
from autograder.release import release, student_copy  # noqa: E402


def log(msg):
    print(f"[book] {msg}", flush=True)


def load_yaml(path):
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def module_of(lesson):
    """The solutions module of a lesson (its manifest's `solutions`)."""
    return manifests.read(lesson)["solutions"]


# --------------------------------------------------------------------------------------------
# Lessons: execute, strip, cache
# --------------------------------------------------------------------------------------------


def lesson_hash(lesson):
    """A hash of what a lesson's student copy with outputs depends on: the files of its folder (the
    notebook holds its solutions; it reaches solutions/ only from hidden tests, whose outputs go)."""
    h = hashlib.sha256(f"{CACHE_VERSION} {sys.version}".encode())
    folder = nbk.lesson_path(lesson).parent
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not {".ipynb_checkpoints", "__pycache__"} & set(f.relative_to(folder).parts):
            h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def execute_lesson(lesson, timeout=600):
    """Run the source notebook with its solutions; return its student copy (with demo outputs)."""
    start = time.perf_counter()
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = nbk.lesson_path(lesson)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=False,
        extra_arguments=KERNEL_ARGS,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as e:
        # nbclient's message quotes the cell and the traceback, which may show solution code: name
        # the cell and the error only, so that a CI log (maybe public) never shows solutions.
        where = next(
            (
                f"cell {i}" + (f" ({nbk.grade_id(c)})" if nbk.grade_id(c) else "")
                for i, c in enumerate(nb.cells)
                if c.cell_type == "code"
                for o in c.get("outputs", [])
                if o.get("output_type") == "error"
            ),
            "a cell",
        )
        raise RuntimeError(
            f"{lesson}: {where} failed when run with the reference solutions: "
            f"{e.ename}: {str(e.evalue)[:300]} (run the notebook to see the traceback)"
        ) from None
    log(f"  {lesson} ran in {time.perf_counter() - start:.1f} s")
    return reader_copy(json.loads(nbformat.writes(nb)))


def reader_copy(nb):
    """The student copy of a run of a source notebook (a dict), outputs kept, with the machine and date it ran on."""
    copy_ = student_copy(nb, keep_outputs=True)
    copy_["metadata"]["book"] = {"machine": build_machine(), "date": datetime.date.today().isoformat()}
    return copy_


def keep_run(lesson, key, nb):
    """Keep a run of the lesson's source notebook made elsewhere as its cache entry, unless one is there: nb (a dict)
    ran top to bottom without an error, as execute_lesson runs it (a python3 kernel with KERNEL_ARGS, cwd its
    folder), while the lesson's files hashed to key (lesson_hash, taken before the run). tests/lessons' run of
    each source notebook lands here, so that the book's test does not run it again."""
    path = NB_CACHE / f"{lesson}-{key}.ipynb"
    if path.exists():
        return
    NB_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")  # whole or absent for a build reading it at once
    nbk.write(reader_copy(nb), tmp)
    os.replace(tmp, path)


def build_machine():
    """The machine the lessons ran on, in words (the book's timings come from it)."""
    cpu = None
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
    except OSError:
        pass
    words = (
        f"{' '.join((cpu or platform.processor() or platform.machine()).split())}, {os.cpu_count()} logical CPU cores"
    )
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
        gpus = out.stdout.split("\n")[0].strip() if out.returncode == 0 else ""
        if gpus:
            words += f", {gpus}"
    return words


def lesson_copies(lessons, jobs, fresh):
    """{lesson: executed student copy}, from the cache where the lesson has not changed."""
    NB_CACHE.mkdir(parents=True, exist_ok=True)
    wanted = {lesson: NB_CACHE / f"{lesson}-{lesson_hash(lesson)}.ipynb" for lesson in lessons}
    todo = [lesson for lesson, f in wanted.items() if fresh or not f.exists()]
    if todo:
        log(
            f"running {len(todo)} lesson(s) with the reference solutions ({min(jobs, len(todo))} at a time): "
            + ", ".join(todo)
        )
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
            futures = {pool.submit(execute_lesson, lesson): lesson for lesson in todo}
            failed = []
            for fut in concurrent.futures.as_completed(futures):
                lesson = futures[fut]
                try:
                    nbk.write(fut.result(), wanted[lesson])
                except Exception as e:  # report every failing lesson, then stop
                    failed.append(f"{type(e).__name__}: {e}")
        if failed:
            raise SystemExit("[book] " + "\n[book] ".join(failed))
        log(f"lessons ran in {time.perf_counter() - start:.1f} s")
    for f in NB_CACHE.glob("*.ipynb"):  # drop stale cache entries
        if f not in wanted.values():
            f.unlink()
    return {lesson: nbk.read(f) for lesson, f in wanted.items()}


def lesson_title(nb, lesson):
    """The first heading of the notebook's first markdown cell, or the lesson's name."""
    for cell in nb["cells"]:
        if cell.get("cell_type") == "markdown":
            m = re.search(r"^#\s+(.+)$", nbk.source(cell), re.M)
            if m:
                return m.group(1).strip()
            break
    return lesson


def lesson_assets(lesson):
    """Image files of the lesson's folder (markdown cells may show them), relative paths."""
    folder = nbk.lesson_path(lesson).parent
    return [
        f.relative_to(folder)
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES and ".ipynb_checkpoints" not in f.parts
    ]


# --------------------------------------------------------------------------------------------
# Lesson pages: the student copy, labelled and captioned for readers
# --------------------------------------------------------------------------------------------

VISIBLE_TESTS = re.compile(r"^\s*#\s*Visible tests:\s*(.+?)\s*$", re.I)
# What a demo cell that measures time calls (its numbers are the build machine's).
TIMING = re.compile(r"perf_counter|benchmark_ms|timeit|\bTimed\b|time\.time\(|cuda\.Event")
# An object's default repr (`<torch._C.Generator object at 0x7f...>`): a memory address says nothing.
ADDRESS_REPR = re.compile(r"^<[\w.]+ (object )?at 0x[0-9a-fA-F]+>$")
IMAGE_MIME = {"image/svg+xml": ".svg", "image/png": ".png", "image/jpeg": ".jpg"}  # in order of preference


def lesson_number(lesson):
    return int(lesson.split("_", 1)[0])


def visible_tests_summary(cell):
    """The one-line summary a test cell's first line gives (`# Visible tests: ...`), or None."""
    lines = nbk.source(cell).splitlines()
    m = VISIBLE_TESTS.match(lines[0]) if lines else None
    return m.group(1).replace("`", "") if m else None


def figure_specs(cell):
    """The cell's figure metadata (interfaces: {"caption", "alt"}, or a list of them), as a list."""
    spec = cell.get("metadata", {}).get("figure")
    specs = spec if isinstance(spec, list) else [spec] if spec else []
    return [s if isinstance(s, dict) else {} for s in specs]


def is_noise(out):
    """An expression's value that is only an object's address (a cell ending in `torch.manual_seed(0)`)."""
    data = out.get("data", {})
    return (
        out.get("output_type") == "execute_result"
        and set(data) == {"text/plain"}
        and bool(ADDRESS_REPR.match(nbk.source({"source": data["text/plain"]}).strip()))
    )


def one_line(text):
    return " ".join(str(text).split())


def markdown_output(text):
    return {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": text}}


def timed_on(machine):
    return f"Timed when this book was built, on {machine}; your own machine will differ."


def figure_output(path, number, spec, width, machine):
    """A figure as MyST (rendered by myst-nb): the image file, its alt text, number and caption."""
    label = f"Figure {number}"
    caption = one_line(spec.get("caption", ""))
    if machine:
        caption += " " + timed_on(machine)
    alt = one_line(spec.get("alt", "")) or f"{label} (no description yet)"
    lines = [f"```{{figure}} {path}", f":alt: {alt}"]
    if width:
        lines.append(f":width: {width}px")
    lines += ["", f"**{label}.** {caption}".rstrip(), "```"]
    return markdown_output("\n".join(lines) + "\n")


def code_cell_for_readers(cell, lesson, figures, machine, files):
    """A demo or provided code cell with readable outputs: address reprs dropped (myst-nb merges prints),
    images as numbered figures with caption and alt text (files: {path: bytes} of the images)."""
    specs = figure_specs(cell)
    timed = machine if nbk.is_demo(cell) and TIMING.search(nbk.source(cell)) else None
    outputs, drawn = [], 0
    for out in cell.get("outputs", []):
        mime = next((m for m in IMAGE_MIME if m in out.get("data", {})), None)
        if mime is None:
            if not is_noise(out):
                outputs.append(out)
            continue
        figures.append(f"{lesson_number(lesson)}.{len(figures) + 1}")
        data = nbk.source({"source": out["data"][mime]})
        name = f"figures/figure-{figures[-1].replace('.', '-')}{IMAGE_MIME[mime]}"
        files[name] = data.encode() if mime == "image/svg+xml" else base64.b64decode(data)
        width = out.get("metadata", {}).get(mime, {}).get("width")
        outputs.append(figure_output(name, figures[-1], specs[drawn] if drawn < len(specs) else {}, width, timed))
        drawn += 1
    if timed and not drawn and outputs:
        outputs.append(markdown_output(f"*{timed_on(machine)}*\n"))
    cell = dict(cell, outputs=outputs, metadata=copy.deepcopy(cell.get("metadata", {})))
    if any("text/markdown" in o.get("data", {}) for o in outputs):
        cell["metadata"].setdefault("mystnb", {})["markdown_format"] = "myst"
    return cell


def visible_tests_for_readers(cell):
    """A visible-test cell, folded under a summary of what it checks."""
    summary = visible_tests_summary(cell) or f"what {nbk.grade_id(cell).removeprefix('test_')} must do"
    meta = copy.deepcopy(cell.get("metadata", {}))
    meta["tags"] = list(meta.get("tags", [])) + ["hide-input", "visible-tests"]
    meta.setdefault("mystnb", {}).update(
        code_prompt_show=f"Visible tests: {summary}", code_prompt_hide=f"Visible tests: {summary}"
    )
    return dict(cell, metadata=meta)


def answer_label(cell):
    """The "Your answer" label put above an answer cell (a markdown cell of its own)."""
    return {
        "cell_type": "markdown",
        "id": f"label-{cell.get('id') or nbk.grade_id(cell)}"[:64],
        "metadata": {},
        "source": ["```{container} cell-label answer-label\n", "Your answer\n", "```\n"],
    }


def download_note(lesson):
    return (
        f"\n:::{{admonition}} Run this lesson yourself\n:class: tip download-lesson\n"
        f"{{download}}`Download {lesson}.zip <{lesson}.zip>`: the notebook as students get it (no "
        f"solutions), with the data files it needs. Unzip it and open it in JupyterLab; "
        f"{{ref}}`the front page <run-locally>` says how.\n:::\n"
    )


def book_page(nb, lesson, glossary):
    """The lesson's page for the book, and {path in its folder: bytes} of the figures it shows.

    nb is the executed student copy. Readers see: the download after the title; each answer cell
    under a "Your answer" label; each visible-test cell folded under its summary; glossary links at
    the first use of each term; demo outputs as in Jupyter, with figures numbered, captioned and
    described (cell metadata "figure"), and timings that say where they were measured."""
    machine = nb.get("metadata", {}).get("book", {})
    machine = f"{machine['machine']} ({machine['date']})" if "machine" in machine else "the build machine"
    page, files, figures, linked, titled = dict(nb, cells=[]), {}, [], set(), False
    for cell in nb["cells"]:
        if cell.get("cell_type") == "markdown":
            text = glossary.link(nbk.source(cell), linked)
            if not titled:
                text, titled = (
                    re.sub(
                        r"^(#\s+.+)$", lambda m: m.group(1) + "\n" + download_note(lesson), text, count=1, flags=re.M
                    ),
                    True,
                )
            cell = dict(cell)
            nbk.set_source(cell, text)
        elif cell.get("cell_type") == "code":
            if nbk.is_answer(cell):
                page["cells"].append(answer_label(cell))
            elif nbk.is_test(cell):
                cell = visible_tests_for_readers(cell)
            else:
                cell = code_cell_for_readers(cell, lesson, figures, machine, files)
        page["cells"].append(cell)
    return page, files


def lesson_download(lesson):
    """The lesson as students get it, zipped: <lesson>/<lesson>.ipynb and its data files (the
    release copy: autograder.release). Fixed timestamps, so an unchanged lesson gives the same bytes."""
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        release(tmp, [lesson])
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                info = zipfile.ZipInfo(f.relative_to(tmp).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, f.read_bytes())
    return buf.getvalue()


# --- glossary ---------------------------------------------------------------------------------

# Markdown that a glossary link must not enter: code, maths, links, HTML, headings, directive
# lines and options, targets. The text between these is prose.
PROTECTED = re.compile(
    r"""
    ^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?^[ \t]*\1[^\n]*$     # fenced blocks (code and directives)
  | ^[ \t]*(?::{3,}|\#|\([^)\n]*\)=|:[\w-]+:)[^\n]*     # colon fences, headings, targets, options
  | \$\$.*?\$\$ | (?<![\\$])\$(?:\\.|[^$\\])+?\$          # maths
  | \\begin\{([\w*]+)\}.*?\\end\{\2\}
  | (`+).*?\3                                             # code spans and roles' content
  | \{[\w:-]+\}                                            # role names
  | !?\[[^\]\n]*\]\([^)\n]*\) | <[^>\n]+> | https?://\S+  # links, HTML, addresses
""",
    re.M | re.S | re.X,
)


class Glossary:
    """book/glossary.md's entries: each a list of terms (the first is the entry's name), linked from
    prose with {term}. A term with two or more capitals (GQA, KV cache) matches as written, others
    in any case; a trailing s or es (heads, FLOPs) is allowed; compounds (multi-head) are not split."""

    def __init__(self, text):
        self.entries = []
        body = re.search(r"^```\{glossary\}[^\n]*\n(.*?)^```", text, re.M | re.S)
        group = []
        for line in (body.group(1) if body else "").splitlines():
            if line.strip() and not line[0].isspace() and not line.startswith(":"):
                group.append(line.strip())
            elif group:
                self.entries.append(group)
                group = []
        alternatives = []
        for i, terms in enumerate(self.entries):
            for term in terms:
                pattern = re.escape(term).replace(r"\ ", r"[ \n]+")
                scope = "(?:" if sum(c.isupper() for c in term) >= 2 else "(?i:"
                alternatives.append((len(term), f"(?P<e{i}_{len(alternatives)}>{scope}{pattern}(?:e?s)?))"))
        alternatives.sort(key=lambda a: -a[0])  # the longest term wins where several start
        self.pattern = (
            re.compile(r"(?<![\w-])(?:" + "|".join(a for _, a in alternatives) + r")(?![\w-])")
            if alternatives
            else None
        )

    def link(self, markdown, linked):
        """markdown with the first use of each entry not in `linked` (updated) linked to the glossary."""
        if self.pattern is None:
            return markdown

        def prose(text):
            def sub(m):
                entry = int(m.lastgroup[1:].split("_")[0])
                if entry in linked:
                    return m.group(0)
                linked.add(entry)
                return f"{{term}}`{' '.join(m.group(0).split())} <{self.entries[entry][0]}>`"

            return self.pattern.sub(sub, text)

        out, pos = [], 0
        for m in PROTECTED.finditer(markdown):
            out += [prose(markdown[pos : m.start()]), m.group(0)]
            pos = m.end()
        return "".join(out + [prose(markdown[pos:])])


# --------------------------------------------------------------------------------------------
# MathJax: a local copy from the npm registry
# --------------------------------------------------------------------------------------------


def mathjax_dir():
    """The es5 folder of the mathjax@3 npm package, fetched into MATHJAX_CACHE on first use."""
    es5 = MATHJAX_CACHE / "package" / "es5"
    if (es5 / "tex-mml-chtml.js").exists():
        return es5
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "[book] npm is needed once to fetch MathJax (the site serves it itself): "
            "install Node.js (apt-get install npm), or unpack the npm package "
            f"{MATHJAX_SPEC} into {MATHJAX_CACHE}/package"
        )
    MATHJAX_CACHE.mkdir(parents=True, exist_ok=True)
    log(f"fetching {MATHJAX_SPEC} with npm into {MATHJAX_CACHE.relative_to(ROOT)}")
    for old in MATHJAX_CACHE.glob("mathjax-*.tgz"):
        old.unlink()
    out = subprocess.run([npm, "pack", MATHJAX_SPEC], capture_output=True, text=True, cwd=MATHJAX_CACHE)
    tgz = sorted(MATHJAX_CACHE.glob("mathjax-*.tgz"))
    if out.returncode != 0 or not tgz:
        raise SystemExit(
            f"[book] `npm pack {MATHJAX_SPEC}` failed (is the npm registry reachable?):\n{out.stderr[-2000:]}"
        )
    with tarfile.open(tgz[-1]) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12: refuse odd members
            tar.extractall(MATHJAX_CACHE, filter="data")
        else:
            tar.extractall(MATHJAX_CACHE)
    tgz[-1].unlink()
    if not (es5 / "tex-mml-chtml.js").exists():
        raise SystemExit(f"[book] {MATHJAX_SPEC} has no es5/tex-mml-chtml.js: is it still MathJax 3?")
    return es5


def mathjax_files(es5):
    """{path in the site's _static/mathjax: source file}."""
    files = {"LICENSE": es5.parent / "LICENSE"}
    for part in MATHJAX_PARTS:
        p = es5 / part
        for f in [p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []:
            if f.is_file():
                files[f.relative_to(es5).as_posix()] = f
    return files


# --------------------------------------------------------------------------------------------
# Pages
# --------------------------------------------------------------------------------------------


def md_escape(text):
    """Text as literal MyST Markdown (no emphasis, maths, links or table cells)."""
    text = " ".join(str(text).split())
    return re.sub(r"([\\`*_{}\[\]()<>#+\-.!|$~^&:=])", r"\\\1", text)


def lessons_table(catalogue, lessons, titles):
    """The table of lessons for the intro page: published ones link to their page."""
    rows = ["| lesson | what you build |", "|---|---|"]
    for lesson in sorted(set(catalogue) | set(lessons)):
        info = catalogue.get(lesson, {})
        title = info.get("title") or titles.get(lesson, lesson)
        number = lesson.split("_", 1)[0]
        name = (
            f"[{number}. {title}](lessons/{lesson}/{lesson}.ipynb)"
            if lesson in lessons
            else f"{number}. {title} *(coming soon)*"
        )
        rows.append(f"| {name} | {info.get('summary', '')} |")
    return "\n".join(rows)


def fence(n):
    return "`" * n


def signature_of(obj, name):
    """`name(args)` for a function, or for a class its constructor's arguments (without self)."""
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None
    try:
        ast.parse(f"def {name}{sig}: pass")  # Sphinx must be able to parse it
    except SyntaxError:
        return None
    return f"{name}{sig}"


def doc_block(obj, ticks=3):
    doc = inspect.getdoc(obj) if obj.__doc__ else None  # its own docstring, not torch.nn.Module's
    return (
        f"{fence(ticks)}{{code-block}} text\n:class: docstring\n\n{doc}\n{fence(ticks)}\n"
        if doc
        else "*(no docstring)*\n"
    )


def class_methods(cls):
    """The methods a student writes or calls: defined in the class itself, public or __init__/__len__."""
    for name, member in vars(cls).items():
        if inspect.isfunction(member) and (not name.startswith("_") or name in ("__init__", "__len__", "__call__")):
            yield name, member


def api_entry(lesson, module, name, contract):
    """One graded name: its signature and docstring from solutions/ (never its body)."""
    try:
        obj = getattr(importlib.import_module(f"solutions.{module}"), name)
    except (ImportError, AttributeError) as e:
        log(f"warning: {lesson}: solutions.{module}.{name} not found ({type(e).__name__})")
        return f"### `{name}`\n\n{contract}\n\n*Not in the reference solutions yet.*\n"
    kind = "class" if inspect.isclass(obj) else "function"
    sig = signature_of(obj, name)
    if sig is None:
        return f"### `{name}`\n\n{contract}\n\n{doc_block(obj)}"
    # No index entry: the general index would show "(in module attention)", a module students never import.
    parts = [f"{fence(5)}{{py:{kind}}} {sig}", f":module: {module}", ":no-index-entry:", ""]
    if kind == "class":
        bases = [b for b in obj.__bases__ if b is not object]
        if bases:
            names = [f"{b.__module__}.{b.__qualname__}".replace("torch.nn.modules.module.", "torch.nn.") for b in bases]
            parts.append("Subclass of " + ", ".join(f"`{n}`" for n in names) + ".\n")
    parts += [contract, "", doc_block(obj)]
    if kind == "class":
        for mname, member in class_methods(obj):
            if mname == "__init__":
                continue  # its arguments are the class's signature
            msig = signature_of(member, mname)
            if msig is None:
                parts.append(f"`{mname}`\n\n{doc_block(member)}")
                continue
            msig = msig.replace("(self, ", "(", 1).replace("(self)", "()", 1)
            parts += [
                f"{fence(4)}{{py:method}} {msig}",
                ":no-index-entry:",
                "",
                doc_block(member) if member.__doc__ else "",
                fence(4),
                "",
            ]
    parts.append(fence(5))
    return "\n".join(parts) + "\n"


def api_page(catalogue, lessons, titles, graded):
    out = [
        "# API reference: the graded functions",
        "",
        "Every exercise of the course is one function or class in a lesson notebook. This page lists them",
        "all, lesson by lesson: what the course's contract fixes (names, signatures, shapes), and the",
        "signature and docstring you find in the notebook's answer cell. The grader calls exactly these",
        "names with these arguments, so keep them as they are.",
        "",
        ":::{note}",
        "Conventions used everywhere: `B` batch, `T` sequence length (`Tq`, `Tk` for queries and keys),",
        "`D` model width, `H` query heads, `Hkv` key/value heads, `Dh = D // H` head width; multi-head",
        'tensors are laid out `(B, H, T, Dh)`. Masks are boolean and **True means "may attend"**; causal',
        "masks are aligned bottom-right (query `i` may see key `j` iff `j <= i + (Tk - Tq)`). Lesson 01",
        "works in numpy, the later lessons in torch on whatever device the inputs are on.",
        ":::",
        "",
    ]
    for lesson in sorted(set(catalogue) | set(lessons)):
        info = catalogue.get(lesson, {})
        title = info.get("title") or titles.get(lesson, lesson)
        number = lesson.split("_", 1)[0]
        out += [f"## {number}. {title}", ""]
        if lesson in lessons:
            out += [f"Lesson page: [{title}](lessons/{lesson}/{lesson}.ipynb).", ""]
        else:
            out += ["*This lesson is not published yet; its functions are listed from the reference.*", ""]
        contracts = dict(info.get("graded") or {})
        names = list(graded.get(lesson, [])) + [n for n in contracts if n not in graded.get(lesson, [])]
        for name in names:
            out.append(api_entry(lesson, module_of(lesson), name, contracts.get(name, "")))
    return "\n".join(out)


# --- results ----------------------------------------------------------------------------------

GPU_KEYS = re.compile(r"device|gpu|accelerator|hardware|platform|machine|backend", re.I)
GPU_VALUES = re.compile(r"cuda|nvidia|\bgpu\b|\b[ahbvtlp]\d{2,3}\b|geforce|rtx|tesla|rocm|radeon|instinct", re.I)


def measured_on_gpu(data):
    """Does this result say (under a device-like key) that it ran on a GPU?"""
    if isinstance(data, dict):
        for k, v in data.items():
            if (
                isinstance(v, str)
                and GPU_KEYS.search(str(k))
                and GPU_VALUES.search(v)
                and not re.search(r"\bno\b|unavailable|not available", v, re.I)
            ):
                return True
            if measured_on_gpu(v):
                return True
    elif isinstance(data, list):
        return any(measured_on_gpu(v) for v in data)
    return False


def cell(value):
    if isinstance(value, bool) or value is None:
        return f"`{json.dumps(value)}`"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)
        return md_escape(text if len(text) <= 120 else text[:117] + "...")
    return md_escape(value)


def table(header, rows):
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def is_records(value):
    return isinstance(value, list) and value and all(isinstance(v, dict) for v in value)


def render_json(data, level=3, label=None):
    """Any JSON value as Markdown: tables for records and key/value pairs, sections for nesting."""
    out = []
    if label is not None:
        out.append(f"{'#' * level} {md_escape(label)}\n" if level <= 4 else f"**{md_escape(label)}**\n")
        level += 1
    if is_records(data):
        columns = list(dict.fromkeys(k for row in data for k in row))
        out.append(table(columns, [[row.get(c, "") for c in columns] for row in data]))
    elif isinstance(data, dict):
        flat = {
            k: v
            for k, v in data.items()
            if not isinstance(v, (dict, list))
            or (isinstance(v, list) and not is_records(v) and not any(isinstance(x, (dict, list)) for x in v))
        }
        if flat:
            out.append(table(["key", "value"], list(flat.items())))
        for k, v in data.items():
            if k not in flat:
                out.append(render_json(v, level, str(k)))
    elif isinstance(data, list) and data and all(isinstance(v, list) for v in data):
        width = max(len(v) for v in data)
        out.append(table(["row"] + [str(i) for i in range(width)], [[i] + list(v) for i, v in enumerate(data)]))
    elif isinstance(data, list):
        out.append(table(["#", "value"], list(enumerate(data))))
    else:
        out.append(cell(data) + "\n")
    return "\n".join(out)


def benchmark_script(path, data):
    """benchmarks/<name>.py that wrote a result: its "benchmark" key, or the longest script name
    that the file's name starts with (solutions_cpu.json: solutions.py); None if there is none."""
    scripts = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    name = data.get("benchmark") if isinstance(data, dict) else None
    if name not in scripts:
        name = max((s for s in scripts if path.stem.startswith(s)), key=len, default=None)
    return scripts.get(name)


def provenance(path, data):
    """What a result measured (its script's docstring, first paragraph), where and when, in Markdown."""
    script = benchmark_script(path, data)
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) if script else None
    what = one_line(doc.split("\n\n")[0]) if doc else "not said (no script in benchmarks/ wrote this file)"
    info = data if isinstance(data, dict) else {}
    where = (
        "; ".join(
            f"{k} {one_line(info[k])}"
            for k in ("machine", "device", "mode", "torch", "triton", "cuda")
            if info.get(k) not in (None, "")
        )
        or "not recorded"
    )
    when = one_line(info.get("date") or "not recorded")
    by = f" by `benchmarks/{script.name}`" if script else ""
    return (
        f"- **What:** {md_escape(what)}\n- **Where:** {md_escape(where)}\n- **When:** {md_escape(when)}\n"
        f"- **File:** `benchmarks/results/{path.name}`, written{by}\n"
    )


SEQ_KEYS, MEASURE_KEYS, PANEL_KEYS = ("seq_len", "T"), ("tflops", "ms"), ("dtype", "head_dim", "causal")


def plottable(data):
    """[(label, records)] of the result's record lists that have a sequence length and a time or
    TFLOP/s (the plots: measure against T, one line per method, one panel per configuration)."""
    found = []

    def walk(value, label):
        if (
            is_records(value)
            and any(k in value[0] for k in SEQ_KEYS)
            and any(k in r for r in value for k in MEASURE_KEYS)
        ):
            found.append((label, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k))

    walk(data, "results")
    return found


def plot_records(records):
    """A PNG (2x) of a measure against T, and its alt text; None when nothing was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = next(k for k in SEQ_KEYS if k in records[0])
    y = next(k for k in MEASURE_KEYS if any(k in r for r in records))
    rows = [r for r in records if isinstance(r.get(y), (int, float)) and isinstance(r.get(x), (int, float))]
    if not rows:
        return None
    panels = [k for k in PANEL_KEYS if k in rows[0]]
    configs = sorted({tuple(r.get(k) for k in panels) for r in rows}, key=str)
    ncols = 2 if len(configs) > 1 else 1
    nrows = -(-len(configs) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(8, 3 * nrows + 0.8), squeeze=False, sharey=True, layout="constrained"
    )
    methods = sorted({str(r.get("method", y)) for r in rows})
    for ax, config in zip(axes.flat, configs):
        for method in methods:
            pts = sorted(
                (r[x], r[y])
                for r in rows
                if str(r.get("method", y)) == method and tuple(r.get(k) for k in panels) == config
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_title(", ".join(f"{k} {v}" for k, v in zip(panels, config)) or y, fontsize=10)
        ax.set_xlabel(x)
        ax.set_ylabel({"tflops": "forward TFLOP/s", "ms": "time (ms)"}[y])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(configs) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=200, metadata={"Software": None})
    plt.close(fig)
    measure = {"tflops": "forward TFLOP/s", "ms": "time in milliseconds"}[y]
    alt = (
        f"Line plots of {measure} against {x} (log scale), one panel per configuration "
        f"({', '.join(panels) or 'one'}), one line per method: {', '.join(methods)}."
    )
    return buf.getvalue(), alt, measure, x


def results_page(results_dir, figures_dir):
    """The results page, and {path under figures_dir: image (a source file or bytes)} of its figures."""
    files = sorted(results_dir.rglob("*.json")) if results_dir.is_dir() else []
    images = (
        sorted(f for f in results_dir.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES) if results_dir.is_dir() else []
    )
    out = [
        "# Benchmark results",
        "",
        "Measured by the scripts in `benchmarks/`, which print ratios against baselines measured in the",
        "same run, and recorded as JSON under `benchmarks/results/`. Every file there is shown below:",
        "what it measured, where and when, its numbers as tables and, where they run over sequence",
        "lengths, as a plot.",
        "",
    ]
    parsed, broken = {}, []
    for f in files:
        try:
            parsed[f] = json.loads(f.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            broken.append((f, e))
    gpu = [f for f, data in parsed.items() if measured_on_gpu(data)]
    if not files:
        out += [
            ":::{important}",
            "No benchmark results have been recorded yet: `benchmarks/results/` is empty.",
            "No GPU results have been measured yet either.",
            ":::",
            "",
        ]
    elif not gpu:
        out += [
            ":::{important}",
            "No GPU results have been measured yet: every result below was measured "
            "without a GPU (or does not say on which device it ran).",
            ":::",
            "",
        ]
    else:
        out += [f"GPU results: {', '.join('`' + f.relative_to(results_dir).as_posix() + '`' for f in gpu)}.", ""]
    figures, number = {}, 0
    if images:
        out += ["## Figures", ""]
        for img in images:
            rel = img.relative_to(results_dir).as_posix()
            figures[rel] = img
            number += 1
            out += [
                f"```{{figure}} {figures_dir}/{rel}",
                f":alt: The figure {md_escape(rel)} of the benchmark results",
                ":width: 100%",
                "",
                f"**Figure R.{number}.** `{rel}`, as recorded under `benchmarks/results/`.",
                "```",
                "",
            ]
    for f in files:
        rel = f.relative_to(results_dir).as_posix()
        data = parsed.get(f)
        script = benchmark_script(f, data) if f in parsed else None
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) if script else None
        title = re.split(r"[:,.]", one_line(doc.split("\n\n")[0]))[0].replace("`", "") if doc else rel
        out += [f"## {md_escape(title)}" + (f" ({md_escape(rel)})" if doc else ""), ""]
        if f not in parsed:
            err = dict(broken)[f]
            log(f"warning: {rel} is not valid JSON ({err})")
            out += [":::{warning}", f"This file is not valid JSON: {md_escape(str(err))}", ":::", ""]
            continue
        out += [provenance(f, data), "Measured on a GPU." if f in gpu else "Not measured on a GPU.", ""]
        for label, records in plottable(data):
            plot = plot_records(records)
            if plot is None:
                continue
            png, alt, measure, x = plot
            number += 1
            name = f"{f.stem}-{re.sub(r'[^A-Za-z0-9]+', '-', label)}.png"
            figures[name] = png
            out += [
                f"```{{figure}} {figures_dir}/{name}",
                f":alt: {alt}",
                "",
                f"**Figure R.{number}.** {md_escape(measure[0].upper() + measure[1:])} against {md_escape(x)}, from "
                f"`{rel}` ({md_escape(label)}); the tables below have every number.",
                "```",
                "",
            ]
        out.append(render_json(data, 3))
    return "\n".join(out), figures


# --------------------------------------------------------------------------------------------
# Assembling and building
# --------------------------------------------------------------------------------------------


def toc(lessons):
    lines = ["format: jb-book", "root: index", "parts:", "  - caption: Lessons", "    chapters:"]
    lines += [f"      - file: lessons/{lesson}/{lesson}" for lesson in lessons] or ["      - file: no_lessons"]
    lines += [
        "  - caption: Reference",
        "    chapters:",
        "      - file: glossary",
        "      - file: api",
        "      - file: instructor",
        "      - file: results",
    ]
    return "\n".join(lines) + "\n"


def sync_tree(files, dest):
    """Make dest hold exactly files ({relative path: bytes or source Path}); unchanged files keep
    their modification time, so Sphinx rebuilds only what changed."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        target = dest / rel
        data = content.read_bytes() if isinstance(content, Path) else content
        if not target.is_file() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    for f in sorted(dest.rglob("*"), reverse=True):
        rel = f.relative_to(dest).as_posix()
        if f.is_file() and rel not in files:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()


def site_config(path=BOOK / "_config.yml"):
    """book/_config.yml as the build uses it, and the repository's address (its one setting,
    `repository: url`; empty: no repository button and no link)."""
    config = load_yaml(path)
    url = ((config.get("repository") or {}).get("url") or "").strip()
    options = config.setdefault("sphinx", {}).setdefault("config", {}).setdefault("html_theme_options", {})
    options["use_repository_button"] = bool(url)
    if url:
        options["repository_url"] = url
    import yaml

    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True), url


def instructor_page():
    """book/instructor.md with the README's "Teach and grade" section in its place: one text for both."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Teach and grade\n", 1)[1].split("\n## ", 1)[0]
    page = (BOOK / "instructor.md").read_text(encoding="utf-8")
    return page.replace("<!-- README: Teach and grade -->", "## Grade, and scale out\n" + section.strip())


def assemble(jobs, fresh, results=RESULTS):
    catalogue = manifests.catalogue()
    lessons = manifests.names()
    copies = lesson_copies(lessons, jobs, fresh)
    titles = {lesson: lesson_title(nb, lesson) for lesson, nb in copies.items()}
    graded = {lesson: [gid.removeprefix("test_") for gid, _ in nbk.graded_tests(nb)] for lesson, nb in copies.items()}

    config, repository = site_config()
    files = {}
    files["_config.yml"] = config.encode()
    files["instructor.md"] = instructor_page().encode()
    intro = (BOOK / "intro.md").read_text(encoding="utf-8")
    intro = intro.replace("<!-- LESSONS -->", lessons_table(catalogue, lessons, titles))
    files["index.md"] = intro.replace(
        "<!-- REPOSITORY -->", f"The course's sources: <{repository}>." if repository else ""
    ).encode()
    files["_toc.yml"] = toc(lessons).encode()
    glossary_text = (BOOK / "glossary.md").read_text(encoding="utf-8")
    files["glossary.md"] = glossary_text.encode()
    glossary = Glossary(glossary_text)
    if not lessons:
        files["no_lessons.md"] = b"# Lessons\n\nNo lesson has been written yet.\n"
    for lesson, nb in copies.items():
        page, figures = book_page(nb, lesson, glossary)
        files[f"lessons/{lesson}/{lesson}.ipynb"] = (json.dumps(page, indent=1, ensure_ascii=False) + "\n").encode()
        files[f"lessons/{lesson}/{lesson}.zip"] = lesson_download(lesson)
        for rel, data in figures.items():
            files[f"lessons/{lesson}/{rel}"] = data
        folder = nbk.lesson_path(lesson).parent
        for rel in lesson_assets(lesson):
            files[f"lessons/{lesson}/{rel.as_posix()}"] = folder / rel
    files["api.md"] = api_page(catalogue, lessons, titles, graded).encode()
    page, figures = results_page(results, "results_figures")
    files["results.md"] = page.encode()
    for rel, src in figures.items():
        files[f"results_figures/{rel}"] = src
    for f in sorted((BOOK / "static").rglob("*")):
        if f.is_file():
            files[f"static/{f.relative_to(BOOK / 'static').as_posix()}"] = f
    for rel, src in mathjax_files(mathjax_dir()).items():
        files[f"static/mathjax/{rel}"] = src
    sync_tree(files, SRC)
    return lessons


def build(strict=True, fresh=False):
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
        "build",
        str(SRC),
        "--path-output",
        str(BOOK),
        "--builder",
        "html",
    ]
    if strict:
        cmd += ["-W", "--keep-going"]
    if fresh:
        cmd.append("--all")
    shutil.rmtree(HTML, ignore_errors=True)  # no stale page survives (the doctrees stay cached)
    log("building the site with Jupyter Book" + (" (warnings are errors)" if strict else ""))
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fresh", action="store_true", help="run every notebook again and rebuild every page")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks run at once")
    p.add_argument(
        "--results", type=Path, default=RESULTS, help="the benchmark results to show (default: benchmarks/results)"
    )
    p.add_argument("--allow-warnings", action="store_true", help="do not treat Sphinx warnings as errors")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if not os.path.exists("/dev/nvidia0"):  # lesson 06's Triton kernels run in the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    lessons = assemble(args.jobs, args.fresh, args.results)
    rc = build(strict=not args.allow_warnings, fresh=args.fresh)
    if rc != 0:
        log(f"the build failed (exit status {rc}); see the warnings above")
        return rc
    pages = [p for p in HTML.rglob("*.html") if p.relative_to(HTML).parts[0] != "_static"]
    log(
        f"{len(pages)} pages ({len(lessons)} lesson(s)) in {HTML.relative_to(ROOT)} "
        f"in {time.perf_counter() - start:.1f} s; open {HTML.relative_to(ROOT)}/index.html"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
