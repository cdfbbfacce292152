"""Will a Triton kernel compile for a GPU, and fit it? Answered on any machine, with or without a GPU.

Triton compiles ahead of time for a named target: `triton.compile` of an `ASTSource` with
`GPUTarget("cuda", arch, 32)` runs the whole pipeline (TTIR, TTGIR, LLVM IR, PTX, and a cubin from
the bundled ptxas) on a plain CPU, and says how much shared memory one program needs. A kernel that
Triton's interpreter runs happily may still be refused here (`tl.dot` on blocks smaller than 16, a
Python `if` on a block-shaped tensor) or need more shared memory than the card has (it would fail to
launch with OutOfResources).

The compiling runs in a child Python without TRITON_INTERPRET: a process that imported Triton under
the interpreter has interpreter versions of Triton's own helpers (tl.max, tl.sum), which the compiler
cannot use. The child gets the kernel's source (and that of any @triton.jit helper or constant it
names), writes it to a file and compiles it, under a time limit.

Standard library only at import (Triton only in the child), so that anything may import it.
"""

import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

# The cards students use, by compute capability: a name and the most shared memory one block may use
# (the opt-in maximum, cudaDevAttrMaxSharedMemoryPerBlockOptin, which Triton launches with).
ARCHES = {
    75: ("T4", 64 * 1024),
    80: ("A100", 163 * 1024),
    86: ("A10", 99 * 1024),
    89: ("L4", 99 * 1024),
    90: ("H100", 227 * 1024),
}
# A fresh compile takes 1-2 s (float16 on sm_80+) to 15 s (float32 on sm_75); the limit is for one batch.
TIMEOUT_S = 300
TRITON_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def kernel_source(kernel):
    """The source of a @triton.jit kernel (a JITFunction, or the interpreter's InterpretedFunction),
    decorators dropped, followed by that of the @triton.jit helpers and plain constants it names.
    -> (name, [source, ...]) with the kernel's own source last."""
    fn = getattr(kernel, "fn", kernel)
    sources, seen = [], set()

    def add(f):
        if f.__name__ in seen:
            return
        seen.add(f.__name__)
        for name in f.__code__.co_names:
            value = f.__globals__.get(name)
            if hasattr(value, "fn") and callable(getattr(value, "fn")) and name not in seen:
                add(value.fn)  # a helper kernel
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and name not in seen:
                seen.add(name)
                sources.append(f"{name} = {value!r}")
            elif type(value).__name__ == "constexpr" and name not in seen:
                seen.add(name)
                sources.append(f"{name} = tl.constexpr({getattr(value, 'value', value)!r})")
        src = textwrap.dedent(inspect.getsource(f))
        src = src[re.search(r"^def ", src, re.M).start() :]  # drop the decorators
        sources.append("@triton.jit\n" + src.rstrip())

    add(fn)
    return fn.__name__, sources


def notebook_kernels(cells):
    """{name: (name, [source])} of the @triton.jit kernels that a notebook's code cells (a list of
    sources) define, at any depth (a demo defines its kernel under `if HAS_TRITON:`), decorators dropped."""
    import ast

    found = {}
    for cell in cells:
        try:
            tree = ast.parse(cell)
        except (SyntaxError, RecursionError, MemoryError, ValueError):  # unparseable, or nested past the stack
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                src = textwrap.dedent("\n".join(cell.splitlines()[node.lineno - 1 : node.end_lineno]))
                found[node.name] = (node.name, ["@triton.jit\n" + src])
    return found


# What a kernel's body may be: Triton language only. Under TRITON_INTERPRET a kernel is plain Python, so a body that
# reached Python (tl.core.builtins is the builtins module, triton.runtime.interpreter.np is numpy, x.handle.data a
# block's numpy array) could compute the answer outside Triton. So the reading fails closed: every attribute reached
# from Triton or math must be a public name of the installed Triton language (its __all__, and the functions of the
# submodules listed there), any other attribute one that Triton's tensors, dtypes and constexprs have, and a name one
# of these builtins, the kernel's parameters and locals, other @triton.jit functions or constants.
KERNEL_BUILTINS = {"range", "float", "int", "bool", "min", "max", "abs", "len", "print", "isinstance"}
MODULES = {"math", "triton", "triton.language", "torch", "numpy"}  # imports the replay keeps
TRITON_MODULES = {"math", "triton", "triton.language"}
TRITON_HELPERS = {"cdiv", "next_power_of_2"}  # of triton itself: sizes, not computation
HIDDEN = {"handle", "data"}  # a value's way to its numpy array under the interpreter


