"""Real speech without a TTS checkpoint: espeak-ng renders of the corpus, randomised realisations, and
controlled damage (words dropped from the text, last words cut from the audio).

A realisation is drawn per (sentence, seed): voice variant, speaking rate and pitch, so two seeds give two
different, equally good renders of a set, as two seeds of a TTS model do. Renders are cached under
<cache>/espeak/ keyed by text, voice, rate, pitch and the espeak-ng version.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import shutil
import subprocess

import numpy as np
import soundfile as sf

from .cache import atomic_write, cache_dir

ESPEAK = "espeak-ng"


@functools.lru_cache(maxsize=1)
def espeak_version() -> str:
    if shutil.which(ESPEAK) is None:
        raise FileNotFoundError(f"{ESPEAK} is not on PATH: apt-get install -y espeak-ng")
    out = subprocess.run([ESPEAK, "--version"], check=True, capture_output=True, text=True).stdout
    return out.split("Data at")[0].strip()


def render(text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50) -> tuple[np.ndarray, int]:
    """text -> ([T] float32 in [-1, 1], sample rate) via `espeak-ng -v voice -s rate -p pitch`, cached on disk."""
    key = json.dumps({"text": text, "voice": voice, "rate": rate, "pitch": pitch, "espeak": espeak_version()},
                     sort_keys=True)
    path = cache_dir("espeak") / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".wav")
    if not path.exists():
        # --stdout and --stdin: no temp file of espeak's own, and text starting with '-' is not an option
        wav_bytes = subprocess.run(
            [ESPEAK, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", "--stdin"],
            input=text.encode(), check=True, capture_output=True,
        ).stdout
        wav, sr = sf.read(io.BytesIO(wav_bytes), dtype="float32")
        atomic_write(path, lambda f: sf.write(f, wav, sr, format="WAV", subtype="PCM_16"))
    wav, sr = sf.read(path, dtype="float32")
    return wav, sr


VARIANTS = ("m1", "m2", "m3", "m7")  # espeak-ng's plain male variants: tiny.en hears each at 14-21% WER (dev set)
RATES = (160, 190)  # words per minute, inclusive; espeak's default is 175
PITCHES = (40, 60)  # 0-99, default 50


@dataclasses.dataclass(frozen=True)
class Realisation:
    voice: str
    rate: int
    pitch: int


def realisation(sentence_id: str, seed: int) -> Realisation:
    """The realisation of one sentence at one seed: voice variant, rate and pitch drawn uniformly."""
    rng = np.random.default_rng([seed, int(hashlib.sha256(sentence_id.encode()).hexdigest()[:8], 16)])
    return Realisation(f"en-us+{VARIANTS[rng.integers(len(VARIANTS))]}", int(rng.integers(RATES[0], RATES[1] + 1)),
                       int(rng.integers(PITCHES[0], PITCHES[1] + 1)))


def render_as(text: str, how: Realisation) -> tuple[np.ndarray, int]:
    return render(text, how.voice, how.rate, how.pitch)


def drop_n_words(text: str, n: int, seed: int) -> str:
    """Remove n words (at most all but one), chosen by a fixed-seed RNG."""
    words = text.split()
    n = min(len(words) - 1, n)
    drop = set(np.random.default_rng(seed).choice(len(words), size=n, replace=False).tolist()) if n > 0 else set()
    return " ".join(w for i, w in enumerate(words) if i not in drop)


def cut_last_words(text: str, n: int, how: Realisation) -> tuple[np.ndarray, int]:
    """The render of `text` with its audio cut where its last n words begin: the full render truncated to the
    length of the render of the first len - n words (its trailing silence trimmed)."""
    wav, sr = render_as(text, how)
    head, _ = render_as(" ".join(text.split()[:-n]), how)
    voiced = np.flatnonzero(np.abs(head) > 0.01)
    end = int(voiced[-1]) + 1 if voiced.size else head.size
    return wav[: min(end, wav.size)], sr
