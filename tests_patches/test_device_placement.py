"""Where fastpath's tensors land: on the model's (or its audio tokenizer's) device, whatever torch's default device
is, and the packed layout's default heads. CPU tests of what CPU parity cannot see: on a CPU-only machine a tensor
made without `device=` lands on the CPU anyway, so every value is the same. Two ways to tell the devices apart here:

- torch's default-device context (`with torch.device("meta"):`): a factory call that names no device makes a meta
  tensor, one that names the model's device does not. Only where the code under test reads no tensor's values on
  the host (`unmask_batched` does not; `packed_layout` does, `.tolist()` of its segment starts, so the context
  cannot run it at all).
- a stand-in model whose device (or audio tokenizer's device) is `meta`, with the real model's config, weights and
  methods (`packed_layout` with documents reads only the config and the device; `prompt_cache.load` reads the
  tokenizer's config, weights and device). A stand-in changes nothing shared: no class or fixture is touched.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

import fastpath
from fastpath import loop, prompt_cache

META = torch.device("meta")
C_LENS, T_LENS = [40, 26], [12, 9]  # two rows of their own lengths; targets fewer than the packed positions
OFFSETS = [0, T_LENS[0]]


def packed_inputs(model, c_lens, device="cpu"):
    """Inputs as `_prepare_inference_inputs` gives them, of these lengths: random ids, text then audio positions."""
    C, V = model.config.num_audio_codebook, model.config.audio_vocab_size
    generator = torch.Generator().manual_seed(7)
    inputs = []
    for c in c_lens:
        ids = torch.randint(0, V - 1, (1, C, c), generator=generator)
        audio = torch.zeros(1, c, dtype=torch.bool)
        audio[0, c // 3 :] = True
        inputs.append({"input_ids": ids.to(device), "audio_mask": audio.to(device)})
    return inputs


def packed_tensors(packed: loop.Packed) -> dict:
    """Every tensor of a Packed layout, by field name (the documents' segment ids as `documents.ids`)."""
    tensors = {name: value for name, value in vars(packed).items() if isinstance(value, torch.Tensor)}
    if packed.documents is not None:
        tensors["documents.ids"] = packed.documents.ids
    return tensors


# --- packed_layout ---------------------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_packed_cfg_layout_lands_on_the_models_device(model):
    """packed_layout with documents (packed_cfg's layout), for a model on `meta`: every tensor of the layout, the
    [1, 1, 1, 1] attention-mask placeholder included, is on the model's device. Kills a change that makes the
    placeholder mask with no device (`device=None`): it would land on the CPU, beside the model's other inputs on
    the GPU. (torch's default-device context cannot show it: packed_layout reads its segment starts on the host.)"""
    on_meta = types.SimpleNamespace(config=model.config, device=META)  # all the documents branch reads of a model
    packed = loop.packed_layout(on_meta, packed_inputs(model, C_LENS, META), C_LENS, T_LENS, OFFSETS,
                                documents=True)
    assert packed.attention_mask.shape == (1, 1, 1, 1), "packed_cfg's mask is a placeholder"
    elsewhere = {name: t.device for name, t in packed_tensors(packed).items() if t.device != META}
    assert not elsewhere, f"tensors of the layout not on the model's device (meta): {elsewhere}"


@pytest.mark.cpu
def test_packed_layout_runs_the_heads_on_every_position_by_default(model):
    """A direct call of packed_layout without `sliced_heads` (as tests_parity/test_lean_llm.py and test_batched.py
    make): the heads' GEMM covers every packed position (head_rows >= N), not only the 2 x sum(t_lens) target frames
    (fewer than N here) that sliced_heads keeps. Checked in packed_cfg's layout (machine-independent counts: N is
    the rows rounded up to the block, and nothing is measured) and in stock's (row_count's counts, where this
    machine has one). Kills a change of the default to sliced_heads=True."""
    inputs, targets = packed_inputs(model, C_LENS), 2 * sum(T_LENS)
    documents = loop.packed_layout(model, inputs, C_LENS, T_LENS, OFFSETS, documents=True)
    N = documents.input_ids.size(-1)
    assert targets < N, "the test needs fewer target frames than positions to tell the two apart"
    assert documents.head_rows == N, f"packed_cfg's layout: heads on {documents.head_rows} rows, not all {N} positions"
    stock = loop.packed_layout(model, inputs, C_LENS, T_LENS, OFFSETS)
    if stock is not None:  # None where no row count gives stock's bits on this machine (the check above still runs)
        N = stock.input_ids.size(-1)
        assert stock.head_rows >= N > targets, f"stock's layout: heads on {stock.head_rows} rows, fewer than {N}"
    sliced = loop.packed_layout(model, inputs, C_LENS, T_LENS, OFFSETS, sliced_heads=True, documents=True)
    assert sliced.head_rows == targets, "control: sliced_heads keeps only the target frames"


# --- unmask_batched --------------------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_per_item_draws_land_on_the_tokens_device(model, monkeypatch):
    """unmask_batched's draw off the CPU (one torch.rand per active item, ONE_DRAW_DEVICES emptied so the CPU takes
    it), run inside torch's default-device context `meta`: the same tokens as outside it, each draw made on the
    tokens' device. Kills a change that drops `device=device` from the per-item torch.rand: its numbers would come
    from the default device (meta here: no values; on a GPU run, the CPU generator, beside GPU scores)."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    monkeypatch.setattr(loop, "ONE_DRAW_DEVICES", ())
    C, V, mask_id = model.config.num_audio_codebook, model.config.audio_vocab_size, model.config.audio_mask_id
    config = OmniVoiceGenerationConfig()
    assert config.position_temperature > 0, "the draw runs only with position noise"
    tokens = torch.full((len(T_LENS), C, max(T_LENS)), mask_id)
    logits = torch.randn(2, C, sum(T_LENS), V, generator=torch.Generator().manual_seed(3))
    layer_ids = torch.arange(C).view(1, -1, 1)

    def unmask(seed, default_device=None):
        out = tokens.clone()
        torch.manual_seed(seed)  # the guard puts the RNG back after the test
        with torch.device(default_device) if default_device else contextlib.nullcontext():
            loop.unmask_batched(model, out, logits, [5, 4], T_LENS, OFFSETS, config, layer_ids)
        return out

    want = unmask(0)
    assert not torch.equal(want, unmask(1)), "control: the draw does not decide which frames are unmasked"
    try:
        got = unmask(0, "meta")
    except RuntimeError as err:  # a tensor made on the default device met the tokens' (CPU) ones
        pytest.fail(f"under the default device meta, unmask_batched mixed devices: a draw left the tokens' device "
                    f"({err})")
    assert got.device == tokens.device, f"tokens moved to {got.device}"
    assert torch.equal(got, want), "under the default device meta, other frames were unmasked: a draw left the CPU"


# --- prompt_cache.load -----------------------------------------------------------------------------------------------


class TokenizerOn:
    """The model's audio tokenizer (its config and weights: the same tokenizer identity) reporting another device."""

    def __init__(self, tokenizer, device):
        self.config, self.state_dict, self.device = tokenizer.config, tokenizer.state_dict, device


@pytest.mark.cpu
def test_loaded_prompts_land_on_the_tokenizers_device(model, tmp_path):
    """A cache saved by the model, loaded into the same model whose audio tokenizer is on `meta` (a stand-in with
    the real tokenizer's config and weights, so the file's tokenizer identity matches): the loaded prompt's tokens
    are on the tokenizer's device (int64), where the prompts the tokenizer encodes are. Kills a change that leaves
    the loaded tokens where torch.load put them (`device = None` instead of the tokenizer's device: on the CPU)."""
    from omnivoice.models.omnivoice import VoiceClonePrompt

    C = model.config.num_audio_codebook
    key = prompt_cache.prompt_key((torch.zeros(1, 2400), 24000), "Hello.", True)
    tokens = torch.randint(0, 1000, (C, 25), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    path = tmp_path / "prompts.pt"
    with fastpath.patched(model, "prompt_cache"):
        model._fastpath_prompt_cache.put(key, VoiceClonePrompt(ref_audio_tokens=tokens, ref_text="Hello.",
                                                               ref_rms=0.1))
        prompt_cache.save(model, path)
    on_meta = types.SimpleNamespace(config=model.config, audio_tokenizer=TokenizerOn(model.audio_tokenizer, META))
    on_meta.__dict__[prompt_cache.CACHE_ATTR] = prompt_cache.PromptCache(original=None)
    assert prompt_cache.load(on_meta, path) == 1
    loaded = prompt_cache._cache_of(on_meta).entries[key].ref_audio_tokens
    assert (loaded.device, loaded.dtype, tuple(loaded.shape)) == (META, torch.long, (C, 25)), (
        f"loaded tokens on {loaded.device} ({loaded.dtype}), the tokenizer is on meta")
