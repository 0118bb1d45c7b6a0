"""The gate's operating characteristics on real speech: espeak-ng renders judged by Whisper (tiny.en by default).

Each corpus sentence is rendered once per seed with a randomised realisation (speech.realisation: voice variant,
rate, pitch), so two sets of seeds are two different, equally good sets: the "equivalent" candidate. Worse
candidates are the equivalent one with damage whose expected size is set in WER points (words dropped from the
middle are injected divided by ERRORS_PER_DROPPED_WORD, what one costs as the judge hears it):
  * spread: every clip loses floor(x w) words (+1 with probability frac(x w)), x the damage as a fraction, w its words;
  * concentrated: the same, only in a random 20% of the sentences (all their seeds), x scaled up to keep the total;
  * cut: the longest third of the sentences have their last words cut from the audio, as many as make about
    twice the margin.
Words are dropped from the text before rendering (same realisation) and scored against the full sentence.
A repetition draws, for every sentence, 2k distinct seeds from a pool of 12 (k for the reference, k for the
candidate), shared by its cases, and each case's damage; clips and transcripts are cached, so repetitions share
work where they share seeds.

    fastpath-suite audit known-answer --reps 20    # the table of docs/results.md (cold: about 4000 clips to render)

`--metric sim|mos|stream` runs the SIM and MOS gates' tables and the stream voice check instead
(harness/audit/known_scores.py); `--metric clone-set` the version gate's quality-set check on the espeak set in
Seed-TTS-eval's layout (harness/audit/known_clone.py).

`--results DIR` writes the figures (margin, seeds, repetitions, the judge's identity, the espeak-ng version and
each row's as_dict) as a results file; `render_results` turns them into the table of docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

from harness.run import results
from harness.run.progress import QUIET, Progress

from harness.quality import corpus, evaluate, speech, wer
from harness.quality.audio import Clip
from harness.quality.stats import gate, margin_fraction, margin_points_option

MARGIN_POINTS = 4.0  # what 60 sentences x 3 seeds of espeak speech support for tiny.en (docs/quality.md: the size rule)
SEEDS = 3
POOL = 12  # seeds rendered per sentence
CONCENTRATED = 0.2
# Whisper tiny.en makes about 1.4 errors per word dropped from the middle of an espeak sentence (it mishears the
# neighbours too): measured by this table at 1.0 word per error (ΔWER over the equivalent set: +5.7 points for 4
# injected, +11.5 for 8, 20 repetitions each). Damage is injected divided by this, so a case "worse by the margin"
# is worse by about the margin as the judge hears it. Words cut from the end cost about 1.0 error each (+7.8 for 8).
ERRORS_PER_DROPPED_WORD = 1.4
FAST = dict(margin_points=8.0, seeds=1)  # the default run's one repetition: 60 clips a set


@dataclasses.dataclass(frozen=True)
class Damage:
    kind: str = "none"  # none | drop | cut
    words: int = 0


def render_clip(item: corpus.Item, seed: int, slot: int, damage: Damage = Damage()) -> Clip:
    how = speech.realisation(item.id, seed)
    if damage.kind == "drop" and damage.words:
        text = speech.drop_n_words(item.text, damage.words, seed=seed * 1000 + damage.words)
        wav, sr = speech.render_as(text, how)
    elif damage.kind == "cut" and damage.words:
        wav, sr = speech.cut_last_words(item.text, damage.words, how)
    else:
        wav, sr = speech.render_as(item.text, how)
    return Clip(f"{item.id}#{slot}", item.text, wav, sr, group=item.id, seed=seed)


def draws(x: float, words: np.ndarray, rng) -> np.ndarray:
    """Words to drop per clip: floor(x w) plus one with probability frac(x w)."""
    want = x * words
    return (np.floor(want) + (rng.random(words.shape) < want - np.floor(want))).astype(int)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str  # equivalent | spread | concentrated | cut
    times_margin: float  # damage in margins (0 for equivalent; cut: about 2)
    want: str  # the criterion, e.g. "pass >= 80%"

    @property
    def key(self) -> str:
        """The case's name on the command line (--cases): equivalent, spread-1x, concentrated-2x, cut."""
        return self.kind if self.kind in ("equivalent", "cut") else f"{self.kind}-{self.times_margin:g}x"


