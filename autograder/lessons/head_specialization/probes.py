"""Lesson 07_head_specialization's reference probes: each graded name of solutions/head_specialization.py (and the
stand-ins its checks send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py
runs them)."""

import copy
import math

import torch

from autograder.checking.probing import agree, lower_right, probe, randn, refuses, shell_module, torch_attention


def _pattern(h, t, seed=0):
    return torch.softmax(randn(h, t, t, seed=seed).masked_fill(~lower_right(t, t), -math.inf), dim=-1)


@probe("07_head_specialization", "solutions.head_specialization.previous_token_score")
def previous_token_score(fn):
    p = _pattern(3, 6)
    agree(fn(p), torch.stack([p[:, i, i - 1] for i in range(1, 6)], -1).mean(-1), "its definition")


@probe("07_head_specialization", "solutions.head_specialization.duplicate_token_score")
def duplicate_token_score(fn):
    p, tokens = _pattern(3, 7), torch.tensor([4, 1, 4, 2, 1, 4, 3])
    rows = [
        p[:, i, [j for j in range(i) if tokens[j] == tokens[i]]].sum(-1) for i in range(7) if tokens[i] in tokens[:i]
    ]
    agree(fn(p, tokens), torch.stack(rows, -1).mean(-1), "its definition")
    refuses(fn, p, torch.arange(7), against="tokens without a repeat")


@probe("07_head_specialization", "solutions.head_specialization.induction_score")
def induction_score(fn):
    p = _pattern(3, 8)
    agree(fn(p, 3), torch.stack([p[:, i, i - 2] for i in range(3, 8)], -1).mean(-1), "its definition")


def _tiny_model(n_kv_heads=None):
    from solutions.head_specialization import AttentionOnlyTransformer

    torch.manual_seed(0)
    return AttentionOnlyTransformer(10, 8, 2, 2, max_seq_len=6, n_kv_heads=n_kv_heads).double().eval()


@probe("07_head_specialization", "solutions.head_specialization.AttentionOnlyTransformer")
def attention_only_transformer(cls):
    x = randn(2, 6, 8)
    for n_kv in (None, 1):
        layer = cls(10, 8, 2, 2, max_seq_len=6, n_kv_heads=n_kv).double().layers[0]
        shell = shell_module(8, 2, n_kv, bias=True)
        shell.q_proj.weight.copy_(layer.qkv.weight[:8])
        shell.q_proj.bias.copy_(layer.qkv.bias[:8])
        width = shell.k_proj.weight.size(0)
        for i, name in enumerate(("k_proj", "v_proj")):
            shell_part = slice(8 + i * width, 8 + (i + 1) * width)
            getattr(shell, name).weight.copy_(layer.qkv.weight[shell_part])
            getattr(shell, name).bias.copy_(layer.qkv.bias[shell_part])
        shell.out_proj.load_state_dict(layer.out_proj.state_dict())
        agree(layer(x), torch_attention(shell, x, causal=True), "causal F.scaled_dot_product_attention")
        agree(layer.pattern.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64), "rows of weights summing to 1")


@probe("07_head_specialization", "solutions.head_specialization.ablate_head")
def ablate_head(fn):
    model, ids = _tiny_model(n_kv_heads=1), torch.randint(10, (2, 6), generator=torch.Generator().manual_seed(0))
    calls = []
    model.layers[1].out_proj.register_forward_pre_hook(lambda module, args: calls.append(1))  # someone else's hook
    before = model(ids)
    ablated = copy.deepcopy(model)
    ablated.layers[1].out_proj.weight[:, :4] = 0  # head 0 of layer 1 adds nothing to out_proj
    both = copy.deepcopy(ablated)
    both.layers[1].out_proj.weight[:, 4:] = 0
    with fn(model, 1, 0):
        agree(model(ids), ablated(ids), "the model with that head's slice of out_proj zeroed")
        with fn(model, 1, 1):
            agree(model(ids), both(ids), "the model with both heads' slices zeroed")
    try:
        with fn(model, 1, 0):
            raise KeyError("raised in the block")
    except KeyError:
        pass
    calls.clear()
    agree(model(ids), before, "the model before the blocks")
    agree(len(calls), 1, "the hooks the model had before")
    for head in (2, -1):
        refuses(lambda: fn(model, 0, head).__enter__(), against="a head that does not exist")
