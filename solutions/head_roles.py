"""Lesson 10: what heads track in language.

A synthetic language built to need three kinds of head (a verb's subject across a relative
clause, a pronoun's antecedent among names of both genders, the rarest word so far), a small
decoder with MLPs trained on it, the scores research used to find such heads (Clark et al. 2019,
Voita et al. 2019) and importance-ordered pruning (Michel et al. 2019).
Attention patterns are (H, T, T) per sentence, rows are queries.

Make the lesson's checkpoint (deterministic; --steps N trains for N steps):
    python -m solutions.head_roles lessons/10_head_roles/role_model.npz
"""

import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---- the graded scores ------------------------------------------------------------------------


def rare_word_score(pattern, tokens, counts):
    """pattern (H, T, T), T >= 2; tokens (T,) long; counts (vocab,) the corpus count of every token id
    -> (H,) in pattern's dtype: for each query i = 1..T-1, 1 when the key the head attends to most among
    j <= i (torch.argmax: the lowest index among equal weights) holds a token whose count is the lowest
    among tokens[0..i], else 0; the mean over those queries."""
    T = pattern.shape[-1]
    count = counts.to(pattern.device)[tokens.to(pattern.device)]  # (T,): each position's corpus count
    lowest = count.cummin(dim=0).values  # (T,): the lowest count among positions 0..i
    past = torch.ones(T, T, dtype=torch.bool, device=pattern.device).tril()
    top = pattern.masked_fill(~past, float("-inf")).argmax(dim=-1)  # (H, T): the key each query looks at most
    hit = count[top] == lowest  # (H, T)
    return hit[:, 1:].to(pattern.dtype).mean(dim=-1)


def relation_accuracy(pattern, pairs):
    """pattern (H, T, T), pairs (N, 2) long of (from, to) with 0 <= to <= from < T -> (H,) in pattern's
    dtype: the share of pairs whose row `from` has its largest weight (over the whole row; the lowest
    index among equal weights) at key `to`."""
    pairs = pairs.to(pattern.device)
    top = pattern[:, pairs[:, 0], :].argmax(dim=-1)  # (H, N): the key each `from` looks at most
    return (top == pairs[:, 1]).to(pattern.dtype).mean(dim=-1)


def offset_baseline(pairs):
    """pairs (N, 2) of (from, to), positions within each pair's sentence -> float: the share of the most
    common offset from - to, what the best "attend k back" rule scores. ValueError when N == 0."""
    pairs = torch.as_tensor(pairs)
    if pairs.numel() == 0:
        raise ValueError("pairs is empty: there is no pair to explain")
    offsets = pairs[:, 0] - pairs[:, 1]
    return torch.bincount(offsets).max().item() / len(offsets)


def head_importance(model, ids, targets):
    """ids, targets (B, T) long on the model's device -> (n_layers, n_heads) in the model's dtype: the mean
    over b of |dL_b / d head_mask[l, h]| at head_mask all ones, with L_b = F.cross_entropy(logits[b],
    targets[b]) (Michel et al. 2019). The model is left as found: weights, every .grad, train/eval mode."""
    weight = next(model.parameters())
    total = torch.zeros(model.n_layers, model.n_heads, dtype=weight.dtype, device=weight.device)
    with torch.enable_grad():  # works under torch.no_grad() too
        for b in range(ids.shape[0]):
            mask = torch.ones_like(total, requires_grad=True)  # a fresh mask: each sequence's own gradient
            loss = F.cross_entropy(model(ids[b : b + 1], head_mask=mask)[0], targets[b])
            # autograd.grad fills no parameter's .grad: the model's gradients stay as they were
            total += torch.autograd.grad(loss, mask)[0].abs()
    return total / ids.shape[0]


def prune_heads(importance, n_prune):
    """importance (n_layers, n_heads), n_prune an int -> head_mask (n_layers, n_heads) in importance's
    dtype (float32 for integers) and device: 0 at the n_prune least important heads (ties: lower layer,
    then lower head first), 1 elsewhere. ValueError unless 0 <= n_prune <= n_layers * n_heads."""
    if not 0 <= n_prune <= importance.numel():
        raise ValueError(f"n_prune must be in 0..{importance.numel()}, got {n_prune}")
    dtype = importance.dtype if importance.is_floating_point() else torch.float32
    order = torch.argsort(importance.flatten(), stable=True)  # equal importance: row-major order
    mask = torch.ones(importance.numel(), dtype=dtype, device=importance.device)
    mask[order[:n_prune]] = 0
    return mask.view(importance.shape)


