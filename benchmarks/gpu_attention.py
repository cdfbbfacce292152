"""Forward attention throughput on a GPU: SDPA's backends, the course's Triton kernel, the torch
FlashAttention of lesson 06 and naive attention.

    python benchmarks/gpu_attention.py              # on an NVIDIA GPU: the full sweep
    python benchmarks/gpu_attention.py --cpu-smoke  # anywhere (and automatically without a GPU): a tiny run

The sweep is sized to take well under 5 minutes on an H200, and --budget (default 270 s) skips
whatever is left when time runs out. (Written without a GPU at hand: the GPU path has not been
run yet; the kernel was compiled for sm_90 ahead of time, see tests/lessons/test_gpu.py.)

FlashAttention's convention: a fixed 16k tokens per batch (batch x T = 16384) and a hidden size of
2048 (heads = 2048 / head_dim), T from 1k to 16k, head_dim 64 and 128, fp16 and bf16, causal or
not. TFLOP/s counts the matmul FLOPs of solutions.gpu.attention_flops (halved when causal).
Every method's time is also given as a ratio to SDPA's default choice, measured in the same run.
Configurations that would not fit in memory, or would take too long (naive and the Python-loop
flash_attention at long T), are skipped and listed with the reason.

The results go to <out>/gpu_attention_<device>.json (default out: benchmarks/results on a GPU;
the CPU smoke run writes only where --out says) and are printed as a table.
"""

import argparse
import datetime
import json
import math
import platform
import re
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from solutions import gpu  # noqa: E402  (sets TRITON_INTERPRET=1 itself when there is no GPU)

BACKENDS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}


class _KernelLog(TorchDispatchMode):
    """Names the fused attention kernel that ran (or 'math' for the composite)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def kernel(self):
        fused = [n for n in self.names if "attention" in n]
        return fused[0] if fused else "math"


def configs(smoke):
    """[(seq_len, batch, heads, head_dim, dtype, causal)] at a fixed number of tokens per batch."""
    if smoke:
        tokens, hidden, lengths, dims, dtypes = 64, 32, (32, 64), (16,), (torch.float32,)
    else:
        tokens, hidden, lengths, dims, dtypes = (
            16384,
            2048,
            (1024, 2048, 4096, 8192, 16384),
            (64, 128),
            (torch.float16, torch.bfloat16),
        )
    return [
        (t, tokens // t, hidden // d, d, dt, causal)
        for dt in dtypes
        for d in dims
        for causal in (False, True)
        for t in lengths
    ]


def bottom_right(q, k, v, causal):
    """SDPA with the course's bottom-right causal mask (T_q = T_k here, so is_causal is the same)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def methods(smoke, device, free=None):
    """{name: (fn(q, k, v, causal) or an SDPA backend, limit(b, h, t, d, dtype) -> reason to skip or None)};
    free: the device memory the limits allow for (default: what is free now)."""
    if free is None:
        free = torch.cuda.mem_get_info()[0] if device == "cuda" else 8 * 2**30

    def too_big(copies, element_bytes=None):
        """Skip when `copies` T x T matrices (of element_bytes each, default the inputs' dtype) would not fit."""

        def limit(b, h, t, d, dt):
            need = copies * b * h * t * t * (element_bytes or dt.itemsize)
            return (
                f"skipped: needs about {need / 2**30:.0f} GiB for {copies} T x T matrices"
                if need > 0.7 * free
                else None
            )

        return limit

    def torch_flash_limit(b, h, t, d, dt):
        block = 256 if device == "cuda" else 32
        tiles = math.ceil(t / block) ** 2
        limit = 1100 if device == "cuda" else 64
        return None if tiles <= limit else f"skipped: {tiles} tiles, too slow as a Python loop (limit {limit})"

    def triton_limit(b, h, t, d, dt):
        if not gpu.HAS_TRITON:
            return "skipped: Triton is not installed"
        if device != "cuda" and t > 32:
            return "skipped: Triton's interpreter, small sizes only"
        return None

    block = 256 if device == "cuda" else 32
    out = {"sdpa": (bottom_right, None)}
    for name, backend in BACKENDS.items():
        out[name] = (backend, too_big(3, 4) if backend == SDPBackend.MATH else None)  # math works in fp32
    out["triton (course kernel)"] = (lambda q, k, v, c: gpu.triton_attention(q, k, v, causal=c), triton_limit)
    out["flash_attention (torch)"] = (
        lambda q, k, v, c: gpu.flash_attention(q, k, v, causal=c, block_q=block, block_k=block),
        torch_flash_limit,
    )
    out["naive"] = (lambda q, k, v, c: gpu.naive_attention(q, k, v, causal=c), too_big(3))
    return out


