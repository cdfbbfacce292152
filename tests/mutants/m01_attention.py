MUTANTS = {
    "softmax": [
        ("no max shift", "max", '''
def softmax(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)
'''),
        ("always the last axis", "axis", '''
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
'''),
        ("normalised over the whole array", "whole array", '''
def softmax(x, axis=-1):
    e = np.exp(x - x.max())
    return e / e.sum()
'''),
        ("sum without keepdims", "keepdims", '''
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis)
'''),
    ],
    "causal_mask": [
        ("top-left alignment", "top-left", '''
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys), dtype=bool))
'''),
        ("True means masked", "may attend", '''
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return ~np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries)
'''),
        ("diagonal excluded", "diagonal", '''
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys), dtype=bool), k=n_keys - n_queries - 1)
'''),
        ("float mask", "dtype", '''
def causal_mask(n_queries, n_keys=None):
    n_keys = n_queries if n_keys is None else n_keys
    return np.tril(np.ones((n_queries, n_keys)), k=n_keys - n_queries)
'''),
    ],
    "scaled_dot_product_attention": [
        ("no scaling", "sqrt(d_k)", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, weights
'''),
        ("scaled by 1/d_k", "1/d_k", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / q.shape[-1]
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, weights
'''),
        ("inverted mask", "may attend", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, -np.inf, scores)
    weights = softmax(scores)
    return weights @ v, weights
'''),
        ("mask after the softmax", "before the softmax", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
'''),
        ("weights transposed", "per query", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return weights @ v, np.swapaxes(weights, -1, -2)
'''),
        ("softmax over the queries", "over the keys", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-2)
    return weights @ v, weights
'''),
    ],
}

VARIANTS = {
    "softmax": [
        ("float64 inside, logsumexp", '''
def softmax(x, axis=-1):
    x64 = np.asarray(x, dtype=np.float64)
    m = x64.max(axis=axis, keepdims=True)
    lse = m + np.log(np.exp(x64 - m).sum(axis=axis, keepdims=True))
    return np.exp(x64 - lse).astype(np.asarray(x).dtype)
'''),
    ],
    "causal_mask": [
        ("explicit comparison of positions", '''
def causal_mask(n_queries, n_keys=None):
    if n_keys is None:
        n_keys = n_queries
    i = np.arange(n_queries)[:, None] + (n_keys - n_queries)
    return np.arange(n_keys)[None, :] <= i
'''),
    ],
    "scaled_dot_product_attention": [
        ("einsum and a large negative fill", '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(k.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, np.finfo(scores.dtype).min)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", weights, v), weights
'''),
    ],
}
