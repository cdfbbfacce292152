"""Lesson 03 (multi-head attention): known mistakes and correct variants (see
autograder/lessons/<module>/mistakes.py)."""

import inspect
import textwrap

from autograder.checking.mistakes import Mistake, edited
from solutions import multi_head as _ref

# Each MultiHeadAttention mutant is the reference class with one change (old -> new, which must occur).
_MHA = textwrap.dedent(inspect.getsource(_ref.MultiHeadAttention))


def _mha(*changes):
    return edited(_MHA, *changes)


# load_torch_mha: what the check says of each mistake, one fixed string whichever parameter shows it
_CHUNK_ORDER = (
    "the chunk order is wrong: in_proj_weight stacks [W_q; W_k; W_v] (and in_proj_bias [b_q; b_k; b_v]), "
    "so q_proj gets rows 0:D, k_proj rows D:2D and v_proj rows 2D:3D"
)
_TRANSPOSED = (
    "nn.Linear and nn.MultiheadAttention both store a weight as (out_features, in_features): copy it as it "
    "is, not transposed"
)
_NO_BIASES = "the biases were not copied: in_proj_bias holds [b_q; b_k; b_v], and out_proj has its own bias"
_NO_OUT_PROJ = (
    "out_proj.weight was not copied into the module (copy in place, e.g. with .copy_(...) under torch.no_grad())"
)
_NOT_COPIED = (
    "it was not copied from torch_mha: copy each parameter into the module in place (param.copy_(...) "
    "under torch.no_grad())"
)


_LOAD = textwrap.dedent(inspect.getsource(_ref.load_torch_mha))


def _load_in_order(order):
    """The reference load_torch_mha reading the chunks of in_proj_weight (and in_proj_bias) as `order` (("k", "q", "v"):
    [W_k; W_q; W_v])."""
    return edited(
        _LOAD,
        (
            "projs = (module.q_proj, module.k_proj, module.v_proj)",
            f"projs = ({', '.join(f'module.{n}_proj' for n in order)})",
        ),
    )


_WRONG_BIASES = "the biases are counted wrongly: four projections, one (d_model,) bias each"

