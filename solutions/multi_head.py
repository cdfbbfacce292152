"""Lesson 03: concatenate the heads and project; the full multi-head attention module.

query (B, Tq, D), key/value (B, Tk, D); per-head tensors (B, H, T, Dh) with Dh = D // H.
Boolean masks broadcast against the scores (B, H, Tq, Tk); True means "may attend".
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def concat_and_project(heads, w_o):
    """heads (B, H, T, Dh), w_o (D, D) with D = H*Dh -> (B, T, D) = concat(heads) @ w_o."""
    B, H, T, Dh = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * Dh) @ w_o


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2) with biasable projections.

    forward: query (B, Tq, D), key (B, Tk, D) = query, value (B, Tk, D) = key,
    mask bool broadcastable to (B, H, Tq, Tk) -> out (B, Tq, D),
    or (out, weights (B, H, Tq, Tk)) when need_weights.
    """

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):
        key = query if key is None else key
        value = key if value is None else value
        if query.ndim != 3 or key.ndim != 3 or value.shape[:2] != key.shape[:2]:
            raise ValueError(
                f"expected query (B, Tq, D), key and value (B, Tk, D); got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        B, Tq, _ = query.shape
        q, k, v = (
            proj(t).view(t.size(0), t.size(1), self.n_heads, self.head_dim).transpose(1, 2)
            for proj, t in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        )
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)
            out = weights @ v
        else:
            # The fused kernel never materialises the (Tq, Tk) weights: faster, less memory.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, self.d_model))
        return (out, weights) if need_weights else out


def load_torch_mha(module, torch_mha):
    """Copy, in place, torch.nn.MultiheadAttention(D, H, batch_first=True)'s weights into module.

    PyTorch packs the q, k, v projections as in_proj_weight (3D, D) = [W_q; W_k; W_v]
    (and in_proj_bias (3D,)); both use nn.Linear's x @ W^T + b. Returns module.
    """
    if (torch_mha.embed_dim, torch_mha.num_heads) != (module.d_model, module.n_heads):
        raise ValueError(
            f"torch_mha has embed_dim={torch_mha.embed_dim}, num_heads={torch_mha.num_heads}; "
            f"module has d_model={module.d_model}, n_heads={module.n_heads}"
        )
    if (torch_mha.in_proj_bias is None) != (module.q_proj.bias is None):
        raise ValueError("torch_mha and module disagree on bias")
    projs = (module.q_proj, module.k_proj, module.v_proj)
    with torch.no_grad():
        for proj, w in zip(projs, torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip(projs, torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module


def mha_param_count(d_model, n_heads, bias=True):
    """Parameters of MultiHeadAttention(d_model, n_heads, bias): four (D, D) matrices (+ four (D,) biases)."""
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
