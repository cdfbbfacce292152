"""solutions.kv_cache (lesson 05): cached equals uncached, token for token."""

import pytest
import torch

from solutions.gqa import GroupedQueryAttention
from solutions.kv_cache import Decoder, KVCache, attend_with_cache, generate
from tests.harness.checks import *  # noqa: F403
from tests.harness.grading import *  # noqa: F403
from tests.harness.honest import *  # noqa: F403
from tests.harness.notebooks import *  # noqa: F403
from tests.harness.visible import *  # noqa: F403

# The slice of one lesson: its solution tests here, and the generic tests above (tests/harness/), which
# tests/lessons/conftest.py parametrizes with this lesson's cases.
LESSON = "05_kv_cache"

torch.manual_seed(0)


def test_update_appends_and_returns_only_what_is_cached():
    cache = KVCache(2, 10, 3, 4)
    k1, v1 = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    k_all, v_all = cache.update(k1, v1)
    assert len(cache) == 4 and k_all.shape == (2, 3, 4, 4)
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    k_all, v_all = cache.update(k2, v2)
    assert len(cache) == 5
    torch.testing.assert_close(k_all, torch.cat([k1, k2], 2))
    torch.testing.assert_close(v_all, torch.cat([v1, v2], 2))
    cache.reset()
    assert len(cache) == 0
    assert cache.update(k2, v2)[0].shape == (2, 3, 1, 4)


def test_full_cache_raises_a_clear_error():
    cache = KVCache(1, 4, 2, 8)
    cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with pytest.raises(ValueError, match="full.*max_seq_len=4"):
        cache.update(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    assert len(cache) == 3


def test_update_rejects_wrong_shapes_and_dtypes():
    cache = KVCache(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"\(1, 2, T_new, 8\).*\(1, 3, 1, 8\)"):
        cache.update(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))
    with pytest.raises(ValueError, match="float64"):
        cache.update(torch.randn(1, 2, 1, 8).double(), torch.randn(1, 2, 1, 8).double())


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_prefill_then_single_steps_equal_full_causal_attention(n_kv_heads):
    attn = GroupedQueryAttention(16, 4, n_kv_heads, bias=True)
    x = torch.randn(2, 9, 16)
    full = attn(x)
    cache = KVCache(2, 16, n_kv_heads, 4)
    outs = [attend_with_cache(attn, x[:, :5], cache)]
    outs += [attn(x[:, t : t + 1], cache=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert len(cache) == 9


def test_chunked_prefill_needs_the_bottom_right_mask():
    attn = GroupedQueryAttention(16, 4, 2)
    x = torch.randn(1, 8, 16)
    cache = KVCache(1, 8, 2, 4)
    attend_with_cache(attn, x[:, :5], cache)
    torch.testing.assert_close(attend_with_cache(attn, x[:, 5:], cache), attn(x)[:, 5:])


def make_decoder(**kw):
    torch.manual_seed(1)
    cfg = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=40) | kw
    return Decoder(**cfg).eval()


def test_decoder_logits_with_caches_equal_without():
    model = make_decoder()
    ids = torch.randint(50, (2, 12))
    caches = model.make_caches(2)
    steps = [model(ids[:, :7], caches)] + [model(ids[:, t : t + 1], caches) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids))
    assert all(len(c) == 12 for c in caches)


@pytest.mark.parametrize("n_kv_heads", [1, 4])
def test_generate_same_tokens_with_and_without_cache(n_kv_heads):
    model = make_decoder(n_kv_heads=n_kv_heads).double()
    prompt = torch.randint(50, (3, 5))
    cached = generate(model, prompt, 20)
    assert cached.shape == (3, 25) and cached.dtype == torch.long
    torch.testing.assert_close(cached[:, :5], prompt)
    torch.testing.assert_close(cached, generate(model, prompt, 20, use_cache=False))


def test_generate_never_feeds_the_last_token():
    # The last new token is returned, never run through the model: 4 + 7 tokens need 10 positions.
    model = make_decoder(max_seq_len=10)
    assert generate(model, torch.zeros(1, 4, dtype=torch.long), 7).shape == (1, 11)
    with pytest.raises(ValueError, match="max_seq_len=10"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 8)


# ---- the hidden check of generate against a forged call log (issue 11, item 4) -------------------

FORGER = """
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, use_cache=True):
    ids = prompt_ids
    for _ in range(max_new_tokens):  # never uses the cache ...
        ids = torch.cat([ids, model(ids)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    if use_cache:  # ... then rewrites the model's call log to look like a cached run
        T0 = prompt_ids.size(1)
        model.calls = [[T0, 0]] + [[1, T0 + i] for i in range(max_new_tokens - 1)] if max_new_tokens else []
    return ids
"""


def test_a_generate_that_forges_the_call_log_loses_its_points():
    from autograder.checking import verify
    from autograder.lessons.kv_cache.checks import ProbeModel, _expected_calls
    from tests.harness.lessons import fresh_namespace

    ns = fresh_namespace("05_kv_cache", {"generate": FORGER})
    # The attack is real: a log kept next to the student's code shows a cached run ...
    model = ProbeModel(11, 16, seed=0)
    ns["generate"](model, torch.zeros(2, 3, dtype=torch.long), 5)
    assert model.calls == _expected_calls(3, 5, use_cache=True)
    # ... but the check reads the grader's own log, so it scores nothing.
    with pytest.raises(AssertionError, match="never given caches") as failed:
        verify("05_kv_cache", "generate", ns)
    assert getattr(failed.value, "earned", 0) == 0


@pytest.mark.parametrize(
    "name, what, share",
    [
        ("attend_with_cache", "a square T x T mask", (3, 4)),
        ("generate", "ignores use_cache: always caches", (2, 3)),
        ("KVCache", "reset() does not reset", (6, 7)),
    ],
)
def test_one_slip_costs_its_share(name, what, share):
    from autograder.checking import PartialCredit, mistakes, verify
    from tests.harness.lessons import fresh_namespace

    m05_kv_cache = mistakes.for_lesson("05_kv_cache")

    code = next(c for w, _, c in m05_kv_cache.MUTANTS[name] if w.startswith(what))
    with pytest.raises(PartialCredit) as partial:
        verify("05_kv_cache", name, fresh_namespace("05_kv_cache", {name: code}))
    assert (partial.value.earned, partial.value.total) == share
