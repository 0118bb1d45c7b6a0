"""The loop's batch layouts (fastpath.loop.padded_groups, trimmed_groups) built from synthetic rows, no model:
which rows share a forward batch, and where the tensors they build live.

Three items whose prompts are all 10 positions long; item 1's target is 5 positions, items 0 and 2 have 4. So the
conditional rows have one length (10) and two starts (6, 5); the unconditional rows (target only) have lengths 4, 5, 4.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import fastpath
from fastpath import loop
from harness.run import strict

C_LENS, T_LENS = [10, 10, 10], [4, 5, 4]


def fake_model(device: str):
    return SimpleNamespace(config=SimpleNamespace(num_audio_codebook=2, audio_mask_id=9), device=torch.device(device))


def inputs(device: str) -> list:
    return [{"input_ids": torch.zeros(1, 2, c, dtype=torch.long, device=device),
             "audio_mask": torch.zeros(1, c, dtype=torch.bool, device=device)} for c in C_LENS]


def batches(groups) -> list:
    return [[(row.item, row.cond) for row in group.rows] for group in groups]


def test_rows_of_one_length_share_a_batch_and_by_start_splits_them_by_start():
    model = fake_model("cpu")
    plain = loop.trimmed_groups(model, inputs("cpu"), C_LENS, T_LENS)
    assert batches(plain) == [[(0, True), (1, True), (2, True)], [(1, False)], [(0, False), (2, False)]]
    # prefix_kv_cache keeps one prefix length per batch: items 0 and 2 (start 6) together, item 1 (start 5) alone,
    # and no more batches than that
    by_start = loop.trimmed_groups(model, inputs("cpu"), C_LENS, T_LENS, by_start=True)
    assert batches(by_start) == [[(1, True)], [(0, True), (2, True)], [(1, False)], [(0, False), (2, False)]]
    assert all(len({row.start for row in group.rows}) == 1 for group in by_start)


LAYOUTS = [
    pytest.param(lambda m, x: loop.padded_groups(m, x, C_LENS, T_LENS), id="padded"),
    pytest.param(lambda m, x: loop.trimmed_groups(m, x, C_LENS, T_LENS), id="trimmed"),
    pytest.param(lambda m, x: loop.trimmed_groups(m, x, C_LENS, T_LENS, own_width=True), id="trimmed-own-width"),
    pytest.param(lambda m, x: loop.trimmed_groups(m, x, C_LENS, T_LENS, by_start=True), id="trimmed-by-start"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_tensor_of_a_layout_is_on_the_models_device(layout):
    # a device that is not the CPU, on a machine without a GPU: a tensor made without device= lands on the CPU
    groups = layout(fake_model("meta"), inputs("meta"))
    placed = {(name, tuple(getattr(g, name).shape), getattr(g, name).device.type)
              for g in groups for name in ("input_ids", "audio_mask", "attention_mask")}
    assert groups and {device for *_, device in placed} == {"meta"}, sorted(placed)


def scoring_calls(spans, limit, monkeypatch):
    """loop.score_runs over packed logits [2, C=2, N=10, V=3] with a stand-in for upstream's scoring: the calls it
    made (their columns, and whether each was a view of the packed logits), and its result."""
    logits = torch.arange(2 * 2 * 10 * 3, dtype=torch.float32).reshape(2, 2, 10, 3)
    calls = []

    def predict(cond, uncond, gen_config):  # [1, C, n, V] each -> tokens, scores [1, C, n]
        view = cond.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
        calls.append(((cond[0, 0, :, 0] / 3).long().tolist(), view))  # column of each frame (row 0, codebook 0)
        return cond.argmax(-1), cond.amax(-1)

    monkeypatch.setattr(loop, "SCORE_RUN_ELEMENTS", limit)
    tokens, scores = loop.score_runs(SimpleNamespace(_predict_tokens_with_scoring=predict), logits, spans, None)
    columns = [c for first, n in spans for c in range(first, first + n)]
    assert torch.equal(scores, logits[0:1, :, columns].amax(-1)), "the runs changed the scores"
    return calls


def test_scoring_runs_hold_as_many_items_as_fit_and_read_contiguous_columns_in_place(monkeypatch):
    # C * V = 6 elements a frame: 50 hold the first two items (7 frames, 42), not the third as well (60)
    calls = scoring_calls([(0, 4), (4, 3), (7, 3)], 50, monkeypatch)
    assert calls == [([0, 1, 2, 3, 4, 5, 6], True), ([7, 8, 9], True)]
    # items that are not side by side in the packed columns: gathered (a copy), in item order
    calls = scoring_calls([(0, 2), (5, 3)], float("inf"), monkeypatch)
    assert calls == [([0, 1, 5, 6, 7], False)]


@pytest.mark.parametrize("flags, by_start", [
    pytest.param(["prefix_kv_cache"], True, id="prefix_kv_cache"),
    pytest.param(["batch_invariant"], False, id="batch_invariant"),
])
def test_the_loop_asks_for_one_prefix_length_per_batch_under_prefix_kv_cache_only(model, monkeypatch, flags, by_start):
    """The layout above is what generate asks for: one start per batch under prefix_kv_cache (its cached steps cut
    every row of a batch at the first row's start), rows of any start together otherwise. At refresh 1 the outputs
    are exact either way, so only the call tells."""
    if "batch_invariant" in flags:
        strict.refused_by_design(model, "batch_invariant", "the layout batch_invariant asks for")
    asked, real = [], loop.trimmed_groups

    def spy(*args, **kwargs):
        asked.append(kwargs.get("by_start", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "trimmed_groups", spy)
    with fastpath.patched(model, flags):
        model.generate(text=["Hi.", "Hello there."], language="en", num_step=2)
    assert asked == [by_start], f"generate's layouts asked by_start={asked}, expected [{by_start}]"


def test_off_the_cpu_the_bit_probes_step_aside(monkeypatch):
    """The loop's early returns for a model off the CPU (no patch claims bit-exactness there), run here on `meta`
    tensors: the GEMM probe says rows are independent, a row count is what was asked, lean_llm does not fit, the
    scoring runs are not cut by the CPU's cache budget, and an attention cut is stock's (P, P); none measures."""
    meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    monkeypatch.setattr(loop, "_PROBED", {})  # a probe that ran would add an entry
    layer = SimpleNamespace(self_attn=SimpleNamespace(q_proj=SimpleNamespace(weight=meta(64, 32))),
                            mlp=SimpleNamespace(down_proj=SimpleNamespace(weight=meta(32, 64))))
    model = SimpleNamespace(llm=SimpleNamespace(layers=[layer]), audio_heads=SimpleNamespace(weight=meta(48, 32)))
    assert loop.gemm_rows_independent(model) is True and loop._PROBED == {}
    assert loop.row_count([meta(64, 32)], torch.arange(5), 10, 7) == 7
    assert loop.lean_llm_fits(model, meta(1, 9, 32)) is False
    monkeypatch.setattr(loop, "SCORE_RUN_ELEMENTS", 1)  # on the CPU every item would be a run of its own
    calls = []
    loop.score_runs(SimpleNamespace(_predict_tokens_with_scoring=lambda c, u, g: calls.append(c.shape) or
                                    (c.argmax(-1), c.amax(-1))), meta(2, 2, 10, 3), [(0, 4), (4, 6)], None)
    assert calls == [torch.Size([1, 2, 10, 3])], calls
    mask = torch.ones(1, 1, 300, 300, dtype=torch.bool)
    assert loop.attention_cut("sdpa", None, meta(1, 4, 300, 16), meta(1, 2, 300, 16), mask, 40, {}) == (300, 300)
