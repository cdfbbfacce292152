"""The reference solutions against their baselines, measured in one run on this machine.

    python benchmarks/solutions.py [--json benchmarks/results/solutions_cpu.json]

1. MultiHeadAttention forward vs torch.nn.MultiheadAttention (B=8, T=256, D=512, H=8, no weights),
   with autograd on (training) and off (inference, where PyTorch takes its fused fast path).
2. Tokens per second of generate() with and without the KV cache (lesson 05's Decoder, 512 new tokens),
   at the lesson's size and at a larger one: the cache saves recomputing the prefix, which costs more
   the wider the model, while a cached step of a tiny model is mostly Python overhead.
3. Peak extra memory of flash_attention vs naive attention at T=4096: each in a fresh process,
   the peak resident set size (VmHWM, reset through /proc/self/clear_refs) above the resident
   size just before the call (Linux only). solutions.gpu.peak_memory_bytes replays the profiler's
   allocation events instead, portable but about 10x slower for a 4096-token flash_attention.
Targets (not tests): MHA at most 0.6x torch's time; cache at least 10x the tokens/s; flash at
most 1/20 of naive's extra memory.
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
from torch.utils import benchmark

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from solutions.kv_cache import Decoder, generate  # noqa: E402
from solutions.multi_head import MultiHeadAttention, load_torch_mha  # noqa: E402


def mha_vs_torch(threads):
    B, T, D, H = 8, 256, 512, 8
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True)
    ours = load_torch_mha(MultiHeadAttention(D, H), ref)
    x = torch.randn(B, T, D)
    rows = []
    for mode, grad in (("training (autograd on)", True), ("inference (no_grad, eval)", False)):
        ref.train(grad), ours.train(grad)
        times = {}
        for name, stmt in (("ours", "ours(x)"), ("torch", "ref(x, x, x, need_weights=False)")):
            with torch.set_grad_enabled(grad):
                t = benchmark.Timer(stmt, globals=dict(ours=ours, ref=ref, x=x), num_threads=threads)
                times[name] = t.blocked_autorange(min_run_time=1.0).median
        rows.append((mode, times["ours"], times["torch"]))
    return rows


SIZES = {"d_model 128, 4 layers (the lesson's)": (128, 4), "d_model 384, 6 layers": (384, 6)}


def generation(d_model, n_layers):
    """(tokens/s with the cache, without) for 512 new tokens after a 16-token prompt."""
    torch.manual_seed(0)
    model = Decoder(vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=8, n_kv_heads=2, max_seq_len=1024)
    prompt = torch.randint(256, (1, 16))
    out = {}
    for use_cache in (True, False):
        start = time.perf_counter()
        tokens = generate(model.eval(), prompt, 512, use_cache=use_cache)
        out[use_cache] = (512 / (time.perf_counter() - start), tokens)
    assert torch.equal(out[True][1], out[False][1]), "cached and uncached generation disagree"
    return out[True][0], out[False][0]


PEAK = """
import sys, torch
sys.path.insert(0, {repo!r})
from solutions.gpu import flash_attention
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 4096, 64) for _ in range(3))
naive = lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v
fn = {{"naive": naive, "flash": flash_attention}}[{which!r}]
fn(q[:, :, :64], k[:, :, :64], v[:, :, :64])  # load the kernels first
open("/proc/self/clear_refs", "w").write("5")  # the peak RSS starts again from the current RSS
before = status("VmRSS")
out = fn(q, k, v)
print(status("VmHWM") - before)
"""


def peak_extra_bytes(which):
    code = PEAK.format(repo=str(REPO), which=which)
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = p.parse_args()
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads\n")
    print("1. MultiHeadAttention forward, B=8 T=256 D=512 H=8, need_weights=False")
    mha = mha_vs_torch(threads)
    for mode, ours, ref in mha:
        print(
            f"   {mode:27s} ours {ours * 1e3:7.2f} ms   torch {ref * 1e3:7.2f} ms   "
            f"ratio {ours / ref:.2f}x (target <= 0.6x)"
        )
    print("\n2. generate(), 512 new tokens after a 16-token prompt (8 heads, 2 KV heads); tokens identical")
    gen = {name: generation(*size) for name, size in SIZES.items()}
    for name, (cached, uncached) in gen.items():
        print(
            f"   {name:36s} with cache {cached:7.1f} tokens/s   without {uncached:6.1f}   "
            f"speedup {cached / uncached:.1f}x (target >= 10x)"
        )
    naive, flash = peak_extra_bytes("naive"), peak_extra_bytes("flash")
    print("\n3. Peak extra memory at T=4096 (B=1, H=4, Dh=64, float32)")
    print(
        f"   naive {naive / 2**20:8.1f} MiB   flash_attention {flash / 2**20:8.1f} MiB   "
        f"ratio 1/{naive / max(flash, 1):.0f} (target <= 1/20)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, {threads} CPU threads",
                    "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                    "mha_forward_ms": [
                        {
                            "mode": m,
                            "ours": round(o * 1e3, 2),
                            "torch.nn.MultiheadAttention": round(r * 1e3, 2),
                            "ratio": round(o / r, 2),
                        }
                        for m, o, r in mha
                    ],
                    "generate_512_tokens_per_s": [
                        {
                            "model": name,
                            "with cache": round(c, 1),
                            "without cache": round(u, 1),
                            "speedup": round(c / u, 1),
                        }
                        for name, (c, u) in gen.items()
                    ],
                    "peak_extra_memory_mib_T4096": {
                        "naive": round(naive / 2**20, 1),
                        "flash_attention": round(flash / 2**20, 1),
                        "ratio": f"1/{naive / max(flash, 1):.0f}",
                    },
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
