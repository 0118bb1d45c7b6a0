"""The quality tier's on-disk caches: where they live and how a file gets into them whole.

Caches live under env FASTPATH_CACHE or <repo>/.cache/, one folder per kind (audio, transcripts, voice, mos,
espeak, packs). Every write goes to a temp file in the same folder and is moved into place with os.replace, so
concurrent pytest-xdist workers only ever see whole files. Below every other module of the tier: the judges and the
harness that drives them both import it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Callable

from harness import REPO_ROOT

CACHE_ENV = "FASTPATH_CACHE"


def cache_dir(kind: str) -> Path:
    """<FASTPATH_CACHE or repo/.cache>/<kind>/, created on first use."""
    root = Path(os.environ.get(CACHE_ENV) or REPO_ROOT / ".cache")
    path = root / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


JUDGE_KINDS = ("transcripts", "voice", "mos")  # what the judges write: a transcript, an embedding, MOS per clip


def judge_entries(root: str | os.PathLike) -> dict[str, dict[str, bytes]]:
    """{kind: {file name: bytes}} of the judges' entries in the cache at `root` (a FASTPATH_CACHE): what a run
    computed and wrote there, e.g. to show that a run with its own empty cache judged by computing."""
    return {kind: {p.name: p.read_bytes() for p in sorted((Path(root) / kind).glob("*")) if not p.name.startswith(".")}
            for kind in JUDGE_KINDS}


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp_path) then os.replace(tmp_path, path): readers never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cached_array(kind: str, key_bytes: bytes, compute: Callable[[], object]):
    """The array stored under <cache>/<kind>/<sha256(key_bytes)[:32]>.npy, or compute() (an array) stored there
    atomically first: a judge's embedding of a clip, keyed by the clip's samples and the judge's identity."""
    import numpy as np

    path = cache_dir(kind) / f"{hashlib.sha256(key_bytes).hexdigest()[:32]}.npy"
    if path.exists():
        return np.load(path)
    value = compute()

    def write(tmp):
        with open(tmp, "wb") as f:  # a file object: np.save would add ".npy" to the temporary name
            np.save(f, value)

    atomic_write(path, write)
    return value
