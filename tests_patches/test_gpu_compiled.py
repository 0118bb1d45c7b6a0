"""The torch.compile wrappers (fastpath/gpu/compiled.py) with a compiler double, on the CPU."""

from __future__ import annotations

import time

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


# --- what the wrappers call and count, with recording doubles of the forward and the compiler ----------------------


def recording(out):
    """A forward double: records (args, kwargs) of each call, returns out(args, kwargs)."""
    def forward(*args, **kwargs):
        forward.calls.append((args, kwargs))
        return out(args, kwargs)

    forward.calls = []
    return forward


def recording_compiler(compiles):
    def compile_(fn, mode, dynamic):
        compiles.append((fn, mode, dynamic))
        return fn

    return compile_


def llm_call(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(inputs_embeds=torch.randn(2, L, 3, generator=g), attention_mask=torch.ones(2, 1, L, L, dtype=torch.bool),
                return_dict=True, position_ids=None)


def test_compiled_llm_unpadded_compiles_once_and_counts_each_shape_on_its_device_once():
    """Without buckets each (rows, length, keys, dtype, device) is a shape, timed on its first call only; every call
    runs the compiled forward with the call's embeddings and mask, asking for a dict and no KV cache."""
    inner, compiles = recording(lambda args, kwargs: (kwargs["inputs_embeds"] * 2,)), []
    llm = torch.nn.Linear(1, 1)
    wrapper = compiled.CompiledForward(llm, inner, buckets=None, devices=("cpu",),
                                       compiler=recording_compiler(compiles))
    calls = [llm_call(5, seed=0), llm_call(5, seed=1), llm_call(7)]
    start = time.perf_counter()
    with torch.inference_mode():
        outs = [wrapper(**kwargs) for kwargs in calls]
    elapsed = time.perf_counter() - start
    assert compiles == [(inner, "default", True)], compiles
    assert [key for key, _ in wrapper.first_calls] == [(2, 5, 5, "torch.float32", "cpu"), (2, 7, 7, "torch.float32",
                                                                                          "cpu")]
    assert all(0 <= seconds <= elapsed for _, seconds in wrapper.first_calls), (wrapper.first_calls, elapsed)
    assert wrapper.stats()["shapes"] == 2 and wrapper.passthrough == 0, wrapper.stats()
    for kwargs, (args, seen), out in zip(calls, inner.calls, outs):
        assert args == () and set(seen) == {"inputs_embeds", "attention_mask", "position_ids", "return_dict",
                                            "use_cache"}, seen
        assert torch.equal(seen["inputs_embeds"], kwargs["inputs_embeds"])
        assert torch.equal(seen["attention_mask"], kwargs["attention_mask"])
        assert (seen["position_ids"], seen["return_dict"], seen["use_cache"]) == (None, True, False), seen
        assert torch.equal(out.last_hidden_state, kwargs["inputs_embeds"] * 2)


def test_compiled_llm_passes_calls_it_does_not_compile_to_the_stock_forward_unchanged():
    """Gradients enabled, a positional argument, or a device not in `devices`: the stock forward gets the call as
    it was made, counted as a passthrough; nothing compiles."""
    inner, compiles = recording(lambda args, kwargs: "stock"), []
    wrapper = compiled.CompiledForward(torch.nn.Linear(1, 1), inner, buckets=None, devices=("cpu",),
                                       compiler=recording_compiler(compiles))
    on_cuda_only = compiled.CompiledForward(torch.nn.Linear(1, 1), inner, buckets=None,
                                            compiler=recording_compiler(compiles))
    kwargs = llm_call(5)
    assert wrapper(**kwargs) == "stock"  # gradients enabled
    with torch.inference_mode():
        assert wrapper("positional", **kwargs) == "stock"
        assert on_cuda_only(**kwargs) == "stock"
    assert [args for args, _ in inner.calls] == [(), ("positional",), ()]
    assert all(seen.keys() == kwargs.keys() and all(seen[k] is kwargs[k] for k in kwargs) for _, seen in inner.calls)
    assert (wrapper.passthrough, on_cuda_only.passthrough, compiles) == (2, 1, [])


def test_compiled_vocoder_counts_each_shape_once_and_passes_the_calls_arguments():
    inner, compiles = recording(lambda args, kwargs: args[0].sum()), []
    wrapper = compiled.CompiledDecode(torch.nn.Linear(1, 1), inner, mode="max-autotune", dynamic=None,
                                      devices=("cpu",), compiler=recording_compiler(compiles))
    codes = [torch.randint(0, 1024, (1, 8, T)) for T in (20, 20, 33)]
    start = time.perf_counter()
    with torch.inference_mode():
        outs = [wrapper(c, "extra", return_dict=None) for c in codes]
    elapsed = time.perf_counter() - start
    assert compiles == [(inner, "max-autotune", None)], compiles
    assert [key for key, _ in wrapper.first_calls] == [(1, 8, 20), (1, 8, 33)] and wrapper.stats()["shapes"] == 2
    assert all(0 <= seconds <= elapsed for _, seconds in wrapper.first_calls), (wrapper.first_calls, elapsed)
    assert [(args[0] is c, args[1:], seen) for c, (args, seen) in zip(codes, inner.calls)] == \
        [(True, ("extra",), {"return_dict": None})] * 3
    assert all(torch.equal(out, c.sum()) for out, c in zip(outs, codes)) and wrapper.passthrough == 0


def test_compiled_vocoder_passes_what_it_does_not_compile_to_the_stock_decode_unchanged():
    inner, compiles = recording(lambda args, kwargs: "stock"), []
    wrapper = compiled.CompiledDecode(torch.nn.Linear(1, 1), inner, devices=("cpu",),
                                      compiler=recording_compiler(compiles))
    codes = torch.zeros(1, 8, 4, dtype=torch.long)
    assert wrapper(codes, "extra", return_dict=None) == "stock"  # gradients enabled
    with torch.inference_mode():
        assert wrapper([[1, 2]], "extra", return_dict=None) == "stock"  # not a tensor
        assert compiled.CompiledDecode(torch.nn.Linear(1, 1), inner, compiler=recording_compiler(compiles))(
            codes, "extra", return_dict=None) == "stock"  # a device not in `devices`
    assert [(args[1:], seen) for args, seen in inner.calls] == [(("extra",), {"return_dict": None})] * 3
    assert inner.calls[0][0][0] is codes and inner.calls[1][0][0] == [[1, 2]] and inner.calls[2][0][0] is codes
    assert (wrapper.passthrough, compiles) == (2, [])
