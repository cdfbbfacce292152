"""Lesson 08_kv_compression's reference probes: each graded name of solutions/kv_compression.py (and the stand-ins its
checks send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch
from torch import nn

from autograder.checking.probing import ListCache, agree, probe, randn, refuses, torch_attention


@probe("08_kv_compression", "solutions.kv_compression.sliding_window_mask")
def sliding_window_mask(fn):
    for n_q, window, n_k in ((5, 2, None), (3, 3, 8)):
        n_keys = n_q if n_k is None else n_k
        want = torch.tensor(
            [[i + n_keys - n_q - window < j <= i + n_keys - n_q for j in range(n_keys)] for i in range(n_q)]
        )
        agree(fn(n_q, window, n_k), want, "its definition")
    refuses(fn, 4, 0, against="a window of 0")


@probe("08_kv_compression", "solutions.kv_compression.RollingKVCache")
def rolling_kv_cache(cls):
    cache, keys, vals = cls(2, 3, 2, 2, dtype=torch.float64), [], []
    for i, t in enumerate((2, 1, 4, 1)):
        seen = sum(x.size(2) for x in keys)
        keys.append(randn(2, 2, t, 2, seed=i))
        vals.append(randn(2, 2, t, 2, seed=10 + i))
        got = cache.update(keys[-1], vals[-1])
        for j, parts in enumerate((keys, vals)):  # the last 3 positions seen before, then the new ones
            agree(got[j], torch.cat(parts, dim=2)[:, :, max(0, seen - 3) :], "the last window positions and the new")
        agree(len(cache), seen + t, "the positions seen")
    cache.reset()
    agree(len(cache), 0, "no position after reset()")
    k, v = randn(2, 2, 5, 2, seed=3), randn(2, 2, 5, 2, seed=4)  # a prefill longer than the window
    cache.update(k, v)
    got = cache.update(k[:, :, :1], v[:, :, :1])
    agree(got[0], torch.cat([k[:, :, 2:], k[:, :, :1]], dim=2), "the last window keys and the new")
    refuses(cls, 2, 0, 2, 2, against="a window of 0")


def _mla_shell(mla):
    """PyTorch's attention over mla's up-projected latents: a shell whose k_proj, v_proj read latents."""
    shell = nn.Module()
    shell.q_proj, shell.out_proj, shell.k_proj, shell.v_proj = mla.q_proj, mla.out_proj, mla.k_up, mla.v_up
    shell.n_heads = shell.n_kv_heads = mla.n_heads
    return shell


@probe("08_kv_compression", "solutions.kv_compression.MultiHeadLatentAttention")
def multi_head_latent_attention(cls):
    torch.manual_seed(0)
    mla, x, cache = cls(12, 3, 5, bias=True).double(), randn(2, 6, 12, seed=1), ListCache(dim=1)
    want = torch_attention(_mla_shell(mla), x, causal=True, keys=mla.kv_down(x))
    agree(mla(x), want, "causal F.scaled_dot_product_attention over the up-projected latents")
    got = torch.cat([mla(x[:, a:b], cache=cache) for a, b in ((0, 4), (4, 6))], dim=1)
    agree(got, want, "causal F.scaled_dot_product_attention over the up-projected latents")
    agree(cache.parts[0].shape[-1], 5, "a cache of latents (width d_latent)")
    for bias in (True, False):
        biases = [name for name, _ in cls(12, 3, 5, bias=bias).named_parameters() if name.endswith("bias")]
        agree(len(biases), 5 if bias else 0, "a bias on each of its five projections, or none")
    refuses(cls, 10, 3, 5, against="d_model not divisible by n_heads")


@probe("08_kv_compression", "solutions.kv_compression.absorbed_attention")
def absorbed_attention(fn):
    from solutions.kv_compression import MultiHeadLatentAttention

    torch.manual_seed(0)
    for bias in (True, False):
        mla, x = MultiHeadLatentAttention(12, 3, 5, bias=bias).double(), randn(2, 7, 12, seed=1)
        latents = mla.kv_down(x)
        agree(
            fn(mla, x[:, -3:], latents),
            torch_attention(_mla_shell(mla), x[:, -3:], causal=True, keys=latents),
            "causal F.scaled_dot_product_attention over the up-projected latents",
        )
