"""Check a lesson notebook before submitting it: `python check_submission.py 01_attention.ipynb`.

`release` copies this file into every lesson folder it writes, with LESSON filled in (lesson_facts): the
lesson's name, the grade_ids of its answer cells and, per test cell, its points and the sha256 of the
visible tests students were given. It holds no solution and no hidden test, and needs only what students
have: the standard library and IPython (numpy, torch, ... only as the notebook imports them).

It says, in the grader's own words where the grader has them:
- whether the notebook is this lesson, with its answer and test cells and their nbgrader metadata intact,
  and each written question (a markdown answer cell graded by hand) kept and answered;
- what the grader would not read (code in a test cell or a demo cell);
- for a lesson whose Triton kernels the grader can compile (triton_fit.py beside this script), whether their
  bodies are Triton language only, in the grader's words, and whether they compile for a GPU, an A100, and fit
  its shared memory, as the lesson launches them; the compiler's complaint when not (the interpreter runs kernels
  a GPU refuses); without Triton, that it skipped them and why;
- the result of each visible test, running the code cells in order (demos skipped, as the grader does) in a
  fresh Python with a timeout, in this script's folder (where release put the lesson's data files, which the
  grader stages beside the notebook).
Exit status: 0 when nothing is wrong, 1 when something is (each a line starting 'PROBLEM'), 2 on bad usage.
A line starting 'note' says what the grader would see but not penalise (a scratch cell that raised).
"""

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

LESSON = None  # release writes: {"name": ..., "answers": [grade_id, ...], "tests": {grade_id: [points, sha256]},
#                                 "written": {grade_id: points}, "limits": the limits in words, "call_seconds": the
#                                 CPU limit on one graded call, "timed": {graded name: a case at the graded size}}

# The grader's words (autograder/grade.py and notebook.py; tests/grader/test_check_submission.py holds them equal).
LOST_METADATA = "the notebook has lost its nbgrader metadata; every code cell was run"
MAX_NOTEBOOK_BYTES = 20 << 20
TOO_BIG = f"is larger than {MAX_NOTEBOOK_BYTES >> 20} MB; clear large outputs and submit it again"
# What the grader parses on its side to judge how an answer works (a Triton kernel's work, lesson 09's D): cells of up
# to MAX_CELL_CHARS characters (an answer cell is a few thousand; a longer cell holds no answer it reads), and up to
# MAX_CODE_CHARS of them in all (an honest lesson 06 notebook: 45,000)
MAX_CELL_CHARS, MAX_CODE_CHARS = 100_000, 300_000
TOO_MUCH_CODE = (
    f"your code cells of up to {MAX_CELL_CHARS:,} characters hold {{:,}} in all, more than the {MAX_CODE_CHARS:,} "
    "the grader reads to judge how an answer works (a Triton kernel's work, lesson 09's D): move large data into a "
    "file and keep the cells for code"
)
DEMO_TAG = "demo"
TEXT_STUB = "YOUR ANSWER HERE"  # what release leaves in a written question's answer (notebook.TEXT_STUB)
DEFAULT_TIMEOUT = 900  # seconds for the whole run of the notebook's cells
HERE = Path(__file__).resolve().parent  # the released lesson folder: its data files, and tripwires.py where its
#                                         visible tests switch off what an exercise forbids, as the grader does


def source(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def cell_label(number, cell):
    """How a message names a code cell (here and in the grader's feedback, grade.py) so that a student can find it:
    its first line of code (comments aside, at most 60 characters), quoted, and its number counting markdown cells
    too, from 1: Jupyter numbers no cells, and a count of code cells alone would not match the file."""
    lines = [line.strip() for line in source(cell).splitlines() if line.strip()]
    first = next((line for line in lines if not line.startswith("#")), lines[0] if lines else "")
    first = first if len(first) <= 60 else first[:57] + "..."
    return (
        f"the cell that begins {first!r} (cell {number}, counting markdown cells)" if first else f"empty cell {number}"
    )


def meta(cell):
    m = cell.get("metadata", {})
    m = m.get("nbgrader", {}) if isinstance(m, dict) else {}
    return m if isinstance(m, dict) else {}


def is_test(cell):
    return bool(meta(cell).get("grade")) and not meta(cell).get("solution")


def is_written(cell):
    """Whether a cell is a written question: a markdown answer cell that a person grades (nbgrader's manually
    graded answer: solution and grade)."""
    return cell.get("cell_type") == "markdown" and bool(meta(cell).get("solution")) and bool(meta(cell).get("grade"))


def is_demo(cell):
    tags = cell.get("metadata", {}).get("tags", []) if isinstance(cell.get("metadata"), dict) else []
    return isinstance(tags, list) and DEMO_TAG in tags


def visible_sha(text):
    """The sha256 of a test cell's visible tests (trailing whitespace aside), as release records it."""
    return hashlib.sha256(text.rstrip().encode("utf-8")).hexdigest()


def lesson_facts(nb, name):
    """The LESSON a released notebook dict (release.student_copy's) gives this script."""
    code = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    return {
        "name": name,
        "answers": [meta(c)["grade_id"] for c in code if meta(c).get("solution")],
        "tests": {
            meta(c)["grade_id"]: [float(meta(c).get("points", 0)), visible_sha(source(c))] for c in code if is_test(c)
        },
        "written": {meta(c)["grade_id"]: float(meta(c).get("points", 0)) for c in nb["cells"] if is_written(c)},
    }


def read(path):
    """(notebook dict, None) or (None, why the grader would not read it)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return None, f"{path.name} is not a regular file; submit the notebook itself"
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return None, f"the notebook {TOO_BIG}"
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"not a readable notebook (corrupt JSON?): {type(e).__name__}: {str(e)[:200]}"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, "not a notebook: it has no list of cells"
    if nb.get("nbformat") != 4:
        return None, f"unsupported notebook format {str(nb.get('nbformat'))[:20]!r} (expected 4)"
    if not all(isinstance(c, dict) and isinstance(c.get("cell_type"), str) for c in nb["cells"]):
        return None, "a cell is not a notebook cell (no cell_type)"
    return nb, None


def structure(nb, lesson):
    """[(is_problem, line)] on whether the notebook is the lesson with its answer and test cells intact."""
    out = []
    code = [(n, c) for n, c in enumerate(nb["cells"], 1) if c["cell_type"] == "code"]
    ids = {meta(c).get("grade_id"): (n, c) for n, c in code if meta(c).get("grade_id")}
    answers, tests = lesson["answers"], lesson["tests"]
    if not any(meta(c) for c in nb["cells"]):
        return [
            (
                True,
                f"{LOST_METADATA} (was it copied into a new notebook? start again from the released "
                f"{lesson['name']}.ipynb and paste your answers into it)",
            )
        ]
    if not set(ids) & (set(answers) | set(tests)):
        return [
            (
                True,
                f"this is not lesson {lesson['name']}: it has none of its cells "
                f"({', '.join(answers[:3])}, ...); check that you are submitting the right notebook",
            )
        ]
    run = [len(source(c)) for _, c in code if not is_test(c) and not is_demo(c)]  # the cells the grader runs
    read = sum(n for n in run if n <= MAX_CELL_CHARS)
    if read > MAX_CODE_CHARS:
        out.append((True, TOO_MUCH_CODE.format(read)))
    for name in answers:
        if name not in ids:
            out.append(
                (
                    True,
                    f"the answer cell '{name}' has lost its nbgrader metadata or was deleted: "
                    "copy your code into the lesson's released notebook",
                )
            )
    for name, (points, sha) in tests.items():
        if name not in ids:
            out.append(
                (
                    True,
                    f"the test cell '{name}' ({points:g} points) has lost its metadata or was deleted: "
                    "the grader would run it as your code",
                )
            )
        elif visible_sha(source(ids[name][1])) != sha:
            out.append(
                (
                    True,
                    f"{cell_label(*ids[name])}, the test cell '{name}', was edited: the grader does not read "
                    "test cells (it runs its own tests), so code you put there is not graded",
                )
            )
    texts = {meta(c).get("grade_id"): source(c) for c in nb["cells"] if is_written(c)}
    for name, points in lesson.get("written", {}).items():
        said = f"the written question '{name}' ({points:g} points)"
        if name not in texts:
            out.append(
                (
                    True,
                    f"{said} has lost its nbgrader metadata or was deleted: paste your answer into "
                    "its cell in the lesson's released notebook, or it is not graded",
                )
            )
        elif TEXT_STUB in texts[name]:
            out.append((True, f"{said} still holds {TEXT_STUB}: write your answer in its place"))
    graded = set(answers)
    define = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.M)
    for n, c in code:
        names = set(define.findall(source(c))) & graded
        if names and is_demo(c):
            out.append(
                (
                    True,
                    f"{cell_label(n, c)} defines {', '.join(sorted(names))} but is a demo cell, which the grader "
                    "skips: define it in its answer cell",
                )
            )
    return out + test_only_reads(nb, graded)


def test_only_reads(nb, answers):
    """[(True, line)] for each name an answer cell reads that only a test cell binds. This check runs the test
    cells, so the name is there when the answer is called; the grader runs its own tests instead, and there it
    is not. (A name only a demo binds fails this check's run as it fails the grader: run_tests says so.)"""

    def names(text, kind):
        try:
            return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and isinstance(n.ctx, kind)}
        except (SyntaxError, RecursionError, MemoryError, ValueError):  # unparseable, or nested past the stack
            return set()

    code = [(n, c) for n, c in enumerate(nb["cells"], 1) if c.get("cell_type") == "code"]
    graded = [source(c) for _, c in code if not is_test(c) and not is_demo(c)]
    known = set().union(*(names(t, ast.Store) | bound(t) | _arguments(t) for t in graded), dir(__builtins__))
    tests = {}
    for n, c in code:
        if is_test(c):
            for name in bound(source(c)) - known:
                tests.setdefault(name, cell_label(n, c))
    out = []
    for n, c in code:
        if meta(c).get("grade_id") in answers and not is_test(c):
            for name in sorted(names(source(c), ast.Load) & set(tests)):
                out.append(
                    (
                        True,
                        f"{cell_label(n, c)}, the answer '{meta(c)['grade_id']}', uses '{name}', which only "
                        f"the test cell {tests[name].removeprefix('the cell ')} defines: the grader runs its own "
                        f"tests instead, so there '{name}' is not defined; define it in the answer's own cell",
                    )
                )
    return out


def _arguments(text):
    """The parameter names of the functions a cell defines (they bind names too)."""
    try:
        return {
            a.arg
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.arguments)
            for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg]
            if a is not None
        }
    except (SyntaxError, RecursionError, MemoryError, ValueError):  # unparseable, or nested past the stack
        return set()