MUTANTS = {
    "concat_and_project": [
        Mistake(
            "merged without the transpose",
            "transpose",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.reshape(B, T, H * Dh) @ w_o
""",
            message=(
                "transpose the heads to (B, T, H, Dh) before merging: a reshape of (B, H, T, Dh) straight to "
                "(B, T, D) mixes time steps and heads"
            ),
        ),
        Mistake(
            "w_o applied transposed",
            "w_o.T",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * Dh) @ w_o.T
""",
            message="apply w_o as merged @ w_o (not w_o.T): here w_o is (D_in, D_out), not an nn.Linear weight",
        ),
        Mistake(
            "no projection",
            "projection is missing",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * Dh)
""",
            message="multiply the concatenated heads by w_o: the output projection is missing",
        ),
        Mistake(
            "heads interleaved",
            "in order",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.permute(0, 2, 3, 1).reshape(B, T, H * Dh) @ w_o
""",
            message=(
                "concatenate the heads in order: head h's features go to h*Dh:(h+1)*Dh (transpose(1, 2), not a "
                "permute that puts the heads last)"
            ),
        ),
        Mistake(
            "heads summed instead of concatenated",
            "own rows",
            """
def concat_and_project(heads, w_o):
    return heads.sum(dim=1) @ w_o[:heads.shape[-1]]
""",
            message=(
                "every head used the first Dh rows of w_o: concatenate the heads, so that head h meets its "
                "own rows h*Dh:(h+1)*Dh of w_o"
            ),
        ),
        (
            "constant: returns zeros",
            "concat(heads) @ w_o",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return heads.new_zeros(B, T, H * Dh)
""",
        ),
        (
            "constant: returns its input",
            "shape",
            """
def concat_and_project(heads, w_o):
    return heads
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def concat_and_project(heads, w_o):
    raise ValueError("concat_and_project is not ready")
""",
        ),
    ],
    "MultiHeadAttention": [
        Mistake(
            "value defaults to query",
            "value must default to key",
            _mha(("value = key if value is None else value", "value = query if value is None else value")),
            message=(
                "value must default to key, not to query: mha(x, memory) attends to memory and reads its "
                "values from memory"
            ),
        ),
        (
            "keys and values split with the query length Tq",
            "own length",
            _mha(("view(t.size(0), t.size(1), self.n_heads", "view(B, Tq, self.n_heads")),
        ),
        (
            "weights averaged over heads",
            "average",
            _mha(
                (
                    "return (out, weights) if need_weights else out",
                    "return (out, weights.mean(dim=1)) if need_weights else out",
                )
            ),
        ),
        (
            "bias argument ignored in __init__",
            "bias=False",
            _mha(
                *[
                    (f"self.{p} = nn.Linear(d_model, d_model, bias=bias)", f"self.{p} = nn.Linear(d_model, d_model)")
                    for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                ]
            ),
        ),
        Mistake(
            "biases ignored in forward",
            "bias",
            _mha(
                ("proj(t).view(", "F.linear(t, proj.weight).view("),
                (
                    "out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, self.d_model))",
                    "out = F.linear(out.transpose(1, 2).reshape(B, Tq, self.d_model), self.out_proj.weight)",
                ),
            ),
            message=(
                "the biases of the projections are ignored: call the nn.Linear layers (self.q_proj(x), ...), "
                "which add their bias"
            ),
        ),
        Mistake(
            "scaled by sqrt(d_model)",
            "head_dim",
            _mha(
                (
                    "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)",
                    "scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)",
                ),
                (
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(self.d_model))",
                ),
            ),
            message="scale each head's scores by 1/sqrt(head_dim), not 1/sqrt(d_model)",
        ),
        (
            "scaled by sqrt(d_model) in the explicit path only",
            "head_dim",
            _mha(
                (
                    "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)",
                    "scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)",
                )
            ),
        ),
        Mistake(
            "mask inverted (nn.MultiheadAttention's convention)",
            "may attend",
            _mha(
                (
                    'scores = scores.masked_fill(~mask, float("-inf"))',
                    'scores = scores.masked_fill(mask, float("-inf"))',
                ),
                (
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else ~mask)",
                ),
            ),
            message=(
                "True in the mask means 'may attend' (the opposite of nn.MultiheadAttention's boolean "
                "attn_mask): you hid the allowed keys instead"
            ),
        ),
        (
            "key argument ignored: always attends to the query",
            "cross-attention",
            _mha(("key = query if key is None else key", "key = query")),
        ),
        (
            "mask ignored",
            "mask",
            _mha(
                ('scores = scores.masked_fill(~mask, float("-inf"))', "pass"),
                (
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                    "out = F.scaled_dot_product_attention(q, k, v)",
                ),
            ),
        ),
        ("need_weights ignored", "pair", _mha(("return (out, weights) if need_weights else out", "return out"))),
        (
            "always returns a pair",
            "only out",
            _mha(("return (out, weights) if need_weights else out", "return (out, weights if need_weights else None)")),
        ),
        ("no ValueError for d_model % n_heads", "ValueError", _mha(("if d_model % n_heads:", "if False:"))),
        Mistake(
            "no output projection",
            "out_proj",
            _mha(
                (
                    "out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, self.d_model))",
                    "out = out.transpose(1, 2).reshape(B, Tq, self.d_model)",
                )
            ),
            message="the output projection out_proj is missing",
        ),
        Mistake(
            "heads merged without the transpose",
            "transpose",
            _mha(
                (
                    "out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, self.d_model))",
                    "out = self.out_proj(out.reshape(B, Tq, self.d_model))",
                )
            ),
            message="transpose the heads back to (B, Tq, H, head_dim) before merging them",
        ),
        (
            "head_dim a float",
            "head_dim",
            _mha(
                (
                    "self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads",
                    "self.d_model, self.n_heads, self._dh = d_model, n_heads, d_model // n_heads\n"
                    "        self.head_dim = d_model / n_heads",
                )
            ),
        ),
        ("constant: raises ValueError for every input", "ValueError", _mha(("if d_model % n_heads:", "if True:"))),
        (
            "constant: forward returns zeros",
            "softmax(q_h k_h^T / sqrt(head_dim))",
            _mha(
                (
                    "key = query if key is None else key",
                    "if need_weights:\n"
                    "            return torch.zeros_like(query), query.new_zeros(\n"
                    "                query.size(0), self.n_heads, query.size(1),\n"
                    "                (query if key is None else key).size(1),\n"
                    "            )\n"
                    "        return torch.zeros_like(query)",
                )
            ),
        ),
    ],
    "load_torch_mha": [
        Mistake(
            "q/k/v chunk order k, q, v",
            "chunk order",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        w_k, w_q, w_v = torch_mha.in_proj_weight.chunk(3)
        module.q_proj.weight.copy_(w_q); module.k_proj.weight.copy_(w_k); module.v_proj.weight.copy_(w_v)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.in_proj_bias is not None:
            b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
            module.q_proj.bias.copy_(b_q); module.k_proj.bias.copy_(b_k); module.v_proj.bias.copy_(b_v)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module
""",
            message=_CHUNK_ORDER,
            aspect="weights",
        ),
        # the other wrong orders: each projection can be given each other chunk
        *(
            Mistake(
                f"q/k/v chunk order {', '.join(order)}",
                "chunk order",
                _load_in_order(order),
                message=_CHUNK_ORDER,
                aspect="weights",
            )
            for order in (("q", "v", "k"), ("v", "k", "q"), ("k", "v", "q"), ("v", "q", "k"))
        ),
        Mistake(
            "biases not copied",
            "biases were not copied",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
    return module
""",
            message=_NO_BIASES,
            aspect="biases",
        ),
        Mistake(
            "out_proj bias not copied",
            "biases were not copied",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
    return module
""",
            message=_NO_BIASES,
            aspect="biases",
        ),
        Mistake(
            "weights transposed",
            "transposed",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w.T)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight.T)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module
