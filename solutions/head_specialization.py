"""Lesson 07: what heads learn.

A two-layer attention-only transformer trained on random token sequences that repeat, the
three head scores (previous-token, duplicate-token, induction) and head ablation.
Attention patterns are (H, T, T) per sequence, rows are queries.

Make the lesson's checkpoints (deterministic; about 35 s each on one CPU core; --steps N trains for N steps):
    python -m solutions.head_specialization lessons/07_head_specialization/induction_model.npz
    python -m solutions.head_specialization lessons/07_head_specialization/induction_model_mqa.npz --kv-heads 1
"""

import contextlib
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def previous_token_score(pattern):
    """pattern (H, T, T) -> (H,): mean over i = 1..T-1 of the attention from i to i-1."""
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def duplicate_token_score(pattern, tokens):
    """pattern (H, T, T), tokens (T,) -> (H,): for each position whose token occurred before,
    the attention mass on those earlier copies, averaged over such positions.
    ValueError when no token occurs twice."""
    earlier_copy = (tokens[:, None] == tokens[None, :]).tril(diagonal=-1)  # (T, T): j < i, same token
    has_copy = earlier_copy.any(dim=-1)
    if not has_copy.any():
        raise ValueError("tokens has no repeated token, so no position has an earlier copy")
    mass = (pattern * earlier_copy).sum(dim=-1)  # (H, T)
    return mass[:, has_copy].mean(dim=-1)


def induction_score(pattern, period):
    """pattern (H, T, T) of a sequence that repeats with `period` -> (H,): mean over
    i = period..T-1 of the attention from i to i - period + 1, the token after i's earlier copy."""
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1)[:, 1:].mean(dim=-1)


class CausalSelfAttention(nn.Module):
    """Causal self-attention that keeps its pattern: x (B, T, D) -> (B, T, D), and
    self.pattern (B, H, T, T) from the last forward.

    n_kv_heads < n_heads shares each key/value head among n_heads // n_kv_heads query heads
    (grouped-query attention; 1 is multi-query attention). Query head h uses key/value head
    h // (n_heads // n_kv_heads).
    """

    def __init__(self, d_model, n_heads, n_kv_heads=None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        kv_width = self.n_kv_heads * self.head_dim
        # One matrix multiply makes the queries (D features), keys and values (kv_width each).
        self.qkv = nn.Linear(d_model, d_model + 2 * kv_width)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.size()
        kv_width = self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([D, kv_width, kv_width], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        group = self.n_heads // self.n_kv_heads
        k, v = (
            t.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v)
        )
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(self.head_dim)  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        self.pattern = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        heads = self.pattern @ v  # (B, H, T, Dh)
        # out_proj's input is the heads side by side: head h is features h*Dh:(h+1)*Dh.
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, D))


