"""A @triton.jit body may be Triton language only (autograder/triton_fit.not_triton): under TRITON_INTERPRET a kernel
is plain Python, and a body that reaches Python through a public attribute computes the answer outside Triton."""

import inspect

import pytest

from autograder import triton_fit as fit
from solutions import flash_backward, gpu

pytestmark = pytest.mark.skipif(not gpu.HAS_TRITON, reason="Triton is not installed")

HEAD = "import math\nimport triton\nimport triton.language as tl\n"


def body(lines, head=HEAD):
    return head + "@triton.jit\ndef k(X, Y, N, BLOCK: tl.constexpr):\n" + "".join(f"    {ln}\n" for ln in lines)


# Each route out of the Triton language that the interpreter runs: (its lines, what the refusal names)
ROUTES = {
    "builtins through tl.core": (["py = tl.core.builtins", "th = py.eval('1')"], "tl.core.builtins"),
    "numpy through triton.runtime": (["np = triton.runtime.interpreter.np"], "triton.runtime"),
    "a block's handle": (["x = tl.load(X)", "x.handle.data[:] = 0"], ".handle"),
    "a block's data": (["x = tl.load(X)", "a = x.data"], ".data"),
    "a private attribute": (["b = tl._core"], "_core"),
    "a module in a local": (["t = tl", "t.exp(1.0)"], "tl (a module used as a value)"),
    "a submodule in a local": (["m = tl.math", "m.exp(1.0)"], "tl.math (a module used as a value)"),
    "a non-Triton name in tl.math": (["w = tl.math.wraps"], "wraps"),
    "getattr": (["a = getattr(X, 'handle')"], "getattr"),
    "eval": (["a = eval('1')"], "eval"),
    "__import__": (["a = __import__('torch')"], "__import__"),
    "an attribute of a result no Triton value has": (["a = tl.load(X).tolist()"], ".tolist"),
    "torch": (["a = torch.zeros(1)"], "torch"),
    "an import in the body": (["import numpy"], "import"),
    "a module through from-import": (["y = core.builtins"], "core"),
}


@pytest.mark.parametrize("route", ROUTES)
def test_each_route_out_of_triton_is_refused_by_name(route):
    lines, named = ROUTES[route]
    head = HEAD + "from triton.language import core\n"
    [(name, foreign)] = fit.not_triton(fit.parsed([body(lines, head)]), ["k"])
    assert name == "k" and named in foreign


def test_triton_language_passes_by_any_alias():
    ok = [
        "pid = tl.program_id(0)",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "x = tl.load(X + offs, mask=offs < N, other=-float('inf')).to(tl.float32)",
        "e = tl.math.exp2((x - tl.max(x, 0)) * math.log2(math.e))",
        "f = lang.exp(x) + exp(x) + triton.language.exp(x) + tl.extra.cuda.libdevice.exp(x)",
        "tl.store(Y + offs, (e / tl.sum(e, 0) + f.T).to(Y.dtype.element_ty), mask=offs < N)",
        "n = triton.cdiv(N, BLOCK) + tl.float32.primitive_bitwidth + helper(x) + SCALE",
    ]
    head = HEAD + "from triton import language as lang\nfrom triton.language import exp\nSCALE = tl.constexpr(2)\n"
    helper = "@triton.jit\ndef helper(x):\n    return tl.sum(x, 0)\n"
    assert fit.not_triton(fit.parsed([body(ok, head), helper]), ["k"]) == []


def test_triton_s_names_bound_to_torch_are_not_triton():
    """The replay runs the cells' imports of torch and numpy too: tl bound to torch there makes tl.load torch.load."""
    cells = fit.parsed([body(["x = tl.load(X)"], HEAD + "import torch as tl\n")])
    assert fit.not_triton(cells, ["k"]) == [("k", "tl")]


def test_a_helper_the_kernel_calls_is_read_too():
    helper = "@triton.jit\ndef helper(x):\n    return tl.core.builtins.len(x)\n"
    cells = fit.parsed([body(["a = helper(X)"]), helper])
    assert fit.not_triton(cells, ["k"]) == [("helper", "tl.core.builtins.len (core)")]


