"""Honest notebooks keep every mark: ordinary notebook habits (imports again in each cell, magics, a scratch copy
of an answer, a redefinition in a later cell, helpers, type hints, prints), graded by the real grader, one run per
lesson whose checks use evidence (05: generate's call log; 06: the source rules and memory; 08 and 09: memory).

Lesson 06's run also grades what the grader cannot read (a huge cell, a deeply nested expression, aliases of a module
written backwards, more than its bounded reading follows) beside the honest students: the student's failure with a
message, never the grader's error, and the grader's own memory stays bounded.
"""

import csv
import importlib
import os
import subprocess
import sys

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from autograder import notebook as nbk
from autograder.check_submission import MAX_CELL_CHARS, bound
from autograder.release import release
from autograder.results import NAME_CAP
from tests.grader.test_adversarial import with_cells
from tests.harness import each, watch
from tests.harness.lessons import answers as lesson_answers
from tests.harness.lessons import fill

__all__ = ["graded", "test_honest_habits_keep_every_mark", "test_cells_nothing_reads_cost_nothing"]
GRADER_MEMORY_MIB = 600  # the grader's own memory per job (issue 19); lesson 06's chunk-proof evidence counts the
# levels of its 2**23 keys on the grader's side instead of drawing them (issue 33: it took 970 MiB)

# Cells a student adds anywhere, and additions to every answer: each set is one habit, in every lesson's run. Habits
# that bind different names share a student (students()): each student costs a grading, up to 3 s of CPU in lesson 09.
MAGICS = {
    "matplotlib_inline": ["%matplotlib inline"],
    "autoreload": ["%load_ext autoreload\n%autoreload 2"],
    "pip_list": ["!pip list"],
    "subprocess_run": ["import subprocess, sys\nsubprocess.run([sys.executable, '--version'], check=True)"],
    "time_line": ["%time _ = sum(range(1000))"],
    "time_cell": ["%%time\ntotal = 0\nfor i in range(100):\n    total += i"],
    "timeit_line": ["%timeit -n 1 -r 1 sum(range(1000))"],
    "timeit_cell": ["%%timeit -n 1 -r 1\nsum(range(1000))"],
    "capture_and_config": ["%%capture\nprint('quiet')", "%config InlineBackend.figure_format = 'retina'\n_ = %env"],
    "help_and_imports_twice": [
        "import math\nimport math\nfrom torch import nn\nfrom torch import nn\n"
        "import torch as T\nimport torch.nn.functional as F\nlen?"
    ],
}
IMPORTS = "import math\nimport torch\nfrom torch import nn\nimport torch.nn.functional as F\n\n"


def _common(lesson, answers, scratch):
    """The habits every lesson shares: (cells inserted after the setup cell, answers replaced, cells at the end)."""
    return {
        "every_magic": ([cell for cells in MAGICS.values() for cell in cells], {}, []),
        "imports_magic_and_print_in_every_answer": (
            [],
            {g: f"%matplotlib inline\n{IMPORTS}{c}\n\nprint('defined', {g!r})\n" for g, c in answers.items()},
            [],
        ),
        "scratch_copy": ([], {}, [scratch]),
        "redefined_in_a_later_cell": ([], {}, [answers[g] for g in answers]),
    }


