"""ΔWER = WER(candidate) - WER(reference) and the non-inferiority gate, in WER points throughout.

Units: margins and every printed number are WER points (1.0 = one point = 0.01 of corpus WER). `margin_fraction`
converts and refuses a value that looks like a fraction (0.01) or a percentage of nothing (50).

The rule: pass iff the upper confidence bound of ΔWER < margin. "Significantly worse" (lower bound > 0) is
reported beside the verdict, never instead of it: a candidate whose whole interval lies inside the margin passes
however many sentences show it slightly worse.

One statistic, one resampling unit: the studentized corpus ΔWER, T = (Δ - Δtrue) / SE, over sentence blocks
(every seed of a sentence in one block). Δ = ΣD / ΣW with D the block's error difference and W its words; SE by
linearising the ratio: SE² = G/(G-1) Σ (D - Δ W)² / (ΣW)². The critical value is the paired bootstrap-t quantile
of T (blocks resampled with replacement) but never below Student's t with G-1 degrees of freedom; the bounds and
both p-values come from the same T. Student's t as a floor keeps small sets honest; the bootstrap-t quantile
widens the upper bound where damage concentrated in a few sentences makes ΔWER skewed. At ΔWER = margin, spread
or concentrated in 10-20% of the sentences, it passes at most 5% of 400 simulated data sets at the suite's sizes
(tests_quality/test_operating.py; figures in docs/results.md).

Power: an equivalent candidate passes when Δ + c SE < margin with Δ about 0, so SE must be at most
margin / (c + z_power). The reference run's own seeds give the pilot: the variance of a sentence's errors across
seeds s²_g says what an equivalent re-generation's D_g varies by (2 k s²_g for k seeds), hence the SE at k seeds
and the seeds per sentence needed (SE shrinks as 1/sqrt(k)). A run with fewer is "underpowered: need N", not a
chance failure.

SIM and MOS (`score_gate`) are judged scores per clip where higher is better: the loss -score goes through the same
statistic with one "word" per clip (Δ the mean difference, the same blocks, bounds, p-values, pilot and size rule),
and a candidate passes iff the lower bound of Δ = candidate - reference is above -margin (margins with their reasons
below). `Overall` is one verdict over every metric of a candidate: it passes only when all of them pass.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Sequence

import numpy as np
from scipy import stats

from .wer import ScoredSet, corpus_wer

DEFAULT_MARGIN_POINTS = 1.0  # non-inferiority margin: +1.0 WER point, absolute
ALPHA = 0.025  # one-sided: the upper bound is a 97.5% bound (the upper end of a two-sided 95% interval)
POWER = 0.8  # wanted pass probability of an equivalent candidate, for the size rule
BOOTSTRAP_RESAMPLES = 4000
SEED = 20240521  # fixed: the same inputs always give the same bounds
MARGIN_POINTS_RANGE = (0.1, 50.0)


class JudgeMismatch(ValueError):
    """Two result sets were transcribed by different judges and must not be compared."""


def margin_fraction(points: float) -> float:
    """A margin in WER points -> a fraction of corpus WER; refuses values that are not plausible points."""
    low, high = MARGIN_POINTS_RANGE
    if not low <= points <= high:
        hint = f" ({points} looks like a fraction: {100 * points:g} points is written {100 * points:g})" \
            if 0 < points < low else ""
        raise ValueError(f"WER margin {points} is not in [{low}, {high}] WER points; margins are given in points "
                         f"(1.0 = one WER point = 0.01 of corpus WER){hint}")
    return points / 100.0


def margin_points_option(text: str) -> float:
    """argparse type of --wer-margin: WER points, checked by `margin_fraction`."""
    import argparse

    try:
        value = float(text)
        margin_fraction(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return value


def paired_arrays(ref: ScoredSet, cand: ScoredSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(errors_ref [N], errors_cand [N], words [N], groups) after checking the two sets really are paired."""
    if ref.judge != cand.judge:
        raise JudgeMismatch(
            f"results come from different judges and are not comparable:\n  reference: {ref.judge}\n"
            f"  candidate: {cand.judge}\nre-transcribe both sets with the same judge (--judge / FASTPATH_JUDGE)"
        )
    if ref.ids != cand.ids:
        raise ValueError("reference and candidate are not paired: utterance ids differ or are in another order")
    if not np.array_equal(ref.words, cand.words):
        raise ValueError("reference and candidate were scored against different reference texts")
    if ref.groups != cand.groups:
        raise ValueError("reference and candidate group their utterances into different sentence blocks")
    return ref.errors, cand.errors, ref.words, ref.groups


