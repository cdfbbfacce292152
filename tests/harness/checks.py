"""The hidden checks, in-process: solutions pass, known-wrong answers fail with a message that
names the mistake (and cost no other function its points), correct variants pass."""

import ast
import dis
import importlib
import inspect
import json
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from autograder.checking import checks_for, memory, mistakes, verify
from tests.harness import each, mutants, one_lesson
from tests.harness.lessons import answers, fresh_namespace, graded_names

REPO = Path(__file__).resolve().parents[2]
__all__ = [
    "test_every_graded_name_has_a_check_and_the_solutions_pass",
    "test_every_graded_name_has_at_least_three_mutants",
    "pristine",
    "test_mutant_fails_its_check_only",
    "test_memory_bound_mutant_fails_its_check_only",
    "tighter_bounds",
    "test_correct_variant_passes",
    "test_the_released_stub_scores_nothing",
    "test_constant_stubs_score_nothing",
    "test_a_defined_mistake_costs_the_aspect_it_names",
    "test_a_mistake_model_returns_what_its_code_returns",
]


def cases(kind, lesson, where=lambda case: True):
    """The lesson's MUTANTS or VARIANTS entries as pytest params (lesson, name, item), those `where` keeps."""
    return [c for c in mutants.cases(kind, [lesson]) if where(c)]


@each("lesson", one_lesson)
def test_every_graded_name_has_a_check_and_the_solutions_pass(lesson):
    ns = fresh_namespace(lesson)
    for name in graded_names(lesson):
        verify(lesson, name, ns)


@each("lesson", one_lesson)
def test_every_graded_name_has_at_least_three_mutants(lesson):
    module = mutants.for_lesson(lesson)
    assert module is not None, f"the mistakes module of {lesson} (autograder/lessons/<module>/mistakes.py) is missing"
    for name in graded_names(lesson):
        assert len(module.MUTANTS.get(name, [])) >= 3, f"{lesson}: {name} needs at least three known-wrong answers"


