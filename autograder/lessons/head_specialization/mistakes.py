from autograder.checking.mistakes import Mistake

_ABLATE_HEADER = """
@contextlib.contextmanager
def ablate_head(model, layer, head):
    attn = model.layers[layer]
    if not 0 <= head < attn.n_heads:
        raise ValueError(f"head must be in 0..{attn.n_heads - 1}, got {head}")
    lo, hi = head * attn.head_dim, (head + 1) * attn.head_dim
"""


def _hook_mutant(zeroing, header=_ABLATE_HEADER, hooked="attn.out_proj"):
    """An ablate_head with a pre-hook on `hooked` (out_proj) whose zeroing line is `zeroing` (x is its input)."""
    return (
        header
        + f"""
    def hook(module, args):
        x = args[0].clone()
        {zeroing}
        return (x,)

    handle = {hooked}.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        handle.remove()
"""
    )


def _weights_mutant(zeroing):
    """An ablate_head that zeroes parameters (`zeroing`, under no_grad) and restores them all afterwards."""
    return (
        _ABLATE_HEADER
        + f"""
    saved = {{k: v.detach().clone() for k, v in attn.named_parameters()}}
    with torch.no_grad():
        {zeroing}
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, v in attn.named_parameters():
                v.copy_(saved[k])
"""
    )


_RAISES = """
def {sig}:
    raise ValueError("not this input")
"""

# what the ablate_head check says when it recognises each mistake (one message per mistake, some used twice)
WRONG_HEAD = (
    "you removed the wrong head: head h is features h*Dh:(h+1)*Dh of out_proj's input "
    "(the heads side by side, Dh = d_model // n_heads)"
)
WRONG_LAYER = "you removed a head of the wrong layer: use model.layers[layer]"
NOTHING = (
    "nothing changed: inside the with-block the head must contribute nothing to the output "
    "(zero its slice of out_proj's input, e.g. with a forward pre-hook on out_proj)"
)
LAYER = "you removed every head of the layer, not just one: zero only the head's slice h*Dh:(h+1)*Dh"
TIME = (
    "you zeroed a slice of the time axis (positions), not of the features: out_proj's input is (B, T, D), "
    "so head h is [..., h*Dh:(h+1)*Dh]"
)
ROWS = (
    "you zeroed the wrong projection weights: rows of out_proj.weight are its *output* features. Head h's "
    "input features are the columns out_proj.weight[:, h*Dh:(h+1)*Dh]"
)
LAYER_INPUT = (
    "you zeroed part of the layer's input (a hook on the whole layer, not on out_proj): every head of the "
    "layer reads it, so their attention changes. Register the pre-hook on model.layers[layer].out_proj, whose input is "
    "the heads' outputs side by side, and zero head h's slice h*Dh:(h+1)*Dh of it"
)
# zeroing a head's query or key rows gives the same scores (all 0), so one message names both
UNIFORM = (
    "you zeroed the wrong projection weights: zeroing a head's query or key projection only makes its attention "
    "uniform, the head still writes its output. Zero the head's output (its slice of out_proj's input)"
)
GROUP = (
    "this model shares each key/value head among a group of n_heads // n_kv_heads query heads: zeroing the "
    "value projection removes the whole group. Zero only this query head's output (its slice of out_proj's input)"
)