def block_sums(groups: Sequence[str] | None, *arrays: np.ndarray) -> list[np.ndarray]:
    """Sum each [N] array within groups -> [G] arrays, groups in order of first appearance."""
    if groups is None:
        return [np.asarray(a, dtype=np.float64) for a in arrays]
    if len(groups) != len(arrays[0]):
        raise ValueError(f"{len(groups)} group ids for {len(arrays[0])} utterances")
    order = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    index = np.array([order[g] for g in groups])
    return [np.bincount(index, weights=np.asarray(a, dtype=np.float64), minlength=len(order)) for a in arrays]


def linearised_se(d: np.ndarray, w: np.ndarray, delta) -> np.ndarray:
    """SE of Δ = Σd/Σw over the last axis of blocks: sqrt(G/(G-1) Σ (d - Δ w)²) / Σw."""
    g = d.shape[-1]
    delta = np.asarray(delta)[..., None]
    return np.sqrt(g / (g - 1) * np.sum((d - delta * w) ** 2, axis=-1)) / np.sum(w, axis=-1)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Δ with its one-sided bounds at level 1 - alpha each, as fractions; p-values of the two one-sided tests."""

    delta: float
    se: float
    lower: float
    upper: float
    crit_low: float  # the critical values the bounds used (bootstrap-t or Student's t, the larger)
    crit_high: float
    p_worse: float  # H0: Δ <= 0
    n_blocks: int
    t_star: np.ndarray = dataclasses.field(default=None, repr=False, compare=False)  # [B] bootstrap-t values

    def p_noninferior(self, margin: float) -> float:
        """p-value of H0: Δ >= margin (small: shown non-inferior)."""
        if self.se == 0:
            return 0.0 if self.delta < margin else 1.0
        return self._p_below((self.delta - margin) / self.se)

    def _p_below(self, t_obs: float) -> float:
        df = self.n_blocks - 1
        return float(max(np.mean(self.t_star <= t_obs), stats.t.cdf(t_obs, df)))


@functools.lru_cache(maxsize=16)
def resample_counts(g: int, n_resamples: int, seed: int) -> np.ndarray:
    """[B, G] how often each block is drawn in each bootstrap resample (blocks drawn with replacement by a fixed
    seed): a function of the sizes alone, drawn once per size. A resample's sums are then matrix-vector products,
    which the simulations (thousands of data sets of one size) need to be quick."""
    idx = np.random.default_rng(seed).integers(g, size=(n_resamples, g))
    counts = np.zeros((n_resamples, g))
    np.add.at(counts, (np.arange(n_resamples)[:, None], idx), 1.0)
    counts.setflags(write=False)
    return counts


def seeds_per_block(groups: Sequence[str]) -> int:
    """The fewest clips any block has."""
    return min(collections.Counter(groups).values())


def studentized_bounds(errors_ref, errors_cand, words, groups: Sequence[str] | None = None, alpha: float = ALPHA,
                       n_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = SEED) -> Bounds:
    """Paired bootstrap-t of corpus ΔWER over blocks, critical values never below Student's t(G-1)."""
    e_ref, e_cand, w = block_sums(groups, errors_ref, errors_cand, words)
    d = e_cand - e_ref  # [G]
    g = d.size
    if g < 2:
        raise ValueError(f"{g} sentence block: a confidence bound needs at least 2")
    delta = float(d.sum() / w.sum())
    se = float(linearised_se(d, w, delta))
    if se == 0:  # every block moves in proportion to its words (no difference at all, typically): no spread
        return Bounds(delta, 0.0, delta, delta, 0.0, 0.0, 0.0 if delta > 0 else 1.0, g, np.zeros(1))
    counts = resample_counts(g, n_resamples, seed)  # [B, G]
    sum_w = counts @ w  # [B]
    delta_star = (counts @ d) / sum_w
    # Σ (d - Δ* w)² over each resample's blocks, expanded into sums the counts give directly
    resid2 = counts @ (d * d) - 2 * delta_star * (counts @ (d * w)) + delta_star**2 * (counts @ (w * w))
    se_star = np.sqrt(g / (g - 1) * np.maximum(resid2, 0.0)) / sum_w
    se_star = np.where(se_star > 1e-9 * se, se_star, se)  # a resample without spread: the sample's own SE
    t_star = (delta_star - delta) / se_star  # [B]
    student = float(stats.t.ppf(1 - alpha, g - 1))
    crit_high = max(-float(np.quantile(t_star, alpha)), student)
    crit_low = max(float(np.quantile(t_star, 1 - alpha)), student)
    t0 = delta / se
    p_worse = float(max(np.mean(t_star >= t0), stats.t.sf(t0, g - 1)))
    return Bounds(delta, se, delta - crit_low * se, delta + crit_high * se, crit_low, crit_high, p_worse, g,
                  t_star)


