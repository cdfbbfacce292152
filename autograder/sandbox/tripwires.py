"""What an exercise forbids (PyTorch's attention kernels, its softmax, autograd), switched off at PyTorch's
dispatcher, where every route to an operator ends: F.*, torch.ops.aten.*, a name bound at run time, a dispatch
table, vmap, a module's method, a kernel looked up with torch._C, all reach the same table.

A path's operators get a kernel of ours at every dispatch key that has one (CPU, the composite keys, nested
tensors, autocast, ...): it raises ForbiddenPath naming the operator. Autograd's kernels are replaced by
fallthroughs for every operator: nothing is recorded, so autograd, .backward(), torch.func and forward-mode AD
give no gradient (an error, or zeros). The original kernels stay registered underneath ours, reachable only
through our registration, a C++ torch::Library whose destruction or reset() removes our kernels. In the sandbox
(install(..., for_good=True)) no Python object owns it: its pybind handle is emptied (_orphan) and freed before
any cell runs, so neither the garbage collector nor a scan of the heap for handles (ctypes over /proc/self/maps)
finds one to reset; undoing it means finding the C++ object in memory and running its registrations' C++
callbacks by hand. The grader still asks, after its calls, whether every path is still off (probe();
Subject.forbidding), and a path switched back on costs the aspect.

Where torch computes the same in Python (torch._refs, torch._decomp's tables, F.multi_head_attention_forward,
eager flex_attention's Python kernels: routes()), the functions' code is replaced in place by code that raises
ForbiddenPath naming the route, so every reference to them, kept anywhere, reaches the tripwire; in the sandbox the
original code is gone. A student can still copy such a function's source from torch's files: that is writing it.

Installed in a fresh process before the student's cells run (runner.child), so no cell can have looked up a
kernel first. Imports nothing of the course (torch only when it switches paths off): it runs next to the student's
code, and beside lesson 06's notebook, whose visible tests switch the same paths off (off()).
"""

import contextlib
import ctypes
import functools
import re
import warnings

# {path: what the student reached, in a message}; operators() says what each covers (torch is imported only there:
# autograder.lessons reads these names)
PATHS = {
    "attention kernels": "PyTorch's attention kernel",
    "softmax": "PyTorch's softmax",
    "autograd": "autograd",
    "compilers": "PyTorch's compilers",  # off wherever any path is (compiler_routes)
}
_KEY = re.compile(r"([A-Za-z0-9]+)(\[alias\])?: registered")


class ForbiddenPath(RuntimeError):
    """Raised by a forbidden operator; its message is `reached <what> (<operator>)`."""


def _matches(path, name):
    """Whether an operator or function called `name` belongs to the path."""
    if path == "attention kernels":
        return "attention" in name
    if path == "softmax":  # softmax's own operators, not their backward (autograd's business)
        return "softmax" in name and "backward" not in name
    if path == "autograd":
        return "backward" in name and "softmax" in name
    if path == "compilers":  # no operator or Python route of torch's by name: compiler_routes() lists its own
        return False
    raise ValueError(f"unknown forbidden path {path!r}; paths are {', '.join(PATHS)}")


def operators(path):
    """The operators whose kernels raise when a path is off (for "autograd", softmax's backward operators:
    _softmax_backward_data is dS = P * (dP - rowsum(dP * P)); attention's are attention kernels; every operator's
    autograd kernel goes too)."""
    import torch

    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::") and _matches(path, n))


# Where torch computes the same in Python, never reaching the dispatcher (or reaching it only through operators that
# are not the path's): its reference implementations, decompositions, higher-order operators' Python kernels (eager
# flex_attention), Python compositions (F.multi_head_attention_forward, need_weights=True: bmm and softmax).
_MODULES = ("torch._refs", "torch._decomp", "torch._higher_order_ops", "torch.nn.functional", "torch.nn.attention")


