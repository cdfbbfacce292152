"""Lesson 01_attention's reference probes: each graded name of solutions/attention.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checking.probing import STAND_INS, agree, lower_right, probe, randn, row_mask, softmax_weights


@probe("01_attention", "solutions.attention.softmax", f"{STAND_INS}.softmax")
def softmax(fn):
    x = randn(3, 4, 5).numpy() * 30 + 1e4
    x[1] -= 2e4  # rows far apart: one shift for the whole array underflows some
    x[0, 1, :3] = -np.inf
    for axis in (-1, 1):
        agree(fn(x, axis=axis), torch.softmax(torch.from_numpy(x), dim=axis), "torch.softmax")


@probe("01_attention", "solutions.attention.causal_mask")
def causal_mask(fn):
    agree(fn(4), lower_right(4, 4), "the bottom-right causal mask")
    agree(fn(3, 7), lower_right(3, 7), "the bottom-right causal mask")


@probe("01_attention", "solutions.attention.scaled_dot_product_attention")
def scaled_dot_product_attention(fn):
    q, k, v = randn(2, 3, 5, 4), randn(2, 3, 6, 4, seed=1), randn(2, 3, 6, 7, seed=2)
    for mask in (None, row_mask(5, 6, 3)):
        out, weights = fn(q.numpy(), k.numpy(), v.numpy(), None if mask is None else mask.numpy())
        agree(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "F.scaled_dot_product_attention")
        agree(weights, softmax_weights(q, k, mask), "torch.softmax of the scaled scores")
