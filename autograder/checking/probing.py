"""What a lesson's reference probes (autograder/lessons/<module>/probes.py) are made of: probe() registers
one, agree() compares a reference with what does not depend on it, and the tools below build the inputs
and PyTorch's own answers. autograder/selfcheck.py runs them.
"""

import math
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

PROBES = defaultdict(list)  # {lesson: [(target "module.name", probe(target_object))]}
STAND_INS = "autograder.checking.stand_ins"


class Disagrees(Exception):
    pass


def probe(lessons, *targets):
    """Register fn(obj) for each target ("solutions.attention.softmax") in each of lessons."""

    def register(fn):
        for lesson in lessons.split():
            PROBES[lesson] += [(target, fn) for target in targets]
        return fn

    return register


# ---- tools ---------------------------------------------------------------------------------------


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)), dtype=torch.float64)


def agree(got, want, against, tol=1e-9):
    """Disagrees unless got (array, tensor, number or bool) equals want in dtype, shape and value."""
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise Disagrees(
            f"{got.dtype} of shape {tuple(got.shape)} where {against} gives {want.dtype} of shape {tuple(want.shape)}"
        )
    if want.dtype == torch.bool or not want.is_floating_point():
        if not torch.equal(got, want):
            raise Disagrees(f"it differs from {against}")
        return
    got = got.double()
    if not torch.equal(got.isnan(), want.isnan()) or not torch.allclose(
        got, want.double(), rtol=tol, atol=tol, equal_nan=True
    ):
        raise Disagrees(f"it differs from {against}, by up to {(got - want).abs().nan_to_num(math.inf).max():.3g}")


def shares_memory(a, b):
    """Whether any parameter of module a lies in the storage of a parameter of module b."""
    return bool(
        {p.untyped_storage().data_ptr() for p in a.parameters()}
        & {p.untyped_storage().data_ptr() for p in b.parameters()}
    )


def python_int(value):
    if type(value) is not int:
        raise Disagrees(f"it returns {type(value).__name__}, not a Python int")
    return value


def refuses(fn, *args, against):
    try:
        fn(*args)
    except ValueError:
        return
    raise Disagrees(f"no ValueError for {against}")


def linears(d_in, widths, bias, seed):
    """{name: nn.Linear(d_in, width)} in float64, with fixed weights."""
    out = {}
    for i, (name, width) in enumerate(widths.items()):
        layer = nn.Linear(d_in, width, bias=bias, dtype=torch.float64)
        layer.weight.copy_(randn(width, d_in, seed=seed + i) / math.sqrt(d_in))
        if bias:
            layer.bias.copy_(randn(width, seed=seed + i + 50))
        out[name] = layer
    return out


def shell_module(d_model, n_heads, n_kv_heads=None, bias=True, seed=0):
    """An attention module's projections and sizes, as mha_to_gqa, fuse_qkv and attend_with_cache read them."""
    n_kv_heads = n_kv_heads or n_heads
    head_dim = d_model // n_heads
    shell = nn.Module()
    for name, layer in linears(
        d_model,
        {"q_proj": d_model, "k_proj": n_kv_heads * head_dim, "v_proj": n_kv_heads * head_dim, "out_proj": d_model},
        bias,
        seed,
    ).items():
        setattr(shell, name, layer)
    shell.d_model, shell.n_heads, shell.n_kv_heads, shell.head_dim = d_model, n_heads, n_kv_heads, head_dim
    return shell


def load(module, shell):
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(module, name).load_state_dict(getattr(shell, name).state_dict())
    return module


def heads_of(t, n):
    """(B, T, n*Dh) -> (B, n, T, Dh) by slicing: head h is features h*Dh:(h+1)*Dh."""
    dh = t.size(-1) // n
    return torch.stack([t[..., h * dh : (h + 1) * dh] for h in range(n)], dim=1)


def merged(t):
    return torch.cat(t.unbind(1), dim=-1)


def torch_attention(shell, x, mask=None, causal=False, keys=None):
    """PyTorch's attention with shell's projections; the queries are the last T of the keys' positions."""
    keys = x if keys is None else keys
    q, k, v = (
        heads_of(shell.q_proj(x), shell.n_heads),
        *(heads_of(p(keys), shell.n_kv_heads) for p in (shell.k_proj, shell.v_proj)),
    )
    if causal:
        mask = lower_right(x.size(1), keys.size(1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=shell.n_kv_heads != shell.n_heads)
    return shell.out_proj(merged(out))


def lower_right(n_q, n_k):
    """The bottom-right causal mask, from its definition: query i sees key j iff j <= i + n_k - n_q."""
    return torch.tensor([[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)])


def softmax_weights(q, k, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return torch.softmax(scores if mask is None else scores.masked_fill(~mask, -math.inf), dim=-1)


def row_mask(n_q, n_k, seed):
    """A random boolean mask in which every query sees at least one key."""
    mask = randn(n_q, n_k, seed=seed) > 0
    mask[:, 0] = True
    return mask


class ListCache:
    """A key/value (or latent) cache by concatenation along dim."""

    def __init__(self, dim=2):
        self.dim, self.parts = dim, None

    def update(self, *new):
        self.parts = new if self.parts is None else tuple(torch.cat(p, self.dim) for p in zip(self.parts, new))
        return self.parts if len(self.parts) > 1 else self.parts[0]

    def __len__(self):
        return 0 if self.parts is None else self.parts[0].size(self.dim)
