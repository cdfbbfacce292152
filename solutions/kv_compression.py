"""Lesson 08: shrinking the cache: sliding windows and multi-head latent attention.

Sliding windows (Mistral 7B, arXiv 2310.06825; Gemma 2/3's local layers) bound the cache: a query
sees only the last `window` keys, so a rolling buffer of `window` positions is all a layer keeps.
Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434) compresses it: each token caches one
latent c = x W_dkv of width d_latent, and keys and values are up-projected from it; with "weight
absorption" the up-projections fold into the queries and the output, so keys and values of the
cached positions are never formed. Layout (B, H, T, Dh); boolean masks, True means "may attend";
causal masks are bottom-right aligned.
"""

import copy
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
    """Mistral's rolling buffer: the keys and values of the last `window` positions, (B, Hkv, window, Dh)
    each, whatever the number of positions seen. (This one shifts its buffers to keep them oldest
    first; a ring buffer, unrolled when read, works as well.)"""

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
            raise ValueError(
                f"expected k and v of shape ({B}, {Hkv}, T_new, {Dh}), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
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
        """Forget every position (the buffers stay allocated)."""
        self.length = 0


class LatentCache:
    """The cache of multi-head latent attention: one latent per position, (B, max_seq_len, d_latent)."""

    def __init__(self, batch_size, max_seq_len, d_latent, dtype=torch.float32, device="cpu"):
        self.c = torch.zeros(batch_size, max_seq_len, d_latent, dtype=dtype, device=device)
        self.filled = 0

    def update(self, c):
        """Append c (B, T_new, d_latent); return every cached latent (B, len, d_latent).
        ValueError when full (the cache is then left unchanged)."""
        B, max_len, d_latent = self.c.shape
        if c.ndim != 3 or (c.size(0), c.size(2)) != (B, d_latent):
            raise ValueError(f"expected c of shape ({B}, T_new, {d_latent}), got {tuple(c.shape)}")
        end = self.filled + c.size(1)
        if end > max_len:
            raise ValueError(f"latent cache full: {self.filled} cached + {c.size(1)} new > max_seq_len={max_len}")
        self.c[:, self.filled : end] = c
        self.filled = end
        return self.c[:, :end]

    def __len__(self):
        return self.filled

    def reset(self):
        self.filled = 0


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

    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        c = self.kv_down(x)
        c = c if cache is None else cache.update(c)  # with a cache: every cached latent, (B, Tk, d_latent)
        Tk = c.size(1)
        q = self.q_proj(x).view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
        k, v = (up(c).view(B, Tk, H, Dh).transpose(1, 2) for up in (self.k_up, self.v_up))  # (B, H, Tk, Dh)
        if mask is None:  # bottom-right: the new tokens are the last T of the Tk positions
            mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))


def absorbed_attention(mla, x, latents):
    """mla's output for new tokens x (B, T, D) attending, bottom-right causal, to latents (B, Tk, d_latent),
    with k_up folded into the queries and v_up into the output projection: keys and values of the
    Tk positions are never formed. -> (B, T, D).

    Per head h, with W_uk^h = k_up.weight[h*Dh:(h+1)*Dh].T (d_latent, Dh) (nn.Linear stores W^T):
    q_h k_h^T = q_h (c W_uk^h + b_uk^h)^T = (q_h W_uk^h^T) c^T + q_h . b_uk^h; the last term is the same
    for every key of a row, which the softmax ignores. Each row of weights sums to 1, so
    weights @ (c W_uv^h + b_uv^h) = (weights @ c) W_uv^h + b_uv^h, and W_uv^h meets head h's slice of
    out_proj: one (d_latent, D) matrix per head.
    """
    B, T, D = x.shape
    H, Dh, L = mla.n_heads, mla.head_dim, mla.d_latent
    q = mla.q_proj(x).view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
    w_uk = mla.k_up.weight.view(H, Dh, L)  # k_h = c @ w_uk[h].T
    # Every head meets the same latents: with the heads in the rows, (B, H*T, L) @ (B, L, Tk), no head gets a
    # copy of them (matmul copies latents[:, None] once per head when B > 1).
    q_latent = (q @ w_uk).reshape(B, H * T, L) / math.sqrt(Dh)  # (B, H*T, L), scaled here: it is small
    Tk = latents.size(1)
    scores = (q_latent @ latents.transpose(1, 2)).view(B, H, T, Tk)
    causal = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
    scores = scores.masked_fill(~causal, float("-inf"))  # rebound: at most two (B, H, T, Tk) at once
    o_latent = (scores.softmax(dim=-1).view(B, H * T, Tk) @ latents).view(B, H, T, L)
    w_uv = mla.v_up.weight.view(H, Dh, L)  # v_h = c @ w_uv[h].T
    w_o = mla.out_proj.weight.view(D, H, Dh)  # out = sum_h o_h @ w_o[:, h].T
    folded = torch.einsum("hdl,ehd->hle", w_uv, w_o)  # (H, L, D)
    out = torch.einsum("bhtl,hle->bte", o_latent, folded)
    if mla.v_up.bias is not None:
        out = out + mla.v_up.bias @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out


