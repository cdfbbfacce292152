"""python -m autograder audit LESSON [--notebook NB]: how the visible tests of a lesson teach.

Every known mistake and correct variant (autograder/mistakes) replaces its answer in the RELEASED
notebook, and the rest of the notebook runs as a student's kernel would. Per graded name it says what
the visible tests catch (the function's own test fails naming the mistake's keyword), what they misblame
(another function's visible test fails), what a correct variant loses (a visible test, or its hidden
check), and the hidden-only escapes: mistakes the visible test misses, with the hidden check's verdict.

A lesson runs once, cell by cell, with the solutions; just before each answer cell it forks one child
per mistake and variant of that function (several at once), which runs the rest of the notebook (demo
cells skipped, the visible test cells recorded) with that answer instead. tests/test_visible.py asserts
on the same runs; the command's fast run (run_lesson(fast=True)) lets a child stop where the rest of the
notebook can no longer differ from the solutions' run, and tests/test_audit.py holds it to the same
verdicts. With --notebook, the lesson is read from an edited source notebook (its answer cells the
solutions), as an instructor checks an exercise before releasing it.
"""
import ast
import contextlib
import hashlib
import importlib
import io
import json
import os
import re
import select
import signal
import sys
import types
import warnings

from autograder import mistakes
from autograder import notebook as nbk
from autograder.release import student_copy

CHILD_SECONDS = 120
HIDDEN = "hidden:"  # the key prefix of a hidden check's verdict in a child's failures


def fill(release_nb, source_nb, replace=None):
    """A submission: the release copy (a dict) with every answer cell filled from the source notebook's
    solution, or from replace[grade_id]."""
    import copy

    replace = replace or {}
    solved = {nbk.grade_id(c): nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(source_nb) if nbk.is_answer(c)}
    nb = copy.deepcopy(release_nb)
    for cell in nbk.code_cells(nb):
        gid = nbk.grade_id(cell)
        if nbk.is_answer(cell):
            nbk.set_source(cell, replace.get(gid, solved[gid]))
    return nb


def _cells(source_nb):
    """[(kind, grade_id, code)] of the released notebook with the solutions filled in; kind is
    answer, test or code (provided and setup cells). Demo cells are left out, magics dropped."""
    out = []
    for cell in nbk.code_cells(fill(student_copy(source_nb), source_nb)):
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


def _child(cells, ns, code, gid, hidden, plan=None):
    """In a forked child: this answer instead of the solution, then the rest of the notebook.
    hidden: the lesson whose hidden check of gid to run afterwards (on variants, and on mistakes the
    visible test missed: keyword), or None. plan (the fast run): what lets the child stop early, with
    the solutions' verdicts for the cells it leaves (see _stops)."""
    for module in GRADER_MODULES:  # a student's kernel has none of the grader's code loaded (earlier tests did)
        sys.modules.pop(module, None)
    failures = {}
    tainted = {gid, "In", *_names(code)[1]}  # what may differ from the solutions' run: In lists this answer
    try:
        ns["In"] = [*ns.get("In", [""]), code]
        exec(compile(code, f"<{gid}>", "exec"), ns)
        for k, cell in enumerate(cells):
            _run([cell], ns, failures)
            if plan is None:
                continue
            loads, stores = plan["names"][k]
            if "*" in loads or loads & tainted:
                tainted |= stores
            needs_hidden = hidden and (hidden[1] is None or hidden[1].lower() not in failures.get(f"test_{gid}", "").lower())
            if not needs_hidden and _stops(plan, k, ns, tainted):
                failures.update(plan["after"][k])
                break
    except Exception as e:  # noqa: BLE001 - a provided cell broke: blame the answer's own test
        failures.setdefault(f"test_{gid}", f"a later cell raised {type(e).__name__}: {e}"[:2000])
    if hidden:
        lesson, keyword = hidden
        if keyword is None or keyword.lower() not in failures.get(f"test_{gid}", "").lower():
            failures[HIDDEN + gid] = _hidden(lesson, gid, ns)
    return failures


