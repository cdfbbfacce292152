"""Hidden checks of lesson 05 (decoding with a key/value cache): KVCache, attend_with_cache, generate.

Isolation: attend_with_cache runs on an AttentionShell (just the projections) and a ListCache (a
correct cache), both built next to the student's code with s.helper(...), so that neither depends on
the student's KVCache or GroupedQueryAttention. generate runs on a HostDecoder, a stand-in model
whose every forward is computed here, in the grader (HostModel, through s.call_with_callbacks): the
call log that shows whether the cache was used is kept where the student's code cannot reach it.
"""

import copy
import functools

import numpy as np
import torch

from autograder.checking import (
    Checks,
    StudentError,
    close,
    expect_array,
    expect_int,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
)
from autograder.sandbox import helpers
from autograder.sandbox.wire import Array, DType
from solutions import gqa as ref_gqa
from solutions import kv_cache as ref

CHECKS = Checks()
LESSON = "05_kv_cache"


def _tensor(array):
    """A numpy array as the Array a returned torch tensor is compared with."""
    return reference(torch.from_numpy(np.ascontiguousarray(array)))


def _pair(got, what):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(
            f"{what} should return a pair (k_all, v_all), but returned {kind_of(got)}"
            + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        )
    return got


# ---- KVCache ---------------------------------------------------------------------------------


def _update(s, cache, k, v):
    return _pair(s.call((cache, "update"), tensor(k), tensor(v)), "update(k, v)")


def _expect_update(got, cached_k, cached_v, k, v, dtype, shadowed):
    """got: what update(k, v) returned; cached_*: what was cached before (B, Hkv, n, Dh); shadowed: the
    mistakes' updates (mistakes.Shadows.update), of which those whose length was right: the others were named by
    len."""
    got_k, got_v = got
    for part, name in ((got_k, "keys"), (got_v, "values")):
        if isinstance(part, Array) and part.kind == "tensor" and part.dtype != dtype:
            fail(
                f"update returned {name} of dtype {part.dtype}, but the cache was made with dtype={dtype}: "
                "allocate the buffers with the dtype (and device) given to KVCache(...)"
            )
    n = cached_k.shape[2] + k.shape[2]
    for i, (part, prev, new, name) in enumerate(((got_k, cached_k, k, "keys"), (got_v, cached_v, v, "values"))):
        want = np.concatenate([prev, new], axis=2)
        expect_array(
            part,
            _tensor(want),
            f"the {name} returned by update",
            [(m, pair[i]) for m, pair, length in shadowed if length == n],
            axes=("B", "Hkv", "T", "Dh"),
            hint="update returns everything cached so far, (B, Hkv, len(cache), Dh), oldest first",
        )


def _expect_len(s, cache, want, what, lengths):
    """lengths: [(message, len)] of the mistakes' caches after the same calls."""
    expect_int(s.helper("len", cache), want, what, mistakes=[(m, n) for m, n in lengths if n != want])


def _expect_full(s, cache, k, v, n):
    """update(k, v) must raise a ValueError with a message and leave the cache as it was (n positions)."""
    try:
        s.call((cache, "update"), tensor(k), tensor(v))
    except StudentError as e:
        if not e.is_a("ValueError"):
            fail(
                f"update on a full cache should raise a clear ValueError, but raised {e.type}: check "
                "len(cache) + T_new <= max_seq_len before writing, and raise ValueError if it does not fit"
            )
        if not e.message.strip():
            fail("the ValueError raised on a full cache has no message: say that the cache is full")
    else:
        fail(
            "update should raise a ValueError when the new positions do not fit "
            "(len(cache) + T_new > max_seq_len), but it returned normally"
        )
    if s.helper("len", cache) != n:
        fail(
            "a failed update must leave the cache unchanged, but len(cache) changed: "
            "check that the new positions fit before changing anything"
        )


def _drawer(rng, B, Hkv, Dh, dtype):
    def draw(t):
        return (rng.standard_normal((B, Hkv, t, Dh)).astype(dtype), rng.standard_normal((B, Hkv, t, Dh)).astype(dtype))

    return draw