MAX_READ = 20_000  # characters: an answer cell is far shorter; a longer cell binds nothing an answer may rely on


def bound(text):
    """The names a cell's top-level code binds (assignments, imports, defs, classes, loop targets; not
    those inside its functions and classes), or none when it does not parse (an IPython magic) or is longer than
    MAX_READ characters (the grader reads every cell with it, and its own memory is bounded)."""
    if len(text) > MAX_READ:
        return set()
    try:
        tree = ast.parse(text)
    except (SyntaxError, RecursionError, MemoryError, ValueError):  # unparseable, or nested past the stack
        return set()
    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += node.decorator_list
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif not isinstance(node, ast.Lambda):
            todo += ast.iter_child_nodes(node)
    return names


def demo_only(nb):
    """{name: cell_label of the demo cell that binds it} for the names that demo cells bind and no cell the grader
    runs (every code cell but tests and demos) does: the grader, which skips demos, finds them undefined."""
    code = [(n, c) for n, c in enumerate(nb["cells"], 1) if c.get("cell_type") == "code"]
    others = set().union(*(bound(source(c)) for _, c in code if not is_test(c) and not is_demo(c)))
    found = {}
    for n, c in code:
        if is_demo(c):
            for name in bound(source(c)) - others:
                found.setdefault(name, cell_label(n, c))
    return found


