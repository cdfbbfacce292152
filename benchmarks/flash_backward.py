"""Lesson 09: one training step of causal attention (forward, then backward) on the CPU, autograd through naive
attention against the tiled forward and backward of solutions.flash_backward, as T grows.

    python benchmarks/flash_backward.py [--lengths 256 512 ... 8192] [--budget 240]
        [--json benchmarks/results/flash_backward_cpu.json]
    python benchmarks/flash_backward.py --cuda [--json ...]   # on a GPU: the step of each method there (see gpu_step)

For each T and method, in a fresh process (Linux only): the peak extra memory of one step, the peak resident set
size (VmHWM, reset through /proc/self/clear_refs) above the resident size just before the step, then the median
wall time of a few more steps. Inputs B=1, H=4, Dh=64, float32; tiles of 256 x 256 (few enough that the Python
loops do not dominate the time). The ratios naive / tiled (memory) and tiled / naive (time) are measured in the
same run. Naive attention's step holds several (H, T, T) tensors (the mask, the scores, P, then dP and dS), so its
memory grows as T^2; the tiled step holds the gradients, out, lse and D, and a few tiles: it grows as T.
--budget (seconds) skips the lengths left when it runs out, and says so.
"""

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

STEP = """
import json, statistics, sys, time, torch
sys.path.insert(0, {repo!r})
from solutions.flash_backward import flash_attention_backward, flash_attention_forward
from solutions.gpu import naive_attention
torch.set_num_threads({threads})
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
def naive(q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    naive_attention(q, k, v, causal=True).backward(do)
    return q.grad, k.grad, v.grad
def tiled(q, k, v, do, block={block}):
    out, lse = flash_attention_forward(q, k, v, True, block, block)
    return flash_attention_backward(q, k, v, out, lse, do, True, block, block)
step = {{"naive": naive, "tiled": tiled}}[{method!r}]
torch.manual_seed(0)
q, k, v, do = (torch.randn(1, {heads}, {T}, 64) for _ in range(4))
step(*(t[:, :, :300] for t in (q, k, v, do)))  # load the kernels and warm the allocator first
open("/proc/self/clear_refs", "w").write("5")  # the peak RSS starts again from the current RSS
before = status("VmRSS")
grads = step(q, k, v, do)
peak = status("VmHWM") - before
del grads
times = []
for _ in range({repeats}):
    start = time.perf_counter()
    step(q, k, v, do)
    times.append(time.perf_counter() - start)
print(json.dumps({{"peak_bytes": peak, "seconds": statistics.median(times)}}))
"""


