"""Process-global flags (fastpath/gpu/flags.py): set, then restored exactly; someone else's changes left alone."""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath.gpu import flags

# --- process-global flags --------------------------------------------------------------------------------------------


STARTING_STATES = [
    pytest.param(lambda: None, id="torch-defaults"),
    pytest.param(lambda: setattr(torch.backends.cudnn, "benchmark", True), id="cudnn-benchmark-on"),
    pytest.param(lambda: setattr(torch.backends.cudnn, "allow_tf32", False), id="cudnn-tf32-off"),
    pytest.param(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), id="matmul-tf32-already-on"),
    pytest.param(lambda: torch.set_float32_matmul_precision("high"), id="precision-high"),
]


@pytest.fixture
def on_cuda(monkeypatch):
    """Make the flags patch see a CUDA model (the settings themselves exist on every build of torch)."""
    monkeypatch.setattr(flags, "model_device_type", lambda model: "cuda")


@pytest.mark.parametrize("start", STARTING_STATES)
def test_flags_are_set_then_restored_exactly(model, on_cuda, start, torch_settings):
    start()
    before = flags.read()
    fastpath.apply(model, "cuda_tf32")
    try:
        now = flags.read()
        assert {k: now[k] for k in flags.SETTINGS} == flags.SETTINGS
        assert now["float32_matmul_precision"] == "high", "TF32 for CUDA matmuls is what 'high' means"
        fastpath.apply(model, "cuda_tf32")  # idempotent: the record of the first apply stays
        assert model.__dict__[flags.FLAGS_ATTR]["changed"] == {
            k: (before[k], v) for k, v in flags.SETTINGS.items() if before[k] != v}
    finally:
        fastpath.revert(model, "cuda_tf32")
    assert flags.read() == before and flags.FLAGS_ATTR not in model.__dict__


def test_flags_changed_by_someone_else_are_left_alone(model, on_cuda, caplog, torch_settings):
    torch.backends.cudnn.benchmark = True
    fastpath.apply(model, "cuda_tf32")  # turns benchmark off and TF32 matmuls on
    assert torch.backends.cudnn.benchmark is False
    torch.backends.cudnn.benchmark = True  # the user's choice, made while the patch is applied
    with caplog.at_level("WARNING", logger="fastpath.gpu.flags"):
        fastpath.revert(model, "cuda_tf32")
    assert torch.backends.cudnn.benchmark is True and "cudnn_benchmark" in caplog.text
    assert torch.backends.cuda.matmul.allow_tf32 is False, "the patch's own change was not undone"


def test_flags_do_nothing_for_a_cpu_model(model):
    before = flags.read()
    with fastpath.patched(model, "cuda_tf32"):
        assert flags.read() == before
        assert model.__dict__[flags.FLAGS_ATTR] == {"device": "cpu", "changed": {}}
