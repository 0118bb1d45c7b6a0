"""The predicted-MOS judge: Microsoft's DNSMOS (P.835 SIG/BAK/OVRL and P.808) through `speechmos`, whose wheel
holds the ONNX models; recorded identity.

Not the model papers report (UTMOS): DNSMOS was trained on noisy and enhanced speech and hears noise, band-limiting
and clipping well, fine detail of a clean voice less. Its numbers are comparable only with each other.

A clip is scored at a fixed level (DNSMOS's OVRL moves with the level: 2.78-3.07 between peaks 0.1 and 0.99 on one
espeak-ng clip): resampled to 16 kHz (scipy), scaled to an RMS of LEVEL_DBFS, and, where that would clip, scaled down
to a peak of PEAK. Clips under 9.01 s (DNSMOS's window) are tiled to fill one window, as DNSMOS's own script pads
them, and cut there: the library would score every 1-s hop of the doubled clip (7 windows for a 4-s clip) over the
same repeated audio, 7x the time for the mean of near-equal windows. Longer clips are scored by the library's hops.
A clip that is empty, under one mel frame (audio.MIN_SAMPLES["MOS"]), silent, non-finite or clipped is refused
before it is scored (audio.BadAudio): DNSMOS crashed on the first and the non-finite ones and scored the others.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from . import audio
from .audio import JUDGE_SR, to_judge_rate
from .cache import atomic_write, cache_dir
from .judge import file_sha256

LEVEL_DBFS = -25.0
PEAK = 0.99
MODELS = ("dnsmos_models/sig_bak_ovr.onnx", "dnsmos_models/model_v8.onnx")
FIELDS = ("ovrl", "sig", "bak", "p808")


def model_dir() -> Path:
    try:
        from speechmos import dnsmos
    except ImportError as e:
        raise ImportError("the predicted-MOS judge is missing: bash scripts/install.sh (pip install speechmos==0.0.1.1 "
                          "onnxruntime librosa)") from e
    root = Path(dnsmos.__file__).parent
    for rel in MODELS:
        if not (root / rel).is_file():
            raise FileNotFoundError(f"DNSMOS model {root / rel} is missing: reinstall speechmos "
                                    "(bash scripts/install.sh)")
    return root


def at_level(wav: np.ndarray, sr: int) -> np.ndarray:
    """[T] at sr -> [T'] at 16 kHz, RMS LEVEL_DBFS (peak at most PEAK)."""
    x = to_judge_rate(wav, sr).astype(np.float64)
    rms = float(np.sqrt(np.mean(x**2)))
    if rms == 0:
        return x.astype(np.float32)
    x *= 10 ** (LEVEL_DBFS / 20) / rms
    peak = float(np.max(np.abs(x)))
    if peak > PEAK:
        x *= PEAK / peak
    return x.astype(np.float32)


def one_window(x: np.ndarray) -> np.ndarray:
    """Tile a clip shorter than DNSMOS's window to exactly one window (a longer one is returned as it is)."""
    from speechmos.dnsmos import INPUT_LENGTH

    n = int(INPUT_LENGTH * JUDGE_SR)
    if x.size >= n or x.size == 0:
        return x
    return np.tile(x, -(-n // x.size))[:n]


@dataclasses.dataclass
class MosJudge:
    model: object
    identity: str

    def score(self, wav: np.ndarray, sr: int) -> dict:
        """{"ovrl", "sig", "bak", "p808"} of one clip (cached on disk by audio and identity); bad audio is refused
        (audio.BadAudio)."""
        audio.require(wav, sr, "MOS")
        x = one_window(at_level(wav, sr))
        key = hashlib.sha256(x.tobytes() + self.identity.encode()).hexdigest()[:32]
        path = cache_dir("mos") / f"{key}.json"
        if path.exists():
            return json.loads(path.read_text())
        out = self.model(x, JUDGE_SR, False)
        record = {f: float(out[f"{f}_mos"]) for f in FIELDS}
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(record)))
        return record


def identity() -> str:
    from harness.run import machine

    root = model_dir()
    digests = {rel: file_sha256(root / rel)[:16] for rel in MODELS}
    return json.dumps({"judge": "DNSMOS P.835 + P.808", "speechmos": machine.package_version("speechmos"),
                       "models_sha256": digests, "level_dbfs": LEVEL_DBFS, "peak": PEAK, "one_window": True,
                       "cpu_isa": machine.isa_tag(machine.cpu_isa()),  # the kernels, hence the last bits, follow it
                       "engine": {n: machine.package_version(n) for n in ("onnxruntime", "librosa")}}, sort_keys=True)


def load_mos_judge(name: str | None = None):
    """The MOS judge: `name` (or env FASTPATH_MOS_JUDGE) UTMOS22 strong weights (harness.quality.utmos), else DNSMOS."""
    import os

    from . import utmos

    name = name or os.environ.get(utmos.ENV) or None
    return utmos.load(name) if name else load_dnsmos()


@functools.lru_cache(maxsize=1)
def load_dnsmos() -> MosJudge:
    """Both ONNX sessions on CPU, once per process."""
    ident = identity()
    from speechmos import dnsmos

    root = model_dir()
    return MosJudge(dnsmos.DNSMOS(str(root / MODELS[0]), str(root / MODELS[1])), ident)


def mos_scores(judge: MosJudge, clips, field: str = "ovrl") -> np.ndarray:
    """[N] `field` of every clip; the set is refused by name (audio.BadAudio) when any clip is bad."""
    audio.refuse(audio.check_clips(clips, "MOS"))
    return np.array([judge.score(c.wav, c.sr)[field] for c in clips])
