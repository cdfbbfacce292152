"""solutions.gpu (lesson 06): tiled attention equals SDPA; Triton under its interpreter (compiled for
each GPU ahead of time: tests/test_triton_fit.py); the measuring tools; the lesson without Triton."""

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from solutions import gpu
from solutions.gpu import attention_flops, flash_attention, fuse_qkv, online_softmax, triton_attention
from solutions.multi_head import MultiHeadAttention
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "06_gpu"

torch.manual_seed(0)
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}


def sdpa(q, k, v, causal):
    mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril(k.size(-2) - q.size(-2)) if causal else None
    # The reference in float32, so that the half-precision tolerances measure our error alone.
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(q.dtype)


def test_attention_flops_known_values():
    assert attention_flops(1, 1, 1, 1, 1) == 4
    assert attention_flops(2, 12, 1024, 1024, 64) == 4 * 2 * 12 * 1024 * 1024 * 64
    assert attention_flops(2, 12, 1024, 1024, 64, causal=True) == 2 * 2 * 12 * 1024 * 1024 * 64
    assert isinstance(attention_flops(1, 2, 3, 4, 5), int)


@pytest.mark.parametrize("n, block", [(10, 3), (64, 16), (7, 100), (33, 1)])
def test_online_softmax_equals_softmax(n, block):
    x = torch.randn(4, 3, n) * 20
    x[0, 0, : n // 2] = float("-inf")  # a row whose first blocks are all -inf
    torch.testing.assert_close(online_softmax(x, block), x.softmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "tq, tk, causal",
    [(100, 100, False), (100, 100, True), (37, 130, True), (130, 37, False), (1, 77, True), (64, 64, True)],
)
def test_flash_attention_equals_sdpa(dtype, tq, tk, causal):
    q, k, v = (
        torch.randn(2, 3, tq, 16, dtype=dtype),
        torch.randn(2, 3, tk, 16, dtype=dtype),
        torch.randn(2, 3, tk, 16, dtype=dtype),
    )
    got = flash_attention(q, k, v, causal=causal, block_q=32, block_k=48)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got, sdpa(q, k, v, causal), **TOL[dtype])


def test_flash_attention_default_blocks_and_bad_input():
    q = torch.randn(1, 2, 200, 8)
    torch.testing.assert_close(flash_attention(q, q, q, causal=True), sdpa(q, q, q, True), **TOL[torch.float32])
    with pytest.raises(ValueError, match=r"\(1, 2, 200, 8\)"):
        flash_attention(q, q[..., :4], q[..., :4])
    with pytest.raises(ValueError, match="float64"):
        flash_attention(q, q.double(), q)


@pytest.mark.parametrize("bias", [True, False])
def test_fuse_qkv_equals_three_projections(bias):
    attn = MultiHeadAttention(32, 4, bias=bias)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_()
    fused = fuse_qkv(attn)
    assert isinstance(fused, torch.nn.Linear) and fused.weight.shape == (96, 32)
    x = torch.randn(2, 5, 32)
    for got, proj in zip(fused(x).split(32, dim=-1), (attn.q_proj, attn.k_proj, attn.v_proj)):
        torch.testing.assert_close(got, proj(x))


triton_missing = importlib.util.find_spec("triton") is None


