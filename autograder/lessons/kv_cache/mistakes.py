"""Known-wrong answers and correct variants of lesson 05: KVCache, attend_with_cache, generate."""

from autograder.checking.mistakes import Mistake, edited

_KV_INIT = """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0
"""

_KV_REST = """
    def __len__(self):
        return self.length

    def reset(self):
        self.length = 0
"""


def _kv(update, rest=_KV_REST, init=_KV_INIT):
    return init + update + rest


def _counting(count):
    """A cache right but for len(), which returns what update last set self.count to: `count`."""
    return """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = self.count = 0

    def update(self, k, v):
        start, end = self.length, self.length + k.size(2)
        if end > self.k.size(2):
            raise ValueError("KV cache full")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length, self.count = end, COUNT
        return self.k[:, :, :end], self.v[:, :, :end]

    def __len__(self):
        return self.count

    def reset(self):
        self.length = self.count = 0
""".replace("COUNT", count)


_CHECKED = """
    def update(self, k, v):
        start, end = self.length, self.length + k.size(2)
        if end > self.k.size(2):
            raise ValueError(f"KV cache full: {end} > max_seq_len={self.k.size(2)}")
"""

_ATTEND = """
def attend_with_cache(attn, x, cache):
    B, T, _ = x.shape
    q = attn.q_proj(x).view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
"""

_ATTEND_OK = (
    _ATTEND
    + """
    k_all, v_all = cache.update(k, v)
    Tk = k_all.size(2)
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
"""
)


def _attend(*replacements):
    """The correct attend_with_cache with (old, new) text replacements: one mistake each."""
    return edited(_ATTEND_OK, *replacements)


_GENERATE = """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = prompt_ids
    caches = model.make_caches(ids.size(0)) if use_cache else None
    new = ids
"""

MUTANTS = {
    "KVCache": [
        (
            "constant: update raises ValueError for every input",
            "ValueError",
            _kv("""
    def update(self, k, v):
        raise ValueError("KV cache full")
"""),
        ),
        (
            "constant: update returns its input and caches nothing",
            "advance",
            _kv("""
    def update(self, k, v):
        return k, v
"""),
        ),
        Mistake(
            "update overwrites from position 0",
            "position 0",
            _kv(
                _CHECKED
                + """
        self.k[:, :, :k.size(2)] = k
        self.v[:, :, :v.size(2)] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
"""
            ),
            message=(
                "the new entries overwrote the cache from position 0: write them at positions len(cache) ... "
                "len(cache) + T_new - 1"
            ),
        ),
        Mistake(
            "update does not advance the length",
            "advance",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]
"""
            ),
            message="len(cache) is still 0: update must advance the length by T_new",
        ),
        (
            "the length is never advanced: update returns buffer[:, :, :length]",
            "advance",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :self.length], self.v[:, :, :self.length]
"""
            ),
        ),
        (
            "grown with torch.cat, no preallocated buffers",
            "preallocate",
            """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.max_seq_len, self.dtype, self.device = max_seq_len, dtype, device
        self.k = self.v = None

    def update(self, k, v):
        if len(self) + k.size(2) > self.max_seq_len:
            raise ValueError("KV cache full")
        k, v = k.to(self.dtype), v.to(self.dtype)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def reset(self):
        self.k = self.v = None
""",
        ),
        (
            "preallocated buffers left unused: update concatenates",
            "in place",
            """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k_buf = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v_buf = torch.zeros_like(self.k_buf)
        self.k = self.v = None

    def update(self, k, v):
        if len(self) + k.size(2) > self.k_buf.size(2):
            raise ValueError("KV cache full")
        k, v = k.to(self.k_buf.dtype), v.to(self.k_buf.dtype)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def reset(self):
        self.k = self.v = None
""",
        ),
        Mistake(
            "update returns the whole preallocated buffer",
            "whole preallocated buffer",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k, self.v
"""
            ),
            message=(
                "it returned the whole preallocated buffer (B, Hkv, max_seq_len, Dh): return only the cached "
                "positions, buffer[:, :, :len(cache)]"
            ),
        ),
        Mistake(
            "update returns only the new keys and values",
            "only the new",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return k, v
"""
            ),
            message=(
                "it returned only the new entries, not everything cached so far: write them after the cached "
                "ones and advance the length by T_new (self.length += T_new)"
            ),
        ),
        Mistake(
            "update returns (values, keys)",
            "appended",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.v[:, :, :end], self.k[:, :, :end]
"""
            ),
            message="update must return (keys, values) in that order: the keys appended so far, then the values",
        ),
        Mistake(
            "len() is the size of the last update",
            "grow by T_new",
            _counting("k.size(2)"),
            message=(
                "len(cache) is the total number of cached positions, not the size of the last update: it must "
                "grow by T_new at each update"
            ),
        ),
        Mistake(
            "len() is max_seq_len",
            "number of cached positions",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
""",
                rest="""
    def __len__(self):
        return self.k.size(2)

    def reset(self):
        self.length = 0
""",
            ),
            message="len(cache) is the number of cached positions, not max_seq_len",
        ),
        Mistake(
            "len() counts calls to update",
            "calls to update",
            _counting("self.count + 1"),
            message="len(cache) counts cached positions, not calls to update",
        ),
        Mistake(
            "reset() does not reset the length",
            "reset",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
""",
                rest="""
    def __len__(self):
        return self.length

    def reset(self):
        self.k.zero_()
        self.v.zero_()
""",
            ),
            message=(
                "reset() did not reset the cache: len(cache) must be 0 after it, and the next update writes from "
                "position 0 again"
            ),
        ),
        (
            "no check for a full cache",
            "ValueError",
            _kv("""
    def update(self, k, v):
        start, end = self.length, self.length + k.size(2)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
"""),
        ),
        (
            "the length changes before the full check",
            "unchanged",
            _kv("""
    def update(self, k, v):
        start = self.length
        self.length += k.size(2)
        if self.length > self.k.size(2):
            raise ValueError("KV cache full")
        self.k[:, :, start:self.length] = k
        self.v[:, :, start:self.length] = v
        return self.k[:, :, :self.length], self.v[:, :, :self.length]
"""),
        ),
        (
            "full one position early (>= instead of >)",
            "exactly",
            _kv("""
    def update(self, k, v):
        start, end = self.length, self.length + k.size(2)
        if end >= self.k.size(2):
            raise ValueError("KV cache full")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
"""),
        ),
        (
            "the dtype argument is ignored",
            "dtype",
            _kv(
                _CHECKED
                + """
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
""",
                init="""
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim)
        self.v = torch.zeros_like(self.k)
        self.length = 0