""",
            message=_TRANSPOSED,
            aspect="weights",
        ),
        Mistake(
            "out_proj not copied",
            "out_proj.weight was not copied",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module
""",
            message=_NO_OUT_PROJ,
            aspect="weights",
        ),
        (
            "new nn.Parameters, and torch_mha's own out_proj.weight shared",
            "in place",
            """
def load_torch_mha(module, torch_mha):
    for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.detach().chunk(3)):
        proj.weight = nn.Parameter(w.clone())
    module.out_proj.weight = torch_mha.out_proj.weight
    if torch_mha.in_proj_bias is not None:
        for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.detach().chunk(3)):
            proj.bias = nn.Parameter(b.clone())
        module.out_proj.bias = nn.Parameter(torch_mha.out_proj.bias.detach().clone())
    return module
""",
        ),
        (
            "new nn.Parameters holding copies",
            "in place",
            """
def load_torch_mha(module, torch_mha):
    for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.detach().chunk(3)):
        proj.weight = nn.Parameter(w.clone())
    module.out_proj.weight = nn.Parameter(torch_mha.out_proj.weight.detach().clone())
    if torch_mha.in_proj_bias is not None:
        for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.detach().chunk(3)):
            proj.bias = nn.Parameter(b.clone())
        module.out_proj.bias = nn.Parameter(torch_mha.out_proj.bias.detach().clone())
    return module
""",
        ),
        (
            "views of torch_mha's in_proj_weight assigned through .data (storage shared)",
            "in place",
            """
def load_torch_mha(module, torch_mha):
    D = torch_mha.embed_dim
    for i, proj in enumerate((module.q_proj, module.k_proj, module.v_proj)):
        proj.weight.data = torch_mha.in_proj_weight.data[i * D:(i + 1) * D]
        if torch_mha.in_proj_bias is not None:
            proj.bias.data = torch_mha.in_proj_bias.data[i * D:(i + 1) * D]
    module.out_proj.weight.data = torch_mha.out_proj.weight.data
    if torch_mha.out_proj.bias is not None:
        module.out_proj.bias.data = torch_mha.out_proj.bias.data
    return module
""",
        ),
        (
            "returns nothing",
            "return the module",
            """
def load_torch_mha(module, torch_mha):
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
""",
        ),
        (
            "builds a new module instead of copying in place",
            "in place",
            """
def load_torch_mha(module, torch_mha):
    import copy
    module = copy.deepcopy(module)
    with torch.no_grad():
        for proj, w in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.in_proj_bias is not None:
            for proj, b in zip((module.q_proj, module.k_proj, module.v_proj), torch_mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module
""",
        ),
        Mistake(
            "constant: returns the module unchanged",
            "was not copied",
            """
def load_torch_mha(module, torch_mha):
    return module
""",
            message=_NOT_COPIED,
            aspect="weights",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def load_torch_mha(module, torch_mha):
    raise ValueError("load_torch_mha is not ready")
""",
        ),
    ],
    "mha_param_count": [
        # first: with bias left out it counts what "biases forgotten" counts, and says why
        Mistake(
            "bias defaults to False",
            "biases",
            """
def mha_param_count(d_model, n_heads, bias=False):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
""",
            aspect="count",
            message="bias defaults to True: count the biases",
        ),
        Mistake(
            "biases forgotten",
            "biases",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model
""",
            aspect="count",
            message="count the biases too: each of the four projections has a (d_model,) bias",
        ),
        Mistake(
            "biases counted even when bias=False",
            "bias=False",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + 4 * d_model
""",
            aspect="bias=False",
            message="with bias=False there are no biases to count",
        ),
        Mistake(
            "one bias per head",
            "per head",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (4 * n_heads if bias else 0)
""",
            aspect="count",
            message="each projection has one bias of d_model numbers, not one bias per head",
        ),
        Mistake(
            "output projection's bias forgotten",
            "biases are counted wrongly",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (3 * d_model if bias else 0)
""",
            aspect="count",
            message=_WRONG_BIASES,
        ),
        Mistake(
            "one bias for all four projections",
            "d_model",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (d_model if bias else 0)
""",
            aspect="count",
            message=_WRONG_BIASES,
        ),
        Mistake(
            "two biases per projection",
            "biases are counted wrongly",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 4 * d_model * d_model + (8 * d_model if bias else 0)
""",
            aspect="count",
            message=_WRONG_BIASES,
        ),
        Mistake(
            "output projection forgotten",
            "out_proj",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return 3 * d_model * d_model + (3 * d_model if bias else 0)
""",
            aspect="count",
            message="count all four projections: q, k, v and the output projection out_proj",
        ),
        Mistake(
            "(Dh, Dh) per head",
            "head_dim",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    head_dim = d_model // n_heads
    return 4 * n_heads * head_dim * head_dim + (4 * d_model if bias else 0)
""",
            aspect="count",
            message=(
                "each head's projections are (d_model, head_dim), not (head_dim, head_dim): together the heads have "
                "(d_model, d_model) weights per projection, whatever n_heads is"
            ),
        ),
        (
            "no ValueError",
            "ValueError",
            """
def mha_param_count(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
""",
        ),
        (
            "returns a float",
            "int",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    head_dim = d_model / n_heads
    return 4 * d_model * head_dim * n_heads + (4 * d_model if bias else 0)
""",
        ),
        (
            "constant: returns 0",
            "right count",
            """
def mha_param_count(d_model, n_heads, bias=True):
    return 0
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            """
def mha_param_count(d_model, n_heads, bias=True):
    raise ValueError("mha_param_count is not ready")
""",
        ),
    ],
}

VARIANTS = {
    "concat_and_project": [
        (
            "sum over heads of each head's rows of w_o",
            """
def concat_and_project(heads, w_o):
    H, Dh = heads.shape[1], heads.shape[-1]
    return sum(heads[:, h] @ w_o[h * Dh:(h + 1) * Dh] for h in range(H))
""",
        ),
        (
            "float64 inside, heads written through their own rows of w_o",
            """
def concat_and_project(heads, w_o):
    H, Dh = heads.shape[1], heads.shape[-1]
    out = sum(heads[:, h].double() @ w_o[h * Dh:(h + 1) * Dh].double() for h in range(H))
    return out.to(heads.dtype)
""",
        ),
        (
            "einsum over (h, d)",
            """
def concat_and_project(heads, w_o):
    B, H, T, Dh = heads.shape
    return torch.einsum("bhtd,hdo->bto", heads, w_o.reshape(H, Dh, -1))
""",
        ),
    ],
    "MultiHeadAttention": [
        (
            "a loop over heads with einsum",
            """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError("d_model must be divisible by n_heads")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias)
        self.k_proj = nn.Linear(d_model, d_model, bias)
        self.v_proj = nn.Linear(d_model, d_model, bias)
        self.out_proj = nn.Linear(d_model, d_model, bias)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):
        if key is None:
            key = query
        if value is None:
            value = key
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        outs, weights = [], []
        for h in range(self.n_heads):
            cols = slice(h * self.head_dim, (h + 1) * self.head_dim)
            s = torch.einsum("bqd,bkd->bqk", q[..., cols], k[..., cols]) / math.sqrt(self.head_dim)
            if mask is not None:
                m = mask[:, min(h, mask.size(1) - 1)] if mask.dim() == 4 else mask
                s = s.masked_fill(~m, float("-inf"))
            w = s.softmax(dim=-1)
            outs.append(torch.einsum("bqk,bkd->bqd", w, v[..., cols]))
            weights.append(w)
        out = self.out_proj(torch.cat(outs, dim=-1))
        if need_weights:
            return out, torch.stack(weights, dim=1)
        return out
