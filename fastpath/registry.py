"""The registry of patches, and apply / revert on one loaded model instance (never the OmniVoice class).

Each patch records whether it is lossless (bit-exact on CPU fp32), the devices where it is meant to help, and
the upstream functions it relies on; the fingerprints of those functions are checked before it applies.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import types
import weakref
from dataclasses import dataclass
from typing import Callable

from fastpath import fingerprints, instance
from fastpath.instance import WARNINGS_ATTR


class NotOmniVoiceError(TypeError):
    pass


class UnknownPatchError(KeyError):
    def __str__(self):
        return str(self.args[0])


@dataclass(frozen=True)
class Patch:
    name: str
    lossless: bool
    devices: tuple  # where it is meant to help
    relies_on: tuple  # upstream names in omnivoice.models.omnivoice, fingerprinted
    summary: str
    apply: Callable
    revert: Callable
    conflicts: tuple = ()  # patches that replace the same function; refused together before anything is touched


APPLIED_ATTR = "_fastpath_applied"

# The loop reimplements _generate_iterative and calls these upstream pieces; a change to any is a change
# to what the loop must do.
LOOP_RELIES_ON = (
    "OmniVoice._generate_iterative",
    "OmniVoice._prepare_inference_inputs",
    "OmniVoice._predict_tokens_with_scoring",
    "OmniVoice.forward",
    "_get_time_steps",
    "_gumbel_sample",
)


def _lazy(target: str, **options) -> Callable:
    """`"module:function"` -> a function of the model that imports the module on first call (the package imports
    no torch) and calls `function(model, **options)`. The one form every apply and revert in the table uses."""
    module, function = target.split(":")

    def call(model):
        return getattr(importlib.import_module(module), function)(model, **options)

    call.__qualname__ = f"{target}({', '.join(f'{k}={v!r}' for k, v in options.items())})"
    return call


def _loop(feature: str) -> tuple:
    return _lazy("fastpath.loop:enable", feature=feature), _lazy("fastpath.loop:disable", feature=feature)


def _register(*patches: Patch) -> dict:
    return {p.name: p for p in patches}


PATCHES = _register(
    Patch(
        "trimmed_cfg", True, ("cpu", "mps"), LOOP_RELIES_ON,
        "Conditional and unconditional rows packed back to back into one forward per step, each at its own length, "
        "instead of one batch padded to the longest row.",
        *_loop("trimmed_cfg"),
    ),
    Patch(
        "sliced_heads", True, ("cpu", "cuda", "mps"), LOOP_RELIES_ON,
        "Audio heads run only on the target positions the sampler reads.",
        *_loop("sliced_heads"),
    ),
    Patch(
        "static_prefix", True, ("cpu", "cuda", "mps"), LOOP_RELIES_ON + ("OmniVoice._prepare_embed_inputs",),
        "The static prefix (style, text, reference) is embedded once per generation; each step re-embeds the target.",
        *_loop("static_prefix"),
    ),
    Patch(
        "batched_scoring", True, ("cpu", "cuda", "mps"), LOOP_RELIES_ON,
        "Scoring and unmasking run for all items of a batch at once (one call, one random draw, one top-k) instead "
        "of a Python loop over items.",
        *_loop("batched_scoring"),
    ),
    Patch(
        "batch_invariant", False, ("cpu", "mps"), LOOP_RELIES_ON,
        "Rows at their own lengths (as trimmed_cfg), each attending over its own item's length instead of the "
        "batch's longest: an item's output is bit-exact with a batch-1 call of it in deterministic settings "
        "(position_temperature=0, class_temperature=0), and a mixed-length batch does no work for its longest item.",
        *_loop("batch_invariant"),
    ),
    Patch(
        "prefix_kv_cache", False, ("cpu", "cuda", "mps"), LOOP_RELIES_ON + ("OmniVoice._prepare_embed_inputs",),
        "Lossy, opt in: the prefix's keys/values are computed at a refresh step (every 2 by default, "
        "fastpath.loop.set_prefix_refresh) and reused by the steps between, which run the target positions only.",
        *_loop("prefix_kv_cache"),
    ),
    Patch(
        "prompt_cache", True, ("cpu", "cuda", "mps"),
        ("OmniVoice.create_voice_clone_prompt", "OmniVoice._preprocess_all", "VoiceClonePrompt"),
        "Reference encodings are reused across calls, keyed by audio content, ref text and the preprocess flag.",
        _lazy("fastpath.prompt_cache:apply"), _lazy("fastpath.prompt_cache:revert"),
    ),
)
# --- GPU tier (issue 6) ------------------------------------------------------------------------------------------
# Not bit-exact (other kernels, shapes or precision): lossless=False, compared with stock under tolerances on CUDA
# (`pytest -m cuda`). On a model that is not on CUDA they apply and stay inert (every call goes to the stock code).
# What padding to a bucket relies on: forward calls self.llm(inputs_embeds=[B, L, H], attention_mask=[B, 1, L, L] bool,
# return_dict=True, position_ids=None), and _generate_iterative gives every query row at least one key.
GPU_LLM_RELIES_ON = ("OmniVoice.forward", "OmniVoice._generate_iterative")
DECODE_RELIES_ON = ("OmniVoice._decode_and_post_process",)  # calls audio_tokenizer.decode(codes [1, C, T])
COMPILED_LLM = ("compiled_llm", "compiled_llm_reduce_overhead", "compiled_llm_max_autotune")
LLM_FORWARD_PATCHES = ("cuda_graphs",) + COMPILED_LLM  # each replaces model.llm.forward: one at a time
PROCESS_GLOBAL = ("cuda_tf32",)  # change settings of the whole process, not only of the model they are applied to


def _others(name: str) -> tuple:
    return tuple(n for n in LLM_FORWARD_PATCHES if n != name)


PATCHES.update(_register(
    Patch(
        "cuda_graphs", False, ("cuda",), GPU_LLM_RELIES_ON,
        "The LLM forward is captured as a CUDA graph per bucketed shape (length padded to a multiple of 64, padded "
        "keys masked; at most 32 graphs, least recently used dropped) and replayed.",
        _lazy("fastpath.gpu.graphs:install"), _lazy("fastpath.gpu.graphs:remove"), conflicts=_others("cuda_graphs"),
    ),
    Patch(
        "compiled_llm", False, ("cuda",), GPU_LLM_RELIES_ON,
        "torch.compile of the LLM forward, mode 'default', dynamic shapes, lengths padded to multiples of 64.",
        _lazy("fastpath.gpu.compiled:compile_llm", mode="default"), _lazy("fastpath.gpu.compiled:uncompile_llm"),
        conflicts=_others("compiled_llm"),
    ),
    Patch(
        "compiled_llm_reduce_overhead", False, ("cuda",), GPU_LLM_RELIES_ON,
        "torch.compile of the LLM forward, mode 'reduce-overhead' (CUDA graphs recorded per 64-multiple bucket).",
        _lazy("fastpath.gpu.compiled:compile_llm", mode="reduce-overhead"), _lazy("fastpath.gpu.compiled:uncompile_llm"),
        conflicts=_others("compiled_llm_reduce_overhead"),
    ),
    Patch(
        "compiled_llm_max_autotune", False, ("cuda",), GPU_LLM_RELIES_ON,
        "torch.compile of the LLM forward, mode 'max-autotune' (autotuned kernels, CUDA graphs per bucket).",
        _lazy("fastpath.gpu.compiled:compile_llm", mode="max-autotune"), _lazy("fastpath.gpu.compiled:uncompile_llm"),
        conflicts=_others("compiled_llm_max_autotune"),
    ),
    Patch(
        "compiled_vocoder", False, ("cuda",), DECODE_RELIES_ON,
        "torch.compile of the audio tokenizer's decode (the float32 waveform decoder), dynamic number of frames.",
        _lazy("fastpath.gpu.compiled:compile_vocoder", mode="default"), _lazy("fastpath.gpu.compiled:uncompile_vocoder"),
    ),
    Patch(
        "packed_cfg", False, ("cuda",), LOOP_RELIES_ON,
        "Every row of a step (conditional and unconditional, every item of a batch) packed into one forward at its "
        "own length, each attending over its own keys (FlexAttention, document block mask); the packed length "
        "rounded up to 128.",
        *_loop("packed_cfg"),
    ),
    Patch(
        "cuda_tf32", False, ("cuda",), GPU_LLM_RELIES_ON[:1] + DECODE_RELIES_ON,
        "TF32 for float32 matmuls and cuDNN convolutions, cudnn.benchmark off (process-global; previous values "
        "restored on revert).",
        _lazy("fastpath.gpu.flags:apply"), _lazy("fastpath.gpu.flags:revert"),
    ),
))
# --- end of the GPU tier ----------------------------------------------------------------------------------------

LOSSLESS = tuple(name for name, p in PATCHES.items() if p.lossless)
# fastpath.stream runs the first two and reproduces the other two piece by piece, calling the functions of
# omnivoice.utils.audio they call (fastpath/streaming.py)
STREAM_RELIES_ON = (
    "OmniVoice._preprocess_all",
    "OmniVoice._generate_chunked",
    "OmniVoice._decode_and_post_process",
    "OmniVoice._post_process_audio",
)


def relied_on() -> list:
    """Every upstream name a patch or `fastpath.stream` relies on, sorted: what fingerprints and the version gate
    look at."""
    return sorted({n for p in PATCHES.values() for n in p.relies_on} | set(STREAM_RELIES_ON))


def _check_model(model) -> None:
    try:
        from omnivoice import OmniVoice
    except ImportError as err:  # pragma: no cover - omnivoice is a dependency
        raise NotOmniVoiceError(f"omnivoice is not installed ({err}); pip install omnivoice") from err
    if not isinstance(model, OmniVoice):
        raise NotOmniVoiceError(
            f"fastpath patches a loaded omnivoice.OmniVoice model, got {type(model).__module__}.{type(model).__name__}. "
            f"Load one with OmniVoice.from_pretrained(path) and pass it."
        )


def _names(names) -> list:
    if names is None:
        return list(LOSSLESS)
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise UnknownPatchError(f"unknown patch(es) {unknown}; registered: {sorted(PATCHES)}")
    return names


class ConflictingPatchesError(ValueError):
    pass


class StreamBusyError(RuntimeError):
    pass


# model (weakly) -> the worker's job of its open stream, until the worker has stopped; apply, revert and a deep copy
# of a patched model are refused meanwhile
_open_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _refuse_while_streaming(model, doing: str) -> None:
    if _open_streams.get(model) is not None:
        raise StreamBusyError(
            f"cannot {doing} while a stream of this model is open (its worker is generating with the patches it "
            f"started with): let it finish, or close() / cancel() it first")


def _deepcopy(model, memo):
    """`copy.deepcopy` of a patched model (installed on the instance by `apply`): a plain deep copy, then the
    copy's objects get what their originals remember of their stock state, so the copy carries the same patches
    and `revert(copy)` returns it to stock. Caches that hold device state start empty in the copy (CUDA graphs
    recapture, compiled code recompiles); the voice-prompt cache is copied."""
    _refuse_while_streaming(model, "copy the model")
    cls = type(model)
    twin = cls.__new__(cls)
    memo[id(model)] = twin
    twin.__setstate__(copy.deepcopy(model.__dict__, memo))
    instance.copy_saved(memo)
    return twin


def _refuse_conflicts(model, names) -> None:
    """Patches that replace the same function cannot be stacked; refused before the model is touched."""
    wanted = list(dict.fromkeys(list(model.__dict__.get(APPLIED_ATTR, [])) + list(names)))
    for i, a in enumerate(wanted):
        for b in wanted[i + 1:]:
            if b in PATCHES[a].conflicts or a in PATCHES[b].conflicts:
                raise ConflictingPatchesError(
                    f"patches {a!r} and {b!r} both replace the same function and cannot be applied together; "
                    f"revert one first (fastpath.revert(model, {a!r}))"
                )


def apply(model, names=None, *, allow_unverified: bool = False) -> list:
    """Apply patches (default: every lossless one) to this model instance. Idempotent.

    Args:
        model: a loaded `omnivoice.OmniVoice`.
        names: a patch name, a list of names, or None for `LOSSLESS`.
        allow_unverified: apply even when an upstream function's fingerprint is unknown (also via the env var
            FASTPATH_ALLOW_UNVERIFIED_UPSTREAM=1); the mismatch is then recorded in `model._fastpath_warnings`.
    Returns:
        The names of the patches now applied to the model.
    """
    _check_model(model)
    names = _names(names)
    _refuse_conflicts(model, names)
    _refuse_while_streaming(model, "apply patches")
    allow = allow_unverified or os.environ.get(fingerprints.ENV_ALLOW) == "1"
    for name in names:  # check all before touching the model: all or nothing
        warnings = fingerprints.check(PATCHES[name].relies_on, name, allow=allow)
        if warnings:
            model.__dict__.setdefault(WARNINGS_ATTR, []).extend(warnings)
    applied = model.__dict__.setdefault(APPLIED_ATTR, [])
    new = []
    try:
        for name in names:
            if name not in applied:
                PATCHES[name].apply(model)
                applied.append(name)
                new.append(name)
    except Exception:  # a patch refused this machine or model: undo this call's patches, then say why
        revert(model, new)
        raise
    if applied and not instance.installed(model, "__deepcopy__"):
        instance.install(model, "__deepcopy__", types.MethodType(_deepcopy, model))
    return list(applied)


def revert(model, names=None) -> list:
    """Revert patches (default: all applied); returns what is still applied."""
    _check_model(model)
    applied = model.__dict__.get(APPLIED_ATTR, [])
    if applied:
        _refuse_while_streaming(model, "revert patches")
    targets = list(applied) if names is None else _names(names)
    for name in targets:
        if name in applied:
            PATCHES[name].revert(model)
            applied.remove(name)
    if not applied:
        model.__dict__.pop(APPLIED_ATTR, None)
        model.__dict__.pop(WARNINGS_ATTR, None)
        instance.restore(model, "__deepcopy__")
    return list(applied)


def applied(model) -> list:
    return list(model.__dict__.get(APPLIED_ATTR, []))


@contextlib.contextmanager
def patched(model, names=None, **kwargs):
    """`with fastpath.patched(model): ...` applies, then reverts what it applied."""
    before = set(applied(model))
    now = apply(model, names, **kwargs)
    try:
        yield model
    finally:
        revert(model, [n for n in now if n not in before])
