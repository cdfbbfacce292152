"""Lesson 04: grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245).

H query heads share Hkv key/value heads in groups of n_rep = H // Hkv: key/value head j
serves query heads j*n_rep ... (j+1)*n_rep - 1. Hkv == H is multi-head attention, Hkv == 1
multi-query attention. Layout (B, H, T, Dh); boolean masks, True means "may attend".
"""

import torch
import torch.nn.functional as F
from torch import nn


def repeat_kv(x, n_rep):
    """(B, Hkv, T, Dh) -> (B, Hkv*n_rep, T, Dh): each key/value head repeated n_rep times in place.

    Interleaved (h0, h0, h1, h1, ...), not tiled (h0, h1, h0, h1, ...): query heads of one
    group sit next to each other.
    """
    if x.ndim != 4:
        raise ValueError(f"expected x of shape (B, Hkv, T, Dh), got {tuple(x.shape)}")
    B, Hkv, T, Dh = x.shape
    return x[:, :, None].expand(B, Hkv, n_rep, T, Dh).reshape(B, Hkv * n_rep, T, Dh)


def attend_with_cache(attn, x, cache):
    """The cached forward that forward(x, cache=cache) hands over to: lesson 05's exercise.
    Imports go one way, solutions.kv_cache -> solutions.gqa: importing solutions.kv_cache puts
    its attend_with_cache here, as lesson 05's notebook defines it in a later cell."""
    raise NotImplementedError("attention with a KV cache is lesson 05's: import solutions.kv_cache first")


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query self-attention.

    q_proj (D -> D), k_proj and v_proj (D -> Hkv*Dh), out_proj (D -> D).
    forward: x (B, T, D), mask bool broadcastable to (B, H, T, T) (None: causal),
    cache a KVCache (lesson 05) or None -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(
                f"need d_model % n_heads == 0 and n_heads % n_kv_heads == 0; got "
                f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None):
        if cache is not None:
            return attend_with_cache(self, x, cache)
        if x.ndim != 3:
            raise ValueError(f"expected x of shape (B, T, D), got {tuple(x.shape)}")
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        # Without a cache Tq == Tk, where PyTorch's top-left is_causal equals our bottom-right mask.
        out = F.scaled_dot_product_attention(
            q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, is_causal=mask is None
        )
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))


def mha_to_gqa(mha, n_kv_heads):
    """A GroupedQueryAttention from a multi-head attention module: each group's key and value heads
    mean-pooled (the GQA paper's uptraining start); query and output projections copied.

    mha: q/k/v/out_proj (D -> D) with attributes d_model, n_heads, head_dim. Biases are kept
    (and pooled) iff mha has them. Same dtype and device as mha.
    """
    D, H, Dh = mha.d_model, mha.n_heads, mha.head_dim
    bias = mha.q_proj.bias is not None
    gqa = GroupedQueryAttention(D, H, n_kv_heads, bias=bias).to(mha.q_proj.weight)
    group = H // n_kv_heads

    def pool(t):  # (H*Dh, ...) -> (Hkv*Dh, ...): rows h*Dh:(h+1)*Dh belong to head h
        return t.reshape(n_kv_heads, group, Dh, *t.shape[1:]).mean(1).reshape(n_kv_heads * Dh, *t.shape[1:])

    with torch.no_grad():
        gqa.q_proj.load_state_dict(mha.q_proj.state_dict())
        gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
        for src, dst in ((mha.k_proj, gqa.k_proj), (mha.v_proj, gqa.v_proj)):
            dst.weight.copy_(pool(src.weight))
            if bias:
                dst.bias.copy_(pool(src.bias))
    return gqa


def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    """Bytes a key/value cache needs: every layer caches its keys and its values,
    (batch_size, n_kv_heads, seq_len, head_dim) each, at bytes_per_element bytes a number
    (2 for float16/bfloat16). Returns a Python int."""
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
