"""Lesson 04 (grouped-query attention): known mistakes and correct variants (see
autograder/lessons/<module>/mistakes.py)."""

from autograder.checking.mistakes import Mistake, edited

_GQA = """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D))
"""


def gqa(*replacements):
    """The correct class with (old, new) text replacements: one mistake each."""
    return edited(_GQA, *replacements)


_MHA_TO_GQA = """
def mha_to_gqa(mha, n_kv_heads):
    D, H, Dh = mha.d_model, mha.n_heads, mha.head_dim
    bias = mha.q_proj.bias is not None
    gqa = GroupedQueryAttention(D, H, n_kv_heads, bias=bias).to(mha.q_proj.weight)
    n_rep = H // n_kv_heads

    def pool(t):
        return t.reshape(n_kv_heads, n_rep, Dh, *t.shape[1:]).mean(1).reshape(n_kv_heads * Dh, *t.shape[1:])

    with torch.no_grad():
        gqa.q_proj.weight.copy_(mha.q_proj.weight)
        gqa.out_proj.weight.copy_(mha.out_proj.weight)
        gqa.k_proj.weight.copy_(pool(mha.k_proj.weight))
        gqa.v_proj.weight.copy_(pool(mha.v_proj.weight))
        if bias:
            gqa.q_proj.bias.copy_(mha.q_proj.bias)
            gqa.out_proj.bias.copy_(mha.out_proj.bias)
            gqa.k_proj.bias.copy_(pool(mha.k_proj.bias))
            gqa.v_proj.bias.copy_(pool(mha.v_proj.bias))
    return gqa
"""


def to_gqa(*replacements):
    return edited(_MHA_TO_GQA, *replacements)


_KV = """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
"""

MUTANTS = {
    "repeat_kv": [
        (
            "constant: returns its input",
            "shape",
            """
def repeat_kv(x, n_rep):
    return x
""",
        ),
        Mistake(
            "tiled with .repeat",
            "tiled",
            """
def repeat_kv(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)
""",
            message=(
                "you tiled the heads (h0, h1, h0, h1, ...), as .repeat does. Key/value head j must serve the "
                "adjacent query heads j*n_rep ... (j+1)*n_rep - 1, so repeat each head in place (h0, h0, h1, h1, ...): "
                "repeat_interleave along dim 1, or expand a new axis after the head axis and reshape"
            ),
        ),
        Mistake(
            "repeated along the time axis",
            "head axis",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=2)
""",
            message="repeat along the head axis (dim 1), not the time axis",
        ),
        Mistake(
            "repeated along the feature axis",
            "head axis",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=3)
""",
            message="repeat along the head axis (dim 1), not the feature axis",
        ),
        Mistake(
            "repeated along the batch axis",
            "head axis",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=0)
""",
            message="repeat along the head axis (dim 1), not the batch axis",
        ),
        (
            "time and feature axes swapped inside (right only when T or Dh is 1)",
            "h // n_rep",
            """
def repeat_kv(x, n_rep):
    B, Hkv, T, Dh = x.shape
    return x[:, :, None].expand(B, Hkv, n_rep, T, Dh).transpose(3, 4).reshape(B, Hkv * n_rep, T, Dh)
""",
        ),
        Mistake(
            "expanded but not merged",
            "reshape",
            """
def repeat_kv(x, n_rep):
    return x[:, :, None].expand(-1, -1, n_rep, -1, -1)
""",
            message="merge the repeat axis into the head axis: reshape (B, Hkv, n_rep, T, Dh) to (B, Hkv*n_rep, T, Dh)",
        ),
        Mistake(
            "repeat_interleave without dim (flattens x)",
            "flat",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep)
""",
            message="torch.repeat_interleave without dim flattens x into one flat vector: pass dim=1, the head axis",
        ),
        (
            "tiled by concatenation",
            "tiled",
            """
def repeat_kv(x, n_rep):
    return torch.cat([x] * n_rep, dim=1)
""",
        ),
        (
            "float32 inside",
            "dtype",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x.float(), n_rep, dim=1)