def jit(node):
    """Whether an ast.FunctionDef is decorated with something named like jit."""
    import ast

    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def _constant(value):
    import ast

    try:
        ast.literal_eval(value)
        return True
    except RecursionError:  # an expression nested deeper than the interpreter's stack: no kernel constant
        return False
    except (ValueError, TypeError, SyntaxError, MemoryError):
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
            return _constant(value.operand)
        return isinstance(value, ast.Call) and (
            _float(value)
            or ast.unparse(value.func) in ("tl.constexpr", "triton.language.constexpr")
            and all(_constant(a) for a in value.args)
        )


def _float(call):
    """Whether an ast.Call is float() of a string literal that float() reads (float("-inf"): a kernel's constant)."""
    import ast

    if not (
        isinstance(call.func, ast.Name)
        and call.func.id == "float"
        and not call.keywords
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
        and len(call.args[0].value) <= 16
    ):
        return False
    try:
        float(call.args[0].value)
        return True
    except ValueError:
        return False


def parsed(sources, max_cell=None):
    """([@triton.jit FunctionDef], [import of MODULES], [(constant assignment, names)]) at the top level of the cells.
    Magic lines are left out; a cell longer than max_cell characters (the grader's bound on its own work), or that
    does not parse, gives nothing."""
    import ast

    kernels, imports, constants = [], [], []
    for source in sources:
        text = str(source) if max_cell is None else str(source)[: max_cell + 1]
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))
        if max_cell is not None and len(text) > max_cell:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and jit(node):
                kernels.append(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and all(
                (a.name if isinstance(node, ast.Import) else node.module or "") in MODULES for a in node.names
            ):
                imports.append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _constant(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if all(isinstance(t, ast.Name) for t in targets):
                    constants.append((node, {t.id for t in targets}))
    if any((a.asname or a.name) == "float" for node in imports for a in node.names):  # float() would be theirs
        constants = [c for c in constants if not any(isinstance(n, ast.Call) and _float(n) for n in ast.walk(c[0]))]
    return kernels, imports, constants


@functools.cache
def _value_attributes():
    """The public attributes of Triton's tensors, dtypes (pointer and block types too) and constexprs, less HIDDEN."""
    import triton.language as tl

    samples = [tl.tensor(None, tl.float32), tl.float32, tl.pointer_type(tl.float32), tl.block_type(tl.float32, [2])]
    return frozenset(n for v in [*samples, tl.constexpr(1)] for n in dir(v) if not n.startswith("_")) - HIDDEN


def _language_path(attrs):
    """None when triton.language.<attrs...> is the Triton language, else the first step that is not: each step a public
    name of a module's __all__ (of a submodule listed there, any function or value Triton's language defines), then
    only the attributes of a value (_value_attributes), and never a module as the value."""
    import types

    import triton.language as obj

    for i, a in enumerate(attrs):
        if a.startswith("_") or a in HIDDEN:
            return a
        if not isinstance(obj, types.ModuleType):
            return next((b for b in attrs[i:] if b not in _value_attributes()), None)
        listed = set(getattr(obj, "__all__", ())) | {n.rsplit(".", 1)[-1] for n in getattr(obj, "__all__", ())}
        value = getattr(obj, a, None)
        home = getattr(value if isinstance(value, type) or callable(value) else type(value), "__module__", "") or ""
        if value is None or not (
            a in listed or (not isinstance(value, types.ModuleType) and home.startswith("triton.language"))
        ):
            return a
        obj = value
    return "a module used as a value" if isinstance(obj, types.ModuleType) else None


def _module_path(module, attrs):
    """None when module.<attrs...> (module one of TRITON_MODULES) is Triton language or math, else what is not."""
    import math

    if module == "triton.language":
        return _language_path(attrs)
    if module == "triton":
        if attrs[:1] == ["language"]:
            return _language_path(attrs[1:])
        return None if len(attrs) == 1 and attrs[0] in TRITON_HELPERS else ".".join(attrs[:1]) or "triton"
    if len(attrs) == 1 and not attrs[0].startswith("_") and hasattr(math, attrs[0]):
        return None
    return ".".join(attrs[:1]) or "math"


def _aliases(imports):
    """{name: (module, [attribute, ...])} the cells' imports of TRITON_MODULES bind, besides tl, triton and math unless
    an import binds them to another module."""
    import ast

    out = {"tl": ("triton.language", []), "triton": ("triton", []), "math": ("math", [])}
    for node in imports:
        for a in node.names:
            if isinstance(node, ast.Import) and a.name in TRITON_MODULES:
                out[a.asname or a.name.split(".")[0]] = (a.name, []) if a.asname else (a.name.split(".")[0], [])
            elif isinstance(node, ast.ImportFrom) and f"{node.module}.{a.name}" in TRITON_MODULES:
                out[a.asname or a.name] = (f"{node.module}.{a.name}", [])
            elif isinstance(node, ast.ImportFrom) and node.module in TRITON_MODULES:
                out[a.asname or a.name] = (node.module, [a.name])
            else:  # torch or numpy under that name (import torch as tl): not Triton's, whatever the name
                out.pop(a.asname or (a.name.split(".")[0] if isinstance(node, ast.Import) else a.name), None)
    return out


def _foreign(kernel, kernels, imports, constants):
    """The first thing in a @triton.jit function's body that is not Triton language (see KERNEL_BUILTINS), or None."""
    import ast

    aliases = _aliases(imports)
    args = kernel.args
    names = (
        KERNEL_BUILTINS
        | {"True", "False", "None"}
        | {k.name for k in kernels}
        | {n for _, names in constants for n in names}
        | {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        | {n.id for n in ast.walk(kernel) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    )
    inner = {id(n.value) for n in ast.walk(kernel) if isinstance(n, ast.Attribute)}
    for node in ast.walk(ast.Module(body=kernel.body, type_ignores=[])):  # decorators and annotations run no body
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda)):
            return type(node).__name__.lower()
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            attrs, base = [], node
            while isinstance(base, ast.Attribute):
                attrs.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases and base.id not in names:
                module, first = aliases[base.id]
                bad = _module_path(module, first + attrs)
                if bad:
                    return f"{ast.unparse(node)} ({bad})"
            elif isinstance(base, ast.Name) and base.id not in names:
                return base.id
            elif any(a not in _value_attributes() for a in attrs):
                return f".{next(a for a in attrs if a not in _value_attributes())}"
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in inner:
            if node.id in aliases and node.id not in names:
                module, first = aliases[node.id]
                bad = _module_path(module, first) if first else "a module used as a value"
                if bad:
                    return f"{node.id} ({bad})"
            elif node.id not in names:
                return node.id
    return None


def not_triton(cells, kernels):
    """[(name, what)]: each of the named @triton.jit kernels in cells (parsed(...)), or a @triton.jit function one
    calls, whose body uses something that is not Triton language (_foreign), or whose decorators, annotations or
    default values are more than plain (_def_time). Needs Triton installed (the names it allows are the installed
    Triton's)."""
    import ast

    defined, imports, constants = cells
    by_name = {k.name: k for k in defined}
    todo, seen, out = list(kernels), set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        foreign = _foreign(by_name[name], defined, imports, constants)
        where = _def_time(by_name[name], imports, constants)
        foreign = foreign or where and f"{where} (in its decorators, annotations or default values)"
        if foreign:
            out.append((name, foreign))
        todo += [n.id for n in ast.walk(by_name[name]) if isinstance(n, ast.Name) and n.id in by_name]
    return out


# What a kernel's decorators, annotations and default values may be. They run as plain Python wherever the kernel is
# defined, the grader's replay of its launches too (lessons/gpu/triton_replay.py), where anything else could compute
# the answer into the replayed buffers (a decorator that rebinds the replay's launcher): literals, constants, Triton's
# language (tl.constexpr), these builtin types, and these calls of such values.
DEF_TIME_CALLS = {"triton.jit", "triton.autotune", "triton.Config"}
DEF_TIME_TYPES = {"int", "float", "bool", "str"}


def _def_time(kernel, imports, constants):
    """The first of a @triton.jit function's decorators, annotations and default values that is more than DEF_TIME_CALLS
    of literals, constants and Triton's language, as its source (shortened), or None."""
    import ast

    aliases, names = _aliases(imports), {n for _, bound in constants for n in bound}

    def path(node):
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in aliases or node.id in names:
            return None
        module, first = aliases[node.id]
        return ".".join([module, *first, *attrs])

    def bad(node):
        if node is None or isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Name) and (node.id in names or node.id in DEF_TIME_TYPES):
            return None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return bad(node.operand)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return first(node.elts)
        if isinstance(node, ast.Dict):
            return "**" if None in node.keys else first([*node.keys, *node.values])
        if isinstance(node, ast.Call) and path(node.func) in DEF_TIME_CALLS:
            return "**" if any(k.arg is None for k in node.keywords) else first([*node.args, *node.keywords])
        if isinstance(node, ast.keyword):  # of a call above
            return bad(node.value)
        where = path(node) or ""
        if where in DEF_TIME_CALLS or where.startswith("triton.language.") and not _language_path(where.split(".")[2:]):
            return None
        return ast.unparse(node)[:80]

    def first(nodes):
        return next(filter(None, map(bad, nodes)), None)

    a = kernel.args
    params = [p for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p]
    parts = [*kernel.decorator_list, kernel.returns, *a.defaults, *a.kw_defaults, *(p.annotation for p in params)]
    return first(parts) or ("type parameters" if getattr(kernel, "type_params", None) else None)


def plain(cells):
    """cells (parsed(...)) less the @triton.jit functions whose decorators, annotations or default values are more than
    plain (_def_time): what may run where the grader launches a kernel again."""
    kernels, imports, constants = cells
    return [k for k in kernels if not _def_time(k, imports, constants)], imports, constants


def not_triton_message(name, foreign):
    """What the grader and check_submission say of a kernel that uses `foreign` (not_triton)."""
    return (
        f"{name} uses {foreign}, which is not Triton language: a @triton.jit body may use only the public functions "
        "of tl (triton.language, e.g. tl.load, tl.exp, tl.math.exp2), math, its parameters and locals, the "
        "attributes of Triton's tensors (.dtype, .to), other @triton.jit functions and constants, and its decorators, "
        "annotations and default values only triton.jit (or triton.autotune of triton.Config), tl.constexpr and "
        "plain numbers; compute the result with those, into the buffer you return"
    )


def job(kernel, signature, constexprs, arch, num_warps=4, num_stages=2, label="", card=None):
    """One compilation, as the child takes it. `kernel` is a @triton.jit function or (name, [source]) as
    kernel_source gives; `signature` maps each runtime argument to a Triton type ("*fp16" a pointer,
    "i32", "fp32"), `constexprs` each constexpr argument to its value; card (name, shared memory per
    block) defaults to ARCHES[arch]."""
    name, sources = kernel if isinstance(kernel, tuple) else kernel_source(kernel)
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    card, limit = card or ARCHES[arch]
    return {
        "name": name,
        "sources": sources,
        "signature": sig,
        "constexprs": constexprs,
        "arch": arch,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "label": label,
        "card": card,
        "limit": limit,
    }


def parameters(kernel):
    """The argument names of a kernel (a @triton.jit function or (name, [source]))."""
    if isinstance(kernel, tuple):
        import ast

        fn = ast.parse(kernel[1][-1]).body[0]
        return [a.arg for a in fn.args.args]
    return list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)


