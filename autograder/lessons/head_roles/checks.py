"""Hidden checks of lesson 10 (torch): relation_accuracy, offset_baseline, rare_word_score, head_importance,
prune_heads.

The scores get their own patterns (random causal ones, ones with weight on later keys, ones with exact ties) and
their own annotated pairs and token counts, in float32 and float64, never the shipped checkpoint. head_importance
runs on the lesson's RoleModel (the provided class in the student's namespace) with weights of the check's own, in
float32 and float64, and is compared with solutions' head_importance on the same weights; its points are split:
the values (the core) and the model left as found (weights and mode). prune_heads gets importances with ties,
integer importances and float64 ones, and every n_prune from 0 to all heads.
"""

import numpy as np
import torch

from autograder.checking import (
    Checks,
    StudentError,
    expect_array,
    expect_error,
    fail,
    keeps_argument,
    mistakes,
    reference,
    tensor,
)
from autograder.sandbox.wire import Array
from solutions import head_roles as ref

CHECKS = Checks()
LESSON = "10_head_roles"
DTYPES = (np.float32, np.float64)
PER_HEAD = "one score per head: average over the queries or pairs (not over the heads), so the result has shape (H,)"


def _patterns(rng, H, T, dtype, future=False, ties=False):
    """(H, T, T) rows summing to 1: causal unless `future`; `ties` rounds the weights to tenths so that equal
    largest weights are common."""
    scores = rng.standard_normal((H, T, T)) * 3
    if not future:
        scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if ties:
        p = np.round(p * 4) / 4
    return p.astype(dtype)


