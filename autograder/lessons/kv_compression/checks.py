"""Hidden checks of lesson 08 (shrinking the cache): sliding_window_mask, RollingKVCache,
MultiHeadLatentAttention, absorbed_attention.

Evidence the student's code cannot forge: the grader streams many updates through a RollingKVCache,
one call each, inside one memory bound (Subject.memory_bound: a hard limit set from outside the
student's process), so a cache whose memory grows runs out; absorbed_attention runs once on so many
cached latents that one head's keys (or values) for every cached position would not fit its memory
bound, while the absorbed form does.
MultiHeadLatentAttention runs with a correct latent cache built next to the student's code
(helpers.ListLatentCache), absorbed_attention on an AttentionShell holding the five projections.
"""

import math

import numpy as np
import torch

from autograder.checking import (
    HEADROOM_MB,
    Checks,
    StudentError,
    evidence_times,
    expect_array,
    expect_error,
    expect_int,
    expect_int_attributes,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
    unseen_seed,
    within_memory,
)
from autograder.sandbox import helpers
from autograder.sandbox.wire import Array, DType
from solutions import kv_compression as ref

CHECKS = Checks()
LESSON = "08_kv_compression"
# What the checks say of the mistakes only evidence shows, whose definitions carry these messages: the mask's device,
# RollingKVCache's memory and prefill, MLA's biases and a latent cache holding keys and values, absorbed_attention's
# keys formed and (Tk, Tk) mask.
DEVICE, MEMORY, PREFILL, BIAS, LATENTS, FORMS_KEYS, SQUARE_MASK = (
    getattr(mistakes.for_lesson(LESSON), n)
    for n in ("DEVICE", "MEMORY", "PREFILL", "BIAS", "LATENTS", "FORMS_KEYS", "SQUARE_MASK")
)


def _bool(mask):
    return reference(torch.as_tensor(mask, dtype=torch.bool))


# ---- sliding_window_mask -------------------------------------------------------------------


def _band(n_queries, n_keys, window):
    """Bool (n_queries, n_keys): row i sees keys p - window < j <= p, p = i + n_keys - n_queries."""
    p = np.arange(n_queries)[:, None] + n_keys - n_queries
    j = np.arange(n_keys)[None, :]
    return (j <= p) & (j > p - window)


def _expect_mask(s, n_queries, window, n_keys=None):
    args = (n_queries, window)
    kwargs = {} if n_keys is None else {"n_keys": n_keys}
    got = s.call("sliding_window_mask", *args, **kwargs)
    tk = n_queries if n_keys is None else n_keys
    what = f"sliding_window_mask({n_queries}, window, n_keys={tk})" if n_keys else "sliding_window_mask(n, window)"
    # the known mistakes (autograder/lessons/kv_compression/mistakes.py) run on the same arguments
    expect_array(
        got,
        _bool(_band(n_queries, tk, window)),
        what,
        lambda: mistakes.compared(LESSON, "sliding_window_mask", n_queries, window, n_keys),
        axes=("query", "key"),
        hint="query i, at position p = i + n_keys - n_queries, may see key j iff p - window < j <= p",
    )


@CHECKS.add("sliding_window_mask", aspects={"square masks": 3, "more keys than queries": 2, "errors": 1, "device": 1})
def sliding_window_mask(s):
    with s.aspect("square masks"):
        for n, window in ((7, 3), (6, 1), (5, 5), (4, 9), (9, 4)):
            _expect_mask(s, n, window)
    with s.aspect("more keys than queries"):
        for n, window, tk in ((3, 4, 10), (1, 5, 12), (4, 2, 7), (2, 20, 9)):
            _expect_mask(s, n, window, n_keys=tk)
    with s.aspect("errors"):
        for window in (0, -2):
            with expect_error("ValueError", "sliding_window_mask with window < 1"):
                s.call("sliding_window_mask", 4, window)
    with s.aspect("device"):
        # a grader may have only a CPU: the helper asks for a device there that shows whether device was used
        used = s.helper("device_used", s.get("sliding_window_mask", "__call__"), 3, 2, n_keys=5)
        if used == "ignored":
            fail(DEVICE)
        if used == "broken":
            fail('sliding_window_mask(3, 2, n_keys=5, device="cpu") should return the mask, a tensor')


