"""Fixtures of the gate's tests that build candidate environments (test_gate_candidates, test_gate_quality_set)."""

from __future__ import annotations

import pytest

from harness.gate import candidate as cand


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    return tmp_path_factory.mktemp("venvs")


@pytest.fixture
def prepare_here(monkeypatch, venvs):
    """The gate's venvs made under the test's folder, not the shared .cache/gate/."""
    real = cand.prepare
    monkeypatch.setattr(cand, "prepare", lambda spec, fresh=False: real(spec, root=venvs, fresh=fresh))