def routes(path):
    """{name: (mapping, key)}: the Python routes to the path, mapping[key] each, found by name (see _matches) in
    _MODULES' functions, in torch._decomp's tables (by operator), and in the Python kernels of higher-order operators
    and aten operators."""
    import importlib
    import sys
    import types

    import torch

    for name in (
        "torch._refs.nn.functional",
        "torch._refs.special",
        "torch._decomp.decompositions",
        "torch._higher_order_ops.flex_attention",
        "torch.nn.attention.flex_attention",
    ):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a torch without it has no such route
            pass
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(_MODULES):
            continue
        for name, value in list(vars(module).items()):
            if (
                isinstance(value, types.FunctionType)
                and _matches(path, name)
                and getattr(value, "__module__", "").startswith("torch")
            ):
                found.setdefault(f"{module_name}.{name}", (vars(module), name))
    tables = getattr(torch._decomp, "global_decomposition_table", {})
    for kind, table in [("", torch._decomp.decomposition_table), *tables.items()]:
        for op in list(table):
            if _matches(path, str(op)):
                found.setdefault(f"{op} {kind or 'post_autograd'} decomposition", (table, op))
    operators_ = [
        getattr(torch.ops.higher_order, n, None)
        for n in getattr(torch._ops, "_higher_order_ops", {})
        if _matches(path, n)
    ]
    for name in operators(path):
        packet = getattr(torch.ops.aten, name.split("::", 1)[1].split(".")[0], None)
        operators_ += [getattr(packet, o, None) for o in (packet.overloads() if packet is not None else ())]
    for op in operators_:
        for key in list(getattr(op, "py_kernels", {})):
            found.setdefault(f"{op} Python kernel at {key}", (op.py_kernels, key))
    return found


# PyTorch's compilers make the kernels they run themselves, never reaching the dispatcher's: NNC (torch._C._te) lowers
# aten::softmax, TorchScript's graph executor differentiates its graphs with its own formulas and sets grad_fn itself,
# inductor generates code. Their entry points are cut wherever another path is off: what compiles a function, a graph
# or a saved module, what runs a compiled one, and dynamo's frame hook (compiler_routes()).
_COMPILER_NAMES = re.compile(
    r"(parse_ir|_create_(function|method|module|object|graph)_.*|_jit_script_.*|_jit_trace_.*|_jit_interpret_graph"
    r"|.*import_ir_module.*|_load_(for_lite_interpreter|jit_module|mobile_module).*|CompilationUnit)$"
)


@functools.cache  # first called by install(), before anything is cut: the types it lists are the originals
def compiler_routes():
    """{name: (owner, attribute)}: the entry points of PyTorch's compilers (a module's or a type's attribute):
    torch.jit.script, trace, trace_module and load, torch.compile, TorchScript's compiling and importing functions in
    torch._C (and their re-exports in torch), the __call__ of compiled functions and methods, everything of NNC
    (torch._C._te) and dynamo's set_eval_frame; and the __init__ of every type among them, so that the type found some
    other way (the garbage collector lists it) makes nothing. A module is one object, whatever imports it."""
    import torch
    import torch._C._dynamo.eval_frame as eval_frame

    found = {f"torch.jit.{n}": (torch.jit, n) for n in ("script", "trace", "trace_module", "load")} | {
        "torch.compile": (torch, "compile"),
        "torch._C._dynamo.eval_frame.set_eval_frame": (eval_frame, "set_eval_frame"),
    }
    names = [n for n in dir(torch._C) if _COMPILER_NAMES.match(n)]
    found |= {f"torch._C.{n}": (torch._C, n) for n in names}
    found |= {f"torch.{n}": (torch, n) for n in names if getattr(torch, n, None) is getattr(torch._C, n)}
    found |= {f"torch._C.{t}.__call__": (getattr(torch._C, t), "__call__") for t in ("ScriptFunction", "ScriptMethod")}
    found |= {f"torch._C._te.{n}": (torch._C._te, n) for n in dir(torch._C._te) if not n.startswith("__")}
    types_ = {getattr(owner, key) for owner, key in found.values() if isinstance(getattr(owner, key), type)}
    return found | {f"{t.__module__}.{t.__qualname__}()": (t, "__init__") for t in types_}


def _keys(op):
    """The dispatch keys (alias keys included) at which op has a kernel of its own."""
    import torch

    return [
        m.group(1)
        for line in torch._C._dispatch_dump(op).splitlines()
        if (m := _KEY.match(line)) and "(inactive)" not in line and m.group(1) != "debug"
    ]


def _tripwire(op, what):
    def tripwire(*args, **kwargs):
        raise ForbiddenPath(f"reached {what} ({op})")

    return tripwire


@functools.cache  # one code object for every function of as many free variables (code is immutable)
def _raising_code(free):
    """The code of a function that raises its keyword-only default _forbidden_path_ = (class, message), with `free`
    free variables: it can replace the code of any function whose closure has that many cells."""
    names = [f"_cell{i}" for i in range(free)]
    cells = "".join(f"    {n} = None\n" for n in names)
    use = f"        ({', '.join(names)},)\n" if names else ""
    namespace = {}
    exec(
        f"def _outer():\n{cells}    def _tripwire(*args, _forbidden_path_, **kwargs):\n{use}"
        f"        raise _forbidden_path_[0](_forbidden_path_[1])\n    return _tripwire\n",
        namespace,
    )
    return namespace["_outer"]().__code__