def equivalent_se(errors_ref, words, groups: Sequence[str]) -> tuple[float, int] | None:
    """Pilot: the SE an equivalent re-generation of the reference run would give at this size, from the spread of
    each sentence's errors across its seeds. (SE, seeds per sentence); None when sentences have < 2 seeds."""
    order = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    index = np.fromiter((order[g] for g in groups), dtype=np.int64, count=len(groups))
    e = np.asarray(errors_ref, dtype=np.float64)
    n = np.bincount(index, minlength=len(order)).astype(np.float64)  # [G] seeds of each sentence
    seeds = int(n.min())
    if seeds < 2 or len(order) < 2:
        return None
    mean = np.bincount(index, weights=e, minlength=len(order)) / n
    var = np.bincount(index, weights=(e - mean[index]) ** 2, minlength=len(order)) / (n - 1)  # ddof=1
    var_d = 2 * n * var  # Var(D_g) for k seeds
    total_words = float(np.sum(words))
    return float(np.sqrt(len(order) / (len(order) - 1) * var_d.sum()) / total_words), seeds


def seeds_needed(se_now: float, seeds_now: int, margin: float, n_blocks: int, alpha: float = ALPHA,
                 power: float = POWER) -> int:
    """Seeds per sentence for an equivalent candidate to pass with `power`: SE <= margin / (t + z_power), SE
    shrinking as 1/sqrt(seeds)."""
    target = margin / (stats.t.ppf(1 - alpha, n_blocks - 1) + stats.norm.ppf(power))
    return max(1, math.ceil(seeds_now * (se_now / target) ** 2))


