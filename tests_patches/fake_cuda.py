"""A recording stand-in for `torch.cuda`, so the CPU runs the CUDA branches of cuda_graphs (fastpath/gpu/graphs.py)
and of the stream worker (fastpath/streaming.py).

`FakeCuda()` has what graphs.py and `fastpath.gpu.synchronize` call, with torch.cuda's signatures (test_gpu_graphs
holds them to the installed torch's). Every call is logged in `calls` as Call(name, device, on, kwargs). The
current device starts at cuda:0 and follows `device(...)`; a stream has the device it was made for; `stream(s)`
makes s current, and its device too (as torch's StreamContext does). A CUDA graph records the kernels launched while
it captures and replays them on the same addresses: here `graph(...)` records the aten ops run inside it (a
TorchDispatchMode) and `replay()` runs them again in order, writing each result into the tensor the capture made.
A host sync during capture (`.item()`, `bool(t)`, `nonzero`) raises as on a capturing stream; inside `graph(...)`
`is_current_stream_capturing()` is True on that thread only (thread-local capture mode).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
HOST_SYNCS = (aten._local_scalar_dense.default, aten.equal.default, aten.nonzero.default)  # need the values on the host
CAPTURE_ERROR = "operation not permitted when stream is capturing"


@dataclass
class Call:
    name: str  # "Stream", "Stream.wait_event", "graph", "synchronize", ...
    device: torch.device  # the device the call acted on
    on: object = None  # the stream, event or graph a method was called on
    kwargs: dict = field(default_factory=dict)


def as_device(device) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


class Recorder(TorchDispatchMode):
    """The aten ops run while a graph captures: (op, args, kwargs, output)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNCS:
            raise RuntimeError(f"{CAPTURE_ERROR} ({func})")
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


def _tensors(out) -> list:
    """The tensors an op returned (one, several, or none: a size, a bool)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)] if isinstance(out, (tuple, list)) else []


class Stream:
    api: FakeCuda  # set on the per-instance subclass

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = self.api.device_now() if device is None else as_device(device)
        self.priority = priority
        self.api.log("Stream", self.device, self, priority=priority)

    def wait_stream(self, stream):
        self.api.log("Stream.wait_stream", self.device, self, stream=stream)

    def wait_event(self, event):
        self.api.log("Stream.wait_event", self.device, self, event=event)

    def synchronize(self):
        self.api.log("Stream.synchronize", self.device, self)


class Event:
    api: FakeCuda

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self.api.log("Event", self.api.device_now(), self, enable_timing=enable_timing)

    def record(self, stream=None):
        stream = stream or self.api._current(self.api.device_now())
        self.api.log("Event.record", stream.device, self, stream=stream)


class CUDAGraph:
    api: FakeCuda

    def __init__(self, keep_graph=False):
        self.recorder, self.handle = None, None
        self.api.log("CUDAGraph", self.api.device_now(), self)

    def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
        self.api.log("CUDAGraph.capture_begin", self.api.device_now(), self, pool=pool,
                     capture_error_mode=capture_error_mode)
        self.handle = pool if pool is not None else ("private pool", id(self))  # torch makes one for the graph
        self.recorder = Recorder()
        self.recorder.__enter__()
        self.api.local.capturing = True

    def capture_end(self):
        self.api.local.capturing = False
        self.recorder.__exit__(None, None, None)
        self.api.log("CUDAGraph.capture_end", self.api.device_now(), self)

    def replay(self):
        """Each recorded op again, its result written into the capture's output (its address); an output that is a
        view or an in-place result of a tensor written earlier already holds the new values."""
        self.api.log("CUDAGraph.replay", self.api.device_now(), self)
        with torch.inference_mode():  # the capture's tensors are written as plain memory, as a graph does
            for func, args, kwargs, out in self.recorder.ops:
                for old, new in zip(_tensors(out), _tensors(func(*args, **kwargs))):
                    if new.untyped_storage().data_ptr() != old.untyped_storage().data_ptr():
                        old.copy_(new)

    def pool(self):
        return self.handle


class Graph:
    """torch.cuda.graph: synchronise, make the capture stream current, capture into `cuda_graph`."""

    api: FakeCuda

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", enable_annotations=False,
                 check_input_liveness=False):
        if stream is None and self.api.default_capture_stream is None:  # torch makes it once, on the device current
            self.api.default_capture_stream = self.api.Stream()
        self.cuda_graph, self.pool, self.capture_error_mode = cuda_graph, pool, capture_error_mode
        self.capture_stream = stream or self.api.default_capture_stream
        self.api.log("graph", self.api.device_now(), cuda_graph, pool=pool, stream=stream,
                     capture_error_mode=capture_error_mode)

    def __enter__(self):
        self.api.synchronize()
        self.context = self.api.stream(self.capture_stream)
        self.context.__enter__()
        self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, *args):
        try:
            self.cuda_graph.capture_end()
        finally:
            self.context.__exit__(*args)


class Device:
    """torch.cuda.device: `device` current inside (None or -1: no change)."""

    api: FakeCuda

    def __init__(self, device):
        self.device = None if device is None or device == -1 else as_device(device)

    def __enter__(self):
        self.before = self.api.device_now()
        if self.device is not None:
            self.api.log("device", self.device)
            self.api.local.device = self.device

    def __exit__(self, type, value, traceback):
        self.api.local.device = self.before


class FakeCuda:
    """The fake API: `calls` is the log; the classes are bound to this instance (their calls land in its log)."""

    def __init__(self):
        self.calls, self.local, self.lock = [], threading.local(), threading.Lock()
        self.defaults, self.default_capture_stream, self.pools = {}, None, itertools.count()
        bind = lambda cls, name: type(name, (cls,), {"api": self})  # noqa: E731 - the class, logging here
        self.Stream, self.Event, self.CUDAGraph = (bind(cls, cls.__name__) for cls in (Stream, Event, CUDAGraph))
        self.graph, self.device = bind(Graph, "graph"), bind(Device, "device")

    def log(self, name, device, on=None, **kwargs):
        self.calls.append(Call(name, device, on, kwargs))

    def names(self) -> list:
        return [c.name for c in self.calls]

    def device_now(self) -> torch.device:
        """The current device of this thread (cuda:0 until `device(...)` says otherwise)."""
        return getattr(self.local, "device", torch.device("cuda", 0))

    def default_stream(self, device) -> Stream:
        """The device's default stream (made once, not logged)."""
        device = as_device(device)
        with self.lock:
            if device not in self.defaults:
                stream = object.__new__(self.Stream)
                stream.device, stream.priority = device, 0
                self.defaults[device] = stream
            return self.defaults[device]

    def _current(self, device) -> Stream:
        return getattr(self.local, "streams", {}).get(device) or self.default_stream(device)

    # --- torch.cuda's functions ----------------------------------------------------------------------------------

    def current_stream(self, device=None):
        device = self.device_now() if device is None else as_device(device)
        self.log("current_stream", device)
        return self._current(device)

    @contextlib.contextmanager
    def stream(self, stream):
        if stream is None:
            yield
            return
        self.log("stream", stream.device, stream)
        streams = self.local.__dict__.setdefault("streams", {})
        before = streams.get(stream.device)
        streams[stream.device] = stream
        try:
            with self.device(stream.device):
                yield
        finally:
            streams[stream.device] = before

    def graph_pool_handle(self):
        self.log("graph_pool_handle", self.device_now())
        return ("fake pool", next(self.pools))

    def is_current_stream_capturing(self):
        return getattr(self.local, "capturing", False)

    def synchronize(self, device=None):
        self.log("synchronize", self.device_now() if device is None else as_device(device))
