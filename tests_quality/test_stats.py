"""Statistics of the gate against hand-computed cases: units, the rule, the bounds, the size rule."""

from __future__ import annotations

import argparse
import dataclasses

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


# --- every field, computed apart from the code -----------------------------------------------------------------


def block_se(d, w):
    """The linearised SE of Σd/Σw over blocks, written out: sqrt(G/(G-1) Σ (d - Δ w)²) / Σw."""
    g, delta = len(d), d.sum() / w.sum()
    return np.sqrt(g / (g - 1) * np.sum((d - delta * w) ** 2)) / w.sum()


def test_linearised_se_of_a_batch_is_each_rows_own_se_over_its_blocks():
    # [B=2, G=3]: the blocks are the last axis, so B must not stand in for G, nor one row's words for another's
    d = np.array([[1.0, -1.0, 2.0], [0.0, 3.0, 1.0]])
    w = np.array([[10.0, 10.0, 20.0], [5.0, 15.0, 30.0]])
    delta = d.sum(axis=1) / w.sum(axis=1)
    got = stats.linearised_se(d, w, delta)
    assert got.shape == (2,)
    np.testing.assert_allclose(got, [block_se(d[0], w[0]), block_se(d[1], w[1])], rtol=1e-12)


def test_studentized_bounds_are_a_bootstrap_t_over_the_blocks_floored_at_students_t():
    """A direct bootstrap-t (each resample's blocks summed and its own SE computed, no algebra) on skewed damage
    at alpha 0.05: every field of Bounds, the critical values never below Student's t(G-1)."""
    rng = np.random.default_rng(11)
    groups = np.repeat([f"s{i}" for i in range(12)], 2)
    w = np.repeat(rng.integers(6, 21, 12), 2)
    e_ref = rng.binomial(w, 0.08)
    e_cand = e_ref + np.where(np.isin(groups, ["s0", "s1"]), 5, rng.binomial(1, 0.2, w.size))
    b = stats.studentized_bounds(e_ref, e_cand, w, groups, alpha=0.05, n_resamples=300, seed=7)

    d = (e_cand - e_ref).reshape(12, 2).sum(axis=1).astype(float)  # [G] blocks: the two seeds of a sentence
    wb = w.reshape(12, 2).sum(axis=1).astype(float)
    g, delta, se = 12, d.sum() / wb.sum(), block_se(d, wb)
    idx = np.random.default_rng(7).integers(g, size=(300, g))  # blocks drawn with replacement by the seed
    t_star = np.array([(d[i].sum() / wb[i].sum() - delta) / block_se(d[i], wb[i]) for i in idx])
    student = sps.t.ppf(0.95, g - 1)
    crit_high = max(-np.quantile(t_star, 0.05), student)
    crit_low = max(np.quantile(t_star, 0.95), student)
    assert -np.quantile(t_star, 0.05) > student, "the damage is meant to be skewed enough for the bootstrap to widen"
    assert (b.delta, b.se, b.n_blocks) == (pytest.approx(delta, rel=1e-12), pytest.approx(se, rel=1e-12), g)
    assert (b.crit_high, b.crit_low) == (pytest.approx(crit_high, rel=1e-9), pytest.approx(crit_low, rel=1e-9))
    assert (b.lower, b.upper) == (pytest.approx(delta - crit_low * se, rel=1e-9),
                                  pytest.approx(delta + crit_high * se, rel=1e-9))
    t0 = delta / se
    assert b.p_worse == pytest.approx(max(np.mean(t_star >= t0), sps.t.sf(t0, g - 1)), rel=1e-9)
    np.testing.assert_allclose(b.t_star, t_star, rtol=1e-9)
    # H0: delta >= margin, the larger of the bootstrap's and Student's p, at margins where the two differ
    differ = 0
    for margin in (0.05, 0.1, 0.2):
        t_obs = (delta - margin) / se
        boot, student_p = np.mean(t_star <= t_obs), sps.t.cdf(t_obs, g - 1)
        differ += abs(boot - student_p) > 1e-3
        assert b.p_noninferior(margin) == pytest.approx(max(boot, student_p), rel=1e-9), margin
    assert differ, "at some margin the bootstrap's p and Student's must differ, or the larger of them is not tested"


def test_a_bound_needs_two_sentence_blocks():
    with pytest.raises(ValueError, match=r"^1 sentence block: a confidence bound needs at least 2$"):
        stats.studentized_bounds([1, 0], [2, 1], [10, 10], groups=["a", "a"])
    two = stats.studentized_bounds([1, 0], [2, 2], [10, 10])  # two blocks are enough
    assert two.n_blocks == 2 and two.se > 0