def _expect_updates(s, cache, shadows, draw, steps, dtype):
    """A new cache, then updates of the given sizes; returns what it holds (keys, values)."""
    _expect_len(s, cache, 0, "len(cache) of a new cache", shadows.lengths())
    B, Hkv, _, Dh = draw(0)[0].shape
    cached_k = cached_v = np.zeros((B, Hkv, 0, Dh), dtype)
    for t in steps:
        k, v = draw(t)
        got = _update(s, cache, k, v)
        shadowed = shadows.update(k, v)
        # the length first: update returns buffer[:, :, :length], so a length not advanced shows there
        _expect_len(s, cache, cached_k.shape[2] + t, "len(cache) after update", [(m, n) for m, _, n in shadowed])
        _expect_update(got, cached_k, cached_v, k, v, dtype, shadowed)
        cached_k, cached_v = np.concatenate([cached_k, k], 2), np.concatenate([cached_v, v], 2)
    return cached_k, cached_v


def _expect_reset(s, cache, shadows, draw):
    """reset() empties the cache; the next update starts again at position 0."""
    s.call((cache, "reset"))
    shadows.reset()
    _expect_len(s, cache, 0, "len(cache) after reset()", shadows.lengths())
    k, v = draw(2)
    got = _update(s, cache, k, v)
    shadowed = shadows.update(k, v)
    expect_array(
        got[0],
        _tensor(k),
        "the keys returned by the first update after reset()",
        [(m, pair[0]) for m, pair, _ in shadowed],
    )
    expect_array(got[1], _tensor(v), "the values returned by the first update after reset()")


def _expect_fill(s, cache, draw, max_len):
    """A new cache filled to two short of max_seq_len; then 3 more do not fit, 2 fit exactly, 1 more does not."""
    cached_k, cached_v = draw(max_len - 2)
    _update(s, cache, cached_k, cached_v)
    _expect_full(s, cache, *draw(3), max_len - 2)
    k, v = draw(2)
    try:
        got = _update(s, cache, k, v)
    except StudentError as e:
        if e.is_a("ValueError"):
            fail(
                "a cache may be filled to exactly max_seq_len positions: raise only when "
                "len(cache) + T_new > max_seq_len"
            )
        raise
    for part, want, name in (
        (got[0], np.concatenate([cached_k, k], 2), "keys"),
        (got[1], np.concatenate([cached_v, v], 2), "values"),
    ):
        expect_array(part, _tensor(want), f"the {name} returned by the update that fills the cache")
    _expect_full(s, cache, *draw(1), max_len)


def _arrays(value, depth=0):
    """The arrays in what s.get returned for an object's __dict__ (also inside lists, tuples and
    dicts): the tensors the object keeps."""
    if isinstance(value, Array):
        return [value.data]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [a for item in items for a in _arrays(item, depth + 1)] if depth < 3 else []


PREALLOCATE = (
    "KVCache must preallocate its key and value buffers in __init__, (batch_size, n_kv_heads, max_seq_len, "
    "head_dim) each, and write each update into them in place (buffer[:, :, a:b] = k)"
)


def _buffers(s, cache, full):
    """The arrays the cache keeps (its __dict__) of at least `full` elements; None without a __dict__."""
    try:
        return [a for a in _arrays(s.get(cache, "__dict__")) if a.size >= full]
    except StudentError:  # __slots__: nothing to look at
        return None


def _expect_preallocated(s):
    """Full-size buffers after __init__, and after updates they hold what was written. What the
    student's process reports about itself: it catches the honest mistake (a cache grown by torch.cat,
    or buffers left unused), not a forgery. (Memory evidence would not be cheap: a cache grown by
    torch.cat peaks at only 1.5 times a full preallocated one, which would take 64 MiB through the wire
    to tell apart from an honest process's own memory.)"""
    B, Hkv, Dh, max_len = 2, 3, 4, 12
    full = B * Hkv * max_len * Dh
    cache = s.call("KVCache", B, max_len, Hkv, Dh)
    buffers = _buffers(s, cache, full)
    if buffers is not None and sum(a.size for a in buffers) < 2 * full:
        fail(
            f"{PREALLOCATE}: a new cache keeps no full-size buffers, and growing the cache with torch.cat in "
            "update copies all of it at every step"
        )
    for t, key in ((5, 7.0), (1, 5.0)):
        _update(s, cache, np.full((B, Hkv, t, Dh), key, np.float32), np.full((B, Hkv, t, Dh), -key, np.float32))
    buffers = _buffers(s, cache, full)
    for t, key in ((5, 7.0), (1, 5.0)) if buffers is not None else ():
        for value in (key, -key):
            if sum(int((a == value).sum()) for a in buffers) < B * Hkv * t * Dh:
                fail(
                    f"{PREALLOCATE}: after two updates the full-size buffers do not hold what was written, so update "
                    "builds new tensors instead (torch.cat, a copy), moving the whole cache at every step"
                )


@CHECKS.add("KVCache", aspects={"update and len": 3, "reset": 1, "full cache": 1, "dtype": 1, "preallocated": 1})
def KVCache(s):
    rng = s.rng
    B, Hkv, Dh, max_len = 2, 3, 4, 12
    draw = _drawer(rng, B, Hkv, Dh, "float32")
    with s.aspect("update and len"):
        cache = s.call("KVCache", B, max_len, Hkv, Dh)  # float32, the default dtype
        shadows = mistakes.Shadows(LESSON, "KVCache", B, max_len, Hkv, Dh)
        _expect_updates(s, cache, shadows, draw, (5, 1, 3), "float32")
    with s.aspect("reset"):
        _expect_reset(s, cache, shadows, draw)
    with s.aspect("full cache"):  # a new cache: a broken reset() costs only its own share
        _expect_fill(s, s.call("KVCache", B, max_len, Hkv, Dh), draw, max_len)
    with s.aspect("dtype"):
        B, Hkv, Dh, max_len = 3, 2, 8, 9
        cache = s.call("KVCache", B, max_len, Hkv, Dh, dtype=DType("float64"), device="cpu")
        shadows = mistakes.Shadows(LESSON, "KVCache", B, max_len, Hkv, Dh, dtype=torch.float64, device="cpu")
        _expect_updates(s, cache, shadows, _drawer(rng, B, Hkv, Dh, "float64"), (1, 1, 4), "float64")
    with s.aspect("preallocated"):
        _expect_preallocated(s)


# ---- attend_with_cache ---------------------------------------------------------------------


def _shell_parts(rng, D, H, Hkv, bias, dtype):
    """{name: (weight, bias or None)} of the four projections, as numpy arrays."""
    Dh = D // H
    parts = {}
    for name, (out_f, scale) in {
        "q_proj": (D, 2.0),
        "k_proj": (Hkv * Dh, 2.0),
        "v_proj": (Hkv * Dh, 1.0),
        "out_proj": (D, 1.0),
    }.items():
        w = (rng.standard_normal((out_f, D)) * scale / np.sqrt(D)).astype(dtype)
        b = (rng.standard_normal(out_f) * 0.2).astype(dtype) if bias else None
        parts[name] = (w, b)
    return parts


@torch.no_grad()
def _cached_mistakes(shell, x, cache, dtype):
    """(message, output) of the known mistakes (autograder/lessons/kv_cache/mistakes.py) for new tokens x, cache
    holding what came before (all float64), each run on a copy of the cache and labelled with the dtype the
    student computes in."""
    return [
        (m.message, reference(out, dtype=dtype))
        for m, out in mistakes.on(LESSON, "attend_with_cache", shell, x, cache, fresh=True)
    ]


@torch.no_grad()
def _appended_mistakes(shell, xs, dtype):
    """(message, keys) of what each known mistake appends to a fresh cache over the chunks xs (float64): run
    only when the student's cached keys are wrong. One that raises on them cannot be what the student did."""
    found = []
    for m, fn in mistakes.defined(LESSON, "attend_with_cache"):
        cache = helpers.ListCache()
        try:
            for x in xs:
                fn(shell, x, cache)
        except Exception:  # noqa: BLE001 - e.g. a shape only other sizes allow
            continue
        if cache.k is not None:
            found.append((m.message, reference(cache.k, dtype=dtype)))
    return found


