"""autograder/source_rules.py in-process: standard library only, honest habits accepted, tricks refused, and what
it cannot read refused with a message (never an exception, whatever the cells hold)."""
import ast
import inspect
import sys
import textwrap

import pytest

from autograder import notebook as nbk
from autograder import source_rules
from autograder.grade import submission_cells
from autograder.release import student_copy
from solutions.attention import answered
from tests.grader.test_adversarial import with_cells
from tests.harness import honest as test_honest
from tests.harness.lessons import fill

# What tests/lessons/test_<module>.py collects from here.
__all__ = ["test_the_rules_need_only_the_standard_library", "test_honest_habits_pass_the_rules", "beside_the_notebook",
           "test_tricks_are_refused", "test_flash_refuses_fused_attention_reached_unseen",
           "test_modules_read_through_helpers_keep_every_mark",
           "test_the_verdict_does_not_depend_on_what_this_process_has_loaded",
           "test_flash_accepts_a_setting_that_the_triton_rules_refuse",
           "test_flash_refuses_a_late_redefinition_that_calls_sdpa",
           "test_what_cannot_be_read_is_refused_with_a_message",
           "test_the_readings_work_grows_with_the_cells_not_faster",
           "test_a_list_of_cells_gives_every_rule_its_verdict", "test_the_warm_up_kernel_is_judged_by_its_own_rule",
           "test_code_run_unseen_is_refused_by_both_rules", "test_honest_timing_and_loading_keep_every_mark",
           "test_the_demonstrations_guard_keeps_every_mark", "test_the_guards_excuse_covers_only_its_exact_text",
           "test_grading_threads_never_share_a_reading", "test_reading_a_chain_or_a_nest_is_linear_in_its_length"]


def _grader_cells(first=(), replace=None, last=()):
    """Lesson 06's cells as the grader reads a solved submission, with cells added and answers replaced."""
    nb = fill(student_copy(nbk.read(nbk.lesson_path("06_gpu"))), "06_gpu", replace or {})
    nb = with_cells(nb, list(first), after=0) if first else nb
    nb = with_cells(nb, list(last), after=-1) if last else nb
    return submission_cells(nb)[0]


def test_the_rules_need_only_the_standard_library():
    tree = ast.parse(open(source_rules.__file__, encoding="utf-8").read())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


@pytest.mark.parametrize("pattern", sorted(test_honest.patterns("06_gpu")))
def test_honest_habits_pass_the_rules(pattern):
    first, replace, last = test_honest.patterns("06_gpu")[pattern]
    assert source_rules.problems(_grader_cells(first, replace, last)) == {}


