"""Paired statistics for ΔWER = WER(candidate) - WER(reference), and the non-inferiority gate.

Procedures, all over utterances paired by id (or over blocks of them when `groups` are given):
  * CI: paired bootstrap (Bisani & Ney 2004) of the corpus-level ΔWER (a ratio of sums), 95% BCa interval
    from `scipy.stats.bootstrap(paired=True, method="BCa")`; blocks are resampled whole, which for a ratio of
    sums is the same as bootstrapping per-block sums.
  * probability of improvement: fraction of bootstrap resamples with Δ < 0.
  * p-value: two-sided paired sign-flip permutation test on per-block error differences
    (`scipy.stats.permutation_test(permutation_type="samples")`, exact when 2**n_blocks <= n_resamples).
    Under the sign flip the word total is fixed, so sum(d) orders resamples exactly as Δ does.
  * MDE = (z_{1-α/2} + z_{power}) * SE(Δ), SE from the bootstrap distribution, power 0.8.
  * sentences needed when undecided: n * (CI half-width / (margin - Δ))**2, since the half-width shrinks as
    1/sqrt(n) and the gate needs Δ + half-width < margin.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

from .wer import ScoredSet, corpus_wer

DEFAULT_MARGIN = 0.01  # +1.0 WER point, absolute
BOOTSTRAP_RESAMPLES = 4000
PERMUTATION_RESAMPLES = 9999
SEED = 20240521  # fixed: the same inputs always give the same CI and p-value


class JudgeMismatch(ValueError):
    """Two result sets were transcribed by different judges and must not be compared."""


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


def delta_wer(errors_ref, errors_cand, words, axis=-1):
    """Corpus ΔWER of each resample: [..., N] -> [...]."""
    return (np.sum(errors_cand, axis=axis) - np.sum(errors_ref, axis=axis)) / np.sum(words, axis=axis)


@dataclasses.dataclass(frozen=True)
class BootstrapResult:
    delta: float
    ci_low: float
    ci_high: float
    se: float
    prob_improvement: float
    method: str  # "BCa", or "degenerate" when no block differs


def paired_bootstrap(
    errors_ref,
    errors_cand,
    words,
    groups: Sequence[str] | None = None,
    confidence: float = 0.95,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = SEED,
) -> BootstrapResult:
    """BCa CI of corpus ΔWER, resampling utterances (or whole groups) with replacement."""
    e_ref, e_cand, w = block_sums(groups, errors_ref, errors_cand, words)
    delta = float(delta_wer(e_ref, e_cand, w))
    if np.array_equal(e_ref, e_cand):  # every resample gives exactly 0; BCa is undefined there
        return BootstrapResult(delta, delta, delta, 0.0, 0.0, "degenerate")
    res = stats.bootstrap(
        (e_ref, e_cand, w),
        delta_wer,
        paired=True,
        vectorized=True,
        method="BCa",
        confidence_level=confidence,
        n_resamples=n_resamples,
        rng=np.random.default_rng(seed),
    )
    dist = res.bootstrap_distribution
    return BootstrapResult(
        delta=delta,
        ci_low=float(res.confidence_interval.low),
        ci_high=float(res.confidence_interval.high),
        se=float(res.standard_error),
        prob_improvement=float(np.mean(dist < 0)),
        method="BCa",
    )


def sign_flip_pvalue(
    errors_ref,
    errors_cand,
    groups: Sequence[str] | None = None,
    n_resamples: int = PERMUTATION_RESAMPLES,
    seed: int = SEED,
) -> float:
    """Two-sided p-value of H0 'per-block error differences are symmetric about 0' (paired sign-flip test)."""
    e_ref, e_cand = block_sums(groups, errors_ref, errors_cand)
    d = e_cand - e_ref  # [G]
    d = d[d != 0]  # a zero flips to itself; dropping zeros lets scipy enumerate all 2**k flips when it can
    if d.size <= 1:  # the flips give {+d, -d}: both as extreme as observed, so p = 1 exactly
        return 1.0
    res = stats.permutation_test(
        (d,),
        lambda x, axis: np.sum(x, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(res.pvalue)


def minimum_detectable_effect(se: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """MDE = (z_{1-α/2} + z_{power}) * SE: the true Δ a two-sided level-α test detects with this power."""
    return (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * se


def sentences_needed(n: int, half_width: float, delta: float, margin: float) -> int | None:
    """n * (half_width / (margin - Δ))**2, rounded up; None when Δ >= margin (no n makes the gate pass)."""
    if delta >= margin:
        return None
    return max(n + 1, math.ceil(n * (half_width / (margin - delta)) ** 2))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of the non-inferiority gate; `verdict` is "pass", "worse" or "inconclusive"."""

    verdict: str
    delta_wer: float
    ci_low: float
    ci_high: float
    p_value: float
    prob_improvement: float
    mde: float
    se: float
    wer_ref: float
    wer_cand: float
    margin: float
    n_sentences: int
    n_groups: int
    n_differing: int
    n_needed: int | None
    judge: str
    label: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def format(self) -> str:
        needed = ""
        if self.verdict == "inconclusive":
            needed = (
                f"\n  sentences needed: {self.n_needed} (n * (CI half-width / (margin - ΔWER))^2)"
                if self.n_needed is not None
                else "\n  sentences needed: none suffices, ΔWER point estimate is at or above the margin"
            )
        return (
            f"[{self.verdict.upper()}] {self.label or 'candidate'} vs reference (non-inferiority, "
            f"margin {100 * self.margin:+.2f} WER points)\n"
            f"  WER ref {100 * self.wer_ref:.2f}%  cand {100 * self.wer_cand:.2f}%\n"
            f"  ΔWER {100 * self.delta_wer:+.2f} pts  95% CI [{100 * self.ci_low:+.2f}, {100 * self.ci_high:+.2f}]"
            f"  p={self.p_value:.4f}  P(improve)={self.prob_improvement:.3f}  MDE {100 * self.mde:.2f} pts\n"
            f"  sentences {self.n_sentences}  groups {self.n_groups}  differing {self.n_differing}"
            f"{needed}\n  judge: {self.judge}"
        )