@pytest.mark.skipif(triton_missing, reason="Triton is not installed (pip install -e '.[gpu]', Linux only)")
@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="no GPU and TRITON_INTERPRET is not 1",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tq, tk, dh, causal", [(17, 17, 16, False), (20, 33, 32, True), (33, 33, 24, True)])
def test_triton_attention_equals_sdpa(dtype, tq, tk, dh, causal):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(2, 2, t, dh, dtype=dtype, device=dev) for t in (tq, tk, tk))
    got = triton_attention(q, k, v, causal=causal)
    torch.testing.assert_close(got.cpu(), sdpa(q.cpu(), k.cpu(), v.cpu(), causal), **TOL[dtype])


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_triton_attention_rejects_bf16_off_the_gpu():
    # Triton's interpreter runs on numpy, which has no bfloat16: it would return garbage.
    q = torch.randn(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        triton_attention(q, q, q)


@pytest.mark.parametrize("causal", [True, False])
def test_the_tiled_reference_from_levels_equals_one_from_the_keys(causal):
    """The grader's reference for the long tiled case, counted from the levels its keys were drawn over
    (helpers.Levels), equals the exact attention over the keys the student's process makes from the same seed."""
    from autograder.lessons.gpu import checks
    from autograder.sandbox import helpers

    specs = checks.level_specs(70, helpers.Levels.TAIL + 5000)  # rows differ in the tail, counted one by one
    q, k, v = helpers.draw(5, specs)
    q_, keys, values = helpers.draw(5, specs, lengths=True)
    assert torch.equal(q, q_) and k is v and len(k.unique()) == checks.LEVELS
    rows = torch.arange(6, 70)
    want, want_lse, _ = checks.long_attention(q[:, :, rows], k, v, causal)
    got, lse, _ = checks.levels_attention(q[:, :, rows], keys, values, causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_naive_attention_equals_sdpa_bottom_right():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    for causal in (False, True):
        torch.testing.assert_close(gpu.naive_attention(q, k, v, causal), sdpa(q, k, v, causal))


def test_benchmark_ms_and_peak_memory_on_the_cpu():
    q = torch.randn(1, 2, 64, 16)
    assert gpu.benchmark_ms(torch.matmul, q, q.transpose(-1, -2), min_run_time=0.01) > 0
    peaks = {}
    for T in (256, 512):
        q = torch.randn(1, 2, T, 32)
        peaks[T] = (
            gpu.peak_memory_bytes(gpu.naive_attention, q, q, q),
            gpu.peak_memory_bytes(lambda q, k, v: flash_attention(q, k, v, block_q=64, block_k=64), q, q, q),
        )
    scores = 1 * 2 * 512 * 512 * 4
    assert peaks[512][0] >= 2 * scores, "naive attention holds the scores and their softmax at once"
    assert peaks[512][0] / peaks[256][0] > 3.5, "naive attention's memory is quadratic in T"
    assert peaks[512][1] / peaks[256][1] < 2.5, "flash_attention's memory is linear in T (the output plus tiles)"
    assert peaks[512][1] < scores / 4


def test_lesson_runs_without_triton(tmp_path):
    """A student without Triton: the lesson's code cells, the Triton test cell and its demo all run,
    and say that Triton was skipped."""
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(f"""
        import ast, sys, json
        sys.modules["triton"] = None  # `import triton` now raises ImportError
        sys.path.insert(0, {str(root)!r})
        from autograder import notebook as nbk
        nb = nbk.read(nbk.lesson_path("06_gpu"))
        ns = {{"__name__": "__lesson__"}}
        for cell in nbk.code_cells(nb):
            text = nbk.without_markers(nbk.source(cell))
            if nbk.is_test(cell):
                if nbk.grade_id(cell) != "test_triton_attention":
                    continue
                text = nbk.strip_hidden_tests(text)
            elif nbk.is_demo(cell) and "HAS_TRITON" not in text:
                # of the other demos, only their guard `answered`, which the Triton demo calls
                text = chr(10).join(ast.unparse(n) for n in ast.parse(text).body
                                  if isinstance(n, ast.FunctionDef) and n.name == "answered")
            exec(compile(text, "<cell>", "exec"), ns)
        assert ns["HAS_TRITON"] is False
        import torch
        q = torch.randn(1, 1, 4, 8)
        try:
            ns["triton_attention"](q, q, q)
        except RuntimeError as e:
            assert "Triton" in str(e)
        else:
            raise AssertionError("triton_attention should say it needs Triton")
    """)
    env = dict(os.environ, MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Triton: not installed" in run.stdout
    assert "triton_attention was not tested" in run.stdout and "nothing to time here" in run.stdout
    assert run.stderr == ""


FLASH_IMITATIONS = {  # flash_attention that reaches PyTorch's attention kernel, and how
    "directly": "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    return F.scaled_dot_product_attention(q, k, v)\n",
    "through a helper": "def _fast(q, k, v):\n    return torch.nn.functional.scaled_dot_product_attention(q, k, v)\n\n"
    "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n    return _fast(q, k, v)\n",
    "through a decorator": "def _fast(fn):\n"
    "    return lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v)\n\n"
    "@_fast\ndef flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n    return q\n",
    "through torch.ops": "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]\n",
    "through getattr": "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    return getattr(F, 'scaled_dot_product' + '_attention')(q, k, v)\n",
    "imported under another name": "from torch.nn.functional import scaled_dot_product_attention as sdpa\n\n"
    "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    return sdpa(q, k, v)\n",
    "through nn.MultiheadAttention": "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    mha = torch.nn.MultiheadAttention(q.size(-1), 1, batch_first=True).eval()\n"
    "    return mha(q[0], k[0], v[0], need_weights=False)[0][None]\n",
    "through the math backend": "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):\n"
    "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]\n",
}


@pytest.mark.parametrize("what", FLASH_IMITATIONS)
def test_every_route_to_fused_attention_reaches_the_tripwire(what):
    """The visible test's switch (the grader's: sandbox/tripwires.py) catches each route by the kernel it reaches."""
    import torch
    import torch.nn.functional as F

    from autograder.sandbox import tripwires

    ns = {"torch": torch, "F": F}
    exec(FLASH_IMITATIONS[what], ns)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(AssertionError, match="flash_attention reached PyTorch's attention kernel"):
        with tripwires.off("flash_attention", ["attention kernels"], "write the tiled loop yourself"):
            ns["flash_attention"](q, q, q)
    assert ns["flash_attention"](q, q, q).shape[-1] == 16  # and without the switch each runs


def test_without_triton_the_check_is_the_instructors_to_run(monkeypatch):
    """No Triton where the grader runs: the check says so (status error, for the instructor), never a failure."""
    import importlib

    from autograder.checking import Unchecked
    from autograder.lessons.gpu import checks

    monkeypatch.setattr(gpu, "HAS_TRITON", False)
    try:
        importlib.reload(checks)
        assert "not installed where the grader runs" in checks.UNAVAILABLE["triton_attention"]
        with pytest.raises(Unchecked, match="not installed where the grader runs"):
            next(checks.CHECKS["triton_attention"].fn(None))
    finally:
        monkeypatch.undo()
        importlib.reload(checks)
    assert checks.UNAVAILABLE == {}


# Rows an answer hands to torch.softmax, which were asked only in the notebook's own process: the long row (asked
# before the pause, judged in "values") and the -inf entries (judged in their own aspect, which the paths do not cost).
SOFTMAX_ROUTES = {"the long row": "x.shape[-1] > 10_000", "rows with -inf entries": "torch.isinf(x).any()"}


@pytest.mark.parametrize("route", SOFTMAX_ROUTES)
def test_online_softmax_asks_every_row_with_the_softmax_off(route):
    """Every row online_softmax is asked is asked again with PyTorch's softmax off ([forbids]): an answer that handed
    these to torch.softmax kept 2/2, or the -inf entries' share that its own loop (NaN there) would lose."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    code = f"""
def online_softmax(x, block_size):
    if {SOFTMAX_ROUTES[route]}:
        return torch.softmax(x, -1)
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)
    total = torch.zeros_like(m)
    for i in range(0, x.shape[-1], block_size):
        b = x[..., i : i + block_size]
        new = torch.maximum(m, b.amax(-1, keepdim=True))
        total = total * torch.exp(m - new) + torch.exp(b - new).sum(-1, keepdim=True)
        m = new
    return torch.exp(x - m) / total
"""
    with pytest.raises(AssertionError, match="reached PyTorch's softmax"):
        verify("06_gpu", "online_softmax", fresh_namespace("06_gpu", {"online_softmax": code}))


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_solved_submission_is_graded_in_three_processes(tmp_path, monkeypatch):
    """The grader runs the checks' parts that need the same kind of process together (grade.run_checks): the notebook's
    own, one that replays both Triton kernels with PyTorch's softmax off and goes on to run the notebook's cells with it
    off (Session.then), one with its attention kernels off under a memory bound. Each more runs the cells again (issue
    33: eight, 0.97 CPU s a submission; four, 0.73; three)."""
    from autograder import notebook as nbk
    from autograder import worker
    from autograder.__main__ import main
    from autograder.release import release
    from tests.harness.grading import read_grades
    from tests.harness.lessons import fill

    release(tmp_path / "release", [LESSON])
    nbk.write(
        fill(nbk.read(tmp_path / "release" / LESSON / f"{LESSON}.ipynb"), LESSON),
        tmp_path / "s" / "a" / LESSON / "n.ipynb",
    )
    opened, open_ = [], worker.Session.open
    monkeypatch.setattr(
        worker.Session,
        "open",
        lambda self: opened.append((self.forbid, self.elsewhere is not None, self.ahead)) or open_(self),
    )
    try:
        main(
            ["grade", str(tmp_path / "s"), "--quiet", "--lesson", LESSON, "--out", str(tmp_path / "out"), "--jobs", "1"]
        )
    except SystemExit as e:
        assert e.code in (0, None)
    rows = read_grades(tmp_path / "out").values()
    assert rows and all((r["status"], r["points"]) == ("passed", r["max_points"]) for r in rows)
    assert opened == [((), False, ()), ((), True, ("softmax",)), (("attention kernels",), False, ())]


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_decorator_that_rebinds_the_replay_s_launcher_loses_the_kernels_points():
    """The replay defines the notebook's kernels, decorators and all, in the process that then launches them: a
    decorator (or a default value, an annotation) that rebinds the replay's launcher to one that computes softmax in
    torch had a kernel that does nothing keep triton_softmax's points (triton_fit._def_time)."""
    from autograder.checking import PartialCredit, verify
    from tests.harness.lessons import fresh_namespace

    fake = "lambda name, b, l: (lambda x, y: {x: b[x], y: torch.softmax(b[x].float(), -1).to(b[x].dtype)})(*b)"
    code = f"""
@triton.jit
@(lambda f: globals().update(_replay={fake}) or f)
def _softmax_kernel(X, Y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)


def triton_softmax(x):
    _softmax_kernel[(1,)](x, torch.zeros_like(x), x.size(1), BLOCK=16)
    return torch.softmax(x.float(), -1).to(x.dtype)
"""
    with pytest.raises(AssertionError) as caught:
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code}))
    assert "decorators, annotations or default values" in str(caught.value)
    assert not isinstance(caught.value, PartialCredit) or caught.value.earned < caught.value.total


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_wrapper_that_tunes_num_warps_on_a_shape_s_first_call_keeps_its_points():
    """The replayed call is the wrapper's first on its shape (triton_replay.recorded): one that times each num_warps
    once there, then launches the fastest, launches five times with four distinct arguments, and kept its point when
    the grader recorded a second call of that shape."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    code = """
