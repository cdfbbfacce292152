"""Evidence, read on the host from the submission's source cells, that lesson 06's
triton_attention is a Triton kernel and not torch code that only looks like one.

Parsed with ast in the grader, never run: the student's code cannot change the verdict. The rules:

- the wrapper (the last `def triton_attention`) only prepares and launches: its calls come from a
  whitelist (allocation, strides and sizes, triton.cdiv, math on scalars, the provided input check)
  plus `kernel[grid](...)` of a `@triton.jit` function; no loops, no `@` or `**`, no stores into
  tensors; it returns a buffer it allocated and passed to a launch, unchanged;
- every `@triton.jit` function it launches (and every one those call) uses only `tl.*` operations,
  arithmetic and a few builtins (range, min, max, float, int);
- nothing in any cell rebinds or patches what the whitelist trusts (torch, triton, tl, math, the
  builtins it allows, the provided check_attention_inputs) or reaches around ast (exec, eval,
  setattr, globals, __dict__, ...).

Deliberately obfuscated code could still hide arithmetic in the kernel's arguments; the values are
checked at run time as well, and the verdict only concerns what this lesson teaches.
"""
import ast
import inspect
import re
import textwrap

PROTECTED_MODULES = {"torch", "triton", "tl", "math", "F", "nn", "builtins", "sys", "os"}
WRAPPER_CALLS = {"torch.empty_like", "torch.empty", "torch.zeros_like", "torch.zeros", "triton.cdiv",
                 "triton.next_power_of_2", "math.sqrt", "math.log2", "math.log", "math.ceil", "max", "min", "int",
                 "float", "len", "tuple", "dict", "isinstance", "str", "bool", "ValueError", "RuntimeError",
                 "TypeError", "check_attention_inputs"}
TENSOR_METHODS = {"contiguous", "stride", "size", "dim", "numel", "element_size", "is_contiguous"}
KERNEL_BUILTINS = {"range", "min", "max", "float", "int"}
KERNEL_METHODS = {"to"}
TRUSTED_NAMES = {name for name in WRAPPER_CALLS | KERNEL_BUILTINS if "." not in name} | {"range"}
DYNAMIC = {"exec", "eval", "compile", "setattr", "delattr", "globals", "vars", "locals", "__import__",
           "__builtins__", "importlib", "ctypes"}
DUNDERS = {"__dict__", "__globals__", "__code__", "__builtins__", "__class__", "__bases__", "__subclasses__",
           "__closure__", "__defaults__", "__kwdefaults__", "__wrapped__", "__self__", "__func__", "__mro__",
           "__getitem__", "__call__", "__setitem__"}
# How the lesson binds the protected names (the setup cell, with its stand-ins when Triton is missing).
ALLOWED_BINDINGS = {"import math", "import os", "import sys", "import torch", "import triton",
                    "import triton.language as tl", "import torch.nn.functional as F", "from torch import nn",
                    "triton = SimpleNamespace(jit=lambda fn: fn)", "tl = SimpleNamespace(constexpr=None)"}


def _provided_check():
    from solutions import gpu
    return ast.dump(ast.parse(textwrap.dedent(inspect.getsource(gpu.check_attention_inputs))).body[0])


def _dotted(node):
    """'a.b.c' for Name/Attribute chains, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# The hidden-test lines of a test cell, as nbgrader runs them in the notebook (then the sources are IPython's In,
# test cells included). The grader's own sources have no test cells; these exact lines do nothing else.
HIDDEN_TEST_LINE = re.compile(r"^(from autograder\.checks import verify|verify\('06_gpu', '\w+', globals\(\)\))$", re.M)


def _parse(sources, drop_hidden_tests=True):
    trees = []
    for text in sources:
        if drop_hidden_tests:
            text = HIDDEN_TEST_LINE.sub("", text)
        text = re.sub(r"^\s*[%!].*$", "", text, flags=re.M)  # magics never define anything we trust
        try:
            trees.append(ast.parse(text))
        except SyntaxError:
            continue  # a cell that does not parse did not run
    if drop_hidden_tests and any("verify" in _bound_names(node) for tree in trees for node in ast.walk(tree)):
        return _parse(sources, drop_hidden_tests=False)  # a `verify` of the student's own could be handed globals()
    return trees


def _bound_names(node):
    """Names a statement binds at its level (def, class, assignment targets, imports, for, with)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    names = set()
    for t in targets:
        names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _module_level(body):
    """The statements of a cell that run at module level (not inside a def, class or lambda)."""
    for node in body:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _module_level(getattr(node, field, None) or [])


def _global_problems(trees, provided):
    """Anything in any cell that could change what the whitelist trusts."""
    trusted = PROTECTED_MODULES | TRUSTED_NAMES | {"check_attention_inputs"}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in DYNAMIC:
                return f"your code uses `{node.id}`"
            if isinstance(node, ast.Attribute) and (node.attr in DUNDERS or _dotted(node) == "sys.modules"):
                return f"your code reaches `.{node.attr}`"
            if isinstance(node, ast.Global) and set(node.names) & trusted:
                return f"your code rebinds `{sorted(set(node.names) & trusted)[0]}` from a function"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(m and m.split(".")[0] in DYNAMIC | {"builtins", "gc", "inspect"} for m in mods):
                    return "your code imports a module that can rewrite other code"
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in trusted:
                        return f"your code changes `{_root(t)}`"
        for node in _module_level(tree.body):
            names = _bound_names(node) & trusted
            if names and ast.unparse(node).strip() not in ALLOWED_BINDINGS \
                    and not (isinstance(node, ast.FunctionDef) and ast.dump(node) == provided):
                return f"your code redefines `{sorted(names)[0]}`"
    return None


