"""Everything the course runs on a GPU, in one command: `make gpu-check` (or python benchmarks/gpu_check.py).

Needs only torch >= 2.5 and Triton (no `make setup`: a GPU machine may lack the course's system packages).
In order, each within its share of about 8 minutes on one H100:

1. launches: triton_attention and lesson 09's Triton forward at the tiles attention_tiles picks for this card,
   float16, bfloat16 and float32, head_dim 64 and 128, causal, against SDPA (bfloat16 below compute
   capability 8.0 must be refused with a ValueError);
2. the GPU tests (pytest on the test files of lessons 06 and 09 and of the fit), when pytest is installed;
3. lessons 06 and 09 top to bottom on the GPU: the source notebooks' code cells in one Python each, as a
   kernel would run them, hidden tests left out (they need the grader's packages), with matplotlib's Agg;
4. benchmarks/gpu_attention.py and benchmarks/flash_backward.py --cuda (each writes its JSON);
5. the fit report against this card's own limits (benchmarks/triton_fit.py --device).

It writes benchmarks/results/gpu_check_<gpu name>.json and prints a table; whatever it skips, it says why.
Without a GPU it says so in one line and exits 0. Exit status 1 when a step failed.
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LESSONS = ("lessons/06_gpu/06_gpu.ipynb", "lessons/09_flash_backward/09_flash_backward.ipynb")
# The GPU tests: those of lessons 06 and 09 that run a kernel on the device (the rest are the CPU's), the fit's,
# and the GPU benchmark's.
TESTS = [
    "tests/lessons/test_gpu.py::test_triton_attention_equals_sdpa",
    "tests/lessons/test_flash_backward.py::test_the_triton_forward_and_its_function_equal_sdpa",
    "tests/lessons/test_flash_backward.py::test_on_cuda_the_function_equals_autograd_through_sdpa",
    "tests/grader/test_triton_fit.py",
    "tests/benchmarks/test_gpu_benchmark.py",
]
# The course's own modules that lessons import from beside the notebook (autograder.release.OWN_MODULES; a test holds
# them equal): not in git there (sync and make setup write the copies), so the lesson runs find them on their path.
OWN_MODULES = (ROOT / "autograder" / "sandbox" / "tripwires.py", ROOT / "autograder" / "triton_fit.py")
# Seconds per step (each is stopped at its limit and says so): under 8 minutes in all on one H100.
BUDGET = {"launches": 60, "tests": 75, "lessons": 100, "gpu_attention": 110, "flash_backward": 45, "fit": 75}

# Run in a fresh Python with a notebook's folder as cwd: its code cells in order, hidden tests left out, as a
# kernel would (IPython's In included: lesson 06's visible tests read it). Cells with magics are skipped.
NOTEBOOK_RUNNER = r"""
import json, re, sys, warnings
import matplotlib
matplotlib.use("Agg")
nb = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__", "In": [""]}
hidden = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)
for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
        continue
    code = hidden.sub("", "".join(cell["source"]))
    if re.search(r"^\s*[%!]", code, re.M):
        print(f"cell {i}: skipped (IPython magic)")
        continue
    ns["In"].append(code)
    exec(compile(code, f"<cell {i}>", "exec"), ns)
    print(f"cell {i}: ok", flush=True)
"""


def launches(budget):
    """[row]: each launcher at this card's tiles (causal, Tq != Tk: the most of each kernel), against SDPA in
    float32; what is left after `budget` seconds (each new configuration compiles first) is listed as skipped."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    sys.path.insert(0, str(ROOT))
    from solutions import flash_backward, gpu

    rows, start = [], time.perf_counter()
    major_minor = torch.cuda.get_device_capability()
    for name, fn in (
        ("triton_attention", gpu.triton_attention),
        ("triton_flash_forward", lambda q, k, v, c: flash_backward.triton_flash_forward(q, k, v, c)[0]),
    ):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for head_dim in (64, 128):
                row = {"step": "launch", "what": f"{name} {str(dtype)[6:]} head_dim {head_dim} causal"}
                if time.perf_counter() - start > budget:
                    rows.append(dict(row, ok=True, note=f"skipped: over the {budget} s budget"))
                    continue
                q, k, v = (torch.randn(2, 4, t, head_dim, device="cuda", dtype=dtype) for t in (1000, 1100, 1100))
                try:
                    row["tiles"] = gpu.launch_tiles(q)
                    got = fn(q, k, v, True)
                    torch.cuda.synchronize()
                except ValueError as e:
                    expected = dtype == torch.bfloat16 and major_minor < (8, 0)
                    row.update(ok=expected, note=("refused, as it must be: " if expected else "") + str(e))
                except Exception as e:  # noqa: BLE001 - OutOfResources, a compile error: the row says which
                    row.update(ok=False, note=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                else:  # bottom-right aligned causal mask, as the course's kernels have
                    want = F.scaled_dot_product_attention(
                        *(t.float() for t in (q, k, v)), attn_mask=causal_lower_right(1000, 1100)
                    )
                    err = (got.float() - want).abs().max().item()
                    tol = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 2e-4}[dtype]
                    row.update(ok=err <= tol, note=f"max error {err:.1e} (tolerance {tol:.0e})")
                rows.append(row)
    return rows


