"""Hidden checks of lesson 07 (torch): previous_token_score, duplicate_token_score,
induction_score, ablate_head.

Scores get attention patterns (H, T, T), random (causal, rows summing to 1) and constructed
(one-hot heads of each kind), in float32 and float64, and compared with the exact (float64) score.
ablate_head is run on the lesson's own AttentionOnlyTransformer (the provided class in the student's
namespace) with known weights and compared with solutions' model and ablate_head, inside and after
the with-block; its points are split: removing one head (the core), restoring the model, nested
ablations, and the ValueError the notebook promises for a head outside 0..n_heads-1.
"""

import contextlib
import functools

import numpy as np
import torch

from autograder.checking import (
    Checks,
    StudentError,
    close,
    expect_array,
    expect_error,
    fail,
    keeps_argument,
    kind_of,
    mistakes,
    reference,
    tensor,
)
from autograder.sandbox.wire import Array, Handle
from solutions import head_specialization as ref

CHECKS = Checks()
LESSON = "07_head_specialization"
DTYPES = (np.float32, np.float64)
PER_HEAD = (
    "one score per head: average over the query positions (not over the heads, not over everything), "
    "so the result has shape (H,)"
)


# ---- patterns -------------------------------------------------------------------------------


def _causal_softmax(scores):
    T = scores.shape[-1]
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def random_pattern(rng, H, T, dtype, sharpness=3.0):
    """(H, T, T): causal, rows sum to 1, peaked enough that the usual mistakes give other numbers."""
    return _causal_softmax(rng.standard_normal((H, T, T)) * sharpness).astype(dtype)


def one_hot_pattern(T, target):
    """(T, T): query i attends fully to key target(i), or to itself where that is not a past key."""
    p = np.zeros((T, T))
    for i in range(T):
        j = target(i)
        p[i, j if 0 <= j <= i else i] = 1
    return p


def constructed_pattern(rng, T, period, dtype):
    """(5, T, T): an induction head, a duplicate-token head (the earlier copy), a previous-token head,
    a head on itself, and a mixture, for a sequence that repeats with `period`."""
    heads = [
        one_hot_pattern(T, lambda i: i - period + 1),
        one_hot_pattern(T, lambda i: i - period),
        one_hot_pattern(T, lambda i: i - 1),
        one_hot_pattern(T, lambda i: i),
    ]
    heads.append(0.5 * heads[0] + 0.3 * heads[2] + 0.2 * _causal_softmax(rng.standard_normal((T, T))))
    return np.stack(heads).astype(dtype)


def _torch(p):
    return torch.from_numpy(np.ascontiguousarray(p))


def _exact(score, p, *args):
    """The exact (float64) score of pattern p, labelled with p's dtype: what the student must return."""
    return reference(score(_torch(p).double(), *args), dtype=p.dtype.name)


def expect_scores(got, want, what, H, T, mistakes=()):
    """A (H,) score tensor; a wrong shape is named (averaged over the heads, over everything, not at all)."""
    if isinstance(got, Array) and got.kind == "tensor" and got.shape != (H,):
        if got.shape == ():
            fail(f"{what} returned a single number: {PER_HEAD}")
        if len(got.shape) == 1:
            fail(f"{what} has shape {got.shape}: you averaged over the wrong axis (the heads?). {PER_HEAD}")
        if len(got.shape) == 2 and got.shape[0] == H:
            fail(f"{what} has shape {got.shape}: average over the query positions too. {PER_HEAD}")
        fail(f"{what} has shape {got.shape}, but should have shape ({H},): {PER_HEAD}")
    expect_array(got, want, what, mistakes, axes=("H",))


# ---- previous_token_score -------------------------------------------------------------------


def _defined(name, p, *args):
    """[(message, what it returns)] of the known mistakes of `name` (autograder/lessons/head_specialization/mistakes.py)
    run on pattern p in float64, labelled with p's dtype, as _exact."""
    return [
        (m.message, reference(out, dtype=p.dtype.name))
        for m, out in mistakes.on(LESSON, name, _torch(p).double(), *args)
    ]


