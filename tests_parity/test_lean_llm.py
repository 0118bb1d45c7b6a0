"""`loop.lean_llm`, the packed forward restated into kept buffers, against the LLM's own forward on the same packed
inputs: the same bits, each GEMM on its own row count, and the LLM's own forward (with a warning) where the
installed transformers is not the source it restates. End to end the parity tier checks it through generate."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastpath
from fastpath import loop
from harness.parity.parity import compare_runs, record_generation
from harness.run import strict


class GemmRows(TorchDispatchMode):
    """Records (rows, weight shape (N, K)) of every aten.mm."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.mm:
            self.seen.append((args[0].size(0), (args[1].size(1), args[1].size(0))))
        return func(*args, **(kwargs or {}))


def packed_inputs(model, c_lens, t_lens):
    C, V = model.config.num_audio_codebook, model.config.audio_vocab_size
    generator = torch.Generator().manual_seed(7)
    inputs = []
    for c, t in zip(c_lens, t_lens):
        ids = torch.randint(0, V - 1, (1, C, c), generator=generator)
        audio = torch.zeros(1, c, dtype=torch.bool)
        audio[0, c // 3 :] = True  # text, then audio positions, the targets last
        inputs.append({"input_ids": ids, "audio_mask": audio})
    offsets = torch.tensor([0, *t_lens[:-1]]).cumsum(0).tolist()
    return loop.packed_layout(model, inputs, c_lens, t_lens, offsets)


@pytest.mark.cpu
@pytest.mark.parametrize("extra", [0, 9], ids=["own rows", "down projection padded"])
def test_lean_llm_gives_the_llm_forwards_bits(model, extra):
    with fastpath.patched(model, ["trimmed_cfg"]), torch.no_grad():
        packed = packed_inputs(model, [40, 26], [12, 9])
        N = packed.input_ids.size(-1)
        down = tuple(model.llm.layers[0].mlp.down_proj.weight.shape)
        if extra:  # on top of what row_count asked for on this machine
            packed.gemm_rows = {**packed.gemm_rows, down: packed.gemm_rows.get(down, N) + extra}
        want = {tuple(w.shape): packed.gemm_rows.get(tuple(w.shape), N) for w in loop.llm_weights(model)}
        assert loop.lean_llm_misfit(model) == "", "lean_llm does not stand for the tiny checkpoint's LLM"
        embeds = model._prepare_embed_inputs(packed.input_ids, packed.audio_mask)
        with loop.padded_gemms(model, packed.gemm_rows, N):
            own = model.llm(inputs_embeds=embeds, attention_mask=packed.attention_mask, return_dict=True,
                            position_ids=packed.position_ids, fastpath_unpacking=packed.unpacking)[0]
        for step in range(2):  # the second reuses the layout's buffers
            with GemmRows() as spy, warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. torch's warning that an op resized a buffer of the wrong shape
                lean = loop.lean_llm(model, embeds, packed)
            assert torch.equal(lean, own), f"step {step}: lean_llm differs from the LLM's forward, max |diff| " \
                                           f"{(lean - own).abs().max().item()}"
            assert len(spy.seen) == 7 * len(model.llm.layers), "not one GEMM per projection and layer"
            rows = {shape: {n for n, s in spy.seen if s == shape} for _, shape in spy.seen}
            assert rows == {shape: {n} for shape, n in want.items()}, f"GEMM rows {rows}, asked for {want} (N = {N})"


@pytest.mark.cpu
@pytest.mark.parametrize("pad", [0, 3], ids=["own rows", "down projection padded"])
def test_a_changed_transformers_source_runs_the_llms_own_forward_and_says_so(model, monkeypatch, pad):
    """The fallback forward: the LLM's own, each GEMM padded to its row count (loop.padded_gemms). `pad` adds rows
    to the down projection's count, so the padding runs on this machine too (where no GEMM needs more rows than the
    forward's, the fallback has nothing to pad): exact wherever a GEMM row's bits do not depend on the row count."""
    name = "models.qwen3.modeling_qwen3:Qwen3MLP.forward"
    monkeypatch.setitem(loop.LEAN_SOURCES, name, "another")
    if pad:
        if not loop.gemm_rows_independent(model):
            strict.not_applicable("a GEMM padded beyond its row count", "exact only where a row's bits ignore the "
                                  "call's row count; this machine's do not (loop.gemm_rows_independent is False): the "
                                  "'own rows' case checks the fallback here; start Python with MKL_CBWR=AVX2,STRICT (or "
                                  "AUTO,STRICT) to make MKL's rows independent and run this case")
        found, down = loop.row_count, tuple(model.llm.layers[0].mlp.down_proj.weight.shape)
        monkeypatch.setattr(loop, "row_count", lambda weights, rows, count, least: (
            n if (n := found(weights, rows, count, least)) is None or tuple(weights[0].shape) != down
            else min(n + pad, count)))
    text = "A changed source still gives stock's bits."
    stock = record_generation(model, seed=0, text=text, num_step=4)
    with fastpath.patched(model, ["trimmed_cfg"]):
        patched = record_generation(model, seed=0, text=text, num_step=4)
        warnings = list(model.__dict__.get("_fastpath_warnings", []))
    assert any(name in w and "lean_llm" in w for w in warnings), warnings
    assert stock.steps and stock.decoded and stock.waveforms, "the stock run recorded nothing"
    problems = compare_runs(stock, patched)  # logits, tokens, decoded audio, waveform
    assert not problems, "the fallback forward is not bit-exact:\n  " + "\n  ".join(problems)


def test_the_misfit_names_every_changed_source(model, monkeypatch):
    """The reason lean_llm steps aside names each transformers function whose source changed, comma-separated."""
    names = ["models.qwen3.modeling_qwen3:Qwen3MLP.forward", "models.qwen3.modeling_qwen3:Qwen3Attention.forward"]
    for name in names:
        monkeypatch.setitem(loop.LEAN_SOURCES, name, "another")
    want = f"the installed transformers' {', '.join(n for n in loop.LEAN_SOURCES if n in names)} differ from 5.24.0's"
    with fastpath.patched(model, ["trimmed_cfg"]):  # its attention wrapper: the checks before the sources pass
        assert loop.lean_llm_misfit(model) == want


def test_a_source_that_cannot_be_read_counts_as_changed(model, monkeypatch):
    """transformers 5.25 turned apply_rotary_pos_emb into a kernels function object, whose source inspect cannot
    read: the check named it as changed instead of raising (the generate fell back to the LLM's own forward)."""
    from transformers.models.qwen3 import modeling_qwen3 as q3

    class Wrapped:  # a callable object without Python source, as the kernels hub's functions are
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *args, **kwargs):
            return self.fn(*args, **kwargs)

    name = "models.qwen3.modeling_qwen3:apply_rotary_pos_emb"
    monkeypatch.setattr(q3, "apply_rotary_pos_emb", Wrapped(q3.apply_rotary_pos_emb))
    loop.lean_sources.cache_clear()
    try:
        assert loop.lean_sources()[name] == "unreadable: TypeError"
        with fastpath.patched(model, ["trimmed_cfg"]):
            assert loop.lean_llm_misfit(model) == f"the installed transformers' {name} differ from 5.24.0's"
    finally:
        loop.lean_sources.cache_clear()  # the next caller reads the real sources again


