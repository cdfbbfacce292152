"""solutions.kv_compression against PyTorch: sliding-window masks against SDPA with a band mask,
cached sliding-window decoding against uncached, MLA against its explicit math, and the absorbed
form against the cached forward (with and without biases); the lesson's decoder and its
compression of lesson 07's checkpoint (SVD to MLA, pooling to GQA)."""

import math

import pytest
import torch
import torch.nn.functional as F

from solutions.kv_compression import (
    LatentCache,
    MultiHeadLatentAttention,
    RollingKVCache,
    SlidingWindowDecoder,
    absorbed_attention,
    absorption_flops,
    mla_from_layer,
    sliding_window_mask,
    with_latent_kv,
    with_pooled_kv,
)
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "08_kv_compression"


@pytest.mark.parametrize("tq, tk, window", [(5, 5, 1), (5, 5, 3), (3, 8, 2), (4, 9, 20), (1, 7, 4)])
def test_sliding_window_mask_is_the_band_bottom_right(tq, tk, window):
    m = sliding_window_mask(tq, window, n_keys=tk)
    assert m.dtype == torch.bool and m.shape == (tq, tk)
    for i in range(tq):
        p = i + tk - tq
        assert m[i].tolist() == [p - window < j <= p for j in range(tk)]


def test_sliding_window_mask_defaults_and_errors():
    assert torch.equal(sliding_window_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, 0)
    with pytest.raises(ValueError, match="window"):
        RollingKVCache(1, 0, 1, 2)


@pytest.mark.parametrize("window", [1, 3, 6])
def test_rolling_cache_decoding_equals_uncached_sliding_window_attention(window):
    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 11, 4
    q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(T, window))
    cache = RollingKVCache(B, window, H, Dh, dtype=torch.float64)
    outs, start = [], 0
    for n in (4, 1, 1, 3, 2):  # a prefill longer than some windows, then steps and chunks
        k_ctx, v_ctx = cache.update(k[:, :, start : start + n], v[:, :, start : start + n])
        assert k_ctx.shape[2] == min(window, start) + n
        mask = sliding_window_mask(n, window, n_keys=k_ctx.shape[2])
        outs.append(F.scaled_dot_product_attention(q[:, :, start : start + n], k_ctx, v_ctx, attn_mask=mask))
        start += n
        assert len(cache) == start and cache.k.shape[2] == window
    torch.testing.assert_close(torch.cat(outs, dim=2), want)
    cache.reset()
    assert len(cache) == 0


def test_latent_cache_appends_and_refuses_overflow():
    cache = LatentCache(2, 5, 3)
    a, b = torch.randn(2, 3, 3), torch.randn(2, 2, 3)
    cache.update(a)
    torch.testing.assert_close(cache.update(b), torch.cat([a, b], 1))
    assert len(cache) == 5
    with pytest.raises(ValueError, match="full"):
        cache.update(torch.randn(2, 1, 3))


def _mla(D=16, H=4, L=6, bias=False, dtype=torch.float64):
    torch.manual_seed(1)
    mla = MultiHeadLatentAttention(D, H, L, bias=bias).to(dtype)
    if bias:
        with torch.no_grad():
            for m in (mla.q_proj, mla.kv_down, mla.k_up, mla.v_up, mla.out_proj):
                m.bias.normal_()
    return mla


@pytest.mark.parametrize("bias", [False, True])
def test_mla_forward_is_attention_over_up_projected_latents(bias):
    mla = _mla(bias=bias)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    c = mla.kv_down(x)
    q, k, v = (t.view(2, 7, 4, 4).transpose(1, 2) for t in (mla.q_proj(x), mla.k_up(c), mla.v_up(c)))
    scores = q @ k.transpose(-1, -2) / math.sqrt(4)
    scores = scores.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    want = mla.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(mla(x), want)
    assert (mla.d_model, mla.n_heads, mla.head_dim, mla.d_latent) == (16, 4, 4, 6)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadLatentAttention(10, 4, 3)


@pytest.mark.parametrize("bias", [False, True])
def test_cached_mla_and_absorbed_attention_equal_the_uncached_forward(bias):
    mla = _mla(bias=bias)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    want = mla(x)
    cache = LatentCache(2, 9, 6, dtype=torch.float64)
    outs, absorbed, start = [], [], 0
    for n in (5, 1, 3):
        chunk = x[:, start : start + n]
        outs.append(mla(chunk, cache=cache))
        absorbed.append(absorbed_attention(mla, chunk, cache.c[:, : len(cache)]))
        start += n
    torch.testing.assert_close(torch.cat(outs, 1), want)
    torch.testing.assert_close(torch.cat(absorbed, 1), want)


