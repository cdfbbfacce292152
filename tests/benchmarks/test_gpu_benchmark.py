"""benchmarks/gpu_attention.py: its GPU sweep follows FlashAttention's convention, and its tiny CPU
version runs (under Triton's interpreter when Triton is there) and writes the JSON it promises.
Timings are never asserted."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from solutions.gpu import HAS_TRITON, attention_flops

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_attention.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_sweep_has_16k_tokens_per_batch_and_hidden_2048(bench):
    configs = bench.configs(smoke=False)
    assert {c[0] for c in configs} == {1024, 2048, 4096, 8192, 16384}
    assert {c[3] for c in configs} == {64, 128}
    assert {c[4] for c in configs} == {torch.float16, torch.bfloat16}
    assert {c[5] for c in configs} == {False, True}
    assert len(configs) == 5 * 2 * 2 * 2
    for t, b, h, d, _, _ in configs:
        assert t * b == 16384 and h * d == 2048


def test_gpu_sweep_skips_what_would_not_fit_or_would_crawl(bench):
    """Which configurations each method skips, and why, on a GPU with 140 GiB free (an H200) and with 24 GiB."""

    def skip(free, name, t, d):
        limit = bench.methods(smoke=False, device="cuda", free=free * 2**30)[name][1]
        return limit and limit(16384 // t, 2048 // d, t, d, torch.float16)

    for name in ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        assert not skip(24, name, 16384, 64)
    assert not skip(140, "naive", 16384, 64) and not skip(140, "sdpa-math", 16384, 128)
    assert "GiB" in skip(24, "naive", 16384, 64) and not skip(24, "naive", 4096, 64)
    assert "GiB" in skip(24, "sdpa-math", 8192, 64) and not skip(24, "sdpa-math", 2048, 64)
    assert "tiles" in skip(140, "flash_attention (torch)", 16384, 64) and not skip(
        140, "flash_attention (torch)", 8192, 128
    )
    assert not skip(140, "triton (course kernel)", 16384, 128) or not HAS_TRITON


def _no_nan(text):
    def refuse(constant):
        raise AssertionError(f"the JSON holds {constant}")

    return json.loads(text, parse_constant=refuse)


def test_cpu_smoke_run_writes_its_json(bench, tmp_path, capsys):
    bench.main(["--cpu-smoke", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    files = list(tmp_path.glob("gpu_attention_*.json"))
    assert [f.name for f in files] == ["gpu_attention_cpu.json"]
    data = _no_nan(files[0].read_text())
    assert data["mode"] == "cpu-smoke" and data["device"] == "cpu" and data["torch"] == torch.__version__
    rows = data["results"]
    configs = {(r["seq_len"], r["batch"], r["heads"], r["head_dim"], r["dtype"], r["causal"]) for r in rows}
    assert len(configs) == len(bench.configs(smoke=True))
    names = [
        "sdpa",
        "sdpa-flash",
        "sdpa-efficient",
        "sdpa-cudnn",
        "sdpa-math",
        "triton (course kernel)",
        "flash_attention (torch)",
        "naive",
    ]
    for config in configs:
        got = [
            r for r in rows if (r["seq_len"], r["batch"], r["heads"], r["head_dim"], r["dtype"], r["causal"]) == config
        ]
        assert [r["method"] for r in got] == names
    for r in rows:
        assert r["status"] in ("ok", "skipped", "unsupported")
        assert r["status"] == "ok" or r["note"], "a row that was not measured says why"
        if r["status"] != "ok":
            continue
        flops = attention_flops(r["batch"], r["heads"], r["seq_len"], r["seq_len"], r["head_dim"], r["causal"])
        assert math.isclose(r["tflops"], flops / (r["ms"] * 1e-3) / 1e12, rel_tol=1e-3)
        assert r["max_abs_err"] < 1e-4, f"{r['method']} does not agree with SDPA"
        assert r["vs_sdpa_default"] > 0
        if r["method"] == "sdpa":
            assert r["vs_sdpa_default"] == 1.0 and r["kernel"]
    by_method = lambda name: [r for r in rows if r["method"] == name]
    assert all(
        r["status"] == "ok" for r in by_method("naive") + by_method("sdpa-math") + by_method("flash_attention (torch)")
    )
    assert all(r["status"] == "unsupported" for r in by_method("sdpa-cudnn")), "cuDNN attention is CUDA-only"
    triton = by_method("triton (course kernel)")
    if HAS_TRITON:
        assert any(r["status"] == "ok" for r in triton), (
            "the Triton kernel runs in the interpreter at the smallest size"
        )
        assert all(r["status"] == "ok" or "interpreter" in r["note"] for r in triton)
    else:
        assert all(r["status"] == "skipped" and "Triton" in r["note"] for r in triton)
    assert "vs SDPA" in printed and "sdpa-math" in printed


def test_cpu_smoke_without_out_writes_nothing_in_the_repository(bench, monkeypatch, capsys):
    results = SCRIPT.parent / "results"
    before = sorted(p.name for p in results.iterdir()) if results.is_dir() else []
    original = bench.configs
    monkeypatch.setattr(bench, "configs", lambda smoke: original(smoke)[:1])  # one configuration is enough here
    result = bench.main(["--cpu-smoke"])
    assert "pass --out" in capsys.readouterr().out and result["mode"] == "cpu-smoke"
    assert (sorted(p.name for p in results.iterdir()) if results.is_dir() else []) == before


GPU_CHECK = SCRIPT.parent / "gpu_check.py"


def test_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_0():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(GPU_CHECK)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpu-check: no CUDA GPU here (torch.cuda.is_available() is False): nothing to check"


def test_gpu_check_runs_a_notebook_as_a_kernel_would_without_its_hidden_tests(tmp_path):
    """Its notebook runner: code cells in order, IPython's In kept, hidden tests left out, magics skipped, and a
    failing cell fails the run."""
    import subprocess
    import sys

    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)

    def run(*cells):
        nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}} for c in cells]}
        (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
        return subprocess.run(
            [sys.executable, "-c", check.NOTEBOOK_RUNNER, "nb.ipynb"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run(
        "x = 1",
        "%timeit x",
        "assert len(In) == 3 and 'x = 1' in In[1]\n### BEGIN HIDDEN TESTS\n"
        "from autograder.checks import verify\n### END HIDDEN TESTS",
    )
    assert done.returncode == 0 and "cell 1: skipped" in done.stdout, done.stderr
    assert run("x = 1", "assert x == 2").returncode == 1


def test_gpu_check_runs_a_lesson_of_a_fresh_clone_with_the_courses_own_modules(tmp_path):
    """A fresh clone has no copies of tripwires.py and triton_fit.py beside the notebooks (sync and make setup
    write them, and a GPU machine runs neither): the lesson runs find them on their path."""
    from autograder import release

    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.OWN_MODULES == release.OWN_MODULES
    cells = ["import tripwires, triton_fit", "assert triton_fit.ARCHES[80][0] == 'A100' and tripwires.off"]
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}} for c in cells]}
    (tmp_path / "lesson.ipynb").write_text(json.dumps(nb))
    (row,) = check.run_lessons([tmp_path / "lesson.ipynb"], 120)
    assert row["ok"] and row["what"] == str(tmp_path / "lesson.ipynb"), row