def run(smoke, budget_s, min_run_time):
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    start = time.perf_counter()
    rows = []
    table = methods(smoke, device)
    for t, b, h, d, dtype, causal in configs(smoke):
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype) for _ in range(3))
        flops = gpu.attention_flops(b, h, t, t, d, causal=causal)
        base = dict(seq_len=t, batch=b, heads=h, head_dim=d, dtype=str(dtype).removeprefix("torch."), causal=causal)
        reference = bottom_right(q, k, v, causal).float()
        default_ms = None
        for name, (fn, limit) in table.items():
            row = dict(
                base,
                method=name,
                kernel=None,
                ms=None,
                tflops=None,
                vs_sdpa_default=None,
                max_abs_err=None,
                status="ok",
                note="",
            )
            reason = limit(b, h, t, d, dtype) if limit else None
            if reason is None and time.perf_counter() - start > budget_s:
                reason = f"skipped: the run's time budget ({budget_s:.0f} s) is spent"
            if reason:
                row.update(status="skipped", note=reason)
                rows.append(row)
                continue
            if isinstance(fn, SDPBackend):
                backend = fn
                fn = lambda q, k, v, c, backend=backend: _with_backend(backend, q, k, v, c)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with _KernelLog() as log:
                        out = fn(q, k, v, causal)
                    ms = gpu.benchmark_ms(fn, q, k, v, causal, min_run_time=min_run_time)
            except torch.OutOfMemoryError:
                row.update(status="skipped", note="skipped: out of memory")
                rows.append(row)
                torch.cuda.empty_cache()
                continue
            except (RuntimeError, ValueError) as e:  # a backend that does not take these inputs
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                row.update(status="unsupported", note=first[:160])
                rows.append(row)
                if device == "cuda":
                    torch.cuda.empty_cache()
                continue
            if name == "sdpa":
                default_ms = ms
            row.update(
                kernel=log.kernel() if name.startswith("sdpa") else name.split(" ")[0],
                ms=_sig(ms),
                tflops=_sig(flops / (ms * 1e-3) / 1e12),
                max_abs_err=_sig(float((out.float() - reference).abs().max())),
            )
            if default_ms:
                row["vs_sdpa_default"] = _sig(default_ms / ms)
            rows.append(row)
            del out
        del q, k, v, reference
        if device == "cuda":
            torch.cuda.empty_cache()
    return device, rows, time.perf_counter() - start


def _sig(x):
    """x to 4 significant digits (a JSON that is readable, without losing small values)."""
    return float(f"{x:.4g}")


def _with_backend(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return bottom_right(q, k, v, causal)


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


def print_table(rows):
    print(
        f"{'T':>6} {'B':>3} {'H':>3} {'Dh':>4} {'dtype':>9} {'causal':>6}  {'method':24} {'kernel':44} "
        f"{'ms':>9} {'TFLOP/s':>8} {'vs SDPA':>8}"
    )
    for r in rows:
        if r["status"] == "ok":
            tail = f"{r['ms']:9.3f} {r['tflops']:8.3g} {r['vs_sdpa_default'] or 0:7.3g}x"
        else:
            tail = r["note"][:60]
        print(
            f"{r['seq_len']:6d} {r['batch']:3d} {r['heads']:3d} {r['head_dim']:4d} {r['dtype']:>9} {r['causal']!s:>6}  "
            f"{r['method']:24} {str(r['kernel'] or '-'):44} {tail}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny CPU run (the default without a GPU)")
    parser.add_argument("--out", type=Path, help="folder for the JSON (default on a GPU: benchmarks/results)")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds after which remaining configs are skipped")
    args = parser.parse_args(argv)
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    if smoke and not args.cpu_smoke:
        print("no CUDA GPU: running the tiny CPU smoke version (--cpu-smoke)")
    device, rows, seconds = run(smoke, args.budget, min_run_time=0.01 if smoke else 0.05)
    print_table(rows)
    result = {
        "benchmark": "gpu_attention",
        "mode": "cpu-smoke" if smoke else "gpu",
        "device": device_name(device),
        "torch": torch.__version__,
        "triton": getattr(gpu.triton, "__version__", None) if gpu.HAS_TRITON else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tokens_per_batch": rows[0]["seq_len"] * rows[0]["batch"] if rows else None,
        "hidden": rows[0]["heads"] * rows[0]["head_dim"] if rows else None,
        "flops": "attention_flops (4*B*H*T*T*Dh, halved when causal)",
        "seconds": round(seconds, 1),
        "results": rows,
    }
    out_dir = args.out or (None if smoke else ROOT / "benchmarks" / "results")
    if out_dir is None:
        print(f"\n{seconds:.1f} s. Smoke run: pass --out DIR to keep the JSON.")
        return result
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    path = out_dir / f"gpu_attention_{slug}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{seconds:.1f} s; wrote {path}")
    return result


if __name__ == "__main__":
    main()
