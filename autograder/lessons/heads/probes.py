"""Lesson 02_heads's reference probes: each graded name of solutions/heads.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checking.probing import (
    STAND_INS,
    agree,
    heads_of,
    lower_right,
    merged,
    probe,
    randn,
    refuses,
    row_mask,
    softmax_weights,
)


@probe("02_heads", "solutions.heads.split_heads", f"{STAND_INS}.split_heads")
def split_heads(fn):
    x = randn(2, 5, 12)
    agree(fn(x, 3), heads_of(x, 3), "slicing head h's features h*Dh:(h+1)*Dh")
    refuses(fn, x, 5, against="d_model not divisible by n_heads")


@probe("02_heads", "solutions.heads.merge_heads")
def merge_heads(fn):
    y = randn(2, 3, 5, 4)
    agree(fn(y), merged(y), "the heads' features side by side")


@probe("02_heads", "solutions.heads.attention", f"{STAND_INS}.attention")
def attention(fn):
    q, k, v = randn(2, 3, 5, 4) * 30, randn(2, 3, 6, 4, seed=1) * 30, randn(2, 3, 6, 7, seed=2)
    for mask in (None, row_mask(5, 6, 3)):  # scores far above exp()'s range: only a shifted softmax copes
        out, weights = fn(q, k, v, mask)
        agree(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "F.scaled_dot_product_attention")
        agree(weights, softmax_weights(q, k, mask), "torch.softmax of the scaled scores")


@probe("02_heads", "solutions.heads.per_head_attention")
def per_head_attention(fn):
    x, (wq, wk, wv) = randn(2, 5, 12), (randn(12, 12, seed=i) for i in (1, 2, 3))
    mha = nn.MultiheadAttention(12, 3, bias=False, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(torch.cat([wq.T, wk.T, wv.T]))
    mha.out_proj.weight.copy_(torch.eye(12, dtype=torch.float64))
    mask = lower_right(5, 5)
    agree(
        merged(fn(x, wq, wk, wv, 3, mask)),
        mha(x, x, x, attn_mask=~mask, need_weights=False)[0],
        "torch.nn.MultiheadAttention (output projection the identity)",
    )