""",
        ),
    ],
    "GroupedQueryAttention": [
        (
            "constant: forward returns zeros",
            "differs",
            gqa(("        B, T, D = x.shape\n", "        return torch.zeros_like(x)\n")),
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            gqa(("        if d_model % n_heads or n_heads % n_kv_heads:\n", "        if True:\n")),
        ),
        (
            "k_proj and v_proj sized D -> D",
            "D -> D",
            gqa(
                (
                    "self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)",
                    "self.k_proj = nn.Linear(d_model, d_model, bias=bias)",
                ),
                (
                    "self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)",
                    "self.v_proj = nn.Linear(d_model, d_model, bias=bias)",
                ),
                (
                    "k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)",
                    "k = self.k_proj(x).view(B, T, self.n_heads, self.head_dim)"
                    "[:, :, ::self.n_heads // self.n_kv_heads]",
                ),
                (
                    "v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)",
                    "v = self.v_proj(x).view(B, T, self.n_heads, self.head_dim)"
                    "[:, :, ::self.n_heads // self.n_kv_heads]",
                ),
            ),
        ),
        (
            "no ValueError when n_heads % n_kv_heads != 0",
            "n_heads % n_kv_heads",
            gqa(("if d_model % n_heads or n_heads % n_kv_heads:", "if d_model % n_heads:")),
        ),
        (
            "no ValueError when d_model % n_heads != 0",
            "d_model % n_heads",
            gqa(("if d_model % n_heads or n_heads % n_kv_heads:", "if n_heads % n_kv_heads:")),
        ),
        Mistake(
            "not causal when mask is None",
            "causal",
            gqa(("is_causal=mask is None", "is_causal=False")),
            message=(
                "with mask=None the layer must be causal: query i may see keys 0..i only "
                "(is_causal=True, or a lower-triangular boolean mask)"
            ),
        ),
        Mistake(
            "a float 0/1 causal mask (added to the scores: hides nothing)",
            "float",
            gqa(
                (
                    "attn_mask=mask, is_causal=mask is None",
                    "attn_mask=torch.ones(T, T).tril() if mask is None else mask",
                )
            ),
            message=(
                "the causal mask is a float tensor of 0s and 1s: scaled_dot_product_attention adds a float mask to "
                "the scores, so it hides nothing; build it as bool (dtype=torch.bool), True = may attend"
            ),
        ),
        Mistake(
            "the keys to hide marked True: triu(diagonal=1) as the causal mask",
            "may attend",
            gqa(
                (
                    "attn_mask=mask, is_causal=mask is None",
                    "attn_mask=torch.ones(T, T, dtype=torch.bool).triu(diagonal=1) if mask is None else mask",
                )
            ),
            message=(
                "the causal mask marks the keys to hide: True in a mask means 'may attend', so token i's row is "
                "True at keys 0..i (tril()), not at the later keys (triu(diagonal=1))"
            ),
        ),
        Mistake(
            "a given mask ignored",
            "ignored",
            gqa(("attn_mask=mask, is_causal=mask is None", "is_causal=True")),
            message="a given mask must be used: you ignored it and kept the causal mask",
        ),
        Mistake(
            "a given mask combined with the causal mask",
            "replaces",
            gqa(
                (
                    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)",
                    "causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()\n"
                    "        mask = causal if mask is None else mask & causal\n"
                    "        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                )
            ),
            message="a given mask replaces the causal mask: you applied both",
        ),
        Mistake(
            "inverted mask",
            "may attend",
            gqa(("attn_mask=mask, is_causal", "attn_mask=None if mask is None else ~mask, is_causal")),
            message="True in the mask means 'may attend': you hid the allowed keys instead",
        ),
        Mistake(
            "key/value heads tiled in forward",
            "h // n_rep",
            gqa(
                (
                    "k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)",
                    "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)",
                )
            ),
            message=(
                "query head h must use key/value head h // n_rep (adjacent query heads share a key/value "
                "head); yours used head h % n_kv_heads, as tiling with .repeat does: use repeat_kv"
            ),
        ),
        (
            "key/value heads never repeated (no repeat_kv)",
            "RuntimeError",
            gqa(("k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)", "pass")),
        ),
        ("bias defaults to True", "defaults to False", gqa(("n_kv_heads, bias=False):", "n_kv_heads, bias=True):"))),
        Mistake(
            "scaled by 1/sqrt(d_model)",
            "1/sqrt(head_dim)",
            gqa(("is_causal=mask is None)", "is_causal=mask is None, scale=D ** -0.5)")),
            message="scale the scores by 1/sqrt(head_dim), the width of one head, not 1/sqrt(d_model)",
        ),
        Mistake(
            "scores not scaled",
            "1/sqrt(head_dim)",
            gqa(("is_causal=mask is None)", "is_causal=mask is None, scale=1.0)")),
            message="scale the scores by 1/sqrt(head_dim); they are not scaled",
        ),
        Mistake(
            "out_proj left out",
            "out_proj",
            gqa(
                (
                    "return self.out_proj(out.transpose(1, 2).reshape(B, T, D))",
                    "return out.transpose(1, 2).reshape(B, T, D)",
                )
            ),
            message="apply out_proj to the merged heads",
        ),
        Mistake(
            "a given mask ignored: causal only when mask is None",
            "ignored",
            gqa(("attn_mask=mask, is_causal=mask is None", "is_causal=mask is None")),
            message="a given mask must be used: you ignored it",
        ),
        Mistake(
            "heads merged without the transpose",
            "transpose",
            gqa(("out.transpose(1, 2).reshape(B, T, D)", "out.reshape(B, T, D)")),
            message=(
                "merge the heads back in order: transpose (B, H, T, Dh) to (B, T, H, Dh) before reshaping to (B, T, D)"
            ),
        ),
        Mistake(
            "queries and keys split into heads without the transpose",
            "transpose",
            gqa(
                (
                    "q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)",
                    "q = self.q_proj(x).view(B, self.n_heads, T, self.head_dim)",
                ),
                (
                    "k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)",
                    "k = self.k_proj(x).view(B, self.n_kv_heads, T, self.head_dim)",
                ),
            ),
            message=(
                "split q and k into heads with .view(B, T, n, head_dim).transpose(1, 2): a view straight to "
                "(B, n, T, head_dim) mixes tokens and features"
            ),
        ),
        Mistake(
            "values split into heads without the transpose",
            "transpose",
            gqa(
                (
                    "v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)",
                    "v = self.v_proj(x).view(B, self.n_kv_heads, T, self.head_dim)",
                )
            ),
            message=(
                "split the values into heads with .view(B, T, n_kv_heads, head_dim).transpose(1, 2): a view "
                "straight to (B, n_kv_heads, T, head_dim) mixes tokens and features"
            ),
        ),
        ("no n_kv_heads attribute", "n_kv_heads", gqa(("self.n_kv_heads", "self.n_kv"))),
    ],
    "mha_to_gqa": [
        (
            "constant: returns its input",
            "n_kv_heads",
            """