# ---- the language -----------------------------------------------------------------------------


class Language:
    """The lesson's words. Noun lemma r is drawn with probability proportional to 1 / (r + 1), a Zipf law,
    so most nouns are rare; the other words are few and frequent."""

    FEMALE = ["mary", "anna"]
    MALE = ["john", "tom"]
    ADJECTIVES = ["big", "small", "old", "red"]
    PAST_VERBS = ["saw", "met", "liked", "found"]
    VERB = ("runs", "run")  # singular, plural: it agrees in number with its subject
    NOUNS = [
        ("dog", "dogs"),
        ("cat", "cats"),
        ("bird", "birds"),
        ("man", "men"),
        ("child", "children"),
        ("horse", "horses"),
        ("king", "kings"),
        ("tree", "trees"),
        ("boat", "boats"),
        ("house", "houses"),
        ("girl", "girls"),
        ("boy", "boys"),
        ("fish", "fishes"),
        ("wolf", "wolves"),
        ("fox", "foxes"),
        ("cow", "cows"),
        ("duck", "ducks"),
        ("frog", "frogs"),
        ("bear", "bears"),
        ("lion", "lions"),
        ("mouse", "mice"),
        ("goat", "goats"),
        ("goose", "geese"),
        ("owl", "owls"),
        ("bee", "bees"),
        ("ant", "ants"),
        ("crab", "crabs"),
        ("snake", "snakes"),
        ("tiger", "tigers"),
        ("whale", "whales"),
        ("queen", "queens"),
        ("nurse", "nurses"),
        ("baker", "bakers"),
        ("pilot", "pilots"),
        ("judge", "judges"),
        ("poet", "poets"),
        ("monk", "monks"),
        ("knight", "knights"),
        ("witch", "witches"),
        ("giant", "giants"),
    ]
    PAD, BOS = "_", "<s>"
    DETERMINERS = ["the", "my"]
    WORDS = (
        [PAD, BOS, ".", "near", "with", "he", "she"]
        + DETERMINERS
        + FEMALE
        + MALE
        + ADJECTIVES
        + PAST_VERBS
        + list(VERB)
        + [w for pair in NOUNS for w in pair]
    )
    ID = {w: i for i, w in enumerate(WORDS)}
    NOUN_P = 1 / np.arange(1, len(NOUNS) + 1) / sum(1 / np.arange(1, len(NOUNS) + 1))
    MAX_LEN = 28  # the longest story; shorter ones are padded to it
    TOPIC = 0.8  # how often a determiner, an adjective, a past verb or a name is the topic's own


@dataclass
class Corpus:
    """Stories of the lesson's language, padded to one length.

    ids (N, T) long; agreement and coreference (M, 3) long rows (story, from, to): `from` is the position
    whose next token is the verb (the pronoun), `to` its subject noun (the name it refers to); counts
    (vocab,) long: how often each token id occurs in ids; words: the word of every token id."""

    ids: torch.Tensor
    agreement: torch.Tensor
    coreference: torch.Tensor
    counts: torch.Tensor
    words: list

    def text(self, n):
        """Story n as words, padding left out."""
        return " ".join(self.words[i] for i in self.ids[n].tolist() if i != Language.ID[Language.PAD])