TRICKS = {  # cells appended to a solved notebook, and a word of the reason each is refused for
    "triton bound to another module": ("import torch as triton", "`triton`"),
    "tl rebound after its import": ("import triton.language as tl\ntl = torch", "`tl`"),
    "torch patched through an alias": ("x = torch\nx.empty_like = lambda q: q", "x.empty_like"),
    "torch patched through a list": ("mods = [torch]\nmods[0].empty_like = lambda q: q", "mods[0].empty_like"),
    "a class patched through type()": ("type(torch.zeros(1)).contiguous = lambda t: t", "changes"),
    "a class patched by a loop": ("for m in [torch.Tensor]:\n    m.contiguous = lambda t: t", "m.contiguous"),
    "the wrapper redefined in %%timeit": ("%%timeit -n 1\ndef triton_attention(q, k, v, causal=False):\n"
                                          "    return naive_attention(q, k, v, causal)", "condition"),
    "the wrapper rebound by %time": ("%time triton_attention = flash_attention", "condition"),
    "the wrapper rebound by a magic assignment": ("triton_attention = %time flash_attention", "condition"),
    "the wrapper rebound by a function": ("def swap():\n    global triton_attention\n    triton_attention = None",
                                          "global"),
    "a shell command that writes a file": ("!echo 'import torch' > helper.py", "shell"),
    "an extension of one's own": ("%load_ext helper", "%load_ext"),
    "a pasted prompt hiding a binding": ("In [1]: triton_attention = flash_attention", "prompts"),
    "a builtin rebound at the top level": ("max = lambda *a: 0", "`max`"),
    # a module reached without its name: through an argument, a local, a call's result, a container, an object
    "torch patched through an argument": ("def f(m):\n    m.empty_like = lambda q: q\n\nf(torch)", "m.empty_like"),
    "torch patched through a default": ("def f(m=torch):\n    m.empty_like = lambda q: q\n\nf()", "m.empty_like"),
    "torch patched through a local": ("def f():\n    x = torch\n    x.empty_like = lambda q: q\n\nf()",
                                      "x.empty_like"),
    "torch returned by a function": ("def g():\n    return torch\n\nt = g()\nt.empty_like = lambda q: q",
                                     "t.empty_like"),
    "torch in a dict built by a call": ("d = dict(t=torch)\nd['t'].empty_like = lambda q: q", "empty_like"),
    "torch appended to a list": ("mods = []\nmods.append(torch)\nmods[0].empty_like = lambda q: q", "empty_like"),
    "torch kept by an object": ("class P:\n    def __init__(self, m):\n        self.m = m\n\n"
                                "    def patch(self):\n        self.m.empty_like = lambda q: q\n\nP(torch).patch()",
                                "self.m.empty_like"),
    "a class patched by a comprehension's helper": ("def f(c):\n    c.contiguous = lambda t: t\n\n"
                                                     "_ = [f(c) for c in [torch.Tensor]]", "c.contiguous"),
    "a class patched through functools.partial": ("import functools\n\ndef f(c):\n    c.contiguous = lambda t: t\n\n"
                                                   "functools.partial(f, torch.Tensor)()", "c.contiguous"),
    # a module the cells wrote, or code loaded from a file
    "a module the cells wrote": ("from pathlib import Path\nPath('helper.py').write_text('import torch')\n"
                                 "import helper", "`helper`"),
    "a module copied and imported": ("import shutil\nshutil.copy('data.txt', 'helper2.py')\nfrom helper2 import f",
                                     "`helper2`"),
    "a written module imported by %aimport": ("open('helper.py', 'w').write('x = 1')\n%aimport helper", "`helper`"),
    "the import path changed": ("import sys\nsys.path.insert(0, '')", "sys.path"),
    "the import path changed through an alias": ("import sys\np = sys.path\np.append('.')", "sys.path"),
    "a file run by runpy": ("import runpy\nns = runpy.run_path('helper.py')", "runpy"),
    "a relative import": ("from . import helper", "relative"),
    "sys reached through getattr": ("import sys\ngetattr(sys, 'pa' + 'th').insert(0, '')", "`sys`"),
    "sys under an alias": ("import sys\ns = sys\ns.path.insert(0, '')", "`sys`"),
    "a pickle that runs code": ("import pickle\npickle.loads(b'')", "pickle"),
    "a module patched by name with mock": ("from unittest import mock\nmock.patch('torch.empty_like', None).start()",
                                           "unittest"),
    "a wrapper helper that calls torch": ("def _grid(*a):\n    return naive_attention(*a)\n\n" + "\n".join(
        line.replace("grid = (triton.cdiv(Tq, block_q), B * H)", "grid = _grid(q, k, v)")
        for line in test_honest._answers("06_gpu")["triton_attention"].splitlines()), "naive_attention"),
}


@pytest.fixture
def beside_the_notebook(tmp_path, monkeypatch):
    """The working folder as the visible tests see it once the cells wrote their modules (the grader's sandbox
    cannot import them: no writable folder is on its sys.path)."""
    monkeypatch.chdir(tmp_path)
    for name in ("helper", "helper2", "fa"):
        (tmp_path / f"{name}.py").write_text("import torch\n")


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_are_refused(trick, beside_the_notebook):
    cell, word = TRICKS[trick]
    found = source_rules.triton_problem(_grader_cells(last=[cell]))
    assert found and word in found, found


FLASH_TRICKS = {  # a cell that hands flash_attention fused attention unseen, what it is called as, a word of the reason
    "a module the cells wrote": ("open('fa.py', 'w').write('import torch.nn.functional as F\\nrun = F.scaled_dot_'\n"
                                 "                           'product_attention\\n')\nimport fa", "fa.run", "`fa`"),
    "a module patched through an argument": ("def alias(m):\n    m.tiled = m.scaled_dot_product_attention\n\n"
                                             "alias(F)", "F.tiled", "m.tiled"),
    "setattr through an argument": ("def alias(m, name, to):\n    setattr(m, name, getattr(m, to))\n\n"
                                    "alias(F, 'tiled', 'scaled_dot_product' + '_attention')", "F.tiled", "setattr"),
    "a module patched at the top level": ("F.tiled = F.scaled_dot_product_attention", "F.tiled", "F.tiled"),
    "a module found in sys.modules": ("import sys\nsys.modules['torch.nn.functional'].tiled = "
                                      "F.scaled_dot_product_attention", "F.tiled", "sys.modules"),
    "the import path changed": ("import sys\nsys.path.insert(0, '')", "F.tiled", "sys.path"),
    "a module's namespace changed through vars()": ("vars(F)['tiled'] = F.scaled_dot_product_attention", "F.tiled",
                                                    "vars(F)"),
}
CALLS = "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n    return {}(q, k, v, is_causal=causal)"


