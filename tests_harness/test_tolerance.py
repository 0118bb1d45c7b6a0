"""Closeness numbers of the GPU tier's tolerance checks (harness/tolerance.py) on known inputs."""

from __future__ import annotations

import math

import pytest
import torch

from harness import tolerance
from harness.parity import Run

# --- closeness numbers -----------------------------------------------------------------------------------------------


def test_closeness_numbers_on_known_inputs():
    a = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    assert tolerance.relative_error(a, a) == 0.0
    assert tolerance.relative_error(a * 1.01, a) == pytest.approx(0.01)
    assert tolerance.relative_error(torch.tensor([float("nan")]), torch.tensor([1.0])) == math.inf
    assert tolerance.argmax_agreement(a, torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])) == 0.5
    assert tolerance.token_agreement([torch.tensor([[1, 2], [3, 4]])], [torch.tensor([[1, 2], [3, 0]])]) == 0.75
    assert tolerance.token_agreement([torch.zeros(2, 3)], [torch.zeros(2, 4)]) == 0.0
    wave = torch.sin(torch.linspace(0, 100, 4800)).numpy()
    assert tolerance.waveform_cosine(wave, wave) == pytest.approx(1.0)
    assert tolerance.waveform_cosine(-wave, wave) == pytest.approx(-1.0)
    assert tolerance.waveform_snr_db(wave * 1.01, wave) == pytest.approx(40.0, abs=0.01)
    assert tolerance.waveform_snr_db(wave, wave) == math.inf


def test_closeness_of_a_run_with_itself_is_perfect():
    logits = torch.randn(1, 8, 5, 16)
    run = Run(steps=[("call 0 c_logits", logits), ("call 0 u_logits", logits + 1)],
              tokens=[torch.ones(8, 5, dtype=torch.long)], waveforms=[torch.randn(960).numpy()])
    close = tolerance.closeness(run, run)
    assert (close.rel_error, close.argmax_agreement, close.token_agreement) == (0.0, 1.0, 1.0)
    assert close.waveform_cosine == pytest.approx(1.0)
    assert close.waveform_snr_db == math.inf and "argmax agreement 1.0000" in close.describe()
