"""solutions.head_specialization (lesson 07): scores on constructed patterns and against loops; the model against
torch.nn.MultiheadAttention; ablation; the data; checkpoints."""

import numpy as np
import pytest
import torch
from torch import nn

from solutions.head_specialization import (
    AttentionOnlyTransformer,
    CausalSelfAttention,
    ablate_head,
    duplicate_token_score,
    induction_score,
    load_checkpoint,
    previous_token_score,
    repeated_sequences,
    save_checkpoint,
    training_batch,
)
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403
from tests.lessons.head_specialization_training import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "07_head_specialization"

T = 8


def one_hot_pattern(target):
    """(1, T, T): query i attends fully to key target(i) (clamped to 0)."""
    p = torch.zeros(1, T, T)
    for i in range(T):
        p[0, i, max(target(i), 0)] = 1
    return p


def test_previous_token_pattern_scores_one():
    prev, self_ = one_hot_pattern(lambda i: i - 1), one_hot_pattern(lambda i: i)
    torch.testing.assert_close(previous_token_score(torch.cat([prev, self_])), torch.tensor([1.0, 0.0]))


def test_previous_token_score_ignores_position_zero():
    p = one_hot_pattern(lambda i: i - 1)  # row 0 attends to itself: not counted
    assert previous_token_score(p).item() == 1.0


def test_induction_pattern_scores_one():
    period = 3
    ind = one_hot_pattern(lambda i: i - period + 1)
    prev = one_hot_pattern(lambda i: i - 1)
    torch.testing.assert_close(induction_score(torch.cat([ind, prev]), period), torch.tensor([1.0, 0.0]))


def test_induction_score_averages_over_the_repeat_only():
    p = torch.zeros(1, T, T)
    p[0, 5, 3] = 1  # i = 5, period 3: the one wanted entry out of T - period = 5 rows
    assert induction_score(p, 3).item() == pytest.approx(1 / 5)


def test_duplicate_token_score():
    tokens = torch.tensor([4, 7, 4, 1, 7, 4, 2, 0])
    dup = torch.zeros(2, T, T)
    for i in range(T):
        copies = [j for j in range(i) if tokens[j] == tokens[i]]
        for j in copies:
            dup[0, i, j] = 1 / len(copies)  # head 0: all on earlier copies
        dup[1, i, i] = 1  # head 1: on itself, which is not an earlier copy
    torch.testing.assert_close(duplicate_token_score(dup, tokens), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="repeated"):
        duplicate_token_score(dup, torch.arange(T))


def test_ablate_head_changes_only_that_head_and_restores():
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12).eval()
    ids = repeated_sequences(2, 6, 20)
    attn = model.layers[1]
    seen = []
    hook = attn.out_proj.register_forward_hook(lambda m, a, out: seen.append(a[0].clone()))  # sees ablated input
    before = model(ids)
    with ablate_head(model, 1, 2):
        during = model(ids)
    after = model(ids)
    hook.remove()
    torch.testing.assert_close(after, before)
    assert not torch.allclose(during, before)
    merged, ablated = seen[0], seen[1]  # out_proj's input (B, T, D): heads side by side
    assert (ablated[..., 8:12] == 0).all()
    torch.testing.assert_close(ablated[..., :8], merged[..., :8])
    torch.testing.assert_close(ablated[..., 12:], merged[..., 12:])
    with pytest.raises(ValueError, match="0..3"):
        with ablate_head(model, 0, 4):
            pass


def test_patterns_are_causal_distributions():
    model = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12)
    model(repeated_sequences(3, 6, 20))
    for p in model.patterns():
        assert p.shape == (3, 4, 12, 12)
        torch.testing.assert_close(p.sum(-1), torch.ones(3, 4, 12))
        assert (p.triu(1) == 0).all()