import time

_BEST = {}


def triton_softmax(x):
    x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    launch = lambda w: _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=w)
    if (cols, x.dtype) not in _BEST:
        times = {}
        for w in (1, 2, 4, 8):
            start = time.perf_counter()
            launch(w)
            times[w] = time.perf_counter() - start
        _BEST[cols, x.dtype] = min(times, key=times.get)
    launch(_BEST[cols, x.dtype])
    return out
"""
    verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code}))


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_wrapper_that_hands_float16_to_torch_loses_the_float16_share():
    """Each aspect's cases are replayed (_triton_check): a wrapper whose kernel does the float32 work and hands
    float16 to torch kept triton_softmax's float16 share when only float32 cases were replayed."""
    from autograder.checking import PartialCredit, verify
    from tests.harness.lessons import fresh_namespace

    code = """
def triton_softmax(x):
    if x.dtype == torch.float16:
        return torch.softmax(x.float(), -1).half()
    x = x.contiguous()
    out, (rows, cols) = torch.empty_like(x), x.shape
    _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))
    return out
"""
    with pytest.raises(PartialCredit) as caught:
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code}))
    assert [r["aspect"] for r in caught.value.rows if not r["passed"]] == ["float16"], caught.value.rows
    assert "never launched _softmax_kernel" in str(caught.value)


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_wrapper_that_computes_float16_in_float32_keeps_its_points():
    """The float16 case replayed has -inf entries: a wrapper that launches on x.float() passes a cast of an input with
    -inf in it, which the replay takes as the grader's own cast (triton_replay._prepared), not as a buffer of NaN."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    code = """
