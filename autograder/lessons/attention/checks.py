"""Hidden checks of lesson 01 (numpy): softmax, causal_mask, scaled_dot_product_attention."""

from functools import cache, partial

import numpy as np

from autograder.checking import Checks, Expect, expect_array, expect_pair, fail, mistakes, reference
from autograder.sandbox.wire import Array
from solutions import attention as ref

# numpy widens float32 / np.sqrt(d) to float64; that is not what this lesson is about: every comparison allows it.
NUMPY = Expect(upcast_ok=True)

CHECKS = Checks()
DTYPES = (np.float64, np.float32)


def _known(name, *args, dtype=None):
    """[(message, what it returns)] of the known mistakes of `name` (autograder/lessons/attention/mistakes.py),
    run on these inputs (cast to dtype)."""
    return mistakes.compared("01_attention", name, *args, convert=dtype and (lambda got: np.asarray(got).astype(dtype)))


def _softmax_mistakes(x, axis):
    """What the known mistakes (autograder/lessons/attention/mistakes.py) return on x, in x's dtype: expect_array's
    mistakes, run only when the answer is wrong."""
    return lambda: _known("softmax", x, axis, dtype=x.dtype)


SOFTMAX = NUMPY.but(
    hint="softmax(x) = e^x / sum of e^x along `axis`: the entries along `axis` are positive and sum to 1"
)
STABLE_HINT = (
    "subtract each row's max before exp() (softmax(x) = softmax(x - max)), or exp() overflows for large inputs"
)


def _expect_softmax(s, x, axis, what, mistakes):
    """The student's softmax(x, axis) against the exact answer (float64) in x's dtype."""
    got = s.call("softmax", x, axis=axis)
    want = reference(ref.softmax(x.astype(np.float64), axis=axis), dtype=x.dtype.name)
    expect_array(got, want, what, mistakes, SOFTMAX, nan_hint=STABLE_HINT)


@CHECKS.add("softmax", aspects={"values along axis": 2, "large and -inf entries": 1})
def softmax(s):
    rng = s.rng
    with s.aspect("values along axis"):
        for dtype in DTYPES:
            for shape, axis, scale in [
                ((6, 6), -1, 1.0),
                ((5, 5), 0, 2.0),
                ((4, 7), -1, 1.0),
                ((3, 5, 6), 1, 3.0),
                ((2, 3, 4), -1, 1.0),
            ]:
                x = (rng.standard_normal(shape) * scale).astype(dtype)
                _expect_softmax(s, x, axis, "softmax(x, axis)", _softmax_mistakes(x, axis))
        x = rng.standard_normal((3, 5))
        got = s.call("softmax", x)
        expect_array(
            got, reference(ref.softmax(x)), "softmax(x) with the default axis", _softmax_mistakes(x, -1), SOFTMAX
        )
    with s.aspect("large and -inf entries"):
        for dtype in DTYPES:
            # exp() overflows without a max shift; rows far apart underflow with one global shift
            x = (rng.standard_normal((3, 8)) * 800).astype(dtype)
            _expect_softmax(s, x, -1, "softmax of large inputs", _softmax_mistakes(x, -1))
            x = (rng.standard_normal((4, 5)) + np.array([[0.0], [900.0], [-900.0], [5.0]])).astype(dtype)
            _expect_softmax(s, x.T.copy(), 0, "softmax(x, axis) of rows far apart", _softmax_mistakes(x.T.copy(), 0))
        # masked entries: -inf must get weight 0 and must not turn the row into NaN, even far below the others
        x = rng.standard_normal((4, 6))
        x[:, ::2] = -np.inf
        x[1] += 1000.0
        _expect_softmax(s, x, -1, "softmax of a row with -inf entries", _softmax_mistakes(x, -1))


MASK = NUMPY.but(hint="query i may see key j iff j <= i + (n_keys - n_queries)")


