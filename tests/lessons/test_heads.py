"""solutions.heads (lesson 02) against explicit slicing and PyTorch's SDPA."""

import pytest
import torch
import torch.nn.functional as F

from solutions.heads import attention, merge_heads, per_head_attention, split_heads
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "02_heads"

torch.manual_seed(0)


def test_split_heads_gives_each_head_its_feature_slice():
    x = torch.randn(2, 5, 12)
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    for i in range(3):
        torch.testing.assert_close(h[:, i], x[..., 4 * i : 4 * (i + 1)])


def test_merge_heads_inverts_split_heads():
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(merge_heads(split_heads(x, 4)), x)
    y = torch.randn(2, 4, 3, 5)
    torch.testing.assert_close(split_heads(merge_heads(y), 4), y)


@pytest.mark.parametrize(
    "fn, arg",
    [(split_heads, torch.zeros(2, 5, 10)), (split_heads, torch.zeros(5, 12)), (merge_heads, torch.zeros(2, 3, 4))],
)
def test_bad_shapes_raise_value_error_naming_them(fn, arg):
    with pytest.raises(ValueError, match=r"\(2, 5, 10\)|\(5, 12\)|\(2, 3, 4\)"):
        fn(arg, 3) if fn is split_heads else fn(arg)


@pytest.mark.parametrize("lead, tq, tk", [((2,), 4, 4), ((2, 3), 3, 6), ((1, 2, 2), 5, 2)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_sdpa(lead, tq, tk, masked):
    q, k, v = torch.randn(*lead, tq, 8), torch.randn(*lead, tk, 8), torch.randn(*lead, tk, 4)
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq) if masked and tk >= tq else None
    out, w = attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert w.shape == (*lead, tq, tk)
    torch.testing.assert_close(w.sum(-1), torch.ones(*lead, tq))


def test_attention_rejects_mismatched_dtypes_and_float_masks():
    q = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="float64"):
        attention(q, q.double(), q)
    with pytest.raises(ValueError, match="boolean"):
        attention(q, q, q, mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        attention(q, torch.randn(2, 3, 5), q)


def test_per_head_attention_uses_each_heads_own_projection_slice():
    B, T, D, H = 2, 5, 12, 3
    x = torch.randn(B, T, D)
    w_q, w_k, w_v = (torch.randn(D, D) for _ in range(3))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    got = per_head_attention(x, w_q, w_k, w_v, H, mask)
    assert got.shape == (B, H, T, D // H)
    for h in range(H):
        cols = slice(h * 4, (h + 1) * 4)
        want = F.scaled_dot_product_attention(x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols], attn_mask=mask)
        torch.testing.assert_close(got[:, h], want)