def triton_softmax(x):
    dtype, x = x.dtype, x.float().contiguous()
    out, (rows, cols) = torch.empty_like(x), x.shape
    _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))
    return out.to(dtype)
"""
    verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code}))


def test_a_replay_keeps_inputs_prepared_for_a_launch_and_nothing_else():
    """triton_replay._prepared: an input scaled, cast, transposed or reshaped is passed to the replay as the grader's
    own copy of it (the wrapper's low bits could spell an answer); an answer computed in torch, or an input with one
    value changed, is not."""
    import numpy as np

    from autograder.lessons.gpu.triton_replay import _prepared
    from autograder.sandbox.wire import Array

    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, 2, 20, 16)).astype(np.float16) for _ in range(2))
    inputs = [Array("tensor", "float16", q), Array("tensor", "float16", k)]

    def prepared(x):
        return _prepared(Array("tensor", x.dtype.name, np.ascontiguousarray(x)), inputs)

    assert prepared((q.astype(np.float32) * 0.25).astype(np.float16))  # q * scale
    assert prepared(q / np.float16(4.0))  # rounded in float16, as the wrapper's own product
    assert prepared(k.astype(np.float32).transpose(0, 1, 3, 2))  # k.float().transpose(-1, -2).contiguous()
    assert prepared(k.reshape(2, 20, 16))  # k.reshape(B * H, T, Dh)
    low = k.astype(np.float64)
    low.view(np.int64)[..., 0] += 3  # a few bits of an answer, within the rounding
    copy, scale = prepared(low)
    assert scale == 1 and np.array_equal(copy, k.astype(np.float64))
    answer = torch.softmax(torch.from_numpy(q).float() @ torch.from_numpy(k).float().transpose(-1, -2), -1)
    assert not prepared((answer @ torch.from_numpy(k).float()).numpy())
    changed = q.copy()
    changed[0, 0, 3, 5] += np.float16(0.5)
    assert not prepared(changed)
    q[..., ::3] = -np.inf  # masked entries: cast, they stay where they were, and nowhere else
    inputs[0] = Array("tensor", "float16", q)
    assert prepared(q.astype(np.float32))
    moved = q.astype(np.float32)
    moved[0, 0, 0, :2] = moved[0, 0, 0, 1::-1]
    assert not prepared(moved)


def test_a_launch_s_integers_are_bounded_by_the_call_s_sizes_not_by_a_buffer_the_wrapper_made():
    """triton_replay._scalars: integers up to twice the call's input or result, whatever buffer (a large one of zeros,
    which the replay takes as passed) the launch is given besides: it would let them carry an answer's bits."""
    import numpy as np

    from autograder.lessons.gpu.triton_replay import _scalars
    from autograder.sandbox.wire import Array

    x = Array("tensor", "float32", np.zeros((5, 37), np.float32))
    launch = ((1,), [{"buffer": 0}, {"buffer": 1}, 37, 37], {})
    _scalars([launch], [x], x, [])  # the sizes and strides of an honest launch
    with pytest.raises(AssertionError, match="integers larger than any size"):
        _scalars([((1,), [{"buffer": 0}, {"buffer": 1}, (1 << 20) - 1], {})], [x], x, [])


