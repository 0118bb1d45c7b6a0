"""The main command's report (`fastpath-suite report`), on the tiny checkpoint with one point per section."""

from __future__ import annotations

import json

import pytest

from harness import report
from harness.speed.measure import stack_packs


@pytest.mark.cpu
def test_report_shows_stock_the_public_package_and_the_stack(model, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "REPORT_POINTS", ("auto_voice",))
    monkeypatch.setattr(report, "TIMING_POINTS", ("auto-short-10",))
    out = report.run_report(None, "tiny", tmp_path, rounds=1, command="test", timing_size="tiny")
    assert out["ok"], [r for r in out["parity"] if not r["bit_exact"]]
    variants = set(out["timing"]["results"]["auto-short-10"])
    assert variants == {"stock@fp32", "peer@fp32", "lossless@fp32"}, variants
    flops = out["timing"]["flops"]["auto-short-10"]
    if stack_packs(model, "auto-short-10"):  # else the stack runs stock's layout (loop.INEXACT_ROWS): equal FLOPs
        assert flops["lossless@fp32"] < flops["stock@fp32"], flops
    else:
        assert flops["lossless@fp32"] == flops["stock@fp32"], flops
    text = (tmp_path / "report.md").read_text()
    assert "lossless@fp32 efficiency" in text and "Verdict: **PASS**" in text
    assert json.loads((tmp_path / "report.json").read_text())["timing"]["peer_installed"] is True


@pytest.mark.cpu
def test_report_without_the_public_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "REPORT_POINTS", ())
    monkeypatch.setattr(report, "TIMING_POINTS", ("auto-short-10",))
    monkeypatch.setattr(report, "peer_installed", lambda: False)
    out = report.run_report(None, "tiny", tmp_path, rounds=1, command="test", timing_size="tiny")
    assert set(out["timing"]["results"]["auto-short-10"]) == {"stock@fp32", "lossless@fp32"}
    assert "pip install -e '.[peers]'" in (tmp_path / "report.md").read_text()
