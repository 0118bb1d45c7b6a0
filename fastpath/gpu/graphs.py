"""CUDA-graph capture and replay of the LLM forward, one graph per bucketed shape (patch `cuda_graphs`).

At batch 1 the Qwen3 backbone (28 layers, ~20 kernels each) is launch-bound on a large GPU: the kernels finish
faster than Python and the driver can issue them. A CUDA graph issues the whole forward with one launch. A graph
replays one fixed shape and fixed addresses, so each call is padded up to a bucketed shape (shapes.py, padding.py)
and copied into that shape's static input buffers; the real rows of the static output are copied out.

Stages per call: `llm_call_shape` -> `read_numerics` -> `graph_key` -> `LRUCache.get_or_create` (first time: fill,
warm up on a side stream, capture) -> `fill_padded` -> replay -> `hidden_output`. Captures share one memory pool
(graphs replay one at a time on one stream, and each keeps its static output alive, so no graph reads memory another
one wrote). Calls that are not on a device the wrapper captures on, need gradients, run inside another capture, or
carry arguments the padding does not handle go to the stock forward unchanged; a shape whose capture fails runs
eagerly, is counted, and is captured again on a later call (at most CAPTURE_TRIES times in all, then a warning says
it runs eagerly for good).

Numerics: a graph replays the kernels and math modes picked at capture, so the key holds the process settings that
pick them (`Numerics`: TF32, reduced-precision reductions, autocast, the SDPA backends), read on every call (about
ten C++ reads). Reverting `cuda_tf32` therefore captures anew instead of replaying TF32 graphs, and setting TF32
back finds the old ones.

Devices: capture (side stream, warm-up, graph, pool) and replay (event wait, replay, event record) run under the
inputs' device (`torch.cuda.device(embeds.device)`, streams of that device), so a model on cuda:1 captures there
whatever device is current. The CUDA API is reached through `GraphedForward.api` (`torch.cuda` by default; tests
pass a recording fake, tests_patches/fake_cuda.py, with devices=("cpu",), and the CPU runs these branches).

Packed calls (packed_cfg: embeddings [1, N, H], positions [1, N], the segment of each position in
`fastpath_documents`) are keyed by N, already a multiple of FlexAttention's block; their static inputs are the
embeddings, positions and segment ids, and the block mask is rebuilt from the static ids inside the graph.

Weights: a graph reads the parameters and buffers at the addresses they had at capture. The key holds a number
for the set of storages the LLM has (`Weights`): each call compares every parameter's and buffer's address with
the last seen (one C++ call over the tensors, as torch.compile's CUDA graphs check theirs; no walk of the module
tree) and re-reads the module tree after any parameter, buffer or submodule registration anywhere in the process
(torch's global registration hooks, held while a GraphedForward exists). A move (`model.cpu().cuda()`, `.to(dtype)`), `load_state_dict(..., assign=True)`
or an adapter that replaces modules or registers weights therefore drops the old graphs and captures anew; an
in-place load (`load_state_dict` without assign, merging an adapter into the weights) keeps them, correctly, as
the graph reads the new values at the old addresses. Not seen: a change of Python state alone that changes what
a module's forward does (e.g. switching peft's active adapter without new weights): call `recapture(model)`.

Threads: captures are serialised in the process and run in thread-local capture mode, so another thread's CUDA
work (the caller's decode beside a stream's worker) neither breaks a capture nor is captured; replays of one
wrapper are serialised and ordered across CUDA streams (each call waits on an event of the previous one), since
they share static buffers.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from fastpath.gpu import synchronize
from fastpath import instance
from fastpath.gpu.padding import fill_padded, hidden_output, llm_call_shape
from fastpath.gpu.shapes import DEFAULT_BUCKETS, Buckets, GraphKey, LRUCache, Numerics, graph_key

log = logging.getLogger(__name__)

GRAPHS_ATTR = "_fastpath_cuda_graphs"  # model instance attribute: the GraphedForward while applied
DEFAULT_MAX_GRAPHS = 32
WARMUP_CALLS = 2  # eager runs on a side stream before capture (lazy cuBLAS/cuDNN init stays out of the graph)
CAPTURE_TRIES = 3  # captures of one shape before it runs eagerly for good (a failure may be passing)
_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (torch documents that limit)


@dataclass
class Captured:
    """One shape's graph and its static buffers: embeds [G, Lb, H], mask [G, 1, Lb, Pb], hidden [G, Lb, H]; for a
    packed call (packed_cfg) embeds [1, N, H], a [1, 1, 1, 1] mask, positions [1, N] and documents [N]."""

    graph: object | None  # api.CUDAGraph (or a test double with .replay()); None: capture failed, run eagerly
    embeds: torch.Tensor | None
    mask: torch.Tensor | None
    hidden: torch.Tensor | None
    seconds: float  # fill + warm-up + capture, device synchronised
    error: str | None = None
    tries: int = 1
    positions: torch.Tensor | None = None  # packed calls only
    documents: torch.Tensor | None = None  # packed calls only: the segment of each position (its block mask is
    # built inside the graph from these, so a replay needs only the new ids)


def capture_cuda_graph(run: Callable, pool, device: torch.device, api=torch.cuda) -> tuple:
    """Warm `run` up on a side stream of `device`, then capture it on that stream into `pool`; returns (graph, its
    static output). The caller holds `api.device(device)`."""
    stream = api.Stream(device=device)
    stream.wait_stream(api.current_stream(device))
    with api.stream(stream):
        for _ in range(WARMUP_CALLS):
            run()
    api.current_stream(device).wait_stream(stream)
    graph = api.CUDAGraph()
    # on the warm-up's stream: torch.cuda.graph's default stream is made once, on the device current at the
    # process's first capture, and entering it would switch a later capture on another device to that one
    with api.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        hidden = run()
    return graph, hidden


def _tf32() -> tuple:
    backends = torch.backends
    try:
        return backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32
    except RuntimeError:  # set through both torch's old and new APIs: the new API's settings decide the flags
        return (backends.fp32_precision, backends.cudnn.fp32_precision, backends.cuda.matmul.fp32_precision,
                backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision)


def _sdp_priority() -> tuple:
    order = getattr(torch._C, "_get_sdp_priority_order", None)  # sdpa_kernel(..., set_priority=True) sets it
    return () if order is None else tuple(order())


def read_numerics(device_type: str) -> Numerics:
    """The settings a capture bakes in, now (`Numerics`); `device_type` is the inputs' (autocast is per type)."""
    matmul, cuda = torch.backends.cuda.matmul, torch.backends.cuda
    autocast = str(torch.get_autocast_dtype(device_type)) if torch.is_autocast_enabled(device_type) else ""
    return Numerics(
        tf32=_tf32(),
        reduced=(matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction),
        autocast=autocast,
        sdpa=(cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
              cuda.cudnn_sdp_enabled()) + _sdp_priority())


