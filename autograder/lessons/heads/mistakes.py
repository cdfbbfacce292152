"""Lesson 02 (heads): known mistakes and correct variants (see autograder/lessons/<module>/mistakes.py)."""

from autograder.checking.mistakes import Mistake

_ATTENTION_BODY = """
def attention(q, k, v, mask=None):{cast}
    scores = {scores}
    if mask is not None:
        scores = scores.masked_fill({hidden}, {fill})
    {weights}
    return {returned}
"""
_ATTENTION_OK = dict(
    cast="",
    scores="q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
    hidden="~mask",
    fill='float("-inf")',
    weights="weights = torch.softmax(scores, dim=-1)",
    returned="weights @ v, weights",
)


def _attention(**edits):
    """The correct attention with some of its parts (_ATTENTION_OK's fields) replaced: one mistake each."""
    return _ATTENTION_BODY.format(**{**_ATTENTION_OK, **edits})


MUTANTS = {
    "split_heads": [
        Mistake(
            "reshape straight to (B, H, T, Dh), no transpose",
            "transpose",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"D={D} is not divisible by n_heads={n_heads}")
    return x.view(B, n_heads, T, D // n_heads)
""",
            aspect="heads layout",
            message=(
                "a reshape (or view) straight to (B, H, T, Dh) mixes time steps and features, because memory "
                "holds x as (B, T, D): reshape to (B, T, H, Dh) first, then transpose(1, 2)"
            ),
        ),
        Mistake(
            "reshape to (B, T, H, Dh), heads after time",
            "transpose",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"D={D} is not divisible by n_heads={n_heads}")
    return x.reshape(B, T, n_heads, D // n_heads)
""",
            aspect="heads layout",
            message=(
                "the heads axis must come before time, (B, H, T, Dh): transpose(1, 2) after the reshape to "
                "(B, T, H, Dh)"
            ),
        ),
        Mistake(
            "strided heads: every H-th feature",
            "contiguous features",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"D={D} is not divisible by n_heads={n_heads}")
    return x.reshape(B, T, D // n_heads, n_heads).permute(0, 3, 1, 2)
""",
            aspect="heads layout",
            message=(
                "head h must hold the contiguous features h*Dh:(h+1)*Dh, not every H-th feature: reshape the "
                "last axis to (H, Dh), not (Dh, H)"
            ),
        ),
        (
            "no ValueError when D % H != 0",
            "ValueError",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2)
""",
        ),
        (
            "dtype changed to float32",
            "dtype",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"D={D} is not divisible by n_heads={n_heads}")
    return x.float().reshape(B, T, n_heads, D // n_heads).transpose(1, 2)
""",
        ),
        (
            "constant: returns zeros",
            "of every token",
            """
def split_heads(x, n_heads):
    B, T, D = x.shape
    return x.new_zeros(B, n_heads, T, D // n_heads)
""",
        ),
        (
            "constant: returns its input",
            "shape",
            """
def split_heads(x, n_heads):
    return x
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def split_heads(x, n_heads):
    raise ValueError("split_heads is not ready")
""",
        ),
    ],
    "merge_heads": [
        Mistake(
            "reshape without transposing back",
            "transpose back",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)
""",
            message=(
                "transpose back to (B, T, H, Dh) before the reshape: a reshape of (B, H, T, Dh) straight to "
                "(B, T, H*Dh) mixes time steps and heads"
            ),
        ),
        Mistake(
            "heads put last before the reshape",
            "concatenate the heads",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)
""",
            message=(
                "concatenate the heads: head h's features go to h*Dh:(h+1)*Dh (transpose(1, 2), not a permute "
                "that puts the heads last)"
            ),
        ),
        (
            "view after transpose (not contiguous)",
            "reshape",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).view(B, T, H * Dh)
""",
        ),
        (
            "returns (B, H*Dh, T)",
            "shape",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh).transpose(1, 2)
""",
        ),
        (
            "constant: returns zeros",
            "head h's output",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.new_zeros(B, T, H * Dh)
""",
        ),
        (
            "constant: returns its input",
            "shape",
            """
def merge_heads(x):
    return x
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def merge_heads(x):
    raise ValueError("merge_heads is not ready")
""",
        ),
    ],
    "attention": [
        Mistake(
            "no scaling",
            "sqrt(d_k)",
            _attention(scores="q @ k.transpose(-2, -1)"),
            message="did you scale the scores by 1/sqrt(d_k)? They are not scaled",
        ),
        Mistake(
            "scaled by 1/d_k",
            "1/d_k",
            _attention(scores="q @ k.transpose(-2, -1) / q.size(-1)"),
            message="scale the scores by 1/sqrt(d_k), not 1/d_k",
        ),
        Mistake(
            "inverted mask (True = masked out)",
            "may attend",
            _attention(hidden="mask"),
            message="True in the mask means 'may attend': you hid the allowed keys instead",
        ),
        Mistake(
            "masked scores set to 0",
            "-inf",
            _attention(fill="0.0"),
            message="masked scores must become -inf, not 0: a score of 0 still gets a share of the softmax",
        ),
        Mistake(
            "mask applied after the softmax",
            "before the softmax",
            """
def attention(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
""",
            message="apply the mask before the softmax (masked scores -> -inf), so each row still sums to 1",
        ),
        Mistake(
            "softmax over the queries",
            "over the keys",
            _attention(weights="weights = torch.softmax(scores, dim=-2)"),
            message="the softmax must run over the keys (dim=-1): each query's weights sum to 1",
        ),
        Mistake(
            "scaled by the value width",
            "value width",
            _attention(scores="q @ k.transpose(-2, -1) / math.sqrt(v.size(-1))"),
            message="scale by the key width d_k = q.shape[-1], not the value width",
        ),
        ("scaled by the number of keys", "scale", _attention(scores="q @ k.transpose(-2, -1) / math.sqrt(k.size(-2))")),
        ("returns (weights, out), the pair swapped", "weights", _attention(returned="weights, weights @ v")),
        (
            "naive exp without max shift",
            "overflow",
            _attention(weights="e = torch.exp(scores)\n    weights = e / e.sum(dim=-1, keepdim=True)"),
        ),
        (
            "computes in float32 whatever the input dtype",
            "dtype",
            _attention(cast="\n    q, k, v = q.float(), k.float(), v.float()"),
        ),
        (
            "keys transposed with transpose(0, 1), right only for 2-D inputs",
            "transpose(-2, -1)",
            _attention(scores="q @ k.transpose(0, 1) / math.sqrt(q.size(-1))"),
        ),
        (
            "softmax over dim=1, right only for 2-D scores",
            "dim=-1",
            _attention(weights="weights = torch.softmax(scores, dim=1)"),
        ),
        # No message: the check recognises it by the q it was given, not by running this definition.
        (
            "q scaled in place (q /= sqrt(d_k))",
            "in place",
            _attention(cast="\n    q /= math.sqrt(q.size(-1))", scores="q @ k.transpose(-2, -1)"),
        ),
        (
            "returns only out, not (out, weights)",
            "pair",
            """
def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
""",
        ),
        (
            "constant: returns zeros",
            "sum to 1",
            """
def attention(q, k, v, mask=None):
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return q.new_zeros(*lead, q.size(-2), v.size(-1)), q.new_zeros(*lead, q.size(-2), k.size(-2))
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def attention(q, k, v, mask=None):
    raise ValueError("attention is not ready")
""",
        ),
    ],
    "per_head_attention": [
        Mistake(
            "every head uses the first Dh columns",
            "own columns",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    B, T, D = x.shape
    Dh = D // n_heads
    q, k, v = (split_heads((x @ w[:, :Dh]).repeat(1, 1, n_heads), n_heads) for w in (w_q, w_k, w_v))
    return attention(q, k, v, mask)[0]
""",
            message=(
                "the heads share one projection: every head used the first Dh columns of w_q, w_k, w_v. Head h must "
                "use its own columns h*Dh:(h+1)*Dh: project with the full (D, D) matrix, then split"
            ),
        ),
        Mistake(
            "one (Dh, Dh) projection shared by all heads",
            "share one projection",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    Dh = x.shape[-1] // n_heads
    xs = split_heads(x, n_heads)
    q, k, v = (xs @ w[:Dh, :Dh] for w in (w_q, w_k, w_v))
    return attention(q, k, v, mask)[0]
""",
            message=(
                "the heads share one projection: split x first and one (Dh, Dh) projection for every head gives all "
                "heads the same weights. Project x with the full (D, D) matrices, then split, so head h uses columns "
                "h*Dh:(h+1)*Dh"
            ),
        ),
        Mistake(
            "one attention over the full width, split afterwards",
            "one attention pattern",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    out, _ = attention(x @ w_q, x @ w_k, x @ w_v, mask)
    return split_heads(out, n_heads)
""",
            message=(
                "all heads share one attention pattern: you attended over the full width D and split afterwards. "
                "Split q, k and v into heads, then attend within each head"
            ),
        ),
        Mistake(
            "projections applied as x @ w.T",
            "x @ w",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q, k, v = (split_heads(x @ w.T, n_heads) for w in (w_q, w_k, w_v))
    return attention(q, k, v, mask)[0]
""",
            message="apply the projections as x @ w (not x @ w.T)",
        ),
        Mistake(
            "queries and keys projected with each other's weights",
            "mixed up",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_k, w_q, w_v))
    return attention(q, k, v, mask)[0]