# ---- Provided by the lesson: the price of absorption (section 3; benchmarks/absorption.py) -------


def absorption_flops(mla, T, Tk):
    """FLOPs (2 per multiply-add) of what differs between the two forms, T new queries against Tk latents.

    Both make the new tokens' queries and latents alike, so neither counts them. The plain forward
    up-projects every latent to keys and values and takes Dh-wide dot products; the absorbed one takes
    d_latent-wide dot products with the latents, then applies each head's folded (d_latent, D) matrix."""
    D, H, Dh, L = mla.d_model, mla.n_heads, mla.head_dim, mla.d_latent
    plain = 2 * 2 * Tk * L * D + 2 * 2 * H * T * Tk * Dh + 2 * T * D * D  # k_up, v_up; q k^T, a @ v; out_proj
    absorbed = 2 * H * T * Dh * L + 2 * 2 * H * T * Tk * L + 2 * H * T * L * D  # q W_uk; q~ c^T, a @ c; folded out
    return plain, absorbed


# ---- Provided by the lesson: a decoder with sliding-window attention (section 3) ----------------


class SlidingWindowAttention(nn.Module):
    """Causal multi-head self-attention in which each query sees only the last `window` positions.

    forward: x (B, T, D), cache a RollingKVCache or None -> (B, T, D). With a cache, the new keys and
    values go through cache.update and the mask is sliding_window_mask(T, window, n_keys=Tk).
    """

    def __init__(self, d_model, n_heads, window):
        super().__init__()
        self.n_heads, self.head_dim, self.window = n_heads, d_model // n_heads, window
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, cache=None):
        B, T = x.shape[:2]
        q, k, v = (
            p(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        if cache is not None:
            k, v = cache.update(k, v)  # the kept positions and the new ones
        mask = sliding_window_mask(T, self.window, n_keys=k.size(2), device=x.device)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, -1))


