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


# --- the GPU tier's tolerance rows (tests_parity/test_gpu_parity.py): rows that can fail ---------------------------


def gpu_rows():
    from harness.parity.gpu_rows import SAME_PRECISION

    return SAME_PRECISION


def test_every_gpu_row_says_what_a_gpu_measured_and_passes_it():
    """A row measured on a GPU is exact where the GPU measured 0.0, passes its own measurement (or the next GPU run
    would fail on what was seen), and says why any bound is looser than measured; an unmeasured row says so."""
    for row in gpu_rows():
        if row.measured is None:
            assert row.card is None and row.why.startswith("not measured on a GPU yet"), row
            continue
        rel, argmax, tokens = row.measured
        assert row.card and row.max_rel_err >= rel and row.min_tokens <= tokens, row
        assert argmax is None or row.min_argmax <= argmax, row
        if rel == 0.0:
            assert (row.max_rel_err, row.min_argmax, row.min_tokens) == (0.0, 1.0, 1.0), row
        elif row.max_rel_err > rel:
            assert "measured" in row.why, f"{row.name}: looser than measured without saying why"


@pytest.mark.cpu
def test_the_gpu_rows_refuse_what_they_exist_to_refuse(model):
    """Known worse, on the CPU model's runs: one ulp in the final norm (step-0 logits move by ~5e-8) is refused by
    every row whose GPU measured stock's bits; another seed's draws (the same logits, other tokens) by every row."""
    from harness.model.points import GPU_PARITY
    from harness.parity.parity import record_generation

    stock = record_generation(model, seed=0, **GPU_PARITY["single"])
    weight = model.llm.norm.weight
    kept = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[0] = torch.nextafter(weight[0], torch.tensor(float("inf")))
        one_ulp = tolerance.closeness(record_generation(model, seed=0, **GPU_PARITY["single"]), stock)
    finally:
        with torch.no_grad():
            weight.copy_(kept)
    other_draws = tolerance.closeness(record_generation(model, seed=1, **GPU_PARITY["single"]), stock)
    assert one_ulp.rel_error > 0 and other_draws.rel_error == 0 and other_draws.token_agreement < 0.5, \
        (one_ulp.describe(), other_draws.describe())
    exact = [row for row in gpu_rows() if row.measured and row.measured[0] == 0.0]
    assert len(exact) >= 3, [row.name for row in exact]
    assert all(row.refused(one_ulp) for row in exact), [row.name for row in exact if not row.refused(one_ulp)]
    assert all(row.refused(other_draws) for row in gpu_rows())


def test_closeness_of_one_item_of_a_batch():
    """Item by item: a batch whose second item has other tokens shows it on that item alone."""
    logits = [torch.randn(1, 8, 5, 16), torch.randn(1, 8, 7, 16)]
    steps = [(f"call {i} {kind}", tensor) for i, x in enumerate(logits)
             for kind, tensor in (("c_logits", x), ("u_logits", x + 1), ("pred_tokens", x.argmax(-1)),
                                  ("scores", x.amax(-1)))]
    tokens = [torch.ones(8, 5, dtype=torch.long), torch.ones(8, 7, dtype=torch.long)]
    waves = [torch.randn(960).numpy(), torch.randn(1344).numpy()]
    stock = Run(steps=steps, tokens=tokens, waveforms=waves)
    other = Run(steps=steps, tokens=[tokens[0], torch.zeros(8, 7, dtype=torch.long)], waveforms=waves)
    assert tolerance.closeness(other, stock, item=0).token_agreement == 1.0
    assert tolerance.closeness(other, stock, item=1).token_agreement == 0.0
    assert tolerance.closeness(other, stock).token_agreement == pytest.approx(40 / 96)
