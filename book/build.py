"""Build the course's online book: `make book` (or `.venv/bin/python book/build.py`).

1. Run every lesson notebook (lessons/NN_name/NN_name.ipynb) with its reference solutions in a
   fresh python3 kernel (cwd: the lesson's folder), so that its figures are the reference's.
2. Make the student copy (autograder.release.student_copy with keep_outputs=True): solution code
   and hidden tests go, and so do the outputs of answer and test cells.
3. Assemble the book's sources in book/_generated/: the static pages of book/, one page per
   lesson, the API reference (signatures and docstrings of solutions/, never function bodies),
   the benchmark results (every JSON under benchmarks/results/), and MathJax, fetched once with
   npm (`npm pack mathjax@3`) into book/_build/.mathjax so that the site needs no other host.
4. Run Jupyter Book (Sphinx) with warnings as errors; the site lands in book/_build/html.

Options: --fresh (run every notebook again and rebuild every page), --jobs N (notebooks run in
parallel; default: the number of CPUs), --results DIR (preview other benchmark results),
--allow-warnings (draft builds only: CI uses the default).
"""
import argparse
import ast
import concurrent.futures
import hashlib
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
SRC = BOOK / "_generated"                # the assembled book sources (ignored)
BUILD = BOOK / "_build"                  # Jupyter Book's output: BUILD/html is the site (ignored)
HTML = BUILD / "html"
NB_CACHE = BUILD / ".notebooks"          # student copies of executed lessons, by content hash
MATHJAX_CACHE = BUILD / ".mathjax"       # the npm package, fetched once
MATHJAX_SPEC = "mathjax@3"
# What the site needs of MathJax's es5 folder: the component Sphinx loads, what it loads on demand
# (TeX extensions, the accessibility menu and its speech engine) and the CHTML fonts.
MATHJAX_PARTS = ["tex-mml-chtml.js", "input", "output/chtml", "a11y", "ui", "sre"]
RESULTS = ROOT / "benchmarks" / "results"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg"}
CACHE_VERSION = "1"                      # bump when the way lessons are executed changes

sys.path.insert(0, str(ROOT))
from autograder import notebook as nbk  # noqa: E402
from autograder.release import student_copy  # noqa: E402


def log(msg):
    print(f"[book] {msg}", flush=True)


def load_yaml(path):
    import yaml
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def module_of(lesson):
    """The solutions module of a lesson: its name without the number (01_attention -> attention)."""
    return lesson.split("_", 1)[1]


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
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as e:
        # nbclient's message quotes the cell and the traceback, which may show solution code: name
        # the cell and the error only, so that a CI log (maybe public) never shows solutions.
        where = next((f"cell {i}" + (f" ({nbk.grade_id(c)})" if nbk.grade_id(c) else "")
                      for i, c in enumerate(nb.cells) if c.cell_type == "code"
                      for o in c.get("outputs", []) if o.get("output_type") == "error"), "a cell")
        raise RuntimeError(f"{lesson}: {where} failed when run with the reference solutions: "
                           f"{e.ename}: {str(e.evalue)[:300]} (run the notebook to see the traceback)") from None
    log(f"  {lesson} ran in {time.perf_counter() - start:.1f} s")
    return student_copy(json.loads(nbformat.writes(nb)), keep_outputs=True)


def lesson_copies(lessons, jobs, fresh):
    """{lesson: executed student copy}, from the cache where the lesson has not changed."""
    NB_CACHE.mkdir(parents=True, exist_ok=True)
    wanted = {lesson: NB_CACHE / f"{lesson}-{lesson_hash(lesson)}.ipynb" for lesson in lessons}
    todo = [lesson for lesson, f in wanted.items() if fresh or not f.exists()]
    if todo:
        log(f"running {len(todo)} lesson(s) with the reference solutions ({min(jobs, len(todo))} at a time): "
            + ", ".join(todo))
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
    for f in NB_CACHE.glob("*.ipynb"):           # drop stale cache entries
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
    return [f.relative_to(folder) for f in sorted(folder.rglob("*"))
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES and ".ipynb_checkpoints" not in f.parts]


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
        raise SystemExit("[book] npm is needed once to fetch MathJax (the site serves it itself): "
                         "install Node.js (apt-get install npm), or unpack the npm package "
                         f"{MATHJAX_SPEC} into {MATHJAX_CACHE}/package")
    MATHJAX_CACHE.mkdir(parents=True, exist_ok=True)
    log(f"fetching {MATHJAX_SPEC} with npm into {MATHJAX_CACHE.relative_to(ROOT)}")
    for old in MATHJAX_CACHE.glob("mathjax-*.tgz"):
        old.unlink()
    out = subprocess.run([npm, "pack", MATHJAX_SPEC], capture_output=True, text=True, cwd=MATHJAX_CACHE)
    tgz = sorted(MATHJAX_CACHE.glob("mathjax-*.tgz"))
    if out.returncode != 0 or not tgz:
        raise SystemExit(f"[book] `npm pack {MATHJAX_SPEC}` failed (is the npm registry reachable?):\n"
                         f"{out.stderr[-2000:]}")
    with tarfile.open(tgz[-1]) as tar:
        if hasattr(tarfile, "data_filter"):       # Python >= 3.11.4 / 3.10.12: refuse odd members
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
        for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []):
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
        name = f"[{number}. {title}](lessons/{lesson}/{lesson}.ipynb)" if lesson in lessons \
            else f"{number}. {title} *(coming soon)*"
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
        ast.parse(f"def {name}{sig}: pass")      # Sphinx must be able to parse it
    except SyntaxError:
        return None
    return f"{name}{sig}"


