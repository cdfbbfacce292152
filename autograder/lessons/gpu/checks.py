"""Hidden checks of lesson 06 (making attention fast): attention_flops, online_softmax,
flash_attention, fuse_qkv, triton_softmax (the warm-up kernel), triton_attention.

Results are compared with the exact answer (the reference computed in float64), with tolerances
that follow the dtype and the scores' magnitude. How a result was computed is scored only where
the evidence is out of the student's reach:

- flash_attention "tiled": two calls run under a hard memory bound (Subject.memory_bound, counted from a
  fresh process) with so many keys that a (block_q, Tk) row of scores cannot fit while tiles do, and,
  causal, so many queries and keys that a full (Tq, Tk) boolean mask cannot fit either;
  "tiled" runs with PyTorch's attention kernels off (lesson.toml's [forbids], sandbox/tripwires.py);
- triton_softmax and triton_attention "is a Triton kernel": what the wrapper returned is what its kernel writes
  when the grader launches it again, from the inputs alone, in a process that ran none of the notebook's other
  code (triton_replay.py);
- online_softmax "one pass" is NOT scored: a second pass over a row leaves no trace that the student's
  code could not erase or fake (a tracer runs next to it; memory and results are the same), so only
  its values earn points. The notebook's demo cell shows the student how their function ran. What the
  exercise forbids, PyTorch's softmax, is off while its values are checked (lesson.toml's [forbids]).
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder import lessons
from autograder.checking import (
    HEADROOM_MB,
    Checks,
    StudentError,
    Unchecked,
    close,
    evidence_times,
    expect_array,
    expect_int,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
    unseen_seed,
    within_memory,
)
from autograder.lessons.gpu.triton_replay import expect_kernel_did_the_work, planned, recorded
from autograder.sandbox import helpers
from autograder.sandbox.wire import Array, Handle
from solutions import gpu as ref

CHECKS = Checks()
# Checks that cannot run here (grade.py reads this: their tests get status error, for the instructor).
UNAVAILABLE = lessons.unavailable("06_gpu", {"triton": ref.HAS_TRITON})  # the reasons: lessons/06_gpu/lesson.toml
LESSON = "06_gpu"
# What the checks say of mistakes only evidence shows, defined with them (autograder/lessons/gpu/mistakes.py)
NO_MAX, FLOAT32_STATE, FLOAT32_INSIDE = (
    getattr(mistakes.for_lesson(LESSON), n) for n in ("NO_MAX", "FLOAT32_STATE", "FLOAT32_INSIDE")
)


# ---- attention_flops --------------------------------------------------------------------------


def _flops_diagnosis(x, full, half):
    """What the pair (count without, count with causal=True) says about the mistake; x = B*H*Tq*Tk*Dh."""
    known = {
        (2 * x, x): "a factor 2 is missing: a multiply-add is 2 FLOPs, so a (m x k) @ (k x n) matmul costs "
        "2*m*k*n FLOPs, and attention has two of them (QK^T and PV)",
        (x, x // 2): "count both matmuls (QK^T and PV) and 2 FLOPs per multiply-add: 4*B*H*Tq*Tk*Dh",
        (4 * x, 4 * x): "with causal=True the count is not halved: a causal kernel skips about half the "
        "score tiles, and the convention is to halve the count",
        (2 * x, 4 * x): "the count is halved when causal is False instead of when it is True",
        (2 * x, 2 * x): "a factor 2 is missing (2 FLOPs per multiply-add, two matmuls), and causal=True "
        "should halve the count",
    }
    try:
        return known.get((full, half))
    except TypeError:  # unhashable results: the type check below explains them
        return None


@CHECKS.add("attention_flops")
def attention_flops(s):
    rng = s.rng
    shapes = [
        (1, 1, 1, 1, 1),
        (2, 12, 1024, 1024, 64),
        (3, 5, 7, 11, 13),
        (1, 32, 1, 4096, 128),
        tuple(int(n) for n in rng.integers(2, 40, size=5)),
        (9, 11, 1_000_003, 999_983, 127),
    ]  # beyond 2**53: floats are no longer exact
    for b, h, tq, tk, dh in shapes:
        x = b * h * tq * tk * dh
        full = s.call("attention_flops", b, h, tq, tk, dh)
        half = s.call("attention_flops", b, h, tq, tk, dh, causal=True)
        diagnosis = _flops_diagnosis(x, full, half)
        if diagnosis and (full, half) != (4 * x, 2 * x):
            fail(f"attention_flops: {diagnosis}")
        for got, want, what in (
            (full, 4 * x, "attention_flops(batch, n_heads, seq_q, seq_k, head_dim)"),
            (half, 2 * x, "attention_flops(..., causal=True)"),
        ):
            if isinstance(got, float) and got.is_integer() and got == want:
                fail(f"{what} returned a float: return an int (halve with //, not /)")
            if type(got) is int and got != want and abs(got - want) <= 1e-9 * want:
                fail(
                    f"{what} is off by a little for very large sizes: floats are exact only up to 2**53, "
                    "so count with Python ints (// to halve)"
                )
            expect_int(got, want, what)
    if s.call("attention_flops", 2, 3, 5, 5, 8, False) != 4 * 2 * 3 * 5 * 5 * 8:
        fail("attention_flops(..., causal=False) passed positionally is not the full count")


# ---- online_softmax -----------------------------------------------------------------------------


def _online_mistakes(x, block):
    """The known mistakes' definitions (autograder/lessons/gpu/mistakes.py) on x, cast to x's dtype: run in
    float64, then in x's own dtype, where exp without the max overflows."""
    own = getattr(torch, x.dtype.name)
    return [
        (m.message, reference(got.to(own)))
        for dtype in dict.fromkeys((torch.float64, own))
        for m, got in mistakes.on(LESSON, "online_softmax", torch.from_numpy(x).to(dtype), block)
    ]