def mha_to_gqa(mha, n_kv_heads):
    return mha
""",
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            """
def mha_to_gqa(mha, n_kv_heads):
    raise ValueError(f"cannot convert to {n_kv_heads} key/value heads")
""",
        ),
        (
            "q_proj and out_proj shared with mha, not copied",
            "shares",
            to_gqa(
                (
                    "        gqa.q_proj.weight.copy_(mha.q_proj.weight)\n"
                    "        gqa.out_proj.weight.copy_(mha.out_proj.weight)\n",
                    "        gqa.q_proj, gqa.out_proj = mha.q_proj, mha.out_proj\n",
                ),
                (
                    "            gqa.q_proj.bias.copy_(mha.q_proj.bias)\n"
                    "            gqa.out_proj.bias.copy_(mha.out_proj.bias)\n",
                    "",
                ),
            ),
        ),
        (
            "mha's parameter tensors assigned through .data",
            "shares",
            to_gqa(
                ("gqa.q_proj.weight.copy_(mha.q_proj.weight)", "gqa.q_proj.weight.data = mha.q_proj.weight.data"),
                (
                    "gqa.out_proj.weight.copy_(mha.out_proj.weight)",
                    "gqa.out_proj.weight.data = mha.out_proj.weight.data",
                ),
            ),
        ),
        Mistake(
            "first head instead of the mean",
            "first head",
            to_gqa((".mean(1).reshape(n_kv_heads * Dh", "[:, 0].reshape(n_kv_heads * Dh")),
            message=(
                "you kept the first head of each group. Average (mean-pool) the group's heads instead: the mean is "
                "the single head closest to all of them, and the GQA paper found it the best start for uptraining"
            ),
        ),
        Mistake(
            "pooled over the wrong axis (strided groups)",
            "wrong axis",
            to_gqa(
                (
                    "t.reshape(n_kv_heads, n_rep, Dh, *t.shape[1:]).mean(1)",
                    "t.reshape(n_rep, n_kv_heads, Dh, *t.shape[1:]).mean(0)",
                )
            ),
            message=(
                "you pooled over the wrong axis: group j is the adjacent heads j*n_rep ... (j+1)*n_rep - 1, not "
                "every n_kv_heads-th head. View the rows as (n_kv_heads, n_rep, head_dim, ...) and average over n_rep"
            ),
        ),
        (
            "pooled over the wrong axis (mean over the group axis of the wrong view)",
            "wrong axis",
            to_gqa(
                (
                    "t.reshape(n_kv_heads, n_rep, Dh, *t.shape[1:]).mean(1)",
                    "t.reshape(n_kv_heads, n_rep, Dh, *t.shape[1:]).mean(0)",
                )
            ),
        ),
        Mistake(
            "pooled rows inside a head",
            "wrong axis",
            to_gqa(
                (
                    "return t.reshape(n_kv_heads, n_rep, Dh, *t.shape[1:]).mean(1)"
                    ".reshape(n_kv_heads * Dh, *t.shape[1:])",
                    "return t.reshape(n_kv_heads * Dh, n_rep, *t.shape[1:]).mean(1)",
                )
            ),
            message=(
                "you pooled over the wrong axis, mixing features inside a head: rows h*head_dim:(h+1)*head_dim "
                "belong to head h. View the rows as (n_kv_heads, n_rep, head_dim, ...) and average over n_rep"
            ),
        ),
        (
            "biases dropped",
            "dropped the biases",
            to_gqa(
                (
                    "gqa = GroupedQueryAttention(D, H, n_kv_heads, bias=bias)",
                    "gqa = GroupedQueryAttention(D, H, n_kv_heads)",
                ),
                ("        if bias:\n", "        if False:\n"),
            ),
        ),
        Mistake(
            "summed instead of averaged",
            "mean",
            to_gqa((".mean(1).reshape", ".sum(1).reshape")),
            message="average the heads of each group (mean), do not sum them",
        ),
        Mistake(
            "keys and values swapped",
            "swapped",
            to_gqa(
                (
                    "gqa.k_proj.weight.copy_(pool(mha.k_proj.weight))",
                    "gqa.k_proj.weight.copy_(pool(mha.v_proj.weight))",
                ),
                (
                    "gqa.v_proj.weight.copy_(pool(mha.v_proj.weight))",
                    "gqa.v_proj.weight.copy_(pool(mha.k_proj.weight))",
                ),
                ("gqa.k_proj.bias.copy_(pool(mha.k_proj.bias))", "gqa.k_proj.bias.copy_(pool(mha.v_proj.bias))"),
                ("gqa.v_proj.bias.copy_(pool(mha.v_proj.bias))", "gqa.v_proj.bias.copy_(pool(mha.k_proj.bias))"),
            ),
            message="you swapped keys and values: pool k_proj from mha.k_proj and v_proj from mha.v_proj",
        ),
        ("dtype not kept", "dtype", to_gqa((".to(mha.q_proj.weight)", ""))),
        ("q_proj not copied", "q_proj", to_gqa(("gqa.q_proj.weight.copy_(mha.q_proj.weight)", "pass"))),
        (
            "mha changed in place",
            "changed mha",
            to_gqa(("    return gqa\n", "        mha.k_proj.weight.zero_()\n    return gqa\n")),
        ),
    ],
    "kv_cache_bytes": [
        (
            "constant: returns 0",
            "right count",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 0
""",
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    raise ValueError("unknown model")
""",
        ),
        Mistake(
            "keys only (factor 2 forgotten)",
            "2 tensors",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
""",
            message="keys and values are 2 tensors: every layer caches both",
        ),
        Mistake(
            "bytes per element ignored",
            "bytes_per_element",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size
""",
            message="multiply by bytes_per_element: the cache size is in bytes, not in numbers",
        ),
        Mistake(
            "batch ignored",
            "batch_size",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * bytes_per_element
""",
            message="multiply by batch_size: every sequence of the batch has its own cache",
        ),
        Mistake(
            "layers ignored",
            "n_layers",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
""",
            message="multiply by n_layers: every layer has its own cache",
        ),
        Mistake(
            "bits, not bytes",
            "bits",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element * 8
""",
            message="count bytes, not bits",
        ),
        Mistake(
            "wrong default bytes_per_element",
            "defaults",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=4):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
