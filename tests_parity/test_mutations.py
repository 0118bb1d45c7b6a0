"""Mutation checks: the parity comparison catches a one-ulp change inside each loop patch, random numbers read
one place off by batched_scoring, and one reference code off in the prompt cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fastpath
from harness.parity.parity import compare_runs, record_generation
from tests_parity.test_bitexact import POINTS

DEVICES = {"cpu", "cuda", "mps"}
POINT = dict(POINTS["batch_of_3"], num_step=8)  # every path of the loop at a quarter of the default 32 steps


@pytest.fixture(scope="module")
def stock_run(model):
    return record_generation(model, seed=0, **POINT)


# patch -> the loop functions whose logits it produces, each with the element to nudge: trimmed_cfg runs the packed
# layout (logits [M, C, V]), or stock's padded one for a call where no packed row count is exact on this machine
# (loop.row_count); the others alone run stock's padded layout through group_logits ([G, T, C, V])
GROUP = ("group_logits", (0, 0, 0, 7))
PRODUCERS = {"trimmed_cfg": (("packed_logits", (0, 0, 7)), GROUP), "sliced_heads": (GROUP,), "static_prefix": (GROUP,)}


@pytest.mark.cpu
@pytest.mark.parametrize("name", list(PRODUCERS))
def test_one_ulp_in_a_patch_fails_parity(model, stock_run, name, monkeypatch):
    """Mutation check: a loop patch whose logits move by one ulp in one element is caught."""
    from fastpath import loop

    def off_by_one_ulp(real, element):
        def produce(*args, **kwargs):
            out = real(*args, **kwargs)
            out[element] = torch.nextafter(out[element], torch.tensor(float("inf")))
            return out

        return produce

    for function, element in PRODUCERS[name]:
        monkeypatch.setattr(loop, function, off_by_one_ulp(getattr(loop, function), element))
    with fastpath.patched(model, name):
        candidate = record_generation(model, seed=0, **POINT)
    problems = compare_runs(stock_run, candidate)
    assert problems and "1/" in problems[0] and "elements differ" in problems[0], problems


@pytest.mark.cpu
def test_batched_noise_in_another_order_fails_parity(model, stock_run, monkeypatch):
    """Mutation check: batched_scoring reading its random numbers one place off (the order bug a rewrite of the
    packing would make) is caught: other positions unmask, and every later step's logits differ from stock's."""
    from fastpath import loop

    real = loop.gumbel_noise
    monkeypatch.setattr(loop, "gumbel_noise", lambda uniform: real(torch.roll(uniform, 1, dims=-1)))
    with fastpath.patched(model, "batched_scoring"):
        candidate = record_generation(model, seed=0, **POINT)
    problems = compare_runs(stock_run, candidate)
    assert problems and "call 0 " not in problems[0], problems  # the first step's logits precede any noise


@pytest.mark.cpu
def test_one_ulp_in_the_prompt_cache_fails_parity(model, monkeypatch):
    from fastpath import prompt_cache

    kwargs = POINTS["voice_clone_audio"]
    stock = record_generation(model, seed=0, **kwargs)
    real_call = prompt_cache.PromptCache.__call__

    def nudged(self, *args, **kw):  # the cache hands back a prompt one code off in one frame
        prompt = real_call(self, *args, **kw)
        tokens = prompt.ref_audio_tokens.clone()
        tokens[0, 0] = (tokens[0, 0] + 1) % 1024
        return dataclasses.replace(prompt, ref_audio_tokens=tokens)

    monkeypatch.setattr(prompt_cache.PromptCache, "__call__", nudged)
    with fastpath.patched(model, "prompt_cache"):
        candidate = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, candidate)
    assert problems and "call 0 c_logits" in problems[0], problems
