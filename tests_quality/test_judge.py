"""The Whisper judge: identity, deterministic decoding, clear errors for a missing judge."""

from __future__ import annotations

import json

import pytest

from harness.run.installed import require_module
from harness.quality import judge as judge_mod
from harness.quality import wer

pytestmark = pytest.mark.quality


def test_identity_records_model_hash_compute_type_and_decoding(judge):
    ident = json.loads(judge.identity)
    assert ident["model_bin_sha256"] == judge_mod.file_sha256(judge.path / "model.bin")[:16]
    assert ident["compute_type"] == judge.compute_type
    d = ident["decode"]
    assert (d["language"], d["temperature"], d["condition_on_previous_text"], d["without_timestamps"],
            d["vad_filter"]) == ("en", 0.0, False, True, False), d
    assert isinstance(d["beam_size"], int)


@pytest.mark.parametrize("change", ["faster-whisper", "ctranslate2", "cpu isa", "CT2_FORCE_CPU_ISA"])
def test_identity_changes_with_the_engine_and_the_instruction_set(judge, monkeypatch, change):
    """The transcript cache is keyed by the identity: a new engine or another instruction set must not meet the
    transcripts cached under the old one."""
    from harness.run import machine

    before = judge_mod.judge_identity(judge.path, judge.compute_type)
    assert before == judge.identity
    if change in ("faster-whisper", "ctranslate2"):
        real = machine.package_version
        monkeypatch.setattr(machine, "package_version", lambda n: "99.0" if n == change else real(n))
    elif change == "cpu isa":
        real_isa = machine.cpu_isa
        monkeypatch.setattr(machine, "cpu_isa", lambda: {**real_isa(), "capability": "other"})
    else:
        monkeypatch.setenv("CT2_FORCE_CPU_ISA", "GENERIC")
    assert judge_mod.judge_identity(judge.path, judge.compute_type) != before, change


def test_transcribes_espeak_speech_deterministically(judge, dev_renders):
    clip = dev_renders[9]  # "The meeting was moved to the large room on the second floor."
    first = judge.transcribe(clip.wav, clip.sr)
    assert judge.transcribe(clip.wav, clip.sr) == first
    errors, words = wer.utterance_errors(clip.text, first)
    assert errors / words < 0.5, f"WER {errors}/{words} on {clip.text!r}: heard {first!r}"


def test_missing_judge_folder_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="FASTPATH_JUDGE"):
        judge_mod.resolve_judge(str(tmp_path / "no-such-judge"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="model.bin"):
        judge_mod.resolve_judge(str(tmp_path / "empty"))


def test_unknown_model_name_is_never_downloaded():
    require_module("faster_whisper", "pip install -e . --group quality")
    with pytest.raises(FileNotFoundError, match="local Hugging Face cache"):
        judge_mod.resolve_judge("fastpath-test/no-such-whisper")
