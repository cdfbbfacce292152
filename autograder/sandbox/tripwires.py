"""What an exercise forbids (PyTorch's attention kernels, its softmax, autograd), switched off at PyTorch's
dispatcher, where every route to an operator ends: F.*, torch.ops.aten.*, a name bound at run time, a dispatch
table, vmap, a module's method, a kernel looked up with torch._C, all reach the same table.

A path's operators get a kernel of ours at every dispatch key that has one (CPU, the composite keys, nested
tensors, autocast, ...): it raises ForbiddenPath naming the operator. Autograd's kernels are replaced by
fallthroughs for every operator: nothing is recorded, so autograd, .backward(), torch.func and forward-mode AD
give no gradient (an error, or zeros). The original kernels stay registered underneath ours, reachable only
through our registration's handle; in the sandbox (install(..., for_good=True)) that handle is a pybind object
the garbage collector does not track, whose only reference is leaked, so no Python code can find it to undo it.

Installed in a fresh process before the student's cells run (runner.child), so no cell can have looked up a
kernel first. Imports nothing of the course (torch only when it switches paths off): it runs next to the student's
code, and beside lesson 06's notebook, whose visible tests switch the same paths off (off()).
"""
import contextlib
import ctypes
import re
import warnings

# {path: what the student reached, in a message}; operators() says what each covers (torch is imported only there:
# autograder.lessons reads these names)
PATHS = {
    "attention kernels": "PyTorch's attention kernel",
    "softmax": "PyTorch's softmax",
    "autograd": "autograd",
}
_KEY = re.compile(r"([A-Za-z0-9]+)(\[alias\])?: registered")


class ForbiddenPath(RuntimeError):
    """Raised by a forbidden operator; its message is `reached <what> (<operator>)`."""


def operators(path):
    """The operators whose kernels raise when a path is off (for "autograd", softmax's backward operators:
    _softmax_backward_data is dS = P * (dP - rowsum(dP * P)); attention's are attention kernels; every operator's
    autograd kernel goes too)."""
    import torch
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    if path == "attention kernels":
        return sorted(n for n in names if "attention" in n)
    if path == "softmax":  # softmax's own operators, not their backward (autograd's business)
        return sorted(n for n in names if "softmax" in n and "backward" not in n)
    if path == "autograd":
        return sorted(n for n in names if "backward" in n and "softmax" in n)
    raise ValueError(f"unknown forbidden path {path!r}; paths are {', '.join(PATHS)}")


def _keys(op):
    """The dispatch keys (alias keys included) at which op has a kernel of its own."""
    import torch
    return [m.group(1) for line in torch._C._dispatch_dump(op).splitlines()
            if (m := _KEY.match(line)) and "(inactive)" not in line and m.group(1) != "debug"]


def _tripwire(op, what):
    def tripwire(*args, **kwargs):
        raise ForbiddenPath(f"reached {what} ({op})")
    return tripwire


def install(paths, for_good=True):
    """Switch the paths off in this process. for_good: for the rest of the process, out of reach (the sandbox);
    otherwise returns remove(), which puts the original kernels back (a hidden test in the student's own
    notebook, where nothing is out of the student's reach anyway)."""
    import torch
    import torch.library
    libraries = {}

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
            for op in operators(path):
                namespace, name = op.split("::", 1)
                for key in _keys(op):
                    library(namespace).impl(name, key, _tripwire(op, PATHS[path]), False)
    if for_good:
        for handle in libraries.values():  # kept alive by a reference nobody holds (see the module's docstring)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))
        return None

    def remove():
        for handle in libraries.values():
            handle.reset()
        libraries.clear()
    return remove


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
        raise AssertionError(f"{name} raised {type(e).__name__} with {off} switched off, as the grader checks it: "
                             f"{instead}") from None
    finally:
        remove()
