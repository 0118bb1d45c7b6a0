"""The CUDA branches of what the GPU tier reads (the machine's GPU, the memory of a long service, the runner's first
check), run on the CPU with torch.cuda's readers faked: each branch executes here before it meets a GPU. What only a
GPU can give (the values themselves) is read by the cuda tests (docs/gpu.md, "What only a GPU runs")."""

from __future__ import annotations

import types

import pytest
import torch

from harness.model import devices
from harness.run import machine
from harness.speed import service


@pytest.fixture
def a_cuda_device(monkeypatch):
    """torch.cuda as a machine with two GPUs would answer (an H100 at index 1), every call recorded."""
    calls = []

    def answer(name, value):
        def fake(*args, **kwargs):
            calls.append((name, args))
            return value(*args) if callable(value) else value
        monkeypatch.setattr(torch.cuda, name, fake)

    answer("is_available", True)
    answer("device_count", 2)
    answer("get_device_capability", lambda index=None: (9, 0) if index == 1 else (8, 0))
    answer("get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3" if index == 1 else "NVIDIA A100")
    answer("get_device_properties", lambda index=None: types.SimpleNamespace(uuid=f"GPU-uuid-{index}"))
    monkeypatch.setattr(machine, "nvidia_driver_version", lambda: "580.1")
    return calls


def test_the_gpu_of_a_cuda_device_is_read_at_its_index(a_cuda_device):
    info = machine.gpu_info("cuda:1")
    assert info == {"cuda_available": True, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_driver": "580.1",
                    "cuda_version": torch.version.cuda, "compute_capability": "9.0", "gpu_uuid": "GPU-uuid-1"}
    assert machine.gpu_info("cuda")["gpu_name"] == "NVIDIA A100"  # no index: device 0
    assert machine.device_key(machine.machine_info("cuda:1")).startswith("cuda-nvidia-h100-80gb-hbm3__torch-")


def test_the_runners_first_check_prints_the_device_and_its_key(a_cuda_device, capsys):
    assert devices.main([]) == 0
    out = capsys.readouterr().out
    assert "device NVIDIA A100 | compute capability 8.0 | driver 580.1 | 2 visible" in out, out
    assert "device key cuda-nvidia-a100__torch-" in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a usable GPU passes this check")
def test_the_runners_first_check_fails_naming_what_is_missing(capsys):
    assert devices.main([]) == 1
    out = capsys.readouterr().out
    assert "CUDA is not usable: the driver" in out or "CUDA is not usable: the wheel" in out, out


def test_a_service_reading_on_cuda_reads_allocated_reserved_and_both_peaks_then_resets_them(monkeypatch):
    calls = []
    mib = {"memory_allocated": 100, "memory_reserved": 300, "max_memory_allocated": 150, "max_memory_reserved": 400}
    for name, value in mib.items():
        monkeypatch.setattr(torch.cuda, name, lambda device, name=name, value=value: calls.append(name) or value * 2**20)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append("reset"))
    assert service.reading("cuda:0") == {"allocated": 100.0, "reserved": 300.0, "peak": 150.0, "peak_reserved": 400.0}
    assert calls[0] == "synchronize" and calls[-1] == "reset", calls
