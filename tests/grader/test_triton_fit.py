"""Triton kernels compiled ahead of time for the GPUs students have, on this CPU (autograder/triton_fit.py):
the tiles solutions.gpu.attention_tiles picks compile and fit each card, and what the interpreter accepts
but a GPU compiler refuses is named."""

import pytest
import torch

from autograder import triton_fit as fit
from solutions import flash_backward, gpu

pytestmark = pytest.mark.skipif(not gpu.HAS_TRITON, reason="Triton is not installed")
triton, tl = gpu.triton, gpu.tl  # the kernels below name them so, as a lesson's do
FP = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def tiles(arch, dtype, head_dim):
    return gpu.attention_tiles((arch // 10, arch % 10), fit.ARCHES[arch][1], FP[dtype], head_dim)


def test_bfloat16_is_refused_below_ampere_and_taken_from_it():
    with pytest.raises(ValueError, match="bfloat16"):
        gpu.attention_tiles((7, 5), 64 * 1024, torch.bfloat16, 64)
    assert gpu.attention_tiles((8, 0), 163 * 1024, torch.bfloat16, 64)["BLOCK_Q"] >= 16
    with pytest.raises(ValueError, match="float64"):
        gpu.attention_tiles((9, 0), 227 * 1024, torch.float64, 64)


def test_both_launchers_refuse_bfloat16_on_a_t4_with_a_clear_value_error(monkeypatch):
    """triton_attention and lesson 09's triton_flash_forward take their tiles from launch_tiles, which asks the
    tensor's GPU (here a stand-in T4: capability 7.5, 64 KiB per block) and refuses bfloat16 before any launch."""
    from types import SimpleNamespace

    props = SimpleNamespace(get_device_properties=lambda index: {"max_shared_mem": 64 * 1024})
    fake = SimpleNamespace(runtime=SimpleNamespace(driver=SimpleNamespace(active=SimpleNamespace(utils=props))))
    monkeypatch.setattr(gpu, "triton", fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))

    def on_a_t4(dtype):
        return SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0), dtype=dtype, size=lambda dim: 64)

    assert gpu.launch_tiles(on_a_t4(torch.float16)) == tiles(75, "float16", 64)
    with pytest.raises(ValueError, match=r"bfloat16 needs compute capability 8.0 .* this GPU has 7.5: use float16"):
        gpu.launch_tiles(on_a_t4(torch.bfloat16))
    assert flash_backward.launch_tiles is gpu.launch_tiles


def test_tiles_shrink_with_shared_memory_and_grow_with_it():
    """B_c = ceil(M / 4d): less on-chip memory, or a wider head or element, never gets larger tiles."""

    def area(t):
        return t["BLOCK_Q"] * t["BLOCK_K"]

    for dtype in ("float16", "float32"):
        for d in (64, 128):
            assert (
                area(tiles(75, dtype, d))
                <= area(tiles(86, dtype, d))
                <= area(tiles(80, dtype, d))
                <= area(tiles(90, dtype, d))
            )
            assert area(tiles(86, "float32", d)) <= area(tiles(86, "float16", d))
    assert area(tiles(86, "float32", 128)) < area(tiles(86, "float32", 64)) <= area(tiles(90, "float32", 64))
    assert area(tiles(75, "float16", 128)) < area(tiles(80, "float16", 128)) and area(tiles(75, "float32", 128)) < area(
        tiles(80, "float32", 128)
    )
    for d in (4, 16, 24, 64, 100, 128):
        t = tiles(80, "float16", d)
        assert t["BLOCK_D"] >= max(d, 16) and t["BLOCK_D"] & (t["BLOCK_D"] - 1) == 0
        assert set(t) == {"BLOCK_Q", "BLOCK_K", "BLOCK_D", "num_warps", "num_stages"}


