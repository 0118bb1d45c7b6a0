"""The quality tier's on-disk caches: where they live and how a file gets into them whole.

Caches live under env FASTPATH_CACHE or <repo>/.cache/, one folder per kind (audio, transcripts, voice, mos,
espeak, packs). Every write goes to a temp file in the same folder and is moved into place with os.replace, so
concurrent pytest-xdist workers only ever see whole files. Below every other module of the tier: the judges and the
harness that drives them both import it.
"""

from __future__ import annotations

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


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp_path) then os.replace(tmp_path, path): readers never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