def _expect_cached_run(s, rng, dtype, B, D, H, Hkv, bias, chunks):
    """attend_with_cache over successive chunks of one sequence (a prefill, then decode steps or
    chunks), on a correct cache; compared with the exact answer, computed here in float64."""
    Dh = D // H
    parts = _shell_parts(rng, D, H, Hkv, bias, dtype)
    sizes = dict(d_model=D, n_heads=H, n_kv_heads=Hkv, head_dim=Dh)
    shell = s.helper(
        "AttentionShell", {n: (tensor(w), None if b is None else tensor(b)) for n, (w, b) in parts.items()}, **sizes
    )
    cache = s.helper("ListCache")
    as64 = lambda a: torch.from_numpy(a.astype(np.float64))  # noqa: E731
    ref_shell = helpers.AttentionShell(
        {n: (as64(w), None if b is None else as64(b)) for n, (w, b) in parts.items()}, **sizes
    )
    ref_cache = helpers.ListCache()
    x_all = rng.standard_normal((B, sum(chunks), D)).astype(dtype)
    outs, start = [], 0
    for T in chunks:
        x = x_all[:, start : start + T]
        # the known mistakes run only when the answer is wrong, on the cache as it is before this call
        known = functools.partial(_cached_mistakes, ref_shell, as64(x), copy.deepcopy(ref_cache), dtype)
        with torch.no_grad():
            want = reference(ref.attend_with_cache(ref_shell, as64(x), ref_cache), dtype=dtype)
        try:
            got = s.call("attend_with_cache", shell, tensor(x), cache)
        except StudentError as e:
            if start > 0 and T > 1:
                fail(
                    f"your code raised {e.type} on a chunk of several new tokens with earlier tokens cached: "
                    f"{e.message}. The mask must have shape (T, Tk), new queries x all cached keys, aligned "
                    "bottom-right; a square (T, T) mask does not fit once the cache holds earlier keys"
                )
            raise
        expect_array(
            got,
            want,
            "attend_with_cache(attn, x, cache)",
            known,
            axes=("B", "T", "D"),
            hint="project the new tokens, append their keys and values to the cache, and let the new "
            "queries attend to all cached keys with the bottom-right causal mask",
        )
        start += T
        if s.helper("len", cache) != start:
            fail(
                "attend_with_cache must append the new keys and values to the cache (cache.update(k, v)) "
                "once per call: after a call with T new tokens, len(cache) should have grown by T"
            )
        outs.append(got.data)
    xs = [as64(x_all[:, start - T : start]) for start, T in zip(np.cumsum(chunks), chunks)]
    expect_array(
        s.get(cache, "k"),
        reference(ref_cache.k, dtype=dtype),
        "the keys appended to the cache",
        mistakes=functools.partial(_appended_mistakes, ref_shell, xs, dtype),
        hint="append keys of shape (B, Hkv, T, Dh): view the projection as (B, T, Hkv, Dh), then transpose(1, 2)",
    )
    # prefill + decode equals causal attention over the whole sequence at once
    full = ref_gqa.GroupedQueryAttention(D, H, Hkv, bias=bias).double()
    full.load_state_dict(ref_shell.state_dict())
    with torch.no_grad():
        want_full = reference(full(as64(x_all)), dtype=dtype)
    expect_array(
        _tensor(np.concatenate(outs, axis=1)),
        want_full,
        "the outputs of a prefill followed by decode steps, put together,",
        axes=("B", "T", "D"),
        hint="they must equal causal attention over the whole sequence at once",
    )


@CHECKS.add("attend_with_cache", isolate=["repeat_kv"], aspects={"prefill and decode steps": 3, "chunks": 1})
def attend_with_cache(s):
    rng = s.rng
    # (dtype, B, D, H, Hkv, bias, sizes of the successive calls: a prefill, then decode steps or chunks)
    with s.aspect("prefill and decode steps"):
        for config in (
            ("float32", 2, 16, 4, 2, True, (5, 1, 1, 1)),
            ("float64", 1, 16, 2, 2, True, (6, 1, 1)),
            ("float32", 2, 16, 4, 1, False, (1, 1, 1, 1)),
        ):
            _expect_cached_run(s, rng, *config)
    with s.aspect("chunks"):  # several new tokens with earlier ones cached (chunked prefill, speculative decoding)
        for config in (("float64", 3, 24, 6, 3, False, (4, 3, 1, 2)), ("float32", 2, 16, 4, 1, False, (2, 1, 4))):
            _expect_cached_run(s, rng, *config)


# ---- generate ------------------------------------------------------------------------------


