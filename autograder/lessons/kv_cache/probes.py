"""Lesson 05_kv_cache's reference probes: each graded name of solutions/kv_cache.py (and the stand-ins its checks
send into the sandbox) against PyTorch or its definition written out (autograder/selfcheck.py runs them)."""

import torch

from autograder.checking.probing import ListCache, agree, probe, randn, refuses, shell_module, torch_attention


@probe("05_kv_cache", "solutions.kv_cache.KVCache")
def kv_cache(cls):
    cache, seen = cls(2, 8, 2, 3, dtype=torch.float64), []
    for i, t in enumerate((3, 1, 2, 2)):  # up to max_seq_len exactly
        k, v = randn(2, 2, t, 3, seed=i), randn(2, 2, t, 3, seed=10 + i)
        seen.append((k, v))
        got = cache.update(k, v)  # views of its buffers or copies of them: the contract allows either
        for j in range(2):
            agree(got[j], torch.cat([s[j] for s in seen], dim=2), "every key and value so far")
        agree(len(cache), sum(s[0].size(2) for s in seen), "the positions cached")
    refuses(cache.update, randn(2, 2, 1, 3), randn(2, 2, 1, 3), against="an update past max_seq_len")
    agree(len(cache), 8, "the positions cached before a refused update")
    cache.reset()
    agree(len(cache), 0, "an empty cache after reset()")


@probe("05_kv_cache", "solutions.kv_cache.attend_with_cache")
def attend_with_cache(fn):
    shell, x, cache = shell_module(12, 4, 2, bias=True), randn(2, 7, 12, seed=1), ListCache()
    got = torch.cat([fn(shell, x[:, a:b], cache) for a, b in ((0, 4), (4, 5), (5, 7))], dim=1)
    agree(got, torch_attention(shell, x, causal=True), "causal F.scaled_dot_product_attention over every token")


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