@CHECKS.add("previous_token_score")
def previous_token_score(s):
    rng = s.rng
    cases = [
        (dtype, random_pattern(rng, H, T, dtype)) for dtype in DTYPES for H, T in [(3, 7), (4, 12), (2, 5), (6, 9)]
    ]
    cases += [(dtype, constructed_pattern(rng, 10, 4, dtype)) for dtype in DTYPES]
    for dtype, p in cases:
        H, T = p.shape[0], p.shape[-1]
        got = s.call("previous_token_score", tensor(p))
        expect_scores(
            got,
            _exact(ref.previous_token_score, p),
            "previous_token_score(pattern)",
            H,
            T,
            functools.partial(_defined, "previous_token_score", p),
        )


# ---- duplicate_token_score ------------------------------------------------------------------


def _tokens(rng, T, vocab):
    """Random tokens with at least one repeat and at least one later first occurrence."""
    while True:
        t = rng.integers(vocab, size=T)
        firsts = [i for i in range(1, T) if t[i] not in t[:i]]
        if len(set(t.tolist())) < T and firsts:
            return t


def _dup_mistakes(p, t):
    return _defined("duplicate_token_score", p, torch.from_numpy(t))


@CHECKS.add("duplicate_token_score")
def duplicate_token_score(s):
    rng = s.rng
    for dtype in DTYPES:
        for H, T, vocab, tok_dtype in [
            (3, 9, 4, np.int64),
            (4, 14, 6, np.int64),
            (2, 8, 3, np.int32),
            (5, 12, 5, np.int64),
        ]:
            t = _tokens(rng, T, vocab).astype(tok_dtype)
            same = (t[:, None] == t[None, :]) & np.tril(np.ones((T, T), dtype=bool))
            # heads: random, one spread over every same-token position (itself included), one on itself
            p = np.concatenate(
                [
                    random_pattern(rng, H, T, dtype),
                    (same / same.sum(-1, keepdims=True))[None].astype(dtype),
                    np.eye(T, dtype=dtype)[None],
                ]
            )
            got = s.call("duplicate_token_score", tensor(p), tensor(t))
            want = _exact(ref.duplicate_token_score, p, torch.from_numpy(t))
            expect_scores(got, want, "duplicate_token_score(pattern, tokens)", H + 2, T, _dup_mistakes(p, t))
    # a constructed sequence that repeats: the duplicate-token head scores 1, the induction head 0
    t = np.concatenate([rng.permutation(7)[:5]] * 2).astype(np.int64)
    p = constructed_pattern(rng, 10, 5, np.float64)
    expect_scores(
        s.call("duplicate_token_score", tensor(p), tensor(t)),
        _exact(ref.duplicate_token_score, p, torch.from_numpy(t)),
        "duplicate_token_score on a repeated sequence",
        5,
        10,
        _dup_mistakes(p, t),
    )
    # the pattern is left as it was given: the other scores read the same pattern
    p, t = random_pattern(rng, 3, 9, np.float64), _tokens(rng, 9, 4)
    _, kept = keeps_argument(s, s.get("duplicate_token_score", "__call__"), p, tensor(t))
    if not kept:
        fail(
            "duplicate_token_score changed the pattern it was given in place (mul_, masked_fill_, *=): the "
            "other scores read the same pattern, so compute on a new tensor (pattern * mask)"
        )
    with expect_error(
        "ValueError",
        "duplicate_token_score with tokens that never repeat (every position would be "
        "left out of the average: say so with a ValueError instead of returning NaN)",
    ):
        s.call("duplicate_token_score", tensor(random_pattern(rng, 2, 6, np.float32)), tensor(np.arange(6)))


# ---- induction_score ------------------------------------------------------------------------


