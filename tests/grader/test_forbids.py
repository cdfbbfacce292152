"""What an exercise forbids (lessons/NN/lesson.toml [forbids], autograder/sandbox/tripwires.py): every route to a
forbidden path costs exactly its declared aspect, with a message naming the path, and nothing a student's code does
in its own process afterwards turns the path back on."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import lessons
from autograder.checking import PartialCredit, checks_for, mistakes, verify
from autograder.checking.subject import OverBudget, Subject
from autograder.sandbox import tripwires
from solutions import flash_backward, gpu
from tests.harness.lessons import LESSONS, fresh_namespace


def tricks():
    """pytest params (lesson, name, Mistake) of the mutants that cost a forbidden aspect."""
    return [
        pytest.param(lesson, name, m, id=f"{lesson}-{name}-{m.what}")
        for lesson in LESSONS
        for name, rule in lessons.forbids(lesson).items()
        for m in mistakes.mutants(lesson).get(name, [])
        if m.aspect == rule["aspect"]
    ]


def test_every_forbidden_aspect_has_tricks_and_names_a_real_aspect():
    found = {(p.values[0], p.values[1]) for p in tricks()}
    for lesson in LESSONS:
        for name, rule in lessons.forbids(lesson).items():
            assert rule["aspect"] in checks_for(lesson)[name].aspects, (lesson, name, rule["aspect"])
            if name != "FlashAttention":  # isolated: its forward and backward are the grader's own
                assert (lesson, name) in found, f"{lesson}: no mutant shows {name} losing {rule['aspect']}"


@pytest.mark.parametrize("lesson, name, mistake", tricks())
def test_a_forbidden_path_costs_exactly_its_aspect(lesson, name, mistake):
    rule = lessons.forbids(lesson)[name]
    with pytest.raises(AssertionError) as caught:
        verify(lesson, name, fresh_namespace(lesson, {name: mistake.code}))
    error = caught.value
    what = " and ".join(tripwires.PATHS[p] for p in rule["paths"])
    assert "reached" in str(error) or what in str(error), str(error)
    assert rule["instead"] in str(error)
    core = next(iter(checks_for(lesson)[name].aspects))
    if rule["aspect"] == core:  # the core lost: every aspect with it, as any core failure
        assert not isinstance(error, PartialCredit)
    else:
        assert isinstance(error, PartialCredit), str(error)
        assert {r["aspect"] for r in error.rows if not r["passed"]} == {rule["aspect"]}, error.rows


def test_the_messages_name_the_operator_reached():
    ns = fresh_namespace(
        "06_gpu",
        {
            "flash_attention": next(
                m.code for m in mistakes.mutants("06_gpu")["flash_attention"] if m.what.startswith("a dispatch table")
            )
        },
    )
    with pytest.raises(PartialCredit) as caught:
        verify("06_gpu", "flash_attention", ns)
    assert str(caught.value) == (
        "flash_attention reached PyTorch's attention kernel (aten::scaled_dot_product_attention)"
        ": write the tiled loop yourself"
    )


def test_manifests_refuse_unknown_paths_and_aspects(tmp_path):
    from tests.grader.test_lessons import toy_lesson

    lesson = toy_lesson(tmp_path, extra='[forbids.toy_fn]\naspect = "tiled"\npaths = ["numpy"]\ninstead = "x"\n')
    with pytest.raises(lessons.LessonError, match="'numpy' is not a path"):
        lessons.read(lesson, tmp_path)
    lessons.read.cache_clear()
    lesson = toy_lesson(tmp_path, extra='[forbids.other]\naspect = "tiled"\npaths = ["softmax"]\ninstead = "x"\n')
    with pytest.raises(lessons.LessonError, match="other is not a graded name"):
        lessons.read(lesson, tmp_path)
    lessons.read.cache_clear()


# What a student who controls its own process tries once the paths are off (as in the sandbox's child, before
# any cell): every attempt must still end in the tripwire, or give no gradient.
ATTACKS = r"""
import ctypes, gc, json, sys
import torch
import torch.nn.functional as F
results = {}
q = torch.randn(1, 2, 8, 4, dtype=torch.float64)

def attempt(name, fn):
    try:
        fn()
        results[name] = "reached"
    except Exception as e:
        results[name] = type(e).__name__

