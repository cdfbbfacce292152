"""Lesson 06: making attention fast.

FLOP counting, the online softmax, FlashAttention's tiled forward in torch, a fused QKV
projection, a warm-up Triton kernel (a row softmax), and the same forward as a Triton kernel.
Layout (B, H, T, Dh); the causal mask is bottom-right aligned (query i sees key j iff
j <= i + Tk - Tq).

Besides the graded names, the lesson provides (and benchmarks/gpu_attention.py uses) a naive
attention, a timer and a peak-memory meter, and the launch configuration of the attention kernels
on a GPU, chosen from its shared memory (attention_tiles; launch_tiles for a tensor's device).
"""

import contextlib
import math
import os
import statistics
import sys
from types import SimpleNamespace

import torch
from torch import nn
from torch.utils import benchmark

# Without a GPU, Triton kernels run in Triton's interpreter. Triton reads this variable when a
# kernel is defined (@triton.jit), so it is set before any kernel is.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # Triton is optional (it installs on Linux only); the rest of the lesson works without it.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # stand-ins, just enough to define (never to run) the kernel below
    HAS_TRITON = False
    triton = SimpleNamespace(jit=lambda fn: fn)
    tl = SimpleNamespace(constexpr=None)


def naive_attention(q, k, v, causal=False):
    """Attention the direct way: the whole (B, H, Tq, Tk) score matrix is built, then softmaxed,
    then multiplied by v. q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) -> (B, H, Tq, Dh);
    causal is bottom-right aligned."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal:
        n_q, n_k = q.size(-2), k.size(-2)
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def check_attention_inputs(q, k, v):
    """ValueError unless q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) share dtype and device."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.size(3) != k.size(3):
        raise ValueError(
            f"expected q (B, H, Tq, Dh), k and v (B, H, Tk, Dh); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must share dtype and device; got {q.dtype}/{q.device}, {k.dtype}/{k.device}, {v.dtype}/{v.device}"
        )


def attention_flops(batch, n_heads, seq_q, seq_k, head_dim, causal=False):
    """Matrix-multiply FLOPs of the attention forward: QK^T and PV, 2*Tq*Tk*Dh each (a
    multiply-add is 2 FLOPs), per batch and head. A causal mask skips about half."""
    flops = 4 * batch * n_heads * seq_q * seq_k * head_dim
    return flops // 2 if causal else flops


def online_softmax(x, block_size):
    """softmax(x, dim=-1), reading the last dim once, block by block, with a running max and sum.

    x (..., N) -> (..., N). When the max grows from m to m', the sum so far was taken relative
    to m, so it is rescaled by exp(m - m') before the new block's terms are added.
    """
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype, device=x.device)
    s = torch.zeros_like(m)
    for start in range(0, x.size(-1), block_size):
        block = x[..., start : start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        # A finite shift keeps exp() away from (-inf) - (-inf) while a row has seen only -inf.
        shift = m_new.clamp(min=torch.finfo(x.dtype).min)
        s = s * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / s


def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    """FlashAttention's forward (Dao et al. 2022) in torch: q (B, H, Tq, Dh), k and v
    (B, H, Tk, Dh) -> (B, H, Tq, Dh), equal to scaled_dot_product_attention.

    Each block_q tile of queries walks over block_k tiles of keys keeping a running max m,
    a running sum l and an unnormalised output acc; no more than block_q x block_k scores
    exist at once, so the extra memory is O(T), not O(T^2). Half precision accumulates in fp32.
    """
    check_attention_inputs(q, k, v)
    Tq, Tk = q.size(2), k.size(2)
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    scale = 1 / math.sqrt(q.size(3))
    out = torch.empty_like(q)
    for qs in range(0, Tq, block_q):
        qb = q[:, :, qs : qs + block_q].to(acc_dtype) * scale
        n = qb.size(2)
        m = torch.full((*qb.shape[:3], 1), float("-inf"), dtype=acc_dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qb)
        rows = torch.arange(qs, qs + n, device=q.device)[:, None] + (Tk - Tq)  # last key each query sees
        # With a causal mask, key tiles past this query tile's last visible key are skipped.
        k_end = min(Tk, qs + n + Tk - Tq) if causal else Tk
        for ks in range(0, k_end, block_k):
            kb = k[:, :, ks : ks + block_k].to(acc_dtype)
            vb = v[:, :, ks : ks + block_k].to(acc_dtype)
            s = qb @ kb.transpose(-2, -1)
            if causal:
                cols = torch.arange(ks, ks + kb.size(2), device=q.device)
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            shift = m_new.clamp(min=torch.finfo(acc_dtype).min)
            p = torch.exp(s - shift)
            alpha = torch.exp(m - shift)  # rescales what was summed under the old max
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ vb
            m = m_new
        out[:, :, qs : qs + n] = (acc / l).to(q.dtype)
    return out


def fuse_qkv(attn):
    """One nn.Linear (D -> 3D) equal to attn's q_proj, k_proj, v_proj stacked in that order:
    q, k, v = fused(x).split(D, dim=-1). Biases are stacked too, if attn has them."""
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    w = attn.q_proj.weight
    fused = nn.Linear(
        w.size(1),
        sum(p.weight.size(0) for p in projs),
        bias=attn.q_proj.bias is not None,
        dtype=w.dtype,
        device=w.device,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in projs]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in projs]))
    return fused


