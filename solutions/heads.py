"""Lesson 02: splitting attention into heads, in torch.

Layout: (B, T, D) activations, (B, H, T, Dh) per-head tensors with Dh = D // H. Head h owns
features h*Dh:(h+1)*Dh. Boolean masks: True means "may attend".
"""

import math

import torch


def split_heads(x, n_heads):
    """(B, T, D) -> (B, H, T, D // H); head h holds features h*Dh:(h+1)*Dh."""
    if x.ndim != 3:
        raise ValueError(f"expected x of shape (B, T, D), got {tuple(x.shape)}")
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} (x of shape {tuple(x.shape)}) is not divisible by n_heads={n_heads}")
    # A reshape alone would give (B, T, H, Dh); heads must come before time, hence the transpose.
    return x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2)


def merge_heads(x):
    """(B, H, T, Dh) -> (B, T, H*Dh), the inverse of split_heads."""
    if x.ndim != 4:
        raise ValueError(f"expected x of shape (B, H, T, Dh), got {tuple(x.shape)}")
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)


def attention(q, k, v, mask=None):
    """Scaled dot-product attention in torch, any leading dims.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv), mask bool broadcastable to (..., Tq, Tk)
    -> out (..., Tq, Dv), weights (..., Tq, Tk).
    """
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"expected q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must share dtype and device; got {q.dtype}/{q.device}, {k.dtype}/{k.device}, {v.dtype}/{v.device}"
        )
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    """Every head attends with its own slice of the projections.

    x (B, T, D), w_q/w_k/w_v (D, D) applied as x @ w, mask broadcastable to (B, H, T, T)
    -> (B, H, T, Dh).
    """
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_q, w_k, w_v))
    return attention(q, k, v, mask)[0]
