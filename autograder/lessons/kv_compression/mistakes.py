"""Known-wrong answers and correct variants of lesson 08: sliding_window_mask, RollingKVCache,
MultiHeadLatentAttention, absorbed_attention."""

from autograder.checking.mistakes import Mistake, edited

_MASK = """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    if window < 1:
        raise ValueError("window must be at least 1")
    n_keys = n_queries if n_keys is None else n_keys
    p = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    j = torch.arange(n_keys, device=device)[None, :]
"""

_ROLL_INIT = """
class RollingKVCache:
    def __init__(self, batch_size, window, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        if window < 1:
            raise ValueError("window must be at least 1")
        self.k = torch.zeros(batch_size, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.window, self.length = window, 0
"""

_ROLL_REST = """
    def __len__(self):
        return self.length

    def reset(self):
        self.length = 0
"""

_SHIFT = """
    def update(self, k, v):
        kept = min(self.length, self.window)
        k_ctx = torch.cat([self.k[:, :, :kept], k], dim=2)
        v_ctx = torch.cat([self.v[:, :, :kept], v], dim=2)
        n = min(self.window, k_ctx.size(2))
        self.k[:, :, :n] = k_ctx[:, :, -n:]
        self.v[:, :, :n] = v_ctx[:, :, -n:]
"""


def _roll(update, rest=_ROLL_REST, init=_ROLL_INIT):
    return init + update + rest


_MLA_INIT = """
class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, d_latent, bias=False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError("d_model is not divisible by n_heads")
        self.d_model, self.n_heads, self.head_dim, self.d_latent = d_model, n_heads, d_model // n_heads, d_latent
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_down = nn.Linear(d_model, d_latent, bias=bias)
        self.k_up = nn.Linear(d_latent, d_model, bias=bias)
        self.v_up = nn.Linear(d_latent, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
"""

_MLA_HEAD = """
    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        c = self.kv_down(x)
        if cache is not None:
            c = cache.update(c)
        Tk = c.size(1)
        q = self.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
"""

_MLA_KV = """
        k, v = (up(c).view(B, Tk, H, Dh).transpose(1, 2) for up in (self.k_up, self.v_up))
"""

_MLA_MASK = """
        if mask is None:
            mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
"""

_MLA_OUT = """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))
"""


def _mla(body, init=_MLA_INIT):
    return init + _MLA_HEAD + body


_ABS_HEAD = """
def absorbed_attention(mla, x, latents):
    B, T, D = x.shape
    H, Dh, L = mla.n_heads, mla.head_dim, mla.d_latent
    Tk = latents.size(1)
    q = mla.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    w_uk = mla.k_up.weight.view(H, Dh, L)
    w_uv = mla.v_up.weight.view(H, Dh, L)
    w_o = mla.out_proj.weight.view(D, H, Dh)
    causal = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
"""

_ABS_BIAS = """
    if mla.v_up.bias is not None:
        out = out + mla.v_up.bias @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
"""


def _abs(body, bias=_ABS_BIAS):
    return _ABS_HEAD + body + bias


_ABS_FOLD = """
    folded = torch.einsum("hdl,ehd->hle", w_uv, w_o)
    out = torch.einsum("bhtl,hle->bte", o_latent, folded)
"""


def _abs_scores(q_latent="q @ w_uk", scale="/ math.sqrt(Dh)", fold=_ABS_FOLD, mask=True):
    masked = 'scores = scores.masked_fill(~causal, float("-inf"))\n    ' if mask else ""
    return (
        f"""
    q_latent = {q_latent}
    scores = q_latent @ latents.transpose(1, 2)[:, None] {scale}
    {masked}o_latent = scores.softmax(dim=-1) @ latents[:, None]
"""
        + fold
    )


_MATERIALISED_OUT = """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    out = out.transpose(1, 2).reshape(B, T, D) @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
"""


def _roll_in_store(mb):
    """A RollingKVCache that keeps every position seen, in an mb MiB float32 store its class reserves when the
    cell runs, before any memory bound begins (issue 19); past the store, in tensors that grow."""
    return _roll(
        """
    def update(self, k, v):
        B, H, n, Dh = k.shape
        cap = self._STORE.numel() // (2 * B * H * Dh)
        if self.length == 0:
            self.seen_k = self.seen_v = None
        if k.dtype == self._STORE.dtype and self.length + n <= cap:
            half = cap * B * H * Dh
            all_k = self._STORE[:half].view(B, H, cap, Dh)
            all_v = self._STORE[half:2 * half].view(B, H, cap, Dh)
            all_k[:, :, self.length:self.length + n] = k
            all_v[:, :, self.length:self.length + n] = v
            self.seen_k, self.seen_v = all_k[:, :, :self.length + n], all_v[:, :, :self.length + n]
        elif self.seen_k is None:
            self.seen_k, self.seen_v = k, v
        else:
            self.seen_k, self.seen_v = torch.cat([self.seen_k, k], dim=2), torch.cat([self.seen_v, v], dim=2)
        kept = min(self.length, self.window)
        self.length += n
        return self.seen_k[:, :, self.length - n - kept:], self.seen_v[:, :, self.length - n - kept:]
""",
        init=_ROLL_INIT.replace(
            "class RollingKVCache:\n",
            "class RollingKVCache:\n"
            f"    _STORE = torch.empty({mb} << 18)  # {mb} MiB of float32, reserved when the cell runs: "
            "room for every position\n\n",
        ),
    )