""",
            message="the defaults are batch_size=1 and bytes_per_element=2 (float16/bfloat16)",
        ),
        (
            "a float result",
            "int",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2.0 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element
""",
        ),
        (
            "a numpy integer",
            "int",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return np.prod([2, n_layers, n_kv_heads, head_dim, seq_len, batch_size, bytes_per_element])
""",
        ),
    ],
}

VARIANTS = {
    "repeat_kv": [
        (
            "repeat_interleave",
            """
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)
""",
        ),
        (
            "index_select with h // n_rep",
            """
def repeat_kv(x, n_rep):
    index = torch.arange(x.size(1) * n_rep, device=x.device) // n_rep
    return x.index_select(1, index)
""",
        ),
        (
            "a loop over heads",
            """
def repeat_kv(x, n_rep):
    heads = []
    for j in range(x.shape[1]):
        for _ in range(n_rep):
            heads.append(x[:, j])
    return torch.stack(heads, dim=1)
""",
        ),
    ],
    "GroupedQueryAttention": [
        (
            "einsum over groups, no repeat_kv, float masks, float64 inside",
            """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        G, R, Dh = self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim
        q = self.q_proj(x).reshape(B, T, G, R, Dh).double()
        k = self.k_proj(x).reshape(B, T, G, Dh).double()
        v = self.v_proj(x).reshape(B, T, G, Dh).double()
        scores = torch.einsum("bqgrd,bkgd->bgrqk", q, k) / Dh ** 0.5
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        mask = mask.expand(B, self.n_heads, T, T).reshape(B, G, R, T, T)
        scores = scores + torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bgrqk,bkgd->bqgrd", weights, v).reshape(B, T, D).to(x.dtype)
        return self.out_proj(out)
