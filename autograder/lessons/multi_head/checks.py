"""Hidden checks of lesson 03 (torch): concat_and_project, MultiHeadAttention, load_torch_mha, mha_param_count."""

import functools
import math

import numpy as np
import torch

from autograder.checking import (
    Checks,
    Expect,
    StudentError,
    as_torch,
    call_named,
    expect_array,
    expect_int,
    expect_int_attributes,
    expect_pair,
    fail,
    kind_of,
    mistakes,
    reference,
    tensor,
)
from autograder.sandbox import helpers
from autograder.sandbox.wire import Array, Handle
from solutions import multi_head as ref

CHECKS = Checks()

DTYPES = (np.float32, np.float64)
PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def _expect_value_error(s, what, *args, **kwargs):
    try:
        s.call(*args, **kwargs)
    except StudentError as e:
        if e.is_a("ValueError"):
            return
        fail(f"{what} should raise a ValueError naming d_model and n_heads, but raised {e.type}")
    fail(f"{what} should raise a ValueError (the width cannot be split evenly into heads), but returned normally")


# ---- concat_and_project ---------------------------------------------------------------------


def _concat_mistakes(heads, w_o):
    """The known mistakes (autograder/lessons/multi_head/mistakes.py) on these inputs."""
    return mistakes.compared("03_multi_head", "concat_and_project", as_torch(heads), as_torch(w_o))


@CHECKS.add("concat_and_project")
def concat_and_project(s):
    rng = s.rng
    for dtype in DTYPES:
        for B, H, T, Dh in [(2, 3, 5, 4), (3, 4, 4, 2), (2, 2, 6, 8), (1, 6, 3, 2), (2, 1, 4, 6)]:
            heads = rng.standard_normal((B, H, T, Dh)).astype(dtype)
            w_o = rng.standard_normal((H * Dh, H * Dh)).astype(dtype)
            got = call_named(s, "concat_and_project(heads, w_o)", "concat_and_project", tensor(heads), tensor(w_o))
            h64, w64 = as_torch(heads.astype(np.float64)), as_torch(w_o.astype(np.float64))
            expect_array(
                got,
                reference(ref.concat_and_project(h64, w64), dtype=heads.dtype.name),
                "concat_and_project(heads, w_o)",
                lambda: _concat_mistakes(heads, w_o),
                axes=("B", "T", "D"),
                hint="out = concat(heads) @ w_o, head h's output in features h*Dh:(h+1)*Dh of the concatenation",
            )


# ---- MultiHeadAttention ---------------------------------------------------------------------


def _random_state(rng, D, bias, dtype):
    """Weights that give non-uniform attention, and non-zero biases (PyTorch starts them at zero)."""
    state = {}
    for name in PROJ:
        scale = (2.0 if name in ("q_proj", "k_proj") else 1.0) / math.sqrt(D)
        state[f"{name}.weight"] = (rng.standard_normal((D, D)) * scale).astype(dtype)
        if bias:
            state[f"{name}.bias"] = (rng.standard_normal(D) * 0.5).astype(dtype)
    return state


def _reference_module(D, H, bias, state):
    m = ref.MultiHeadAttention(D, H, bias=bias).to(
        torch.float64 if state["q_proj.weight"].dtype == np.float64 else torch.float32
    )
    m.load_state_dict({k: as_torch(v) for k, v in state.items()})
    return m


@torch.no_grad()
def _mha_mistakes(state, H, args, kwargs, dtype):
    """[(message, (out, weights))] of the known mistakes (autograder/lessons/multi_head/mistakes.py): each class built
    with these weights in float64 and called as the student's was (args: the float64 tensors the student got),
    labelled with the student's dtype. One these inputs make raise cannot be what the student did."""
    D = state["q_proj.weight"].shape[0]
    found = []
    for m, module in mistakes.on("03_multi_head", "MultiHeadAttention", D, H, bias="q_proj.bias" in state):
        try:
            module = module.double()
            module.load_state_dict({k: as_torch(v.astype(np.float64)) for k, v in state.items()})
            out, w = module(*args, **kwargs, need_weights=True)
        except Exception:  # noqa: BLE001 - e.g. value defaulting to a query of another length
            continue
        found.append((m.message, (reference(out, dtype=dtype), reference(w, dtype=dtype))))
    return found


