"""Known mistakes and correct variants of lesson 10 (relation_accuracy, offset_baseline, rare_word_score,
head_importance, prune_heads)."""

from autograder.checking.mistakes import Mistake, edited

_RAISES = """
def {sig}:
    raise ValueError("not this input")
"""

# What the visible test and the check say of a key compared by its position with the minimum's
TIES_OF_COUNTS = (
    "ties of counts: every key whose count equals the lowest count among tokens[0..i] qualifies, a copy of the "
    "rarest token included, not only one position of the minimum (torch.cummin's indices give the last among equal "
    "counts, argmin the first position of the minimum): compare counts, count[top] == lowest"
)

_RARE = """
def rare_word_score(pattern, tokens, counts):
    T = pattern.shape[-1]
    count = {count}
    lowest = {lowest}
    past = torch.ones(T, T, dtype=torch.bool).tril({diagonal})
    top = {top}
    hit = count[top] == lowest
    return {mean}
"""


def _rare(
    count="counts[tokens]",
    lowest="count.cummin(dim=0).values",
    diagonal="",
    top='pattern.masked_fill(~past, float("-inf")).argmax(dim=-1)',
    mean="hit[:, 1:].to(pattern.dtype).mean(dim=-1)",
):
    """A rare_word_score with one piece replaced."""
    return _RARE.format(count=count, lowest=lowest, diagonal=diagonal, top=top, mean=mean)


_IMPORTANCE = """
def head_importance(model, ids, targets):
    {prelude}weight = next(model.parameters())
    total = torch.zeros(model.n_layers, model.n_heads, dtype=weight.dtype)
    with torch.enable_grad():
        for b in range(ids.shape[0]):
            mask = torch.ones_like(total, requires_grad=True)
            loss = F.cross_entropy(model(ids[b:b + 1], head_mask=mask)[0], targets[b])
            total += {term}
    return {result}
"""


def _importance(term="torch.autograd.grad(loss, mask)[0].abs()", result="total / ids.shape[0]", prelude=""):
    """A head_importance with one piece replaced (prelude: lines before the rest, each ending in a newline and
    the body's indent)."""
    return _IMPORTANCE.format(term=term, result=result, prelude=prelude)


_PRUNE = """
def prune_heads(importance, n_prune):
    if not 0 <= n_prune <= importance.numel():
        raise ValueError(f"n_prune must be in 0..{{importance.numel()}}, got {{n_prune}}")
    dtype = importance.dtype if importance.is_floating_point() else torch.float32
    order = {order}
    mask = torch.ones(importance.numel(), dtype={dtype})
    mask[order[:n_prune]] = 0
    return mask.view(importance.shape)
"""


def _prune(order="torch.argsort(importance.flatten(), stable=True)", dtype="dtype"):
    return _PRUNE.format(order=order, dtype=dtype)


IGNORE_INDEX = (
    "every target counts: the loss is F.cross_entropy(logits[b], targets[b]), without ignore_index (the "
    "lesson's training skips padding, but head_importance is given its targets aligned, every one counted)"
)

