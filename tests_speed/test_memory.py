"""Memory per generate: peak, and growth over repeated calls (users report VRAM growing call after call)."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

import fastpath
from harness.model.points import point
from harness.speed.measure import cuda_memory_over_calls

CALLS = 10
# Bound on resident-set growth from call 2 to call 10 on the tiny model. The allocator keeps freed pages, so
# RSS wanders by a few MiB; a leak of one sequence's activations per call (the failure this catches) grows
# by tens of MiB over 8 calls.
RSS_GROWTH_BOUND_MB = 24.0
CUDA_GROWTH_BOUND_MB = 1.0  # allocated bytes must return to the same level after every call
# reserved: the caching allocator may keep a new block for a new shape, but not one per call (as `fastpath-suite
# memory`'s FLAT_MIB["reserved"], harness/speed/service.py)
CUDA_RESERVED_GROWTH_BOUND_MB = 64.0


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
    from harness.model.checkpoint import load_model

    model = load_model(checkpoint, device="cuda", dtype=torch.bfloat16)
    kwargs = point("clone6-medium-16").generate_kwargs(model)
    with fastpath.patched(model, list(patches)):
        mib = cuda_memory_over_calls(model, kwargs, CALLS)
    growth = {k: mib[k][-1] - mib[k][1] for k in ("allocated", "reserved")}
    print(f"peak per generate {max(mib['peak_allocated']):.0f} MiB allocated, {max(mib['peak_reserved']):.0f} MiB "
          f"reserved; after each call {[round(a, 1) for a in mib['allocated']]} allocated")
    assert growth["allocated"] < CUDA_GROWTH_BOUND_MB, f"CUDA memory grew {growth} MiB over {CALLS - 2} calls"
    assert growth["reserved"] < CUDA_RESERVED_GROWTH_BOUND_MB, f"reserved memory grew {growth} MiB"


@pytest.mark.cpu
def test_cuda_memory_over_calls_reads_every_series_after_each_call(model, monkeypatch):
    """The CUDA branch of the memory reading, run on the CPU model with torch.cuda's memory counters faked: each
    call resets the peaks on the model's device, then reads allocated, reserved and both peaks after it."""
    calls = []
    counter = iter(range(1000))
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda device, name=name: calls.append((name, device)) or
                            next(counter) * 2**20)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    kwargs = dict(text="Hi.", language="en", num_step=2, postprocess_output=False)
    mib = cuda_memory_over_calls(model, kwargs, 2)
    assert mib == {"allocated": [0.0, 4.0], "peak_allocated": [1.0, 5.0], "reserved": [2.0, 6.0],
                   "peak_reserved": [3.0, 7.0]}, mib
    assert [n for n, _ in calls] == ["reset", "memory_allocated", "max_memory_allocated", "memory_reserved",
                                     "max_memory_reserved"] * 2 and {d for _, d in calls} == {torch.device("cpu")}


# --- memory over long service (harness.speed.service, `fastpath-suite memory`) -----------------------------------


def test_the_verdict_judges_growth_after_the_warm_up_only():
    from harness.speed import service

    flat = {"allocated": [10.0, 50.0, 60.0, 60.0, 60.5], "reserved": [100.0, 300.0, 300.0, 300.0, 330.0]}
    judged = service.verdict(flat, warmup=2)  # 50 -> 60.5 allocated: more than 1 MiB
    assert judged["allocated"] == {"growth_mib": 10.5, "flat": False, "bound_mib": service.FLAT_MIB["allocated"]}
    assert judged["reserved"]["flat"] and judged["reserved"]["growth_mib"] == 30.0
    assert service.verdict(flat, warmup=3)["allocated"]["flat"]  # 60 -> 60.5 after a longer warm-up
    with pytest.raises(ValueError, match="more --calls"):
        service.verdict(flat, warmup=5)


@pytest.mark.cpu
def test_the_memory_command_records_every_call_and_says_the_verdict(tmp_path, capsys):
    """On the CPU the resident set after every call; the exit status is the verdict (0 flat, 1 grows)."""
    import json

    from harness.speed import service

    rc = service.main(["--out", str(tmp_path), "--size", "tiny", "--calls", "4", "--warmup", "2", "--num-step", "2",
                       "--apply", "none", "--quiet"])
    data = json.loads((tmp_path / "memory.json").read_text())
    assert len(data["series"]["rss"]) == data["calls"] == 4 and data["patches"] == []
    assert rc == (0 if data["verdict"]["rss"]["flat"] else 1), data["verdict"]
    assert "rss:" in capsys.readouterr().out


def test_the_gpu_results_show_the_memory_series(tmp_path):
    from harness import gpu_check

    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.json").write_text(
        '{"command": "fastpath-suite memory", "calls": 3, "warmup": 1, "num_step": 16, "patches": [], '
        '"series": {"allocated": [5.0, 5.0, 9.0]}, "verdict": {"allocated": {"growth_mib": 4.0, "flat": false, '
        '"bound_mib": 1.0}}}')
    (tmp_path / "steps.jsonl").write_text('{"step": "memory", "exit": 1, "limit_s": 240, "seconds": 9, "call": "x"}\n')
    figures, _ = gpu_check.gather([tmp_path])
    text = gpu_check.render_results(figures)
    assert "| allocated | 5.0 | 9.0 | +4.0 | 1.0 | grows |" in text and "without leaving" not in text, text