# the keywords transformers 5.24.0's Qwen3Attention.forward gives the attention function itself (the rest of what
# reaches it, position_ids and use_cache, is the model forward's plumbing, which no attention function reads)
ATTENTION_KEYWORDS = ("dropout", "scaling", "sliding_window")


@pytest.mark.cpu
def test_lean_llm_gives_the_attention_the_keywords_the_llms_own_forward_gives_it(model, monkeypatch):
    """Every layer's attention call of lean_llm has the keywords (and values) that the LLM's own forward gives the same
    layer, the output buffer aside: a keyword it drops (sliding_window is None on these full-attention layers, so the
    values cannot show it) would leave that attention to its default."""
    calls, real = [], loop.unpacked_attention

    def spy(inner, module, *args, **kwargs):
        calls.append((module, {k: v for k, v in kwargs.items() if k != "out"}))
        return real(inner, module, *args, **kwargs)

    monkeypatch.setattr(loop, "unpacked_attention", spy)
    with fastpath.patched(model, ["trimmed_cfg"]), torch.no_grad():
        packed = packed_inputs(model, [40, 26], [12, 9])
        N = packed.input_ids.size(-1)
        embeds = model._prepare_embed_inputs(packed.input_ids, packed.audio_mask)
        with loop.padded_gemms(model, packed.gemm_rows, N):
            model.llm(inputs_embeds=embeds, attention_mask=packed.attention_mask, return_dict=True,
                      position_ids=packed.position_ids, fastpath_unpacking=packed.unpacking)
        own, calls[:] = list(calls), []
        loop.lean_llm(model, embeds, packed)
    layers = [layer.self_attn for layer in model.llm.layers]
    assert [module for module, _ in own] == [module for module, _ in calls] == layers, "not one call per layer"
    for (_, theirs), (_, mine) in zip(own, calls):
        assert set(ATTENTION_KEYWORDS) <= set(theirs), f"the LLM's forward gives the attention {sorted(theirs)}"
        assert mine == {k: theirs[k] for k in ATTENTION_KEYWORDS}, f"lean_llm gives {mine}, the LLM's forward {theirs}"


def gelu_mlp(llm, mp):  # a submodule, put back by hand (monkeypatch puts back only what the instance's __dict__ held)
    mlp, silu = llm.layers[1].mlp, llm.layers[1].mlp.act_fn
    mlp.act_fn = torch.nn.GELU()
    return lambda: setattr(mlp, "act_fn", silu)


MISFITS = [  # (what is changed on the tiny model's LLM, the reason lean_llm_misfit gives)
    pytest.param(gelu_mlp, "the LLM is a Qwen3Model, not transformers' Qwen3Model with silu MLPs", id="gelu-mlp"),
    pytest.param(lambda llm, mp: mp.setattr(llm.config, "attention_bias", True),
                 "the LLM's projections have biases", id="attention-bias"),
    pytest.param(lambda llm, mp: mp.setattr(llm.config, "mlp_bias", True, raising=False),
                 "the LLM's projections have biases", id="mlp-bias"),
    pytest.param(lambda llm, mp: mp.setattr(llm.config, "layer_types", ["full_attention", "sliding_attention"]),
                 "the LLM has sliding-window layers or runs attention through 'fastpath_padded_keys|sdpa'",
                 id="sliding-window"),
]


@pytest.mark.parametrize("change, why", MISFITS)
def test_lean_llm_steps_aside_for_an_llm_it_does_not_restate_and_says_why(model, monkeypatch, change, why):
    """Each check of lean_llm_misfit on the tiny model (trimmed_cfg's attention on), one thing changed: its reason,
    and lean_llm_fits says no and notes it once, word for word; unchanged, it fits and notes nothing."""
    with fastpath.patched(model, ["trimmed_cfg"]):
        embeds = torch.zeros(1, 4, model.llm.config.hidden_size)
        assert loop.lean_llm_misfit(model) == "" and loop.lean_llm_fits(model, embeds) is True
        assert not model.__dict__.get("_fastpath_warnings"), "a fitting LLM noted something"
        with monkeypatch.context() as mp:
            undo = None
            try:
                undo = change(model.llm, mp)
                assert loop.lean_llm_misfit(model) == why
                assert loop.lean_llm_fits(model, embeds) is False and loop.lean_llm_fits(model, embeds) is False
                assert model.__dict__.get("_fastpath_warnings") == [
                    f"trimmed_cfg runs the LLM's own forward, not fastpath.loop.lean_llm (same bits, slower on CPU): "
                    f"{why}. lean_llm restates transformers 5.24.0's Qwen3 (LEAN_SOURCES)."]
            finally:
                if undo:
                    undo()


