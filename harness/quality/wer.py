"""Scoring: Whisper's English normalizer, then jiwer alignments per utterance.

The normalizer is `whisper_normalizer.english.EnglishTextNormalizer` (PyPI `whisper-normalizer`): a copy of
openai-whisper's normalizer that ships its spelling map (`normalizers/english.json`) inside the wheel, so it
works offline. transformers' copy of the same class needs that json passed in, and transformers ships none.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jiwer
import numpy as np


@functools.lru_cache(maxsize=1)
def _english_normalizer():
    try:
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as e:  # the quality extra is not installed
        raise ImportError(
            "the Whisper English normalizer is missing: pip install -e . --group quality (package whisper-normalizer)"
        ) from e
    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """Whisper English normalization: lower case, spelled-out contractions, British->American, no punctuation."""
    return " ".join(_english_normalizer()(text).split())


@dataclasses.dataclass(frozen=True)
class ScoredSet:
    """Per-utterance errors of one system, as scored by one judge.

    errors, words: [N] int arrays; errors = S + D + I against the reference, words = reference word count.
    groups: [N] ids of the resampling block (sentence, speaker or voice prompt) each utterance belongs to.
    """

    ids: tuple[str, ...]
    groups: tuple[str, ...]
    errors: np.ndarray
    words: np.ndarray
    judge: str

    @property
    def wer(self) -> float:
        return corpus_wer(self.errors, self.words)


def corpus_wer(errors: Sequence[int], words: Sequence[int]) -> float:
    """Corpus WER is a ratio of sums (sum errors / sum reference words), not a mean of per-utterance WERs."""
    total = int(np.sum(words))
    if total == 0:
        raise ValueError("corpus WER needs at least one reference word")
    return float(np.sum(errors)) / total


def utterance_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(S + D + I, reference word count) after normalization, from jiwer's word alignment."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    n_ref = len(ref.split())
    if n_ref == 0:
        raise ValueError(f"reference {reference!r} has no words after normalization")
    if not hyp:  # jiwer refuses an empty hypothesis; everything is a deletion
        return n_ref, n_ref
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, n_ref


def score_set(
    ids: Sequence[str],
    references: Sequence[str],
    hypotheses: Sequence[str],
    judge: str,
    groups: Sequence[str] | None = None,
) -> ScoredSet:
    """Score N hypotheses against N references; `judge` is the identity of the transcriber that made them."""
    if not (len(ids) == len(references) == len(hypotheses)):
        raise ValueError(f"ids/references/hypotheses lengths differ: {len(ids)}/{len(references)}/{len(hypotheses)}")
    pairs = [utterance_errors(r, h) for r, h in zip(references, hypotheses)]
    return ScoredSet(
        ids=tuple(ids),
        groups=tuple(groups) if groups is not None else tuple(ids),
        errors=np.array([e for e, _ in pairs], dtype=np.int64),
        words=np.array([w for _, w in pairs], dtype=np.int64),
        judge=judge,
    )


def dropped_spans(reference: str, hypothesis: str, min_words: int = 1) -> list[str]:
    """Runs of >= min_words consecutive reference words that the hypothesis deleted, in reading order.

    A long-form chunking bug drops whole phrases at chunk seams; these show up as long deletion runs, while
    ordinary recognition errors are substitutions or single-word deletions.
    """
    ref, hyp = normalize(reference), normalize(hypothesis)
    ref_words = ref.split()
    if not hyp:
        return [ref] if len(ref_words) >= min_words else []
    out = jiwer.process_words(ref, hyp)
    spans = []
    for chunk in out.alignments[0]:
        if chunk.type == "delete" and chunk.ref_end_idx - chunk.ref_start_idx >= min_words:
            spans.append(" ".join(ref_words[chunk.ref_start_idx : chunk.ref_end_idx]))
    return spans