def run(step, what, cmd, timeout, cwd=ROOT, env=None):
    """A row for one command run under a time limit: ok, seconds, the last line it printed."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return {"step": step, "what": what, "ok": False, "seconds": timeout, "note": f"stopped after {timeout} s"}
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return {
        "step": step,
        "what": what,
        "ok": done.returncode == 0,
        "seconds": round(time.perf_counter() - start, 1),
        "note": (lines[-1] if lines else "")[:200],
        "output": "\n".join(lines[-40:]),
    }


def run_lessons(notebooks, seconds):
    """A row per notebook, run top to bottom in its folder (NOTEBOOK_RUNNER) within `seconds` each, with the course's
    own modules it imports on its path: a fresh clone, without `make setup`, has no copies beside it."""
    with tempfile.TemporaryDirectory() as own:
        for module in OWN_MODULES:
            shutil.copy(module, own)
        return [
            run(
                "lesson",
                str(nb.relative_to(ROOT)) if nb.is_relative_to(ROOT) else str(nb),
                [sys.executable, "-c", NOTEBOOK_RUNNER, nb.name],
                seconds,
                cwd=nb.parent,
                env={"PYTHONPATH": os.pathsep.join([str(ROOT), own])},
            )
            for nb in notebooks
        ]


def have(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main():
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False): nothing to check")
        return 0
    name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    print(
        f"gpu-check on {name} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}), "
        f"torch {torch.__version__}"
    )
    rows, skipped = [], []
    py = sys.executable
    if have("triton"):
        rows += launches(BUDGET["launches"])
    else:
        skipped.append("launches and the fit report: Triton is not installed (pip install triton)")
    if have("pytest"):
        rows.append(
            run(
                "tests",
                "GPU tests",
                [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *TESTS],
                BUDGET["tests"],
            )
        )
    else:
        skipped.append("the GPU tests: pytest is not installed (pip install pytest)")
    if have("matplotlib"):
        rows += run_lessons([ROOT / nb for nb in LESSONS], BUDGET["lessons"] // len(LESSONS))
    else:
        skipped.append("lessons 06 and 09: matplotlib is not installed (pip install matplotlib)")
    rows.append(
        run(
            "benchmark",
            "benchmarks/gpu_attention.py",
            [py, "benchmarks/gpu_attention.py", "--budget", str(BUDGET["gpu_attention"] - 30)],
            BUDGET["gpu_attention"],
        )
    )
    rows.append(
        run(
            "benchmark",
            "benchmarks/flash_backward.py --cuda",
            [
                py,
                "benchmarks/flash_backward.py",
                "--cuda",
                "--budget",
                str(BUDGET["flash_backward"] - 20),
                "--json",
                str(RESULTS / f"flash_backward_{slug}.json"),
            ],
            BUDGET["flash_backward"],
        )
    )
    if have("triton"):
        rows.append(
            run("fit", "benchmarks/triton_fit.py --device", [py, "benchmarks/triton_fit.py", "--device"], BUDGET["fit"])
        )
    print(f"\n{'step':10} {'':4} {'what':52} note")
    for r in rows:
        print(f"{r['step']:10} {'ok' if r['ok'] else 'FAIL':4} {r['what']:52} {r.get('note', '')}")
    for s in skipped:
        print(f"skipped {s}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"gpu_check_{slug}.json"
    path.write_text(
        json.dumps(
            {
                "device": name,
                "capability": list(torch.cuda.get_device_capability()),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "triton": __import__("triton").__version__ if have("triton") else None,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "rows": rows,
                "skipped": skipped,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {path}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
