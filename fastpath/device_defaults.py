"""Which patches are on by default on each device, and why: a table with a reason in every cell.

    fastpath.apply(model, fastpath.defaults(model))     # or defaults("cuda"), defaults(torch.device("mps"))

A patch that loses on a device is off there. `trimmed_cfg` is off on CUDA: run as separate, smaller batches
(omnivoice-fastpath's layout) it won where arithmetic is the bottleneck (CPU 1.42x, MPS 1.18x) and lost where
kernel launches are (0.64x on a T4 in fp16), all measured by omnivoice-fastpath (reference 001). fastpath now
packs the rows into one forward per step; until that is measured on a GPU it stays off there. Every number in a reason names its source; rows marked "not yet measured here" are to be
replaced by the GPU tier's own measurements (`scripts/gpu_check.sh`).

`FULL_PRESET` is what the speed targets call the full preset: the device's defaults plus 12 unmasking steps
instead of 32 (12 was indistinguishable from 32 by faster-whisper large-v3 WER over 48 paired sentences; 8 was
not: +3.07 WER points, p = 0.009; reference 001). It changes the output, so it is never a default: pass
`**fastpath.FULL_PRESET` to `generate` yourself.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class Default:
    on: bool
    reason: str


ON, OFF = True, False
_CUDA_ONLY = "a CUDA patch: inert on this device (every call goes to the stock code)"

TABLE = {
    "trimmed_cfg": {
        "cpu": Default(ON, "bit-exact; 1.42x on CPU fp32 (reference 001)"),
        "cuda": Default(OFF, "0.64x on a T4 in fp16 (reference 001) when it ran two forwards per step; it now packs "
                             "the rows into one, which is not measured on CUDA yet, and the CUDA graph paths "
                             "replay stock-shaped calls only"),
        "mps": Default(ON, "bit-exact on CPU; 1.18x on MPS fp16 (reference 001)"),
    },
    "sliced_heads": {
        "cpu": Default(ON, "bit-exact; the 1024 x 8200 head GEMM runs on the target rows only"),
        "cuda": Default(ON, "removes most of the head GEMM's FLOPs and its logits buffer; one slice per row "
                            "(not yet measured here on CUDA)"),
        "mps": Default(ON, "bit-exact on CPU; fewer FLOPs on any device"),
    },
    "static_prefix": {
        "cpu": Default(ON, "bit-exact; the prefix embedding is computed once per generation"),
        "cuda": Default(ON, "fewer embedding lookups per step, allocations reused (not yet measured here on CUDA)"),
        "mps": Default(ON, "bit-exact on CPU; fewer lookups on any device"),
    },
    "batched_scoring": {
        "cpu": Default(ON, "bit-exact; a batch is scored in one pass instead of one small pass per item"),
        "cuda": Default(ON, "about 20 kernel launches per step plus one random draw per item, instead of "
                            "about 20 per item; the same random numbers as stock (not yet measured here on CUDA)"),
        "mps": Default(ON, "bit-exact on CPU; fewer, larger kernels on any device"),
    },
    "batch_invariant": {
        "cpu": Default(OFF, "opt in: not bit-exact against a stock batch call (it matches batch-1 calls instead); "
                            "measured by fastpath-suite bench with --variants lossless batch-invariant"),
        "cuda": Default(OFF, "opt in: one forward per distinct row length, which a launch-bound GPU pays for "
                             "(not yet measured here on CUDA)"),
        "mps": Default(OFF, "opt in, as on CPU"),
    },
    "prefix_kv_cache": {
        "cpu": Default(OFF, "lossy: changes the output; a candidate for the quality gate, never a default"),
        "cuda": Default(OFF, "lossy: changes the output; a candidate for the quality gate, never a default"),
        "mps": Default(OFF, "lossy: changes the output; a candidate for the quality gate, never a default"),
    },
    "prompt_cache": {
        "cpu": Default(ON, "bit-exact; a reused reference is encoded once"),
        "cuda": Default(ON, "a reused reference is encoded once (encoding costs 1-2 s per call, reference 001)"),
        "mps": Default(ON, "a reused reference is encoded once"),
    },
    "cuda_graphs": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(ON, "one launch per LLM forward instead of ~600: batch-1 forwards are launch-bound; no "
                            "compile time, captures bounded by buckets and an LRU (the GPU stack against its target "
                            "of 3.5x stock eager: docs/gpu.md, 'Targets')"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "compiled_llm": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(OFF, "opt in: compile costs minutes at first request (137-218 s on CUDA, reference 001) "
                             "for 1.42x there; cuda_graphs removes the launch overhead without it"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "compiled_llm_reduce_overhead": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(OFF, "opt in: compile time as compiled_llm, and 8% slower than default compile with "
                             "2.8x its compile time when shapes vary (reference 001; bucketing here bounds the "
                             "re-records, not yet measured here)"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "compiled_llm_max_autotune": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(OFF, "opt in: autotuning takes longer than any request; for long-lived servers"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "compiled_vocoder": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(OFF, "opt in: 29 -> 14 ms per decode on an RTX 4090 (reference 003), a small share of a "
                             "request, against compile time at the first request (not yet measured here)"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "packed_cfg": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(OFF, "not measured on a GPU yet: on by default once the GPU bench measures it faster than "
                             "the stack without it (scripts/gpu_check.sh, stage packed)"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
    "cuda_tf32": {
        "cpu": Default(OFF, _CUDA_ONLY),
        "cuda": Default(ON, "fp32 matmuls and the fp32 vocoder's convolutions on tensor cores; cudnn.benchmark "
                            "kept off: it stalled 8.8 s per novel sentence length (reference 003)"),
        "mps": Default(OFF, _CUDA_ONLY),
    },
}

FULL_PRESET = {"num_step": 12}
FULL_PRESET_REASON = ("12 steps: no WER difference from 32 over 48 paired sentences (-0.87 points, 95% CI "
                      "[-2.20, +0.52]); 8 steps +3.07 points, p = 0.009 (reference 001)")


class UnknownDeviceError(ValueError):
    pass


def device_type(device) -> str:
    """'cpu' / 'cuda' / 'mps' from a string ('cuda:1'), a torch.device, or anything with a `.device` (a model)."""
    target = getattr(device, "device", device)
    kind = getattr(target, "type", None) or str(target).split(":")[0]
    if kind not in DEVICES:
        raise UnknownDeviceError(f"no default patch table for device {device!r} (type {kind!r}); "
                                 f"known: {list(DEVICES)}")
    return kind


def defaults(device) -> list:
    """The patches on by default on `device` (a device string, torch.device or a model), in registry order."""
    from fastpath.registry import PATCHES

    kind = device_type(device)
    return [name for name in PATCHES if TABLE[name][kind].on]


def explain(device) -> list:
    """(patch, on, reason) for every registered patch on `device`."""
    from fastpath.registry import PATCHES

    kind = device_type(device)
    return [(name, TABLE[name][kind].on, TABLE[name][kind].reason) for name in PATCHES]