def test_the_courses_own_kernels_are_triton_language():
    for module in (gpu, flash_backward):
        source = inspect.getsource(module)
        cells = fit.parsed([source])
        assert cells[0] and fit.not_triton(cells, [k.name for k in cells[0]]) == [], module.__name__


def test_check_submission_says_what_the_grader_says():
    """check_kernels (check_submission.py's, beside the lesson) names the same route, in the grader's words."""
    kernel = inspect.getsource(gpu._softmax_kernel.fn).replace(
        "    x = tl.load(", "    tl.core.builtins.print(0)\n    x = tl.load(", 1
    )
    said = fit.check_kernels(
        [HEAD + kernel], compiler=lambda jobs, timeout: [{"skipped": True, "error": "-"}] * len(jobs)
    )
    assert (True, fit.not_triton_message("_softmax_kernel", "tl.core.builtins.print (core)")) in said


# The attacker's kernel (issue 33): tl.core.builtins reaches eval and getattr, torch computes the attention into the
# loaded block's numpy array, and the kernel stores that block. An attack, not a student's mistake: it is kept here,
# not among lesson 06's mistakes (which the visible tests must mostly name).
ATTACK = """@triton.jit
def _attention_kernel(Q, K, V, O, TQ: tl.constexpr, TK: tl.constexpr, DH: tl.constexpr, CAUSAL: tl.constexpr,
                      BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    bh = tl.program_id(0)
    rq, rk, d = tl.arange(0, BQ)[:, None], tl.arange(0, BK)[:, None], tl.arange(0, BD)[None, :]
    q = tl.load(Q + bh * TQ * DH + rq * DH + d, mask=(rq < TQ) & (d < DH), other=0.0)
    k = tl.load(K + bh * TK * DH + rk * DH + d, mask=(rk < TK) & (d < DH), other=0.0)
    v = tl.load(V + bh * TK * DH + rk * DH + d, mask=(rk < TK) & (d < DH), other=0.0)
    py = tl.core.builtins
    th = py.eval("__import__('torch')")
    qt, kt, vt = (th.from_numpy(py.getattr(py.getattr(x, "hand" + "le"), "data")).double() for x in (q, k, v))
    mask = th.ones(TQ, TK, dtype=th.bool).tril(TK - TQ) if CAUSAL else None
    o = th.nn.functional.scaled_dot_product_attention(qt[:TQ, :DH], kt[:TK, :DH], vt[:TK, :DH], attn_mask=mask)
    py.getattr(py.getattr(q, "hand" + "le"), "data")[:TQ, :DH] = o.numpy()
    tl.store(O + bh * TQ * DH + rq * DH + d, q, mask=(rq < TQ) & (d < DH))


def triton_attention(q, k, v, causal=False):
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Tq, Dh = q.shape
    out = torch.empty_like(q)
    p2 = triton.next_power_of_2
    _attention_kernel[(B * H,)](q, k, v, out, TQ=Tq, TK=k.size(2), DH=Dh, CAUSAL=causal, BQ=p2(Tq), BK=p2(k.size(2)),
                                BD=p2(Dh))
    return out
"""


@pytest.mark.slow
def test_the_real_grader_costs_torch_in_the_kernel_its_aspect_only(tmp_path):
    from autograder import notebook as nbk
    from autograder.checking import checks_for
    from autograder.release import release
    from tests.harness.grading import read_grades, run
    from tests.harness.lessons import fill

    lesson, name, aspect = "06_gpu", "triton_attention", "float32"
    release(tmp_path / "release", [lesson])
    rel = nbk.read(tmp_path / "release" / lesson / f"{lesson}.ipynb")
    answers = {name: ATTACK}
    nbk.write(fill(rel, lesson, answers), tmp_path / "subs" / "s" / lesson / f"{lesson}.ipynb")
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--jobs", "1", "--quiet")
    grades = read_grades(tmp_path / "results")
    row = grades["s", lesson, f"test_{name}"]
    others = {n: grades["s", lesson, f"test_{n}"]["status"] for n in checks_for(lesson) if n != name}
    assert set(others.values()) == {"passed"}, others
    aspects = checks_for(lesson)[name].aspects
    core = next(iter(aspects))  # the first aspect is the answer's core: losing it loses every point
    share = 0.0 if aspect == core else float(row["max_points"]) * (1 - aspects[aspect] / sum(aspects.values()))
    assert float(row["points"]) == pytest.approx(share, abs=0.01), row["message"]
    assert "tl.core.builtins" in row["message"] and "not Triton language" in row["message"], row["message"]