CASES = (
    Case("equivalent set (other seeds)", "equivalent", 0.0, "pass >= 80%"),
    Case("worse by the margin, spread", "spread", 1.0, "pass <= 5%"),
    Case("worse by the margin, concentrated in 20% of sentences", "concentrated", 1.0, "pass <= 5%"),
    Case("worse by 2x the margin, spread", "spread", 2.0, "refused >= 95%"),
    Case("worse by 2x the margin, concentrated in 20% of sentences", "concentrated", 2.0, "refused >= 95%"),
    Case("last words cut from the audio of the longest third", "cut", 2.0, "refused >= 95%"),
)


def plan(case: Case, items: Sequence[corpus.Item], seeds: int, margin_points: float, chosen: np.ndarray,
         rng) -> tuple[list, list]:
    """(reference specs, candidate specs) of one repetition: lists of (item, seed, slot, Damage). chosen: [G, 2k]
    distinct pool seeds per sentence (the first k the reference's, the rest the candidate's); rng draws the damage."""
    words = np.array([len(it.text.split()) for it in items])
    ref = [(it, int(chosen[g, j]), j, Damage()) for g, it in enumerate(items) for j in range(seeds)]
    drop = np.zeros((len(items), seeds), dtype=int)
    x = margin_fraction(margin_points) * case.times_margin / ERRORS_PER_DROPPED_WORD
    kind = "drop"
    if case.kind == "spread":
        drop = draws(x, np.repeat(words[:, None], seeds, 1), rng)
    elif case.kind == "concentrated":
        hit = rng.choice(len(items), max(1, round(CONCENTRATED * len(items))), replace=False)
        scale = words.sum() / words[hit].sum()
        drop[hit] = draws(x * scale, np.repeat(words[hit, None], seeds, 1), rng)
    elif case.kind == "cut":
        kind = "cut"
        longest = np.argsort(-words, kind="stable")[: len(items) // 3]
        drop[longest] = max(1, round(x * ERRORS_PER_DROPPED_WORD * words.sum() / len(longest)))
    cand = [(it, int(chosen[g, seeds + j]), j, Damage(kind, int(drop[g, j]))) for g, it in enumerate(items)
            for j in range(seeds)]
    return ref, cand


_judge = None


def _load(name):
    global _judge
    from harness.quality.judge import load_judge

    _judge = load_judge(name, cpu_threads=1)


def _transcribe(specs):
    return evaluate.transcribe_set(_judge, [render_clip(*s) for s in specs])


CHUNK = 20  # clips per unit of work (and per progress step) of transcribe_all


def transcribe_all(specs: list, judge_name: str | None, workers: int, progress: Progress = QUIET) -> None:
    """Render and transcribe every clip of `specs` (deduplicated) into the caches, `workers` processes of one
    thread each (judge.load_judge measured 2 threads 1.3x faster than 1, so two one-thread processes should do
    about 1.5x one of two threads on 2 cores; not measured separately). Chunks of CHUNK clips, one progress step
    each (cached clips make a chunk quick, so the estimate of what is left is rough)."""
    unique = list({(s[0].id, s[1], s[3]): s for s in specs}.values())
    chunks = [unique[i:i + CHUNK] for i in range(0, len(unique), CHUNK)]
    with progress.stage("render and transcribe", len(chunks)) as step:
        done = 0
        if workers <= 1:
            _load(judge_name)
            for chunk in chunks:
                _transcribe(chunk)
                done += len(chunk)
                step(f"{done}/{len(unique)} clips")
            return
        context = multiprocessing.get_context("spawn")  # no fork of a process whose OpenMP threads may be running
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_load, initargs=(judge_name,)) as ex:
            for chunk, _ in zip(chunks, ex.map(_transcribe, chunks)):
                done += len(chunk)
                step(f"{done}/{len(unique)} clips")


def score(judge, specs: list) -> wer.ScoredSet:
    scored, _ = evaluate.score_clips(judge, [render_clip(*s) for s in specs])
    return scored