MUTANTS = {
    "previous_token_score": [
        Mistake(
            "the main diagonal (attention to itself)",
            "off by one",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=0, dim1=-2, dim2=-1).mean(dim=-1)
""",
            message=(
                "off by one: that is the main diagonal, each token's attention to itself. The previous token "
                "of query i is key i-1: pattern[:, i, i-1], the diagonal just below"
            ),
        ),
        Mistake(
            "two tokens back",
            "off by one",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=-2, dim1=-2, dim2=-1).mean(dim=-1)
""",
            message="off by one: that is key i-2. The previous token of query i is key i-1: pattern[:, i, i-1]",
        ),
        Mistake(
            "above the diagonal (rows and columns swapped)",
            "off by one",
            """
def previous_token_score(pattern):
    T = pattern.shape[-1]
    return torch.stack([pattern[:, i - 1, i] for i in range(1, T)], dim=-1).mean(dim=-1)
""",
            message=(
                "off by one: pattern[:, i, i+1] is above the diagonal (the future, 0 under the causal mask). "
                "Rows are queries, so the previous token of query i is pattern[:, i, i-1]"
            ),
        ),
        Mistake(
            "divides by T: position 0 included",
            "position 0",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / pattern.shape[-1]
""",
            message="position 0 has no previous token: average over the T-1 queries i = 1..T-1, not over all T",
        ),
        Mistake(
            "position 0 counted with its attention to itself",
            "position 0",
            """
def previous_token_score(pattern):
    i = torch.arange(pattern.shape[-1])
    return pattern[:, i, (i - 1).clamp(min=0)].mean(dim=-1)
""",
            message="position 0 has no previous token: don't count its attention to itself, "
            "average over i = 1..T-1 only",
        ),
        (
            "index i - 1 for every i: position 0 reads key -1",
            "position 0",
            """
def previous_token_score(pattern):
    i = torch.arange(pattern.shape[-1])
    return pattern[:, i, i - 1].mean(dim=-1)
""",
        ),
        (
            "averaged over the heads",
            "per head",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=0)
""",
        ),
        (
            "one number for all heads",
            "per head",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean()
""",
        ),
        Mistake(
            "sum, not mean",
            "mean",
            """
def previous_token_score(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1)
""",
            message="take the mean over positions, not the sum",
        ),
        (
            "constant: returns zeros",
            "off by one",
            """
def previous_token_score(pattern):
    return torch.zeros(pattern.shape[0], dtype=pattern.dtype)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="previous_token_score(pattern)")),
    ],
    "duplicate_token_score": [
        Mistake(
            "a token counted as its own duplicate",
            "own duplicate",
            """
def duplicate_token_score(pattern, tokens):
    same = (tokens[:, None] == tokens[None, :]).tril()
    return (pattern * same).sum(dim=-1).mean(dim=-1)
""",
            message="a token is not its own duplicate: count the attention on earlier copies j < i only, "
            "not on i itself",
        ),
        Mistake(
            "itself counted, at positions with an earlier copy",
            "own duplicate",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    has_copy = earlier.any(dim=-1)
    if not has_copy.any():
        raise ValueError("no token repeats")
    same = (tokens[:, None] == tokens[None, :]).tril()
    return (pattern * same).sum(dim=-1)[:, has_copy].mean(dim=-1)
""",
            message="a token is not its own duplicate: count the attention on earlier copies j < i only, "
            "not on i itself",
        ),
        Mistake(
            "averaged over every position",
            "only over the positions",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    if not earlier.any():
        raise ValueError("no token repeats")
    return (pattern * earlier).sum(dim=-1).mean(dim=-1)
""",
            message="average only over the positions that have an earlier copy "
            "(the others have nothing to look back at)",
        ),
        Mistake(
            "first occurrences of repeated tokens included",
            "earlier",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    others = (tokens[:, None] == tokens[None, :]) & ~torch.eye(len(tokens), dtype=torch.bool)
    has_copy = others.any(dim=-1)
    if not has_copy.any():
        raise ValueError("no token repeats")
    return (pattern * earlier).sum(dim=-1)[:, has_copy].mean(dim=-1)
""",
            message=(
                "only positions with an *earlier* copy count: the first occurrence of a token has no copy to "
                "look back at"
            ),
        ),
        Mistake(
            "mean over the copies instead of their total",
            "add up",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    has_copy = earlier.any(dim=-1)
    if not has_copy.any():
        raise ValueError("no token repeats")
    per_copy = (pattern * earlier).sum(dim=-1) / earlier.sum(dim=-1).clamp(min=1)
    return per_copy[:, has_copy].mean(dim=-1)
""",
            message=(
                "add up the attention on all earlier copies of the token (the mass on them), don't average it "
                "over the copies"
            ),
        ),
        Mistake(
            "averaged over the heads",
            "per head",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    has_copy = earlier.any(dim=-1)
    if not has_copy.any():
        raise ValueError("no token repeats")
    return (pattern * earlier).sum(dim=-1)[:, has_copy].mean(dim=0)
""",
            message=(
                "you averaged over the heads: one score per head: average over the query positions (not over "
                "the heads, not over everything), so the result has shape (H,)"
            ),
        ),
        # No message: the check recognises it by the pattern it was given, not by running this definition,
        # which would change the check's own pattern.
        (
            "the pattern masked in place (mul_)",
            "in place",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    has_copy = earlier.any(dim=-1)
    if not has_copy.any():
        raise ValueError("no token repeats")
    pattern.mul_(earlier)
    return pattern.sum(dim=-1)[:, has_copy].mean(dim=-1)
""",
        ),
        (
            "NaN instead of a ValueError when nothing repeats",
            "ValueError",
            """
def duplicate_token_score(pattern, tokens):
    earlier = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)
    has_copy = earlier.any(dim=-1)
    return (pattern * earlier).sum(dim=-1)[:, has_copy].mean(dim=-1)
""",
        ),
        (
            "a float32 accumulator",
            "dtype",
            """
def duplicate_token_score(pattern, tokens):
    H, T = pattern.shape[0], pattern.shape[-1]
    total, count = torch.zeros(H), 0
    for i in range(T):
        copies = [j for j in range(i) if tokens[j] == tokens[i]]
        if copies:
            total += pattern[:, i, copies].sum(dim=-1)   # in place: stays float32
            count += 1
    if count == 0:
        raise ValueError("no token repeats")
    return total / count
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def duplicate_token_score(pattern, tokens):
    return torch.zeros(pattern.shape[0], dtype=pattern.dtype)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="duplicate_token_score(pattern, tokens)")),
    ],
    "induction_score": [
        Mistake(
            "key i - period (the earlier copy itself)",
            "i - period + 1",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=-period, dim1=-2, dim2=-1).mean(dim=-1)
""",
            message=(
                "wrong offset: key i - period is the earlier copy of the current token (what a duplicate-token "
                "head looks at). An induction head looks at the token that came *after* that copy: key i - period + 1"
            ),
        ),
        Mistake(
            "key i - 1 (the previous token)",
            "i - period + 1",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1)[:, period - 1:].mean(dim=-1)
""",
            message=(
                "wrong offset: key i - 1 is the previous token. An induction head looks at the token after the "
                "earlier copy of the current token: key i - period + 1"
            ),
        ),
        Mistake(
            "key i - period - 1",
            "i - period + 1",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=-period - 1, dim1=-2, dim2=-1).mean(dim=-1)
""",
            message="wrong offset: the token after the earlier copy of token i is at i - period + 1, "
            "not i - period - 1",
        ),
        Mistake(
            "query period - 1 included",
            "i = period..T-1",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1).mean(dim=-1)