def _cond(x):
    """How much a float32 softmax of x may differ from the exact one, relative to 1: its rounding
    error grows with the size of the exponents (x - max)."""
    finite = np.abs(x[np.isfinite(x)])
    return max(1.0, float(finite.max()) / 10) if finite.size else 1.0


def _long_row(rng):
    """float64 rows of LONG_ROW entries whose first dominates: the rest, e^-23 of it each, add up to about 1e-5 of
    the sum, which a float32 running sum drops block by block (1 + 6e-9 == 1 in float32) and float64 keeps."""
    x = rng.standard_normal((2, LONG_ROW)) * 0.1 - 23.0
    x[:, 0] = rng.standard_normal(2) * 0.1
    return x


LONG_ROW = 40_000


def _float32_state(got, want, cond):
    """Whether a float64 answer is wrong by float32's rounding only."""
    as32 = lambda a: Array(a.kind, "float32", a.data, device=a.device)
    return (
        isinstance(got, Array)
        and got.kind == want.kind
        and got.dtype == want.dtype == "float64"
        and got.shape == want.shape
        and not close(got, want, cond=cond)
        and close(as32(got), as32(want), cond=cond)
    )


@CHECKS.add("online_softmax", aspects={"values": 2, "-inf entries": 1})
def online_softmax(s):
    """Values (see the module's docstring for why "one pass" is not scored), then no call to torch.softmax."""
    rng = s.rng
    cases = [
        ((3, 4, 50), 8, 20.0, "random"),
        ((2, 20), 1, 5.0, "rising"),
        ((2, 3, 17), 100, 3.0, "random"),
        ((4, 64), 16, 50.0, "rising"),
        ((2, 3, 40), 7, 10.0, "masked"),
        ((5, 24), 24, 1.0, "random"),
    ]
    # "values" runs with PyTorch's softmax off, on inputs drawn from a seed no source shows: a table of their softmax
    # worked out beforehand misses them (the -inf entries' are drawn from the check's own)
    short, hidden = [], np.random.default_rng(unseen_seed(rng))
    for dtype in (np.float64, np.float32):
        for shape, block, scale, kind in cases:
            x = (rng if kind == "masked" else hidden).standard_normal(shape) * scale
            if kind == "rising":  # the max grows in every block, so every block must rescale
                x = np.sort(x, axis=-1)
            if kind == "masked":  # -inf entries, and a row whose first blocks are all -inf
                x[..., ::3] = -np.inf
                x[0, 0, :20] = -np.inf
            short.append((x.astype(dtype), block, kind))
    long_row = _long_row(hidden)  # drawn last
    # -inf entries first: "values" runs with PyTorch's softmax off (lessons/06_gpu/lesson.toml), in a process of its
    # own, in one block (the core: its first failure ends the check anyway), so that the paths are probed once
    for x, block, kind in short:
        if kind == "masked":
            with s.aspect("-inf entries"):
                _expect_online(s, x, block, kind)
    yield s.next_process("values")
    with s.aspect("values"):
        for x, block, kind in short:
            if kind != "masked":
                _expect_online(s, x, block, kind)
            else:  # judged above; asked again for the softmax alone, which an answer could keep for -inf entries
                try:
                    s.call("online_softmax", tensor(x), block)
                except StudentError as e:
                    if e.type == "ForbiddenPath":
                        raise
        # The long row last, with the paths off as every value is. Judged first, its answer would name the wrong
        # mistake: on it an unnormalised result is one computed in float32 (the sum is 1 to float32's rounding), which
        # the short rows tell apart.
        _expect_online(s, long_row, 64, "long")


def _expect_online(s, x, block, kind):
    """online_softmax(x, block) against the exact softmax, naming a known mistake where it recognises one."""
    got = s.call("online_softmax", tensor(x), block)
    # float64's softmax: the exact answer to within 1e-15, as the online one computes it, without its Python loop over
    # blocks (625 of them on the long row, 0.04 CPU s a check: issue 19)
    want = reference(torch.from_numpy(x).double().softmax(-1), dtype=x.dtype.name)
    if _float32_state(got, want, _cond(x)):
        fail(f"online_softmax(x, block_size) in float64: {FLOAT32_STATE}")
    expect_array(
        got,
        want,
        "online_softmax(x, block_size)",
        mistakes=lambda: _online_mistakes(x, block),
        cond=_cond(x),
        axes=("rows",) * (x.ndim - 1) + ("N",),
        nan_hint=NO_MAX
        if kind != "masked"
        else "-inf entries must get weight 0, and a row whose first blocks are all -inf must not turn "
        "into NaN: exp(-inf - (-inf)) is NaN, so while the running max is still -inf, subtract a "
        "finite number instead (e.g. clamp it to torch.finfo(dtype).min)",
    )


# ---- flash_attention and triton_attention -------------------------------------------------------