""",
        ),
        (
            "the scale folded into the queries, fused kernel for the output, weights by einsum",
            """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4)
        )

    def _heads(self, t):
        return t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):
        key = query if key is None else key
        value = key if value is None else value
        q = self._heads(self.q_proj(query) * self.head_dim ** -0.5)
        k, v = self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        if need_weights:
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)
            out = torch.einsum("bhqk,bhkd->bhqd", weights, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        out = self.out_proj(out.transpose(1, 2).flatten(2))
        return (out, weights) if need_weights else out
""",
        ),
        (
            "float64 inside, always the explicit path",
            """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"{d_model} % {n_heads} != 0")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=bias))

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):
        key = query if key is None else key
        value = key if value is None else value
        B, Tq, D = query.shape
        heads = lambda t: t.double().unflatten(-1, (self.n_heads, self.head_dim)).permute(0, 2, 1, 3)
        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5
        if mask is not None:
            scores = torch.where(mask, scores, torch.finfo(torch.float64).min)
        w = torch.softmax(scores, dim=-1)
        out = self.out_proj((w @ v).permute(0, 2, 1, 3).reshape(B, Tq, D).to(query.dtype))
        return (out, w.to(query.dtype)) if need_weights else out
""",
        ),
    ],
    "load_torch_mha": [
        (
            "load_state_dict with a renamed copy",
            """