""",
            message="the queries, keys and values are mixed up: q comes from w_q, k from w_k, v from w_v",
        ),
        Mistake(
            "mask not passed on",
            "mask",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_q, w_k, w_v))
    return attention(q, k, v)[0]
""",
            message="pass the mask on to attention",
        ),
        (
            "returns (out, weights)",
            "only the heads' outputs",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_q, w_k, w_v))
    return attention(q, k, v, mask)
""",
        ),
        Mistake(
            "inline attention scaled by sqrt(D)",
            "sqrt(Dh)",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_q, w_k, w_v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(x.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
""",
            message="scale each head's scores by 1/sqrt(Dh), the head width, not 1/sqrt(D)",
        ),
        (
            "constant: returns zeros",
            "split into heads",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    B, T, D = x.shape
    return x.new_zeros(B, n_heads, T, D // n_heads)
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    raise ValueError("per_head_attention is not ready")
""",
        ),
    ],
}

VARIANTS = {
    "split_heads": [
        (
            "unflatten and permute",
            """
def split_heads(x, n_heads):
    if x.shape[-1] % n_heads != 0:
        raise ValueError("the model width must be a multiple of n_heads")
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)
""",
        ),
        (
            "a loop over heads with torch.stack",
            """
def split_heads(x, n_heads):
    D = x.shape[-1]
    if D % n_heads:
        raise ValueError(f"cannot split {D} features into {n_heads} heads")
    dh = D // n_heads
    return torch.stack([x[..., h * dh:(h + 1) * dh] for h in range(n_heads)], dim=1)
""",
        ),
    ],
    "merge_heads": [
        (
            "a loop over heads with torch.cat",
            """
def merge_heads(x):
    return torch.cat([x[:, h] for h in range(x.shape[1])], dim=-1)
""",
        ),
        (
            "permute, contiguous, view",
            """
def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.permute(0, 2, 1, 3).contiguous().view(B, T, -1)
""",
        ),
    ],
    "attention": [
        (
            "einsum, float64 inside, large negative fill",
            """
def attention(q, k, v, mask=None):
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = torch.einsum("...qd,...kd->...qk", q64, k64) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    w = scores.exp()
    w = w / w.sum(dim=-1, keepdim=True)
    return torch.einsum("...qk,...kd->...qd", w, v64).to(q.dtype), w.to(q.dtype)
""",
        ),
        (
            "matmul with a -inf tensor and torch.where",
            """
def attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    weights = scores.softmax(-1)
    return torch.matmul(weights, v), weights
""",
        ),
        (
            "q scaled before the product, logsumexp, a sum over keys",
            """
def attention(q, k, v, mask=None):
    scores = (q / math.sqrt(q.size(-1))).unsqueeze(-2).mul(k.unsqueeze(-3)).sum(-1)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = (scores - scores.logsumexp(dim=-1, keepdim=True)).exp()
    return (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2), weights
""",
        ),
    ],
    "per_head_attention": [
        (
            "a loop over heads with column slices",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    dh = x.shape[-1] // n_heads
    outs = []
    for h in range(n_heads):
        cols = slice(h * dh, (h + 1) * dh)
        m = mask
        if m is not None and m.ndim == 4:
            m = m[:, min(h, m.size(1) - 1)]
        outs.append(attention(x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols], m)[0])
    return torch.stack(outs, dim=1)
""",
        ),
        (
            "float64 inside, einsum over all heads at once",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    B, T, D = x.shape
    q, k, v = (torch.einsum("btd,dhe->bhte", x.double(), w.double().view(D, n_heads, D // n_heads))
               for w in (w_q, w_k, w_v))
    scores = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(D // n_heads)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(dim=-1) @ v).to(x.dtype)
""",
        ),
        (
            "einsum projections",
            """
def per_head_attention(x, w_q, w_k, w_v, n_heads, mask=None):
    q = split_heads(torch.einsum("btd,de->bte", x, w_q), n_heads)
    k = split_heads(torch.einsum("btd,de->bte", x, w_k), n_heads)
    v = split_heads(torch.einsum("btd,de->bte", x, w_v), n_heads)
    out, _ = attention(q, k, v, mask=mask)
    return out
""",
        ),
    ],
}
