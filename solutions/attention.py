"""Lesson 01: scaled dot-product attention, in numpy.

Shapes: q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv). Boolean masks broadcast against
the scores (..., Tq, Tk); True means "may attend".
"""

import math

import numpy as np


def softmax(x, axis=-1):
    """Softmax of x along `axis`, safe for huge and -inf entries. Same shape as x."""
    x = np.asarray(x)
    # exp(x - max) cannot overflow, and the shift cancels in the ratio.
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_mask(n_queries, n_keys=None):
    """Bottom-right aligned causal mask: bool (n_queries, n_keys), True where query i may see key j.

    The queries are the last n_queries positions of the n_keys keys (a KV cache holds the
    earlier ones), so query i sees key j iff j <= i + (n_keys - n_queries).
    """
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(Dk)) v.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv), mask bool broadcastable to (..., Tq, Tk)
    -> out (..., Tq, Dv), weights (..., Tq, Tk); each row of weights sums to 1 over the keys.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"expected q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # a Python float keeps float32 float32
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights


# Not an exercise: the guard of every lesson's demonstrations (sync copies it into each notebook that defines it).
def answered(*answers):
    """Stop a demonstration with one sentence while an answer it runs is still the released stub.

    The demonstration lists the answers it runs, in the order of the exercises. A stub only raises
    NotImplementedError (after super().__init__() in a module); a class is one while any method is.
    """
    for answer in answers:
        fn = getattr(answer, "__wrapped__", answer)  # through @contextmanager and @torch.no_grad()
        methods = vars(fn).values() if isinstance(fn, type) else [fn]
        for code in (getattr(m, "__code__", None) for m in methods):
            if (
                code
                and "NotImplementedError" in code.co_names
                and set(code.co_names) <= {"NotImplementedError", "super", "__init__"}
            ):
                raise NotImplementedError(
                    f"{answer.__name__} is still the stub: write it in its cell above and "
                    "run that cell, then run this one again"
                )
