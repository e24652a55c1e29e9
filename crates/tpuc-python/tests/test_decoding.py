"""Decoding loops: Hugging Face `generate` with the dynamic cache (graphs compiled per bucket of
cache lengths) and the static cache (caches updated in place), in strict mode, against eager;
and inputs a graph updates in place, seen by the caller in its own memory."""
import sys
from pathlib import Path

import pytest
import torch

import tpuc  # noqa: F401  (registers the backend)
from tpuc.runtime import STATS

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
transformers = pytest.importorskip("transformers")
from bench_decode import build  # noqa: E402

NEW_TOKENS = 24


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_generate_matches_eager_in_strict_mode(family, cache):
    model = build(family)
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        eager = model.generate(prompt, **kwargs)
    model.forward = torch.compile(model.forward, backend="tpuc", options={"strict": True})
    before = dict(STATS)
    with torch.no_grad():
        first = model.generate(prompt, **kwargs)
        compiles = STATS["compiles"]
        second = model.generate(prompt, **kwargs)
    assert torch.equal(first, eager) and torch.equal(second, eager)
    # The second generate compiles nothing.
    assert STATS["compiles"] == compiles
    if cache == "dynamic":
        # Cache lengths 8..31: the prompt's graph and the first step's (static), then the
        # buckets 16 and 32, which the other steps share.
        assert compiles - before["compiles"] <= 4
        assert STATS["bucket_hits"] - before["bucket_hits"] >= NEW_TOKENS - 4
    elif family != "mistral":
        # Each layer's key and value caches are written in place on every step (Mistral's
        # sliding-window layers replace theirs).
        assert STATS["in_place"] - before["in_place"] >= 2 * 4 * NEW_TOKENS


def test_inputs_updated_in_place_are_seen_by_the_caller_in_their_own_memory():
    def step(cache, lengths, pos, new):
        cache.index_copy_(0, pos, new)
        lengths[pos] += 1
        return cache.sum(0) * 2

    f = torch.compile(step, backend="tpuc", options={"strict": True})
    cache, lengths = torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)
    ref_cache, ref_lengths = cache.clone(), lengths.clone()
    address = cache.data_ptr()
    before = STATS["in_place"]
    for i in range(6):
        pos, new = torch.tensor([i % 8]), torch.randn(1, 4)
        torch.testing.assert_close(f(cache, lengths, pos, new), step(ref_cache, ref_lengths, pos, new))
        torch.testing.assert_close(cache, ref_cache)
        assert torch.equal(lengths, ref_lengths)
    assert cache.data_ptr() == address
    assert STATS["in_place"] - before == 2 * 6


def test_a_tensor_updated_through_a_slice_and_a_non_contiguous_one():
    def write(cache, new, pos):
        cache[:, pos] = new
        return cache.mean()

    f = torch.compile(write, backend="tpuc", options={"strict": True})
    cache = torch.zeros(3, 6)
    ref = cache.clone()
    for i in range(3):
        new = torch.randn(3)
        torch.testing.assert_close(f(cache, new, i), write(ref, new, i))
        torch.testing.assert_close(cache, ref)
    # A transposed view is not contiguous: updated by a copy, with the same result.
    torch._dynamo.reset()
    g = torch.compile(write, backend="tpuc", options={"strict": True})
    base, ref_base = torch.zeros(6, 3), torch.zeros(6, 3)
    new = torch.randn(3)
    torch.testing.assert_close(g(base.t(), new, 1), write(ref_base.t(), new, 1))
    torch.testing.assert_close(base, ref_base)