# ---- RollingKVCache ------------------------------------------------------------------------


def _ctx(seen, window, n_new):
    """The positions update must return: the last min(window, kept) before the call, then the new ones."""
    kept = min(window, seen)
    return list(range(seen - kept, seen + n_new))


def _expect_context(got, k_all, v_all, seen, window, n_new, dtype, shadowed):
    """got: update's reply; k_all, v_all (B, Hkv, seen + n_new, Dh): every position so far; shadowed: the defined
    mistakes' replies (mistakes.Shadows.update), of which those whose length was right: the others were named by
    len."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"update(k, v) should return a pair (k_ctx, v_ctx), but returned {kind_of(got)}")
    want = _ctx(seen, window, n_new)
    for i, (part, full, name) in enumerate(((got[0], k_all, "keys"), (got[1], v_all, "values"))):
        if isinstance(part, Array) and part.kind == "tensor" and part.dtype != dtype:
            fail(
                f"update returned {name} of dtype {part.dtype}, but the cache was made with dtype={dtype}: "
                "allocate the buffers with the dtype (and device) given to RollingKVCache(...)"
            )
        # a cache copies numbers, it computes nothing: what it returns must be exactly what it was given
        expect_array(
            part,
            reference(torch.from_numpy(np.ascontiguousarray(full[:, :, want]))),
            f"the {name} returned by update",
            [(m, pair[i]) for m, pair, length in shadowed if length == seen + n_new],
            axes=("B", "Hkv", "T", "Dh"),
            rtol=1e-300,
            atol=1e-300,
            hint="update returns the last min(window, len(cache)) positions seen before the call, "
            "followed by the T_new new ones, in time order (oldest first)",
        )


def _expect_len(s, cache, want, lengths, what="len(cache)"):
    """lengths: [(message, len)] of the defined mistakes' caches after the same calls."""
    expect_int(s.helper("len", cache), want, what, mistakes=[(m, n) for m, n in lengths if n != want])


def _made(s, *args, dtype=None):
    """The student's RollingKVCache and the defined mistakes' (mistakes.Shadows), made with the same arguments."""
    if dtype is None:
        return s.call("RollingKVCache", *args), mistakes.Shadows(LESSON, "RollingKVCache", *args)
    return (
        s.call("RollingKVCache", *args, dtype=DType(dtype), device="cpu"),
        mistakes.Shadows(LESSON, "RollingKVCache", *args, dtype=getattr(torch, dtype), device="cpu"),
    )


def _run_cache(s, cache, shadows, rng, shape, window, steps, dtype, seen=0, k_all=None, v_all=None):
    """Updates of the given sizes, given to the student's cache and to the defined mistakes' (shadows); returns
    (seen, k_all, v_all) for continuing."""
    B, Hkv, Dh = shape
    for n in steps:
        k = rng.standard_normal((B, Hkv, n, Dh)).astype(dtype)
        v = rng.standard_normal((B, Hkv, n, Dh)).astype(dtype)
        k_all = k if k_all is None else np.concatenate([k_all, k], 2)
        v_all = v if v_all is None else np.concatenate([v_all, v], 2)
        got = s.call((cache, "update"), tensor(k), tensor(v))
        shadowed = shadows.update(k, v)
        # the length first: a mistake's reply is judged only where its length is right
        _expect_len(s, cache, seen + n, [(m, length) for m, _, length in shadowed])
        _expect_context(got, k_all, v_all, seen, window, n, dtype, shadowed)
        seen += n
    return seen, k_all, v_all


# Each update is one round trip to the student's process, whose cost is mostly per call: 80 calls of 128
# positions send what 160 of 64 did, in half the calls (issue 19: grading cost).
STREAM = dict(batch_size=1, n_kv_heads=1, head_dim=256, steps=80, chunk=128)  # 20 MiB if every position is kept
STREAM_WINDOW, STREAM_MB = 128, 10  # a correct cache holds 256 KiB and makes two 256 KiB contexts per update:
# the solution streams inside 2 MiB
# A notebook that holds more than an honest fresh one when the stream begins (%matplotlib inline: 30 to 60 MiB,
# a scratch tensor) keeps what it holds on top of STREAM_MB, up to HEADROOM_MB (Subject.memory_bound):
# then the stream grows (chunks up to 2 times longer, then more steps) until every position seen takes more
# than that, glibc's slack included (evidence_times), so that no store it reserved before can keep them all.
STREAM_MAX_CHUNKS = 2
# A cache keeping a quarter of the stream's keys' bytes (20 windows here) or more after it keeps what grows with the
# positions seen; a correct one keeps its two window buffers, maybe the last contexts, some 3 windows' worth.
STREAM_KEPT_SHARE = 4


