"""Operating characteristics of the gate by simulation, where the truth is known.

A data set: G sentences x k seeds. Sentence difficulty p_g ~ Beta(1, b) with mean `wer`; each clip's error rate
~ Beta(c p_g, c (1 - p_g)) (clips of one sentence vary around it, `c` the concentration); errors ~ Binomial(words,
rate). The reference and an equivalent candidate are two such draws (every clip re-generated). A worse candidate
adds errors with expectation `delta` x words: "spread" over every clip (Poisson), or "concentrated" in a fraction
of the sentences (all their seeds; gamma-mixed Poisson, so a damaged clip loses zero to several words).

    python -m harness.quality.simulate --sentences 48 --seeds 40      # README "Quality tier", real-checkpoint size
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from .stats import gate, margin_fraction
from .wer import ScoredSet

PATTERNS = (("spread", 0.0), ("concentrated", 0.1), ("concentrated", 0.2))


@dataclasses.dataclass(frozen=True)
class Model:
    sentences: int
    seeds: int
    wer: float = 0.06  # corpus WER of the reference
    concentration: float = 8.0  # how closely a sentence's clips follow its difficulty (lower: noisier seeds)
    words: tuple = (6, 21)  # words per sentence ~ integers in [low, high)

    def draw(self, rng, delta: float = 0.0, pattern: str = "spread", fraction: float = 0.0) -> tuple:
        """(reference ScoredSet, candidate ScoredSet) with true ΔWER = delta (a fraction)."""
        g, k = self.sentences, self.seeds
        w = np.repeat(rng.integers(*self.words, g)[:, None], k, 1)  # [G, k]
        p_g = rng.beta(1.0, (1 - self.wer) / self.wer, g)[:, None] * np.ones((1, k))
        c = self.concentration

        def clips():
            return rng.binomial(w, rng.beta(np.maximum(c * p_g, 1e-3), np.maximum(c * (1 - p_g), 1e-3)))

        ref, cand = clips(), clips()
        if delta > 0 and pattern == "spread":
            cand = cand + rng.poisson(delta * w)
        elif delta > 0:
            chosen = rng.choice(g, max(1, round(fraction * g)), replace=False)
            rate = np.zeros((g, k))
            rate[chosen] = delta * w.sum() / w[chosen].sum()
            cand = cand + rng.poisson(rate * w * rng.gamma(0.5, 2.0, (g, k)))
        ids = tuple(f"s{i}#{j}" for i in range(g) for j in range(k))
        groups = tuple(f"s{i}" for i in range(g) for _ in range(k))
        wf = w.reshape(-1)
        return (ScoredSet(ids, groups, ref.reshape(-1), wf, "sim"), ScoredSet(ids, groups, cand.reshape(-1), wf, "sim"))


def pass_rate(model: Model, margin_points: float, delta_points: float, pattern: str, fraction: float,
              datasets: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    margin_fraction(margin_points)  # refuses a margin that is not in WER points
    delta = delta_points / 100.0
    passes = 0
    for _ in range(datasets):
        ref, cand = model.draw(rng, delta, pattern, fraction)
        passes += gate(ref, cand, margin_points=margin_points).passed
    return passes / datasets


def table(model: Model, margin_points: float, datasets: int, seed: int = 1) -> list[tuple]:
    """Rows (case, true ΔWER points, pass rate)."""
    rows = [("equivalent (every clip re-generated)", 0.0, pass_rate(model, margin_points, 0.0, "spread", 0, datasets, seed))]
    for pattern, fraction in PATTERNS:
        name = pattern if not fraction else f"{pattern} in {fraction:.0%} of sentences"
        for times in (1.0, 2.0):
            rows.append((f"worse, {name}", times * margin_points,
                         pass_rate(model, margin_points, times * margin_points, pattern, fraction, datasets, seed)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.quality.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--wer", type=float, default=0.06)
    parser.add_argument("--concentration", type=float, default=8.0,
                        help="how closely a sentence's clips follow its difficulty (espeak + tiny.en: about 40)")
    parser.add_argument("--margin", type=float, default=1.0, help="WER points")
    parser.add_argument("--datasets", type=int, default=400)
    args = parser.parse_args(argv)
    model = Model(args.sentences, args.seeds, args.wer, args.concentration)
    print(f"{model}, margin {args.margin} points, {args.datasets} data sets per row")
    print("| case | true ΔWER (points) | gate passes |\n|---|---|---|")
    for name, delta, rate in table(model, args.margin, args.datasets):
        print(f"| {name} | {delta:+.1f} | {rate:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