@CHECKS.add("induction_score")
def induction_score(s):
    rng = s.rng
    cases = [
        (random_pattern(rng, H, T, dtype), period)
        for dtype in DTYPES
        for H, T, period in [(3, 10, 5), (4, 12, 4), (2, 11, 4), (5, 16, 8), (3, 9, 3)]
    ]
    cases += [
        (constructed_pattern(rng, T, period, dtype), period) for dtype in DTYPES for T, period in [(12, 6), (13, 4)]
    ]
    for p, period in cases:
        H, T = p.shape[0], p.shape[-1]
        got = s.call("induction_score", tensor(p), period)
        expect_scores(
            got,
            _exact(ref.induction_score, p, period),
            "induction_score(pattern, period)",
            H,
            T,
            functools.partial(_defined, "induction_score", p, period),
        )


# ---- ablate_head ----------------------------------------------------------------------------

# (config, dtype, [(layer, head)]): several heads and layers, a GQA model (heads 0, 1 share a key/value
# head), float64, T below max_seq_len.
ABLATIONS = [
    (dict(vocab_size=13, d_model=24, n_layers=2, n_heads=3, max_seq_len=12), np.float32, [(1, 1), (0, 0), (1, 2)]),
    (
        dict(vocab_size=11, d_model=32, n_layers=3, n_heads=4, max_seq_len=14, n_kv_heads=2),
        np.float64,
        [(1, 1), (2, 0), (0, 3)],
    ),
]


def _state(rng, config, dtype):
    """Random weights, sharper than the default initialisation so heads differ clearly."""
    torch.manual_seed(int(rng.integers(2**31)))
    model = ref.AttentionOnlyTransformer(**config)
    state = {}
    for k, v in model.state_dict().items():
        v = v.numpy()
        state[k] = (v * (2.0 if "qkv.weight" in k else 1.0)).astype(dtype)
    return state


def _ref_model(config, state):
    model = ref.AttentionOnlyTransformer(**config)
    if next(iter(state.values())).dtype == np.float64:
        model = model.double()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    return model.eval()


def _run(config, state, ids, edit=None):
    """Reference logits and patterns, with `edit(model)` (a context manager) around the forward."""
    model = _ref_model(config, state)
    with torch.no_grad(), edit(model) if edit else contextlib.nullcontext():
        logits = model(torch.from_numpy(ids))
    return reference(logits), [reference(p) for p in model.patterns()]


def _ablation_mistakes(config, layer, head):
    """[(message, edit)]: the usual wrong ablations, as edits of the reference model: the defined mistakes
    (autograder/lessons/head_specialization/mistakes.py), and the reference itself on every other head or layer
    (the defined 'next head' and 'layer 0' are one of each), named by those mistakes' messages."""
    known = mistakes.for_lesson(LESSON)
    out = [
        (known.WRONG_HEAD, lambda m, h2=h2: ref.ablate_head(m, layer, h2))
        for h2 in range(config["n_heads"])
        if h2 != head
    ]
    out += [
        (known.WRONG_LAYER, lambda m, l2=l2: ref.ablate_head(m, l2, head))
        for l2 in range(config["n_layers"])
        if l2 != layer
    ]
    defined = [
        (m.message, lambda model, fn=fn: fn(model, layer, head)) for m, fn in mistakes.defined(LESSON, "ablate_head")
    ]
    # "nothing changed" is tried first: a wrong edit that changes nothing reads as that
    nothing = [d for d in defined if d[0] == known.NOTHING]
    return nothing + out + [d for d in defined if d[0] != known.NOTHING]


def _forward(s, model, ids):
    logits = s.call(model, tensor(ids))
    patterns = s.call((model, "patterns"))
    return logits, patterns


def _matches(got, want):
    logits, patterns = got
    return (
        close(logits, want[0])
        and isinstance(patterns, list)
        and len(patterns) == len(want[1])
        and all(close(p, w) for p, w in zip(patterns, want[1]))
    )


