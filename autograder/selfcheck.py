"""The reference, checked before anything is graded with it.

Every verdict compares a student's answer with solutions/. A reference changed by mistake (a clone
whose solutions/attention.py was edited) would grade a whole class wrong without a word, so
`grade` and `gradescope-bundle` first run, for each lesson they grade, a probe of every graded
name and of every reference helper its checks use (the stand-ins they send into the sandbox, the
modules they build references with). A probe compares the reference with what does not depend on
it, on a few small fixed inputs in float64: PyTorch's own implementations (torch.softmax,
F.scaled_dot_product_attention, nn.MultiheadAttention, torch.repeat_interleave)
or the definition written out index by index. 0.01 to 0.03 s of CPU per lesson (lesson 06: 0.5 s, Triton's
interpreter).

check_reference(lessons) raises ReferenceBroken, one line naming the lesson and the function.
"""
import copy
import importlib
import math
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autograder.results import UsageError

PROBES = defaultdict(list)  # {lesson: [(target "module.name", probe(target_object))]}
STAND_INS = "autograder.checks.stand_ins"


class ReferenceBroken(UsageError):
    """A reference disagrees with PyTorch or with its definition: nothing may be graded with it."""


class _Disagrees(Exception):
    pass


def probe(lessons, *targets):
    """Register fn(obj) for each target ("solutions.attention.softmax") in each of lessons."""
    def register(fn):
        for lesson in lessons.split():
            PROBES[lesson] += [(target, fn) for target in targets]
        return fn
    return register


def check_reference(lessons):
    """Run every probe of these lessons; ReferenceBroken at the first reference that fails one."""
    for lesson in lessons:
        for target, fn in PROBES[lesson]:
            module, name = target.rsplit(".", 1)
            try:  # torch's global RNG is left as it was: the probes seed it to build models
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    fn(getattr(importlib.import_module(module), name))
            except _Disagrees as e:
                why = str(e)
            except Exception as e:  # noqa: BLE001 (whatever a broken reference raises)
                why = f"it raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")
            else:
                continue
            raise ReferenceBroken(f"lesson {lesson}: the reference {target} is wrong ({why}); nothing was graded: "
                                  f"restore {module.replace('.', '/')}.py (git diff, git log) and run again")


# ---- tools ---------------------------------------------------------------------------------------

def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)), dtype=torch.float64)


def agree(got, want, against, tol=1e-9):
    """_Disagrees unless got (array, tensor, number or bool) equals want in dtype, shape and value."""
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise _Disagrees(f"{got.dtype} of shape {tuple(got.shape)} where {against} gives {want.dtype} of "
                         f"shape {tuple(want.shape)}")
    if want.dtype == torch.bool or not want.is_floating_point():
        if not torch.equal(got, want):
            raise _Disagrees(f"it differs from {against}")
        return
    got = got.double()
    if not torch.equal(got.isnan(), want.isnan()) or not torch.allclose(got, want.double(), rtol=tol, atol=tol,
                                                                             equal_nan=True):
        raise _Disagrees(f"it differs from {against}, by up to {(got - want).abs().nan_to_num(math.inf).max():.3g}")


def _shares_memory(a, b):
    """Whether any parameter of module a lies in the storage of a parameter of module b."""
    return bool({p.untyped_storage().data_ptr() for p in a.parameters()}
                & {p.untyped_storage().data_ptr() for p in b.parameters()})


def _python_int(value):
    if type(value) is not int:
        raise _Disagrees(f"it returns {type(value).__name__}, not a Python int")
    return value


def _refuses(fn, *args, against):
    try:
        fn(*args)
    except ValueError:
        return
    raise _Disagrees(f"no ValueError for {against}")


def _linears(d_in, widths, bias, seed):
    """{name: nn.Linear(d_in, width)} in float64, with fixed weights."""
    out = {}
    for i, (name, width) in enumerate(widths.items()):
        layer = nn.Linear(d_in, width, bias=bias, dtype=torch.float64)
        layer.weight.copy_(_randn(width, d_in, seed=seed + i) / math.sqrt(d_in))
        if bias:
            layer.bias.copy_(_randn(width, seed=seed + i + 50))
        out[name] = layer
    return out


def _shell(d_model, n_heads, n_kv_heads=None, bias=True, seed=0):
    """An attention module's projections and sizes, as mha_to_gqa, fuse_qkv and attend_with_cache read them."""
    n_kv_heads = n_kv_heads or n_heads
    head_dim = d_model // n_heads
    shell = nn.Module()
    for name, layer in _linears(d_model, {"q_proj": d_model, "k_proj": n_kv_heads * head_dim,
                                          "v_proj": n_kv_heads * head_dim, "out_proj": d_model}, bias, seed).items():
        setattr(shell, name, layer)
    shell.d_model, shell.n_heads, shell.n_kv_heads, shell.head_dim = d_model, n_heads, n_kv_heads, head_dim
    return shell