def attention_mistakes(q, k, v, causal, block_ks, dtype, triton=False):
    """(message, Array) of known mistakes on these inputs (numpy), for each block size the student may use: the
    definitions of flash_attention's (autograder/lessons/gpu/mistakes.py), run in float64 and in the inputs' own dtype
    (float16 arithmetic shows only there), cast to `dtype`; with triton, also what Triton's own slips give: the
    exact attention of queries ln 2 smaller (exp2 without log2(e)) and of keys padded with zeros (not masked)."""
    cast = lambda t: reference(t.to(dtype))
    own = getattr(torch, np.dtype(q.dtype).name)
    out = []
    for bk in block_ks:
        for work in dict.fromkeys((torch.float64, own)):
            q_, k_, v_ = (torch.from_numpy(a).to(work) for a in (q, k, v))
            # one query tile: each query row is computed on its own, only the key tiles matter
            out += [
                (m.message, cast(got))
                for m, got in mistakes.on(
                    LESSON, "flash_attention", q_, k_, v_, causal=causal, block_q=max(1, q.shape[2]), block_k=bk
                )
            ]
    if triton:
        q64, k64, v64 = (torch.from_numpy(a).double() for a in (q, k, v))
        exact = lambda q_, k_, v_: cast(ref.flash_attention(q_, k_, v_, causal=causal))
        out.append(
            (
                "the exponentials are off by a factor log2(e): exp2(x) = exp(x * ln 2), so with exp2 the scores "
                "must be multiplied by log2(e) (fold it into the scale)",
                exact(q64 * math.log(2), k64, v64),
            )
        )
        for bk in block_ks:
            zeros = k64.new_zeros(*k64.shape[:2], (-k64.size(2)) % bk, k64.size(3))
            if zeros.numel() and not causal:
                out.append(
                    (
                        "keys past the end of the sequence are not masked out: in the tail tile, positions "
                        ">= seq_k must get score -inf (loading them as 0 is not enough)",
                        exact(q64, torch.cat([k64, zeros], 2), torch.cat([v64, zeros], 2)),
                    )
                )
    return out


def exact_attention(q, k, v, causal, dtype, rows=None):
    """The exact answer (float64) to a question asked in `dtype` (for the given query rows only, when
    given), and how far a float32 computation may stray from it (relative to float32's tolerance): the
    error of exp(s - m) grows with the scores' size."""
    q64, k64, v64 = (torch.from_numpy(a).double() for a in (q, k, v))
    tq, tk = q.shape[2], k.shape[2]
    rows = torch.arange(tq) if rows is None else torch.from_numpy(np.asarray(rows))
    q64 = q64[:, :, rows]
    mask = torch.arange(tk)[None, :] <= rows[:, None] + (tk - tq) if causal else None  # bottom-right aligned
    # torch's fused CPU kernel in float64: exact to ~1e-14 and O(T) memory, for the bounded case's many keys
    want = reference(F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask), dtype=np.dtype(dtype).name)
    # |q . k| <= |q| |k|: a bound on the largest score without forming the score matrix
    largest = q64.norm(dim=-1).amax().item() * k64.norm(dim=-1).amax().item() / math.sqrt(q.shape[-1])
    return want, max(1.0, largest / 16)


