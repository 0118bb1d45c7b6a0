"""Batched decoding: a mixed-length batch of eight, scored in one pass, against stock OmniVoice on CPU fp32.

- `batched_scoring` (lossless): bit-exact against the same stock batch call, random numbers included (one draw
  read in upstream's per-item order), in sampling and deterministic settings, with CPU's cache-sized scoring runs
  and with one scoring call per step (what other devices do).
- `batch_invariant` (opt in): each item bit-exact against a stock batch-1 call of it in deterministic settings
  (position_temperature=0, class_temperature=0). With sampling it cannot be: in a batch, an item's random numbers
  come after the earlier items' draws from the same generator, in a batch-1 call they start at the seed.
- Packed rows (`trimmed_cfg` alone, `loop.packed_layout`): every row at its own length in one forward, bit-exact.
"""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath import loop
from fastpath.instance import overridden
from harness.parity.parity import POINTS, Run, compare_runs, record_generation
from harness.model.points import load_spec
from harness.run import strict

MIXED_8 = load_spec()["texts"]["mixed8"]  # one word to about ten seconds
# 4 steps: what is tested is the batch (eight lengths packed, scored and unmasked together, each item's own k per
# step); every step is the same loop, which the bit-exact tier checks over 32
BATCH = dict(text=MIXED_8, language="en", num_step=4)
DETERMINISTIC = dict(language="en", num_step=4, position_temperature=0.0)
# name -> generate settings; each row says why it is here
SETTINGS = {
    "sampling": {},  # upstream defaults: position noise (random numbers every step)
    "deterministic": dict(position_temperature=0.0),  # no random numbers at all
    "class_sampling": dict(class_temperature=0.8),  # noise drawn inside upstream's scoring: per-item path kept
}


@pytest.fixture(scope="module")
def stock_batch(model):
    cache = {}

    def get(setting):
        if setting not in cache:
            assert fastpath.applied(model) == []
            cache[setting] = record_generation(model, seed=0, **BATCH, **SETTINGS[setting])
        return cache[setting]

    return get


# Default run: the stack in CPU runs while sampling, batched_scoring alone in one call on the top-k path without
# noise; the other 10 combinations (class sampling's per-item path among them) under --slow, which the nightly slow
# job runs (time budget: README, "Running the suite").
DEFAULT_CASES = {("sampling", "stack", "cpu-runs"), ("deterministic", "batched_scoring", "one-call")}


def batch_cases():
    for setting in SETTINGS:
        for patches, pname in ((("batched_scoring",), "batched_scoring"), (tuple(fastpath.LOSSLESS), "stack")):
            for run_elements, rname in ((loop.SCORE_RUN_ELEMENTS, "cpu-runs"), (float("inf"), "one-call")):
                marks = [] if (setting, pname, rname) in DEFAULT_CASES else [pytest.mark.slow]
                yield pytest.param(setting, patches, run_elements, id=f"{setting}-{'+'.join(patches)}-{rname}",
                                   marks=marks)


@pytest.mark.cpu
@pytest.mark.parametrize(("setting", "patches", "run_elements"), batch_cases())
def test_batched_scoring_is_bit_exact_on_a_mixed_batch(model, stock_batch, setting, patches, run_elements, monkeypatch):
    stock = stock_batch(setting)
    monkeypatch.setattr(loop, "SCORE_RUN_ELEMENTS", run_elements)
    with fastpath.patched(model, list(patches)):
        candidate = record_generation(model, seed=0, **BATCH, **SETTINGS[setting])
    problems = compare_runs(stock, candidate)
    assert not problems, f"{'+'.join(patches)}, {setting}: not bit-exact:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_one_draw_per_item_gives_the_same_numbers(model, stock_batch, monkeypatch):
    """The draw used off CPU (one call per item, as upstream) run here: still the stock random numbers."""
    monkeypatch.setattr(loop, "ONE_DRAW_DEVICES", ())
    with fastpath.patched(model, "batched_scoring"):
        candidate = record_generation(model, seed=0, **BATCH)
    problems = compare_runs(stock_batch("sampling"), candidate)
    assert not problems, "per-item draws: not bit-exact:\n  " + "\n  ".join(problems)


def scoring_calls(model, **kwargs) -> int:
    calls = []

    def counting(predict):
        def count(*args):
            calls.append(args[0].shape)
            return predict(*args)

        return count

    with overridden(model, "_predict_tokens_with_scoring", counting):
        torch.manual_seed(0)
        model.generate(**kwargs)
    return len(calls)


@pytest.mark.cpu
def test_batched_scoring_scores_each_step_in_one_call(model, monkeypatch):
    """Upstream scores item by item (8 calls a step here); batched, one call a step (CPU's cache-sized runs off)."""
    kwargs = dict(BATCH, num_step=4, postprocess_output=False)
    stock = scoring_calls(model, **kwargs)
    monkeypatch.setattr(loop, "SCORE_RUN_ELEMENTS", float("inf"))
    with fastpath.patched(model, "batched_scoring"):
        batched = scoring_calls(model, **kwargs)
    assert (stock, batched) == (4 * len(MIXED_8), 4), f"scoring calls: stock {stock}, batched {batched}"


