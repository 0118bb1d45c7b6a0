"""Device-aware defaults (fastpath/device_defaults.py): a default and a reason for every patch on every device."""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath import device_defaults
from fastpath.registry import LLM_FORWARD_PATCHES

# --- device-aware defaults -------------------------------------------------------------------------------------------


def test_every_patch_has_a_default_and_a_reason_on_every_device():
    assert set(device_defaults.TABLE) == set(fastpath.PATCHES), "patches without a default row (or stale rows)"
    for name, row in device_defaults.TABLE.items():
        assert set(row) == set(device_defaults.DEVICES), name
        for device, cell in row.items():
            assert cell.reason.strip(), f"{name} on {device} has no reason"
            if cell.on:
                assert device in fastpath.PATCHES[name].devices, f"{name} on by default on {device}, not meant for it"


def test_defaults_per_device():
    assert fastpath.defaults("cpu") == list(fastpath.LOSSLESS), "on CPU the default is the bit-exact stack"
    cuda = fastpath.defaults("cuda")
    assert "trimmed_cfg" not in cuda and "0.64x" in device_defaults.TABLE["trimmed_cfg"]["cuda"].reason
    assert {"cuda_graphs", "cuda_tf32", "sliced_heads"} <= set(cuda)
    assert len([n for n in cuda if n in LLM_FORWARD_PATCHES]) <= 1, "two patches replacing the LLM forward"
    assert fastpath.defaults("cuda:1") == fastpath.defaults(torch.device("cuda", 0)) == cuda
    assert fastpath.defaults("mps") == list(fastpath.LOSSLESS)
    assert fastpath.FULL_PRESET == {"num_step": 12}
    with pytest.raises(device_defaults.UnknownDeviceError, match="known"):
        fastpath.defaults("xpu")


def test_defaults_read_a_models_device(model):
    assert fastpath.defaults(model) == fastpath.defaults("cpu")
    names, on, reasons = zip(*device_defaults.explain(model))
    assert list(names) == list(fastpath.PATCHES) and all(reasons)
