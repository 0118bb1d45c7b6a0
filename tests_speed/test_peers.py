"""The public packages the bench times beside stock (harness.speed.bench.PEERS): omnivoice-tts-inference 0.1.0's own
model class as the `tts-inference` variant, the points it cannot run, and its claim of bit-identical output.

omnivoice-tts-inference says that with default settings its `generate(text)[0]` is upstream's, bit for bit (int16
PCM), for a single text without CR/LF, short or chunked, in fp16 on sdpa with the global RNG. Checked here against
stock omnivoice on the built test checkpoint, both loaded from the same folder and reseeded before each call: the
tokens of every unmasking pass (`torch.equal`), the float waveform (max |diff|) and the int16 PCM a WAV file holds
(soundfile's PCM_16, as a user saves it). The measured outcome is identity, so identity is asserted; a release that
breaks the claim fails here with the first difference.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from harness.model.checkpoint import load_model
from harness.run.installed import require_module
from harness.model.points import PARITY, load_points
from harness.speed import bench


@pytest.fixture(scope="module")
def tts_inference():
    return require_module("omnivoice_tts", f"the tts-inference peer is not installed: {bench.PEERS_INSTALL}")


def peer_model(checkpoint, dtype: str = "fp32"):
    return bench.load_peer_model("tts-inference", checkpoint, "cpu", dtype)


# --- the bench variant -----------------------------------------------------------------------------------------------


def test_tts_inference_runs_the_auto_voice_points_only():
    """No voice cloning in 0.1.0 (its codec loads decode-only) and one text per call: of the speed points it runs
    the auto-voice ones; every other point names why it is left out."""
    runs = {p.name for p in load_points("speed") if not bench.cannot_run("tts-inference@fp32", p.name)}
    assert runs == {p.name for p in load_points("speed") if p.voice == "auto"}, runs
    assert "no voice cloning" in bench.cannot_run("tts-inference@fp32", "clone3-short-32")
    assert not any(bench.cannot_run(v, p.name) for v in ("stock@fp32", "peer@fp32", "lossless@fp32")
                   for p in load_points("speed"))


def test_a_peer_that_cannot_run_a_point_is_not_the_base(capsys):
    """The first variant is what the others are compared with: a cloned point with tts-inference first is a usage
    error that says why, before any model loads."""
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--points", "clone3-short-32", "--variants", "tts-inference", "stock", "--rounds", "1"])
    assert exit_info.value.code == 2
    assert "no voice cloning" in capsys.readouterr().err


def test_a_missing_tts_inference_names_the_install(monkeypatch):
    from dataclasses import replace

    monkeypatch.setitem(bench.PEERS, "tts-inference",
                        replace(bench.PEERS["tts-inference"], module="omnivoice_tts_not_installed"))
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[peers\]'.*omnivoice-tts-inference==0\.1\.0"):
        bench.load_peer_model("tts-inference", None, "cpu", "fp32")


@pytest.mark.cpu
def test_bench_times_tts_inference_beside_stock_where_it_can(tts_inference, tmp_path, capsys):
    """Its own class, from the same folder: timed at the auto-voice point, "-" with the reason at the cloned one;
    its FLOPs equal stock's (the same upstream arithmetic, one padded batch of cond and uncond rows)."""
    out = tmp_path / "bench.json"
    assert bench.main(["--size", "tiny", "--points", "auto-short-10", "clone3-short-32", "--num-step", "2",
                       "--rounds", "1", "--variants", "stock", "tts-inference", "--bound", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert set(data["results"]["auto-short-10"]) == {"stock@fp32", "tts-inference@fp32"}
    assert set(data["results"]["clone3-short-32"]) == {"stock@fp32"}
    assert "clone3-short-32: tts-inference@fp32 not run: omnivoice-tts-inference==0.1.0 has no voice cloning" in printed
    row = next(line for line in printed.splitlines() if line.startswith("| clone3-short-32 |"))  # the RTF table's
    assert row.split(" | ")[2:5:2] == ["-", "-"], row  # its RTF and its speedup
    flops = data["flops"]["auto-short-10"]
    assert flops["tts-inference@fp32"] == flops["stock@fp32"] > 0, flops
    peer = data["results"]["auto-short-10"]["tts-inference@fp32"]
    assert peer["audio_seconds"] == data["results"]["auto-short-10"]["stock@fp32"]["audio_seconds"] > 0, peer


# --- its claim: bit-identical to upstream ----------------------------------------------------------------------------


def generation(model, seed: int = 0, **kwargs) -> dict:
    """Reseed, generate; the tokens of every unmasking pass (a chunked text has one per chunk) and the waveform."""
    from fastpath.instance import overridden

    tokens = []

    def recording(iterate):
        def record(task, gen_config, *rest):  # rest: omnivoice_tts's generator (None: the global RNG)
            out = iterate(task, gen_config, *rest)
            tokens.extend(t.clone() for t in out)
            return out

        return record

    with overridden(model, "_generate_iterative", recording):
        torch.manual_seed(seed)
        [audio] = model.generate(**kwargs)
    return {"tokens": tokens, "audio": np.asarray(audio, dtype=np.float32)}


def pcm16(audio: np.ndarray, rate: int) -> np.ndarray:
    """The int16 samples of a 16-bit WAV of `audio`, as soundfile writes and reads one."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    return soundfile.read(buffer, dtype="int16")[0]


def differences(stock: dict, peer: dict, rate: int) -> list:
    """Every way the two generations differ, with its size; empty when they are bit-identical."""
    found = []
    if len(stock["tokens"]) != len(peer["tokens"]):
        found.append(f"{len(stock['tokens'])} unmasking passes against {len(peer['tokens'])}")
    for i, (a, b) in enumerate(zip(stock["tokens"], peer["tokens"])):
        if a.shape != b.shape or not torch.equal(a, b):
            found.append(f"pass {i} tokens: shapes {tuple(a.shape)} {tuple(b.shape)}, "
                         f"{(a != b).sum().item() if a.shape == b.shape else 'all'} differ")
    if stock["audio"].shape != peer["audio"].shape:
        return found + [f"audio lengths {stock['audio'].shape} against {peer['audio'].shape}"]
    diff = np.abs(stock["audio"] - peer["audio"]).max(initial=0.0)
    if diff:
        found.append(f"float audio max |diff| {diff:.3g}")
    a, b = pcm16(stock["audio"], rate), pcm16(peer["audio"], rate)
    if not np.array_equal(a, b):
        found.append(f"int16 PCM max |diff| {np.abs(a.astype(np.int32) - b).max()} "
                     f"({np.count_nonzero(a != b)} of {a.size} samples)")
    return found


# Points of the parity tier inside the claim's scope (one text, no reference, no CR/LF), each with the generate
# settings it runs at here: the default config (32 steps, silence trimming on) where it is cheap on the tiny model,
# fewer steps where the point's path, not its step count, is what is checked.
CLAIM_CASES = [
    pytest.param("auto_voice", "fp32", {}, id="auto_voice-fp32-defaults"),
    pytest.param("voice_design", "fp32", {"num_step": 8}, id="voice_design-fp32"),
    # upstream's chunked path: a 40 s paragraph, four passes (about a minute of CPU here), so under --slow
    pytest.param("long_chunked", "fp32", {"num_step": 4}, id="long_chunked-fp32", marks=pytest.mark.slow),
    pytest.param("nonverbal_tag", "fp32", {"num_step": 8}, id="nonverbal_tag-fp32"),
    pytest.param("chinese", "fp32", {"num_step": 8}, id="chinese-fp32"),
    # the dtype the claim names (fp16 weights, fp32 RoPE buffers and codec): CPU half precision, slower, so 8 steps
    pytest.param("auto_voice", "fp16", {"num_step": 8}, id="auto_voice-fp16"),
]


@pytest.fixture(scope="module")
def peer_fp32(tts_inference, checkpoint):
    return peer_model(checkpoint)


@pytest.mark.cpu
@pytest.mark.parametrize("name, dtype, settings", CLAIM_CASES)
def test_tts_inference_is_bit_identical_to_stock(name, dtype, settings, model, peer_fp32, checkpoint):
    if dtype == "fp32":
        stock, peer = model, peer_fp32
    else:
        stock, peer = load_model(checkpoint, dtype=torch.float16), peer_model(checkpoint, dtype)
    kwargs = {**PARITY[name], **settings}
    first, second = generation(stock, **kwargs), generation(peer, **kwargs)
    assert first["tokens"] and first["audio"].size, "stock generated nothing"
    if name == "long_chunked":
        assert len(first["tokens"]) > 1, "the paragraph did not take the chunked path"
    problems = differences(first, second, stock.sampling_rate)
    assert not problems, f"omnivoice-tts-inference is not bit-identical to stock at {name} ({dtype}): {problems}"


def test_the_comparison_sees_a_one_sample_difference():
    """The check itself can fail: one int16 step in one sample, and one token, are both reported."""
    audio = np.linspace(-0.4, 0.4, 2400, dtype=np.float32)
    changed = audio.copy()
    changed[100] += 2 / 32767
    tokens = torch.arange(16).view(2, 8)
    other = tokens.clone()
    other[1, 3] = 0
    found = differences({"tokens": [tokens], "audio": audio}, {"tokens": [other], "audio": changed}, 24000)
    assert any("pass 0 tokens" in f and "1 differ" in f for f in found), found
    assert any(f.startswith("int16 PCM max |diff| 2 (1 of 2400") for f in found), found
