"""Hidden checks of lesson 02 (torch): split_heads, merge_heads, attention, per_head_attention."""

import functools

import numpy as np

from autograder.checking import (
    Checks,
    Expect,
    StudentError,
    as_torch,
    call_named,
    expect_array,
    expect_pair,
    fail,
    keeps_argument,
    kind_of,
    mistakes,
    reference,
    tensor,
)
from solutions import heads as ref

CHECKS = Checks()
DTYPES = (np.float32, np.float64)
HEADS = Expect(axes=("B", "H", "T", "Dh"))  # a result per head: a mismatch is said by batch, head and position


# ---- split_heads ----------------------------------------------------------------------------


def _split_mistakes(x, H):
    """The known layout mistakes (autograder/lessons/heads/mistakes.py) on this input."""
    return mistakes.compared("02_heads", "split_heads", as_torch(x), H)


@CHECKS.add("split_heads", aspects={"heads layout": 2, "errors": 1})
def split_heads(s):
    rng = s.rng
    with s.aspect("heads layout"):
        for dtype in DTYPES:
            for B, T, D, H in [
                (2, 5, 12, 3),
                (3, 4, 8, 4),
                (2, 6, 6, 6),
                (1, 7, 10, 2),
                (2, 3, 16, 1),
                (2, 4, 12, 4),
                (4, 2, 32, 8),
            ]:
                x = (rng.standard_normal((B, T, D)) * 3).astype(dtype)
                got = call_named(s, "split_heads(x, n_heads)", "split_heads", tensor(x), H)
                expect_array(
                    got,
                    reference(ref.split_heads(as_torch(x), H)),
                    "split_heads(x, n_heads)",
                    lambda: _split_mistakes(x, H),
                    HEADS,
                    hint="head h holds features h*Dh:(h+1)*Dh of every token",
                )
    with s.aspect("errors"):
        for B, T, D, H in [(2, 5, 10, 3), (1, 3, 12, 5), (2, 4, 6, 4), (2, 2, 7, 2)]:
            x = rng.standard_normal((B, T, D)).astype(np.float32)
            try:
                s.call("split_heads", tensor(x), H)
            except StudentError as e:
                if e.is_a("ValueError"):
                    continue
                fail(
                    f"split_heads(x, n_heads) with D not divisible by n_heads should raise a ValueError naming the "
                    f"sizes, but raised {e.type}: check D % n_heads before reshaping"
                )
            fail(
                "split_heads(x, n_heads) with D not divisible by n_heads should raise a ValueError, but returned "
                "normally"
            )


# ---- merge_heads ----------------------------------------------------------------------------


def _merge_mistakes(x):
    """The known layout mistakes (autograder/lessons/heads/mistakes.py) on this input."""
    return mistakes.compared("02_heads", "merge_heads", as_torch(x))


MERGE_HINT = "features h*Dh:(h+1)*Dh of each token are head h's output"
MERGED = Expect(axes=("B", "T", "D"), hint=MERGE_HINT)


def _call_merge(s, x):
    """merge_heads(x); a failing .view after the transpose gets its explanation."""
    try:
        return s.call("merge_heads", tensor(x))
    except StudentError as e:
        view = "view" in e.raw_message and ("stride" in e.raw_message or "contiguous" in e.raw_message)
        fail(
            f"merge_heads(x) raised {e.type}: {e.message}"
            + (
                " (after transpose(1, 2) the tensor is not contiguous in memory: use .reshape, or .contiguous().view)"
                if view
                else ""
            )
        )


@CHECKS.add("merge_heads")
def merge_heads(s):
    rng = s.rng
    for dtype in DTYPES:
        for B, H, T, Dh in [(2, 3, 5, 4), (3, 4, 4, 2), (2, 6, 3, 1), (1, 2, 7, 5), (2, 1, 3, 16), (2, 4, 4, 3)]:
            x = (rng.standard_normal((B, H, T, Dh)) * 3).astype(dtype)
            got = _call_merge(s, x)
            expect_array(
                got,
                reference(ref.merge_heads(as_torch(x))),
                "merge_heads(x)",
                lambda: _merge_mistakes(x),
                MERGED,
            )
    # the inverse of split_heads, on the layout split_heads produces
    x = rng.standard_normal((3, 6, 20)).astype(np.float32)
    heads = ref.split_heads(as_torch(x), 4).contiguous().numpy()
    got = _call_merge(s, heads)
    expect_array(
        got,
        reference(as_torch(x)),
        "merge_heads(split_heads(x, n_heads))",
        lambda: _merge_mistakes(heads),
        MERGED,
        hint="merge_heads must undo split_heads and give x back: " + MERGE_HINT,
    )