def test_the_largest_tiles_the_launcher_picks_compile_and_fit_every_card():
    """One compile per card: float16 at head_dim 128, the largest tiles the launcher picks (float16 compiles
    fastest; every dtype and head_dim is the slow test's, and benchmarks/triton_fit.py's)."""
    jobs = [
        fit.attention_job(gpu._attention_kernel, arch, "float16", 128, tiles(arch, "float16", 128))
        for arch in fit.ARCHES
    ]
    for r in fit.compile_jobs(jobs):
        assert r["compiles"] and r["fits"], fit.describe(r)


@pytest.mark.slow
def test_every_launch_of_both_attention_kernels_compiles_and_fits_every_card():
    jobs = [
        fit.attention_job(kernel, arch, dtype, d, tiles(arch, dtype, d))
        for kernel in (gpu._attention_kernel, flash_backward._flash_forward_kernel)
        for arch in fit.ARCHES
        for dtype in FP
        for d in (64, 128)
        if not (dtype == "bfloat16" and arch < 80)
    ]
    for r in fit.compile_jobs(jobs):
        assert r["compiles"] and r["fits"], f"{r['kernel']} {r['label']}: {fit.describe(r)}"


def test_the_old_fixed_tiles_did_not_fit_a_t4():
    """What the fit is for: 128 x 64 tiles in two stages, float32 at head_dim 128, needs more shared memory
    than a T4 has (the launchers used them on every card before attention_tiles)."""
    fixed = {"BLOCK_Q": 128, "BLOCK_K": 64, "BLOCK_D": 128, "num_warps": 8, "num_stages": 2}
    (r,) = fit.compile_jobs([fit.attention_job(gpu._attention_kernel, 75, "float16", 128, fixed)])
    assert r["compiles"] and not r["fits"] and r["shared"] > r["limit"]
    assert "does not fit T4" in fit.describe(r)


# Two slips Triton's interpreter runs without a word and a GPU compiler refuses.
@triton.jit
def _dot_on_8x8(A, B, C):
    r = tl.arange(0, 8)
    a = tl.load(A + r[:, None] * 8 + r[None, :])
    b = tl.load(B + r[:, None] * 8 + r[None, :])
    tl.store(C + r[:, None] * 8 + r[None, :], tl.dot(a, b))


@triton.jit
def _if_on_a_block(X, Y, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + cols, mask=cols < n, other=0.0)
    if x > 0.0:  # meant tl.where(x > 0, x, 0): the interpreter takes it as true
        x = x * 2.0
    tl.store(Y + cols, x, mask=cols < n)


def test_the_interpreter_runs_what_the_compiler_refuses_and_the_refusal_is_named():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    c = torch.empty(8, 8)
    _dot_on_8x8[(1,)](a, b, c)
    torch.testing.assert_close(c, a @ b)
    x = torch.randn(10)
    y = torch.empty(10)
    _if_on_a_block[(1,)](x, y, 10, BLOCK=16)
    dot, cond = fit.compile_jobs(
        [
            fit.job(_dot_on_8x8, {"A": "*fp16", "B": "*fp16", "C": "*fp32"}, {}, 80),
            fit.job(_if_on_a_block, {"X": "*fp32", "Y": "*fp32", "n": "i32"}, {"BLOCK": 16}, 80),
        ]
    )
    assert not dot["compiles"] and "K >= 16" in dot["error"] and "line 5" in dot["error"]
    assert not cond["compiles"] and "Boolean value of Tensor" in cond["error"] and "line 4" in cond["error"]
    assert fit.describe(cond).startswith("does not compile for A100")


SCALE = tl.constexpr(2.0)  # a plain global the compiler refuses (the interpreter takes it)


@triton.jit
def _doubled(x):
    return x * SCALE


