"""Real speech without a TTS checkpoint: espeak-ng renders of the corpus, plus controlled degradations.

Used by the known-answer tests: a render vs a mildly noisy copy must pass the gate; vs a render with a fifth
of the words dropped must fail as worse. Renders are cached under <cache>/espeak/ keyed by text, voice, rate
and the espeak-ng version.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import subprocess

import numpy as np
import soundfile as sf

from .evaluate import atomic_write, cache_dir

ESPEAK = "espeak-ng"


@functools.lru_cache(maxsize=1)
def espeak_version() -> str:
    if shutil.which(ESPEAK) is None:
        raise FileNotFoundError(f"{ESPEAK} is not on PATH: apt-get install -y espeak-ng")
    out = subprocess.run([ESPEAK, "--version"], check=True, capture_output=True, text=True).stdout
    return out.split("Data at")[0].strip()


def render(text: str, voice: str = "en-us", rate: int = 175) -> tuple[np.ndarray, int]:
    """text -> ([T] float32 in [-1, 1], sample rate) via `espeak-ng -v voice -s rate`, cached on disk."""
    key = json.dumps({"text": text, "voice": voice, "rate": rate, "espeak": espeak_version()}, sort_keys=True)
    path = cache_dir("espeak") / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".wav")
    if not path.exists():
        # --stdout and --stdin: no temp file of espeak's own, and text starting with '-' is not an option
        wav_bytes = subprocess.run(
            [ESPEAK, "-v", voice, "-s", str(rate), "--stdout", "--stdin"],
            input=text.encode(), check=True, capture_output=True,
        ).stdout
        wav, sr = sf.read(io.BytesIO(wav_bytes), dtype="float32")
        atomic_write(path, lambda f: sf.write(f, wav, sr, format="WAV", subtype="PCM_16"))
    wav, sr = sf.read(path, dtype="float32")
    return wav, sr


def add_noise(wav: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    """wav [T] + white Gaussian noise at snr_db relative to the mean power of the whole clip (fixed RNG)."""
    power = float(np.mean(wav.astype(np.float64) ** 2))
    noise = np.random.default_rng(seed).standard_normal(wav.shape) * np.sqrt(power / 10 ** (snr_db / 10))
    return (wav + noise).astype(np.float32)


def drop_words(text: str, fraction: float, seed: int) -> str:
    """Remove round(fraction * n_words) words, chosen by a fixed-seed RNG (at least one, never all)."""
    words = text.split()
    n_drop = min(len(words) - 1, max(1, round(fraction * len(words))))
    drop = set(np.random.default_rng(seed).choice(len(words), size=n_drop, replace=False).tolist())
    return " ".join(w for i, w in enumerate(words) if i not in drop)
