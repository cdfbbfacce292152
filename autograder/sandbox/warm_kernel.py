"""A Triton kernel the sandbox's worker launches once in Triton's interpreter before any child forks (runner.preload):
the interpreter rewrites Triton's own @triton.jit functions (tl.max, tl.sum, ...) and fills its caches at their first
use in a process, which each child that launches a student's kernel would otherwise do again (issue 33)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _warm(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    p = tl.zeros((BLOCK, BLOCK), dtype=tl.float32) + e[:, None]
    acc = tl.dot(p.to(x_ptr.dtype.element_ty), p.to(x_ptr.dtype.element_ty)) * 0
    y = tl.where(offs < n, e / tl.sum(e, axis=0) + tl.sum(acc, axis=1), tl.maximum(e, 0.0))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n)


def warm():
    for dtype in (torch.float32, torch.float16):
        x = torch.ones(20, dtype=dtype)
        _warm[(triton.cdiv(20, 16),)](x, torch.empty_like(x), 20, BLOCK=16)
