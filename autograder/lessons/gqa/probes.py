"""Lesson 04_gqa's reference probes: each graded name of solutions/gqa.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch

from autograder.checking.probing import (
    STAND_INS,
    Disagrees,
    agree,
    load,
    probe,
    python_int,
    randn,
    refuses,
    row_mask,
    shares_memory,
    shell_module,
    torch_attention,
)


@probe("04_gqa", "solutions.gqa.repeat_kv", f"{STAND_INS}.repeat_kv")
def repeat_kv(fn):
    x = randn(2, 2, 5, 3)
    agree(fn(x, 3), torch.repeat_interleave(x, 3, dim=1), "torch.repeat_interleave")


@probe("04_gqa 05_kv_cache", "solutions.gqa.GroupedQueryAttention")
def grouped_query_attention(cls):
    shell = shell_module(12, 4, 2, bias=True)
    module = load(cls(12, 4, 2, bias=True).double(), shell)
    x, mask = randn(2, 6, 12, seed=1), row_mask(6, 6, 2)
    agree(module(x), torch_attention(shell, x, causal=True), "F.scaled_dot_product_attention with enable_gqa")
    agree(module(x, mask=mask), torch_attention(shell, x, mask=mask), "F.scaled_dot_product_attention with enable_gqa")
    if any(p.bias is not None for p in (cls(12, 4, 2).q_proj, cls(12, 4, 2).k_proj)):
        raise Disagrees("its projections have biases by default")
    refuses(cls, 12, 4, 3, against="n_heads not divisible by n_kv_heads")
    refuses(cls, 10, 4, 2, against="d_model not divisible by n_heads")


@probe("04_gqa", "solutions.gqa.mha_to_gqa")
def mha_to_gqa(fn):
    mha = shell_module(12, 4, bias=True)
    gqa = fn(mha, 2)
    if shares_memory(gqa, mha):
        raise Disagrees("its parameters share memory with mha's")
    agree(torch.tensor(gqa.n_kv_heads), torch.tensor(2), "the number of key/value heads asked for")
    for name in ("q_proj", "out_proj"):
        agree(getattr(gqa, name).weight, getattr(mha, name).weight, f"mha's {name}")
    for name in ("k_proj", "v_proj"):  # key/value head j: the mean of query heads 2j and 2j+1's rows
        w, b = getattr(mha, name).weight.view(4, 3, 12), getattr(mha, name).bias.view(4, 3)
        agree(
            getattr(gqa, name).weight,
            torch.cat([(w[2 * j] + w[2 * j + 1]) / 2 for j in range(2)]),
            f"mean-pooled {name} weights",
        )
        agree(
            getattr(gqa, name).bias,
            torch.cat([(b[2 * j] + b[2 * j + 1]) / 2 for j in range(2)]),
            f"mean-pooled {name} biases",
        )


@probe("04_gqa", f"{STAND_INS}.GroupedQueryAttention")
def grouped_query_shell(cls):
    module, shell = cls(12, 4, 2, bias=True), shell_module(12, 4, 2, bias=True)
    shapes = [{name: tuple(p.shape) for name, p in m.named_parameters()} for m in (module, shell)]
    if shapes[0] != shapes[1]:
        raise Disagrees(f"projections {shapes[0]}, not {shapes[1]}")


@probe("04_gqa", "solutions.gqa.kv_cache_bytes")
def kv_cache_bytes(fn):
    for dtype in (torch.float16, torch.float32):
        want = 2 * 3 * torch.empty(2, 4, 10, 8, dtype=dtype).nbytes  # keys and values of 3 layers
        agree(python_int(fn(3, 4, 8, 10, 2, dtype.itemsize)), want, "the bytes of the cached tensors")
    agree(fn(3, 4, 8, 10, 2), 2 * 3 * torch.empty(2, 4, 10, 8, dtype=torch.float16).nbytes, "float16 bytes")