def test_scores_match_explicit_loops_on_random_patterns():
    gen = torch.Generator().manual_seed(1)
    H, T, period = 3, 11, 4
    scores = torch.randn(H, T, T, generator=gen, dtype=torch.float64) * 3
    p = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    tokens = torch.randint(4, (T,), generator=gen)
    prev = torch.tensor([sum(p[h, i, i - 1] for i in range(1, T)) / (T - 1) for h in range(H)], dtype=torch.float64)
    ind = torch.tensor(
        [sum(p[h, i, i - period + 1] for i in range(period, T)) / (T - period) for h in range(H)], dtype=torch.float64
    )
    rows = [i for i in range(T) if any(tokens[j] == tokens[i] for j in range(i))]
    dup = torch.tensor(
        [sum(sum(p[h, i, j] for j in range(i) if tokens[j] == tokens[i]) for i in rows) / len(rows) for h in range(H)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(previous_token_score(p), prev)
    torch.testing.assert_close(induction_score(p, period), ind)
    torch.testing.assert_close(duplicate_token_score(p, tokens), dup)
    assert previous_token_score(p.float()).dtype == torch.float32


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_attention_layer_matches_torch_multihead_attention(n_kv_heads):
    """CausalSelfAttention equals nn.MultiheadAttention with the causal mask (keys and values of a group repeated)."""
    torch.manual_seed(0)
    D, H, T = 16, 4, 7
    attn = CausalSelfAttention(D, H, n_kv_heads)
    Hkv, Dh = attn.n_kv_heads, D // H
    w, b = attn.qkv.weight.detach(), attn.qkv.bias.detach()
    wq, wk, wv = w.split([D, Hkv * Dh, Hkv * Dh])
    bq, bk, bv = b.split([D, Hkv * Dh, Hkv * Dh])
    expand = lambda t: t.view(Hkv, Dh, *t.shape[1:]).repeat_interleave(H // Hkv, dim=0).reshape(D, *t.shape[1:])
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([wq, expand(wk), expand(wv)]))
        mha.in_proj_bias.copy_(torch.cat([bq, expand(bk), expand(bv)]))
        mha.out_proj.weight.copy_(attn.out_proj.weight)
        mha.out_proj.bias.copy_(attn.out_proj.bias)
    x = torch.randn(2, T, D)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # nn.MultiheadAttention: True = may NOT attend
    want, want_w = mha(x, x, x, attn_mask=future, average_attn_weights=False)
    torch.testing.assert_close(attn(x), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(attn.pattern, want_w, atol=1e-5, rtol=1e-4)


def test_ablate_head_under_gqa_removes_one_query_head_only():
    torch.manual_seed(1)
    model = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12, n_kv_heads=2).eval()
    ids = repeated_sequences(2, 6, 20)
    with torch.no_grad():
        base = model(ids)
        with ablate_head(model, 0, 1):
            one = model(ids)
        manual = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12, n_kv_heads=2).eval()
        manual.load_state_dict(model.state_dict())
        manual.layers[0].out_proj.weight[:, 4:8] = 0  # head 1's columns: the same as zeroing its output
        torch.testing.assert_close(one, manual(ids))
        torch.testing.assert_close(model(ids), base)


def test_ablate_head_restores_after_an_error():
    model = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12).eval()
    ids = repeated_sequences(2, 6, 20)
    before = model(ids)
    with pytest.raises(RuntimeError):
        with ablate_head(model, 1, 0):
            raise RuntimeError("inside the block")
    torch.testing.assert_close(model(ids), before)
    assert not model.layers[1].out_proj._forward_pre_hooks


def test_training_batch_repeats_a_block_right_after_itself():
    ids = training_batch(64, 32, 64, 4, 16, torch.Generator().manual_seed(0))
    assert ids.shape == (64, 32) and ids.dtype == torch.long
    starts_at_zero = 0
    for row in ids.tolist():
        found = [(s, L) for L in range(4, 17) for s in range(0, 33 - 2 * L) if row[s : s + L] == row[s + L : s + 2 * L]]
        assert found, "every sequence holds a repeated block"
        starts_at_zero += any(s == 0 for s, _ in found)
    assert 32 <= starts_at_zero < 64, "half the batch starts its block at 0, the rest elsewhere"


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(20, d_model=16, n_layers=2, n_heads=4, max_seq_len=12, n_kv_heads=2).eval()
    history = [
        dict(
            step=0,
            loss_first=1.23456789,
            loss_repeat=0.5,
            previous=[[0.1] * 4] * 2,
            duplicate=[[0.2] * 4] * 2,
            induction=[[0.3] * 4] * 2,
        )
    ]
    save_checkpoint(model, history, tmp_path / "m.npz")
    loaded, got = load_checkpoint(tmp_path / "m.npz")
    ids = repeated_sequences(2, 6, 20)
    torch.testing.assert_close(loaded(ids), model(ids))
    assert loaded.config == model.config and got[0]["loss_first"] == 1.2346 and got[0]["induction"][1][3] == 0.3
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:  # plain arrays: no pickle needed
        assert data["__config__"].dtype.kind == "U"
