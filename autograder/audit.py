"""python -m autograder audit LESSON [--notebook NB]: how the visible tests of a lesson teach.

Every known mistake and correct variant (autograder/lessons/<module>/mistakes.py) replaces its answer in the RELEASED
notebook, and the rest of the notebook runs as a student's kernel would. Per graded name it says what
the visible tests catch (the function's own test fails naming the mistake's keyword), what they misblame
(another function's visible test fails), what a correct variant loses (a visible test, or its hidden
check), and the hidden-only escapes: mistakes the visible test misses, with the hidden check's verdict.

A lesson runs once, cell by cell, with the solutions; just before each answer cell it forks one child
per mistake and variant of that function (several at once), which runs the rest of the notebook (demo
cells skipped, the visible test cells recorded) with that answer instead. The command's fast run
(run_lesson(fast=True)) lets a child stop where the rest of the notebook can no longer differ from the
solutions' run, and tests/grader/test_audit.py holds it to the exact run's verdicts; tests/harness/visible.py
asserts on the fast runs. With --notebook, the lesson is read from an edited source notebook (its answer cells the
solutions), as an instructor checks an exercise before releasing it.
"""

import ast
import contextlib
import functools
import gc
import hashlib
import importlib
import io
import json
import os
import re
import select
import signal
import symtable
import sys
import types
import warnings

from autograder import notebook as nbk
from autograder.checking import mistakes
from autograder.release import student_copy

CHILD_SECONDS = 120
HIDDEN = "hidden:"  # the key prefix of a hidden check's verdict in a child's failures


def fill(release_nb, source_nb, replace=None):
    """A submission: the release copy (a dict) with every answer cell filled from the source notebook's
    solution, or from replace[grade_id]."""
    import copy

    replace = replace or {}
    solved = {
        nbk.grade_id(c): nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(source_nb) if nbk.is_answer(c)
    }
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
        ns.setdefault("In", [""]).append(code)  # IPython's In: the cells run so far
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


GRADER_MODULES = ("sandbox.helpers", "autograder.sandbox.helpers", "autograder.checking.stand_ins")


def _child(cells, ns, code, gid, hidden, plan=None):
    """In a forked child: this answer instead of the solution, then the rest of the notebook.
    hidden: the lesson whose hidden check of gid to run afterwards (on variants, and on mistakes the
    visible test missed: keyword), or None. plan (the fast run): what lets the child stop early, with
    the solutions' verdicts for the cells it leaves (see _stops)."""
    for module in GRADER_MODULES:  # a student's kernel has none of the grader's code loaded (earlier tests did)
        sys.modules.pop(module, None)
    failures, rulings = {}, {}
    # What may differ from the solutions' run: what this answer or the solution binds, and In, which lists the answer
    tainted = {gid, "In", *_names(code)[1], *(plan["replaced"] if plan else ())}
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
            needs_hidden = hidden and (
                hidden[1] is None or hidden[1].lower() not in failures.get(f"test_{gid}", "").lower()
            )
            if not needs_hidden and _stops(plan, k, ns, tainted, rulings):
                failures.update(plan["after"][k])
                break
    except Exception as e:  # noqa: BLE001 - a provided cell broke: blame the answer's own test
        failures.setdefault(f"test_{gid}", f"a later cell raised {type(e).__name__}: {e}"[:2000])
    if hidden:
        lesson, keyword = hidden
        if keyword is None or keyword.lower() not in failures.get(f"test_{gid}", "").lower():
            failures[HIDDEN + gid] = _hidden(lesson, gid, ns)
    return failures


