"""The speaker-similarity judge: resemblyzer's GE2E speaker encoder (weights in its wheel), recorded identity.

SIM of two clips is the cosine of their utterance embeddings (256 values, L2-normalised, non-negative: unrelated
audio still scores about 0.5, white noise against speech 0.51). Not the model papers report (WavLM-ECAPA): the
numbers are GE2E cosines, comparable only with each other. Clips are resampled to 16 kHz by scipy, then go
through resemblyzer's own preprocessing (volume normalisation, long silences trimmed by webrtcvad). A clip that is
empty, under 1.2 s (audio.MIN_SAMPLES["SIM"]), silent, non-finite or clipped is refused before it is embedded
(audio.BadAudio), so the prompt's audio, every clip (and in auto voice each half) and every stream chunk must be one
the encoder can judge.

Per clip of a set (`sim_scores`):
  * cloned voice: SIM of the clip to the voice prompt's audio (the voice it was asked for);
  * auto voice (no prompt): the reference run's clip of the same item and seed is the voice to keep. Its second
    half is the anchor; a clip's score is SIM(its first half, the anchor), the reference's own first half included,
    so both sides compare the same words with the same anchor and an equivalent candidate scores what the
    reference does (a clip against itself would score 1.0 and leave nothing to compare with).

A stream keeps its voice (`seam_check`): SIM between consecutive chunks of one stream, refused below
SEAM_FLOOR at any seam (auto voice can change between chunks; measured in `fastpath-suite audit known-answer --metric
stream`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from . import audio
from .audio import JUDGE_SR, Clip, to_judge_rate
from .cache import cached_array
from .judge import file_sha256

# The lowest SIM between consecutive chunks of one stream that still counts as one voice, and why: on espeak-ng
# streams of three sentences in one voice (rate and pitch jittered per chunk), the lowest seam of 40 streams was
# 0.843; a switch to a female voice at a seam scored at most 0.743, a switch to another male variant 0.655-0.898
# (espeak's m1 and m3 are near one voice to GE2E: 0.85-0.90). 0.80 refuses none of the one-voice streams, every
# switch of sex, and about four in five switches between male variants (docs/results.md, "stream-voice").
SEAM_FLOOR = 0.80


@dataclasses.dataclass
class VoiceJudge:
    """A loaded GE2E encoder; `identity` is recorded in every result it produces and keys its cache."""

    encoder: object
    identity: str

    def embed(self, wav: np.ndarray, sr: int) -> np.ndarray:
        """[T] at sr -> [256] float32, L2-normalised (cached on disk by audio and identity); bad audio is refused
        (audio.BadAudio)."""
        audio.require(wav, sr, "SIM")
        wav16 = to_judge_rate(wav, sr)

        def compute() -> np.ndarray:
            from resemblyzer import preprocess_wav

            trimmed = preprocess_wav(wav16)  # already at the encoder's 16 kHz: no resampling inside
            if trimmed.size == 0:  # nothing webrtcvad calls voiced (above the silence floor all the same): all of it
                trimmed = wav16
            return np.asarray(self.encoder.embed_utterance(trimmed), dtype=np.float32)

        return cached_array("voice", wav16.tobytes() + self.identity.encode(), compute)

    def similarity(self, a: tuple[np.ndarray, int], b: tuple[np.ndarray, int]) -> float:
        """SIM of two (wav, sr) clips: the cosine of their embeddings."""
        return float(np.dot(self.embed(*a), self.embed(*b)))


def weights_path() -> Path:
    try:
        import resemblyzer
    except ImportError as e:
        raise ImportError(
            "the speaker-similarity judge is missing: bash scripts/install.sh (pip install --no-deps "
            "resemblyzer==0.1.4 webrtcvad-wheels librosa; resemblyzer's own webrtcvad dependency does not build)"
        ) from e
    path = Path(resemblyzer.__file__).parent / "pretrained.pt"
    if not path.is_file():
        raise FileNotFoundError(f"resemblyzer's weights {path} are missing: reinstall it (bash scripts/install.sh)")
    return path


def identity() -> str:
    from harness.run import machine

    path = weights_path()
    return json.dumps({"judge": "resemblyzer GE2E", "resemblyzer": machine.package_version("resemblyzer"),
                       "weights_sha256": file_sha256(path)[:16], "input_sr": JUDGE_SR,
                       "cpu_isa": machine.isa_tag(machine.cpu_isa()),  # the kernels, hence the last bits, follow it
                       "engine": {n: machine.package_version(n) for n in ("torch", "librosa", "webrtcvad-wheels")}},
                      sort_keys=True)


def load_voice_judge(name: str | None = None):
    """The SIM judge: `name` (or env FASTPATH_SIM_JUDGE) a WavLMForXVector folder (harness.quality.wavlm), else GE2E."""
    import os

    from . import wavlm

    name = name or os.environ.get(wavlm.ENV) or None
    return wavlm.load(name) if name else load_ge2e()


@functools.lru_cache(maxsize=1)
def load_ge2e() -> VoiceJudge:
    """The encoder on CPU (once per process: its first embedding warms librosa up, about 3 s; on a new install
    numba compiles librosa's kernels first, about 30 s, which scripts/install.sh does once)."""
    ident = identity()
    from resemblyzer import VoiceEncoder

    return VoiceJudge(VoiceEncoder("cpu", verbose=False), ident)


def halves(wav: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mid = wav.size // 2
    return wav[:mid], wav[mid:]


Prompt = tuple  # (wav [T], sr): a voice prompt's audio


def per_clip(prompt: Prompt | list[Prompt], n: int) -> list[Prompt]:
    """One prompt for each of n clips: `prompt` for all of them, or a list of one per clip (an evaluation set's
    items, each cloned from its own prompt)."""
    if isinstance(prompt, list):
        if len(prompt) != n:
            raise ValueError(f"{len(prompt)} voice prompts for {n} clips: give one per clip, or one for all")
        return prompt
    return [prompt] * n


def sim_problems(ref: Sequence[Clip], cand: Sequence[Clip],
                 prompt: Prompt | list[Prompt] | None = None) -> list[audio.Problem]:
    """What `sim_scores` would give the judge that it must not hear, by name: with a prompt (one, or one per clip),
    its audio and every clip; in auto voice, both halves of each reference clip and the first half of each candidate
    clip."""
    if prompt is not None:
        if isinstance(prompt, list):
            parts = [(f"the voice prompt of clip {c.id}", *p) for c, p in zip(ref, per_clip(prompt, len(ref)))]
        else:
            parts = [("the voice prompt's audio", *prompt)]
        parts += [(f"clip {c.id} ({side})", c.wav, c.sr) for side, clips in (("reference", ref), ("candidate", cand))
                  for c in clips]
    else:
        parts = [(f"clip {r.id} (reference), {which} half", half, r.sr) for r in ref
                 for which, half in zip(("first", "second"), halves(np.asarray(r.wav)))]
        parts += [(f"clip {c.id} (candidate), first half", halves(np.asarray(c.wav))[0], c.sr) for c in cand]
    return [p for name, wav, sr in parts if (p := audio.check_clip(wav, sr, "SIM", name)) is not None]


def sim_scores(judge: VoiceJudge, ref: Sequence[Clip], cand: Sequence[Clip],
               prompt: Prompt | list[Prompt] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(SIM of every reference clip [N], of every candidate clip [N]), paired by position (module docstring: to the
    prompt's audio when cloned, each clip to its own prompt when given one per clip, to the reference clip's second
    half in auto voice)."""
    if [c.id for c in ref] != [c.id for c in cand]:
        raise ValueError("reference and candidate clips are not paired: ids differ or are in another order")
    audio.refuse(sim_problems(ref, cand, prompt))
    if prompt is not None:
        prompts = per_clip(prompt, len(ref))
        return (np.array([judge.similarity((c.wav, c.sr), p) for c, p in zip(ref, prompts)]),
                np.array([judge.similarity((c.wav, c.sr), p) for c, p in zip(cand, prompts)]))
    ref_s, cand_s = [], []
    for r, c in zip(ref, cand):
        anchor = (halves(r.wav)[1], r.sr)
        ref_s.append(judge.similarity((halves(r.wav)[0], r.sr), anchor))
        cand_s.append(judge.similarity((halves(c.wav)[0], c.sr), anchor))
    return np.array(ref_s), np.array(cand_s)


@dataclasses.dataclass(frozen=True)
class SeamCheck:
    """SIM at each seam of one stream (chunk k against chunk k+1) and the verdict against SEAM_FLOOR."""

    seams: tuple[float, ...]
    floor: float

    @property
    def passed(self) -> bool:
        return all(s >= self.floor for s in self.seams)

    def format(self) -> str:
        cells = ", ".join(f"{s:.3f}" + ("  <- VOICE CHANGED" if s < self.floor else "") for s in self.seams)
        return (f"[{'PASS' if self.passed else 'FAIL'}] stream keeps its voice: SIM between consecutive chunks "
                f"(GE2E cosine, refused below {self.floor:.2f}): {cells}")


def seam_check(judge: VoiceJudge, chunks: Sequence[np.ndarray], sr: int, floor: float = SEAM_FLOOR) -> SeamCheck:
    """SIM between consecutive chunks of one stream ([T_k] arrays at sr); fewer than 2 chunks have no seam. A bad
    chunk (audio.check_clip for SIM: under 1.2 s, silent, ...) is refused by its number (audio.BadAudio)."""
    audio.refuse([p for k, c in enumerate(chunks) if (p := audio.check_clip(c, sr, "SIM", f"chunk {k + 1} of the "
                                                                                       "stream")) is not None])
    return SeamCheck(tuple(judge.similarity((a, sr), (b, sr)) for a, b in zip(chunks, chunks[1:])), floor)
