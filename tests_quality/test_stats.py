"""Statistics of the gate, against scipy and hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from harness.quality import stats
from harness.quality.wer import ScoredSet


def scored(errors, words, judge="judge-A", groups=None) -> ScoredSet:
    ids = tuple(f"u{i:03d}" for i in range(len(errors)))
    return ScoredSet(ids, tuple(groups) if groups else ids, np.asarray(errors), np.asarray(words), judge)


def synthetic(n, p_ref, p_cand, seed):
    """Per-utterance (errors_ref, errors_cand, words): words 6..20, errors ~ Binomial(words, p)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(6, 21, n)
    return rng.binomial(words, p_ref), rng.binomial(words, p_cand), words


def test_delta_wer_is_a_ratio_of_sums():
    # hand: (1+0+3 - (0+0+1)) / (10+5+5) = 3/20
    assert stats.delta_wer(np.array([0, 0, 1]), np.array([1, 0, 3]), np.array([10, 5, 5])) == pytest.approx(0.15)


def test_block_sums_by_group_in_first_seen_order():
    e, w = stats.block_sums(["b", "a", "b", "c"], np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40]))
    np.testing.assert_array_equal(e, [4, 2, 4])
    np.testing.assert_array_equal(w, [40, 20, 40])


def test_bootstrap_matches_scipy_bca():
    e_ref, e_cand, w = synthetic(80, 0.10, 0.12, seed=1)
    got = stats.paired_bootstrap(e_ref, e_cand, w, n_resamples=2000, seed=7)
    want = sps.bootstrap((e_ref, e_cand, w), stats.delta_wer, paired=True, vectorized=True, method="BCa",
                         n_resamples=2000, rng=np.random.default_rng(7))
    assert (got.ci_low, got.ci_high) == pytest.approx(tuple(want.confidence_interval), abs=1e-12)
    assert got.prob_improvement == pytest.approx(np.mean(want.bootstrap_distribution < 0))
    assert got.ci_low < got.delta < got.ci_high, f"Δ {got.delta} outside CI [{got.ci_low}, {got.ci_high}]"


def test_bootstrap_ci_agrees_with_delta_method_normal_interval():
    # Hand: linearising Δ = Σd/Σw gives SE = sqrt(Σ (d_i - Δ w_i)^2) / Σw (n large, so n/(n-1) ≈ 1).
    e_ref, e_cand, w = synthetic(400, 0.10, 0.11, seed=2)
    d = (e_cand - e_ref).astype(float)
    delta = d.sum() / w.sum()
    se = np.sqrt(np.sum((d - delta * w) ** 2)) / w.sum()
    got = stats.paired_bootstrap(e_ref, e_cand, w)
    assert got.se == pytest.approx(se, rel=0.1), f"bootstrap SE {got.se:.5f} vs delta-method {se:.5f}"
    for ours, normal in ((got.ci_low, delta - 1.96 * se), (got.ci_high, delta + 1.96 * se)):
        assert ours == pytest.approx(normal, abs=0.15 * 1.96 * se), f"BCa bound {ours:.5f} vs normal {normal:.5f}"


def test_block_bootstrap_resamples_whole_groups():
    # Three copies of each utterance are not three times the evidence: with groups the CI keeps its width,
    # without groups it narrows by about sqrt(3).
    e_ref, e_cand, w = synthetic(60, 0.10, 0.12, seed=3)
    rep = lambda a: np.repeat(a, 3)  # noqa: E731
    groups = np.repeat(np.arange(60), 3).astype(str)
    base = stats.paired_bootstrap(e_ref, e_cand, w)
    blocked = stats.paired_bootstrap(rep(e_ref), rep(e_cand), rep(w), groups=groups)
    naive = stats.paired_bootstrap(rep(e_ref), rep(e_cand), rep(w))
    width = lambda r: r.ci_high - r.ci_low  # noqa: E731
    assert width(blocked) == pytest.approx(width(base), rel=1e-9), f"{width(blocked)} vs {width(base)}"
    assert width(naive) / width(base) == pytest.approx(1 / np.sqrt(3), rel=0.15), width(naive) / width(base)


def test_bootstrap_without_any_difference_is_degenerate_zero():
    e, w = np.array([1, 2, 0]), np.array([10, 10, 10])
    got = stats.paired_bootstrap(e, e, w)
    assert (got.delta, got.ci_low, got.ci_high, got.method) == (0.0, 0.0, 0.0, "degenerate")


