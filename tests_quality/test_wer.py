"""Scoring: Whisper's English normalizer and jiwer alignments, against hand-computed cases and jiwer.wer."""

from __future__ import annotations

import jiwer
import numpy as np
import pytest

from harness.run.installed import require_module
from harness.quality import wer

require_module("whisper_normalizer", "pip install -e . --group quality (package whisper-normalizer)")


@pytest.mark.parametrize(
    "text, want",
    [
        ("Hello, World!", "hello world"),  # case and punctuation
        ("The colour of the neighbour's car.", "the color of the neighbor is car"),  # British -> American
        ("He won't go, um, there.", "he will not go there"),  # contractions, fillers
        ("twenty one", "21"),  # spelled numbers -> digits, as Whisper's own scoring does
    ],
)
def test_normalize_matches_whisper_english_rules(text, want):
    assert wer.normalize(text) == want


@pytest.mark.parametrize(
    "ref, hyp, errors, words",
    [
        ("the cat sat on the mat", "the cat sat on the mat", 0, 6),
        ("the cat sat on the mat", "the cat sit on mat", 2, 6),  # 1 substitution + 1 deletion
        ("the cat sat", "the black cat sat down", 2, 3),  # 2 insertions
        ("The Cat, sat!", "the cat sat", 0, 3),  # normalization removes case/punctuation differences
        ("hello there", "", 2, 2),  # empty transcript: every word deleted
    ],
)
def test_utterance_errors_hand_computed(ref, hyp, errors, words):
    assert wer.utterance_errors(ref, hyp) == (errors, words)


def test_corpus_wer_is_ratio_of_sums_not_mean_of_ratios():
    # hand: (1 + 0) / (1 + 9) = 0.1; the mean of per-utterance WERs would be 0.5
    assert wer.corpus_wer([1, 0], [1, 9]) == pytest.approx(0.1)


def test_score_set_agrees_with_jiwer_corpus_wer():
    refs = ["the quick brown fox", "jumps over the lazy dog", "a stitch in time saves nine"]
    hyps = ["the quick brown box", "jumps over lazy dogs today", "a stitch in time saves nine"]
    s = wer.score_set(["a", "b", "c"], refs, hyps, judge="j")
    want = jiwer.wer([wer.normalize(r) for r in refs], [wer.normalize(h) for h in hyps])
    assert s.wer == pytest.approx(want), f"ours {s.wer} vs jiwer {want}"
    np.testing.assert_array_equal(s.words, [4, 5, 6])
    assert s.groups == ("a", "b", "c") and s.judge == "j"


def test_score_set_rejects_ragged_inputs():
    with pytest.raises(ValueError, match="lengths differ"):
        wer.score_set(["a", "b"], ["x y"], ["x y"], judge="j")


def test_dropped_spans_reports_runs_of_deleted_reference_words():
    ref = "the red fox ran over a very tall green hill today"
    hyp = "the red fox tall green hill"
    assert wer.dropped_spans(ref, hyp, min_words=2) == ["ran over a very"]
    assert wer.dropped_spans(ref, hyp, min_words=1) == ["ran over a very", "today"]
    assert wer.dropped_spans(ref, ref) == []