def attention_job(kernel, arch, dtype, head_dim, tiles, causal=True, label="", card=None):
    """A job for lesson 06's _attention_kernel (or lesson 09's _flash_forward_kernel, which adds LSE), as
    their launchers call it: Q, K, V, O point at `dtype` ("float16", "bfloat16", "float32"), LSE at
    float32, qk_scale is a float, the other runtime arguments integers; `tiles` as attention_tiles gives."""
    constexprs = {
        "CAUSAL": causal,
        "BLOCK_Q": tiles["BLOCK_Q"],
        "BLOCK_K": tiles["BLOCK_K"],
        "BLOCK_D": tiles["BLOCK_D"],
        "PRECISION": "ieee" if dtype == "float32" else "tf32",
    }
    pointer = "*" + TRITON_TYPES[dtype]
    signature = {
        a: (pointer if a in "QKVO" else "*fp32" if a == "LSE" else "fp32" if a == "qk_scale" else "i32")
        for a in parameters(kernel)
        if a not in constexprs
    }
    return job(
        kernel,
        signature,
        constexprs,
        arch,
        tiles["num_warps"],
        tiles["num_stages"],
        label or f"{dtype} head_dim {head_dim}",
        card,
    )


def softmax_job(kernel, arch, dtype, block, label="", card=None):
    """A job for lesson 06's _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK) at one BLOCK."""
    pointer = "*" + TRITON_TYPES[dtype]
    signature = {"X": pointer, "Y": pointer, "n_cols": "i32", "stride_x": "i32", "stride_y": "i32"}
    # launched without num_warps or num_stages: Triton's defaults, 4 and 3
    return job(kernel, signature, {"BLOCK": block}, arch, 4, 3, label or f"{dtype} BLOCK {block}", card)


# The kernels a lesson fixes, with their parameters, compiled for one named target: an A100 (sm_80), float16,
# head_dim 64, at the tiles solutions.gpu.attention_tiles picks there (tests/test_triton_fit.py holds them equal),
# the softmax kernel at BLOCK=1024.
TARGET = 80
A100_TILES = {"BLOCK_Q": 128, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 8, "num_stages": 2}
ATTENTION_ARGS = [
    "Q",
    "K",
    "V",
    "O",
    "stride_b",
    "stride_h",
    "stride_t",
    "stride_kb",
    "stride_kh",
    "stride_kt",
    "n_heads",
    "seq_q",
    "seq_k",
    "head_dim",
    "qk_scale",
    "CAUSAL",
    "BLOCK_Q",
    "BLOCK_K",
    "BLOCK_D",
    "PRECISION",
]
LESSON_KERNELS = {
    "_softmax_kernel": (
        ["X", "Y", "n_cols", "stride_x", "stride_y", "BLOCK"],
        lambda k: softmax_job(k, TARGET, "float16", 1024),
    ),
    "_attention_kernel": (ATTENTION_ARGS, lambda k: attention_job(k, TARGET, "float16", 64, A100_TILES)),
    "_flash_forward_kernel": (
        ATTENTION_ARGS[:4] + ["LSE"] + ATTENTION_ARGS[4:],
        lambda k: attention_job(k, TARGET, "float16", 64, A100_TILES),
    ),
}