def measure(method, T, heads, block, threads, repeats):
    code = STEP.format(repo=str(REPO), method=method, T=T, heads=heads, block=block, threads=threads, repeats=repeats)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{method} at T={T} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def gpu_step(method, T, heads, dtype, repeats):
    """On the GPU, one training step of causal attention (B=1, Dh=64): peak memory above what was allocated
    before it (torch.cuda.max_memory_allocated) and the median time of `repeats` more steps (CUDA events).
    Methods: naive (autograd through naive attention), tiled (FlashAttention, the torch forward and backward),
    triton (TritonFlashAttention: the Triton forward, the torch backward), sdpa (PyTorch's flash backend)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(REPO))
    from solutions.flash_backward import FlashAttention, TritonFlashAttention
    from solutions.gpu import naive_attention

    fns = {
        "naive": lambda q, k, v: naive_attention(q, k, v, True),
        "tiled": lambda q, k, v: FlashAttention.apply(q, k, v, True),
        "triton": lambda q, k, v: TritonFlashAttention.apply(q, k, v, True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }

    def step():
        q, k, v = (
            t.requires_grad_() for t in (torch.randn(1, heads, T, 64, device="cuda", dtype=dtype) for _ in range(3))
        )
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if method == "sdpa" else contextlib.nullcontext():
            fns[method](q, k, v).backward(torch.ones_like(q))

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return {"peak_bytes": peak, "seconds": statistics.median(times)}


def main_cuda(args):
    """The GPU version of the table: every method at every length, in float16 (the torch passes in their
    default tiles of 64; the Triton forward in solutions.gpu.attention_tiles' for this card)."""
    name = torch.cuda.get_device_name()
    print(
        f"torch {torch.__version__} on {name}; causal attention, B=1, H={args.heads}, Dh=64, float16; one forward + "
        f"backward step (inputs included in the time, not in the memory)\n"
    )
    methods = ("naive", "tiled", "triton", "sdpa")
    print(f"{'T':>6} " + " ".join(f"{m + ' MiB':>11} {m + ' ms':>10}" for m in methods))
    start, rows, skipped = time.perf_counter(), [], []
    for T in args.lengths:
        if time.perf_counter() - start > args.budget:
            skipped.append(T)
            continue
        row = {"T": T}
        for m in methods:
            try:
                got = gpu_step(m, T, args.heads, torch.float16, args.repeats)
                row[m + "_mib"], row[m + "_ms"] = got["peak_bytes"] / 2**20, got["seconds"] * 1e3
            except (RuntimeError, ValueError) as e:  # out of memory, or a backend this card lacks
                row[m + "_note"] = str(e).splitlines()[0][:120]
                torch.cuda.empty_cache()
        rows.append(row)
        print(
            f"{T:6d} "
            + " ".join(
                f"{row.get(m + '_mib', float('nan')):11.1f} {row.get(m + '_ms', float('nan')):10.2f}" for m in methods
            ),
            flush=True,
        )
    if skipped:
        print(f"skipped (over the {args.budget:.0f} s budget): T = {', '.join(map(str, skipped))}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": name,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "date": datetime.date.today().isoformat(),
                    "setup": {
                        "B": 1,
                        "H": args.heads,
                        "Dh": 64,
                        "dtype": "float16",
                        "causal": True,
                        "repeats": args.repeats,
                    },
                    "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows],
                    "skipped": skipped,
                },
                indent=1,
            )
            + "\n"
        )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=256, help="the tiled step's block_q = block_k")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=3, help="timed steps per method and length (the median is kept)")
    p.add_argument("--budget", type=float, default=240, help="seconds; lengths left when it runs out are skipped")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--cuda", action="store_true", help="measure on the GPU (naive, tiled, triton and sdpa)")
    args = p.parse_args()
    if args.cuda:
        if not torch.cuda.is_available():
            sys.exit("--cuda: no CUDA GPU here")
        return main_cuda(args)
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("this benchmark reads the peak resident set size from /proc (Linux only)")
    print(
        f"torch {torch.__version__}, {args.threads} threads; causal attention, B=1, H={args.heads}, Dh=64, "
        f"float32, tiles of {args.block}; one forward + backward step\n"
    )
    print(
        f"{'T':>6} {'naive MiB':>10} {'tiled MiB':>10} {'naive/tiled':>12} "
        f"{'naive s':>9} {'tiled s':>9} {'tiled/naive':>12}"
    )
    start, rows, skipped = time.perf_counter(), [], []
    for T in args.lengths:
        if time.perf_counter() - start > args.budget:
            skipped.append(T)
            continue
        naive, tiled = (measure(m, T, args.heads, args.block, args.threads, args.repeats) for m in ("naive", "tiled"))
        row = {
            "T": T,
            "naive_mib": naive["peak_bytes"] / 2**20,
            "tiled_mib": tiled["peak_bytes"] / 2**20,
            "naive_s": naive["seconds"],
            "tiled_s": tiled["seconds"],
        }
        row["memory_ratio"] = row["naive_mib"] / max(row["tiled_mib"], 1 / 2**20)
        row["time_ratio"] = row["tiled_s"] / row["naive_s"]
        rows.append(row)
        print(
            f"{T:6d} {row['naive_mib']:10.1f} {row['tiled_mib']:10.1f} {row['memory_ratio']:11.1f}x "
            f"{row['naive_s']:9.3f} {row['tiled_s']:9.3f} {row['time_ratio']:11.2f}x",
            flush=True,
        )
    if skipped:
        print(f"skipped (over the {args.budget:.0f} s budget): T = {', '.join(map(str, skipped))}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, {args.threads} CPU threads",
                    "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                    "setup": {
                        "B": 1,
                        "H": args.heads,
                        "Dh": 64,
                        "dtype": "float32",
                        "causal": True,
                        "block": args.block,
                        "repeats": args.repeats,
                    },
                    "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows],
                    "skipped": skipped,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