def expect_attention(got, want, what, mistaken, tq, block_qs, cond32):
    """expect_array, most specific first: a known mistake, float64 computed in float32, then only the
    last, partial tile of queries wrong, then where the result differs. cond32: exact_attention's."""
    cond = cond32 if want.dtype == "float32" else 1.0
    tol = dict(cond=cond)
    if not close(got, want, **tol):
        for message, wrong in mistaken():
            if close(got, wrong, **tol):
                fail(f"{what}: {message}")
    if isinstance(got, Array) and got.kind == want.kind and got.dtype == want.dtype and got.shape == want.shape:
        as32 = lambda a: Array(a.kind, "float32", a.data, device=a.device)
        if want.dtype == "float64" and not close(got, want) and close(as32(got), as32(want), cond=cond32):
            fail(f"{what}: {FLOAT32_INSIDE}")
        for bq in block_qs:
            n = (tq // bq) * bq
            head = lambda a: Array(a.kind, a.dtype, a.data[..., :n, :], device=a.device)
            tail = lambda a: Array(a.kind, a.dtype, a.data[..., n:, :], device=a.device)
            if 0 < n < tq and close(head(got), head(want), **tol) and not close(tail(got), tail(want), **tol):
                fail(
                    f"{what}: the tail is wrong: when Tq is not a multiple of the query block, the last, partial "
                    "tile of queries must be computed too (its rows of the output are wrong or missing)"
                )
    expect_array(
        got,
        want,
        what,
        cond=cond,
        axes=("B", "H", "Tq", "Dh"),
        nan_hint="a row of scores that is all -inf in a tile gives exp(-inf - (-inf)) = NaN: use a finite "
        "shift while the running max is -inf",
    )


def qkv(rng, b, h, tq, tk, dh, dtype, scale=2.0):
    q = (rng.standard_normal((b, h, tq, dh)) * scale).astype(dtype)
    k = (rng.standard_normal((b, h, tk, dh)) * scale).astype(dtype)
    v = rng.standard_normal((b, h, tk, dh)).astype(dtype)
    return q, k, v


# "tiled" is judged by evidence no chunk the student's code picks can shrink (issue 33). The grader passes block sizes
# smaller than both lengths, in one memory bound for two calls (one restart of the process):
# - LONG, causal: 2 queries against 2**23 keys, where ANY tensor spanning every key (one query row of scores,
#   whatever chunk of queries) takes 64 MiB, more than the working memory an answer may use (TILED_MB); row 0 sees
#   all keys but the last, so a call without causal would show nothing more (its values are the small cases');
# - MASK, causal: 8229 queries and keys, whose (Tq, Tk) boolean mask takes 64 MiB.
# The inputs are float64 (a float64 answer copies none of them) with Dh = 1, drawn in the student's process
# (helpers.drawn_calls); the long case's keys are its values too, each one of LEVELS levels (level_specs), so that
# the grader's reference counts levels instead of drawing 2**23 keys and values of its own (issue 33: 970 MiB and
# 0.3 CPU s a submission on its side). They are counted on top of TILED_MB (inputs_mb), so that TILED_MB bounds the
# answer's working memory alone: tiles of 1 x 2**16 or 256 x 512 (0.5 and 1 MiB), and the 8 MiB an honest process
# holds beyond a fresh one when the block begins (runner.HONEST_HELD_MB): a correct answer keeps its marks with a
# bound a quarter smaller (tests/harness/checks.py), and nothing spanning every key fits even the full bound. A copy
# of the keys in another dtype is a tensor spanning every key too: it does not fit either.
# A notebook that holds more than an honest fresh one when the block begins (%matplotlib inline, a dataset, a scratch
# tensor) keeps what it holds on top of TILED_MB, up to HEADROOM_MB: then the long case's queries grow until its full
# score matrix takes more than that, glibc's slack included (evidence_times), so that no buffer reserved before the
# block can hold it (its inputs stay as they are; growing until one row would not fit such a buffer would take
# hundreds of millions of keys), and the mask case grows as the square root.
TILED_MB = 40
TILED_LONG = dict(tq=2, bq=1, tk=2**23 + 77, bk=2**16)  # Tk is no multiple of block_k
TILED_MASK = dict(t=8229, bq=256, bk=512)
TILED_ROWS = 64  # the mask case's query rows whose outputs are compared


def long_specs(tq, tk, dtype="float64"):
    """helpers.draw specs of q (1, 1, tq, 1), k and v (1, 1, tk, 1)."""
    return [((1, 1, tq, 1), 2.0, dtype), ((1, 1, tk, 1), 2.0, dtype), ((1, 1, tk, 1), 1.0, dtype)]


def level_specs(tq, tk):
    """helpers.draw specs of float64 q (1, 1, tq, 1), and of k (1, 1, tk, 1) over LEVELS levels, which draw gives as v
    too: the exact attention is then the grader's from how often each level comes (helpers.Levels), with nothing of
    Tk's length made on its side and no pass of exp over every key, and the student's process draws half as much."""
    return [((1, 1, tq, 1), 2.0, "float64"), ((1, 1, tk, 1), 2.0, "float64", LEVELS)]


LEVELS = 256


def drawn_mb(specs):
    """MiB (rounded up, one more for the generator's own) that helpers.draw(seed, specs) makes."""
    return -(-sum(8 * math.prod(spec[0]) for spec in specs) >> 20) + 1


# What helpers.draw makes for the tiled evidence, on top of TILED_MB: the long case's k, which is its v (its q, grown
# with evidence_times, and the mask case's inputs are under 1 MiB)
TILED_INPUTS_MB = drawn_mb(level_specs(0, TILED_LONG["tk"])) + 1


# One case at the size "tiled" grades, for check_submission.py to time against the limit on a call (helpers.draw's
# specs, then the arguments after q, k, v)
TIMED_LONG = {
    "tensors": long_specs(TILED_LONG["tq"], TILED_LONG["tk"]),
    "args": [True, TILED_LONG["bq"], TILED_LONG["bk"]],
}
TIMED = {"flash_attention": TIMED_LONG}


def tiled_cases(s):
    """[(what it catches, its MiB, specs of q, k, v, [(causal, block_q, block_k)])] of the tiled evidence, grown with
    what the process held when the block began (evidence_times)."""
    tq, bq, tk, bk = (TILED_LONG[key] for key in ("tq", "bq", "tk", "bk"))
    tq *= evidence_times(s, TILED_MB, tq * tk * 8 >> 20)
    t, mask_bq, mask_bk = (TILED_MASK[key] for key in ("t", "bq", "bk"))
    t = math.ceil(t * math.sqrt(evidence_times(s, TILED_MB, t * t >> 20)))
    return [
        ("one query row of scores", tk * 8 >> 20, level_specs(tq, tk), [(True, bq, bk)]),
        # float32: its inputs are small, and float32 tiles cost half (issue 19)
        ("a full causal mask", t * t >> 20, long_specs(t, t, "float32"), [(True, mask_bq, mask_bk)]),
    ]


def long_attention(q, k, v, causal, chunk=2**20):
    """The exact (float64) out (B, H, Tq, Dh) and lse (B, H, Tq) of q (B, H, Tq, Dh) against k, v (B, H, Tk, Dh), and a
    bound on the largest score: few queries, many keys, key chunk by key chunk (no (Tq, Tk) tensor). The keys every
    row sees (bottom-right causal: all but the last Tq - 1) are summed without a mask."""
    q = q.double() / math.sqrt(q.size(-1))
    tq, tk = q.size(2), k.size(2)
    m = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    for ks in range(0, tk - tq + 1, chunk):
        stop = min(ks + chunk, tk - tq + 1)
        s = q @ k[:, :, ks:stop].double().transpose(-2, -1)
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m - m_new)
        l, acc, m = l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v[:, :, ks:stop].double(), m_new
    s = q @ k[:, :, tk - tq + 1 :].double().transpose(-2, -1)  # the last Tq - 1 keys, which row i sees up to i - 1
    if causal:
        s = s.masked_fill(torch.arange(tq - 1) >= torch.arange(tq)[:, None], float("-inf"))
    m_new = torch.maximum(m, s.amax(-1)) if s.size(-1) else m
    p = torch.exp(s - m_new[..., None])
    alpha = torch.exp(m - m_new)
    l, acc = l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v[:, :, tk - tq + 1 :].double()
    return acc / l[..., None], m_new + torch.log(l), q.norm(dim=-1).amax().item() * k.norm(dim=-1).amax().item()


