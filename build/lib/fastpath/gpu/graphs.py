"""CUDA-graph capture and replay of the LLM forward, one graph per bucketed shape (patch `cuda_graphs`).

At batch 1 the Qwen3 backbone (28 layers, ~20 kernels each) is launch-bound on a large GPU: the kernels finish
faster than Python and the driver can issue them. A CUDA graph issues the whole forward with one launch. A graph
replays one fixed shape and fixed addresses, so each call is padded up to a bucketed shape (shapes.py, padding.py)
and copied into that shape's static input buffers; the real rows of the static output are copied out.

Stages per call: `llm_call_shape` -> `graph_key` -> `LRUCache.get_or_create` (first time: fill, warm up on a side
stream, capture) -> `fill_padded` -> replay -> `hidden_output`. Captures share one memory pool (graphs replay one
at a time on one stream, and each keeps its static output alive, so no graph reads memory another one wrote).
Calls that are not on CUDA, need gradients, run inside another capture, or carry arguments the padding does not
handle go to the stock forward unchanged; a shape whose capture fails runs eagerly and is counted.

Replaying a graph reads the weights at the addresses they had at capture: after replacing parameters (loading
other weights, `model.to(...)`), revert and apply again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from fastpath.gpu import synchronize
from fastpath import instance
from fastpath.gpu.padding import fill_padded, hidden_output, llm_call_shape
from fastpath.gpu.shapes import DEFAULT_BUCKETS, Buckets, GraphKey, LRUCache, graph_key

log = logging.getLogger(__name__)

GRAPHS_ATTR = "_fastpath_cuda_graphs"  # model instance attribute: the GraphedForward while applied
DEFAULT_MAX_GRAPHS = 32
WARMUP_CALLS = 2  # eager runs on a side stream before capture (lazy cuBLAS/cuDNN init stays out of the graph)


@dataclass
class Captured:
    """One shape's graph and its static buffers: embeds [G, Lb, H], mask [G, 1, Lb, Pb], hidden [G, Lb, H]."""

    graph: object | None  # torch.cuda.CUDAGraph (or a test double with .replay()); None: capture failed, run eagerly
    embeds: torch.Tensor | None
    mask: torch.Tensor | None
    hidden: torch.Tensor | None
    seconds: float  # fill + warm-up + capture, device synchronised
    error: str | None = None


