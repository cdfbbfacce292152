"""Lesson 06 (making attention fast): known-wrong answers and correct variants.

The Triton mutants and variants (triton_softmax, triton_attention) are the reference kernel and
wrapper with a few edits each, so they stay in step with solutions/gpu.py (an edit that no longer
applies fails at import). The triton_softmax mistakes its check recognises carry a model, the same
computation in torch, which the check runs instead of the kernel (Triton's interpreter is too slow
for the grader).
"""

import inspect
import textwrap

from autograder.checking.mistakes import Mistake
from solutions import gpu as _sol


def _kernel_source(kernel):
    return textwrap.dedent(inspect.getsource(getattr(kernel, "fn", kernel)))


_KERNEL = _kernel_source(_sol._attention_kernel)
_WRAPPER = inspect.getsource(_sol.triton_attention)
_SOFTMAX_KERNEL = _kernel_source(_sol._softmax_kernel)
_SOFTMAX_WRAPPER = inspect.getsource(_sol.triton_softmax)


def _edited(k, w, kernel, wrapper):
    """An answer cell: the wrapper w with edits [(old, new)], after the kernel k with its edits when
    there are any (an edited kernel is defined again in the same cell, under the same name)."""
    for old, new in kernel:
        assert old in k, f"mutant edit no longer applies to the kernel: {old!r}"
        k = k.replace(old, new)
    for old, new in wrapper:
        assert old in w, f"mutant edit no longer applies to the wrapper: {old!r}"
        w = w.replace(old, new)
    return (k + "\n\n" + w) if kernel else w


def _triton(kernel=(), wrapper=()):
    """The triton_attention answer cell with edits [(old, new)] to the kernel and the wrapper."""
    return _edited(_KERNEL, _WRAPPER, kernel, wrapper)


def _softmax(kernel=(), wrapper=()):
    """The triton_softmax answer cell with edits [(old, new)] to the kernel and the wrapper."""
    return _edited(_SOFTMAX_KERNEL, _SOFTMAX_WRAPPER, kernel, wrapper)


# PyTorch's fused attention with the lesson's causal mask: what the imitations really run.
_SDPA = """
def _sdpa(q, k, v, causal):
    Tq, Tk = q.size(2), k.size(2)
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq) if causal else None
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(q.dtype)
"""
FLASH_BODY = """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    scale = 1 / math.sqrt(q.size(3))
    out = torch.zeros_like(q)
    for qs in range(0, {q_stop}, block_q):
        qb = q[:, :, qs:qs + block_q].to(acc_dtype) * {scale}
        n = qb.size(2)
        m = torch.full((*qb.shape[:3], 1), float("-inf"), dtype=acc_dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qb)
        rows = torch.arange(qs, qs + n)[:, None] + {offset}
        for ks in range(0, {k_stop}, block_k):
            kb = k[:, :, ks:ks + block_k].to(acc_dtype)
            vb = v[:, :, ks:ks + block_k].to(acc_dtype)
            s = qb @ kb.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + kb.size(2)) > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            shift = m_new.clamp(min=torch.finfo(acc_dtype).min)
            p = torch.exp(s - shift)
            alpha = torch.exp(m - shift)
            l = {l_update}
            acc = {acc_update}
            m = m_new
        out[:, :, qs:qs + n] = ({result}).to({out_dtype})
    return out
"""
FLASH_OK = dict(
    q_stop="Tq",
    k_stop="Tk",
    scale="scale",
    offset="(Tk - Tq)",
    l_update="l * alpha + p.sum(dim=-1, keepdim=True)",
    acc_update="acc * alpha + p @ vb",
    result="acc / l",
    out_dtype="q.dtype",
)


def _flash(**edits):
    body = FLASH_BODY.format(**{**FLASH_OK, **edits})
    if edits.get("out_dtype") == "acc_dtype":  # an output allocated in the accumulator's dtype
        body = body.replace("out = torch.zeros_like(q)", "out = torch.zeros_like(q, dtype=acc_dtype)")
    return body


# Untiled code cut into chunks of queries of its own size, every chunk against all keys (issue 33): whatever the size,
# one chunk's scores span every key, which the tiled evidence sees however few queries a chunk holds.
OWN_CHUNKS = """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty_like(q)
    for qs in range(0, Tq, {chunk}):
        qb = q[:, :, qs:qs + {chunk}].to(work)
        scores = qb @ k.to(work).transpose(-2, -1) / math.sqrt(q.size(-1))
        if causal:
            rows = torch.arange(qs, qs + qb.size(2))[:, None] + Tk - Tq
            scores = scores.masked_fill(torch.arange(Tk) > rows, float("-inf"))
        out[:, :, qs:qs + {chunk}] = (scores.softmax(-1) @ v.to(work)).to(q.dtype)
    return out
"""


def _flash_in_buffer(mb):
    """A flash_attention that is not tiled: it writes its full score matrix (out=) into an mb MiB float32
    buffer its cell reserves at top level, before any memory bound begins (issue 19)."""
    return f"""
_SCORES = torch.empty({mb} << 18)  # {mb} MiB of float32, reserved when the cell runs


def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    B, H, Tq, Dh = q.shape
    Tk = k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    q3, k3, v3 = (t.to(work).reshape(B * H, -1, Dh) for t in (q, k, v))
    n = B * H * Tq * Tk
    out = _SCORES[:n].view(B * H, Tq, Tk) if work == torch.float32 and n <= _SCORES.numel() else None
    scores = torch.bmm(q3, k3.transpose(1, 2), out=out).mul_(1 / math.sqrt(Dh))
    if causal:
        scores.masked_fill_(torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not(), float("-inf"))
    scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    scores.div_(scores.sum(-1, keepdim=True))
    return torch.bmm(scores, v3).reshape(B, H, Tq, Dh).to(q.dtype)
"""


