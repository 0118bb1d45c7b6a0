"""The main command's report (`fastpath-suite report`), on the tiny checkpoint with one point per section."""

from __future__ import annotations

import json

import pytest

from harness import report
from harness.speed.measure import stack_packs


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.cpu
def test_report_shows_stock_the_public_packages_and_the_stack(model, tmp_path, monkeypatch):
    from harness.run.installed import missing
    from harness.speed import bench

    absent = [bench.PEERS[n].requirement for n, installed in report.peers_installed().items() if not installed]
    if absent:
        missing(f"{', '.join(absent)} not installed: {bench.PEERS_INSTALL}")
    monkeypatch.setattr(report, "REPORT_POINTS", ("auto_voice",))
    monkeypatch.setattr(report, "TIMING_POINTS", ("auto-short-10",))
    out = report.run_report(None, "tiny", tmp_path, rounds=1, command="test", timing_size="tiny")
    assert out["ok"], [r for r in out["parity"] if not r["bit_exact"]]
    variants = set(out["timing"]["results"]["auto-short-10"])
    assert variants == {"stock@fp32", "peer@fp32", "tts-inference@fp32", "lossless@fp32"}, variants
    flops = out["timing"]["flops"]["auto-short-10"]
    if stack_packs(model, "auto-short-10"):  # else the stack runs stock's layout (loop.INEXACT_ROWS): equal FLOPs
        assert flops["lossless@fp32"] < flops["stock@fp32"], flops
    else:
        assert flops["lossless@fp32"] == flops["stock@fp32"], flops
    text = (tmp_path / "report.md").read_text()
    assert "lossless@fp32 efficiency" in text and "Verdict: **PASS**" in text
    assert "the timing is unjudged: 1 round(s) are too few" in text, text  # rounds=1: the rule cannot judge it
    assert json.loads((tmp_path / "report.json").read_text())["timing"]["peers_missing"] == []


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.cpu
def test_report_without_the_public_packages_says_how_to_install_them(tmp_path, monkeypatch):
    from harness.speed import bench

    monkeypatch.setattr(report, "REPORT_POINTS", ())
    monkeypatch.setattr(report, "TIMING_POINTS", ("auto-short-10",))
    monkeypatch.setattr(report, "peers_installed", lambda: dict.fromkeys(bench.PEERS, False))
    out = report.run_report(None, "tiny", tmp_path, rounds=1, command="test", timing_size="tiny")
    assert set(out["timing"]["results"]["auto-short-10"]) == {"stock@fp32", "lossless@fp32"}
    text = (tmp_path / "report.md").read_text()
    assert "pip install -e '.[peers]'" in text
    assert "Not installed, so not in the table: omnivoice-fastpath==0.1.0, omnivoice-tts-inference==0.1.0" in text


def report_of(timing: dict) -> dict:
    """A report with `timing` and nothing in the other sections (render_report's input)."""
    return {"command": "test", "checkpoint": "tiny-x (tiny)", "ok": True, "patches": [], "parity": [],
            "environment": {"machine": "test", "torch": "-", "transformers": "-", "omnivoice": "-"},
            "work": {"point": "auto-short-10", "stock": {}, "fastpath": {}}, "timing": timing}


@pytest.mark.parametrize("rounds, says", [
    pytest.param(1, "unjudged", id="1 round"),
    pytest.param(2, "unjudged", id="2 rounds"),
    pytest.param(3, "stable", id="3 rounds: judged"),
])
def test_a_timing_with_too_few_rounds_is_unjudged_not_unstable(monkeypatch, rounds, says):
    """`report --rounds 1` (or 2): the stability rule cannot judge so few rounds, so the verdict and the table say
    "unjudged" and how many rounds it needs, never "unstable" (which means rounds that disagree). Synthetic quiet
    rounds (every ratio 2.0), no model: the wording alone."""
    from types import SimpleNamespace

    from harness.speed import bench, stability
    from harness.speed.measure import Samples

    def quiet_rounds(variants, names, n, *args, **kwargs):
        return {p: {v: Samples(v, (), rtf=[2.0 if v.startswith("stock") else 1.0] * n, load=[0.5] * n,
                               first_call_seconds=1.0) for v in variants} for p in names}

    monkeypatch.setattr(bench, "build_variants", lambda ckpt, specs, device: {s.name: None for s in specs})
    monkeypatch.setattr(bench, "run_variant_bench", quiet_rounds)
    monkeypatch.setattr(bench, "flop_bounds", lambda variants, names, *a: {p: {v: 10 for v in variants} for p in names})
    monkeypatch.setattr(report, "TIMING_POINTS", ("auto-short-10",))
    text = report.render_report(report_of(report.measure_timing(SimpleNamespace(identity="tiny-x", kind="tiny"),
                                                                rounds)))
    [verdict] = [line for line in text.splitlines() if line.startswith("Verdict:")]
    [row] = [line for line in text.splitlines() if line.startswith("| auto-short-10 |")]
    if says == "unjudged":
        assert "unstable" not in verdict and "unjudged" in verdict, verdict
        assert f"at least {stability.MIN_ROUNDS} rounds" in verdict and f"--rounds {stability.MIN_ROUNDS}" in verdict
        assert "unstable" not in row and "unjudged" in row and "2.00x" not in row, row
    else:
        assert "the timing is stable" in verdict and "2.00x" in row, (verdict, row)
