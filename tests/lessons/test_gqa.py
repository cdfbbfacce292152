"""solutions.gqa (lesson 04) against SDPA's own GQA and against multi-head attention."""

import pytest
import torch
import torch.nn.functional as F

from solutions.gqa import GroupedQueryAttention, kv_cache_bytes, mha_to_gqa, repeat_kv
from solutions.multi_head import MultiHeadAttention
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "04_gqa"

torch.manual_seed(0)
D = 24


def randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module


def test_repeat_kv_interleaves_heads():
    x = torch.randn(2, 3, 4, 5)
    r = repeat_kv(x, 2)
    assert r.shape == (2, 6, 4, 5)
    for h in range(6):
        torch.testing.assert_close(r[:, h], x[:, h // 2])
    torch.testing.assert_close(r, x.repeat_interleave(2, dim=1))


@pytest.mark.parametrize("n_heads, n_kv_heads", [(6, 2), (6, 3), (6, 6), (6, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_gqa_matches_sdpa_enable_gqa(n_heads, n_kv_heads, bias):
    attn = randomise(GroupedQueryAttention(D, n_heads, n_kv_heads, bias=bias))
    assert attn.k_proj.weight.shape == (n_kv_heads * attn.head_dim, D)
    x = torch.randn(2, 7, D)
    B, T, Dh = 2, 7, D // n_heads
    q = attn.q_proj(x).view(B, T, n_heads, Dh).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, n_kv_heads, Dh).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, n_kv_heads, Dh).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = attn.out_proj(o.transpose(1, 2).reshape(B, T, D))
    torch.testing.assert_close(attn(x), want)
    mask = torch.rand(T, T) < 0.5
    mask.fill_diagonal_(True)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(attn(x, mask=mask), attn.out_proj(o.transpose(1, 2).reshape(B, T, D)))


@pytest.mark.parametrize("bias", [False, True])
def test_full_kv_heads_is_multi_head_attention(bias):
    mha = randomise(MultiHeadAttention(D, 4, bias=bias))
    gqa = mha_to_gqa(mha, 4)  # n_kv_heads == n_heads: an exact copy
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        torch.testing.assert_close(getattr(gqa, name).weight, getattr(mha, name).weight)
    x = torch.randn(2, 6, D)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(gqa(x), mha(x, mask=causal))


def test_one_kv_head_is_multi_query_attention():
    attn = randomise(GroupedQueryAttention(D, 4, 1))
    x = torch.randn(1, 5, D)
    k, v = attn.k_proj(x), attn.v_proj(x)  # (1, T, Dh): one key and value head for all queries
    q = attn.q_proj(x).view(1, 5, 4, 6).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k[:, None], v[:, None], is_causal=True)
    torch.testing.assert_close(attn(x), attn.out_proj(o.transpose(1, 2).reshape(1, 5, D)))


@pytest.mark.parametrize("bias", [False, True])
def test_mha_to_gqa_mean_pools_each_group(bias):
    mha = randomise(MultiHeadAttention(D, 6, bias=bias))
    gqa = mha_to_gqa(mha, 2)
    assert (gqa.n_heads, gqa.n_kv_heads, gqa.head_dim) == (6, 2, 4)
    assert (gqa.k_proj.bias is not None) == bias
    w = mha.k_proj.weight.view(6, 4, D)  # (head, Dh, D)
    torch.testing.assert_close(gqa.k_proj.weight.view(2, 4, D)[1], w[3:6].mean(0))
    torch.testing.assert_close(gqa.q_proj.weight, mha.q_proj.weight)
    if bias:
        torch.testing.assert_close(gqa.v_proj.bias.view(2, 4)[0], mha.v_proj.bias.view(6, 4)[:3].mean(0))


def test_mha_to_gqa_keeps_dtype():
    gqa = mha_to_gqa(MultiHeadAttention(D, 6).double(), 3)
    assert gqa.k_proj.weight.dtype == torch.float64


def test_kv_cache_bytes_llama2_70b():
    assert kv_cache_bytes(80, 8, 128, 1) == 327_680
    assert kv_cache_bytes(80, 8, 128, 4096, batch_size=2, bytes_per_element=4) == 327_680 * 4096 * 2 * 2


@pytest.mark.parametrize("d, h, hkv", [(24, 5, 1), (24, 6, 4), (24, 6, 5)])
def test_indivisible_heads_raise(d, h, hkv):
    with pytest.raises(ValueError, match=f"n_heads={h}, n_kv_heads={hkv}"):
        GroupedQueryAttention(d, h, hkv)


def test_bad_input_rank():
    with pytest.raises(ValueError, match=r"\(7, 24\)"):
        GroupedQueryAttention(D, 6, 2)(torch.randn(7, D))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        repeat_kv(torch.randn(3, 4), 2)


def test_imports_go_one_way():
    # solutions.kv_cache imports this lesson's module; this one never imports lesson 05's.
    import subprocess
    import sys

    code = "import sys, solutions.gqa; assert 'solutions.kv_cache' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "name, what, share",
    [("GroupedQueryAttention", "a given mask ignored", (5, 6)), ("mha_to_gqa", "biases dropped", (5, 6))],
)
def test_one_slip_costs_its_share(name, what, share):
    from autograder.checking import PartialCredit, mistakes, verify
    from tests.harness.lessons import fresh_namespace

    m04_gqa = mistakes.for_lesson("04_gqa")

    code = next(c for w, _, c in m04_gqa.MUTANTS[name] if w.startswith(what))
    with pytest.raises(PartialCredit) as partial:
        verify("04_gqa", name, fresh_namespace("04_gqa", {name: code}))
    assert (partial.value.earned, partial.value.total) == share
