"""Hidden checks of lesson 09 (training through attention): attention_backward, flash_attention_forward,
flash_attention_backward, FlashAttention.

Gradients are compared with the exact answer (the reference in float64) under the contract's tolerance,
max|err| <= tol * (1 + max|truth|) per gradient. How they were computed is scored only from evidence the
student's code cannot reach, a hard memory bound set from outside its process (Subject.memory_bound):

- flash_attention_forward and flash_attention_backward "tiled": calls with so many keys (or queries) that a
  (block_q, Tk) row of scores, a (Tq, block_k) column of them, the full matrix or a full causal mask does not
  fit the bound while block_q x block_k tiles do;
- attention_backward "by hand": calls in a process where autograd's kernels are fallthroughs and PyTorch's attention
  and softmax-backward kernels raise (lesson.toml's [forbids], sandbox/tripwires.py); the other functions' "tiled"
  and FlashAttention's "never keeps P" run with PyTorch's attention kernels off the same way;
- FlashAttention "never keeps P": a forward and a backward, both inside one bound, at a length where one
  float32 (Tq, Tk) tensor of probabilities is larger than the bound plus all the process held before it:
  keeping P (in ctx.save_for_backward, on ctx, in a global) cannot fit, whatever buffer was reserved first.

The large cases compare values too, with tolerances derived from the length of their sums (_grad_atol).
FlashAttention runs with correct flash_attention_forward and flash_attention_backward (isolate), so a
mistake in those costs points on their own tests only.
"""

import ast
import contextlib
import hashlib
import math
from types import SimpleNamespace

import numpy as np
import torch

from autograder.checking import (
    HEADROOM_MB,
    Checks,
    StudentError,
    changed_arguments,
    close,
    evidence_times,
    expect_array,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
    unseen_seed,
    within_memory,
)
from autograder.lessons.gpu.checks import (
    TILED_ROWS,
    TIMED_LONG,
    attention_mistakes,
    drawn_mb,
    exact_attention,
    expect_attention,
    long_specs,
    qkv,
    rows_of,
    tiled_judged,
)
from autograder.sandbox import helpers
from autograder.sandbox.wire import Array
from solutions import flash_backward as ref