@pytest.fixture(scope="module")
def pristine():
    """A pristine interpreter (the tests and the course imported, nothing checked) that forks a child for each
    memory-bound mutant: every one starts from the same untouched allocator, as in a fresh interpreter, without
    paying an interpreter's start (about 2 s of CPU, for some 100 mutants)."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tests import conftest; from tests.harness.checks import serve_forks; serve_forks()",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def judge(*case):
        server.stdin.write(json.dumps(case) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], 600)
        if not ready:  # its verdict would come late, as the next case's: no later case may read it
            server.kill()
            pytest.fail(f"{case}: no verdict in 600 s")
        return json.loads(server.stdout.readline() or '"the fork server stopped"')

    yield judge
    server.stdin.close()
    server.wait(timeout=60)


def serve_forks():
    """pristine()'s server: for each (lesson, name, what) line on stdin, mutant_case in a forked child, and one
    line on stdout: "" when it held, else why not. Everything else printed goes to stderr."""
    verdicts = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for lesson in sorted({lesson for lesson, _ in mutants.MEMORY_BOUND}):
        fresh_namespace(lesson)  # imports, as each child's fresh_namespace begins (Triton's takes a second)
    for line in sys.stdin:
        read, write = os.pipe()
        if (pid := os.fork()) == 0:
            os.close(read)
            # Fresh for one mutant, as the grader's children are: the bounds of its own check leave glibc's thresholds
            # as they are (the pinned allocator's page faults cost lesson 09's mutants 106 CPU s instead of 44, with
            # the same verdicts); mutant_case pins them for the other names' checks
            memory.LocalBound.pin = False
            try:
                mutant_case(*json.loads(line))
                why = ""
            except BaseException:
                why = traceback.format_exc()[-3000:]
            with os.fdopen(write, "w") as out:
                out.write(why)
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as got:
            why = got.read()
        status = os.waitpid(pid, 0)[1]
        print(
            json.dumps(why or ("" if status == 0 else f"the child ended with wait status {status}")),
            file=verdicts,
            flush=True,
        )


@each(
    "lesson, name, mutant", lambda lesson: cases("MUTANTS", lesson, lambda c: c.values[:2] not in mutants.MEMORY_BOUND)
)
def test_mutant_fails_its_check_only(lesson, name, mutant):
    mutant_case(lesson, name, mutant[0])


@pytest.mark.slow  # some 6 s of CPU each in lesson 09, with every check of the lesson: make test-fast leaves them out
@each("lesson, name, mutant", lambda lesson: cases("MUTANTS", lesson, lambda c: c.values[:2] in mutants.MEMORY_BOUND))
def test_memory_bound_mutant_fails_its_check_only(lesson, name, mutant, pristine):
    """mutant_case in a fresh allocator, a child of the fork server: what ran before must not count. Each is a unit of
    its own for xdist (tests/conftest.py's SPREAD)."""
    why = pristine(lesson, name, mutant[0])
    assert not why, why


def mutant_case(lesson, name, what):
    """The mutant `what` of `name` fails its check, with its keyword (and, for a memory-bound check, the aspect its
    definition names: test_a_defined_mistake_costs_the_aspect_it_names), and costs no other name its points."""
    [mutant] = [m for m in mistakes.mutants(lesson)[name] if m.what == what]
    keyword, code = mutant.keyword, mutant.code
    ns = fresh_namespace(lesson, {name: code})
    with pytest.raises(AssertionError) as caught:
        verify(lesson, name, ns)
    assert keyword.lower() in str(caught.value).lower(), (
        f"feedback for '{what}' should mention {keyword!r}: {caught.value}"
    )
    if (lesson, name) in mutants.MEMORY_BOUND and mutant.aspect:
        assert_costs_its_aspect(lesson, name, mutant, caught.value)
    # The other names' code is the solutions', honest answers: their bounds pin the allocator (LocalBound.pin), so
    # that their verdicts do not depend on what ran before them (issue 19)
    memory.LocalBound.pin = True
    for other in sorted(seen_by(lesson, name, code, ns) - mutants.also_loses(lesson, what)):
        # Only what reads a name the two cells bind can see the mistake (lesson 09's flash_attention_backward check,
        # 4.5 s of CPU, for each mutant of the three other names).
        verify(lesson, other, ns)


def seen_by(lesson, name, code, ns=None):
    """The other graded names whose check can see `code` in the answer cell of `name` (ns: the lesson's cells run
    with that one, run here when not given): those that read a name the cell or the solution's cell binds, or all of
    them where the cell runs more than definitions."""
    bound, acts = _cell_binds(code)
    others = [other for other in graded_names(lesson) if other != name]
    if acts:
        return set(others)
    bound |= _cell_binds(answers(lesson)[name])[0]
    ns = fresh_namespace(lesson, {name: code}) if ns is None else ns
    return {other for other in others if _reads(lesson, other, ns) & bound}


def _cell_binds(code):
    """(the global names an answer cell binds, whether it runs more than definitions): a cell that keeps memory or
    rebinds through globals() can change any check, and every other name is verified with it."""
    tree, bound = ast.parse(code), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            bound |= set(node.names)
    acts = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            acts = acts or _defining_runs(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            acts = True
    return bound, acts


# Decorators that only wrap what they decorate when the cell runs
WRAPPERS = {"triton.jit", "torch.no_grad", "contextlib.contextmanager", "staticmethod", "classmethod", "property"}


def _defining_runs(node):
    """Whether defining this function or class runs code of the cell's own beyond binding it: a decorator but the
    WRAPPERS, a default value or a base that calls something, a class body statement but definitions and constants
    (a buffer reserved there or as a default argument is kept like one at the top level)."""
    if any(ast.unparse(d).removesuffix("()") not in WRAPPERS for d in node.decorator_list):
        return True
    if isinstance(node, ast.ClassDef):
        if node.keywords or any(not isinstance(b, (ast.Name, ast.Attribute)) for b in node.bases):
            return True
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if _defining_runs(item):
                    return True
            elif not isinstance(item, (ast.Expr, ast.Assign, ast.AnnAssign)) or not isinstance(
                item.value, ast.Constant
            ):
                return True
        return False
    defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    return any(isinstance(n, ast.Call) for d in defaults for n in ast.walk(d))


def _reads(lesson, name, ns):
    """Every name that the check of `name`, or the notebook code it reaches, mentions (the globals, and strings
    that are identifiers, of their code, followed through the check module's own helpers and the namespace's
    functions, classes and kernels): what a mistake in another cell must bind to reach that check. A check that
    runs the cells' text again (Subject.sources: lesson 06's Triton replay runs every cell's kernels, and the imports
    and constants beside them) reads what every cell with a kernel binds; one that parses it
    (Subject.readable_sources: lesson 09's d_per_pair) reads the definitions of the names it reads. The names it
    isolates are the grader's stand-ins while it runs (Check.isolate): it reads what their cells bind besides."""
    check = checks_for(lesson)[name]
    module = importlib.import_module(check.fn.__module__)
    seen, attributes = _mentions([check.fn], vars(module), module.__name__)
    if "sources" in attributes:
        seen |= {n for cell in ns["__cell_sources__"] if "@triton.jit" in cell for n in _cell_binds(cell)[0]}
    isolated = set(check.isolate)
    reached = [ns[n] for n in (seen | {name}) - isolated if n in ns]
    return _mentions(reached, {n: v for n, v in ns.items() if n not in isolated}, ns["__name__"], seen)[0] - isolated


GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


def _mentions(objects, env, owner, seen=()):
    """(the globals and identifier strings, the other names) that the code of `objects` mentions, and the code of
    what those globals name in env where `owner` defined it."""
    seen, attributes, todo, visited = {*seen}, set(), list(objects), set()
    while todo:
        obj = todo.pop()
        obj = inspect.unwrap(getattr(obj, "fn", obj) if not inspect.isclass(obj) else obj)  # a Triton kernel's .fn
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if inspect.isclass(obj):
            for v in vars(obj).values():
                todo.append(v.__func__ if isinstance(v, (staticmethod, classmethod)) else getattr(v, "fget", v))
            todo += [b for b in obj.__bases__ if env.get(b.__name__) is b]
            continue
        codes = [obj.__code__] if inspect.isfunction(obj) else []
        while codes:
            code = codes.pop()
            codes += [c for c in code.co_consts if inspect.iscode(c)]
            new = {i.argval for i in dis.get_instructions(code) if i.opname in GLOBAL_OPS}
            new = (new | {c for c in code.co_consts if isinstance(c, str) and c.isidentifier()}) - seen
            attributes |= set(code.co_names) - new
            seen |= new
            todo += [env[n] for n in new if getattr(env.get(n), "__module__", None) == owner]
    return seen, attributes


# What an honest call maps under a memory bound moves with the allocator's state (issue 19: 21 to 27 MiB of a 28 MiB
# bound for one correct flash_attention, which lost its "tiled" aspect in 1 run of 6): a correct answer must keep
# its marks with every bound this much smaller, so that no state of the allocator or the machine can cost it one.
HONEST_SHARE = 0.75
SOLUTION = ("the solution", None)


@pytest.fixture
def tighter_bounds(monkeypatch):
    """Every in-process memory bound HONEST_SHARE of its size."""
    enter = memory.LocalBound.enter
    monkeypatch.setattr(
        memory.LocalBound,
        "enter",
        lambda self, namespace, mb, headroom=0, inputs=0: enter(
            self, namespace, int(mb * HONEST_SHARE), headroom, inputs
        ),
    )


def _variants(lesson):
    """The lesson's correct variants, and the solutions of its memory-bound names; those of memory-bound names are
    slow (some 4 s of CPU each in lesson 09, under their bounds): make test-fast leaves them out, as their mutants."""
    params = cases("VARIANTS", lesson) + [
        pytest.param(lesson, name, SOLUTION, id=f"{lesson}-{name}-{SOLUTION[0]}")
        for lesson_, name in sorted(mutants.MEMORY_BOUND)
        if lesson_ == lesson
    ]
    return [
        pytest.param(
            *p.values, id=p.id, marks=[pytest.mark.slow] if tuple(p.values[:2]) in mutants.MEMORY_BOUND else []
        )
        for p in params
    ]


@each("lesson, name, variant", _variants)
def test_correct_variant_passes(lesson, name, variant, tighter_bounds):
    """Correct variants (and the solutions of the memory-bound names) pass, with every memory bound tightened."""
    verify(lesson, name, fresh_namespace(lesson, {name: variant[1]} if variant[1] else None))


def _zero_points(lesson, name, code):
    """verify() fails with nothing earned: a plain AssertionError, or PartialCredit of 0."""
    from autograder.checking import PartialCredit

    with pytest.raises(AssertionError) as caught:
        verify(lesson, name, fresh_namespace(lesson, {name: code}))
    return not isinstance(caught.value, PartialCredit) or caught.value.earned == 0


@each("lesson", one_lesson)
def test_the_released_stub_scores_nothing(lesson):
    from autograder import notebook as nbk

    answers = [
        c
        for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson)))
        if nbk.is_answer(c) and nbk.grade_id(c) in graded_names(lesson)
    ]
    for cell in answers:
        name = nbk.grade_id(cell)
        assert _zero_points(lesson, name, nbk.strip_solutions(nbk.source(cell))), (
            f"the released stub of {name} earns points"
        )


