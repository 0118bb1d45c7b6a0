"""Bucketing, graph keys and the LRU of the GPU tier (fastpath/gpu/shapes.py), on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from fastpath.gpu.shapes import Buckets, GraphKey, LRUCache, Numerics, graph_key

# --- buckets, keys, LRU ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, expected", [(1, 64), (63, 64), (64, 64), (65, 128), (300, 320), (1000, 1024)])
def test_plain_buckets_round_up_to_the_multiple(n, expected):
    assert Buckets(64).length(n) == expected


@pytest.mark.parametrize("multiple, growth", [(64, 1.0), (32, 1.25), (64, 1.5), (16, 2.0)])
def test_bucket_ladder_bounds_padding_and_rung_count(multiple, growth):
    buckets = Buckets(multiple, growth)
    ladder = buckets.ladder(4096)
    assert ladder == sorted(set(ladder)) and all(r % multiple == 0 for r in ladder)
    for n in range(1, 4097):
        b = buckets.length(n)
        assert b >= n and b in ladder
        # waste: under one multiple, or under a growth fraction of the length (rounded up to a multiple)
        assert b - n < multiple or b <= math.ceil(n * growth / multiple) * multiple + multiple, (n, b)
    if growth > 1.0:  # geometric: logarithmically many rungs beyond the linear start
        linear = math.ceil(multiple / (growth - 1) / multiple) + 1
        assert len(ladder) <= linear + math.ceil(math.log(4096 / multiple, growth)) + 1, ladder


@pytest.mark.parametrize("kwargs", [dict(multiple=0), dict(multiple=1.5), dict(growth=0.9), dict(growth=float("nan"))])
def test_bad_bucket_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="bucket"):
        Buckets(**kwargs)
    with pytest.raises(ValueError, match="cannot bucket"):
        Buckets().length(0)


def test_graph_key_shares_a_bucket_and_separates_everything_else():
    b = Buckets(64)
    key = graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b)
    assert key == GraphKey(2, 320, 320, "torch.bfloat16", "cuda:0", "sdpa")
    assert graph_key(2, 257, 257, torch.bfloat16, "cuda:0", "sdpa", b) == key  # same bucket, same graph
    others = [
        graph_key(1, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b),  # rows
        graph_key(2, 321, 321, torch.bfloat16, "cuda:0", "sdpa", b),  # next bucket
        graph_key(2, 300, 300, torch.float16, "cuda:0", "sdpa", b),  # dtype
        graph_key(2, 300, 300, torch.bfloat16, "cuda:1", "sdpa", b),  # device
        graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "eager", b),  # attention implementation
        graph_key(2, 300, 400, torch.bfloat16, "cuda:0", "sdpa", b),  # wider keys (trimmed layout)
        # numerics the kernels were picked under: TF32, autocast, the SDPA backends
        graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b, numerics=Numerics(tf32=(True, True))),
        graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b, numerics=Numerics(autocast="torch.bfloat16")),
        graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b, numerics=Numerics(sdpa=(False, True, True, True))),
    ]
    assert len({key, *others}) == 1 + len(others)
    trimmed = graph_key(3, 40, 300, torch.bfloat16, "cuda:0", "sdpa", b)
    assert (trimmed.length, trimmed.keys) == (64, 320)
    with pytest.raises(ValueError, match="narrower"):
        graph_key(1, 10, 9, torch.float32, "cpu", "sdpa", b)


def test_lru_evicts_the_least_recently_used_and_counts():
    evicted = []
    cache = LRUCache(2, on_evict=lambda k, v: evicted.append((k, v)))
    made = []

    def make(name):
        return lambda: made.append(name) or name.upper()

    assert cache.get_or_create("a", make("a")) == "A"
    assert cache.get_or_create("b", make("b")) == "B"
    assert cache.get_or_create("a", make("a")) == "A"  # hit: "a" becomes most recent
    assert cache.get_or_create("c", make("c")) == "C"  # evicts "b"
    assert made == ["a", "b", "c"] and evicted == [("b", "B")]
    assert cache.keys() == ["a", "c"] and len(cache) == 2 and "b" not in cache
    assert cache.stats.as_dict() == {"hits": 1, "misses": 3, "evictions": 1, "failures": 0}
    cache.clear()
    assert len(cache) == 0 and [k for k, _ in evicted] == ["b", "a", "c"]
    with pytest.raises(ValueError, match="max_entries"):
        LRUCache(0)