LESSON = "09_flash_backward"
CHECKS = Checks()
# The contract's tolerances, max|err| <= tol * (1 + max|truth|), by the dtype asked in (half precision: float32
# arithmetic, then the result's own rounding, 2**-11 of it in float16 and 2**-8 in bfloat16).
TOL = {"float64": 1e-10, "float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
UNIT = {"float64": 2.0**-53, "float32": 2.0**-24}  # unit roundoff of the arithmetic
GRADS = ("dq", "dk", "dv")
AXES = {"dq": ("B", "H", "Tq", "Dh"), "dk": ("B", "H", "Tk", "Dh"), "dv": ("B", "H", "Tk", "Dh")}
FLOAT64, ORDER, DQ_KEPT, D_PER_PAIR, SAVED, TILE_END, in_place = (
    getattr(mistakes.for_lesson(LESSON), n)
    for n in ("FLOAT64", "ORDER", "DQ_KEPT", "D_PER_PAIR", "SAVED", "TILE_END", "in_place")
)


BACKWARD_NAMES = ("q", "k", "v", "dout")  # attention_backward's tensor inputs
FORWARD_NAMES = ("q", "k", "v")
FLASH_BACKWARD_NAMES = ("q", "k", "v", "out", "lse", "dout")


def _torch_dtype(name):
    return getattr(torch, name)


def _send(a, name):
    """A numpy array as the tensor the student gets (bfloat16 rounded there)."""
    return tensor(a, "bfloat16") if name == "bfloat16" else tensor(a)


def _exact64(a, name):
    """The float64 values of the tensor the student gets (exact: every dtype's values are float64 values)."""
    return torch.from_numpy(np.asarray(a)).to(_torch_dtype(name)).double()


def _inputs(rng, b, h, tq, tk, dh, name, scale=2.0):
    """q, k, v, dout as numpy arrays (float32 for bfloat16: rounded when sent)."""
    dtype = np.float32 if name == "bfloat16" else np.dtype(name)
    q, k, v = qkv(rng, b, h, tq, tk, dh, dtype, scale)
    return q, k, v, rng.standard_normal((b, h, tq, dh)).astype(dtype)


# ---- inputs kept ---------------------------------------------------------------------------------


def _expect_kept(s, fn_name, what, names, *args, **kwargs):
    """fn_name(*args, **kwargs) leaves every numpy array among args (sent as tensors) as it was; the failure names
    those it changed (names: of every argument, by position). .to(dtype) returns the input itself in its own dtype,
    so a float64 or float32 call is where an in-place slip shows."""
    got, changed = changed_arguments(s, s.get(fn_name, "__call__"), *args, **kwargs)
    if changed:
        fail(f"{what}: {in_place([names[i] for i in changed])}")
    return got


@contextlib.contextmanager
def _in_place_first(s, fn_name, what, names, args, **kwargs):
    """A failure in the block names the inputs fn_name(*args, **kwargs) changes in place, where it changes any: a
    later tile then reads the changed values, and the differing values the failure names are only their effect.
    args None: not looked for (bfloat16 inputs, which the student gets rounded: kept ones differ from the arrays)."""
    try:
        yield
    except AssertionError:
        if args is not None:
            _expect_kept(s, fn_name, what, names, *args, **kwargs)
        raise


@contextlib.contextmanager
def _naming_tile_ends():
    """A size mismatch the student's tiled code raises names its likely cause: a tile's end past the last position
    (a mask built for block_k keys where the last tile holds fewer)."""
    try:
        yield
    except StudentError as e:
        if "must match the size of tensor" in e.raw_message:
            fail(f"your code raised {e.type}: {e.message}. Likely {TILE_END}")
        raise


# ---- gradients ---------------------------------------------------------------------------------


def _atol(want, name):
    return TOL[name] * (1 + float(np.abs(want.data).max(initial=0)))


def _as(array, dtype):
    return Array(array.kind, dtype, array.data, device=array.device)


def _expect_grads(got, want, what, name, mistaken=lambda: [], atols=None, precision=True):
    """got: the student's (dq, dk, dv); want: the exact three (reference(..., dtype=name)). Most specific first:
    a known mistake (mistaken(): [(message, (dq, dk, dv))]), the wrong order, float64 computed in float32,
    then each gradient on its own. atols: per gradient, where the contract's tolerance is not the right one.
    precision=False: float64 computed in float32 is not looked for (a long case, judged after "values" passed in
    float64, where gradients of ~1/Tk are all within float32 rounding of a wrong answer's)."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        fail(
            f"{what} should return three gradients (dq, dk, dv), but returned {kind_of(got)}"
            + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        )
    atols = atols or [_atol(w, name) for w in want]
    tol = [dict(rtol=1e-300, atol=a) for a in atols]
    if all(close(g, w, **t) for g, w, t in zip(got, want, tol)):
        return
    for message, wrong in mistaken():
        if all(close(g, x, **t) for g, x, t in zip(got, wrong, tol)):
            fail(f"{what}: {message}")
    shapes = [getattr(g, "shape", None) for g in got]
    if shapes != [w.shape for w in want] and sorted(map(str, shapes)) == sorted(str(w.shape) for w in want):
        fail(f"{what}: {ORDER}")
    if any(
        all(close(g, want[j], rtol=1e-300, atol=atols[j]) for g, j in zip(got, perm))  # dk and dv share a shape
        for perm in [(1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]
    ):
        fail(f"{what}: {ORDER}")
    if (
        precision
        and name == "float64"
        and all(isinstance(g, Array) and g.dtype == "float64" for g in got)
        and all(
            close(_as(g, "float32"), _as(w, "float32"), rtol=1e-300, atol=_atol(w, "float32"))
            for g, w in zip(got, want)
        )
    ):
        fail(f"{what}: {FLOAT64}")
    for g, w, a, grad in zip(got, want, atols, GRADS):
        expect_array(
            g,
            w,
            f"{grad} of {what}",
            rtol=1e-300,
            atol=a,
            axes=AXES[grad],
            nan_hint="a fully masked tile gives exp(-inf - lse) = 0, never NaN: subtract lse, not the tile's max",
        )


def _truth(q, k, v, dout, causal, name):
    """The exact gradients (float64), labelled with the dtype the student answers in."""
    got = ref.attention_backward(*(_exact64(a, name) for a in (q, k, v, dout)), causal)
    return [reference(g, dtype=name) for g in got]


def _mistaken(fn_name, q, k, v, dout, causal, name, *extra, forward=False):
    """[(message, (dq, dk, dv))] of the defined mistakes of fn_name on these inputs (as the student gets them);
    forward: fn_name takes (q, k, v, out, lse, dout)."""

    def run():
        args = [_exact64(a, name).to(_torch_dtype(name)) for a in (q, k, v, dout)]
        if forward:
            out, lse = ref.flash_attention_forward(*(a.double() for a in args[:3]), causal)
            args = [
                *args[:3],
                out.to(args[0].dtype),
                lse.to(torch.promote_types(args[0].dtype, torch.float32)),
                args[3],
            ]
        return [
            (m.message, reference(tuple(got)))
            for m, got in mistakes.on(LESSON, fn_name, *args, causal, *extra, fresh=True)
            if isinstance(got, tuple) and len(got) == 3
        ]

    return run


# ---- attention_backward ------------------------------------------------------------------------


@CHECKS.add(
    "attention_backward", aspects={"values": 3, "causal": 2, "half precision": 1, "by hand": 2, "inputs kept": 1}
)
def attention_backward(s):
    rng = s.rng
    # (aspect, dtype, (B, H, Tq, Tk, Dh), causal, scale of q and k)
    cases = [
        ("values", "float64", (2, 3, 7, 11, 8), False, 2.0),
        ("values", "float32", (2, 2, 13, 6, 16), False, 3.0),
        ("values", "float64", (1, 2, 9, 9, 4), False, 1.0),
        ("causal", "float64", (2, 2, 5, 12, 8), True, 2.0),
        ("causal", "float32", (2, 3, 10, 10, 8), True, 2.0),
        ("causal", "float64", (1, 2, 1, 9, 4), True, 2.0),
        ("half precision", "float16", (2, 2, 9, 14, 16), True, 1.5),
        ("half precision", "bfloat16", (2, 2, 8, 8, 8), False, 1.0),
    ]
    for aspect, name, (b, h, tq, tk, dh), causal, scale in cases:
        with s.aspect(aspect):
            q, k, v, dout = _inputs(rng, b, h, tq, tk, dh, name, scale)
            got = s.call("attention_backward", *(_send(a, name) for a in (q, k, v, dout)), causal=causal)
            what = f"attention_backward(q, k, v, dout, causal={causal}) in {name}"
            with _in_place_first(
                s, "attention_backward", what, BACKWARD_NAMES, None if name == "bfloat16" else [q, k, v, dout, causal]
            ):
                _expect_grads(
                    got,
                    _truth(q, k, v, dout, causal, name),
                    what,
                    name,
                    _mistaken("attention_backward", q, k, v, dout, causal, name),
                )
    # "by hand" runs with autograd and PyTorch's attention kernels off (lessons/09_flash_backward/lesson.toml), on
    # inputs drawn from a seed no source shows: a table of their gradients worked out beforehand with autograd misses
    # them
    hidden = np.random.default_rng(unseen_seed(rng))
    with s.aspect("by hand"):
        for causal in (False, True):
            q, k, v, dout = _inputs(hidden, 2, 2, 6, 10, 8, "float64", 2.0)
            got = s.call("attention_backward", *(_send(a, "float64") for a in (q, k, v, dout)), causal=causal)
            _expect_grads(
                got,
                _truth(q, k, v, dout, causal, "float64"),
                f"attention_backward(q, k, v, dout, causal={causal}) in float64",
                "float64",
            )
    with s.aspect("inputs kept"):
        for name, causal in (("float64", False), ("float32", True)):
            q, k, v, dout = _inputs(rng, 2, 2, 6, 9, 8, name)
            what = f"attention_backward(q, k, v, dout, causal={causal}) in {name}"
            _expect_kept(s, "attention_backward", what, BACKWARD_NAMES, q, k, v, dout, causal)


# ---- flash_attention_forward -------------------------------------------------------------------


def _exact_lse(q, k, causal, rows=None):
    """The row logsumexp of the scaled scores (float64) of the given query rows (all when None)."""
    q64, k64 = (torch.from_numpy(a).double() for a in (q, k))
    tq, tk = q.shape[2], k.shape[2]
    rows = torch.arange(tq) if rows is None else torch.from_numpy(np.asarray(rows))
    scores = q64[:, :, rows] @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.arange(tk)[None, :] > rows[:, None] + (tk - tq), float("-inf"))
    return scores.logsumexp(-1), scores.abs().amax().item()


def _lse_atol(lse, largest, name, tk, dh):
    """How far lse may be from the exact one: float64 or float32 arithmetic over tk exponentials whose
    arguments (scores of dh products, up to `largest`) are rounded."""
    unit = UNIT["float64" if name == "float64" else "float32"]
    return unit * (tk + 8 + (dh + 4) * largest + float(lse.abs().max()))


def _expect_lse(got, want, largest, what, name, tk, dh, mistaken, slips=None):
    """lse: float32 for half inputs, else the inputs' dtype; shape exactly (B, H, Tq). slips: a list that gets
    another float dtype of lse (float64 for float32 inputs), which is then judged by its values: a dtype slip
    costs the aspect "lse dtype" alone."""
    lse_name = "float64" if name == "float64" else "float32"
    if slips is not None and isinstance(got, Array) and got.dtype in ("float32", "float64") and got.dtype != lse_name:
        slips.append(
            f"lse is {got.dtype} for {name} inputs: it is in the inputs' dtype, {lse_name} here (and float32 "
            "for float16 or bfloat16 inputs)"
        )
        got = Array(got.kind, lse_name, got.data.astype(lse_name), device=got.device)
    if isinstance(got, Array) and name == "float16" and got.dtype == "float16":
        fail(
            f"{what}: lse is float16 for float16 inputs: keep it in float32 (the dtype you compute in): "
            "float16 has 3 decimal digits, and P = exp(s - lse) needs more"
        )
    if isinstance(got, Array) and got.shape == (*want.shape, 1):
        fail(f"{what}: lse has shape {got.shape}, but should have shape {tuple(want.shape)}: squeeze its last axis")
    expect_array(
        got,
        reference(want, dtype=lse_name),
        f"lse of {what}",
        mistakes=mistaken,
        rtol=1e-300,
        atol=_lse_atol(want, largest, name, tk, dh),
        axes=("B", "H", "Tq"),
        hint="lse[b, h, i] = m + log(l), the natural log of the sum of exp(s) over the keys row i may see",
    )


def _forward_mistakes(q, k, v, causal, blocks, name, part=1):
    """[(message, lse)] (part 0: out) of the defined mistakes of flash_attention_forward on these inputs."""

    def run():
        args = [torch.from_numpy(a) for a in (q, k, v)]
        return [
            (m.message, reference(got[part]))
            for m, got in mistakes.on(LESSON, "flash_attention_forward", *args, causal, *blocks, fresh=True)
            if isinstance(got, tuple) and len(got) == 2
        ]

    return run


def _expect_pair(got, what):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(
            f"{what} should return a pair (out, lse), but returned {kind_of(got)}"
            + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        )
    return got


def _expect_forward_tiled(s, rng):
    """flash_attention_forward within lesson 06's bound: its tiles fit, nothing spanning every key does."""
    lse_hint = ", and take lse = m + log(l) from the running max and sum, not torch.logsumexp of a whole row"
    for causal, q, tk, answer, rows, want, want_lse, cond in tiled_judged(s, rng, "flash_attention_forward", lse_hint):
        what = f"flash_attention_forward(causal={causal}) with {tk} keys"
        out, lse = _expect_pair(answer, what)
        name = str(q.dtype).split(".")[-1]
        expect_attention(rows_of(out, rows), reference(want, dtype=name), what, lambda: [], len(rows), [], cond)
        if isinstance(lse, Array) and lse.data.ndim == 3 and lse.shape[2] == q.size(2):
            lse = Array(lse.kind, lse.dtype, lse.data[:, :, rows.numpy()], device=lse.device)
        _expect_lse(lse, want_lse, cond * 16, what, name, tk, q.size(3), [])


def _large_scores(rng, b, h, tq, tk, dh):
    """float32 q, k, v whose even query rows score in the hundreds and odd ones near 1: exp of a score overflows
    (exp(89) is inf in float32), and one shift for rows of both kinds underflows the small ones to 0."""
    q, k, v = qkv(rng, b, h, tq, tk, dh, np.float32, 1.0)
    q[:, :, ::2] *= 100
    return q, k, v


@CHECKS.add(
    "flash_attention_forward",
    aspects={"values": 3, "causal": 1, "large scores": 1, "inputs kept": 1, "float16": 1, "lse dtype": 1, "tiled": 2},
    memory_bound=True,
)
def flash_attention_forward(s):
    rng = s.rng
    slips = []  # lse in another float dtype: judged by its values, costing "lse dtype" only
    # (aspect, dtype, (B, H, Tq, Tk, Dh), causal, block_q, block_k (None: the defaults), scale, blocks by position)
    cases = [
        ("values", np.float64, (2, 3, 37, 53, 8), False, 16, 16, 3.0, False),
        ("values", np.float32, (2, 2, 45, 20, 8), False, 16, 8, 10.0, True),
        ("values", np.float32, (2, 2, 70, 100, 8), False, None, None, 3.0, False),
        ("causal", np.float64, (2, 2, 29, 45, 16), True, 8, 12, 2.0, True),
        ("causal", np.float32, (2, 3, 150, 150, 8), True, None, None, 2.0, False),
        ("causal", np.float32, (2, 2, 1, 77, 16), True, 16, 32, 2.0, False),
        # a query tile's last visible key is the first of a key tile: key 31 for queries 16..31, and key 64
        # for query 64 with the default blocks
        ("causal", np.float32, (1, 2, 100, 100, 8), True, 16, 31, 2.0, False),
        ("causal", np.float32, (1, 2, 65, 65, 8), True, None, None, 2.0, False),
        ("large scores", np.float32, (2, 2, 33, 40, 8), False, 16, 16, None, False),
        ("float16", np.float16, (2, 2, 40, 70, 16), True, 16, 32, 1.5, False),
        ("float16", np.float16, (2, 3, 64, 64, 32), False, 32, 32, 1.0, True),
    ]
    for aspect, dtype, (b, h, tq, tk, dh), causal, bq, bk, scale, positional in cases:
        with s.aspect(aspect), _naming_tile_ends():
            name = np.dtype(dtype).name
            q, k, v = qkv(rng, b, h, tq, tk, dh, dtype, scale) if scale else _large_scores(rng, b, h, tq, tk, dh)
            blocks = () if bq is None else (bq, bk)
            args, kwargs = (
                ((causal, *blocks), {})
                if positional
                else ((), dict(causal=causal, **(dict(block_q=bq, block_k=bk) if blocks else {})))
            )
            what = (
                f"flash_attention_forward(q, k, v, causal={causal}{', block_q, block_k' if blocks else ''}) in {name}"
            )
            out, lse = _expect_pair(
                s.call("flash_attention_forward", tensor(q), tensor(k), tensor(v), *args, **kwargs), what
            )
            bq, bk = bq or 64, bk or 64
            want, cond = exact_attention(q, k, v, causal, dtype)
            mistaken = lambda: (
                attention_mistakes(q, k, v, causal, [bk], getattr(torch, name))
                + _forward_mistakes(q, k, v, causal, (bq, bk), name, part=0)()
            )
            want_lse, largest = _exact_lse(q, k, causal)
            lse_mistaken = _forward_mistakes(q, k, v, causal, (bq, bk), name)
            with _in_place_first(s, "flash_attention_forward", what, FORWARD_NAMES, [q, k, v, *args], **kwargs):
                if aspect == "large scores":  # lse first: it names the slip (an overflow, one shift) out's NaN hides
                    _expect_lse(lse, want_lse, largest, what, name, tk, dh, lse_mistaken, slips)
                expect_attention(out, want, what, mistaken, tq, [bq], cond)
                _expect_lse(lse, want_lse, largest, what, name, tk, dh, lse_mistaken, slips)
    with s.aspect("inputs kept"):
        for dtype in (np.float32, np.float64):
            q, k, v = qkv(rng, 2, 2, 24, 32, 8, dtype)  # whole tiles: a slip at a tail is not this aspect's
            what = f"flash_attention_forward(q, k, v, causal=True) in {np.dtype(dtype).name}"
            _expect_kept(s, "flash_attention_forward", what, FORWARD_NAMES, q, k, v, True, 8, 8)
    with s.aspect("lse dtype"):
        if slips:
            fail(slips[0])
    with s.aspect("tiled"), _naming_tile_ends():
        _expect_forward_tiled(s, rng)


# ---- flash_attention_backward ------------------------------------------------------------------

BIG_TILE = 2**18  # the entries of a tile in the grader's own float64 passes over the large cases


def _big_blocks(tq, tk):
    """(block_q, block_k) of the grader's own passes: tiles of about BIG_TILE entries, whatever the lengths' shape."""
    bk = min(tk, BIG_TILE)
    return max(1, BIG_TILE // bk), bk


def _grad_atol(q64, k64, v64, out64, lse64, do64, causal, forward_length=0, name="float32"):
    """How far a float32 (dq, dk, dv) may be from the exact one, per gradient: a first-order bound on the rounding
    of every product and sum. Each dS_ij carries the rounding of its score (Dh products), of exp(s - lse), of dP_ij
    and D_i (Dh products each); dQ sums Tk terms dS_ij k_j, dK and dV sum Tq terms, each sum adding its length in
    units of roundoff times the sum of its terms' magnitudes. In any summation order; twice that, for safety.
    forward_length: out and lse are the exact ones, but the student's own float32 forward gave its backward theirs,
    sums over that many keys: lse is then off by up to that many units of roundoff, and out by that many times
    the largest value."""
    u, scale = UNIT[name], 1 / math.sqrt(q64.size(-1))
    tq, tk, dh = q64.size(2), k64.size(2), q64.size(3)
    forward = (forward_length + 8) * u if forward_length else 0.0
    d = (do64 * out64).sum(-1, keepdim=True)
    big_q, big_k = _big_blocks(tq, tk)
    # D's error: its Dh products and sum, and out's own error (up to forward times the largest value)
    e_d = u * (dh + 2) * (do64 * out64).abs().sum(-1, keepdim=True) + forward * do64.abs().sum(
        -1, keepdim=True
    ) * float(v64.abs().max())
    sizes = [torch.zeros_like(t) for t in (q64, k64, k64, q64, k64, k64)]  # |terms| and their errors, per gradient
    for ks in range(0, tk, big_k):
        cols = slice(ks, ks + big_k)
        kb, vb = k64[:, :, cols], v64[:, :, cols]
        for qs in range(0, tq, big_q):
            rows = slice(qs, qs + big_q)
            qb, dob, lb, db = q64[:, :, rows], do64[:, :, rows], lse64[:, :, rows, None], d[:, :, rows]
            sc = qb @ kb.transpose(-2, -1) * scale
            if causal:
                last = torch.arange(qs, qs + qb.size(2))[:, None] + tk - tq
                sc = sc.masked_fill(torch.arange(ks, ks + kb.size(2)) > last, float("-inf"))
            p = torch.exp(sc - lb)
            dp = dob @ vb.transpose(-2, -1)
            ds = p * (dp - db)
            e_p = p * (u * ((dh + 2) * (qb.abs() @ kb.abs().transpose(-2, -1)) * scale + lb.abs() + 4) + forward)
            e_ds = (
                e_p * (dp - db).abs()
                + 2 * u * ds.abs()
                + p * (u * (dh + 2) * (dob.abs() @ vb.abs().transpose(-2, -1)) + e_d[:, :, rows])
            )
            sizes[0][:, :, rows] += ds.abs() @ kb.abs() * scale
            sizes[3][:, :, rows] += e_ds @ kb.abs() * scale
            sizes[1][:, :, cols] += ds.abs().transpose(-2, -1) @ qb.abs() * scale
            sizes[4][:, :, cols] += e_ds.transpose(-2, -1) @ qb.abs() * scale
            sizes[2][:, :, cols] += p.transpose(-2, -1) @ dob.abs()
            sizes[5][:, :, cols] += e_p.transpose(-2, -1) @ dob.abs()
    return [2 * float(((n + 4) * u * sizes[i] + sizes[i + 3]).max()) + 1e-7 for i, n in enumerate((tk, tq, tq))]


SUFFIX = 64  # the last queries (for dq) and keys (for dk, dv) whose gradients a long case compares


def _long_truth(arrays, causal, forward_length=0, compare_dq=True):
    """What _expect_long_grads compares a long case's gradients with: (the dtype asked in, the full gradients' shapes,
    the suffixes' rows and columns, the exact gradients of the last SUFFIX queries (dq) and keys (dk, dv), their
    tolerances). Given lse and out, query i's dq depends on row i alone and key j's dk and dv on column j alone; a
    suffix keeps the bottom-right causal alignment (Tk - Tq is that of the suffix problem), so the reference answers
    the suffix problems themselves, with tolerances derived from the length of their sums (_grad_atol).
    compare_dq=False: dq is left to other cases (a few queries against millions of keys: its reference and bound
    would cost a pass over them all); its place holds q's rows, for _expect_long_grads."""
    name = "float64" if str(arrays[0].dtype).endswith("float64") else "float32"
    q64, k64, v64, out64, lse64, do64 = _as64(*arrays)  # exactly what the student was given
    tq, tk = q64.size(2), k64.size(2)
    rows, cols = slice(tq - min(SUFFIX, tq), tq), slice(tk - min(SUFFIX, tk), tk)
    queries = (q64[:, :, rows], k64, v64, out64[:, :, rows], lse64[:, :, rows], do64[:, :, rows])
    keys = (q64, k64[:, :, cols], v64[:, :, cols], out64, lse64, do64)
    if compare_dq:
        want = [ref.flash_attention_backward(*queries, causal, *_big_blocks(rows.stop - rows.start, tk))[0]]
        atols = [_grad_atol(*queries, causal, forward_length, name)[0]]
    else:
        want, atols = [q64[:, :, rows]], [0.0]
    want += ref.flash_attention_backward(*keys, causal, *_big_blocks(tq, cols.stop - cols.start))[1:]
    atols += _grad_atol(*keys, causal, forward_length, name)[1:]
    shapes = [tuple(t.shape) for t in (q64, k64, v64)]
    return name, shapes, rows, cols, [reference(g, dtype=name) for g in want], atols, compare_dq


def _expect_long_grads(got, truth, what, shapes=None):
    """A long case's gradients, compared for its last SUFFIX queries (dq) and keys (dk, dv) only, with truth
    (_long_truth). shapes: got is already cut to the suffixes (helpers.drawn_calls), and these are the full
    gradients' shapes."""
    name, full, rows, cols, want, atols, compare_dq = truth
    if isinstance(got, (tuple, list)) and len(got) == 3:
        for g, full_shape, grad, shape in zip(got, full, GRADS, shapes or [None] * 3):
            shape = tuple(shape) if shape else g.shape if isinstance(g, Array) else None
            if shape is not None and shape != full_shape:
                fail(f"{grad} of {what} has shape {shape}, but should have shape {full_shape}")
        if shapes is None:
            got = [
                Array(g.kind, g.dtype, g.data[:, :, part], device=g.device) if isinstance(g, Array) else g
                for g, part in zip(got, (rows, cols, cols))
            ]
    if not compare_dq and isinstance(got[0], Array):  # dq compared with itself
        want = [reference(torch.as_tensor(got[0].data), dtype=name), *want[1:]]
    _expect_grads(got, want, what + " (its last queries and keys)", name, atols=atols, precision=False)


def _big_inputs(rng, tq, tk, dh):
    """Float32 q, k, v, dout as numpy arrays (1, 1, T, dh)."""
    return _inputs(rng, 1, 1, tq, tk, dh, "float32")


def _as64(*arrays):
    return [torch.as_tensor(a).double() for a in arrays]


# "tiled", as the forward's (gpu.TILED_MB): the grader's block sizes are smaller than both lengths, and the cases so
# long that scores spanning every key or every query for any chunk of queries worth tiling do not fit, in one bound:
# - ROW, causal: 64 queries against 2**19 keys, where the scores of 8 query rows against every key take 32 MiB, and a
#   chunk computing dS holds at least two such tensors (P and dP), more than BACKWARD_MB;
# - COLUMN: 2**16 queries against 165 keys, where a (Tq, block_k) column of scores (FlashAttention-2's outer loop over
#   key tiles with every query inside) takes 64 MiB;
# - MASK, causal: 8229 queries and keys, whose (Tq, Tk) boolean mask takes 64 MiB.
# The inputs are float64 with Dh = 1, drawn in the student's process (helpers.drawn_calls); they and the gradients an
# honest answer returns (dk and dv of the row case, 4 MiB each) count on top of BACKWARD_MB, which bounds the answer's
# working memory alone: its tiles (16 x 2**13, 2**11 x 128, 256 x 512: 0.5 to 2 MiB), D and dq, and the gradients built
# per tile and concatenated (dk and dv held twice: 8 MiB more, any tensor up to B*H*Tk*Dh is the contract's), within the
# three quarters of the bound that tests/harness/checks.py holds every correct answer to, with the 8 MiB an honest
# process holds before the block. With Dh = 1 a single query row of scores is no larger than dk, so code that takes one
# query row against all keys at a time cannot be told from an honest concatenation by memory: it is not caught here.
# A notebook holding more than an honest fresh one when the block begins gets what it holds on top, up to HEADROOM_MB:
# then each case's short side grows until its full matrix is larger than all that (evidence_times).
BACKWARD_MB = 40
BACKWARD_ROW = dict(tq=64, bq=16, tk=2**19 + 77, bk=2**13)
BACKWARD_CHUNK = 8  # query rows against every key that the row case's message names
BACKWARD_COLUMN = dict(tq=2**16 + 33, bq=2**11, tk=165, bk=128)
BACKWARD_MASK = dict(tq=8229, bq=256, tk=8229, bk=512)
BACKWARD_MESSAGE = (
    "flash_attention_backward{causal} ran out of memory with {tq} queries and {tk} keys in tiles of "
    "{bq} x {bk}: it may never hold more than block_q x block_k scores or probabilities at once, "
    "whatever chunk of queries (here {mb} MiB of {what}): not the full matrix, not a (block_q, Tk) row, "
    "not a chunk of query rows against all keys, not a (Tq, block_k) column, not a full causal mask. "
    "Loop over key tiles of the block sizes you are given, and inside over query tiles, and recompute "
    "each tile's P = exp(s - lse)"
)
ROW_WHAT = f"the scores of {BACKWARD_CHUNK} query rows against every key"


def _drawn_specs(tq, tk, dtype="float64"):
    """helpers.draw specs of q, k, v (gpu.long_specs) and dout (1, 1, tq, 1)."""
    return [*long_specs(tq, tk, dtype), ((1, 1, tq, 1), 1.0, dtype)]


def _suffix(n):
    return list(range(n - min(SUFFIX, n), n))


# q, k, v, dout and the gradients (twice the inputs' keys) of the row case, on top of BACKWARD_MB
BACKWARD_INPUTS_MB = 2 * drawn_mb(_drawn_specs(0, BACKWARD_ROW["tk"]))


def _backward_cases(s):
    """[(what it catches, its MiB, specs of q, k, v, dout, causals, (block_q, block_k), picks)] of the tiled evidence,
    each grown with what the process held when the block began (evidence_times)."""
    cases = []
    for case, causals, what in (
        (BACKWARD_ROW, (True,), ROW_WHAT),
        (BACKWARD_COLUMN, (False,), "a column of scores"),
        (BACKWARD_MASK, (True,), "a causal mask"),
    ):
        tq, bq, tk, bk = (case[key] for key in ("tq", "bq", "tk", "bk"))
        times = evidence_times(s, BACKWARD_MB, tq * tk * 8 >> 20)
        tk, tq = (tk * times, tq) if tq > tk else (tk, tq * times)  # the short side grows
        mb = tq * bk * 8 if tq > tk else tq * tk if tq == tk else BACKWARD_CHUNK * tk * 8
        # the mask case in float32, which costs half: its inputs are small (a float64 answer's copies of them too)
        specs = _drawn_specs(tq, tk, "float32" if case is BACKWARD_MASK else "float64")
        cases.append((what, mb >> 20, specs, causals, (bq, bk), [_suffix(tq), _suffix(tk), _suffix(tk)]))
    return cases


# One case at each size "tiled" grades, for check_submission.py to time against the limit on a call: the row case
# (out and lse arbitrary: the time does not depend on them)
TIMED = {
    "flash_attention_forward": TIMED_LONG,
    "flash_attention_backward": {
        "tensors": [
            *long_specs(BACKWARD_ROW["tq"], BACKWARD_ROW["tk"]),
            ((1, 1, BACKWARD_ROW["tq"], 1), 1.0),
            ((1, 1, BACKWARD_ROW["tq"]), 0.0),
            ((1, 1, BACKWARD_ROW["tq"], 1), 1.0),
        ],
        "args": [True, BACKWARD_ROW["bq"], BACKWARD_ROW["bk"]],
    },
}


def _backward_plan(s, seed, held=None):
    """(cases, specs, the drawn calls, [(causal, the arrays each call is given)]) of the tiled evidence for a process
    holding what `held` (s unless given) says it holds, the grader's side of them (the drawn inputs, and out and lse
    from them) made here, once a run: the seed is the run's (unseen_seed)."""
    cases = _backward_cases(held or s)
    return s.once_per_run(
        ("flash_attention_backward tiled", seed, repr(cases)), lambda: _make_backward_plan(cases, seed)
    )


def _make_backward_plan(cases, seed):
    specs = [spec for *_, case_specs, _, _, _ in cases for spec in case_specs]
    drawn = helpers.draw(seed, specs)
    calls, judged = [], []
    for i, (_, _, _, causals, (bq, bk), picks) in enumerate(cases):
        q, k, v, dout = drawn[4 * i : 4 * i + 4]
        for causal in causals:
            # the forward's out and lse, as a student's forward gives them: sent, small (the long side is drawn)
            out, lse = ref.flash_attention_forward(q, k, v, causal, *_big_blocks(q.size(2), k.size(2)))
            # the row case's gradients take what its inputs do: the other calls have that much mapped
            calls.append(
                {
                    "args": [
                        {"drawn": 4 * i},
                        {"drawn": 4 * i + 1},
                        {"drawn": 4 * i + 2},
                        tensor(out.numpy()),
                        tensor(lse.numpy()),
                        {"drawn": 4 * i + 3},
                        causal,
                        bq,
                        bk,
                    ],
                    "picks": picks,
                    "ballast_mb": 0 if i == 0 else BACKWARD_INPUTS_MB // 2,
                }
            )
            judged.append((causal, (q, k, v, out, lse, dout)))
    return cases, specs, calls, judged


def _expect_backward_tiled(s, rng):
    first = BACKWARD_MESSAGE.format(
        causal="", what=ROW_WHAT, mb=BACKWARD_CHUNK * BACKWARD_ROW["tk"] * 8 >> 20, **BACKWARD_ROW
    )
    seed = unseen_seed(rng)
    # Made before the bound, for a process that holds no more than an honest fresh one: in-process (the notebook's own
    # hidden test) the grader's side counts against the bound too. One that holds more grows the cases: made again.
    plan = _backward_plan(s, seed, SimpleNamespace(held_mb=0))
    with within_memory(s, BACKWARD_MB, first, HEADROOM_MB, BACKWARD_INPUTS_MB) as reword:
        if _backward_cases(s) != plan[0]:
            plan = None
            plan = _backward_plan(s, seed)
        cases, specs, calls, judged = plan
        reword(
            BACKWARD_MESSAGE.format(
                causal="",
                what=" or ".join(case[0] for case in cases),
                mb=min(case[1] for case in cases),
                **BACKWARD_ROW,
            )
        )
        got = s.helper("drawn_calls", s.get("flash_attention_backward", "__call__"), seed, specs, calls)
    # after the block: in-process (the notebook's own hidden test) the grader's side counts against the bound
    truths = s.once_per_run(
        ("flash_attention_backward tiled truth", seed, repr(cases)),
        lambda: [_long_truth(arrays, causal, compare_dq=arrays[1].size(2) <= BIG_TILE) for causal, arrays in judged],
    )
    for (causal, arrays), truth, (answer, shapes) in zip(judged, truths, got):
        tq, tk = arrays[0].size(2), arrays[1].size(2)
        what = f"flash_attention_backward(causal={causal}) with {tq} queries and {tk} keys"
        _expect_long_grads(answer, truth, what, shapes=shapes)


_METADATA = {"dtype", "device", "shape", "size", "ndim", "dim", "is_cuda"}  # reading these reads no values


def _reads(node, name, loops=(), guarded=False):
    """(enclosing loops, under an if within the innermost) of every read of `name`'s values in node (out.dtype
    aside), nested functions aside."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Attribute) and child.attr in _METADATA and isinstance(child.value, ast.Name):
            continue
        if isinstance(child, ast.Name) and child.id == name and isinstance(child.ctx, ast.Load):
            yield loops, guarded
        elif isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
            yield from _reads(child, name, (*loops, child), False)
        elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _reads(child, name, loops, guarded or isinstance(child, ast.If))


def d_per_pair(sources):
    """Whether flash_attention_backward, as the cells define it, reads `out` (its fourth parameter) for every pair
    of tiles: in a loop nested in another, with no loop inside it and no `if` around the read (a cache filled once
    per query tile). D = rowsum(dout * out) is what it reads out for, and the contract computes it up front or once
    per query tile. The cells are parsed here, in the grader's process: evidence the student's code cannot reach."""
    loop = (ast.For, ast.AsyncFor, ast.While)
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, RecursionError, MemoryError, ValueError):  # unparseable, or nested past the stack
            continue
        try:
            if any(_reads_out_per_pair(fn, loop) for fn in tree.body):
                return True
        except RecursionError:  # a body nested past the stack: not read, never held against the answer
            continue
    return False


def _reads_out_per_pair(fn, loop):
    """d_per_pair for one top-level statement of a cell."""
    if isinstance(fn, ast.FunctionDef) and fn.name == "flash_attention_backward" and len(fn.args.args) > 3:
        for name in _aliases(fn, fn.args.args[3].arg):
            for loops, guarded in _reads(fn, name):
                if (
                    len(loops) >= 2
                    and not guarded
                    and not any(isinstance(n, loop) for n in ast.walk(loops[-1]) if n is not loops[-1])
                ):
                    return True
    return False


# methods whose result holds the values of the tensor they are called on: a cast, a copy or a view of it
_SAME_VALUES = {"to", "float", "double", "half", "bfloat16", "type", "type_as", "clone", "detach", "contiguous", "cpu"}
_SAME_VALUES |= {"cuda", "view", "view_as", "reshape", "squeeze", "unsqueeze", "flatten", "transpose", "permute"}


def _aliases(fn, name):
    """name and the names fn binds to it through casts, copies and views alone (o = out.to(work), out.float()): the
    same values under another name. D = out.to(work).mul_(dout).sum(-1) is no such name: a product reduced."""
    found = {name}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            while (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in _SAME_VALUES
            ):
                value = value.func.value
            if isinstance(value, ast.Name) and value.id == name:
                found.add(node.targets[0].id)
    return found


@CHECKS.add(
    "flash_attention_backward",
    aspects={"values": 3, "causal": 1, "half precision": 1, "D once": 1, "inputs kept": 1, "tiled": 3},
    memory_bound=True,
)
def flash_attention_backward(s):
    rng = s.rng
    # (aspect, dtype, (B, H, Tq, Tk, Dh), causal, block_q, block_k (None: the defaults), scale, blocks by position)
    cases = [
        ("values", "float64", (2, 3, 37, 53, 8), False, 16, 16, 2.0, False),
        ("values", "float32", (2, 2, 45, 20, 8), False, 16, 8, 3.0, True),
        ("values", "float32", (2, 2, 70, 100, 8), False, None, None, 2.0, False),
        ("causal", "float64", (2, 2, 29, 45, 16), True, 8, 12, 2.0, True),
        ("causal", "float32", (2, 3, 150, 150, 8), True, None, None, 2.0, False),
        ("causal", "float64", (2, 2, 1, 77, 16), True, 16, 32, 2.0, False),
        ("half precision", "float16", (2, 2, 40, 70, 16), True, 16, 32, 1.5, False),
        ("half precision", "bfloat16", (2, 3, 64, 64, 32), False, 32, 32, 1.0, True),
    ]
    for aspect, name, (b, h, tq, tk, dh), causal, bq, bk, scale, positional in cases:
        with s.aspect(aspect), _naming_tile_ends():
            q, k, v, dout = _inputs(rng, b, h, tq, tk, dh, name, scale)
            q64, k64, v64 = (_exact64(a, name) for a in (q, k, v))
            out64, lse64 = ref.flash_attention_forward(q64, k64, v64, causal)
            out = out64.to(_torch_dtype(name))  # the correct forward's results, as the student's forward gives them
            lse = lse64.to(torch.promote_types(_torch_dtype(name), torch.float32))
            sent = [_send(q, name), _send(k, name), _send(v, name), reference(out), reference(lse), _send(dout, name)]
            blocks = () if bq is None else (bq, bk)
            args, kwargs = (
                ((causal, *blocks), {})
                if positional
                else ((), dict(causal=causal, **(dict(block_q=bq, block_k=bk) if blocks else {})))
            )
            got = s.call("flash_attention_backward", *sent, *args, **kwargs)
            what = (
                f"flash_attention_backward(q, k, v, out, lse, dout, causal={causal}"
                f"{', block_q, block_k' if blocks else ''}) in {name}"
            )
            given = None if name == "bfloat16" else [q, k, v, out.numpy(), lse.numpy(), dout, *args]
            with _in_place_first(s, "flash_attention_backward", what, FLASH_BACKWARD_NAMES, given, **kwargs):
                _expect_grads(
                    got,
                    _truth(q, k, v, dout, causal, name),
                    what,
                    name,
                    _mistaken(
                        "flash_attention_backward", q, k, v, dout, causal, name, bq or 64, bk or 64, forward=True
                    ),
                )
            if (aspect, name) == ("values", "float64"):  # the same call again gives the same gradients
                again = s.call("flash_attention_backward", *sent, *args, **kwargs)
                if not (
                    isinstance(again, (tuple, list))
                    and len(again) == 3
                    and all(close(a, g, rtol=1e-300, atol=0) for a, g in zip(again, got))
                ):
                    fail(f"{what}: {DQ_KEPT}")
    with s.aspect("D once"):
        if d_per_pair(s.readable_sources()):
            fail(D_PER_PAIR)
    with s.aspect("tiled"), _naming_tile_ends():
        _expect_backward_tiled(s, rng)
    with s.aspect("inputs kept"):
        for name, causal in (("float64", False), ("float32", True)):
            q, k, v, dout = _inputs(rng, 2, 2, 24, 32, 8, name)  # whole tiles: a slip at a tail is not this aspect's
            out, lse = (
                t.numpy() for t in ref.flash_attention_forward(*(torch.from_numpy(a) for a in (q, k, v)), causal)
            )
            what = f"flash_attention_backward(q, k, v, out, lse, dout, causal={causal}, 8, 8) in {name}"
            _expect_kept(
                s, "flash_attention_backward", what, FLASH_BACKWARD_NAMES, q, k, v, out, lse, dout, causal, 8, 8
            )


# ---- FlashAttention ----------------------------------------------------------------------------

NONE_FOR_CAUSAL = "backward must return one gradient per input of forward: (dq, dk, dv, None), None for the flag causal"
OUT_ONLY = (
    "FlashAttention.apply(q, k, v, causal) should return out alone, not the tuple (out, lse): keep lse for "
    "the backward with ctx.save_for_backward"
)


def _function_run(s, q, k, v, dout, causal):
    """(out, (dq, dk, dv)): the student's FlashAttention.apply, then autograd's backward from it (helpers.Graph)."""
    apply = s.get("FlashAttention", "apply")
    graph = s.helper("Graph", apply, tensor(q), tensor(k), tensor(v), causal)
    out = s.get(graph, "out")
    if isinstance(out, (tuple, list)):
        fail(OUT_ONLY)
    try:
        grads = s.call((graph, "backward"), tensor(dout))
    except StudentError as e:
        if "incorrect number of gradients" in e.raw_message:
            fail(f"FlashAttention's {NONE_FOR_CAUSAL}")
        if "invalid gradient at index" in e.raw_message:
            fail(f"FlashAttention's backward: {ORDER} (autograd found a gradient of the wrong shape)")
        raise
    return out, grads


def _function_mistakes(q, k, v, dout, causal):
    """[(message, (dq, dk, dv))] of the defined mistakes of FlashAttention, run here."""

    def run():
        out = []
        for mistake, cls in mistakes.defined(LESSON, "FlashAttention"):
            leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
            try:
                with torch.enable_grad():
                    cls.apply(*leaves, causal).backward(torch.from_numpy(dout))
            except Exception:  # noqa: BLE001 - a mistake that cannot run here is not what the student's did
                continue
            out.append((mistake.message, reference(tuple(t.grad for t in leaves))))
        return out

    return run


def _expect_function(s, rng, name, shape, causal):
    q, k, v, dout = _inputs(rng, *shape, name)
    out, grads = _function_run(s, q, k, v, dout, causal)
    what = f"FlashAttention.apply(q, k, v, causal={causal}) in {name}"
    want, cond = exact_attention(q, k, v, causal, np.dtype(name))
    ignored = (
        [
            (
                "causal is not passed on: forward must give it to flash_attention_forward",
                exact_attention(q, k, v, False, np.dtype(name))[0],
            )
        ]
        if causal
        else []
    )
    expect_attention(out, want, what, lambda: ignored, shape[2], [], cond)
    _expect_grads(
        grads,
        _truth(q, k, v, dout, causal, name),
        f"the gradients of {what}",
        name,
        _function_mistakes(q, k, v, dout, causal),
    )


# With correct tiled forward and backward, a Function holds O(T) between them: q, k, v, out, lse (64 KiB each
# here). The probabilities P of 4096 queries and keys take 64 MiB in float32, well above FUNCTION_MB; a notebook
# holding more than an honest fresh one when the block begins grows T until P is larger than all it may hold.
FUNCTION_MB, FUNCTION_T, FUNCTION_DH = 28, 4096, 4
FUNCTION_STEP = 512  # T grows in steps of the stand-ins' tiles (stand_ins.MIN_TILE)
FUNCTION_MESSAGE = (
    "FlashAttention ran out of memory with {t} queries and keys: between its forward and its backward "
    "it may keep only O(T) memory, q, k, v, out and lse (ctx.save_for_backward), never the (Tq, Tk) "
    "probabilities P ({mb} MiB here): not in saved_tensors, not as an attribute of ctx, not in a "
    "global, and not recomputed whole in the backward; flash_attention_backward recomputes them tile "
    "by tile from lse"
)


def _expect_never_keeps_p(s, rng):
    with within_memory(
        s, FUNCTION_MB, FUNCTION_MESSAGE.format(t=FUNCTION_T, mb=FUNCTION_T**2 * 4 >> 20), HEADROOM_MB
    ) as reword:
        times = evidence_times(s, FUNCTION_MB, FUNCTION_T**2 * 4 >> 20)
        t = math.ceil(FUNCTION_T * math.sqrt(times) / FUNCTION_STEP) * FUNCTION_STEP
        reword(FUNCTION_MESSAGE.format(t=t, mb=t * t * 4 >> 20))
        q, k, v, dout = _big_inputs(rng, t, t, FUNCTION_DH)
        out, grads = _function_run(s, q, k, v, dout, False)
    rows = np.sort(rng.choice(t, TILED_ROWS, replace=False))
    want, cond = exact_attention(q, k, v, False, np.float32, rows)
    what = f"FlashAttention.apply(q, k, v) with {t} queries and keys"
    expect_attention(rows_of(out, rows), want, what, lambda: [], len(rows), [], cond)
    _expect_long_grads(
        grads,
        s.once_per_run(("never keeps P", _digest(q, k, v, dout)), lambda: _p_truth(q, k, v, dout)),
        f"the gradients of {what}",
    )


def _digest(*arrays):
    """A key for once_per_run of what is computed from these numpy arrays."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr((a.dtype.str, a.shape)).encode() + np.ascontiguousarray(a).tobytes())
    return h.digest()


def _p_truth(q, k, v, dout):
    """_long_truth of never keeps P's case, from the gradients of the exact forward: a float32 forward's out and lse
    are within float32 rounding of it."""
    t = q.shape[2]
    out64, lse64 = ref.flash_attention_forward(*_as64(q, k, v), False, *_big_blocks(t, t))
    return _long_truth([q, k, v, out64.numpy(), lse64.numpy(), dout], False, forward_length=t)


def _expect_saved(s, rng):
    """What the forward saved (helpers.Graph.saved sends the tensors): exactly q, k, v, out, lse, in any order, each
    compared with this process's own."""
    q, k, v, _ = _inputs(rng, 1, 2, 5, 7, 4, "float64")
    graph = s.helper("Graph", s.get("FlashAttention", "apply"), tensor(q), tensor(k), tensor(v), True)
    saved, on_ctx = s.call((graph, "saved"))
    out, lse = (t.numpy() for t in ref.flash_attention_forward(*_as64(q, k, v), True, *_big_blocks(5, 7)))
    left = [a for a in saved if isinstance(a, Array)]
    for want in (q, k, v, out, lse):
        match = next((a for a in left if a.shape == want.shape and np.allclose(a.data, want, atol=1e-9)), None)
        left = [a for a in left if a is not match]
        if match is None:
            break
    if len(saved) != 5 or left or match is None or on_ctx:
        fail(
            f"{SAVED}; it saved {len(saved)} tensors of shapes {[getattr(a, 'shape', None) for a in saved]}"
            + (f" and kept {', '.join(map(str, on_ctx))} on ctx" if on_ctx else "")
        )


@CHECKS.add(
    "FlashAttention",
    isolate=["flash_attention_forward", "flash_attention_backward"],
    aspects={"values": 3, "causal": 1, "gradcheck": 1, "saves q, k, v, out, lse": 1, "never keeps P": 3},
    memory_bound=True,
)
def FlashAttention(s):
    rng = s.rng
    with s.aspect("values"):
        _expect_function(s, rng, "float32", (2, 3, 13, 21, 8), False)
        _expect_function(s, rng, "float64", (2, 2, 16, 16, 8), False)  # Tq = Tk: every order of gradients fits
    with s.aspect("causal"):
        _expect_function(s, rng, "float64", (1, 2, 9, 23, 8), True)
        _expect_function(s, rng, "float32", (2, 2, 30, 30, 16), True)
    with s.aspect("gradcheck"):  # what torch.autograd.gradcheck certifies, judged here (its verdict, made where the
        # student's code runs, could be replaced): at its small float64 sizes, the backward's gradients are the
        # forward's
        for causal in (False, True):
            _expect_function(s, rng, "float64", (1, 2, 3, 5, 4), causal)
    with s.aspect("saves q, k, v, out, lse"):
        _expect_saved(s, rng)
    with s.aspect("never keeps P"):
        _expect_never_keeps_p(s, rng)