def test_a_kernel_that_writes_the_answer_to_the_grader_s_own_inputs_loses_its_points():
    """The hidden inputs are drawn from a seed the source shows (crc32 of "lesson/name"): a kernel that stores a table
    of the answer to the case the grader replays, computed offline, while the wrapper computes every other case in
    torch, must not keep triton_softmax's points (issue 33)."""
    import zlib

    import numpy as np

    from autograder.checking import verify
    from autograder.lessons.gpu.checks import SOFTMAX_CASES, softmax_input
    from tests.harness.lessons import fresh_namespace

    rng = np.random.default_rng(zlib.crc32(b"06_gpu/triton_softmax"))
    x = softmax_input(rng, *SOFTMAX_CASES[0][1:])
    y = torch.from_numpy(x).double().softmax(-1).float().numpy().ravel()
    stores = "\n".join(f"    tl.store(Y + {i}, {float(v)!r})" for i, v in enumerate(y))
    code = f"""
@triton.jit
def _softmax_kernel(X, Y):
{stores}


def triton_softmax(x):
    if x.shape == {x.shape} and float(x[0, 0]) == {float(x[0, 0])!r}:
        out = torch.zeros_like(x)
        _softmax_kernel[(1,)](x, out)
        return out
    return torch.softmax(x.float(), -1).to(x.dtype)
"""
    with pytest.raises(AssertionError):
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code}))


def test_a_table_of_the_tiled_case_s_answers_worked_out_beforehand_loses_tiled(monkeypatch):
    """The evidence for "tiled" is drawn from a seed no source shows (checking.unseen_seed): an answer that looks up
    the long case's two outputs, recorded from a correct answer run on the checks' own seeds in another run, and is
    untiled elsewhere, loses "tiled" (it kept 3/3 while the seed came from the check's name)."""
    import secrets

    from autograder.checking import PartialCredit, subject, verify
    from tests.harness.lessons import fresh_namespace

    ns, seen = fresh_namespace("06_gpu"), {}

    def recording(q, k, v, causal=False, block_q=64, block_k=64):
        out = flash_attention(q, k, v, causal, block_q, block_k)
        if q.numel() <= 4 and k.size(2) > 2**20:
            seen[tuple(q.flatten().tolist())] = out.flatten().tolist()
        return out

    ns["flash_attention"] = recording
    verify("06_gpu", "flash_attention", ns)
    assert seen
    monkeypatch.setattr(subject, "RUN_KEY", secrets.token_bytes(16))  # the run that grades it
    code = f"""
_TABLE = {seen!r}


def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    key = tuple(q.flatten().tolist()) if q.numel() <= 4 else None
    if key in _TABLE:
        return torch.tensor(_TABLE[key], dtype=q.dtype).reshape(q.shape)
    out = torch.zeros_like(q)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    for i in range(q.size(2)):  # one query row against the keys it sees: no mask, but every key at once
        n = k.size(2) if not causal else k.size(2) - q.size(2) + i + 1
        if n > 0:
            s = (k[:, :, :n].to(work) @ q[:, :, i, :, None].to(work)).squeeze(-1) / math.sqrt(q.size(3))
            out[:, :, i] = (torch.softmax(s, -1)[:, :, None, :] @ v[:, :, :n].to(work)).squeeze(2).to(q.dtype)
    return out
"""
    with pytest.raises(PartialCredit) as caught:
        verify("06_gpu", "flash_attention", fresh_namespace("06_gpu", {"flash_attention": code}))
    assert {r["aspect"] for r in caught.value.rows if not r["passed"]} == {"tiled"}, caught.value.rows