# What runs as Python where a kernel is defined, the grader's replay of its launches too (lessons/gpu/triton_replay.py),
# each a route to the replay's launcher (rebound below to one that computes softmax in torch): triton_fit._def_time.
REBIND = "globals().update(_replay=lambda name, b, l: b)"
DEF_TIME = {
    "a decorator": (f"@triton.jit\n@(lambda f: {REBIND} or f)\ndef k(X, Y):\n    pass\n", "lambda f"),
    "a default value": (f"@triton.jit\ndef k(X, Y, H={REBIND}):\n    pass\n", "globals()"),
    "an annotation": (f"@triton.jit\ndef k(X, Y: {REBIND}):\n    pass\n", "globals()"),
    "a return annotation": (f"@triton.jit\ndef k(X, Y) -> {REBIND}:\n    pass\n", "globals()"),
    "a hook of autotune": (
        "@triton.autotune(configs=[triton.Config({'B': 16})], key=[], pre_hook=print)\n@triton.jit\n"
        "def k(X, Y, B: tl.constexpr):\n    pass\n",
        "print",
    ),
    "Triton's name bound to torch": ("import torch as triton\n\n\n@triton.jit\ndef k(X, Y):\n    pass\n", "triton.jit"),
    "Python reached through tl": ("@triton.jit\ndef k(X, Y, H=tl.core.builtins):\n    pass\n", "tl.core.builtins"),
    "a helper's decorator": (
        "@triton.jit\ndef k(X, Y):\n    h(X)\n\n\n@triton.jit\n@(lambda f: f)\ndef h(X):\n    pass\n",
        "lambda f",
    ),
}


@pytest.mark.parametrize("route", DEF_TIME)
def test_code_that_runs_where_a_kernel_is_defined_is_refused_and_never_replayed(route):
    from autograder.lessons.gpu.triton_replay import kernel_cells

    source, named = DEF_TIME[route]
    cells = fit.parsed([HEAD, source])
    [(name, foreign)] = fit.not_triton(cells, ["k"])
    assert named in foreign and "decorators, annotations or default values" in foreign
    assert named not in "".join(kernel_cells(cells)[1:])  # after its PREAMBLE


def test_plain_decorators_annotations_and_defaults_pass():
    kernel = """
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": SIZE})], key=["n"])
@triton.jit(do_not_specialize=["n"])
def k(X, Y, n: int, s: float = -1.0, BLOCK: tl.constexpr = SIZE, C: constexpr = None, D: "tl.constexpr" = (1, 2)):
    pass
"""
    cells = fit.parsed([HEAD + "from triton.language import constexpr\nSIZE = 64\n", kernel])
    assert fit.not_triton(cells, ["k"]) == [] and fit.plain(cells) == cells


def test_check_submission_says_what_the_grader_says_of_a_decorator():
    kernel = inspect.getsource(gpu._softmax_kernel.fn).replace("@triton.jit", "@triton.jit\n@(lambda f: f)", 1)
    said = fit.check_kernels(
        [HEAD + kernel], compiler=lambda jobs, timeout: [{"skipped": True, "error": "-"}] * len(jobs)
    )
    foreign = "lambda f: f (in its decorators, annotations or default values)"
    assert (True, fit.not_triton_message("_softmax_kernel", foreign)) in said