def _torch(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _compared(name, *args):
    """[(message, reference)] of the known mistakes of `name` on these (numpy) inputs, as torch tensors."""
    return mistakes.compared(LESSON, name, *[_torch(a) if isinstance(a, np.ndarray) else a for a in args])


def expect_scores(got, want, what, H, mistakes_list):
    if isinstance(got, Array) and got.kind == "tensor" and got.shape != (H,):
        fail(f"{what} has shape {got.shape}, but should have shape ({H},): {PER_HEAD}")
    expect_array(got, want, what, mistakes_list, axes=("H",))


# ---- relation_accuracy ------------------------------------------------------------------------


def _pairs(rng, T, N):
    frm = rng.integers(0, T, size=N)
    return np.stack([frm, (rng.random(N) * (frm + 1)).astype(np.int64)], axis=1).astype(np.int64)


@CHECKS.add("relation_accuracy")
def relation_accuracy(s):
    rng = s.rng
    for dtype in DTYPES:
        for H, T, N, future, ties in [
            (3, 9, 6, False, False),
            (5, 12, 10, True, False),
            (4, 7, 5, False, True),
            (2, 10, 1, True, True),
        ]:
            p, pairs = _patterns(rng, H, T, dtype, future, ties), _pairs(rng, T, N)
            # the pairs' `to` where the head looks most, for some of them, so that scores are not all near 0
            p[0, pairs[:, 0], pairs[:, 1]] += 1
            p[0] /= p[0].sum(-1, keepdims=True)
            got = s.call("relation_accuracy", tensor(p), tensor(pairs))
            want = reference(ref.relation_accuracy(_torch(p), _torch(pairs)))
            expect_scores(got, want, "relation_accuracy(pattern, pairs)", H, _compared("relation_accuracy", p, pairs))


# ---- offset_baseline --------------------------------------------------------------------------


@CHECKS.add("offset_baseline", aspects={"value": 3, "errors": 1})
def offset_baseline(s):
    rng = s.rng
    with s.aspect("value"):
        for N, T in [(7, 12), (40, 30), (1, 5), (15, 8)]:
            pairs = _pairs(rng, T, N)
            got = s.call("offset_baseline", tensor(pairs))
            want = ref.offset_baseline(_torch(pairs))
            for m, wrong in mistakes.on(LESSON, "offset_baseline", _torch(pairs)):
                if (
                    isinstance(got, float)
                    and isinstance(wrong, (float, int))
                    and abs(got - wrong) < 1e-6
                    and abs(got - want) > 1e-6
                ):
                    fail(f"offset_baseline(pairs): {m.message}")
            if not isinstance(got, float):
                fail(
                    "offset_baseline(pairs) should return a Python float (use .item()), not "
                    + ("a tensor" if isinstance(got, Array) else type(got).__name__)
                )
            if abs(got - want) > 1e-6:  # a share computed in float32 is right too
                fail("offset_baseline(pairs) differs from the share of pairs with the most common offset from - to")
    with s.aspect("errors"):
        with expect_error("ValueError", "offset_baseline with no pairs (nothing to explain)"):
            s.call("offset_baseline", tensor(np.zeros((0, 2), dtype=np.int64)))


# ---- rare_word_score --------------------------------------------------------------------------


@CHECKS.add("rare_word_score")
def rare_word_score(s):
    rng = s.rng
    for dtype in DTYPES:
        for H, T, vocab, future, ties, count_dtype in [
            (3, 10, 8, False, False, np.int64),
            (4, 14, 12, True, False, np.float64),
            (2, 9, 5, False, True, np.int64),
            (5, 2, 3, True, False, np.float32),
            (3, 16, 20, True, True, np.int32),
        ]:
            tokens = rng.integers(0, vocab, size=T).astype(np.int64)
            counts = rng.integers(1, 6, size=vocab).astype(count_dtype)  # few distinct counts: ties of counts
            p = _patterns(rng, H, T, dtype, future, ties)
            got = s.call("rare_word_score", tensor(p), tensor(tokens), tensor(counts))
            want = reference(ref.rare_word_score(_torch(p), _torch(tokens), _torch(counts)))
            expect_scores(
                got,
                want,
                "rare_word_score(pattern, tokens, counts)",
                H,
                _compared("rare_word_score", p, tokens, counts),
            )


# ---- head_importance --------------------------------------------------------------------------

CONFIGS = [
    (dict(vocab_size=14, d_model=16, n_layers=2, n_heads=4, d_mlp=24, max_len=10), np.float64, 3, 8),
    (dict(vocab_size=11, d_model=24, n_layers=3, n_heads=3, d_mlp=16, max_len=12), np.float32, 4, 12),
]


def _state(rng, config, dtype):
    torch.manual_seed(int(rng.integers(2**31)))
    model = ref.RoleModel(**config)
    return {k: (v.numpy() * (2.0 if "qkv.weight" in k else 1.0)).astype(dtype) for k, v in model.state_dict().items()}


def _ref_model(config, state):
    model = ref.RoleModel(**config)
    if next(iter(state.values())).dtype == np.float64:
        model = model.double()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    return model.eval()


def _grads(rng, model):
    """{name: .grad} for the model's parameters, every other one (the 1st, 3rd, ...) random values and the rest None,
    as a caller in the middle of its own backward would leave them: the grader's own copy of what it gives."""
    return {
        name: rng.standard_normal(tuple(p.shape)).astype(p.detach().numpy().dtype) if i % 2 == 0 else None
        for i, (name, p) in enumerate(model.named_parameters())
    }


def _as_given(got, given):
    """Whether ModelRecord.grads() (got: {name: [requires_grad, .grad or None]}) says every parameter requires grad
    and holds the .grad it was given, values included."""
    return (
        isinstance(got, dict)
        and set(got) == set(given)
        and all(
            isinstance(got[k], (list, tuple))
            and len(got[k]) == 2
            and got[k][0] is True
            and (
                got[k][1] is None
                if g is None
                else isinstance(got[k][1], Array) and got[k][1].kind == "tensor" and np.array_equal(got[k][1].data, g)
            )
            for k, g in given.items()
        )
    )


@CHECKS.add("head_importance", aspects={"values": 3, "model as found": 1})
def head_importance(s):
    rng = s.rng
    for config, dtype, B, T in CONFIGS:
        state = _state(rng, config, dtype)
        ids = rng.integers(0, config["vocab_size"], size=(B, T)).astype(np.int64)
        targets = rng.integers(0, config["vocab_size"], size=(B, T)).astype(np.int64)
        model = s.call("RoleModel", **config)
        if dtype == np.float64:
            model = s.call((model, "double"))
        s.load(model, state)
        s.call((model, "eval"))
        with s.aspect("values"):
            got = s.call("head_importance", model, tensor(ids), tensor(targets))
            args = (_ref_model(config, state), _torch(ids), _torch(targets))
            want = reference(ref.head_importance(*args))
            expect_array(
                got,
                want,
                "head_importance(model, ids, targets)",
                lambda: mistakes.compared(LESSON, "head_importance", *args),
                axes=("layer", "head"),
                hint="the mean over sequences b of |dL_b / d head_mask[l, h]| at a mask of ones",
            )
            try:  # a caller that only measures may hold torch.no_grad(): the gradients must still flow
                got = s.helper(
                    "without_grad", s.get("head_importance", "__call__"), model, tensor(ids), tensor(targets)
                )
            except StudentError as e:
                fail(
                    f"head_importance fails when called under torch.no_grad() ({e.type}): compute the loss "
                    "inside `with torch.enable_grad():`"
                )
            expect_array(
                got,
                want,
                "head_importance(model, ids, targets) under torch.no_grad()",
                axes=("layer", "head"),
                hint="compute the loss inside `with torch.enable_grad():`",
            )
        with s.aspect("model as found"):  # read from the objects the model was built with, not its methods
            record = s.helper("ModelRecord", model)
            given = _grads(rng, _ref_model(config, state))
            s.call((record, "give_grads"), {k: None if g is None else tensor(g) for k, g in given.items()})
            s.call((record, "set_mode"), False)
            s.call("head_importance", model, tensor(ids), tensor(targets))
            if not _as_given(s.call((record, "grads")), given):
                fail(
                    "head_importance changed the .grad of the model's parameters (filled, wiped or added to) or "
                    "their requires_grad: take the gradient of the mask alone (torch.autograd.grad(loss, mask)) and "
                    "leave the model as found"
                )
            after = s.call((record, "weights"))
            if set(after) != set(state) or any(
                not np.array_equal(after[k].data if isinstance(after[k], Array) else np.asarray(after[k]), v)
                for k, v in state.items()
            ):
                fail("head_importance changed the model's weights: leave the model as found")
            if any(s.call((record, "modes"))):
                fail("head_importance changed the model's mode (it was in eval mode): leave the mode alone")
            s.call((record, "set_mode"), True)
            s.call("head_importance", model, tensor(ids), tensor(targets))
            if not all(s.call((record, "modes"))):
                fail("head_importance changed the model's mode (it was in train mode): leave the mode alone")


# ---- prune_heads ------------------------------------------------------------------------------


@CHECKS.add("prune_heads", aspects={"mask": 3, "errors": 1})
def prune_heads(s):
    rng = s.rng
    cases = [
        rng.random((3, 4)).astype(np.float32),
        np.round(rng.random((2, 5)) * 3).astype(np.float64),  # many ties
        rng.integers(0, 3, size=(4, 2)).astype(np.int64),
    ]  # integers: a float32 mask
    with s.aspect("mask"):
        for importance in cases:
            for n in range(importance.size + 1):
                got, kept = keeps_argument(s, s.get("prune_heads", "__call__"), importance, n)
                if not kept:
                    fail(
                        "prune_heads changed `importance` in place: build the mask in a new tensor (clone first "
                        "if you sort or overwrite)"
                    )
                want = reference(ref.prune_heads(_torch(importance.copy()), n))
                expect_array(
                    got,
                    want,
                    "prune_heads(importance, n_prune)",
                    _compared("prune_heads", importance.copy(), n),
                    axes=("layer", "head"),
                )
    with s.aspect("errors"):
        for bad in (-1, cases[0].size + 1):
            with expect_error("ValueError", "prune_heads with n_prune outside 0..n_layers * n_heads"):
                s.call("prune_heads", tensor(cases[0]), bad)
