"""Operating characteristics of the gate by simulation, where the truth is known.

A data set: G sentences x k seeds. Sentence difficulty p_g ~ Beta(1, b) with mean `wer`; each clip's error rate
~ Beta(c p_g, c (1 - p_g)) (clips of one sentence vary around it, `c` the concentration); errors ~ Binomial(words,
rate). The reference and an equivalent candidate are two such draws (every clip re-generated). A worse candidate
adds errors with expectation `delta` x words: "spread" over every clip (Poisson), or "concentrated" in a fraction
of the sentences (all their seeds; gamma-mixed Poisson, so a damaged clip loses zero to several words).

    fastpath-suite audit simulate --sentences 48 --seeds 40      # the real checkpoint's holdout size
    fastpath-suite audit simulate --metric sim --sentences 48 --seeds 40   # the SIM gate (ScoreModel); --metric mos

`--results DIR` writes the figures (the model's parameters, margin, data sets, and each row's case, true ΔWER and
pass rate) as a results file; `render_results` turns them into the table of docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from harness.run import results
from harness.run.progress import QUIET, Progress

from harness.quality.stats import ALPHA, gate, margin_fraction, margin_points_option
from harness.quality.wer import ScoredSet

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


def cases(margin_points: float) -> list[tuple]:
    """(case name, true ΔWER points, pattern, fraction) of every row of the table, in order."""
    out = [("equivalent (every clip re-generated)", 0.0, "spread", 0.0)]
    for pattern, fraction in PATTERNS:
        name = pattern if not fraction else f"{pattern} in {fraction:.0%} of sentences"
        for times in (1.0, 2.0):
            out.append((f"worse, {name}", times * margin_points, pattern, fraction))
    return out


def table(model: Model, margin_points: float, datasets: int, seed: int = 1, progress: Progress = QUIET) -> list[tuple]:
    """Rows (case, true ΔWER points, pass rate); one progress step per row."""
    rows = []
    todo = cases(margin_points)
    with progress.stage("rows", len(todo)) as step:
        for name, delta, pattern, fraction in todo:
            rows.append((name, delta, pass_rate(model, margin_points, delta, pattern, fraction, datasets, seed)))
            step(f"{name}, true ΔWER {delta:+.1f}: passes {rows[-1][2]:.1%}")
    return rows


def figures(model: Model, margin_points: float, datasets: int, seed: int, rows: list[tuple]) -> dict:
    """The raw figures of a run (JSON-serialisable), as a results file holds them."""
    return {"model": {"sentences": model.sentences, "seeds": model.seeds, "wer": model.wer,
                      "concentration": model.concentration, "words": list(model.words)},
            "margin_points": margin_points, "alpha": ALPHA, "datasets": datasets, "seed": seed,
            "rows": [{"case": name, "true_delta_points": delta, "pass_rate": rate} for name, delta, rate in rows]}


def render_results(figures: dict) -> str:
    """The table of a run's figures (`figures()`), as markdown: one row per case."""
    m = figures["model"]
    lines = [f"{m['sentences']} sentences x {m['seeds']} seeds a set, reference WER {100 * m['wer']:g}%, "
             f"concentration {m['concentration']:g}, {m['words'][0]}-{m['words'][1] - 1} words a sentence; "
             f"margin {figures['margin_points']:g} WER points; {figures['datasets']} simulated data sets a row "
             f"(seed {figures['seed']}).", "",
             "| case | true ΔWER (points) | gate passes |", "|---|---|---|"]
    for row in figures["rows"]:
        lines.append(f"| {row['case']} | {row['true_delta_points']:+.1f} | {row['pass_rate']:.1%} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ScoreModel:
    """A judged score per clip (SIM, MOS): score = mean + sentence effect (sd `between`, shared by every seed of
    the sentence and by the candidate) + the clip's own noise (sd `within`, drawn afresh for every clip of either
    set). A worse candidate loses `delta` on every clip ("spread") or, keeping the total, only in a fraction of
    the sentences ("concentrated"), with gamma-mixed per-clip sizes as for WER."""

    sentences: int
    seeds: int
    within: float
    between: float
    mean: float = 0.0

    def draw(self, rng, delta: float = 0.0, pattern: str = "spread", fraction: float = 0.0):
        """(reference [N], candidate [N], groups [N]) with true Δ = -delta (delta >= 0: the candidate is worse)."""
        g, k = self.sentences, self.seeds
        base = self.mean + rng.normal(0.0, self.between, (g, 1))
        ref = base + rng.normal(0.0, self.within, (g, k))
        cand = base + rng.normal(0.0, self.within, (g, k))
        if delta > 0 and pattern == "spread":
            cand = cand - delta
        elif delta > 0:
            chosen = rng.choice(g, max(1, round(fraction * g)), replace=False)
            loss = np.zeros((g, k))
            loss[chosen] = delta * g / len(chosen) * rng.gamma(2.0, 0.5, (len(chosen), k))
            cand = cand - loss
        groups = [f"s{i}" for i in range(g) for _ in range(k)]
        return ref.reshape(-1), cand.reshape(-1), groups


def score_pass_rate(model: ScoreModel, margin: float, delta: float, pattern: str, fraction: float, datasets: int,
                    seed: int) -> float:
    """How often the SIM/MOS gate (stats.score_gate) passes at true Δ = -delta."""
    from harness.quality.stats import score_gate

    rng = np.random.default_rng(seed)
    passes = 0
    for _ in range(datasets):
        ref, cand, groups = model.draw(rng, delta, pattern, fraction)
        passes += score_gate("sim", "simulated", ref, cand, groups, margin, "sim").passed
    return passes / datasets


# The spread of a clip's score across seeds of one sentence, measured on espeak-ng speech (the dev set at 3 seeds,
# known_scores' renders): SIM 0.008 (GE2E cosine to the speaker's prompt), DNSMOS OVRL 0.17 (P808's 0.11 is the
# easier of MOS's two). The sentence effect (sd 0.017 SIM; 0.3 MOS, a round figure) is shared by both sides of a
# pair and cancels; it is drawn so that the sets look like the real ones.
SPREADS = {"sim": dict(within=0.008, between=0.017), "mos": dict(within=0.17, between=0.3)}


def score_cases(margin: float) -> list[tuple]:
    """(case name, true loss, pattern, fraction) of every row of a SIM/MOS table, in order."""
    out = [("equivalent (every clip re-generated)", 0.0, "spread", 0.0)]
    for pattern, fraction in (("spread", 0.0), ("concentrated", 0.2)):
        name = pattern if not fraction else f"{pattern} in {fraction:.0%} of sentences"
        for times in (1.0, 2.0):
            out.append((f"worse by {times:g}x the margin, {name}", times * margin, pattern, fraction))
    return out


def score_table(model: ScoreModel, margin: float, datasets: int, seed: int = 1,
                progress: Progress = QUIET) -> list[tuple]:
    rows = []
    todo = score_cases(margin)
    with progress.stage("rows", len(todo)) as step:
        for name, loss, pattern, fraction in todo:
            rows.append((name, 0.0 - loss, score_pass_rate(model, margin, loss, pattern, fraction, datasets, seed)))
            step(f"{name}, true Δ {-loss:+.3f}: passes {rows[-1][2]:.1%}")
    return rows


def score_figures(metric: str, model: ScoreModel, margin: float, datasets: int, seed: int, rows: list) -> dict:
    return {"metric": metric, "model": dataclasses.asdict(model), "margin": margin, "alpha": ALPHA,
            "datasets": datasets, "seed": seed,
            "rows": [{"case": name, "true_delta": delta, "pass_rate": rate} for name, delta, rate in rows]}


def render_score_results(figures: dict) -> str:
    m = figures["model"]
    lines = [f"{figures['metric'].upper()}: {m['sentences']} sentences x {m['seeds']} seeds a set, a clip's score "
             f"varying by {m['within']:g} (sd) across seeds; margin {figures['margin']:g}; {figures['datasets']} "
             f"simulated data sets a row (seed {figures['seed']}).", "",
             "| case | true Δ | gate passes |", "|---|---|---|"]
    for row in figures["rows"]:
        lines.append(f"| {row['case']} | {row['true_delta']:+.3f} | {row['pass_rate']:.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite audit simulate", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--metric", choices=("wer", "sim", "mos"), default="wer",
                        help="the gate: WER, or a judged score (SIM, MOS: spreads from SPREADS, margins from stats)")
    parser.add_argument("--sentences", type=int, default=48, help="sentences in a simulated set")
    parser.add_argument("--seeds", type=int, default=40, help="seeds (clips) per sentence")
    parser.add_argument("--wer", type=float, default=0.06, help="corpus WER of the reference, as a fraction")
    parser.add_argument("--concentration", type=float, default=8.0,
                        help="how closely a sentence's clips follow its difficulty (espeak + tiny.en: about 40)")
    parser.add_argument("--margin", type=margin_points_option, default=1.0,
                        help="non-inferiority margin in WER points")
    parser.add_argument("--datasets", type=int, default=400, help="simulated data sets per row of the table")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the simulation")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("simulate", quiet=args.quiet)
    if args.metric != "wer":
        from harness.quality import stats

        model = ScoreModel(args.sentences, args.seeds, **SPREADS[args.metric])
        margin = stats.SIM_MARGIN if args.metric == "sim" else stats.MOS_MARGIN
        progress.say(f"{len(score_cases(margin))} rows of {args.datasets} simulated data sets each "
                     f"({args.sentences} sentences x {args.seeds} seeds, {args.metric.upper()} margin {margin:g})")
        data = score_figures(args.metric, model, margin, args.datasets, args.seed,
                             score_table(model, margin, args.datasets, args.seed, progress))
        print(render_score_results(data))
        results.write_if_asked(args, f"simulate-{args.metric}", data)
        return 0
    model = Model(args.sentences, args.seeds, args.wer, args.concentration)
    progress.say(f"{len(cases(args.margin))} rows of {args.datasets} simulated data sets each "
                 f"({args.sentences} sentences x {args.seeds} seeds)")
    rows = table(model, args.margin, args.datasets, args.seed, progress)
    data = figures(model, args.margin, args.datasets, args.seed, rows)
    print(render_results(data))
    results.write_if_asked(args, "simulate", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