_ONLINE = """
def online_softmax(x, block_size):
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)
    s = torch.zeros_like(m)
    for start in range(0, x.size(-1), block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = {shift}
        s = {s_update}
        m = m_new
    return {result}
"""
_ONLINE_OK = dict(
    shift="m_new.clamp(min=torch.finfo(x.dtype).min)",
    s_update="s * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)",
    result="torch.exp(x - m) / s",
)


def _online(**edits):
    return _ONLINE.format(**{**_ONLINE_OK, **edits})


_FUSE = """
def fuse_qkv(attn):
    projs = {projs}
    w = attn.q_proj.weight
    d = w.size(1)
    fused = nn.Linear(d, 3 * d, bias={bias}, dtype={dtype})
    with torch.no_grad():
        fused.weight.copy_(torch.cat([{weight} for p in projs]))
        if {copy_bias}:
            fused.bias.copy_(torch.cat([p.bias for p in projs]))
    return fused
"""
_FUSE_OK = dict(
    projs="(attn.q_proj, attn.k_proj, attn.v_proj)",
    bias="attn.q_proj.bias is not None",
    dtype="w.dtype",
    weight="p.weight",
    copy_bias="fused.bias is not None",
)


def _fuse(**edits):
    return _FUSE.format(**{**_FUSE_OK, **edits})


# What the checks say (autograder/lessons/gpu/checks.py), defined once with the mistakes that earn them.
NO_MAX = (
    "exp(x) overflows on large entries (exp(89) is inf in float32): subtract the running max before exp, "
    "exp(x - m), and rescale the sum when the max grows"
)
FLOAT32_STATE = (
    "float64 input was computed in float32 (the result is only as close as float32 rounding goes; a "
    "float32 running sum drops the many small terms of a long row): keep the running max and sum in "
    "x's dtype"
)
FLOAT32_INSIDE = (
    "float64 inputs were computed in float32 (the result is as far from the exact answer as float32 "
    "rounding goes). Compute in float64 for float64 inputs: torch.promote_types(q.dtype, torch.float32) "
    "picks the dtype"
)
FLOAT16_INSIDE = (
    "float16 inputs were computed in float16: a float16 running sum drops the many small terms of a long "
    "row of keys (1 + 1e-4 == 1 in float16). Compute the scores and accumulate in float32 "
    "(torch.promote_types(q.dtype, torch.float32)), then cast the output back"
)
ACC = (
    "the accumulator is not rescaled: when the running max grows from m to m_new, multiply acc by exp(m - m_new), "
    "as you do for the running sum"
)
L_SUM = "the running sum l is not rescaled when the max grows: l = l * exp(m - m_new) + p.sum(-1)"
NEITHER = "neither the accumulator nor the running sum is rescaled when the max grows: multiply both by exp(m - m_new)"
LAST_SUM = (
    "the wrong normaliser: divide acc by the running sum l of all key tiles, once, at the end (you divide by "
    "the last tile's sum)"
)
NEVER = "the wrong normaliser: the output is never normalised; divide acc by the running sum l at the end"
K_TAIL = "the tail is dropped: when Tk is not a multiple of block_k, the last, partial tile of keys must still be used"
TOP_LEFT = (
    "the causal mask is aligned top-left. With Tk > Tq the queries are the last Tq positions, so query i sees "
    "key j iff j <= i + (Tk - Tq) (bottom-right)"
)
UNSCALED = "scale the scores by 1/sqrt(Dh) (Dh = q.size(-1)); they are not scaled"
BY_DH = "scale the scores by 1/sqrt(Dh), not 1/Dh"
SOFTMAX_NO_MAX = (
    "exp(x) overflows on large entries (exp(89) is inf in float32): subtract the row's max before exp, "
    "exp(x - tl.max(x, 0))"
)


def _fuse_order(order):
    """The fuse_qkv mistake of stacking the projections in `order` (a permutation of "qkv")."""
    return Mistake(
        f"{', '.join(order)} order",
        "order",
        _fuse(projs=f"({', '.join(f'attn.{n}_proj' for n in order)})"),
        message=f"the projections are stacked in the order {', '.join(order)}: stack them as q, k, v, "
        "so that q, k, v = fused(x).split(D, dim=-1)",
        aspect="weights",
    )


# The models of the Triton softmax's mistakes: what each kernel computes (in float32, stored in x's dtype), in torch,
# for the check to run in place of the kernel (Triton's interpreter is too slow for the grader)
_SOFTMAX_MODEL = """
def triton_softmax(x):
    x32 = x.float()
    return ({result}).to(x.dtype)
"""

_RAISES = """
def {sig}:
    raise ValueError("not this input")
"""

