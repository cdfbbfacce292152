"""Correct stand-ins for answers that other answers call (autograder.checking.Check.isolate).

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


def _tile_scores(q, k, rows, cols, causal, work):
    """Scaled scores of query rows x key cols, in work; causal: bottom-right (key j <= i + Tk - Tq)."""
    s = q[:, :, rows].to(work) @ k[:, :, cols].to(work).transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        i = torch.arange(rows.start, min(rows.stop, q.size(2)))[:, None] + k.size(2) - q.size(2)
        s = s.masked_fill(torch.arange(cols.start, min(cols.stop, k.size(2))) > i, float("-inf"))
    return s


# The stand-ins' tiles are at least this large, whatever the Function asks: FlashAttention's check runs them on
# thousands of queries and keys, within a memory bound that tiles of this size fit.
MIN_TILE = 512


def flash_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    """One pass over key tiles per query tile, with a running logsumexp that rescales the output."""
    block_q, block_k = max(block_q, MIN_TILE), max(block_k, MIN_TILE)
    work = torch.promote_types(q.dtype, torch.float32)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=work)
    for qs in range(0, q.size(2), block_q):
        rows = slice(qs, qs + block_q)
        row_lse = torch.full((*q[:, :, rows].shape[:3], 1), float("-inf"), dtype=work)
        acc = 0
        for ks in range(0, k.size(2), block_k):
            s = _tile_scores(q, k, rows, slice(ks, ks + block_k), causal, work)
            new = torch.logaddexp(row_lse, s.logsumexp(-1, keepdim=True))
            finite = new.clamp(min=torch.finfo(work).min)  # rows that have seen no key yet
            acc = acc * torch.exp(row_lse - finite) + torch.exp(s - finite) @ v[:, :, ks : ks + block_k].to(work)
            row_lse = new
        out[:, :, rows], lse[:, :, rows] = acc.to(q.dtype), row_lse.squeeze(-1)
    return out, lse


def flash_attention_backward(q, k, v, out, lse, dout, causal=False, block_q=64, block_k=64):
    """Tile by tile from P = exp(s - lse), with D = rowsum(dout * out)."""
    block_q, block_k = max(block_q, MIN_TILE), max(block_k, MIN_TILE)
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1 / math.sqrt(q.size(-1))
    d = (dout.to(work) * out.to(work)).sum(-1, keepdim=True)
    grads = [torch.zeros(t.shape, dtype=work) for t in (q, k, v)]
    for ks in range(0, k.size(2), block_k):
        cols = slice(ks, ks + block_k)
        for qs in range(0, q.size(2), block_q):
            rows = slice(qs, qs + block_q)
            p = torch.exp(_tile_scores(q, k, rows, cols, causal, work) - lse[:, :, rows, None].to(work))
            do = dout[:, :, rows].to(work)
            ds = p * (do @ v[:, :, cols].to(work).transpose(-2, -1) - d[:, :, rows])
            grads[0][:, :, rows] += ds @ k[:, :, cols].to(work) * scale
            grads[1][:, :, cols] += ds.transpose(-2, -1) @ q[:, :, rows].to(work) * scale
            grads[2][:, :, cols] += p.transpose(-2, -1) @ do
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
