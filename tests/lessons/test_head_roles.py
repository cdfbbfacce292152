"""solutions.head_roles (lesson 10): the scores on constructed patterns and against loops written from the
contract, head_importance against finite differences and per-sequence autograd, prune_heads' order and errors,
the language's annotations and the model's head_mask. Each score test also fails on a known-wrong version."""

import pytest
import torch
import torch.nn.functional as F

from solutions.head_roles import (
    Language,
    RoleModel,
    head_importance,
    make_corpus,
    offset_baseline,
    prune_heads,
    rare_word_score,
    relation_accuracy,
    uniform_rare_word_score,
)
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403
from tests.lessons.head_roles_training import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "10_head_roles"


def one_hot(T, targets):
    """(1, T, T): query i puts all its weight on key targets[i]."""
    p = torch.zeros(1, T, T)
    p[0, torch.arange(T), torch.tensor(targets)] = 1
    return p


def rare_loop(pattern, tokens, counts):
    """The contract's rare_word_score, one query at a time."""
    H, T, _ = pattern.shape
    out = torch.zeros(H, dtype=torch.float64)
    for h in range(H):
        for i in range(1, T):
            j = max(range(i + 1), key=lambda k: (pattern[h, i, k].item(), -k))  # largest weight, lowest index
            lowest = min(counts[t].item() for t in tokens[: i + 1])
            out[h] += counts[tokens[j]].item() == lowest
    return out / (T - 1)


def random_pattern(gen, H, T, future=False):
    scores = torch.randn(H, T, T, generator=gen, dtype=torch.float64) * 3
    if not future:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1)


def test_rare_word_score_against_a_loop():
    gen = torch.Generator().manual_seed(0)
    for T, future in [(2, False), (9, False), (9, True), (15, True)]:
        tokens = torch.randint(6, (T,), generator=gen)
        counts = torch.randint(1, 5, (6,), generator=gen)  # small counts: ties between tokens are common
        pattern = random_pattern(gen, 3, T, future)
        torch.testing.assert_close(rare_word_score(pattern, tokens, counts), rare_loop(pattern, tokens, counts))
        assert rare_word_score(pattern.float(), tokens, counts.float()).dtype == torch.float32


def test_rare_word_score_known_heads():
    tokens = torch.tensor([0, 1, 2, 1, 3])
    counts = torch.tensor([50, 9, 4, 7])  # token 2 (at 2) is the rarest once seen; before, token 1 (at 1)
    rare = one_hot(5, [0, 1, 2, 2, 2])
    first = one_hot(5, [0, 0, 0, 0, 0])
    future = one_hot(5, [2, 2, 2, 2, 2])  # at i = 1 the rare key lies in the future: it does not count
    got = rare_word_score(torch.cat([rare, first, future]), tokens, counts)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.75]))
    # any position with the lowest count qualifies: two copies of the rare token, the head on the first
    tokens, counts = torch.tensor([0, 2, 1, 2]), torch.tensor([50, 9, 4])
    torch.testing.assert_close(rare_word_score(one_hot(4, [0, 1, 0, 1]), tokens, counts), torch.tensor([2 / 3]))


def test_rare_word_score_ties_go_to_the_lowest_index():
    tokens, counts = torch.tensor([0, 1, 2]), torch.tensor([9, 1, 9])
    p = torch.zeros(1, 3, 3)
    p[0, 1, :2] = 0.5  # keys 0 and 1 equal: argmax is key 0, not the rare key 1
    p[0, 2, 1:] = 0.5  # keys 1 and 2 equal: key 1, the rare one
    assert rare_word_score(p, tokens, counts).tolist() == [0.5]


def test_relation_accuracy():
    pattern = torch.cat([one_hot(6, [0, 0, 1, 1, 2, 0]), one_hot(6, [0, 1, 2, 3, 4, 5])])
    pairs = torch.tensor([[3, 1], [4, 2], [5, 0], [5, 5]])
    torch.testing.assert_close(relation_accuracy(pattern, pairs), torch.tensor([0.75, 0.25]))
    # the largest weight over the whole row, future keys included; equal weights: the lowest index
    p = torch.zeros(1, 4, 4)
    p[0, 2] = torch.tensor([0.2, 0.3, 0.1, 0.4])
    p[0, 3] = torch.tensor([0.3, 0.3, 0.2, 0.2])
    assert relation_accuracy(p, torch.tensor([[2, 1], [3, 0]])).tolist() == [0.5]
    assert relation_accuracy(p.double(), torch.tensor([[3, 1]])).dtype == torch.float64


def test_relation_accuracy_is_argmax_not_mass():
    p = torch.zeros(1, 3, 3)
    p[0, 2] = torch.tensor([0.45, 0.55, 0.0])
    assert relation_accuracy(p, torch.tensor([[2, 0]])).item() == 0  # the mass on key 0 (0.45) would be wrong


def test_offset_baseline():
    pairs = torch.tensor([[5, 2], [7, 4], [9, 6], [4, 0], [3, 3]])  # offsets 3, 3, 3, 4, 0
    assert offset_baseline(pairs) == pytest.approx(0.6) and isinstance(offset_baseline(pairs), float)
    assert offset_baseline(torch.tensor([[2, 1]])) == 1.0
    with pytest.raises(ValueError, match="empty"):
        offset_baseline(torch.zeros(0, 2, dtype=torch.long))


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    return RoleModel(len(Language.WORDS), d_model=16, n_layers=2, n_heads=4, d_mlp=32, **kw)


