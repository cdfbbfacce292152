"""Objects the grader builds next to student code, so that one function can be checked
without depending on the student's other answers (a correct cache for attend_with_cache, a
stand-in model for generate, ...). Nothing here is a lesson's answer.

Everything here runs in the student's process, where a cell may have replaced it (sys.modules reaches this module):
a helper sends data (a tensor as a call left it, a model's .grad), never a verdict, and the grader compares the data
with its own copy of what it sent, so that forging it means producing the state the exercise asks for. What only
this process can tell (a CPU time to compare with) is measured in a process that ran none of the notebook's code
(Subject.elsewhere). Two still report what they saw as a word or a number (device_used, tensor_bytes): forging them
spares no more work than passing the device on, or than dropping a log kept beside a correct window.
"""

import math
import types

import torch
from torch import nn

from . import tripwires


def torch_mha(d_model, n_heads, bias, state):
    """torch.nn.MultiheadAttention(d_model, n_heads, bias, batch_first=True) holding `state`."""
    mha = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    mha.load_state_dict(state)
    return mha.eval()


class AttentionShell(nn.Module):
    """Just the projections and sizes of an attention module (no forward): what mha_to_gqa,
    attend_with_cache and fuse_qkv read. linears: {name: (weight, bias or None)}."""

    def __init__(self, linears, **attrs):
        super().__init__()
        for name, (weight, bias) in linears.items():
            layer = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None, dtype=weight.dtype)
            with torch.no_grad():
                layer.weight.copy_(weight)
                if bias is not None:
                    layer.bias.copy_(bias)
            setattr(self, name, layer)
        for k, v in attrs.items():
            setattr(self, k, v)


class ListCache:
    """A simple, correct key/value cache: update(k, v) appends along the time axis (dim 2)
    and returns everything so far; len() is the number of cached positions."""

    def __init__(self):
        self.k = self.v = None

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def reset(self):
        self.k = self.v = None


class ListLatentCache:
    """A simple, correct latent cache (lesson 08's LatentCache): update(c) appends c (B, T_new, d_latent)
    along dim 1 and returns every latent so far; len() is the number of cached positions."""

    def __init__(self):
        self.c = None

    def update(self, c):
        self.c = c if self.c is None else torch.cat([self.c, c], dim=1)
        return self.c

    def __len__(self):
        return 0 if self.c is None else self.c.size(1)


class HostDecoder(nn.Module):
    """A stand-in language model for checking generate(), with the Decoder's interface. It holds
    no weights and no state: each forward sends its ids and its caches' numbers to the grader
    (server.host_callback), which computes the logits, keeps every cache's state and logs the
    calls, where the student's code cannot reach them. A cache is only the number the grader gave."""

    class Cache:
        def __init__(self, number):
            self.number = number

        def __len__(self):
            return _ask_grader({"op": "len", "cache": self.number})

    def __init__(self, vocab_size, max_seq_len):
        super().__init__()
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len

    def make_caches(self, batch_size):
        return [HostDecoder.Cache(_ask_grader({"op": "make_caches", "batch_size": batch_size}))]

    def forward(self, ids, caches=None):
        if not (torch.is_tensor(ids) and ids.dtype == torch.long and ids.ndim == 2):
            raise ValueError(f"expected ids (B, T) of dtype torch.long, got {getattr(ids, 'dtype', type(ids))}")
        numbers = [getattr(c, "number", None) for c in caches] if caches else None
        return _ask_grader({"op": "forward", "ids": ids, "caches": numbers})


class Graph:
    """out = fn(q, k, v, *args) with q, k, v as fresh leaves that require grad (an autograd Function's apply);
    backward(dout) runs autograd from out and returns the leaves' gradients (dq, dk, dv)."""

    def __init__(self, fn, q, k, v, *args):
        self.leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        self.out = fn(*self.leaves, *args)

    def backward(self, dout):
        torch.autograd.backward(self.out, dout)
        return tuple(t.grad for t in self.leaves)

    def saved(self):
        """Before backward: the tensors fn's ctx.save_for_backward saved, as data the grader compares with its own,
        and the names of the tensors kept as attributes of ctx."""
        ctx = self.out.grad_fn
        return (
            list(getattr(ctx, "saved_tensors", ())),
            sorted(n for n, x in vars(ctx).items() if isinstance(x, torch.Tensor)),
        )


# .grad and .requires_grad as torch's C type defines them: a cell may rebind torch.Tensor's, not these (an
# immutable type)
_GRAD, _REQUIRES_GRAD = torch._C.TensorBase.grad, torch._C.TensorBase.requires_grad