def _expect_run(s, got, want, what, mistakes_runs):
    """Compare logits, then each layer's pattern; mistakes_runs: [(message, (logits, patterns))], or a
    function that makes them (called only when the result is wrong: each is a forward pass)."""
    if _matches(got, want):
        return
    if callable(mistakes_runs):
        mistakes_runs = mistakes_runs()
    logits, patterns = got
    want_logits, want_patterns = want
    expect_array(
        logits,
        want_logits,
        f"the logits {what}",
        [(m, r[0]) for m, r in mistakes_runs],
        axes=("B", "T", "vocab"),
        hint="only the head's output may change: zero its slice of out_proj's input",
    )
    if not isinstance(patterns, list) or len(patterns) != len(want_patterns):
        fail(f"model.patterns() {what} should be one pattern per layer")
    for i, (p, wp) in enumerate(zip(patterns, want_patterns)):
        expect_array(
            p,
            wp,
            f"the layer-{i} attention pattern {what}",
            [(m, r[1][i]) for m, r in mistakes_runs],
            axes=("B", "H", "Tq", "Tk"),
            hint="removing a head must not change its attention pattern, nor any pattern in its layer",
        )


def _enter(s, cm, what):
    if not isinstance(cm, Handle):
        fail(
            f"{what} should return a context manager (decorate a generator with @contextlib.contextmanager and "
            f"yield), but it returned {kind_of(cm)}"
        )
    try:
        s.get(cm, "__exit__")
    except StudentError:
        fail(f"{what} should return a context manager, usable in a with-statement, but it returned {kind_of(cm)}")
    s.call((cm, "__enter__"))


def _fresh_model(s, config, dtype, state):
    """The lesson's AttentionOnlyTransformer in the student's namespace, with `state` loaded."""
    model = s.call("AttentionOnlyTransformer", **config)
    if dtype == np.float64:
        model = s.call((model, "double"))
    s.load(model, state)
    return model


def _expect_restored(s, model, state, ids, before):
    """After a with-block: the same weights, and the same outputs as before it."""
    got_state = s.state(model)
    for name, value in state.items():
        if name not in got_state or not close(got_state[name], reference(torch.from_numpy(value))):
            fail(
                f"after the with-block the weights ({name}) are not restored: keep a copy of what you change "
                f"(.clone(): a slice is a view, zeroed with the weights) and put it back when the block "
                f"ends (in a finally, so it happens even after an error)"
            )
    after = _forward(s, model, ids)
    for got, want_after, part in ((after[0], before[0], "logits"),) + tuple(
        (p, wp, f"layer-{i} pattern") for i, (p, wp) in enumerate(zip(after[1], before[1]))
    ):
        if not close(got, want_after):
            fail(
                f"after the with-block the model's {part} still differ from before: a hook is still "
                f"registered. Keep the handle register_forward_pre_hook returns and call handle.remove() "
                f"when the block ends (in a finally), so the model is restored"
            )


def _raise_in_block(s, cm):
    """Leave the with-block of cm (entered) with an error, as `with cm: raise RuntimeError` does:
    cm.__exit__(RuntimeError, None, None), the exception class taken from the builtins its __exit__ sees."""
    exit_fn = s.get(s.get(cm, "__exit__"), "__func__")
    builtins = s.get(exit_fn, "__builtins__")
    error = builtins.get("RuntimeError") if isinstance(builtins, dict) else None
    if not isinstance(error, Handle):
        fail(
            "the with-block of ablate_head(model, layer, head) could not be left with an error: its __exit__ "
            "does not see Python's builtins"
        )
    try:
        s.call((cm, "__exit__"), error, None, None)
    except StudentError as e:
        if not e.is_a("RuntimeError"):  # a class's __exit__ may raise it again: that is allowed
            raise


def _expect_restored_after_error(s, config, dtype, state, ids, before):
    """A with-block that raises: the model is restored all the same (the notebook promises it)."""
    model = _fresh_model(s, config, dtype, state)
    cm = s.call("ablate_head", model, 1, 1)
    _enter(s, cm, "ablate_head(model, layer, head)")
    _raise_in_block(s, cm)
    try:
        _expect_restored(s, model, state, ids, before)
    except AssertionError:
        raise AssertionError(
            "after a with-block that raised an error the model is not restored: undo the ablation "
            "in a finally (try: yield model, then finally: remove the hook or put the weights "
            "back), so it runs whatever the block does"
        ) from None