@pytest.mark.parametrize("extra, p_worse", [(1, 0.0), (-1, 1.0)])
def test_a_difference_in_proportion_to_the_words_has_no_spread(extra, p_worse):
    """Each block moves by exactly its words x 1%: SE 0, both bounds at Δ, and "no worse" is rejected (p 0) when
    Δ > 0, kept (p 1) when Δ < 0."""
    w = np.array([100, 200, 300])
    e_ref = np.array([5, 9, 20])
    b = stats.studentized_bounds(e_ref, e_ref + extra * w // 100, w)
    delta = extra * 0.01
    assert b == stats.Bounds(delta, 0.0, delta, delta, 0.0, 0.0, p_worse, 3), b


def test_equivalent_se_of_uneven_seeds_is_the_spread_of_each_sentence_across_its_seeds():
    # sentences of 3, 2 and 4 seeds; the fewest (2) is reported
    groups = ["a", "a", "a", "b", "b", "c", "c", "c", "c"]
    errors = np.array([1, 4, 2, 0, 3, 5, 5, 1, 2])
    words = np.array([12, 12, 12, 8, 8, 20, 20, 20, 20])
    se, seeds = stats.equivalent_se(errors, words, groups)
    var_d = [2 * len(x) * np.var(x, ddof=1) for x in (errors[:3], errors[3:5], errors[5:])]
    assert seeds == 2
    assert se == pytest.approx(np.sqrt(3 / 2 * sum(var_d)) / words.sum(), rel=1e-12)


def wer_expected(e_ref, e_cand, w, groups, margin_points, alpha, rerun, label):
    """The WER gate's verdict computed apart: the bounds from studentized_bounds at the same alpha, the rest by hand."""
    margin = margin_points / 100
    b = stats.studentized_bounds(e_ref, e_cand, w, groups, alpha=alpha)
    names = list(dict.fromkeys(groups))
    per = [np.asarray(e_ref)[np.asarray(groups) == g] for g in names]
    seeds, n_blocks = min(len(x) for x in per), len(names)
    if seeds >= 2:
        words = float(np.sum(w))
        se_eq = np.sqrt(n_blocks / (n_blocks - 1) * sum(2 * len(x) * np.var(x, ddof=1) for x in per)) / words
        pilot = "pilot: the reference run's spread across seeds"
    else:
        se_eq, pilot = b.se, "pilot: this comparison's SE (one seed per sentence)"
    t = sps.t.ppf(1 - alpha, n_blocks - 1)
    needed = max(1, int(np.ceil(seeds * (se_eq * (t + sps.norm.ppf(0.8)) / margin) ** 2))) if se_eq > 0 else seeds
    verdict = ("pass" if b.upper < margin else "underpowered" if needed > seeds and b.lower < margin else "fail")
    return dict(verdict=verdict, delta_wer=pytest.approx(np.sum(e_cand - e_ref) / np.sum(w), rel=1e-12),
                lower=b.lower, upper=b.upper, se=b.se, p_noninferior=b.p_noninferior(margin), p_worse=b.p_worse,
                worse=bool(b.lower > 0), wer_ref=pytest.approx(np.sum(e_ref) / np.sum(w), rel=1e-12),
                wer_cand=pytest.approx(np.sum(e_cand) / np.sum(w), rel=1e-12), margin=margin, n_clips=len(w),
                n_sentences=n_blocks, seeds=seeds, seeds_needed=needed, pilot=pilot,
                equivalent_pass=pytest.approx(sps.norm.cdf(margin / se_eq - t) if se_eq > 0 else 1.0, rel=1e-9),
                n_differing=int(np.sum(np.asarray(e_ref) != np.asarray(e_cand))), judge="judge-A", label=label,
                rerun=rerun.format(seeds=needed) if rerun else "")


@pytest.mark.parametrize("seeds", [3, 1])
def test_every_field_of_the_wer_verdict_at_a_non_default_alpha(seeds):
    """Each field of Verdict against its definition (module docstring), with the pilot from the seeds of a sentence
    or, at one seed, from the comparison's own SE; alpha 0.05 reaches the bounds and the size rule."""
    rng = np.random.default_rng(30 + seeds)
    groups = list(np.repeat([f"s{i}" for i in range(15)], seeds))
    w = np.repeat(rng.integers(6, 21, 15), seeds)
    e_ref, e_cand = rng.binomial(w, 0.1), rng.binomial(w, 0.12)
    rerun = "pytest tests_quality --quality-seeds {seeds}"
    v = stats.gate(scored(e_ref, w, groups=groups), scored(e_cand, w, groups=groups), margin_points=1.5,
                   label="demo", rerun=rerun, alpha=0.05)
    want = wer_expected(e_ref, e_cand, w, groups, 1.5, 0.05, rerun, "demo")
    assert dataclasses.asdict(v) == want, v.format()
    assert want["seeds_needed"] != seeds and want["verdict"] == "underpowered"  # the case meant: a size rule at work


def test_the_wer_gate_defaults_to_a_one_point_margin_at_alpha_0025_and_no_rerun():
    e_ref, e_cand, w = synthetic(30, 0.1, 0.1, seed=12)
    v = stats.gate(scored(e_ref, w), scored(e_cand, w))
    assert dataclasses.asdict(v) == wer_expected(e_ref, e_cand, w, [f"u{i:03d}" for i in range(30)], 1.0, 0.025,
                                                 "", "")


def test_exactly_at_the_margin_the_wer_gate_fails():
    """Every block 1 point worse (SE 0): the bounds sit on the margin. "pass" needs the upper bound strictly under
    it, "underpowered" the lower bound strictly under it, so this is "fail" though the pilot asks for more seeds."""
    groups, w = ["a", "a", "b", "b"], [100, 100, 100, 100]
    v = stats.gate(scored([0, 2, 0, 2], w, groups=groups), scored([1, 3, 1, 3], w, groups=groups), margin_points=1.0)
    assert (v.lower, v.upper, v.margin) == (0.01, 0.01, 0.01) and v.seeds_needed > v.seeds == 2, v.format()
    assert v.verdict == "fail", v.format()


def test_a_reference_without_spread_across_seeds_needs_no_more_seeds_so_an_open_bound_fails():
    """The pilot sees no spread (each sentence's errors equal across its seeds): the run has the seeds it needs
    (seeds_needed = seeds), so a bound that leaves the margin open is "fail", not "underpowered"."""
    groups = list(np.repeat(["a", "b", "c", "d", "e"], 2))
    w = np.full(10, 20)
    e_ref = np.repeat([2, 1, 3, 0, 2], 2)
    e_cand = e_ref + np.array([0, 1, 2, 0, 0, 1, 0, 0, 1, 0])
    v = stats.gate(scored(e_ref, w, groups=groups), scored(e_cand, w, groups=groups), margin_points=1.0)
    assert v.lower < v.margin < v.upper, v.format()
    assert (v.seeds_needed, v.pilot, v.verdict) == (2, "pilot: the reference run's spread across seeds", "fail")


def score_expected(metric, unit, ref, cand, groups, margin, alpha, rerun, label):
    """The score gate's verdict computed apart: Δ = cand - ref, its bounds the loss's negated and swapped."""
    ref, cand = np.asarray(ref, float), np.asarray(cand, float)
    b = stats.studentized_bounds(-ref, -cand, np.ones_like(ref), groups, alpha=alpha)
    names = list(dict.fromkeys(groups))
    per = [ref[np.asarray(groups) == g] for g in names]
    seeds, n_blocks = min(len(x) for x in per), len(names)
    se_eq = (np.sqrt(n_blocks / (n_blocks - 1) * sum(2 * len(x) * np.var(x, ddof=1) for x in per)) / ref.size
             if seeds >= 2 else b.se)
    t = sps.t.ppf(1 - alpha, n_blocks - 1)
    needed = max(1, int(np.ceil(seeds * (se_eq * (t + sps.norm.ppf(0.8)) / margin) ** 2))) if se_eq > 0 else seeds
    lower, upper = -b.upper, -b.lower
    verdict = "pass" if lower > -margin else "underpowered" if needed > seeds and upper > -margin else "fail"
    return dict(metric=metric, unit=unit, verdict=verdict, delta=pytest.approx(np.mean(cand - ref), rel=1e-9),
                lower=lower, upper=upper, se=b.se, p_noninferior=b.p_noninferior(margin), p_worse=b.p_worse,
                worse=bool(upper < 0), mean_ref=pytest.approx(ref.mean(), rel=1e-12),
                mean_cand=pytest.approx(cand.mean(), rel=1e-12), margin=margin, n_clips=ref.size,
                n_sentences=n_blocks, seeds=seeds, seeds_needed=needed,
                equivalent_pass=pytest.approx(sps.norm.cdf(margin / se_eq - t) if se_eq > 0 else 1.0, rel=1e-9),
                judge="ge2e", label=label, rerun=rerun.format(seeds=needed) if rerun else "")


@pytest.mark.parametrize("shift", [-0.03, 0.01])
def test_every_field_of_the_score_verdict_at_a_non_default_alpha(shift):
    """Each field of ScoreVerdict against its definition: Δ = candidate - reference (higher is better), bounds at
    alpha 0.05, worse iff the upper bound is under 0; a drop beyond the margin and a small gain."""
    rng = np.random.default_rng(40)
    groups = list(np.repeat([f"s{i}" for i in range(10)], 2))
    ref = 0.8 + rng.normal(0, 0.02, 20)
    cand = ref + shift + rng.normal(0, 0.01, 20)
    rerun = "rerun --seeds {seeds}"
    v = stats.score_gate("SIM", "GE2E cosine", ref, cand, groups, 0.02, "ge2e", label="demo", rerun=rerun, alpha=0.05)
    assert dataclasses.asdict(v) == score_expected("SIM", "GE2E cosine", ref, cand, groups, 0.02, 0.05, rerun,
                                                   "demo"), v.format()
    assert v.worse == (shift < 0) and v.seeds_needed != v.seeds, v.format()


def test_the_score_gate_defaults_to_alpha_0025_and_no_rerun():
    rng = np.random.default_rng(41)
    groups = list(np.repeat([f"s{i}" for i in range(8)], 3))
    ref, cand = 3.0 + rng.normal(0, 0.1, 24), 3.0 + rng.normal(0, 0.1, 24)
    v = stats.score_gate("MOS-OVRL", "DNSMOS P.835 OVRL", ref, cand, groups, 0.1, "ge2e")
    assert dataclasses.asdict(v) == score_expected("MOS-OVRL", "DNSMOS P.835 OVRL", ref, cand, groups, 0.1, 0.025,
                                                   "", "")


def test_exactly_at_the_margin_the_score_gate_fails():
    """Every clip exactly the margin lower (SE 0): the lower bound sits on -margin, which is not above it, and the
    upper bound is not above it either, so "fail" though the pilot asks for more seeds."""
    ref = np.array([3.0, 3.5, 4.0, 4.5])
    v = stats.score_gate("MOS-OVRL", "DNSMOS", ref, ref - 0.5, ["a", "a", "b", "b"], 0.5, "dnsmos")
    assert (v.lower, v.upper) == (-0.5, -0.5) and v.seeds_needed > v.seeds == 2, v.format()
    assert v.verdict == "fail", v.format()


def test_an_open_interval_still_under_the_margin_with_too_few_seeds_is_underpowered_not_failed():
    """The lower bound is past -margin and the upper one inside (-margin, +margin): more seeds could still pass it,
    and the reference's seed spread asks for more, so "underpowered"."""
    groups = list(np.repeat(["a", "b", "c", "d"], 2))
    ref = np.array([0.80, 0.84, 0.70, 0.74, 0.90, 0.86, 0.75, 0.79])
    cand = ref + np.array([-0.05, 0.0, -0.04, 0.02, 0.0, 0.0, -0.03, 0.01])
    v = stats.score_gate("SIM", "GE2E cosine", ref, cand, groups, 0.02, "ge2e")
    assert v.lower < -v.margin < v.upper < v.margin and v.seeds_needed > v.seeds, v.format()
    assert v.verdict == "underpowered", v.format()


def test_a_score_reference_without_spread_across_seeds_needs_no_more_seeds_so_an_open_bound_fails():
    groups = list(np.repeat(["a", "b", "c", "d", "e"], 2))
    ref = np.repeat([0.8, 0.7, 0.9, 0.75, 0.85], 2)
    cand = ref + np.array([0.0, -0.1, -0.05, 0.0, 0.02, -0.08, 0.0, 0.01, -0.06, 0.0])
    v = stats.score_gate("SIM", "GE2E cosine", ref, cand, groups, 0.02, "ge2e")
    assert v.lower < -v.margin < v.upper, v.format()
    assert (v.seeds_needed, v.verdict) == (2, "fail"), v.format()


def test_identical_sets_are_not_significantly_worse_on_any_metric():
    """No difference at all puts a bound exactly on 0: "significantly worse" needs it strictly past 0."""
    e, w = np.array([1, 0, 2, 1]), np.array([10, 12, 9, 11])
    v = stats.gate(scored(e, w), scored(e, w))
    s = stats.score_gate("SIM", "GE2E cosine", [0.8, 0.7, 0.9], [0.8, 0.7, 0.9], ["a", "b", "c"], 0.02, "ge2e")
    assert (v.lower, v.worse, s.upper, s.worse) == (0.0, False, 0.0, False), (v.format(), s.format())