def story(rng):
    """One story: (token ids, (from, to) of the verb's subject, (from, to) of the pronoun's antecedent).

    An agreement sentence, a names sentence and a pronoun sentence:
        the [adj] N1 <a phrase with other nouns> runs/run .   the verb agrees with N1, whatever the nouns between
        NAME1 saw NAME2 [near the [adj] N] .                  NAME2 of either gender
        he/she saw the [adj] N .                              the pronoun is NAME1's; N is the rarest noun so far
    The rarest noun so far (the highest Zipf rank) is the story's topic: each later determiner, adjective,
    past verb and name is, with probability Language.TOPIC, the topic's own (noun r goes with determiner
    r % 2, adjective and past verb r % 4, the first name r % 2 of its gender, the second r % 3 of the
    others), as rare words steer a text's vocabulary.
    """
    L = Language
    words, nouns = [L.BOS], []  # nouns: the Zipf rank of each noun so far

    def pick(options, own):
        """A word of options: the topic's own (index own(rank)) with probability TOPIC, else any."""
        if nouns and rng.random() < L.TOPIC:
            return options[own(max(nouns))]
        return options[rng.integers(len(options))]

    def noun_phrase(number, rank=None):
        determiner = pick(L.DETERMINERS, lambda r: r % 2)
        adjective = [pick(L.ADJECTIVES, lambda r: r % 4)] if rng.random() < 0.5 else []
        nouns.append(int(rng.choice(len(L.NOUNS), p=L.NOUN_P)) if rank is None else rank)
        return [determiner] + adjective + [L.NOUNS[nouns[-1]][number]]

    def past():
        return pick(L.PAST_VERBS, lambda r: r % 4)

    def other():  # a noun between subject and verb, of either number: it tells nothing about the verb
        return noun_phrase(int(rng.integers(2)))

    number = int(rng.integers(2))
    subject = noun_phrase(number)
    kind = rng.integers(4)
    if kind == 0:
        between = ["near"] + other()
    elif kind == 1:
        between = other() + [past()]  # "the dog the cats saw runs"
    elif kind == 2:
        between = other() + ["near"] + other() + [past()]
    else:
        between = ["near"] + other() + ["with"] + other()
    words.extend(subject + between)
    agreement = (len(words) - 1, len(words) - len(between) - 1)
    words.extend([L.VERB[number], "."])

    female = rng.random() < 0.5
    first = pick(L.FEMALE if female else L.MALE, lambda r: r % 2)
    others = [n for n in L.FEMALE + L.MALE if n != first]
    name = len(words)
    words.extend([first, past(), pick(others, lambda r: r % 3)])
    if rng.random() < 0.5:
        words.extend(["near"] + other())
    words.append(".")

    coreference = (len(words) - 1, name)
    words.extend(["she" if female else "he", past()] + noun_phrase(int(rng.integers(2)), rank=max(nouns)) + ["."])
    return [L.ID[w] for w in words], agreement, coreference


def make_corpus(n_sentences, seed=0):
    """n_sentences stories of the lesson's language (deterministic in seed) -> Corpus."""
    rng = np.random.default_rng(seed)
    ids = torch.full((n_sentences, Language.MAX_LEN), Language.ID[Language.PAD], dtype=torch.long)
    agreement, coreference = [], []
    for n in range(n_sentences):
        tokens, subject, antecedent = story(rng)
        ids[n, : len(tokens)] = torch.tensor(tokens)
        agreement.append((n, *subject))
        coreference.append((n, *antecedent))
    counts = torch.bincount(ids.flatten(), minlength=len(Language.WORDS))
    return Corpus(ids, torch.tensor(agreement), torch.tensor(coreference), counts, list(Language.WORDS))


# ---- the model --------------------------------------------------------------------------------


class RoleAttention(nn.Module):
    """Causal self-attention whose heads can be scaled: x (B, T, D), head_mask (H,) -> (B, T, D), and
    self.pattern (B, H, T, T) from the last forward."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, head_mask):
        B, T, D = x.size()
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        self.pattern = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        heads = (self.pattern @ v) * head_mask[:, None, None]  # (B, H, T, Dh): head h scaled by head_mask[h]
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, D))


class RoleModel(nn.Module):
    """A decoder: token and position embeddings, n_layers pre-norm blocks (attention, then an MLP), an
    unembedding. forward(ids (B, T), head_mask (n_layers, n_heads) or None for ones) -> logits
    (B, T, vocab_size); each head's output is multiplied by head_mask[layer, head]. After a forward,
    patterns() gives each layer's attention pattern (B, H, T, T)."""

    def __init__(self, vocab_size, d_model=64, n_layers=3, n_heads=4, d_mlp=128, max_len=Language.MAX_LEN):
        super().__init__()
        self.config = dict(
            vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_mlp=d_mlp, max_len=max_len
        )
        self.vocab_size, self.n_layers, self.n_heads = vocab_size, n_layers, n_heads
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.attn = nn.ModuleList(RoleAttention(d_model, n_heads) for _ in range(n_layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))
            for _ in range(n_layers)
        )
        self.ln = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids, head_mask=None):
        if head_mask is None:
            head_mask = self.tok_emb.weight.new_ones(self.n_layers, self.n_heads)
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.size(1), device=ids.device))
        for layer in range(self.n_layers):
            x = x + self.attn[layer](self.ln[layer](x), head_mask[layer])
            x = x + self.mlp[layer](x)
        return self.unembed(self.ln_f(x))

    def patterns(self):
        """[(B, H, T, T)] per layer, from the last forward."""
        return [a.pattern for a in self.attn]


