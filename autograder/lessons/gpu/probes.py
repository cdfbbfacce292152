"""Lesson 06_gpu's reference probes: each graded name of solutions/gpu.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import math

import torch
import torch.nn.functional as F

from autograder.checking.probing import agree, lower_right, probe, python_int, randn, refuses, shell_module


@probe("06_gpu", "solutions.gpu.attention_flops")
def attention_flops(fn):
    # (torch.utils.flop_counter agrees, but its first count costs a second and a half.)
    def matmul(m, k, n):  # an (m, k) @ (k, n) product: m*n dot products of k multiply-adds
        return 2 * m * n * k

    want = 2 * 3 * (matmul(5, 4, 7) + matmul(5, 7, 4))  # QK^T and PV, per batch and head
    agree(python_int(fn(2, 3, 5, 7, 4)), want, "two matrix products per batch and head")
    agree(fn(2, 3, 5, 7, 4, causal=True), want // 2, "half of them")
    tq, tk = 10_000_019, 9_999_991  # a count past float64's exact integers
    agree(fn(1, 2, tq, tk, 127), 2 * (matmul(tq, 127, tk) + matmul(tq, tk, 127)), "two matrix products per head")


@probe("06_gpu", "solutions.gpu.online_softmax")
def online_softmax(fn):
    x = randn(3, 10) * 30
    x[0, :4] = -math.inf
    for block in (3, 10):
        agree(fn(x, block), torch.softmax(x, dim=-1), "torch.softmax")


@probe("06_gpu", "solutions.gpu.flash_attention")
def flash_attention(fn):
    q, k, v = randn(2, 2, 9, 4), randn(2, 2, 13, 4, seed=1), randn(2, 2, 13, 4, seed=2)
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=lower_right(9, 13) if causal else None)
        agree(fn(q, k, v, causal=causal, block_q=4, block_k=5), want, "F.scaled_dot_product_attention")
    agree(
        fn(q.half(), k.half(), v.half(), block_q=4, block_k=5),
        F.scaled_dot_product_attention(q, k, v).half(),
        "F.scaled_dot_product_attention",
        tol=2e-3,
    )


@probe("06_gpu", "solutions.gpu.check_attention_inputs")
def check_attention_inputs(fn):
    q = randn(2, 3, 5, 4)
    fn(q, q[:, :, :2], q[:, :, :2])
    refuses(fn, q, q[:, :, :, :3], q[:, :, :, :3], against="keys of another head size")
    refuses(fn, q, q.float(), q.float(), against="keys of another dtype")


@probe("06_gpu", "solutions.gpu.fuse_qkv")
def fuse_qkv(fn):
    shell, x = shell_module(12, 3, bias=True), randn(2, 5, 12, seed=1)
    got = fn(shell)(x).split(12, dim=-1)
    for part, name in zip(got, ("q_proj", "k_proj", "v_proj")):
        agree(part, getattr(shell, name)(x), f"attn.{name}")


@probe("06_gpu", "solutions.gpu.triton_softmax")
def triton_softmax(fn):
    from solutions import gpu

    if not gpu.HAS_TRITON:  # the lesson's check is unavailable too: it grades nothing
        return
    x = randn(3, 200).float() * 40  # wider than 128, no power of two, past exp's float32 range
    agree(fn(x), torch.softmax(x, dim=-1), "torch.softmax", tol=1e-5)
    agree(fn(x[:, :7].half()), torch.softmax(x[:, :7], dim=-1).half(), "torch.softmax", tol=2e-3)


@probe("06_gpu", "solutions.gpu.triton_attention")
def triton_attention(fn):
    from solutions import gpu

    if not gpu.HAS_TRITON:  # the lesson's check is unavailable too: it grades nothing
        return
    q, k, v = randn(1, 2, 20, 8).float(), randn(1, 2, 27, 8, seed=1).float(), randn(1, 2, 27, 8, seed=2).float()
    for causal in (False, True):  # sizes that are no multiple of the tiles, several key tiles
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=lower_right(20, 27) if causal else None)
        agree(fn(q, k, v, causal=causal), want, "F.scaled_dot_product_attention", tol=1e-4)
    agree(
        fn(q.half(), k.half(), v.half()),
        F.scaled_dot_product_attention(q, k, v).half(),
        "F.scaled_dot_product_attention",
        tol=2e-3,
    )