# ---- attention ------------------------------------------------------------------------------


def _attention_cases(rng):
    """(q, k, v, mask or None): leading dims, Tq != Tk, Dv != Dk, broadcast masks, large values, both dtypes."""
    for dtype in DTYPES:
        for lead, tq, tk, dk, dv, mask_kind, scale in [
            ((2,), 4, 4, 8, 8, None, 1.0),
            ((2, 3), 3, 6, 4, 5, "shared", 1.0),
            ((2, 3), 5, 5, 16, 4, "per-batch", 1.0),
            ((3,), 2, 7, 9, 3, None, 2.0),
            ((2, 2), 6, 3, 8, 8, "full", 1.0),
            ((2,), 5, 5, 4, 4, "shared", 30.0),
            ((1, 2, 2), 3, 4, 6, 2, None, 1.0),
            ((2, 2), 5, 6, 4, 4, None, 30.0),
        ]:
            q = (rng.standard_normal((*lead, tq, dk)) * scale).astype(dtype)
            k = (rng.standard_normal((*lead, tk, dk)) * scale).astype(dtype)
            v = rng.standard_normal((*lead, tk, dv)).astype(dtype)
            mask = None
            if mask_kind:
                shape = {
                    "shared": (tq, tk),
                    "full": (*lead, tq, tk),
                    "per-batch": (lead[0],) + (1,) * (len(lead) - 1) + (tq, tk),
                }[mask_kind]
                # random, never a fully masked row, nor a fully visible one (so inverting it matters)
                mask = rng.random(shape) < 0.5
                mask[..., 0], mask[..., -1] = True, False
            yield q, k, v, mask


def _attention_mistakes(q, k, v, mask):
    """[(message, (out, weights))] of the known mistakes (autograder/lessons/heads/mistakes.py) on these inputs."""
    args = [as_torch(a) for a in (q, k, v)] + ([] if mask is None else [as_torch(mask)])
    return [(m.message, reference(tuple(got))) for m, got in mistakes.on("02_heads", "attention", *args)]


def exact_attention(q, k, v, mask, dtype):
    """(out, weights) of ref.attention computed in float64, labelled `dtype` (the exact answer), and the
    conditioning of the problem: rounding errors in scores of size |s| move the weights by about |s| * eps."""
    q64, k64, v64 = (as_torch(t.astype(np.float64)) for t in (q, k, v))
    out, w = ref.attention(q64, k64, v64, None if mask is None else as_torch(mask))
    cond = max(1.0, float((q64 @ k64.transpose(-2, -1)).abs().max()) / np.sqrt(q.shape[-1]) / 100)
    return reference(out, dtype=dtype), reference(w, dtype=dtype), cond


LEAD_HINT = (
    "the inputs have leading dimensions such as (B, H): work on the last two axes only, "
    "k.transpose(-2, -1) and softmax(dim=-1), which are right for any number of leading dimensions"
)
WEIGHTS_HINT = "softmax over the keys of the scaled, masked scores: each query's weights sum to 1"