def _stops(plan, k, ns, tainted):
    """True when the cells after the k-th (of those the child runs) would give what they gave the solutions:
    none of them reads a name the answer changed (tainted: bound by it, or by a cell that read one, at any
    depth), and the kernel's state equals the solutions' run after the same cell (_state: random states,
    torch's global settings, the environment, the modules loaded, the names and what each is, and the
    attributes of the modules the cells hold). What this cannot see, a change inside a value that no
    tainted name reaches, the exact run (fast=False, what tests/test_visible.py runs) makes no bet on;
    tests/test_audit.py holds the two equal."""
    if any("*" in loads or loads & tainted for loads, _ in plan["names"][k + 1:]):
        return False
    if not set(sys.modules) <= plan["modules"]:
        return False
    glob, names = _state(ns)
    want_glob, want_names = plan["states"][k]
    return glob == want_glob and ({n: h for n, h in names.items() if n not in tainted}
                                  == {n: h for n, h in want_names.items() if n not in tainted})


def _names(code):
    """(names a cell reads, names it binds), at any depth: a local that shares a global's name counts, which
    only makes the fast run stop later. A cell that reaches names by string (globals(), eval, ...) reads '*'."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {"*"}, set()
    loads, stores = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.add(node.name)
        elif isinstance(node, ast.alias):
            stores.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            stores.update(node.names)
    if loads & BY_STRING:
        loads.add("*")
    return loads, stores


BY_STRING = {"globals", "locals", "vars", "eval", "exec", "dir", "__import__", "getattr", "setattr", "get_ipython"}


def _state(ns):
    """(hash of the process's state, {name: hash of what it holds}) after a cell, comparable between two
    forked runs: torch's and numpy's random states (Python's random is seeded afresh in each forked child,
    the exact run's too), torch's global settings, environment, working directory, sys.path, the
    warning filters; per name its value's type, and for a module its attributes' types and names."""
    import numpy as np
    import torch

    glob = [torch.get_rng_state().numpy().tobytes(), np.random.get_state()[1].tobytes(),
            torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(), sorted(os.environ.items()), os.getcwd(), sys.path,
            warnings.filters, np.geterr()]
    names = {n: _hash(_describe(v)) for n, v in ns.items() if n != "__builtins__"}
    return _hash(glob), names


def _describe(value):
    def kind(x):
        try:  # torch.ops and torch.classes answer any attribute with an object: only strings are kept
            own = [getattr(x, a, None) for a in ("__module__", "__qualname__")]
        except Exception:  # noqa: BLE001 - an attribute that raises when read
            own = []
        return type(x).__module__, type(x).__qualname__, *(a for a in own if isinstance(a, str))
    if isinstance(value, types.ModuleType):
        return value.__name__, sorted((a, kind(x)) for a, x in list(vars(value).items()))
    return kind(value)


def _hash(x):
    return hashlib.sha1(repr(x).encode()).hexdigest()[:16]


def _scout(cells, ns):
    """In a forked child: the solutions' run, as the fast run's plan. Per cell: _state after it (names
    sent only where they changed), the test failures so far; and every module the run loaded, in order."""
    for module in GRADER_MODULES:
        sys.modules.pop(module, None)
    failures, states, after, seen = {}, [], [], {}
    for cell in cells:
        _run([cell], ns, failures)
        glob, names = _state(ns)
        states.append([glob, {n: h for n, h in names.items() if seen.get(n) != h}])
        seen = names
        after.append(dict(failures))
    return {"failures": failures, "states": states, "after": after, "modules": list(sys.modules)}


def _plan(cells, scout, start):
    """What a child forked before cell `start` needs to stop early (see _child): per later cell its names,
    the solutions' state after it, and the solutions' failures of the cells after it."""
    full, states = {}, []
    for glob, changed in scout["states"]:
        full = {**full, **changed}
        states.append((glob, full))
    final = scout["failures"]
    return {"names": [_names(code) for _, _, code in cells[start:]], "states": states[start:],
            "after": [{t: m for t, m in final.items() if t not in seen} for seen in scout["after"][start:]],
            "modules": set(scout["modules"])}


def _warm(scout):
    """Import, before forking, the modules the solutions' run loads later inside packages already loaded
    (torch._dynamo, which torch loads lazily in every child otherwise: 1.4 s each in lesson 06). Packages
    not yet loaded are left to the cells, which may set what they read first (TRITON_INTERPRET)."""
    with warnings.catch_warnings():  # the filters a module sets when loaded (a test cell's are dropped after it)
        for name in scout["modules"]:
            if name not in sys.modules and name.split(".")[0] in sys.modules and not name.startswith(GRADER_SIDE):
                with contextlib.suppress(Exception):
                    importlib.import_module(name)


GRADER_SIDE = ("autograder", "solutions", "tests", "sandbox")


def _hidden(lesson, name, ns):
    """The hidden check's verdict on ns: '' when it passes, else what it says (with the points earned)."""
    from autograder.checks import PartialCredit, verify

    try:
        verify(lesson, name, ns)
        return ""
    except PartialCredit as e:
        return f"{e.earned}/{e.total}: {e}"[:2000]
    except AssertionError as e:
        return f"0: {e}"[:2000]
    except Exception as e:  # noqa: BLE001 - recorded, the audit goes on
        return f"0: the check raised {type(e).__name__}: {e}"[:2000]


def _start(fn, whole=False):
    """fn() in a forked child, which writes its JSON answer to a pipe: (pid, read end). Unless whole (the
    parent reads at once), an answer stays under the pipe's buffer, so the child never waits for the parent."""
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
        if len(payload) >= 60_000 and not whole:
            payload = json.dumps({"<harness>": "too long"}).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(w, view):]
        os._exit(0)
    os.close(w)
    return pid, r


def _collect(pid, r):
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"<harness>": "the child died (a hang or a crash)"}


