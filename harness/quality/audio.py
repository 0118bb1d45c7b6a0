"""Audio as the judges take it: a clip of a set (`Clip`), 16 kHz mono (`to_judge_rate`), and the clips no judge
may hear (`check_clip`), refused by name before any judge sees them.

Every judge (Whisper for WER, GE2E for SIM, DNSMOS for MOS) returns a number for whatever it is given: an empty, a
one-sample and a silent clip all scored SIM 0.397; Whisper transcribes silence as "" (every word a deletion, a WER
verdict about nothing) and an all-NaN clip as a line of brackets after two minutes; DNSMOS crashes on an empty or a
non-finite clip. So a clip is checked first, and a bad one is refused: `BadAudio` (an error, from a judge or a set's
scoring) or `Refused` (the verdict of a set comparison, `evaluate.compare_sets`), each naming the clip, the defect,
the measured value and the limit.

The defects, in the order they are checked (the first found is reported):
  * empty, or not mono [T];
  * non-finite: any NaN or inf sample (a bf16 overflow gives an all-NaN clip);
  * too short for a judge: fewer samples at 16 kHz than MIN_SAMPLES[judge] (each floor with its source below);
  * silent: peak below SILENT_PEAK;
  * clipped: more than MAX_CLIPPED_FRACTION of the samples at |x| >= CLIP_LEVEL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Iterable, Sequence

import numpy as np

JUDGE_SR = 16000  # every judge's input rate (Whisper, GE2E and DNSMOS alike)

# The fewest samples at JUDGE_SR each judge judges, with its source; a judge given less pads or repeats the clip
# into audio it was not asked about. tests_quality/test_audio.py reads each from its library.
MIN_SAMPLES = {
    # Whisper (faster-whisper's FeatureExtractor): one STFT window, n_fft = 400 samples (25 ms). Whisper pads every
    # input with zeros to 30 s by design, so the window is its floor: below it no mel frame holds a whole window.
    "WER": 400,
    # resemblyzer's GE2E (VoiceEncoder.embed_utterance): a partial utterance is 160 mel frames of 10 ms (1.6 s,
    # hparams.partials_n_frames), and a zero-padded partial is kept only when min_coverage = 0.75 of it is audio:
    # 0.75 x 1.6 s = 1.2 s. A shorter clip's one partial would be more than a quarter padding.
    "SIM": 19200,
    # DNSMOS (speechmos): its P.808 model's mel frames are n_fft = frame_size + 1 = 321 samples (20 ms). A clip under
    # DNSMOS's 9.01 s window (INPUT_LENGTH) is tiled to fill it, as DNSMOS's own script does, so the window is no
    # floor (every sentence of the corpus is shorter); below one frame no mel frame holds a whole window of it.
    "MOS": 321,
}
WHY = {"WER": "Whisper's STFT window", "SIM": "0.75 of GE2E's 1.6 s partial utterance",
       "MOS": "DNSMOS's mel frame"}

# Silent: the loudest sample below -60 dBFS. Every judge rescales its input's level (DNSMOS to an RMS of -25 dBFS,
# resemblyzer up to -30 dBFS, Whisper's log-mel against its own loudest frame), so a clip with next to nothing in it
# reaches them as loud noise and is scored as if it were speech. 60 dB under full scale is the 5 lowest bits of a
# 16-bit clip; every espeak-ng render of the dev set peaks above 0.5 (tested: test_real_speech_is_never_refused).
SILENT_PEAK = 1e-3

# Clipped: more than 0.1% of the samples at |x| >= 0.999 (full scale less float rounding; a sample beyond +-1 counts,
# it clips when written). Speech scaled so that its peak is exactly full scale has a handful of samples there, and
# hard-clipped at twice that gain many: on the 180 espeak-ng renders of the dev set that test_audio.py checks, at most
# 0.003% and at least 0.27%; 0.1% lies between. A damage short of full scale (clipping at a third of the peak) is
# MOS's to hear, not a defect here.
CLIP_LEVEL = 0.999
MAX_CLIPPED_FRACTION = 1e-3


@dataclasses.dataclass(frozen=True)
class Clip:
    """One utterance of a set. wav: [T] float32 mono at sr; group: resampling block (the sentence id)."""

    id: str
    text: str
    wav: np.ndarray
    sr: int
    group: str
    seed: int | None = None
    language: str = "en"  # what the words are in: the WER judge decodes and scores in it

    @property
    def sha256(self) -> str:
        h = hashlib.sha256(np.ascontiguousarray(self.wav, dtype=np.float32).tobytes())
        h.update(str(self.sr).encode())
        return h.hexdigest()


def to_judge_rate(wav: np.ndarray, sr: int) -> np.ndarray:
    """[T] at sr -> [T'] float32 at 16 kHz (polyphase resampling, scipy.signal.resample_poly: T' = ceil(T 16000/sr))."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"judge expects mono [T] audio, got shape {wav.shape}")
    if sr != JUDGE_SR:
        from scipy.signal import resample_poly

        g = math.gcd(sr, JUDGE_SR)
        wav = resample_poly(wav, JUDGE_SR // g, sr // g).astype(np.float32)
    return wav


def judge_samples(n: int, sr: int) -> int:
    """How many samples a clip of n samples at sr has at 16 kHz (what to_judge_rate gives)."""
    g = math.gcd(sr, JUDGE_SR)
    return -(-n * (JUDGE_SR // g) // (sr // g))


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why a clip is refused: `name` says which clip ("clip h01#s3 (candidate)"), `defect` one of "empty",
    "not mono", "non-finite", "too short", "silent", "clipped"; `measured` and `limit` as printed."""

    name: str
    defect: str
    measured: str
    limit: str
    judge: str | None = None

    def format(self) -> str:
        what = f"too short for the {self.judge} judge" if self.defect == "too short" else self.defect
        return f"{self.name} is {what} ({self.measured}, limit {self.limit})"


def _judges(judge) -> tuple[str, ...]:
    judges = () if judge is None else (judge,) if isinstance(judge, str) else tuple(judge)
    unknown = [j for j in judges if j not in MIN_SAMPLES]
    if unknown:
        raise ValueError(f"unknown judge {unknown[0]!r}: choose among {tuple(MIN_SAMPLES)}")
    return judges


def check_clip(wave: np.ndarray, sr: int, judge: str | Iterable[str] | None = None,
               name: str = "the clip") -> Problem | None:
    """The first defect of one clip ([T] at sr) for `judge` ("WER", "SIM", "MOS", several, or None: no length
    floor), or None when every judge named may hear it."""
    judges = _judges(judge)
    x = np.asarray(wave)
    if x.ndim != 1:
        return Problem(name, "not mono", f"shape {x.shape}", "one dimension [T]")
    if x.size == 0:
        return Problem(name, "empty", "0 samples", str(max((MIN_SAMPLES[j] for j in judges), default=1)))
    bad = int(x.size - np.count_nonzero(np.isfinite(x)))
    if bad:
        return Problem(name, "non-finite", f"{bad} of {x.size} samples NaN or inf", "0")
    n16 = judge_samples(x.size, sr)
    for j in sorted(judges, key=lambda j: -MIN_SAMPLES[j]):  # the strictest floor first
        if n16 < MIN_SAMPLES[j]:
            return Problem(name, "too short", f"{n16} samples at 16 kHz", f"{MIN_SAMPLES[j]}: {WHY[j]}", j)
    level = np.abs(x.astype(np.float64))
    peak = float(level.max())
    if peak < SILENT_PEAK:
        return Problem(name, "silent", f"peak {peak:.3g}", f"{SILENT_PEAK:g}")
    clipped = float(np.mean(level >= CLIP_LEVEL))
    if clipped > MAX_CLIPPED_FRACTION:
        return Problem(name, "clipped", f"{100 * clipped:.2f}% of samples at |x| >= {CLIP_LEVEL}",
                       f"{100 * MAX_CLIPPED_FRACTION:g}%")
    return None


def check_clips(clips: Sequence[Clip], judge, side: str = "") -> list[Problem]:
    """Every clip's first defect for `judge`, each named "clip <id> (<side>)"."""
    suffix = f" ({side})" if side else ""
    return [p for c in clips if (p := check_clip(c.wav, c.sr, judge, f"clip {c.id}{suffix}")) is not None]


SHOWN = 5  # problems spelled out in an error's one line; a Refused verdict lists every one


class BadAudio(ValueError):
    """Clips no judge may hear, refused by name: `problems` says which, why, the measured value and the limit."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = tuple(problems)
        more = f"; and {len(self.problems) - SHOWN} more" if len(self.problems) > SHOWN else ""
        super().__init__("refused: bad audio: " + "; ".join(p.format() for p in self.problems[:SHOWN]) + more)


def refuse(problems: Sequence[Problem]) -> None:
    """Raise BadAudio when there is any problem."""
    if problems:
        raise BadAudio(problems)


def require(wave: np.ndarray, sr: int, judge: str, name: str = "the clip") -> None:
    """A judge's first line: raise BadAudio unless `judge` may hear this clip."""
    refuse([p] if (p := check_clip(wave, sr, judge, name)) is not None else [])


@dataclasses.dataclass(frozen=True)
class Refused:
    """The verdict of a set comparison with bad audio on either side: no judge heard either set, and it fails."""

    problems: tuple[Problem, ...]
    label: str = ""
    verdict: str = dataclasses.field(default="refused", init=False)
    seeds_needed: int | None = dataclasses.field(default=None, init=False)

    @property
    def passed(self) -> bool:
        return False

    def format(self) -> str:
        first = self.problems[0].format()
        more = f", and {len(self.problems) - 1} more clip(s)" if len(self.problems) > 1 else ""
        lines = [f"[REFUSED] {self.label or 'candidate'}: bad audio: {first}{more}",
                 "  in plain words: a clip no judge can score (empty, too short, silent, non-finite or clipped) was "
                 "refused before any judge heard either set; fix the generation, then rerun.",
                 *(f"  {p.format()}" for p in self.problems)]
        return "\n".join(lines)


def check_duration(wave: np.ndarray, sr: int, text: str, words_per_second: float = 2.7,
                   duration_factor: float = 2.5, name: str = "the clip") -> Problem | None:
    """A generation cut short or run on: the clip's duration outside [1/factor, factor] times the expected
    n_words / words_per_second. Not a judge's defect (WER hears missing words), a generator's: the real-checkpoint
    tier asserts it of every candidate clip."""
    words = len(text.split())
    expected = words / words_per_second
    duration = np.asarray(wave).size / sr
    low, high = expected / duration_factor, expected * duration_factor
    if low <= duration <= high:
        return None
    return Problem(name, f"of implausible duration for {words} words", f"{duration:.2f} s",
                   f"{low:.2f}-{high:.2f} s")