def _stops(plan, k, ns, tainted, rulings):
    """True when the cells after the k-th (of those the child runs) would give what they gave the solutions:
    none of them reads a name the answer changed (tainted: bound by it or by the solution's answer, or by a
    cell that read one; read where the cell has not bound it first, or by a function it calls, _names),
    a cell that reads In (which lists this answer) gets from the lesson's own rules what the solutions' run
    got (_same_rulings), and the kernel's state equals the solutions' run after the same cell (_state:
    random states, torch's global settings, the environment, the modules loaded, the names and what each
    is, and the attributes of the modules the cells hold). What this cannot see, a change inside a value
    that no tainted name reaches (a hook the answer left on an object), the exact run (fast=False, what
    tests/harness/visible.py runs) makes no bet on; tests/grader/test_audit.py holds the two equal."""
    if any("*" in loads or loads & tainted - {"In"} for loads, _ in plan["names"][k + 1 :]):
        return False
    if not set(sys.modules) <= plan["modules"]:
        return False
    rng, glob, names, env = _state(ns)
    want_rng, want_glob, want_names, want_env = plan["states"][k]
    same_names = {n: h for n, h in names.items() if n not in tainted} == {
        n: h for n, h in want_names.items() if n not in tainted
    }
    return (
        glob == want_glob
        and env == want_env
        and same_names
        and (rng == want_rng or _reseeded(plan, k))
        and _same_rulings(plan, k, ns, rulings)
    )


def _reseeded(plan, k):
    """Whether the cells after the k-th may start from another torch random state (an answer's test that
    failed before it drew all its numbers): in the solutions' run, each leaves the state as it found it (so it
    draws nothing, whatever the state) until one that seeds it first (_seeds_first)."""
    for j in range(k + 1, len(plan["states"])):
        if plan["states"][j][0] != plan["states"][j - 1][0]:
            return plan["seeds"][j]
    return True