# The graded function that launches each kernel a student writes: `grade --kernels-graded` makes the kernel's compiling
# and fitting the target an aspect of that function's test.
LAUNCHED_BY = {"_softmax_kernel": "triton_softmax", "_attention_kernel": "triton_attention"}


def lesson_kernel_jobs(cells):
    """(jobs, problems) for the lesson kernels (LESSON_KERNELS) that cells (a list of sources) define: a job
    each, or a problem line when its parameters are not the lesson's (it is compiled as the lesson launches it)."""
    jobs, problems = [], []
    for name, kernel in notebook_kernels(cells).items():
        if name not in LESSON_KERNELS or _stub(kernel):
            continue
        args, make = LESSON_KERNELS[name]
        if parameters(kernel) != args:
            problems.append(
                f"{name}: its parameters are not the lesson's ({', '.join(args)}), so it cannot be "
                "compiled as the lesson launches it"
            )
        else:
            jobs.append(make(kernel))
    return jobs, problems


def _stub(kernel):
    """Whether a kernel is still the released stub: its body only raises NotImplementedError (the visible
    tests say so; the compiler would only refuse the raise)."""
    import ast

    body = ast.parse(kernel[1][-1]).body[0].body
    body = body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


def check_kernels(cells, timeout=120, compiler=None, strict=False):
    """[(is_problem, line)]: the lesson's kernels among cells that use something not Triton language (not_triton,
    as the grader refuses them), and compiled for an A100 (TARGET) as their
    launchers launch them there, by compiler(jobs, timeout) (compile_jobs here; the grader's runs in its sandbox); a
    line that says it skipped, and why, when Triton is not installed. Each line starts with the kernel's name, but
    that one. strict: a kernel the compiler gave no verdict on (a time limit, a crash) is a problem too."""
    import importlib.util

    jobs, problems = lesson_kernel_jobs(cells)
    out = [(True, p) for p in problems]
    if importlib.util.find_spec("triton") is not None:  # the names a kernel may use are the installed Triton's
        written = [n for n, k in notebook_kernels(cells).items() if n in LESSON_KERNELS and not _stub(k)]
        out += [(True, not_triton_message(*f)) for f in not_triton(parsed(cells), written)]
    if not jobs:
        return out
    if compiler is None and importlib.util.find_spec("triton") is None:
        return out + [
            (
                False,
                "Triton kernels: not compiled for a GPU, since Triton is not installed here "
                "(pip install triton; Linux only)",
            )
        ]
    for j, r in zip(jobs, (compiler or compile_jobs)(jobs, timeout)):
        what = f"{j['name']} ({j['label']}, {tiles_text(j)})"
        if r.get("skipped"):
            out.append((strict, f"{what}: not compiled for a GPU here ({r['error']})"))
        else:
            out.append((not r["fits"], f"{what} {describe(r)}"))
    return out