class _Registrations:
    """A count of parameter, buffer and submodule registrations in the process (torch's global hooks, installed
    while at least one `Weights` is alive)."""

    def __init__(self):
        self.count, self.users, self.handles = 0, 0, []

    def bump(self, *args):
        self.count += 1  # returns None: the registered value is kept

    def hold(self) -> None:
        from torch.nn.modules import module

        if self.users == 0:
            self.handles = [module.register_module_parameter_registration_hook(self.bump),
                            module.register_module_buffer_registration_hook(self.bump),
                            module.register_module_module_registration_hook(self.bump)]
        self.users += 1

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            for handle in self.handles:
                handle.remove()
            self.handles = []


_registrations = _Registrations()


def _same_addresses(tensors: list, addresses: list, indices: list) -> bool:
    check = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # what torch.compile's graphs use
    if check is not None:
        return check(tensors, addresses, indices)
    return all(t.data_ptr() == a for t, a in zip(tensors, addresses))


class Weights:
    """Which storages a module's forward reads: `generation()` is a number that changes whenever a parameter or
    buffer of the module is replaced or moved, or its module tree changes."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.number = module, 0
        self.identity, self.tensors, self.addresses, self.indices, self.seen = None, [], [], [], -1
        _registrations.hold()
        self.close = weakref.finalize(self, _registrations.release)  # close(): now, else when collected; once

    def generation(self) -> int:
        if self.seen == _registrations.count and _same_addresses(self.tensors, self.addresses, self.indices):
            return self.number
        tensors = [t for _, t in self.module.named_parameters()] + [b for _, b in self.module.named_buffers()]
        identity = tuple((id(m), tuple(m._parameters), tuple(m._buffers)) for m in self.module.modules()) + \
            tuple((id(t), t.data_ptr()) for t in tensors)
        if identity != self.identity:
            self.number += 1
            self.identity = identity
        self.tensors, self.addresses = tensors, [t.data_ptr() for t in tensors]
        self.indices, self.seen = list(range(len(tensors))), _registrations.count
        return self.number

@dataclass
class PackedCall:
    """What a packed call (packed_cfg) adds to the embeddings: positions [1, N] and the segment ids [N]."""

    positions: torch.Tensor
    ids: torch.Tensor


PACKED_KWARGS = {"inputs_embeds", "attention_mask", "position_ids", "fastpath_documents", "return_dict", "use_cache"}


def packed_call_length(args: tuple, kwargs: dict):
    """N for a packed call the graphs can replay (keyword-only; embeddings [1, N, H]; positions [1, N]; documents
    of N ids; no KV cache asked for), else None."""
    documents = kwargs.get("fastpath_documents")
    if documents is None or args or not set(kwargs) <= PACKED_KWARGS or kwargs.get("use_cache") \
            or kwargs.get("return_dict") is False:
        return None
    embeds, positions = kwargs.get("inputs_embeds"), kwargs.get("position_ids")
    if not (isinstance(embeds, torch.Tensor) and isinstance(positions, torch.Tensor)) or embeds.dim() != 3:
        return None
    N = embeds.shape[1]
    if embeds.shape[0] != 1 or tuple(positions.shape) != (1, N) or documents.ids.shape != (N,):
        return None
    return N


def fill_packed(embeds: torch.Tensor, call: PackedCall, static: Captured) -> None:
    static.embeds.copy_(embeds)
    static.positions.copy_(call.positions)
    static.documents.copy_(call.ids)


@dataclass(eq=False, repr=False)
class GraphedForward:
    """Stands in for `llm.forward` on the instance: replays a captured graph per bucketed shape.

    Args:
        llm: the model's LLM module (its attention implementation is part of the key).
        inner: the forward it replaces (stock bound method, or whatever the instance had).
        buckets: the length ladder; max_graphs: LRU bound on live captures.
        devices: device types it captures on; anything else calls `inner`.
        capture: (run, pool) -> (graph, static output), a test's double; None: `capture_cuda_graph` through `api`.
        api: the CUDA API for streams, events, graphs, the pool and synchronisation on `devices`: `torch.cuda` when
            None and "cuda" is in `devices`; a test passes a fake with devices=("cpu",); stays None for a capture
            double on the CPU (nothing queued, nothing to order).
    """

    llm: torch.nn.Module
    inner: Callable
    buckets: Buckets = DEFAULT_BUCKETS
    max_graphs: int = DEFAULT_MAX_GRAPHS
    devices: tuple = ("cuda",)
    capture: Callable | None = None
    api: object = None
    cache: LRUCache = field(init=False)
    pool: object = None
    passthrough: int = 0  # calls sent to `inner` because they are not capturable
    captures: list = field(default_factory=list)  # (key, seconds, error or None) for every capture, evicted too
    recaptures: int = 0  # times the weights changed under captured graphs, which were dropped

    def __post_init__(self):
        if self.api is None and "cuda" in self.devices:
            self.api = torch.cuda
        if self.api is None and self.capture is None:
            raise ValueError(f"cuda_graphs on {self.devices} needs a CUDA API or a capture double")
        self.cache = LRUCache(self.max_graphs)  # a dropped entry frees its graph and buffers with its last reference
        self.weights = Weights(self.llm)
        self.lock = threading.Lock()  # one call at a time uses the static buffers
        self.last = None  # api.Event recorded after the last replay's output was copied out
        self.graphs_weights = None  # the weights number the cached graphs were captured with

    def __deepcopy__(self, memo):
        """A copy (of a deep-copied model) starts with no graphs: they hold the original's addresses."""
        import copy

        return GraphedForward(copy.deepcopy(self.llm, memo), copy.deepcopy(self.inner, memo), self.buckets,
                              self.max_graphs, self.devices, self.capture, self.api)

    def close(self) -> None:
        self.cache.clear()
        self.pool = None
        self.weights.close()

    def __call__(self, *args, **kwargs):
        packed = packed_call_length(args, kwargs)
        shape = llm_call_shape(args, kwargs) if packed is None else (1, packed, packed)
        embeds = kwargs.get("inputs_embeds")
        if shape is None or embeds.device.type not in self.devices or torch.is_grad_enabled() or self._capturing():
            self.passthrough += 1
            return self.inner(*args, **kwargs)
        rows, length, keys = shape
        mask = kwargs["attention_mask"]
        call = PackedCall(kwargs["position_ids"], kwargs["fastpath_documents"].ids) if packed else None
        attention = self.llm.config._attn_implementation + ("|packed" if packed else "")
        with self.lock:
            weights = self.weights.generation()
            if weights != self.graphs_weights:
                if len(self.cache):
                    self.recaptures += 1
                    self.cache.clear()  # every graph reads the old storages
                self.graphs_weights = weights
            numerics = read_numerics(embeds.device.type)
            # a packed length is already a multiple of the FlexAttention block: its own key, not bucketed again
            key = GraphKey(1, length, length, str(embeds.dtype), str(embeds.device), attention, weights, numerics) \
                if packed else graph_key(rows, length, keys, embeds.dtype, embeds.device, attention, self.buckets,
                                         weights, numerics)
            known = key in self.cache
            entry = self.cache.get_or_create(key, lambda: self._capture(key, embeds, mask, call=call))
            if known and entry.graph is None and entry.tries < CAPTURE_TRIES:  # failed on an earlier call: again
                entry = self._capture(key, embeds, mask, tries=entry.tries + 1, call=call)
                self.cache.replace(key, entry)
            if entry.graph is not None:
                return self._replay(entry, embeds, mask, length, call)
        return self.inner(*args, **kwargs)  # this shape's capture failed: eagerly, outside the lock

    def _capturing(self) -> bool:
        """Whether this thread's current stream is capturing (someone's graph of a larger call): not ours to capture."""
        return self.api is not None and self.api.is_current_stream_capturing()

    def _on(self, device: torch.device):
        """`api.device(device)`: the inputs' device is current while its graphs are captured and replayed."""
        return nullcontext() if self.api is None else self.api.device(device)

    def _synchronize(self, device: torch.device) -> None:
        synchronize(device, self.api, self.devices if self.api is not None else ())

    def _replay(self, entry: Captured, embeds: torch.Tensor, mask: torch.Tensor, length: int,
                call: PackedCall | None = None) -> torch.Tensor:
        with self._on(embeds.device):
            stream = None if self.api is None else self.api.current_stream(embeds.device)
            if stream is not None and self.last is not None:
                stream.wait_event(self.last)  # the previous replay (maybe on another stream) has copied its output
            if call is None:
                fill_padded(embeds, mask, entry.embeds, entry.mask)
            else:
                fill_packed(embeds, call, entry)
            entry.graph.replay()
            out = hidden_output(entry.hidden, length)
            if stream is not None:
                self.last = self.api.Event()
                self.last.record(stream)
        return out

    def _capture(self, key: GraphKey, embeds: torch.Tensor, mask: torch.Tensor, tries: int = 1,
                 call: PackedCall | None = None) -> Captured:
        with _CAPTURE_LOCK, self._on(embeds.device):
            return self._capture_alone(key, embeds, mask, tries, call)

    def _capture_alone(self, key: GraphKey, embeds: torch.Tensor, mask: torch.Tensor, tries: int,
                       call: PackedCall | None) -> Captured:
        from fastpath.gpu.packed import Documents

        device = embeds.device
        self._synchronize(device)
        start = time.perf_counter()
        static = Captured(None, None, None, None, 0.0)  # the static inputs, filled with this call's real data
        with torch.inference_mode(False):  # normal tensors: writable from inside and outside inference mode
            static.embeds = torch.empty((key.rows, key.length, embeds.shape[-1]), dtype=embeds.dtype, device=device)
            if call is None:
                static.mask = torch.empty((key.rows, 1, key.length, key.keys), dtype=torch.bool, device=device)
            else:
                static.mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
                static.positions, static.documents = torch.empty_like(call.positions), torch.empty_like(call.ids)
        if call is None:
            fill_padded(embeds, mask, static.embeds, static.mask)
        else:
            fill_packed(embeds, call, static)

        def run():
            if call is None:
                return self.inner(inputs_embeds=static.embeds, attention_mask=static.mask, position_ids=None,
                                  return_dict=True, use_cache=False)[0]
            # the block mask is built from the static ids inside the graph (tensor ops, no host sync)
            return self.inner(inputs_embeds=static.embeds, attention_mask=static.mask, position_ids=static.positions,
                              fastpath_documents=Documents(static.documents), return_dict=True, use_cache=False)[0]

        try:
            if self.pool is None and self.api is not None:
                self.pool = self.api.graph_pool_handle()  # one pool for every shape of this wrapper
            graph, hidden = self.capture(run, self.pool) if self.capture is not None else \
                capture_cuda_graph(run, self.pool, device, self.api)
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager for this shape
            self.cache.stats.failures += 1
            after = "it runs eagerly for good" if tries >= CAPTURE_TRIES else "running it eagerly, to be tried again"
            log.warning("cuda_graphs: capture %d/%d of %s failed, %s: %s", tries, CAPTURE_TRIES, key, after, err)
            entry = Captured(None, None, None, None, time.perf_counter() - start, f"{type(err).__name__}: {err}",
                             tries)
        else:
            self._synchronize(device)
            entry = Captured(graph, static.embeds, static.mask, hidden, time.perf_counter() - start, None, tries,
                             static.positions, static.documents)
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
            "recaptures": self.recaptures,
            "capture_seconds": [round(seconds, 4) for _, seconds, _ in self.captures],
            "errors": [error for _, _, error in self.captures if error],
            "keys": self.cache.keys(),
        }


