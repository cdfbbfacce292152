"""solutions.flash_backward (lesson 09): the gradients by hand and the tiled backward equal autograd through
PyTorch's scaled_dot_product_attention (bottom-right causal, Tq != Tk, ragged tiles, every dtype), lse equals
torch.logsumexp, the autograd Function passes gradcheck and saves no probabilities, and the backward never forms
a (Tq, Tk) tensor nor one larger than the contract's bound (a TorchDispatchMode records every tensor made)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from solutions.flash_backward import (
    HAS_TRITON,
    FlashAttention,
    TritonFlashAttention,
    attention_backward,
    flash_attention_backward,
    flash_attention_forward,
    triton_flash_forward,
)
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "09_flash_backward"

# The contract's tolerances against the float64 truth, max|err| <= tol * (1 + max|truth|): 1e-10 in float64 and
# 1e-4 in float32. Half precision is computed in float32 and rounded once at the end: a few units of its epsilon.
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
HALF = (torch.float16, torch.bfloat16)
# (Tq, Tk, causal): square, more keys than queries (a KV cache), more queries than keys (non-causal only: a causal
# row would see no key), one query, lengths that do not divide the blocks of 16 x 24 used below.
SHAPES = [(40, 40, False), (40, 40, True), (37, 53, True), (53, 37, False), (1, 29, True), (48, 48, True)]


def bottom_right(n_q, n_k):
    """The contract's causal mask, bool (Tq, Tk): query i sees key j iff j <= i + Tk - Tq."""
    return torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)


def inputs(tq, tk, dtype, b=2, h=3, dh=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(b, h, tq, dh, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, h, tk, dh, generator=g, dtype=torch.float64) for _ in range(2))
    return tuple(t.to(dtype) for t in (q, k, v, do))


