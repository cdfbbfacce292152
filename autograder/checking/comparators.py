"""What a check compares a student's result with, and how it words a difference: the inputs it sends
(reference, as_torch), and the expect_* verdicts that name the likely mistake, never a hidden value."""

import contextlib
from dataclasses import dataclass, replace

import numpy as np
import torch

from autograder.checking.memory import held_first
from autograder.checking.subject import OverBudget, StudentError, tensor
from autograder.sandbox import wire
from autograder.sandbox.server import ObjectServer
from autograder.sandbox.wire import Array, Handle


def as_torch(array):
    """A numpy array as a torch tensor, for computing references here."""
    return torch.from_numpy(np.ascontiguousarray(array))


def call_named(s, what, *args, hint="", **kwargs):
    """s.call(*args, **kwargs); when the student's code raises, the failure names the call `what`."""
    try:
        return s.call(*args, **kwargs)
    except StudentError as e:
        fail(f"{what} raised {e.type}: {e.message}" + (f" ({hint})" if hint else ""))


def changed_arguments(s, target, *args, **kwargs):
    """(target(*args, **kwargs), the positions in args of the numpy arrays, each sent as a tensor, that the call
    changed). The student's process sends its arguments back as the call left them (helpers.with_arguments) and this
    process compares each with its own copy: where the student's code runs, nothing says whether an argument was kept,
    so forging it means leaving it as it was."""
    got, after = s.helper(
        "with_arguments", target, *(tensor(a) if isinstance(a, np.ndarray) else a for a in args), **kwargs
    )
    after = after if isinstance(after, (list, tuple)) and len(after) == len(args) else [None] * len(args)
    return got, [
        i
        for i, (a, b) in enumerate(zip(args, after))
        if isinstance(a, np.ndarray) and not (isinstance(b, Array) and b.shape == a.shape and np.array_equal(b.data, a))
    ]


def keeps_argument(s, target, x, *args):
    """(target(x, *args), whether the call left x, a numpy array sent as a tensor, as it was): changed_arguments."""
    got, changed = changed_arguments(s, target, x, *args)
    return got, 0 not in changed


def call_within_memory(s, memory_mb, message, target, *args, **kwargs):
    """s.call_bounded(memory_mb, target, ...); running out of memory there fails with `message` (what
    the answer must have materialised). Size the case so that the wrong layout needs one allocation
    well above memory_mb, which counts from a fresh process (Subject.memory_bound)."""
    with within_memory(s, memory_mb, message):
        return s.call(target, *args, **kwargs)


@contextlib.contextmanager
def within_memory(s, memory_mb, message, headroom_mb=0, inputs_mb=0):
    """A block of calls in s.memory_bound(memory_mb, headroom_mb, inputs_mb); running out of memory there fails with
    `message`.
    It gives reword(message), which sets the message for what follows in the block (one bound, calls
    that must fit it for different reasons)."""
    said = [message]
    try:
        with s.memory_bound(memory_mb, headroom_mb, inputs_mb):
            yield lambda new: said.__setitem__(0, new)
    except OverBudget:
        fail(held_first(s, said[0]))
    except StudentError as e:
        if e.is_a("MemoryError") or "alloc" in e.raw_message.lower():
            fail(held_first(s, said[0]))
        raise


def reference(value, dtype=None):
    """A solutions/ result (tensors, arrays, tuples, numbers) as the plain data a check compares with.
    dtype: the result is the exact answer (computed in float64) to a question asked in `dtype`: the
    Array says `dtype` (what the student must return) and keeps the float64 values, so a correct
    answer is judged by its distance from the truth, not from the reference's own rounding."""
    got = wire.decode(ObjectServer({})._encode(value, [0]))
    if dtype is None:
        return got
    if not isinstance(got, Array):
        raise TypeError("reference(value, dtype) takes a single array")
    return Array(got.kind, dtype, got.data, got.device, got.subclass)


# ---- verdicts ------------------------------------------------------------------------------