def doc_block(obj, ticks=3):
    doc = inspect.getdoc(obj) if obj.__doc__ else None   # its own docstring, not torch.nn.Module's
    return f"{fence(ticks)}{{code-block}} text\n:class: docstring\n\n{doc}\n{fence(ticks)}\n" if doc else "*(no docstring)*\n"


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
    parts = [f"{fence(5)}{{py:{kind}}} {sig}", f":module: {module}", ""]
    if kind == "class":
        bases = [b for b in obj.__bases__ if b is not object]
        if bases:
            names = [f"{b.__module__}.{b.__qualname__}".replace("torch.nn.modules.module.", "torch.nn.") for b in bases]
            parts.append("Subclass of " + ", ".join(f"`{n}`" for n in names) + ".\n")
    parts += [contract, "", doc_block(obj)]
    if kind == "class":
        for mname, member in class_methods(obj):
            if mname == "__init__":
                continue          # its arguments are the class's signature
            msig = signature_of(member, mname)
            if msig is None:
                parts.append(f"`{mname}`\n\n{doc_block(member)}")
                continue
            msig = msig.replace("(self, ", "(", 1).replace("(self)", "()", 1)
            parts += [f"{fence(4)}{{py:method}} {msig}", "", doc_block(member) if member.__doc__ else "", fence(4), ""]
    parts.append(fence(5))
    return "\n".join(parts) + "\n"


def api_page(catalogue, lessons, titles, graded):
    out = [
        "# API reference: the graded functions", "",
        "Every exercise of the course is one function or class in a lesson notebook. This page lists them",
        "all, lesson by lesson: what the course's contract fixes (names, signatures, shapes), and the",
        "signature and docstring you find in the notebook's answer cell. The grader calls exactly these",
        "names with these arguments, so keep them as they are.", "",
        ":::{note}",
        "Conventions used everywhere: `B` batch, `T` sequence length (`Tq`, `Tk` for queries and keys),",
        "`D` model width, `H` query heads, `Hkv` key/value heads, `Dh = D // H` head width; multi-head",
        "tensors are laid out `(B, H, T, Dh)`. Masks are boolean and **True means \"may attend\"**; causal",
        "masks are aligned bottom-right (query `i` may see key `j` iff `j <= i + (Tk - Tq)`). Lesson 01",
        "works in numpy, the later lessons in torch on whatever device the inputs are on.",
        ":::", "",
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
            if isinstance(v, str) and GPU_KEYS.search(str(k)) and GPU_VALUES.search(v) \
                    and not re.search(r"\bno\b|unavailable|not available", v, re.I):
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
        flat = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) or
                (isinstance(v, list) and not is_records(v) and not any(isinstance(x, (dict, list)) for x in v))}
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


