"""solutions.attention (lesson 01, numpy) against PyTorch and explicit loops."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solutions.attention import causal_mask, scaled_dot_product_attention, softmax
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "01_attention"

rng = np.random.default_rng(0)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_torch(axis):
    x = rng.standard_normal((3, 4, 5)) * 5
    np.testing.assert_allclose(softmax(x, axis=axis), torch.softmax(torch.from_numpy(x), dim=axis).numpy(), atol=1e-12)


def test_softmax_huge_and_minus_inf_entries():
    x = np.array([[1000.0, 1001.0, -np.inf], [-1e300, 0.0, 1e300], [-np.inf, 3.0, 3.0]])
    got = softmax(x)
    np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(x), dim=-1).numpy(), atol=1e-12)
    assert np.isfinite(got).all() and got[0, 2] == 0 and got[2, 0] == 0


@pytest.mark.parametrize("nq, nk", [(1, 1), (4, 4), (3, 7), (1, 5)])
def test_causal_mask_is_bottom_right(nq, nk):
    want = np.array([[j <= i + (nk - nq) for j in range(nk)] for i in range(nq)])
    got = causal_mask(nq, nk)
    assert got.dtype == bool and got.shape == (nq, nk)
    np.testing.assert_array_equal(got, want)


def test_causal_mask_defaults_to_square():
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), dtype=bool)))


@pytest.mark.parametrize(
    "lead, tq, tk, masked", [((), 3, 3, False), ((2,), 4, 6, True), ((2, 3), 5, 2, False), ((2, 3), 3, 8, True)]
)
def test_sdpa_matches_torch(lead, tq, tk, masked):
    q, k = rng.standard_normal((*lead, tq, 8)), rng.standard_normal((*lead, tk, 8))
    v = rng.standard_normal((*lead, tk, 5))
    mask = causal_mask(tq, tk) if masked else None
    out, w = scaled_dot_product_attention(q, k, v, mask)
    t = [torch.from_numpy(a) for a in (q, k, v)]
    want = F.scaled_dot_product_attention(*t, attn_mask=None if mask is None else torch.from_numpy(mask))
    np.testing.assert_allclose(out, want.numpy(), atol=1e-10)
    assert w.shape == (*lead, tq, tk)
    np.testing.assert_allclose(w.sum(-1), 1.0)
    if masked:
        assert (w[..., ~mask] == 0).all()


def test_sdpa_random_boolean_mask_broadcasts():
    q, k, v = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 7, 6)), rng.standard_normal((2, 7, 3))
    mask = rng.random((4, 7)) < 0.6
    mask[:, 0] = True  # no fully masked row
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(out, want.numpy(), atol=1e-10)


@pytest.mark.parametrize("shapes", [((4,), (4, 3), (4, 3)), ((2, 3), (2, 4), (2, 4)), ((2, 3), (5, 3), (4, 3))])
def test_sdpa_bad_shapes_name_them(shapes):
    q, k, v = (np.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=r"got q \("):
        scaled_dot_product_attention(q, k, v)


def test_sdpa_rejects_non_boolean_mask():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(x, x, x, mask=np.ones((2, 2)))
