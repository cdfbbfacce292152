"""Hidden checks of lesson 04 (torch): repeat_kv, GroupedQueryAttention, mha_to_gqa, kv_cache_bytes.

Forward passes are compared with solutions.gqa and with torch's own grouped-query attention,
F.scaled_dot_product_attention(..., enable_gqa=True). Known mistakes are their definitions
(autograder/lessons/gqa/mistakes.py) run on the same inputs, so the feedback can name them.
"""

import numpy as np
import torch

from autograder.checking import (
    Checks,
    expect_array,
    expect_error,
    expect_int,
    expect_int_attributes,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
)
from autograder.sandbox.wire import Array, Handle
from solutions import gqa as ref

CHECKS = Checks()
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


# ---- repeat_kv ---------------------------------------------------------------------------


def _repeat_kv_mistakes(x, n_rep):
    """What the known mistakes (autograder/lessons/gqa/mistakes.py) return on this input: expect_array's mistakes,
    run only when the answer is wrong."""
    return lambda: mistakes.compared("04_gqa", "repeat_kv", torch.from_numpy(x), n_rep)


@CHECKS.add("repeat_kv")
def repeat_kv(s):
    rng = s.rng
    for dtype in (np.float32, np.float64):
        for B, Hkv, T, Dh, n_rep in [
            (2, 3, 5, 4, 2),
            (2, 2, 4, 3, 4),
            (3, 1, 6, 8, 5),
            (2, 4, 3, 5, 1),
            (1, 2, 7, 2, 3),
        ]:
            x = rng.standard_normal((B, Hkv, T, Dh)).astype(dtype)
            got = s.call("repeat_kv", tensor(x), n_rep)
            expect_array(
                got,
                reference(ref.repeat_kv(torch.from_numpy(x), n_rep)),
                "repeat_kv(x, n_rep)",
                mistakes=_repeat_kv_mistakes(x, n_rep) if n_rep > 1 else [],
                axes=("B", "H", "T", "Dh"),
                hint="the result's head h must be x's head h // n_rep",
            )


# ---- GroupedQueryAttention -----------------------------------------------------------------


def _module(s, *args, **kwargs):
    """Build the student's GroupedQueryAttention; a Handle."""
    h = s.call("GroupedQueryAttention", *args, **kwargs)
    if not isinstance(h, Handle):
        fail(f"GroupedQueryAttention(...) should build a torch.nn.Module, but it gave {kind_of(h)}")
    return h


