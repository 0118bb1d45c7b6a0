"""`copy.deepcopy` of a patched model: the copy carries the same patches, generates what the original does, and
reverts to stock on its own, leaving the original patched. CPU, tiny checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

import fastpath
from fastpath import prompt_cache
from fastpath.gpu import compiled, flags, graphs
from harness.parity.parity import compare_runs, record_generation
from harness.model.points import reference

pytestmark = pytest.mark.cpu
POINT = dict(text=["Hi there.", "This sentence is a little bit longer than the first one."], language="en",
             num_step=4, postprocess_output=False)
# every lossless patch, and GPU patches that install wrappers (inert on a CPU model, but on its instance)
STACK = list(fastpath.LOSSLESS) + ["cuda_graphs", "compiled_vocoder", "cuda_tf32"]
COMPILED_ON_CUDA = object()  # stands for the compiled decode a CUDA model's wrapper holds after its first call


def waveforms(model, seed: int = 0):
    """Everything a generate of POINT computes (harness.parity.parity.record_generation): logits, tokens, audio."""
    return record_generation(model, seed=seed, **POINT)


def same(candidate, stock) -> bool:
    return bool(stock.waveforms) and not compare_runs(stock, candidate)  # stock first: it splits batched calls


def instance_attributes(model) -> dict:
    """What patches put on instances: the model's own attributes, and those of the submodules they wrap."""
    return {"model": sorted(model.__dict__), "llm": sorted(model.llm.__dict__),
            "tokenizer": sorted(model.audio_tokenizer.__dict__), "attention": model.llm.config._attn_implementation}


@pytest.mark.slow  # about 20 s: beyond the default run's budget; .ci/run's controls stage runs it on every change
@pytest.mark.control
def test_deepcopy_of_a_patched_model_carries_its_patches_and_reverts_to_stock(model):
    stock, stock_state = waveforms(model), instance_attributes(model)
    audio, text = reference("ref_3s")
    fastpath.apply(model, STACK)
    try:
        model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
        model.__dict__[compiled.VOCODER_ATTR].compiled = COMPILED_ON_CUDA  # it calls the original's decode
        twin = copy.deepcopy(model)
        model.__dict__[compiled.VOCODER_ATTR].compiled = None
        assert fastpath.applied(twin) == fastpath.applied(model) == STACK
        assert same(waveforms(twin), stock), "the copy, patched, does not generate what stock does"
        assert prompt_cache.stats(twin)["entries"] == 1 and twin._fastpath_prompt_cache is not \
            model._fastpath_prompt_cache, "the copy's prompt cache is not its own copy"
        twin.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
        assert prompt_cache.stats(twin)["hits"] == 1 and prompt_cache.stats(model)["hits"] == 0
        assert twin.__dict__[graphs.GRAPHS_ATTR].llm is twin.llm, "the copy's graphs wrap the original's LLM"
        decode = twin.__dict__[compiled.VOCODER_ATTR]
        assert decode.tokenizer is twin.audio_tokenizer and decode.compiled is None, (
            "the copy's compiled decode is the original's")
        assert twin.__dict__[flags.FLAGS_ATTR]["changed"] == {}, "the copy would revert the original's settings"
        assert fastpath.revert(twin) == []
        assert instance_attributes(twin) == stock_state, "the reverted copy still carries patches"
        assert same(waveforms(twin), stock), "the reverted copy does not generate what stock does"
        assert fastpath.applied(model) == STACK and "_generate_iterative" in model.__dict__, (
            "reverting the copy reverted the original")
        assert same(waveforms(model), stock)
    finally:
        fastpath.revert(model)
    assert instance_attributes(model) == stock_state


def test_deepcopy_of_a_patched_model_is_its_own_without_generating(model):
    """The default run's share of the control above (no generation, a second or two): the copy carries the patches
    and its own copy of the voice-prompt cache, whose misses call the copy's own stock method, and it reverts to
    stock on its own."""
    stock_state = instance_attributes(model)
    audio, text = reference("ref_3s")
    fastpath.apply(model, STACK)
    try:
        prompt = model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
        twin = copy.deepcopy(model)
        assert fastpath.applied(twin) == STACK
        own, original = twin._fastpath_prompt_cache, model._fastpath_prompt_cache
        assert own is not original and own.original.__self__ is twin, "the copy's cache is the original's"
        again = twin.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
        assert prompt_cache.stats(twin)["hits"] == 1 and prompt_cache.stats(model)["hits"] == 0
        assert torch.equal(again.ref_audio_tokens, prompt.ref_audio_tokens)
        assert again.ref_audio_tokens.data_ptr() != prompt.ref_audio_tokens.data_ptr(), "the entry is shared"
        twin.create_voice_clone_prompt(ref_audio=audio, ref_text=text, preprocess_prompt=False)  # a miss
        assert prompt_cache.stats(twin)["misses"] == 2 and prompt_cache.stats(model)["misses"] == 1
        assert fastpath.revert(twin) == []
        assert instance_attributes(twin) == stock_state, "the reverted copy still carries patches"
        assert fastpath.applied(model) == STACK and "_generate_iterative" in model.__dict__, (
            "reverting the copy reverted the original")
    finally:
        fastpath.revert(model)
    assert instance_attributes(model) == stock_state


def test_deepcopy_of_a_stock_model_is_a_plain_copy(model):
    twin = copy.deepcopy(model)
    assert "__deepcopy__" not in model.__dict__ and "__deepcopy__" not in twin.__dict__
    assert fastpath.applied(twin) == []


def test_the_deepcopy_hook_is_installed_once_however_many_applies_and_removed_with_the_last_patch(model):
    try:
        fastpath.apply(model, fastpath.LOSSLESS[:1])
        hook = model.__dict__["__deepcopy__"]
        fastpath.apply(model, fastpath.LOSSLESS[1:2])
        assert model.__dict__["__deepcopy__"] is hook, "a second apply installed the copy hook again"
        fastpath.revert(model, fastpath.LOSSLESS[:1])  # one patch left: the hook stays for it
        assert model.__dict__["__deepcopy__"] is hook, "the hook went with a patch that was not the last"
        fastpath.revert(model, fastpath.LOSSLESS[1:2])
        assert "__deepcopy__" not in model.__dict__, "the last patch reverted left the copy hook"
    finally:
        fastpath.revert(model)
    assert "__deepcopy__" not in model.__dict__


def test_install_then_restore_puts_back_what_the_instance_had_under_that_name():
    """An attribute the instance had comes back, the first saved value kept over later installs; one it did not
    have is removed."""
    from fastpath import instance

    class Thing:
        pass

    thing = Thing()
    thing.kept = "own"
    instance.install(thing, "kept", "patched")
    instance.install(thing, "kept", "patched again")
    instance.install(thing, "new", "patched")
    assert (thing.kept, thing.new) == ("patched again", "patched")
    assert instance.installed(thing, "kept") and instance.installed(thing, "new")
    instance.restore(thing, "kept")
    instance.restore(thing, "new")
    assert thing.__dict__ == {"kept": "own"}
    assert not instance.installed(thing, "kept") and not instance.installed(thing, "new")
