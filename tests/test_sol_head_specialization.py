"""solutions.head_specialization (lesson 07): scores on constructed patterns; ablation."""
import pytest
import torch

from solutions.head_specialization import (AttentionOnlyTransformer, ablate_head, duplicate_token_score,
                                           induction_score, previous_token_score, repeated_sequences)

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