def truth(q, k, v, do, causal):
    """(out, dq, dk, dv) by autograd through SDPA, in float64, from the (possibly rounded) inputs."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = bottom_right(q.size(2), k.size(2)) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(do.double())
    return out.detach(), q.grad, k.grad, v.grad


def assert_near(got, want, dtype, what):
    assert got.dtype == dtype and got.shape == want.shape, f"{what}: {got.dtype} {tuple(got.shape)}"
    err = (got.double() - want).abs().max().item()
    assert err <= TOL[dtype] * (1 + want.abs().max().item()), f"{what}: max error {err:.2e} in {dtype}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF])
@pytest.mark.parametrize("tq, tk, causal", SHAPES)
def test_attention_backward_equals_autograd_through_sdpa(dtype, tq, tk, causal):
    q, k, v, do = inputs(tq, tk, dtype)
    _, *want = truth(q, k, v, do, causal)
    for name, got, w in zip(("dq", "dk", "dv"), attention_backward(q, k, v, do, causal), want):
        assert_near(got, w, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF])
@pytest.mark.parametrize("tq, tk, causal", SHAPES)
def test_flash_attention_forward_equals_sdpa_and_logsumexp(dtype, tq, tk, causal):
    q, k, v, do = inputs(tq, tk, dtype)
    out, lse = flash_attention_forward(q, k, v, causal, 16, 24)  # block sizes by position
    assert_near(out, truth(q, k, v, do, causal)[0], dtype, "out")
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(~bottom_right(tq, tk), float("-inf"))
    want = torch.logsumexp(scores, dim=-1)
    # lse is float32 for half inputs (an exp of a float16 lse would lose the probabilities' last digits).
    assert_near(lse, want, torch.float32 if dtype in HALF else dtype, "lse")
    assert lse.shape == (2, 3, tq)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF])
@pytest.mark.parametrize("tq, tk, causal", SHAPES)
def test_flash_attention_backward_equals_autograd_through_sdpa(dtype, tq, tk, causal):
    q, k, v, do = inputs(tq, tk, dtype)
    out, lse = flash_attention_forward(q, k, v, causal, block_q=16, block_k=24)
    _, *want = truth(q, k, v, do, causal)
    got = flash_attention_backward(q, k, v, out, lse, do, causal, 16, 24)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_near(g, w, dtype, name)


@pytest.mark.parametrize("block_q, block_k", [(1, 1), (7, 5), (64, 64), (100, 3)])
def test_any_block_sizes_give_the_same_gradients(block_q, block_k):
    q, k, v, do = inputs(23, 31, torch.float64, b=1, h=2)
    out, lse = flash_attention_forward(q, k, v, True, block_q, block_k)
    got = flash_attention_backward(q, k, v, out, lse, do, True, block_q=block_q, block_k=block_k)
    for g, w in zip(got, attention_backward(q, k, v, do, causal=True)):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_function_passes_gradcheck(causal):
    q, k, v, _ = inputs(6, 9, torch.float64, b=1, h=2, dh=4)
    args = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: FlashAttention.apply(q, k, v, causal), args)


def test_flash_attention_function_saves_exactly_q_k_v_out_and_lse():
    q, k, v, do = inputs(37, 53, torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = FlashAttention.apply(q, k, v, True)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [
        (2, 3, 37, 16),
        (2, 3, 53, 16),
        (2, 3, 53, 16),
        (2, 3, 37, 16),
        (2, 3, 37),
    ]
    assert all(t is not None and t.numel() < 37 * 53 for t in saved[4:])
    assert [n for n in vars(out.grad_fn) if isinstance(getattr(out.grad_fn, n), torch.Tensor)] == []
    out.backward(do)
    _, *want = truth(q, k, v, do, True)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_near(t.grad, w, torch.float32, name)


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.made += [(func.overloadpacket.__name__, tuple(t.shape)) for t in outs if isinstance(t, torch.Tensor)]
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_the_tiled_passes_form_no_tq_by_tk_tensor_and_none_above_the_bound(causal):
    # Sizes that are all different, so that an axis of Tq (37) or Tk (53) can be told from the others.
    B, H, Tq, Tk, Dh, bq, bk = 2, 3, 37, 53, 8, 16, 12
    q, k, v, do = inputs(Tq, Tk, torch.float32, b=B, h=H, dh=Dh)
    bound = B * H * max(bq * bk, Tq * Dh, Tk * Dh)
    with Shapes() as forward:
        out, lse = flash_attention_forward(q, k, v, causal, bq, bk)
    with Shapes() as backward:
        flash_attention_backward(q, k, v, out, lse, do, causal, bq, bk)
    for log in (forward, backward):
        assert log.made, "the dispatch mode saw nothing"
        both = [(op, s) for op, s in log.made if Tq in s and Tk in s]
        assert both == [], f"a tensor with a Tq and a Tk axis: {both[:3]}"
        assert max(math.prod(s) for _, s in log.made) <= bound


def test_the_recorder_sees_the_naive_backwards_tq_by_tk_tensors():
    """The test above can fail: the same recorder finds P in the backward by the formulas."""
    q, k, v, do = inputs(37, 53, torch.float32)
    with Shapes() as log:
        attention_backward(q, k, v, do, causal=True)
    assert any(37 in s and 53 in s for _, s in log.made)


def test_causal_tiles_that_are_fully_masked_are_skipped():
    """Two (block_q, block_k) products per pair of tiles (the scores and dP): 16 pairs of 32 x 32 tiles over
    128 x 128, of which a causal mask leaves the 10 on and below the diagonal."""
    q, k, v, do = inputs(128, 128, torch.float32, b=1, h=1)
    tiles = {}
    for causal in (False, True):
        out, lse = flash_attention_forward(q, k, v, causal, 32, 32)
        with Shapes() as log:
            flash_attention_backward(q, k, v, out, lse, do, causal, 32, 32)
        tiles[causal] = sum(op in ("mm", "bmm") and s[-2:] == (32, 32) for op, s in log.made)
    assert tiles == {False: 2 * 16, True: 2 * 10}


def test_bad_inputs_get_a_clear_error():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"\(1, 2, 8, 4\)"):
        attention_backward(q, q[..., :2], q[..., :2], q)
    with pytest.raises(ValueError, match="float64"):
        flash_attention_forward(q, q.double(), q)
    with pytest.raises(ValueError, match="share dtype"):
        flash_attention_backward(q, q, q.half(), q, q[..., 0], q)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (pip install -e '.[gpu]', Linux only)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tq, tk, causal", SHAPES)
def test_the_triton_forward_and_its_function_equal_sdpa(dtype, tq, tk, causal):
    """Lesson 06's kernel with lse stored (on the CPU in Triton's interpreter), then as the forward of a Function
    whose backward is the tiled one: out, lse and the gradients as the torch passes give them."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = inputs(tq, tk, dtype, b=1, h=2)
    want, *grads = truth(q, k, v, do, causal)
    q, k, v, do = (t.to(dev) for t in (q, k, v, do))
    out, lse = triton_flash_forward(q, k, v, causal)
    assert_near(out.cpu(), want, dtype, "out")
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(~bottom_right(tq, tk).to(dev), float("-inf"))
    assert_near(lse.cpu(), scores.logsumexp(-1).cpu(), torch.float32, "lse")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    TritonFlashAttention.apply(q, k, v, causal).backward(do)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), grads):
        assert_near(t.grad.cpu(), w, dtype, name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_on_cuda_the_function_equals_autograd_through_sdpa(dtype):
    q, k, v, do = (t.cuda() for t in inputs(200, 300, dtype, dh=64))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    FlashAttention.apply(q, k, v, True).backward(do)
    _, *want = truth(*(t.cpu() for t in (q, k, v, do)), True)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert t.grad.device.type == "cuda"
        assert_near(t.grad.cpu(), w, dtype, name)


def test_d_per_pair_is_read_from_the_cells_values_only():
    """Lesson 09's "D once": out's values read for every pair of tiles fail it; the reference, out's dtype read in
    the inner loop and out's values read once per query tile (query tiles outside) do not."""
    import inspect

    from autograder.checking import mistakes
    from autograder.lessons.flash_backward.checks import d_per_pair
    from solutions import flash_backward as ref

    source = inspect.getsource(ref.flash_attention_backward)
    per_pair = [
        m.code
        for m in mistakes.mutants("09_flash_backward")["flash_attention_backward"]
        if m.what == "D computed for every pair of tiles"
    ]
    assert per_pair and d_per_pair(per_pair) and not d_per_pair([source])
    assert not d_per_pair(
        [source.replace("dq[:, :, qs:qe] += ds @ kb * scale", "dq[:, :, qs:qe] += (ds @ kb * scale).to(out.dtype)")]
    )
    assert not any(d_per_pair([code]) for _, code in mistakes.variants("09_flash_backward")["flash_attention_backward"])
    # D from a product of out's values, reduced before the loops, is no name for out read in the inner loop
    in_place = source.replace("(dout.to(dtype) * out.to(dtype)).sum(dim=-1)", "out.to(dtype).mul_(dout).sum(dim=-1)")
    assert in_place != source and not d_per_pair([in_place])


def test_the_long_cases_blame_no_precision_for_wrong_values():
    """The "tiled" aspect compares a long case's gradients, earned only when "values" passed: a top-left causal
    mask, whose last keys' gradients in the row case are 0 where the truth's are within float32 rounding of it (dq is
    left to other cases there), is told its gradients differ, not that float64 inputs were computed in float32."""
    from autograder.checking import mistakes, reference
    from autograder.lessons.flash_backward import checks
    from autograder.sandbox import helpers

    [top_left] = [
        fn
        for m, fn in mistakes.defined("09_flash_backward", "flash_attention_backward")
        if m.what == "causal mask top-left"
    ]
    tq, bq, tk, bk = (checks.BACKWARD_ROW[key] for key in ("tq", "bq", "tk", "bk"))
    q, k, v, do = helpers.draw(0, checks._drawn_specs(tq, tk))
    out, lse = flash_attention_forward(q, k, v, True, bq, bk)
    got = reference(tuple(g[:, :, -checks.SUFFIX :] for g in top_left(q, k, v, out, lse, do, True, bq, bk)))
    shapes = [q.shape, k.shape, v.shape]
    with pytest.raises(AssertionError) as caught:
        truth = checks._long_truth([q, k, v, out, lse, do], True, compare_dq=False)
        checks._expect_long_grads(got, truth, "the row case", shapes=shapes)
    assert "differs" in str(caught.value) and "float32" not in str(caught.value), caught.value


def test_the_introduction_names_the_sections_that_need_a_gpu():
    """Each demonstration that runs only on a GPU (DEVICE != "cuda" skips it) is in a section the introduction
    names."""
    import re

    from autograder import notebook as nbk

    cells = nbk.read(nbk.lesson_path(LESSON))["cells"]
    section, gpu_only = None, set()
    for cell in cells:
        source = nbk.source(cell)
        if cell["cell_type"] == "markdown":
            section = ([section] + re.findall(r"^## (\d+)\.", source, re.M))[-1]
        elif source.startswith("# Demonstration") and 'DEVICE != "cuda"' in source:
            gpu_only.add(section)
    named = set(re.findall(r"sections? (\d+)", nbk.source(cells[0])))
    assert gpu_only and gpu_only <= named, (
        f"sections {sorted(gpu_only)} run only on a GPU; the introduction names {named}"
    )


def test_a_tile_end_past_the_keys_costs_no_inputs_kept():
    """A mask built for block_k keys where the last tile holds fewer raises in the causal cases: it costs them, named,
    but not "inputs kept", whose call is of whole tiles."""
    from autograder.checking import mistakes
    from tests.harness.checks import fresh_namespace, verify

    [code] = [
        m.code
        for m in mistakes.mutants(LESSON)["flash_attention_backward"]
        if m.what == "causal: the last key tile's mask of block_k keys, past Tk"
    ]
    with pytest.raises(AssertionError) as caught:
        verify(LESSON, "flash_attention_backward", fresh_namespace(LESSON, {"flash_attention_backward": code}))
    failed = {r["aspect"] for r in caught.value.rows if not r["passed"]}
    assert "causal" in failed and "inputs kept" not in failed, failed
    assert "min(ks + block_k, Tk)" in str(caught.value)