_CUT = []  # the Python functions cut now (probe checks they still are); in the sandbox their code is gone for good


def _cut(route, fn, what, path, undo):
    """Make the Python function fn, and those it wraps (functools.wraps' __wrapped__, its closure's functions of the
    path), raise ForbiddenPath wherever they are referenced: their code is replaced in place, so a reference kept
    anywhere (a table, a closure, the garbage collector's list) reaches the tripwire too. undo: [(fn, code,
    defaults, kwdefaults)] to put back."""
    import types

    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if not isinstance(f, types.FunctionType) or id(f) in seen or f.__code__.co_name == "_tripwire":
            continue
        seen.add(id(f))
        todo += [f.__dict__.get("__wrapped__")] + [
            c.cell_contents
            for c in f.__closure__ or ()
            if _filled(c) and _matches(path, getattr(c.cell_contents, "__name__", ""))
        ]
        undo.append((f, f.__code__, f.__defaults__, f.__kwdefaults__))
        _CUT.append(f)
        f.__code__ = _raising_code(len(f.__closure__ or ()))
        f.__defaults__, f.__kwdefaults__ = None, {"_forbidden_path_": (ForbiddenPath, f"reached {what} ({route})")}


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


_PREPARED = {}  # {path: (operators(path), routes(path))}, found in the sandbox's worker before it forks (prepare)


def prepare(paths):
    """Find the paths' operators and Python routes (and the compilers' routes) once, in the sandbox's worker before any
    child forks and before any student code ran, as install() would find them in a fresh child: each child that
    switches them off then skips the search (some 0.03 CPU s a child, issue 33). Their kernels' dispatch keys are read
    by install() itself: they change as it registers (autograd's fallthroughs first)."""
    compiler_routes()
    for path in paths:
        _PREPARED[path] = (operators(path), routes(path))


def install(paths, for_good=True):
    """Switch the paths off in this process. for_good: for the rest of the process, out of reach (the sandbox);
    otherwise returns remove(), which puts the original kernels back (a hidden test in the student's own
    notebook, where nothing is out of the student's reach anyway)."""
    import types

    import torch
    import torch.library

    libraries = {}
    # Python routes cut (_cut), and table entries or attributes that are not Python functions replaced (_put)
    undo, entries = [], []

    def library(namespace):
        if namespace not in libraries:
            libraries[namespace] = torch._C._dispatch_library("IMPL", namespace, "")
        return libraries[namespace]

    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        if "autograd" in paths:  # first: a backward operator's tripwire then replaces its fallthrough
            for op in torch._C._dispatch_get_all_op_names():
                namespace, name = op.split("::", 1)
                try:
                    library(namespace).impl(name, "Autograd", torch.library.fallthrough_kernel, False)
                except RuntimeError:  # one that takes no kernel there records nothing either
                    pass
        for path in paths:
            ops, found = _PREPARED.get(path) or (operators(path), None)
            for op in ops:
                namespace, name = op.split("::", 1)
                for key in _keys(op):
                    library(namespace).impl(name, key, _tripwire(op, PATHS[path]), False)
            for route, (mapping, key) in (found if found is not None else routes(path)).items():
                if isinstance(mapping[key], types.FunctionType):
                    _cut(route, mapping[key], PATHS[path], path, undo)
                else:  # a decomposition table's or a Python kernel's entry that is some other callable
                    entries.append((mapping, key, mapping[key]))
                    _put(mapping, key, _tripwire(route, PATHS[path]))
        for route, (owner, key) in compiler_routes().items() if paths else ():  # wherever anything is off
            if isinstance(getattr(owner, key), types.FunctionType):
                _cut(route, getattr(owner, key), PATHS["compilers"], "compilers", undo)
            elif getattr(getattr(owner, key), "__name__", "") != "tripwire":
                entries.append((owner, key, getattr(owner, key)))
                _put(owner, key, _tripwire(route, PATHS["compilers"]))
        for op in torch._ops._higher_order_ops.values() if hasattr(torch._ops, "_higher_order_ops") else ():
            getattr(op, "_dispatch_cache", {}).clear()  # kernels it looked up before
    if for_good:
        for handle in libraries.values():
            _orphan(handle)
        libraries.clear()
        return None

    def remove():
        for handle in libraries.values():
            handle.reset()
        libraries.clear()
        for f, code, defaults, kwdefaults in reversed(undo):
            f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
            _CUT.remove(f)
        for owner, key, fn in reversed(entries):
            _put(owner, key, fn)
        undo.clear()
        entries.clear()

    return remove


