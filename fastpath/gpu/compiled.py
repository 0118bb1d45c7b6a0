"""`torch.compile` of the LLM backbone (patches `compiled_llm*`) and of the vocoder decode (`compiled_vocoder`).

Both replace a forward on the instance only (`llm.__dict__["forward"]`, `audio_tokenizer.__dict__["decode"]`) and
put back what was there on revert. Compilation is lazy: nothing is compiled until the first call on CUDA, and
calls on other devices go to the stock code, so applying on a CPU model changes nothing.

Shapes: sequence lengths differ per sentence. The LLM inputs are padded up to the same buckets as `cuda_graphs`
(padding.py) and compiled with dynamic shapes, so one compiled graph serves every length and the CUDA-graph modes
("reduce-overhead", "max-autotune") record one graph per bucket rather than per length (the public
omnivoice-fastpath measurements found reduce-overhead slower than default compile because it re-recorded per
length). The vocoder input ([1, 8, T] codes) is compiled with dynamic shapes unpadded: padding codes would
change the waveform's tail.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from fastpath import instance
from fastpath.gpu import synchronize
from fastpath.gpu.padding import hidden_output, llm_call_shape, padded
from fastpath.gpu.shapes import DEFAULT_BUCKETS, Buckets, graph_key

LLM_ATTR = "_fastpath_compiled_llm"
VOCODER_ATTR = "_fastpath_compiled_vocoder"
MODES = ("default", "reduce-overhead", "max-autotune")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # inductor records CUDA graphs in these modes


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r}; fastpath uses one of {list(MODES)}")
    return mode


@dataclass(eq=False, repr=False)
class CompiledForward:
    """Stands in for `llm.forward`: pads the call to its bucket and runs the compiled forward on CUDA."""

    llm: torch.nn.Module
    inner: Callable
    mode: str = "default"
    dynamic: bool | None = True
    buckets: Buckets | None = DEFAULT_BUCKETS  # None: no padding (every new length may recompile or re-record)
    devices: tuple = ("cuda",)
    compiler: Callable = torch.compile
    compiled: Callable | None = None
    first_calls: list = field(default_factory=list)  # (shape key, seconds incl. compile/record) per new shape
    seen: set = field(default_factory=set)
    passthrough: int = 0

    def __repr__(self) -> str:
        return f"CompiledForward(mode={self.mode!r}, dynamic={self.dynamic}, {len(self.seen)} shapes)"

    def __deepcopy__(self, memo):
        """A copy (of a deep-copied model) compiles its own forward: the compiled one calls the original's."""
        return CompiledForward(copy.deepcopy(self.llm, memo), copy.deepcopy(self.inner, memo), self.mode,
                               self.dynamic, self.buckets, self.devices, self.compiler)

    def __call__(self, *args, **kwargs):
        shape = llm_call_shape(args, kwargs)
        embeds = kwargs.get("inputs_embeds")
        if shape is None or embeds.device.type not in self.devices or torch.is_grad_enabled():
            self.passthrough += 1
            return self.inner(*args, **kwargs)
        rows, length, keys = shape
        mask = kwargs["attention_mask"]
        if self.buckets is not None:
            key = graph_key(rows, length, keys, embeds.dtype, embeds.device, self.llm.config._attn_implementation,
                            self.buckets)
            embeds, mask = padded(embeds, mask, key.length, key.keys)
        else:
            key = (rows, length, keys, str(embeds.dtype), str(embeds.device))
        if self.compiled is None:
            self.compiled = self.compiler(self.inner, mode=self.mode, dynamic=self.dynamic)
        first = key not in self.seen
        if first:
            synchronize(embeds.device)
            start = time.perf_counter()
        if self.mode in CUDAGRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's outputs were copied out already
        hidden = self.compiled(inputs_embeds=embeds, attention_mask=mask, position_ids=None, return_dict=True,
                               use_cache=False)[0]
        out = hidden_output(hidden, length)  # a copy: CUDA-graph modes overwrite their outputs on the next call
        if first:
            synchronize(embeds.device)
            self.first_calls.append((key, time.perf_counter() - start))
            self.seen.add(key)
        return out

    def stats(self) -> dict:
        return {"mode": self.mode, "dynamic": self.dynamic, "shapes": len(self.seen), "passthrough": self.passthrough,
                "first_call_seconds": [round(s, 4) for _, s in self.first_calls]}