def install(model, buckets: Buckets = DEFAULT_BUCKETS, max_graphs: int = DEFAULT_MAX_GRAPHS,
            devices: tuple = ("cuda",), capture: Callable | None = None, api=None) -> GraphedForward:
    """Put a GraphedForward in front of `model.llm.forward` (instance only). Idempotent.

    Args:
        model: a loaded OmniVoice.
        buckets: sequence-length ladder (default: multiples of 64).
        max_graphs: most captured shapes kept; the least recently used is dropped beyond it.
        devices: device types to capture on (default CUDA only; tests pass ("cpu",) with a fake API or a double).
        capture: how one shape is captured, (run, pool) -> (graph, static output) (default: `capture_cuda_graph`).
        api: the CUDA API (default `torch.cuda` when "cuda" is in `devices`; tests pass tests_patches/fake_cuda.py's).
    """
    llm = model.llm
    return instance.install_wrapper(model, GRAPHS_ATTR, llm, "forward", lambda: GraphedForward(
        llm, llm.forward, buckets, max_graphs, tuple(devices), capture, api))


def remove(model) -> None:
    """Drop the graphs and put back the forward the instance had."""
    graphed = instance.remove_wrapper(model, GRAPHS_ATTR, "forward", lambda wrapper: model.llm)
    if graphed is not None:
        graphed.close()


def recapture(model) -> None:
    """Drop every captured graph of the applied `cuda_graphs` patch, so each shape is captured again on its next
    call: after a change the weights' addresses do not show (module docstring)."""
    graphed = model.__dict__.get(GRAPHS_ATTR)
    if graphed is not None:
        with graphed.lock:
            graphed.cache.clear()
            graphed.recaptures += 1


def stats(model) -> dict | None:
    """Cache counters, capture times and keys of the applied `cuda_graphs` patch (None when not applied)."""
    graphed = model.__dict__.get(GRAPHS_ATTR)
    return None if graphed is None else graphed.stats()