def _stream_size(s):
    """(steps, chunk) of the stream inside its bound (evidence_times)."""
    steps, chunk = STREAM["steps"], STREAM["chunk"]
    kept_mb = steps * chunk * STREAM["head_dim"] * 4 * 2 // 2**20  # keys and values of every position
    times = evidence_times(s, STREAM_MB, kept_mb)
    longer = min(times, STREAM_MAX_CHUNKS)
    return steps * math.ceil(times / longer), chunk * longer


def _expect_fixed_memory(s):
    """The grader streams the updates itself, one call each, all inside one memory bound; position
    t's keys are all t, its values -t. The cache is gone after the bound (Subject.memory_bound)."""
    B, Hkv, Dh = (STREAM[k] for k in ("batch_size", "n_kv_heads", "head_dim"))
    cache = s.call("RollingKVCache", B, STREAM_WINDOW, Hkv, Dh)
    with within_memory(s, STREAM_MB, MEMORY, HEADROOM_MB):
        steps, chunk = _stream_size(s)
        for i in range(steps):
            k = np.ascontiguousarray(
                np.broadcast_to(
                    np.arange(i * chunk, (i + 1) * chunk, dtype=np.float32)[None, None, :, None], (B, Hkv, chunk, Dh)
                )
            )
            if i < steps - 1:  # only the last contexts come back: the stream is about memory
                s.call_for_effect((cache, "update"), tensor(k), tensor(-k))
            else:
                got = s.call((cache, "update"), tensor(k), tensor(-k))
        # What the cache object keeps, too: a few MiB kept beside a correct window (a log of every key seen) can
        # fit in a glibc arena's unused heap, which the address-space bound does not see (runner.bound).
        if s.helper("tensor_bytes", cache) * STREAM_KEPT_SHARE > steps * chunk * B * Hkv * Dh * 4:
            fail(MEMORY)
    positions = np.array(_ctx((steps - 1) * chunk, STREAM_WINDOW, chunk), np.float32)
    want = np.broadcast_to(positions[None, None, :, None], (B, Hkv, len(positions), Dh))
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail("update(k, v) should return a pair (k_ctx, v_ctx)")
    for part, sign, name in ((got[0], 1, "keys"), (got[1], -1, "values")):
        expect_array(
            part,
            reference(torch.from_numpy(np.ascontiguousarray(sign * want))),
            f"the {name} update returned after many updates",
            axes=("B", "Hkv", "T", "Dh"),
            hint="the last min(window, len(cache)) positions seen before the call, then the new ones",
        )


@CHECKS.add(
    "RollingKVCache",
    aspects={
        "before the window fills": 3,
        "after the window fills": 2,
        "prefill longer than the window": 1,
        "fixed memory": 2,
        "dtype and reset": 1,
        "errors": 1,
        "window attribute": 1,
    },
    memory_bound=True,
)
def RollingKVCache(s):
    rng = s.rng
    shape, window = (2, 3, 4), 6
    with s.aspect("before the window fills"):
        cache, shadows = _made(s, 2, window, 3, 4)
        _expect_len(s, cache, 0, shadows.lengths())
        state = _run_cache(s, cache, shadows, rng, shape, window, (2, 1, 2), "float32")
    with s.aspect("after the window fills"):
        _run_cache(s, cache, shadows, rng, shape, window, (1, 1, 3, 1, 1, 4, 2, 1), "float32", *state)
    with s.aspect("prefill longer than the window"):
        cache, shadows = _made(s, 1, 3, 2, 5)
        try:
            _run_cache(s, cache, shadows, rng, (1, 2, 5), 3, (7, 1, 5, 1), "float32")
        except StudentError as e:
            fail(f"update raised {e.type} on a prefill longer than the window: {e.message}. {PREFILL}")
    with s.aspect("dtype and reset"):
        cache, shadows = _made(s, 2, 4, 1, 3, dtype="float64")
        _run_cache(s, cache, shadows, rng, (2, 1, 3), 4, (3, 2, 1), "float64")
        s.call((cache, "reset"))
        shadows.reset()
        _expect_len(s, cache, 0, shadows.lengths(), "len(cache) after reset()")
        _run_cache(s, cache, shadows, rng, (2, 1, 3), 4, (2, 1), "float64")
    with s.aspect("errors"):
        with expect_error("ValueError", "RollingKVCache with window < 1"):
            s.call("RollingKVCache", 1, 0, 1, 2)
    with s.aspect("window attribute"):  # the contract names it: the lesson's demonstrations read cache.window
        expect_int_attributes(s, s.call("RollingKVCache", 1, 5, 1, 2), {"window": (5, "window")}, "RollingKVCache")
    # last: the grader ends the bounded process, and a request after it would run the notebook's cells again
    with s.aspect("fixed memory"):
        _expect_fixed_memory(s)