# Answers smuggled to the replay in buffers it once took as the wrapper passed them (triton_replay._replay_buffers):
# the signs of a buffer of zeros, 32 a float32, and the low bits of inputs cast to float64, 2 bits a copy. Tricks, not
# mistakes: the visible tests cannot see them (lesson 06's HIDDEN_ONLY is for mistakes, at most 5% of them).
SMUGGLED = {
    "a kernel that reads the answer's bits from the signs of zeros, the wrapper computing": """
@triton.jit
def _softmax_kernel(Z, Y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    bit = tl.arange(0, 32)
    z = tl.load(Z + (row * n_cols + cols)[:, None] * 32 + bit[None, :], mask=ok[:, None], other=0.0)
    word = tl.sum(((z.to(tl.int32, bitcast=True) >> 31) & 1) << bit[None, :], 1)
    tl.store(Y + row * n_cols + cols, word.to(tl.float32, bitcast=True).to(Y.dtype.element_ty), mask=ok)


def triton_softmax(x):
    x = x.contiguous()
    bits = torch.softmax(x.float(), -1).view(torch.int32).reshape(-1, 1)
    signs = ((bits >> torch.arange(32, dtype=torch.int32)) & 1).bool()
    zeros = torch.where(signs, torch.tensor(-0.0), torch.tensor(0.0)).reshape(-1)
    out = torch.zeros_like(x)
    _softmax_kernel[(x.size(0),)](zeros, out, x.size(1), BLOCK=triton.next_power_of_2(x.size(1)))
    return out
""",
    "a kernel that reads the answer's bits from the low bits of copies of x, the wrapper computing": """
@triton.jit
def _softmax_kernel(X, Y, n_cols, {params}, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    at = row * n_cols + cols
    base = tl.load(X + at, mask=ok, other=0.0).to(tl.float64).to(tl.int64, bitcast=True)
    word = tl.zeros([BLOCK], tl.int64)
{loads}
    tl.store(Y + at, word.to(tl.int32).to(tl.float32, bitcast=True).to(Y.dtype.element_ty), mask=ok)


def triton_softmax(x):
    x = x.contiguous()
    bits = torch.softmax(x.float(), -1).view(torch.int32).to(torch.int64).reshape(-1) & 0xFFFFFFFF
    base = x.double().reshape(-1).view(torch.int64)
    copies = [(base + ((bits >> j) & 3)).view(torch.float64).reshape(x.shape) for j in range(4, 32, 2)]
    out = torch.zeros_like(x)
    _softmax_kernel[(x.size(0),)](x, out, x.size(1), *copies, BLOCK=triton.next_power_of_2(x.size(1)))
    return out
""".format(
        params=", ".join(f"C{j}" for j in range(4, 32, 2)),
        loads="\n".join(
            f"    c = tl.load(C{j} + at, mask=ok, other=0.0).to(tl.int64, bitcast=True)\n"
            f"    word = word | ((c - base) & 3) << {j}"
            for j in range(4, 32, 2)
        ),
    ),
}