# PyTorch's compilers make kernels of their own, by any name (tripwires.compiler_routes): NNC lowers softmax itself,
# TorchScript's executor differentiates its graph and sets grad_fn itself
import importlib
torch._C._jit_set_te_must_use_llvm_cpu(False)
TY = "Double(1, 2, 8, 4, strides=[64, 32, 4, 1], device=cpu)"
IR = (f"graph(%x : {TY}):\n  %d : int = prim::Constant[value=-1]()\n  %n : NoneType = prim::Constant()\n"
      f"  %y : {TY} = aten::softmax(%x, %d, %n)\n  return (%y)")
attempt("NNC", lambda: torch._C._te.TensorExprKernel(torch._C.parse_ir(IR)).run((q,)))
attempt("NNC by built names", lambda: getattr(importlib.import_module("torch._C._" + "te"), "TensorExpr" + "Kernel")(
    getattr(torch._C, "parse" + "_ir")(IR)).run((q,)))
nnc = [o for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "TensorExprKernel"][0]
attempt("NNC's type found by gc, torch's re-export", lambda: nnc(torch.parse_ir(IR)).run((q,)))

def exp_x(t):
    return torch.exp(t) * t

def scripted_grad(jit):  # torch.jit.script needs a file's source: a -c script compiles from text, as it does
    torch._C._jit_set_profiling_executor(False)
    torch._C._get_graph_executor_optimize(True)
    torch._C._debug_set_autodiff_subgraph_inlining(False)
    f = jit.CompilationUnit("def exp_x(t):\n    return torch.exp(t) * t\n").exp_x
    t = q.clone().requires_grad_()
    return torch.autograd.grad(f(t).sum(), t)

attempt("TorchScript autodiff", lambda: scripted_grad(torch.jit))
attempt("TorchScript by importlib", lambda: scripted_grad(importlib.import_module("torch." + "jit")))
attempt("torch.jit.trace", lambda: torch.jit.trace(exp_x, q))
attempt("torch.compile", lambda: torch.compile(exp_x))
# Python routes that never reach the path's operators (tripwires.routes)
import torch._refs
from torch._decomp import decomposition_table
from torch.nn.attention.flex_attention import flex_attention
attempt("torch._refs", lambda: torch._refs.softmax(q, -1))
attempt("decomposition", lambda: decomposition_table[torch.ops.aten._softmax.default](q, -1, False))
attempt("backward decomposition", lambda: decomposition_table[torch.ops.aten._softmax_backward_data.default](
    q, q, -1, q.dtype))
attempt("the decomposition found by gc", lambda: [f for f in gc.get_objects() if type(f).__name__ == "function"
                                                 and f.__name__ == "_softmax_backward_data"][0](q, q, -1, q.dtype))
eye = torch.eye(4, dtype=torch.float64)
attempt("need_weights=True", lambda: F.multi_head_attention_forward(
    q[0, 0, :, None], q[0, 0, :, None], q[0, 0, :, None], 4, 1, None, None, None, None, False, 0.0, eye, None,
    training=False, need_weights=True, use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
    v_proj_weight=eye))
attempt("flex_attention", lambda: flex_attention(q, q, q))
# Undo: find the registration's handle through the garbage collector, or a library of our own
handles = [o for o in gc.get_objects() if type(o).__name__ == "_DispatchModule"]
results["handles found"] = len(handles)
for h in handles + [o.m for o in gc.get_objects() if type(o).__name__ == "Library" and o.m is not None]:
    h.reset()
lib = torch._C._dispatch_library("IMPL", "aten", "")
lib.reset()
attempt("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, q, q))
attempt("fused CPU op", lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q))
attempt("math op", lambda: torch.ops.aten._scaled_dot_product_attention_math(q, q, q))
attempt("kernel looked up", lambda: torch._C._dispatch_get_computed_kernel_for_dispatch_key(
    "aten::_scaled_dot_product_flash_attention_for_cpu", torch._C.DispatchKey.CPU).call_boxed(
    torch._C._dispatch_keyset_full(), q, q, q))
attempt("multi_head_attention_forward", lambda: torch.nn.MultiheadAttention(4, 1, dtype=torch.float64).eval()(
    q[0, 0], q[0, 0], q[0, 0], need_weights=False))