@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    """One program computes one row of Y = softmax(X, dim=-1).

    X and Y point at (rows, n_cols) tensors whose last stride is 1; BLOCK, a power of two >= n_cols,
    holds the whole row. The tail past n_cols is read as -inf (exp gives it weight 0, and it cannot
    raise the max) and never written.
    """
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))  # max-subtracted: exp never overflows, the largest term is 1
    tl.store(Y + row * stride_y + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=ok)


def triton_softmax(x):
    """softmax(x, dim=-1) as a Triton kernel: x (rows, cols), float32 or float16, cols <= 4096 ->
    (rows, cols) in x's dtype. One program per row, the row in one block. Runs on a GPU, or on the
    CPU under TRITON_INTERPRET=1."""
    if not HAS_TRITON:
        raise RuntimeError("triton_softmax needs Triton (pip install triton; Linux only)")
    if x.dim() != 2 or x.size(1) > 4096 or x.dtype not in (torch.float32, torch.float16):
        raise ValueError(
            f"triton_softmax takes a 2-D float32 or float16 tensor of at most 4096 columns, "
            f"got {tuple(x.shape)} {x.dtype}"
        )
    x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty_like(x)
    _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))
    return out


@triton.jit
def _attention_kernel(
    Q,
    K,
    V,
    O,
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
    """One program computes BLOCK_Q rows of the output of one (batch, head).

    Q, K, V, O point at contiguous (B, H, T, Dh) tensors (so the last stride is 1); q and o share
    the strides stride_b/h/t, k and v share stride_kb/kh/kt. qk_scale = log2(e) / sqrt(Dh):
    the scores come out in log2 units, so exp2 gives the softmax's exponentials.
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
    last_key = rows + (seq_k - seq_q)  # bottom-right causal: query i sees keys <= i + Tk - Tq
    hi = seq_k
    if CAUSAL:
        hi = tl.minimum(seq_k, (pid_q + 1) * BLOCK_Q + seq_k - seq_q)
    for start in range(0, hi, BLOCK_K):
        keys = start + tl.arange(0, BLOCK_K)
        k_ok = keys < seq_k
        kt = tl.load(
            K + kv_off + keys[None, :] * stride_kt + cols_d[:, None], mask=k_ok[None, :] & d_ok[:, None], other=0.0
        )  # (BLOCK_D, BLOCK_K)
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
    acc = acc / l_i[:, None]
    tl.store(
        O + q_off + rows[:, None] * stride_t + cols_d[None, :],
        acc.to(O.dtype.element_ty),
        mask=(rows[:, None] < seq_q) & d_ok[None, :],
    )


def attention_tiles(capability, max_shared_bytes, dtype, head_dim):
    """The launch configuration of the attention kernels on one GPU: capability (major, minor), the
    shared memory one block may use (bytes), a torch dtype and the head dimension -> dict of BLOCK_Q,
    BLOCK_K, BLOCK_D, num_warps, num_stages. ValueError for bfloat16 below (8, 0), which has no
    bfloat16 arithmetic, and for a dtype other than float16, bfloat16, float32.

    FlashAttention sizes its tiles from on-chip memory M: key tiles of B_c = ceil(M / 4d) rows, so that
    the tiles of K and V (B_c x d each) and those of Q and O fit in M together. Here M is shared memory
    in bytes, and what one program keeps there is the Q tile, num_stages copies of the K and V tiles
    (from Ampere, sm_80, on, the next tiles load while this one computes; before it, one stage) and, on
    some cards, the block of float32 scores on its way between layouts. Tiles shrink, queries first,
    until that fits; the course repository's benchmarks/triton_fit.py (not the triton_fit.py beside a
    lesson) compiles each choice for each card and measures it (shared memory, registers and spills).
    """
    capability = tuple(capability)
    if dtype == torch.bfloat16 and capability < (8, 0):
        raise ValueError(
            f"bfloat16 needs compute capability 8.0 (Ampere) or newer; this GPU has "
            f"{capability[0]}.{capability[1]}: use float16 or float32"
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the attention kernels take float16, bfloat16 or float32, got {dtype}")
    size = dtype.itemsize
    block_d = max(16, 1 << (head_dim - 1).bit_length())  # tl.dot needs blocks of at least 16
    stages = 2 if capability >= (8, 0) else 1

    def shared(block_q, block_k):
        return size * block_d * (block_q + 2 * stages * block_k) + 4 * block_q * block_k

    block_k = 16
    while block_k < 64 and 2 * block_k <= max_shared_bytes // (4 * block_d * size):  # B_c = M / 4d, at most 64
        block_k *= 2
    block_q = 2 * block_k
    if size == 4 and block_d >= 64:
        # float32 products ("ieee") run on the CUDA cores, not the tensor cores, with the operands in registers
        # too: larger tiles spill them to memory (ptxas -v, in the course repository's benchmarks/results/)
        block_q, block_k = min(block_q, 64), min(block_k, 4096 // block_d)
    while shared(block_q, block_k) > max_shared_bytes and block_q > 16:
        if block_q > block_k:
            block_q //= 2
        elif block_k > 16:
            block_k //= 2
        else:
            break
    return {
        "BLOCK_Q": block_q,
        "BLOCK_K": block_k,
        "BLOCK_D": block_d,
        # more warps share the registers of larger tiles (fewer spilled, by ptxas -v's figures)
        "num_warps": 8
        if block_q >= 128 or block_q * block_d >= 8192 or (size == 4 and block_q >= 64 and block_d >= 64)
        else 4,
        "num_stages": stages,
    }


def launch_tiles(q):
    """The tiles a launcher uses for q (B, H, T, Dh): attention_tiles of q's GPU; on the CPU, in
    Triton's interpreter, small tiles (it runs every program one after another, in numpy)."""
    if not q.is_cuda:
        return {"BLOCK_Q": 16, "BLOCK_K": 16, "BLOCK_D": max(16, 1 << (q.size(-1) - 1).bit_length())}
    # What Triton checks a launch against: the most shared memory a block may opt in to, from the driver
    shared = triton.runtime.driver.active.utils.get_device_properties(q.device.index)["max_shared_mem"]
    return attention_tiles(torch.cuda.get_device_capability(q.device), shared, q.dtype, q.size(-1))


