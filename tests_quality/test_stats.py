"""Statistics of the gate against hand-computed cases: units, the rule, the bounds, the size rule."""

from __future__ import annotations

import argparse

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


# --- units -------------------------------------------------------------------------------------------------------


def test_margin_is_in_points_and_a_fraction_is_refused():
    assert stats.margin_fraction(1.0) == 0.01 and stats.margin_fraction(0.5) == 0.005
    with pytest.raises(ValueError, match="looks like a fraction"):
        stats.margin_fraction(0.01)
    with pytest.raises(ValueError, match="WER points"):
        stats.margin_fraction(75)


def test_the_command_line_option_takes_points():
    assert stats.margin_points_option("0.5") == 0.5  # half a point, not 50 points
    with pytest.raises(argparse.ArgumentTypeError, match="looks like a fraction"):
        stats.margin_points_option("0.01")


def test_verdict_prints_points():
    e_ref, e_cand, w = synthetic(60, 0.10, 0.12, seed=8)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=2.0, label="demo")
    text = v.format()
    for piece in (f"{100 * v.delta_wer:+.2f} pts", f"{100 * v.upper:+.2f}]", "margin 2.00 WER points",
                  f'H0 "candidate worse by the margin or more" (ΔWER >= +2.00 pts) = {v.p_noninferior:.4f}',
                  f'H0 "candidate no worse than the reference" (ΔWER <= 0) = {v.p_worse:.4f}',
                  f"clips {v.n_clips}", "judge-A", "demo"):
        assert piece in text, f"{piece!r} missing from:\n{text}"


def test_identical_sets_read_as_shown_non_inferior_in_words():
    """Two identical sets: p = 0 for "worse by the margin" and p = 1 for "no worse" are the best outcome, and the
    verdict says so in words, each p-value named by the hypothesis it tests (not `p(non-inferior)=0.0000`)."""
    e_ref, _, w = synthetic(60, 0.10, 0.10, seed=9)
    v = stats.gate(scored(e_ref, w), scored(e_ref, w), margin_points=1.0)
    text = v.format()
    assert v.passed and (v.p_noninferior, v.p_worse) == (0.0, 1.0), text
    lines = text.splitlines()
    assert lines[0].startswith("[PASS]"), text
    assert lines[1].startswith("  in plain words: shown non-inferior: not worse than the reference by 1.00 WER "
                               "points or more"), text
    assert ('p for H0 "candidate worse by the margin or more" (ΔWER >= +1.00 pts) = 0.0000 '
            "(small: shown non-inferior)") in text
    assert ('p for H0 "candidate no worse than the reference" (ΔWER <= 0) = 1.0000 '
            "(not small: not shown worse than the reference)") in text
    assert "p(non-inferior)" not in text and "p(worse)" not in text


def test_every_verdict_has_its_plain_words():
    """pass, underpowered and both kinds of fail each say what they mean in one sentence."""
    e_ref, e_cand, w = synthetic(20, 0.10, 0.10, seed=6)
    small = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0)
    e_ref, e_cand, w = synthetic(60, 0.05, 0.30, seed=7)
    worse = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0)
    assert small.verdict == "underpowered" and small.meaning().startswith("undecided, not a failure"), small.format()
    assert f"rerun with {small.seeds_needed} seeds per sentence" in small.meaning()
    assert worse.verdict == "fail" and worse.meaning().startswith("shown worse than the reference by 1.00"), \
        worse.format()
    assert "(small: shown worse than the reference, by some amount)" in worse.format()
    e_ref, e_cand, w = synthetic(2000, 0.10, 0.11, seed=1)  # about one point worse, measured precisely
    near = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0)
    assert near.verdict == "fail" and near.lower < near.margin < near.upper, near.format()
    assert near.meaning().startswith("not shown non-inferior: worse by 1.00 WER points or more is not ruled out")
    assert "(not small: worse by the margin or more is not ruled out)" in near.format()
    for v in (small, worse, near):
        assert f"  in plain words: {v.meaning()}" in v.format()


# --- bounds ------------------------------------------------------------------------------------------------------


def test_block_sums_by_group_in_first_seen_order():
    e, w = stats.block_sums(["b", "a", "b", "c"], np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40]))
    np.testing.assert_array_equal(e, [4, 2, 4])
    np.testing.assert_array_equal(w, [40, 20, 40])


def test_linearised_se_hand_computed():
    # d = (1, -1, 2), w = (10, 10, 20): Δ = 2/40 = 0.05; residuals d - Δw = (0.5, -1.5, 1.0); Σ r² = 3.5
    # SE = sqrt(3/2 * 3.5) / 40
    d, w = np.array([1.0, -1.0, 2.0]), np.array([10.0, 10.0, 20.0])
    assert float(stats.linearised_se(d, w, 0.05)) == pytest.approx(np.sqrt(1.5 * 3.5) / 40)


def test_bounds_use_at_least_students_t_and_contain_the_estimate():
    e_ref, e_cand, w = synthetic(40, 0.10, 0.12, seed=1)
    b = stats.studentized_bounds(e_ref, e_cand, w)
    student = sps.t.ppf(1 - stats.ALPHA, 39)
    assert b.crit_high >= student and b.crit_low >= student
    assert b.upper == pytest.approx(b.delta + b.crit_high * b.se)
    assert b.lower < b.delta < b.upper
    assert (b.delta, b.se) == (pytest.approx((e_cand - e_ref).sum() / w.sum()),
                               pytest.approx(float(stats.linearised_se(e_cand - e_ref, w, b.delta))))


