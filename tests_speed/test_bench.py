"""The bench CLI's variants and the interleaved runner (harness/speed/bench.py, measure.py)."""

from __future__ import annotations

import argparse
import json

import pytest

import fastpath
from harness.speed import bench
from harness.speed.measure import Variant, interleaved_variants, stack_packs

# --- bench variants and the interleaved runner -----------------------------------------------------------------------


def test_bench_variant_names_and_dtypes():
    gpu = bench.parse_variant("gpu@bf16", "cuda", "fp32")
    assert (gpu.name, gpu.dtype, list(gpu.patches)) == ("gpu@bf16", "bf16", fastpath.defaults("cuda"))
    preset = bench.parse_variant("preset", "cuda", "bf16")
    assert preset.name == "preset@bf16" and preset.overrides == fastpath.FULL_PRESET and preset.patches == gpu.patches
    compiled_variant = bench.parse_variant("gpu-reduce-overhead", "cuda", "bf16")
    assert "cuda_graphs" not in compiled_variant.patches and "compiled_llm_reduce_overhead" in compiled_variant.patches
    assert bench.parse_variant("stock@fp32", "cuda", "bf16").patches == ()
    for bad in ("turbo", "gpu@int8"):
        with pytest.raises(argparse.ArgumentTypeError, match="known"):
            bench.parse_variant(bad, "cuda", "bf16")


@pytest.mark.cpu
def test_bench_variants_write_a_loadable_baseline(tmp_path, capsys):
    from harness.speed.baselines import load_baseline

    out, path = tmp_path / "bench.json", tmp_path / "baseline.json"
    assert bench.main(["--size", "tiny", "--points", "auto-short-10", "--rounds", "1", "--variants", "stock",
                       "stock-preset@fp32", "--out", str(out), "--save-baseline", str(path)]) == 0
    data = json.loads(path.read_text())
    baseline = load_baseline(path, data["device_key"], "test")
    assert sorted(baseline["points"]) == ["auto-short-10/stock-preset@fp32", "auto-short-10/stock@fp32"]
    assert baseline["points"]["auto-short-10/stock-preset@fp32"]["extra"]["overrides"] == fastpath.FULL_PRESET
    assert "first call s" in capsys.readouterr().out
    assert json.loads(out.read_text())["variants"]["stock@fp32"]["patches"] == []


@pytest.mark.cpu
def test_interleaved_variants_keep_patches_for_the_run_and_revert(model):
    variants = {"a": Variant(model, ("sliced_heads",)), "b": Variant(model, ("sliced_heads",), {"num_step": 2})}
    out = interleaved_variants(variants, dict(text="Hi there.", language="en", num_step=4), rounds=2)
    assert fastpath.applied(model) == []
    assert [len(s.rtf) for s in out.values()] == [2, 2] and all(s.first_call_seconds for s in out.values())
    with pytest.raises(ValueError, match="own model instance"):
        interleaved_variants({"a": Variant(model, ()), "b": Variant(model, ("sliced_heads",))}, {}, rounds=1)


@pytest.mark.cpu
def test_bench_compares_with_the_public_package_and_prints_the_flop_bound(model, tmp_path, capsys):
    """stock, the public omnivoice-fastpath 0.1.0 and this project in one interleaved run, with FLOPs counted per
    variant (CPU attention included): the lossless stack does less arithmetic than stock, and the table says so
    (where GEMM rows depend on the row count the stack runs stock's layout: the same arithmetic as stock)."""
    out = tmp_path / "bench.json"
    assert bench.main(["--size", "tiny", "--points", "clone3-short-32", "--num-step", "2", "--rounds", "1",
                       "--variants", "stock", "peer", "lossless", "--bound", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lossless@fp32 bound" in printed and "peer@fp32 efficiency" in printed
    flops = json.loads(out.read_text())["flops"]["clone3-short-32"]
    if stack_packs(model, "clone3-short-32"):
        assert flops["lossless@fp32"] < flops["peer@fp32"] < flops["stock@fp32"], flops
    else:  # loop.INEXACT_ROWS: no packed row count with stock's bits on this machine
        assert flops["lossless@fp32"] == flops["stock@fp32"] > flops["peer@fp32"], flops


def test_a_missing_peer_package_names_the_install(monkeypatch):
    from dataclasses import replace

    monkeypatch.setitem(bench.PEERS, "peer", replace(bench.PEERS["peer"], module="omnivoice_fastpath_not_installed"))
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[peers\]'"):
        bench.peer_apply("peer")
