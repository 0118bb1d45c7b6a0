"""The test checkpoint's codec carries information: other audio encodes to other codes, other codes decode to other
audio, every codebook matters, near its frame (harness.model.codec). Without its calibration a seeded codec quantizes
every frame to entry 0 and decodes every code to the same waveform, and every audio comparison downstream compares
only lengths and volumes. Runs on any checkpoint: a real one must pass as well.
"""

from __future__ import annotations

import pytest

from harness.model import codec
from harness.model import checkpoint as ckpt

# Bounds, each far from what the calibrated tiny codec measures (fastpath-suite codec; docs/results.md) and from
# what an uncalibrated one gives (1 entry; agreement 1.0; decodes 0.0 apart).
MIN_DISTINCT_SHARE = 0.5  # distinct entries a clip's codes use, per codebook, as a share of its frames (measured >= 0.89)
MAX_AGREEMENT = 0.1  # share of frames where two different clips have the same code, per codebook (measured <= 0.014)
DECODE_RMS = (0.01, 1.0)  # decoded level of random codes: audible, unclipped (measured 0.105-0.108)
MIN_APART = 0.05  # max |diff| between the decodes of different random codes (measured 0.66)
MIN_NEAR = 0.01  # max |diff| within a frame of one changed code, per codebook (measured 0.31-0.47)
MAX_REACH = 16  # frames from the changed code where the audio may move: the decoder's receptive field (measured 10)


@pytest.fixture(scope="module")
def figures(model):
    found = codec.measure(model)
    print(codec.describe(found))
    return found


@pytest.mark.cpu
def test_other_audio_other_codes(figures):
    for name, counts in figures["distinct"].items():
        frames = figures["frames"][name]
        low = [k for k, c in enumerate(counts) if c < MIN_DISTINCT_SHARE * frames]
        assert not low, f"{name}: codebooks {low} use {[counts[k] for k in low]} entries over {frames} frames"
    for pair, shares in figures["agreement"].items():
        high = {k: round(s, 3) for k, s in enumerate(shares) if s > MAX_AGREEMENT}
        assert not high, f"{pair}: codebooks agree frame by frame at {high} (different audio, same codes)"


@pytest.mark.cpu
def test_other_codes_other_audio(figures):
    low, high = DECODE_RMS
    assert all(low <= r <= high for r in figures["decode_rms"]), f"decoded RMS {figures['decode_rms']}"
    assert figures["decodes_apart"] >= MIN_APART, (
        f"the decodes of three random code tensors are max |diff| {figures['decodes_apart']:.3g} apart")


@pytest.mark.cpu
def test_every_codebook_moves_the_audio_near_its_frame(figures):
    for k, moved in enumerate(figures["one_code"]):
        assert moved["near"] >= MIN_NEAR, f"codebook {k}: one code changed at frame {codec.FRAME} moves the audio " \
                                          f"near it by {moved['near']:.3g}"
        assert moved["reach_frames"] is not None and moved["reach_frames"] <= MAX_REACH, (
            f"codebook {k}: one code changed at frame {codec.FRAME} moved audio {moved['reach_frames']} frames away")


def test_calibration_rescales_to_unit_std_in_execution_order():
    """scale_layers on a known stack: each layer's weight term (output minus bias) ends at std 1 (the last at its
    target), whatever the weights it started with, and the layers after it see the rescaled input."""
    import torch

    torch.manual_seed(0)
    stack = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.Tanh(), torch.nn.Conv1d(4, 4, 3),
                                torch.nn.Conv1d(4, 1, 1)).double()
    with torch.no_grad():
        for layer in stack[::2]:
            layer.weight.mul_(0.01)
    x = torch.randn(8, 2, 200, dtype=torch.float64)
    kept = codec.scale_layers(stack, lambda: stack(x), last=stack[3], last_std=0.1, keep=stack[2])
    def weight_term(layers, layer):
        return (layers(x) - layer.bias.view(1, -1, 1)).std().item()

    with torch.no_grad():
        assert weight_term(stack[:1], stack[0]) == pytest.approx(1.0, rel=1e-9)
        assert weight_term(stack[:3], stack[2]) == pytest.approx(1.0, rel=1e-9)
        assert weight_term(stack, stack[3]) == pytest.approx(0.1, rel=1e-9)
        assert torch.allclose(kept, stack[:3](x), rtol=1e-12), "the kept output is not the rescaled layer's"


def test_a_recipe_without_its_codec_section_is_refused(tmp_path, monkeypatch):
    recipes = ckpt.load_recipes()
    recipes["tiny"] = {k: v for k, v in recipes["tiny"].items() if k != "codec"}
    monkeypatch.setattr(ckpt, "load_recipes", lambda: recipes)
    with pytest.raises(ckpt.CheckpointError, match="no 'codec' section"):
        ckpt.build_checkpoint("tiny", root=tmp_path)


def test_key_follows_the_codec_recipe_and_the_builder_code(monkeypatch):
    """A checkpoint cached under another codec recipe, or built by other code, is never reused."""
    key = ckpt.checkpoint_key("tiny")
    recipes = ckpt.load_recipes()
    other = dict(recipes, tiny=dict(recipes["tiny"], codec=dict(recipes["tiny"]["codec"], output_rms=0.2)))
    monkeypatch.setattr(ckpt, "load_recipes", lambda: other)
    assert ckpt.checkpoint_key("tiny") != key
    monkeypatch.setattr(ckpt, "load_recipes", lambda: recipes)
    assert ckpt.checkpoint_key("tiny") == key
    source = ckpt._builder_source()
    monkeypatch.setattr(ckpt, "_builder_source", lambda: source.replace("output_rms", "output_level"))
    assert ckpt.checkpoint_key("tiny") != key