""",
            ),
        ),
    ],
    "attend_with_cache": [
        (
            "constant: returns zeros",
            "differs",
            """
def attend_with_cache(attn, x, cache):
    return torch.zeros_like(x)
""",
        ),
        (
            "constant: returns its input",
            "differs",
            """
def attend_with_cache(attn, x, cache):
    return x
""",
        ),
        Mistake(
            "top-left mask (is_causal=True)",
            "top-left",
            _ATTEND
            + """
    k_all, v_all = cache.update(k, v)
    out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
            message=(
                "the causal mask is aligned top-left (is_causal=True, or tril() without an offset). The new "
                "queries are the last T of the Tk cached positions, so query i may see key j iff j <= i + (Tk - T): "
                "align the mask bottom-right"
            ),
        ),
        Mistake(
            "no mask",
            "causal mask",
            _ATTEND
            + """
    k_all, v_all = cache.update(k, v)
    out = F.scaled_dot_product_attention(q, k_all, v_all, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
            message=(
                "with several new tokens, each may attend only up to its own position: apply the causal mask "
                "(bottom-right aligned)"
            ),
        ),
        (
            "a square T x T mask, not offset by the cache length",
            "square",
            _ATTEND
            + """
    k_all, v_all = cache.update(k, v)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
        ),
        (
            "never appends to the cache",
            "append",
            _ATTEND
            + """
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
        ),
        Mistake(
            "appends, but attends to the new keys only",
            "append",
            _ATTEND
            + """
    cache.update(k, v)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
            message=(
                "the new queries attended only to the new keys: append the new keys and values to the cache "
                "and attend to everything cache.update(k, v) returns"
            ),
        ),
        Mistake(
            "key/value heads tiled, not interleaved",
            "in place",
            _ATTEND
            + """
    k_all, v_all = cache.update(k, v)
    n_rep = attn.n_heads // attn.n_kv_heads
    Tk = k_all.size(2)
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
    out = F.scaled_dot_product_attention(q, k_all.repeat(1, n_rep, 1, 1), v_all.repeat(1, n_rep, 1, 1), attn_mask=mask)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
            message=(
                "key/value head j serves query heads j*n_rep ... (j+1)*n_rep - 1: repeat each key/value head "
                "in place (repeat_kv, repeat_interleave or enable_gqa=True), do not tile them"
            ),
        ),
        (
            "the repeated key/value heads cached (repeat_kv before cache.update)",
            "appended to the cache",
            _ATTEND
            + """
    n_rep = attn.n_heads // attn.n_kv_heads
    k_all, v_all = cache.update(repeat_kv(k, n_rep), repeat_kv(v, n_rep))
    Tk = k_all.size(2)
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
        ),
        (
            "mask offset by the cache length before the update",
            "bottom-right",
            _ATTEND
            + """
    past = len(cache)
    k_all, v_all = cache.update(k, v)
    Tk = k_all.size(2)
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=past - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model))
""",
        ),
        Mistake(
            "out_proj left out",
            "out_proj",
            _ATTEND
            + """
    k_all, v_all = cache.update(k, v)
    Tk = k_all.size(2)
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(B, T, attn.d_model)
""",
            message="apply out_proj to the merged heads",
        ),
        Mistake(
            "a float 0/1 causal mask (added to the scores: hides nothing)",
            "float",
            _attend(("torch.ones(T, Tk, dtype=torch.bool)", "torch.ones(T, Tk)")),
            message=(
                "the causal mask is a float tensor of 0s and 1s: scaled_dot_product_attention adds a float mask "
                "to the scores, so it hides nothing; build it as bool (dtype=torch.bool), True = may attend"
            ),
        ),
        Mistake(
            "the keys to hide marked True (triu)",
            "may attend",
            _attend((".tril(diagonal=Tk - T)", ".triu(diagonal=Tk - T + 1)")),
            message=(
                "the causal mask marks the keys to hide: True in a mask means 'may attend', so query i's row is "
                "True at keys j <= i + (Tk - T) (tril(diagonal=Tk - T)), not at the later keys"
            ),
        ),
        Mistake(
            "heads merged without the transpose",
            "transpose",
            _attend(("out.transpose(1, 2).reshape(B, T", "out.reshape(B, T")),
            message="merge the heads in order: transpose (B, H, T, Dh) to (B, T, H, Dh) before reshaping to (B, T, D)",
        ),
        Mistake(
            "scaled by 1/sqrt(d_model)",
            "1/sqrt(head_dim)",
            _attend(("enable_gqa=True)", "enable_gqa=True, scale=attn.d_model ** -0.5)")),
            message="scale the scores by 1/sqrt(head_dim), the width of one head, not 1/sqrt(d_model)",
        ),
        Mistake(
            "scores not scaled",
            "1/sqrt(head_dim)",
            _attend(("enable_gqa=True)", "enable_gqa=True, scale=1.0)")),
            aspect="prefill and decode steps",
            message="scale the scores by 1/sqrt(head_dim)",
        ),
        Mistake(
            "values appended where the keys go (and read back swapped)",
            "where the keys go",
            _attend(("k_all, v_all = cache.update(k, v)", "v_all, k_all = cache.update(v, k)")),
            aspect="prefill and decode steps",
            message="you appended the values where the keys go: cache.update(k, v)",
        ),
    ],
    "generate": [
        (
            "constant: returns the prompt",
            "only the prompt",
            """
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    return prompt_ids
""",
        ),
        (
            "constant: raises ValueError for every input",
            "ValueError",
            """
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    raise ValueError("no model")
""",
        ),
        (
            "ignores use_cache: always recomputes",
            "use_cache",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = prompt_ids
    for _ in range(max_new_tokens):
        logits = model(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids
""",
        ),
        (
            "ignores use_cache: always caches",
            "use_cache",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = prompt_ids
    caches = model.make_caches(ids.size(0))
    new = ids
    for _ in range(max_new_tokens):
        logits = model(new, caches)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "one token too many",
            "one token too many",
            _GENERATE
            + """
    for _ in range(max_new_tokens + 1):
        logits = model(new, caches) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "one token too few",
            "one token too few",
            _GENERATE
            + """
    for _ in range(max_new_tokens - 1):
        logits = model(new, caches) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "feeds the last token too (one forward too many)",
            "one time too many",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    caches = model.make_caches(prompt_ids.size(0)) if use_cache else None
    ids = prompt_ids
    logits = model(ids, caches) if use_cache else model(ids)
    for _ in range(max_new_tokens):
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
        logits = model(new, caches) if use_cache else model(ids)
    return ids
""",
        ),
        (
            "feeds the whole sequence into the cached model",
            "newest token",
            _GENERATE
            + """
    for _ in range(max_new_tokens):
        logits = model(ids, caches) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "new caches at every step",
            "once, before the loop",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = new = prompt_ids
    for _ in range(max_new_tokens):
        logits = model(new, model.make_caches(ids.size(0))) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "samples instead of taking the argmax",
            "argmax",
            _GENERATE
            + """
    for _ in range(max_new_tokens):
        logits = model(new, caches) if use_cache else model(ids)
        new = torch.multinomial(logits[:, -1].softmax(dim=-1), 1)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "the first position's logits",
            "last position",
            _GENERATE
            + """
    for _ in range(max_new_tokens):
        logits = model(new, caches) if use_cache else model(ids)
        new = logits[:, 0].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids
""",
        ),
        (
            "the ids kept in a float buffer (torch.zeros' default dtype)",
            "long",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    B, T0 = prompt_ids.shape
    ids = torch.zeros(B, T0 + max_new_tokens)
    ids[:, :T0] = prompt_ids
    caches = model.make_caches(B) if use_cache else None
    for t in range(T0, T0 + max_new_tokens):
        feed = ids[:, :t] if not use_cache or t == T0 else ids[:, t - 1:t]
        ids[:, t] = model(feed, caches)[:, -1].argmax(dim=-1)
    return ids
""",
        ),
        (
            "returns only the new tokens",
            "prompt",
            _GENERATE
            + """
    for _ in range(max_new_tokens):
        logits = model(new, caches) if use_cache else model(ids)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids[:, prompt_ids.size(1):]
""",
        ),
    ],
}

VARIANTS = {
    "KVCache": [
        (
            "torch.empty buffers, narrow() views, a full check in its own method",
            """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.max_seq_len, self.pos = max_seq_len, 0

    def _check_room(self, n):
        if self.pos + n > self.max_seq_len:
            raise ValueError(f"the cache is full: {self.pos} + {n} positions > max_seq_len = {self.max_seq_len}")

    def update(self, k, v):
        n = k.shape[-2]
        self._check_room(n)
        self.keys.narrow(2, self.pos, n).copy_(k)
        self.values.narrow(2, self.pos, n).copy_(v)
        self.pos += n
        return self.keys.narrow(2, 0, self.pos), self.values.narrow(2, 0, self.pos)

    def __len__(self):
        return self.pos

    def reset(self):
        self.pos = 0
""",
        ),
        (
            "one buffer holding keys and values, index_copy_",
            """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.kv = torch.zeros(2, batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.n = 0

    def update(self, k, v):
        t = k.size(2)
        if self.n + t > self.kv.size(3):
            raise ValueError("KV cache is full")
        idx = torch.arange(self.n, self.n + t, device=k.device)
        self.kv[0].index_copy_(2, idx, k)
        self.kv[1].index_copy_(2, idx, v)
        self.n += t
        return self.kv[0, :, :, :self.n], self.kv[1, :, :, :self.n]

    def __len__(self):
        return self.n

    def reset(self):
        self.n = 0
        self.kv.zero_()
""",
        ),
        (
            "preallocated buffers written in place, copies of them returned",
            """
class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def update(self, k, v):
        end = self.length + k.size(2)
        if end > self.k.size(2):
            raise ValueError("KV cache is full")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end].clone(), self.v[:, :, :end].clone()

    def __len__(self):
        return self.length

    def reset(self):
        self.length = 0
""",
        ),
    ],
    "attend_with_cache": [
        (
            "float32 by hand: repeat_kv, an additive float mask, exp and sum",
            """
def attend_with_cache(attn, x, cache):
    B, T, D = x.shape
    n_rep = attn.n_heads // attn.n_kv_heads
    q = attn.q_proj(x).unflatten(-1, (attn.n_heads, attn.head_dim)).transpose(1, 2)
    k = attn.k_proj(x).unflatten(-1, (attn.n_kv_heads, attn.head_dim)).transpose(1, 2)
    v = attn.v_proj(x).unflatten(-1, (attn.n_kv_heads, attn.head_dim)).transpose(1, 2)
    k_all, v_all = cache.update(k, v)
    Tk = k_all.shape[2]
    allowed = torch.arange(Tk, device=x.device)[None, :] <= torch.arange(T, device=x.device)[:, None] + (Tk - T)
    bias = torch.zeros(T, Tk, dtype=x.dtype, device=x.device).masked_fill(~allowed, float("-inf"))
    scores = q @ repeat_kv(k_all, n_rep).transpose(-1, -2) / attn.head_dim ** 0.5 + bias
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    out = (weights / weights.sum(-1, keepdim=True)) @ repeat_kv(v_all, n_rep)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, D))
""",
        ),
        (
            "by hand: repeat_kv, einsum, float64 softmax, mask from positions",
            """
def attend_with_cache(attn, x, cache):
    B, T, D = x.shape
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = attn.q_proj(x).reshape(B, T, H, Dh).permute(0, 2, 1, 3)
    k = attn.k_proj(x).reshape(B, T, Hkv, Dh).permute(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(B, T, Hkv, Dh).permute(0, 2, 1, 3)
    k_all, v_all = cache.update(k, v)
    k_all, v_all = repeat_kv(k_all, H // Hkv), repeat_kv(v_all, H // Hkv)
    Tk = k_all.shape[2]
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), k_all.double()) / math.sqrt(Dh)
    query_pos = torch.arange(T).unsqueeze(1) + (Tk - T)
    scores = scores.masked_fill(torch.arange(Tk).unsqueeze(0) > query_pos, float("-inf"))
    out = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v_all.double()).to(x.dtype)
    return attn.out_proj(out.permute(0, 2, 1, 3).reshape(B, T, D))