def run_lesson(lesson, notebook=None, hidden=False, jobs=None, fast=False):
    """{(name, what): {visible test grade_id: failure message}} for every mistake and variant, and
    ("<solutions>", "") for the solutions. hidden: also the hidden check's verdict (key 'hidden:NAME')
    on variants and on the mistakes their visible test misses. notebook: an edited source notebook.
    fast (the audit command): a first child runs the solutions and records their state after each cell;
    the lazily loaded modules it met are loaded before forking, and each child stops where the rest of
    the notebook can no longer differ from the solutions' run (_stops), taking the solutions' verdicts
    for it. A child that will run the hidden check runs the whole notebook, as the hidden check sees it."""
    import numpy.random  # noqa: F401 - seeded when first loaded: here, so the fast run's children share one state
    import torch
    torch.set_num_threads(1)
    answers = {n: [("mutant", m.what, m.code, m.keyword) for m in ms] for n, ms in mistakes.mutants(lesson).items()}
    for n, vs in mistakes.variants(lesson).items():
        answers.setdefault(n, []).extend(("variant", v[0], v[1], None) for v in vs)
    path = nbk.lesson_path(lesson)
    cells = _cells(nbk.read(notebook or path))
    jobs = jobs or len(os.sched_getaffinity(0))
    ns = {"__name__": "__main__"}
    results, baseline, running = {}, {}, {}
    cwd = os.getcwd()
    os.chdir(path.parent)  # data files are read relative to the notebook
    sys.path.insert(0, str(path.parent))  # and its modules imported from there, as in Jupyter
    quiet = contextlib.redirect_stdout(io.StringIO())
    try:
        with quiet:
            scout = _collect(*_start(lambda: _scout(cells, ns), whole=True)) if fast else None
            if scout is not None and "<harness>" in scout:
                raise RuntimeError(f"audit: the solutions' run failed: {scout['<harness>']}")
            for i, (kind, gid, code) in enumerate(cells):
                if scout and kind == "answer" and gid in answers:
                    _warm(scout)
                    plan = _plan(cells, scout, i + 1)
                for _, what, answer, keyword in answers.get(gid, []) if kind == "answer" else ():
                    while len(running) >= jobs:
                        _finish_one(running, results)
                    check = (lesson, keyword) if hidden else None
                    running[_start(lambda: _child(cells[i + 1:], ns, answer, gid, check, plan if scout else None))] = (gid, what)
                _run([(kind, gid, code)], ns, baseline)
            while running:
                _finish_one(running, results)
    finally:
        os.chdir(cwd)
        sys.path.remove(str(path.parent))
    if scout and scout["failures"] != baseline:  # loading modules early changed the solutions' run: no shortcut
        return run_lesson(lesson, notebook, hidden, jobs)
    results["<solutions>", ""] = baseline
    return results