@each("lesson, name, mutant", lambda lesson: cases("MUTANTS", lesson, lambda c: c.values[2][0].startswith("constant")))
def test_constant_stubs_score_nothing(lesson, name, mutant):
    assert _zero_points(lesson, name, mutant[2]), f"'{mutant[0]}' earns partial credit"


# those of MEMORY_BOUND are judged in test_memory_bound_mutant_fails_its_check_only's fresh interpreter
@each(
    "lesson, name, mutant",
    lambda lesson: cases(
        "MUTANTS", lesson, lambda c: getattr(c.values[2], "aspect", "") and c.values[:2] not in mutants.MEMORY_BOUND
    ),
)
def test_a_defined_mistake_costs_the_aspect_it_names(lesson, name, mutant):
    with pytest.raises(AssertionError) as caught:
        verify(lesson, name, fresh_namespace(lesson, {name: mutant.code}))
    assert_costs_its_aspect(lesson, name, mutant, caught.value)


@each("lesson, name, mutant", lambda lesson: cases("MUTANTS", lesson, lambda c: getattr(c.values[2], "model", "")))
def test_a_mistake_model_returns_what_its_code_returns(lesson, name, mutant):
    """A mistake's model (autograder/lessons/<module>/mistakes.py: what its check runs in place of a code too slow
    for the grader, a Triton kernel) returns what the code returns, on the check's inputs named in its module's
    MODEL_INPUTS."""
    import importlib

    import numpy as np

    from autograder.checking import LESSONS as MODULES
    from autograder.checking import close, reference

    module = importlib.import_module(f"autograder.lessons.{MODULES[lesson]}.checks")
    if name in getattr(module, "UNAVAILABLE", {}):
        pytest.skip(module.UNAVAILABLE[name])
    code = fresh_namespace(lesson, {name: mutant.code})[name]
    [model] = [fn for m, fn in mistakes.defined(lesson, name) if m.what == mutant.what]
    inputs = module.MODEL_INPUTS[name](np.random.default_rng(0))
    assert inputs, f"MODEL_INPUTS gives {name} no inputs"
    for args in inputs:
        got, modelled = reference(code(*args)), reference(model(*args))
        assert close(got, modelled), f"'{mutant.what}': its model differs from its code on {args[0].shape}"