class ProbeModel(torch.nn.Module):
    """The grader's stand-in language model. The logits at position t are a fixed function of
    tokens 0..t, computed the same way with caches (continuing from the cached state) or without,
    so cached and uncached decoding agree exactly. self.calls logs each forward as
    [number of ids, cached positions or None]."""

    class Cache:
        def __init__(self):
            self.length, self.state = 0, None

        def __len__(self):
            return self.length

    def __init__(self, vocab_size, max_seq_len, seed):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab_size, vocab_size, generator=gen, dtype=torch.float64)
        self.pos = torch.randn(max_seq_len, vocab_size, generator=gen, dtype=torch.float64)
        self.max_seq_len, self.calls = max_seq_len, []

    def make_caches(self, batch_size):
        return [ProbeModel.Cache()]

    def forward(self, ids, caches=None):
        start = len(caches[0]) if caches else 0
        self.calls.append([ids.size(1), start if caches else None])
        if start + ids.size(1) > self.max_seq_len:
            raise ValueError(f"positions beyond max_seq_len={self.max_seq_len}")
        state = caches[0].state if caches and start else torch.zeros(ids.size(0), self.emb.size(0), dtype=torch.float64)
        if state.size(0) != ids.size(0):
            raise ValueError("the ids' batch size differs from the one the caches were made for")
        logits = []
        for t in range(ids.size(1)):
            state = 0.5 * state + self.emb[ids[:, t]]
            logits.append(state + self.pos[start + t])
        if caches:
            caches[0].state, caches[0].length = state, start + ids.size(1)
        return torch.stack(logits, dim=1)


class HostModel:
    """The grader's side of the sandbox's HostDecoder (s.call_with_callbacks handler): every forward
    the student's generate makes is computed here by a ProbeModel, with the caches' states and the
    call log kept here too. So "it used the cache" is decided from a record the student's code
    cannot rewrite. A request that is not what HostDecoder sends is refused ({"error": why})."""

    MAX_CACHES = 256

    def __init__(self, vocab_size, max_seq_len, seed):
        self.model = ProbeModel(vocab_size, max_seq_len, seed)
        self.caches = []

    @property
    def calls(self):
        return self.model.calls

    def __call__(self, payload):
        try:
            return self._answer(payload if isinstance(payload, dict) else {})
        except (ValueError, TypeError, IndexError, RuntimeError) as e:
            return {"error": str(e)[:200]}

    def _cache(self, number):
        if type(number) is not int or not 0 <= number < len(self.caches):
            raise ValueError("caches must come from model.make_caches(batch_size)")
        return self.caches[number]

    def _answer(self, request):
        op = request.get("op")
        if op == "make_caches":
            if len(self.caches) >= self.MAX_CACHES:
                raise ValueError("too many caches")
            self.caches.append(ProbeModel.Cache())
            return len(self.caches) - 1
        if op == "len":
            return len(self._cache(request.get("cache")))
        if op != "forward":
            raise ValueError("unknown request")
        ids, numbers = request.get("ids"), request.get("caches")
        if not (
            isinstance(ids, Array)
            and ids.kind == "tensor"
            and ids.dtype == "int64"
            and len(ids.shape) == 2
            and 0 < ids.shape[0] <= 64
        ):
            raise ValueError("expected ids (B, T) of dtype torch.long")
        if ids.data.size and not (0 <= ids.data.min() and ids.data.max() < self.model.emb.size(0)):
            raise IndexError("token ids must be in 0 .. vocab_size - 1")
        caches = None if numbers is None else [self._cache(n) for n in numbers] if isinstance(numbers, list) else 0
        if caches == 0:
            raise ValueError("caches must be the list model.make_caches(batch_size) returned")
        return reference(self.model(torch.from_numpy(ids.data), caches))


def _expected_calls(T0, N, use_cache):
    """The call log of a correct generate: [number of ids, cached positions or None]."""
    if use_cache:
        return ([[T0, 0]] + [[1, T0 + i] for i in range(N - 1)]) if N else []
    return [[T0 + i, None] for i in range(N)]


def _diagnose_calls(calls, T0, N, use_cache):
    """Fail with the mistake that the model's call log (kept by the grader) shows, if any."""
    if N == 0 or calls == _expected_calls(T0, N, use_cache):
        return
    if use_cache:
        if calls and all(c[1] is None for c in calls):
            fail(
                "with use_cache=True the model was never given caches: make them once with "
                "model.make_caches(batch_size) and pass them to every call, model(ids, caches)"
            )
        if calls and calls[0] != [T0, 0]:
            fail(
                "with the cache, the first call is the prefill: the whole prompt (B, T0) in one call, with "
                "the empty caches from model.make_caches"
            )
        for n, cached in calls[1:]:
            if cached is None:
                fail("with use_cache=True, pass the caches to every call of the model")
            if cached == 0:
                fail("a later step got fresh, empty caches: make the caches once, before the loop")
            if n > 1:
                fail(
                    "after the prefill, feed only the newest token, shape (B, 1), to the cached model: the "
                    "cache already holds the earlier positions, and feeding the whole sequence again appends "
                    "it to the cache a second time"
                )
    else:
        if any(c[1] is not None for c in calls):
            fail(
                "with use_cache=False the model must run without caches: rerun the whole sequence, model(ids), "
                "at every step"
            )
        if [c[0] for c in calls[:N]] != [T0 + i for i in range(min(N, len(calls)))]:
            fail("without the cache, each step reruns the whole sequence so far (the prompt and the new tokens)")
    if len(calls) == N + 1:
        fail(
            "the model ran one time too many: each call gives one new token, and the last new token is "
            "returned, never fed back (a generation may fill the model's max_seq_len exactly)"
        )
    if len(calls) < N:
        fail("the model ran too few times: one call per new token")
    fail("the model's calls are not one per new token (prefill first when caching)")


