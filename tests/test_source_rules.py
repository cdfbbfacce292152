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
    "a wrapper helper that calls torch": ("def _grid(*a):\n    return naive_attention(*a)\n\n" + "\n".join(
        line.replace("grid = (triton.cdiv(Tq, block_q), B * H)", "grid = _grid(q, k, v)")
        for line in test_honest._answers("06_gpu")["triton_attention"].splitlines()), "naive_attention"),
}


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_are_refused(trick):
    cell, word = TRICKS[trick]
    found = source_rules.triton_problem(_grader_cells(last=[cell]))
    assert found and word in found, found


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