# ---- MultiHeadLatentAttention --------------------------------------------------------------

NAMES = ("q_proj", "kv_down", "k_up", "v_up", "out_proj")


def _params(rng, D, L, bias, dtype):
    """{state_dict name: numpy array} of an MLA with weights that make the scale and split matter."""
    shapes = {"q_proj": (D, D), "kv_down": (L, D), "k_up": (D, L), "v_up": (D, L), "out_proj": (D, D)}
    gains = {"q_proj": 2.0, "kv_down": 1.5, "k_up": 2.0, "v_up": 1.0, "out_proj": 1.0}
    out = {}
    for name, (o, i) in shapes.items():
        out[f"{name}.weight"] = (rng.standard_normal((o, i)) * gains[name] / np.sqrt(i)).astype(dtype)
        if bias:
            out[f"{name}.bias"] = (rng.standard_normal(o) * 0.5).astype(dtype)
    return out


def _mla64(params, D, H, L, bias):
    mla = ref.MultiHeadLatentAttention(D, H, L, bias=bias).double()
    mla.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in params.items()})
    return mla


@torch.no_grad()
def _forward(mla, x, prev, mask, with_cache):
    """mla(x, mask) in float64, given a LatentCache holding prev (B, L0, d_latent), every earlier chunk's correct
    latents, when with_cache."""
    cache = None
    if with_cache:
        cache = ref.LatentCache(prev.size(0), prev.size(1) + x.size(1), prev.size(2), dtype=torch.float64)
        cache.update(prev)
    return mla(x, mask=mask, cache=cache)


def _mla_mistakes(params, D, H, L, bias):
    """[(Mistake, its module)] of the defined mistakes of MultiHeadLatentAttention
    (autograder/lessons/<module>/mistakes.py), made with the check's arguments and weights in float64. One these
    cannot make is not what the student wrote."""
    out = []
    for mistake, cls in mistakes.defined(LESSON, "MultiHeadLatentAttention"):
        try:
            mla = cls(D, H, L, bias=bias).double()
            mla.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in params.items()})
        except Exception:  # noqa: BLE001 - e.g. parameters of other shapes
            continue
        out.append((mistake, mla))
    return out


def _forward_mistakes(defined, x, prev, mask, with_cache, dtype):
    """[(message, what it returns)] of each defined mistake on the check's own inputs (_forward), labelled dtype."""
    out = []
    for mistake, mla in defined:
        try:
            out.append((mistake.message, reference(_forward(mla, x, prev, mask, with_cache), dtype=dtype)))
        except Exception:  # noqa: BLE001 - a mistake that cannot happen with these shapes
            continue
    return out


def _make_mla(s, D, H, L, bias, params, dtype):
    kwargs = {"bias": True} if bias else {}
    mla = s.call("MultiHeadLatentAttention", D, H, L, **kwargs)
    if dtype == "float64":
        mla = s.call((mla, "double"))
    state = s.state(mla)
    want = set(params)
    if set(state) != want:
        missing, extra = sorted(want - set(state)), sorted(set(state) - want)
        if any(n.endswith(".bias") for n in missing + extra) and not {
            n for n in missing + extra if n.endswith(".weight")
        }:
            fail(BIAS.format(bias=bias, which="every one" if bias else "none"))
        fail(
            "MultiHeadLatentAttention's parameters should be exactly those of its five nn.Linear members q_proj, "
            "kv_down, k_up, v_up, out_proj"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (unexpected: {', '.join(extra)})" if extra else "")
        )
    for name, value in params.items():
        if state[name].shape != value.shape:
            fail(
                f"{name} has shape {state[name].shape}, but should be {value.shape}: q_proj D -> D, kv_down "
                "D -> d_latent, k_up and v_up d_latent -> D, out_proj D -> D (nn.Linear(in, out) stores (out, in))"
            )
    s.load(mla, params)
    return mla