TILED_MESSAGE = (
    "{name} ran out of memory with {tq} queries and {tk} keys in tiles of {bq} x {bk}: FlashAttention "
    "never materialises anything that spans every key (here {mb} MiB of {what}), whatever chunk of "
    "queries: not the full score matrix, not a (block_q, Tk) row of it, not one query row at a time "
    "against all keys, not a full mask, not a copy of the keys. Loop over tiles of queries AND keys of the "
    "block sizes you are given, keeping only one block_q x block_k tile of scores (and of the causal "
    "mask){lse}"
)


def tiled_calls(s, rng, name, lse=""):
    """name(q, k, v, causal, block_q, block_k) on each of tiled_cases' inputs, inside their bound (every case's inputs
    alive during every call: the bound's inputs_mb covers them once); returns (what the calls returned, the grader's
    side of them: _tiled_truths, once a run, the seed being the run's)."""
    function = s.get(name, "__call__")
    first = TILED_MESSAGE.format(
        name=name, what="one query row of scores", mb=TILED_LONG["tk"] * 8 >> 20, lse=lse, **TILED_LONG
    )
    seed = unseen_seed(rng)
    with within_memory(s, TILED_MB, first, HEADROOM_MB, TILED_INPUTS_MB) as reword:
        cases = tiled_cases(s)
        specs = [spec for *_, case_specs, _ in cases for spec in case_specs]
        calls = [
            {"args": [{"drawn": 3 * i}, {"drawn": 3 * i + 1}, {"drawn": 3 * i + 2}, causal, bq, bk]}
            for i, (*_, blocks) in enumerate(cases)
            for causal, bq, bk in blocks
        ]
        # one message for the calls together: the case that runs out names no call
        (what, mb, long, blocks), (mask_what, mask_mb, *_) = cases
        reword(
            TILED_MESSAGE.format(
                name=name,
                tq=long[0][0][2],
                tk=long[1][0][2],
                bq=blocks[0][1],
                bk=blocks[0][2],
                mb=min(mb, mask_mb),
                what=f"{what} or {mask_what}",
                lse=lse,
            )
        )
        got = s.helper("drawn_calls", function, seed, specs, calls)
    truths = s.once_per_run(("tiled", seed, repr(cases)), lambda: _tiled_truths(seed, specs, cases))
    return [answer for answer, _ in got], truths


def _tiled_truths(seed, specs, cases):
    """[(causal, q, Tk, and tiled_reference's rows, out, lse and conditioning)] of each call of tiled_calls, its inputs
    drawn again here (k and v of the long case as the helpers.Levels they were drawn over)."""
    drawn = helpers.draw(seed, specs, lengths=True)
    inputs = [drawn[3 * i : 3 * i + 3] for i, (*_, blocks) in enumerate(cases) for _ in blocks]
    causals = [causal for *_, blocks in cases for causal, _, _ in blocks]
    return [
        (causal, q, k.n if isinstance(k, helpers.Levels) else k.size(2), *tiled_reference(q, k, v, causal))
        for causal, (q, k, v) in zip(causals, inputs)
    ]


def tiled_judged(s, rng, name, lse=""):
    """[(causal, q, Tk, what the call returned, and tiled_reference's rows, out, lse and conditioning)] of
    tiled_calls."""
    answers, truths = tiled_calls(s, rng, name, lse)
    return [(causal, q, tk, answer, *rest) for answer, (causal, q, tk, *rest) in zip(answers, truths)]


def tiled_reference(q, k, v, causal):
    """(rows compared, exact out and lse of those rows, the conditioning of a float64 answer) of a tiled case."""
    tq = q.size(2)
    rows = torch.arange(max(0, tq - TILED_ROWS), tq)  # a suffix keeps the bottom-right alignment of the whole
    attention = levels_attention if isinstance(k, helpers.Levels) else long_attention
    out, lse, largest = attention(q[:, :, rows], k, v, causal)
    return rows, out, lse, max(1.0, largest / 16)


def levels_attention(q, levels, _, causal):
    """long_attention of q (1, 1, Tq, 1), the last Tq queries, against keys, the values too, drawn over levels
    (helpers.Levels): each row's softmax over the levels, each weighted by how often it comes among the keys the row
    sees."""
    tq, keys = q.size(2), torch.from_numpy(levels.values)
    seen = [levels.counts_upto(levels.n - tq + 1 + i if causal else levels.n) for i in range(tq)]
    counts = torch.from_numpy(np.stack(seen)).double()  # (Tq, levels)
    s = (q[0, 0].double() * keys).masked_fill(counts == 0, float("-inf"))  # Dh = 1: no scale
    m = s.amax(-1, keepdim=True)
    w = counts * torch.exp(s - m)
    out = (w @ keys / w.sum(-1))[None, None, :, None]
    lse = (m[:, 0] + torch.log(w.sum(-1)))[None, None]
    return out, lse, q.abs().max().item() * keys.abs().max().item()


def _expect_tiled(s, rng):
    """flash_attention within a memory bound that its tiles fit and nothing spanning every key does."""
    for causal, q, tk, got, rows, out, _, cond in tiled_judged(s, rng, "flash_attention"):
        expect_attention(
            rows_of(got, rows),
            reference(out, dtype=str(q.dtype).split(".")[-1]),
            f"flash_attention(causal={causal}) with {tk} keys",
            lambda: [],
            len(rows),
            [],
            cond,
        )