def assert_costs_its_aspect(lesson, name, mutant, error):
    """A mistake's definition names the aspect it costs (autograder/lessons/<module>/mistakes.py): that aspect
    fails. A plain AssertionError means the core failed, and with it every aspect."""
    from autograder.checking import checks_for

    rows = getattr(error, "rows", None)
    failed = {r["aspect"] for r in rows if not r["passed"]} if rows else set(checks_for(lesson)[name].aspects)
    assert mutant.aspect in failed, f"'{mutant.what}' should cost {mutant.aspect!r}; it failed {sorted(failed)}"


# A memory mutant of each memory-bound check, judged after every other check of lessons 06, 08 and 09 ran in the same
# process (and freed what they took): the verdict must be the fresh interpreter's (issue 19).
AFTER_OTHERS = [
    ("08_kv_compression", "RollingKVCache", "memory grows: every position is kept"),
    ("08_kv_compression", "absorbed_attention", "materialises one head's keys and values at a time"),
    ("06_gpu", "flash_attention", "the full score matrix, in a buffer reserved before the call"),
    ("09_flash_backward", "flash_attention_backward", "P and dP whole, in a 264 MiB buffer reserved before the call"),
    ("09_flash_backward", "FlashAttention", "P kept in a 68 MiB buffer reserved before the call"),
]


def memory_verdicts_after_others():
    """Run in a fresh interpreter: the honest checks of these lessons, then each of AFTER_OTHERS' mutants."""
    for lesson in sorted({lesson for lesson, _, _ in AFTER_OTHERS}):
        ns = fresh_namespace(lesson)
        for name in graded_names(lesson):
            verify(lesson, name, ns)
    for lesson, name, what in AFTER_OTHERS:
        [(keyword, code)] = [(k, c) for w, k, c in mutants.for_lesson(lesson).MUTANTS[name] if w == what]
        with pytest.raises(AssertionError) as caught:
            verify(lesson, name, fresh_namespace(lesson, {name: code}))
        assert keyword.lower() in str(caught.value).lower(), f"after other checks, '{what}': {caught.value}"


@pytest.mark.slow
def test_memory_verdicts_do_not_depend_on_what_ran_before():
    script = "from tests import conftest; from tests.harness.checks import memory_verdicts_after_others as f; f()"
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