def _seeds_first(code):
    """Whether the cell's first statement is torch.manual_seed(number), or an `if NAME:` whose body starts with
    it and whose else (if any) only prints."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    seed = lambda stmt: isinstance(stmt, ast.Expr) and re.fullmatch(r"torch\.manual_seed\(\d+\)", ast.unparse(stmt))
    prints = lambda stmt: (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and ast.unparse(stmt.value.func) == "print"
        and not any(isinstance(n, ast.Call) for a in stmt.value.args for n in ast.walk(a))
    )
    first = body[0] if body else None
    if isinstance(first, ast.If) and isinstance(first.test, ast.Name):
        return bool(first.body) and bool(seed(first.body[0])) and all(prints(stmt) for stmt in first.orelse)
    return bool(seed(first))


def _same_rulings(plan, k, ns, rulings):
    """Whether every cell after the k-th that reads In reads it only as `module.rule(In)` (_in_reads), and each
    such call, on the In it will be given (this child's, with the cells up to it), rules as it does in the
    solutions' run (plan["rulings"], _rulings). rulings: what earlier calls found, per cell and modules loaded."""
    later = [j for j in range(k + 1, len(plan["names"])) if "In" in plan["names"][j][0]]
    if any(plan["in_reads"][j] is None for j in later):
        return False
    key = _hash(sorted(sys.modules))
    todo = [j for j in later if (j, key) not in rulings]
    if todo:
        sources = [*ns["In"], *(code for _, _, code in plan["cells"][k + 1 :])]
        found = _collect(*_start(lambda: _rulings(plan, todo, sources, len(ns["In"]) - k)))
        for j in todo:
            rulings[j, key] = found.get(str(j)) == plan["rulings"][j] is not None
    return all(rulings[j, key] for j in later)


def _rulings(plan, cells, sources, start):
    """In a forked child (this process is left as it was): {cell: [what each of its `module.rule(In)` calls
    rules]} for the given later cells, In as cell j runs being sources[:start + j]; None for a cell, and none
    after it, when this process cannot have the modules the solutions' run had loaded by then (plan["loaded"]).
    The rules are the lesson's own (a module beside its notebook): they read the sources as text, and look up modules in
    sys.modules, so they judge with exactly those modules loaded, in the order the solutions' run loaded them."""
    for module in GRADER_MODULES:
        sys.modules.pop(module, None)
    out = {}
    for j in cells:
        for module in plan["loaded"][j]:
            if module not in sys.modules:
                with contextlib.suppress(Exception):
                    importlib.import_module(module)
        if set(sys.modules) != set(plan["loaded"][j]):
            out[j] = None
            break
        out[j] = [_ruling(m, f, sources[: start + j]) for m, f in plan["in_reads"][j]]
    return out


def _ruling(module, rule, sources):
    """What the lesson's own module's rule says of the sources (its result, or the error it raised), comparable."""
    try:
        return repr(getattr(importlib.import_module(module), rule)(list(sources)))
    except Exception as e:  # noqa: BLE001 - an error is a ruling too
        return f"raised {type(e).__name__}: {e}"


def _in_reads(code, folder):
    """[(module, rule)] when the cell reads In only as the one argument of `module.rule(In)`, module a file of the
    lesson's folder that the cell imports itself (`import module`) and binds no other way;
    None when it reads In any other way ([] when not at all)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    nodes = list(ast.walk(tree))
    imported = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names if a.asname is None}
    rebound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)} | {
        a.asname or a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names
    }
    calls, fine = [], set()
    for n in nodes:
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and len(n.args) == 1
            and not n.keywords
            and isinstance(n.args[0], ast.Name)
            and n.args[0].id == "In"
        ):
            module = n.func.value.id
            if module in imported and module not in rebound and (folder / f"{module}.py").is_file():
                calls.append((module, n.func.attr))
                fine.add(id(n.args[0]))
    if any(isinstance(n, ast.Name) and n.id == "In" and id(n) not in fine for n in nodes):
        return None
    return calls


def _names(code):
    """(names a cell may read from the notebook's namespace, names it may bind there, {name it binds: (names,
    names) a call of what it binds there may read and bind}), by Python's scoping (symtable): a function's
    arguments and locals are its own. A read counts only where the cell has not bound the name itself on
    every path before it (in order, through if/else, for, while, with and try); what a function, lambda or
    class of the cell reads counts where it is defined (what a later cell's call of it reads is in the third
    element, for _plan). A cell that reaches names by string (globals(), eval, ...) reads '*'."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {"*"}, set(), {}
    reads, binds, body = set(), set(), {}

    def scope(node):
        """(what evaluating node reads and binds at the top level, what its functions read and bind when called)"""
        src = ast.unparse(node if isinstance(node, ast.stmt) else ast.Expr(node))
        table = symtable.symtable(src, "<cell>", "exec")
        now = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
        bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
        later_reads, later_binds, todo = set(), set(), list(table.get_children())
        while todo:
            t = todo.pop()
            todo += t.get_children()
            for s in t.get_symbols():
                # a class body falls back to the globals for any name
                if s.is_referenced() and (s.is_global() or t.get_type() == "class"):
                    later_reads.add(s.get_name())
                if s.is_declared_global() and s.is_assigned():
                    later_binds.add(s.get_name())
        return now | later_reads, bound | later_binds, (later_reads, later_binds)

    def read(node, bound):
        """node's reads (none where it cannot run: bound None) and binds; (what it binds, what calls read, bind)"""
        got, changed, calls = scope(node)
        reads.update(got - bound if bound is not None else set())
        binds.update(changed)
        return changed, calls

    def target(node, bound):
        """What a for or with target binds (reading the names of a subscript or attribute target)."""
        return read(ast.Assign(targets=[node], value=ast.Constant(None), lineno=0), bound)[0]

    def block(stmts, bound):
        """Reads and binds of the statements; the names bound on every path through them (None: none ends)."""
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                read(stmt.test, bound)
                bound = _meet(block(stmt.body, _copy(bound)), block(stmt.orelse, _copy(bound)))
            elif isinstance(stmt, (ast.For, ast.While)):
                read(stmt.iter if isinstance(stmt, ast.For) else stmt.test, bound)
                targets = target(stmt.target, bound) if isinstance(stmt, ast.For) else set()
                block(stmt.body, _join(bound, targets))
                block(stmt.orelse, _copy(bound))
            elif isinstance(stmt, ast.With):
                named = set()
                for item in stmt.items:
                    read(item.context_expr, bound)
                    named |= target(item.optional_vars, bound) if item.optional_vars else set()
                bound = _join(bound, named)
                block(stmt.body, _copy(bound))  # the context may swallow an exception: nothing after is sure
            elif isinstance(stmt, ast.Try):
                ends = [block(stmt.orelse, block(stmt.body, _copy(bound)))]
                for handler in stmt.handlers:
                    if handler.type:
                        read(handler.type, bound)
                    binds.update({handler.name} - {None})
                    end = block(handler.body, _join(bound, {handler.name} - {None}))
                    ends.append(end and end - {handler.name})  # Python deletes the `as` name after the handler
                bound = _join(functools.reduce(_meet, ends), block(stmt.finalbody, _copy(bound)) or set())
            elif isinstance(stmt, ast.Raise):
                read(stmt, bound)
                bound = None
            else:
                changed, calls = read(stmt, bound)
                for name in changed:
                    body[name] = calls
                if isinstance(stmt, ast.Delete):
                    bound = bound and bound - changed
                else:
                    bound = _join(bound, changed)
        return bound

    block(tree.body, set())
    if reads & BY_STRING:
        reads.add("*")
    return reads, binds, body


