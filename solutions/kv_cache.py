"""Lesson 05: decoding with a key/value cache.

Prefill runs the prompt once and stores every layer's keys and values; each decode step
then projects only the new token and attends to everything cached. Cached keys are
(B, Hkv, T, Dh). Queries are the last T of the Tk cached positions, so the causal mask is
bottom-right aligned: query i sees key j iff j <= i + (Tk - T).
"""

import torch
import torch.nn.functional as F
from torch import nn

from solutions import gqa
from solutions.gqa import GroupedQueryAttention


class KVCache:
    """Preallocated keys and values of one attention layer: (B, Hkv, max_seq_len, Dh) each."""

    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def update(self, k, v):
        """Append k, v (B, Hkv, T_new, Dh); return all cached keys and values (B, Hkv, len, Dh).

        ValueError when len + T_new > max_seq_len (the cache is then left unchanged)."""
        B, Hkv, max_len, Dh = self.k.shape
        if k.shape != v.shape or k.ndim != 4 or (k.size(0), k.size(1), k.size(3)) != (B, Hkv, Dh):
            raise ValueError(
                f"expected k and v of shape ({B}, {Hkv}, T_new, {Dh}), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.dtype != self.k.dtype or k.device != self.k.device:
            raise ValueError(f"cache holds {self.k.dtype} on {self.k.device}, got {k.dtype} on {k.device}")
        start, end = self.length, self.length + k.size(2)
        if end > max_len:
            raise ValueError(f"KV cache full: {start} cached + {k.size(2)} new > max_seq_len={max_len}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def __len__(self):
        """The number of cached positions."""
        return self.length

    def reset(self):
        """Empty the cache; the buffers stay allocated."""
        self.length = 0


def attend_with_cache(attn, x, cache):
    """The cached forward of a GroupedQueryAttention for T new tokens x (B, T, D) -> (B, T, D).

    Projects x, appends the new keys and values to cache, and lets the new queries attend to
    all Tk cached positions under the bottom-right causal mask.
    """
    B, T, _ = x.shape
    q = attn.q_proj(x).view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    k_all, v_all = cache.update(k, v)
    Tk = k_all.size(2)
    # Not is_causal=True: PyTorch aligns that mask top-left, which hides the cached keys.
    mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))


# GroupedQueryAttention.forward(x, cache=cache) calls the name attend_with_cache of its own module.
gqa.attend_with_cache = attend_with_cache


class Block(nn.Module):
    """Pre-norm decoder block: x + attention(LN(x)), then x + MLP(LN(x)). (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache=cache)
        return x + self.mlp(self.ln_2(x))


class Decoder(nn.Module):
    """A small GPT-style decoder built from GroupedQueryAttention and KVCache.

    forward: ids (B, T) -> logits (B, T, vocab_size). With caches (one KVCache per layer, from
    make_caches) the ids continue from position len(caches[0]) and every layer appends to its cache.
    """

    def __init__(self, vocab_size, d_model, n_layers, n_heads, n_kv_heads, max_seq_len):
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, n_kv_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def make_caches(self, batch_size):
        """One empty KVCache per layer, with the model's dtype and device."""
        attn, w = self.blocks[0].attn, self.lm_head.weight
        return [
            KVCache(batch_size, self.max_seq_len, attn.n_kv_heads, attn.head_dim, w.dtype, w.device)
            for _ in self.blocks
        ]

    def forward(self, ids, caches=None):
        start = len(caches[0]) if caches else 0
        if start + ids.size(1) > self.max_seq_len:
            raise ValueError(f"positions {start}..{start + ids.size(1) - 1} exceed max_seq_len={self.max_seq_len}")
        pos = torch.arange(start, start + ids.size(1), device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(pos)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches else None)
        return self.lm_head(self.ln_f(x))


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    """Greedy decoding: prompt_ids (B, T0) -> (B, T0 + max_new_tokens) LongTensor.

    With the cache the prompt is run once (prefill) and each step feeds only the newest token;
    without it every step reruns the whole sequence. Both give the same tokens.
    """
    ids = prompt_ids
    caches = model.make_caches(ids.size(0)) if use_cache else None
    new = ids
    for _ in range(max_new_tokens):
        logits = model(new, caches) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