MUTANTS = {
    "attention_flops": [
        (
            "a multiply-add counted as one FLOP",
            "factor 2",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    flops = 2 * batch * n_heads * seq_q * seq_k * head_dim
    return flops // 2 if causal else flops
""",
        ),
        (
            "one matmul, one FLOP per multiply-add",
            "both matmuls",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    flops = batch * n_heads * seq_q * seq_k * head_dim
    return flops // 2 if causal else flops
""",
        ),
        (
            "causal not halved",
            "not halved",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    return 4 * batch * n_heads * seq_q * seq_k * head_dim
""",
        ),
        (
            "halved when not causal",
            "instead of",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    flops = 4 * batch * n_heads * seq_q * seq_k * head_dim
    return flops if causal else flops // 2
""",
        ),
        (
            "returns a float",
            "float",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    flops = 4 * batch * n_heads * seq_q * seq_k * head_dim
    return flops / 2 if causal else flops
""",
        ),
        (
            "float arithmetic, rounded back",
            "2**53",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    flops = 4.0 * batch * n_heads * seq_q * seq_k * head_dim
    return int(flops / 2) if causal else int(flops)
""",
        ),
        (
            "constant: returns 0",
            "count",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    return 0
""",
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            _RAISES.format(sig="attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False)"),
        ),
    ],
    "online_softmax": [
        Mistake(
            "running sum not rescaled",
            "not rescaled",
            _online(s_update="s + torch.exp(block - shift).sum(dim=-1, keepdim=True)"),
            message=(
                "the running sum is not rescaled when the max grows: the sum so far was taken relative to the "
                "old max m, so multiply it by exp(m - m_new) before adding the new block's terms"
            ),
        ),
        Mistake(
            "rescaled the wrong way",
            "wrong way",
            _online(
                s_update="s * torch.exp(shift - m.clamp(min=torch.finfo(x.dtype).min))"
                " + torch.exp(block - shift).sum(dim=-1, keepdim=True)"
            ),
            message="the running sum is rescaled the wrong way: multiply it by exp(m_old - m_new), which is <= 1",
        ),
        Mistake(
            "each block normalised on its own",
            "whole row",
            """
def online_softmax(x, block_size):
    blocks = [torch.exp(b - b.amax(dim=-1, keepdim=True)) for b in x.split(block_size, dim=-1)]
    return torch.cat([e / e.sum(dim=-1, keepdim=True) for e in blocks], dim=-1)
""",
            message="each block is normalised on its own: the sum must run over the whole row (keep one running sum)",
        ),
        ("no finite shift: NaN after an all -inf block", "finite", _online(shift="m_new")),
        Mistake(
            "never normalised",
            "not normalised",
            _online(result="torch.exp(x - m)"),
            message="the result is not normalised: divide exp(x - max) by the running sum at the end",
        ),
        Mistake(
            "no max subtraction: exp overflows on large entries",
            "subtract the running max",
            """
def online_softmax(x, block_size):
    s = torch.zeros((*x.shape[:-1], 1), dtype=x.dtype)
    for start in range(0, x.size(-1), block_size):
        s = s + torch.exp(x[..., start:start + block_size]).sum(dim=-1, keepdim=True)
    return torch.exp(x) / s
""",
            message=NO_MAX,
        ),
        (
            "constant: returns its input",
            "differs",
            """
def online_softmax(x, block_size):
    return x
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="online_softmax(x, block_size)")),
        # Two a student found passing every test (issue 20): the exercise forbids torch.softmax, and the dtype
        # is the input's. Only evidence shows them: the source cells, and float32's rounding in a float64 answer.
        Mistake(
            "torch.softmax, no blocks",
            "PyTorch's softmax",
            """
def online_softmax(x, block_size):
    return torch.softmax(x, dim=-1)
""",
            aspect="values",
            evidence=True,
        ),
        # Hidden softmaxes a student found passing every test (issue 33): the softmax is off where "values" is graded
        # (lessons/06_gpu/lesson.toml), whatever route reaches it.
        Mistake(
            "a softmax swapped in through global",
            "PyTorch's softmax",
            _online()
            + """

def _faster():
    global online_softmax
    online_softmax = lambda x, block_size: torch.nn.functional.softmax(x, dim=-1)


_faster()
""",
            aspect="values",
            evidence=True,
        ),
        Mistake(
            "a distribution's probabilities",
            "PyTorch's softmax",
            """
def online_softmax(x, block_size):
    return torch.distributions.Categorical(logits=x, validate_args=False).probs
""",
            aspect="values",
            evidence=True,
        ),
        # Python routes that never reach softmax's operators: torch's reference implementation, its decomposition
        Mistake(
            "torch's reference softmax (torch._refs)",
            "PyTorch's softmax",
            """
online_softmax = lambda x, block_size: torch._refs.softmax(x, -1)
""",
            aspect="values",
            evidence=True,
        ),
        Mistake(
            "softmax's decomposition, from torch._decomp's table",
            "PyTorch's softmax",
            """
from torch._decomp import decomposition_table


def online_softmax(x, block_size):
    return decomposition_table[torch.ops.aten._softmax.default](x, -1, False)
""",
            aspect="values",
            evidence=True,
        ),
        Mistake(
            "running max and sum in float32 for float64 input",
            "float32",
            _online()
            .replace(
                'm = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)',
                'm = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=torch.float32)',
            )
            .replace(
                "m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))",
                "m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True).float())",
            )
            .replace("clamp(min=torch.finfo(x.dtype).min)", "clamp(min=torch.finfo(torch.float32).min)")
            .replace(
                "torch.exp(block - shift).sum(dim=-1, keepdim=True)",
                "torch.exp(block - shift).sum(dim=-1, keepdim=True).float()",
            ),
            message=FLOAT32_STATE,
            evidence=True,
        ),
    ],
    "flash_attention": [
        (
            "the full score matrix, not tiled",
            "never materialises",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(work) @ k.to(work).transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not(), float("-inf"))
    return (scores.softmax(-1) @ v.to(work)).to(q.dtype)
""",
        ),
        (
            "only the queries tiled",
            "(block_q, Tk) row",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    out = torch.empty_like(q)
    for qs in range(0, Tq, block_q):
        work = torch.promote_types(q.dtype, torch.float32)
        qb = q[:, :, qs:qs + block_q].to(work)
        scores = qb @ k.to(work).transpose(-2, -1) / math.sqrt(q.size(-1))
        if causal:
            rows = torch.arange(qs, qs + qb.size(2))[:, None] + Tk - Tq
            scores = scores.masked_fill(torch.arange(Tk) > rows, float("-inf"))
        out[:, :, qs:qs + block_q] = (scores.softmax(-1) @ v.to(work)).to(q.dtype)
    return out
""",
        ),
        Mistake("accumulator not rescaled", "accumulator", _flash(acc_update="acc + p @ vb"), message=ACC),
        Mistake(
            "running sum not rescaled", "running sum", _flash(l_update="l + p.sum(dim=-1, keepdim=True)"), message=L_SUM
        ),
        Mistake(
            "normalised by the last tile's sum",
            "normaliser",
            _flash(l_update="p.sum(dim=-1, keepdim=True)"),
            message=LAST_SUM,
        ),
        Mistake("never normalised", "normaliser", _flash(result="acc"), message=NEVER),
        Mistake("tail tile of keys dropped", "tail", _flash(k_stop="Tk - block_k + 1"), message=K_TAIL),
        ("tail tile of queries dropped", "tail", _flash(q_stop="Tq - block_q + 1")),
        Mistake("causal mask top-left", "top-left", _flash(offset="0"), message=TOP_LEFT),
        Mistake("scores not scaled", "sqrt", _flash(scale="1.0"), message=UNSCALED),
        ("output left in float32 for half inputs", "dtype", _flash(out_dtype="acc_dtype")),
        Mistake(
            "float64 inputs computed in float32",
            "float64",
            _flash().replace("acc_dtype = torch.promote_types(q.dtype, torch.float32)", "acc_dtype = torch.float32"),
            message=FLOAT32_INSIDE,
            evidence=True,
        ),  # float32's rounding in a float64 answer shows it
        (
            "the full score matrix in numpy, unseen by torch's tracer",
            "never materialises",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    import numpy as np
    Tq, Tk = q.size(2), k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    qn, kn, vn = (t.detach().to(work).numpy() for t in (q, k, v))
    scores = qn @ kn.swapaxes(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = np.where(np.tri(Tq, Tk, Tk - Tq, dtype=bool), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return torch.from_numpy(p / p.sum(-1, keepdims=True) @ vn).to(q.dtype)
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    return torch.zeros_like(q)
""",
        ),
        Mistake(
            "PyTorch's fused attention, no tiling of its own",
            "attention kernel",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    work = torch.promote_types(q.dtype, torch.float32)
    return F.scaled_dot_product_attention(q.to(work), k.to(work), v.to(work), attn_mask=mask).to(q.dtype)
""",
            aspect="tiled",
            evidence=True,
        ),
        # Routes to PyTorch's attention a student found passing every test (issue 33): its kernels are off where
        # "tiled" is graded (lessons/06_gpu/lesson.toml), whatever route reaches them.
        Mistake(
            "rebound through global to a wrapper of the fused kernel",
            "attention kernel",
            _flash()
            + """

def _install():
    global flash_attention

    def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
        Tq, Tk = q.size(2), k.size(2)
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
        work = torch.promote_types(q.dtype, torch.float32)
        return F.scaled_dot_product_attention(q.to(work), k.to(work), v.to(work), attn_mask=mask).to(q.dtype)


_install()
""",
            aspect="tiled",
            evidence=True,
        ),
        Mistake(
            "F.multi_head_attention_forward with identity projections",
            "attention kernel",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    (B, H, Tq, Dh), Tk = q.shape, k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    fold = lambda t: t.to(work).permute(2, 0, 1, 3).reshape(t.size(2), B * H, Dh)  # (T, B*H, Dh): heads as batch
    eye = torch.eye(Dh, dtype=work)
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not() if causal else None
    out, _ = F.multi_head_attention_forward(
        fold(q), fold(k), fold(v), Dh, 1, None, None, None, None, False, 0.0, eye, None, training=False,
        need_weights=False, attn_mask=mask, use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
        v_proj_weight=eye)
    return out.reshape(Tq, B, H, Dh).permute(1, 2, 0, 3).to(q.dtype)
""",
            aspect="tiled",
            evidence=True,
        ),
        # Python compositions of attention, a tile of 16 queries at a time so that no bound sees the full scores
        Mistake(
            "F.multi_head_attention_forward's weights path (need_weights=True), 16 queries at a time",
            "attention kernel",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    (B, H, Tq, Dh), Tk = q.shape, k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    eye = torch.eye(Dh, dtype=work)
    out = torch.empty_like(q)
    for b in range(B):
        for h in range(H):
            for s in range(0, Tq, 16):
                qb = q[b, h, s:s + 16].to(work)
                mask = torch.arange(Tk) > torch.arange(s, s + qb.size(0))[:, None] + (Tk - Tq) if causal else None
                o, _ = F.multi_head_attention_forward(
                    qb[:, None], k[b, h, :, None].to(work), v[b, h, :, None].to(work), Dh, 1, None, None, None, None,
                    False, 0.0, eye, None, training=False, need_weights=True, attn_mask=mask,
                    use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye)
                out[b, h, s:s + 16] = o[:, 0].to(q.dtype)
    return out
""",
            aspect="tiled",
            evidence=True,
        ),
        Mistake(
            "a dispatch table filled in later",
            "attention kernel",
            """
_KERNELS = {}


def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    work = torch.promote_types(q.dtype, torch.float32)
    return _KERNELS["attend"](q.to(work), k.to(work), v.to(work), attn_mask=mask).to(q.dtype)


_KERNELS["attend"] = getattr(torch.ops.aten, "scaled_dot_" + "product_attention")
""",
            aspect="tiled",
            evidence=True,
        ),
        (
            "constant: raises ValueError",
            "ValueError",
            _RAISES.format(sig="flash_attention(q, k, v, causal=False, block_q=64, block_k=64)"),
        ),
        # Memory taken before the bound is part of it (issue 19): the full score matrix, written into a buffer
        # that the cell reserved at top level.
        ("the full score matrix, in a buffer reserved before the call", "never materialises", _flash_in_buffer(68)),
        # ... up to HEADROOM_MB and just over it (a notebook holding more loses the aspect as over budget)
        *[
            (
                f"the full score matrix, in a {mb} MiB buffer reserved before the call",
                "never materialises",
                _flash_in_buffer(mb),
            )
            for mb in (128, 256, 400)
        ],
        # Tiles of scores, but the causal mask made whole first (issue 21: the lesson says a full mask counts too).
        (
            "tiles, but a full (Tq, Tk) causal mask",
            "full mask",
            _flash()
            .replace(
                "    for qs in range(0, Tq, block_q):",
                "    visible = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None\n"
                "    for qs in range(0, Tq, block_q):",
            )
            .replace(
                's.masked_fill(torch.arange(ks, ks + kb.size(2)) > rows, float("-inf"))',
                's.masked_fill(~visible[qs:qs + n, ks:ks + kb.size(2)], float("-inf"))',
            ),
        ),
        *[
            Mistake(
                f"chunks of {n} query rows of its own against all keys",
                "one query row at a time",
                OWN_CHUNKS.format(chunk=n),
                aspect="tiled",
            )
            for n in (16, 1)
        ],
        # A slip a student found passing every test (issue 20): the lesson says half precision accumulates in fp32.
        Mistake(
            "float16 inputs computed in float16",
            "accumulate in float32",
            _flash().replace("acc_dtype = torch.promote_types(q.dtype, torch.float32)", "acc_dtype = q.dtype"),
            message=FLOAT16_INSIDE,
            aspect="float16",
        ),
        Mistake(
            "neither the accumulator nor the running sum rescaled",
            "rescaled",
            _flash(acc_update="acc + p @ vb", l_update="l + p.sum(dim=-1, keepdim=True)"),
            message=NEITHER,
        ),
        Mistake("scores scaled by 1/Dh", "sqrt", _flash(scale="scale * scale"), message=BY_DH),
    ],
    "fuse_qkv": [
        *(_fuse_order(order) for order in ("kqv", "qvk", "kvq", "vqk", "vkq")),
        ("biases dropped", "biases are dropped", _fuse(bias="False", copy_bias="False")),
        ("bias left at its random initial value", "bias", _fuse(bias="True", copy_bias="False")),
        Mistake(
            "each weight transposed",
            "transposed",
            _fuse(weight="p.weight.T"),
            message="each weight is transposed: nn.Linear stores its weight as (out_features, in_features) and "
            "computes x @ weight.T, so stack the weights themselves, not their transposes",
            aspect="weights",
        ),
        ("always float32", "dtype", _fuse(dtype="torch.float32")),
        (
            "constant: returns None",
            "Linear",
            """
def fuse_qkv(attn):
    return None
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="fuse_qkv(attn)")),
    ],
    "triton_softmax": [
        Mistake(
            "no max subtraction",
            "overflows",
            _softmax(kernel=[("e = tl.exp(x - tl.max(x, 0))", "e = tl.exp(x)")]),
            message=SOFTMAX_NO_MAX,
            aspect="float32",
            model=_SOFTMAX_MODEL.format(result="x32.exp() / x32.exp().sum(-1, keepdim=True)"),
        ),
        Mistake(
            "tail read as 0 (other=0.0)",
            "read as 0",
            _softmax(kernel=[('mask=ok, other=float("-inf")', "mask=ok, other=0.0")]),
            message="the tail of the block is read as 0 (other=0.0): masked entries then count in the sum and can "
            "raise the max; read them as -inf (other=float('-inf')), which gets weight 0",
            aspect="float32",
            model=_SOFTMAX_MODEL.format(
                result="torch.nn.functional.pad(x32, (0, triton.next_power_of_2(x.size(1))"
                " - x.size(1))).softmax(-1)[:, :x.size(1)]"
            ),
        ),
        # A student who swapped the roles of rows and columns: program i loads column i, BLOCK holds the rows
        Mistake(
            "one program per column: the softmax over dim 0",
            "wrong axis",
            _softmax(
                kernel=[
                    ("X + row * stride_x + cols", "X + cols * stride_x + row"),
                    ("Y + row * stride_y + cols", "Y + cols * stride_y + row"),
                ],
                wrapper=[
                    (
                        "_softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), "
                        "BLOCK=triton.next_power_of_2(cols))",
                        "_softmax_kernel[(cols,)](x, out, rows, x.stride(0), out.stride(0), "
                        "BLOCK=triton.next_power_of_2(rows))",
                    )
                ],
            ),
            message="the softmax runs over the wrong axis: each row (dim=-1) sums to 1, one program per row",
            aspect="float32",
            model=_SOFTMAX_MODEL.format(result="x32.softmax(0)"),
        ),
        Mistake(
            "not normalised: exp(x - max) stored",
            "not normalised",
            _softmax(kernel=[("(e / tl.sum(e, 0)).to(Y.dtype.element_ty)", "e.to(Y.dtype.element_ty)")]),
            message="the result is not normalised: divide exp(x - max) by the row's sum",
            aspect="float32",
            model=_SOFTMAX_MODEL.format(result="(x32 - x32.amax(-1, keepdim=True)).exp()"),
        ),
        # The two below leave part of the output unwritten (torch.empty_like's leftovers): no model returns that,
        # and the check recognises them by what it did write
        (
            "a block of 128 columns, narrower than the row",
            "whole row",
            _softmax(wrapper=[("BLOCK=triton.next_power_of_2(cols)", "BLOCK=128")]),
        ),
        ("one program for all the rows", "one program per row", _softmax(wrapper=[("[(rows,)]", "[(1,)]")])),
        (
            "output always float32",
            "dtype",
            _softmax(wrapper=[("out = torch.empty_like(x)", "out = torch.empty_like(x, dtype=torch.float32)")]),
        ),
        (
            "torch.softmax, no kernel",
            "@triton.jit",
            """
def triton_softmax(x):
    return torch.softmax(x, dim=-1)
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def triton_softmax(x):
    return torch.zeros_like(x)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="triton_softmax(x)")),
        # A kernel that does nothing while the wrapper computes, into the buffer it launches with (issue 33): the
        # grader launches the kernel again on its own (checks/triton_replay.py).
        Mistake(
            "a kernel that only reads its program id, the wrapper computing",
            "launched it again",
            """
@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)


def triton_softmax(x):
    out = torch.softmax(x.float(), dim=-1).to(x.dtype)
    _softmax_kernel[(x.size(0),)](
        x, out, x.size(1), x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(x.size(1))
    )
    return out
""",
            aspect="float32",
            evidence=True,
        ),
        # The answer smuggled in scalars, 29 a launch, which the kernel only stores (triton_replay._scalars)
        Mistake(
            "a kernel that stores the scalars it is given, the wrapper computing",
            "a scale",
            """
@triton.jit
def _softmax_kernel(Y, OFF, N, {params}):
{stores}


def triton_softmax(x):
    out = torch.zeros_like(x)
    flat = torch.softmax(x.double(), -1).to(x.dtype).reshape(-1).tolist()
    for off in range(0, len(flat), 29):
        chunk = flat[off:off + 29]
        _softmax_kernel[(1,)](out, off, len(flat), *chunk, *[0.0] * (29 - len(chunk)))
    return out
""".format(
                params=", ".join(f"A{i}" for i in range(29)),
                stores="\n".join(f"    tl.store(Y + OFF + {i}, A{i}, mask=OFF + {i} < N)" for i in range(29)),
            ),
            aspect="float32",
            evidence=True,
        ),
        # Python inside the kernel's body, which the interpreter runs (triton_fit.not_triton)
        Mistake(
            "torch's softmax inside the kernel, through x.handle",
            "not Triton",
            _softmax(
                kernel=[
                    (
                        "    e = tl.exp(x - tl.max(x, 0))",
                        "    x.handle.data[:] = torch.from_numpy(x.handle.data).double().softmax(0).numpy().astype("
                        "x.handle.data.dtype)\n    e = x",
                    ),
                    ("(e / tl.sum(e, 0))", "e"),
                ]
            ),
            aspect="float32",
            evidence=True,
        ),
    ],
    "triton_attention": [
        (
            "causal mask top-left",
            "top-left",
            _triton(kernel=[("last_key = rows + (seq_k - seq_q)", "last_key = rows")]),
        ),
        (
            "keys past seq_k not masked",
            "masked out",
            _triton(kernel=[("ok = k_ok[None, :]", "ok = keys[None, :] >= 0")]),
        ),
        (
            "exp2 without log2(e)",
            "log2(e)",
            _triton(wrapper=[("math.log2(math.e) / math.sqrt(Dh)", "1 / math.sqrt(Dh)")]),
        ),
        (
            "accumulator not rescaled",
            "accumulator",
            _triton(kernel=[("acc = acc * alpha[:, None] + tl.dot", "acc = acc + tl.dot")]),
        ),
        (
            "query tail tile dropped",
            "tail",
            _triton(
                wrapper=[
                    ('grid = (triton.cdiv(Tq, tiles["BLOCK_Q"]), B * H)', 'grid = (Tq // tiles["BLOCK_Q"], B * H)')
                ]
            ),
        ),
        (
            "output always float32",
            "dtype",
            _triton(wrapper=[("out = torch.empty_like(q)", "out = torch.empty_like(q, dtype=torch.float32)")]),
        ),
        (
            "plain torch, no Triton",
            "@triton.jit",
            """
def triton_attention(q, k, v, causal=False):
    Tq, Tk = q.size(2), k.size(2)
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not(), float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)
""",
        ),
        Mistake(
            "a kernel that only reads its program id, the wrapper computing",
            "launched it again",
            """
@triton.jit
def _attention_kernel(Q, K, V, O, seq_q, CAUSAL: tl.constexpr):
    pid = tl.program_id(0)


def triton_attention(q, k, v, causal=False):
    out = naive_attention(q, k, v, causal=causal)
    _attention_kernel[(1,)](q, k, v, out, q.size(2), CAUSAL=causal)
    return out
""",
            aspect="float32",
            evidence=True,
        ),
        # A dummy kernel launched while torch does the work. Its other disguises (a decorator on the wrapper, a
        # second definition under `if`) pass the visible test: tests/lessons/test_gpu.py's imitations test them.
        (
            "a home-made jit that launches torch",
            "@triton.jit",
            _SDPA
            + """
class _Launch:
    def __getitem__(self, grid):
        return lambda q, k, v, out, causal: out.copy_(_sdpa(q, k, v, causal))

def jit(fn):
    return _Launch()

@jit
def _dummy_kernel(Q, K, V, O, CAUSAL):
    pid = tl.program_id(0)

def triton_attention(q, k, v, causal=False):
    out = torch.empty_like(q)
    _dummy_kernel[(1,)](q, k, v, out, causal)
    return out
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def triton_attention(q, k, v, causal=False):
    return torch.zeros_like(q)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="triton_attention(q, k, v, causal=False)")),
    ],
}

# Only the hidden checks see these: the visible tests read what torch runs, the grader its memory and the source.
HIDDEN_ONLY = {
    "the full score matrix in numpy, unseen by torch's tracer": "the visible test's tracer sees torch's "
    "operations only",
    # the visible tests check the launch, not what the kernel wrote: only the grader launches it again,
    # from the inputs alone, in a process that ran no other code of the notebook (checks/triton_replay.py)
    **dict.fromkeys(
        [
            "a kernel that only reads its program id, the wrapper computing",
            "a kernel that stores the scalars it is given, the wrapper computing",
        ],
        "only the grader's own launch of the kernel shows that it wrote nothing",
    ),
    **dict.fromkeys(
        [
            "torch's softmax inside the kernel, through x.handle",
        ],
        "the interpreter runs it; only the grader (and check_submission.py) reads the kernel's body",
    ),
}

VARIANTS = {
    "attention_flops": [
        (
            "two matmuls of 2*m*k*n, causal by a shift",
            """
def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    per_matmul = 2 * seq_q * seq_k * head_dim
    total = batch * n_heads * 2 * per_matmul
    return total >> 1 if causal else total
""",
        ),
    ],
    "online_softmax": [
        (
            "running log-sum-exp in the input's dtype",
            """
def online_softmax(x, block_size):
    lse = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)
    for start in range(0, x.size(-1), block_size):
        lse = torch.logaddexp(lse, torch.logsumexp(x[..., start:start + block_size], dim=-1, keepdim=True))
    return torch.exp(x - lse)
""",
        ),
        (
            "running log-sum-exp in float64",
            """''
def online_softmax(x, block_size):
    x64 = x.double()
    lse = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=torch.float64)
    for start in range(0, x.size(-1), block_size):
        lse = torch.logaddexp(lse, torch.logsumexp(x64[..., start:start + block_size], dim=-1, keepdim=True))
    return torch.exp(x64 - lse).to(x.dtype)
