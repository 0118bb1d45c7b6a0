"""The field's judges beside the offline defaults (--sim-judge: WavLMForXVector; --mos-judge: UTMOS22 strong), loaded
from local files only, with a message naming how to provide them. Their weights cannot reach this machine, so their
loading and scoring path runs on randomly initialised models of the same classes; their known answers need the real
weights (docs/quality.md). A verdict names the judge of every figure, and both sides of it are scored by that one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.quality import evaluate, mos, utmos, voice, wavlm
from harness.quality.audio import Clip

pytestmark = pytest.mark.quality


def clip(seconds: float, f0: float, seed: int = 0, sr: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(seed)
    x = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
    return (0.3 * x / np.abs(x).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


@pytest.fixture(scope="module")
def wavlm_folder(tmp_path_factory):
    """A randomly initialised WavLMForXVector (a small config of the class) saved as a real folder."""
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    torch.manual_seed(0)
    config = WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, tdnn_dim=(32, 32, 64),
                         tdnn_kernel=(5, 3, 1), tdnn_dilation=(1, 2, 1), xvector_output_dim=24, num_buckets=32,
                         max_bucket_distance=64)
    folder = tmp_path_factory.mktemp("wavlm-sv-random")
    WavLMForXVector(config).eval().save_pretrained(folder)
    Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, do_normalize=True).save_pretrained(folder)
    return folder


def test_the_wavlm_judge_loads_a_local_folder_and_scores(wavlm_folder):
    judge = voice.load_voice_judge(str(wavlm_folder))
    a, b = (clip(2.0, 110.0), 24000), (clip(2.0, 220.0, seed=1), 24000)
    same, other = judge.similarity(a, a), judge.similarity(a, b)
    assert same == pytest.approx(1.0, abs=1e-5) and -1.0 <= other <= 1.0 and other != pytest.approx(1.0, abs=1e-6)
    assert judge.similarity(a, b) == other  # cached by audio and identity: the same figure again
    ident = json.loads(judge.identity)
    assert ident["judge"] == "WavLMForXVector" and ident["model"] == wavlm_folder.name and ident["layers"] == 2


def test_a_missing_sim_judge_names_how_to_provide_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist .*--sim-judge"):
        voice.load_voice_judge(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json and weights .*save_pretrained"):
        wavlm.load(str(tmp_path / "empty"))


@pytest.fixture(scope="module")
def utmos_weights(tmp_path_factory):
    """A randomly initialised UTMOS22 strong model (utmos-pytorch's class, its own config) as a state-dict file."""
    import torch
    from utmos_pytorch.utmos_torch import UTMOSModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("utmos-random") / "utmos_state_dict.pt"
    torch.save(UTMOSModel().state_dict(), path)
    return path


@pytest.mark.slow  # a full-size wav2vec 2.0 base inside (95M parameters): .ci/run's controls stage
@pytest.mark.control
def test_the_utmos_judge_loads_strictly_and_scores(utmos_weights, tmp_path):
    import torch

    judge = mos.load_mos_judge(str(utmos_weights))
    got = judge.score(clip(2.0, 140.0), 24000)
    assert set(got) == {"utmos"} and np.isfinite(got["utmos"])
    assert judge.fields == (("UTMOS", "utmos", "UTMOS22 strong"),)
    assert json.loads(judge.identity)["judge"].startswith("UTMOS22 strong")
    foreign = tmp_path / "other.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), foreign)
    with pytest.raises(ValueError, match="is not a UTMOS22 strong state dict"):
        utmos.load(str(foreign))
    with pytest.raises(FileNotFoundError, match="--mos-judge"):
        mos.load_mos_judge(str(tmp_path / "missing.pt"))


def test_a_verdict_names_each_figures_judge_and_scores_both_sides_with_it(wavlm_folder, judge, mos_judge):
    """The SIM row is the WavLM judge's (its identity in the verdict), the MOS rows DNSMOS's; one judge object scores
    both sides, so no comparison mixes two judges."""
    sim_judge = voice.load_voice_judge(str(wavlm_folder))
    prompt = (clip(3.0, 120.0, seed=5), 24000)
    ref = [Clip(f"c{k}", "hello there", clip(2.0, 100.0 + 10 * k, seed=k), 24000, group=f"c{k}") for k in range(6)]
    out = evaluate.compare_sets(judge, ref, ref, label="same", prompt=prompt, voice_judge=sim_judge,
                                mos_judge=mos_judge)
    rows = {out.overall.metric(v): v for v in out.overall.verdicts}
    assert set(rows) == {"WER", "SIM", "MOS-OVRL", "MOS-P808"}
    assert rows["SIM"].judge == sim_judge.identity and rows["MOS-OVRL"].judge == mos_judge.identity
    assert np.array_equal(*out.scores["SIM"])  # the same clips on both sides: the same figures, by one judge