def _abs_in_buffer(mb):
    """An absorbed_attention that forms one head's keys at a time, written into an mb MiB float32 buffer given as a
    default argument (made when the cell runs, before any memory bound begins: issue 19); the values absorbed."""
    return f"""
def absorbed_attention(mla, x, latents, _keys=torch.empty({mb} << 18)):  # {mb} MiB of float32
    B, T, D = x.shape
    H, Dh = mla.n_heads, mla.head_dim
    Tk = latents.size(1)
    q = mla.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    causal = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
    outs = []
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        n = B * Tk * Dh
        buf = _keys[:n].view(B, Tk, Dh) if latents.dtype == _keys.dtype and n <= _keys.numel() else None
        with torch.no_grad():  # out= refuses autograd
            k_h = torch.matmul(latents, mla.k_up.weight[rows].T, out=buf)
        if mla.k_up.bias is not None:
            k_h.add_(mla.k_up.bias[rows])
        weights = (q[:, h] @ k_h.transpose(1, 2) / math.sqrt(Dh)).masked_fill(~causal, float("-inf")).softmax(-1)
        o_h = (weights @ latents) @ mla.v_up.weight[rows].T  # the weights sum to 1: v_up's bias comes once
        outs.append(o_h if mla.v_up.bias is None else o_h + mla.v_up.bias[rows])
    out = torch.cat(outs, dim=-1) @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
"""


# What RollingKVCache's check says where only evidence shows the mistake: its memory under a bound, an error.
MEMORY = (
    "RollingKVCache's memory grows with the number of positions seen: streaming many updates through a small "
    "window, it ran out of memory or kept far more than the window. Between calls keep only the last window "
    "positions (buffers of shape (B, Hkv, window, Dh)), never every position seen"
)
PREFILL = (
    "A prefill of T_new > window positions attends to all of them (return them all), then keep only its last "
    "window positions"
)


# What MultiHeadLatentAttention's check says when the cache it gave forward holds other than the latents.
# ... and when its members' biases do not follow bias (a template: bias, and which members should have one)
BIAS = (
    "with bias={bias}, {which} of the five nn.Linear members should have a bias: pass bias=bias to each of q_proj, "
    "kv_down, k_up, v_up and out_proj"
)
LATENTS = (
    "the cache must hold the latents c = kv_down(x), d_latent numbers per token (B, T, d_latent): not keys "
    "and values. Append c with cache.update(c) and up-project what it returns"
)


def _grows(what, code, keyword="memory"):
    """A RollingKVCache whose memory grows: only the streaming bound sees it."""
    return Mistake(what, keyword, code, message=MEMORY, aspect="fixed memory", evidence=True)


# What absorbed_attention's check says when its memory bound sees keys or values formed: a template the check fills
# with its case's sizes (Tk cached latents of width L; one head's keys take mib MiB).
FORMS_KEYS = (
    "absorbed_attention ran out of memory with {Tk} cached latents of width {L}: it forms keys or values "
    "for every cached position (one head's alone take {mib} MiB here). Fold k_up into the queries and v_up "
    "into the output projection, so that only (B, H, T, Tk) scores and the latents themselves ever involve "
    "every cached position (and make the causal mask (T, Tk), not (Tk, Tk))"
)
# ... and when the op log of a call that failed there shows a (Tk, Tk) tensor
SQUARE_MASK = (
    "absorbed_attention ran out of memory because its causal mask is (Tk, Tk), every cached position "
    "against every other, before keeping its last T rows: make it (T, Tk) directly, "
    "torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)"
)


# ... and when the CPU time of a call shows them formed, a few positions at a time (issue 33: no tensor spans every
# position then, only the work does)
FORMS_KEYS_IN_CHUNKS = (
    "absorbed_attention took as much CPU time with {Tk} cached latents as applying k_up and v_up to "
    "every one of them: it forms keys or values, if only a few positions at a time. Fold k_up "
    "into the queries and v_up into the output projection: only (B, H, T, Tk) scores and the "
    "latents themselves ever involve every cached position"
)
_IN_CHUNKS = (
    "\n@torch.no_grad()  # no graph keeping every chunk's keys alive: only the chunks are ever held"
    + _ABS_HEAD
    + """
    scores = torch.empty(B, H, T, Tk, dtype=x.dtype)
    for s in range(0, Tk, {chunk}):
        k = mla.k_up(latents[:, s:s + {chunk}]).view(B, -1, H, Dh).transpose(1, 2)
        scores[..., s:s + {chunk}] = q @ k.transpose(-2, -1) / math.sqrt(Dh)
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    o = torch.zeros(B, H, T, Dh, dtype=x.dtype)
    for s in range(0, Tk, {chunk}):
        v = mla.v_up(latents[:, s:s + {chunk}]).view(B, -1, H, Dh).transpose(1, 2)
        o = o + weights[..., s:s + {chunk}] @ v
    out = o.transpose(1, 2).reshape(B, T, D) @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
"""
)


def _forms_keys(what, code, message=FORMS_KEYS, keyword="memory"):
    """An absorbed_attention that forms keys or values (or a (Tk, Tk) mask): only the memory bound sees it."""
    return Mistake(what, keyword, code, message=message, aspect="never forms keys or values", evidence=True)