def test_head_mask_scales_each_heads_output():
    model = small_model().eval()
    ids = make_corpus(3, seed=4).ids
    ones = model(ids, head_mask=torch.ones(2, 4))
    torch.testing.assert_close(model(ids), ones)
    mask = torch.ones(2, 4)
    mask[1, 2] = 0
    seen = []
    hook = model.attn[1].out_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    out = model(ids, head_mask=mask)
    hook.remove()
    assert (seen[0][..., 8:12] == 0).all() and (seen[0][..., :8] != 0).any()
    assert not torch.allclose(out, ones)


def test_head_importance_matches_finite_differences():
    model = small_model().double().eval()
    corpus = make_corpus(3, seed=1)
    ids, targets = corpus.ids[:, :-1], corpus.ids[:, 1:]
    got = head_importance(model, ids, targets)
    assert got.shape == (2, 4) and got.dtype == torch.float64 and not got.requires_grad
    want = torch.zeros(2, 4, dtype=torch.float64)
    eps = 1e-6
    for b in range(3):
        for l in range(2):
            for h in range(4):
                up, down = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
                up[l, h] += eps
                down[l, h] -= eps
                with torch.no_grad():
                    d = (
                        F.cross_entropy(model(ids[b : b + 1], up)[0], targets[b])
                        - F.cross_entropy(model(ids[b : b + 1], down)[0], targets[b])
                    ) / (2 * eps)
                want[l, h] += d.abs() / 3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
    # the mean of each sequence's |gradient| differs from the |gradient| of the batch's mean loss
    mask = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    logits = model(ids, mask)
    batch = torch.autograd.grad(torch.stack([F.cross_entropy(logits[b], targets[b]) for b in range(3)]).mean(), mask)
    assert not torch.allclose(batch[0].abs(), got)


def test_head_importance_leaves_the_model_as_found():
    model = small_model().train()
    ids = make_corpus(2, seed=2).ids
    model(ids).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.tok_emb.weight.grad = None  # a parameter without a gradient stays without
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        got = head_importance(model, ids[:, :-1], ids[:, 1:])
    assert got.shape == (2, 4) and (got > 0).any()
    assert model.training and model.tok_emb.weight.grad is None
    for k, p in model.named_parameters():
        if k != "tok_emb.weight":
            assert torch.equal(p.grad, grads[k]), k
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_prune_heads():
    importance = torch.tensor([[0.5, 0.1, 0.3], [0.1, 0.9, 0.2]], dtype=torch.float64)
    before = importance.clone()
    mask = prune_heads(importance, 3)
    assert mask.dtype == torch.float64 and torch.equal(importance, before)
    assert mask.tolist() == [[1, 0, 1], [0, 1, 0]]
    assert prune_heads(importance, 2).tolist() == [[1, 0, 1], [0, 1, 1]]  # the tie: lower layer first
    ties = prune_heads(torch.zeros(2, 3, dtype=torch.int64), 4)
    assert ties.dtype == torch.float32 and ties.tolist() == [[0, 0, 0], [0, 1, 1]]
    assert prune_heads(importance, 0).sum() == 6 and prune_heads(importance, 6).sum() == 0
    for bad in (-1, 7):
        with pytest.raises(ValueError, match="n_prune"):
            prune_heads(importance, bad)


def test_corpus_annotations():
    corpus = make_corpus(400, seed=3)
    L = Language
    assert corpus.ids.shape == (400, L.MAX_LEN) and torch.equal(make_corpus(400, seed=3).ids, corpus.ids)
    assert torch.equal(corpus.counts, torch.bincount(corpus.ids.flatten(), minlength=len(L.WORDS)))
    assert (corpus.ids[:, 0] == L.ID[L.BOS]).all() and (corpus.ids == L.ID[L.PAD]).any()
    singular, plural = {s for s, _ in L.NOUNS}, {p for _, p in L.NOUNS}
    words = corpus.words
    for story, at, to in corpus.agreement.tolist():
        verb, subject = words[corpus.ids[story, at + 1]], words[corpus.ids[story, to]]
        assert subject in singular | plural and verb == L.VERB[subject not in singular], corpus.text(story)
        assert {words[t] for t in corpus.ids[story, to + 1 : at + 1]} & (singular | plural), "a noun between"
    # the nouns between subject and verb have either number: the nearest one tells nothing about the verb
    nearest_agrees = [
        words[corpus.ids[s, max(t for t in range(to + 1, at + 1) if words[corpus.ids[s, t]] in singular | plural)]]
        in singular
        for s, at, to in corpus.agreement.tolist()
    ]
    subject_singular = [words[corpus.ids[s, to]] in singular for s, _, to in corpus.agreement.tolist()]
    agree = sum(a == b for a, b in zip(nearest_agrees, subject_singular)) / len(subject_singular)
    assert 0.4 < agree < 0.6
    for story, at, to in corpus.coreference.tolist():
        pronoun, name = words[corpus.ids[story, at + 1]], words[corpus.ids[story, to]]
        assert name in L.FEMALE + L.MALE and (pronoun == "she") == (name in L.FEMALE), corpus.text(story)
    # position alone explains little of the subject; a uniform head rarely finds the rarest word
    assert offset_baseline(corpus.agreement[:, 1:]) < 0.4
    assert uniform_rare_word_score(corpus.ids, corpus.counts) < 0.2