def _copy(bound):
    return None if bound is None else set(bound)


def _join(bound, more):
    return None if bound is None else bound | more


def _meet(a, b):
    """The names bound on both paths; None is a path that never ends (a raise)."""
    return b if a is None else a if b is None else a & b


BY_STRING = {"globals", "locals", "vars", "eval", "exec", "dir", "__import__", "getattr", "setattr", "get_ipython"}


def _state(ns):
    """(hash of torch's random state, hash of the rest of the process's state, {name: hash of what it holds},
    the environment) after a cell, comparable
    between two forked runs: torch's and numpy's random states (Python's random is seeded afresh in each
    forked child, the exact run's too), torch's global settings, working directory, sys.path, the warning
    filters; per name its value's type, and for a module its attributes' types and names (its submodules
    aside: which are loaded yet is _warm's business)."""
    import numpy as np
    import torch

    glob = [
        torch.get_rng_state().numpy().tobytes(),
        np.random.get_state()[1].tobytes(),
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        os.getcwd(),
        sys.path,
        warnings.filters,
        np.geterr(),
    ]
    names = {n: _hash(_describe(v)) for n, v in ns.items() if n != "__builtins__"}
    return _hash(glob[0]), _hash(glob[1:]), names, dict(os.environ)


def _describe(value):
    def kind(x):
        try:  # torch.ops and torch.classes answer any attribute with an object: only strings are kept
            own = [getattr(x, a, None) for a in ("__module__", "__qualname__")]
        except Exception:  # noqa: BLE001 - an attribute that raises when read
            own = []
        return type(x).__module__, type(x).__qualname__, *(a for a in own if isinstance(a, str))

    if isinstance(value, types.ModuleType):
        return value.__name__, sorted(
            (a, kind(x))
            for a, x in list(vars(value).items())
            if x is not sys.modules.get(f"{value.__name__}.{a}", value)
        )
    return kind(value)


def _hash(x):
    return hashlib.sha1(repr(x).encode()).hexdigest()[:16]


def _scout(cells, ns):
    """In a forked child: the solutions' run, as the fast run's plan. Per cell: _state after it (names
    sent only where they changed), the test failures so far, the modules it loaded; and every module the
    run loaded, in order."""
    for module in GRADER_MODULES:
        sys.modules.pop(module, None)
    failures, states, after, seen, loaded = {}, [], [], {}, []
    first = list(sys.modules)
    known = set(first)
    for cell in cells:
        _run([cell], ns, failures)
        rng, glob, names, env = _state(ns)
        states.append([rng, glob, {n: h for n, h in names.items() if seen.get(n) != h}, env])
        seen = names
        after.append(dict(failures))
        loaded.append([m for m in sys.modules if m not in known])
        known |= set(loaded[-1])
    return {
        "failures": failures,
        "states": states,
        "after": after,
        "modules": list(sys.modules),
        "first": first,
        "loaded": loaded,
    }


