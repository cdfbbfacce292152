"""Lesson 08: shrinking the cache: sliding windows and multi-head latent attention.

Sliding windows (Mistral 7B, arXiv 2310.06825; Gemma 2/3's local layers) bound the cache: a query
sees only the last `window` keys, so a rolling buffer of `window` positions is all a layer keeps.
Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434) compresses it: each token caches one
latent c = x W_dkv of width d_latent, and keys and values are up-projected from it; with "weight
absorption" the up-projections fold into the queries and the output, so keys and values of the
cached positions are never formed. Layout (B, H, T, Dh); boolean masks, True means "may attend";
causal masks are bottom-right aligned.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    """Bool (n_queries, n_keys): query i, at absolute position p = i + n_keys - n_queries, may see key j
    iff p - window < j <= p (itself and the window - 1 keys before it). Bottom-right aligned."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    n_keys = n_queries if n_keys is None else n_keys
    p = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    j = torch.arange(n_keys, device=device)[None, :]
    return (j <= p) & (j > p - window)


class RollingKVCache:
    """Mistral's rolling buffer: the keys and values of the last `window` positions, (B, Hkv, window, Dh).

    The buffer is kept in time order, oldest first (a shifting buffer): after each update it holds
    the last min(window, len) positions seen."""

    def __init__(self, batch_size, window, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.k = torch.zeros(batch_size, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.window, self.length = window, 0

    def update(self, k, v):
        """k, v (B, Hkv, T_new, Dh) -> (k_ctx, v_ctx) (B, Hkv, min(window, len) + T_new, Dh): the kept
        positions followed by the new ones, in time order. Then only the last `window` are kept."""
        B, Hkv, window, Dh = self.k.shape
        if k.shape != v.shape or k.ndim != 4 or (k.size(0), k.size(1), k.size(3)) != (B, Hkv, Dh):
            raise ValueError(f"expected k and v of shape ({B}, {Hkv}, T_new, {Dh}), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        kept = min(self.length, window)
        k_ctx = torch.cat([self.k[:, :, :kept], k], dim=2)
        v_ctx = torch.cat([self.v[:, :, :kept], v], dim=2)
        n = min(window, k_ctx.size(2))
        self.k[:, :, :n] = k_ctx[:, :, -n:]
        self.v[:, :, :n] = v_ctx[:, :, -n:]
        self.length += k.size(2)
        return k_ctx, v_ctx

    def __len__(self):
        """The number of positions seen so far (not only those kept)."""
        return self.length

    def reset(self):
        self.length = 0


class LatentCache:
    """The cache of multi-head latent attention: one latent per position, (B, max_seq_len, d_latent)."""

    def __init__(self, batch_size, max_seq_len, d_latent, dtype=torch.float32, device="cpu"):
        self.c = torch.zeros(batch_size, max_seq_len, d_latent, dtype=dtype, device=device)
        self.length = 0

    def update(self, c):
        """Append c (B, T_new, d_latent); return every cached latent (B, len, d_latent).
        ValueError when full (the cache is then left unchanged)."""
        B, max_len, d_latent = self.c.shape
        if c.ndim != 3 or (c.size(0), c.size(2)) != (B, d_latent):
            raise ValueError(f"expected c of shape ({B}, T_new, {d_latent}), got {tuple(c.shape)}")
        end = self.length + c.size(1)
        if end > max_len:
            raise ValueError(f"latent cache full: {self.length} cached + {c.size(1)} new > max_seq_len={max_len}")
        self.c[:, self.length:end] = c
        self.length = end
        return self.c[:, :end]

    def __len__(self):
        return self.length

    def reset(self):
        self.length = 0


def _causal(n_queries, n_keys, device):
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=n_keys - n_queries)


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention whose keys and values come from a cached latent (DeepSeek-V2, without RoPE).

    q_proj (D -> D), kv_down (D -> d_latent), k_up and v_up (d_latent -> D), out_proj (D -> D).
    forward: x (B, T, D), mask bool broadcasting to (B, H, T, Tk) (None: causal, bottom-right),
    cache a LatentCache or None -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, d_latent, bias=False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim, self.d_latent = d_model, n_heads, d_model // n_heads, d_latent
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_down = nn.Linear(d_model, d_latent, bias=bias)
        self.k_up = nn.Linear(d_latent, d_model, bias=bias)
        self.v_up = nn.Linear(d_latent, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, t):  # (B, T, D) -> (B, H, T, Dh)
        return t.view(t.size(0), t.size(1), self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        c = self.kv_down(x)
        if cache is not None:
            c = cache.update(c)  # every cached latent, the new ones included
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_up(c)), self._heads(self.v_up(c))
        if mask is None:
            mask = _causal(T, c.size(1), x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))


def absorbed_attention(mla, x, latents):
    """mla's output for new tokens x (B, T, D) attending, bottom-right causal, to latents (B, Tk, d_latent),
    with k_up folded into the queries and v_up into the output projection: keys and values of the
    Tk positions are never formed. -> (B, T, D).

    Per head h: q_h k_h^T = q_h (c W_uk^h + b_uk^h)^T = (q_h W_uk^h) c^T + q_h . b_uk^h; the last term
    is the same for every key of a row, which the softmax ignores. Since each row of weights sums to
    1, weights @ (c W_uv^h + b_uv^h) = (weights @ c) W_uv^h + b_uv^h, and W_uv^h meets its slice of
    out_proj's weight: one (d_latent, D) matrix per head. (nn.Linear stores W^T: weight is (out, in).)
    """
    B, T, D = x.shape
    H, Dh, L = mla.n_heads, mla.head_dim, mla.d_latent
    q = mla._heads(mla.q_proj(x))                                   # (B, H, T, Dh)
    w_uk = mla.k_up.weight.view(H, Dh, L)                           # k_h = c @ w_uk[h].T
    q_latent = q @ w_uk                                             # (B, H, T, L)
    scores = q_latent @ latents.transpose(1, 2)[:, None] / math.sqrt(Dh)  # (B, H, T, Tk)
    scores = scores.masked_fill(~_causal(T, latents.size(1), x.device), float("-inf"))
    o_latent = scores.softmax(dim=-1) @ latents[:, None]            # (B, H, T, L)
    w_uv = mla.v_up.weight.view(H, Dh, L)                           # v_h = c @ w_uv[h].T
    w_o = mla.out_proj.weight.view(D, H, Dh)                        # out = sum_h o_h @ w_o[:, h].T
    folded = torch.einsum("hdl,ehd->hle", w_uv, w_o)                # (H, L, D)
    out = torch.einsum("bhtl,hle->bte", o_latent, folded)
    if mla.v_up.bias is not None:
        out = out + mla.v_up.bias @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