def equivalent_pass_probability(se: float, margin: float, n_blocks: int, alpha: float = ALPHA) -> float:
    """About how often a candidate with ΔWER = 0 passes at this SE (normal approximation)."""
    if se == 0:
        return 1.0
    return float(stats.norm.cdf(margin / se - stats.t.ppf(1 - alpha, n_blocks - 1)))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The gate's outcome: `verdict` is "pass", "fail" or "underpowered"; `worse` is reported beside it.
    Fractions inside; `format()` prints points."""

    verdict: str
    delta_wer: float
    lower: float
    upper: float
    se: float
    p_noninferior: float
    p_worse: float
    worse: bool  # the lower bound > 0: significantly worse than the reference (not necessarily beyond the margin)
    wer_ref: float
    wer_cand: float
    margin: float
    n_clips: int
    n_sentences: int
    seeds: int  # per sentence (the fewest any sentence has)
    seeds_needed: int | None  # from the pilot; None when the reference run has one seed per sentence
    pilot: str  # where the size rule's SE came from
    equivalent_pass: float  # estimated pass probability of an equivalent candidate at this size
    n_differing: int
    judge: str
    label: str = ""
    rerun: str = ""  # the command that gives the run the size it needs

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def meaning(self) -> str:
        """The verdict in one plain sentence."""
        pts = lambda x: f"{100 * x:+.2f}"
        margin = f"{100 * self.margin:.2f} WER points"
        if self.verdict == "pass":
            text = (f"shown non-inferior: not worse than the reference by {margin} or more (with {1 - ALPHA:.1%} "
                    f"confidence: upper bound {pts(self.upper)} < margin)")
            if self.worse:
                text += "; measurably worse than the reference, but by less than the margin"
            return text + "; as far as WER can tell, it may ship."
        if self.verdict == "underpowered":
            return (f"undecided, not a failure: this run is too small to show non-inferiority (an equivalent "
                    f"candidate passes about {self.equivalent_pass:.0%} of the time at this size); worse by {margin} "
                    f"or more is neither ruled out (upper bound {pts(self.upper)} >= margin) nor shown (lower bound "
                    f"{pts(self.lower)} < margin); rerun with {self.seeds_needed} seeds per sentence.")
        if self.lower >= self.margin:
            return (f"shown worse than the reference by {margin} or more (lower bound {pts(self.lower)} >= margin): "
                    "it must not ship as far as WER can tell.")
        return (f"not shown non-inferior: worse by {margin} or more is not ruled out (upper bound {pts(self.upper)} "
                f">= margin), at a size where an equivalent candidate passes about {self.equivalent_pass:.0%} of the "
                "time; listen to the worst sentences.")

    def p_lines(self) -> list[str]:
        """The two p-values, each named by the null hypothesis it tests and read in words."""
        small = lambda p: p < ALPHA
        return [
            f"  p-values (small = below {ALPHA:g}, the one-sided alpha; small rejects the hypothesis named):",
            f"    p for H0 \"candidate worse by the margin or more\" (ΔWER >= {100 * self.margin:+.2f} pts) = "
            f"{self.p_noninferior:.4f} ("
            + ("small: shown non-inferior" if small(self.p_noninferior)
               else "not small: worse by the margin or more is not ruled out") + ")",
            f"    p for H0 \"candidate no worse than the reference\" (ΔWER <= 0) = {self.p_worse:.4f} ("
            + ("small: shown worse than the reference, by some amount" if small(self.p_worse)
               else "not small: not shown worse than the reference") + ")",
        ]

    def format(self) -> str:
        pts = lambda x: f"{100 * x:+.2f}"
        head = self.verdict.upper()
        if self.verdict == "underpowered":
            head = f"UNDERPOWERED: need {self.seeds_needed} seeds per sentence"
        size = f"  sentences {self.n_sentences} x seeds {self.seeds} = clips {self.n_clips}  differing {self.n_differing}"
        if self.seeds_needed is not None:
            size += f"  seeds needed for {POWER:.0%} power: {self.seeds_needed} ({self.pilot})"
        lines = [
            f"[{head}] {self.label or 'candidate'} vs reference: non-inferiority at margin {100 * self.margin:.2f} "
            f"WER points (pass iff the {1 - ALPHA:.1%} upper bound < margin)",
            f"  in plain words: {self.meaning()}",
            f"  WER ref {100 * self.wer_ref:.2f}%  cand {100 * self.wer_cand:.2f}%",
            f"  ΔWER {pts(self.delta_wer)} pts  bounds [{pts(self.lower)}, {pts(self.upper)}]  SE {100 * self.se:.2f}"
            + ("  SIGNIFICANTLY WORSE than the reference" if self.worse else ""),
            *self.p_lines(),
            size + f"  equivalent passes ~{self.equivalent_pass:.0%}",
        ]
        if self.verdict == "underpowered" and self.rerun:
            lines.append(f"  rerun: {self.rerun}")
        lines.append(f"  judge: {self.judge}")
        return "\n".join(lines)


def gate(ref: ScoredSet, cand: ScoredSet, margin_points: float = DEFAULT_MARGIN_POINTS, label: str = "",
         rerun: str = "", alpha: float = ALPHA) -> Verdict:
    """Non-inferiority gate over sentence blocks (ScoredSet.groups): "pass" iff the upper bound < margin; else
    "underpowered" when the pilot says this size gives an equivalent candidate less than POWER and the candidate
    is not shown worse than the margin; else "fail". `rerun` (a command with {seeds}) is printed when underpowered."""
    margin = margin_fraction(margin_points)
    e_ref, e_cand, words, groups = paired_arrays(ref, cand)
    b = studentized_bounds(e_ref, e_cand, words, groups, alpha=alpha)
    pilot = equivalent_se(e_ref, words, groups)
    seeds = seeds_per_block(groups)
    if pilot is not None:
        se_eq, _ = pilot
        source = "pilot: the reference run's spread across seeds"
    else:
        se_eq = b.se
        source = "pilot: this comparison's SE (one seed per sentence)"
    needed = seeds_needed(se_eq, seeds, margin, b.n_blocks, alpha) if se_eq > 0 else seeds
    if b.upper < margin:
        verdict = "pass"
    elif needed > seeds and b.lower < margin:
        verdict = "underpowered"
    else:
        verdict = "fail"
    return Verdict(
        verdict=verdict, delta_wer=b.delta, lower=b.lower, upper=b.upper, se=b.se,
        p_noninferior=b.p_noninferior(margin), p_worse=b.p_worse, worse=b.lower > 0,
        wer_ref=corpus_wer(e_ref, words), wer_cand=corpus_wer(e_cand, words), margin=margin,
        n_clips=len(words), n_sentences=b.n_blocks, seeds=seeds, seeds_needed=needed, pilot=source,
        equivalent_pass=equivalent_pass_probability(se_eq, margin, b.n_blocks, alpha),
        n_differing=int(np.count_nonzero(e_ref != e_cand)), judge=ref.judge, label=label,
        rerun=rerun.format(seeds=needed) if rerun else "",
    )


# Margins of the judged scores, higher is better for both: a candidate passes iff the lower confidence bound of
# Δ = candidate - reference is above -margin. Each value with its reason (measured on espeak-ng speech, the table
# of `fastpath-suite audit known-answer --metric sim|mos`, docs/quality.md).
SIM_MARGIN = 0.02
SIM_MARGIN_REASON = ("GE2E cosine; on espeak-ng speech a pitch-and-formant shift of x1.02 costs 0.008, x1.05 0.042 "
                     "and espeak's m2 or m7 variant in place of m1 about 0.1, while the same voice saying another "
                     "sentence varies by 0.008 (sd across seeds): 0.02, about a x1.03 shift, refuses drift well short "
                     "of another speaker and leaves an equivalent set at 60 sentences x 3 seeds ample power")
MOS_MARGIN = 0.1  # for each of DNSMOS's OVRL and P808 (both on the 1-5 MOS scale); MOS passes when both pass
MOS_MARGIN_REASON = ("DNSMOS points; on espeak-ng speech white noise at 20 dB SNR costs 0.3 OVRL and 0.5 P808, "
                     "band-limiting to 4 kHz and clipping at a third of the peak cost about 0.2-0.3 P808 (OVRL does "
                     "not hear them there), while a clip's score varies by 0.17 OVRL and 0.11 P808 across seeds: 0.1 "
                     "refuses each of those damages and leaves an equivalent set at 60 sentences x 3 seeds ample power")
SIM_UNIT = "GE2E cosine"
MOS_FIELDS = (("MOS-OVRL", "ovrl", "DNSMOS P.835 OVRL"), ("MOS-P808", "p808", "DNSMOS P.808"))  # (metric, field, unit)


@dataclasses.dataclass(frozen=True)
class ScoreVerdict:
    """The gate's outcome on a judged score (SIM, MOS) where higher is better: pass iff the lower bound of
    Δ = candidate - reference > -margin. Same statistic as ΔWER (sentence blocks, bootstrap-t never below
    Student's t), in the score's own units."""

    metric: str  # "SIM" | "MOS-OVRL" | "MOS-P808"
    unit: str  # what the numbers are, e.g. "GE2E cosine"
    verdict: str  # pass | fail | underpowered
    delta: float
    lower: float
    upper: float
    se: float
    p_noninferior: float
    p_worse: float
    worse: bool  # the upper bound < 0: significantly worse than the reference
    mean_ref: float
    mean_cand: float
    margin: float
    n_clips: int
    n_sentences: int
    seeds: int
    seeds_needed: int
    equivalent_pass: float
    judge: str
    label: str = ""
    rerun: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def meaning(self) -> str:
        m = f"{self.margin:g} {self.unit}"
        if self.verdict == "pass":
            text = (f"shown non-inferior: not worse than the reference by {m} or more ({1 - ALPHA:.1%} lower bound "
                    f"{self.lower:+.4f} > -margin)")
            return text + ("; measurably worse, but by less than the margin" if self.worse else "") + "."
        if self.verdict == "underpowered":
            return (f"undecided, not a failure: an equivalent candidate passes about {self.equivalent_pass:.0%} at "
                    f"this size; rerun with {self.seeds_needed} seeds per sentence.")
        if self.upper <= -self.margin:
            return f"shown worse than the reference by {m} or more (upper bound {self.upper:+.4f} <= -margin)."
        return f"not shown non-inferior: worse by {m} or more is not ruled out (lower bound {self.lower:+.4f})."

    def p_lines(self) -> list[str]:
        small = lambda p: p < ALPHA
        return [
            f"    p for H0 \"worse by the margin or more\" (Δ{self.metric} <= {-self.margin:+g}) = "
            f"{self.p_noninferior:.4f} (" + ("small: shown non-inferior" if small(self.p_noninferior)
                                             else "not small: not ruled out") + ")",
            f"    p for H0 \"no worse than the reference\" (Δ{self.metric} >= 0) = {self.p_worse:.4f} ("
            + ("small: shown worse, by some amount" if small(self.p_worse) else "not small") + ")",
        ]

    def format(self) -> str:
        head = self.verdict.upper() if self.verdict != "underpowered" else f"UNDERPOWERED: need {self.seeds_needed}"
        return "\n".join([
            f"[{head}] {self.metric} ({self.unit}), margin {self.margin:g}: {self.meaning()}",
            f"  mean ref {self.mean_ref:.4f}  cand {self.mean_cand:.4f}  Δ{self.metric} {self.delta:+.4f}  bounds "
            f"[{self.lower:+.4f}, {self.upper:+.4f}]  SE {self.se:.4f}"
            + ("  SIGNIFICANTLY WORSE" if self.worse else ""),
            *self.p_lines(),
            f"  sentences {self.n_sentences} x seeds {self.seeds} = clips {self.n_clips}  equivalent passes "
            f"~{self.equivalent_pass:.0%}  seeds needed for {POWER:.0%} power: {self.seeds_needed}",
            f"  judge: {self.judge}",
        ])


def score_gate(metric: str, unit: str, ref_scores, cand_scores, groups: Sequence[str], margin: float, judge: str,
               label: str = "", rerun: str = "", alpha: float = ALPHA) -> ScoreVerdict:
    """Non-inferiority of a higher-is-better score per clip ([N] each, paired by position, `groups` the sentence
    of each clip). The loss -score goes through `studentized_bounds` with one "word" per clip, so Δ is the mean
    difference and every seed of a sentence stays in its block; the pilot and size rule are the WER gate's."""
    ref = np.asarray(ref_scores, dtype=np.float64)
    cand = np.asarray(cand_scores, dtype=np.float64)
    if ref.shape != cand.shape or ref.ndim != 1 or len(groups) != ref.size:
        raise ValueError(f"{metric}: {ref.shape} reference and {cand.shape} candidate scores for {len(groups)} clips")
    if not margin > 0:
        raise ValueError(f"{metric} margin {margin} must be > 0 ({unit})")
    ones = np.ones_like(ref)
    b = studentized_bounds(-ref, -cand, ones, groups, alpha=alpha)  # the loss: Δloss = -Δ
    seeds = seeds_per_block(groups)
    pilot = equivalent_se(-ref, ones, groups)
    se_eq = pilot[0] if pilot is not None else b.se
    needed = seeds_needed(se_eq, seeds, margin, b.n_blocks, alpha) if se_eq > 0 else seeds
    lower, upper = -b.upper, -b.lower
    if lower > -margin:
        verdict = "pass"
    elif needed > seeds and upper > -margin:
        verdict = "underpowered"
    else:
        verdict = "fail"
    return ScoreVerdict(
        metric=metric, unit=unit, verdict=verdict, delta=-b.delta, lower=lower, upper=upper, se=b.se,
        p_noninferior=b.p_noninferior(margin), p_worse=b.p_worse, worse=upper < 0, mean_ref=float(ref.mean()),
        mean_cand=float(cand.mean()), margin=margin, n_clips=ref.size, n_sentences=b.n_blocks, seeds=seeds,
        seeds_needed=needed, equivalent_pass=equivalent_pass_probability(se_eq, margin, b.n_blocks, alpha),
        judge=judge, label=label, rerun=rerun.format(seeds=needed) if rerun else "")


@dataclasses.dataclass(frozen=True)
class Overall:
    """One verdict over every metric of a candidate (WER's Verdict, then ScoreVerdicts): pass only when all pass;
    fail when any fails; otherwise underpowered, needing the most seeds any metric asks for."""

    verdicts: tuple
    label: str = ""

    @property
    def verdict(self) -> str:
        kinds = [v.verdict for v in self.verdicts]
        return "fail" if "fail" in kinds else "underpowered" if "underpowered" in kinds else "pass"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def seeds_needed(self) -> int:
        return max(v.seeds_needed or 0 for v in self.verdicts if v.verdict == "underpowered") \
            if self.verdict == "underpowered" else 0

    def metric(self, v) -> str:
        return getattr(v, "metric", "WER")

    def format(self) -> str:
        head = self.verdict.upper() if self.verdict != "underpowered" else \
            f"UNDERPOWERED: need {self.seeds_needed} seeds per sentence"
        summary = ", ".join(f"{self.metric(v)} {v.verdict}" for v in self.verdicts)
        lines = [f"[{head}] {self.label or 'candidate'}: {summary} (passes only when every metric passes)"]
        return "\n".join(lines + [v.format() for v in self.verdicts])
