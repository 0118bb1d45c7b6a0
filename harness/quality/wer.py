"""Scoring: Whisper's normalizers, then jiwer alignments per utterance, in words or, for Chinese and Japanese, in
characters (CER, as Seed-TTS-eval scores zh).

English: `whisper_normalizer.english.EnglishTextNormalizer` (PyPI `whisper-normalizer`): a copy of openai-whisper's
normalizer that ships its spelling map (`normalizers/english.json`) inside the wheel, so it works offline.
transformers' copy of the same class needs that json passed in, and transformers ships none. Every other language:
the same package's `BasicTextNormalizer` (lower case, punctuation and symbols out), as Whisper's own multilingual
evaluation does; zh and ja then count one unit per character, spaces dropped.
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


CHARACTER_LANGUAGES = ("zh", "ja")  # scored in characters: CER (no spaces between words to count by)


@functools.lru_cache(maxsize=1)
def _basic_normalizer():
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer()


def normalize(text: str, language: str = "en") -> str:
    """Whisper's normalization for `language`: in English lower case, spelled-out contractions, British->American,
    no punctuation; in any other, lower case without punctuation or symbols. Units separated by one space: words,
    or for CHARACTER_LANGUAGES characters."""
    if language == "en":
        return " ".join(_english_normalizer()(text).split())
    basic = _basic_normalizer()(text)
    if language in CHARACTER_LANGUAGES:
        return " ".join("".join(basic.split()))
    return " ".join(basic.split())


def unit(language: str) -> str:
    """What an error is counted in: "characters" (CER) or "words" (WER)."""
    return "characters" if language in CHARACTER_LANGUAGES else "words"


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


def utterance_errors(reference: str, hypothesis: str, language: str = "en") -> tuple[int, int]:
    """(S + D + I, reference unit count) after normalization for `language`, from jiwer's alignment of its units
    (words, or characters for CHARACTER_LANGUAGES)."""
    ref, hyp = normalize(reference, language), normalize(hypothesis, language)
    n_ref = len(ref.split())
    if n_ref == 0:
        raise ValueError(f"reference {reference!r} has no {unit(language)} after normalization")
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
    languages: Sequence[str] | None = None,
) -> ScoredSet:
    """Score N hypotheses against N references (each in its language, English when not given); `judge` is the
    identity of the transcriber that made them."""
    if not (len(ids) == len(references) == len(hypotheses)):
        raise ValueError(f"ids/references/hypotheses lengths differ: {len(ids)}/{len(references)}/{len(hypotheses)}")
    languages = languages if languages is not None else ["en"] * len(ids)
    pairs = [utterance_errors(r, h, lang) for r, h, lang in zip(references, hypotheses, languages)]
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