# What sliding_window_mask's check says when the mask it asked for on the "meta" device was made elsewhere.
DEVICE = (
    "sliding_window_mask ignored its device argument: the mask was made on the CPU whatever device it was "
    "asked for. Make its tensors there, torch.arange(..., device=device), so that a model on a GPU gets its "
    "mask on the GPU"
)

_OFF_BY_ONE = "it may see itself and the window - 1 keys before it, p - window < j <= p (an off-by-one: < against <=)"

MUTANTS = {
    "sliding_window_mask": [
        (
            "constant: a mask of all True",
            "window",
            """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    if window < 1:
        raise ValueError("window must be at least 1")
    return torch.ones(n_queries, n_queries if n_keys is None else n_keys, dtype=torch.bool, device=device)
""",
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    raise ValueError("window must be at least 1")
""",
        ),
        Mistake(
            "off by one: window + 1 keys (>= against >)",
            "off-by-one",
            _MASK
            + """
    return (j <= p) & (j >= p - window)
""",
            message="each query sees window + 1 keys: " + _OFF_BY_ONE,
            aspect="square masks",
        ),
        Mistake(
            "off by one: window - 1 keys",
            "off-by-one",
            _MASK
            + """
    return (j <= p) & (j > p - window + 1)
""",
            message="each query sees window - 1 keys: " + _OFF_BY_ONE,
            aspect="square masks",
        ),
        Mistake(
            "top-left alignment",
            "top-left",
            _MASK
            + """
    p = torch.arange(n_queries, device=device)[:, None]
    return (j <= p) & (j > p - window)
""",
            message=(
                "the mask is aligned top-left (query i at position i). With n_keys > n_queries the queries are the "
                "last n_queries positions: query i sits at p = i + n_keys - n_queries; align it bottom-right"
            ),
            aspect="more keys than queries",
        ),
        Mistake(
            "the first window keys (wrong end)",
            "wrong end",
            _MASK
            + """
    return (j <= p) & (j < window)
""",
            message=(
                "the window is counted from the wrong end: it keeps the first window keys. Query i at position p "
                "sees the window keys that END at p, p - window < j <= p"
            ),
            aspect="square masks",
        ),
        Mistake(
            "the window anchored at the last key (wrong end)",
            "wrong end",
            _MASK
            + """
    return (j <= p) & (j > n_keys - 1 - window)
""",
            message=(
                "the window is counted from the wrong end: it is anchored at the last key instead of at each "
                "query's own position p; query i sees p - window < j <= p"
            ),
            aspect="square masks",
        ),
        Mistake(
            "no causal part: a band on both sides",
            "causal",
            _MASK
            + """
    return (j - p).abs() < window
""",
            message="the causal part is missing: a query may never see a later key (j <= p)",
            aspect="square masks",
        ),
        # only the device the mask is made on shows it (the check reads it): every value is right
        Mistake(
            "device ignored: the mask is always made on the CPU",
            "device",
            edited(_MASK, (", device=device)", ")"))
            + """
    return (j <= p) & (j > p - window)
""",
            message=DEVICE,
            aspect="device",
            evidence=True,
        ),
        (
            "no ValueError for window < 1",
            "ValueError",
            """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    p = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    j = torch.arange(n_keys, device=device)[None, :]
    return (j <= p) & (j > p - window)
""",
        ),
    ],
    "RollingKVCache": [
        Mistake(
            "constant: update returns its input and keeps nothing",
            "only the new",
            _roll("""
    def update(self, k, v):
        self.length += k.size(2)
        return k, v
"""),
            message="update returned only the new positions: return the kept positions before them",
            aspect="before the window fills",
        ),
        (
            "constant: update raises ValueError for every input",
            "ValueError",
            _roll("""
    def update(self, k, v):
        raise ValueError("window is full")
"""),
        ),
        # Memory taken before the bound is part of it (issue 19): every position kept, in a store the class
        # reserved when the cell ran.
        _grows("every position kept, in a store reserved before the calls", _roll_in_store(32)),
        # ... up to HEADROOM_MB and just over it (a notebook holding more loses the aspect as over budget)
        *[
            _grows(f"every position kept, in a {mb} MiB store reserved before the calls", _roll_in_store(mb))
            for mb in (128, 256, 400)
        ],
        _grows(
            "memory grows: every position is kept",
            _roll("""
    def update(self, k, v):
        kept = min(self.length, self.window)
        if self.length == 0:
            self.all_k, self.all_v = k, v
            k_ctx, v_ctx = k, v
        else:
            k_ctx = torch.cat([self.all_k[:, :, self.all_k.size(2) - kept:], k], dim=2)
            v_ctx = torch.cat([self.all_v[:, :, self.all_v.size(2) - kept:], v], dim=2)
            self.all_k, self.all_v = torch.cat([self.all_k, k], dim=2), torch.cat([self.all_v, v], dim=2)
        self.length += k.size(2)
        return k_ctx, v_ctx
"""),
        ),
        # a correct window, plus a log of every key seen beside it: half of what the mutant above keeps
        _grows(
            "memory grows: every key seen is also logged",
            _roll(
                _SHIFT
                + """
        self.all_k = k if self.length == 0 else torch.cat([self.all_k, k], dim=2)
        self.length += k.size(2)
        return k_ctx, v_ctx
"""
            ),
        ),
        Mistake(
            "returns every position seen",
            "more than",
            _roll("""
    def update(self, k, v):
        if self.length == 0:
            self.all_k, self.all_v = k, v
        else:
            self.all_k, self.all_v = torch.cat([self.all_k, k], dim=2), torch.cat([self.all_v, v], dim=2)
        self.length += k.size(2)
        return self.all_k, self.all_v
"""),
            message=(
                "update returned more than the last window positions before the new ones: it keeps more than window "
                "positions (return the last min(window, len(cache)) kept positions, then the new ones)"
            ),
            aspect="after the window fills",
        ),
        Mistake(
            "ring buffer returned in storage order after wrapping",
            "time order",
            _roll("""
    def update(self, k, v):
        kept = min(self.length, self.window)
        k_ctx = torch.cat([self.k[:, :, :kept], k], dim=2)
        v_ctx = torch.cat([self.v[:, :, :kept], v], dim=2)
        for t in range(max(0, k.size(2) - self.window), k.size(2)):
            self.k[:, :, (self.length + t) % self.window] = k[:, :, t]
            self.v[:, :, (self.length + t) % self.window] = v[:, :, t]
        self.length += k.size(2)
        return k_ctx, v_ctx
"""),
            message=(
                "after the buffer wrapped, the kept positions came back in storage order, out of time order: "
                "return them oldest first (roll the ring buffer, or keep a shifting buffer)"
            ),
            aspect="after the window fills",
        ),
        Mistake(
            "drops the new tokens' own keys and values",
            "new tokens' own",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx[:, :, :-k.size(2)], v_ctx[:, :, :-v.size(2)]
"""
            ),
            message=(
                "update returned the kept positions but dropped the new tokens' own keys and values: return the "
                "kept positions followed by the T_new new ones"
            ),
            aspect="before the window fills",
        ),
        Mistake(
            "returns only the last window positions, new ones included",
            "BEFORE the call",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx[:, :, -self.window:], v_ctx[:, :, -self.window:]
"""
            ),
            message=(
                "update returned only the last window positions, new ones included: return the last "
                "min(window, len(cache)) positions seen BEFORE the call, followed by all T_new new ones"
            ),
            aspect="after the window fills",
        ),
        Mistake(
            "len counts only the kept positions",
            "seen so far",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                rest=_ROLL_REST.replace("return self.length", "return min(self.length, self.window)"),
            ),
            message="len(cache) is the number of positions seen so far, not only those kept",
            aspect="after the window fills",
        ),
        Mistake(
            "len counts calls to update",
            "calls",
            _roll(
                _SHIFT
                + """
        self.length += 1
        return k_ctx, v_ctx
"""
            ),
            message="len(cache) counts positions, not calls to update",
            aspect="before the window fills",
        ),
        Mistake(
            "update does not add T_new to the length",
            "seen so far",
            _roll(
                _SHIFT
                + """
        return k_ctx, v_ctx
"""
            ),
            message="len(cache) is still 0: it is the number of positions seen so far, so update must add T_new to it",
            aspect="before the window fills",
        ),
        Mistake(
            "len is the window",
            "has seen no positions",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                rest=_ROLL_REST.replace("return self.length", "return self.window"),
            ),
            message=(
                "len(cache) is window, but it counts the positions seen so far: a new cache has seen no positions "
                "(len 0), and each update adds its T_new"
            ),
            aspect="before the window fills",
        ),
        Mistake(
            "a prefill longer than the window is written into the buffer as is",
            "prefill",
            _roll("""
    def update(self, k, v):
        kept = min(self.length, self.window)
        k_ctx = torch.cat([self.k[:, :, :kept], k], dim=2)
        v_ctx = torch.cat([self.v[:, :, :kept], v], dim=2)
        if self.length == 0:
            self.k[:, :, :k.size(2)] = k
            self.v[:, :, :v.size(2)] = v
        else:
            n = min(self.window, k_ctx.size(2))
            self.k[:, :, :n] = k_ctx[:, :, -n:]
            self.v[:, :, :n] = v_ctx[:, :, -n:]
        self.length += k.size(2)
        return k_ctx, v_ctx
"""),
            message=PREFILL,
            aspect="prefill longer than the window",
            evidence=True,
        ),  # it raises: the check names the error
        Mistake(
            "the buffers ignore dtype",
            "dtype",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                init=_ROLL_INIT.replace("dtype=dtype, ", ""),
            ),
            message=(
                "the kept positions lost precision: the buffers are float32 although the cache was made with "
                "dtype=float64. Allocate them with the dtype (and device) given to RollingKVCache(...)"
            ),
            aspect="dtype and reset",
        ),
        Mistake(
            "reset does not reset the length",
            "reset",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                rest=_ROLL_REST.replace("self.length = 0", "pass"),
            ),
            message="reset() did not reset the length: len(cache) must be 0 after it",
            aspect="dtype and reset",
        ),
        (
            "no ValueError for window < 1",
            "ValueError",
            _roll(
                _SHIFT
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                init=_ROLL_INIT.replace(
                    """        if window < 1:
            raise ValueError("window must be at least 1")
""",
                    "",
                ),
            ),
        ),
        (
            "the window kept under another name (self.W)",
            "attribute",
            _roll(
                _SHIFT.replace("self.window", "self.W")
                + """
        self.length += k.size(2)
        return k_ctx, v_ctx
""",
                init=_ROLL_INIT.replace("self.window, self.length", "self.W, self.length"),
            ),
        ),
    ],
    "MultiHeadLatentAttention": [
        (
            "constant: forward returns zeros",
            "differs",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        return torch.zeros_like(x)
""",
        ),
        (
            "constant: forward returns its input",
            "differs",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        return x
""",
        ),
        (
            "constant: __init__ raises ValueError for every input",
            "ValueError",
            """
class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, d_latent, bias=False):
        super().__init__()
        raise ValueError("d_model is not divisible by n_heads")
""",
        ),
        Mistake(
            "caches keys and values instead of the latent",
            "latent",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        c = self.kv_down(x)
        kv = torch.cat([self.k_up(c), self.v_up(c)], dim=-1)
        if cache is not None:
            kv = cache.update(kv)
        Tk = kv.size(1)
        q = self.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
        k, v = (t.reshape(B, Tk, H, Dh).transpose(1, 2) for t in kv.split(self.d_model, dim=-1))
"""
            + _MLA_MASK
            + _MLA_OUT,
            message=LATENTS,
            aspect="cache",
            evidence=True,
        ),  # the check reads its cache
        Mistake(
            "wrong head split: head h takes features h, h + H, ...",
            "split",
            _mla(
                """
        k, v = (up(c).view(B, Tk, Dh, H).permute(0, 3, 1, 2) for up in (self.k_up, self.v_up))
"""
                + _MLA_MASK
                + _MLA_OUT
            ),
            message=(
                "the keys and values are split into heads the wrong way: after k_up and "
                "v_up, view (B, Tk, H, Dh) and transpose(1, 2), so that head h takes features "
                "h*Dh:(h+1)*Dh"
            ),
            aspect="forward",
        ),
        Mistake(
            "wrong head split: reshape to (B, H, Tk, Dh) without the transpose",
            "split",
            _mla(
                """
        k, v = (up(c).reshape(B, H, Tk, Dh) for up in (self.k_up, self.v_up))
"""
                + _MLA_MASK
                + _MLA_OUT
            ),
            message=(
                "the keys and values are split into heads the wrong way: view (B, Tk, H, "
                "Dh), then transpose(1, 2) (a reshape straight to (B, H, Tk, Dh) mixes "
                "positions and heads)"
            ),
            aspect="forward",
        ),
        Mistake(
            "heads merged without the transpose",
            "merged",
            _mla(_MLA_KV + _MLA_MASK + edited(_MLA_OUT, ("out.transpose(1, 2).reshape", "out.reshape"))),
            message=(
                "the heads are merged the wrong way: transpose(1, 2) back to (B, T, H, Dh) before "
                "reshape(B, T, D) (a reshape straight from (B, H, T, Dh) mixes positions and heads)"
            ),
        ),
        Mistake(
            "k_up and v_up swapped",
            "swapped",
            _mla(edited(_MLA_KV, ("(self.k_up, self.v_up)", "(self.v_up, self.k_up)")) + _MLA_MASK + _MLA_OUT),
            message="the keys and values are swapped: the keys are k_up(c), the values v_up(c)",
        ),
        # before "no causal mask": with a cache both drop the mask, and this one's message is the closer
        Mistake(
            "no causal mask with a cache",
            "causal mask",
            _mla(
                _MLA_KV
                + """
        if mask is None and cache is None:
            mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril()
"""
                + _MLA_OUT
            ),
            message=(
                "apply the causal mask (bottom-right aligned) when mask is None: with a cache too, each "
                "new token may see only the keys up to its own position"
            ),
            aspect="cache",
        ),
        Mistake(
            "no causal mask",
            "causal mask",
            _mla(_MLA_KV + _MLA_OUT),
            message=("apply the causal mask (bottom-right aligned) when mask is None: a token may not see later ones"),
            aspect="forward",
        ),
        Mistake(
            "is_causal=True: top-left with a cache",
            "top-left",
            _mla(
                _MLA_KV
                + """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))
"""
            ),
            message=(
                "with a cache the causal mask is aligned top-left: the new tokens are the last T of the Tk cached "
                "positions, so query i may see key j iff j <= i + (Tk - T)"
            ),
            aspect="cache",
        ),
        Mistake(
            "scale uses d_latent",
            "d_latent",
            _mla(
                _MLA_KV
                + _MLA_MASK
                + """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(self.d_latent))
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))
"""
            ),
            message=(
                "the scores are scaled by 1/sqrt(d_latent): the scale is 1/sqrt(head_dim), the width of the vectors "
                "whose dot product makes a score"
            ),
            aspect="forward",
        ),
        Mistake(
            "scores not scaled",
            "sqrt(head_dim)",
            _mla(
                _MLA_KV
                + _MLA_MASK
                + """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.d_model))
"""
            ),
            message="the scores are not scaled: divide them by sqrt(head_dim)",
            aspect="forward",
        ),
        Mistake(
            "the cache's latents are ignored: only the new tokens' own",
            "every cached latent",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        c = self.kv_down(x)
        if cache is not None:
            cache.update(c)
        Tk = c.size(1)
        q = self.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
"""
            + _MLA_KV
            + _MLA_MASK
            + _MLA_OUT,
            message=(
                "with a cache, the keys and values must come from every cached latent "
                "(what cache.update(c) returns), not only the new tokens' own"
            ),
            aspect="cache",
        ),
        # the check reads the members' parameters: the first has no bias with bias=True, the second one with False
        Mistake(
            "bias ignored: no member ever has a bias",
            "bias",
            _mla(_MLA_KV + _MLA_MASK + _MLA_OUT, init=_MLA_INIT.replace("bias=bias", "bias=False")),
            message=BIAS,
            aspect="bias",
            evidence=True,
        ),
        Mistake(
            "bias ignored: kv_down always has a bias",
            "bias",
            _mla(
                _MLA_KV + _MLA_MASK + _MLA_OUT,
                init=_MLA_INIT.replace(
                    "self.kv_down = nn.Linear(d_model, d_latent, bias=bias)",
                    "self.kv_down = nn.Linear(d_model, d_latent)",
                ),
            ),
            message=BIAS,
            aspect="forward",
            evidence=True,
        ),
        (
            "head_dim is d_latent // n_heads",
            "head_dim",
            _mla(
                _MLA_KV + _MLA_MASK + _MLA_OUT,
                init=_MLA_INIT.replace("d_model // n_heads, d_latent", "d_latent // n_heads, d_latent")
                + """
    @property
    def _dh(self):
        return self.d_model // self.n_heads
""",
            ).replace("H, Dh = self.n_heads, self.head_dim", "H, Dh = self.n_heads, self._dh"),
        ),
        Mistake(
            "the mask it is given is ignored: always the causal one",
            "not applied",
            _mla(
                _MLA_KV
                + """
        mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)
"""
                + _MLA_OUT
            ),
            message=(
                "the mask you were given was not applied: use mask when it is given, and the causal "
                "mask only when mask is None"
            ),
            aspect="mask",
        ),
        (
            "no ValueError when d_model % n_heads != 0",
            "ValueError",
            _mla(
                _MLA_KV + _MLA_MASK + _MLA_OUT,
                init=_MLA_INIT.replace(
                    """        if d_model % n_heads:
            raise ValueError("d_model is not divisible by n_heads")
""",
                    "",
                ),
            ),
        ),
    ],
    "absorbed_attention": [
        (
            "constant: returns zeros",
            "differs",
            """
def absorbed_attention(mla, x, latents):
    return torch.zeros_like(x)
""",
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            """
def absorbed_attention(mla, x, latents):
    raise ValueError("latents do not match mla")
""",
        ),
        _forms_keys(
            "materialises the keys and values (B, Tk, D)",
            _ABS_HEAD
            + """
    k = mla.k_up(latents).view(B, Tk, H, Dh).transpose(1, 2)
    v = mla.v_up(latents).view(B, Tk, H, Dh).transpose(1, 2)
"""
            + _MATERIALISED_OUT,
        ),
        _forms_keys(
            "materialises one head's keys and values at a time",
            _ABS_HEAD
            + """
    outs = []
    for h in range(H):
        k_h = latents @ w_uk[h].T
        v_h = latents @ w_uv[h].T
        if mla.k_up.bias is not None:
            k_h, v_h = k_h + mla.k_up.bias[h * Dh:(h + 1) * Dh], v_h + mla.v_up.bias[h * Dh:(h + 1) * Dh]
        scores = (q[:, h] @ k_h.transpose(1, 2) / math.sqrt(Dh)).masked_fill(~causal, float("-inf"))
        outs.append(scores.softmax(dim=-1) @ v_h)
    out = torch.cat(outs, dim=-1) @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