def capture_cuda_graph(run: Callable, pool) -> tuple:
    """Warm `run` up on a side stream, then capture it; returns (graph, its static output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_CALLS):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        hidden = run()
    return graph, hidden


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@dataclass(eq=False, repr=False)
class GraphedForward:
    """Stands in for `llm.forward` on the instance: replays a captured graph per bucketed shape.

    Args:
        llm: the model's LLM module (its attention implementation is part of the key).
        inner: the forward it replaces (stock bound method, or whatever the instance had).
        buckets: the length ladder; max_graphs: LRU bound on live captures.
        devices: device types it captures on; anything else calls `inner`.
        capture: (run, pool) -> (graph, static output); `capture_cuda_graph` unless a test passes a double.
    """

    llm: torch.nn.Module
    inner: Callable
    buckets: Buckets = DEFAULT_BUCKETS
    max_graphs: int = DEFAULT_MAX_GRAPHS
    devices: tuple = ("cuda",)
    capture: Callable = capture_cuda_graph
    cache: LRUCache = field(init=False)
    pool: object = None
    passthrough: int = 0  # calls sent to `inner` because they are not capturable
    captures: list = field(default_factory=list)  # (key, seconds, error or None) for every capture, evicted too

    def __post_init__(self):
        self.cache = LRUCache(self.max_graphs)  # a dropped entry frees its graph and buffers with its last reference

    def __call__(self, *args, **kwargs):
        shape = llm_call_shape(args, kwargs)
        embeds = kwargs.get("inputs_embeds")
        if shape is None or embeds.device.type not in self.devices or torch.is_grad_enabled() \
                or _capturing(embeds.device):
            self.passthrough += 1
            return self.inner(*args, **kwargs)
        rows, length, keys = shape
        key = graph_key(rows, length, keys, embeds.dtype, embeds.device, self.llm.config._attn_implementation,
                        self.buckets)
        mask = kwargs["attention_mask"]
        entry = self.cache.get_or_create(key, lambda: self._capture(key, embeds, mask))
        if entry.graph is None:
            return self.inner(*args, **kwargs)
        fill_padded(embeds, mask, entry.embeds, entry.mask)
        entry.graph.replay()
        return hidden_output(entry.hidden, length)

    def _capture(self, key: GraphKey, embeds: torch.Tensor, mask: torch.Tensor) -> Captured:
        device = embeds.device
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode(False):  # normal tensors: writable from inside and outside inference mode
            static_embeds = torch.empty((key.rows, key.length, embeds.shape[-1]), dtype=embeds.dtype, device=device)
            static_mask = torch.empty((key.rows, 1, key.length, key.keys), dtype=torch.bool, device=device)
        fill_padded(embeds, mask, static_embeds, static_mask)  # warm up and capture on this call's real data

        def run():
            return self.inner(inputs_embeds=static_embeds, attention_mask=static_mask, position_ids=None,
                              return_dict=True, use_cache=False)[0]

        try:
            if self.pool is None and device.type == "cuda":
                self.pool = torch.cuda.graph_pool_handle()
            graph, hidden = self.capture(run, self.pool)
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager for this shape
            self.cache.stats.failures += 1
            log.warning("cuda_graphs: capture of %s failed, running it eagerly: %s", key, err)
            entry = Captured(None, None, None, None, time.perf_counter() - start, f"{type(err).__name__}: {err}")
        else:
            synchronize(device)
            entry = Captured(graph, static_embeds, static_mask, hidden, time.perf_counter() - start)
        self.captures.append((key, entry.seconds, entry.error))
        return entry

    def __repr__(self) -> str:
        return f"GraphedForward({len(self.cache)} graphs, {self.buckets}, max {self.max_graphs})"

    def stats(self) -> dict:
        entries = self.cache.values()
        return {
            **self.cache.stats.as_dict(),
            "graphs": sum(e.graph is not None for e in entries),
            "passthrough": self.passthrough,
            "capture_seconds": [round(seconds, 4) for _, seconds, _ in self.captures],
            "errors": [error for _, _, error in self.captures if error],
            "keys": self.cache.keys(),
        }


def install(model, buckets: Buckets = DEFAULT_BUCKETS, max_graphs: int = DEFAULT_MAX_GRAPHS,
            devices: tuple = ("cuda",), capture: Callable = capture_cuda_graph) -> GraphedForward:
    """Put a GraphedForward in front of `model.llm.forward` (instance only). Idempotent.

    Args:
        model: a loaded OmniVoice.
        buckets: sequence-length ladder (default: multiples of 64).
        max_graphs: most captured shapes kept; the least recently used is dropped beyond it.
        devices: device types to capture on (default CUDA only; tests pass ("cpu",) with a capture double).
        capture: how one shape is captured (default: `capture_cuda_graph`).
    """
    llm = model.llm
    return instance.install_wrapper(model, GRAPHS_ATTR, llm, "forward", lambda: GraphedForward(
        llm, llm.forward, buckets, max_graphs, tuple(devices), capture))


def remove(model) -> None:
    """Drop the graphs and put back the forward the instance had."""
    graphed = instance.remove_wrapper(model, GRAPHS_ATTR, "forward", lambda wrapper: model.llm)
    if graphed is not None:
        graphed.cache.clear()
        graphed.pool = None


def stats(model) -> dict | None:
    """Cache counters, capture times and keys of the applied `cuda_graphs` patch (None when not applied)."""
    graphed = model.__dict__.get(GRAPHS_ATTR)
    return None if graphed is None else graphed.stats()