class AttentionOnlyTransformer(nn.Module):
    """Token and position embeddings, n_layers residual attention layers (no MLPs), an unembedding.

    forward: ids (B, T) -> logits (B, T, vocab_size). After a forward, patterns() gives each
    layer's attention pattern (B, H, T, T).
    """

    def __init__(self, vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=64, n_kv_heads=None):
        super().__init__()
        self.config = dict(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            max_seq_len=max_seq_len,
            n_kv_heads=n_kv_heads,
        )
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.layers = nn.ModuleList(CausalSelfAttention(d_model, n_heads, n_kv_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):
        positions = torch.arange(ids.size(1), device=ids.device)
        residual = self.tok_emb(ids) + self.pos_emb(positions)
        for layer in self.layers:
            residual = residual + layer(residual)  # each layer adds what its heads found
        return self.unembed(self.ln_f(residual))

    def patterns(self):
        """[(B, H, T, T)] per layer, from the last forward."""
        return [layer.pattern for layer in self.layers]


@contextlib.contextmanager
def ablate_head(model, layer, head):
    """Inside the with-block, head `head` of layer `layer` contributes nothing: its slice
    h*Dh:(h+1)*Dh of out_proj's input (B, T, D) is zeroed. Other heads (also those that share
    its key/value head), its attention pattern and every other layer are untouched, and the
    model is exactly as before once the block ends. ValueError for a head that does not exist."""
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer must be in 0..{len(model.layers) - 1}, got {layer}")
    attn = model.layers[layer]
    if not 0 <= head < attn.n_heads:
        raise ValueError(f"head must be in 0..{attn.n_heads - 1}, got {head}")
    lo, hi = head * attn.head_dim, (head + 1) * attn.head_dim

    def zero_head(module, args):
        merged = args[0].clone()
        merged[..., lo:hi] = 0
        return (merged,)

    handle = attn.out_proj.register_forward_pre_hook(zero_head)
    try:
        yield model
    finally:
        handle.remove()


def repeated_sequences(batch_size, half, vocab_size, generator=None):
    """Random tokens (B, half) followed by the same tokens again: (B, 2*half) LongTensor."""
    first = torch.randint(vocab_size, (batch_size, half), generator=generator)
    return torch.cat([first, first], dim=1)


def training_batch(batch_size, seq_len, vocab_size, min_repeat, max_repeat, generator=None):
    """(B, seq_len) LongTensor of random tokens in which a block of L tokens comes again right
    after itself: positions s+L..s+2L-1 copy s..s+L-1, with L drawn in min_repeat..max_repeat
    for each sequence. The first half of the batch starts its block at s = 0, the second half
    at a random s, so that neither a fixed offset nor a position tells where the copy is."""
    lengths = torch.randint(min_repeat, max_repeat + 1, (batch_size, 1), generator=generator)
    starts = (torch.rand(batch_size, 1, generator=generator) * (seq_len - 2 * lengths + 1)).long()
    starts[: batch_size // 2] = 0
    ids = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    pos = torch.arange(seq_len)
    in_copy = (pos >= starts + lengths) & (pos < starts + 2 * lengths)
    return ids.gather(1, torch.where(in_copy, pos - lengths, pos))  # each token's source position


def head_scores(model, ids):
    """The three scores of every head, averaged over the sequences ids (B, 2*half) from
    repeated_sequences: {"previous" | "duplicate" | "induction": tensor (n_layers, H)}.
    Uses previous_token_score, duplicate_token_score and induction_score."""
    half = ids.size(1) // 2
    with torch.no_grad():
        model(ids)
        out = {"previous": [], "duplicate": [], "induction": []}
        for pattern in model.patterns():  # (B, H, T, T)
            out["previous"].append(torch.stack([previous_token_score(p) for p in pattern]).mean(0))
            out["duplicate"].append(torch.stack([duplicate_token_score(p, t) for p, t in zip(pattern, ids)]).mean(0))
            out["induction"].append(torch.stack([induction_score(p, half) for p in pattern]).mean(0))
    return {name: torch.stack(rows) for name, rows in out.items()}


def half_losses(model, ids):
    """Next-token cross-entropy on the first half and on the repeated second half of ids (B, 2*half)."""
    half = ids.size(1) // 2
    with torch.no_grad():
        logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(0)  # (T-1,): predicts 1..T-1
    return loss[: half - 1].mean().item(), loss[half:].mean().item()


class ProgressBar:
    """A one-line text progress bar for train(progress=ProgressBar(steps))."""

    def __init__(self, total, width=30):
        self.total, self.width, self.start = total, width, time.perf_counter()

    def __call__(self, step, record):
        done = round(self.width * step / self.total)
        print(
            f"\r[{'#' * done}{'.' * (self.width - done)}] step {step:5d}/{self.total}  "
            f"loss: first half {record['loss_first']:.2f}, repeated half {record['loss_repeat']:.2f}  "
            f"({time.perf_counter() - self.start:.0f} s)",
            end="\n" if step == self.total else "",
            flush=True,
        )


def train(
    steps=2000,
    vocab_size=64,
    half=16,
    batch_size=64,
    d_model=64,
    n_heads=4,
    n_kv_heads=None,
    min_repeat=4,
    lr=3e-3,
    seed=0,
    log_every=25,
    progress=None,
):
    """Train a 2-layer AttentionOnlyTransformer on training_batch sequences (length 2*half, a
    block of 4..half tokens repeated), deterministically: one CPU thread, fixed seeds.

    Every log_every steps it measures, on a fixed set of repeated_sequences, the loss on the
    first and on the repeated half and head_scores (progress: an optional callable(step, record)).
    Returns (model, history): a list of records {step, loss_first, loss_repeat,
    previous, duplicate, induction}, the scores as lists [layer][head].
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same numbers on every run
    try:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = AttentionOnlyTransformer(vocab_size, d_model, 2, n_heads, max_seq_len=2 * half, n_kv_heads=n_kv_heads)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        probe = repeated_sequences(64, half, vocab_size, torch.Generator().manual_seed(seed + 1000))
        history = []
        for step in range(steps + 1):
            if step % log_every == 0 or step == steps:
                model.eval()
                first, repeat = half_losses(model, probe)
                record = dict(step=step, loss_first=first, loss_repeat=repeat)
                record.update({name: s.tolist() for name, s in head_scores(model, probe).items()})
                history.append(record)
                model.train()
                if progress:
                    progress(step, record)
            if step == steps:
                break
            ids = training_batch(batch_size, 2 * half, vocab_size, min_repeat, half, gen)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab_size), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), history


def save_checkpoint(model, history, path):
    """Weights, config and training history in a .npz that numpy loads without pickle."""
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    history = [{k: np.round(v, 4).tolist() if k != "step" else v for k, v in r.items()} for r in history]
    np.savez_compressed(path, **arrays, __config__=json.dumps(model.config), __history__=json.dumps(history))


def load_checkpoint(path):
    """(model, history) from save_checkpoint's file."""
    with np.load(path, allow_pickle=False) as data:
        model = AttentionOnlyTransformer(**json.loads(str(data["__config__"])))
        model.load_state_dict({k: torch.from_numpy(data[k]) for k in data.files if not k.startswith("__")})
        history = json.loads(str(data["__history__"]))
    return model.eval(), history


if __name__ == "__main__":
    args, options = sys.argv[1:], {"--kv-heads": None, "--steps": 2000}
    for flag in options:
        if flag in args:
            i = args.index(flag)
            options[flag] = int(args[i + 1])
            del args[i : i + 2]
    out, steps = args[0] if args else "induction_model.npz", options["--steps"]
    start = time.perf_counter()
    model, history = train(steps, n_kv_heads=options["--kv-heads"], progress=ProgressBar(steps))
    save_checkpoint(model, history, out)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