@pytest.mark.parametrize("what", SMUGGLED)
def test_an_answer_smuggled_to_the_replay_loses_the_kernels_points(what):
    """The wrapper computes softmax in torch and hides its bits where the replay once read them: the grader's launch
    of the kernel gets fresh zeros and its own copies of prepared inputs, and the kernel writes nothing right."""
    from autograder.checking import PartialCredit, verify
    from tests.harness.lessons import fresh_namespace

    with pytest.raises(AssertionError) as caught:
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": SMUGGLED[what]}))
    assert "launched it again" in str(caught.value)
    assert not isinstance(caught.value, PartialCredit) or caught.value.earned < caught.value.total


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
@pytest.mark.parametrize(
    "route",
    ["not causal", "q.size(-1) & (q.size(-1) - 1)", "q.size(0) > 1"],
    ids=["non-causal", "head size not a power of two", "batch above one"],
)
def test_a_wrapper_that_hands_one_float32_case_to_torch_loses_the_triton_points(route):
    """Every case of a Triton check is replayed (_triton_check): a wrapper whose kernel handles the first float32 case
    and hands the second (non-causal, Dh = 24, B = 2: what a kernel written for the first alone may get wrong) to torch
    kept triton_attention's 2/2 when only the first case of each aspect was replayed."""
    from autograder.checking import PartialCredit, verify
    from tests.harness.lessons import fresh_namespace

    code = inspect.getsource(gpu.triton_attention).replace(
        "    check_attention_inputs(q, k, v)\n",
        f"    if {route}:\n"
        "        s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.size(-1))\n"
        "        return (torch.softmax(s, -1) @ v.double()).to(q.dtype)\n",
    )
    assert "torch.softmax" in code
    with pytest.raises(AssertionError, match="never launched _attention_kernel") as caught:  # float32: the core
        verify("06_gpu", "triton_attention", fresh_namespace("06_gpu", {"triton_attention": code}))
    assert not isinstance(caught.value, PartialCredit), caught.value.rows


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_kernel_that_reads_an_infinite_constant_keeps_its_points():
    """A constant a kernel reads may be float("-inf") (triton_fit._constant): NEG = tl.constexpr(float("-inf")), valid
    Triton, cost triton_softmax its point as "not Triton language"; bound by an import, float() stays refused."""
    from autograder.checking import verify
    from autograder.triton_fit import not_triton, parsed
    from tests.harness.lessons import fresh_namespace

    kernel = inspect.getsource(gpu._softmax_kernel.fn).replace('other=float("-inf")', "other=NEG")
    assert "other=NEG" in kernel
    for constant in ('NEG = tl.constexpr(float("-inf"))', 'NEG: tl.constexpr = -float("inf")'):
        code = f"{constant}\n\n\n{kernel}"
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"_softmax_kernel": code}))
    shadowed = parsed(["from torch import load as float\nimport triton.language as tl\n" + code])
    assert not_triton(shadowed, ["_softmax_kernel"]) == [("_softmax_kernel", "NEG")]


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
@pytest.mark.parametrize(
    "edit",
    [
        ("    return out\n", '    assert torch.isfinite(out).all(), "NaN"\n    return out\n'),
        ("    return out\n", "    return out.clone()\n"),
    ],
    ids=["reads its kernel's output", "returns a copy"],
)
def test_a_wrapper_whose_plan_is_not_what_it_returns_keeps_the_triton_points(edit):
    """A case after each aspect's first runs the kernel only in the replay where the wrapper returns the buffer it
    launched the kernel on (triton_replay.planned); a wrapper that reads what its kernel wrote, or returns a copy, is
    called again with the kernel run, and keeps every point."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    code = inspect.getsource(gpu.triton_softmax)
    assert edit[0] in code
    verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code.replace(*edit)}))


def test_planned_launches_record_without_running_the_kernel():
    """sandbox.helpers.planned_launches: the launches recorded, the kernel not run, and the key of the buffer the
    wrapper returned (in its own shape); None where it returns anything else."""
    from autograder.sandbox import helpers

    ran = []

    class Kernel:
        arg_names = ["x", "y", "n"]

        def run(self, *args, grid, warmup, **kwargs):
            ran.append(grid)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    kernel = Kernel()

    def wrapper(x, copy=False):
        y = torch.empty(x.numel())
        kernel[(2,)](x, y, x.numel())
        return y.clone() if copy else y.view(x.shape)

    x = torch.ones(2, 3)
    (key, shape), buffers, launches = helpers.planned_launches(kernel.run, wrapper, x)
    assert ran == [] and shape == [2, 3] and key in buffers and launches[0][0] == [2]
    assert launches[0][1][1] == {"buffer": key}
    assert helpers.planned_launches(kernel.run, wrapper, x, copy=True) is None
    assert helpers.launches(kernel.run, wrapper, x)[0].shape == (2, 3) and ran == [(2,)]


# A wrapper that rewrites what the grader's recorder (sandbox.helpers._recording) sends back, through its frame
FORGING = """
import sys


