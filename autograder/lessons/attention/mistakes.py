"""Lesson 01 (attention, numpy): known mistakes and correct variants (see autograder/lessons/<module>/mistakes.py)."""

from autograder.checking.mistakes import Mistake

MUTANTS = {
    "softmax": [
        (
            "no max shift",
            "max",
            """
def softmax(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)
""",
        ),
        Mistake(
            "always the last axis",
            "axis",
            """
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
""",
            aspect="values along axis",
            message="you normalised over the wrong axis: use the `axis` argument, the sums along it must be 1",
        ),
        Mistake(
            "always axis 0",
            "axis",
            """
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)
""",
            aspect="values along axis",
            message="you normalised over the wrong axis: use the `axis` argument, the sums along it must be 1",
        ),
        Mistake(
            "normalised over the whole array",
            "whole array",
            """
def softmax(x, axis=-1):
    e = np.exp(x - x.max())
    return e / e.sum()
""",
            aspect="values along axis",
            message="you normalised over the whole array: sum along `axis` only (keepdims=True)",
        ),
        Mistake(
            "sum without keepdims",
            "keepdims",
            """
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis)
""",
            aspect="values along axis",
            message="divide by the sum with keepdims=True, so it broadcasts along `axis`",
        ),
        Mistake(
            "max without keepdims",
            "keepdims",
            """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis))
    return e / np.sum(e, axis=axis, keepdims=True)
""",
            aspect="values along axis",
            message=(
                "subtract each row's own max, np.max(x, axis=axis, keepdims=True): without keepdims the max "
                "broadcasts along the wrong axis"
            ),
        ),
        Mistake(
            "shifted by the global max",
            "global max",
            """
def softmax(x, axis=-1):
    e = np.exp(x - x.max())
    return e / e.sum(axis=axis, keepdims=True)
""",
            aspect="large and -inf entries",
            message=(
                "subtract each row's own max (np.max(x, axis=axis, keepdims=True)), not the global max x.max(): a "
                "row far below the global max underflows to 0/0 = NaN, and a row whose finite entries all sit far "
                "below it (next to -inf entries) loses every weight. The shift must be per row along `axis`"
            ),
        ),
        (
            "constant: returns zeros",
            "sum to 1",
            """
def softmax(x, axis=-1):
    return np.zeros_like(np.asarray(x, dtype=float))
""",
        ),
        (
            "constant: returns its input",
            "sum to 1",
            """
def softmax(x, axis=-1):
    return x
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def softmax(x, axis=-1):
    raise ValueError("softmax is not ready")
""",
        ),
        (
            "borrows the grader's stand-in softmax",
            "sum to 1",
            """
import sys
def softmax(x, axis=-1):
    for module in ("sandbox.helpers", "autograder.sandbox.helpers", "autograder.checking.stand_ins"):
        found = getattr(sys.modules.get(module), "softmax", None)
        if found is not None:
            return found(x, axis)
    return x
""",
        ),
    ],
    "causal_mask": [
        Mistake(
            "top-left alignment",
            "top-left",
            """
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys), dtype=bool))
""",
            aspect="more keys than queries",
            message=(
                "it is aligned top-left. With n_keys > n_queries the queries are the *last* n_queries positions "
                "(a KV cache holds the earlier keys), so query i sees key j iff j <= i + (n_keys - n_queries)"
            ),
        ),
        Mistake(
            "True means masked",
            "may attend",
            """
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return ~np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries)
""",
            aspect="lower triangle",
            message="True must mean 'may attend': you marked the hidden (future) keys instead",
        ),
        Mistake(
            "diagonal excluded",
            "diagonal",
            """
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries - 1)
""",
            aspect="lower triangle",
            message="a query must be able to see its own position: keep the diagonal",
        ),
        (
            "float mask",
            "dtype",
            """
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys)), k=n_keys - n_queries)
""",
        ),
        (
            "constant: nothing visible (all False)",
            "j <= i",
            """
def causal_mask(n_queries, n_keys=None):
    return np.zeros((n_queries, n_queries if n_keys is None else n_keys), dtype=bool)
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def causal_mask(n_queries, n_keys=None):
    raise ValueError("causal_mask is not ready")
""",
        ),
    ],
    "scaled_dot_product_attention": [
        Mistake(
            "no scaling",
            "sqrt(d_k)",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, weights
""",
            aspect="scaled attention",
            message="did you scale the scores by 1/sqrt(d_k)? They are not scaled",
        ),
        Mistake(
            "scaled by 1/d_k",
            "1/d_k",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / q.shape[-1]
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, weights
""",
            aspect="scaled attention",
            message="scale the scores by 1/sqrt(d_k), not 1/d_k",
        ),
        Mistake(
            "scaled by the value width",
            "value width",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(v.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, weights
""",
            aspect="scaled attention",
            message="scale by the key width d_k = q.shape[-1], not the value width",
        ),
        Mistake(
            "inverted mask",
            "may attend",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, -np.inf, scores)
    weights = softmax(scores)
    return weights @ v, weights
""",
            aspect="masks",
            message="True in the mask means 'may attend': you hid the allowed keys instead",
        ),
        Mistake(
            "masked scores set to 0, not -inf",
            "-inf",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, 0.0)
    weights = softmax(scores)
    return weights @ v, weights
""",
            aspect="masks",
            message=(
                "set the masked scores to -inf before the softmax: a score of 0 (or any finite number) still "
                "gets a weight"
            ),
        ),
        Mistake(
            "mask after the softmax",
            "before the softmax",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
""",
            aspect="masks",
            message="apply the mask before the softmax (masked scores -> -inf), so each row still sums to 1",
        ),
        Mistake(
            "weights transposed",
            "per query",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, np.swapaxes(weights, -1, -2)
""",
            aspect="scaled attention",
            message="return the weights per query, (..., Tq, Tk); yours are transposed",
        ),
        Mistake(
            "softmax over the queries",
            "over the keys",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-2)
    return weights @ v, weights
""",
            aspect="scaled attention",
            message="the softmax must run over the keys (last axis): each query's weights sum to 1",
        ),
        (
            "constant: returns zeros",
            "sum to 1",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return np.zeros(lead + (q.shape[-2], v.shape[-1])), np.zeros(lead + (q.shape[-2], k.shape[-2]))
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    raise ValueError("scaled_dot_product_attention is not ready")
""",
        ),
    ],
}

VARIANTS = {
    "softmax": [
        (
            "the axis moved last, computed there, moved back",
            """
def softmax(x, axis=-1):
    moved = np.moveaxis(np.asarray(x), axis, -1)
    e = np.exp(moved - moved.max(axis=-1)[..., None])
    return np.moveaxis(e / e.sum(axis=-1)[..., None], -1, axis)
""",
        ),
        (
            "float64 inside, logsumexp",
            """
def softmax(x, axis=-1):
    x64 = np.asarray(x, dtype=np.float64)
    m = x64.max(axis=axis, keepdims=True)
    lse = m + np.log(np.exp(x64 - m).sum(axis=axis, keepdims=True))
    return np.exp(x64 - lse).astype(np.asarray(x).dtype)
""",
        ),
    ],
    "causal_mask": [
        (
            "explicit comparison of positions",
            """
def causal_mask(n_queries, n_keys=None):
    if n_keys is None:
        n_keys = n_queries
    i = np.arange(n_queries)[:, None] + (n_keys - n_queries)
    return np.arange(n_keys)[None, :] <= i
""",
        ),
    ],
    "scaled_dot_product_attention": [
        (
            "einsum and a large negative fill",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(k.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, np.finfo(scores.dtype).min)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", weights, v), weights
""",
        ),
        (
            "one query at a time, scaled inside the dot product",
            """
def scaled_dot_product_attention(q, k, v, mask=None):
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (np.broadcast_to(t, lead + t.shape[-2:]) for t in (q, k, v))
    m = None if mask is None else np.broadcast_to(mask, lead + (q.shape[-2], k.shape[-2]))
    weights = np.empty(lead + (q.shape[-2], k.shape[-2]), dtype=np.result_type(q, k))
    for i in range(q.shape[-2]):
        s = np.einsum("...d,...kd->...k", q[..., i, :] / np.sqrt(q.shape[-1]).astype(q.dtype), k)
        if m is not None:
            s = np.where(m[..., i, :], s, -np.inf)
        weights[..., i, :] = softmax(s, axis=-1)
    return weights @ v, weights
""",
        ),
    ],
}
