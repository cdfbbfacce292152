"""Does every Triton kernel of the course compile for the GPUs students have, and fit them?

    python benchmarks/triton_fit.py                  # every kernel, every card of ARCHES (CPU or GPU)
    python benchmarks/triton_fit.py --device         # on a GPU: against this card's own limits
    python benchmarks/triton_fit.py --arch 75 80     # some cards only

No GPU is needed: Triton compiles ahead of time for a named target (autograder/triton_fit.py). The
kernels are the solutions' (solutions/gpu.py, solutions/flash_backward.py) and the source notebooks'
(lessons 06 and 09; one row where a notebook's kernel is the solutions' own). Each is compiled the
way its launcher launches it: the attention kernels at the tiles solutions.gpu.attention_tiles picks
for the card, in float16, bfloat16 and float32, for every BLOCK_D the lessons launch with (head_dim
16 to 128); the softmax kernel at BLOCK 1024 and 4096 (cols <= 4096); the lesson's demo kernel as
its cell launches it. A fresh compile takes 1-2 s in float16 on sm_80+, up to 15 s in float32 on
sm_75; Triton caches what it compiled, so a second run takes seconds.

Each row: compiles or the compiler's complaint, the shared memory one program needs against the
card's limit per block, registers per thread and spilled bytes (ptxas -v). The rows go to
benchmarks/results/triton_fit.json (with --device: triton_fit_<gpu name>.json) and a table.
"""

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

from autograder import notebook as nbk  # noqa: E402
from autograder import triton_fit as fit  # noqa: E402
from solutions import flash_backward, gpu  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
HEAD_DIMS = (16, 32, 64, 128)  # BLOCK_D of every head_dim the lessons and benchmarks launch with (4 to 128)
SOFTMAX_BLOCKS = (1024, 4096)
NOTEBOOKS = {
    "06_gpu": "lessons/06_gpu/06_gpu.ipynb",
    "09_flash_backward": "lessons/09_flash_backward/09_flash_backward.ipynb",
}


def kernels():
    """[(kind, where, (name, [source]))]: each distinct kernel once, with every place that defines it."""
    found = [
        ("softmax", "solutions/gpu.py", fit.kernel_source(gpu._softmax_kernel)),
        ("attention", "solutions/gpu.py", fit.kernel_source(gpu._attention_kernel)),
        ("attention", "solutions/flash_backward.py", fit.kernel_source(flash_backward._flash_forward_kernel)),
    ]
    for lesson, path in NOTEBOOKS.items():
        cells = [nbk.without_markers(nbk.source(c)) for c in nbk.code_cells(nbk.read(ROOT / path))]
        for name, kernel in fit.notebook_kernels(cells).items():
            same = [i for i, (_, _, k) in enumerate(found) if k == kernel]
            if same:
                kind, where, k = found[same[0]]
                found[same[0]] = (kind, f"{where}, lesson {lesson}", k)
            else:
                kind = (
                    "attention"
                    if "BLOCK_Q" in fit.parameters(kernel)
                    else "softmax"
                    if name == "_softmax_kernel"
                    else "demo"
                )
                found.append((kind, f"lesson {lesson}", kernel))
    return found