def test_lean_llm_misfit_names_an_llm_of_another_class():
    stand_in = SimpleNamespace(llm=SimpleNamespace(config=None, layers=[]))
    assert loop.lean_llm_misfit(stand_in) == ("the LLM is a SimpleNamespace, not transformers' Qwen3Model with silu "
                                              "MLPs")


def test_the_attention_outside_fastpaths_wrapper_is_a_misfit(model):
    assert loop.lean_llm_misfit(model) == "the LLM has sliding-window layers or runs attention through 'sdpa'"


@pytest.mark.cpu
@pytest.mark.parametrize("layers", [2, 1], ids=["two-layers", "one-layer"])
def test_lean_llm_applies_every_norms_weight(model, layers):
    """The tiny checkpoint's RMSNorm weights are all 1, so a norm whose weight is dropped gives the same bits there:
    here a copy of its LLM with random norm weights (and its first `layers` layers), through lean_llm and through its
    own forward, gives the same bits, and other bits than the LLM with weights 1 (the control: the weights reach the
    output)."""
    with fastpath.patched(model, ["trimmed_cfg"]), torch.no_grad():
        llm = copy.deepcopy(model.llm)  # with trimmed_cfg's attention wrapper
        llm.layers = llm.layers[:layers]
        llm.config.num_hidden_layers, llm.config.layer_types = layers, llm.config.layer_types[:layers]
        plain = copy.deepcopy(llm)  # as many layers, its norm weights left at one: the control below
        generator = torch.Generator().manual_seed(11)
        norms = [p for name, p in llm.named_parameters() if name.endswith("norm.weight")]
        assert len(norms) == 4 * len(llm.layers) + 1 and all(bool((p == 1).all()) for p in norms)
        for p in norms:
            p.copy_(1 + 0.5 * torch.randn(p.shape, generator=generator))
        packed = packed_inputs(model, [40, 26], [12, 9])
        N = packed.input_ids.size(-1)
        embeds = model._prepare_embed_inputs(packed.input_ids, packed.audio_mask)
        stand_in = SimpleNamespace(llm=llm)
        with loop.padded_gemms(stand_in, packed.gemm_rows, N):
            own = llm(inputs_embeds=embeds, attention_mask=packed.attention_mask, return_dict=True,
                      position_ids=packed.position_ids, fastpath_unpacking=packed.unpacking)[0]
        lean = loop.lean_llm(stand_in, embeds, packed)
        ones = loop.lean_llm(SimpleNamespace(llm=plain), embeds, loop.Packed(**{**vars(packed), "buffers": {}}))
    assert torch.equal(lean, own), f"lean_llm differs from the LLM's forward, max |diff| {(lean - own).abs().max()}"
    assert not torch.equal(lean, ones), "the random norm weights changed nothing"


@pytest.mark.cpu
def test_lean_llm_does_not_stand_for_the_forward_in_another_dtype(model):
    """On the CPU in bfloat16 (a model cast to bf16) the LLM's own forward runs: lean_llm restates float32's, and says
    nothing, since nothing is wrong."""
    with fastpath.patched(model, ["trimmed_cfg"]):
        assert loop.lean_llm_fits(model, torch.zeros(1, 4, 64, dtype=torch.bfloat16)) is False
        assert loop.lean_llm_fits(model, torch.zeros(1, 4, 64)) is True
        assert not model.__dict__.get("_fastpath_warnings")


def test_the_row_probes_measure_one_weight_of_each_shape_of_the_first_layer(model):
    """llm_weights: layer 0's q_proj, k_proj (v_proj has its shape), gate_proj (up_proj has its shape) and down_proj;
    o_proj has q_proj's shape. The weights themselves, not copies."""
    attn, mlp = model.llm.layers[0].self_attn, model.llm.layers[0].mlp
    assert tuple(attn.o_proj.weight.shape) == tuple(attn.q_proj.weight.shape), "the tiny model's o_proj is square"
    got = loop.llm_weights(model)
    assert [id(w) for w in got] == [id(attn.q_proj.weight), id(attn.k_proj.weight), id(mlp.gate_proj.weight),
                                    id(mlp.down_proj.weight)]
