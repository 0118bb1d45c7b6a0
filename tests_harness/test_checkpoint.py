"""The test checkpoint: built through the real classes, loaded through the real loader, reproducible."""

from __future__ import annotations

import hashlib
import json

import pytest

from harness.model import checkpoint as ckpt


def digest_folder(folder) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "fastpath_recipe.json"
    }


def test_same_recipe_same_weights(tmp_path, torch_settings):
    """Also when the second build runs on one thread, as in a pytest-xdist worker of a 2-core machine: the codec's
    calibration follows the thread count, so the build uses the threads the process started with."""
    import torch

    a = ckpt.build_checkpoint("tiny", root=tmp_path / "a")
    torch.set_num_threads(1)  # put back by torch_settings
    b = ckpt.build_checkpoint("tiny", root=tmp_path / "b")
    assert torch.get_num_threads() == 1, "the build puts the test's thread count back"
    da, db = digest_folder(a), digest_folder(b)
    assert "model.safetensors" in da and "audio_tokenizer/model.safetensors" in da
    assert da == db, [k for k in da if da[k] != db.get(k)]


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
def test_other_seed_other_weights(tmp_path, monkeypatch):
    stock = ckpt.build_checkpoint("tiny")
    recipes = ckpt.load_recipes()
    recipes["tiny"] = dict(recipes["tiny"], seed=recipes["tiny"]["seed"] + 1)
    monkeypatch.setattr(ckpt, "load_recipes", lambda: recipes)
    other = ckpt.build_checkpoint("tiny", root=tmp_path)
    assert other.name != stock.name, "the key must follow the recipe"
    assert digest_folder(other)["model.safetensors"] != digest_folder(stock)["model.safetensors"]


def test_loaded_model_has_omnivoice_shape(model):
    at = model.audio_tokenizer.config
    assert at.frame_rate == 25 and at.hop_length == 960 and at.num_quantizers == 8
    assert model.config.num_audio_codebook == 8 and model.config.audio_mask_id == 1024
    assert model.sampling_rate == 24000
    assert type(model.llm).__name__ == "Qwen3Model"
    vocab = model.text_tokenizer.get_vocab()
    for token in ckpt.SPECIAL_TOKENS + ckpt.NONVERBAL_TAGS:
        assert token in vocab, f"{token} missing from the text tokenizer"
        ids = model.text_tokenizer(token, add_special_tokens=False).input_ids
        assert len(ids) == 1, f"{token} splits into {ids}"
    assert len(model.text_tokenizer) > model.config.audio_mask_id


def test_full_recipe_has_qwen3_0_6b_dimensions():
    llm = ckpt.load_recipes()["full"]["llm"]
    assert (llm["hidden_size"], llm["num_hidden_layers"], llm["num_attention_heads"], llm["num_key_value_heads"],
            llm["head_dim"], llm["intermediate_size"]) == (1024, 28, 16, 8, 128, 3072)


def test_cache_key_follows_versions(monkeypatch):
    key = ckpt.checkpoint_key("tiny")
    monkeypatch.setattr(ckpt, "_versions", lambda: {"omnivoice": "9.9.9"})
    assert ckpt.checkpoint_key("tiny") != key


def test_unknown_size_names_the_known_ones():
    with pytest.raises(ckpt.CheckpointError, match="tiny"):
        ckpt.checkpoint_key("huge")


def test_built_folder_records_its_recipe(checkpoint):
    if checkpoint.is_real:
        pytest.skip("the user's real checkpoint carries no fastpath recipe (nothing to check)")
    meta = json.loads((checkpoint.path / "fastpath_recipe.json").read_text())
    assert meta["key"] == ckpt.checkpoint_key(checkpoint.kind)