def _expect_forward(s, rng, dtype, B, D, H, L, bias, chunks, mask=None):
    """MLA over successive chunks of one sequence (with a cache when len(chunks) > 1) against float64."""
    params = _params(rng, D, L, bias, dtype)
    mla = _make_mla(s, D, H, L, bias, params, dtype)
    mla64 = _mla64(params, D, H, L, bias)
    defined = _mla_mistakes(params, D, H, L, bias)
    x_all = rng.standard_normal((B, sum(chunks), D)).astype(dtype)
    with_cache = len(chunks) > 1
    cache = s.helper("ListLatentCache") if with_cache else None
    prev, start = torch.zeros(B, 0, L, dtype=torch.float64), 0
    for T in chunks:
        x = x_all[:, start : start + T]
        x64 = torch.from_numpy(x.astype(np.float64))
        m = None if mask is None else mask[..., start : start + T, : start + T]
        m64 = None if m is None else torch.from_numpy(m)
        kwargs = {} if m is None else {"mask": tensor(m)}
        if with_cache:
            kwargs["cache"] = cache
        try:
            got = s.call((mla, "forward"), tensor(x), **kwargs)
        except StudentError as e:
            if with_cache and start > 0:
                fail(
                    f"your forward raised {e.type} with a cache holding earlier tokens: {e.message}. With a "
                    "cache, c = cache.update(kv_down(x)) is every cached latent (B, Tk, d_latent); the mask is "
                    "(T, Tk), bottom-right aligned"
                )
            raise
        want = reference(_forward(mla64, x64, prev, m64, with_cache), dtype=dtype)
        expect_array(
            got,
            want,
            "MultiHeadLatentAttention's forward" + (" with a cache" if with_cache else ""),
            lambda: _forward_mistakes(defined, x64, prev, m64, with_cache, dtype),
            axes=("B", "T", "D"),
            hint="c = kv_down(x); keys k_up(c) and values v_up(c), split into heads (B, H, Tk, Dh); "
            "attention with the queries, scale 1/sqrt(head_dim), the causal mask when mask is None; "
            "merge the heads and apply out_proj",
        )
        with torch.no_grad():
            prev = torch.cat([prev, mla64.kv_down(x64)], 1)
        start += T
        if with_cache:
            stored = s.get(cache, "c")
            if not isinstance(stored, Array):
                fail("forward with a cache must call cache.update(c) with the new tokens' latents c = kv_down(x)")
            if len(stored.shape) != 3 or stored.shape[-1] != L:
                fail(LATENTS)
            if stored.shape[1] != start:
                fail("forward must append the new tokens' latents to the cache once per call (cache.update(c))")
            expect_array(
                stored,
                reference(prev, dtype=dtype),
                "the latents in the cache",
                hint="cache.update(kv_down(x)): the latents of the new tokens, before any up-projection",
            )