@dataclasses.dataclass
class Row:
    case: Case
    verdicts: list

    @property
    def pass_rate(self) -> float:
        return sum(v.passed for v in self.verdicts) / len(self.verdicts)

    def meets(self) -> bool:
        rate = self.pass_rate
        return {"pass >= 80%": rate >= 0.8, "pass <= 5%": rate <= 0.05, "refused >= 95%": rate <= 0.05}[self.case.want]

    def as_dict(self) -> dict:
        deltas = [100 * v.delta_wer for v in self.verdicts]
        return {"case": self.case.name, "want": self.case.want, "repetitions": len(self.verdicts),
                "passed": sum(v.passed for v in self.verdicts), "pass_rate": self.pass_rate, "meets": self.meets(),
                "delta_points_mean": float(np.mean(deltas)), "delta_points_sd": float(np.std(deltas, ddof=1))
                if len(deltas) > 1 else 0.0, "upper_points_mean": float(np.mean([100 * v.upper for v in self.verdicts])),
                "verdicts": [v.verdict for v in self.verdicts]}


def run(judge, judge_name: str | None, reps: int, seeds: int = SEEDS, margin_points: float = MARGIN_POINTS,
        cases: Sequence[Case] = CASES, workers: int = 2, seed: int = 0, items=None, log=print,
        progress: Progress = QUIET) -> list[Row]:
    """Every case `reps` times: render and transcribe all clips (one stage), then gate each repetition of each
    case (another); progress on `progress`, a line per stage's result through `log`."""
    items = items if items is not None else corpus.load_corpus("dev")
    plans = {case: [] for case in cases}
    for rep in range(reps):  # one draw of seeds per repetition, shared by every case: paired, and fewer clips
        pick = np.random.default_rng([seed, 1000 + rep])
        chosen = np.array([pick.choice(POOL, 2 * seeds, replace=False) for _ in items])
        for case in cases:
            rng = np.random.default_rng([seed, rep, CASES.index(case)])
            plans[case].append(plan(case, items, seeds, margin_points, chosen, rng))
    every = [s for reps_ in plans.values() for ref, cand in reps_ for s in ref + cand]
    t0 = time.time()
    transcribe_all(every, judge_name, workers, progress)
    log(f"rendered and transcribed {len({(s[0].id, s[1], s[3]) for s in every})} distinct clips in "
        f"{time.time() - t0:.0f} s")
    rows = []
    with progress.stage("gate", len(plans) * reps) as step:
        for case, reps_ in plans.items():
            verdicts = []
            for rep, (ref, cand) in enumerate(reps_, 1):
                verdicts.append(gate(score(judge, ref), score(judge, cand), margin_points=margin_points,
                                     label=case.name))
                step(f"{case.name}, repetition {rep}/{reps}: {verdicts[-1].verdict}")
            rows.append(Row(case, verdicts))
            log(f"{case.name}: passed {sum(v.passed for v in verdicts)}/{len(verdicts)}")
    return rows


def figures(rows: list[Row], margin_points: float, seeds: int, reps: int, sentences: int, judge: str | None,
            espeak: str | None, seed: int = 0) -> dict:
    """The raw figures of a run (JSON-serialisable), as a results file and --out hold them; `cases_total`: how
    many cases the full table has (a run of some --cases renders as such)."""
    return {"margin_points": margin_points, "seeds": seeds, "reps": reps, "sentences": sentences, "seed": seed,
            "pool": POOL, "judge": judge, "espeak": espeak, "cases_total": len(CASES),
            "rows": [r.as_dict() for r in rows]}


RATE_LEVEL = 0.95  # the two-sided level of a pass rate's interval in the table