""",
        ),
        *[
            _forms_keys(
                f"keys and values formed {n} positions at a time",
                _IN_CHUNKS.format(chunk=n),
                message=FORMS_KEYS_IN_CHUNKS,
                keyword=keyword,
            )
            for n, keyword in ((2048, "keys or values"), (16, "few positions at a time"))
        ],
        _forms_keys(
            "absorbs the keys but materialises the values",
            _ABS_HEAD
            + """
    scores = (q @ w_uk) @ latents.transpose(1, 2)[:, None] / math.sqrt(Dh)
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    v = mla.v_up(latents).view(B, Tk, H, Dh).transpose(1, 2)
    out = (weights @ v).transpose(1, 2).reshape(B, T, D) @ mla.out_proj.weight.T
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
""",
        ),
        Mistake(
            "W_uk folded without the transpose",
            "transpose",
            _abs(_abs_scores(q_latent="q @ w_uk.transpose(1, 2)")),
            message=(
                "W_uk is folded into the queries without the transpose: k_h = c @ W_uk^h.T with W_uk^h = "
                "k_up.weight[h*Dh:(h+1)*Dh] (Dh, d_latent), so q_h k_h^T = (q_h @ W_uk^h) c^T"
            ),
            aspect="values",
        ),
        Mistake(
            "the scale applied twice",
            "twice",
            _abs(_abs_scores(scale="/ math.sqrt(Dh) / math.sqrt(Dh)")),
            message="the scale is applied twice: divide the scores by sqrt(head_dim) once",
            aspect="values",
        ),
        Mistake(
            "the scores not scaled",
            "sqrt(Dh)",
            _abs(_abs_scores(scale="")),
            message=(
                "the absorbed scores are not scaled: divide them by sqrt(head_dim) (the width of q_h and k_h, "
                "not d_latent), scores (q @ W_uk) @ latents^T / sqrt(Dh)"
            ),
            aspect="values",
        ),
        Mistake(
            "the scale uses d_latent",
            "d_latent",
            _abs(_abs_scores(scale="/ math.sqrt(L)")),
            message=(
                "the absorbed scores are scaled by 1/sqrt(d_latent): the scale is 1/sqrt(head_dim), as in the "
                "unabsorbed form"
            ),
            aspect="values",
        ),
        Mistake(
            "v_up and out_proj folded in the wrong order",
            "order",
            _abs(
                _abs_scores(
                    fold="""
    folded = w_o.permute(1, 2, 0).transpose(1, 2) @ w_uv
    out = torch.einsum("bhtl,hle->bte", o_latent, folded)