def rows_of(got, rows):
    """The given query rows of a (B, H, Tq, Dh) answer; anything else as it came (expect_array names it)."""
    rows = np.asarray(rows)
    if isinstance(got, Array) and got.data.ndim == 4 and got.data.shape[2] > rows.max():
        return Array(got.kind, got.dtype, got.data[:, :, rows], device=got.device)
    return got


def _dominant_key(rng):
    """float16 q (1, 2, 3, 16), k and v (1, 2, DOMINANT_KEYS, 16). The first two keys score 11 and 10 and have
    opposite values; the others score 0, each e^-11 of the first, and make 9% of the sum together, which float16
    running sums drop tile by tile (1.37 + 16 e^-11 rounds to 1.37 in float16) and float32 ones keep. Two
    dominant keys of different scores keep the answer apart from an unscaled or unnormalised one."""
    q = np.zeros((1, 2, 3, 16))
    q[..., 0] = 4.0
    k = rng.standard_normal((1, 2, DOMINANT_KEYS, 16)) * 0.01
    k[:, :, :2, 0] = [11.0, 10.0]  # scores 4 * 11 / sqrt(16) and 4 * 10 / sqrt(16)
    v = rng.standard_normal((1, 2, DOMINANT_KEYS, 16))
    v[:, :, :2] = np.array([1.0, -1.0])[:, None] + rng.standard_normal((1, 2, 2, 16)) * 0.1
    return q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)


DOMINANT_BLOCK, DOMINANT_KEYS = 16, 8192


@CHECKS.add("flash_attention", aspects={"values": 3, "causal": 1, "float16": 1, "tiled": 2}, memory_bound=True)
def flash_attention(s):
    rng = s.rng
    # (aspect, dtype, (B, H, Tq, Tk, Dh), causal, block_q, block_k or None for the defaults, scale of q and k)
    cases = [
        ("values", np.float64, (2, 3, 37, 53, 8), False, 16, 16, 3.0),
        ("values", np.float32, (2, 2, 45, 20, 8), False, 16, 8, 10.0),
        ("values", np.float32, (2, 2, 70, 100, 8), False, None, None, 3.0),
        ("causal", np.float64, (2, 2, 29, 45, 16), True, 8, 12, 2.0),
        ("causal", np.float32, (2, 3, 150, 150, 8), True, None, None, 2.0),
        ("causal", np.float32, (2, 2, 1, 77, 16), True, 16, 32, 2.0),
        ("float16", np.float16, (2, 2, 40, 70, 16), True, 16, 32, 1.5),
        ("float16", np.float16, (2, 3, 64, 64, 32), False, 32, 32, 1.0),
    ]
    for aspect, dtype, (b, h, tq, tk, dh), causal, bq, bk, scale in cases:
        with s.aspect(aspect):
            q, k, v = qkv(rng, b, h, tq, tk, dh, dtype, scale)
            blocks = {} if bq is None else dict(block_q=bq, block_k=bk)
            bq, bk = bq or 64, bk or 64
            got = s.call("flash_attention", tensor(q), tensor(k), tensor(v), causal=causal, **blocks)
            want, cond = exact_attention(q, k, v, causal, dtype)
            what = (
                f"flash_attention(q, k, v, causal={causal}{', block_q, block_k' if blocks else ''}) "
                f"in {np.dtype(dtype).name}"
            )
            mistaken = lambda: attention_mistakes(q, k, v, causal, [bk], getattr(torch, np.dtype(dtype).name))
            expect_attention(got, want, what, mistaken, tq, [bq], cond)
    with s.aspect("float16"):
        q, k, v = _dominant_key(rng)
        got = s.call("flash_attention", tensor(q), tensor(k), tensor(v), block_q=DOMINANT_BLOCK, block_k=DOMINANT_BLOCK)
        want, cond = exact_attention(q, k, v, False, np.float16)
        expect_attention(
            got,
            want,
            f"flash_attention(q, k, v) in float16 with {k.shape[2]} keys",
            lambda: attention_mistakes(q, k, v, False, [DOMINANT_BLOCK], torch.float16),
            q.shape[2],
            [DOMINANT_BLOCK],
            cond,
        )
    yield s.next_process("tiled")
    with s.aspect("tiled"):  # with PyTorch's attention kernels off (lessons/06_gpu/lesson.toml)
        _expect_tiled(s, rng)


# ---- fuse_qkv -----------------------------------------------------------------------------------

QKV = ("q", "k", "v")


def _fused(shell, part):
    """The reference's fused layer of `shell` (an AttentionShell made here), its `part` ("weight" or "bias")."""
    return reference(getattr(ref.fuse_qkv(shell), part).detach())


def _fuse_mistakes(shell, part):
    """[(message, Array)]: the `part` of the fused layer each defined mistake (autograder/lessons/gpu/mistakes.py)
    makes of `shell`."""
    return [
        (m.message, reference(getattr(fused, part).detach()))
        for m, fused in mistakes.on(LESSON, "fuse_qkv", shell)
        if getattr(fused, part, None) is not None
    ]