@pytest.mark.parametrize("trick", FLASH_TRICKS)
def test_flash_refuses_fused_attention_reached_unseen(trick, beside_the_notebook):
    cell, call, word = FLASH_TRICKS[trick]
    found = source_rules.flash_problem(_grader_cells(last=[cell, CALLS.format(call)]))
    assert found and word in found, found


@pytest.mark.parametrize("use", test_honest.MODULE_READERS)
def test_modules_read_through_helpers_keep_every_mark(use):
    """Each alone (test_honest grades them all in one notebook)."""
    assert source_rules.problems(_grader_cells(last=[test_honest.MODULE_READERS[use]])) == {}


def test_the_verdict_does_not_depend_on_what_this_process_has_loaded():
    """The rules look genuine objects up in sys.modules, never importing: the grader reads the cells where the
    notebook ran, which has torch loaded and Triton only where it is installed. The honest patterns get the same
    verdict in a fresh Python with torch and without Triton (here, both are loaded)."""
    import json
    import subprocess

    import triton.language  # noqa: F401 - loaded here, so that the two processes differ

    cases = {name: _grader_cells(*test_honest.patterns("06_gpu")[name]) for name in test_honest.patterns("06_gpu")}
    here = {name: source_rules.problems(cells) for name, cells in cases.items()}
    probe = ("import importlib.util, json, sys; s = importlib.util.spec_from_file_location('r', sys.argv[1]); "
             "r = importlib.util.module_from_spec(s); s.loader.exec_module(r); import torch; "
             "assert 'triton' not in sys.modules; "
             "print(json.dumps({n: r.problems(c) for n, c in json.load(sys.stdin).items()}))")
    p = subprocess.run([sys.executable, "-I", "-c", probe, source_rules.__file__], input=json.dumps(cases),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == here == {name: {} for name in cases}


def test_flash_accepts_a_setting_that_the_triton_rules_refuse():
    """An item a module holds, set from a variable, cannot hand flash_attention fused attention; the Triton rules,
    which trust what torch and triton hold, still refuse it."""
    cells = _grader_cells(last=["size = 9\nplt.rcParams['font.size'] = size"])
    assert source_rules.flash_problem(cells) is None
    assert "plt.rcParams" in source_rules.triton_problem(cells)


def test_flash_refuses_a_late_redefinition_that_calls_sdpa():
    found = source_rules.flash_problem(_grader_cells(last=[
        "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
        "    return F.scaled_dot_product_attention(q, k, v)"]))
    assert found and "scaled_dot_product_attention" in found


@pytest.mark.parametrize("cell, words", [
    ("\n".join(["a = 1"] * 150_000), "characters"),
    ("_x = " + "+".join(["1"] * 20_000), "too deeply"),
    ("_x = " + "-" * 5000 + "1", "cell"),
    ("x = [" * 120 + "]" * 120, "cell"),
    ("def f(:\n    pass", "does not parse"),
    ("'\\N{no such name}'", "does not parse"),
    ("\x00", "does not parse"),
])
def test_what_cannot_be_read_is_refused_with_a_message(cell, words):
    for rule in (source_rules.triton_problem, source_rules.flash_problem):
        found = rule(_grader_cells(last=[cell]))
        assert found and words in found, found


WORK = {  # cells within the size limits that made the grader's reading superlinear (seconds of its CPU)
    "backward_chains": [test_honest.backward_chain(k, 4300) for k in range(3)],
    "functions_and_unfollowed_calls": ["\n".join(f"def f{k}_{i}(x):\n    return f{k}_{i - 1}(x)" for i in range(2500, 0, -1))
                                       + f"\ndef f{k}_0(x):\n    return torch\n" for k in range(2)],
    "calls_through_a_table": ["\n".join(f"def g{i}(x):\n    return 1" for i in range(2000))
                              + "\ntable = [g0]\n" + "\n".join(["table[0](torch)"] * 2000)],
}


@pytest.mark.parametrize("name", sorted(WORK))
def test_the_readings_work_grows_with_the_cells_not_faster(name, monkeypatch):
    """Every rule's verdict on one submission reads its cells once, in passes bounded in all (MAX_VISITS), and
    hands a call it cannot follow every function's parameters once, not once per call and pass."""
    cells = _grader_cells(last=WORK[name])
    counts = {"_visit": 0, "_params": 0, "_parents": 0}

    def counting(owner, attr):
        real = getattr(owner, attr)

        def counted(*args, **kwargs):
            counts[attr] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, attr, counted)
    counting(source_rules.Flow, "_visit")
    counting(source_rules.Flow, "_params")
    counting(source_rules, "_parents")
    functions = sum(isinstance(n, (ast.FunctionDef, ast.Lambda)) for c in cells if not c.lstrip().startswith(("%", "!"))
                    for n in ast.walk(ast.parse(c)))
    source_rules.problems(cells)
    assert counts["_visit"] <= source_rules.MAX_VISITS, counts
    assert counts["_params"] <= 2 * functions and counts["_parents"] <= 1, (counts, functions)