"""
                )
            ),
            message=(
                "v_up and out_proj are folded in the wrong order: the output is o_latent_h @ W_uv^h.T @ "
                "out_proj.weight[:, h*Dh:(h+1)*Dh].T (v_up first, then out_proj)"
            ),
            aspect="values",
        ),
        Mistake(
            "no causal mask",
            "causal",
            _abs(_abs_scores(mask=False)),
            message="the new tokens attend to every latent: the causal mask (bottom-right) still applies",
            aspect="values",
        ),
        _forms_keys(
            "a (Tk, Tk) causal mask, sliced to its last T rows",
            _ABS_HEAD.replace(
                "torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - T)",
                "torch.ones(Tk, Tk, dtype=torch.bool, device=x.device).tril()[Tk - T:]",
            )
            + _abs_scores()
            + _ABS_BIAS,
            message=SQUARE_MASK,
            keyword="mask is (Tk, Tk)",
        ),
        # Memory taken before the bound is part of it (issue 19): one head's keys at a time, written into a
        # buffer given as a default argument (made when the cell runs); the values absorbed.
        _forms_keys("one head's keys at a time, in a buffer reserved before the call", _abs_in_buffer(128)),
        *[
            _forms_keys(f"one head's keys at a time, in a {mb} MiB buffer reserved before the call", _abs_in_buffer(mb))
            for mb in (256, 400)
        ],
        Mistake(
            "v_up's bias dropped",
            "bias",
            _abs(
                _abs_scores(),
                bias="""
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias
    return out
