"""Issue 33, a new attacker's tricks that the real grader still pays for (each test fails on main at 795436e).

Each trick is graded in the sandbox beside the solved notebook; it must lose exactly the aspect it dodges."""

import pytest

from autograder.checking import checks_for

# The student process may start a fresh Python, where nothing is switched off (runner.child installs the tripwires in
# its own process only): autograd and torch.softmax run there, outside every aspect without a memory bound.
SUBPROCESS = """
import pickle, subprocess, sys

_server = subprocess.Popen([sys.executable, "-c", {server!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def {signature}:
    pickle.dump(({args}), _server.stdin)
    _server.stdin.flush()
    return pickle.load(_server.stdout)
"""
AUTOGRAD_SERVER = """
import pickle, sys, torch
while True:
    try:
        q, k, v, dout, causal = pickle.load(sys.stdin.buffer)
    except EOFError:
        break
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(k.size(2) - q.size(2) + 1), float("-inf"))
    grads = torch.autograd.grad(torch.softmax(s, -1) @ v, (q, k, v), dout)
    pickle.dump(tuple(g.detach() for g in grads), sys.stdout.buffer)
    sys.stdout.buffer.flush()
"""
SOFTMAX_SERVER = """
import pickle, sys, torch
while True:
    try:
        x = pickle.load(sys.stdin.buffer)
    except EOFError:
        break
    pickle.dump(torch.softmax(x, -1), sys.stdout.buffer)
    sys.stdout.buffer.flush()
"""
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
# In the student's own process: PyTorch's NNC (torch._C._te) compiles aten::softmax from its own lowering, never
# calling aten's softmax kernel, so the tripwire never fires (no subprocess needed: a memory bound would not stop it).
NNC_SOFTMAX = r"""
torch._C._jit_set_te_must_use_llvm_cpu(False)


def online_softmax(x, block_size):
    x = x.contiguous()
    name = {torch.float32: "Float", torch.float64: "Double"}[x.dtype]
    ty = f"{name}({', '.join(map(str, x.shape))}, strides=[{', '.join(map(str, x.stride()))}], device=cpu)"
    graph = torch._C.parse_ir(
        f"graph(%x : {ty}):\n  %d : int = prim::Constant[value=-1]()\n  %n : NoneType = prim::Constant()\n"
        f"  %y : {ty} = aten::softmax(%x, %d, %n)\n  return (%y)"
    )
    return torch._C._te.TensorExprKernel(graph).run((x,))
"""
# In the student's own process: TorchScript's legacy executor differentiates its DifferentiableGraph with its own
# symbolic formulas and gives the outputs a grad_fn itself, so torch.autograd.grad works with autograd's kernels off.
JIT_AUTODIFF = r"""
# TorchScript's own autodiff (the legacy executor's DifferentiableGraph), not autograd's kernels
torch._C._jit_set_profiling_executor(False)
torch._C._get_graph_executor_optimize(True)
torch._C._debug_set_autodiff_subgraph_inlining(False)


@torch.jit.script
def _forward(q, kt, v, mask, shift, scale: float):
    e = torch.exp(torch.matmul(q, kt) * scale + mask - shift)
    return torch.matmul(e / torch.matmul(e, torch.ones_like(mask[0]).unsqueeze(-1)), v)


def attention_backward(q, k, v, dout, causal=False):
    work = torch.promote_types(q.dtype, torch.float32)
    q32, k32, v32, do32 = (t.detach().to(work) for t in (q, k, v, dout))
    tq, tk = q.size(2), k.size(2)
    mask = torch.zeros(tq, tk, dtype=work)
    if causal:
        mask = mask.masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq), float("-inf"))
    scale = q.size(-1) ** -0.5
    shift = (q32 @ k32.transpose(-2, -1) * scale + mask).amax(-1, keepdim=True)
    qq, vv = q32.clone().requires_grad_(), v32.clone().requires_grad_()
    kt = k32.transpose(-2, -1).contiguous().requires_grad_()
    dq, dkt, dv = torch.autograd.grad(_forward(qq, kt, vv, mask, shift, scale), (qq, kt, vv), do32)
    return dq.to(q.dtype), dkt.transpose(-2, -1).to(k.dtype), dv.to(v.dtype)
"""
TRICKS = {  # lesson: {student: ({grade id: code}, the graded name, the aspect it must lose)}
    "09_flash_backward": {
        "autograd-in-a-subprocess": (
            {
                "attention_backward": SUBPROCESS.format(
                    server=AUTOGRAD_SERVER,
                    signature="attention_backward(q, k, v, dout, causal=False)",
                    args="q, k, v, dout, causal",
                )
            },
            "attention_backward",
            "by hand",
        ),
        "torchscript-autodiff": ({"attention_backward": JIT_AUTODIFF}, "attention_backward", "by hand"),
    },
    "06_gpu": {
        "softmax-in-a-subprocess": (
            {
                "online_softmax": SUBPROCESS.format(
                    server=SOFTMAX_SERVER, signature="online_softmax(x, block_size)", args="x"
                )
            },
            "online_softmax",
            "values",
        ),
        "nnc-softmax": ({"online_softmax": NNC_SOFTMAX}, "online_softmax", "values"),
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