def tiles_text(j):
    c = j["constexprs"]
    if "BLOCK_Q" in c:
        return f"{c['BLOCK_Q']} x {c['BLOCK_K']} tiles, {j['num_stages']} stages, {j['num_warps']} warps"
    return f"{j['num_warps']} warps"


def compile_jobs(jobs, ptxas=False, timeout=TIMEOUT_S, python=sys.executable, isolated=False):
    """Compile each job (see job()) for its target in one child Python (isolated: `python -I`, which takes no module
    from the script's folder or the environment's PYTHONPATH: the grader's, whose folder student code wrote in).
    -> one dict per job:
    compiles (bool), error (the compiler's complaint, or None), skipped (True when the child could not give
    the compiler's verdict: a time limit, a Triton without this API, a crash), shared (bytes one program
    needs), limit (the card's, ARCHES), fits, and registers (per thread), spill_stores and spill_loads
    (bytes) from Triton's own `ptxas -v`, which runs only on a fresh compile: ptxas=True compiles afresh
    (Triton's cache aside, so slower), else they are known only for kernels the cache did not hold."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as fresh:
        if ptxas:
            env["TRITON_CACHE_DIR"] = fresh
        return _run_child(jobs, timeout, [python, "-I"] if isolated else [python], env)


def _run_child(jobs, timeout, python, env):
    try:
        out = subprocess.run(
            [*python, __file__, "--child"],
            input=json.dumps(jobs),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return [dict(_blank(j), error=f"compiling took more than {timeout} s", skipped=True) for j in jobs]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or len(lines) != len(jobs):  # not the compiler's verdict: this Triton, or this machine
        why = (out.stderr.strip().splitlines() or ["the compiler's process failed"])[-1]
        return [dict(_blank(j), error=why[:300], skipped=True) for j in jobs]
    return [json.loads(ln) for ln in lines]


def _blank(j):
    return {
        "kernel": j["name"],
        "label": j["label"],
        "arch": j["arch"],
        "card": j["card"],
        "num_warps": j["num_warps"],
        "num_stages": j["num_stages"],
        "compiles": False,
        "error": None,
        "shared": None,
        "limit": j["limit"],
        "fits": None,
        "registers": None,
        "spill_stores": None,
        "spill_loads": None,
    }


def describe(r):
    """One line on a result of compile_jobs: fits / needs more shared memory than the card has / the
    compiler's complaint."""
    card = f"{r['card']} (sm_{r['arch']}, {r['limit'] // 1024} KiB per block)"
    if not r["compiles"]:
        return f"does not compile for {card}: {r['error']}"
    regs = f", {r['registers']} registers" if r.get("registers") else ""
    if r.get("spill_stores"):
        regs += f", spills {r['spill_stores']} bytes"
    if r["fits"]:
        return f"fits {card}: needs {r['shared']:,} bytes of shared memory{regs}"
    return f"does not fit {card}: needs {r['shared']:,} bytes of shared memory, {r['shared'] - r['limit']:,} too many"