""",
        ),
        (
            "a loop over key/value heads, PyTorch's causal_lower_right bias",
            """
def attend_with_cache(attn, x, cache):
    from torch.nn.attention.bias import causal_lower_right
    B, T, D = x.shape
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    g = H // Hkv
    q = attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
    k_all, v_all = cache.update(k, v)
    bias = causal_lower_right(T, k_all.size(2))
    outs = [F.scaled_dot_product_attention(q[:, j * g:(j + 1) * g], k_all[:, j:j + 1], v_all[:, j:j + 1],
                                           attn_mask=bias) for j in range(Hkv)]
    return attn.out_proj(torch.cat(outs, dim=1).transpose(1, 2).reshape(B, T, D))
""",
        ),
    ],
    "generate": [
        (
            "torch.max(...).indices, caches passed by keyword, the prompt sliced back in at the end",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    caches = model.make_caches(prompt_ids.shape[0]) if use_cache else None
    seq, new_tokens = prompt_ids, []
    feed = prompt_ids
    for _ in range(max_new_tokens):
        logits = model(feed, caches=caches) if use_cache else model(seq)
        nxt = torch.max(logits[:, -1, :], dim=-1).indices[:, None]
        new_tokens.append(nxt)
        seq = torch.cat([seq, nxt], dim=1)
        feed = nxt
    return torch.cat([prompt_ids] + new_tokens, dim=1)
""",
        ),
        (
            "prefill outside the loop, no forward after the last token",
            """
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = prompt_ids
    if max_new_tokens == 0:
        return ids
    with torch.no_grad():
        caches = model.make_caches(ids.shape[0]) if use_cache else None
        logits = model(ids, caches) if use_cache else model(ids)
        for step in range(max_new_tokens):
            next_id = torch.argmax(logits[:, -1, :], dim=-1).unsqueeze(1)
            ids = torch.cat((ids, next_id), dim=1)
            if step + 1 < max_new_tokens:
                logits = model(next_id, caches) if use_cache else model(ids, None)
    return ids
""",
        ),
        (
            "a while loop on the length, tokens in a list",
            """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    target = prompt_ids.size(1) + max_new_tokens
    tokens = [prompt_ids]
    caches = model.make_caches(len(prompt_ids)) if use_cache else None
    feed = prompt_ids
    while sum(t.size(1) for t in tokens) < target:
        if use_cache:
            logits = model(feed, caches=caches)
        else:
            logits = model(torch.cat(tokens, dim=1))
        feed = logits[:, -1:].argmax(-1)
        tokens.append(feed)
    return torch.cat(tokens, dim=1)
""",
        ),
    ],
}
