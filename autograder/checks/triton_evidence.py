"""Lesson 06's source evidence: read on the host from the submission's code cells, that
triton_attention is a Triton kernel and not torch code that only looks like one, and that
flash_attention does not hand the work to PyTorch's fused attention.

Each cell is turned into Python as IPython runs it (magics become get_ipython() calls), then parsed
with ast in the grader, never run: the student's code cannot change the verdict. A cell that still
does not parse, or that uses a magic (whose code hides in a string), is refused, never skipped:
the grader cannot tell what it defined. The rules for triton_attention:

- every name the rules trust (triton_attention, torch, triton, tl, math, the builtins it
  allows, the provided check_attention_inputs, ...) is bound exactly once in all the cells, at any
  nesting and by any means (def, class, assignment, import, for, with, walrus, del, global, argument),
  triton only by `import triton` and tl only by `import triton.language as tl` (plus the lesson's
  stand-ins when that import fails); the builtins are never bound;
- the wrapper (one undecorated top-level `def triton_attention`) only prepares and launches: its
  calls come from a whitelist (allocation, strides and sizes, triton.cdiv, math on scalars, the
  provided input check) plus `kernel[grid](...)` of a `@triton.jit` function; no loops, no `@` or
  `**`, no stores into tensors; it returns a buffer it allocated and passed to a launch, unchanged;
- every `@triton.jit` function it launches (and every one those call) uses only `tl.*` operations,
  arithmetic and a few builtins (range, min, max, float, int); each binding of a kernel's name is
  a top-level def whose only decorator is triton.jit, and each such def is checked (a kernel fixed
  in a later cell is defined twice; whichever ran last is one of them);
- nothing in any cell rebinds or patches what the whitelist trusts (torch, triton, tl, math, the
  builtins it allows, the provided check_attention_inputs) or reaches around ast (exec, eval,
  setattr, globals, __dict__, ...).

For flash_attention (best effort): nothing the function can reach by name in the cells calls
scaled_dot_product_attention, torch.ops' attention kernels, flash_attn, getattr, __import__, eval or exec.

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
           "__builtins__", "importlib", "ctypes", "get_ipython"}
DUNDERS = {"__dict__", "__globals__", "__code__", "__builtins__", "__class__", "__bases__", "__subclasses__",
           "__closure__", "__defaults__", "__kwdefaults__", "__wrapped__", "__self__", "__func__", "__mro__",
           "__getitem__", "__call__", "__setitem__"}
# The one statement that may bind each protected name (the lesson's setup cell); the others are never bound.
ALLOWED_BINDINGS = {"math": "import math", "os": "import os", "sys": "import sys", "torch": "import torch",
                    "triton": "import triton", "tl": "import triton.language as tl",
                    "F": "import torch.nn.functional as F", "nn": "from torch import nn",
                    "SimpleNamespace": "from types import SimpleNamespace"}
# The setup cell's stand-ins, allowed besides only in `except ImportError` after `import triton` (never run by a
# grader that has Triton, which is the only grader that runs this check).
STAND_INS = {"triton = SimpleNamespace(jit=lambda fn: fn)", "tl = SimpleNamespace(constexpr=None)"}
# What flash_attention must not reach: PyTorch's fused attention, or the means to name it without saying so.
FUSED_CALLS = {"scaled_dot_product_attention", "getattr", "__import__", "eval", "exec"}


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


class Unreadable(ValueError):
    """A code cell the grader cannot read as Python: what it defined is unknown."""


def _python(text):
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(text)


def parse_cells(sources, drop_hidden_tests=True):
    """The syntax tree of each code cell, as IPython runs it; raises Unreadable for a cell that does not parse."""
    trees = []
    for i, text in enumerate(sources):
        if drop_hidden_tests:
            text = HIDDEN_TEST_LINE.sub("", text)
        try:
            tree = ast.parse(_python(text))
            tree.body = [stmt for stmt in tree.body if not _harmless_magic(stmt)]
            trees.append(tree)
        except (SyntaxError, ValueError) as e:
            raise Unreadable(f"code cell {i + 1} does not parse as Python ({getattr(e, 'msg', e)}), so the grader "
                             "cannot tell what it defined: fix or delete it") from None
    if drop_hidden_tests and bindings(trees, "verify"):
        return parse_cells(sources, drop_hidden_tests=False)  # a `verify` of the student's own could be handed globals()
    return trees


# Line magics that run no code of the student's: a cell with `%matplotlib inline` keeps its marks.
HARMLESS_MAGICS = {"matplotlib", "config"}


def _harmless_magic(stmt):
    """A top-level statement that is exactly get_ipython().run_line_magic('<harmless>', '<text>')."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "run_line_magic"
            and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "get_ipython" and not call.func.value.args and not call.keywords
            and len(call.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)
            and call.args[0].value in HARMLESS_MAGICS)


def _names_bound_by(node):
    """The names this one node binds (its children not included)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def bindings(trees, name):
    """Every node, at any nesting in any cell, that binds `name`."""
    return [node for tree in trees for node in ast.walk(tree) if name in _names_bound_by(node)]


def _stand_ins(trees):
    """The targets of the setup cell's stand-ins, where they are allowed: `except ImportError` after `import triton`."""
    found = set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Try) and any(isinstance(b, ast.Import) and ast.unparse(b) == "import triton"
                                             for b in node.body):
            for handler in node.handlers:
                if isinstance(handler.type, ast.Name) and handler.type.id == "ImportError":
                    found |= {id(t) for st in handler.body if ast.unparse(st) in STAND_INS for t in st.targets}
    return found