def _plan(cells, scout, start, analysed, in_reads, warmed, ns):
    """What a child forked before cell `start` needs to stop early (see _child): per later cell what it reads
    and binds (with what the functions it calls read and bind, analysed: _names of every cell), its reads of
    In, the solutions' state after it, the modules loaded by then, what the lesson's rules rule there (_rulings,
    run here on ns's In), and the solutions' failures of the cells after it; and what the solution's answer
    binds. warmed: what _warm changed in the environment and the modules it loaded, which the solutions' run
    the children fork from has from then on (where the scout's has not)."""
    full, states = {}, []
    for rng, glob, changed, env in scout["states"]:
        full = {**full, **changed}
        states.append((rng, glob, full, {**warmed["environ"], **env}))
    modules, loaded = [*scout["first"], *warmed["modules"]], []
    for new in scout["loaded"]:
        modules = modules + [m for m in new if m not in warmed["modules"]]
        loaded.append(modules)
    calls = {}
    for _, _, body in analysed:
        for name, (reads, binds) in body.items():
            was = calls.get(name, (set(), set()))
            calls[name] = (was[0] | reads, was[1] | binds)
    final = scout["failures"]
    plan = {
        "names": [_called(reads, binds, calls) for reads, binds, _ in analysed[start:]],
        "states": states[start:],
        "after": [{t: m for t, m in final.items() if t not in seen} for seen in scout["after"][start:]],
        "modules": set(scout["modules"]),
        "cells": cells[start:],
        "in_reads": in_reads[start:],
        "seeds": [_seeds_first(code) for _, _, code in cells[start:]],
        "loaded": loaded[start:],
        "replaced": analysed[start - 1][1],
    }
    later = [j for j, reads in enumerate(plan["in_reads"]) if reads and j > 0]  # the first runs in every child
    sources = [*ns.get("In", [""]), *(code for _, _, code in cells[start - 1 :])]
    found = _collect(*_start(lambda: _rulings(plan, later, sources, len(sources) - len(plan["cells"]) + 1)))
    plan["rulings"] = {j: None for j in range(len(plan["cells"]))} | {
        int(j): r for j, r in found.items() if j != "<harness>"
    }
    return plan


def _called(reads, binds, calls):
    """(reads, binds) of a cell with what a call of each name it reads may read and bind, through any depth
    of calls: any function a cell defined under that name (calls: {name: (reads, binds)} of all cells)."""
    reads, binds, todo = set(reads), set(binds), list(reads)
    while todo:
        more, changed = calls.get(todo.pop(), (set(), set()))
        binds |= changed
        todo += more - reads
        reads |= more
    return reads, binds


def _warm(scout, warmed):
    """Import, before forking, the modules the solutions' run loads later inside packages already loaded
    (torch._dynamo, which torch loads lazily in every child otherwise: 1.4 s each in lesson 06). Packages
    not yet loaded are left to the cells, which may set what they read first (TRITON_INTERPRET). warmed
    gets the modules loaded and what the imports set in the environment (torch._inductor: TORCHINDUCTOR_CACHE_DIR)."""
    before, loaded = dict(os.environ), set(sys.modules)
    with warnings.catch_warnings():  # the filters a module sets when loaded (a test cell's are dropped after it)
        for name in scout["modules"]:
            if name not in sys.modules and name.split(".")[0] in sys.modules and not name.startswith(GRADER_SIDE):
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
    warmed["environ"].update({k: v for k, v in os.environ.items() if before.get(k) != v})
    warmed["modules"].update(name for name in sys.modules if name not in loaded)


GRADER_SIDE = ("autograder", "solutions", "tests", "sandbox")