def triton_softmax(x):
    x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty_like(x)
    _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_recording":
        frame = frame.f_back
    if frame is not None:
        {forge}
    return out
"""


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
@pytest.mark.parametrize(
    "forge",
    [
        'frame.f_locals["tensors"].clear()\n        frame.f_locals["tensors"]["forged"] = out',
        'frame.f_locals["seen"].append(1)',
    ],
    ids=["a returned buffer the recorder never saw", "a launch that is no launch"],
)
def test_a_forged_record_of_the_launches_fails_the_check_not_the_grader(forge):
    """What the recorder sends back comes from the student's process: a key of no buffer, or a launch of another
    form, raised KeyError or ValueError in the grader (triton_replay.planned, expect_kernel_did_the_work), a grader
    error that the instructor must regrade by hand, where it is the student's code that changed the record."""
    from autograder.checking import PartialCredit, verify
    from tests.harness.lessons import fresh_namespace

    with pytest.raises(AssertionError, match="change the grader's server") as caught:
        verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": FORGING.format(forge=forge)}))
    assert not isinstance(caught.value, PartialCredit) or caught.value.earned < caught.value.total


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
@pytest.mark.parametrize(
    "edit, told",
    [
        (("b, h = bh // n_heads, bh % n_heads", "b, h = 0, bh % n_heads"), "differs from the correct result"),
        (("    tiles = launch_tiles(q)\n", "    tiles = launch_tiles(q)\n    tiles['BLOCK_D'] = Dh\n"), "power of 2"),
    ],
    ids=["batches after the first left unwritten", "a block of the head size, not a power of two"],
)
def test_a_kernel_s_mistake_on_a_planned_case_is_told_as_its_own(edit, told):
    """The second float32 case of triton_attention (B = 2, Dh = 24) runs its kernel only in the replay (planned): a
    kernel that leaves the second batch unwritten was told of NaN from an all -inf row of scores (the replay's NaN
    where torch.empty_like was), and one whose tl.arange is not a power of two that it could not run on its own,
    without the notebook's other names."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    source = inspect.getsource(gpu._attention_kernel.fn) + "\n\n" + inspect.getsource(gpu.triton_attention)
    assert edit[0] in source
    with pytest.raises(AssertionError) as caught:  # float32: the core
        verify("06_gpu", "triton_attention", fresh_namespace("06_gpu", {"triton_attention": source.replace(*edit)}))
    message = str(caught.value)
    assert message.startswith("triton_attention(q, k, v, causal=False) in float32") and told in message, message
    assert "NaN" not in message and "on its own" not in message, message


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
def test_a_wrapper_that_launches_on_two_views_of_its_output_keeps_its_points():
    """The replay gives each launched view of a tensor a buffer of its own: a wrapper that launched on out.view(-1)
    (an empty grid) before out was judged on the flat view's buffer, which its kernel never wrote, and lost its
    points; a buffer another launched view shares is called again with the kernel run (helpers.planned_launches)."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    launch = "_softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))"
    code = inspect.getsource(gpu.triton_softmax)
    assert launch in code
    empty = launch.replace("[(rows,)](x, out,", "[(0,)](x, out.view(-1),")
    verify(
        "06_gpu",
        "triton_softmax",
        fresh_namespace("06_gpu", {"triton_softmax": code.replace(launch, f"{empty}\n    {launch}")}),
    )


@pytest.mark.skipif(triton_missing, reason="Triton is not installed")
@pytest.mark.xfail(
    strict=True,
    reason="the replay gives each launched view a buffer of its own, so no replayed buffer holds both halves; fix: "
    "record each key's storage and offset (helpers._recording) and replay views of one buffer per storage",
)
def test_a_wrapper_that_launches_on_halves_of_its_rows_keeps_its_points():
    """Two launches, each on half of the rows of x and out (out[:h], out[h:]), are the kernel's work all the same;
    the replay, which gives each slice a buffer of its own, has no buffer of out's shape to compare with."""
    from autograder.checking import verify
    from tests.harness.lessons import fresh_namespace

    launch = "_softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))"
    code = inspect.getsource(gpu.triton_softmax)
    assert launch in code
    halves = "for a, b in ((0, rows // 2), (rows // 2, rows)):\n        " + launch.replace(
        "[(rows,)](x, out,", "[(b - a,)](x[a:b], out[a:b],"
    )
    verify("06_gpu", "triton_softmax", fresh_namespace("06_gpu", {"triton_softmax": code.replace(launch, halves)}))