""",
        ),
        (
            "block softmaxes merged with their maxima and sums",
            """
def online_softmax(x, block_size):
    m, s = None, None
    for block in x.split(block_size, dim=-1):
        bm = block.amax(dim=-1, keepdim=True)
        finite = torch.where(torch.isfinite(bm), bm, torch.zeros_like(bm))
        bs = torch.exp(block - finite).sum(dim=-1, keepdim=True)
        if m is None:
            m, s, m_f = bm, bs, finite
            continue
        new = torch.maximum(m, bm)
        new_f = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
        s = s * torch.exp(m_f - new_f) + bs * torch.exp(finite - new_f)
        m, m_f = new, new_f
    return torch.exp(x - m_f) / s
""",
        ),
    ],
    "flash_attention": [
        (
            "FlashAttention-1 style: the output normalised after every tile",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    for qs in range(0, Tq, block_q):
        qb = q[:, :, qs:qs + block_q].to(work) / math.sqrt(q.size(-1))
        o = torch.zeros_like(qb)
        m = torch.full(qb.shape[:-1] + (1,), -1e30, dtype=work)
        l = torch.zeros_like(m)
        last = torch.arange(qs, qs + qb.size(2)).unsqueeze(1) + Tk - Tq
        for ks in range(0, Tk, block_k):
            s = qb @ k[:, :, ks:ks + block_k].to(work).transpose(-1, -2)
            if causal:
                s = torch.where(torch.arange(ks, min(Tk, ks + block_k)) <= last, s, torch.tensor(-1e30, dtype=work))
            m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
            p = torch.exp(s - m_new)
            l_new = l * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
            o = (o * l * torch.exp(m - m_new) + p @ v[:, :, ks:ks + block_k].to(work)) / l_new
            m, l = m_new, l_new
        out[:, :, qs:qs + block_q] = o.to(q.dtype)
    return out
""",
        ),
        (
            "a loop over batch and heads, einsum, float64 inside",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    B, H, Tq, Dh = q.shape
    Tk = k.size(2)
    out = torch.empty_like(q)
    for b in range(B):
        for h in range(H):
            qh, kh, vh = q[b, h].double(), k[b, h].double(), v[b, h].double()
            for qs in range(0, Tq, block_q):
                qb = qh[qs:qs + block_q]
                m = torch.full((qb.size(0),), float("-inf"), dtype=torch.float64)
                l = torch.zeros_like(m)
                acc = torch.zeros(qb.size(0), Dh, dtype=torch.float64)
                for ks in range(0, Tk, block_k):
                    s = torch.einsum("qd,kd->qk", qb, kh[ks:ks + block_k]) / Dh ** 0.5
                    if causal:
                        i = torch.arange(qs, qs + qb.size(0))[:, None]
                        j = torch.arange(ks, ks + s.size(1))[None, :]
                        s = s.masked_fill(j > i + Tk - Tq, float("-inf"))
                    m_new = torch.maximum(m, s.max(dim=1).values)
                    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                    p = torch.exp(s - safe[:, None])
                    c = torch.exp(m - safe)
                    l = l * c + p.sum(1)
                    acc = acc * c[:, None] + torch.einsum("qk,kd->qd", p, vh[ks:ks + block_k])
                    m = m_new
                out[b, h, qs:qs + block_q] = (acc / l[:, None]).to(q.dtype)
    return out
""",
        ),
        (
            "FlashAttention-1's loop order: key/value tiles outside, query tiles inside, state per query",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk = q.size(2), k.size(2)
    work = torch.promote_types(q.dtype, torch.float32)
    low = torch.finfo(work).min
    o = torch.zeros(q.shape, dtype=work)
    l = torch.zeros(*q.shape[:3], 1, dtype=work)
    m = torch.full_like(l, float("-inf"))
    for ks in range(0, Tk, block_k):
        kb, vb = k[:, :, ks:ks + block_k].to(work), v[:, :, ks:ks + block_k].to(work)
        for qs in range(0, Tq, block_q):
            rows = slice(qs, qs + block_q)
            s = (q[:, :, rows].to(work) / math.sqrt(q.size(-1))) @ kb.transpose(-2, -1)
            if causal:
                last = torch.arange(qs, min(Tq, qs + block_q))[:, None] + Tk - Tq
                s = s.masked_fill(torch.arange(ks, ks + kb.size(2)) > last, float("-inf"))
            m_tile = s.amax(-1, keepdim=True)
            p = torch.exp(s - m_tile.clamp(min=low))
            m_old, l_old = m[:, :, rows], l[:, :, rows]
            m_new = torch.maximum(m_old, m_tile)
            a, b = torch.exp(m_old - m_new.clamp(min=low)), torch.exp(m_tile - m_new.clamp(min=low))
            l_new = a * l_old + b * p.sum(-1, keepdim=True)
            o[:, :, rows] = (l_old * a * o[:, :, rows] + b * (p @ vb)) / l_new.clamp(min=torch.finfo(work).tiny)
            m[:, :, rows], l[:, :, rows] = m_new, l_new
    return o.to(q.dtype)
""",
        ),
        (
            "einsum, an output list joined at the end",
            """
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    Tq, Tk, Dh = q.size(2), k.size(2), q.size(3)
    work = torch.promote_types(q.dtype, torch.float32)
    outs = []
    for qs in range(0, Tq, block_q):
        qb = q[:, :, qs:qs + block_q].to(work)
        n = qb.size(2)
        m = torch.full(qb.shape[:3], -torch.inf, dtype=work)
        l = torch.zeros(qb.shape[:3], dtype=work)
        acc = torch.zeros_like(qb)
        for ks in range(0, Tk, block_k):
            kb, vb = k[:, :, ks:ks + block_k].to(work), v[:, :, ks:ks + block_k].to(work)
            s = torch.einsum("bhqd,bhkd->bhqk", qb, kb) / math.sqrt(Dh)
            if causal:
                visible = torch.arange(ks, ks + kb.size(2))[None, :] <= torch.arange(qs, qs + n)[:, None] + (Tk - Tq)
                s = torch.where(visible, s, -torch.inf)
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            p = torch.exp(s - shift[..., None])
            c = torch.exp(m - shift)
            l = l * c + p.sum(-1)
            acc = acc * c[..., None] + torch.einsum("bhqk,bhkd->bhqd", p, vb)
            m = m_new
        outs.append(acc / l[..., None])
    return torch.cat(outs, dim=2).to(q.dtype)
""",
        ),
        (
            "float64 inside for every dtype",
            _flash().replace("acc_dtype = torch.promote_types(q.dtype, torch.float32)", "acc_dtype = torch.float64"),
        ),
    ],
    "fuse_qkv": [
        (
            "new Parameters assigned",
            """
def fuse_qkv(attn):
    layers = [attn.q_proj, attn.k_proj, attn.v_proj]
    fused = nn.Linear(attn.q_proj.in_features, 3 * attn.q_proj.out_features, bias=attn.q_proj.bias is not None)
    fused.weight = nn.Parameter(torch.cat([l.weight.detach() for l in layers], dim=0).clone())
    if attn.q_proj.bias is not None:
        fused.bias = nn.Parameter(torch.cat([l.bias.detach() for l in layers]).clone())
    return fused
""",
        ),
    ],
    "triton_softmax": [
        (
            "exp2 with log2(e)",
            _softmax(
                kernel=[("e = tl.exp(x - tl.max(x, 0))", "e = tl.math.exp2((x - tl.max(x, 0)) * 1.4426950408889634)")]
            ),
        ),
        (
            "two passes: the max, then the row loaded again",
            _softmax(
                kernel=[
                    (
                        "    e = tl.exp(x - tl.max(x, 0))",
                        "    m = tl.max(x, 0)\n"
                        '    x = tl.load(X + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)\n'
                        "    e = tl.exp(x - m)",
                    )
                ]
            ),
        ),
        (
            "a loop over blocks of 64 columns, online",
            """
@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride_x + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    m_row = tl.max(m, 0)
    total = tl.sum(l * tl.exp(m - m_row), 0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride_x + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(Y + row * stride_y + cols, (tl.exp(x - m_row) / total).to(Y.dtype.element_ty), mask=cols < n_cols)


def triton_softmax(x):
    if x.dim() != 2 or x.size(1) > 4096 or x.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"triton_softmax takes a 2-D float32 or float16 tensor, got {x.dtype}")
    x = x.contiguous()
    out = torch.empty_like(x)
    _softmax_kernel[(x.size(0),)](x, out, x.size(1), x.stride(0), out.stride(0), BLOCK=64)
    return out
""",
        ),
    ],
    "triton_attention": [
        (
            "exp instead of exp2",
            _triton(
                kernel=[
                    ("p = tl.math.exp2(s - shift[:, None])", "p = tl.exp(s - shift[:, None])"),
                    ("alpha = tl.math.exp2(m_i - shift)", "alpha = tl.exp(m_i - shift)"),
                ],
                wrapper=[("math.log2(math.e) / math.sqrt(Dh)", "1 / math.sqrt(Dh)")],
            ),
        ),
        (
            "q divided by sqrt(Dh) in torch before the launch",
            _triton(
                wrapper=[
                    (
                        "q, k, v = q.contiguous(), k.contiguous(), v.contiguous()",
                        "q, k, v = (q / math.sqrt(q.size(3))).contiguous(), k.contiguous(), v.contiguous()",
                    ),
                    ("math.log2(math.e) / math.sqrt(Dh)", "math.log2(math.e)"),
                ]
            ),
        ),
        (
            "32 x 32 tiles on the CPU",
            _triton(
                wrapper=[
                    (
                        "tiles = launch_tiles(q)",
                        "tiles = launch_tiles(q) if on_gpu else "
                        "dict(BLOCK_Q=32, BLOCK_K=32, BLOCK_D=max(16, triton.next_power_of_2(Dh)))",
                    )
                ]
            ),
        ),
    ],
}