@pytest.mark.parametrize(
    "diffs, p_hand",
    [
        ([1, 1, 1, 1, 1], 2 / 32),  # only all-plus and all-minus reach |sum| = 5
        ([1, 2, 3], 2 / 8),  # |sum| >= 6 only for +++ and ---
        ([3, -1, 0, 0, 0], 4 / 4),  # zeros flip to themselves; sums of (±3, ±1) are ±4, ±2: all |.| >= 2
        ([2, 0, 0], 1.0),  # one non-zero difference: +2 and -2 are equally extreme
        ([0, 0, 0], 1.0),
    ],
)
def test_sign_flip_pvalue_hand_computed(diffs, p_hand):
    e_ref = np.full(len(diffs), 5)
    assert stats.sign_flip_pvalue(e_ref, e_ref + np.array(diffs)) == pytest.approx(p_hand)


def test_sign_flip_pvalue_on_unit_differences_is_the_exact_sign_test():
    # With every d in {-1, +1}, the sign-flip statistic is 2K - n with K ~ Binomial(n, 1/2).
    d = np.array([1] * 10 + [-1] * 2)
    p = stats.sign_flip_pvalue(np.zeros(12, int), d)
    assert p == pytest.approx(sps.binomtest(10, 12, 0.5).pvalue), p


def test_sign_flip_pvalue_uses_group_sums():
    # Four utterances each one error worse. Per utterance: 16 flips, only ++++ and ---- reach |4| -> 2/16.
    # As groups a = {u0, u1, u2}, b = {u3}: sums (3, 1) flip to 4, 2, -2, -4; |.| >= 4 twice -> 2/4.
    e_ref = np.zeros(4, int)
    e_cand = np.array([1, 1, 1, 1])
    assert stats.sign_flip_pvalue(e_ref, e_cand) == pytest.approx(2 / 16)
    assert stats.sign_flip_pvalue(e_ref, e_cand, groups=["a", "a", "a", "b"]) == pytest.approx(2 / 4)


def test_mde_formula():
    se = 0.004
    want = (sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) * se  # 2.8016 * SE
    assert stats.minimum_detectable_effect(se) == pytest.approx(want)
    assert stats.minimum_detectable_effect(se) == pytest.approx(2.8016 * se, abs=1e-6)


def test_sentences_needed_formula():
    # hand: half-width 0.02 at n = 100 must shrink to margin - Δ = 0.01 -> n * (0.02 / 0.01)^2 = 400
    assert stats.sentences_needed(100, 0.02, 0.0, 0.01) == 400
    assert stats.sentences_needed(100, 0.02, 0.005, 0.01) == 1600
    assert stats.sentences_needed(100, 0.02, 0.01, 0.01) is None


def test_gate_passes_a_tiny_harmless_difference():
    e_ref, _, w = synthetic(200, 0.1, 0.1, seed=4)
    e_cand = e_ref.copy()
    e_cand[:3] += 1
    e_cand[3:6] -= np.minimum(e_cand[3:6], 1)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin=0.01)
    assert v.verdict == "pass", v.format()
    assert v.ci_high < 0.01 and v.n_differing <= 6, v.format()


def test_gate_fails_a_clear_degradation_as_worse():
    e_ref, e_cand, w = synthetic(60, 0.10, 0.25, seed=5)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w))
    assert v.verdict == "worse", v.format()
    assert v.ci_low > 0 and v.p_value < 0.05, v.format()


def test_gate_on_too_few_sentences_is_inconclusive_and_says_how_many_more():
    e_ref, e_cand, w = synthetic(20, 0.10, 0.10, seed=6)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin=0.01)
    assert v.verdict == "inconclusive", v.format()
    half = (v.ci_high - v.ci_low) / 2
    if v.delta_wer < v.margin:
        assert v.n_needed == max(21, int(np.ceil(20 * (half / (v.margin - v.delta_wer)) ** 2))), v.format()
        assert f"sentences needed: {v.n_needed}" in v.format()
    else:
        assert v.n_needed is None and "none suffices" in v.format()


def test_gate_refuses_to_compare_different_judges():
    e, w = np.array([1, 0, 2]), np.array([10, 10, 10])
    with pytest.raises(stats.JudgeMismatch, match="different judges"):
        stats.gate(scored(e, w, judge="tiny.en"), scored(e, w, judge="large-v3"))


def test_gate_refuses_unpaired_sets():
    a = scored([1, 0], [10, 10])
    b = ScoredSet(("x", "y"), ("x", "y"), np.array([1, 0]), np.array([10, 10]), "judge-A")
    with pytest.raises(ValueError, match="not paired"):
        stats.gate(a, b)


def test_verdict_format_prints_every_number():
    e_ref, e_cand, w = synthetic(40, 0.10, 0.12, seed=8)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), label="demo")
    text = v.format()
    for piece in (f"{100 * v.delta_wer:+.2f}", f"{100 * v.ci_low:+.2f}", f"{100 * v.ci_high:+.2f}",
                  f"p={v.p_value:.4f}", f"MDE {100 * v.mde:.2f}", f"sentences {v.n_sentences}",
                  f"differing {v.n_differing}", v.verdict.upper(), "judge-A", "demo"):
        assert piece in text, f"{piece!r} missing from:\n{text}"