def load_torch_mha(module, torch_mha):
    sd = torch_mha.state_dict()
    new = {}
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        new[f"{name}.weight"] = sd["in_proj_weight"].split(module.d_model)[i]
        if "in_proj_bias" in sd:
            new[f"{name}.bias"] = sd["in_proj_bias"].split(module.d_model)[i]
    new["out_proj.weight"] = sd["out_proj.weight"]
    if "out_proj.bias" in sd:
        new["out_proj.bias"] = sd["out_proj.bias"]
    module.load_state_dict(new)
    return module
""",
        ),
        (
            "slices assigned through .data",
            """
def load_torch_mha(module, torch_mha):
    D = torch_mha.embed_dim
    for i, proj in enumerate([module.q_proj, module.k_proj, module.v_proj]):
        proj.weight.data = torch_mha.in_proj_weight.data[i * D:(i + 1) * D].clone()
        if torch_mha.in_proj_bias is not None:
            proj.bias.data = torch_mha.in_proj_bias.data[i * D:(i + 1) * D].clone()
    module.out_proj.weight.data = torch_mha.out_proj.weight.data.clone()
    if torch_mha.out_proj.bias is not None:
        module.out_proj.bias.data = torch_mha.out_proj.bias.data.clone()
    return module
""",
        ),
    ],
    "mha_param_count": [
        (
            "counted from nn.Linear layers on the meta device",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads != 0:
        raise ValueError("d_model must be a multiple of n_heads")
    layers = [nn.Linear(d_model, d_model, bias=bias, device="meta") for _ in range(4)]
    return sum(p.numel() for layer in layers for p in layer.parameters())
""",
        ),
        (
            "per head, then summed",
            """
def mha_param_count(d_model, n_heads, bias=True):
    if d_model % n_heads:
        raise ValueError("bad sizes")
    head_dim = d_model // n_heads
    per_head = 3 * d_model * head_dim + head_dim * d_model
    return n_heads * per_head + (4 * d_model if bias else 0)
""",
        ),
    ],
}
