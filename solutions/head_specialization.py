"""Lesson 07: what heads learn.

A two-layer attention-only transformer trained on random token sequences that repeat, the
three head scores (previous-token, duplicate-token, induction) and head ablation.
Attention patterns are (H, T, T) per sequence, rows are queries.

Train the lesson's checkpoint (deterministic, about a minute on 2 CPU cores):
    python -m solutions.head_specialization lessons/07_head_specialization/induction_model.npz
"""
import contextlib
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def previous_token_score(pattern):
    """pattern (H, T, T) -> (H,): mean over i = 1..T-1 of the attention from i to i-1."""
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def duplicate_token_score(pattern, tokens):
    """pattern (H, T, T), tokens (T,) -> (H,): for each position whose token occurred before,
    the attention mass on those earlier copies, averaged over such positions."""
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
    """Multi-head causal self-attention that keeps its pattern: x (B, T, D) -> (B, T, D), and
    self.pattern (B, H, T, T) from the last forward."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(x).split(D, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        self.pattern = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        heads = self.pattern @ v  # (B, H, T, Dh)
        # out_proj's input is the heads side by side: head h is features h*Dh:(h+1)*Dh.
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, D))


class AttentionOnlyTransformer(nn.Module):
    """Token and position embeddings, n_layers residual attention layers, an unembedding.

    forward: ids (B, T) -> logits (B, T, vocab_size). After a forward, patterns() gives each
    layer's attention pattern (B, H, T, T).
    """

    def __init__(self, vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=64):
        super().__init__()
        self.config = dict(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                           n_heads=n_heads, max_seq_len=max_seq_len)
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.layers = nn.ModuleList(CausalSelfAttention(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.size(1), device=ids.device))
        for layer in self.layers:
            x = x + layer(x)
        return self.unembed(self.ln_f(x))

    def patterns(self):
        """[(B, H, T, T)] per layer, from the last forward."""
        return [layer.pattern for layer in self.layers]


@contextlib.contextmanager
def ablate_head(model, layer, head):
    """Inside the with-block, head `head` of layer `layer` contributes nothing: its slice of
    out_proj's input (B, T, D) is zeroed. The model is unchanged afterwards."""
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


def half_losses(model, ids):
    """Next-token cross-entropy on the first half and on the repeated second half of ids (B, 2*half)."""
    half = ids.size(1) // 2
    with torch.no_grad():
        logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(0)  # (T-1,)
    return loss[:half - 1].mean().item(), loss[half:].mean().item()


def train(steps=600, vocab_size=32, half=16, batch_size=64, d_model=64, n_heads=4, lr=3e-3,
          seed=0, log_every=50, progress=None):
    """Train AttentionOnlyTransformer on repeated random sequences, deterministically.

    progress: an optional callable(step, record) for a progress bar.
    Returns (model, history): history is a list of dicts with step, loss, loss_first,
    loss_repeat and the best induction score in layer 1.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AttentionOnlyTransformer(vocab_size, d_model, 2, n_heads, max_seq_len=2 * half)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    probe = repeated_sequences(32, half, vocab_size, torch.Generator().manual_seed(seed + 1))
    history = []
    for step in range(steps + 1):
        if step % log_every == 0 or step == steps:
            first, repeat = half_losses(model, probe)
            pattern = model.patterns()[1].mean(0)
            record = dict(step=step, loss_first=first, loss_repeat=repeat,
                          induction=induction_score(pattern, half).max().item())
            history.append(record)
            if progress:
                progress(step, record)
        if step == steps:
            break
        ids = repeated_sequences(batch_size, half, vocab_size, gen)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), history


def save_checkpoint(model, history, path):
    """Weights and config in a .npz that numpy loads without pickle."""
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    np.savez(path, **arrays, __config__=json.dumps(model.config), __history__=json.dumps(history))


def load_checkpoint(path):
    """(model, history) from save_checkpoint's file."""
    with np.load(path, allow_pickle=False) as data:
        model = AttentionOnlyTransformer(**json.loads(str(data["__config__"])))
        model.load_state_dict({k: torch.from_numpy(data[k]) for k in data.files if not k.startswith("__")})
        history = json.loads(str(data["__history__"]))
    return model.eval(), history


if __name__ == "__main__":
    torch.set_num_threads(1)  # same numbers on every machine with this torch
    model, history = train(progress=lambda step, r: print(
        f"step {step:4d}  loss first half {r['loss_first']:.3f}  repeated half {r['loss_repeat']:.3f}  "
        f"best induction score {r['induction']:.2f}", flush=True))
    save_checkpoint(model, history, sys.argv[1] if len(sys.argv) > 1 else "induction_model.npz")
