"""`loop.lean_llm`, the packed forward restated into kept buffers, against the LLM's own forward on the same packed
inputs: the same bits, each GEMM on its own row count, and the LLM's own forward (with a warning) where the
installed transformers is not the source it restates. End to end the parity tier checks it through generate."""

from __future__ import annotations

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
            with GemmRows() as spy:
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
                                  "'own rows' case checks the fallback here")
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
