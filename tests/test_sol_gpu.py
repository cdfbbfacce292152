"""solutions.gpu (lesson 06): tiled attention equals SDPA; Triton under its interpreter."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from solutions.gpu import attention_flops, flash_attention, fuse_qkv, online_softmax, triton_attention
from solutions.multi_head import MultiHeadAttention

torch.manual_seed(0)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def sdpa(q, k, v, causal):
    mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril(k.size(-2) - q.size(-2)) if causal else None
    # The reference in float32, so that the half-precision tolerances measure our error alone.
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(q.dtype)


def test_attention_flops_known_values():
    assert attention_flops(1, 1, 1, 1, 1) == 4
    assert attention_flops(2, 12, 1024, 1024, 64) == 4 * 2 * 12 * 1024 * 1024 * 64
    assert attention_flops(2, 12, 1024, 1024, 64, causal=True) == 2 * 2 * 12 * 1024 * 1024 * 64
    assert isinstance(attention_flops(1, 2, 3, 4, 5), int)


@pytest.mark.parametrize("n, block", [(10, 3), (64, 16), (7, 100), (33, 1)])
def test_online_softmax_equals_softmax(n, block):
    x = torch.randn(4, 3, n) * 20
    x[0, 0, : n // 2] = float("-inf")  # a row whose first blocks are all -inf
    torch.testing.assert_close(online_softmax(x, block), x.softmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tq, tk, causal", [(100, 100, False), (100, 100, True), (37, 130, True),
                                            (130, 37, False), (1, 77, True), (64, 64, True)])
def test_flash_attention_equals_sdpa(dtype, tq, tk, causal):
    q, k, v = torch.randn(2, 3, tq, 16, dtype=dtype), torch.randn(2, 3, tk, 16, dtype=dtype), torch.randn(2, 3, tk, 16, dtype=dtype)
    got = flash_attention(q, k, v, causal=causal, block_q=32, block_k=48)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got, sdpa(q, k, v, causal), **TOL[dtype])


def test_flash_attention_default_blocks_and_bad_input():
    q = torch.randn(1, 2, 200, 8)
    torch.testing.assert_close(flash_attention(q, q, q, causal=True), sdpa(q, q, q, True), **TOL[torch.float32])
    with pytest.raises(ValueError, match=r"\(1, 2, 200, 8\)"):
        flash_attention(q, q[..., :4], q[..., :4])
    with pytest.raises(ValueError, match="float64"):
        flash_attention(q, q.double(), q)


@pytest.mark.parametrize("bias", [True, False])
def test_fuse_qkv_equals_three_projections(bias):
    attn = MultiHeadAttention(32, 4, bias=bias)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_()
    fused = fuse_qkv(attn)
    assert isinstance(fused, torch.nn.Linear) and fused.weight.shape == (96, 32)
    x = torch.randn(2, 5, 32)
    for got, proj in zip(fused(x).split(32, dim=-1), (attn.q_proj, attn.k_proj, attn.v_proj)):
        torch.testing.assert_close(got, proj(x))


triton_missing = importlib.util.find_spec("triton") is None


@pytest.mark.skipif(triton_missing, reason="Triton is not installed (pip install -e '.[gpu]', Linux only)")
@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="no GPU and TRITON_INTERPRET is not 1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tq, tk, dh, causal", [(17, 17, 16, False), (20, 33, 32, True), (33, 33, 24, True)])
def test_triton_attention_equals_sdpa(dtype, tq, tk, dh, causal):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(2, 2, t, dh, dtype=dtype, device=dev) for t in (tq, tk, tk))
    got = triton_attention(q, k, v, causal=causal)
    torch.testing.assert_close(got.cpu(), sdpa(q.cpu(), k.cpu(), v.cpu(), causal), **TOL[dtype])


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_triton_attention_rejects_bf16():
    q = torch.randn(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        triton_attention(q, q, q)