def triton_attention(q, k, v, causal=False):
    """The FlashAttention forward as a Triton kernel: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh),
    float32 or float16 (bfloat16 too, on a GPU) -> (B, H, Tq, Dh). Runs on a GPU, or on the CPU
    under TRITON_INTERPRET=1 (Triton's interpreter: small sizes only)."""
    if not HAS_TRITON:
        raise RuntimeError("triton_attention needs Triton (pip install triton; Linux only)")
    check_attention_inputs(q, k, v)
    on_gpu = q.is_cuda
    if q.dtype not in (torch.float32, torch.float16) and not (on_gpu and q.dtype == torch.bfloat16):
        raise ValueError(
            f"triton_attention takes float32 or float16 (bfloat16 on a GPU only: "
            f"the interpreter has no bfloat16), got {q.dtype}"
        )
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Tq, Dh = q.shape
    out = torch.empty_like(q)
    tiles = launch_tiles(q)
    grid = (triton.cdiv(Tq, tiles["BLOCK_Q"]), B * H)
    _attention_kernel[grid](
        q,
        k,
        v,
        out,
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
        # fp32 inputs: exact products, not TF32, so the result matches SDPA.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **tiles,
    )
    return out


def benchmark_ms(fn, *args, min_run_time=0.1):
    """Milliseconds per call of fn(*args), after a warm-up call. On a GPU: CUDA events around
    repeated calls (kernels run asynchronously, so a wall clock would time only the launches).
    On the CPU: torch.utils.benchmark, with num_threads set (it would time one thread otherwise)."""
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        fn(*args)  # warm-up: compilation, autotuning, allocator
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times, total = [], 0.0
        while len(times) < 3 or (total < min_run_time * 1e3 and len(times) < 100):
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            total += times[-1]
        return statistics.median(times)
    fn(*args)
    timer = benchmark.Timer(stmt="fn(*args)", globals={"fn": fn, "args": args}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the process's stderr (file descriptor 2): the profiler's C++ layer prints
    start/stop lines there, which would show in a notebook as error output."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn, *args):
    """Peak memory allocated while fn(*args) runs, above what was allocated before it (its
    output included). On a GPU: torch.cuda.max_memory_allocated. On the CPU torch keeps no such
    counter, so the allocator's events are recorded with torch.profiler (profile_memory=True)
    and replayed: a running sum of allocations (+) and frees (-), whose maximum is the peak."""
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = fn(*args)
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - before
    with (
        _quiet_stderr(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        out = fn(*args)
    del out
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak
