"""The GPU tier's wrappers on model doubles, on the CPU: what `compile_llm`, `compile_vocoder` and `graphs.install`
put on the instance by default and with every argument given, what their deep copies carry, their stats, and the
exact words of the GPU tier's refusals and warnings (each names what is wrong and the fix)."""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from fastpath.gpu import compiled, flags, graphs, packed
from fastpath.gpu.padding import fill_padded
from fastpath.gpu.shapes import DEFAULT_BUCKETS, Buckets, LRUCache, graph_key


class LLM(torch.nn.Module):
    """A model's LLM double: one parameter, an attention implementation, a forward returning (embeds * 2,)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.config = SimpleNamespace(_attn_implementation="sdpa")

    def forward(self, inputs_embeds=None, attention_mask=None, **kwargs):
        return (inputs_embeds * 2,)


class Tokenizer(torch.nn.Module):
    def decode(self, audio_codes, return_dict=None):
        return audio_codes.float().sum()


class Model:
    """What the wrappers read of an OmniVoice: `llm` and `audio_tokenizer`, and an instance `__dict__`."""

    def __init__(self, tokenizer=True):
        self.llm, self.audio_tokenizer = LLM(), Tokenizer() if tokenizer else None


def compiler(fn, mode, dynamic):
    return fn


def llm_call(L):
    return dict(inputs_embeds=torch.ones(2, L, 3), attention_mask=torch.ones(2, 1, L, L, dtype=torch.bool))


# --- what the wrappers hold ------------------------------------------------------------------------------------------


def test_compile_llm_by_default_is_torch_compiles_default_mode_dynamic_bucketed_on_cuda_only():
    model = Model()
    stock = model.llm.forward
    wrapper = compiled.compile_llm(model)
    try:
        assert model.llm.forward is wrapper and model.__dict__[compiled.LLM_ATTR] is wrapper
        assert (wrapper.llm, wrapper.inner) == (model.llm, stock)
        assert (wrapper.mode, wrapper.dynamic, wrapper.buckets, wrapper.devices) == ("default", True, DEFAULT_BUCKETS,
                                                                                  ("cuda",))
        assert wrapper.compiler is torch.compile and wrapper.compiled is None
    finally:
        compiled.uncompile_llm(model)
    assert "forward" not in model.llm.__dict__ and compiled.LLM_ATTR not in model.__dict__


def test_compile_llm_keeps_every_argument_it_is_given_and_devices_as_a_tuple():
    model, buckets = Model(), Buckets(16, 1.5)
    wrapper = compiled.compile_llm(model, mode="max-autotune", dynamic=None, buckets=buckets, devices=["cpu", "mps"],
                                   compiler=compiler)
    try:
        assert (wrapper.mode, wrapper.dynamic, wrapper.buckets, wrapper.devices, wrapper.compiler) == (
            "max-autotune", None, buckets, ("cpu", "mps"), compiler)
        with torch.inference_mode():
            model.llm(**llm_call(5))
        assert wrapper.compiled is not None and wrapper.passthrough == 0, "the call on the CPU was not compiled"
    finally:
        compiled.uncompile_llm(model)
    assert wrapper.compiled is None, "uncompile keeps the compiled forward alive"


def test_compile_vocoder_by_default_is_torch_compiles_default_mode_dynamic_on_cuda_only():
    model = Model()
    tokenizer, stock = model.audio_tokenizer, model.audio_tokenizer.decode
    wrapper = compiled.compile_vocoder(model)
    try:
        assert tokenizer.decode is wrapper and compiled.compile_vocoder(model, mode="max-autotune") is wrapper
        assert (wrapper.tokenizer, wrapper.inner) == (tokenizer, stock)
        assert (wrapper.mode, wrapper.dynamic, wrapper.devices) == ("default", True, ("cuda",))
        assert wrapper.compiler is torch.compile and wrapper.compiled is None
    finally:
        compiled.uncompile_vocoder(model)
    assert "decode" not in tokenizer.__dict__ and compiled.VOCODER_ATTR not in model.__dict__


def test_compile_vocoder_keeps_every_argument_it_is_given_and_devices_as_a_tuple():
    model = Model()
    wrapper = compiled.compile_vocoder(model, mode="reduce-overhead", dynamic=False, devices=["cpu"],
                                       compiler=compiler)
    try:
        assert (wrapper.mode, wrapper.dynamic, wrapper.devices, wrapper.compiler) == (
            "reduce-overhead", False, ("cpu",), compiler)
        with torch.inference_mode():
            model.audio_tokenizer.decode(torch.ones(1, 8, 4, dtype=torch.long))
        assert wrapper.compiled is not None and wrapper.passthrough == 0, "the call on the CPU was not compiled"
    finally:
        compiled.uncompile_vocoder(model)
    assert wrapper.compiled is None, "uncompile keeps the compiled decode alive"


@pytest.mark.parametrize("compile_", [compiled.compile_llm, compiled.compile_vocoder])
def test_an_unknown_mode_is_refused_before_anything_is_installed(compile_):
    model = Model()
    with pytest.raises(ValueError, match="unknown torch.compile mode 'fast'"):
        compile_(model, mode="fast")
    assert model.__dict__.keys() == {"llm", "audio_tokenizer"} and "forward" not in model.llm.__dict__


def test_graphs_install_by_default_captures_on_cuda_through_torch_cuda_up_to_32_shapes():
    model = Model()
    stock = model.llm.forward
    graphed = graphs.install(model)
    try:
        assert model.llm.forward is graphed and (graphed.llm, graphed.inner) == (model.llm, stock)
        assert (graphed.buckets, graphed.max_graphs, graphed.cache.max_entries, graphed.devices) == (
            DEFAULT_BUCKETS, 32, 32, ("cuda",))
        assert graphed.capture is None and graphed.api is torch.cuda
    finally:
        graphs.remove(model)
    assert "forward" not in model.llm.__dict__ and graphs.GRAPHS_ATTR not in model.__dict__


def test_graphs_install_keeps_every_argument_it_is_given_and_devices_as_a_tuple():
    model, buckets, api = Model(), Buckets(32), SimpleNamespace()

    def capture(run, pool):
        return None

    graphed = graphs.install(model, buckets=buckets, max_graphs=3, devices=["cpu"], capture=capture, api=api)
    try:
        assert (graphed.buckets, graphed.max_graphs, graphed.cache.max_entries, graphed.devices) == (
            buckets, 3, 3, ("cpu",))
        assert graphed.capture is capture and graphed.api is api
    finally:
        graphs.remove(model)


# --- deep copies -----------------------------------------------------------------------------------------------------


def test_a_deep_copy_of_the_compiled_forward_keeps_its_settings_and_compiles_its_own_llm():
    llm, buckets = LLM(), Buckets(16)
    wrapper = compiled.CompiledForward(llm, llm.forward, "reduce-overhead", False, buckets, ("cpu", "mps"), compiler,
                                       compiled="compiled", passthrough=3)
    wrapper.seen.add("shape")
    twin = copy.deepcopy(wrapper)
    assert twin.llm is not llm and twin.inner.__self__ is twin.llm, "the copy calls the original's forward"
    assert (twin.mode, twin.dynamic, twin.buckets, twin.devices, twin.compiler) == (
        "reduce-overhead", False, buckets, ("cpu", "mps"), compiler)
    assert (twin.compiled, twin.seen, twin.first_calls, twin.passthrough) == (None, set(), [], 0)


def test_a_deep_copy_of_the_compiled_decode_keeps_its_settings_and_compiles_its_own_tokenizer():
    tokenizer = Tokenizer()
    wrapper = compiled.CompiledDecode(tokenizer, tokenizer.decode, "max-autotune", False, ("cpu", "mps"), compiler,
                                      compiled="compiled", passthrough=2)
    wrapper.seen.add("shape")
    twin = copy.deepcopy(wrapper)
    assert twin.tokenizer is not tokenizer and twin.inner.__self__ is twin.tokenizer, (
        "the copy calls the original's decode")
    assert (twin.mode, twin.dynamic, twin.devices, twin.compiler) == ("max-autotune", False, ("cpu", "mps"), compiler)
    assert (twin.compiled, twin.seen, twin.first_calls, twin.passthrough) == (None, set(), [], 0)


def test_a_deep_copy_of_the_graphed_forward_keeps_its_settings_and_starts_without_graphs():
    llm, buckets, api = LLM(), Buckets(32), SimpleNamespace()

    def capture(run, pool):
        return None

    graphed = graphs.GraphedForward(llm, llm.forward, buckets, 5, ("cpu", "mps"), capture, api)
    graphed.cache.get_or_create("shape", lambda: "graph")
    twin = copy.deepcopy(graphed)
    try:
        assert twin.llm is not llm and twin.inner.__self__ is twin.llm and twin.weights.module is twin.llm
        assert (twin.buckets, twin.max_graphs, twin.cache.max_entries, twin.devices) == (buckets, 5, 5, ("cpu", "mps"))
        assert twin.capture is capture and twin.api is api and len(twin.cache) == 0
    finally:
        graphed.close()
        twin.close()


# --- stats -----------------------------------------------------------------------------------------------------------


def test_compiled_stats_name_each_wrapper_and_round_first_call_times_to_a_tenth_of_a_millisecond():
    model = Model()
    assert compiled.stats(model) == {}
    llm = compiled.compile_llm(model, mode="reduce-overhead", dynamic=None, compiler=compiler)
    try:
        llm.first_calls, llm.seen, llm.passthrough = [("a", 0.123456), ("b", 2.0)], {"a", "b"}, 4
        assert compiled.stats(model) == {"llm": {"mode": "reduce-overhead", "dynamic": None, "shapes": 2,
                                                 "passthrough": 4, "first_call_seconds": [0.1235, 2.0]}}
        vocoder = compiled.compile_vocoder(model, mode="max-autotune", compiler=compiler)
        vocoder.first_calls, vocoder.seen, vocoder.passthrough = [("c", 0.98765)], {"c"}, 1
        assert compiled.stats(model)["vocoder"] == {"mode": "max-autotune", "shapes": 1, "passthrough": 1,
                                                    "first_call_seconds": [0.9877]}
    finally:
        compiled.uncompile_llm(model)
        compiled.uncompile_vocoder(model)


def test_graph_stats_count_graphs_and_keep_every_capture_time_and_error():
    model = Model()
    assert graphs.stats(model) is None
    graphed = graphs.install(model, devices=("cpu",), capture=lambda run, pool: None)
    try:
        for key, graph in (("a", "graph"), ("b", None), ("c", "graph")):
            graphed.cache.get_or_create(key, lambda: graphs.Captured(graph, None, None, None, 0.0))
        graphed.cache.get_or_create("a", lambda: None)  # a hit: "a" is the most recently used now
        graphed.captures = [("a", 0.123456, None), ("b", 1.5, "RuntimeError: boom"), ("c", 0.00004, None)]
        graphed.passthrough, graphed.recaptures = 2, 1
        assert graphs.stats(model) == {"hits": 1, "misses": 3, "evictions": 0, "failures": 0, "graphs": 2,
                                       "passthrough": 2, "recaptures": 1, "capture_seconds": [0.1235, 1.5, 0.0],
                                       "errors": ["RuntimeError: boom"], "keys": ["b", "c", "a"]}
    finally:
        graphs.remove(model)


# --- the exact words of refusals and warnings ------------------------------------------------------------------------


def _dropout():
    t = torch.zeros(1, 1, 128, 2)
    packed.document_attention(None, t, t, t, packed.Documents(torch.zeros(128, dtype=torch.int32)), dropout=0.1)


REFUSALS = [
    pytest.param(lambda: compiled.check_mode("fast"),
                 "unknown torch.compile mode 'fast'; fastpath uses one of ['default', 'reduce-overhead', "
                 "'max-autotune']", id="compile-mode"),
    pytest.param(lambda: compiled.compile_vocoder(Model(tokenizer=False)),
                 "this model has no audio tokenizer (loaded with train=True?); nothing to compile",
                 id="vocoder-without-tokenizer"),
    pytest.param(lambda: graphs.GraphedForward(LLM(), None, devices=("cpu",)),
                 "cuda_graphs on ('cpu',) needs a CUDA API or a capture double", id="graphs-without-api"),
    pytest.param(lambda: Buckets(multiple=0), "bucket multiple must be a positive int, got 0", id="bucket-multiple"),
    pytest.param(lambda: Buckets(growth=0.5), "bucket growth must be a finite number >= 1.0, got 0.5",
                 id="bucket-growth"),
    pytest.param(lambda: Buckets().length(0), "cannot bucket a length of 0", id="bucket-length"),
    pytest.param(lambda: graph_key(1, 10, 9, torch.float32, "cpu", "sdpa", Buckets()),
                 "mask width 9 is narrower than the sequence length 10", id="graph-key"),
    pytest.param(lambda: LRUCache(0), "max_entries must be a positive int, got 0", id="lru-size"),
    pytest.param(lambda: fill_padded(torch.zeros(2, 5, 4), torch.ones(2, 1, 5, 5, dtype=torch.bool),
                                     torch.zeros(2, 3, 4), torch.zeros(2, 1, 3, 3, dtype=torch.bool)),
                 "padded buffers (2, 3, 4), (2, 1, 3, 3) cannot hold inputs (2, 5, 4), (2, 1, 5, 5)", id="padding"),
    pytest.param(lambda: packed.document_block_mask(torch.zeros(100, dtype=torch.int32)),
                 "a packed length of 100 is not a multiple of the block (128): use packed_length", id="block-mask"),
    pytest.param(_dropout, "packed_cfg runs inference only (dropout 0)", id="packed-dropout"),
]


@pytest.mark.parametrize("call, message", REFUSALS)
def test_each_refusal_of_the_gpu_tier_says_what_is_wrong_in_these_words(call, message):
    with pytest.raises(ValueError) as refused:
        call()
    assert str(refused.value) == message


def test_a_failed_capture_is_logged_with_its_try_and_what_happens_next(caplog):
    model = Model()

    def broken(run, pool):
        raise RuntimeError("boom")

    graphed = graphs.install(model, devices=("cpu",), capture=broken)
    try:
        with caplog.at_level(logging.WARNING, logger="fastpath.gpu.graphs"), torch.inference_mode():
            for _ in range(graphs.CAPTURE_TRIES + 1):
                model.llm(**llm_call(5))
        said = [r.getMessage() for r in caplog.records if r.name == "fastpath.gpu.graphs"]
        key = graphed.captures[0][0]
        assert said == [f"cuda_graphs: capture 1/3 of {key} failed, running it eagerly, to be tried again: boom",
                        f"cuda_graphs: capture 2/3 of {key} failed, running it eagerly, to be tried again: boom",
                        f"cuda_graphs: capture 3/3 of {key} failed, it runs eagerly for good: boom"], said
        assert graphs.stats(model)["errors"] == ["RuntimeError: boom"] * 3
        assert graphed.passthrough == 0 and graphed.cache.stats.failures == 3
    finally:
        graphs.remove(model)


def test_a_setting_changed_since_apply_is_named_in_the_revert_warning(caplog):
    model = Model()
    now = bool(torch.backends.cudnn.benchmark)  # the patch set it to `not now`; someone set it back since
    model.__dict__[flags.FLAGS_ATTR] = flags.Record(device="cuda", changed={"cudnn_benchmark": (now, not now)})
    with caplog.at_level(logging.WARNING, logger="fastpath.gpu.flags"):
        assert flags.revert(model) == ["cudnn_benchmark"]
    assert [r.getMessage() for r in caplog.records] == [
        "cuda_tf32 revert: ['cudnn_benchmark'] changed since apply; left as they are now"]
    assert torch.backends.cudnn.benchmark is now and flags.FLAGS_ATTR not in model.__dict__


def test_past_the_compile_bound_the_warning_names_the_length_the_rung_the_bound_and_the_rungs_compiled(monkeypatch):
    monkeypatch.setattr(packed, "STATS", packed.FlexStats(compiles=packed.MAX_COMPILES, rungs={128, 512}))
    tensors = [torch.zeros(1, 2, 2048, 4)] * 3
    with pytest.warns(packed.EagerFlexWarning) as said:
        assert packed.admitted(1500, tensors, None, False) is False
    assert [str(w.message) for w in said] == [
        "packed_cfg: FlexAttention at packed length 1500 (rung 2048) runs eager, every score materialised: the "
        "compile bound is reached (6 compiles, fastpath.gpu.packed.MAX_COMPILES = 6; rungs compiled: [128, 512])"]


# --- the document block mask where torch's sort refuses bool ---------------------------------------------------------


def test_the_document_block_mask_sorts_no_bool_tensor(monkeypatch):
    """The wheel admits torch >= 2.4, whose CUDA sort refuses bool tensors before torch 2.6 ("Sort currently does
    not support bool dtype on CUDA"): the mask orders its blocks by sorting int8. A sort double that refuses bool
    as that one does builds the same mask as torch's own."""
    ids = packed.document_ids([100, 60, 200], 384, "cpu")
    expected = packed.document_block_mask(ids)
    argsort, sorted_ = torch.argsort, []

    def old_cuda_argsort(input, *args, **kwargs):
        sorted_.append(input.dtype)
        if input.dtype == torch.bool:
            raise RuntimeError("Sort currently does not support bool dtype on CUDA.")
        return argsort(input, *args, **kwargs)

    monkeypatch.setattr(torch, "argsort", old_cuda_argsort)
    ours = packed.document_block_mask(ids)
    monkeypatch.undo()
    assert sorted_ and torch.bool not in sorted_, sorted_
    assert torch.equal(ours.to_dense(), expected.to_dense())
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(ours, name), getattr(expected, name)), name