WRAPPER_HELPERS = '''
def _grid(seq_q: int, batch_heads: int, block_q: int) -> tuple:
    """The launch grid: one program per query tile and (batch, head)."""
    return (triton.cdiv(seq_q, block_q), batch_heads)

'''
JIT_HELPER = '''
@triton.jit
def _rescale(acc, alpha):
    """acc * alpha, row by row (a helper kernel)."""
    return acc * alpha[:, None]

'''
FLASH_HELPER = '''
def _tile(x: torch.Tensor, start: int, size: int) -> torch.Tensor:
    """Rows start..start+size of x (B, H, T, Dh), as the accumulation dtype."""
    return x[:, :, start:start + size]

'''
MODULE_READERS = {  # lesson 06: modules and genuine objects passed around only to be read (the source rules
    # refuse what changes something that may be a module, never what reads one)
    "a module passed to print its version": (
        "def show(m):\n    print(m.__name__, m.__version__)\n\nshow(torch)\nshow(triton)"
    ),
    "math passed to a helper": "def root(lib, x):\n    return lib.sqrt(x)\n\nprint(root(math, 2.0))",
    "a timing helper": (
        "import time\n\ndef timeit(fn, *args):\n    start = time.perf_counter()\n    fn(*args)\n"
        "    return time.perf_counter() - start\n\nx = torch.randn(1, 1, 8, 16)\n"
        "print(timeit(flash_attention, x, x, x), timeit(torch.matmul, x, x.transpose(-2, -1)))"
    ),
    "dtypes passed to a helper": (
        "def make(shape, dtype):\n    buf = torch.zeros(shape, dtype=dtype)\n    buf[0] = 1\n"
        "    buf.requires_grad = False\n    return buf\n\nb = make((2, 3), torch.float32)\n"
        "h = make((2,), torch.float16)"
    ),
    "an object keeping a module": (
        "class Backend:\n    def __init__(self, lib):\n        self.lib = lib\n"
        "        self.name = lib.__name__\n        self.calls = 0\n\n"
        "    def zeros(self, n):\n        self.calls = self.calls + 1\n"
        "        return self.lib.zeros(n)\n\n"
        "b = Backend(torch)\nz = b.zeros(3)"
    ),
    "modules in a list, read": (
        "for m in [torch, math]:\n    print(m.__name__)\nlibs = {'torch': torch}\nprint(libs['torch'].pi)"
    ),
    "a guarded import of a missing package": "try:\n    import google.colab\nexcept ImportError:\n    pass",
    "an import of a package the grader lacks": "from google.colab import drive",
    "reading sys.path and sys.modules": (
        "import sys\nprint(sys.path)\nprint('triton' in sys.modules)\n"
        "for p in sys.path:\n    print(p)\nmods = sorted(sys.modules)\nsys"
    ),
    "matplotlib settings": "plt.rcParams['figure.figsize'] = (8, 3)\nplt.rcParams.update({'font.size': 9})",
    "a layer's weights set in a helper": (
        "def load(layer, w):\n    layer.weight = nn.Parameter(w)\n\nlin = nn.Linear(2, 2)\nload(lin, torch.eye(2))"
    ),
}

# Memory kept at top level when the memory-bound checks run, up to their headroom (checks.HEADROOM_MB): a scratch
# tensor, or %matplotlib inline with a dataset (issue 19)
HELD = {
    "scratch_tensor_128MiB_kept": ([], {}, ["big = torch.randn(2**25)  # 128 MiB\nprint(big.std())"]),
    "scratch_tensor_256MiB_kept": ([], {}, ["big = torch.randn(2**26)  # 256 MiB\nprint(big.std())"]),
    "matplotlib_and_a_dataset_kept": (
        [],
        {},
        [
            "%matplotlib inline\nimport numpy as np\nimport matplotlib.pyplot as plt\n"
            "data = np.random.default_rng(0).standard_normal(2**24)  # a 128 MiB dataset\n"
            "_ = plt.plot(data[:100])"
        ],
    ),
}