def _finish_one(running, results):
    ready, _, _ = select.select([r for _, r in running], [], [])
    [(pid, r)] = [job for job in running if job[1] == ready[0]]
    results[running.pop((pid, r))] = _collect(pid, r)


def verdict(results, name, mistake):
    """(caught, own message, misblamed visible tests): caught when the own visible test fails naming
    the keyword."""
    failures = {t: m for t, m in results[name, mistake.what].items() if not t.startswith(HIDDEN)}
    own = failures.get(f"test_{name}", "")
    return mistake.keyword.lower() in own.lower(), own, sorted(t for t in failures if t != f"test_{name}")


def judge(lesson, results):
    """{name: [(status, what, detail)]} of every mistake and variant, and the problems: the lines that make
    the audit fail. A mistake is
      caught       its own visible test fails naming its keyword (what tests/test_visible.py asks);
      hidden-only  it is not, is declared in HIDDEN_ONLY, and the hidden check catches it naming the keyword;
      UNNAMED      its own visible test fails, but the message does not name the mistake: the student learns
                   that something is wrong, not what;
      NOT CAUGHT   its own visible test passes: the student is told the answer is right.
    and MISBLAMES when another function's visible test fails too. A variant keeps every mark or LOSES some."""
    declared = mistakes.hidden_only(lesson)
    ms, vs = mistakes.mutants(lesson), mistakes.variants(lesson)
    out, problems = {}, []
    for name in dict.fromkeys([*ms, *vs]):
        rows = out.setdefault(name, [])
        for m in ms.get(name, []):
            caught, own, blamed = verdict(results, name, m)
            hidden = results[name, m.what].get(HIDDEN + name)
            named = hidden is not None and hidden != "" and m.keyword.lower() in hidden.lower()
            said = (f"its visible test says {own[:120]!r}" if own else "its visible test passes") + (
                "" if hidden is None else "; the hidden check passes it too" if hidden == ""
                else "; the hidden check catches it" + ("" if named else f" without naming {m.keyword!r}"))
            if caught:
                status, detail = "caught", ""
            elif m.what in declared:
                status, detail = ("hidden-only" if named else "HIDDEN-ONLY, HIDDEN MISSES"), f"{said} (declared: {declared[m.what]})"
            else:
                status, detail = ("UNNAMED" if own else "NOT CAUGHT"), f"{said}; the feedback must name {m.keyword!r}"
            if blamed:
                status, detail = f"{status}, MISBLAMES", f"{detail}; " * bool(detail) + f"it also fails {', '.join(blamed)}"
            rows.append((status, m.what, detail))
            if status not in ("caught", "hidden-only"):
                problems.append(f"{name}: '{m.what}' {status}: {detail}")
        for what, _ in vs.get(name, []):
            lost = {t: msg for t, msg in results[name, what].items() if msg}
            detail = "; ".join(f"loses {t}: {msg[:120]!r}" for t, msg in lost.items())
            rows.append(("variant LOSES" if lost else "variant ok", what, detail))
            if lost:
                problems.append(f"{name}: correct variant '{what}' {detail}")
    total = sum(len(v) for v in ms.values())
    known = {m.what for v in ms.values() for m in v}
    if set(declared) - known:
        problems.append(f"HIDDEN_ONLY names unknown mistakes: {', '.join(sorted(set(declared) - known))}")
    if len(declared) > MAX_HIDDEN_ONLY * total:
        problems.append(f"HIDDEN_ONLY declares {len(declared)} of {total} mistakes: at most {MAX_HIDDEN_ONLY:.0%} "
                        f"({int(MAX_HIDDEN_ONLY * total)}) may be left to the hidden checks")
    if results["<solutions>", ""]:
        problems.append(f"the solutions fail visible tests: {', '.join(results['<solutions>', ''])}")
    return out, problems