class ModelRecord:
    """The parameters and submodules of a model the grader just built, found through each module's own __dict__ (as
    nn.Module keeps them), not through its methods, which a subclass may override. What the grader reads of the model
    after a call (its weights, .grad, requires_grad and mode) comes from these objects, as data the grader compares
    with what it set: no verdict is made here, where the student's code may have replaced this class's methods."""

    def __init__(self, model):
        self.modules, self.params, todo = [], {}, [("", model)]
        while todo:
            prefix, module = todo.pop(0)
            own = object.__getattribute__(module, "__dict__")
            self.modules.append(own)
            for name, p in own.get("_parameters", {}).items():
                if p is not None:
                    self.params[prefix + name] = p
            todo += [(f"{prefix}{name}.", m) for name, m in own.get("_modules", {}).items() if m is not None]

    def give_grads(self, grads):
        """Each parameter's .grad set to grads[name] (a tensor, or None: absent names too), as a caller in the middle
        of its own backward would leave them; the grader chooses the values."""
        for name, p in self.params.items():
            _GRAD.__set__(p, None if grads.get(name) is None else grads[name].to(p.dtype))

    def grads(self):
        """{name: [requires_grad, .grad (None when unset)]}."""
        return {name: [bool(_REQUIRES_GRAD.__get__(p)), _GRAD.__get__(p)] for name, p in self.params.items()}

    def weights(self):
        """{name: a copy of the parameter's values}."""
        return {name: p.detach().clone() for name, p in self.params.items()}

    def modes(self):
        """[training] of the model and every submodule."""
        return [bool(own.get("training")) for own in self.modules]

    def set_mode(self, training):
        """The model and its submodules in train (True) or eval mode, without their methods."""
        for own in self.modules:
            own["training"] = bool(training)


def without_grad(fn, *args):
    """fn(*args) under torch.no_grad(), as a caller who only measures runs it."""
    with torch.no_grad():
        return fn(*args)


def with_arguments(fn, *args, **kwargs):
    """(fn(*args, **kwargs), args as the call left them): the grader compares each tensor it sent with its own
    copy (checking.changed_arguments)."""
    return fn(*args, **kwargs), list(args)


def device_used(fn, *args, **kwargs):
    """Whether fn(*args, **kwargs, device=...) makes its tensor on the device it is asked for: "used",
    "ignored", "unseen" (no verdict) or "broken" (with device="cpu" it raises, a device argument it
    lacks included, or returns no tensor). The device asked for is one that costs nothing here: "cuda" where
    this torch cannot use one (code that uses it raises; code that ignores it returns a CPU tensor), else
    "meta", which every torch has but whose first use imports PyTorch's meta kernels (about 1 s and 250 MiB,
    which would count as the notebook's own memory in the later memory bounds); code that uses a meta device
    may still call an operation meta tensors lack: unseen."""
    try:
        if not torch.is_tensor(fn(*args, device="cpu", **kwargs)):
            return "broken"
    except Exception:  # noqa: BLE001 - the values' aspects say what is wrong with it
        return "broken"
    asked = "meta" if torch.cuda.is_available() else "cuda"
    try:
        out = fn(*args, device=asked, **kwargs)
    except Exception:  # noqa: BLE001 - see the docstring
        return "used" if asked == "cuda" else "unseen"
    if not torch.is_tensor(out):
        return "broken"
    return "used" if out.device.type == asked else "ignored"


def tensor_bytes(obj, limit=10_000):
    """The bytes of the distinct tensor storages obj holds: through its attributes, its class's plain
    attributes and the lists, tuples, sets and dicts among them, at most `limit` objects deep in all.
    What a cache keeps between calls, seen from its object rather than from the process's address space,
    where a glibc arena's unused heap hides tens of MiB (runner.bound)."""
    seen, storages, todo = set(), {}, [obj]
    while todo and len(seen) < limit:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if torch.is_tensor(item):
            storage = item.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(
            item, (type, types.FunctionType, types.MethodType, types.ModuleType)
        ):
            todo.extend(vars(item).values())
            todo.extend(v for k, v in vars(type(item)).items() if not k.startswith("__") and not callable(v))
    return sum(storages.values())