def attention_patterns(model, ids):
    """ids (B, T) -> (n_layers, B, n_heads, T, T): every head's attention on every sequence."""
    with torch.no_grad():
        model(ids)
    return torch.stack(model.patterns())


# ---- measuring the model ----------------------------------------------------------------------


def choice_accuracy(model, corpus, pairs):
    """The share of pairs (M, 3) of (story, from, to) where the model, at `from`, gives the true next word
    (the verb, the pronoun) a higher logit than its other form (the other number, the other gender).
    Chance is 0.5."""
    with torch.no_grad():
        logits = model(corpus.ids)
    story, at = pairs[:, 0], pairs[:, 1]
    true = corpus.ids[story, at + 1]
    other = torch.arange(len(Language.WORDS))  # each agreeing word's other form: other number, other gender
    for a, b in (Language.VERB, ("he", "she")):
        other[Language.ID[a]], other[Language.ID[b]] = Language.ID[b], Language.ID[a]
    row = logits[story, at]
    return (row.gather(1, true[:, None]) > row.gather(1, other[true][:, None])).float().mean().item()


def head_relation_accuracy(patterns, pairs):
    """patterns (n_layers, N, H, T, T) of N stories, pairs (M, 3) of (story, from, to) -> (n_layers, H): the
    relation_accuracy of every head over all pairs (each story's pairs scored on its own pattern)."""
    total = torch.zeros(patterns.shape[0], patterns.shape[2], dtype=patterns.dtype)
    for story in pairs[:, 0].unique():
        mine = pairs[pairs[:, 0] == story, 1:]
        total += torch.stack([relation_accuracy(p[story], mine) for p in patterns]) * len(mine)
    return total / len(pairs)


def head_rare_word_score(patterns, ids, counts):
    """patterns (n_layers, N, H, T, T), ids (N, T), counts (vocab,) -> (n_layers, H): rare_word_score
    averaged over the stories, each without its padding."""
    lengths = (ids != Language.ID[Language.PAD]).sum(dim=1).tolist()
    return torch.stack(
        [
            torch.stack([rare_word_score(p[n, :, :t, :t], ids[n, :t], counts) for n, t in enumerate(lengths)]).mean(0)
            for p in patterns
        ]
    )


def uniform_rare_word_score(ids, counts):
    """What a head spreading its attention evenly scores: the mean over stories and over i = 1..T-1 of the
    share of positions 0..i holding a lowest-count token (the contract's chance level), padding left out."""
    scores = []
    for story in ids:
        count = counts[story[story != Language.ID[Language.PAD]]]  # (t,): the story without its padding
        hits = (count[None, :] == count.cummin(dim=0).values[:, None]).tril().sum(-1)  # lowest-count keys in 0..i
        scores.append((hits / torch.arange(1, len(count) + 1))[1:].mean())
    return torch.stack(scores).mean().item()


def evaluate(model, corpus):
    """Everything the lesson claims, on corpus: {agreement, pronoun: accuracy against the other form;
    subject, antecedent, rare: (n_layers, H) head scores; subject_baseline, antecedent_baseline:
    offset_baseline; rare_chance: uniform_rare_word_score; loss: next-token loss}."""
    was_training = model.training
    model.eval()
    patterns = attention_patterns(model, corpus.ids)
    with torch.no_grad():
        logits = model(corpus.ids)
    loss = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), corpus.ids[:, 1:].flatten(), ignore_index=Language.ID[Language.PAD]
    )
    out = dict(
        loss=loss.item(),
        agreement=choice_accuracy(model, corpus, corpus.agreement),
        pronoun=choice_accuracy(model, corpus, corpus.coreference),
        subject=head_relation_accuracy(patterns, corpus.agreement),
        antecedent=head_relation_accuracy(patterns, corpus.coreference),
        rare=head_rare_word_score(patterns, corpus.ids, corpus.counts),
        subject_baseline=offset_baseline(corpus.agreement[:, 1:]),
        antecedent_baseline=offset_baseline(corpus.coreference[:, 1:]),
        rare_chance=uniform_rare_word_score(corpus.ids, corpus.counts),
    )
    model.train(was_training)
    return out