def _load(module, shell):
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(module, name).load_state_dict(getattr(shell, name).state_dict())
    return module


def _heads(t, n):
    """(B, T, n*Dh) -> (B, n, T, Dh) by slicing: head h is features h*Dh:(h+1)*Dh."""
    dh = t.size(-1) // n
    return torch.stack([t[..., h * dh:(h + 1) * dh] for h in range(n)], dim=1)


def _merged(t):
    return torch.cat(t.unbind(1), dim=-1)


def _torch_attention(shell, x, mask=None, causal=False, keys=None):
    """PyTorch's attention with shell's projections; the queries are the last T of the keys' positions."""
    keys = x if keys is None else keys
    q, k, v = _heads(shell.q_proj(x), shell.n_heads), *(_heads(p(keys), shell.n_kv_heads)
                                                         for p in (shell.k_proj, shell.v_proj))
    if causal:
        mask = _lower_right(x.size(1), keys.size(1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=shell.n_kv_heads != shell.n_heads)
    return shell.out_proj(_merged(out))


def _lower_right(n_q, n_k):
    """The bottom-right causal mask, from its definition: query i sees key j iff j <= i + n_k - n_q."""
    return torch.tensor([[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)])


def _softmax_weights(q, k, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return torch.softmax(scores if mask is None else scores.masked_fill(~mask, -math.inf), dim=-1)


def _row_mask(n_q, n_k, seed):
    """A random boolean mask in which every query sees at least one key."""
    mask = _randn(n_q, n_k, seed=seed) > 0
    mask[:, 0] = True
    return mask


class _ListCache:
    """A key/value (or latent) cache by concatenation along dim."""

    def __init__(self, dim=2):
        self.dim, self.parts = dim, None

    def update(self, *new):
        self.parts = new if self.parts is None else tuple(torch.cat(p, self.dim) for p in zip(self.parts, new))
        return self.parts if len(self.parts) > 1 else self.parts[0]

    def __len__(self):
        return 0 if self.parts is None else self.parts[0].size(self.dim)


# ---- 01_attention ----------------------------------------------------------------------------------

@probe("01_attention", "solutions.attention.softmax", f"{STAND_INS}.softmax")
def softmax(fn):
    x = _randn(3, 4, 5).numpy() * 30 + 1e4
    x[1] -= 2e4  # rows far apart: one shift for the whole array underflows some
    x[0, 1, :3] = -np.inf
    for axis in (-1, 1):
        agree(fn(x, axis=axis), torch.softmax(torch.from_numpy(x), dim=axis), "torch.softmax")


@probe("01_attention", "solutions.attention.causal_mask")
def causal_mask(fn):
    agree(fn(4), _lower_right(4, 4), "the bottom-right causal mask")
    agree(fn(3, 7), _lower_right(3, 7), "the bottom-right causal mask")


@probe("01_attention", "solutions.attention.scaled_dot_product_attention")
def scaled_dot_product_attention(fn):
    q, k, v = _randn(2, 3, 5, 4), _randn(2, 3, 6, 4, seed=1), _randn(2, 3, 6, 7, seed=2)
    for mask in (None, _row_mask(5, 6, 3)):
        out, weights = fn(q.numpy(), k.numpy(), v.numpy(), None if mask is None else mask.numpy())
        agree(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "F.scaled_dot_product_attention")
        agree(weights, _softmax_weights(q, k, mask), "torch.softmax of the scaled scores")


# ---- 02_heads --------------------------------------------------------------------------------------

@probe("02_heads", "solutions.heads.split_heads", f"{STAND_INS}.split_heads")
def split_heads(fn):
    x = _randn(2, 5, 12)
    agree(fn(x, 3), _heads(x, 3), "slicing head h's features h*Dh:(h+1)*Dh")
    _refuses(fn, x, 5, against="d_model not divisible by n_heads")


@probe("02_heads", "solutions.heads.merge_heads")
def merge_heads(fn):
    y = _randn(2, 3, 5, 4)
    agree(fn(y), _merged(y), "the heads' features side by side")


@probe("02_heads", "solutions.heads.attention", f"{STAND_INS}.attention")
def attention(fn):
    q, k, v = _randn(2, 3, 5, 4) * 30, _randn(2, 3, 6, 4, seed=1) * 30, _randn(2, 3, 6, 7, seed=2)
    for mask in (None, _row_mask(5, 6, 3)):  # scores far above exp()'s range: only a shifted softmax copes
        out, weights = fn(q, k, v, mask)
        agree(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "F.scaled_dot_product_attention")
        agree(weights, _softmax_weights(q, k, mask), "torch.softmax of the scaled scores")


@probe("02_heads", "solutions.heads.per_head_attention")
def per_head_attention(fn):
    x, (wq, wk, wv) = _randn(2, 5, 12), (_randn(12, 12, seed=i) for i in (1, 2, 3))
    mha = nn.MultiheadAttention(12, 3, bias=False, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(torch.cat([wq.T, wk.T, wv.T]))
    mha.out_proj.weight.copy_(torch.eye(12, dtype=torch.float64))
    mask = _lower_right(5, 5)
    agree(_merged(fn(x, wq, wk, wv, 3, mask)), mha(x, x, x, attn_mask=~mask, need_weights=False)[0],
          "torch.nn.MultiheadAttention (output projection the identity)")


# ---- 03_multi_head ---------------------------------------------------------------------------------

@probe("03_multi_head", "solutions.multi_head.concat_and_project", f"{STAND_INS}.concat_and_project")
def concat_and_project(fn):
    heads, w_o = _randn(2, 3, 5, 4), _randn(12, 12, seed=1)
    agree(fn(heads, w_o), _merged(heads) @ w_o, "the heads side by side times w_o")


def _torch_mha(module):
    """torch.nn.MultiheadAttention holding module's projections."""
    mha = nn.MultiheadAttention(module.d_model, module.n_heads, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
    mha.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
    mha.out_proj.load_state_dict(module.out_proj.state_dict())
    return mha


@probe("03_multi_head", "solutions.multi_head.MultiHeadAttention")
def multi_head_attention(cls):
    module = _load(cls(12, 3).double(), _shell(12, 3))
    mha = _torch_mha(module)
    query, key = _randn(2, 5, 12, seed=1), _randn(2, 7, 12, seed=2)
    mask = _row_mask(5, 7, 4)
    agree(module(query), mha(query, query, query, need_weights=False)[0], "torch.nn.MultiheadAttention")
    agree(module(query, key), mha(query, key, key, need_weights=False)[0], "torch.nn.MultiheadAttention")
    out, weights = module(query, key, key, mask=mask, need_weights=True)
    want, want_weights = mha(query, key, key, attn_mask=~mask, average_attn_weights=False)
    agree(out, want, "torch.nn.MultiheadAttention")
    agree(weights, want_weights, "torch.nn.MultiheadAttention's weights")
    for bias in (True, False):
        agree(sum(p.numel() for p in cls(24, 4, bias=bias).parameters()),
              sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters()),
              "torch.nn.MultiheadAttention's parameter count")
    _refuses(cls, 10, 3, against="d_model not divisible by n_heads")


@probe("03_multi_head", "solutions.multi_head.load_torch_mha")
def load_torch_mha(fn):
    from solutions.multi_head import MultiHeadAttention

    mha = nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64)
    mha.in_proj_weight.copy_(_randn(36, 12))
    mha.in_proj_bias.copy_(_randn(36))
    mha.out_proj.bias.copy_(_randn(12, seed=1))
    module = MultiHeadAttention(12, 3).double()
    params = list(module.parameters())
    if fn(module, mha) is not module or list(module.parameters()) != params or _shares_memory(module, mha):
        raise _Disagrees("it does not copy in place into the module's own parameters")
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        agree(getattr(module, name).weight, mha.in_proj_weight[12 * i:12 * (i + 1)], "in_proj_weight's rows")
        agree(getattr(module, name).bias, mha.in_proj_bias[12 * i:12 * (i + 1)], "in_proj_bias")
    agree(module.out_proj.weight, mha.out_proj.weight, "out_proj.weight")
    agree(module.out_proj.bias, mha.out_proj.bias, "out_proj.bias")


@probe("03_multi_head", "solutions.multi_head.mha_param_count")
def mha_param_count(fn):
    for bias in (True, False):
        want = sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters())
        agree(_python_int(fn(24, 4, bias)), want, "torch.nn.MultiheadAttention's parameter count")
    _refuses(fn, 10, 3, against="d_model not divisible by n_heads")


@probe("03_multi_head", f"{STAND_INS}.MultiHeadAttention")
def multi_head_shell(cls):
    for bias in (True, False):
        want = sum(p.numel() for p in nn.MultiheadAttention(24, 4, bias=bias).parameters())
        agree(sum(p.numel() for p in cls(24, 4, bias).parameters()), want, "torch.nn.MultiheadAttention's parameters")


# ---- 04_gqa ----------------------------------------------------------------------------------------

@probe("04_gqa", "solutions.gqa.repeat_kv", f"{STAND_INS}.repeat_kv")
def repeat_kv(fn):
    x = _randn(2, 2, 5, 3)
    agree(fn(x, 3), torch.repeat_interleave(x, 3, dim=1), "torch.repeat_interleave")


@probe("04_gqa 05_kv_cache", "solutions.gqa.GroupedQueryAttention")
def grouped_query_attention(cls):
    shell = _shell(12, 4, 2, bias=True)
    module = _load(cls(12, 4, 2, bias=True).double(), shell)
    x, mask = _randn(2, 6, 12, seed=1), _row_mask(6, 6, 2)
    agree(module(x), _torch_attention(shell, x, causal=True), "F.scaled_dot_product_attention with enable_gqa")
    agree(module(x, mask=mask), _torch_attention(shell, x, mask=mask), "F.scaled_dot_product_attention with enable_gqa")
    if any(p.bias is not None for p in (cls(12, 4, 2).q_proj, cls(12, 4, 2).k_proj)):
        raise _Disagrees("its projections have biases by default")
    _refuses(cls, 12, 4, 3, against="n_heads not divisible by n_kv_heads")
    _refuses(cls, 10, 4, 2, against="d_model not divisible by n_heads")


@probe("04_gqa", "solutions.gqa.mha_to_gqa")
def mha_to_gqa(fn):
    mha = _shell(12, 4, bias=True)
    gqa = fn(mha, 2)
    if _shares_memory(gqa, mha):
        raise _Disagrees("its parameters share memory with mha's")
    agree(torch.tensor(gqa.n_kv_heads), torch.tensor(2), "the number of key/value heads asked for")
    for name in ("q_proj", "out_proj"):
        agree(getattr(gqa, name).weight, getattr(mha, name).weight, f"mha's {name}")
    for name in ("k_proj", "v_proj"):  # key/value head j: the mean of query heads 2j and 2j+1's rows
        w, b = getattr(mha, name).weight.view(4, 3, 12), getattr(mha, name).bias.view(4, 3)
        agree(getattr(gqa, name).weight, torch.cat([(w[2 * j] + w[2 * j + 1]) / 2 for j in range(2)]),
              f"mean-pooled {name} weights")
        agree(getattr(gqa, name).bias, torch.cat([(b[2 * j] + b[2 * j + 1]) / 2 for j in range(2)]),
              f"mean-pooled {name} biases")


@probe("04_gqa", f"{STAND_INS}.GroupedQueryAttention")
def grouped_query_shell(cls):
    module, shell = cls(12, 4, 2, bias=True), _shell(12, 4, 2, bias=True)
    shapes = [{name: tuple(p.shape) for name, p in m.named_parameters()} for m in (module, shell)]
    if shapes[0] != shapes[1]:
        raise _Disagrees(f"projections {shapes[0]}, not {shapes[1]}")


@probe("04_gqa", "solutions.gqa.kv_cache_bytes")
def kv_cache_bytes(fn):
    for dtype in (torch.float16, torch.float32):
        want = 2 * 3 * torch.empty(2, 4, 10, 8, dtype=dtype).nbytes  # keys and values of 3 layers
        agree(_python_int(fn(3, 4, 8, 10, 2, dtype.itemsize)), want, "the bytes of the cached tensors")
    agree(fn(3, 4, 8, 10, 2), 2 * 3 * torch.empty(2, 4, 10, 8, dtype=torch.float16).nbytes, "float16 bytes")


# ---- 05_kv_cache -----------------------------------------------------------------------------------

@probe("05_kv_cache", "solutions.kv_cache.KVCache")
def kv_cache(cls):
    cache, seen, storage = cls(2, 8, 2, 3, dtype=torch.float64), [], set()
    for i, t in enumerate((3, 1, 2, 2)):  # up to max_seq_len exactly
        k, v = _randn(2, 2, t, 3, seed=i), _randn(2, 2, t, 3, seed=10 + i)
        seen.append((k, v))
        got = cache.update(k, v)
        storage.add(got[0].untyped_storage().data_ptr())
        for j in range(2):
            agree(got[j], torch.cat([s[j] for s in seen], dim=2), "every key and value so far")
        agree(len(cache), sum(s[0].size(2) for s in seen), "the positions cached")
    if len(storage) > 1:
        raise _Disagrees("its keys are not views of one preallocated buffer")
    _refuses(cache.update, _randn(2, 2, 1, 3), _randn(2, 2, 1, 3), against="an update past max_seq_len")
    agree(len(cache), 8, "the positions cached before a refused update")
    cache.reset()
    agree(len(cache), 0, "an empty cache after reset()")


@probe("05_kv_cache", "solutions.kv_cache.attend_with_cache")
def attend_with_cache(fn):
    shell, x, cache = _shell(12, 4, 2, bias=True), _randn(2, 7, 12, seed=1), _ListCache()
    got = torch.cat([fn(shell, x[:, a:b], cache) for a, b in ((0, 4), (4, 5), (5, 7))], dim=1)
    agree(got, _torch_attention(shell, x, causal=True), "causal F.scaled_dot_product_attention over every token")


@probe("05_kv_cache", "solutions.kv_cache.generate")
def generate(fn):
    from solutions.kv_cache import Decoder

    torch.manual_seed(0)
    model = Decoder(11, 8, 2, 2, 1, 12).double().eval()
    ids = prompt = torch.randint(11, (2, 3), generator=torch.Generator().manual_seed(0))
    for _ in range(5):  # greedy decoding, the whole sequence each step
        ids = torch.cat([ids, model(ids)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    widths = []  # what each forward is fed: the prompt, then one token (cached) or everything (not)
    model.register_forward_pre_hook(lambda module, args: widths.append(args[0].size(1)))
    for use_cache, fed in ((True, [3, 1, 1, 1, 1]), (False, [3, 4, 5, 6, 7])):
        widths.clear()
        agree(fn(model, prompt, 5, use_cache=use_cache), ids, "greedy decoding without a cache")
        agree(widths, fed, f"the tokens fed to each forward {'with' if use_cache else 'without'} the cache")


# ---- 06_gpu ----------------------------------------------------------------------------------------

@probe("06_gpu", "solutions.gpu.attention_flops")
def attention_flops(fn):
    # (torch.utils.flop_counter agrees, but its first count costs a second and a half.)
    def matmul(m, k, n):  # an (m, k) @ (k, n) product: m*n dot products of k multiply-adds
        return 2 * m * n * k
    want = 2 * 3 * (matmul(5, 4, 7) + matmul(5, 7, 4))  # QK^T and PV, per batch and head
    agree(_python_int(fn(2, 3, 5, 7, 4)), want, "two matrix products per batch and head")
    agree(fn(2, 3, 5, 7, 4, causal=True), want // 2, "half of them")
    tq, tk = 10_000_019, 9_999_991  # a count past float64's exact integers
    agree(fn(1, 2, tq, tk, 127), 2 * (matmul(tq, 127, tk) + matmul(tq, tk, 127)), "two matrix products per head")


@probe("06_gpu", "solutions.gpu.online_softmax")
def online_softmax(fn):
    x = _randn(3, 10) * 30
    x[0, :4] = -math.inf
    for block in (3, 10):
        agree(fn(x, block), torch.softmax(x, dim=-1), "torch.softmax")


@probe("06_gpu", "solutions.gpu.flash_attention")
def flash_attention(fn):
    q, k, v = _randn(2, 2, 9, 4), _randn(2, 2, 13, 4, seed=1), _randn(2, 2, 13, 4, seed=2)
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=_lower_right(9, 13) if causal else None)
        agree(fn(q, k, v, causal=causal, block_q=4, block_k=5), want, "F.scaled_dot_product_attention")
    agree(fn(q.half(), k.half(), v.half(), block_q=4, block_k=5), F.scaled_dot_product_attention(q, k, v).half(),
          "F.scaled_dot_product_attention", tol=2e-3)


@probe("06_gpu", "solutions.gpu.check_attention_inputs")
def check_attention_inputs(fn):
    q = _randn(2, 3, 5, 4)
    fn(q, q[:, :, :2], q[:, :, :2])
    _refuses(fn, q, q[:, :, :, :3], q[:, :, :, :3], against="keys of another head size")
    _refuses(fn, q, q.float(), q.float(), against="keys of another dtype")


@probe("06_gpu", "solutions.gpu.fuse_qkv")
def fuse_qkv(fn):
    shell, x = _shell(12, 3, bias=True), _randn(2, 5, 12, seed=1)
    got = fn(shell)(x).split(12, dim=-1)
    for part, name in zip(got, ("q_proj", "k_proj", "v_proj")):
        agree(part, getattr(shell, name)(x), f"attn.{name}")


@probe("06_gpu", "solutions.gpu.triton_softmax")
def triton_softmax(fn):
    from solutions import gpu

    if not gpu.HAS_TRITON:  # the lesson's check is unavailable too: it grades nothing
        return
    x = _randn(3, 200).float() * 40  # wider than 128, no power of two, past exp's float32 range
    agree(fn(x), torch.softmax(x, dim=-1), "torch.softmax", tol=1e-5)
    agree(fn(x[:, :7].half()), torch.softmax(x[:, :7], dim=-1).half(), "torch.softmax", tol=2e-3)


@probe("06_gpu", "solutions.gpu.triton_attention")
def triton_attention(fn):
    from solutions import gpu

    if not gpu.HAS_TRITON:  # the lesson's check is unavailable too: it grades nothing
        return
    q, k, v = _randn(1, 2, 20, 8).float(), _randn(1, 2, 27, 8, seed=1).float(), _randn(1, 2, 27, 8, seed=2).float()
    for causal in (False, True):  # sizes that are no multiple of the tiles, several key tiles
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=_lower_right(20, 27) if causal else None)
        agree(fn(q, k, v, causal=causal), want, "F.scaled_dot_product_attention", tol=1e-4)
    agree(fn(q.half(), k.half(), v.half()), F.scaled_dot_product_attention(q, k, v).half(),
          "F.scaled_dot_product_attention", tol=2e-3)


# ---- 07_head_specialization ------------------------------------------------------------------------

def _pattern(h, t, seed=0):
    return torch.softmax(_randn(h, t, t, seed=seed).masked_fill(~_lower_right(t, t), -math.inf), dim=-1)


@probe("07_head_specialization", "solutions.head_specialization.previous_token_score")
def previous_token_score(fn):
    p = _pattern(3, 6)
    agree(fn(p), torch.stack([p[:, i, i - 1] for i in range(1, 6)], -1).mean(-1), "its definition")


@probe("07_head_specialization", "solutions.head_specialization.duplicate_token_score")
def duplicate_token_score(fn):
    p, tokens = _pattern(3, 7), torch.tensor([4, 1, 4, 2, 1, 4, 3])
    rows = [p[:, i, [j for j in range(i) if tokens[j] == tokens[i]]].sum(-1)
            for i in range(7) if tokens[i] in tokens[:i]]
    agree(fn(p, tokens), torch.stack(rows, -1).mean(-1), "its definition")
    _refuses(fn, p, torch.arange(7), against="tokens without a repeat")


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
    x = _randn(2, 6, 8)
    for n_kv in (None, 1):
        layer = cls(10, 8, 2, 2, max_seq_len=6, n_kv_heads=n_kv).double().layers[0]
        shell = _shell(8, 2, n_kv, bias=True)
        shell.q_proj.weight.copy_(layer.qkv.weight[:8])
        shell.q_proj.bias.copy_(layer.qkv.bias[:8])
        width = shell.k_proj.weight.size(0)
        for i, name in enumerate(("k_proj", "v_proj")):
            shell_part = slice(8 + i * width, 8 + (i + 1) * width)
            getattr(shell, name).weight.copy_(layer.qkv.weight[shell_part])
            getattr(shell, name).bias.copy_(layer.qkv.bias[shell_part])
        shell.out_proj.load_state_dict(layer.out_proj.state_dict())
        agree(layer(x), _torch_attention(shell, x, causal=True), "causal F.scaled_dot_product_attention")
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
        _refuses(lambda: fn(model, 0, head).__enter__(), against="a head that does not exist")


# ---- 08_kv_compression -----------------------------------------------------------------------------

@probe("08_kv_compression", "solutions.kv_compression.sliding_window_mask")
def sliding_window_mask(fn):
    for n_q, window, n_k in ((5, 2, None), (3, 3, 8)):
        n_keys = n_q if n_k is None else n_k
        want = torch.tensor([[i + n_keys - n_q - window < j <= i + n_keys - n_q for j in range(n_keys)]
                             for i in range(n_q)])
        agree(fn(n_q, window, n_k), want, "its definition")
    _refuses(fn, 4, 0, against="a window of 0")


@probe("08_kv_compression", "solutions.kv_compression.RollingKVCache")
def rolling_kv_cache(cls):
    cache, keys, vals = cls(2, 3, 2, 2, dtype=torch.float64), [], []
    for i, t in enumerate((2, 1, 4, 1)):
        seen = sum(x.size(2) for x in keys)
        keys.append(_randn(2, 2, t, 2, seed=i))
        vals.append(_randn(2, 2, t, 2, seed=10 + i))
        got = cache.update(keys[-1], vals[-1])
        for j, parts in enumerate((keys, vals)):  # the last 3 positions seen before, then the new ones
            agree(got[j], torch.cat(parts, dim=2)[:, :, max(0, seen - 3):], "the last window positions and the new")
        agree(len(cache), seen + t, "the positions seen")
    cache.reset()
    agree(len(cache), 0, "no position after reset()")
    k, v = _randn(2, 2, 5, 2, seed=3), _randn(2, 2, 5, 2, seed=4)  # a prefill longer than the window
    cache.update(k, v)
    got = cache.update(k[:, :, :1], v[:, :, :1])
    agree(got[0], torch.cat([k[:, :, 2:], k[:, :, :1]], dim=2), "the last window keys and the new")
    _refuses(cls, 2, 0, 2, 2, against="a window of 0")


def _mla_shell(mla):
    """PyTorch's attention over mla's up-projected latents: a shell whose k_proj, v_proj read latents."""
    shell = nn.Module()
    shell.q_proj, shell.out_proj, shell.k_proj, shell.v_proj = mla.q_proj, mla.out_proj, mla.k_up, mla.v_up
    shell.n_heads = shell.n_kv_heads = mla.n_heads
    return shell


@probe("08_kv_compression", "solutions.kv_compression.MultiHeadLatentAttention")
def multi_head_latent_attention(cls):
    torch.manual_seed(0)
    mla, x, cache = cls(12, 3, 5, bias=True).double(), _randn(2, 6, 12, seed=1), _ListCache(dim=1)
    want = _torch_attention(_mla_shell(mla), x, causal=True, keys=mla.kv_down(x))
    agree(mla(x), want, "causal F.scaled_dot_product_attention over the up-projected latents")
    got = torch.cat([mla(x[:, a:b], cache=cache) for a, b in ((0, 4), (4, 6))], dim=1)
    agree(got, want, "causal F.scaled_dot_product_attention over the up-projected latents")
    agree(cache.parts[0].shape[-1], 5, "a cache of latents (width d_latent)")
    for bias in (True, False):
        biases = [name for name, _ in cls(12, 3, 5, bias=bias).named_parameters() if name.endswith("bias")]
        agree(len(biases), 5 if bias else 0, "a bias on each of its five projections, or none")
    _refuses(cls, 10, 3, 5, against="d_model not divisible by n_heads")


@probe("08_kv_compression", "solutions.kv_compression.absorbed_attention")
def absorbed_attention(fn):
    from solutions.kv_compression import MultiHeadLatentAttention

    torch.manual_seed(0)
    for bias in (True, False):
        mla, x = MultiHeadLatentAttention(12, 3, 5, bias=bias).double(), _randn(2, 7, 12, seed=1)
        latents = mla.kv_down(x)
        agree(fn(mla, x[:, -3:], latents), _torch_attention(_mla_shell(mla), x[:, -3:], causal=True, keys=latents),
              "causal F.scaled_dot_product_attention over the up-projected latents")


# ---- 09_flash_backward -----------------------------------------------------------------------------

def _attention_inputs(tq=5, tk=7, dh=4, b=2):
    """q, k, v, dout in float64, Tq != Tk, several batches and heads."""
    return (_randn(b, 2, tq, dh), _randn(b, 2, tk, dh, seed=1), _randn(b, 2, tk, dh, seed=2),
            _randn(b, 2, tq, dh, seed=3))


LONG = dict(tq=3, tk=1100, b=1)  # more keys than the stand-ins' smallest tile (stand_ins.MIN_TILE): several tiles


def _sdpa_grads(q, k, v, dout, causal):
    """(out, lse, (dq, dk, dv)): PyTorch's attention, its scores' row logsumexp, and autograd's gradients for dout."""
    mask = _lower_right(q.size(2), k.size(2)) if causal else None
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        out.backward(dout)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    lse = (scores if mask is None else scores.masked_fill(~mask, -math.inf)).logsumexp(-1)
    return out.detach(), lse, tuple(t.grad for t in leaves)


@probe("09_flash_backward", "solutions.flash_backward.attention_backward")
def attention_backward(fn):
    q, k, v, dout = _attention_inputs()
    for causal in (False, True):
        for got, want in zip(fn(q, k, v, dout, causal), _sdpa_grads(q, k, v, dout, causal)[2]):
            agree(got, want, "autograd through F.scaled_dot_product_attention")


@probe("09_flash_backward", "solutions.flash_backward.flash_attention_forward", f"{STAND_INS}.flash_attention_forward")
def flash_attention_forward(fn):
    for (q, k, v, _), blocks in ((_attention_inputs(), (2, 3)), (_attention_inputs(**LONG), (2, 300))):
        for causal in (False, True):  # tiles that divide neither length
            out, lse, _ = _sdpa_grads(q, k, v, q, causal)
            got = fn(q, k, v, causal, *blocks)
            agree(got[0], out, "F.scaled_dot_product_attention")
            agree(got[1], lse, "torch.logsumexp of the scaled scores")
    if fn(q.half(), k.half(), v.half(), False, 2, 3)[1].dtype != torch.float32:
        raise _Disagrees("its lse is not float32 for float16 inputs")


@probe("09_flash_backward", "solutions.flash_backward.flash_attention_backward",
       f"{STAND_INS}.flash_attention_backward")
def flash_attention_backward(fn):
    for (q, k, v, dout), blocks in ((_attention_inputs(), (2, 3)), (_attention_inputs(**LONG), (2, 300))):
        for causal in (False, True):
            out, lse, grads = _sdpa_grads(q, k, v, dout, causal)
            for got, want in zip(fn(q, k, v, out, lse, dout, causal, *blocks), grads):
                agree(got, want, "autograd through F.scaled_dot_product_attention")


@probe("09_flash_backward", "solutions.flash_backward.FlashAttention")
def flash_attention_function(cls):
    q, k, v, dout = _attention_inputs()
    for causal in (False, True):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            cls.apply(*leaves, causal).backward(dout)
        for got, want in zip(leaves, _sdpa_grads(q, k, v, dout, causal)[2]):
            agree(got.grad, want, "autograd through F.scaled_dot_product_attention")
        with torch.enable_grad():
            small = [t[:1, :1, :3].detach().requires_grad_() for t in (q, k, v)]
            if not torch.autograd.gradcheck(cls.apply, (*small, causal), raise_exception=False):
                raise _Disagrees("it fails torch.autograd.gradcheck")


@probe("09_flash_backward", f"{STAND_INS}._tile_scores")
def tile_scores(fn):
    q, k, _, _ = _attention_inputs()
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~_lower_right(5, 7), -math.inf)  # Dh = 4
    agree(fn(q, k, slice(3, 6), slice(2, 5), True, torch.float64), scores[:, :, 3:5, 2:5], "the masked scaled scores")


# ---- 10_head_roles ---------------------------------------------------------------------------------

def _role_pattern(H=3, T=7, seed=0):
    """(H, T, T) float64 rows summing to 1, with weight on later keys and exact ties (quarters)."""
    p = torch.softmax(_randn(H, T, T, seed=seed) * 3, dim=-1)
    return torch.round(p * 4) / 4 + 1e-3 * torch.eye(T)  # many equal largest weights; the diagonal breaks some


def _first_largest(row):
    """The index of a row's largest value, the lowest among equal ones, written out."""
    values = row.tolist()
    return max(range(len(values)), key=lambda j: (values[j], -j))


@probe("10_head_roles", "solutions.head_roles.relation_accuracy")
def relation_accuracy(fn):
    p, pairs = _role_pattern(), torch.tensor([[3, 1], [6, 6], [4, 0], [2, 2], [5, 3]])
    want = torch.tensor([sum(_first_largest(p[h, f]) == t for f, t in pairs.tolist()) / len(pairs)
                         for h in range(p.shape[0])], dtype=torch.float64)
    agree(fn(p, pairs), want, "the definition, pair by pair")


@probe("10_head_roles", "solutions.head_roles.offset_baseline")
def offset_baseline(fn):
    pairs = torch.tensor([[5, 2], [7, 4], [6, 2], [9, 6], [3, 3], [8, 4], [4, 0]])  # offsets 3 3 4 3 0 4 4
    offsets = [f - t for f, t in pairs.tolist()]
    agree(fn(pairs), max(offsets.count(k) for k in offsets) / len(offsets), "the share of the most common offset")
    try:
        fn(torch.zeros(0, 2, dtype=torch.long))
    except ValueError:
        return
    raise _Disagrees("it raises no ValueError for no pairs")


@probe("10_head_roles", "solutions.head_roles.rare_word_score")
def rare_word_score(fn):
    p, tokens, counts = _role_pattern(seed=1), torch.tensor([4, 0, 2, 2, 1, 3, 0]), torch.tensor([5, 2, 9, 2, 7])
    want = []
    for h in range(p.shape[0]):
        hits = [counts[tokens[_first_largest(p[h, i, :i + 1])]] == min(counts[tokens[:i + 1]].tolist())
                for i in range(1, p.shape[-1])]
        want.append(sum(bool(x) for x in hits) / len(hits))
    agree(fn(p, tokens, counts), torch.tensor(want, dtype=torch.float64), "the definition, query by query")


@probe("10_head_roles", "solutions.head_roles.head_importance")
def head_importance(fn):
    from solutions.head_roles import RoleModel

    torch.manual_seed(0)
    model = RoleModel(9, d_model=8, n_layers=2, n_heads=2, d_mlp=8, max_len=5).double().train()
    ids, targets = torch.randint(9, (3, 5), generator=torch.Generator().manual_seed(1)), torch.arange(15).view(3, 5) % 9
    want, eps = torch.zeros(2, 2, dtype=torch.float64), 1e-6
    for b in range(3):
        for gate in range(4):
            step = torch.zeros(4, dtype=torch.float64)
            step[gate] = eps
            with torch.no_grad():
                up, down = (F.cross_entropy(model(ids[b:b + 1], (1 + s * step).view(2, 2))[0], targets[b])
                            for s in (1, -1))
            want.view(-1)[gate] += abs(up - down) / (2 * eps) / 3
    agree(fn(model, ids, targets), want, "finite differences of each sequence's loss", tol=1e-6)
    if not model.training or any(p.grad is not None for p in model.parameters()):
        raise _Disagrees("it changes the model's mode or fills its parameters' .grad")


@probe("10_head_roles", "solutions.head_roles.prune_heads")
def prune_heads(fn):
    for importance in (torch.tensor([[0.5, 0.1, 0.3], [0.1, 0.9, 0.2]], dtype=torch.float64),
                       torch.tensor([[2, 0, 1], [0, 1, 0]])):
        flat = importance.flatten().tolist()
        order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
        for n in range(len(flat) + 1):
            want = torch.ones(len(flat), dtype=importance.dtype if importance.is_floating_point() else torch.float32)
            want[order[:n]] = 0
            agree(fn(importance.clone(), n), want.view(importance.shape), "zeros at the n least important heads")
    try:
        fn(importance, -1)
    except ValueError:
        return
    raise _Disagrees("it raises no ValueError for n_prune = -1")
