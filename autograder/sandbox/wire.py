"""Plain-data values between the grader and student code: JSON, arrays as raw bytes in base64.

Never pickle: decoding builds only None, bools, numbers, strings, lists, tuples, dicts,
Array and Handle. The grader decodes everything the sandbox sends with decode(), which
validates dtypes and sizes, so a hostile sandbox can send wrong answers but nothing else.
"""

import base64
import json
import math
import struct

import numpy as np

# dtypes that may cross the wire; bfloat16 travels as float32 with its name kept.
DTYPES = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
# What a reader parses is capped, so a hostile peer cannot blow up the grader's memory: a frame's
# bytes, and its JSON tokens (each "[", "{" or ",": every container and item costs one), counted
# before parsing. Arrays travel as one base64 string each, whatever their size.
MAX_FRAME = 32 * 2**20
MAX_TOKENS = 500_000
MAX_DEPTH = 16
MAX_ITEMS = 10_000


class WireError(ValueError):
    """A message that is not valid plain data."""


class Array:
    """An array that crossed the wire: kind 'tensor' or 'ndarray', dtype name, shape, data (numpy)."""

    def __init__(self, kind, dtype, data, device="cpu", subclass=None, requires_grad=False):
        self.kind, self.dtype, self.data = kind, dtype, data
        self.shape = tuple(data.shape)
        self.device, self.subclass, self.requires_grad = device, subclass, requires_grad

    def __repr__(self):
        return f"Array({self.kind}, {self.dtype}, shape={self.shape})"


class Handle:
    """A reference to an object that stays on the other side (a module, a cache, ...)."""

    def __init__(self, id, type, mro=(), callable=False):
        self.id, self.type, self.mro, self.callable = id, type, tuple(mro), callable

    def __repr__(self):
        return f"<{self.type} object>"


class DType:
    """A torch dtype passed as an argument, by name (e.g. 'float64')."""

    def __init__(self, name):
        self.name = name


def encode_array(kind, dtype, arr, **extra):
    arr = np.asarray(arr, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    return {
        "$": kind,
        "dtype": dtype,
        "shape": list(arr.shape),
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
        **extra,
    }


def decode(obj, depth=0):
    """Plain data -> Python values, validating everything; raises WireError."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, list):
        if len(obj) > MAX_ITEMS:
            raise WireError("list too long")
        return [decode(x, depth + 1) for x in obj]
    if not isinstance(obj, dict):
        raise WireError(f"unexpected JSON value {type(obj).__name__}")
    tag = obj.get("$")
    if tag in ("tensor", "ndarray", "npscalar"):
        return _decode_array(obj)
    if tag == "tuple":
        if not isinstance(obj.get("items"), list):
            raise WireError("bad tuple")
        return tuple(decode(obj["items"], depth + 1))
    if tag == "dict":
        items = obj.get("items")
        if not isinstance(items, dict) or len(items) > MAX_ITEMS:
            raise WireError("bad dict")
        return {str(k): decode(v, depth + 1) for k, v in items.items()}
    if tag == "handle":
        mro = obj.get("mro", [])
        if not (
            isinstance(obj.get("id"), int)
            and isinstance(obj.get("type"), str)
            and isinstance(mro, list)
            and all(isinstance(m, str) for m in mro)
        ):
            raise WireError("bad handle")
        return Handle(obj["id"], obj["type"][:200], [m[:200] for m in mro[:50]], bool(obj.get("callable")))
    if tag == "float":  # nan and infinities, which JSON cannot spell
        if obj.get("value") not in ("nan", "inf", "-inf"):
            raise WireError("bad float")
        return float(obj["value"])
    if tag == "dtype":
        if obj.get("name") not in DTYPES | {"bfloat16"}:
            raise WireError("bad dtype")
        return DType(obj["name"])
    raise WireError(f"unknown tag {tag!r}")


def _decode_array(obj):
    dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    wire_dtype = "float32" if dtype == "bfloat16" else dtype
    if wire_dtype not in DTYPES:
        raise WireError(f"dtype {dtype!r} not allowed")
    if not (isinstance(shape, list) and len(shape) <= 8 and all(isinstance(n, int) and 0 <= n for n in shape)):
        raise WireError("bad shape")
    if not isinstance(data, str):
        raise WireError("bad array data")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except ValueError:  # binascii.Error, UnicodeEncodeError
        raise WireError("bad array data") from None
    if len(raw) != math.prod(shape) * np.dtype(wire_dtype).itemsize:
        raise WireError("array data does not match its shape")
    arr = np.frombuffer(raw, dtype=wire_dtype).reshape(shape).copy()
    subclass = obj.get("subclass")
    return Array(
        obj["$"],
        dtype,
        arr,
        device=str(obj.get("device", "cpu"))[:50],
        subclass=str(subclass)[:200] if subclass else None,
        requires_grad=bool(obj.get("requires_grad")),
    )


def encode_plain(value, depth=0):
    """Grader-side values (numpy arrays, Array, DType, scalars, containers) -> plain data."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$": "float", "value": str(value)}
    if isinstance(value, np.generic):
        return encode_plain(value.item(), depth)
    if isinstance(value, np.ndarray):
        return encode_array("ndarray", value.dtype.name, value)
    if isinstance(value, Array):
        return encode_array(value.kind, value.dtype, value.data, device=value.device)
    if isinstance(value, Handle):
        return {"$": "handle", "id": value.id, "type": value.type}
    if isinstance(value, DType):
        return {"$": "dtype", "name": value.name}
    if isinstance(value, tuple):
        return {"$": "tuple", "items": [encode_plain(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [encode_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {"$": "dict", "items": {str(k): encode_plain(v, depth + 1) for k, v in value.items()}}
    raise WireError(f"cannot send a {type(value).__name__}")


def dumps(message):
    return json.dumps(message, separators=(",", ":")).encode()


def loads(payload, max_tokens=MAX_TOKENS):
    if max_tokens is not None and sum(payload.count(c) for c in (b"[", b"{", b",")) > max_tokens:
        raise WireError(f"a message of more than {max_tokens} items")
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed message: {str(e)[:200]}") from None


def send_frame(sock, message):
    payload = dumps(message)
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def recv_frame(sock, max_bytes=MAX_FRAME, max_tokens=MAX_TOKENS):
    """One message from a socket; None at end of stream."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > max_bytes:
        raise WireError(f"a message of {n} bytes, larger than {max_bytes}")
    payload = _recv_exact(sock, n)
    if payload is None:
        raise WireError("stream ended inside a message")
    return loads(payload, max_tokens)


def _recv_exact(sock, n):
    buf, got = bytearray(n), 0  # one buffer of the announced size: no copies while it fills
    view = memoryview(buf)
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if not k:
            if got:
                raise WireError("stream ended inside a message")
            return None
        got += k
    return buf