def compile_kernels(jobs_json, timeout):
    """The Triton compiler's verdicts (JSON) on jobs (JSON, as autograder/triton_fit.py makes them), from the
    triton_fit.py that grading stages beside the notebook of a lesson whose cells import it: the compiling
    runs in a child of this sandboxed process, under its limits, and `timeout` seconds at most; afresh (Triton's cache,
    in the sandbox's writable HOME, is left aside) in an isolated Python (no module from this folder)."""
    import importlib.util
    import json
    import os

    spec = importlib.util.spec_from_file_location("_triton_fit", os.path.abspath("triton_fit.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.dumps(module.compile_jobs(json.loads(jobs_json), ptxas=True, timeout=timeout, isolated=True))


def draw(seed, specs, lengths=False):
    """Tensors, one per (shape, scale) or (shape, scale, dtype name) of specs, uniform in [-scale, scale] (float64
    unless named), from a generator seeded with seed, in order. The grader draws the same on its side (same torch,
    same CPU generator), so that inputs too large to send are made where they are used, and no wire buffer counts
    against a memory bound.
    A spec (shape, scale, "float64", levels) makes one float64 tensor, given twice (a case's keys and its values),
    whose entries are `levels` evenly spaced values in [-scale, scale], one drawn for each position from numpy's
    generator (cheaper than torch's), LEVELS_CHUNK at a time: the exact attention over it needs only how often each
    level comes, which the grader counts chunk by chunk without making the tensor (lengths=True gives a Levels, twice,
    instead); code would have to read every key to tell the levels apart."""
    generator = torch.Generator().manual_seed(int(seed))
    out = []
    for i, (shape, scale, *rest) in enumerate(specs):
        dtype = getattr(torch, rest[0]) if rest else torch.float64
        if len(rest) < 2:
            out.append(torch.empty([int(n) for n in shape], dtype=dtype).uniform_(-scale, scale, generator=generator))
            continue
        n, levels = math.prod(int(n) for n in shape), int(rest[1])
        if lengths:
            out += [Levels(_levels(seed, i, n, levels), n, scale, levels)] * 2
            continue
        keys = torch.empty([int(n) for n in shape], dtype=torch.float64)
        flat = keys.view(-1).numpy()
        for a, level in _levels(seed, i, n, levels):
            part = flat[a : a + len(level)]
            part[...] = level
            part *= 2 * scale / (levels - 1)
            part -= scale
        out += [keys, keys]
    return out


LEVELS_CHUNK = 2**18  # positions whose levels draw makes at once


def _levels(seed, i, n, levels):
    """(start, levels (uint8)) of the n positions of spec i, LEVELS_CHUNK at a time."""
    import numpy as np

    rng = np.random.default_rng([int(seed), i])
    for a in range(0, n, LEVELS_CHUNK):
        yield a, rng.integers(0, levels, min(LEVELS_CHUNK, n - a), np.uint8)


class Levels:
    """The grader's side of a tensor draw makes over levels: the value of each level, the length n, how often each
    level comes among the first n - TAIL positions, and the levels of the last TAIL in order."""

    TAIL = 2**12  # past any number of queries a check asks at once: the causal rows differ in the last ones only

    def __init__(self, chunks, n, scale, levels):
        import numpy as np

        self.n, self.values = n, np.arange(levels) * (2 * scale / (levels - 1)) - scale  # as draw makes them
        self.counts, tail = np.zeros(levels, np.int64), []
        for a, level in chunks:
            head = max(0, n - self.TAIL - a)
            self.counts += np.bincount(level[:head], minlength=levels)
            tail.append(level[head:])
        self.tail = np.concatenate(tail)

    def counts_upto(self, stop):
        """How often each level comes among the first `stop` positions (stop >= n - TAIL)."""
        import numpy as np

        return self.counts + np.bincount(self.tail[: stop - (self.n - len(self.tail))], minlength=len(self.values))


def _picked(value, picks):
    """Of each tensor of value (a tensor, or a tuple or list of them), the entries at picks[j] along dim 2 (None:
    all of it); anything else as it is. -> (what is picked, each element's full shape or None)."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    out, shapes = [], []
    for item, pick in zip(items, list(picks) + [None] * (len(items) - len(picks))):
        tensor = torch.is_tensor(item)
        shapes.append(list(item.shape) if tensor else None)
        if tensor and pick is not None and item.dim() >= 3 and item.size(2) > max(pick):
            item = item.index_select(2, torch.tensor(pick, device=item.device))
        out.append(item)
    return (tuple(out) if isinstance(value, (tuple, list)) else out[0]), shapes


def drawn_calls(fn, seed, specs, calls):
    """fn(*call["args"]) for each of calls, where {"drawn": i} among the args is the i-th tensor draw(seed, specs) makes
    here, every one alive until the last call; of each result, only the entries call["picks"] says (_picked), with
    the full shapes. call["ballast_mb"] MiB stay mapped during the call: what another call's results may take, so
    that one memory bound holds each call to the same working memory."""
    drawn = draw(seed, specs)
    results = []
    for call in calls:
        ballast = torch.empty(int(call.get("ballast_mb", 0)) << 20, dtype=torch.uint8)  # mapped, never touched
        result = fn(*[drawn[a["drawn"]] if isinstance(a, dict) and "drawn" in a else a for a in call["args"]])
        results.append(_picked(result, call.get("picks", [])))
        del result, ballast
    return results


def form_latent_kv(mla, seed, specs, chunk=2048):
    """What absorbed_attention must never do, done here to price it: apply mla.k_up and mla.v_up to every latent
    (B, Tk, d_latent) of draw(seed, specs), chunk positions at a time, keeping nothing. The grader compares the CPU
    time of a student's call with this one's, made in a process that ran none of the notebook's code
    (lessons/kv_compression/checks.py)."""
    latents = draw(seed, specs)[0]
    with torch.no_grad():
        for s in range(0, latents.size(1), chunk):
            mla.k_up(latents[:, s : s + chunk])
            mla.v_up(latents[:, s : s + chunk])


# payload -> the grader's reply: installed by server.py, which imports this module (so this one
# imports no other of the sandbox's, and the two form no circle).
host_callback = None


def launches(run, fn, *args, **kwargs):
    """(fn(*args, **kwargs), buffers, [(grid, args, kwargs)]): fn's result and each launch of the Triton kernel
    whose `run` is given, as it was launched, a tensor argument as the key of `buffers` {key: its contents when
    first launched} (the same storage, shape and strides: the same key). What the grader launches again on its
    own (Subject.elsewhere, checks/triton_replay.py): evidence recorded here may be forged, and is worth only
    what its replay gives."""
    return _recording(run, fn, args, kwargs, run)[:3]


def planned_launches(run, fn, *args, **kwargs):
    """launches(), with the kernel's launches recorded and not run (the grader's replay runs them): ((the key of the
    launched buffer fn returned, the shape it returned it in), buffers, launches), or None where fn returned anything
    else (the grader then calls it with the kernel run: launches()), or a buffer whose memory another launched tensor
    shares (two views of it, which the replay gives a buffer each: which of them it returned is not its own)."""
    result, buffers, seen, tensors = _recording(run, fn, args, kwargs, lambda *a, **kw: None)
    if not (torch.is_tensor(result) and result.is_contiguous()):
        return None
    storage = result.untyped_storage().data_ptr()
    sharing = [(k, t) for k, t in tensors.items() if t.untyped_storage().data_ptr() == storage]
    if len(sharing) != 1:
        return None
    k, t = sharing[0]
    if (t.data_ptr(), t.dtype, t.numel()) == (result.data_ptr(), result.dtype, result.numel()) and t.is_contiguous():
        return (k, list(result.shape)), buffers, seen
    return None


def _recording(run, fn, args, kwargs, launch):
    """(fn(*args, **kwargs), buffers, launches, {key: the tensor launched}) of launches(), each launch of run's kernel
    recorded and then made by launch(*args, grid=, warmup=, **kwargs)."""
    kernel, buffers, seen, tensors = run.__self__, {}, [], {}

    def key(t):
        k = f"{t.data_ptr()}:{tuple(t.shape)}:{t.stride()}:{t.dtype}"
        if k not in buffers:
            buffers[k], tensors[k] = t.detach().clone(), t
        return {"buffer": k}

    def record(*a, grid, warmup, **kw):
        plain = lambda v: key(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        if callable(grid):
            grid = grid(dict(zip(kernel.arg_names, a), **kw))
        seen.append(([int(g) for g in grid], [plain(v) for v in a], {k: plain(v) for k, v in kw.items()}))
        return launch(*a, grid=grid, warmup=warmup, **kw)

    kernel.run = record
    try:
        result = fn(*args, **kwargs)
    finally:
        del kernel.run
    return result, buffers, seen, tensors


def _ask_grader(payload):
    """The grader's answer to payload; its refusals ({"error": why}) become a ValueError here."""
    if host_callback is None:
        raise RuntimeError("no grader callback is active")
    reply = host_callback(payload)
    if isinstance(reply, dict) and "error" in reply:
        raise ValueError(str(reply["error"]))
    return reply


HELPERS = {
    "torch_mha": torch_mha,
    "AttentionShell": AttentionShell,
    "ListCache": ListCache,
    "HostDecoder": HostDecoder,
    "ListLatentCache": ListLatentCache,
    "len": len,
    "Graph": Graph,
    "without_grad": without_grad,
    "with_arguments": with_arguments,
    "device_used": device_used,
    "tensor_bytes": tensor_bytes,
    "compile_kernels": compile_kernels,
    "drawn_calls": drawn_calls,
    "form_latent_kv": form_latent_kv,
    "launches": launches,
    "planned_launches": planned_launches,
    "ModelRecord": ModelRecord,
    "tripwires_probe": tripwires.probe,
}
