"""solutions.multi_head (lesson 03) against torch.nn.MultiheadAttention."""

import pytest
import torch
from torch import nn

from solutions.multi_head import MultiHeadAttention, concat_and_project, load_torch_mha, mha_param_count
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "03_multi_head"

torch.manual_seed(0)
D, H = 16, 4


def pair(bias):
    ref = nn.MultiheadAttention(D, H, bias=bias, batch_first=True)
    if bias:  # PyTorch zero-initialises its biases; random ones make the test able to fail
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return load_torch_mha(MultiHeadAttention(D, H, bias=bias), ref), ref


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_matches_torch(bias, need_weights):
    ours, ref = pair(bias)
    x = torch.randn(3, 5, D)
    got = ours(x, need_weights=need_weights)
    want, want_w = ref(x, x, x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got[0] if need_weights else got, want)
    if need_weights:
        assert got[1].shape == (3, H, 5, 5)
        torch.testing.assert_close(got[1], want_w)


@pytest.mark.parametrize("bias", [True, False])
def test_cross_attention_with_mask_matches_torch(bias):
    ours, ref = pair(bias)
    query, memory, value = torch.randn(2, 3, D), torch.randn(2, 7, D), torch.randn(2, 7, D)
    mask = torch.rand(3, 7) < 0.7
    mask[:, 0] = True
    out, w = ours(query, memory, value, mask=mask, need_weights=True)
    # PyTorch's boolean attn_mask means the opposite: True = masked out.
    want, want_w = ref(query, memory, value, attn_mask=~mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w, want_w)
    torch.testing.assert_close(ours(query, memory, value, mask=mask), want)


def test_key_and_value_defaults():
    ours, ref = pair(True)
    x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    torch.testing.assert_close(ours(x), ref(x, x, x)[0])
    torch.testing.assert_close(ours(x, memory), ref(x, memory, memory)[0])


def test_concat_and_project():
    heads, w_o = torch.randn(2, H, 5, D // H), torch.randn(D, D)
    want = torch.cat([heads[:, h] for h in range(H)], dim=-1) @ w_o
    torch.testing.assert_close(concat_and_project(heads, w_o), want)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d, h", [(16, 4), (768, 12), (64, 1)])
def test_param_count_matches_module(d, h, bias):
    assert mha_param_count(d, h, bias) == sum(p.numel() for p in MultiHeadAttention(d, h, bias).parameters())
    assert mha_param_count(d, h, bias) == sum(p.numel() for p in nn.MultiheadAttention(d, h, bias=bias).parameters())


def test_attributes_and_divisibility():
    m = MultiHeadAttention(768, 12)
    assert (m.d_model, m.n_heads, m.head_dim) == (768, 12, 64)
    for make in (lambda: MultiHeadAttention(10, 3), lambda: mha_param_count(10, 3)):
        with pytest.raises(ValueError, match="d_model=10.*n_heads=3"):
            make()


def test_bad_inputs():
    m = MultiHeadAttention(D, H)
    with pytest.raises(ValueError, match=r"\(5, 16\)"):
        m(torch.randn(5, D))
    with pytest.raises(ValueError, match="boolean"):
        m(torch.randn(1, 5, D), mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match="num_heads=2"):
        load_torch_mha(m, nn.MultiheadAttention(D, 2, batch_first=True))
    with pytest.raises(ValueError, match="bias"):
        load_torch_mha(m, nn.MultiheadAttention(D, H, bias=False, batch_first=True))
