"""Lesson 03_multi_head's reference probes: each graded name of solutions/multi_head.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch
from torch import nn

from autograder.checking.probing import (
    STAND_INS,
    Disagrees,
    agree,
    load,
    merged,
    probe,
    python_int,
    randn,
    refuses,
    row_mask,
    shares_memory,
    shell_module,
)


@probe("03_multi_head", "solutions.multi_head.concat_and_project", f"{STAND_INS}.concat_and_project")
def concat_and_project(fn):
    heads, w_o = randn(2, 3, 5, 4), randn(12, 12, seed=1)
    agree(fn(heads, w_o), merged(heads) @ w_o, "the heads side by side times w_o")


def _torch_mha(module):
    """torch.nn.MultiheadAttention holding module's projections."""
    mha = nn.MultiheadAttention(module.d_model, module.n_heads, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
    mha.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
    mha.out_proj.load_state_dict(module.out_proj.state_dict())
    return mha


@probe("03_multi_head", "solutions.multi_head.MultiHeadAttention")
def multi_head_attention(cls):
    module = load(cls(12, 3).double(), shell_module(12, 3))
    mha = _torch_mha(module)
    query, key = randn(2, 5, 12, seed=1), randn(2, 7, 12, seed=2)
    mask = row_mask(5, 7, 4)
    agree(module(query), mha(query, query, query, need_weights=False)[0], "torch.nn.MultiheadAttention")
    agree(module(query, key), mha(query, key, key, need_weights=False)[0], "torch.nn.MultiheadAttention")
    out, weights = module(query, key, key, mask=mask, need_weights=True)
    want, want_weights = mha(query, key, key, attn_mask=~mask, average_attn_weights=False)
    agree(out, want, "torch.nn.MultiheadAttention")
    agree(weights, want_weights, "torch.nn.MultiheadAttention's weights")
    for bias in (True, False):
        agree(
            sum(p.numel() for p in cls(24, 4, bias=bias).parameters()),
            sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters()),
            "torch.nn.MultiheadAttention's parameter count",
        )
    refuses(cls, 10, 3, against="d_model not divisible by n_heads")


@probe("03_multi_head", "solutions.multi_head.load_torch_mha")
def load_torch_mha(fn):
    from solutions.multi_head import MultiHeadAttention

    mha = nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(randn(36, 12))
    mha.in_proj_bias.copy_(randn(36))
    mha.out_proj.bias.copy_(randn(12, seed=1))
    module = MultiHeadAttention(12, 3).double()
    params = list(module.parameters())
    if fn(module, mha) is not module or list(module.parameters()) != params or shares_memory(module, mha):
        raise Disagrees("it does not copy in place into the module's own parameters")
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        agree(getattr(module, name).weight, mha.in_proj_weight[12 * i : 12 * (i + 1)], "in_proj_weight's rows")
        agree(getattr(module, name).bias, mha.in_proj_bias[12 * i : 12 * (i + 1)], "in_proj_bias")
    agree(module.out_proj.weight, mha.out_proj.weight, "out_proj.weight")
    agree(module.out_proj.bias, mha.out_proj.bias, "out_proj.bias")


@probe("03_multi_head", "solutions.multi_head.mha_param_count")
def mha_param_count(fn):
    for bias in (True, False):
        want = sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters())
        agree(python_int(fn(24, 4, bias)), want, "torch.nn.MultiheadAttention's parameter count")
    refuses(fn, 10, 3, against="d_model not divisible by n_heads")


@probe("03_multi_head", f"{STAND_INS}.MultiHeadAttention")
def multi_head_shell(cls):
    for bias in (True, False):
        want = sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters())
        agree(sum(p.numel() for p in cls(24, 4, bias).parameters()), want, "torch.nn.MultiheadAttention's parameters")