def as_one_batch(alone: list) -> Run:
    """Batch-1 runs arranged as a batch run records them: per step, item by item (an item whose schedule is
    spent stops being scored, as upstream skips it), then each item's tokens, decoded audio and waveform."""
    steps = []
    for step in range(max(len(run.steps) // 4 for run in alone)):
        for run in alone:
            steps += run.steps[4 * step : 4 * step + 4]
    return Run(steps, [run.tokens[0] for run in alone], [run.waveforms[0] for run in alone],
               decoded=[run.decoded[0] for run in alone])


@pytest.fixture(scope="module")
def batch_1_calls(model):
    """Stock, deterministic settings: each text of the batch in a call of its own."""
    return as_one_batch([record_generation(model, seed=0, text=text, **DETERMINISTIC) for text in MIXED_8])


def needs_independent_rows(model) -> None:
    """batch_invariant refuses a machine whose CPU GEMM gives a row other bits when the call has another number of
    rows (loop.gemm_rows_independent is False): the test is then not applicable (the refusal checked); run with
    MKL_CBWR=AVX2,STRICT (or AUTO,STRICT) to check it there."""
    strict.refused_by_design(model, "batch_invariant", "items of a batch against their calls alone")


@pytest.mark.cpu
def test_batch_invariant_items_equal_batch_1_calls(model, batch_1_calls):
    """Deterministic settings: every item of a batch of eight is bit-exact (per-step logits, scores, tokens,
    waveform) with a stock call on it alone."""
    needs_independent_rows(model)
    with fastpath.patched(model, list(fastpath.LOSSLESS) + ["batch_invariant"]):
        batch = record_generation(model, seed=0, text=MIXED_8, **DETERMINISTIC)
    problems = compare_runs(batch_1_calls, batch)
    assert not problems, "batch_invariant: items differ from their batch-1 calls:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_two_voices_in_one_batch_each_get_their_own(model):
    """The voices_batch point (one text twice, two references of equal length and different content), deterministic:
    with batch_invariant each item is bit-exact with a stock call of it alone, so neither item's output carries the
    other's reference; the two items' tokens differ, so a swap or a mix of the two would be seen."""
    needs_independent_rows(model)
    kwargs = dict(POINTS["voices_batch"], **DETERMINISTIC)
    alone = as_one_batch([record_generation(model, seed=0, **dict(kwargs, text=kwargs["text"][i],
                                                                  ref_audio=kwargs["ref_audio"][i],
                                                                  ref_text=kwargs["ref_text"][i]))
                          for i in range(len(kwargs["text"]))])
    first, second = alone.tokens
    assert first.shape == second.shape and not torch.equal(first, second), (
        "the two voices gave outputs of other lengths, or the same tokens: the point cannot show a mix-up")
    with fastpath.patched(model, list(fastpath.LOSSLESS) + ["batch_invariant"]):
        batch = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(alone, batch)
    assert not problems, "voices in one batch: items differ from their calls alone:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_batch_invariant_is_needed_for_that(model, batch_1_calls):
    """Control: the lossless stack (attention over the batch's longest item, as stock) does not reproduce the
    batch-1 calls, so the test above can fail."""
    with fastpath.patched(model):
        batch = record_generation(model, seed=0, text=MIXED_8, **DETERMINISTIC)
    assert compare_runs(batch_1_calls, batch), "stock-width attention reproduced batch-1 calls: the control has no power"


@pytest.mark.cpu
def test_packed_rows_run_as_one_forward_without_padding(model, stock_batch):
    """trimmed_cfg alone (heads on every packed position) on the mixed batch: bit-exact, and its layout is one
    forward over the rows' own lengths (plus the few padding rows `loop.row_count` adds where this machine's GEMM
    needs them), each unpacked into a row of stock's attention width."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    with fastpath.patched(model, ["trimmed_cfg"]):
        candidate = record_generation(model, seed=0, **BATCH)
    problems = compare_runs(stock_batch("sampling"), candidate)
    assert not problems, "trimmed_cfg (packed rows): not bit-exact:\n  " + "\n  ".join(problems)
    task = model._preprocess_all(text=MIXED_8, language="en")
    cfg = OmniVoiceGenerationConfig()
    inputs = [model._prepare_inference_inputs(task.texts[i], task.target_lens[i], None, None, task.langs[i],
                                              task.instructs[i], cfg.denoise) for i in range(task.batch_size)]
    c_lens, t_lens = [x["input_ids"].size(2) for x in inputs], list(task.target_lens)
    packed = loop.packed_layout(model, inputs, c_lens, t_lens, [sum(t_lens[:i]) for i in range(len(t_lens))])
    B, P, own = len(c_lens), max(c_lens), sum(c_lens) + sum(t_lens)
    if packed is None:
        strict.not_applicable("the packed layout's positions", "this machine's GEMM gives no row count of the "
                              "packed forward stock's bits for this batch (loop.row_count is None: the call ran "
                              "stock's layout, bit-exact as checked above); the layout is checked on machines where "
                              "one exists (AVX-512 MKL, or MKL without its AVX2 cap)")
    got = packed.input_ids.shape[-1]
    assert own <= got < own + loop.PROBE_SCAN, f"packed positions {got}: not the rows' own {own} (+ < {loop.PROBE_SCAN})"
    R = 2 * B + (got > own)  # a padding segment when row_count added rows
    assert packed.attention_mask.shape == (R, 1, P, P), "attention is not unpacked to stock's width"
    unpacking = packed.unpacking
    assert list(unpacking.starts) == [sum(unpacking.lengths[:r]) for r in range(R)], "segments not back to back"
    assert max(unpacking.lengths) == P and sum(unpacking.lengths) == got, "segments do not cover the packed rows"
    assert packed.targets.numel() == 2 * sum(t_lens), "each target frame of each row listed once"