def _put(owner, key, value):
    """owner[key] = value for a table, the attribute otherwise (a module's, a type's)."""
    if isinstance(owner, dict):
        owner[key] = value
    else:
        setattr(owner, key, value)


def _orphan(handle):
    """Leave handle's torch::Library (our kernels' registration) alive with no Python object owning it: pybind's
    simple instance layout holds [refcount, type, value pointer, holder (the unique_ptr), ..., flags]; the holder
    emptied, freeing the handle destroys nothing. Where the layout is not that one (another pybind), the handle is
    kept alive by a reference nobody holds instead: out of the garbage collector's reach, not a heap scan's."""
    words = (ctypes.c_uint64 * (type(handle).__basicsize__ // 8)).from_address(id(handle))
    simple_and_constructed = 0b110  # pybind's instance flags: simple_layout, simple_holders_constructed
    if len(words) >= 5 and words[2] and words[2] == words[3] and words[-1] & simple_and_constructed == 0b110:
        words[3] = 0
    else:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


def probe(paths):
    """The parts of the paths switched back on since install(paths) (empty while every route still ends in a
    tripwire): an operator with an active kernel that is not ours, a Python route whose code is not the tripwire, or
    a fresh call per path that does not raise ForbiddenPath (autograd: a product that records a grad_fn). The grader
    asks after each call with the paths off (Subject.forbidding), so a cell that undid our registration loses the
    aspect.

    It runs next to the student's code, which may replace it: it is a second layer. The first is that the paths are
    off before any cell runs and no Python object holds the registration (_orphan): turning them back on takes
    finding a C++ object in the process's memory and running its C++ callbacks by hand, far more work than the
    exercise; only then is this function worth replacing. The Triton answers' replay and the lessons' evidence
    checks are the other layers."""
    import torch

    lost = [
        op
        for path in paths
        for op in (_PREPARED[path][0] if path in _PREPARED else operators(path))
        if any(
            not line.split(": registered at ", 1)[1].startswith("/dev/null:0")
            for line in torch._C._dispatch_dump(op).splitlines()
            if (m := _KEY.match(line)) and "(inactive)" not in line and m.group(1) != "debug"
        )
    ]
    lost += [f"{f.__module__}.{f.__qualname__}" for f in _CUT if f.__code__.co_name != "_tripwire"]
    if paths:  # PyTorch's compilers are off wherever anything is (install)
        paths = [*paths, "compilers"] if "compilers" not in paths else paths
        lost += [
            route
            for route, (owner, key) in compiler_routes().items()
            if getattr(getattr(owner, key), "__code__", None) is None
            or getattr(owner, key).__code__.co_name not in ("tripwire", "_tripwire")
        ]
    q = torch.ones(1, 1, 2, 2)
    calls = {
        "attention kernels": lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q),
        "softmax": lambda: q.softmax(-1),
        "autograd": lambda: torch.ops.aten._softmax_backward_data(q, q, -1, q.dtype),
        "compilers": lambda: torch._C.parse_ir("graph():\n  return ()"),
    }
    for path in paths:
        try:
            calls[path]()
            lost.append(f"a call of {PATHS[path]}")
        except ForbiddenPath:
            pass
        except Exception:  # noqa: BLE001 - anything else is not our tripwire either
            lost.append(f"a call of {PATHS[path]}")
    if "autograd" in paths and (torch.ones(1, requires_grad=True) * 2).grad_fn is not None:
        lost.append("autograd's recording")
    return lost


def message(name, reached, instead):
    """What the student reads when `name` reached a forbidden path (reached: a ForbiddenPath's message)."""
    return f"{name} {reached}: {instead}"


@contextlib.contextmanager
def off(name, paths, instead):
    """The paths off for a block of a notebook's visible test, as the grader has them off where it checks `name`
    (lessons' [forbids]); reaching one fails with the grader's own words. Beside the notebook, this file is the
    grader's own (release copies it)."""
    remove = install(paths, for_good=False)
    try:
        yield
    except ForbiddenPath as e:
        raise AssertionError(message(name, e, instead)) from None
    except Exception as e:  # autograd off raises no ForbiddenPath: nothing was recorded to differentiate
        off = " and ".join(PATHS[p] for p in paths)
        raise AssertionError(
            f"{name} raised {type(e).__name__} with {off} switched off, as the grader checks it: {instead}"
        ) from None
    finally:
        remove()