MAX_HIDDEN_ONLY = mistakes.MAX_HIDDEN_ONLY
COLUMNS = ("mistakes", "caught", "hidden-only", "unnamed", "not caught", "misblames", "variants losing")


def table(lesson, results):
    """The audit's lines: the counts per function, then a table per function (a row per mistake and
    variant), the problems, and a summary line."""
    judged, problems = judge(lesson, results)
    counts = {}
    for name, rows in judged.items():
        c = dict.fromkeys(COLUMNS, 0)
        mistake_rows = [s for s, _, _ in rows if not s.startswith("variant")]
        c["mistakes"] = len(mistake_rows)
        for col, test in (("caught", "caught"), ("hidden-only", "hidden-only"), ("unnamed", "UNNAMED"),
                          ("not caught", "NOT CAUGHT")):
            c[col] = sum(s.split(",")[0] == test for s in mistake_rows)
        c["misblames"] = sum(s.endswith("MISBLAMES") for s in mistake_rows)
        variants = [s for s, _, _ in rows if s.startswith("variant")]
        c["variants losing"] = f"{variants.count('variant LOSES')}/{len(variants)}"
        counts[name] = c
    total = {col: sum(c[col] for c in counts.values()) for col in COLUMNS[:-1]}
    losing = [tuple(map(int, c["variants losing"].split("/"))) for c in counts.values()]
    total["variants losing"] = f"{sum(a for a, _ in losing)}/{sum(b for _, b in losing)}"
    width = max(28, *(len(n) for n in counts))
    fmt = lambda first, cells: f"{first:<{width}} " + " ".join(f"{str(v):>{len(col)}}" for col, v in zip(COLUMNS, cells))
    lines = [f"{lesson}: {total['mistakes']} known mistakes and {total['variants losing'].split('/')[1]} correct variants "
             "against the visible tests of the released notebook (and the hidden check, where the visible test "
             "misses and on every variant)", "", fmt("function", COLUMNS)]
    lines += [fmt(name, c.values()) for name, c in counts.items()] + [fmt("all", total.values())]
    for name, rows in judged.items():
        lines += ["", f"{name}:"]
        status_width = min(max(len(s) for s, _, _ in rows), len("hidden-only"))  # a longer status runs over
        lines += [f"  {s:<{status_width}}  {what}" + (f": {detail}" if detail else "") for s, what, detail in rows]
    if problems:
        lines += ["", f"to fix ({len(problems)}):"] + [f"  {p}" for p in problems]
    declared = len(mistakes.hidden_only(lesson))
    lines += ["", f"{lesson}: {total['caught']} of {total['mistakes']} mistakes caught by the visible tests, "
                  f"{declared} declared hidden-only (at most {int(MAX_HIDDEN_ONLY * total['mistakes'])}), "
                  f"{total['unnamed']} unnamed, {total['not caught']} not caught, {total['misblames']} misblaming, "
                  f"{total['variants losing']} variants losing: "
                  + (f"{len(problems)} to fix (exit 1)" if problems else "nothing to fix (exit 0)")]
    return lines


EXIT_STATUS = """exit status: 0 nothing to fix; 1 something to fix: the solutions fail a visible test, a mistake's
own visible test passes it (NOT CAUGHT) or fails without naming it (UNNAMED) and HIDDEN_ONLY does not
declare it, a declared one escapes the hidden check too, a mistake makes another function's visible test
fail (MISBLAMES), a correct variant loses a mark, or HIDDEN_ONLY declares more than 5% of the lesson's
mistakes; 2 the command cannot run (no such notebook, one without the lesson's answer cells)."""


def audit(lesson, notebook=None):
    """Print the table; the exit status is EXIT_STATUS's: 1 when judge finds anything to fix."""
    results = run_lesson(lesson, notebook, hidden=True, fast=True)
    print("\n".join(table(lesson, results)))
    return 1 if judge(lesson, results)[1] else 0