def _lesson_06(answers):
    kernel, wrapper, flash = answers["_attention_kernel"], answers["triton_attention"], answers["flash_attention"]
    draft = "def triton_attention(q, k, v, causal=False):\n    return naive_attention(q, k, v, causal)\n"
    typed = wrapper.replace(
        "def triton_attention(q, k, v, causal=False):",
        "def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,\n"
        "                     causal: bool = False) -> torch.Tensor:",
    )
    return {
        "triton_reimports_torch_math": ([], {"triton_attention": "import torch\nimport math\n\n" + wrapper}, []),
        "triton_reimports_triton": (
            [],
            {"_attention_kernel": "import triton\nimport triton.language as tl\n\n" + kernel},
            [],
        ),
        "torch_under_another_name": (
            [],
            {
                "triton_attention": "import torch as T\nfrom math import sqrt\n\n"
                + wrapper.replace("torch.empty_like", "T.empty_like").replace("math.sqrt(Dh)", "sqrt(Dh)")
            },
            [],
        ),
        "wrapper_with_typed_helper": (
            [],
            {
                "triton_attention": WRAPPER_HELPERS
                + wrapper.replace(
                    'grid = (triton.cdiv(Tq, tiles["BLOCK_Q"]), B * H)', 'grid = _grid(Tq, B * H, tiles["BLOCK_Q"])'
                )
            },
            [],
        ),
        "wrapper_type_hints_and_print": (
            [],
            {"triton_attention": typed.replace("    return out\n", "    print(end='')\n    return out\n")},
            [],
        ),
        "kernel_with_jit_helper": (
            [],
            {
                "_attention_kernel": JIT_HELPER
                + kernel.replace("acc = acc * alpha[:, None] + tl.dot", "acc = _rescale(acc, alpha) + tl.dot")
            },
            [],
        ),
        "triton_draft_before_the_answer": ([draft], {}, []),
        "triton_scratch_copy": (
            [],
            {},
            ["f = triton_attention\n\ndef my_attempt(q, k, v, causal=False):\n    return f(q, k, v, causal)\n"],
        ),
        "kernel_fixed_in_a_later_cell": ([], {}, [kernel, wrapper]),
        "timing_the_kernel": (
            [],
            {},
            [
                "%%time\nx = torch.randn(1, 1, 8, 16)\n_ = triton_attention(x, x, x)",
                "%time _ = flash_attention(x, x, x)",
            ],
        ),
        "flash_reimports_and_helper": (
            [],
            {
                "flash_attention": "import torch.nn.functional as F\nimport math\n"
                + FLASH_HELPER
                + flash.replace("kb = k[:, :, ks:ks + block_k]", "kb = _tile(k, ks, block_k)")
            },
            [],
        ),
        "flash_draft_then_final": (
            [],
            {},
            [
                "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
                "    return naive_attention(q, k, v, causal)\n",
                flash,
            ],
        ),
        "sdpa_to_compare_in_a_scratch_cell": (
            [],
            {},
            [
                "from torch.nn.functional import scaled_dot_product_attention as sdpa\nx = torch.randn(1, 1, 8, 16)\n"
                "print((sdpa(x, x, x) - flash_attention(x, x, x)).abs().max())"
            ],
        ),
        "modules_read_by_helpers": ([], {}, list(MODULE_READERS.values())),
        "environment_and_flags": (
            ["os.environ['TRITON_PRINT_AUTOTUNING'] = '0'\ntorch.backends.cudnn.allow_tf32 = False"],
            {},
            [],
        ),
        # code run unseen by the checks
        "timing_with_timeit": (
            [],
            {},
            [
                "import timeit\nx = torch.randn(1, 1, 8, 16)\n"
                "print(timeit.timeit(lambda: flash_attention(x, x, x), number=2))\n"
                "print(timeit.repeat('flash_attention(x, x, x)',\n"
                "                    globals={'flash_attention': flash_attention, 'x': x}, number=1, repeat=2))",
                "%timeit -n 1 -r 1 flash_attention(x, x, x)",
            ],
        ),
        "tensors_saved_and_loaded": (
            [],
            {},
            [
                "import numpy as np\ntorch.save({'w': torch.ones(2)}, 'weights.pt')\nstate = torch.load('weights.pt')\n"
                "state = torch.load('weights.pt', map_location='cpu', weights_only=True)\n"
                "np.save('ones.npy', np.ones(3))\nones = np.load('ones.npy')"
            ],
        ),
        # issue 19: a float64 copy of one head's keys and values (Tk x Dh) is O(T), honest, and fits the tiled bound
        "flash_upcasts_one_head_to_float64": (
            [],
            {
                "flash_attention": dict(
                    importlib.import_module("autograder.lessons.gpu.mistakes").VARIANTS["flash_attention"]
                )["a loop over batch and heads, einsum, float64 inside"]
            },
            [],
        ),
        "gc_between_timings": (
            [],
            {},
            ["import gc\ngc.collect()\nif torch.cuda.is_available():\n    torch.cuda.empty_cache()"],
        ),
        **HELD,
    }


def _lesson_05(answers):
    return {
        "generate_helper_with_hints": (
            [],
            {
                "generate": answers["generate"]
                + '''

def greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """generate(), cached, with a docstring and type hints."""
    return generate(model, prompt, n, use_cache=True)
'''
            },
            [],
        )
    }


def _lesson_08(answers):
    return {
        "cache_subclass_in_scratch": (
            [],
            {},
            ['class MyCache(RollingKVCache):\n    """A scratch subclass."""\n\nc = MyCache\n'],
        ),
        # a scratch tensor kept at top level: more than RollingKVCache's whole bound (issue 19)
        "scratch_tensor_kept": ([], {}, ["big = torch.randn(8, 2**20)  # 32 MiB\nprint(big.std())"]),
        **HELD,
    }