""",
        ),
        (
            "manual attention per head with repeat_kv and masked_fill",
            """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("bad sizes")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias)
        self.out_proj = nn.Linear(d_model, d_model, bias)

    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        split = lambda t, n: t.unflatten(-1, (n, self.head_dim)).permute(0, 2, 1, 3)
        q = split(self.q_proj(x), self.n_heads)
        k = repeat_kv(split(self.k_proj(x), self.n_kv_heads), self.n_heads // self.n_kv_heads)
        v = repeat_kv(split(self.v_proj(x), self.n_kv_heads), self.n_heads // self.n_kv_heads)
        scores = q @ k.transpose(-1, -2) * self.head_dim ** -0.5
        if mask is None:
            mask = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.out_proj(out.permute(0, 2, 1, 3).flatten(2))
""",
        ),
        (
            "a registered causal-mask buffer (nanoGPT style) and enable_gqa",
            """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"cannot split d_model={d_model} into {n_heads} heads in {n_kv_heads} groups")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.register_buffer("causal", torch.ones(64, 64, dtype=torch.bool).tril())

    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        if mask is None:
            mask = self.causal[:T, :T]
        q = self.q_proj(x).unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_proj(x).unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.out_proj(out.transpose(1, 2).flatten(2))
""",
        ),
        (
            "a loop over query heads in float32, each with its key/value head h // n_rep, masked_fill",
            """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads} do not divide")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        Dh, n_rep = self.head_dim, self.n_heads // self.n_kv_heads
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        mask = mask.expand(B, self.n_heads, T, T)
        heads = []
        for h in range(self.n_heads):
            j = h // n_rep
            qh, kh, vh = q[..., h * Dh:(h + 1) * Dh], k[..., j * Dh:(j + 1) * Dh], v[..., j * Dh:(j + 1) * Dh]
            scores = (qh / Dh ** 0.5) @ kh.transpose(1, 2)
            weights = scores.masked_fill(~mask[:, h], float("-inf")).softmax(dim=-1)
            heads.append(weights @ vh)
        return self.out_proj(torch.cat(heads, dim=-1))
