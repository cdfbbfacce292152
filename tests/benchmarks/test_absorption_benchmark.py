"""benchmarks/absorption.py (lesson 08): a tiny run measures both forms of both cases, their outputs
agree, its FLOPs are absorption_flops' and it writes the JSON it promises. Timings are never asserted."""

import json
import runpy
import sys
from pathlib import Path

import pytest

from solutions.kv_compression import MultiHeadLatentAttention, absorption_flops

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "absorption.py"


@pytest.fixture(scope="module")
def bench():
    return runpy.run_path(str(SCRIPT))  # the script's globals, without running its main


@pytest.mark.parametrize("batch", [1, 2])
def test_a_tiny_run_prints_and_writes_both_cases(bench, tmp_path, capsys, batch):
    out = tmp_path / "absorption.json"
    memory = batch == 1 and sys.platform == "linux"  # the peak memory runs a fresh process per form and case
    bench["main"](
        ["--prefill", "12", "--cached", "40", "--batch", str(batch), "--repeats", "1", "--json", str(out)]
        + ([] if memory else ["--no-memory"])
    )
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    mla = MultiHeadLatentAttention(bench["D_MODEL"], bench["N_HEADS"], bench["D_LATENT"])
    assert [(c["case"], c["T"], c["Tk"]) for c in written["cases"]] == [("prefill", 12, 12), ("decode", 1, 40)]
    for case in written["cases"]:
        assert case["max difference"] < 1e-4, f"{case['case']}: the two forms disagree"
        plain, absorbed = absorption_flops(mla, case["T"], case["Tk"])
        assert (case["plain"]["GFLOP"], case["absorbed"]["GFLOP"]) == (
            round(batch * plain / 1e9, 4),
            round(batch * absorbed / 1e9, 4),
        )
        assert case["absorbed / plain"]["flops"] == round(absorbed / plain, 3)
        for form in ("plain", "absorbed"):
            peak = case[form]["peak extra MiB"]
            assert (peak >= 0) if memory else peak is None
            assert case[form]["ms"] > 0
        assert f"{case['case']} (T = {case['T']}, Tk = {case['Tk']})" in printed
    assert written["batch"] == batch and printed.count("absorbed / plain") == 2