def _lesson_09(answers):
    backward, function = answers["flash_attention_backward"], answers["FlashAttention"]
    return {
        "backward_with_typed_helper": ([], {"flash_attention_backward": FLASH_HELPER + backward}, []),
        "function_reimports_and_prints": ([], {"FlashAttention": IMPORTS + function + "\n\nprint('defined')\n"}, []),
        # a training step and gradcheck in scratch cells: autograd state left behind at top level
        "training_step_in_a_scratch_cell": (
            [],
            {},
            [
                "x = torch.randn(2, 2, 16, 8, dtype=torch.float64, requires_grad=True)\n"
                "loss = FlashAttention.apply(x, x, x, True).pow(2).sum()\nloss.backward()\nprint(x.grad.norm())",
                "ok = torch.autograd.gradcheck(FlashAttention.apply, (x[:1, :1, :4].detach().requires_grad_(),) * 3)",
            ],
        ),
        # the naive backward's P kept at top level while exploring (1 MiB), and timings
        "naive_probabilities_kept": (
            [],
            {},
            [
                "q = torch.randn(1, 1, 512, 16)\nP = torch.softmax(q @ q.transpose(-2, -1) / 4, dim=-1)\n"
                "grads = attention_backward(q, q, q, torch.ones_like(q))",
                "%time _ = flash_attention_backward(q, q, q, *flash_attention_forward(q, q, q), torch.ones_like(q))",
            ],
        ),
        **HELD,
    }


def _lesson_10(answers):
    rare = answers["rare_word_score"]
    return {
        "rare_word_score_with_a_helper": (
            [],
            {
                "rare_word_score": (
                    "def _lowest_so_far(count):\n    return torch.cummin(count, dim=0).values\n\n\n"
                    + rare.replace("count.cummin(dim=0).values", "_lowest_so_far(count)")
                )
            },
            [],
        ),
        # the checkpoint explored in scratch cells: importance, pruning, a training step that leaves .grad behind
        "checkpoint_explored_in_scratch_cells": (
            [],
            {},
            [
                "m, h = load_checkpoint('role_model.npz')\nstories = make_corpus(20, seed=5)\n"
                "imp = head_importance(m, stories.ids[:, :-1], stories.ids[:, 1:])\nmask = prune_heads(imp, 4)\n"
                "print(imp, mask)",
                "m.train()\n"
                "loss = F.cross_entropy(m(stories.ids[:, :-1]).flatten(0, 1), stories.ids[:, 1:].flatten())\n"
                "loss.backward()\n"
                "print(relation_accuracy(attention_patterns(m, stories.ids)[1, 0], stories.agreement[:1, 1:]))",
            ],
        ),
    }


SCRATCH = {
    "05_kv_cache": "g = generate\nC = KVCache\n",
    "06_gpu": "f = flash_attention\ng = triton_attention\n",
    "08_kv_compression": "C = RollingKVCache\nf = absorbed_attention\n",
    "09_flash_backward": "f = flash_attention_backward\nA = FlashAttention\n",
    "10_head_roles": "f = head_importance\np = prune_heads\n",
}
LESSON_PATTERNS = {
    "05_kv_cache": _lesson_05,
    "06_gpu": _lesson_06,
    "08_kv_compression": _lesson_08,
    "09_flash_backward": _lesson_09,
    "10_head_roles": _lesson_10,
}
# What the grader cannot read, graded beside the honest students of lesson 06: the student's failure, never ours.


def backward_chain(k, n):
    """n aliases of torch written backwards: the grader's reading of the module flow learns one a pass."""
    return "\n".join(f"b{k}_{i + 1} = b{k}_{i}" for i in range(n, 0, -1)) + f"\nb{k}_1 = torch"