""",
            ),
            message=(
                "v_up's bias is missing: it adds b_uv to every value, and the weights of a row sum to 1, so it "
                "passes through out_proj: add v_up.bias @ out_proj.weight.T"
            ),
            aspect="bias",
        ),
        Mistake(
            "a top-left causal mask (tril() without the offset)",
            "top-left",
            _ABS_HEAD.replace(".tril(diagonal=Tk - T)", ".tril()") + _abs_scores() + _ABS_BIAS,
            message=(
                "the causal mask is aligned top-left (tril() without an offset, or is_causal=True): the new "
                "tokens are the last T of the Tk latents, so query i sees latent j iff j <= i + Tk - T"
            ),
            aspect="values",
        ),
    ],
}

# A mutant whose cells keep more than another check's whole memory bound loses that check's memory aspect too.
ALSO_LOSES = {
    "one head's keys at a time, in a buffer reserved before the call": {
        "RollingKVCache": "the 128 MiB its cell keeps is more than the streaming bound, as it would be for any notebook"
    },
    # 400 MiB is more than HEADROOM_MB: the other memory-bound check refuses it as over budget too
    "every position kept, in a 400 MiB store reserved before the calls": {
        "absorbed_attention": "the 400 MiB its cell keeps is more than any memory-bound check allows before it"
    },
    "one head's keys at a time, in a 400 MiB buffer reserved before the call": {
        "RollingKVCache": "the 400 MiB its cell keeps is more than any memory-bound check allows before it"
    },
}

VARIANTS = {
    "sliding_window_mask": [
        (
            "tril difference",
            """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    if window < 1:
        raise ValueError("window must be at least 1")
    n_keys = n_queries if n_keys is None else n_keys
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    off = n_keys - n_queries
    return ones.tril(off) & ~ones.tril(off - window)
""",
        ),
        (
            "a loop over queries",
            """
def sliding_window_mask(n_queries, window, n_keys=None, device=None):
    if window < 1:
        raise ValueError(f"window={window} < 1")
    if n_keys is None:
        n_keys = n_queries
    mask = torch.zeros(n_queries, n_keys, dtype=torch.bool, device=device)
    for i in range(n_queries):
        p = i + n_keys - n_queries
        mask[i, max(0, p - window + 1):p + 1] = True
    return mask
""",
        ),
    ],
    "RollingKVCache": [
        (
            "a ring buffer, rolled into time order",
            """