def _forward_cases(rng, D, H, dtype):
    """{aspect: [(description, query, key or None, value or None, mask or None, need_weights)]} beyond mha(x)."""
    B, T, Tk = 2, 5, 7
    x = rng.standard_normal((B, T, D)).astype(dtype)
    same_len = rng.standard_normal((B, T, D)).astype(dtype)
    memory = rng.standard_normal((B, Tk, D)).astype(dtype)
    value = rng.standard_normal((B, Tk, D)).astype(dtype)

    def random_mask(shape):
        m = rng.random(shape) < 0.5
        m[..., 0], m[..., -1] = True, False  # never a fully masked row, and inverting it matters
        return m

    return x, {
        "weights": [
            ("mha(x, need_weights=True)", x, None, None, None, True),
            ("mha(query, key, value, need_weights=True) with Tq != Tk", x, memory, value, None, True),
        ],
        "cross-attention": [
            ("mha(x, memory) (cross-attention)", x, same_len, None, None, False),
            ("mha(x, memory) (cross-attention, Tq != Tk)", x, memory, None, None, False),
        ],
        "masks": [
            ("mha(query, key, value, mask=mask) with a (Tq, Tk) mask", x, memory, value, random_mask((T, Tk)), False),
            ("mha(x, mask=causal_mask) (self-attention)", x, None, None, np.tril(np.ones((T, T), dtype=bool)), False),
            (
                "mha(query, key, value, mask=mask) with a per-head (B, H, Tq, Tk) mask",
                x,
                memory,
                value,
                random_mask((B, H, T, Tk)),
                False,
            ),
            (
                "mha(query, key, value, mask=mask, need_weights=True) with a (B, 1, Tq, Tk) mask",
                x,
                memory,
                value,
                random_mask((B, 1, T, Tk)),
                True,
            ),
        ],
    }


OUTPUT = Expect(
    axes=("B", "Tq", "D"), hint="out = out_proj(concat over heads of softmax(q_h k_h^T / sqrt(head_dim)) v_h)"
)


def _check_forward(s, mha, module, state, H, case, weights=True):
    """One call of the student's forward against the reference module. weights=False: with
    need_weights=True only the output is compared (the weights are the "weights" aspect's)."""
    what, query, key, value, mask, need_weights = case
    args = [tensor(query)] + ([] if key is None else [tensor(key)]) + ([] if value is None else [tensor(value)])
    kwargs = {} if mask is None else {"mask": tensor(mask)}
    if need_weights:
        kwargs["need_weights"] = True
    hint = ""
    if key is not None and value is None:
        hint = "mha(query, key) attends to key: value defaults to key"
    elif key is None:
        hint = "mha(x) is self-attention: key defaults to query and value to key"
    if key is not None and key.shape[1] != query.shape[1]:
        hint = "; ".join(
            filter(None, [hint, "split the keys and values into heads with their own length Tk, not the query's Tq"])
        )
    got = call_named(s, what, mha, *args, **kwargs, hint=hint)
    k = query if key is None else key
    v = k if value is None else value
    with torch.no_grad():  # the exact answer: the reference module in float64
        want_out, want_w = module(
            *(as_torch(t.astype(np.float64)) for t in (query, k, v)),
            mask=None if mask is None else as_torch(mask),
            need_weights=True,
        )
    want_out, want_w = reference(want_out, dtype=query.dtype.name), reference(want_w, dtype=query.dtype.name)
    as64 = [as_torch(t.astype(np.float64)) for t in (query, key, value) if t is not None]
    mistakes = functools.cache(
        lambda: _mha_mistakes(state, H, as64, {} if mask is None else {"mask": as_torch(mask)}, query.dtype.name)
    )
    regions = None if mask is None else {"masked keys": ~np.broadcast_to(mask, want_w.shape)}
    if not need_weights:
        if isinstance(got, (tuple, list)):
            fail(f"{what} returned {kind_of(got)}: with need_weights=False (the default) return only out")
        expect_array(
            got,
            want_out,
            f"the output of {what}",
            lambda: [(m, o) for m, (o, w) in mistakes()],
            OUTPUT,
        )
        return
    if not weights and not (isinstance(got, (tuple, list)) and len(got) == 2):
        return  # need_weights=True that gives no pair fails the "weights" aspect, not this one
    out, w = expect_pair(got, what)
    if weights:
        if isinstance(w, Array) and w.shape == want_w.shape[:1] + want_w.shape[2:]:
            fail(
                f"the weights of {what} have shape (B, Tq, Tk): return one pattern per head, (B, H, Tq, Tk), "
                "and do not average over the heads (nn.MultiheadAttention averages by default; we don't)"
            )
        expect_array(
            w,
            want_w,
            f"the weights of {what}",
            lambda: [(m, w) for m, (o, w) in mistakes()],
            hint="softmax(q k^T / sqrt(head_dim)) per head, masked where mask is False",
            axes=("B", "H", "Tq", "Tk"),
            regions=regions,
        )
    expect_array(
        out,
        want_out,
        f"the output of {what}",
        lambda: [(m, o) for m, (o, w) in mistakes()],
        OUTPUT,
    )


