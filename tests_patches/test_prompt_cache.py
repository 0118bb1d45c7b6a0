"""The voice-prompt cache: keyed by content, saved and loaded, refusing foreign files."""

from __future__ import annotations

import shutil

import pytest
import torch

import fastpath
from fastpath import prompt_cache
from harness.parity import REF_3S
from harness.points import reference

REF_6S = reference("ref_6s")


@pytest.fixture
def cached(model):
    fastpath.apply(model, "prompt_cache")
    yield model
    fastpath.revert(model)


def test_hits_on_same_content_misses_on_other(cached, tmp_path):
    cache = cached._fastpath_prompt_cache
    first = cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1])
    renamed = tmp_path / "renamed.wav"
    shutil.copy(REF_6S[0], renamed)
    again = cached.create_voice_clone_prompt(ref_audio=str(renamed), ref_text=REF_6S[1])
    assert again is first and (cache.hits, cache.misses) == (1, 1)
    cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1] + " extra")
    cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1], preprocess_prompt=False)
    cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    assert (cache.hits, cache.misses) == (1, 4)


def test_generate_with_ref_audio_goes_through_the_cache(cached):
    cached.generate(text="Hi.", language="en", ref_audio=REF_3S[0], ref_text=REF_3S[1], num_step=2)
    cached.generate(text="Hi again.", language="en", ref_audio=REF_3S[0], ref_text=REF_3S[1], num_step=2)
    assert cached._fastpath_prompt_cache.hits == 1


def test_waveform_key_covers_sample_rate():
    wave = torch.zeros(1, 2400)
    assert prompt_cache.audio_key((wave, 24000)) != prompt_cache.audio_key((wave, 16000))


def test_save_load_round_trip(cached, tmp_path, checkpoint):
    made = cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    path = tmp_path / "prompts.pt"
    prompt_cache.save(cached, path)
    from harness.checkpoint import load_model

    other = load_model(checkpoint)
    fastpath.apply(other, "prompt_cache")
    assert prompt_cache.load(other, path) == 1
    loaded = other.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    assert other._fastpath_prompt_cache.hits == 1
    assert torch.equal(loaded.ref_audio_tokens, made.ref_audio_tokens) and loaded.ref_rms == made.ref_rms


def test_load_refuses_corrupt_and_foreign_files(cached, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(prompt_cache.PromptCacheError, match="delete it and rebuild"):
        prompt_cache.load(cached, bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "something-else"}, foreign)
    with pytest.raises(prompt_cache.PromptCacheError, match="is not a"):
        prompt_cache.load(cached, foreign)
    cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    other_tok = tmp_path / "other.pt"
    prompt_cache.save(cached, other_tok)
    blob = torch.load(other_tok, weights_only=True)
    blob["tokenizer"] = "0" * 24
    torch.save(blob, other_tok)
    with pytest.raises(prompt_cache.PromptCacheError, match="another audio tokenizer"):
        prompt_cache.load(cached, other_tok)


def test_save_needs_the_patch(model, tmp_path):
    with pytest.raises(prompt_cache.PromptCacheError, match="fastpath.apply"):
        prompt_cache.save(model, tmp_path / "x.pt")