def plan(cards):
    """(jobs, refused): the compilations, and the rows a launcher refuses before compiling (bfloat16
    on a card without it). cards: {arch: (name, limit)}."""
    jobs, refused = [], []
    for kind, where, kernel in kernels():
        for arch, (card, limit) in cards.items():
            if kind == "attention":
                for dtype in DTYPES:
                    for head_dim in HEAD_DIMS:
                        try:
                            tiles = gpu.attention_tiles((arch // 10, arch % 10), limit, DTYPES[dtype], head_dim)
                        except ValueError as e:
                            refused.append(
                                dict(
                                    kernel=kernel[0],
                                    where=where,
                                    label=f"{dtype} head_dim {head_dim}",
                                    arch=arch,
                                    card=card,
                                    limit=limit,
                                    refused=str(e),
                                )
                            )
                            continue
                        jobs.append(
                            (where, fit.attention_job(kernel, arch, dtype, head_dim, tiles, card=(card, limit)))
                        )
            elif kind == "softmax":
                for dtype in ("float16", "float32"):
                    for block in SOFTMAX_BLOCKS:
                        jobs.append((where, fit.softmax_job(kernel, arch, dtype, block, card=(card, limit))))
            else:  # lesson 06's first kernel, as its demo launches it
                jobs.append(
                    (
                        where,
                        fit.job(
                            kernel,
                            {"X": "*fp32", "Y": "*fp32", "n": "i32"},
                            {"BLOCK": 4},
                            arch,
                            label="float32 BLOCK 4",
                            card=(card, limit),
                        ),
                    )
                )
    return jobs, refused


def tiles_of(r):
    c = r.get("constexprs", {})
    return f"{c['BLOCK_Q']}x{c['BLOCK_K']} s{r['num_stages']} w{r['num_warps']}" if "BLOCK_Q" in c else ""


def print_table(rows):
    for kernel in sorted({(r["kernel"], r["where"]) for r in rows}):
        print(f"{kernel[0]}: {kernel[1]}")
    print(
        f"\n{'kernel':22} {'config':22} {'card':11} {'tiles':16} "
        f"{'shared':>8} {'limit':>7} {'regs':>5} {'spills':>7}  verdict"
    )
    for r in rows:
        card = f"{r['card']} sm_{r['arch']}"
        if r.get("refused"):
            print(
                f"{r['kernel']:22} {r['label']:22} {card:11} {'':16} {'':>8} {'':>7} {'':>5} {'':>7}  launcher refuses"
            )
            continue
        verdict = "fits" if r["fits"] else ("DOES NOT FIT" if r["compiles"] else f"DOES NOT COMPILE: {r['error']}")
        shared = f"{r['shared'] / 1024:.1f}K" if r["shared"] is not None else "-"
        print(
            f"{r['kernel']:22} {r['label']:22} {card:11} {tiles_of(r):16} {shared:>8} {r['limit'] // 1024:>6}K "
            f"{r['registers'] or '-':>5} {r['spill_stores'] if r['spill_stores'] is not None else '-':>7}  {verdict}"
        )


def device_card():
    """{arch: (name, limit)} of this machine's GPU, from torch."""
    import triton

    major, minor = torch.cuda.get_device_capability(0)
    limit = triton.runtime.driver.active.utils.get_device_properties(0)["max_shared_mem"]  # as launch_tiles reads it
    return {major * 10 + minor: (torch.cuda.get_device_name(0), limit)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", choices=sorted(fit.ARCHES), help="cards to compile for")
    parser.add_argument("--device", action="store_true", help="against this machine's GPU and its limits")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the JSON")
    args = parser.parse_args(argv)
    if not gpu.HAS_TRITON:
        print("skipped: Triton is not installed (pip install triton; Linux only)")
        return None
    if args.device:
        if not torch.cuda.is_available():
            print("skipped: --device needs a CUDA GPU")
            return None
        cards = device_card()
    else:
        cards = {a: fit.ARCHES[a] for a in (args.arch or fit.ARCHES)}
    start = time.perf_counter()
    jobs, refused = plan(cards)
    results = fit.compile_jobs([j for _, j in jobs], ptxas=True, timeout=3600)
    rows = [dict(r, where=where, constexprs=j["constexprs"]) for (where, j), r in zip(jobs, results)] + refused
    rows.sort(key=lambda r: (r["kernel"], r["label"], r["arch"]))
    print_table(rows)
    seconds = time.perf_counter() - start
    import triton

    result = {
        "benchmark": "triton_fit",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "how": (
            "compiled for this GPU"
            if args.device
            else "compiled ahead of time for each target on a CPU (triton.compile, GPUTarget)"
        ),
        "cards": {str(a): {"name": n, "shared_per_block": lim} for a, (n, lim) in cards.items()},
        "seconds": round(seconds, 1),
        "rows": rows,
    }
    name = "triton_fit.json"
    if args.device:
        name = "triton_fit_" + re.sub(r"[^a-z0-9]+", "-", next(iter(cards.values()))[0].lower()).strip("-") + ".json"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / name).write_text(json.dumps(result, indent=1) + "\n")
    bad = [r for r in rows if not r.get("refused") and not r["fits"]]
    print(f"\n{len(rows)} rows, {len(bad)} that do not compile or fit; {seconds:.0f} s; wrote {args.out / name}")
    return result


if __name__ == "__main__":
    main()