def test_a_list_of_cells_gives_every_rule_its_verdict():
    cells = _grader_cells(last=["%run helper.py"])
    assert set(source_rules.problems(cells)) == {"triton_attention", "flash_attention", "triton_softmax",
                                                 "online_softmax"}
    assert source_rules.problems(_grader_cells()) == {}


def test_the_warm_up_kernel_is_judged_by_its_own_rule():
    cells = _grader_cells(last=["def triton_softmax(x):\n    return torch.softmax(x, dim=-1)\n"])
    assert set(source_rules.problems(cells)) == {"triton_softmax"}
    assert "triton_softmax calls `torch.softmax`" in source_rules.softmax_problem(cells)


HIDDEN_CODE = {  # code run where no reading sees it, in any cell: refused by both rules, with a word of the reason
    "torch.load that unpickles": ("m = torch.load('m.pt', weights_only=False)", "weights_only=False"),
    "torch.load told by a variable": ("safe = False\nm = torch.load('m.pt', weights_only=safe)", "weights_only=safe"),
    "torch.load given its options unseen": ("opts = {}\nm = torch.load('m.pt', **opts)", "torch.load"),
    "torch.load given a pickle module by position": ("m = torch.load('m.pt', None, torch)", "torch.load"),
    "torch.load under another name": ("load = torch.load\nm = load('m.pt')", "passes `torch.load`"),
    "torch.load's default turned off": ("os.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] = '1'",
                                        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"),
    "globals allowed to unpickle": ("torch.serialization.add_safe_globals([print])", "add_safe_globals"),
    "numpy that unpickles": ("import numpy as np\na = np.load('a.npy', allow_pickle=True)", "allow_pickle"),
    "pandas that unpickles": ("import pandas as pd\na = pd.read_pickle('a.pkl')", "read_pickle"),
    "marshalled code": ("import marshal\ncode = marshal.loads(b'')", "marshal"),
    "exec at the top level": ("exec('import torch')", "`exec`"),
    "code compiled from a string": ("c = compile('x = 1', 'cell', 'exec')", "`compile`"),
    "ctypes": ("import ctypes\nctypes.pythonapi.Py_IncRef", "ctypes"),
    "a TorchFunctionMode of one's own": ("from torch.overrides import TorchFunctionMode\n\n"
                                         "class Quiet(TorchFunctionMode):\n    pass", "TorchFunctionMode"),
    "a TorchDispatchMode of one's own": (
        "from torch.utils._python_dispatch import TorchDispatchMode\n\nclass Quiet(TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n        return func(*args)",
        "TorchDispatchMode"),
    "the lesson's OpLog changed": (
        "class OpLog(TorchDispatchMode):\n    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {}))", "TorchDispatchMode"),
    "a tensor subclass with __torch_function__": (
        "class T(torch.Tensor):\n    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {}))", "__torch_function__"),
    "the visible test's tracer switched off": (
        "from torch.utils._python_dispatch import _disable_current_modes\n\nwith _disable_current_modes():\n"
        "    pass", "_disable_current_modes"),
    "an aten kernel registered by hand": ("lib = torch.library.Library('aten', 'IMPL')", "torch.library"),
    "torch's C internals": ("torch._C._set_grad_enabled(True)", "torch._C"),
    "a profile hook": ("import sys\nsys.setprofile(lambda frame, event, arg: None)", "sys.setprofile"),
    "a trace hook on every thread": ("import threading\nthreading.settrace(print)", "threading.settrace"),
    "the caller's frame": ("import sys\nf = sys._getframe(0)", "sys._getframe"),
    "a frame reached from a traceback": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
                                         "    up = e.__traceback__.tb_frame", "frame"),
    "every live object": ("import gc\nobjs = gc.get_objects()", "gc.get_objects"),
    "gc under another name": ("import gc\ng = gc\nobjs = g.get_objects()", "`gc`"),
    # code in strings given to timers: a literal is read as code (and refused for what it does), anything else is
    # refused as unreadable
    "code in a timeit string": ("import timeit\ntimeit.timeit(\"exec('import torch')\", number=1)", "`exec`"),
    "a patch in a timeit string": ("import timeit\nns = {'F': F}\ntimeit.timeit('F.tiled = "
                                   "F.scaled_dot_product_attention', globals=ns, number=1)", "F.tiled"),
    "a written module imported in a timeit setup": ("import timeit\ntimeit.timeit('pass', setup='import helper')",
                                                    "`helper`"),
    "code built for timeit": ("import timeit\ncode = 'import ' + 'helper'\ntimeit.timeit(code, number=1)",
                              "`code`"),
    "code given to a Timer by name": ("from timeit import Timer\nTimer(stmt='imp' + 'ort helper').timeit(1)", "stmt"),
    "code run by cProfile": ("import cProfile\ncProfile.run(\"eval('1')\")", "`eval`"),
    "timeit under another name": ("import timeit\nt = timeit.timeit\nt('import helper')", "passes `timeit.timeit`"),
    "timeit through an alias of its module": ("import timeit\nm = timeit\nm.timeit('import helper')", "m.timeit"),
    "a timeit string that does not parse": ("import timeit\ntimeit.timeit('def (:', number=1)", "does not parse"),
}


