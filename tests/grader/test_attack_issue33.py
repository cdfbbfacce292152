"""Issue 33, a new attacker's tricks that the real grader still pays for (each test fails on main at 795436e).

Each trick is graded in the sandbox beside the solved notebook; it must lose exactly the aspect it dodges. The
subprocess and compiler tricks moved to tests/grader/test_forbids.py (REAL_GRADER)."""

import pytest

from autograder.checking import checks_for

# Under TRITON_INTERPRET a kernel is Python: tl.core.builtins is the builtins module (getattr, eval), so the body
# reaches torch and a loaded block's numpy data without naming anything the AST rules refuse.
TORCH_IN_KERNEL = """
@triton.jit
def _attention_kernel(Q, K, V, O, TQ: tl.constexpr, TK: tl.constexpr, DH: tl.constexpr, CAUSAL: tl.constexpr,
                      BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    bh = tl.program_id(0)
    rq, rk, d = tl.arange(0, BQ)[:, None], tl.arange(0, BK)[:, None], tl.arange(0, BD)[None, :]
    q = tl.load(Q + bh * TQ * DH + rq * DH + d, mask=(rq < TQ) & (d < DH), other=0.0)
    k = tl.load(K + bh * TK * DH + rk * DH + d, mask=(rk < TK) & (d < DH), other=0.0)
    v = tl.load(V + bh * TK * DH + rk * DH + d, mask=(rk < TK) & (d < DH), other=0.0)
    py = tl.core.builtins
    th = py.eval("__import__('torch')")
    qt, kt, vt = (th.from_numpy(py.getattr(py.getattr(x, "hand" + "le"), "data")).double() for x in (q, k, v))
    mask = th.ones(TQ, TK, dtype=th.bool).tril(TK - TQ) if CAUSAL else None
    o = th.nn.functional.scaled_dot_product_attention(qt[:TQ, :DH], kt[:TK, :DH], vt[:TK, :DH], attn_mask=mask)
    py.getattr(py.getattr(q, "hand" + "le"), "data")[:TQ, :DH] = o.numpy()
    tl.store(O + bh * TQ * DH + rq * DH + d, q, mask=(rq < TQ) & (d < DH))
"""
TORCH_IN_KERNEL_WRAPPER = """
def triton_attention(q, k, v, causal=False):
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Tq, Dh = q.shape
    out = torch.empty_like(q)
    p2 = triton.next_power_of_2
    _attention_kernel[(B * H,)](q, k, v, out, TQ=Tq, TK=k.size(2), DH=Dh, CAUSAL=causal, BQ=p2(Tq), BK=p2(k.size(2)),
                                BD=p2(Dh))
    return out
"""
# Keys and values formed 2,048 positions at a time cost 0.15 to 0.2 CPU s on this grader, about COST_FLOOR_S (0.2 s):
# the price is compared only above it, so the verdict flips with the machine (3/3 in 2 of 3 runs here; 8,192 at a
# time costs more and is caught).
FORMED_IN_CHUNKS = """
def absorbed_attention(mla, x, latents, chunk=2048):
    with torch.no_grad():
        B, T, D = x.shape
        H, Dh, Tk = mla.n_heads, mla.head_dim, latents.size(1)
        q = mla.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
        s = torch.cat([q @ mla.k_up(latents[:, i : i + chunk]).view(B, -1, H, Dh).permute(0, 2, 3, 1)
                       for i in range(0, Tk, chunk)], -1) / Dh**0.5
        p = s.masked_fill(~torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T), float("-inf")).softmax(-1)
        o = sum(p[..., i : i + chunk] @ mla.v_up(latents[:, i : i + chunk]).view(B, -1, H, Dh).transpose(1, 2)
                for i in range(0, Tk, chunk))
        return mla.out_proj(o.transpose(1, 2).reshape(B, T, H * Dh))
"""
TRICKS = {  # lesson: {student: ({grade id: code}, the graded name, the aspect it must lose)}
    "06_gpu": {
        "torch-in-the-kernel": (
            {"_attention_kernel": TORCH_IN_KERNEL, "triton_attention": TORCH_IN_KERNEL_WRAPPER},
            "triton_attention",
            "float32",
        ),
    },
    "08_kv_compression": {
        "keys-in-2048-chunks": (
            {"absorbed_attention": FORMED_IN_CHUNKS},
            "absorbed_attention",
            "never forms keys or values",
        )
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("lesson", TRICKS)
def test_the_real_grader_costs_each_new_trick_its_aspect(lesson, tmp_path):
    from autograder import notebook as nbk
    from autograder.release import release
    from tests.harness.grading import read_grades, run
    from tests.harness.lessons import fill

    release(tmp_path / "release", [lesson])
    rel = nbk.read(tmp_path / "release" / lesson / f"{lesson}.ipynb")
    for student, (answers, _, _) in TRICKS[lesson].items():
        nbk.write(fill(rel, lesson, answers), tmp_path / "subs" / student / lesson / f"{lesson}.ipynb")
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--jobs", "1", "--quiet")
    grades = read_grades(tmp_path / "results")
    paid = {}
    for student, (_, name, aspect) in TRICKS[lesson].items():
        row = grades[student, lesson, f"test_{name}"]
        aspects = checks_for(lesson)[name].aspects
        core = next(iter(aspects))
        share = 0.0 if aspect == core else float(row["max_points"]) * (1 - aspects[aspect] / sum(aspects.values()))
        if float(row["points"]) != pytest.approx(share, abs=0.01):
            paid[student] = (row["points"], row["max_points"], row["message"][:200])
    assert not paid, paid