UNREADABLE = {
    "huge_cell": "\n".join(["a = 1"] * (MAX_CELL_CHARS // 5)),  # longer than any cell the grader reads
    "deep_expression": "_x = " + "+".join(["1"] * 20_000),
    "backward_alias_chain": backward_chain(0, 4500),
}  # more passes than the grader's reading makes


def patterns(lesson):
    answers = dict(lesson_answers(lesson))
    return {**_common(lesson, answers, SCRATCH[lesson]), **LESSON_PATTERNS[lesson](answers)}


def _binds(cell):
    """The names a cell binds at top level, magics read as IPython runs them (a cell magic runs its body here)."""
    return bound(TransformerManager().transform_cell(cell.split("\n", 1)[1] if cell.startswith("%%") else cell))


def students(lesson):
    """{student id: {habit: (first, replace, last)}}: the lesson's habits, several to a student where their cells bind
    different names (a replaced answer binds its graded name), so that none redefines, replaces or hides what another
    one tests; a HELD habit alone, since the headroom is sized for one. The id names the habits graded together."""
    habits = patterns(lesson)
    names = {h: set(r).union(*map(_binds, [*f, *r.values(), *la])) for h, (f, r, la) in habits.items()}
    groups = []  # [[habit]]
    for habit in sorted(habits, key=lambda h: -len(names[h])):  # the habits binding most names first: fewer students
        fits = [
            group
            for group in groups
            if not HELD.keys() & {habit, *group}
            and not names[habit] & set().union(*(names[h] for h in group))
            and len(_student_id([*group, habit])) <= NAME_CAP
        ]
        if fits:
            min(fits, key=len).append(habit)  # the smallest group: a failure names few habits
        else:
            groups.append([habit])
    return {_student_id(group): {h: habits[h] for h in group} for group in groups}


def _student_id(habits):
    return "honest-" + "+".join(habits)


def grade(root, subs, lesson):
    """The real command; (process, grades.csv rows, the grader's peak resident memory in MiB)."""
    tmp = root / "tmp"
    tmp.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "autograder",
        "grade",
        str(subs),
        "--out",
        str(root / "results"),
        "--lesson",
        lesson,
        "--jobs",
        "2",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp))
    )
    out, err, peak = watch.communicate(proc, timeout=1500)
    proc.stderr_text = err
    rows = list(csv.DictReader((root / "results" / "grades.csv").open(newline=""))) if proc.returncode == 0 else []
    return proc, rows, peak


def _with_patterns(lesson):
    return [lesson] if lesson in LESSON_PATTERNS else []


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    """The honest students of the importing file's lesson, graded by the real command."""
    lesson = request.module.LESSON
    root = tmp_path_factory.mktemp(f"honest-{lesson}")
    release(root / "release", [lesson])
    rel = nbk.read(root / "release" / lesson / f"{lesson}.ipynb")
    subs = root / "submissions"

    def put(student, nb):
        nbk.write(nb, subs / student / lesson / f"{lesson}.ipynb")

    put("plain", fill(rel, lesson))
    for student, habits in students(lesson).items():
        first, replace, last = zip(*habits.values())
        nb = fill(rel, lesson, {g: cell for r in replace for g, cell in r.items()})
        first, last = sum(first, []), sum(last, [])
        nb = with_cells(nb, first, after=0) if first else nb
        put(student, with_cells(nb, last, after=-1) if last else nb)
    if lesson == "06_gpu":
        for name, cell in UNREADABLE.items():
            put(f"unreadable-{name}", with_cells(fill(rel, lesson), [cell], after=-1))
    proc, rows, peak = grade(root, subs, lesson)
    return lesson, proc, rows, peak


def _by_student(rows):
    out = {}
    for r in rows:
        out.setdefault(r["student"], []).append(r)
    return out


def test_the_corpus_is_large_enough():
    assert sum(len(patterns(lesson)) for lesson in LESSON_PATTERNS) >= 30


@pytest.mark.slow
@each("lesson", _with_patterns)
def test_honest_habits_keep_every_mark(lesson, graded):
    lesson, proc, rows, _ = graded
    assert proc.returncode == 0, proc.stderr_text[-3000:]
    by_student = _by_student(rows)
    graded_habits = {habit for student, habits in students(lesson).items() if student in by_student for habit in habits}
    assert set(patterns(lesson)) <= graded_habits, f"not graded: {set(patterns(lesson)) - graded_habits}"
    for student, got in by_student.items():
        if student.startswith(("honest-", "plain")):
            lost = {r["test"]: r["message"] for r in got if float(r["points"]) < float(r["max_points"])}
            assert not lost, (student, lost)


@pytest.mark.slow
@each("lesson", _with_patterns)
def test_cells_nothing_reads_cost_nothing(lesson, graded):
    lesson, proc, rows, peak = graded
    if lesson != "06_gpu":
        pytest.skip("the unreadable cells are graded in lesson 06's run")
    by_student = _by_student(rows)
    for name in UNREADABLE:  # nothing reads the cells to judge how an answer works any more (issue 33): they cost
        got = {r["test"]: r for r in by_student[f"unreadable-{name}"]}  # nothing, and the grader stays bounded
        assert all(r["status"] == "passed" for r in got.values()), got
    assert peak < GRADER_MEMORY_MIB, f"the grader reached {peak} MiB"