TOLERANCE = {"float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (1e-2, 2e-3), "bfloat16": (5e-2, 2e-2)}


def fail(message):
    raise AssertionError(message)


def kind_of(value):
    """How a value is named in feedback."""
    if isinstance(value, Array):
        return {"tensor": "a torch.Tensor", "ndarray": "a numpy array", "npscalar": "a numpy scalar"}[value.kind]
    if isinstance(value, Handle):
        return f"a {value.type}"
    return "None" if value is None else f"a {type(value).__name__}"


def dtype_ok(got, want, upcast_ok=False):
    """got's dtype is want's, or (upcast_ok) float64 where want is float32: numpy promotes
    float32 / np.sqrt(d) to float64, a harmless widening in the numpy lesson."""
    return got.dtype == want.dtype or (upcast_ok and (got.dtype, want.dtype) == ("float64", "float32"))


def close(got, want, rtol=None, atol=None, upcast_ok=False, cond=1.0):
    """Same kind, dtype, shape, and values within the dtype's tolerance times cond (NaN equal to NaN)."""
    if not (
        isinstance(got, Array) and got.kind == want.kind and dtype_ok(got, want, upcast_ok) and got.shape == want.shape
    ):
        return False
    if want.data.dtype.kind in "biu":
        return bool(np.array_equal(got.data, want.data))
    return bool(_near(got, want, rtol, atol, cond).all())


def _near(got, want, rtol, atol, cond):
    r, a = TOLERANCE.get(want.dtype, (1e-5, 1e-6))
    with np.errstate(invalid="ignore"):
        return np.isclose(
            got.data.astype(np.float64),
            want.data.astype(np.float64),
            rtol=(rtol or r) * cond,
            atol=(atol or a) * cond,
            equal_nan=True,
        )


def where_it_differs(bad, axes=None, regions=None):
    """Where a result differs, in words and without values. bad: bool array of wrong entries;
    axes: a name per dimension ("B", "H", "T", ...); regions: {name: bool array broadcasting to bad}."""
    if not bad.any():
        return ""
    if bad.all():
        return "everywhere"
    for name, region in (regions or {}).items():
        region = np.broadcast_to(np.asarray(region, dtype=bool), bad.shape)
        if region.any() and not (bad & ~region).any():
            return f"only in the {name}"
        if (~region).any() and not (bad & region).any():
            return f"only outside the {name}"
    parts = []
    for axis, size in enumerate(bad.shape):
        if size < 2:
            continue
        name = axes[axis] if axes and axis < len(axes) else f"axis {axis}"
        hit = bad.any(axis=tuple(i for i in range(bad.ndim) if i != axis))
        if hit.all():
            continue
        first, last = int(np.argmax(hit)), size - 1 - int(np.argmax(hit[::-1]))
        sequence = name.startswith("T")  # positions in a sequence have a tail; heads, layers, widths do not
        where = "positions" if sequence else "indices"
        if hit.sum() == 1 and name in ("H", "Hkv"):
            parts.append(f"in one head only ({name})")
        elif hit[first : last + 1].all() and last == size - 1:
            parts.append(f"only in the last {where} along {name}" + (" (the tail)" if sequence else ""))
        elif hit[first : last + 1].all() and first == 0:
            parts.append(f"only in the first {where} along {name}")
        else:
            parts.append(f"in some {where} along {name}")
    return "; ".join(parts) or "in scattered entries"


@dataclass(frozen=True)
class Expect:
    """How expect_array judges one result and what its failure says, in the spirit of PrairieLearn's
    Feedback.check_* options: a lesson names the few it uses once (e.g. HEADS = Expect(axes=("B", "H", "T", "Dh")))
    and varies one per call (expect_array's keywords, or .but(hint=...)).

    hint: said after a value mismatch; nan_hint: said when NaN or inf stands where the answer is finite;
    rtol, atol: the tolerance (None: the dtype's, TOLERANCE), scaled by cond (the problem's conditioning);
    upcast_ok: float64 passes for float32 (dtype_ok); axes, regions: where a mismatch is said to be
    (where_it_differs)."""

    hint: str = ""
    nan_hint: str = ""
    rtol: float | None = None
    atol: float | None = None
    upcast_ok: bool = False
    cond: float = 1.0
    axes: tuple | None = None
    regions: dict | None = None

    def but(self, **changes) -> "Expect":
        """These options with `changes` (Expect's fields) made; TypeError naming one it lacks."""
        return replace(self, **changes)


def expect_array(got, want, what, mistakes=(), how: Expect | None = None, **changes):
    """Check a returned array against the reference `want` (an Array from reference()), judged and worded as `how`
    (an Expect; default Expect()) with `changes` (Expect's fields) made.

    mistakes: [(message, Array)] of what known mistakes would return on the same inputs, or a
    function returning them (called only when the result is wrong); a match fails with that
    message. Then kind, dtype, shape, device, NaN and values; a value mismatch says where it is.
    """
    how = (how or Expect()).but(**changes)
    tol = dict(rtol=how.rtol, atol=how.atol, upcast_ok=how.upcast_ok, cond=how.cond)
    if callable(mistakes):
        mistakes = [] if close(got, want, **tol) else mistakes()
    for message, wrong in mistakes:
        if close(got, wrong, **tol) and not close(got, want, **tol):
            fail(f"{what}: {message}")
    if not isinstance(got, Array) or got.kind != want.kind:
        fail(f"{what} should be {kind_of(want)}, but it is {kind_of(got)}")
    if got.subclass:
        fail(f"{what} should be a plain {kind_of(want)[2:]}, not a subclass ({got.subclass})")
    if not dtype_ok(got, want, how.upcast_ok):
        fail(f"{what} has dtype {got.dtype}, but should have {want.dtype}: keep the inputs' dtype")
    if got.shape != want.shape:
        fail(f"{what} has shape {got.shape}, but should have shape {want.shape}")
    if got.kind == "tensor" and got.device != want.device:
        fail(f"{what} is on {got.device}, but the inputs were on {want.device}")
    if want.data.dtype.kind == "f":
        bad = ~np.isfinite(got.data) & np.isfinite(want.data)
        if bad.any():
            fail(
                f"{what} contains NaN or inf where the correct result is finite"
                + (f": {how.nan_hint}" if how.nan_hint else "")
            )
    if not close(got, want, **tol):
        where = ""
        if want.data.dtype.kind == "f":
            where = where_it_differs(~_near(got, want, how.rtol, how.atol, how.cond), how.axes, how.regions)
        fail(
            f"{what} differs from the correct result"
            + (f" ({where})" if where else "")
            + (f": {how.hint}" if how.hint else "")
        )


def expect_int(got, want, what, mistakes=()):
    """A Python int equal to want; mistakes: [(message, wrong int)], or a function returning them (called only
    when the answer is wrong)."""
    if callable(mistakes):
        mistakes = [] if got == want and type(got) is int else mistakes()
    for message, wrong in mistakes:
        if got == wrong and got != want and type(got) is int:
            fail(f"{what}: {message}")
    if type(got) is not int:
        fail(f"{what} should be a Python int, but it is {kind_of(got)}")
    if got != want:
        fail(f"{what} is not the right count")


def expect_int_attributes(s, handle, rules, what):
    """Each attribute of the student's object must be the right Python int.
    rules: {name: (value, how it is computed, e.g. "d_model // n_heads")}."""
    for name, (want, rule) in rules.items():
        try:
            got = s.get(handle, name)
        except StudentError:
            fail(f"{what} has no attribute `{name}`: set self.{name} = {rule} in __init__")
        if type(got) is not int:
            fail(f"{what}.{name} should be the int {rule}, but it is {kind_of(got)}")
        if got != want:
            fail(f"{what}.{name} should be {rule}")


def expect_pair(got, what):
    """A result that must be a pair (out, weights); returns it."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(
            f"{what} should return a pair (out, weights), but returned {kind_of(got)}"
            + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        )
    return got


@contextlib.contextmanager
def expect_error(error, what):
    """with expect_error("ValueError", "split_heads with D % H != 0"): s.call(...)"""
    try:
        yield
    except StudentError as e:
        if not e.is_a(error):
            fail(f"{what} should raise {error}, but raised {e.type}")
        return
    fail(f"{what} should raise {error}, but returned normally")
