"""Lesson 09: training through attention (FlashAttention's backward pass).

The gradients of attention by hand, then FlashAttention-2's tiled backward (Dao 2023), which
stores only each row's logsumexp `lse` in the forward and recomputes every tile of
probabilities from it, and an autograd Function that trains with both. Beside the graded
names, lesson 06's Triton kernel with the two lines that also store `lse`, as the forward of a
Function whose backward is the tiled one (on a GPU, or on the CPU under Triton's interpreter).
Layout (B, H, T, Dh); the causal mask is bottom-right aligned (query i sees key j iff
j <= i + Tk - Tq). Half precision is computed in float32 and returned in the inputs' dtype.
"""

import math

import torch

from solutions.gpu import HAS_TRITON, check_attention_inputs, launch_tiles, tl, triton


def _compute_dtype(dtype):
    """float32 for float16/bfloat16 (and float32), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _visible(rows, cols, n_q, n_k, device):
    """Bool (len(rows), len(cols)): query row i may see key col j iff j <= i + n_k - n_q."""
    r = torch.arange(rows.start, rows.stop, device=device)[:, None] + (n_k - n_q)
    c = torch.arange(cols.start, cols.stop, device=device)[None, :]
    return c <= r


def attention_backward(q, k, v, dout, causal=False):
    """The gradients of out = softmax(q k^T / sqrt(Dh), masked) v, from the formulas, no autograd.

    q, dout (B, H, Tq, Dh); k, v (B, H, Tk, Dh) -> (dq, dk, dv), shaped like q, k, v, in the
    inputs' dtype. With P the (B, H, Tq, Tk) probabilities and O = P V:
      dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D = rowsum(dO * O),
      dQ = dS K / sqrt(Dh),  dK = dS^T Q / sqrt(Dh).
    D is the softmax Jacobian collapsed: row i of dS is P_i * (dP_i - sum_j P_ij dP_ij), and
    sum_j P_ij dP_ij = sum_j P_ij (dO_i . V_j) = dO_i . O_i.
    """
    check_attention_inputs(q, k, v)
    dtype = _compute_dtype(q.dtype)
    q32, k32, v32, do32 = (t.to(dtype) for t in (q, k, v, dout))
    scale = 1 / math.sqrt(q.size(-1))
    s = q32 @ k32.transpose(-2, -1) * scale
    if causal:
        n_q, n_k = q.size(2), k.size(2)
        s = s.masked_fill(~_visible(range(n_q), range(n_k), n_q, n_k, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = p @ v32
    dv = p.transpose(-2, -1) @ do32
    dp = do32 @ v32.transpose(-2, -1)
    d = (do32 * out).sum(dim=-1, keepdim=True)
    ds = p * (dp - d)
    dq = ds @ k32 * scale
    dk = ds.transpose(-2, -1) @ q32 * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def flash_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    """Lesson 06's tiled forward, also returning each row's logsumexp.

    q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) -> (out (B, H, Tq, Dh) in q's dtype,
    lse (B, H, Tq)): lse[b, h, i] = log(sum over visible j of exp(s_ij)) with s the scaled
    scores, float32 for half-precision inputs. Since P_ij = exp(s_ij - lse_i), the backward can
    recompute any tile of probabilities from q, k and lse alone: O(T) memory, not O(T^2).
    """
    check_attention_inputs(q, k, v)
    Tq, Tk = q.size(2), k.size(2)
    dtype = _compute_dtype(q.dtype)
    scale = 1 / math.sqrt(q.size(3))
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=dtype, device=q.device)
    for qs in range(0, Tq, block_q):
        qe = min(qs + block_q, Tq)
        qb = q[:, :, qs:qe].to(dtype) * scale
        m = torch.full((*qb.shape[:3], 1), float("-inf"), dtype=dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qb)
        # With a causal mask, key tiles past this query tile's last visible key are skipped.
        k_end = min(Tk, qe + Tk - Tq) if causal else Tk
        for ks in range(0, k_end, block_k):
            ke = min(ks + block_k, Tk)
            kb, vb = k[:, :, ks:ke].to(dtype), v[:, :, ks:ke].to(dtype)
            s = qb @ kb.transpose(-2, -1)
            if causal:
                s = s.masked_fill(~_visible(range(qs, qe), range(ks, ke), Tq, Tk, q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            shift = m_new.clamp(min=torch.finfo(dtype).min)  # a row that has seen only -inf so far
            p = torch.exp(s - shift)
            alpha = torch.exp(m - shift)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ vb
            m = m_new
        out[:, :, qs:qe] = (acc / l).to(q.dtype)
        lse[:, :, qs:qe] = (m + torch.log(l)).squeeze(-1)
    return out, lse


def flash_attention_backward(q, k, v, out, lse, dout, causal=False, block_q=64, block_k=64):
    """FlashAttention-2's backward: the gradients of flash_attention_forward, tile by tile.

    q, out, dout (B, H, Tq, Dh); k, v (B, H, Tk, Dh); lse (B, H, Tq) from the forward ->
    (dq, dk, dv), shaped like q, k, v, in the inputs' dtype. Key tiles are the outer loop:
    each key tile's dK and dV are summed over the query tiles inside and written once, while dQ
    is accumulated across key tiles. D = rowsum(dO * O) is computed once, up front. No more
    than block_q x block_k scores or probabilities exist at once. Causal tiles that are fully
    masked need no work: skipping them is optional (this backward skips them).
    """
    check_attention_inputs(q, k, v)
    Tq, Tk = q.size(2), k.size(2)
    dtype = _compute_dtype(q.dtype)
    scale = 1 / math.sqrt(q.size(3))
    d = (dout.to(dtype) * out.to(dtype)).sum(dim=-1)  # (B, H, Tq)
    lse = lse.to(dtype)
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for ks in range(0, Tk, block_k):
        ke = min(ks + block_k, Tk)
        kb, vb = k[:, :, ks:ke].to(dtype), v[:, :, ks:ke].to(dtype)
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        # With a causal mask, query tiles before the first query that sees key ks are skipped.
        q_start = max(0, ks - (Tk - Tq)) // block_q * block_q if causal else 0
        for qs in range(q_start, Tq, block_q):
            qe = min(qs + block_q, Tq)
            qb, dob = q[:, :, qs:qe].to(dtype), dout[:, :, qs:qe].to(dtype)
            s = qb @ kb.transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(~_visible(range(qs, qe), range(ks, ke), Tq, Tk, q.device), float("-inf"))
            p = torch.exp(s - lse[:, :, qs:qe, None])  # recomputed, exactly the forward's probabilities
            dvb += p.transpose(-2, -1) @ dob
            dp = dob @ vb.transpose(-2, -1)
            ds = p * (dp - d[:, :, qs:qe, None])
            dq[:, :, qs:qe] += ds @ kb * scale
            dkb += ds.transpose(-2, -1) @ qb * scale
        dk[:, :, ks:ke] = dkb.to(k.dtype)
        dv[:, :, ks:ke] = dvb.to(v.dtype)
    return dq.to(q.dtype), dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention that trains with the tiled forward and backward: FlashAttention.apply(q, k, v, causal).

    The forward saves q, k, v, out and lse (O(T) memory beyond the inputs), never P.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = flash_attention_forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal)
        return dq, dk, dv, None


@triton.jit
def _flash_forward_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    stride_b,
    stride_h,
    stride_t,
    stride_kb,
    stride_kh,
    stride_kt,
    n_heads,
    seq_q,
    seq_k,
    head_dim,
    qk_scale,
    CAUSAL: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Lesson 06's _attention_kernel, which also writes each row's logsumexp to LSE.

    One program computes BLOCK_Q rows of one (batch, head). Q, K, V, O as in lesson 06
    (contiguous (B, H, T, Dh)); LSE points at a contiguous float32 (B, H, Tq).
    """
    pid_q, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    cols_d = tl.arange(0, BLOCK_D)
    d_ok = cols_d < head_dim
    q_off = b * stride_b + h * stride_h
    kv_off = b * stride_kb + h * stride_kh
    q = tl.load(
        Q + q_off + rows[:, None] * stride_t + cols_d[None, :], mask=(rows[:, None] < seq_q) & d_ok[None, :], other=0.0
    )
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    last_key = rows + (seq_k - seq_q)
    hi = seq_k
    if CAUSAL:
        hi = tl.minimum(seq_k, (pid_q + 1) * BLOCK_Q + seq_k - seq_q)
    for start in range(0, hi, BLOCK_K):
        keys = start + tl.arange(0, BLOCK_K)
        k_ok = keys < seq_k
        kt = tl.load(
            K + kv_off + keys[None, :] * stride_kt + cols_d[:, None], mask=k_ok[None, :] & d_ok[:, None], other=0.0
        )
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        ok = k_ok[None, :]
        if CAUSAL:
            ok = ok & (keys[None, :] <= last_key[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        alpha = tl.math.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(
            V + kv_off + keys[:, None] * stride_kt + cols_d[None, :], mask=k_ok[:, None] & d_ok[None, :], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PRECISION)
        m_i = m_new
    tl.store(
        O + q_off + rows[:, None] * stride_t + cols_d[None, :],
        (acc / l_i[:, None]).to(O.dtype.element_ty),
        mask=(rows[:, None] < seq_q) & d_ok[None, :],
    )
    # m_i is in log2 units (the scores were scaled by log2(e)): the natural logsumexp is
    # m_i * ln(2) + ln(l_i), the max added back (a row that sees no key gets -inf, as in the torch forward).
    tl.store(LSE + bh * seq_q + rows, m_i * 0.6931471805599453 + tl.log(l_i), mask=rows < seq_q)


def triton_flash_forward(q, k, v, causal=False):
    """flash_attention_forward as a Triton kernel: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh),
    float32 or float16 (bfloat16 too, on a GPU) -> (out (B, H, Tq, Dh) in q's dtype,
    lse (B, H, Tq) float32). Runs on a GPU, or on the CPU under TRITON_INTERPRET=1 (small sizes)."""
    if not HAS_TRITON:
        raise RuntimeError("triton_flash_forward needs Triton (pip install triton; Linux only)")
    check_attention_inputs(q, k, v)
    on_gpu = q.is_cuda
    if q.dtype not in (torch.float32, torch.float16) and not (on_gpu and q.dtype == torch.bfloat16):
        raise ValueError(f"triton_flash_forward takes float32 or float16 (bfloat16 on a GPU only), got {q.dtype}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Tq, Dh = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    tiles = launch_tiles(q)
    grid = (triton.cdiv(Tq, tiles["BLOCK_Q"]), B * H)
    _flash_forward_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        H,
        Tq,
        k.size(2),
        Dh,
        math.log2(math.e) / math.sqrt(Dh),
        CAUSAL=causal,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **tiles,
    )
    return out, lse


class TritonFlashAttention(torch.autograd.Function):
    """FlashAttention with the Triton kernel as its forward and flash_attention_backward as its
    backward: TritonFlashAttention.apply(q, k, v, causal). Saves q, k, v, out and lse, as
    FlashAttention does."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = triton_flash_forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal)
        return dq, dk, dv, None