# ---- training ---------------------------------------------------------------------------------


def train(
    steps=1600,
    n_stories=20000,
    batch_size=64,
    d_model=64,
    n_layers=3,
    n_heads=4,
    d_mlp=128,
    lr=3e-3,
    seed=0,
    log_every=100,
    progress=None,
):
    """Train a RoleModel on make_corpus(n_stories, seed) deterministically (one CPU thread, fixed seeds),
    measuring evaluate() on held-out stories, make_corpus(200, seed + 1), every log_every steps (progress: an
    optional callable(step, record)). Returns (model, history): the model as it was at the logged step where
    the lesson's three kinds of head were clearest (the largest margin above the lesson's thresholds: 0.8 for
    the best subject and antecedent heads, 0.5 for the best rare-word head), and records {step, loss,
    agreement, pronoun, best_subject, best_antecedent, best_rare, kept} (kept: the step returned)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same numbers on every run
    try:
        torch.manual_seed(seed)
        corpus, probe = make_corpus(n_stories, seed), make_corpus(200, seed + 1)
        gen = torch.Generator().manual_seed(seed)
        model = RoleModel(len(Language.WORDS), d_model, n_layers, n_heads, d_mlp)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=max(steps, 1), pct_start=0.1)
        history, best = [], (-math.inf, None, 0)  # (margin, weights, step) of the clearest step so far
        for step in range(steps + 1):
            if step % log_every == 0 or step == steps:
                m = evaluate(model, probe)
                record = dict(
                    step=step,
                    loss=m["loss"],
                    agreement=m["agreement"],
                    pronoun=m["pronoun"],
                    best_subject=m["subject"].max().item(),
                    best_antecedent=m["antecedent"].max().item(),
                    best_rare=m["rare"].max().item(),
                )
                margin = min(record["best_subject"] - 0.8, record["best_antecedent"] - 0.8, record["best_rare"] - 0.5)
                if margin > best[0]:
                    best = (margin, {k: v.clone() for k, v in model.state_dict().items()}, step)
                history.append(record)
                if progress:
                    progress(step, record)
            if step == steps:
                break
            ids = corpus.ids[torch.randint(len(corpus.ids), (batch_size,), generator=gen)]
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), ignore_index=Language.ID[Language.PAD])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        model.load_state_dict(best[1])
        for record in history:
            record["kept"] = best[2]
    finally:
        torch.set_num_threads(threads)
    return model.eval(), history


def save_checkpoint(model, history, path):
    """Weights (float16: the checkpoint stays small), config and history in a .npz numpy loads without pickle."""
    arrays = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    np.savez_compressed(path, **arrays, __config__=json.dumps(model.config), __history__=json.dumps(history))


def load_checkpoint(path):
    """(model in float32, eval mode; history) from save_checkpoint's file."""
    with np.load(path, allow_pickle=False) as data:
        model = RoleModel(**json.loads(str(data["__config__"])))
        model.load_state_dict(
            {k: torch.from_numpy(data[k].astype(np.float32)) for k in data.files if not k.startswith("__")}
        )
        history = json.loads(str(data["__history__"]))
    return model.eval(), history


if __name__ == "__main__":
    args = sys.argv[1:]
    steps = 1600
    if "--steps" in args:
        i = args.index("--steps")
        steps = int(args[i + 1])
        del args[i : i + 2]
    out = args[0] if args else "role_model.npz"
    start = time.perf_counter()

    def report(step, r):
        print(
            f"step {step:5d}  loss {r['loss']:.3f}  agreement {r['agreement']:.2f}  pronoun {r['pronoun']:.2f}  "
            f"best heads: subject {r['best_subject']:.2f}  antecedent {r['best_antecedent']:.2f}  "
            f"rare {r['best_rare']:.2f}  ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )

    model, history = train(steps, progress=report)
    save_checkpoint(model, history, out)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