def _is_jit(fn):
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if _dotted(d) in ("triton.jit", "jit"):
            return True
    return False


def _definitions(trees, name):
    """Every statement that binds `name` at a cell's top level, in order."""
    return [node for tree in trees for node in tree.body if name in _bound_names(node)]


def _kernel_problem(name, trees, seen):
    """Why the @triton.jit function `name` is not a Triton kernel (None when it is)."""
    if name in seen:
        return None
    seen.add(name)
    defs = _definitions(trees, name)
    if not defs or not all(isinstance(d, ast.FunctionDef) and _is_jit(d) for d in defs):
        return f"`{name}` must be a function decorated with @triton.jit (and never rebound)"
    for node in ast.walk(defs[-1]):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda, ast.ClassDef)):
            return f"the kernel `{name}` may only use tl.* operations and arithmetic"
        if isinstance(node, ast.Name) and node.id in PROTECTED_MODULES - {"tl", "triton", "math"}:
            return f"the kernel `{name}` uses `{node.id}`: a kernel may only use tl.* operations and arithmetic"
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if dotted and dotted.startswith("tl."):
                continue
            if dotted in KERNEL_BUILTINS:
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in KERNEL_METHODS:
                continue
            if isinstance(node.func, ast.Name):
                problem = _kernel_problem(node.func.id, trees, seen)
                if problem is None:
                    continue
                return problem
            return (f"the kernel `{name}` calls `{ast.unparse(node.func)}`: a kernel may only use tl.* operations, "
                    "arithmetic and other @triton.jit functions")
    return None


def problem(sources):
    """None when the sources show a triton_attention that launches a Triton kernel; else why not."""
    trees = _parse(sources)
    defs = _definitions(trees, "triton_attention")
    if not defs:
        return "no `def triton_attention` was found in your notebook's code cells"
    if not all(isinstance(d, ast.FunctionDef) for d in defs):
        return "`triton_attention` must be a function (def), never rebound"
    found = _global_problems(trees, _provided_check())
    if found:
        return found + ", which the grader cannot trust in a Triton exercise"
    wrapper = defs[-1]
    params = {a.arg for a in wrapper.args.args + wrapper.args.kwonlyargs + wrapper.args.posonlyargs}
    local = params | {n for node in ast.walk(wrapper) if node is not wrapper for n in _bound_names(node)}
    shadowed = local & (PROTECTED_MODULES | TRUSTED_NAMES | {"check_attention_inputs"})
    if shadowed:
        return f"triton_attention rebinds `{sorted(shadowed)[0]}`, which the grader cannot trust in a Triton exercise"
    allocated, launched_with, kernels, returns = {}, set(), [], []
    for node in ast.walk(wrapper):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return "triton_attention has a loop: it should only prepare the inputs and launch the kernel once"
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.MatMult, ast.Pow)):
            return "triton_attention computes with `@` or `**`: leave the arithmetic to the kernel"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, (ast.Subscript, ast.Attribute)) for tt in targets for t in ast.walk(tt)):
                return "triton_attention writes into a tensor: only the kernel may write the output"
            if isinstance(node, ast.Assign) and len(targets) == 1 and isinstance(targets[0], ast.Name):
                call = node.value
                if isinstance(call, ast.Call) and _dotted(call.func) in ("torch.empty_like", "torch.empty",
                                                                          "torch.zeros_like", "torch.zeros"):
                    allocated[targets[0].id] = allocated.get(targets[0].id, 0) + 1
                else:
                    allocated[targets[0].id] = allocated.get(targets[0].id, 0) + 2  # rebound: not a clean buffer
        if isinstance(node, ast.Return) and node.value is not None:
            returns.append(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
                kernels.append(func.value.id)
                launched_with |= {a.id for a in node.args if isinstance(a, ast.Name)}
                continue
            dotted = _dotted(func)
            if dotted in WRAPPER_CALLS:
                continue
            if isinstance(func, ast.Attribute) and func.attr in TENSOR_METHODS:
                continue
            return (f"triton_attention calls `{ast.unparse(func)}`: it should only allocate the output, prepare "
                    "the inputs and launch a @triton.jit kernel (kernel[grid](...))")
    if set(kernels) & local:
        return "triton_attention must launch a @triton.jit kernel defined at the top level of a cell"
    if not kernels:
        return "triton_attention never launches a kernel: call your @triton.jit kernel as kernel[grid](...)"
    for name in kernels:
        found = _kernel_problem(name, trees, set())
        if found:
            return found
    if not returns or not all(isinstance(r, ast.Name) and allocated.get(r.id) == 1 and r.id in launched_with
                              for r in returns):
        return ("triton_attention should return the output buffer it allocated (torch.empty_like) and passed to the "
                "kernel, as the kernel wrote it")
    return None