def results_page(results_dir, figures_dir):
    """The results page, and {path under figures_dir: source image} of the figures it shows."""
    files = sorted(results_dir.rglob("*.json")) if results_dir.is_dir() else []
    images = sorted(f for f in results_dir.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES) \
        if results_dir.is_dir() else []
    out = ["# Benchmark results", "",
           "Measured by the scripts in `benchmarks/`, which print ratios against baselines measured in the",
           "same run, and recorded as JSON under `benchmarks/results/`. Every file there is shown below.", ""]
    parsed, broken = {}, []
    for f in files:
        try:
            parsed[f] = json.loads(f.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            broken.append((f, e))
    gpu = [f for f, data in parsed.items() if measured_on_gpu(data)]
    if not files:
        out += [":::{important}", "No benchmark results have been recorded yet: `benchmarks/results/` is empty.",
                "No GPU results have been measured yet either.", ":::", ""]
    elif not gpu:
        out += [":::{important}", "No GPU results have been measured yet: every result below was measured "
                "without a GPU (or does not say on which device it ran).", ":::", ""]
    else:
        out += [f"GPU results: {', '.join('`' + f.relative_to(results_dir).as_posix() + '`' for f in gpu)}.", ""]
    figures = {}
    if images:
        out += ["## Figures", ""]
        for img in images:
            rel = img.relative_to(results_dir).as_posix()
            figures[rel] = img
            out += [f"```{{figure}} {figures_dir}/{rel}", ":width: 100%", "", md_escape(rel), "```", ""]
    for f in files:
        rel = f.relative_to(results_dir).as_posix()
        out += [f"## {md_escape(rel)}", ""]
        if f in parsed:
            out += ["Measured on a GPU." if f in gpu else "Not measured on a GPU.", "",
                    render_json(parsed[f], 3)]
        else:
            err = dict(broken)[f]
            log(f"warning: {rel} is not valid JSON ({err})")
            out += [":::{warning}", f"This file is not valid JSON: {md_escape(str(err))}", ":::", ""]
    return "\n".join(out), figures


# --------------------------------------------------------------------------------------------
# Assembling and building
# --------------------------------------------------------------------------------------------

def toc(lessons):
    lines = ["format: jb-book", "root: index", "parts:", "  - caption: Lessons", "    chapters:"]
    lines += [f"      - file: lessons/{lesson}/{lesson}" for lesson in lessons] or ["      - file: no_lessons"]
    lines += ["  - caption: Reference", "    chapters:", "      - file: api", "      - file: instructor",
              "      - file: results"]
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


def instructor_page():
    """book/instructor.md with the README's "Teach and grade" section in its place: one text for both."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Teach and grade\n", 1)[1].split("\n## ", 1)[0]
    page = (BOOK / "instructor.md").read_text(encoding="utf-8")
    return page.replace("<!-- README: Teach and grade -->", "## Release, grade and scale out\n" + section.strip())


def assemble(jobs, fresh, results=RESULTS):
    catalogue = load_yaml(BOOK / "lessons.yml")
    lessons = nbk.lesson_names()
    copies = lesson_copies(lessons, jobs, fresh)
    titles = {lesson: lesson_title(nb, lesson) for lesson, nb in copies.items()}
    graded = {lesson: [gid.removeprefix("test_") for gid, _ in nbk.graded_tests(nb)] for lesson, nb in copies.items()}

    files = {}
    files["_config.yml"] = (BOOK / "_config.yml").read_bytes()
    files["instructor.md"] = instructor_page().encode()
    intro = (BOOK / "intro.md").read_text(encoding="utf-8")
    files["index.md"] = intro.replace("<!-- LESSONS -->", lessons_table(catalogue, lessons, titles)).encode()
    files["_toc.yml"] = toc(lessons).encode()
    if not lessons:
        files["no_lessons.md"] = b"# Lessons\n\nNo lesson has been written yet.\n"
    for lesson, nb in copies.items():
        files[f"lessons/{lesson}/{lesson}.ipynb"] = (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()
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
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(SRC), "--path-output", str(BOOK), "--builder", "html"]
    if strict:
        cmd += ["-W", "--keep-going"]
    if fresh:
        cmd.append("--all")
    shutil.rmtree(HTML, ignore_errors=True)     # no stale page survives (the doctrees stay cached)
    log("building the site with Jupyter Book" + (" (warnings are errors)" if strict else ""))
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fresh", action="store_true", help="run every notebook again and rebuild every page")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks run at once")
    p.add_argument("--results", type=Path, default=RESULTS, help="the benchmark results to show "
                   "(default: benchmarks/results)")
    p.add_argument("--allow-warnings", action="store_true", help="do not treat Sphinx warnings as errors")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if not os.path.exists("/dev/nvidia0"):        # lesson 06's Triton kernels run in the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    lessons = assemble(args.jobs, args.fresh, args.results)
    rc = build(strict=not args.allow_warnings, fresh=args.fresh)
    if rc != 0:
        log(f"the build failed (exit status {rc}); see the warnings above")
        return rc
    pages = [p for p in HTML.rglob("*.html") if p.relative_to(HTML).parts[0] != "_static"]
    log(f"{len(pages)} pages ({len(lessons)} lesson(s)) in {HTML.relative_to(ROOT)} "
        f"in {time.perf_counter() - start:.1f} s; open {HTML.relative_to(ROOT)}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