def _expect_weights(s, attn, shell):
    """fuse_qkv(attn) is an nn.Linear whose weight stacks attn's q, k, v (shell: attn's twin here); returns
    its handle."""
    fused = s.call("fuse_qkv", attn)
    if not (isinstance(fused, Handle) and "torch.nn.modules.linear.Linear" in fused.mro):
        fail(f"fuse_qkv(attn) should return a torch.nn.Linear (D -> 3D), but it returned {kind_of(fused)}")
    expect_array(
        s.get(fused, "weight"),
        _fused(shell, "weight"),
        "fuse_qkv(attn).weight",
        mistakes=lambda: _fuse_mistakes(shell, "weight"),
        hint="stack q_proj.weight, k_proj.weight and v_proj.weight along dim 0",
    )
    return fused


def _expect_biases(s, fused, shell, bias):
    """The fused layer's bias stacks attn's q, k, v biases, or is None when attn has no biases."""
    fused_bias = s.get(fused, "bias")
    if bias:
        if fused_bias is None:
            fail(
                "fuse_qkv(attn): the biases are dropped. attn's projections have biases, so the fused layer "
                "needs them too, stacked in the same order (q, k, v)"
            )
        expect_array(
            fused_bias,
            _fused(shell, "bias"),
            "fuse_qkv(attn).bias",
            mistakes=lambda: _fuse_mistakes(shell, "bias"),
            hint="copy the three biases into the fused layer, stacked in the order q, k, v",
        )
    elif fused_bias is not None:
        fail(
            "fuse_qkv(attn): attn's projections have no biases, so the fused layer must have none "
            "(nn.Linear(..., bias=False))"
        )


@CHECKS.add("fuse_qkv", aspects={"weights": 2, "biases": 1})
def fuse_qkv(s):
    rng = s.rng
    for dtype, d, n_heads, bias in [
        (np.float32, 16, 4, True),
        (np.float64, 24, 3, True),
        (np.float32, 12, 2, False),
        (np.float64, 8, 2, False),
    ]:
        w = {n: rng.standard_normal((d, d)).astype(dtype) for n in (*QKV, "o")}
        b = {n: rng.standard_normal(d).astype(dtype) if bias else None for n in (*QKV, "o")}
        projs = {f"{n}_proj" if n != "o" else "out_proj": (w[n], b[n]) for n in (*QKV, "o")}
        sizes = dict(d_model=d, n_heads=n_heads, head_dim=d // n_heads)
        attn = s.helper(
            "AttentionShell",
            {p: (tensor(wp), None if bp is None else tensor(bp)) for p, (wp, bp) in projs.items()},
            **sizes,
        )
        # its twin here, for the reference and the defined mistakes
        shell = helpers.AttentionShell(
            {p: (torch.from_numpy(wp), None if bp is None else torch.from_numpy(bp)) for p, (wp, bp) in projs.items()},
            **sizes,
        )
        with s.aspect("weights"):
            fused = _expect_weights(s, attn, shell)
        with s.aspect("biases"):
            _expect_biases(s, fused, shell, bias)
        with s.aspect("biases"):  # a bias where attn has none shows here too
            x = rng.standard_normal((2, 5, d)).astype(dtype)
            parts = {n: x @ w[n].T + (b[n] if bias else 0) for n in QKV}
            expect_array(
                s.call(fused, tensor(x)),
                reference(torch.from_numpy(np.concatenate([parts[n] for n in QKV], -1))),
                "fuse_qkv(attn)(x)",
                hint="fused(x).split(D, dim=-1) must give q_proj(x), k_proj(x), v_proj(x)",
            )


# ---- triton_attention ----------------------------------------------------------------------------


def _on(array, device):
    array.device = device
    return array


def _triton_device():
    """Where Triton kernels run: the GPU, or the CPU in Triton's interpreter."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


# One program per row in the interpreter: few rows. Every width but 64 leaves a masked tail (37, 1000,
# 100 are not powers of two); scale 50 overflows exp without the max; "-inf": a third of the entries.
SOFTMAX_CASES = [
    ("float32", np.float32, (5, 37), 3.0, False),
    ("float32", np.float32, (3, 64), 50.0, False),
    ("float32", np.float32, (4, 1000), 5.0, True),
    ("float32", np.float32, (2, 4096), 2.0, False),
    ("float16", np.float16, (6, 100), 4.0, True),
    ("float16", np.float16, (3, 40), 8.0, False),
]
SOFTMAX_NO_MAX = mistakes.for_lesson(LESSON).SOFTMAX_NO_MAX  # also what the check says of NaN


def softmax_input(rng, dtype, shape, scale, with_inf):
    """The rows one of SOFTMAX_CASES gives triton_softmax (numpy)."""
    x = rng.standard_normal(shape) * scale
    if with_inf:  # -inf entries, never a whole row of them (the contract)
        x[:, 1::3] = -np.inf
    return x.astype(dtype)


# Where tests/harness/checks.py holds each mistake's model (autograder/lessons/gpu/mistakes.py: what the check runs
# in place of the Triton kernel, too slow for the grader on a CPU) equal to its kernel in Triton's interpreter: the
# cases of at most 100 columns (the interpreter's cost grows with the programs, one per column for the wrong-axis
# mistake).
MODEL_INPUTS = {
    "triton_softmax": lambda rng: [
        (torch.from_numpy(softmax_input(rng, *case[1:])).to(_triton_device()),)
        for case in SOFTMAX_CASES
        if case[2][1] <= 100
    ]
}


def _expect_softmax(got, want, x, what):
    """expect_array, most specific first: a known mistake (its model, run on x), a block narrower than the row,
    a grid of one program, then where the result differs. The last two leave part of the output unwritten, which
    no definition reproduces (the leftovers of torch.empty_like): recognised from what the kernel did write."""
    if not close(got, want) and isinstance(got, Array) and got.shape == want.shape and got.dtype == want.dtype:
        for message, wrong in mistakes.compared(LESSON, "triton_softmax", torch.from_numpy(x)):
            if close(got, wrong):
                fail(f"{what}: {message}")
        t = torch.from_numpy(x).double()
        for b in (2**i for i in range(12)):
            if b < x.shape[1] and close(
                Array(got.kind, got.dtype, got.data[:, :b]), reference(t[:, :b].softmax(-1), dtype=got.dtype)
            ):
                fail(
                    f"{what}: only the first {b} columns are a softmax (of themselves): the block must hold the "
                    "whole row, BLOCK = triton.next_power_of_2(cols)"
                )
        if x.shape[0] > 1 and close(
            Array(got.kind, got.dtype, got.data[:1]), Array(want.kind, want.dtype, want.data[:1])
        ):
            fail(
                f"{what}: only the first row is right: launch one program per row, grid = (rows,), and let "
                "tl.program_id(0) pick the row"
            )
    expect_array(got, want, what, axes=("rows", "cols"), nan_hint=SOFTMAX_NO_MAX)


def _softmax_case(rng, dtype, shape, scale, with_inf, device):
    """(inputs, keyword arguments, what, judge: the result's expectations) of one of SOFTMAX_CASES, drawn with rng."""
    x = softmax_input(rng, dtype, shape, scale, with_inf)
    what = f"triton_softmax(x) in {np.dtype(dtype).name}"
    want = _on(reference(torch.from_numpy(x).double().softmax(-1), dtype=np.dtype(dtype).name), device)
    return [_on(tensor(x), device)], {}, what, lambda got: _expect_softmax(got, want, x, what)


@CHECKS.add("triton_softmax", aspects={"float32": 2, "float16": 1})
def triton_softmax(s):
    if not ref.HAS_TRITON:
        raise Unchecked(UNAVAILABLE["triton_softmax"])
    if not s.sources:
        raise Unchecked("triton_softmax needs the notebook's code cells, which the grader did not receive")
    yield from _triton_check(s, "triton_softmax", "_softmax_kernel", SOFTMAX_CASES, _softmax_case)


def _triton_check(s, wrapper, kernel, cases, drawn):
    """The cases of a Triton check (aspect, then the arguments of drawn after rng), each in its aspect, every one
    replayed (expect_kernel_did_the_work) once the cases are done, in a process of its own (the check pauses): a
    wrapper that hands one dtype, or one shape, to torch keeps none of that aspect's share. The first case of each
    aspect is called with the kernel run and its launches recorded, and judged at once (an unwritten answer is told it
    is not implemented yet); the others with their launches recorded and not run where the wrapper returns what it
    launched the kernel on (planned), judged on what the replay writes: the kernel runs once for them. Every case is
    drawn from a seed no source shows (the checks' own, s.rng, is the source's to read: a kernel could store the
    answer to their inputs, worked out beforehand)."""
    device, seen, replays = _triton_device(), set(), []
    for aspect, *case in cases:
        with s.aspect(aspect):
            first = aspect not in seen
            seen.add(aspect)
            inputs, kwargs, what, judge = drawn(np.random.default_rng(unseen_seed(s.rng)), *case, device)
            plan = None if first else planned(s, wrapper, kernel, inputs, kwargs)
            if plan is not None:
                replays.append((aspect, (inputs, what, *plan, judge)))
                continue
            got, launched = recorded(s, wrapper, kernel, inputs, kwargs)
            judge(got)
            replays.append((aspect, (inputs, what, got, launched)))
    for aspect, evidence in replays:
        with s.aspect(aspect):
            yield from expect_kernel_did_the_work(s, wrapper, kernel, *evidence)


# Small sizes: on a CPU this runs in Triton's interpreter, whose cost grows with the programs launched
# (query tiles x B*H) and the key tiles each walks: two of each, with 16 x 16 tiles (issue 33). Every case has
# partial query and key tiles; Dh = 24 is not a power of two; B and H above 1 exercise the strides.
TRITON_CASES = [
    ("float32", np.float32, (1, 2, 17, 24, 16), True),
    ("float32", np.float32, (2, 1, 17, 18, 24), False),
    ("float16", np.float16, (1, 2, 17, 20, 16), True),
]


def _attention_case(rng, dtype, shape, causal, device):
    """(inputs, keyword arguments, what, judge: the result's expectations) of one of TRITON_CASES, drawn with rng."""
    b, h, tq, tk, dh = shape
    q, k, v = qkv(rng, b, h, tq, tk, dh, dtype)
    what = f"triton_attention(q, k, v, causal={causal}) in {np.dtype(dtype).name}"
    want, cond = exact_attention(q, k, v, causal, dtype)
    blocks = [16, 32, 64, 128]
    mistaken = lambda: attention_mistakes(q, k, v, causal, blocks, getattr(torch, np.dtype(dtype).name), triton=True)
    return (
        [_on(tensor(a), device) for a in (q, k, v)],
        {"causal": causal},
        what,
        lambda got: expect_attention(got, _on(want, device), what, mistaken, tq, blocks, cond),
    )


@CHECKS.add("triton_attention", aspects={"float32": 2, "float16": 1})
def triton_attention(s):
    if not ref.HAS_TRITON:
        raise Unchecked(UNAVAILABLE["triton_attention"])
    if not s.sources:
        raise Unchecked("triton_attention needs the notebook's code cells, which the grader did not receive")
    yield from _triton_check(s, "triton_attention", "_attention_kernel", TRITON_CASES, _attention_case)