MUTANTS = {
    "relation_accuracy": [
        Mistake(
            "the weight on `to`, not whether it is the largest",
            "argmax",
            """
def relation_accuracy(pattern, pairs):
    return pattern[:, pairs[:, 0], pairs[:, 1]].mean(dim=-1)
""",
            message=(
                "count the pairs whose largest weight is at `to` (argmax of the row), not the weight the head "
                "puts on `to`"
            ),
        ),
        Mistake(
            "argmax over the keys up to `from` only",
            "whole row",
            """
def relation_accuracy(pattern, pairs):
    T = pattern.shape[-1]
    rows = pattern[:, pairs[:, 0], :]
    later = torch.arange(T)[None, :] > pairs[:, 0][:, None]
    top = rows.masked_fill(later, float("-inf")).argmax(dim=-1)
    return (top == pairs[:, 1]).to(pattern.dtype).mean(dim=-1)
""",
            message=(
                "take the key with the largest weight over the whole row, later keys included (the contract's "
                "argmax over the row)"
            ),
        ),
        Mistake(
            "ties broken the other way (the highest index)",
            "lowest index",
            """
def relation_accuracy(pattern, pairs):
    T = pattern.shape[-1]
    top = T - 1 - pattern[:, pairs[:, 0], :].flip(-1).argmax(dim=-1)
    return (top == pairs[:, 1]).to(pattern.dtype).mean(dim=-1)
""",
            message="ties: among equal weights the lowest index wins, as torch.argmax gives",
        ),
        Mistake(
            "rows and columns swapped (the queries that look at `from` most)",
            "row",
            """
def relation_accuracy(pattern, pairs):
    top = pattern[:, :, pairs[:, 0]].argmax(dim=1)
    return (top == pairs[:, 1]).to(pattern.dtype).mean(dim=-1)
""",
            message="rows are queries: read row `from` (pattern[:, from, :]) and find its largest key",
        ),
        (
            "averaged over the heads",
            "per head",
            """
def relation_accuracy(pattern, pairs):
    top = pattern[:, pairs[:, 0], :].argmax(dim=-1)
    return (top == pairs[:, 1]).to(pattern.dtype).mean(dim=0)
""",
        ),
        Mistake(
            "the pairs' count, not their share",
            "share",
            """
def relation_accuracy(pattern, pairs):
    top = pattern[:, pairs[:, 0], :].argmax(dim=-1)
    return (top == pairs[:, 1]).to(pattern.dtype).sum(dim=-1)
""",
            message="return the share of pairs (the mean over the pairs), not their count",
        ),
        (
            "float32 always",
            "dtype",
            """
def relation_accuracy(pattern, pairs):
    top = pattern[:, pairs[:, 0], :].argmax(dim=-1)
    return (top == pairs[:, 1]).float().mean(dim=-1)
""",
        ),
        (
            "constant: returns zeros",
            "differs",
            """
def relation_accuracy(pattern, pairs):
    return torch.zeros(pattern.shape[0], dtype=pattern.dtype)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="relation_accuracy(pattern, pairs)")),
    ],
    "offset_baseline": [
        Mistake(
            "an offset per pair (always 1)",
            "one offset",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    offsets = pairs[:, 0] - pairs[:, 1]
    return (offsets == offsets).float().mean().item()
""",
            message=(
                'one offset k for all pairs ("attend k back"): the share of pairs with the most common '
                "offset, not a perfect score from an offset per pair"
            ),
        ),
        Mistake(
            "the count of the most common offset, not its share",
            "share",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    return float(torch.bincount(pairs[:, 0] - pairs[:, 1]).max())
""",
            message="return the share of pairs with the most common offset, not their count",
        ),
        Mistake(
            "the smallest offset's share",
            "most common",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    offsets = pairs[:, 0] - pairs[:, 1]
    return (offsets == offsets.min()).float().mean().item()
""",
            message="the most common offset, not the smallest or the last",
        ),
        Mistake(
            "the most common `to`, not the most common offset",
            "offset",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    return (torch.bincount(pairs[:, 1]).max() / len(pairs)).item()
""",
            message='the rule is "attend k back": count the offsets from - to, not the positions `to`',
        ),
        Mistake(
            "the share of the mean offset (rounded), not of the most common",
            "most common",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    offsets = pairs[:, 0] - pairs[:, 1]
    return (offsets == offsets.double().mean().round()).double().mean().item()
""",
            message="the most common offset (the mode), not the mean offset: count each offset with torch.bincount "
            "and take the largest count",
        ),
        (
            "no ValueError for no pairs",
            "ValueError",
            """
def offset_baseline(pairs):
    offsets = pairs[:, 0] - pairs[:, 1]
    if len(offsets) == 0:
        return 0.0
    return (torch.bincount(offsets).max() / len(offsets)).item()
""",
        ),
        (
            "a tensor, not a float",
            "float",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    offsets = pairs[:, 0] - pairs[:, 1]
    return torch.bincount(offsets).max() / len(offsets)
""",
        ),
        (
            "constant: returns 0",
            "differs",
            """
def offset_baseline(pairs):
    if len(pairs) == 0:
        raise ValueError("no pairs")
    return 0.0
""",
        ),
    ],
    "rare_word_score": [
        Mistake(
            "argmax over all keys instead of j <= i",
            "j <= i",
            _rare(top="pattern.argmax(dim=-1)"),
            message=(
                "only keys j <= i count: take the key the head attends to most among keys 0..i (mask the "
                "later keys before the argmax)"
            ),
        ),
        Mistake(
            "the most frequent token instead of the rarest",
            "lowest",
            _rare(lowest="count.cummax(dim=0).values"),
            message="the rarest token has the lowest corpus count, not the highest",
        ),
        Mistake(
            "counts from the sentence instead of the corpus",
            "corpus",
            _rare(count="torch.bincount(tokens)[tokens]"),
            message=(
                "use the corpus counts (counts[token]), not how often a token occurs in this sentence: in one "
                "sentence nearly every word occurs once"
            ),
        ),
        Mistake(
            "the lowest count of the whole sentence, not of tokens[0..i]",
            "0..i",
            _rare(lowest="count.min().expand(T)"),
            message=(
                "the rarest token so far: the lowest count among tokens[0..i] (torch.cummin), not over the "
                "whole sentence"
            ),
        ),
        Mistake(
            "ties broken the other way (the highest index)",
            "lowest index",
            _rare(top='T - 1 - pattern.masked_fill(~past, float("-inf")).flip(-1).argmax(dim=-1)'),
            message="ties: among equal weights the lowest index wins, as torch.argmax gives",
        ),
        Mistake(
            "the query itself left out of the keys (j < i)",
            "itself",
            _rare(diagonal="diagonal=-1", top='pattern.masked_fill(~past, float("-inf")).argmax(dim=-1)'),
            message="the query itself counts among the keys 0..i (j <= i, the diagonal included)",
        ),
        Mistake(
            "position 0 included in the mean",
            "i = 1..T-1",
            _rare(mean="hit.to(pattern.dtype).mean(dim=-1)"),
            message="average over the queries i = 1..T-1 (T-1 of them), position 0 left out",
        ),
        Mistake(
            "the key compared with the position of the minimum (torch.cummin's indices), not its count",
            "position of the minimum",
            edited(_rare(), ("hit = count[top] == lowest", "hit = top == count.cummin(dim=0).indices")),
            message=TIES_OF_COUNTS,
        ),
        Mistake(
            "one token id as the rarest, though another has the same count",
            "count",
            """
def rare_word_score(pattern, tokens, counts):
    T = pattern.shape[-1]
    count = counts[tokens]
    rarest = torch.stack([tokens[count[:i + 1].argmin()] for i in range(T)])  # the first id with the lowest count
    past = torch.ones(T, T, dtype=torch.bool).tril()
    top = pattern.masked_fill(~past, float("-inf")).argmax(dim=-1)
    hit = tokens[top] == rarest
    return hit[:, 1:].to(pattern.dtype).mean(dim=-1)
""",
            message="two different tokens may share the lowest count: a key qualifies when its token's count equals "
            "the lowest count among tokens[0..i], whatever its token id (compare counts, not token ids)",
        ),
        ("averaged over the heads", "per head", _rare(mean="hit[:, 1:].to(pattern.dtype).mean(dim=0)")),
        ("float32 always", "dtype", _rare(mean="hit[:, 1:].float().mean(dim=-1)")),
        (
            "constant: returns zeros",
            "differs",
            """
def rare_word_score(pattern, tokens, counts):
    return torch.zeros(pattern.shape[0], dtype=pattern.dtype)
""",
        ),
        ("constant: raises ValueError", "ValueError", _RAISES.format(sig="rare_word_score(pattern, tokens, counts)")),
    ],
    "head_importance": [
        Mistake(
            "no absolute value",
            "absolute",
            _importance(term="torch.autograd.grad(loss, mask)[0]"),
            message="take the absolute value of each sequence's gradient: importance is never negative",
        ),
        Mistake(
            "the absolute value of the batch's mean gradient",
            "each sequence",
            """
def head_importance(model, ids, targets):
    weight = next(model.parameters())
    mask = torch.ones(model.n_layers, model.n_heads, dtype=weight.dtype, requires_grad=True)
    with torch.enable_grad():
        logits = model(ids, head_mask=mask)
        loss = torch.stack([F.cross_entropy(logits[b], targets[b]) for b in range(ids.shape[0])]).mean()
        return torch.autograd.grad(loss, mask)[0].abs()
""",
            message=(
                "the mean over sequences of the absolute value of each sequence's own gradient, not the absolute "
                "value of the batch's mean gradient"
            ),
        ),
        Mistake(
            "head_mask not reset: its .grad accumulates over the sequences",
            "fresh mask",
            """
def head_importance(model, ids, targets):
    weight = next(model.parameters())
    total = torch.zeros(model.n_layers, model.n_heads, dtype=weight.dtype)
    mask = torch.ones_like(total, requires_grad=True)
    with torch.enable_grad():
        for b in range(ids.shape[0]):
            loss = F.cross_entropy(model(ids[b:b + 1], head_mask=mask)[0], targets[b])
            loss.backward(inputs=[mask])
            total += mask.grad.abs()
    return total / ids.shape[0]
""",
            message=(
                "each sequence needs its own gradient: a fresh mask per sequence, or mask.grad set to zero "
                "before each backward (.grad accumulates)"
            ),
        ),
        Mistake(
            "summed over the sequences, not averaged",
            "average",
            _importance(result="total"),
            message="average over the sequences, don't sum",
        ),
        Mistake(
            "loss.backward() fills the parameters' .grad",
            ".grad",
            _importance(term="(loss.backward() or mask.grad).abs()"),
            message="head_importance changed the .grad of the model's parameters",
            aspect="model as found",
        ),
        # A model whose parameters() shows stand-ins while the real .grad fills (issue 33): the grader reads the
        # parameters it built the model with (sandbox.helpers.ModelRecord), not the model's methods. The visible
        # test sees it too: it reads .grad through named_parameters() and pos_emb.weight, not parameters().
        Mistake(
            "a RoleModel whose parameters() shows stand-ins, loss.backward() filling the real .grad",
            ".grad",
            """
class RoleModel(RoleModel):
    def parameters(self, recurse=True):
        if "_shown" not in self.__dict__:
            self.__dict__["_shown"] = [torch.nn.Parameter(p.detach().clone()) for p in super().parameters(recurse)]
        return iter(self.__dict__["_shown"])

"""
            + _importance(term="(loss.backward() or mask.grad).abs()"),
            aspect="model as found",
            evidence=True,
        ),
        Mistake(
            "loss.backward(), then model.zero_grad(): the caller's .grad wiped",
            ".grad",
            _importance(term="(loss.backward() or mask.grad).abs()\n            model.zero_grad()"),
            message="head_importance changed the .grad of the model's parameters",
            aspect="model as found",
        ),
        Mistake(
            "no enable_grad: fails under torch.no_grad()",
            "no_grad",
            """
def head_importance(model, ids, targets):
    weight = next(model.parameters())
    total = torch.zeros(model.n_layers, model.n_heads, dtype=weight.dtype)
    for b in range(ids.shape[0]):
        mask = torch.ones_like(total, requires_grad=True)
        loss = F.cross_entropy(model(ids[b:b + 1], head_mask=mask)[0], targets[b])
        total += torch.autograd.grad(loss, mask)[0].abs()
    return total / ids.shape[0]
""",
            message="head_importance fails when called under torch.no_grad()",
            aspect="values",
        ),
        ("model.eval() inside, the mode not restored", "mode", _importance(prelude="model.eval()\n    ")),
        # the check's message on the model's .grad names requires_grad too (ModelRecord.grads reports both)
        Mistake(
            "requires_grad turned off on the parameters and left off",
            "requires_grad",
            _importance(prelude="for p in model.parameters():\n        p.requires_grad_(False)\n    "),
            aspect="model as found",
        ),
        Mistake(
            "padding targets ignored (ignore_index), as in training",
            "ignore_index",
            _importance().replace("targets[b])", "targets[b], ignore_index=0)"),
            message=IGNORE_INDEX,
            aspect="values",
        ),
        ("float32 always", "dtype", _importance(result="(total / ids.shape[0]).float()")),
        (
            "constant: returns zeros",
            "differs",
            """
def head_importance(model, ids, targets):
    weight = next(model.parameters())
    return torch.zeros(model.n_layers, model.n_heads, dtype=weight.dtype)
""",
        ),
    ],
    "prune_heads": [
        Mistake(
            "the most important heads pruned",
            "least important",
            _prune(order="torch.argsort(importance.flatten(), stable=True, descending=True)"),
            message="prune the least important heads (zeros at the smallest importances), not the most important",
        ),
        Mistake(
            "ties broken the other way (higher layer and head first)",
            "ties",
            _prune(order="importance.numel() - 1 - torch.argsort(importance.flatten().flip(0), stable=True)"),
            message="ties: among equal importances the lower layer, then the lower head, is pruned first",
        ),
        (
            "no ValueError for n_prune out of range",
            "ValueError",
            """
def prune_heads(importance, n_prune):
    dtype = importance.dtype if importance.is_floating_point() else torch.float32
    order = torch.argsort(importance.flatten(), stable=True)
    mask = torch.ones(importance.numel(), dtype=dtype)
    mask[order[:max(n_prune, 0)]] = 0
    return mask.view(importance.shape)
""",
        ),
        Mistake(
            "the mask written into `importance` itself",
            "in place",
            """
def prune_heads(importance, n_prune):
    if not 0 <= n_prune <= importance.numel():
        raise ValueError(f"n_prune must be in 0..{importance.numel()}, got {n_prune}")
    order = torch.argsort(importance.flatten(), stable=True)
    mask = importance if importance.is_floating_point() else importance.float()
    mask.fill_(1)
    mask.view(-1)[order[:n_prune]] = 0
    return mask
""",
            message="prune_heads changed `importance` in place",
            aspect="mask",
        ),
        ("float32 always", "dtype", _prune(dtype="torch.float32")),
        ("integer importances give an integer mask", "float32", _prune(dtype="importance.dtype")),
        (
            "constant: returns ones",
            "differs",
            """
def prune_heads(importance, n_prune):
    if not 0 <= n_prune <= importance.numel():
        raise ValueError(f"n_prune must be in 0..{importance.numel()}, got {n_prune}")
    return torch.ones(importance.shape, dtype=importance.dtype if importance.is_floating_point() else torch.float32)
""",
        ),
    ],
}

VARIANTS = {
    "relation_accuracy": [
        (
            "a loop over the pairs",
            """
def relation_accuracy(pattern, pairs):
    hits = torch.zeros(pattern.shape[0], dtype=pattern.dtype, device=pattern.device)
    for frm, to in pairs.tolist():
        hits += (pattern[:, frm, :].argmax(dim=-1) == to).to(pattern.dtype)
    return hits / len(pairs)
""",
        ),
        (
            "max over the row, then the first position holding it",
            """
def relation_accuracy(pattern, pairs):
    rows = pattern[:, pairs[:, 0], :]
    is_max = rows == rows.max(dim=-1, keepdim=True).values
    first = is_max.int().argmax(dim=-1)
    return (first == pairs[:, 1]).double().mean(dim=-1).to(pattern.dtype)
""",
        ),
    ],
    "offset_baseline": [
        (
            "collections.Counter",
            """
def offset_baseline(pairs):
    import collections
    offsets = [frm - to for frm, to in pairs.tolist()]
    if not offsets:
        raise ValueError("pairs is empty")
    return collections.Counter(offsets).most_common(1)[0][1] / len(offsets)
""",
        ),
        (
            "torch.unique with counts",
            """
def offset_baseline(pairs):
    if pairs.shape[0] == 0:
        raise ValueError("no pairs to explain")
    _, counts = torch.unique(pairs[:, 0] - pairs[:, 1], return_counts=True)
    return float(counts.max()) / float(pairs.shape[0])
""",
        ),
    ],
    "rare_word_score": [
        (
            "a loop over queries and heads",
            """
def rare_word_score(pattern, tokens, counts):
    H, T, _ = pattern.shape
    count = counts[tokens].tolist()
    out = torch.zeros(H, dtype=pattern.dtype)
    for i in range(1, T):
        lowest = min(count[:i + 1])
        for h in range(H):
            j = int(pattern[h, i, :i + 1].argmax())
            out[h] += count[j] == lowest
    return out / (T - 1)
""",
        ),
        (
            "counts compared in float64, an explicit tril",
            """
def rare_word_score(pattern, tokens, counts):
    T = pattern.shape[-1]
    count = counts.double()[tokens]
    lowest = torch.stack([count[:i + 1].min() for i in range(T)])
    scores = torch.where(torch.tril(torch.ones(T, T, dtype=torch.bool)), pattern, torch.full_like(pattern, -1.0))
    top = scores.argmax(dim=-1)
    return (count[top] == lowest).double()[:, 1:].mean(dim=-1).to(pattern.dtype)
""",
        ),
    ],
    "head_importance": [
        (
            "backward into the mask only, its .grad reset each time, float64 sums",
            """
def head_importance(model, ids, targets):
    weight = next(model.parameters())
    total = torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64)
    mask = torch.ones(model.n_layers, model.n_heads, dtype=weight.dtype, device=weight.device, requires_grad=True)
    with torch.enable_grad():
        for b in range(ids.shape[0]):
            mask.grad = None
            logits = model(ids[b:b + 1], head_mask=mask)[0]
            F.cross_entropy(logits, targets[b]).backward(inputs=[mask])
            total += mask.grad.double().abs()
    return (total / ids.shape[0]).to(weight.dtype).detach()
""",
        ),
        (
            "the parameters' .grad saved and restored around loss.backward(), the mode too",
            """
def head_importance(model, ids, targets):
    saved = [(p, p.grad) for p in model.parameters()]
    training = model.training
    weight = next(model.parameters())
    out = []
    try:
        with torch.enable_grad():
            for b in range(ids.shape[0]):
                for p in model.parameters():
                    p.grad = None
                mask = torch.ones(model.n_layers, model.n_heads, dtype=weight.dtype, requires_grad=True)
                F.cross_entropy(model(ids[b:b + 1], mask)[0], targets[b]).backward()
                out.append(mask.grad.abs())
    finally:
        for p, g in saved:
            p.grad = g
        model.train(training)
    return torch.stack(out).mean(dim=0)
""",
        ),
        (
            "a deep copy of the model, its parameters frozen",
            """
import copy


def head_importance(model, ids, targets):
    copy_ = copy.deepcopy(model)
    copy_.requires_grad_(False)
    weight = next(copy_.parameters())
    total = torch.zeros(copy_.n_layers, copy_.n_heads, dtype=weight.dtype, device=weight.device)
    with torch.enable_grad():
        for b in range(ids.shape[0]):
            mask = torch.ones_like(total, requires_grad=True)
            loss = F.cross_entropy(copy_(ids[b:b + 1], head_mask=mask)[0], targets[b])
            total += torch.autograd.grad(loss, mask)[0].abs()
    return total / ids.shape[0]
""",
        ),
    ],
    "prune_heads": [
        (
            "sorted (importance, index) pairs in Python",
            """
def prune_heads(importance, n_prune):
    if not isinstance(n_prune, int) or not 0 <= n_prune <= importance.numel():
        raise ValueError(f"n_prune must be an int in 0..{importance.numel()}")
    flat = importance.flatten().tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    mask = torch.ones(len(flat))
    mask[order[:n_prune]] = 0
    dtype = importance.dtype if importance.is_floating_point() else torch.float32
    return mask.view(importance.shape).to(dtype=dtype, device=importance.device)
""",
        ),
        (
            "argmin again and again on a copy (torch.argmin takes the first of equal values)",
            """
def prune_heads(importance, n_prune):
    if n_prune < 0 or n_prune > importance.numel():
        raise ValueError("n_prune out of range")
    dtype = importance.dtype if importance.is_floating_point() else torch.float32
    left = importance.double().flatten().clone()
    mask = torch.ones(importance.numel(), dtype=dtype, device=importance.device)
    for _ in range(n_prune):
        i = int(left.argmin())
        mask[i] = 0
        left[i] = float("inf")
    return mask.reshape(importance.shape)
""",
        ),
    ],
}
