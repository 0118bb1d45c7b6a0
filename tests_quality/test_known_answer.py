"""Known answers on real speech (espeak-ng renders, judged by Whisper): the gate must pass an equivalent
rendering, fail a degraded one as worse, keep its false-positive rate under the null, and the long-form check
must find no dropped words in whole paragraphs while finding a sentence that was removed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from harness.quality import corpus, evaluate, stats, wer
from harness.quality.evaluate import Clip

# Audio perturbation that stands in for an "equivalent" system: white noise at this SNR is the scale of the
# rounding noise a lossless patch may add. tiny.en is not stable under louder noise: of the first 40 dev
# renders, white noise changed 24 transcripts at 30 dB, 12 at 45 dB and 1 at 60 dB (float32 judge). At 30 dB
# the gate rightly calls it worse for this judge (int8 judge, 60 renders: ΔWER +3.9 pts, CI [+1.4, +6.8]).
EQUIVALENT_SNR_DB = 60.0
DEGRADE_DROP_FRACTION = 0.2  # a fifth of the words removed from the text before rendering
# The default run judges the first 30 dev sentences (time budget: README, "Running the suite"); --slow all 60.
SET_SIZES = [pytest.param(30, id="30"), pytest.param(None, id="all", marks=pytest.mark.slow)]


def report(v: stats.Verdict) -> str:
    text = v.format()
    print("\n" + text)
    return text


@pytest.mark.quality
@pytest.mark.parametrize("size", SET_SIZES)
def test_equivalent_rendering_passes_the_gate(judge, dev_renders, espeak, wer_margin, tmp_path, size):
    ref = dev_renders[:size]
    cand = [Clip(c.id, c.text, espeak.add_noise(c.wav, EQUIVALENT_SNR_DB, seed=k), c.sr, c.group)
            for k, c in enumerate(ref)]
    out = evaluate.compare_sets(judge, ref, cand, margin=wer_margin,
                               label=f"white noise {EQUIVALENT_SNR_DB:.0f} dB SNR", pack_dir=tmp_path / "pack")
    text = report(out.verdict)
    assert out.verdict.verdict == "pass", f"equivalent rendering should pass; listening pack {out.pack}\n{text}"


@pytest.mark.quality
@pytest.mark.parametrize("size", SET_SIZES)
def test_degraded_rendering_fails_as_worse(judge, dev_renders, espeak, wer_margin, tmp_path, size):
    # The text is dropped before rendering; scoring is still against the full sentence.
    ref, cand = dev_renders[:size], []
    for k, c in enumerate(ref):
        wav, sr = espeak.render(espeak.drop_words(c.text, DEGRADE_DROP_FRACTION, seed=k))
        cand.append(Clip(c.id, c.text, wav, sr, c.group))
    out = evaluate.compare_sets(judge, ref, cand, margin=wer_margin,
                               label=f"{DEGRADE_DROP_FRACTION:.0%} of words dropped", pack_dir=tmp_path / "pack")
    text = report(out.verdict)
    assert out.verdict.verdict == "worse", text
    assert out.verdict.ci_low > 0 and out.verdict.p_value < 0.05, text
    assert out.pack is not None and out.pack.is_file(), "a failed gate must leave a listening pack (index.md)"


def test_false_positive_rate_under_the_null_is_within_alpha():
    """400 trials with ref and cand errors drawn from one distribution per utterance: the sign-flip test
    at alpha 0.05 may reject at most as often as Binomial(400, 0.05) allows (one-sided binomial p > 0.001)."""
    alpha, trials, n = 0.05, 400, 60
    rng = np.random.default_rng(12345)
    rejections = 0
    for _ in range(trials):
        words = rng.integers(6, 21, n)
        p_utt = rng.beta(1.0, 8.0, n)  # per-utterance difficulty, shared by both systems
        e_ref, e_cand = rng.binomial(words, p_utt), rng.binomial(words, p_utt)
        rejections += stats.sign_flip_pvalue(e_ref, e_cand, n_resamples=999, seed=int(rng.integers(2**31))) < alpha
    rate = rejections / trials
    tail = sps.binomtest(rejections, trials, alpha, alternative="greater").pvalue
    print(f"\nnull false-positive rate {rate:.3f} ({rejections}/{trials}) at alpha {alpha}; binomial tail p {tail:.3g}")
    assert tail > 0.001, f"false-positive rate {rate:.3f} ({rejections}/{trials}) exceeds alpha {alpha}"
    assert rejections > 0, "a test that never rejects under the null is suspect (expected about 20 of 400)"


def test_power_against_a_real_difference():
    """The same simulation with the candidate 50% worse per utterance: the test must usually reject."""
    rng = np.random.default_rng(54321)
    hits = 0
    for _ in range(100):
        words = rng.integers(6, 21, 60)
        p_utt = rng.beta(1.0, 8.0, 60)
        e_ref, e_cand = rng.binomial(words, p_utt), rng.binomial(words, np.minimum(1.5 * p_utt, 1))
        hits += stats.sign_flip_pvalue(e_ref, e_cand, n_resamples=999, seed=int(rng.integers(2**31))) < 0.05
    print(f"\npower at +50% errors, 60 sentences: {hits}/100")
    assert hits >= 70, f"power {hits}/100 at +50% errors"


@pytest.mark.quality
def test_long_form_paragraphs_lose_no_words(judge, espeak):
    """Whole paragraphs (> 30 s) keep every phrase; removing one sentence shows up as a dropped span."""
    items = corpus.load_corpus("longform")
    for item in items:
        wav, sr = espeak.render(item.text)
        assert wav.size / sr > 30, f"{item.id}: only {wav.size / sr:.1f} s, not long-form"
        spans = wer.dropped_spans(item.text, judge.transcribe(wav, sr), min_words=3)
        assert spans == [], f"{item.id}: dropped {spans}"
    sentences = items[0].text.split(". ")
    cut = ". ".join(sentences[:3] + sentences[4:])  # remove the 4th sentence from the audio only
    wav, sr = espeak.render(cut)
    spans = wer.dropped_spans(items[0].text, judge.transcribe(wav, sr), min_words=3)
    missing = wer.normalize(sentences[3])
    assert any(missing in s or s in missing for s in spans) and spans, f"removed {missing!r}; found {spans}"
