"""Correct stand-ins for answers that other answers call (autograder.checks.Check.isolate).

They are lessons' answers, so they never sit in the sandbox before a check needs them: the
grader sends this file's text with an isolate request, after the function it stands in for has
been graded, and the sandbox's server runs it there (server.ObjectServer, op "isolate").
"""
import math

import numpy as np
import torch
from torch import nn


def softmax(x, axis=-1):
    x = np.asarray(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return np.exp(shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True)))


def split_heads(x, n_heads):
    if x.size(-1) % n_heads:
        raise ValueError(f"d_model={x.size(-1)} is not divisible by n_heads={n_heads}")
    return x.unflatten(-1, (n_heads, x.size(-1) // n_heads)).permute(0, 2, 1, 3)


def attention(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    weights = scores.softmax(dim=-1)
    return torch.einsum("...qk,...kd->...qd", weights, v), weights


def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


class GroupedQueryAttention(nn.Module):
    """Only what mha_to_gqa builds: the projections and sizes."""

    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        kv = n_kv_heads * self.head_dim
        self.q_proj, self.out_proj = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)
        self.k_proj, self.v_proj = nn.Linear(d_model, kv, bias), nn.Linear(d_model, kv, bias)


def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.permute(0, 2, 1, 3).reshape(B, T, H * Dh) @ w_o


class MultiHeadAttention(nn.Module):
    """Only what mha_param_count may build: the projections and sizes."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=bias))
