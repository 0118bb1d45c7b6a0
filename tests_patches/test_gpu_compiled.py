"""The torch.compile wrappers (fastpath/gpu/compiled.py) with a compiler double, on the CPU."""

from __future__ import annotations

import pytest
import torch

from fastpath.gpu import compiled
from harness.parity import tolerance
from harness.model.devices import llm_inputs

# --- the compile wrappers, with a compiler double --------------------------------------------------------------------


def eager_compiler(calls):
    def compile_(fn, mode, dynamic):
        calls.append((mode, dynamic))
        return fn

    return compile_


@pytest.mark.cpu
def test_compiled_llm_pads_to_buckets_and_compiles_once(model):
    calls = []
    wrapper = compiled.compile_llm(model, mode="default", devices=("cpu",), compiler=eager_compiler(calls))
    try:
        assert compiled.compile_llm(model) is wrapper  # idempotent
        with torch.inference_mode():
            for L in (37, 50, 100):
                kwargs = llm_inputs(model, L=L)
                assert tolerance.relative_error(model.llm(**kwargs)[0], wrapper.inner(**kwargs)[0]) < 1e-5
        s = compiled.stats(model)["llm"]
        assert calls == [("default", True)] and s["shapes"] == 2 and len(s["first_call_seconds"]) == 2, s
    finally:
        compiled.uncompile_llm(model)
    assert "forward" not in model.llm.__dict__ and compiled.LLM_ATTR not in model.__dict__


@pytest.mark.cpu
def test_compiled_vocoder_wraps_decode_on_the_instance(model):
    calls = []
    tokenizer = model.audio_tokenizer
    wrapper = compiled.compile_vocoder(model, devices=("cpu",), compiler=eager_compiler(calls))
    try:
        codes = torch.randint(0, 1024, (1, 8, 20))
        with torch.inference_mode():
            out = tokenizer.decode(codes).audio_values
            ref = wrapper.inner(codes).audio_values
        assert torch.equal(out, ref) and calls == [("default", True)] and wrapper.stats()["shapes"] == 1
    finally:
        compiled.uncompile_vocoder(model)
    assert "decode" not in tokenizer.__dict__


def test_compile_mode_is_checked():
    with pytest.raises(ValueError, match="reduce-overhead"):
        compiled.check_mode("fast")


@pytest.mark.cpu
@pytest.mark.parametrize("mode, marks", [("default", 0), ("reduce-overhead", 2), ("max-autotune", 2)])
def test_the_cuda_graph_modes_mark_each_step_before_the_call(model, monkeypatch, mode, marks):
    """In the modes where inductor records CUDA graphs, each call first tells it a new step begins (the previous
    call's outputs were copied out), LLM and vocoder alike; the branch runs here with a compiler double."""
    steps = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append("llm or vocoder"))
    llm = compiled.compile_llm(model, mode=mode, devices=("cpu",), compiler=eager_compiler([]))
    vocoder = compiled.compile_vocoder(model, mode=mode, devices=("cpu",), compiler=eager_compiler([]))
    try:
        with torch.inference_mode():
            model.llm(**llm_inputs(model, L=37))
            model.audio_tokenizer.decode(torch.randint(0, 1024, (1, 8, 20)))
        assert len(steps) == marks and llm.passthrough == vocoder.passthrough == 0, steps
    finally:
        compiled.uncompile_llm(model)
        compiled.uncompile_vocoder(model)