def compile_llm(model, mode: str = "default", dynamic: bool | None = True, buckets: Buckets | None = DEFAULT_BUCKETS,
                devices: tuple = ("cuda",), compiler: Callable = torch.compile) -> CompiledForward:
    """Compile `model.llm`'s forward on this instance. Idempotent.

    Args:
        model: a loaded OmniVoice.
        mode: torch.compile mode: "default", "reduce-overhead" (CUDA graphs) or "max-autotune" (autotuned
            kernels and CUDA graphs; long compile).
        dynamic: torch.compile's `dynamic` (True: one graph for all lengths; None: torch decides after a recompile).
        buckets: pad lengths to this ladder (None: no padding).
        devices: device types that use the compiled forward; others call the stock one.
        compiler: `torch.compile`, or a test double with its signature.
    """
    check_mode(mode)
    llm = model.llm
    return instance.install_wrapper(model, LLM_ATTR, llm, "forward", lambda: CompiledForward(
        llm, llm.forward, mode, dynamic, buckets, tuple(devices), compiler))


def uncompile_llm(model) -> None:
    wrapper = instance.remove_wrapper(model, LLM_ATTR, "forward", lambda wrapper: model.llm)
    if wrapper is not None:
        wrapper.compiled = None


@dataclass(eq=False, repr=False)
class CompiledDecode:
    """Stands in for `audio_tokenizer.decode(audio_codes [B, C, T], return_dict=None)`: compiled on CUDA."""

    tokenizer: torch.nn.Module
    inner: Callable
    mode: str = "default"
    dynamic: bool | None = True
    devices: tuple = ("cuda",)
    compiler: Callable = torch.compile
    compiled: Callable | None = None
    first_calls: list = field(default_factory=list)
    seen: set = field(default_factory=set)
    passthrough: int = 0

    def __repr__(self) -> str:
        return f"CompiledDecode(mode={self.mode!r}, {len(self.seen)} shapes)"

    def __deepcopy__(self, memo):
        """A copy (of a deep-copied model) compiles its own decode: the compiled one calls the original's."""
        return CompiledDecode(copy.deepcopy(self.tokenizer, memo), copy.deepcopy(self.inner, memo), self.mode,
                              self.dynamic, self.devices, self.compiler)

    def __call__(self, audio_codes, *args, **kwargs):
        if not isinstance(audio_codes, torch.Tensor) or audio_codes.device.type not in self.devices \
                or torch.is_grad_enabled():
            self.passthrough += 1
            return self.inner(audio_codes, *args, **kwargs)
        if self.compiled is None:
            self.compiled = self.compiler(self.inner, mode=self.mode, dynamic=self.dynamic)
        key = tuple(audio_codes.shape)
        first = key not in self.seen
        if first:
            synchronize(audio_codes.device)
            start = time.perf_counter()
        if self.mode in CUDAGRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.compiled(audio_codes, *args, **kwargs)
        if first:
            synchronize(audio_codes.device)
            self.first_calls.append((key, time.perf_counter() - start))
            self.seen.add(key)
        return out

    def stats(self) -> dict:
        return {"mode": self.mode, "shapes": len(self.seen), "passthrough": self.passthrough,
                "first_call_seconds": [round(s, 4) for _, s in self.first_calls]}


def compile_vocoder(model, mode: str = "default", dynamic: bool | None = True, devices: tuple = ("cuda",),
                    compiler: Callable = torch.compile) -> CompiledDecode:
    """Compile `model.audio_tokenizer.decode` on this instance (the waveform decoder, float32). Idempotent.

    Args:
        model: a loaded OmniVoice (with its audio tokenizer).
        mode: torch.compile mode (default "default", as the public write-up that measured it used).
        dynamic: torch.compile's `dynamic`; True: one graph for every number of frames.
        devices: device types that use the compiled decode; others call the stock one.
        compiler: `torch.compile`, or a test double with its signature.
    """
    check_mode(mode)
    if VOCODER_ATTR in model.__dict__:
        return model.__dict__[VOCODER_ATTR]
    tokenizer = model.audio_tokenizer
    if tokenizer is None:
        raise ValueError("this model has no audio tokenizer (loaded with train=True?); nothing to compile")
    return instance.install_wrapper(model, VOCODER_ATTR, tokenizer, "decode", lambda: CompiledDecode(
        tokenizer, tokenizer.decode, mode, dynamic, tuple(devices), compiler))


def uncompile_vocoder(model) -> None:
    wrapper = instance.remove_wrapper(model, VOCODER_ATTR, "decode", lambda wrapper: wrapper.tokenizer)
    if wrapper is not None:
        wrapper.compiled = None


def stats(model) -> dict:
    """First-call (compile / record) times and counters of the applied compile patches."""
    out = {}
    for attr, name in ((LLM_ATTR, "llm"), (VOCODER_ATTR, "vocoder")):
        if attr in model.__dict__:
            out[name] = model.__dict__[attr].stats()
    return out