attempt("vmap", lambda: torch.vmap(F.scaled_dot_product_attention)(q, q, q))
attempt("softmax", lambda: q.softmax(-1))
attempt("distribution", lambda: torch.distributions.Categorical(logits=q).probs)
attempt("python dispatcher", lambda: (torch._C._EnablePythonDispatcher(), q.softmax(-1)))
x = q.clone().requires_grad_()
attempt("autograd.grad", lambda: torch.autograd.grad((x * x).sum(), x))
attempt("backward", lambda: (x * x).sum().backward())
attempt("softmax backward", lambda: torch.ops.aten._softmax_backward_data(q, q, -1, torch.float64))
g = torch.func.grad(lambda t: (t * t).sum())(q)
results["torch.func.grad is zero"] = bool((g == 0).all())
print(json.dumps(results))
"""


def test_a_student_process_cannot_turn_the_paths_back_on():
    script = (
        "from autograder.sandbox import tripwires\n"
        "tripwires.install(['attention kernels', 'softmax', 'autograd'])\n" + ATTACKS
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results.pop("handles found") == 0
    assert results.pop("torch.func.grad is zero") is True
    assert results.pop("autograd.grad") == results.pop("backward") == "RuntimeError"  # nothing was recorded
    assert set(results.values()) == {"ForbiddenPath"}, results


def test_without_the_paths_off_every_attack_reaches_its_path():
    """The attacks are real: in a plain process each one reaches what it aims at (so the test above can fail)."""
    out = subprocess.run([sys.executable, "-c", ATTACKS], capture_output=True, text=True, timeout=300)
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results.pop("torch.func.grad is zero") is False
    results.pop("handles found")
    assert {name: r for name, r in results.items() if r != "reached"} == {}


def _attention_backward_by_autograd(q, k, v, dout, causal=False):
    import torch

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    if causal:
        seen = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril(k.size(-2) - q.size(-2))
        scores = scores.masked_fill(~seen, float("-inf"))
    return torch.autograd.grad(scores.softmax(-1) @ v, (q, k, v), dout)


@pytest.mark.parametrize(
    "lesson, name, aspect, forbidden",
    [
        ("06_gpu", "online_softmax", "values", lambda x, block_size: x.softmax(-1)),
        ("09_flash_backward", "attention_backward", "by hand", _attention_backward_by_autograd),
    ],
)
def test_a_table_of_a_forbidden_aspects_answers_worked_out_beforehand_loses_it(
    lesson, name, aspect, forbidden, monkeypatch
):
    """A forbidden aspect's inputs are drawn from a seed no source shows (checking.unseen_seed): an answer that looks up
    what a correct one returned on every call of the check, recorded in another run, and takes the forbidden path
    elsewhere, loses that aspect (it kept every mark while they came from the check's name)."""
    import hashlib
    import secrets

    import torch

    from autograder.checking import subject

    def key(args):
        return hashlib.sha256(repr([a.tolist() if torch.is_tensor(a) else a for a in args]).encode()).hexdigest()

    table, ns = {}, fresh_namespace(lesson)
    correct = ns[name]

    def recording(*args, **kwargs):
        return table.setdefault(key([*args, kwargs]), correct(*args, **kwargs))

    def from_the_table(*args, **kwargs):
        found = key([*args, kwargs])
        return table[found] if found in table else forbidden(*args, **kwargs)

    ns[name] = recording
    verify(lesson, name, ns)
    monkeypatch.setattr(subject, "RUN_KEY", secrets.token_bytes(16))  # the run that grades it
    ns = fresh_namespace(lesson)
    ns[name] = from_the_table
    with pytest.raises(AssertionError) as caught:
        verify(lesson, name, ns)
    if isinstance(caught.value, PartialCredit):
        lost = {r["aspect"] for r in caught.value.rows if not r["passed"]}
    else:  # the core: the whole check
        lost = {next(iter(checks_for(lesson)[name].aspects))}
    assert lost == {aspect}, str(caught.value)


# TorchScript's entry points the compilers' cut replaces stay reachable where torch keeps them under other names
# (torch.jit._builtins' table of builtins, torchbind's saved ScriptMethod.__call__): a module saved beforehand, loaded
# and run through them, still ends at the dispatcher's tripwires (NNC fusion enabled: the profiling run reaches
# aten::softmax first) and records nothing to differentiate.
LEFTOVERS = r"""
import base64, json, re, torch
import torch.jit._builtins as builtins
import torch._higher_order_ops.torchbind as torchbind
load = next(f for f, name in builtins._builtin_ops if name == "aten::import_ir_module_from_buffer")
torch._C._jit_override_can_fuse_on_cpu(True)
torch._C._jit_set_texpr_fuser_enabled(True)
torch._C._jit_set_te_must_use_llvm_cpu(False)
results = {}
for name, blob in json.loads(%r).items():
    method = load(torch.jit._state._python_cu, base64.b64decode(blob), None, {}, False)._get_method("forward")
    t = torch.randn(4, 8, requires_grad=True)
    try:
        for _ in range(3):  # past the profiling runs
            out = torchbind._orig_scriptmethod_call(method, t)
        torch.autograd.grad(out.sum(), t)
        results[name] = "reached"
    except Exception as e:
        tripwire = re.search(r"reached [^\n]*?\(aten::[\w.]+\)", str(e))  # the interpreter wraps ForbiddenPath
        results[name] = tripwire.group() if tripwire else type(e).__name__
print(json.dumps(results))
"""


def test_torchscript_run_through_what_torch_keeps_of_its_entry_points_ends_at_the_tripwires():
    import base64
    import io

    import torch

    class Softmax(torch.nn.Module):
        def forward(self, t):
            return torch.softmax(t * 2.0, -1)

    class Product(torch.nn.Module):
        def forward(self, t):
            return torch.exp(t) * t

    blobs = {}
    for module in (Softmax(), Product()):
        buffer = io.BytesIO()
        torch.jit.save(torch.jit.script(module), buffer)
        blobs[type(module).__name__] = base64.b64encode(buffer.getvalue()).decode()
    script = LEFTOVERS % json.dumps(blobs)
    off = "from autograder.sandbox import tripwires\ntripwires.install(['softmax', 'autograd'])\n"
    results = [
        json.loads(
            subprocess.run([sys.executable, "-c", prefix + script], capture_output=True, text=True, timeout=300)
            .stdout.strip()
            .splitlines()[-1]
        )
        for prefix in ("", off)
    ]
    assert results[0] == {"Softmax": "reached", "Product": "reached"}  # the routes are real
    assert results[1]["Softmax"] == "reached PyTorch's softmax (aten::softmax.int)", results[1]
    assert results[1]["Product"] == "RuntimeError", results[1]  # nothing recorded: no gradient


@pytest.mark.parametrize("handle", ["orphaned", "leaked"])
def test_a_scan_of_the_heap_finds_no_handle_to_reset(handle):
    """A cell that scans the heap for our registration's handle, to reset() it and reach the kernels: the sandbox's
    registration has no handle left to find, and the paths stay off. "leaked": the handle kept alive by a reference
    nobody holds instead (as before issue 33), which the scan finds, so that this test can fail."""
    leak = "tripwires._orphan = lambda h: ctypes.pythonapi.Py_IncRef(ctypes.py_object(h))\n" * (handle == "leaked")
    script = f"""
{RESET_THROUGH_THE_HEAP}
from autograder.sandbox import tripwires
{leak}tripwires.install(['attention kernels', 'softmax'])
print(tripwires.probe(['attention kernels', 'softmax']))
print(_reset())
q = torch.ones(1, 1, 2, 2)
try:
    torch.nn.functional.scaled_dot_product_attention(q, q, q)
    print("reached", tripwires.probe(['attention kernels', 'softmax'])[:1])
except tripwires.ForbiddenPath:
    print("off", tripwires.probe(['attention kernels', 'softmax']))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    before, found, after = out.stdout.splitlines()[-3:]
    assert before == "[]", out.stderr[-2000:]
    if handle == "orphaned":
        assert (found, after) == ("0", "off []")
    else:  # the probe, the second layer, still names what came back
        assert int(found) > 0 and after.startswith("reached ['aten::"), (found, after)


RESET_THROUGH_THE_HEAP = """
import ctypes, gc
import numpy as np
import torch


def _reset():
    kind = type(torch._C._dispatch_library("FRAGMENT", "heap_probe", ""))
    held = {id(r) for o in gc.get_objects() for r in gc.get_referents(o) if type(r) is kind}
    found = []
    for line in open("/proc/self/maps"):
        parts = line.split()
        if not parts[1].startswith("rw") or (len(parts) > 5 and parts[5] != "[heap]"):
            continue
        a, b = (int(x, 16) for x in parts[0].split("-"))
        try:
            words = np.frombuffer((ctypes.c_char * (b - a)).from_address(a), dtype=np.uint64)
        except Exception:
            continue
        found += [a + (int(i) - 1) * 8 for i in np.nonzero(words == np.uint64(id(kind)))[0] if i and words[i - 1] == 1]
    handles = [ctypes.cast(addr, ctypes.py_object).value for addr in found if addr not in held]
    for h in handles:
        h.reset()
    return len(handles)
"""


def test_removed_in_process_the_kernels_come_back():
    """A hidden test in the student's own notebook switches them off for its calls only (LocalSubject)."""
    import torch

    remove = tripwires.install(["softmax"], for_good=False)
    with pytest.raises(tripwires.ForbiddenPath, match=r"aten::softmax\.int"):
        torch.ones(3).softmax(-1)
    remove()
    assert torch.ones(2).softmax(-1).tolist() == [0.5, 0.5]


def test_paths_names_are_those_the_manifests_use():
    used = {p for lesson in LESSONS for rule in lessons.forbids(lesson).values() for p in rule["paths"]}
    assert used <= set(tripwires.PATHS)


# Run by the real grader, in its sandbox: the paths are off before the cells run, so a kernel a cell looked up
# first is the tripwire too (in-process, a hidden test in the notebook switches them off after the cells).
LOOKED_UP_FIRST = """
_kernel = torch._C._dispatch_get_computed_kernel_for_dispatch_key(
    "aten::_scaled_dot_product_flash_attention_for_cpu", torch._C.DispatchKey.CPU)


def flash_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    work = torch.promote_types(q.dtype, torch.float32)
    Tq, Tk = q.size(2), k.size(2)
    mask = torch.zeros(Tq, Tk, dtype=work).masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq),
                                                       float("-inf")) if causal else None
    out, lse = _kernel.call_boxed(torch._C._dispatch_keyset_full(), q.to(work), k.to(work), v.to(work), 0.0, False,
                                  attn_mask=mask)
    return out.to(q.dtype), lse.to(work)
"""


# A fresh Python of the student's own, started by a cell, where nothing is switched off (runner.child installs the
# tripwires in its own process only): with the paths off the child is confined once the cells ran (runner.confine),
# so that process is gone and no other can be started.
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
# In the student's own process: PyTorch's NNC (torch._C._te) compiles aten::softmax from its own lowering, never
# calling aten's softmax kernel; TorchScript's legacy executor differentiates its DifferentiableGraph with its own
# formulas and gives the outputs a grad_fn itself. Wherever a path is off, so are the compilers
# (tripwires.compiler_routes): the decorator raises in a cell, and the call that fails for it is told why.
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

# A call that switches a path back on (a kernel of its own over the tripwire of an attention operator) the first time
# it runs in a process: the cells alone leave every path off, so only a probe of the process the calls ran in sees it
# (Subject.memory_bound probes the bounded process before ending it). The answer is the solution's tiled loop.
KERNEL_IN_A_CALL = (
    "import torch.library\n\n_kernels = []\n\n"
    + inspect.getsource(gpu.flash_attention).replace("def flash_attention(", "def _tiled(", 1)
    + """

def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    if not _kernels:
        _kernels.append(torch.library.Library("aten", "IMPL"))
        _kernels[0].impl("_scaled_dot_product_attention_math", lambda *args, **kwargs: None, "CPU")
    return _tiled(q, k, v, causal, block_q, block_k)
"""
)

REAL_GRADER = {  # lesson: {student: {graded name: the mutant's what, or code}}; "solved" answers all
    "09_flash_backward": {
        "autograd": {"attention_backward": "autograd through the naive forward"},
        "fused": {
            "flash_attention_forward": "PyTorch's fused CPU flash attention",
            "flash_attention_backward": "PyTorch's fused CPU flash attention backward",
        },
        "looked-up": {"flash_attention_forward": LOOKED_UP_FIRST},
        "autograd-in-a-subprocess": {
            "attention_backward": SUBPROCESS.format(
                server=AUTOGRAD_SERVER,
                signature="attention_backward(q, k, v, dout, causal=False)",
                args="q, k, v, dout, causal",
            )
        },
        "torchscript-autodiff": {"attention_backward": JIT_AUTODIFF},
    },
    "06_gpu": {
        "tricks": {
            "online_softmax": "a distribution's probabilities",
            "flash_attention": "a dispatch table filled in later",
            "triton_softmax": "a kernel that only reads its program id, the wrapper computing",
        },
        "softmax-in-a-subprocess": {
            "online_softmax": SUBPROCESS.format(
                server=SOFTMAX_SERVER, signature="online_softmax(x, block_size)", args="x"
            )
        },
        "nnc-softmax": {"online_softmax": NNC_SOFTMAX},
        "kernel-in-a-call": {"flash_attention": KERNEL_IN_A_CALL},
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("lesson", REAL_GRADER)
def test_the_real_grader_costs_each_trick_its_aspect(lesson, tmp_path):
    """In the sandbox: each trick loses exactly the aspect its manifest (or, Triton, its check) names, the rest of
    its answer and every other answer keep their points."""
    from autograder import notebook as nbk
    from autograder.release import release
    from tests.harness.grading import read_grades, run
    from tests.harness.lessons import fill

    release(tmp_path / "release", [lesson])
    rel = nbk.read(tmp_path / "release" / lesson / f"{lesson}.ipynb")
    known = {(name, m.what): m.code for name, ms in mistakes.mutants(lesson).items() for m in ms}
    students = {
        "solved": {},
        **{
            student: {name: known.get((name, what), what) for name, what in answers.items()}
            for student, answers in REAL_GRADER[lesson].items()
        },
    }
    for student, answers in students.items():
        nbk.write(fill(rel, lesson, answers), tmp_path / "subs" / student / lesson / f"{lesson}.ipynb")
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--jobs", "1", "--quiet")
    grades = read_grades(tmp_path / "results")
    checks = checks_for(lesson)
    for student, answers in students.items():
        for name in checks:
            row = grades[student, lesson, f"test_{name}"]
            if name not in answers:
                assert row["status"] == "passed", (student, name, row["message"])
                continue
            aspects = checks[name].aspects
            lost = lessons.forbids(lesson)[name]["aspect"] if name in lessons.forbids(lesson) else next(iter(aspects))
            share = (
                0.0
                if lost == next(iter(aspects))
                else float(row["max_points"]) * (1 - aspects[lost] / sum(aspects.values()))
            )
            assert float(row["points"]) == pytest.approx(share, abs=0.01), (student, name, row["message"])
            assert any(w in row["message"] for w in ("switched off", "reached", "launched it again")), row["message"]
            if student == "kernel-in-a-call":
                assert "guard against PyTorch's kernels was switched off" in row["message"], row["message"]
            if student in ("torchscript-autodiff", "nnc-softmax"):
                assert "reached PyTorch's compilers" in row["message"], row["message"]


def test_a_model_that_shows_stand_ins_loses_model_as_found_only():
    """Lesson 10 reads the model from the objects it was built with (sandbox.helpers.ModelRecord): a RoleModel whose
    parameters() shows stand-ins while loss.backward() fills the real .grad keeps its values and loses that aspect."""
    lesson, name = "10_head_roles", "head_importance"
    [trick] = [m for m in mistakes.mutants(lesson)[name] if "stand-ins" in m.what]
    with pytest.raises(PartialCredit) as caught:
        verify(lesson, name, fresh_namespace(lesson, {name: trick.code}))
    assert {r["aspect"] for r in caught.value.rows if not r["passed"]} == {"model as found"}
    assert ".grad" in str(caught.value)


# Forgeries of the evidence gathered next to the student's code (issue 33): each rides on a known wrong answer that
# loses the aspect, with a cell that rewrites what the grader's helpers in that process report. The helpers send data
# (the argument after the call, the .grad the model holds) that the grader compares with its own copy of what it sent:
# a verdict a cell can replace with "yes" is never made there. Run in a fresh process (the cell changes its helpers).
_HELPERS = "import sys\nhelpers = next(m for n, m in list(sys.modules.items()) if n.endswith('sandbox.helpers'))\n"
# A FlashAttention right at the lesson's sizes whose dq is wrong for fewer than 8 keys (gradcheck's sizes)
_WRONG_FOR_FEW_KEYS = inspect.getsource(flash_backward.FlashAttention).replace(
    "return dq, dk, dv, None", "return dq * (2 if k.size(2) < 8 else 1), dk, dv, None"
)
FORGERIES = {  # id: (lesson, graded name, the wrong answer (a mutant's what, or code), the forging cell, aspect lost)
    "grads_as_given says yes": (
        "10_head_roles",
        "head_importance",
        "loss.backward() fills the parameters' .grad",
        _HELPERS + "helpers.ModelRecord.grads_as_given = lambda self: True\n",
        "model as found",
    ),
    "the .grad reported as a constant": (
        "10_head_roles",
        "head_importance",
        "loss.backward() fills the parameters' .grad",
        _HELPERS + "helpers.ModelRecord.grads = lambda self: {n: [True, torch.full_like(p, 0.5) if i % 2 == 0 else "
        "None] for i, (n, p) in enumerate(self.params.items())}\n",
        "model as found",
    ),
    "keeps_argument says yes": (
        "02_heads",
        "attention",
        "q scaled in place (q /= sqrt(d_k))",
        _HELPERS + "helpers.HELPERS['keeps_argument'] = lambda fn, x, *a: (fn(x, *a), True)\n",
        "scaled attention",
    ),
    "Graph.saved reports the shapes of q, k, v, out, lse": (
        "09_flash_backward",
        "FlashAttention",
        "only q, k, v saved, the forward rerun in the backward",
        _HELPERS + "helpers.Graph.saved = lambda self: ([[1, 2, 5, 4], [1, 2, 7, 4], [1, 2, 7, 4], [1, 2, 5, 4], "
        "[1, 2, 5]], [])\n",
        "saves q, k, v, out, lse",
    ),
    "gradcheck says yes": (
        "09_flash_backward",
        "FlashAttention",
        _WRONG_FOR_FEW_KEYS,
        _HELPERS + "helpers.HELPERS['gradcheck'] = lambda *a: True\n",
        "gradcheck",
    ),
}
_LOST = """
import json, sys
from autograder.checking import PartialCredit, checks_for, verify
from tests.harness.lessons import fresh_namespace
lesson, name, code = json.loads(sys.argv[1])
try:
    verify(lesson, name, fresh_namespace(lesson, {name: code}))
    lost = []
except PartialCredit as e:
    lost = sorted(r["aspect"] for r in e.rows if not r["passed"])
except AssertionError:
    lost = [next(iter(checks_for(lesson)[name].aspects))]
print(json.dumps(lost))
"""


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forged_evidence_costs_its_aspect(forgery):
    lesson, name, what, cell, aspect = FORGERIES[forgery]
    wrong = next((m.code for m in mistakes.mutants(lesson)[name] if m.what == what), what)
    out = subprocess.run(
        [sys.executable, "-c", _LOST, json.dumps([lesson, name, cell + wrong])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [aspect]


@pytest.mark.slow
def test_the_price_of_forming_keys_cannot_be_raised_from_a_cell(tmp_path):
    """Lesson 08 prices forming every key and value (helpers.form_latent_kv) to judge "never forms keys or values"
    by CPU time: a cell that makes that helper slower in its own process (here a hundred times over) does not raise
    the price the grader compares with, which it reads in a process that ran none of the notebook's code."""
    from autograder import notebook as nbk
    from autograder.release import release
    from tests.harness.grading import read_grades, run
    from tests.harness.lessons import fill

    lesson, name = "08_kv_compression", "absorbed_attention"
    [wrong] = [
        m.code for m in mistakes.mutants(lesson)[name] if m.what == "keys and values formed 16 positions at a time"
    ]
    slower = (  # in every copy of the helpers the process holds: the server's is the sandbox package's
        "import sys\nfor _m in [m for n, m in list(sys.modules.items()) if n.endswith('sandbox.helpers')]:\n"
        "    _m.HELPERS['form_latent_kv'] = lambda *a, _form=_m.form_latent_kv: [_form(*a) for _ in range(100)]\n"
    )
    release(tmp_path / "release", [lesson])
    rel = nbk.read(tmp_path / "release" / lesson / f"{lesson}.ipynb")
    nbk.write(fill(rel, lesson, {name: slower + wrong}), tmp_path / "subs" / "slower" / lesson / f"{lesson}.ipynb")
    run("grade", str(tmp_path / "subs"), "--out", str(tmp_path / "results"), "--jobs", "1", "--quiet")
    grades = read_grades(tmp_path / "results")
    row = grades["slower", lesson, f"test_{name}"]
    others = {n: grades["slower", lesson, f"test_{n}"]["status"] for n in checks_for(lesson) if n != name}
    assert set(others.values()) == {"passed"}, others
    aspects = checks_for(lesson)[name].aspects
    share = 1 - aspects["never forms keys or values"] / sum(aspects.values())
    assert float(row["points"]) == pytest.approx(float(row["max_points"]) * share, abs=0.01), row["message"]
    assert "forms keys or values" in row["message"], row["message"]


def test_the_visible_tests_switch_off_what_the_manifest_forbids_in_its_words():
    """Each tripwires.off(name, paths, instead) in a notebook's visible tests is its manifest's [forbids] entry."""
    import ast

    from autograder import notebook as nbk

    for lesson in LESSONS:
        calls = [
            n
            for c in nbk.code_cells(nbk.read(nbk.lesson_path(lesson)))
            if nbk.is_test(c)
            for n in ast.walk(ast.parse(nbk.source(c)))
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "tripwires.off"
        ]
        said = {ast.literal_eval(c.args[0]): (ast.literal_eval(c.args[1]), ast.literal_eval(c.args[2])) for c in calls}
        forbids = lessons.forbids(lesson)
        assert set(said) <= set(forbids), lesson
        for name, (paths, instead) in said.items():
            assert (paths, instead) == (forbids[name]["paths"], forbids[name]["instead"]), (lesson, name)


def _recording(replies=None):
    """A Subject whose transport records each request's op (a call as its helper's or name's) and answers from
    replies[op] (a list, first reply first) or {"ok": None}, with a probe that finds every path still off."""
    sent, replies = [], replies or {}

    def transport(request, callback=None):
        target = request.get("target", {})
        op = target.get("helper") or target.get("name") if request["op"] == "call" else request["op"]
        sent.append(op)
        queued = replies.get(op)
        return queued.pop(0) if queued else {"ok": [] if op == "tripwires_probe" else None}

    return Subject(transport), sent


def test_a_bounded_block_is_probed_in_its_own_process_before_it_ends():
    """The probe of a memory-bounded block with the paths off runs before "unbound" ends that process, and no other
    follows; where the bound stops it (out of memory), the block's end probes a fresh process instead."""
    s, sent = _recording()
    with s.forbidding(["attention kernels"]):
        with s.memory_bound(40):
            s.call("flash_attention")
    assert sent == ["forbid", "bound", "flash_attention", "tripwires_probe", "unbound", "unforbid"]

    starved = {"error": {"type": "MemoryError", "mro": ["MemoryError", "Exception"], "message": ""}}
    s, sent = _recording({"tripwires_probe": [starved]})
    with s.forbidding(["attention kernels"]):
        with s.memory_bound(40):
            s.call("flash_attention")
    assert sent == ["forbid", "bound", "flash_attention", "tripwires_probe", "unbound", "tripwires_probe", "unforbid"]


def test_a_probe_that_finds_a_path_back_on_fails_the_block():
    s, _ = _recording({"tripwires_probe": [{"ok": ["aten::_scaled_dot_product_attention_math"]}]})
    with pytest.raises(AssertionError, match="_scaled_dot_product_attention_math no longer raises"):
        with s.forbidding(["attention kernels"]):
            with s.memory_bound(40):
                s.call("flash_attention")


def test_isolation_is_sent_again_before_the_next_request_not_when_a_block_ends():
    """After a block that may end the serving process the stand-ins are isolated again before the next request (and
    before a bound: they are no part of what it counts), never only to be restored."""
    s, sent = _recording({"bound": [{"ok": None, "held_mb": 0}, {"refused": "over", "held_mb": 900}]})
    s.isolate(["flash_attention_forward"])
    with s.forbidding(["attention kernels"]):
        with s.memory_bound(28):
            s.call("FlashAttention")
    s.restore()
    assert sent == [
        *("isolate", "forbid", "isolate", "bound", "FlashAttention", "tripwires_probe", "unbound", "unforbid"),
        "restore",
    ]
    with pytest.raises(OverBudget, match="over"):  # a refused bound ends its process too
        s.isolate(["flash_attention_forward"])
        with s.memory_bound(28):
            pass
    s.call("FlashAttention")
    assert sent[-3:] == ["unbound", "isolate", "FlashAttention"]