""",
        ),
    ],
    "mha_to_gqa": [
        (
            "a loop over groups and load_state_dict",
            """
def mha_to_gqa(mha, n_kv_heads):
    has_bias = mha.k_proj.bias is not None
    n_rep, Dh = mha.n_heads // n_kv_heads, mha.head_dim
    state = {}
    for name in ("q_proj", "out_proj"):
        for key, value in getattr(mha, name).state_dict().items():
            state[f"{name}.{key}"] = value.clone()
    for name in ("k_proj", "v_proj"):
        for key, value in getattr(mha, name).state_dict().items():
            groups = []
            for j in range(n_kv_heads):
                heads = [value[h * Dh:(h + 1) * Dh] for h in range(j * n_rep, (j + 1) * n_rep)]
                groups.append(torch.stack(heads).mean(dim=0))
            state[f"{name}.{key}"] = torch.cat(groups)
    gqa = GroupedQueryAttention(mha.d_model, mha.n_heads, n_kv_heads, bias=has_bias)
    gqa = gqa.to(dtype=mha.q_proj.weight.dtype, device=mha.q_proj.weight.device)
    gqa.load_state_dict(state)
    return gqa
""",
        ),
        (
            "pooling in float64 via einsum with an averaging matrix",
            """
def mha_to_gqa(mha, n_kv_heads):
    H, Dh = mha.n_heads, mha.head_dim
    n_rep = H // n_kv_heads
    dtype = mha.q_proj.weight.dtype
    avg = torch.zeros(n_kv_heads, H, dtype=torch.float64)
    for h in range(H):
        avg[h // n_rep, h] = 1.0 / n_rep
    gqa = GroupedQueryAttention(mha.d_model, H, n_kv_heads, bias=mha.q_proj.bias is not None).to(dtype)
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            for p_src, p_dst in zip(getattr(mha, name).parameters(), getattr(gqa, name).parameters()):
                p_dst.copy_(p_src)
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(mha, name), getattr(gqa, name)
            w = src.weight.double().view(H, Dh, -1)
            dst.weight.copy_(torch.einsum("gh,hdi->gdi", avg, w).reshape(n_kv_heads * Dh, -1).to(dtype))
            if src.bias is not None:
                b = src.bias.double().view(H, Dh)
                dst.bias.copy_((avg @ b).reshape(-1).to(dtype))
    return gqa
""",
        ),
    ],
    "kv_cache_bytes": [
        (
            "math.prod",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    import math
    return math.prod([2, n_layers, n_kv_heads, head_dim, seq_len, batch_size, bytes_per_element])
""",
        ),
        (
            "per layer, then summed, int() at the end",
            """
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    per_tensor = batch_size * n_kv_heads * seq_len * head_dim * bytes_per_element
    total = 0
    for _ in range(n_layers):
        total += per_tensor      # keys
        total += per_tensor      # values
    return int(total)
""",
        ),
    ],
}