def gate(
    ref: ScoredSet,
    cand: ScoredSet,
    margin: float = DEFAULT_MARGIN,
    alpha: float = 0.05,
    label: str = "",
    use_groups: bool = True,
) -> Verdict:
    """Non-inferiority gate: pass iff the upper 95% CI bound of ΔWER < margin and the candidate is not
    significantly worse (CI lower bound > 0 and p < alpha fails as "worse"); otherwise "inconclusive"."""
    e_ref, e_cand, words, groups = paired_arrays(ref, cand)
    groups = groups if use_groups else None
    boot = paired_bootstrap(e_ref, e_cand, words, groups, confidence=1 - alpha)
    p = sign_flip_pvalue(e_ref, e_cand, groups)
    n_groups = len(set(groups)) if groups is not None else len(words)
    if boot.ci_low > 0 and p < alpha:
        verdict = "worse"
    elif boot.ci_high < margin:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    half_width = (boot.ci_high - boot.ci_low) / 2
    return Verdict(
        verdict=verdict,
        delta_wer=boot.delta,
        ci_low=boot.ci_low,
        ci_high=boot.ci_high,
        p_value=p,
        prob_improvement=boot.prob_improvement,
        mde=minimum_detectable_effect(boot.se, alpha),
        se=boot.se,
        wer_ref=corpus_wer(e_ref, words),
        wer_cand=corpus_wer(e_cand, words),
        margin=margin,
        n_sentences=len(words),
        n_groups=n_groups,
        n_differing=int(np.count_nonzero(e_ref != e_cand)),
        n_needed=sentences_needed(len(words), half_width, boot.delta, margin) if verdict == "inconclusive" else None,
        judge=ref.judge,
        label=label,
    )