@CHECKS.add("causal_mask", aspects={"lower triangle": 1, "more keys than queries": 1})
def causal_mask(s):
    for aspect, sizes in [
        ("lower triangle", [(4, 4), (6, 6), (1, 1)]),
        ("more keys than queries", [(3, 7), (1, 6), (5, 9)]),
    ]:
        with s.aspect(aspect):
            for nq, nk in sizes:
                want = reference(ref.causal_mask(nq, nk))
                got = s.call("causal_mask", nq, nk)
                if isinstance(got, Array) and got.dtype != "bool":
                    fail(
                        f"causal_mask(n_queries, n_keys) has dtype {got.dtype}: return a boolean mask (dtype bool, "
                        "True = may attend), e.g. np.ones(..., dtype=bool)"
                    )
                expect_array(got, want, "causal_mask(n_queries, n_keys)", _known("causal_mask", nq, nk), MASK)
    with s.aspect("lower triangle"):
        expect_array(
            s.call("causal_mask", 5),
            reference(ref.causal_mask(5)),
            "causal_mask(n) with n_keys left out",
            how=NUMPY,
            hint="n_keys defaults to n_queries",
        )


def _attention_cases(rng):
    """(q, k, v, mask or None): leading dims, Tq != Tk, Dv != Dk, masks, large values, both dtypes."""
    for dtype in DTYPES:
        for lead, tq, tk, dk, dv, masked, scale in [
            ((), 4, 4, 8, 8, False, 1.0),
            ((2,), 3, 6, 4, 5, True, 1.0),
            ((2, 3), 5, 5, 16, 4, True, 1.0),
            ((3,), 2, 7, 9, 3, False, 2.0),
            ((2,), 6, 3, 8, 8, False, 1.0),
            ((2,), 5, 5, 4, 4, False, 30.0),
        ]:
            q = (rng.standard_normal((*lead, tq, dk)) * scale).astype(dtype)
            k = (rng.standard_normal((*lead, tk, dk)) * scale).astype(dtype)
            v = rng.standard_normal((*lead, tk, dv)).astype(dtype)
            mask = None
            if masked:  # random, never a fully masked row, nor a fully visible one (so inverting matters)
                mask = rng.random((tq, tk)) < 0.5
                mask[:, 0], mask[:, -1] = True, False
            yield q, k, v, mask


def _sdpa_mistakes(q, k, v, mask):
    """(message, (out, weights)) of the known mistakes (autograder/lessons/attention/mistakes.py) on these inputs."""
    args = (q, k, v) if mask is None else (q, k, v, mask)
    return [
        (m.message, (reference(np.asarray(o).astype(q.dtype)), reference(np.asarray(w).astype(q.dtype))))
        for m, (o, w) in mistakes.on("01_attention", "scaled_dot_product_attention", *args)
    ]


WEIGHTS_HINT = "softmax over the keys of the scaled, masked scores: each query's weights sum to 1"


@CHECKS.add("scaled_dot_product_attention", isolate=["softmax"], aspects={"scaled attention": 2, "masks": 1})
def scaled_dot_product_attention(s):
    for q, k, v, mask in _attention_cases(s.rng):
        with s.aspect("scaled attention" if mask is None else "masks"):
            args = (q, k, v) if mask is None else (q, k, v, mask)
            out, weights = expect_pair(s.call("scaled_dot_product_attention", *args), "scaled_dot_product_attention")
            # the exact answer (float64), asked in the inputs' dtype; large scores amplify rounding in exp()
            q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
            want_out, want_w = ref.scaled_dot_product_attention(q64, k64, v64, mask)
            want_out, want_w = reference(want_out, dtype=q.dtype.name), reference(want_w, dtype=q.dtype.name)
            cond = max(1.0, float(np.abs(q64 @ np.swapaxes(k64, -1, -2)).max()) / np.sqrt(q.shape[-1]) / 100)
            known = cache(partial(_sdpa_mistakes, q, k, v, mask))  # run only when an answer is wrong
            expect_array(
                weights,
                want_w,
                "the attention weights",
                lambda: [(m, w) for m, (o, w) in known()],
                NUMPY,
                nan_hint="subtract the row max inside the softmax",
                hint=WEIGHTS_HINT,
                cond=cond,
                axes=("B", "H", "Tq", "Tk")[-q.ndim :],
                regions=None if mask is None else {"masked keys": ~mask},
            )
            expect_array(
                out,
                want_out,
                "the attention output",
                lambda: [(m, o) for m, (o, w) in known()],
                NUMPY,
                hint="out = weights @ v",
                cond=cond,
                axes=("B", "H", "Tq", "Dv")[-q.ndim :],
            )