@CHECKS.add("attention", aspects={"scaled attention": 2, "masks": 1})
def attention(s):
    for q, k, v, mask in _attention_cases(s.rng):
        with s.aspect("scaled attention" if mask is None else "masks"):
            args = (tensor(q), tensor(k), tensor(v)) + (() if mask is None else (tensor(mask),))
            out, weights = expect_pair(
                call_named(s, "attention(q, k, v, mask)", "attention", *args, hint=LEAD_HINT), "attention"
            )
            want_out, want_w, cond = exact_attention(q, k, v, mask, q.dtype.name)
            mistakes = functools.cache(lambda: _attention_mistakes(q, k, v, mask))
            lead = ("B", "H", "G")[: q.ndim - 2]
            expect_array(
                weights,
                want_w,
                "the attention weights",
                lambda: (
                    [(m, w) for m, (o, w) in mistakes()]
                    + [
                        (
                            "return the weights per query, (..., Tq, Tk); yours are transposed",
                            reference(as_torch(want_w.data).transpose(-2, -1).to(as_torch(q).dtype)),
                        )
                    ]
                ),
                nan_hint="use torch.softmax (or subtract the row max): exp() overflows for large scores",
                hint=WEIGHTS_HINT,
                cond=cond,
                axes=lead + ("Tq", "Tk"),
                regions=None if mask is None else {"masked keys": ~mask},
            )
            expect_array(
                out,
                want_out,
                "the attention output",
                lambda: [(m, o) for m, (o, w) in mistakes()],
                hint="out = weights @ v",
                cond=cond,
                axes=lead + ("Tq", "Dv"),
            )
    with s.aspect("scaled attention"):  # the caller's q is left as it was given
        q, k, v = (s.rng.standard_normal(shape).astype("float32") for shape in ((2, 4, 8), (2, 6, 8), (2, 6, 5)))
        _, kept = keeps_argument(s, s.get("attention", "__call__"), q, tensor(k), tensor(v))
        if not kept:
            fail(
                "attention changed its input q in place (q /= ..., q.mul_(...)): the caller still needs q, so "
                "compute a new tensor (q / math.sqrt(d_k))"
            )


# ---- per_head_attention ---------------------------------------------------------------------


def _per_head_mistakes(x, ws, H, mask):
    """[(message, output)] of the known mistakes (autograder/lessons/heads/mistakes.py) on these inputs."""
    args = [as_torch(x)] + [as_torch(w) for w in ws] + [H] + ([] if mask is None else [as_torch(mask)])
    return mistakes.compared("02_heads", "per_head_attention", *args)


@CHECKS.add("per_head_attention", isolate=["split_heads", "attention"], aspects={"heads": 2, "masks": 1})
def per_head_attention(s):
    rng = s.rng
    for dtype, B, T, D, H, mask_kind in [
        (np.float32, 2, 5, 12, 3, None),
        (np.float32, 3, 6, 16, 4, "causal"),
        (np.float64, 2, 4, 8, 2, "per-head"),
        (np.float64, 2, 7, 12, 6, "per-batch"),
        (np.float32, 2, 5, 12, 1, None),
        (np.float64, 3, 4, 24, 4, None),
    ]:
        x = rng.standard_normal((B, T, D)).astype(dtype)
        ws = [(rng.standard_normal((D, D)) * 0.7).astype(dtype) for _ in range(3)]
        mask = None
        if mask_kind == "causal":
            mask = np.tril(np.ones((T, T), dtype=bool))
        elif mask_kind:
            mask = rng.random((B, H if mask_kind == "per-head" else 1, T, T)) < 0.5
            mask[..., 0], mask[..., -1] = True, False
        with s.aspect("heads" if mask is None else "masks"):
            args = [tensor(x)] + [tensor(w) for w in ws] + [H] + ([] if mask is None else [tensor(mask)])
            got = call_named(s, "per_head_attention(x, w_q, w_k, w_v, n_heads, mask)", "per_head_attention", *args)
            if isinstance(got, (tuple, list)):
                fail(
                    f"per_head_attention returned {kind_of(got)}: return only the heads' outputs (B, H, T, Dh), "
                    "not the pair (out, weights) that attention returns"
                )
            x64, ws64 = as_torch(x.astype(np.float64)), [as_torch(w.astype(np.float64)) for w in ws]
            want = reference(
                ref.per_head_attention(x64, *ws64, H, None if mask is None else as_torch(mask)), dtype=x.dtype.name
            )
            cond = max(
                float(
                    (ref.split_heads(x64 @ ws64[0], H) @ ref.split_heads(x64 @ ws64[1], H).transpose(-2, -1))
                    .abs()
                    .max()
                )
                / np.sqrt(D // H)
                / 100,
                1.0,
            )
            expect_array(
                got,
                want,
                "per_head_attention(x, w_q, w_k, w_v, n_heads, mask)",
                lambda: _per_head_mistakes(x, ws, H, mask),
                HEADS,
                cond=cond,
                hint="project x with each (D, D) matrix (x @ w), split into heads, attend within each head",
            )
