"""Weight absorption's trade-off (lesson 08): the plain and the absorbed MLA forward, measured in one run.

    python benchmarks/absorption.py [--prefill 2048] [--cached 65536] [--batch 1] [--json FILE]

Both forms are the reference code on the same MultiHeadLatentAttention (float32, D = 256, 8 heads of
Dh = 32, d_latent = 128 = 4 Dh, DeepSeek-V2's ratio d_c / Dh; no autograd), each taking the
new tokens' latents through a LatentCache: the plain forward up-projects every cached latent to keys
and values and runs PyTorch's fused attention; absorbed_attention folds k_up into the queries and v_up
into the output projection. Two cases: a prefill (T = Tk new tokens) and one decode step (T = 1)
against Tk cached latents. For each form:
  * FLOPs of what differs between the forms (solutions.kv_compression.absorption_flops, the count the
    lesson prints): the absorbed scores are d_latent-wide dot products where the plain ones are Dh-wide,
    and the plain form up-projects every latent;
  * time: the fastest of --repeats runs (other programs add noise, never speed);
  * peak extra memory: each form and case in a fresh process, the peak resident set size (VmHWM, reset
    through /proc/self/clear_refs) above the resident size just before the call (Linux only).
Printed: absorbed / plain of each. No target: the lesson's claim is that a long prefill costs the
absorbed form about d_latent / Dh the attention FLOPs, and a decode step saves it the up-projection of
every latent and the memory of the keys and values. The reference's absorbed_attention puts the heads
into the rows, (B, H * T, d_latent) @ (B, d_latent, Tk), so that with --batch above 1 too it makes no
copy of the latents per head (a matmul against latents[:, None] would: lesson 08, section 3).
"""

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from solutions.kv_compression import (  # noqa: E402
    LatentCache,
    MultiHeadLatentAttention,
    absorbed_attention,
    absorption_flops,
)

D_MODEL, N_HEADS, D_LATENT = 256, 8, 128
CASES = ("prefill", "decode")


def forms(case, prefill, cached, batch):
    """(mla, T, Tk, {"plain": fn, "absorbed": fn}): each fn runs T new tokens of `batch` sequences after
    Tk - T cached latents."""
    T, Tk = (prefill, prefill) if case == "prefill" else (1, cached)
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(D_MODEL, N_HEADS, D_LATENT).eval()
    x = torch.randn(batch, T, D_MODEL)
    cache = LatentCache(batch, Tk, D_LATENT)
    with torch.no_grad():
        cache.update(mla.kv_down(torch.randn(batch, Tk - T, D_MODEL)))

    @torch.no_grad()
    def plain():
        cache.filled = Tk - T  # forget the new latents of the last call
        return mla(x, cache=cache)

    @torch.no_grad()
    def absorbed():
        cache.filled = Tk - T
        return absorbed_attention(mla, x, cache.update(mla.kv_down(x)))

    return mla, T, Tk, {"plain": plain, "absorbed": absorbed}


def status(key):
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def peak(case, form, prefill, cached, batch):
    """Run in a fresh process (--peak): print the peak extra resident bytes of one call."""
    forms(case, 16, 64, batch)[3][form]()  # load the kernels first, at a tiny size
    fn = forms(case, prefill, cached, batch)[3][form]
    with open("/proc/self/clear_refs", "w") as f:  # the peak RSS starts again from the current RSS
        f.write("5")
    before = status("VmRSS")
    fn()
    print(status("VmHWM") - before)


def peak_extra_bytes(case, form, prefill, cached, batch):
    args = [
        sys.executable,
        __file__,
        "--peak",
        case,
        form,
        "--prefill",
        str(prefill),
        "--cached",
        str(cached),
        "--batch",
        str(batch),
    ]
    return int(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def measure(case, prefill, cached, batch, repeats, memory=True):
    """T, Tk, {form: {"flops", "seconds", "peak_bytes"}} and the largest difference of the two outputs."""
    mla, T, Tk, fns = forms(case, prefill, cached, batch)
    flops = {form: batch * n for form, n in zip(fns, absorption_flops(mla, T, Tk))}  # it counts one sequence
    rows, outs = {}, {}
    for form, fn in fns.items():
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            outs[form] = fn()
            best = min(best, time.perf_counter() - start)
        rows[form] = {
            "flops": flops[form],
            "seconds": best,
            "peak_bytes": peak_extra_bytes(case, form, prefill, cached, batch) if memory else None,
        }
    return T, Tk, rows, (outs["plain"] - outs["absorbed"]).abs().max().item()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill", type=int, default=2048, help="tokens of the prefill (default 2048)")
    p.add_argument("--cached", type=int, default=65536, help="latents cached before the decode step (default 65536)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each form; the fastest counts (default 3)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak memory (it needs Linux's /proc)")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--peak", nargs=2, metavar=("CASE", "FORM"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peak:
        return peak(*args.peak, args.prefill, args.cached, args.batch)
    memory = not args.no_memory and sys.platform == "linux"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; MLA D={D_MODEL}, {N_HEADS} heads "
        f"(Dh={D_MODEL // N_HEADS}), d_latent={D_LATENT}, float32, batch {args.batch}\n"
    )
    results = []
    for case in CASES:
        T, Tk, rows, diff = measure(case, args.prefill, args.cached, args.batch, args.repeats, memory)
        print(f"{case} (T = {T}, Tk = {Tk}): the outputs agree to {diff:.0e}")
        for form, r in rows.items():
            mib = f"{r['peak_bytes'] / 2**20:8.1f} MiB" if memory else "       -    "
            print(f"  {form:8s} {r['flops'] / 1e9:7.3f} GFLOP {r['seconds'] * 1e3:9.1f} ms   peak extra memory {mib}")
        plain, absorbed = rows["plain"], rows["absorbed"]
        ratio = {key: absorbed[key] / plain[key] for key in ("flops", "seconds")}
        if memory:
            ratio["peak_bytes"] = absorbed["peak_bytes"] / max(plain["peak_bytes"], 1)
        print(
            f"  absorbed / plain: {ratio['flops']:.2f}x the FLOPs, {ratio['seconds']:.2f}x the time"
            + (f", {ratio['peak_bytes']:.2f}x the peak memory" if memory else "")
            + "\n"
        )
        results.append(
            {
                "case": case,
                "T": T,
                "Tk": Tk,
                "max difference": diff,
                **{
                    form: {
                        "GFLOP": round(r["flops"] / 1e9, 4),
                        "ms": round(r["seconds"] * 1e3, 2),
                        "peak extra MiB": None if r["peak_bytes"] is None else round(r["peak_bytes"] / 2**20, 1),
                    }
                    for form, r in rows.items()
                },
                "absorbed / plain": {key: round(value, 3) for key, value in ratio.items()},
            }
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} CPU threads",
                    "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                    "mla": {"d_model": D_MODEL, "n_heads": N_HEADS, "d_latent": D_LATENT, "dtype": "float32"},
                    "batch": args.batch,
                    "cases": results,
                },
                indent=1,
            )
            + "\n"
        )
    return results


if __name__ == "__main__":
    main()
