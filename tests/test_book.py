"""The online book (book/build.py, `make book`): it builds with warnings as errors, shows every lesson
as students see it, leaks no solution and no hidden test, and works offline in a real browser.

The slow tests share one build per test session. The browser test drives headless Chromium through
the DevTools protocol (tornado's websocket client) and needs /usr/bin/chromium (`make setup`
installs it when it can); it is skipped, saying so, where Chromium is missing.
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
from tests.lessons import LESSONS

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
SITE = BOOK / "_build" / "html"
SCREENSHOTS = BOOK / "_build" / "screenshots"
MIN_SECRET = 16          # shorter lines (`return out`) are not distinctive


@functools.lru_cache(maxsize=None)
def build_module():
    spec = importlib.util.spec_from_file_location("book_build", BOOK / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def site():
    """Build the book once (exactly what `make book` runs); the path of the site."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(BOOK / "build.py")], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
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
    guide = page_text(site / "instructor.html")
    for needle in ("autograder release", "autograder grade", "autograder merge", "--shard", "--resume", "--jobs",
                   "nbgrader autograde", "nbgrader_config.py", "bubblewrap", "unshare", "--unsafe", "grades.csv"):
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
    figures = sum("image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
                  for c in nbk.code_cells(copy) for o in c.get("outputs", []))
    assert len(re.findall(r"<img [^>]*src=\"[^\"]*_images/", page)) >= figures, \
        f"the lesson's {figures} reference figure(s) should be on its page"
    for name in [gid.removeprefix("test_") for gid, _ in nbk.graded_tests(copy)]:
        assert name in text, f"the exercise {name} is missing from the page"


@pytest.mark.slow
def test_api_reference_has_signatures_and_docstrings(site):
    import inspect
    page = page_text(site / "api.html")
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
    for f in files:
        assert f.relative_to(results).as_posix() in page, f"{f.name} is not on the results page"
    build = build_module()
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
    build = build_module()
    records = [{"seq_len": 128, "ms": 0.51234, "impl": "naive"}, {"seq_len": 256, "ms": 1.9, "impl": "flash|tiled"}]
    md = build.render_json({"device": "cpu", "runs": records, "matrix": [[1, 2], [3, 4]], "cfg": {"dtype": "$x$"}}, 3)
    assert "| seq\\_len | ms | impl |" in md and "| 128 | 0.5123 | naive |" in md
    assert "flash\\|tiled" in md, "a | inside a value must not split the table cell"
    assert "\\$x\\$" in md, "a $ in a value must not start maths"
    assert "### runs" in md and "### matrix" in md and "| row | 0 | 1 |" in md
    assert build.render_json([1, 2.5, "a"], 2).count("\n|") >= 3
    assert build.render_json(3.0, 2).strip() == "3"


def test_gpu_results_are_recognised():
    build = build_module()
    assert build.measured_on_gpu({"device": "NVIDIA H200", "ms": 1})
    assert build.measured_on_gpu({"runs": [{"device": "cuda:0"}]})
    assert build.measured_on_gpu({"meta": {"gpu_name": "A100-SXM4-80GB"}})
    assert not build.measured_on_gpu({"device": "cpu", "note": "a GPU would be faster"})
    assert not build.measured_on_gpu({"gpu": "none: not available"})
    assert not build.measured_on_gpu([{"device": "cpu"}])


def test_results_page_says_when_nothing_was_measured(tmp_path):
    build = build_module()
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
        for cell in student_copy(nb)["cells"]:       # what students are meant to see
            visible.update(normalize(line) for line in nbk.source(cell).splitlines())
    for path in sorted((ROOT / "solutions").glob("*.py")):
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            body = node.body
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:            # docstrings are public (notebooks, API reference)
                visible.update(normalize(line) for line in doc.splitlines())
                body = body[1:]
            visible.update(normalize(line) for line in lines[node.lineno - 1:(body or node.body)[0].lineno - 1])
            if body:
                for line in lines[body[0].lineno - 1:node.end_lineno]:
                    found.setdefault(normalize(line), f"solutions/{path.name}: body of {node.name}")
    visible = " ".join(visible)        # a hint may quote a line of the solution, even across lines
    return {line: where for line, where in found.items()
            if len(line) >= MIN_SECRET and re.search(r"[A-Za-z]", line) and line not in visible}


ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)", re.S)
DATA_URI = re.compile(r"data:(?:text|application)/[\w.+-]+;base64,([A-Za-z0-9+/=]+)")


def unescape_js(text):
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "", "f": ""}
    return ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] in "ux" and len(m.group(1)) > 1
                      else simple.get(m.group(1), m.group(1)), text)


def views(text):
    """The ways a line of code can appear in a file: as is, HTML-escaped, split into highlighting
    spans, JSON/JS string escaped, or base64 in a data: URI. All whitespace-normalized, each once."""
    decoded = [text, unescape_js(text)]
    decoded += [base64.b64decode(m.group(1) + "==").decode("utf-8", "ignore")
                for m in DATA_URI.finditer(text)]
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
        words = set(WORD.findall(view))     # a quick filter: substring search only where it can match
        found.update(line for line in lines if line not in found and inner_words(line) <= words and line in view)
    return found


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
    assert not leaks_in("nothing to see here", lines)


@pytest.mark.slow
def test_no_solution_or_hidden_test_in_the_site(site):
    """Every file of the site (pages, search index, JSON, images, ...), and also of everything else
    the build keeps (its sources in book/_generated, its caches), except the npm MathJax package."""
    lines = secrets()
    leaks, scanned = [], 0
    for root in (BOOK / "_build", BOOK / "_generated"):
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(BOOK)
            if path.is_file() and rel.parts[1] not in (".mathjax", "screenshots"):
                scanned += 1
                leaks += [f"{rel}: {lines[line]}" for line in leaks_in(path.read_bytes().decode("utf-8", "ignore"), lines)]
    assert scanned > len(LESSONS)
    assert not leaks, "solution code or hidden tests in the built book:\n" + "\n".join(leaks[:20])


