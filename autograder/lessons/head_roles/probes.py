"""Lesson 10_head_roles's reference probes: each graded name of solutions/head_roles.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch
import torch.nn.functional as F

from autograder.checking.probing import Disagrees, agree, probe, randn


def _role_pattern(H=3, T=7, seed=0):
    """(H, T, T) float64 rows summing to 1, with weight on later keys and exact ties (quarters)."""
    p = torch.softmax(randn(H, T, T, seed=seed) * 3, dim=-1)
    return torch.round(p * 4) / 4 + 1e-3 * torch.eye(T)  # many equal largest weights; the diagonal breaks some


def _first_largest(row):
    """The index of a row's largest value, the lowest among equal ones, written out."""
    values = row.tolist()
    return max(range(len(values)), key=lambda j: (values[j], -j))


@probe("10_head_roles", "solutions.head_roles.relation_accuracy")
def relation_accuracy(fn):
    p, pairs = _role_pattern(), torch.tensor([[3, 1], [6, 6], [4, 0], [2, 2], [5, 3]])
    want = torch.tensor(
        [sum(_first_largest(p[h, f]) == t for f, t in pairs.tolist()) / len(pairs) for h in range(p.shape[0])],
        dtype=torch.float64,
    )
    agree(fn(p, pairs), want, "the definition, pair by pair")


@probe("10_head_roles", "solutions.head_roles.offset_baseline")
def offset_baseline(fn):
    pairs = torch.tensor([[5, 2], [7, 4], [6, 2], [9, 6], [3, 3], [8, 4], [4, 0]])  # offsets 3 3 4 3 0 4 4
    offsets = [f - t for f, t in pairs.tolist()]
    agree(fn(pairs), max(offsets.count(k) for k in offsets) / len(offsets), "the share of the most common offset")
    try:
        fn(torch.zeros(0, 2, dtype=torch.long))
    except ValueError:
        return
    raise Disagrees("it raises no ValueError for no pairs")


@probe("10_head_roles", "solutions.head_roles.rare_word_score")
def rare_word_score(fn):
    p, tokens, counts = _role_pattern(seed=1), torch.tensor([4, 0, 2, 2, 1, 3, 0]), torch.tensor([5, 2, 9, 2, 7])
    want = []
    for h in range(p.shape[0]):
        hits = [
            counts[tokens[_first_largest(p[h, i, : i + 1])]] == min(counts[tokens[: i + 1]].tolist())
            for i in range(1, p.shape[-1])
        ]
        want.append(sum(bool(x) for x in hits) / len(hits))
    agree(fn(p, tokens, counts), torch.tensor(want, dtype=torch.float64), "the definition, query by query")


@probe("10_head_roles", "solutions.head_roles.head_importance")
def head_importance(fn):
    from solutions.head_roles import RoleModel

    torch.manual_seed(0)
    model = RoleModel(9, d_model=8, n_layers=2, n_heads=2, d_mlp=8, max_len=5).double().train()
    ids, targets = torch.randint(9, (3, 5), generator=torch.Generator().manual_seed(1)), torch.arange(15).view(3, 5) % 9
    want, eps = torch.zeros(2, 2, dtype=torch.float64), 1e-6
    for b in range(3):
        for gate in range(4):
            step = torch.zeros(4, dtype=torch.float64)
            step[gate] = eps
            with torch.no_grad():
                up, down = (
                    F.cross_entropy(model(ids[b : b + 1], (1 + s * step).view(2, 2))[0], targets[b]) for s in (1, -1)
                )
            want.view(-1)[gate] += abs(up - down) / (2 * eps) / 3
    agree(fn(model, ids, targets), want, "finite differences of each sequence's loss", tol=1e-6)
    if not model.training or any(p.grad is not None for p in model.parameters()):
        raise Disagrees("it changes the model's mode or fills its parameters' .grad")


@probe("10_head_roles", "solutions.head_roles.prune_heads")
def prune_heads(fn):
    for importance in (
        torch.tensor([[0.5, 0.1, 0.3], [0.1, 0.9, 0.2]], dtype=torch.float64),
        torch.tensor([[2, 0, 1], [0, 1, 0]]),
    ):
        flat = importance.flatten().tolist()
        order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
        for n in range(len(flat) + 1):
            want = torch.ones(len(flat), dtype=importance.dtype if importance.is_floating_point() else torch.float32)
            want[order[:n]] = 0
            agree(fn(importance.clone(), n), want.view(importance.shape), "zeros at the n least important heads")
    try:
        fn(importance, -1)
    except ValueError:
        return
    raise Disagrees("it raises no ValueError for n_prune = -1")