""",
            message=(
                "average over the queries i = period..T-1 only (i - period + 1 with i = period - 1 is key 0, "
                "which is not the token after an earlier copy)"
            ),
        ),
        Mistake(
            "sum over the queries, not mean",
            "mean",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1)[:, 1:].sum(dim=-1)
""",
            message="take the mean over the queries i = period..T-1, not the sum",
        ),
        (
            "averaged over the heads",
            "per head",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1)[:, 1:].mean(dim=0)
""",
        ),
        (
            "one number for all heads",
            "per head",
            """
def induction_score(pattern, period):
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1)[:, 1:].mean()
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def induction_score(pattern, period):
    return torch.zeros(pattern.shape[0], dtype=pattern.dtype)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="induction_score(pattern, period)")),
    ],
    "ablate_head": [
        Mistake(
            "the next head",
            "wrong head",
            _hook_mutant("nxt = (lo + attn.head_dim) % x.shape[-1]\n        x[..., nxt:nxt + attn.head_dim] = 0"),
            message=WRONG_HEAD,
        ),
        Mistake("a time slice (positions lo:hi)", "time axis", _hook_mutant("x[:, lo:hi] = 0"), message=TIME),
        Mistake("the whole layer", "every head", _hook_mutant("x[...] = 0"), message=LAYER),
        Mistake(
            "the hook on the whole layer (its input), not on out_proj",
            "layer's input",
            _hook_mutant("x[..., lo:hi] = 0", hooked="attn"),
            message=LAYER_INPUT,
        ),
        Mistake(
            "always layer 0",
            "wrong layer",
            _hook_mutant(
                "x[..., lo:hi] = 0", _ABLATE_HEADER.replace("attn = model.layers[layer]", "attn = model.layers[0]")
            ),
            message=WRONG_LAYER,
        ),
        Mistake(
            "rows of out_proj.weight",
            "wrong projection",
            _weights_mutant("attn.out_proj.weight[lo:hi] = 0\n        attn.out_proj.bias[lo:hi] = 0"),
            message=ROWS,
        ),
        Mistake(
            "the query projection",
            "wrong projection",
            _weights_mutant("attn.qkv.weight[lo:hi] = 0\n        attn.qkv.bias[lo:hi] = 0"),
            message=UNIFORM,
        ),
        Mistake(
            "the key projection",
            "wrong projection",
            _weights_mutant(
                "k0 = attn.n_heads * attn.head_dim\n"
                "        g = head // (attn.n_heads // attn.n_kv_heads)\n"
                "        attn.qkv.weight[k0 + g * attn.head_dim:k0 + (g + 1) * attn.head_dim] = 0\n"
                "        attn.qkv.bias[k0 + g * attn.head_dim:k0 + (g + 1) * attn.head_dim] = 0"
            ),
            message=UNIFORM,
        ),
        Mistake(
            "the value projection: the whole group under GQA",
            "group",
            _weights_mutant(
                "v0 = attn.qkv.out_features - attn.n_kv_heads * attn.head_dim\n"
                "        g = head // (attn.n_heads // attn.n_kv_heads)\n"
                "        attn.qkv.weight[v0 + g * attn.head_dim:v0 + (g + 1) * attn.head_dim] = 0\n"
                "        attn.qkv.bias[v0 + g * attn.head_dim:v0 + (g + 1) * attn.head_dim] = 0"
            ),
            message=GROUP,
        ),
        (
            "no try/finally: an error in the with-block leaves the hook",
            "finally",
            _ABLATE_HEADER
            + """
    def hook(module, args):
        x = args[0].clone()
        x[..., lo:hi] = 0
        return (x,)

    handle = attn.out_proj.register_forward_pre_hook(hook)
    yield model
    handle.remove()
""",
        ),
        (
            "weights left zeroed",
            "not restored",
            _ABLATE_HEADER
            + """
    with torch.no_grad():
        attn.out_proj.weight[:, lo:hi] = 0
    yield model
""",
        ),
        (
            "restored from a view, not a copy",
            "not restored",
            _ABLATE_HEADER
            + """
    saved = attn.out_proj.weight[:, lo:hi]
    with torch.no_grad():
        attn.out_proj.weight[:, lo:hi] = 0
    try:
        yield model
    finally:
        with torch.no_grad():
            attn.out_proj.weight[:, lo:hi] = saved
""",
        ),
        (
            "hook never removed",
            "hook",
            _ABLATE_HEADER
            + """
    def hook(module, args):
        x = args[0].clone()
        x[..., lo:hi] = 0
        return (x,)

    attn.out_proj.register_forward_pre_hook(hook)
    yield model
""",
        ),
        (
            "leaving clears every hook",
            "outer",
            _ABLATE_HEADER
            + """
    def hook(module, args):
        x = args[0].clone()
        x[..., lo:hi] = 0
        return (x,)

    attn.out_proj.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        attn.out_proj._forward_pre_hooks.clear()
""",
        ),
        (
            "one hook slot per layer: nested ablations replace each other",
            "nested",
            _ABLATE_HEADER
            + """
    def hook(module, args):
        x = args[0].clone()
        x[..., lo:hi] = 0
        return (x,)

    if getattr(attn, "_ablation", None) is not None:
        attn._ablation.remove()
    attn._ablation = attn.out_proj.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        if attn._ablation is not None:
            attn._ablation.remove()
        attn._ablation = None
""",
        ),
        (
            "no check of the head index",
            "ValueError",
            """
@contextlib.contextmanager
def ablate_head(model, layer, head):
    attn = model.layers[layer]
    lo, hi = head * attn.head_dim, (head + 1) * attn.head_dim

    def hook(module, args):
        x = args[0].clone()
        x[..., lo:hi] = 0
        return (x,)

    handle = attn.out_proj.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        handle.remove()
""",
        ),
        Mistake("nothing happens", "nothing changed", _hook_mutant("pass"), message=NOTHING),
        (
            "a negative head accepted (it removes nothing)",
            "ValueError",
            _hook_mutant(
                "x[..., lo:hi] = 0",
                _ABLATE_HEADER.replace("if not 0 <= head < attn.n_heads:", "if head >= attn.n_heads:"),
            ),
        ),
        (
            "constant: does nothing, for every head",
            "nothing changed",
            """
@contextlib.contextmanager
def ablate_head(model, layer, head):
    yield model
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="ablate_head(model, layer, head)")),
    ],
}

VARIANTS = {
    "previous_token_score": [
        (
            "a loop over positions, float64 inside",
            """
def previous_token_score(pattern):
    T = pattern.shape[-1]
    total = sum(pattern[:, i, i - 1].double() for i in range(1, T))
    return (total / (T - 1)).to(pattern.dtype)
""",
        ),
        (
            "a mask of the sub-diagonal",
            """
def previous_token_score(pattern):
    T = pattern.shape[-1]
    below = torch.ones(T, T, dtype=torch.bool).tril(-1) & torch.ones(T, T, dtype=torch.bool).triu(-1)
    return (pattern * below).sum(dim=-1)[:, 1:].mean(dim=-1)
""",
        ),
    ],
    "duplicate_token_score": [
        (
            "a loop over positions",
            """
def duplicate_token_score(pattern, tokens):
    T = pattern.shape[-1]
    scores = []
    for i in range(T):
        copies = (tokens[:i] == tokens[i]).nonzero().flatten()
        if len(copies):
            scores.append(pattern[:, i, copies].sum(dim=-1))
    if not scores:
        raise ValueError("no token occurs twice")
    return torch.stack(scores, dim=-1).mean(dim=-1)
""",
        ),
        (
            "einsum and a weighted mean",
            """
def duplicate_token_score(pattern, tokens):
    T = len(tokens)
    earlier = ((tokens[:, None] == tokens[None, :]) & (torch.arange(T)[None, :] < torch.arange(T)[:, None]))
    weights = earlier.any(dim=-1).to(pattern.dtype)
    if weights.sum() == 0:
        raise ValueError("tokens never repeat")
    mass = torch.einsum("hij,ij->hi", pattern, earlier.to(pattern.dtype))
    return (mass * weights).sum(dim=-1) / weights.sum()
""",
        ),
    ],
    "induction_score": [
        (
            "a loop over queries",
            """
def induction_score(pattern, period):
    T = pattern.shape[-1]
    return torch.stack([pattern[:, i, i - period + 1] for i in range(period, T)], dim=-1).mean(dim=-1)
""",
        ),
        (
            "a slice, then its diagonal",
            """
def induction_score(pattern, period):
    return pattern[:, period:, 1:].diagonal(dim1=-2, dim2=-1).mean(dim=-1)
""",
        ),
    ],
    "ablate_head": [
        (
            "a class with __enter__ and __exit__",
            """
class ablate_head:
    def __init__(self, model, layer, head):
        self.attn = model.layers[layer]
        if not 0 <= head < self.attn.n_heads:
            raise ValueError(f"no head {head}")
        self.model, self.cols = model, slice(head * self.attn.head_dim, (head + 1) * self.attn.head_dim)

    def _zero(self, module, args):
        x = args[0].clone()
        x[..., self.cols] = 0
        return (x,)

    def __enter__(self):
        self.handle = self.attn.out_proj.register_forward_pre_hook(self._zero)
        return self.model

    def __exit__(self, exc_type, exc, tb):
        self.handle.remove()
        return False
""",
        ),
        (
            "zero out_proj's columns, then put them back",
            """
@contextlib.contextmanager
def ablate_head(model, layer, head):
    attn = model.layers[layer]
    if head < 0 or head >= attn.n_heads:
        raise ValueError("no such head")
    cols = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    saved = attn.out_proj.weight[:, cols].detach().clone()
    with torch.no_grad():
        attn.out_proj.weight[:, cols] = 0
    try:
        yield model
    finally:
        with torch.no_grad():
            attn.out_proj.weight[:, cols] = saved
""",
        ),
        (
            "a class with __enter__ and __exit__, multiplying by a mask",
            """
class ablate_head:
    def __init__(self, model, layer, head):
        self.attn = model.layers[layer]
        if not 0 <= head < self.attn.n_heads:
            raise ValueError(f"head {head} does not exist")
        self.model, self.head = model, head

    def __enter__(self):
        keep = torch.ones(self.attn.n_heads, self.attn.head_dim)
        keep[self.head] = 0
        keep = keep.flatten()
        self.handle = self.attn.out_proj.register_forward_pre_hook(lambda m, args: (args[0] * keep.to(args[0].dtype),))
        return self.model

    def __exit__(self, *exc):
        self.handle.remove()
        return False
""",
        ),
    ],
}
