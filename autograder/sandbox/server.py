"""Runs the grader's requests against student code: call a function, read an attribute,
read or load a module's state. Used inside the sandbox (runner.py) and, for hidden tests
run in the notebook itself, in-process (autograder.checking.LocalSubject).

Requests and replies are plain data (wire.py). Whatever the student's code returns becomes
plain data here, or a handle to an object that stays on this side.
"""

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import helpers, wire

MAX_REPLY_BYTES = 64 * 2**20
_MISSING = object()
_current = None  # the server running a call now, for host_callback


def host_callback(payload):
    """Ask the grader, from code next to the student's (helpers), to handle payload (plain data and
    tensors); returns its reply. Only during Subject.call_with_callbacks: the grader keeps the record."""
    channel = _current.channel if _current is not None else None
    if channel is None:
        raise RuntimeError("no grader callback is active")
    return _current._arg(channel(_current._encode(payload, [0])))


helpers.host_callback = host_callback


class TooLarge(Exception):
    pass


class ObjectServer:
    def __init__(self, namespace):
        self.namespace = namespace
        self.objects = {}
        self.saved = {}  # names replaced by isolate(), restored by restore()
        # Set by whoever runs the server: encoded payload -> encoded reply, through the grader.
        self.channel = None

    def handle(self, request):
        """request (plain data) -> {'ok': value} or {'error': {...}}; never raises."""
        global _current
        _current = self
        try:
            return {"ok": self._encode(self._dispatch(request), [0])}
        except TooLarge:
            return {
                "error": {
                    "type": "OutputTooLarge",
                    "mro": ["OutputTooLarge"],
                    "message": "the result is larger than 64 MB",
                }
            }
        except BaseException as e:  # student code may raise anything, SystemExit included
            return {"error": describe(e)}
        finally:
            _current = None

    def _dispatch(self, req):
        op = req["op"]
        if op == "call":
            fn = self._target(req["target"])
            args = [self._arg(a) for a in req.get("args", [])]
            kwargs = {k: self._arg(v) for k, v in req.get("kwargs", {}).items()}
            if req.get("trace"):
                with OpLog() as log:
                    result = fn(*args, **kwargs)
                return result, log.ops
            result = fn(*args, **kwargs)
            return None if req.get("discard") else result  # the grader wants only the call's effect
        if op == "getattr":  # of a handle, or of a name the notebook defines (a class's static method)
            obj = self._target({"name": req["global"]}) if "global" in req else self.objects[req["handle"]]
            return getattr(obj, req["name"])
        if op == "state":
            module = self.objects[req["handle"]]
            return {k: v for k, v in module.state_dict(keep_vars=req.get("keep_vars") is True).items()}
        if op == "load":
            module = self.objects[req["handle"]]
            state = {k: self._arg(v) for k, v in req["state"].items()}
            with torch.no_grad():
                module.load_state_dict(state, strict=True)
            return None
        if op == "has":
            return callable(self.namespace.get(req["name"]))
        if op == "isolate":  # the grader's stand-ins arrive as source text (checks/stand_ins.py)
            stand_ins = {}
            exec(compile(str(req["source"]), "<grader stand-ins>", "exec"), stand_ins)
            for name in req["names"]:
                self.saved.setdefault(name, self.namespace.get(name, _MISSING))
                self.namespace[name] = stand_ins[name]
            return None
        if op == "restore":
            for name, value in self.saved.items():
                if value is _MISSING:
                    self.namespace.pop(name, None)
                else:
                    self.namespace[name] = value
            self.saved = {}
            return None
        raise ValueError(f"unknown op {op!r}")

    def _target(self, t):
        if "name" in t:
            if t["name"] not in self.namespace:
                raise NameError(f"name '{t['name']}' is not defined")
            return self.namespace[t["name"]]
        if "helper" in t:
            return helpers.HELPERS[t["helper"]]
        obj = self.objects[t["handle"]]
        return getattr(obj, t["method"]) if "method" in t else obj

    def _arg(self, v):
        if isinstance(v, list):
            return [self._arg(x) for x in v]
        if not isinstance(v, dict):
            return v
        tag = v.get("$")
        if tag == "handle":
            return self.objects[v["id"]]
        if tag == "tuple":
            return tuple(self._arg(x) for x in v["items"])
        if tag == "dict":
            return {k: self._arg(x) for k, x in v["items"].items()}
        value = wire.decode(v)
        if isinstance(value, wire.Array):
            if value.kind == "ndarray":
                return value.data
            t = torch.from_numpy(value.data)
            if value.dtype == "bfloat16":
                t = t.to(torch.bfloat16)
            return t.to(value.device) if value.device != "cpu" else t
        if isinstance(value, wire.DType):
            return getattr(torch, value.name)
        return value

    def _encode(self, x, budget, depth=0):
        if depth > wire.MAX_DEPTH:
            raise ValueError("the result is nested too deeply")
        if x is None or type(x) in (bool, int, str):
            return x
        if type(x) is float:
            return wire.encode_plain(x)
        if type(x) in (tuple, list):
            items = [self._encode(v, budget, depth + 1) for v in x]
            return {"$": "tuple", "items": items} if type(x) is tuple else items
        if type(x) is dict and all(type(k) is str for k in x):
            return {"$": "dict", "items": {k: self._encode(v, budget, depth + 1) for k, v in x.items()}}
        if isinstance(x, torch.Tensor) and _wire_dtype(x.dtype) is not None:
            sub = None if type(x) in (torch.Tensor, torch.nn.Parameter) else _qualname(type(x))
            t = torch.Tensor.detach(x).cpu()
            dtype = _wire_dtype(x.dtype)
            data = (t.float() if dtype == "bfloat16" else t).numpy()
            self._spend(budget, data)
            return wire.encode_array(
                "tensor", dtype, data, device=str(x.device), subclass=sub, requires_grad=bool(x.requires_grad)
            )
        if isinstance(x, np.ndarray) and x.dtype.name in wire.DTYPES:
            self._spend(budget, x)
            sub = None if type(x) is np.ndarray else _qualname(type(x))
            return wire.encode_array("ndarray", x.dtype.name, np.asarray(x), subclass=sub)
        if isinstance(x, np.generic) and x.dtype.name in wire.DTYPES:
            return wire.encode_array("npscalar", x.dtype.name, np.asarray(x))
        return self._handle(x)

    def _handle(self, x):
        oid = len(self.objects) + 1
        self.objects[oid] = x
        mro = [_qualname(c) for c in type(x).__mro__]
        return {"$": "handle", "id": oid, "type": mro[0], "mro": mro, "callable": callable(x)}

    @staticmethod
    def _spend(budget, arr):
        budget[0] += np.asarray(arr).nbytes  # the data's own size: a subclass's nbytes may say anything
        if budget[0] > MAX_REPLY_BYTES:
            raise TooLarge()


class OpLog(TorchDispatchMode):
    """Records every tensor op a call runs, as [name, first input's shape or None, [floating outputs'
    shapes]], so a check can see how a result was computed (tiled? one pass?), not only what it is."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        outs = out if isinstance(out, (tuple, list)) else [out]
        if len(self.ops) < wire.MAX_ITEMS:
            self.ops.append(
                [
                    func.overloadpacket.__name__,
                    None if first is None else list(first.shape),
                    [list(t.shape) for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()],
                ]
            )
        return out


def _wire_dtype(dtype):
    name = str(dtype).removeprefix("torch.")
    return name if name in wire.DTYPES or name == "bfloat16" else None


def _qualname(cls):
    return (
        f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ not in ("builtins", "__main__") else cls.__qualname__
    )


def describe(e):
    """An exception as plain data, its message cut short."""
    try:
        message = str(e)
    except BaseException:
        message = "<unprintable>"
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": message[:500]}