@pytest.mark.parametrize("B", [1, 3])
def test_absorbed_attention_never_forms_the_keys(B):
    """Keys for every cached position would be (B, Tk, D), and the latents copied once per head (B, H, Tk, d_latent)
    (what a matmul against latents[:, None] makes when B > 1); the absorbed form holds (B, Tk, d_latent) and the
    (B, H, T, Tk) scores."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    mla = _mla(D=64, H=4, L=4, dtype=torch.float32)
    Tk = 300
    latents, x = torch.randn(B, Tk, 4), torch.randn(B, 1, 64)

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            held = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in held:  # a view is no copy
                self.seen.append(out.untyped_storage().nbytes() // out.element_size())
            return out

    with Shapes() as log:
        absorbed_attention(mla, x, latents)
    assert max(log.seen) < B * Tk * 4 * 4, "a tensor as large as the cached keys, or as the latents once per head"


@pytest.mark.parametrize("T, Tk", [(7, 7), (3, 10), (1, 40)])
def test_absorption_flops_counts_the_matrix_products_of_each_form(T, Tk):
    """FlopCounterMode counts every matrix product at 2 FLOPs a multiply-add; it does not see inside the CPU's
    fused attention, so the plain form runs here as explicit products. absorption_flops leaves out what both
    forms share, the new tokens' queries (q_proj), and the reference's absorbed form also folds v_up into
    out_proj at every call (2 D d_latent D, whatever T and Tk: an engine does it once)."""
    from torch.utils.flop_counter import FlopCounterMode

    D, H, L = 32, 4, 12
    mla = _mla(D=D, H=H, L=L)
    x, latents = torch.randn(1, T, D, dtype=torch.float64), torch.randn(1, Tk, L, dtype=torch.float64)

    def heads(t):  # (1, n, D) -> (1, H, n, Dh)
        return t.view(1, -1, H, D // H).transpose(1, 2)

    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        q, k, v = heads(mla.q_proj(x)), heads(mla.k_up(latents)), heads(mla.v_up(latents))
        mla.out_proj(((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(1, T, D))
    with torch.no_grad(), FlopCounterMode(display=False) as absorbed:
        absorbed_attention(mla, x, latents)
    shared, fold = 2 * T * D * D, 2 * D * L * D
    assert absorption_flops(mla, T, Tk) == (
        plain.get_total_flops() - shared,
        absorbed.get_total_flops() - shared - fold,
    )


def test_sliding_window_decoder_cached_equals_uncached():
    from solutions.kv_cache import generate

    torch.manual_seed(0)
    model = SlidingWindowDecoder(vocab_size=50, d_model=32, n_layers=2, n_heads=4, window=5, max_seq_len=64).double()
    prompt = torch.randint(50, (2, 9))  # longer than the window
    cached = generate(model.eval(), prompt, 20)
    assert torch.equal(cached, generate(model, prompt, 20, use_cache=False))
    caches = model.make_caches(2)
    model(prompt, caches)
    assert all(c.k.shape[2] == 5 and len(c) == 9 for c in caches)


def test_svd_and_pooling_of_lesson_07s_model():
    """A latent as wide as d_model keeps the model exactly (the stacked (W_k; W_v) has rank <= D); the MLA built
    from the SVD computes what the low-rank layer computes; pooling to n_heads key/value heads changes nothing."""
    from solutions.head_specialization import load_checkpoint

    model, _ = load_checkpoint("lessons/08_kv_compression/induction_model.npz")
    ids = torch.randint(64, (2, 20))
    with torch.no_grad():
        want = model(ids)
        torch.testing.assert_close(with_latent_kv(model, 64)(ids), want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(with_pooled_kv(model, 4)(ids), want)
        assert not torch.allclose(with_pooled_kv(model, 2)(ids), want, atol=1e-2)
        x = torch.randn(2, 7, 64)
        torch.testing.assert_close(
            mla_from_layer(model.layers[1], 12)(x), with_latent_kv(model, 12).layers[1](x), atol=1e-5, rtol=1e-5
        )