@CHECKS.add("ablate_head", aspects={"removes one head": 3, "restores the model": 2, "nested ablations": 1, "errors": 1})
def ablate_head(s):
    rng = s.rng
    for config, dtype, heads in ABLATIONS:
        state = _state(rng, config, dtype)
        model = _fresh_model(s, config, dtype, state)
        ids = rng.integers(config["vocab_size"], size=(3, config["max_seq_len"] - 2)).astype(np.int64)
        before = _run(config, state, ids)
        logits, _ = _forward(s, model, ids)
        if not close(logits, before[0]):
            fail(
                "AttentionOnlyTransformer does not compute what the lesson provides: run its provided cell again "
                "unchanged (ablate_head is checked on that model)"
            )
        for layer, head in heads:
            with s.aspect("removes one head"):
                what = f"inside `with ablate_head(model, {layer}, {head})`"
                cm = s.call("ablate_head", model, layer, head)
                _enter(s, cm, "ablate_head(model, layer, head)")
                during = _forward(s, model, ids)
                s.call((cm, "__exit__"), None, None, None)
                want = _run(config, state, ids, lambda m: ref.ablate_head(m, layer, head))
                _expect_run(
                    s,
                    during,
                    want,
                    what,
                    lambda: [
                        (message, _run(config, state, ids, edit))
                        for message, edit in _ablation_mistakes(config, layer, head)
                    ],
                )
            restored = False
            with s.aspect("restores the model"):
                _expect_restored(s, model, state, ids, before)
                restored = True
            if not restored:  # the rest is checked on a model without the leftovers
                model = _fresh_model(s, config, dtype, state)
        with s.aspect("restores the model"):
            _expect_restored_after_error(s, config, dtype, state, ids, before)
        # two ablations at once, nested: leaving the inner one keeps the outer one
        with s.aspect("nested ablations"):
            layer = 1
            outer, inner = s.call("ablate_head", model, layer, 0), s.call("ablate_head", model, layer, 1)
            _enter(s, outer, "ablate_head(model, layer, head)")
            _enter(s, inner, "ablate_head(model, layer, head)")
            both = _forward(s, model, ids)

            @contextlib.contextmanager
            def two(m):
                with ref.ablate_head(m, layer, 0), ref.ablate_head(m, layer, 1):
                    yield m

            want_outer = _run(config, state, ids, lambda m: ref.ablate_head(m, layer, 0))
            _expect_run(
                s,
                both,
                _run(config, state, ids, two),
                "with two heads ablated at once (nested with-blocks)",
                lambda: [
                    (
                        "with two nested ablations only one head was removed: each ablate_head must add its "
                        "own change to the model, not replace the other's",
                        r,
                    )
                    for r in (want_outer, _run(config, state, ids, lambda m: ref.ablate_head(m, layer, 1)))
                ],
            )
            s.call((inner, "__exit__"), None, None, None)
            _expect_run(
                s,
                _forward(s, model, ids),
                want_outer,
                "after leaving the inner of two nested with-blocks",
                [
                    (
                        "leaving the inner with-block also undid the outer one: remove only your own hook (or put "
                        "back only the weights you changed), never all of them",
                        before,
                    )
                ],
            )
            s.call((outer, "__exit__"), None, None, None)
        with s.aspect("errors"):
            for bad in (config["n_heads"], -1):  # the notebook promises a ValueError outside 0..n_heads-1
                with expect_error(
                    "ValueError",
                    f"ablate_head(model, layer, head) with head = {bad} and n_heads = "
                    f"{config['n_heads']} (the slice would be empty, or another head's, "
                    f"and nothing would say so)",
                ):
                    _enter(s, s.call("ablate_head", model, 0, bad), "ablate_head(model, layer, head)")
