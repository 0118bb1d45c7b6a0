"""The text corpus in fixtures/corpus/: dev (tuning), holdout (gate only) and long-form paragraphs.

File format: one item per line, "<id><TAB><text>"; blank lines and lines starting with '#' are ignored.
"""

from __future__ import annotations

from typing import NamedTuple

from harness import FIXTURES

CORPUS_DIR = FIXTURES / "corpus"
OPEN_SETS = ("dev", "longform")
HOLDOUT_SENTENCES = 48  # the count the simulated sizes assume (tests_quality/test_evaluate.py checks it)


class Item(NamedTuple):
    id: str
    text: str


class HoldoutAccess(PermissionError):
    """Raised when tuning code asks for the holdout set."""


def _read(name: str) -> list[Item]:
    path = CORPUS_DIR / f"{name}.txt"
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        sid, sep, text = line.partition("\t")
        if not sep or not text.strip():
            raise ValueError(f"{path}:{n}: expected '<id><TAB><text>', got {line!r}")
        items.append(Item(sid.strip(), text.strip()))
    ids = [i.id for i in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids")
    return items


def load_corpus(name: str) -> list[Item]:
    """Items of "dev" or "longform". "holdout" is refused: only harness.gate_on_holdout reads it."""
    if name == "holdout":
        raise HoldoutAccess(
            "the holdout set is read only by the final gate (harness.quality.evaluate.gate_on_holdout); "
            "tune and explore on load_corpus('dev')"
        )
    if name not in OPEN_SETS:
        raise ValueError(f"unknown corpus {name!r}; choose one of {OPEN_SETS}")
    return _read(name)


def read_holdout_for_gate() -> list[Item]:
    """Holdout items; call sites are checked by tests_quality/test_evaluate.py (gate only)."""
    return _read("holdout")