@CHECKS.add(
    "MultiHeadLatentAttention",
    aspects={"forward": 3, "cache": 2, "mask": 1, "bias": 1, "shapes and attributes": 1, "errors": 1},
)
def MultiHeadLatentAttention(s):
    rng = s.rng
    with s.aspect("forward"):
        _expect_forward(s, rng, "float32", 2, 24, 4, 5, False, (7,))
        _expect_forward(s, rng, "float64", 1, 16, 2, 12, False, (5,))
    with s.aspect("cache"):
        _expect_forward(s, rng, "float32", 2, 24, 4, 5, False, (5, 1, 1, 3))
        _expect_forward(s, rng, "float64", 3, 16, 4, 6, False, (1, 1, 2))
    with s.aspect("mask"):
        T = 6
        mask = rng.random((2, 1, T, T)) < 0.6
        mask[..., np.arange(T), np.arange(T)] = True
        _expect_forward(s, rng, "float32", 2, 16, 4, 6, False, (T,), mask=mask)
    with s.aspect("bias"):
        _expect_forward(s, rng, "float32", 2, 16, 2, 6, True, (4,))
        _expect_forward(s, rng, "float64", 1, 16, 4, 6, True, (3, 2))
    with s.aspect("shapes and attributes"):
        mla = s.call("MultiHeadLatentAttention", 30, 5, 7)
        expect_int_attributes(
            s,
            mla,
            {
                "d_model": (30, "d_model"),
                "n_heads": (5, "n_heads"),
                "head_dim": (6, "d_model // n_heads"),
                "d_latent": (7, "d_latent"),
            },
            "MultiHeadLatentAttention",
        )
    with s.aspect("errors"):
        with expect_error("ValueError", "MultiHeadLatentAttention with d_model % n_heads != 0"):
            s.call("MultiHeadLatentAttention", 10, 4, 3)


# ---- absorbed_attention --------------------------------------------------------------------