def _check_structure(s, mha, D, H):
    """The attributes and the four projections' weights (biases are the "bias" aspect's)."""
    expect_int_attributes(
        s,
        mha,
        {"d_model": (D, "d_model"), "n_heads": (H, "n_heads"), "head_dim": (D // H, "d_model // n_heads")},
        "MultiHeadAttention",
    )
    state = s.state(mha)
    missing = [p for p in PROJ if f"{p}.weight" not in state]
    if missing:
        fail(
            "MultiHeadAttention needs nn.Linear members q_proj, k_proj, v_proj, out_proj; "
            f"missing: {', '.join(missing)}"
        )
    extra = sorted(k for k in state if k not in {f"{p}.{n}" for p in PROJ for n in ("weight", "bias")})
    if extra:
        fail(
            f"MultiHeadAttention's state_dict has unexpected entries {extra}: keep only the four projections "
            "(register helper buffers with persistent=False)"
        )
    for key in sorted(state):
        want = (D, D) if key.endswith("weight") else (D,)
        if state[key].shape != want:
            fail(f"{key} has shape {state[key].shape}, but should have shape {want}: nn.Linear(d_model, d_model)")


def _check_biases(s, mha, bias):
    state = s.state(mha)
    biases = [p for p in PROJ if f"{p}.bias" in state]
    if bias and len(biases) < 4:
        fail(
            "with bias=True (the default) each of the four projections has a bias: "
            "nn.Linear(d_model, d_model, bias=bias)"
        )
    if not bias and biases:
        fail("with bias=False the projections must have no bias: pass bias=bias to each nn.Linear")


def _load(s, mha, state):
    """Load `state` into the student's module; biases it has but should not get zeros (the "bias" aspect
    reports them), so that one slip costs one share."""
    have = s.state(mha)
    full = dict(state)
    for key, array in have.items():
        if key.endswith(".bias") and key not in full and isinstance(array, Array):
            full[key] = np.zeros(array.shape, dtype=state["q_proj.weight"].dtype)
    if any(k not in have for k in full):
        fail("the module has no bias to load the biases into: with bias=True (the default) each projection has a bias")
    try:
        s.load(mha, full)
    except StudentError as e:
        fail(f"could not load weights into MultiHeadAttention: {e.type}: {e.message}")


CONFIGS = [(24, 6, False, np.float32), (16, 2, False, np.float64), (16, 4, True, np.float32), (12, 3, True, np.float64)]


@CHECKS.add(
    "MultiHeadAttention",
    isolate=["concat_and_project"],
    aspects={
        "self-attention": 3,
        "cross-attention": 1,
        "masks": 1,
        "weights": 1,
        "bias": 1,
        "shapes and attributes": 1,
        "errors": 1,
    },
)
def MultiHeadAttention(s):
    rng = s.rng
    with s.aspect("errors"):
        for D, H in [(10, 3), (12, 5), (16, 3)]:
            _expect_value_error(
                s,
                "MultiHeadAttention(d_model, n_heads) with d_model not divisible by n_heads",
                "MultiHeadAttention",
                D,
                H,
            )
    for D, H, bias, dtype in CONFIGS:
        kwargs = {} if bias else {"bias": False}  # the default must be bias=True
        mha = call_named(s, "MultiHeadAttention(d_model, n_heads, bias)", "MultiHeadAttention", D, H, **kwargs)
        if not isinstance(mha, Handle) or "torch.nn.modules.module.Module" not in mha.mro:
            fail(f"MultiHeadAttention(d_model, n_heads) should build a torch.nn.Module, but gave {kind_of(mha)}")
        structure = ""  # what is wrong with the attributes may be why the forward fails
        with s.aspect("shapes and attributes"):
            try:
                _check_structure(s, mha, D, H)
            except AssertionError as e:
                structure = f" (and {e})"
                raise
        with s.aspect("bias"):
            _check_biases(s, mha, bias)
        # self-attention without biases is the core; with biases it is the "bias" aspect, so that a
        # forward that ignores the biases loses that share only
        with s.aspect("bias" if bias else "self-attention"):
            try:
                if dtype == np.float64:
                    call_named(s, "MultiHeadAttention(...).double()", (mha, "double"))
                state = _random_state(rng, D, bias, dtype)
                _load(s, mha, state)
                module = _reference_module(D, H, bias, {k: v.astype(np.float64) for k, v in state.items()})
                x, cases = _forward_cases(rng, D, H, dtype)
                _check_forward(s, mha, module, state, H, ("mha(x)", x, None, None, None, False))
            except AssertionError as e:
                raise AssertionError(f"{e}{structure}") from None
        if bias:
            continue
        for aspect, items in cases.items():
            with s.aspect(aspect):
                for case in items:
                    _check_forward(s, mha, module, state, H, case, weights=aspect != "masks")


# ---- load_torch_mha -------------------------------------------------------------------------


def _loaded(linears, sizes, bias, src):
    """The module's state_dict after the reference's load_torch_mha, and a function giving [(message, state_dict)]:
    what each defined mistake of load_torch_mha (autograder/lessons/multi_head/mistakes.py) leaves in the module. Both
    run here, on twins of the student's module (an AttentionShell holding `linears`) and of torch_mha (holding
    `src`), each mistake on its own copy; the mistakes run on the first call only, when a parameter is wrong."""

    def shell():
        return helpers.AttentionShell(
            {p: (torch.from_numpy(w), None if b is None else torch.from_numpy(b)) for p, (w, b) in linears.items()},
            **sizes,
        )

    tmha = helpers.torch_mha(sizes["d_model"], sizes["n_heads"], bias, {k: torch.from_numpy(v) for k, v in src.items()})
    right = ref.load_torch_mha(shell(), tmha).state_dict()

    @functools.lru_cache(maxsize=None)
    def wrong():
        return [
            (m.message, got.state_dict())
            for m, got in mistakes.on("03_multi_head", "load_torch_mha", shell(), tmha, fresh=True)
            if isinstance(got, torch.nn.Module)
        ]

    return right, wrong


IN_PLACE = "load_torch_mha must copy into the module's own parameters in place (param.copy_ under torch.no_grad())"


def _expect_in_place(s, shell, tmha, src, state, marked):
    """The module's parameters are still its own (marked: each had requires_grad=False before the call,
    which a new nn.Parameter does not keep) and share no memory with torch_mha (changing torch_mha's
    weights afterwards, from here, leaves the module's as they were)."""
    if marked:
        params = s.state(shell, keep_vars=True)  # one request, where a getattr per layer and parameter took 12
        for p, kind in ((p, kind) for p in PROJ for kind in ("weight", "bias")):
            got = params.get(f"{p}.{kind}") if isinstance(params, dict) else None
            if isinstance(got, Array) and got.requires_grad:
                fail(
                    f"{IN_PLACE}, not assign new ones: module.{p}.{kind} is a new nn.Parameter (or {p} a new "
                    "layer), so whatever held the module's parameters (an optimizer, a hook) no longer sees them"
                )
    s.load(tmha, {k: v + 1 for k, v in src.items()})
    after = s.state(shell)
    for key in sorted(state):
        if key in after and not np.array_equal(after[key].data, state[key].data):
            fail(
                f"{IN_PLACE}, not assign torch_mha's tensors: module.{key} shares memory with torch_mha, so a "
                "change to one changes the other"
            )


@CHECKS.add("load_torch_mha", aspects={"weights": 2, "biases": 1, "returns the module": 1, "copied in place": 1})
def load_torch_mha(s):
    rng = s.rng
    failed = set()
    for i, (D, H, bias) in enumerate([(12, 3, True), (16, 4, False), (20, 5, True), (8, 2, True)]):

        def rand(*shape):
            return rng.standard_normal(shape).astype(np.float32)

        src = {"in_proj_weight": rand(3 * D, D), "out_proj.weight": rand(D, D)}
        if bias:
            src.update({"in_proj_bias": rand(3 * D), "out_proj.bias": rand(D)})
        tmha = s.helper("torch_mha", D, H, bias, {k: tensor(v) for k, v in src.items()})
        init = {}
        for p in PROJ:
            init[f"{p}.weight"] = rand(D, D)
            if bias:
                init[f"{p}.bias"] = rand(D)
        linears = {p: (init[f"{p}.weight"], init[f"{p}.bias"] if bias else None) for p in PROJ}
        sizes = dict(d_model=D, n_heads=H, head_dim=D // H)
        shell = s.helper(
            "AttentionShell",
            {p: (tensor(w), None if b is None else tensor(b)) for p, (w, b) in linears.items()},
            **sizes,
        )
        right, wrong = _loaded(linears, sizes, bias, src)
        # The last case only: on parameters without requires_grad a copy_ outside torch.no_grad() does not
        # raise (it makes them require grad), so the other cases still show that mistake as it is.
        marked = i == 3
        if marked:
            s.call((shell, "requires_grad_"), False)
        with s.aspect("weights"):
            got = call_named(s, "load_torch_mha(module, torch_mha)", "load_torch_mha", shell, tmha)
            state = s.state(shell)
            if set(state) != set(init):
                fail(
                    f"after load_torch_mha the module's state_dict has entries {sorted(state)}: copy the weights into "
                    "the existing projections, don't add or remove any"
                )
        for key in sorted(init, key=lambda k: (k.endswith("bias"), PROJ.index(k.split(".")[0]))):  # weights first
            aspect = "biases" if key.endswith("bias") else "weights"
            # an aspect keeps its first message: once it failed, the mistakes need not run again
            known = (
                ()
                if aspect in failed
                else lambda key=key: [(m, reference(loaded[key].detach())) for m, loaded in wrong() if key in loaded]
            )
            with s.aspect(aspect):
                try:
                    expect_array(
                        state[key],
                        reference(right[key].detach()),
                        f"module.{key} after load_torch_mha",
                        known,
                        hint="in_proj_weight = [W_q; W_k; W_v] (3D, D), "
                        "in_proj_bias = [b_q; b_k; b_v]; out_proj is an nn.Linear",
                    )
                except AssertionError:
                    failed.add(aspect)
                    raise
        with s.aspect("returns the module"):
            if not isinstance(got, Handle) or "AttentionShell" not in got.type:
                fail(f"load_torch_mha should return the module it filled in, but returned {kind_of(got)}")
        with s.aspect("copied in place"):
            _expect_in_place(s, shell, tmha, src, state, marked)


# ---- mha_param_count ------------------------------------------------------------------------


def _count_mistakes(*args, **kwargs):
    """What the known mistakes (autograder/lessons/multi_head/mistakes.py) count for these arguments: expect_int's
    mistakes, run only when the answer is wrong."""
    return lambda: [(m.message, n) for m, n in mistakes.on("03_multi_head", "mha_param_count", *args, **kwargs)]


@CHECKS.add("mha_param_count", isolate=["MultiHeadAttention"], aspects={"count": 2, "bias=False": 1, "errors": 1})
def mha_param_count(s):
    rng = s.rng
    cases = [(64, 8, True), (64, 8, False), (96, 12, True), (120, 4, False), (48, 16, True), (256, 1, True)]
    for _ in range(4):
        H = int(rng.integers(2, 17))
        cases.append((H * int(rng.integers(2, 65)), H, bool(rng.integers(0, 2))))
    for D, H, bias in sorted(cases, key=lambda c: not c[2]):  # the core (bias=True) first
        with s.aspect("count" if bias else "bias=False"):
            got = call_named(s, "mha_param_count(d_model, n_heads, bias)", "mha_param_count", D, H, bias=bias)
            expect_int(
                got,
                ref.mha_param_count(D, H, bias),
                "mha_param_count(d_model, n_heads, bias)",
                mistakes=_count_mistakes(D, H, bias=bias),
            )
    with s.aspect("count"):
        got = call_named(s, "mha_param_count(d_model, n_heads)", "mha_param_count", 80, 4)
        expect_int(
            got,
            ref.mha_param_count(80, 4),
            "mha_param_count(d_model, n_heads) with bias left out",
            mistakes=_count_mistakes(80, 4),
        )
    with s.aspect("errors"):
        for D, H in [(10, 3), (100, 7), (64, 5)]:
            _expect_value_error(
                s, "mha_param_count(d_model, n_heads) with d_model not divisible by n_heads", "mha_param_count", D, H
            )
