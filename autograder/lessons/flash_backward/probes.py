"""Lesson 09_flash_backward's reference probes: each graded name of solutions/flash_backward.py (and the stand-ins its
checks send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import math

import torch
import torch.nn.functional as F

from autograder.checking.probing import STAND_INS, Disagrees, agree, lower_right, probe, randn


def _attention_inputs(tq=5, tk=7, dh=4, b=2):
    """q, k, v, dout in float64, Tq != Tk, several batches and heads."""
    return (randn(b, 2, tq, dh), randn(b, 2, tk, dh, seed=1), randn(b, 2, tk, dh, seed=2), randn(b, 2, tq, dh, seed=3))


LONG = dict(tq=3, tk=1100, b=1)  # more keys than the stand-ins' smallest tile (stand_ins.MIN_TILE): several tiles


def _sdpa_grads(q, k, v, dout, causal):
    """(out, lse, (dq, dk, dv)): PyTorch's attention, its scores' row logsumexp, and autograd's gradients for dout."""
    mask = lower_right(q.size(2), k.size(2)) if causal else None
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        out.backward(dout)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    lse = (scores if mask is None else scores.masked_fill(~mask, -math.inf)).logsumexp(-1)
    return out.detach(), lse, tuple(t.grad for t in leaves)


@probe("09_flash_backward", "solutions.flash_backward.attention_backward")
def attention_backward(fn):
    q, k, v, dout = _attention_inputs()
    for causal in (False, True):
        for got, want in zip(fn(q, k, v, dout, causal), _sdpa_grads(q, k, v, dout, causal)[2]):
            agree(got, want, "autograd through F.scaled_dot_product_attention")


@probe("09_flash_backward", "solutions.flash_backward.flash_attention_forward", f"{STAND_INS}.flash_attention_forward")
def flash_attention_forward(fn):
    for (q, k, v, _), blocks in ((_attention_inputs(), (2, 3)), (_attention_inputs(**LONG), (2, 300))):
        for causal in (False, True):  # tiles that divide neither length
            out, lse, _ = _sdpa_grads(q, k, v, q, causal)
            got = fn(q, k, v, causal, *blocks)
            agree(got[0], out, "F.scaled_dot_product_attention")
            agree(got[1], lse, "torch.logsumexp of the scaled scores")
    if fn(q.half(), k.half(), v.half(), False, 2, 3)[1].dtype != torch.float32:
        raise Disagrees("its lse is not float32 for float16 inputs")


@probe(
    "09_flash_backward", "solutions.flash_backward.flash_attention_backward", f"{STAND_INS}.flash_attention_backward"
)
def flash_attention_backward(fn):
    for (q, k, v, dout), blocks in ((_attention_inputs(), (2, 3)), (_attention_inputs(**LONG), (2, 300))):
        for causal in (False, True):
            out, lse, grads = _sdpa_grads(q, k, v, dout, causal)
            for got, want in zip(fn(q, k, v, out, lse, dout, causal, *blocks), grads):
                agree(got, want, "autograd through F.scaled_dot_product_attention")


@probe("09_flash_backward", "solutions.flash_backward.FlashAttention")
def flash_attention_function(cls):
    q, k, v, dout = _attention_inputs()
    for causal in (False, True):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            cls.apply(*leaves, causal).backward(dout)
        for got, want in zip(leaves, _sdpa_grads(q, k, v, dout, causal)[2]):
            agree(got.grad, want, "autograd through F.scaled_dot_product_attention")
        with torch.enable_grad():
            small = [t[:1, :1, :3].detach().requires_grad_() for t in (q, k, v)]
            if not torch.autograd.gradcheck(cls.apply, (*small, causal), raise_exception=False):
                raise Disagrees("it fails torch.autograd.gradcheck")


@probe("09_flash_backward", f"{STAND_INS}._tile_scores")
def tile_scores(fn):
    q, k, _, _ = _attention_inputs()
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~lower_right(5, 7), -math.inf)  # Dh = 4
    agree(fn(q, k, slice(3, 6), slice(2, 5), True, torch.float64), scores[:, :, 3:5, 2:5], "the masked scaled scores")