def _the_def(trees, name):
    """The one top-level def that binds `name`, or None when it is bound otherwise or more than once."""
    found = bindings(trees, name)
    if len(found) == 1 and isinstance(found[0], ast.FunctionDef) and any(found[0] in t.body for t in trees):
        return found[0]
    return None


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
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return "your code uses `import *`"
    stand_ins = _stand_ins(trees)
    for name in sorted(trusted | set(ALLOWED_BINDINGS)):
        found = [n for n in bindings(trees, name) if id(n) not in stand_ins]
        allowed = ALLOWED_BINDINGS.get(name)
        if name == "check_attention_inputs":
            ok = len(found) <= 1 and all(ast.dump(n) == provided for n in found)
        elif name in ("triton", "tl"):
            ok = len(found) == 1 and ast.unparse(found[0]) == allowed
        else:
            ok = len(found) <= (allowed is not None) and all(ast.unparse(n) == allowed for n in found)
        if not ok:
            return f"your code redefines `{name}`" + (f" (only `{allowed}` may bind it, once)" if allowed else "")
    return None


def _is_jit(fn):
    """Its one decorator is triton.jit (or triton.jit(...)): a home-made `jit` proves nothing."""
    if len(fn.decorator_list) != 1:
        return False
    d = fn.decorator_list[0]
    return _dotted(d.func if isinstance(d, ast.Call) else d) == "triton.jit"


def _kernel_problem(name, trees, seen):
    """Why the @triton.jit function `name` is not a Triton kernel (None when it is)."""
    if name in seen:
        return None
    seen.add(name)
    # A kernel may be defined again in a later cell (a student fixing it there), so each of its definitions,
    # all top-level defs, must pass: whichever ran last is one of them.
    kernels = bindings(trees, name)
    if not kernels or not all(isinstance(k, ast.FunctionDef) and _is_jit(k) and any(k in t.body for t in trees)
                              for k in kernels):
        return (f"`{name}` must be a function at the top level of a cell, decorated with @triton.jit only "
                "(and never rebound otherwise)")
    for node in (n for kernel in kernels for n in ast.walk(kernel)):
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
    try:
        trees = parse_cells(sources)
    except Unreadable as e:
        return str(e)
    if not bindings(trees, "triton_attention"):
        return "no `def triton_attention` was found in your notebook's code cells"
    wrapper = _the_def(trees, "triton_attention")
    if wrapper is None:
        return "`triton_attention` must be one function at the top level of a cell, defined once and never rebound"
    if wrapper.decorator_list:
        return "triton_attention must not be decorated: a decorator can replace the function the grader reads"
    found = _global_problems(trees, _provided_check())
    if found:
        return found + ", which the grader cannot trust in a Triton exercise"
    local = {n for node in ast.walk(wrapper) if node is not wrapper for n in _names_bound_by(node)}
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


def _fused(node):
    """The name by which this node reaches PyTorch's fused attention (or could, unseen), else None."""
    if isinstance(node, ast.Name):
        names = [node.id]
    elif isinstance(node, ast.Attribute):
        names = [node.attr]
        chain = (_dotted(node) or "").split(".")
        if "attention" in node.attr and ("ops" in chain or "aten" in chain):
            return _dotted(node)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [part for a in node.names for part in [*a.name.split("."), a.asname or ""]]
        names += (node.module or "").split(".") if isinstance(node, ast.ImportFrom) else []
    else:
        return None
    return next((n for n in names if n in FUSED_CALLS or n.startswith("_scaled_dot_product") or "flash_attn" in n),
                None)


def _definers(trees):
    """{name: the statements (or targets) that bind it} in all the cells, to follow names through."""
    found = {}
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            parts = [node.target]  # only what is bound, not the loop's body
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            parts = [item for item in node.items if item.optional_vars is not None]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.Import, ast.ImportFrom,
                               ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts = [node]
        else:
            continue
        for part in parts:
            for name in {n for sub in ast.walk(part) for n in _names_bound_by(sub)} - {"_"}:
                found.setdefault(name, []).append(part)
    return found


def flash_problem(sources):
    """None unless flash_attention, or anything it reaches by name in the cells, calls fused attention (best effort)."""
    try:
        trees = parse_cells(sources)
    except Unreadable as e:
        return str(e)
    if any(isinstance(n, ast.Name) and n.id == "get_ipython" for tree in trees for n in ast.walk(tree)):
        return "your code cells use magics (%, !), whose code the grader cannot read: remove them from your answers"
    definers = _definers(trees)
    todo, seen = list(definers.get("flash_attention", [])), {"flash_attention"}
    while todo:
        part = todo.pop()
        local = set()  # a function's own arguments and variables are not the cells' names of the same spelling
        if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local = {n for node in ast.walk(part) if node is not part for n in _names_bound_by(node)}
        for node in ast.walk(part):
            name = _fused(node)
            if name:
                return f"flash_attention reaches `{name}`"
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in seen | local:
                seen.add(node.id)
                todo += definers.get(node.id, [])
    return None