@pytest.mark.slow
def test_site_references_no_other_host(site):
    """Static check: no script, style sheet, image or frame of the site comes from another host
    (links to papers are fine: a reader follows them, the page does not load them)."""
    bad = []
    tag = re.compile(r"<(script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(src|href)=[\"']"
                     r"((?:https?:)?//[^\"']+)", re.I)
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css"):
            text = path.read_text(encoding="utf-8", errors="ignore")
            bad += [f"{path.relative_to(site)}: {m.group(3)}" for m in tag.finditer(text)
                    if not (m.group(1).lower() == "link" and re.search(r"rel=[\"'](canonical|alternate)", m.group(0)))]
            bad += [f"{path.relative_to(site)}: {u}" for u in re.findall(r"url\(\s*[\"']?((?:https?:)?//[^)\"']+)", text)]
            bad += [f"{path.relative_to(site)}: {u}" for u in re.findall(r"@import\s+[\"']((?:https?:)?//[^\"']+)", text)]
    assert not bad, "the site loads things from other hosts:\n" + "\n".join(sorted(bad)[:20])
    page = (site / "index.html").read_text(encoding="utf-8")
    assert "_static/mathjax/tex-mml-chtml.js" in page, "MathJax must be served by the site itself"


# ---------------------------------------------------------------------------------------------
# In a browser: pages load, maths is typeset, images load, search works, nothing goes elsewhere
# ---------------------------------------------------------------------------------------------

CHROMIUM = next((c for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
                 if c and os.path.exists(c)), None)

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
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.stderr, start_new_session=True)

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
            os.killpg(self.proc.pid, signal.SIGKILL)   # our own process group only
            self.proc.wait(timeout=10)
        self.stderr.close()


async def browse(site, base, screenshots):
    report = {"pages": {}, "requests": [], "failures": [], "exceptions": [], "search": []}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        browser = Browser(tmp)
        try:
            cdp = await browser.connect()
            target = await cdp.send("Target.createTarget", url="about:blank")
            session = (await cdp.send("Target.attachToTarget", targetId=target["targetId"], flatten=True))["sessionId"]
            for domain in ("Network", "Page", "Runtime"):
                await cdp.send(f"{domain}.enable", session)
            await cdp.send("Emulation.setDeviceMetricsOverride", session, width=1280, height=960,
                           deviceScaleFactor=1, mobile=False)

            async def goto(url):
                loaded = cdp.expect("Page.loadEventFired", session)
                nav = await cdp.send("Page.navigate", session, url=url)
                assert not nav.get("errorText"), f"{url}: {nav['errorText']}"
                await asyncio.wait_for(loaded, 30)

            async def evaluate(expression):
                r = await cdp.send("Runtime.evaluate", session, expression=expression, awaitPromise=True,
                                   returnByValue=True, timeout=60)
                assert "exceptionDetails" not in r, f"JavaScript failed: {r['exceptionDetails']}"
                return r["result"]["value"]

            for page in pages(site):
                rel = page.relative_to(site).as_posix()
                await goto(f"{base}/{rel}")
                report["pages"][rel] = await evaluate(PAGE_CHECK)

            await goto(f"{base}/search.html?q=softmax")
            report["search"] = await evaluate(SEARCH_RESULTS)

            if LESSONS:
                screenshots.mkdir(parents=True, exist_ok=True)
                lesson = LESSONS[0]
                await goto(f"{base}/lessons/{lesson}/{lesson}.html")
                await evaluate(PAGE_CHECK)
                shot = await cdp.send("Page.captureScreenshot", session, format="png")
                (screenshots / f"{lesson}.png").write_bytes(base64.b64decode(shot["data"]))
                await evaluate("(document.querySelector('.cell_output img') || document.body).scrollIntoView()"
                               " || window.scrollBy(0, -120) || new Promise(r => setTimeout(r, 300))")
                shot = await cdp.send("Page.captureScreenshot", session, format="png")
                (screenshots / f"{lesson}-figure.png").write_bytes(base64.b64decode(shot["data"]))

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
            try:
                await cdp.send("Browser.close", timeout=10)
            except (ConnectionError, RuntimeError, asyncio.TimeoutError):
                pass
        finally:
            browser.close()
    return report


@pytest.mark.slow
def test_site_in_a_browser(site):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (/usr/bin/chromium): `make setup` installs it as root with "
                    "apt-get; without it the book's browser test cannot run")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        report = asyncio.run(asyncio.wait_for(browse(site, base, SCREENSHOTS), 600))
    finally:
        server.shutdown()
        server.server_close()

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
    foreign = sorted({u for u in report["requests"]
                      if urlparse(u).scheme not in ("data", "blob", "about") and urlparse(u).hostname != "127.0.0.1"})
    problems += [f"request to another host: {u}" for u in foreign]
    problems += [f"failed request: {f}" for f in report["failures"]]
    problems += [f"JavaScript error: {e}" for e in report["exceptions"]]
    if not report["search"]:
        problems.append("searching for 'softmax' found nothing")
    elif "01_attention" in LESSONS and not any("01_attention" in u for u in report["search"]):
        problems.append(f"searching for 'softmax' does not find lesson 01: {report['search']}")
    assert not problems, "\n".join(problems)
    assert report["requests"], "no request was recorded: is Network logging on?"
    if LESSONS:
        assert (SCREENSHOTS / f"{LESSONS[0]}.png").stat().st_size > 10_000