def test_skewed_damage_widens_the_upper_bound_beyond_students_t():
    """Damage in a few sentences: the bootstrap-t quantile is larger than Student's, the upper bound further out."""
    rng = np.random.default_rng(2)
    w = rng.integers(6, 21, 60)
    e_ref = rng.binomial(w, 0.05)
    e_cand = e_ref.copy()
    e_cand[:4] += 6  # four sentences lose six words each
    b = stats.studentized_bounds(e_ref, e_cand, w)
    assert b.crit_high > sps.t.ppf(1 - stats.ALPHA, 59) * 1.1, b


def test_seeds_of_a_sentence_are_one_block():
    # Three copies of each utterance are not three times the evidence: as blocks the bound keeps its distance.
    e_ref, e_cand, w = synthetic(60, 0.10, 0.12, seed=3)
    rep = lambda a: np.repeat(a, 3)
    groups = np.repeat(np.arange(60), 3).astype(str)
    base = stats.studentized_bounds(e_ref, e_cand, w)
    blocked = stats.studentized_bounds(rep(e_ref), rep(e_cand), rep(w), groups=groups)
    naive = stats.studentized_bounds(rep(e_ref), rep(e_cand), rep(w))
    assert blocked.se == pytest.approx(base.se, rel=1e-12)
    assert naive.se / base.se == pytest.approx(1 / np.sqrt(3), rel=0.05)


def test_no_difference_at_all_is_a_zero_bound():
    e, w = np.array([1, 2, 0]), np.array([10, 10, 10])
    b = stats.studentized_bounds(e, e, w)
    assert (b.delta, b.lower, b.upper, b.se, b.p_worse) == (0.0, 0.0, 0.0, 0.0, 1.0)


# --- the rule ----------------------------------------------------------------------------------------------------


def test_pass_iff_the_upper_bound_is_under_the_margin():
    e_ref, e_cand, w = synthetic(200, 0.10, 0.105, seed=4)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=3.0)
    assert v.passed == (v.upper < v.margin), v.format()
    tight = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=100 * v.upper - 0.01)
    assert not tight.passed, tight.format()


def test_significantly_worse_inside_the_margin_passes_and_says_so():
    """The old rule called this WORSE: many sentences, the whole interval above 0 but under the margin."""
    rng = np.random.default_rng(5)
    w = rng.integers(6, 21, 3000)
    e_ref = rng.binomial(w, 0.05)
    e_cand = e_ref + rng.binomial(1, 0.05, w.size)  # about +0.4 points
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0)
    assert v.passed and v.worse and v.lower > 0, v.format()
    assert "SIGNIFICANTLY WORSE" in v.format() and v.format().startswith("[PASS]")
    assert "measurably worse than the reference, but by less than the margin" in v.meaning()


def test_a_small_run_is_underpowered_and_names_the_seeds_and_the_command():
    e_ref, e_cand, w = synthetic(20, 0.10, 0.10, seed=6)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0,
                   rerun="pytest tests_quality --quality-seeds {seeds}")
    assert v.verdict == "underpowered" and v.seeds_needed > 1, v.format()
    assert f"need {v.seeds_needed} seeds per sentence" in v.format()
    assert f"--quality-seeds {v.seeds_needed}" in v.format()


def test_shown_worse_than_the_margin_fails_whatever_the_size():
    e_ref, e_cand, w = synthetic(60, 0.05, 0.30, seed=7)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w), margin_points=1.0)
    assert v.verdict == "fail" and v.lower > v.margin, v.format()


def test_gate_refuses_to_compare_different_judges():
    e, w = np.array([1, 0, 2]), np.array([10, 10, 10])
    with pytest.raises(stats.JudgeMismatch, match="different judges"):
        stats.gate(scored(e, w, judge="tiny.en"), scored(e, w, judge="large-v3"))


def test_gate_refuses_unpaired_sets():
    a = scored([1, 0], [10, 10])
    b = ScoredSet(("x", "y"), ("x", "y"), np.array([1, 0]), np.array([10, 10]), "judge-A")
    with pytest.raises(ValueError, match="not paired"):
        stats.gate(a, b)


# --- the size rule -----------------------------------------------------------------------------------------------


def test_equivalent_se_from_the_spread_across_seeds_hand_computed():
    # two sentences x 2 seeds: errors (1, 3) and (0, 0); s² = 2 and 0; Var(D_g) = 2 k s² = 8 and 0
    # SE = sqrt(G/(G-1) * 8) / Σwords = sqrt(16) / 40
    groups = ("a", "a", "b", "b")
    se, seeds = stats.equivalent_se(np.array([1, 3, 0, 0]), np.array([10, 10, 10, 10]), groups)
    assert (se, seeds) == (pytest.approx(4 / 40), 2)
    assert stats.equivalent_se(np.array([1, 0]), np.array([10, 10]), ("a", "b")) is None  # one seed: no pilot


def test_seeds_needed_hand_computed():
    # SE must reach margin / (t + z) = 0.01 / (t_{0.975, 49} + z_{0.8}); SE 0.02 at 4 seeds -> 4 (0.02/target)²
    target = 0.01 / (sps.t.ppf(0.975, 49) + sps.norm.ppf(0.8))
    assert stats.seeds_needed(0.02, 4, 0.01, 50) == int(np.ceil(4 * (0.02 / target) ** 2))
    assert stats.seeds_needed(target / 2, 4, 0.01, 50) == 1