def _expect_count(got, want, T0, N):
    """Off by one in the loop, or the prompt left out."""
    if not (isinstance(got, Array) and got.kind == "tensor" and len(got.shape) == 2 and got.shape[0] == want.shape[0]):
        return
    if got.shape[1] == T0 and N > 0 and np.array_equal(got.data, want.data[:, :T0]):
        fail("generate returned only the prompt: append max_new_tokens new tokens to it, (B, T0 + max_new_tokens)")
    if got.shape[1] == N and N > 0 and np.array_equal(got.data, want.data[:, T0:]):
        fail("generate returned only the new tokens: return the prompt followed by them, (B, T0 + max_new_tokens)")
    if got.shape[1] == T0 + N + 1:
        fail("generate returned one token too many: exactly max_new_tokens new tokens, (B, T0 + max_new_tokens)")
    if got.shape[1] == T0 + N - 1:
        fail("generate returned one token too few: exactly max_new_tokens new tokens, (B, T0 + max_new_tokens)")


def _generate(s, case, use_cache):
    """(the grader's call log, the result or None, the StudentError or None) of one generate call."""
    vocab, max_len, seed, prompt, N = case
    host = HostModel(vocab, max_len, seed)
    model = s.helper("HostDecoder", vocab, max_len)
    kwargs = {} if use_cache else {"use_cache": False}  # True is the default
    try:
        return host.calls, s.call_with_callbacks(host, "generate", model, tensor(prompt), N, **kwargs), None
    except StudentError as e:
        return host.calls, None, e


def _expect_generate(s, case, use_cache):
    vocab, max_len, seed, prompt, N = case
    calls, got, error = _generate(s, case, use_cache)
    want = reference(ref.generate(ProbeModel(vocab, max_len, seed), torch.from_numpy(prompt), N, use_cache=use_cache))
    if error is None:
        _expect_count(got, want, prompt.shape[1], N)
    elif not calls:  # it raised before it ran the model: that is the mistake to show
        raise error
    _diagnose_calls(calls, prompt.shape[1], N, use_cache)
    if error is not None:
        raise error
    if isinstance(got, Array) and got.kind == "tensor" and got.shape == want.shape and not close(got, want):
        second = _generate(s, case, use_cache)[1]
        if not (isinstance(second, Array) and second.shape == got.shape and np.array_equal(second.data, got.data)):
            fail(
                "generate gave different tokens on the same input: greedy decoding is deterministic, each new "
                "token is the argmax of the last position's logits (no sampling)"
            )
    expect_array(
        got,
        want,
        "the output of generate(model, prompt_ids, max_new_tokens" + (")" if use_cache else ", use_cache=False)"),
        hint="the prompt, then each new token = the argmax of the logits at the last position, logits[:, -1]",
    )


@CHECKS.add("generate", aspects={"greedy decoding with the cache": 2, "without the cache": 1})
def generate(s):
    rng = s.rng
    # (vocab_size, max_seq_len, seed, prompt, max_new_tokens); the second fills max_seq_len exactly (T0 + N - 1)
    cases = [
        (vocab, max_len, int(rng.integers(1 << 30)), rng.integers(vocab, size=(B, T0)).astype(np.int64), N)
        for vocab, max_len, B, T0, N in ((13, 32, 3, 4, 6), (9, 11, 2, 5, 7), (17, 16, 1, 1, 5), (11, 16, 2, 3, 0))
    ]
    with s.aspect("greedy decoding with the cache"):
        for case in cases:
            _expect_generate(s, case, use_cache=True)
    with s.aspect("without the cache"):
        for case in cases:
            _expect_generate(s, case, use_cache=False)