def demo_hint(error, demos):
    """What to add to an error line (a NameError) when the name is one only a demo cell defines, or ''."""
    m = re.search(r"NameError: name '(\w+)' is not defined", error)
    if not m or m.group(1) not in demos:
        return ""
    return (
        f" ('{m.group(1)}' is defined only in the demonstration cell {demos[m.group(1)].removeprefix('the cell ')}, "
        "which is not run when "
        "grading: an answer must define what it uses itself)"
    )


def graded_sources(nb):
    """The code the grader reads, as grade.submission_cells takes it: every code cell but tests and demos."""
    return [
        source(c)
        for c in nb["cells"]
        if c["cell_type"] == "code"
        and not is_test(c)
        and not is_demo(c)
        and not str(meta(c).get("grade_id") or "").startswith("test_")
    ]


def kernels(nb, folder):
    """[(is_problem, line)] on the lesson's Triton kernels among the cells the grader reads, compiled for a GPU
    (triton_fit.check_kernels, beside this script): none for a lesson without triton_fit.py."""
    if not (folder / "triton_fit.py").is_file():
        return []
    sys.path.insert(0, str(folder))
    try:
        import triton_fit
    finally:
        sys.path.remove(str(folder))
    return triton_fit.check_kernels(graded_sources(nb))


CHILD = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
cells, out = json.load(open(sys.argv[1])), sys.argv[2]
class Shell(InteractiveShell):  # the grader's shell (sandbox/runner.preload): %matplotlib inline keeps Agg
    def enable_matplotlib(self, gui=None):
        return gui, "agg"
shell = Shell.instance()
timed = cells.pop()  # {name: {"tensors": [[shape, scale], ...], "args": [...]}}: one graded case each
for n, name, code, answers in cells:
    before = {a: shell.user_ns.get(a) for a in answers}
    r = shell.run_cell(code, store_history=True)
    e = r.error_before_exec or r.error_in_exec
    text = str(e).strip().splitlines()[0] if e and str(e).strip() else ""
    line = f"{type(e).__name__}: {text}" if text else type(e).__name__ if e else ""
    if isinstance(e, NotImplementedError) and not text:
        line += " (an answer is still the released stub)"
    lost = [a for a in answers if e and shell.user_ns.get(a) is before[a]]  # answers its error kept from being defined
    with open(out, "a") as f:
        f.write(json.dumps([n, name, line, lost]) + "\n")
for name, case in timed.items():
    if not callable(shell.user_ns.get(name)):
        continue
    import time, torch
    g = torch.Generator().manual_seed(0)
    tensors = [torch.empty(shape, dtype=getattr(torch, dtype[0]) if dtype else torch.float64)
               .uniform_(-scale, scale, generator=g) for shape, scale, *dtype in case["tensors"]]
    start, error = time.process_time(), ""
    try:
        shell.user_ns[name](*tensors, *case["args"])
    except Exception as e:
        error = f"{type(e).__name__}: {str(e).strip()[:200]}"
    with open(out, "a") as f:
        f.write(json.dumps(["timed", name, [time.process_time() - start, error]]) + "\n")