def _shell(s, params, D, H, L):
    linears = {
        n: (tensor(params[f"{n}.weight"]), tensor(params[f"{n}.bias"]) if f"{n}.bias" in params else None)
        for n in NAMES
    }
    return s.helper("AttentionShell", linears, d_model=D, n_heads=H, head_dim=D // H, d_latent=L)


@torch.no_grad()
def _absorbed_mistakes(mla64, x, c, dtype):
    """What the known mistakes of the absorption (autograder/lessons/kv_compression/mistakes.py) return on these inputs
    (float64, labelled dtype)."""
    return [
        (m.message, reference(out, dtype=dtype)) for m, out in mistakes.on(LESSON, "absorbed_attention", mla64, x, c)
    ]


SHAPE_HINT = (
    "check the shapes and the order of the folds: q_h (T, Dh) @ W_uk^h (Dh, d_latent), where W_uk^h = "
    "k_up.weight[h*Dh:(h+1)*Dh] (nn.Linear stores the transpose); then o_latent_h @ W_uv^h.T (v_up first) "
    "@ out_proj.weight[:, h*Dh:(h+1)*Dh].T (then out_proj)"
)


def _expect_absorbed(s, rng, dtype, B, D, H, L, T, Tk, bias):
    params = _params(rng, D, L, bias, dtype)
    mla64 = _mla64(params, D, H, L, bias)
    shell = _shell(s, params, D, H, L)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    c = (rng.standard_normal((B, Tk, L)) * 1.5).astype(dtype)
    x64, c64 = (torch.from_numpy(a.astype(np.float64)) for a in (x, c))
    try:
        got = s.call("absorbed_attention", shell, tensor(x), tensor(c))
    except StudentError as e:
        if e.is_a("RuntimeError") and ("shape" in e.raw_message or "size" in e.raw_message):
            fail(f"absorbed_attention raised {e.type}: {e.message}. {SHAPE_HINT}")
        raise
    with torch.no_grad():
        want = reference(ref.absorbed_attention(mla64, x64, c64), dtype=dtype)
    expect_array(
        got,
        want,
        "absorbed_attention(mla, x, latents)",
        lambda: _absorbed_mistakes(mla64, x64, c64, dtype),
        axes=("B", "T", "D"),
        hint="it must equal mla's output for x attending (bottom-right causal) to the keys and values "
        "up-projected from latents",
    )


# One head's keys for every cached position, (B, Tk, Dh) in float32, take 128 MiB; the absorbed form needs a few
# (B, H, T, Tk) score tensors (0.5 MiB each) and the latents (1 MiB). A head of 512 makes the keys 128 times larger
# than one row of scores, so that the honest form stays far inside its bound at every size the case grows to. One
# head (D = Dh = 512): its keys are all the keys, and the (D, D) weights sent to the student's process take 1 MiB
# each, not the 4 MiB of two heads of 512 (issue 19: grading cost).
BOUND = dict(B=1, D=512, H=1, L=4, T=2, Tk=65536)
BOUND_MB = 64
# A notebook that holds more than an honest fresh one when the bound begins (%matplotlib inline, a dataset, a
# scratch tensor) keeps what it holds on top of BOUND_MB, up to HEADROOM_MB: then the cached latents grow until
# one head's keys take more than that, glibc's slack included (evidence_times), so that no buffer reserved
# before the bound can hold them (4 times as many at most, where the absorbed form needs some 25 MiB).
FLOAT32_UNIT = 2.0**-24  # float32's unit roundoff: a float32 sum of n terms is off by at most n of it times their |sum|
SHORT_COND = 30.0  # the rounding of a short case's scores and projections, in units of float32's tolerance


def _length_bound(mla64, x64, c64):
    """How far a float32 absorbed_attention (bias-free mla) may be from the exact answer because its softmax and
    its weighted sum of latents add up Tk terms: Tk units of roundoff times the magnitude of those terms, carried
    through the folded output projection (the most any order of the sums can give, to first order). What the
    length of the sums does not change (the scores' own rounding) is SHORT_COND's."""
    B, T, D = x64.shape
    H, Dh, L, Tk = mla64.n_heads, mla64.head_dim, mla64.d_latent, c64.size(1)
    heads = (x64 @ mla64.q_proj.weight.T).view(B, T, H, Dh).transpose(1, 2)
    scores = (heads @ mla64.k_up.weight.view(H, Dh, L)) @ c64.transpose(1, 2)[:, None] / math.sqrt(Dh)
    causal = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (B, H, T, Tk)
    folded = torch.einsum(
        "hdl,ehd->hle", mla64.v_up.weight.view(H, Dh, L).abs(), mla64.out_proj.weight.view(D, H, Dh).abs()
    )  # (H, L, D)
    terms = torch.einsum("bhtl,hle->bte", weights @ c64.abs()[:, None], folded)  # (B, T, D)
    return (Tk + 4) * FLOAT32_UNIT * terms.max().item()


def _makes_square_mask(s):
    """Whether absorbed_attention, on a small case, runs an op on a (..., Tk, Tk) tensor. Read from the op
    log (recorded next to the student's code), so it only names the mistake of a call that already failed."""
    B, D, H, L, T, Tk = 1, 16, 2, 3, 2, 37
    rng = np.random.default_rng(0)
    params = _params(rng, D, L, False, "float32")
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    c = rng.standard_normal((B, Tk, L)).astype(np.float32)
    try:
        _, ops = s.call_traced("absorbed_attention", _shell(s, params, D, H, L), tensor(x), tensor(c))
    except StudentError:
        return False
    return any(list(shape[-2:]) == [Tk, Tk] for _, first, outs in ops for shape in [first or [], *outs])


def _expect_never_forms_keys(s, rng):
    B, D, H, L, T = (BOUND[k] for k in ("B", "D", "H", "L", "T"))
    params = _params(rng, D, L, False, "float32")
    shell = _shell(s, params, D, H, L)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    message = lambda Tk: FORMS_KEYS.format(Tk=Tk, L=L, mib=B * Tk * (D // H) * 4 // 2**20)
    try:
        with within_memory(s, BOUND_MB, message(BOUND["Tk"]), HEADROOM_MB) as reword:
            times = evidence_times(s, BOUND_MB, B * BOUND["Tk"] * (D // H) * 4 >> 20)
            Tk = BOUND["Tk"] * times
            c = rng.standard_normal((B, Tk, L), dtype=np.float32)
            reword(message(Tk))
            got = s.call("absorbed_attention", shell, tensor(x), tensor(c))
    except AssertionError:
        if _makes_square_mask(s):
            fail(SQUARE_MASK)
        raise
    mla64 = _mla64(params, D, H, L, False)
    x64, c64 = (torch.from_numpy(a.astype(np.float64)) for a in (x, c))
    with torch.no_grad():
        want = reference(ref.absorbed_attention(mla64, x64, c64), dtype="float32")
        atol = _length_bound(mla64, x64, c64)
    expect_array(
        got,
        want,
        f"absorbed_attention with {Tk} cached latents",
        axes=("B", "T", "D"),
        cond=SHORT_COND,
        atol=1e-5 + atol / SHORT_COND,
    )


# Keys or values formed a few positions at a time never hold every position at once: no memory bound sees them, and
# the absorbed form itself holds H x T scores for every cached position. What forming them cannot hide is its work:
# Tk x d_latent x D multiply-adds for the keys and as many for the values, where the absorbed form's scores and
# weighted sum take Tk x d_latent x H x T each, D / (H T) = 256 times less here. So the grader reads the CPU time of
# one call from outside the student's process (Subject.cpu_seconds): an honest call takes some 10 ms, forming the keys
# and values 0.15 s (a few thousand positions at a time under no_grad) to over a second; one that takes more than
# COST_FLOOR_S (between the two, nearer the honest call) is compared with forming them on the same
# machine (helpers.form_latent_kv, so that a slow machine is no excuse and costs no honest answer its marks), and a
# call costing COST_SHARE of that or more formed them, whatever chunk of positions it took. The forming is priced in a
# process that ran none of the notebook's code (Subject.elsewhere): a cell cannot have made it slower there.
COST = dict(B=1, T=2, Tk=2**18 + 17)
COST_FLOOR_S, COST_SHARE = 0.08, 0.3
COST_SAMPLE = 8  # forming keys is priced on 1 / COST_SAMPLE of the latents (its cost is linear in them)
FORMS_KEYS_IN_CHUNKS = mistakes.for_lesson(LESSON).FORMS_KEYS_IN_CHUNKS


def _expect_never_forms_keys_in_chunks(s, rng):
    """absorbed_attention on many cached latents (drawn in the student's process), whose CPU time is an honest call's,
    never that of forming its keys and values."""
    B, D, H, L = (BOUND[k] for k in ("B", "D", "H", "L"))
    T, Tk = COST["T"], COST["Tk"]
    params = _params(rng, D, L, False, "float32")
    shell = _shell(s, params, D, H, L)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    seed = unseen_seed(rng)
    function = s.get("absorbed_attention", "__call__")
    before = s.cpu_seconds()
    specs = [((B, Tk, L), 1.5, "float32")]
    [(got, _)] = s.helper("drawn_calls", function, seed, specs, [{"args": [shell, tensor(x), {"drawn": 0}]}])
    used = s.cpu_seconds() - before
    if used > COST_FLOOR_S:
        with s.elsewhere([]):
            there = _shell(s, params, D, H, L)
            before = s.cpu_seconds()
            s.helper("form_latent_kv", there, seed, [((B, Tk // COST_SAMPLE, L), 1.5, "float32")])
            forming = s.cpu_seconds() - before
        if used >= COST_SHARE * COST_SAMPLE * forming:
            fail(FORMS_KEYS_IN_CHUNKS.format(Tk=Tk))
    mla64 = _mla64(params, D, H, L, False)
    c = helpers.draw(seed, specs)[0].double()
    with torch.no_grad():
        want = reference(ref.absorbed_attention(mla64, torch.from_numpy(x).double(), c), dtype="float32")
        atol = _length_bound(mla64, torch.from_numpy(x).double(), c)
    expect_array(
        got,
        want,
        f"absorbed_attention with {Tk} cached latents",
        axes=("B", "T", "D"),
        cond=SHORT_COND,
        atol=1e-5 + atol / SHORT_COND,
    )


# "never forms keys or values" is the exercise's point: half of its points (a notebook that forms them keeps the rest).
@CHECKS.add("absorbed_attention", aspects={"values": 3, "bias": 1, "never forms keys or values": 4}, memory_bound=True)
def absorbed_attention(s):
    rng = s.rng
    with s.aspect("values"):
        # (dtype, B, D, H, L, T, Tk, bias); the first is square (D = Dh = L) so that every fold mistake has a shape
        for case in (
            ("float64", 2, 6, 1, 6, 3, 8, False),
            ("float32", 2, 24, 4, 5, 3, 11, False),
            ("float64", 1, 16, 2, 8, 1, 9, False),
            ("float32", 3, 32, 4, 8, 4, 4, False),
        ):
            _expect_absorbed(s, rng, *case)
    with s.aspect("bias"):
        for case in (("float64", 2, 24, 4, 5, 2, 7, True), ("float32", 1, 6, 1, 6, 3, 8, True)):
            _expect_absorbed(s, rng, *case)
    with s.aspect("never forms keys or values"):
        _expect_never_forms_keys(s, rng)  # what forms them all at once runs out of memory, with its own message
        _expect_never_forms_keys_in_chunks(s, rng)  # in a fresh process: the memory bound ended the last one