class RollingKVCache:
    def __init__(self, batch_size, window, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        if window < 1:
            raise ValueError("window must be at least 1")
        self.k = torch.zeros(batch_size, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.window, self.length = window, 0

    def update(self, k, v):
        kept = min(self.length, self.window)
        order = [(self.length - kept + i) % self.window for i in range(kept)]
        k_ctx = torch.cat([self.k[:, :, order], k], dim=2)
        v_ctx = torch.cat([self.v[:, :, order], v], dim=2)
        T = k.size(2)
        for t in range(max(0, T - self.window), T):
            self.k[:, :, (self.length + t) % self.window] = k[:, :, t]
            self.v[:, :, (self.length + t) % self.window] = v[:, :, t]
        self.length += T
        return k_ctx, v_ctx

    def __len__(self):
        return self.length

    def reset(self):
        self.length = 0
""",
        ),
        (
            "a shifting buffer that is reallocated (cat, then clone the last window)",
            """
class RollingKVCache:
    def __init__(self, batch_size, window, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        if window < 1:
            raise ValueError("window must be at least 1")
        self.shape, self.dtype, self.device, self.window = (batch_size, n_kv_heads, 0, head_dim), dtype, device, window
        self.reset()

    def update(self, k, v):
        k_ctx, v_ctx = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k_ctx[:, :, -self.window:].clone(), v_ctx[:, :, -self.window:].clone()
        self.n += k.shape[2]
        return k_ctx, v_ctx

    def __len__(self):
        return self.n

    def reset(self):
        self.k = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros_like(self.k)
        self.n = 0
""",
        ),
    ],
    "MultiHeadLatentAttention": [
        (
            "einsum, explicit softmax, float64 inside",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        c = self.kv_down(x)
        if cache is not None:
            c = cache.update(c)
        Tk = c.shape[1]
        q = self.q_proj(x).double().reshape(B, T, H, Dh)
        k = self.k_up(c).double().reshape(B, Tk, H, Dh)
        v = self.v_up(c).double().reshape(B, Tk, H, Dh)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / Dh ** 0.5
        if mask is None:
            mask = torch.arange(Tk)[None, :] <= torch.arange(T)[:, None] + (Tk - T)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, self.d_model)
        return self.out_proj(out.to(x.dtype))
""",
        ),
        (
            "a loop over heads",
            _MLA_INIT
            + """
    def forward(self, x, mask=None, cache=None):
        B, T, D = x.shape
        c = self.kv_down(x)
        if cache is not None:
            c = cache.update(c)
        Tk, Dh = c.size(1), self.head_dim
        q, k, v = self.q_proj(x), self.k_up(c), self.v_up(c)
        if mask is None:
            mask = torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)
        heads = []
        for h in range(self.n_heads):
            sl = slice(h * Dh, (h + 1) * Dh)
            s = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(Dh)
            keep = mask[:, h] if mask.dim() == 4 and mask.size(1) > 1 else mask.squeeze(1) if mask.dim() == 4 else mask
            s = s.masked_fill(~keep, float("-inf"))
            heads.append(s.softmax(-1) @ v[..., sl])
        return self.out_proj(torch.cat(heads, dim=-1))
""",
        ),
    ],
    "absorbed_attention": [
        # the lesson's earlier reference: correct, though with B > 1 matmul copies the latents once per head
        ("the latents broadcast over the heads (latents[:, None])", _abs(_abs_scores())),
        (
            "a loop over heads",
            """
def absorbed_attention(mla, x, latents):
    B, T, D = x.shape
    H, Dh = mla.n_heads, mla.head_dim
    Tk = latents.size(1)
    q = mla.q_proj(x)
    keep = torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)
    out = mla.out_proj.bias.expand(B, T, D).clone() if mla.out_proj.bias is not None else x.new_zeros(B, T, D)
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        q_lat = q[..., rows] @ mla.k_up.weight[rows]                     # (B, T, L)
        s = (q_lat @ latents.transpose(1, 2) / math.sqrt(Dh)).masked_fill(~keep, float("-inf"))
        o_lat = s.softmax(-1) @ latents                                  # (B, T, L)
        w = mla.v_up.weight[rows].T @ mla.out_proj.weight[:, rows].T     # (L, D)
        out = out + o_lat @ w
        if mla.v_up.bias is not None:
            out = out + mla.v_up.bias[rows] @ mla.out_proj.weight[:, rows].T
    return out
""",
        ),
        (
            "float64 inside, einsum",
            """
def absorbed_attention(mla, x, latents):
    B, T, D = x.shape
    H, Dh, L = mla.n_heads, mla.head_dim, mla.d_latent
    Tk = latents.size(1)
    c = latents.double()
    q = mla.q_proj(x).double().view(B, T, H, Dh)
    q_lat = torch.einsum("bthd,hdl->bhtl", q, mla.k_up.weight.double().view(H, Dh, L))
    s = torch.einsum("bhtl,bsl->bhts", q_lat, c) * Dh ** -0.5
    s = s.masked_fill(torch.arange(Tk)[None, :] > torch.arange(T)[:, None] + (Tk - T), float("-inf"))
    o = torch.einsum("bhts,bsl->bhtl", s.softmax(-1), c)
    w = torch.einsum("hdl,ehd->hle", mla.v_up.weight.double().view(H, Dh, L),
                     mla.out_proj.weight.double().view(D, H, Dh))
    out = torch.einsum("bhtl,hle->bte", o, w)
    if mla.v_up.bias is not None:
        out = out + mla.out_proj.weight.double() @ mla.v_up.bias.double()
    if mla.out_proj.bias is not None:
        out = out + mla.out_proj.bias.double()
    return out.to(x.dtype)
""",
        ),
    ],
}

# Only the grader's CPU-time evidence sees this: no tensor it forms is larger than a visible test can bound.
HIDDEN_ONLY = {
    "keys and values formed 16 positions at a time": "16 positions of keys are smaller than anything a "
    "visible test can tell from honest work; the grader prices the CPU time of forming them"
}