@pytest.mark.parametrize("trick", HIDDEN_CODE)
def test_code_run_unseen_is_refused_by_both_rules(trick, beside_the_notebook):
    cell, word = HIDDEN_CODE[trick]
    cells = _grader_cells(last=[cell])
    for rule in (source_rules.triton_problem, source_rules.flash_problem):
        found = rule(cells)
        assert found and word in found, (rule.__name__, found)


HONEST_NEAR_THE_RULES = {  # beside each rule above, what honest notebooks do (those that run anywhere are also
    # graded in test_honest's lesson 06 run)
    "torch.load with its defaults": ("m = torch.load('m.pt')\n"
                                     "m = torch.load('m.pt', map_location='cpu', weights_only=True)"),
    "torch.load imported by name": "from torch.serialization import load\nm = load('m.pt')",
    "numpy.load with its defaults": ("import numpy as np\na = np.load('a.npy')\n"
                                     "a = np.load('a.npy', allow_pickle=False)"),
    "%timeit of an answer": "x = torch.randn(1, 1, 8, 16)\n%timeit flash_attention(x, x, x)",
    "%prun of an answer": "x = torch.randn(1, 1, 8, 16)\n%prun -s cumtime flash_attention(x, x, x)",
    "timeit given a lambda": ("import timeit\nx = torch.randn(1, 1, 8, 16)\n"
                              "timeit.timeit(lambda: flash_attention(x, x, x))"),
    "timeit given a function": ("import timeit\n\ndef step():\n    flash_attention(x, x, x)\n\n"
                                "timeit.repeat(step, number=2)"),
    "timeit given a literal": ("from timeit import timeit, Timer\ntimeit('flash_attention(x, x, x)', "
                               "globals={'flash_attention': flash_attention, 'x': x}, number=1)\n"
                               "Timer('sum(range(9))').timeit(1)"),
    "a timing helper around timeit": ("import timeit\n\ndef bench(fn, *args):\n"
                                      "    return timeit.timeit(lambda: fn(*args), number=3)\n\n"
                                      "bench(flash_attention, x, x, x)"),
    "torch's benchmark Timer": ("import torch.utils.benchmark as benchmark\nt = benchmark.Timer("
                                "stmt='flash_attention(x, x, x)',\n"
                                "                    globals={'flash_attention': flash_attention, 'x': x})"),
    "cProfile of an answer": "import cProfile\ncProfile.run('flash_attention(x, x, x)')",
    "gc between timings": "import gc\ngc.collect()\nfrom gc import collect\ncollect()",
    "the lesson's own OpLog, run again": "with OpLog() as log:\n    flash_attention(x, x, x)\nprint(len(log.ops))",
    "a model put in eval mode": "lin = nn.Linear(2, 2).eval()",
}