def _child():
    """The child: compile each job of stdin's JSON list, print one JSON line per job."""
    import contextlib
    import importlib.util
    import io

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if hasattr(triton, "knobs"):  # Triton 3.4 on: ptxas -v's log, printed on a fresh compile (registers, spills)
        triton.knobs.nvidia.dump_ptxas_log = True
    jobs = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as tmp:
        for i, j in enumerate(jobs):
            r = _blank(j)
            path = os.path.join(tmp, f"kernel_{i}.py")
            with open(path, "w") as f:
                f.write("import math\nimport triton\nimport triton.language as tl\n\n" + "\n\n".join(j["sources"]))
            log = io.StringIO()
            try:
                spec = importlib.util.spec_from_file_location(f"kernel_{i}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                src = ASTSource(fn=getattr(module, j["name"]), signature=j["signature"], constexprs=j["constexprs"])
                with contextlib.redirect_stdout(log):
                    compiled = triton.compile(
                        src,
                        target=GPUTarget("cuda", j["arch"], 32),
                        options={"num_warps": j["num_warps"], "num_stages": j["num_stages"]},
                    )
            except Exception as e:  # the compiler's complaint, for the student
                r["error"] = _complaint(e)
            else:
                r.update(compiles=True, shared=compiled.metadata.shared)
                r["fits"] = r["shared"] <= r["limit"]
                text = log.getvalue()
                m = re.search(r"Used (\d+) registers", text)
                r["registers"] = int(m[1]) if m else None
                m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
                r["spill_stores"], r["spill_loads"] = (int(m[1]), int(m[2])) if m else (None, None)
            print(json.dumps(r), flush=True)


# What the compiler's words usually mean, for the two slips Triton's interpreter accepts.
HINTS = [
    (
        "K >= 16",
        "tl.dot needs blocks of at least 16 x 16 (the interpreter multiplies smaller ones, a GPU's "
        "tensor cores do not)",
    ),
    (
        "Boolean value of Tensor",
        "a Python `if` on a block-shaped tensor (the interpreter takes it as true): "
        "use tl.where, or reduce the block to one value first",
    ),
]


def _complaint(e):
    """The line of a compile error that says what is wrong, where it is in the kernel, and what it usually means
    (HINTS). Triton's CompilationError holds the source around the line, then the cause; an error inside a
    helper the kernel calls is chained under the call's (e.__cause__): the innermost cause is the one."""
    where, said = None, None
    while e is not None:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        at = re.match(r"at (\d+):(\d+):", lines[0]) if lines else None
        where = where or at  # the kernel's own line, the outermost
        cause = [ln.strip() for ln in lines if re.match(r"^\w*(Error|Exception)\b|^\w+Error\(", ln.strip())]
        last = lines[-1].strip() if lines else type(e).__name__
        said = cause[-1] if cause else last if last.strip("^ ") else said  # a bare ^ only marks the column
        e = e.__cause__
    said = (said or "the compiler gave no reason")[:300]
    hint = next((f": {h}" for words, h in HINTS if words in said), "")
    return (f"line {where[1]} of the kernel: " if where else "") + said + hint


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
