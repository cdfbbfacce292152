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
    assert "tiles" in skip(140, "flash_attention (torch)", 16384, 64) and not skip(140, "flash_attention (torch)", 8192, 128)
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
    names = ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "triton (course kernel)",
             "flash_attention (torch)", "naive"]
    for config in configs:
        got = [r for r in rows if (r["seq_len"], r["batch"], r["heads"], r["head_dim"], r["dtype"], r["causal"]) == config]
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
    assert all(r["status"] == "ok" for r in by_method("naive") + by_method("sdpa-math") + by_method("flash_attention (torch)"))
    assert all(r["status"] == "unsupported" for r in by_method("sdpa-cudnn")), "cuDNN attention is CUDA-only"
    triton = by_method("triton (course kernel)")
    if HAS_TRITON:
        assert any(r["status"] == "ok" for r in triton), "the Triton kernel runs in the interpreter at the smallest size"
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