@pytest.mark.parametrize("use", HONEST_NEAR_THE_RULES)
def test_honest_timing_and_loading_keep_every_mark(use):
    assert source_rules.problems(_grader_cells(last=[HONEST_NEAR_THE_RULES[use]])) == {}


# The demonstrations' guard, and the demonstration that defines it, as lesson 06 has them: the visible tests judge
# the cells the kernel ran (IPython's In), demonstrations included, and the guard reads `vars` and `__code__`.
GUARD = inspect.getsource(answered)
GUARD_CELL = next(nbk.source(c) for c in nbk.read(nbk.lesson_path("06_gpu"))["cells"]
                  if nbk.is_demo(c) and GUARD in nbk.source(c))


def test_the_demonstrations_guard_keeps_every_mark():
    assert source_rules.problems(_grader_cells(last=[GUARD_CELL])) == {}


GUARD_ABUSES = {  # the guard's excuse is its exact text, a top-level statement: anything else that reads the same is
    # refused, with a word of the reason
    "a line added to the guard": (GUARD.replace("    for answer in answers:\n", "    ns = vars(torch)\n"
                                                "    for answer in answers:\n"), "`vars`"),
    "the guard under another name": (GUARD.replace("def answered(", "def peek("), "`vars`"),
    "the guard decorated": ("@contextlib.contextmanager\n" + GUARD, "`vars`"),
    "the guard nested in a block": ("if True:\n" + textwrap.indent(GUARD, "    "), "`vars`"),
    "the guard beside vars in its cell": (GUARD + "\n\nns = vars(torch)\n", "`vars`"),
    "the guard's own code taken": (GUARD + "\n\ncode = answered.__code__\n", "`.__code__`"),
}


@pytest.mark.parametrize("abuse", GUARD_ABUSES)
def test_the_guards_excuse_covers_only_its_exact_text(abuse):
    cell, word = GUARD_ABUSES[abuse]
    found = source_rules.problems(_grader_cells(last=[cell]))
    assert {"triton_attention", "triton_softmax"} <= set(found) and all(word in why for why in found.values()), found


def test_grading_threads_never_share_a_reading():
    """The reading of the last notebook is kept per grading thread (issue 33): with one shared, a thread could judge
    its notebook by another thread's cells between checking and using it."""
    import threading

    honest = ["import torch\n\ndef flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n    return q\n"]
    fused = ["import torch.nn.functional as F\n\ndef flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
             "    return F.scaled_dot_product_attention(q, k, v)\n"]
    wrong, switch = [], sys.getswitchinterval()

    def judge(cells, refused):
        for _ in range(300):
            if (source_rules.flash_problem(cells) is not None) != refused:
                wrong.append(refused)

    sys.setswitchinterval(1e-6)  # switch threads as often as possible: every window between two lines is tried
    try:
        threads = [threading.Thread(target=judge, args=args) for args in ((honest, False), (fused, True))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not wrong


@pytest.mark.parametrize("depth", [20, 40, 80])
def test_reading_a_chain_or_a_nest_is_linear_in_its_length(depth, monkeypatch):
    """An attribute chain or a nested call n long is read link by link once, not once per link (issue 33: the reading
    was quadratic in a chain's length): the links asked about grow as n, not n**2."""
    asked = {"may": 0, "resolve": 0}
    may, resolve = source_rules.Flow._may_read, source_rules.Cells.resolve
    monkeypatch.setattr(source_rules.Flow, "_may_read",
                        lambda self, *a: asked.__setitem__("may", asked["may"] + 1) or may(self, *a))

    def counting(self, node):
        chain = node
        while isinstance(chain, ast.Attribute) and id(chain) not in self._resolved:
            asked["resolve"] += 1
            chain = chain.value
        return resolve(self, node)

    monkeypatch.setattr(source_rules.Cells, "resolve", counting)
    chain = "torch." + ".".join(f"a{i}" for i in range(depth // 2))
    nest = "f(" * (depth // 2) + "torch" + ")" * (depth // 2)
    cells = [f"import torch\n\ndef f(x):\n    return x\n\ndef flash_attention(q, k, v):\n    y = {chain}\n    return {nest}\n"]
    source_rules._LAST.__dict__.clear()
    source_rules.flash_problem(cells)
    assert asked["resolve"] <= 4 * depth and asked["may"] <= 4 * depth, (depth, asked)
