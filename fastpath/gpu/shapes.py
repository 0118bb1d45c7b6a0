"""Shape bucketing and the bounded cache of per-shape work (captured graphs), in plain Python.

A CUDA graph (or a compiled graph in "reduce-overhead" mode) replays one fixed shape. OmniVoice's LLM sees a
new sequence length for almost every sentence, so each length is padded up to a bucket: a ladder of lengths
that are multiples of `multiple` and, with `growth` > 1, grow geometrically, so padding wastes at most one
multiple or a fraction growth - 1 of the length, and the number of rungs up to N grows like log(N). Captures
are kept in an LRU of at most `max_entries`; the least recently used one is dropped when a new shape arrives.

No torch here: the rules are unit-tested on any machine.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable


@dataclass(frozen=True)
class Buckets:
    """The ladder of padded lengths. multiple: rung spacing; growth: 1.0 for plain multiples, > 1 geometric."""

    multiple: int = 64
    growth: float = 1.0

    def __post_init__(self):
        if not isinstance(self.multiple, int) or self.multiple < 1:
            raise ValueError(f"bucket multiple must be a positive int, got {self.multiple!r}")
        if not (isinstance(self.growth, (int, float)) and math.isfinite(self.growth) and self.growth >= 1.0):
            raise ValueError(f"bucket growth must be a finite number >= 1.0, got {self.growth!r}")

    def length(self, n: int) -> int:
        """The smallest rung >= n (n >= 1)."""
        if n < 1:
            raise ValueError(f"cannot bucket a length of {n}")
        if self.growth == 1.0:
            return -(-n // self.multiple) * self.multiple
        for rung in self.rungs():
            if rung >= n:
                return rung
        raise AssertionError("unreachable: rungs() is unbounded")

    def rungs(self):
        """multiple, then each rung max(previous + multiple, previous * growth rounded up to a multiple)."""
        rung = self.multiple
        while True:
            yield rung
            grown = -(-math.ceil(rung * self.growth) // self.multiple) * self.multiple
            rung = max(rung + self.multiple, grown)

    def ladder(self, up_to: int) -> list:
        """Every rung needed to cover lengths 1..up_to."""
        out = []
        for rung in self.rungs():
            out.append(rung)
            if rung >= up_to:
                return out


DEFAULT_BUCKETS = Buckets(multiple=64, growth=1.0)  # lengths padded to multiples of 64 (compile, graphs)


@dataclass(frozen=True)
class Numerics:
    """Process settings a captured graph bakes in: the kernels (and their math modes) picked at capture are replayed
    whatever the settings are later, so a change of any of them needs a graph of its own.

    tf32: cuBLAS and cuDNN TF32 (torch's two flags, or the fp32_precision settings they derive from where torch
    refuses to read the flags); reduced: cuBLAS fp16 and bf16 reduced-precision reductions; autocast: the autocast
    dtype on the inputs' device type, "" when autocast is off there; sdpa: which attention backends may run
    (flash, mem_efficient, math, cudnn) and their priority order (what `torch.nn.attention.sdpa_kernel` sets).
    """

    tf32: tuple = ()
    reduced: tuple = ()
    autocast: str = ""
    sdpa: tuple = ()


@dataclass(frozen=True)
class GraphKey:
    """What one captured graph is specialised to: replaying it for anything else would be wrong.

    rows: batch rows G; length: bucketed query length; keys: bucketed key length (the mask's last dim, >= length);
    dtype, device: of the input embeddings; attention: the LLM's attention implementation name; weights: which
    set of parameter and buffer storages the graph reads (a number the owner changes when any of them changes);
    numerics: the process settings the graph's kernels were picked under (`Numerics`).
    """

    rows: int
    length: int
    keys: int
    dtype: str
    device: str
    attention: str
    weights: int = 0
    numerics: Numerics = Numerics()


def graph_key(rows: int, length: int, keys: int, dtype, device, attention: str, buckets: Buckets,
              weights: int = 0, numerics: Numerics = Numerics()) -> GraphKey:
    """The key for a forward over [rows, length] with a [rows, 1, length, keys] mask (keys >= length)."""
    if keys < length:
        raise ValueError(f"mask width {keys} is narrower than the sequence length {length}")
    padded = buckets.length(length)
    return GraphKey(rows, padded, max(buckets.length(keys), padded), str(dtype), str(device), attention, weights,
                    numerics)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    failures: int = 0  # shapes whose capture failed and that run eagerly instead

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "failures": self.failures}


@dataclass
class LRUCache:
    """At most `max_entries` values by key; `get_or_create` builds a missing one and drops the least recently used.

    `on_evict(key, value)` is called for each dropped entry (to free what it holds).
    """

    max_entries: int
    on_evict: Callable | None = None
    stats: CacheStats = field(default_factory=CacheStats)
    _entries: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self):
        if not isinstance(self.max_entries, int) or self.max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {self.max_entries!r}")

    def get_or_create(self, key: Hashable, create: Callable):
        if key in self._entries:
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return self._entries[key]
        self.stats.misses += 1
        value = create()
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            old_key, old_value = self._entries.popitem(last=False)
            self.stats.evictions += 1
            if self.on_evict is not None:
                self.on_evict(old_key, old_value)
        return value

    def replace(self, key: Hashable, value) -> None:
        """Put `value` in place of the entry under `key` (most recently used now); the old one is not evicted."""
        self._entries[key] = value
        self._entries.move_to_end(key)

    def keys(self) -> list:
        """Keys from least to most recently used."""
        return list(self._entries)

    def values(self) -> list:
        return list(self._entries.values())

    def clear(self) -> None:
        while self._entries:
            key, value = self._entries.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(key, value)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries
