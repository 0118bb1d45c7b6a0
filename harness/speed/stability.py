"""When a timing is a measurement: the rule that prints "unstable" instead of a speedup, and its rates.

Interleaved rounds (stock, lossless, stock, lossless, ...) make the ratio of two variants fair under a steady load:
a load that slows every call alike slows both sides of each round's ratio alike. What breaks a ratio is load that
comes and goes between the calls of one round. So the rule judges the spread of the per-round ratios, not the load:

    q_r = RTF(base, round r) / RTF(variant, round r)          one ratio per interleaved round
    unstable  when  (max_r q_r - min_r q_r) / median_r q_r  >  MAX_RATIO_SPREAD  for any compared variant

With fewer than MIN_ROUNDS rounds a spread says nothing, so the timing is "unjudged" and no speedup is printed.
A run compared with a stored run (`fastpath-suite compare`) has no rounds in common with it; there the rule is
each side's relative spread, IQR / median of its samples, against MAX_SAMPLE_SPREAD.

The load average (1-minute, os.getloadavg) is read after every timed call and the highest value is named in the
message, so the reader sees why; it does not enter the rule.

`fastpath-suite audit stability` (harness/audit/under_load.py) measures how often the rule calls a quiet machine's run
unstable and how often a run disturbed by intermittent load passes as stable; its results file is rendered in
docs/results.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The per-round ratios of a run may span at most 40% of their median. Chosen from a first run on a quiet 2-core
# EPYC (per-call spread about 9% there, so a ratio's about 12%: the range of 3 normal samples stays under 3.3 sd,
# 0.40, 95% of the time), where quiet windows spanned up to 0.39 and intermittently loaded ones at least 0.48;
# the rates in docs/results.md are from later runs, not from the one the threshold was read off.
MAX_RATIO_SPREAD = 0.40
MAX_SAMPLE_SPREAD = 0.25  # a stored run's IQR may be at most 25% of its median (compare)
MIN_ROUNDS = 3


def advice(load: float | None) -> str:
    during = f" (load average {load:.1f} during the run)" if load is not None else ""
    return f"unstable: rerun on an idle machine{during}"


@dataclass(frozen=True)
class Judgement:
    """The rule's outcome for one point: `stable`, the spread per compared variant, the highest load seen."""

    stable: bool
    spreads: dict
    load: float | None
    rounds: int

    @property
    def judged(self) -> bool:
        """Enough rounds for the rule to say anything: fewer are "unjudged", neither stable nor unstable."""
        return self.rounds >= MIN_ROUNDS

    @property
    def verdict(self) -> str:
        """One word for a table cell: "stable", "unstable" or "unjudged"."""
        return "unjudged" if not self.judged else "stable" if self.stable else "unstable"

    @property
    def message(self) -> str:
        if not self.judged:
            return f"unjudged: {self.rounds} round(s); at least {MIN_ROUNDS} show whether the timing holds"
        return "stable" if self.stable else advice(self.load)


def ratio_spread(base: list, other: list) -> float:
    """(max - min) / median of the per-round ratios base[r] / other[r]."""
    ratios = [b / o for b, o in zip(base, other, strict=True)]
    return (max(ratios) - min(ratios)) / statistics.median(ratios)


def judge(samples: dict) -> Judgement:
    """samples: variant -> measure.Samples of one point, the first the base the others are compared with."""
    base, *others = samples.values()
    loads = [x for s in samples.values() for x in getattr(s, "load", []) if x is not None]
    return judge_rounds(base.rtf, {o.name: o.rtf for o in others}, max(loads) if loads else None)


def judge_rounds(base: list, others: dict, load: float | None = None) -> Judgement:
    """The rule on plain per-round values: base[r] against each of others (name -> values, same rounds)."""
    rounds = len(base)
    if rounds < 2:
        return Judgement(False, {}, load, rounds)
    spreads = {name: ratio_spread(base, values) for name, values in others.items()}
    stable = rounds >= MIN_ROUNDS and all(s <= MAX_RATIO_SPREAD for s in spreads.values())
    return Judgement(stable, spreads, load, rounds)


def sample_spread(samples) -> float:
    """IQR / median of one run's samples (the compare rule)."""
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return (q[2] - q[0]) / statistics.median(samples)