def rate_interval(passed: int, repetitions: int, level: float = RATE_LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a pass rate seen as `passed` of `repetitions` (scipy): how much a
    table of few repetitions can say (2 of 2 passing: 16% to 100%)."""
    from scipy.stats import binomtest

    ci = binomtest(passed, repetitions).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def render_results(figures: dict) -> str:
    """The table of a run's figures (`figures()`), as markdown: one row per case, each pass rate with its
    interval (rate_interval), so a run of fewer repetitions says how little its rates are known."""
    rows = figures["rows"]
    lines = [f"Margin {figures['margin_points']:g} WER points; {figures.get('sentences', '?')} sentences x "
             f"{figures['seeds']} seeds a set; {rows[0]['repetitions'] if rows else figures['reps']} repetitions a "
             "row." + (f" Judge: {figures['judge']}; espeak-ng {figures['espeak']}." if figures.get("judge") else "")
             + f" Each pass rate with its {RATE_LEVEL:.0%} interval (exact binomial, Clopper-Pearson); \"met\" "
             "compares the observed rate with the criterion."
             + (f" {len(rows)} of the {figures['cases_total']} cases were run (--cases); the others are not measured."
                if len(rows) < figures.get("cases_total", len(rows)) else ""),
             "",
             f"| case | criterion | passed | pass rate, {RATE_LEVEL:.0%} interval | ΔWER points, mean (sd) | "
             "upper bound, mean | met |",
             "|---|---|---|---|---|---|---|"]
    for d in rows:
        low, high = rate_interval(d["passed"], d["repetitions"])
        lines.append(f"| {d['case']} | {d['want']} | {d['passed']}/{d['repetitions']} ({d['pass_rate']:.0%}) | "
                     f"{low:.0%} to {high:.0%} | {d['delta_points_mean']:+.2f} ({d['delta_points_sd']:.2f}) | "
                     f"{d['upper_points_mean']:+.2f} | {'yes' if d['meets'] else 'NO'} |")
    return "\n".join(lines)


def markdown(rows: list[Row], margin_points: float, seeds: int, items: int, judge: str | None = None,
             espeak: str | None = None) -> str:
    """render_results of rows not yet gathered into figures."""
    return render_results(figures(rows, margin_points, seeds, len(rows[0].verdicts) if rows else 0, items, judge,
                                  espeak))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite audit known-answer", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--metric", choices=("wer", "sim", "mos", "stream", "clone-set"), default="wer",
                        help="which gate: WER (words, Whisper), SIM (voice, GE2E), MOS (DNSMOS OVRL and P808), "
                             "stream (the voice check at a stream's seams), or clone-set (the version gate's "
                             "quality-set check on the espeak Seed-TTS-eval-format set)")
    parser.add_argument("--reps", type=int, default=20, help="repetitions of every case (fresh seeds and damage)")
    parser.add_argument("--streams", type=int, default=40, help="--metric stream: streams of each kind")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="seeds per sentence in a set (every metric)")
    parser.add_argument("--margin", type=margin_points_option, default=MARGIN_POINTS,
                        help="non-inferiority margin in WER points")
    parser.add_argument("--cases", nargs="+", choices=[c.key for c in CASES], default=[c.key for c in CASES],
                        help="which rows of the table to run (each case draws the same seeds and damage as in the "
                             "whole table)")
    parser.add_argument("--workers", type=int, default=2, help="processes rendering and transcribing clips")
    parser.add_argument("--judge", default=None,
                        help="the Whisper judge (a name or path, as --judge of pytest); None: tiny.en")
    parser.add_argument("--out", default=str(evaluate.REPO_ROOT / "out" / "quality" / "known_answer.json"),
                        help="where to write the run's figures as JSON")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    from pathlib import Path

    from harness.quality.judge import load_judge

    progress = Progress("known-answer", quiet=args.quiet)
    if args.metric == "clone-set":
        from . import known_clone

        return known_clone.main(args, progress)
    if args.metric != "wer":
        from . import known_scores

        return known_scores.main(args, progress)
    items = corpus.load_corpus("dev")
    cases = tuple(c for c in CASES if c.key in args.cases)
    progress.say(f"{len(cases)} cases x {args.reps} repetitions of {len(items)} sentences x {args.seeds} seeds a set, "
                 f"margin {args.margin:g} WER points; clips not yet cached are rendered and transcribed first "
                 "(cold: about 4000 clips at the defaults)")
    judge = load_judge(args.judge)
    rows = run(judge, args.judge, args.reps, args.seeds, args.margin, cases=cases, workers=args.workers, items=items,
               log=progress.say, progress=progress)
    data = figures(rows, args.margin, args.seeds, args.reps, len(items), judge.identity, speech.espeak_version())
    print(render_results(data))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    results.write_if_asked(args, "known-answer", data)
    return 0 if all(r.meets() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