@triton.jit
def _with_a_helper(X, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(X + cols, _doubled(tl.load(X + cols)))


def test_kernel_source_brings_the_helpers_and_constants_a_kernel_names():
    name, sources = fit.kernel_source(flash_backward._flash_forward_kernel)
    assert name == "_flash_forward_kernel" and sources[-1].startswith("@triton.jit\ndef _flash_forward_kernel(")
    name, sources = fit.kernel_source(_with_a_helper)
    assert sources[0] == "SCALE = tl.constexpr(2.0)" and sources[1].startswith("@triton.jit\ndef _doubled(x):")
    plain = (name, ["SCALE = 2.0", *sources[1:]])
    took, refused = fit.compile_jobs([fit.job(k, {"X": "*fp32"}, {"BLOCK": 16}, 80) for k in ((name, sources), plain)])
    assert took["compiles"], took["error"]
    assert (
        not refused["compiles"]
        and refused["error"].startswith("line 3 of the kernel: NameError(")
        and "global variable SCALE" in refused["error"]
    ), "the cause, from inside the helper"
    cells = ["x = 1", "if HAS_TRITON:\n    @triton.jit\n    def _k(X, BLOCK: tl.constexpr):\n        pass\n"]
    assert fit.notebook_kernels(cells) == {"_k": ("_k", ["@triton.jit\ndef _k(X, BLOCK: tl.constexpr):\n    pass"])}


# The two slips as a student of lesson 06 writes them: kernels the interpreter runs, right, and a GPU refuses.
def _edited(kernel, *edits):
    src = fit.kernel_source(kernel)[1][-1]
    for old, new in edits:
        assert old in src, f"the edit no longer applies: {old!r}"
        src = src.replace(old, new)
    return src


DOT_ON_8 = _edited(
    gpu._attention_kernel,
    ("for start in range(0, hi, BLOCK_K):", "for start in range(0, hi, 8):"),
    ("keys = start + tl.arange(0, BLOCK_K)", "keys = start + tl.arange(0, 8)  # key tiles of 8"),
)
IF_ON_A_BLOCK = _edited(
    gpu._softmax_kernel,
    (
        "    e = tl.exp(x - tl.max(x, 0))",
        "    x = x - tl.max(x, 0)\n"
        "    if x < -80.0:  # meant: clamp each entry (tl.maximum); a Python if on the whole block\n"
        "        x = tl.maximum(x, -80.0)\n"
        "    e = tl.exp(x)",
    ),
)


def _defined(src):
    """The kernel of src, defined here (under the interpreter, as the tests run)."""
    ns = {"triton": triton, "tl": tl}
    exec(compile(src, "<answer>", "exec"), ns)
    return next(v for k, v in ns.items() if k.startswith("_") and hasattr(v, "fn"))


def test_both_slips_run_right_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(gpu, "_attention_kernel", _defined(DOT_ON_8))
    monkeypatch.setattr(gpu, "_softmax_kernel", _defined(IF_ON_A_BLOCK))
    q, k, v = (torch.randn(1, 2, t, 16) for t in (20, 33, 33))
    torch.testing.assert_close(
        gpu.triton_attention(q, k, v, True), gpu.naive_attention(q, k, v, True), atol=1e-5, rtol=1e-5
    )
    x = torch.randn(3, 37)
    torch.testing.assert_close(gpu.triton_softmax(x), torch.softmax(x, -1))


def test_check_kernels_names_each_slip_and_passes_the_lessons_own():
    said = fit.check_kernels([DOT_ON_8, IF_ON_A_BLOCK])
    assert [bad for bad, _ in said] == [True, True]
    dot, cond = sorted(line for _, line in said)
    assert dot.startswith("_attention_kernel (float16 head_dim 64, 128 x 64 tiles") and "at least 16 x 16" in dot
    assert cond.startswith("_softmax_kernel (float16 BLOCK 1024") and "Python `if` on a block-shaped tensor" in cond
    own = fit.check_kernels([fit.kernel_source(k)[1][-1] for k in (gpu._attention_kernel, gpu._softmax_kernel)])
    assert [bad for bad, _ in own] == [False, False] and all("fits A100" in line for _, line in own)
    stub = (
        "@triton.jit\ndef _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):\n"
        '    """One program computes one row."""\n    raise NotImplementedError\n'
    )
    assert fit.check_kernels([stub]) == [], "a kernel not written yet: the visible tests say so"
    renamed = DOT_ON_8.replace("stride_kt,", "stride_kv,", 1)
    assert fit.check_kernels([renamed]) == [
        (
            True,
            "_attention_kernel: its parameters are not the lesson's ("
            + ", ".join(fit.ATTENTION_ARGS)
            + "), so it cannot be compiled "
            "as the lesson launches it",
        ),
        (True, fit.not_triton_message("_attention_kernel", "stride_kt")),  # the grader refuses the name too
    ]


def test_the_target_tiles_are_attention_tiles_for_an_a100():
    assert fit.A100_TILES == tiles(fit.TARGET, "float16", 64)


def test_without_triton_the_check_says_it_skipped_and_why(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert fit.check_kernels([IF_ON_A_BLOCK]) == [
        (
            False,
            "Triton kernels: not compiled for a GPU, since Triton is "
            "not installed here (pip install triton; Linux only)",
        )
    ]


def test_check_submission_compiles_the_students_kernels_and_names_the_slip(tmp_path):
    """check_submission.py in lesson 06's folder (where release puts triton_fit.py beside it), on a notebook whose
    attention kernel takes keys in tiles of 8."""
    from autograder import check_submission as cs
    from autograder import notebook as nbk
    from autograder.release import student_copy

    source = nbk.LESSONS_DIR / "06_gpu"
    nb = student_copy(nbk.read(source / "06_gpu.ipynb"))
    for cell in nbk.code_cells(nb):
        if nbk.grade_id(cell) == "_attention_kernel":
            nbk.set_source(cell, DOT_ON_8)
        elif nbk.grade_id(cell) == "_softmax_kernel":
            nbk.set_source(cell, fit.kernel_source(gpu._softmax_kernel)[1][-1])
    nbk.write(nb, tmp_path / "mine.ipynb")
    found = cs.check(tmp_path / "mine.ipynb", cs.lesson_facts(nb, "06_gpu"), run=False, folder=source)
    compiled = dict((line.split()[0], (bad, line)) for bad, line in found if "A100" in line)
    assert set(compiled) == {"_attention_kernel", "_softmax_kernel"}, found
    assert compiled["_attention_kernel"][0] and "at least 16 x 16" in compiled["_attention_kernel"][1]
    assert not compiled["_softmax_kernel"][0] and "fits A100" in compiled["_softmax_kernel"][1]


def test_graded_kernels_cost_the_aspect_of_the_launchers_test_and_nothing_else():
    """grade --kernels-graded: a kernel the compiler refuses loses its launcher's test KERNEL_WEIGHT of its aspects'
    weight; one that compiles and fits, or a launcher whose core failed, keeps what it had."""
    from autograder import grade
    from autograder.checking import checks_for

    checks = checks_for("06_gpu")

    def row(name, max_points, status="passed", message="", **aspects):
        out = dict(test=f"test_{name}", max_points=max_points, status=status, message=message)
        out["points"] = float(max_points) if status == "passed" else 0.0
        if aspects:
            out["aspects"] = grade.aspect_rows(checks[name].aspects, max_points, **aspects)
        return out

    def rows():
        every = [dict(aspect=a, weight=w, passed=True) for a, w in checks["triton_softmax"].aspects.items()]
        return [
            row("triton_softmax", 1, passed=every),
            row("triton_attention", 2, "failed", "wrong values", failed="wrong values"),
            row("fuse_qkv", 2),
        ]

    refused = "_softmax_kernel (float16 BLOCK 1024, 4 warps) does not compile for A100: line 14 of the kernel: ..."
    got = rows()
    grade.grade_kernels(got, checks, [(True, refused), (False, "_attention_kernel (...) fits A100 (...)")])
    softmax, attention, fuse = got
    assert (softmax["status"], softmax["points"]) == ("failed", 0.75) and refused in softmax["message"]
    assert [a["passed"] for a in softmax["aspects"]] == [True, True, False]
    assert softmax["aspects"][-1]["aspect"] == grade.KERNEL_ASPECT and softmax["aspects"][-1]["message"] == refused
    assert (attention["status"], attention["points"], attention["message"]) == ("failed", 0.0, "wrong values")
    assert attention["aspects"][-1]["message"] == "earned only when float32 passes"
    assert fuse == rows()[2]
    got = rows()
    grade.grade_kernels(got, checks, [(False, "_softmax_kernel (...) fits A100 (...)")])
    assert (got[0]["status"], got[0]["points"]) == ("passed", 1.0) and len(got[0]["aspects"]) == 3
    got = rows()
    grade.grade_kernels(got, checks, [(True, "Triton kernels: not compiled for a GPU here (OverBudget: ...)")])
    assert got[0]["points"] == 0.75, "no verdict, when it is worth points: not earned"
    got = rows()
    grade.grade_kernels(got, checks, [])
    assert got[0]["points"] == 0.75 and "not found among your answer cells" in got[0]["message"]


def test_graded_kernels_refuse_a_target_the_lessons_own_tiles_do_not_fit(monkeypatch):
    from autograder import grade
    from autograder.results import UsageError

    grade.check_reference_kernels(["06_gpu"])  # its own kernels fit an A100: grading may start
    monkeypatch.setattr(fit, "A100_TILES", dict(fit.A100_TILES, BLOCK_Q=256, BLOCK_K=256, BLOCK_D=256, num_stages=4))
    with pytest.raises(UsageError, match="06_gpu's own kernels do not pass: _attention_kernel does not fit A100"):
        grade.check_reference_kernels(["06_gpu"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["note", "graded"])
def test_grade_kernels_says_in_the_feedback_what_the_compiler_refuses(tmp_path, mode):
    """grade --kernels on a lesson 06 submission with both slips, compiled in the submission's sandbox, and on the
    solution: the feedback names each one's problem; as a note, full marks (they run right in the interpreter);
    graded, each launcher's test loses the kernel's aspect, and the solution keeps every point."""
    import subprocess
    import sys

    from autograder import grade
    from autograder import notebook as nbk
    from autograder.release import release
    from tests.harness.grading import read_grades
    from tests.harness.lessons import fill

    release(tmp_path / "release", ["06_gpu"])
    rel = nbk.read(tmp_path / "release" / "06_gpu" / "06_gpu.ipynb")
    nbk.write(
        fill(rel, "06_gpu", {"_attention_kernel": DOT_ON_8, "_softmax_kernel": IF_ON_A_BLOCK}),
        tmp_path / "subs" / "ada" / "06_gpu" / "06_gpu.ipynb",
    )
    nbk.write(fill(rel, "06_gpu"), tmp_path / "subs" / "bo" / "06_gpu" / "06_gpu.ipynb")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(tmp_path / "subs"),
            "--out",
            str(tmp_path / "results"),
            "--lesson",
            "06_gpu",
            {"note": "--kernels", "graded": "--kernels-graded"}[mode],
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    grades = read_grades(tmp_path / "results")
    lost = {"note": {}, "graded": {"test_triton_softmax": 0.25, "test_triton_attention": 0.5}}[mode]
    for (student, _, test), r in grades.items():
        most = float(r["max_points"])
        want = most - (lost.get(test, 0) if student == "ada" else 0)
        assert (r["status"], float(r["points"])) == ("passed" if want == most else "failed", want), (student, r)
    feedback = (tmp_path / "results" / "feedback" / "ada" / "06_gpu.html").read_text()
    how = "graded: an aspect of the test of its launcher" if mode == "graded" else "a note, not graded"
    assert f"Triton kernels ({how}): _attention_kernel" in feedback
    assert "at least 16 x 16" in feedback and "Python `if` on a block-shaped tensor" in feedback
    assert (mode == "graded") == (grade.KERNEL_ASPECT in feedback)
