"""autograder/source_rules.py in-process: standard library only, honest habits accepted, tricks refused, and what
it cannot read refused with a message (never an exception, whatever the cells hold)."""
import ast
import sys

import pytest

from autograder import notebook as nbk
from autograder import source_rules
from autograder.grade import submission_cells
from autograder.release import student_copy
from tests import test_honest
from tests.lessons import fill
from tests.test_adversarial import with_cells


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


def test_a_list_of_cells_gives_every_rule_its_verdict():
    cells = _grader_cells(last=["%run helper.py"])
    assert set(source_rules.problems(cells)) == {"triton_attention", "flash_attention"}
    assert source_rules.problems(_grader_cells()) == {}