def _hidden(lesson, name, ns):
    """The hidden check's verdict on ns: '' when it passes, else what it says (with the points earned)."""
    from autograder.checking import PartialCredit, verify

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
    gc.freeze()  # what the parent holds is never the child's garbage: its collections (memory bounds) skip it
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
            view = view[os.write(w, view) :]
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
    results, baseline, running, warmed = {}, {}, {}, {"environ": {}, "modules": set()}
    cwd = os.getcwd()
    os.chdir(path.parent)  # data files are read relative to the notebook
    sys.path.insert(0, str(path.parent))  # and its modules imported from there, as in Jupyter
    quiet = contextlib.redirect_stdout(io.StringIO())
    try:
        with quiet:
            if fast:
                analysed = [_names(code) for _, _, code in cells]
                in_reads = [_in_reads(code, path.parent) for _, _, code in cells]
            scout = _collect(*_start(lambda: _scout(cells, ns), whole=True)) if fast else None
            if scout is not None and "<harness>" in scout:
                raise RuntimeError(f"audit: the solutions' run failed: {scout['<harness>']}")
            for i, (kind, gid, code) in enumerate(cells):
                if scout and kind == "answer" and gid in answers:
                    _warm(scout, warmed)
                    plan = _plan(cells, scout, i + 1, analysed, in_reads, warmed, ns)
                for _, what, answer, keyword in answers.get(gid, []) if kind == "answer" else ():
                    while len(running) >= jobs:
                        _finish_one(running, results)
                    check = (lesson, keyword) if hidden else None
                    running[_start(lambda: _child(cells[i + 1 :], ns, answer, gid, check, plan if scout else None))] = (
                        gid,
                        what,
                    )
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
      caught       its own visible test fails naming its keyword (what tests/harness/visible.py asks);
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
                ""
                if hidden is None
                else "; the hidden check passes it too"
                if hidden == ""
                else "; the hidden check catches it" + ("" if named else f" without naming {m.keyword!r}")
            )
            if caught:
                status, detail = "caught", ""
            elif m.what in declared:
                status, detail = (
                    ("hidden-only" if named else "HIDDEN-ONLY, HIDDEN MISSES"),
                    f"{said} (declared: {declared[m.what]})",
                )
            else:
                status, detail = ("UNNAMED" if own else "NOT CAUGHT"), f"{said}; the feedback must name {m.keyword!r}"
            if blamed:
                status, detail = (
                    f"{status}, MISBLAMES",
                    f"{detail}; " * bool(detail) + f"it also fails {', '.join(blamed)}",
                )
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
        problems.append(
            f"HIDDEN_ONLY declares {len(declared)} of {total} mistakes: at most {MAX_HIDDEN_ONLY:.0%} "
            f"({int(MAX_HIDDEN_ONLY * total)}) may be left to the hidden checks"
        )
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
        for col, test in (
            ("caught", "caught"),
            ("hidden-only", "hidden-only"),
            ("unnamed", "UNNAMED"),
            ("not caught", "NOT CAUGHT"),
        ):
            c[col] = sum(s.split(",")[0] == test for s in mistake_rows)
        c["misblames"] = sum(s.endswith("MISBLAMES") for s in mistake_rows)
        variants = [s for s, _, _ in rows if s.startswith("variant")]
        c["variants losing"] = f"{variants.count('variant LOSES')}/{len(variants)}"
        counts[name] = c
    total = {col: sum(c[col] for c in counts.values()) for col in COLUMNS[:-1]}
    losing = [tuple(map(int, c["variants losing"].split("/"))) for c in counts.values()]
    total["variants losing"] = f"{sum(a for a, _ in losing)}/{sum(b for _, b in losing)}"
    width = max(28, *(len(n) for n in counts))
    fmt = lambda first, cells: (
        f"{first:<{width}} " + " ".join(f"{str(v):>{len(col)}}" for col, v in zip(COLUMNS, cells))
    )
    lines = [
        f"{lesson}: {total['mistakes']} known mistakes and {total['variants losing'].split('/')[1]} correct variants "
        "against the visible tests of the released notebook (and the hidden check, where the visible test "
        "misses and on every variant)",
        "",
        fmt("function", COLUMNS),
    ]
    lines += [fmt(name, c.values()) for name, c in counts.items()] + [fmt("all", total.values())]
    for name, rows in judged.items():
        lines += ["", f"{name}:"]
        status_width = min(max(len(s) for s, _, _ in rows), len("hidden-only"))  # a longer status runs over
        lines += [f"  {s:<{status_width}}  {what}" + (f": {detail}" if detail else "") for s, what, detail in rows]
    if problems:
        lines += ["", f"to fix ({len(problems)}):"] + [f"  {p}" for p in problems]
    declared = len(mistakes.hidden_only(lesson))
    lines += [
        "",
        f"{lesson}: {total['caught']} of {total['mistakes']} mistakes caught by the visible tests, "
        f"{declared} declared hidden-only (at most {int(MAX_HIDDEN_ONLY * total['mistakes'])}), "
        f"{total['unnamed']} unnamed, {total['not caught']} not caught, {total['misblames']} misblaming, "
        f"{total['variants losing']} variants losing: "
        + (f"{len(problems)} to fix (exit 1)" if problems else "nothing to fix (exit 0)"),
    ]
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
