"""Memory per generate: peak, and growth over repeated calls (users report VRAM growing call after call)."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

import fastpath
from harness.points import point
from harness.speed.measure import cuda_memory_over_calls

CALLS = 10
# Bound on resident-set growth from call 2 to call 10 on the tiny model. The allocator keeps freed pages, so
# RSS wanders by a few MiB; a leak of one sequence's activations per call (the failure this catches) grows
# by tens of MiB over 8 calls.
RSS_GROWTH_BOUND_MB = 24.0
CUDA_GROWTH_BOUND_MB = 1.0  # allocated (not reserved) bytes must return to the same level after every call


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.cpu
@pytest.mark.slow  # 18 s of a fresh clone's default run, beyond its budget: every night on the CPU speed runner
@pytest.mark.parametrize("patches", [(), tuple(fastpath.LOSSLESS)], ids=["stock", "fastpath"])
def test_rss_does_not_grow_over_repeated_calls(model, patches):
    kwargs = point("clone6-medium-16").generate_kwargs(model)
    readings = []
    with fastpath.patched(model, list(patches)):
        for _ in range(CALLS):
            model.generate(**kwargs)
            gc.collect()
            readings.append(rss_mb())
    growth = readings[-1] - readings[1]  # call 1 warms caches and the allocator
    print(f"{'+'.join(patches) or 'stock'}: RSS after each call (MiB) {[round(r) for r in readings]}, growth {growth:.1f}")
    assert growth < RSS_GROWTH_BOUND_MB, f"RSS grew {growth:.1f} MiB over {CALLS - 2} calls: {readings}"


@pytest.mark.cuda
@pytest.mark.parametrize("patches", [(), tuple(fastpath.LOSSLESS)], ids=["stock", "fastpath"])
def test_cuda_memory_is_flat_over_repeated_calls(checkpoint, patches):
    from harness.checkpoint import load_model

    model = load_model(checkpoint, device="cuda", dtype=torch.bfloat16)
    kwargs = point("clone6-medium-16").generate_kwargs(model)
    with fastpath.patched(model, list(patches)):
        allocated, peaks = cuda_memory_over_calls(model, kwargs, CALLS)
    growth = allocated[-1] - allocated[1]
    print(f"peak per generate {max(peaks):.0f} MiB; allocated after calls {[round(a, 1) for a in allocated]}")
    assert growth < CUDA_GROWTH_BOUND_MB, f"CUDA memory grew {growth:.2f} MiB over {CALLS - 2} calls"