def _expect_attributes(s, h, D, H, Hkv, what):
    expect_int_attributes(
        s,
        h,
        {
            "d_model": (D, "d_model"),
            "n_heads": (H, "n_heads"),
            "n_kv_heads": (Hkv, "n_kv_heads, the number of key/value heads"),
            "head_dim": (D // H, "d_model // n_heads"),
        },
        what,
    )


def _expect_projections(s, h, D, H, Hkv, bias, what):
    """The state_dict of a GroupedQueryAttention: the four projections with the right shapes."""
    state = s.state(h)
    Dh = D // H
    shapes = {"q_proj": (D, D), "k_proj": (Hkv * Dh, D), "v_proj": (Hkv * Dh, D), "out_proj": (D, D)}
    for name, shape in shapes.items():
        weight = state.get(f"{name}.weight")
        if weight is None:
            fail(
                f"{what} should have nn.Linear members q_proj, k_proj, v_proj and out_proj: "
                f"its state_dict has no {name}.weight"
            )
        if weight.shape != shape:
            if name in ("k_proj", "v_proj") and weight.shape == (D, D) and Hkv != H:
                fail(
                    f"{what}: k_proj and v_proj are sized D -> D, like multi-head attention. In grouped-query "
                    f"attention they make only n_kv_heads key/value heads: nn.Linear(d_model, n_kv_heads * head_dim)"
                )
            fail(
                f"{what}: {name}.weight has shape {weight.shape}, but should have shape {shape} "
                f"(nn.Linear(in, out) stores its weight as (out, in))"
            )
        has_bias = f"{name}.bias" in state
        if has_bias != bias:
            fail(
                f"{what}: "
                + (
                    "bias=True should give every projection a bias"
                    if bias
                    else "bias defaults to False (and bias=False means no biases): pass bias=bias to nn.Linear"
                )
            )


def _random_state(rng, D, H, Hkv, bias, dtype, std=0.3):
    module = ref.GroupedQueryAttention(D, H, Hkv, bias=bias)
    return {k: (rng.standard_normal(tuple(v.shape)) * std).astype(dtype) for k, v in module.state_dict().items()}


def _reference_module(state, D, H, Hkv, bias, dtype):
    module = ref.GroupedQueryAttention(D, H, Hkv, bias=bias).to(getattr(torch, np.dtype(dtype).name)).eval()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return module


@torch.no_grad()
def _forward_mistakes(state, x, H, Hkv, mask):
    """(message, output) of the known mistakes (autograder/lessons/gqa/mistakes.py: each class built, given these
    weights and run on x)."""
    D = x.shape[-1]
    found = []
    for m, module in mistakes.on("04_gqa", "GroupedQueryAttention", D, H, Hkv, bias="q_proj.bias" in state):
        try:
            module = module.double().eval()
            module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
            found.append(
                (
                    m.message,
                    reference(module(torch.from_numpy(x), mask=None if mask is None else torch.from_numpy(mask))),
                )
            )
        except Exception:  # noqa: BLE001 - a mistake these shapes do not allow cannot be what the student did
            continue
    return found


def _random_mask(rng, shape, T):
    """Boolean, diagonal visible, some future keys visible, at least one hidden key per row."""
    mask = rng.random(shape) < 0.5
    idx = np.arange(T)
    mask[..., idx, idx] = True
    mask[..., 0, T - 1] = True
    mask[..., idx, (idx + 1) % T] = False
    return mask


def _expect_forward(s, rng, D, H, Hkv, bias, B, T, dtype, scale, masked):
    """The student's layer holding random weights, against the exact answer (float64): with
    mask=None (causal), or (masked) with given boolean masks."""
    what = "GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias)"
    state = _random_state(rng, D, H, Hkv, bias, dtype)
    state64 = {k: v.astype(np.float64) for k, v in state.items()}
    module = _reference_module(state64, D, H, Hkv, bias, np.float64)
    h = _module(s, D, H, Hkv, bias=bias)
    _expect_projections(s, h, D, H, Hkv, bias, what)
    if dtype == np.float64:
        h = s.call((h, "double"))
    # buffers of the student's own (a registered causal mask, say) keep their values
    extra = {k: v.data for k, v in s.state(h).items() if k not in state and isinstance(v, Array)}
    s.load(h, {**extra, **state})
    x = (rng.standard_normal((B, T, D)) * scale).astype(dtype)
    masks = (
        [_random_mask(rng, (T, T), T)] + ([_random_mask(rng, (B, 1, T, T), T)] if Hkv not in (1, H) else [])
        if masked
        else [None]
    )
    name = np.dtype(dtype).name
    for mask in masks:
        call = "attn(x)" if mask is None else f"attn(x, mask) with a mask of shape {mask.shape}"
        got = s.call(h, tensor(x)) if mask is None else s.call(h, tensor(x), mask=tensor(mask))
        with torch.no_grad():
            want = reference(
                module(torch.from_numpy(x.astype(np.float64)), mask=None if mask is None else torch.from_numpy(mask)),
                dtype=name,
            )
        known = lambda: [
            (m, Array(w.kind, name, w.data))  # noqa: E731 - run only when the answer is wrong
            for m, w in _forward_mistakes(state64, x.astype(np.float64), H, Hkv, mask)
        ]
        expect_array(
            got,
            want,
            call,
            mistakes=known,
            cond=scale,
            axes=("B", "T", "D"),
            nan_hint="mask the scores with -inf before the softmax (no row here is fully masked)",
        )


# (D, H, Hkv, bias, B, T, dtype, scale of x): grouped-query, multi-head (Hkv == H), multi-query (Hkv == 1)
FORWARD_CASES = [
    (24, 6, 2, True, 2, 7, np.float32, 1.0),
    (24, 6, 3, False, 3, 5, np.float64, 1.0),
    (32, 8, 8, True, 2, 6, np.float32, 1.0),
    (32, 8, 1, False, 2, 5, np.float64, 1.0),
    (48, 12, 4, True, 2, 9, np.float64, 4.0),
]


@CHECKS.add(
    "GroupedQueryAttention",
    isolate=["repeat_kv"],
    aspects={"causal self-attention": 3, "given masks": 1, "attributes and bias": 1, "errors": 1},
)
def GroupedQueryAttention(s):
    rng = s.rng
    with s.aspect("causal self-attention"):
        for case in FORWARD_CASES:
            _expect_forward(s, rng, *case, masked=False)
    with s.aspect("given masks"):
        for case in FORWARD_CASES[:4]:
            _expect_forward(s, rng, *case, masked=True)
    with s.aspect("attributes and bias"):
        what = "GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias)"
        for D, H, Hkv, bias in [(24, 6, 2, True), (32, 8, 1, False), (16, 4, 4, True)]:
            h = _module(s, D, H, Hkv, bias=bias)
            _expect_attributes(s, h, D, H, Hkv, what)
            _expect_projections(s, h, D, H, Hkv, bias, what)
        _expect_projections(
            s, _module(s, 24, 6, 3), 24, 6, 3, False, "GroupedQueryAttention(d_model, n_heads, n_kv_heads)"
        )
    with s.aspect("errors"):
        for D, H, Hkv in [(24, 6, 4), (32, 8, 3), (24, 6, 12)]:
            with expect_error(
                "ValueError",
                "GroupedQueryAttention with n_heads % n_kv_heads != 0 (the query heads "
                "cannot be split into equal groups)",
            ):
                s.call("GroupedQueryAttention", D, H, Hkv)
        for D, H, Hkv in [(24, 5, 1), (30, 4, 2), (24, 9, 3)]:
            with expect_error("ValueError", "GroupedQueryAttention with d_model % n_heads != 0"):
                s.call("GroupedQueryAttention", D, H, Hkv)


# ---- mha_to_gqa ------------------------------------------------------------------------------


def _expect_conversion(s, rng, D, H, Hkv, bias, dtype, keys):
    """mha_to_gqa on a multi-head shell holding random weights; compares the result's `keys`
    ("weight", "bias") with the exact pooling. Returns the shell, the weights and biases it was
    given, and the result (a Handle)."""
    Dh = D // H
    weights = {n: (rng.standard_normal((D, D)) * 0.3).astype(dtype) for n in PROJECTIONS}
    biases = {n: (rng.standard_normal(D) * 0.3).astype(dtype) if bias else None for n in PROJECTIONS}
    shell = s.helper(
        "AttentionShell",
        {n: (tensor(weights[n]), None if biases[n] is None else tensor(biases[n])) for n in PROJECTIONS},
        d_model=D,
        n_heads=H,
        head_dim=Dh,
    )
    mha = ref.GroupedQueryAttention(D, H, H, bias=bias).double()
    mha.load_state_dict(
        {
            f"{n}.{p}": torch.from_numpy(a.astype(np.float64))
            for n in PROJECTIONS
            for p, a in (("weight", weights[n]), ("bias", biases[n]))
            if a is not None
        }
    )
    name = np.dtype(dtype).name
    want = {k: reference(v, dtype=name) for k, v in ref.mha_to_gqa(mha, Hkv).state_dict().items()}
    # what the known mistakes (autograder/lessons/gqa/mistakes.py) make of the same mha
    wrong = [(m.message, out.state_dict()) for m, out in mistakes.on("04_gqa", "mha_to_gqa", mha, Hkv)]

    got = s.call("mha_to_gqa", shell, Hkv)
    what = "mha_to_gqa(mha, n_kv_heads)"
    if not isinstance(got, Handle):
        fail(f"{what} should return a GroupedQueryAttention module, but returned {kind_of(got)}")
    _expect_attributes(s, got, D, H, Hkv, f"the GroupedQueryAttention that {what} returns")
    state = s.state(got)
    if "bias" in keys:
        if bias and "k_proj.bias" not in state:
            fail(
                f"{what}: you dropped the biases. mha has biases, so the result must have them too: pass "
                f"bias=True to GroupedQueryAttention (its default is False) and pool the key and value biases "
                f"like the weights"
            )
        if not bias and any(k.endswith(".bias") for k in state):
            fail(f"{what}: mha has no biases, so the result must not have any: pass bias=False")
    for key, wanted in want.items():
        name, part = key.split(".")
        if part not in keys:
            continue
        got_t = state.get(key)
        if got_t is None:
            fail(f"{what}: the result's state_dict has no {key}")
        if isinstance(got_t, Array) and got_t.dtype != wanted.dtype:
            fail(
                f"{what}: the result holds {got_t.dtype} weights, but mha's are {wanted.dtype}: build it in "
                f"mha's dtype (and device), e.g. with .to(mha.q_proj.weight)"
            )
        if name in ("k_proj", "v_proj"):
            hint = f"{name} holds the mean of each group's {name} heads"
        else:
            hint = f"copy {name} unchanged from mha"
        known = (
            [(m, reference(out[key], dtype=wanted.dtype)) for m, out in wrong if key in out]
            if name in ("k_proj", "v_proj")
            else []
        )
        expect_array(got_t, wanted, f"{what}: {key}", mistakes=known, hint=hint)
    return shell, weights, biases, got


@CHECKS.add(
    "mha_to_gqa",
    isolate=["GroupedQueryAttention"],
    aspects={"pooled weights": 3, "biases": 1, "dtype": 1, "mha left unchanged": 1},
)
def mha_to_gqa(s):
    rng = s.rng
    # The first case has n_rep == n_kv_heads, where pooling over the wrong axis still has the right shape.
    with s.aspect("pooled weights"):
        for D, H, Hkv, bias in [
            (24, 4, 2, True),
            (32, 8, 4, False),
            (16, 4, 4, False),
            (24, 6, 2, True),
            (32, 8, 1, True),
        ]:
            _expect_conversion(s, rng, D, H, Hkv, bias, np.float32, ("weight",))
    with s.aspect("biases"):
        for D, H, Hkv, bias in [(24, 6, 3, True), (16, 4, 2, False)]:
            _expect_conversion(s, rng, D, H, Hkv, bias, np.float32, ("weight", "bias"))
    with s.aspect("dtype"):  # without biases, so that dropping them costs only the biases' share
        for D, H, Hkv in [(24, 6, 2), (24, 6, 3)]:
            _expect_conversion(s, rng, D, H, Hkv, False, np.float64, ("weight",))
    with s.aspect("mha left unchanged"):
        shell, weights, biases, gqa = _expect_conversion(s, rng, 24, 6, 2, True, np.float32, ("weight",))
        after = s.state(shell)
        for n in PROJECTIONS:
            for p, a in (("weight", weights[n]), ("bias", biases[n])):
                if not np.array_equal(after[f"{n}.{p}"].data, a):
                    fail(
                        f"mha_to_gqa(mha, n_kv_heads) changed mha's own {n}.{p}: build a new module and leave "
                        f"mha as it was"
                    )
        # the result shares no memory with mha: changing mha's weights from here leaves the result's as they were
        converted = s.state(gqa)
        s.load(shell, {k: v.data + 1 for k, v in after.items()})
        for key, value in sorted(s.state(gqa).items()):
            if key in converted and not np.array_equal(value.data, converted[key].data):
                fail(
                    f"the result of mha_to_gqa(mha, n_kv_heads) shares {key} with mha, so a change to one changes "
                    f"the other: copy into the new module's own parameters (param.copy_ under torch.no_grad()), "
                    f"never assign mha's layers or tensors"
                )


# ---- kv_cache_bytes ----------------------------------------------------------------------------


@CHECKS.add("kv_cache_bytes")
def kv_cache_bytes(s):
    # Factors chosen so that each mistake gives a different number. The mistakes are their definitions
    # (autograder/lessons/gqa/mistakes.py) run on each case.
    cases = [
        ((5, 3, 7, 11), dict(batch_size=3, bytes_per_element=4)),
        ((80, 8, 128, 1), {}),  # Llama 2 70B, one token, fp16
        ((32, 8, 128, 8192), dict(batch_size=7, bytes_per_element=1)),
        ((2, 1, 64, 100), dict(batch_size=5, bytes_per_element=8)),
        ((96, 96, 128, 2048), dict(batch_size=3)),
        ((12, 12, 64, 1024), dict(bytes_per_element=4)),
        ((3, 5, 6, 7), dict(batch_size=11, bytes_per_element=2)),
    ]
    for args, kwargs in cases:
        want = ref.kv_cache_bytes(*args, **kwargs)
        call = "kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len" + "".join(f", {k}" for k in kwargs) + ")"
        known = [(m.message, w) for m, w in mistakes.on("04_gqa", "kv_cache_bytes", *args, **kwargs)]
        got = s.call("kv_cache_bytes", *args, **kwargs)
        if isinstance(got, float) and got == want:
            fail(f"{call} should return a Python int (a count of bytes), not a float: avoid '/' or wrap it in int()")
        if isinstance(got, Array) and got.data.size == 1 and got.data.item() == want:
            fail(f"{call} should return a Python int, not {kind_of(got)}: wrap it in int()")
        expect_int(got, want, call, mistakes=[(m, w) for m, w in known if w != want])