class SlidingWindowDecoder(nn.Module):
    """Lesson 05's small GPT-style decoder with sliding-window attention in every layer.

    forward: ids (B, T) -> logits (B, T, vocab_size). With caches (one RollingKVCache per layer, from
    make_caches) the ids continue from position len(caches[0]).
    """

    def __init__(self, vocab_size, d_model, n_layers, n_heads, window, max_seq_len):
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.attn = nn.ModuleList(SlidingWindowAttention(d_model, n_heads, window) for _ in range(n_layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )
            for _ in range(n_layers)
        )
        self.ln = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers + 1))
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def make_caches(self, batch_size):
        """One empty RollingKVCache per layer, with the model's dtype and device."""
        attn, w = self.attn[0], self.lm_head.weight
        return [
            RollingKVCache(batch_size, attn.window, attn.n_heads, attn.head_dim, w.dtype, w.device) for _ in self.attn
        ]

    def forward(self, ids, caches=None):
        start = len(caches[0]) if caches else 0
        pos = torch.arange(start, start + ids.size(1), device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(pos)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = x + attn(self.ln[i](x), caches[i] if caches else None)
            x = x + mlp(x)
        return self.lm_head(self.ln[-1](x))


# ---- Provided by the lesson: compressing a trained model's cache (section 6) ----------------------
# The model is lesson 07's AttentionOnlyTransformer: each layer's qkv (D -> 3D) holds the query, key and
# value projections stacked by rows, with biases; head h owns rows h*Dh:(h+1)*Dh of each.


def latent_factors(layer, d_latent):
    """Truncated SVD of one layer's stacked key and value projections W = [W_k; W_v] (2D, D):
    W ~ U_r S_r V_r^T with r = d_latent. -> (down (r, D), k_up (D, r), v_up (D, r)): the latent is
    c = x @ down.T (the top r input directions), keys c @ k_up.T + b_k, values c @ v_up.T + b_v."""
    D = layer.out_proj.weight.size(0)
    w = layer.qkv.weight.detach()[D:].double()
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    up = (u[:, :d_latent] * s[:d_latent]).to(layer.qkv.weight.dtype)
    return vh[:d_latent].to(up.dtype), up[:D], up[D:]


def mla_from_layer(layer, d_latent):
    """A MultiHeadLatentAttention (bias=True) computing what `layer` computes with its keys and
    values squeezed through a d_latent-wide latent (latent_factors)."""
    D, H = layer.out_proj.weight.size(0), layer.n_heads
    mla = MultiHeadLatentAttention(D, H, d_latent, bias=True).to(layer.qkv.weight.dtype)
    down, k_up, v_up = latent_factors(layer, d_latent)
    w, b = layer.qkv.weight.detach(), layer.qkv.bias.detach()
    with torch.no_grad():
        for linear, weight, bias in (
            (mla.q_proj, w[:D], b[:D]),
            (mla.kv_down, down, torch.zeros(d_latent)),
            (mla.k_up, k_up, b[D : 2 * D]),
            (mla.v_up, v_up, b[2 * D :]),
            (mla.out_proj, layer.out_proj.weight, layer.out_proj.bias),
        ):
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
    return mla


def with_latent_kv(model, d_latent):
    """A copy of an AttentionOnlyTransformer whose layers' keys and values come from a d_latent-wide
    latent: each stacked (W_k; W_v) replaced by its rank-d_latent truncated SVD, which is exactly
    what mla_from_layer computes (and keeps the layers' attention patterns for the scores)."""
    model = copy.deepcopy(model)
    D = model.config["d_model"]
    with torch.no_grad():
        for layer in model.layers:
            down, k_up, v_up = latent_factors(layer, d_latent)
            layer.qkv.weight[D:] = torch.cat([k_up, v_up]) @ down
    return model


def with_pooled_kv(model, n_kv_heads):
    """The AttentionOnlyTransformer with grouped-query attention: each group's key and value heads
    (and biases) mean-pooled, as lesson 04's mha_to_gqa does. Needs n_heads % n_kv_heads == 0."""
    config = dict(model.config, n_kv_heads=n_kv_heads)
    D, H = config["d_model"], config["n_heads"]
    Dh, group = D // H, H // n_kv_heads
    state = dict(model.state_dict())
    for i in range(config["n_layers"]):
        for name in ("weight", "bias"):
            t = state[f"layers.{i}.qkv.{name}"]
            q, k, v = t[:D], t[D : 2 * D], t[2 * D :]
            pool = [
                x.reshape(n_kv_heads, group, Dh, *x.shape[1:]).mean(1).reshape(n_kv_heads * Dh, *x.shape[1:])
                for x in (k, v)
            ]
            state[f"layers.{i}.qkv.{name}"] = torch.cat([q, *pool])
    pooled = type(model)(**config)
    pooled.load_state_dict(state)
    return pooled.eval()