"""


def run_tests(nb, folder, timeout, lesson=None):
    """[(is_problem, line)]: each visible test's result, running the code cells (demos skipped) in order, as
    the grader runs them; then the CPU time of one case at the graded size of each name LESSON["timed"] holds,
    against the limit on a call. A NameError for a name only a demo cell defines says so. Another cell's error
    is a problem only when it kept an answer (a graded name) from being defined: the grader, which runs such a
    cell and goes on, costs nothing else."""
    lesson = lesson or LESSON or {}
    answers = lesson.get("answers", ())
    define = re.compile(r"^(?:async\s+)?(?:def|class)\s+(\w+)", re.M)
    cells = [
        (
            n,
            meta(c).get("grade_id") if is_test(c) else None,
            source(c),
            sorted(set(define.findall(source(c))) & set(answers)),
        )
        for n, c in enumerate(nb["cells"], 1)
        if c["cell_type"] == "code" and not is_demo(c)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        todo, done = Path(tmp, "cells.json"), Path(tmp, "done.jsonl")
        todo.write_text(json.dumps(cells + [lesson.get("timed", {})]))
        crash = ""
        try:
            child = subprocess.run(
                [sys.executable, "-c", CHILD, str(todo), str(done)],
                cwd=folder,
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, MPLBACKEND="Agg"),
            )
            last = child.stderr.strip().splitlines()[-1:] if child.returncode else []
            crash = f"stopped the notebook (exit status {child.returncode}{': ' + last[0][:200] if last else ''})"
            if child.returncode < 0:  # killed by a signal: memory corrupted or read outside the process's own
                crash += (
                    ": the Python process crashed, which Python code alone does not do; the usual cause is a "
                    "Triton kernel that loads or stores outside its tensors (a tl.load or tl.store without mask=)"
                )
        except subprocess.TimeoutExpired:
            crash = f"did not finish within {timeout} s"
        ran = [json.loads(line) for line in done.read_text().splitlines()] if done.exists() else []
    out, demos = [], demo_only(nb)
    label = {n: cell_label(n, c) for n, c in enumerate(nb["cells"], 1)}
    timings = [(r[1], r[2]) for r in ran if r[0] == "timed"]
    ran = [r for r in ran if r[0] != "timed"]
    for n, name, error, lost in ran:
        error += demo_hint(error, demos)
        if name:
            out.append((bool(error), f"{name}: {'FAILED: ' + error if error else 'passed'}"))
        elif lost:
            out.append(
                (
                    True,
                    f"{label[n]} raised {error}, so {', '.join(lost)} is not defined: the grader finds no answer there",
                )
            )
        elif error:
            out.append(
                (
                    None,
                    f"{label[n]} raised {error}; the grader runs it too and goes on, so it costs no points by itself",
                )
            )
    if len(ran) < len(cells):
        n, name, _, _ = cells[len(ran)]
        out.append((True, f"{label[n]}{f' ({name})' if name else ''} {crash}; the tests after it did not run"))
    limit = lesson.get("call_seconds")
    for name, (seconds, error) in timings:
        if error:
            continue  # its visible test says what is wrong
        slow = limit is not None and seconds > limit
        out.append(
            (
                slow,
                f"{name} at the size it is graded: {seconds:.1f} s of CPU time"
                + (
                    f", more than the {limit} s a graded call may use: correct but too slow for the graded sizes "
                    "(keep the block sizes you are given, and let torch work on whole tiles)"
                    if slow
                    else f", within the {limit} s a graded call may use"
                    if limit is not None
                    else ""
                ),
            )
        )
    return out


def check(path, lesson=None, timeout=DEFAULT_TIMEOUT, run=True, folder=HERE):
    """[(is_problem, line)] for the notebook at path, as main prints them (is_problem None: a note, which costs
    nothing); folder holds the lesson's released
    files (this script's folder, not the notebook's: a student may keep the notebook anywhere)."""
    lesson = lesson or LESSON
    nb, why = read(path)
    if why:
        return [(True, why)]
    found = structure(nb, lesson)
    if any("not lesson" in line or LOST_METADATA in line for _, line in found):
        return found
    found += kernels(nb, folder)
    return found + (run_tests(nb, folder, timeout, lesson) if run else [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", help=f"the notebook to check, e.g. {(LESSON or {}).get('name', 'NN_name')}.ipynb")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds for running all its cells")
    p.add_argument("--no-run", action="store_true", help="check the notebook without running its tests")
    args = p.parse_args(argv)
    if LESSON is None:
        p.error("this is the course's template: use the copy in a released lesson folder")
    if not Path(args.notebook).exists():
        p.error(f"no notebook at {args.notebook}")
    if LESSON.get("limits"):
        print(f"limits  when graded, {LESSON['limits']}")
    found = check(args.notebook, timeout=args.timeout, run=not args.no_run)
    for bad, line in found:
        print(("PROBLEM " if bad else "note    " if bad is None else "ok      ") + line)
    bad = sum(b is True for b, _ in found)
    print(f"{bad} problem(s): fix them before you submit" if bad else "nothing wrong found: ready to submit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
