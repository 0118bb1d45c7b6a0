"""Closeness numbers of the GPU tier's tolerance checks (harness/parity/tolerance.py) on known inputs."""

from __future__ import annotations

import math

import pytest
import torch

from harness.parity import tolerance
from harness.parity.parity import Run

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
    run = Run(steps=[("call 0 c_logits", logits), ("call 0 u_logits", logits + 1),
                     ("call 0 pred_tokens", logits.argmax(-1)), ("call 0 scores", logits.amax(-1))],
              tokens=[torch.ones(8, 5, dtype=torch.long)], waveforms=[torch.randn(960).numpy()])
    close = tolerance.closeness(run, run)
    assert (close.rel_error, close.argmax_agreement, close.token_agreement) == (0.0, 1.0, 1.0)
    assert close.waveform_cosine == pytest.approx(1.0)
    assert close.waveform_snr_db == math.inf and "argmax agreement 1.0000" in close.describe()


@pytest.mark.cpu
def test_closeness_splits_a_batched_scoring_call_per_item(model):
    """batched_scoring scores the items of a batch in one call ([1, C, sum of frames, V]); closeness compares it
    item by item with stock's per-item calls, as the parity tier does (the H200's first run compared the packed
    call with stock's first item and failed on shapes). On CPU the patch is bit-exact: perfect closeness."""
    import fastpath
    from harness.parity.parity import POINTS, record_generation

    kwargs = dict(POINTS["batch_of_3"], num_step=2)
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model, ["batched_scoring"]):
        batched = record_generation(model, seed=0, **kwargs)
    assert len(batched.steps) < len(stock.steps), "batched_scoring no longer packs items: this test checks nothing"
    close = tolerance.closeness(batched, stock)
    assert (close.rel_error, close.argmax_agreement, close.token_agreement) == (0.0, 1.0, 1.0), close.describe()
