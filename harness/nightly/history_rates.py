"""The history rule's operating characteristics on this project's own noise: `fastpath-suite nightly rates`.

Clean nights are drawn from a *recorded* history (repeated runs of nightly points on one machine, some with a core
kept busy: scripts/record_nights.sh): a circular block bootstrap over the recorded runs (blocks of ``BLOCK`` runs,
the same run for every point of a night, so a busy night slows all points at once, as it does), and within a run
``samples`` of its samples drawn with replacement (3, 5, 9: what a night pays for). Changes are injected as a
factor on every sample of one point from the change night on: a step (x (1 + d)) or a drift (x (1 + r x nights)).
Every history starts with ``ESTABLISHED`` clean nights, as a history in use has.

Measured for one history of the recorded points, judged with that history's share of the suite's budget (alpha
over the suite's statistical histories, changes.STATISTICAL_HISTORIES), split over its points:
  - false alarms per 100 clean nights (nights on which any point raised a slowdown: the nightly would fail; goal
    <= 1 for the whole suite, so at most this history's share, 1/3), the nights that fail (an alarm stays open
    until it recovers), and speedups noted, which fail nothing;
  - after an accepted 10% step, the clean nights that follow: judged at once against the accepted level, and the
    slowdowns they raise per 100 nights of the point, beside the same point's rate on clean nights;
  - a 10% step caught on its first night (goal >= 95%), a 5% step within 3 nights (goal >= 90%), a drift of 1% a
    night before it reaches 5% (goal >= 90%), the change night named exactly (goal >= 80%);
  - detection against the step size and against the samples per night; the change night named against Pelt's
    penalty (its calibration, on a synthetic runner with 1% night-to-night noise, where most steps are caught);
  - the five goals on synthetic runners of 1% and 2% night-to-night noise: what the goals ask of a runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import REPO_ROOT
from harness.nightly import changes

# the recorded nights the docs' table is measured on (scripts/record_nights.sh wrote it)
RECORDED = REPO_ROOT / "fixtures" / "nights" / "cpu-amd-epyc-avx2-2c-2t.json"
# instruction counts of the tiny counting points, recorded the same way (record-nights --signal instructions)
RECORDED_INSTRUCTIONS = REPO_ROOT / "fixtures" / "nights" / "cpu-amd-epyc-avx2-2c-2t-instructions.json"

BLOCK = 3  # recorded runs per bootstrap block
ESTABLISHED = 20  # clean nights every simulated history starts with
CLEAN_NIGHTS = 100
# one false alarm per 100 clean nights for the whole suite: a history's goal is its share
FALSE_ALARM_GOAL = 100 * changes.ALPHA / len(changes.STATISTICAL_HISTORIES)
AFTER_ACCEPTANCE = 10  # clean nights simulated after an accepted step
GOALS = {  # name -> (goal, "at most" or "at least")
    "false_alarms_per_100": (FALSE_ALARM_GOAL, "at most"),
    "step10_first_night": (0.95, "at least"),
    "step5_within_3": (0.90, "at least"),
    "drift1_before_5pct": (0.90, "at least"),
    "named_exactly": (0.80, "at least"),
}
STEPS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15)
SAMPLES = (3, 5, 9)
PENALTIES = (1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class Recorded:
    """Per recorded run and point, the raw samples: samples[run][point] (equal counts per point)."""

    points: tuple
    samples: np.ndarray  # [runs, points, samples per run]
    busy: tuple  # per run: was a core kept busy

    @property
    def runs(self) -> int:
        return self.samples.shape[0]


def recorded_from(history) -> Recorded:
    """The runs of a recorded history with the points every run measured, each cut to the fewest samples any run
    of it has."""
    points = [p for p in history.point_names if all(p in n.points for n in history.nights)]
    if len(history.nights) < 2 * BLOCK or not points:
        raise ValueError(f"{history.path}: {len(history.nights)} nights with points measured on all of them; the "
                         f"simulation needs at least {2 * BLOCK} (record at least 20: fastpath-suite nightly record)")
    k = min(len(n.points[p]["samples"]) for n in history.nights for p in points)
    data = np.array([[n.points[p]["samples"][:k] for p in points] for n in history.nights], dtype=float)
    busy = tuple("busy-core" in n.labels for n in history.nights)
    return Recorded(points=tuple(points), samples=data, busy=busy)


def clean_nights(rng, rec: Recorded, nights: int, samples: int, histories: int) -> tuple:
    """(x, within) of shape [histories, points, nights]: log medians and within-night errors of simulated clean
    nights (circular block bootstrap over the recorded runs, ``samples`` resampled per night)."""
    blocks = math.ceil(nights / BLOCK)
    starts = rng.integers(0, rec.runs, size=(histories, blocks))
    runs = ((starts[:, :, None] + np.arange(BLOCK)) % rec.runs).reshape(histories, -1)[:, :nights]
    pick = rng.integers(0, rec.samples.shape[2], size=(histories, nights, len(rec.points), samples))
    # drawn[h, t, p, s] = rec.samples[runs[h, t], p, pick[h, t, p, s]]
    drawn = rec.samples[runs[:, :, None, None], np.arange(len(rec.points))[None, None, :, None], pick]
    med = np.median(drawn, axis=-1)
    within = changes.within_night_sigma(drawn)
    return np.log(med).transpose(0, 2, 1), within.transpose(0, 2, 1)


def first_alarm(trace, start: int):
    """The first slowdown the rule raised at or after night ``start``, or None."""
    return next((e for e in trace.events if e.kind == "slower" and e.alarmed >= start), None)


def false_alarms(rng, rec: Recorded, rule: changes.Rule, samples: int, histories: int) -> dict:
    """On clean nights after ESTABLISHED, per 100 nights of the history (all its points): nights on which any point
    raised a slowdown (a false alarm: the nightly would fail), nights that fail (an alarm stays open until it
    recovers), slowdowns raised summed over points, and speedups noted (they fail nothing)."""
    x, within = clean_nights(rng, rec, ESTABLISHED + CLEAN_NIGHTS, samples, histories)
    alarm_nights = failing = raised = faster = 0
    for h in range(histories):
        alarmed, open_nights = set(), set()
        for p in range(len(rec.points)):
            trace = changes.scan(x[h, p], within[h, p], rule)
            for e in trace.events:
                if e.alarmed >= ESTABLISHED:
                    raised += e.kind == "slower"
                    faster += e.kind == "faster"
                    if e.kind == "slower":
                        alarmed.add(e.alarmed)
            open_nights.update(t for t, s in enumerate(trace.status) if t >= ESTABLISHED and s in ("alarm", "open"))
        alarm_nights += len(alarmed)
        failing += len(open_nights)
    scale = 100.0 / (histories * CLEAN_NIGHTS)
    return {"false_alarms_per_100": alarm_nights * scale, "failing_nights_per_100": failing * scale,
            "point_alarms_per_100": raised * scale, "speedups_per_100": faster * scale, "histories": histories}


def injected(rng, rec: Recorded, rule: changes.Rule, samples: int, histories: int, *, step: float = 0.0,
             drift: float = 0.0, after: int = 3) -> dict:
    """Detection of one change on one point (each point in turn) at night ESTABLISHED: the share caught on the
    first night, within ``after`` nights, and named exactly among those caught within ``after``. For a drift,
    "before" counts the nights before the factor reaches 5%."""
    c = ESTABLISHED
    nights = c + max(after, 6)
    x, within = clean_nights(rng, rec, nights, samples, histories)
    ramp = np.zeros(nights)
    if step:
        ramp[c:] = math.log1p(step)
    if drift:
        ramp[c:] = np.log1p(drift * np.arange(1, nights - c + 1))
    before = int(np.sum(np.expm1(ramp[c:]) < 0.05 - 1e-12)) if drift else None
    first = within_after = named = within_before = 0
    for h in range(histories):
        p = h % len(rec.points)
        trace = changes.scan(x[h, p] + ramp, within[h, p], rule)
        e = first_alarm(trace, 0)
        if e is None or e.alarmed < c:  # a false alarm before the change leaves the point already failing
            continue
        first += e.alarmed == c
        if e.alarmed < c + after:
            within_after += 1
            named += e.began == c
        if before is not None and e.alarmed < c + before:
            within_before += 1
    out = {"first_night": first / histories, f"within_{after}": within_after / histories,
           "named_exactly": named / within_after if within_after else None, "caught": within_after,
           "histories": histories}
    if before is not None:
        out["before_5pct"] = within_before / histories
    return out


def after_acceptance(rng, rec: Recorded, rule: changes.Rule, samples: int, histories: int, *, step: float = 0.10,
                     after: int = AFTER_ACCEPTANCE) -> dict:
    """A step of ``step`` on one point (each in turn) at night ESTABLISHED, accepted on that night, then ``after``
    clean nights at the new level: the share of them judged (not learning, not busy), and per 100 of them the
    slowdowns raised and the nights that fail."""
    c = ESTABLISHED
    x, within = clean_nights(rng, rec, c + 1 + after, samples, histories)
    ramp = np.zeros(c + 1 + after)
    ramp[c:] = math.log1p(step)
    judged = raised = failing = 0
    for h in range(histories):
        p = h % len(rec.points)
        trace = changes.scan(x[h, p] + ramp, within[h, p], rule, accepted=frozenset({c}))
        judged += sum(s not in ("learning", "not judged") for s in trace.status[c + 1:])
        raised += sum(e.kind == "slower" and e.alarmed > c for e in trace.events)
        failing += sum(s in ("alarm", "open") for s in trace.status[c + 1:])
    nights = histories * after
    return {"judged": judged / nights, "false_alarms_per_100": 100.0 * raised / nights,
            "failing_nights_per_100": 100.0 * failing / nights, "step": step, "after": after,
            "histories": histories}


def rule_figures(rule: changes.Rule, *names) -> dict:
    """The rule's settings as the results file keeps them: the budget's split and the named settings."""
    return {k: getattr(rule, k) for k in ("points", "alpha", "histories", "history_alpha", *names)} | {"h": rule.h}


def measure(rec: Recorded, histories: int = 400, seed: int = 0, progress=None, penalties=PENALTIES) -> dict:
    """Every figure of the table, with the rule's defaults for this suite's number of points. ``progress``: a
    harness.run.progress.Progress (one unit per row)."""
    from contextlib import nullcontext

    rng = np.random.default_rng(seed)
    rule = changes.Rule(points=len(rec.points))
    fig: dict = {"points": list(rec.points), "runs": rec.runs, "busy_runs": int(sum(rec.busy)),
                 "samples_recorded": int(rec.samples.shape[2]), "histories": histories, "seed": seed,
                 "rule": rule_figures(rule, "min_nights", "window", "step_floor", "drift_floor", "k", "penalty"),
                 "block": BLOCK, "established": ESTABLISHED, "clean_nights": CLEAN_NIGHTS,
                 "noise": noise_figures(rec), "clean": {}, "steps": {}, "by_samples": {"3": {}, "5": {}},
                 "penalty": {}}
    rows = ([("clean", k) for k in SAMPLES] + [("step", s) for s in STEPS] + [("drift", None)]
            + [("samples", (k, s)) for k in (3, 5) for s in (0.05, 0.10)] + [("penalty", p) for p in penalties]
            + [("accepted", None)])
    calibration = gaussian(len(rec.points), GAUSSIAN[0], seed)
    with (progress.stage("rows", total=len(rows)) if progress else nullcontext(lambda label: None)) as step:
        for kind, arg in rows:
            if kind == "clean":
                fig["clean"][str(arg)] = false_alarms(rng, rec, rule, arg, histories)
            elif kind == "step":
                fig["steps"][f"{arg:g}"] = injected(rng, rec, rule, 9, histories, step=arg)
            elif kind == "drift":
                fig["drift"] = injected(rng, rec, rule, 9, histories, drift=0.01, after=6)
            elif kind == "samples":
                fig["by_samples"][str(arg[0])][f"{arg[1]:g}"] = injected(rng, rec, rule, arg[0], histories,
                                                                          step=arg[1])
            elif kind == "accepted":
                fig["accepted"] = after_acceptance(rng, rec, rule, 9, histories)
            else:  # on the synthetic 1% runner, where most steps are caught: a share of few catches is noise
                pen_rule = changes.Rule(points=len(rec.points), penalty=arg)
                fig["penalty"][f"{arg:g}"] = {f"{s:g}": injected(rng, calibration, pen_rule, 9, histories // 2,
                                                                 step=s)["named_exactly"] for s in (0.05, 0.10)}
            step(f"{kind} {arg if arg is not None else ''}".strip())
    fig["by_samples"]["9"] = {f"{s:g}": fig["steps"][f"{s:g}"] for s in (0.05, 0.10)}
    fig["goals"] = goals_of(fig["clean"]["9"], fig["steps"]["0.05"], fig["steps"]["0.1"], fig["drift"])
    fig["gaussian"] = {}
    for sigma in GAUSSIAN:  # the same rule on noise of known size: what the goals ask of a runner's noise
        synthetic = gaussian(len(rec.points), sigma, seed)
        fig["gaussian"][f"{sigma:g}"] = goals_of(
            false_alarms(rng, synthetic, rule, 9, histories // 2),
            injected(rng, synthetic, rule, 9, histories // 2, step=0.05),
            injected(rng, synthetic, rule, 9, histories // 2, step=0.10),
            injected(rng, synthetic, rule, 9, histories // 2, drift=0.01, after=6))
    return fig


GAUSSIAN = (0.01, 0.02)  # night-to-night noise of the synthetic runners the table compares with

# --- a count signal (instructions under callgrind): one sample a night, noise of hundredths of a percent ----------
COUNT_GOALS = {  # name -> (goal, "at most" or "at least")
    "false_alarms_per_100": (FALSE_ALARM_GOAL, "at most"),
    "step5_first_night": (0.95, "at least"),
    "step2_within_3": (0.90, "at least"),
    "drift1_before_5pct": (0.90, "at least"),
    "named_exactly": (0.80, "at least"),
}
COUNT_STEPS = (0.005, 0.01, 0.02, 0.05, 0.10)


def measure_counts(rec: Recorded, metric: str, histories: int = 400, seed: int = 0, progress=None) -> dict:
    """The goals of a count signal on its recorded runs, with that metric's rule (changes.rule_for): clean nights,
    steps of COUNT_STEPS, a drift of 1% a night; one sample a night (a count is one number)."""
    from contextlib import nullcontext

    rng = np.random.default_rng(seed)
    rule = changes.rule_for(metric, len(rec.points))
    fig: dict = {"metric": metric, "points": list(rec.points), "runs": rec.runs, "busy_runs": int(sum(rec.busy)),
                 "histories": histories, "seed": seed, "block": BLOCK, "established": ESTABLISHED,
                 "clean_nights": CLEAN_NIGHTS,
                 "rule": rule_figures(rule, "min_nights", "window", "step_floor", "drift_floor", "min_sigma", "k",
                                      "penalty"),
                 "noise": count_noise(rec), "steps": {}}
    rows = [("clean", None)] + [("step", s) for s in COUNT_STEPS] + [("drift", None)] + [("accepted", None)]
    with (progress.stage("rows", total=len(rows)) if progress else nullcontext(lambda label: None)) as step:
        for kind, arg in rows:
            if kind == "clean":
                fig["clean"] = false_alarms(rng, rec, rule, 1, histories)
            elif kind == "step":
                fig["steps"][f"{arg:g}"] = injected(rng, rec, rule, 1, histories, step=arg)
            elif kind == "accepted":
                fig["accepted"] = after_acceptance(rng, rec, rule, 1, histories, step=0.02)
            else:
                fig["drift"] = injected(rng, rec, rule, 1, histories, drift=0.01, after=6)
            step(f"{kind} {arg if arg is not None else ''}".strip())
    named = [fig["steps"]["0.05"], fig["steps"]["0.1"], fig["steps"]["0.02"]]
    caught = sum(d["caught"] for d in named)
    fig["goals"] = {"false_alarms_per_100": fig["clean"]["false_alarms_per_100"],
                    "step5_first_night": fig["steps"]["0.05"]["first_night"],
                    "step2_within_3": fig["steps"]["0.02"]["within_3"],
                    "drift1_before_5pct": fig["drift"]["before_5pct"],
                    "named_exactly": (sum(d["named_exactly"] * d["caught"] for d in named if d["caught"]) / caught
                                      if caught else None)}
    return fig


def count_noise(rec: Recorded) -> dict:
    """Per point: the count's median over the runs, its spread (max - min over the runs, as a fraction of the
    median, and the standard deviation of the log), busy and quiet runs apart."""
    out = {}
    for i, p in enumerate(rec.points):
        values = rec.samples[:, i, 0]
        x = np.log(values)
        out[p] = {"median": float(np.median(values)), "range": float((values.max() - values.min()) / np.median(values)),
                  "sigma": float(np.std(x, ddof=1)) if len(x) > 1 else 0.0,
                  "busy_vs_quiet": busy_effect(x, rec.busy)}
    return out


def render_count_results(fig: dict) -> str:
    def pct(v, digits=0):
        return "n/a" if v is None else f"{100 * v:.{digits}f}%"

    rule = fig["rule"]
    lines = [f"Recorded: {fig['runs']} runs ({fig['busy_runs']} beside a busy core at the same priority) of "
             f"{len(fig['points'])} points, one count each; {fig['histories']} simulated histories a row (circular "
             f"block bootstrap, blocks of {fig['block']} runs, {fig['established']} established nights first), seed "
             f"{fig['seed']}. Rule for {fig['metric']}: {budget(rule)}, floors "
             f"{pct(rule['step_floor'], 1)} (one night) and {pct(rule['drift_floor'], 1)} (cumulative), noise never "
             f"below {pct(rule['min_sigma'], 2)}, CUSUM k {rule['k']:g} h {rule['h']:.2f}.", "",
             "| point | median count | spread over the runs (max - min) | sd of log | busy core against quiet |",
             "|---|---|---|---|---|"]
    for p, n in fig["noise"].items():
        busy = "n/a" if n["busy_vs_quiet"] is None else f"{100 * n['busy_vs_quiet']:+.4f}%"
        lines.append(f"| {p} | {n['median']:,.0f} | {100 * n['range']:.4f}% | {100 * n['sigma']:.4f}% | {busy} |")
    labels = {"false_alarms_per_100": (FALSE_ALARM_LABEL, f"<= {FALSE_ALARM_GOAL:.2f}"),
              "step5_first_night": ("5% step caught on its first night", ">= 95%"),
              "step2_within_3": ("2% step caught within 3 nights", ">= 90%"),
              "drift1_before_5pct": ("drift of 1% a night caught before 5%", ">= 90%"),
              "named_exactly": ("change night named exactly (2%, 5% and 10% steps)", ">= 80%")}
    lines += ["", "| measure | recorded runs | goal | met |", "|---|---|---|---|"]
    for name, (label, goal) in labels.items():
        v = fig["goals"][name]
        shown = f"{v:.2f}" if name == "false_alarms_per_100" else pct(v)
        lines.append(f"| {label} | {shown} | {goal} | {'yes' if met(name, v, COUNT_GOALS) else 'NO'} |")
    lines += ["", "| step | caught on its first night | within 3 nights | named exactly |", "|---|---|---|---|"]
    for s, d in fig["steps"].items():
        lines.append(f"| {100 * float(s):g}% | {pct(d['first_night'])} | {pct(d['within_3'])} | "
                     f"{pct(d['named_exactly'])} |")
    d = fig["drift"]
    lines += ["", f"A drift of 1% a night: caught before it reaches 5% {pct(d['before_5pct'])}, within 6 nights "
              f"{pct(d['within_6'])}. Clean nights: {fig['clean']['false_alarms_per_100']:.2f} false alarms and "
              f"{fig['clean']['failing_nights_per_100']:.2f} failing nights per 100."]
    if "accepted" in fig:
        lines += ["", accepted_text(fig["accepted"], fig["clean"], len(fig["points"]))]
    return "\n".join(lines)


FALSE_ALARM_LABEL = "false alarms per 100 clean nights, this history (its share of the suite's 1)"


def budget(rule: dict) -> str:
    """"alpha 0.01 for the suite, 0.00333 for this history (one of 3 statistical histories) over 4 points"."""
    if "histories" not in rule:  # a results file written before the suite-wide split
        return f"alpha {rule['alpha']:g} over {rule['points']} points"
    return (f"alpha {rule['alpha']:g} for the suite, {rule['history_alpha']:.3g} for this history (one of "
            f"{rule['histories']} statistical histories) over {rule['points']} points")


def accepted_text(acc: dict, clean: dict, points: int) -> str:
    """The after-acceptance row as a sentence, beside the same point's rate on clean nights."""
    return (f"After an accepted {100 * acc['step']:g}% step on one point, its next {acc['after']} clean nights: "
            f"{100 * acc['judged']:.0f}% judged at once against the accepted level, "
            f"{acc['false_alarms_per_100']:.2f} slowdowns raised and {acc['failing_nights_per_100']:.2f} failing "
            f"nights per 100 of them ({acc['histories']} histories); on clean nights a point raises "
            f"{clean['point_alarms_per_100'] / points:.2f} per 100.")


def gaussian(points: int, sigma: float, seed: int = 0, runs: int = 200) -> Recorded:
    """Recorded runs of known truth: each run's level N(0, sigma) in log, its 9 samples spread 1% about it."""
    rng = np.random.default_rng(seed)
    samples = np.exp(rng.normal(0, sigma, (runs, points, 1)) + rng.normal(0, 0.01, (runs, points, 9)))
    return Recorded(points=tuple(f"p{i}" for i in range(points)), samples=samples, busy=(False,) * runs)


def goals_of(clean: dict, step5: dict, step10: dict, drift: dict) -> dict:
    """The five goals' figures from their rows. The night a change began is scored on the steps: a drift's first
    night (1% slower) is below anything a night can show, so "exactly" has no meaning there (its share is in the
    drift row of the results file)."""
    named = [step5, step10]
    caught = sum(d["caught"] for d in named)
    return {
        "false_alarms_per_100": clean["false_alarms_per_100"],
        "step10_first_night": step10["first_night"],
        "step5_within_3": step5["within_3"],
        "drift1_before_5pct": drift["before_5pct"],
        "named_exactly": (sum(d["named_exactly"] * d["caught"] for d in named if d["caught"]) / caught
                          if caught else None),
    }


def noise_figures(rec: Recorded) -> dict:
    """Per point: the recorded runs' night-to-night noise (MAD of the log medians, as a fraction) and the median
    within-run error of the median, quiet and busy runs apart."""
    med = np.median(rec.samples, axis=-1)
    out = {}
    for i, p in enumerate(rec.points):
        x = np.log(med[:, i])
        out[p] = {"night_sigma": float(changes.MAD_SCALE * np.median(np.abs(x - np.median(x)))),
                  "within_sigma": float(np.median(changes.within_night_sigma(rec.samples[:, i]))),
                  "busy_slowdown": busy_effect(x, rec.busy),
                  "median": float(np.median(med[:, i]))}
    return out


def busy_effect(x: np.ndarray, busy) -> float | None:
    """The busy runs' median over the quiet runs' (log values x, one per run), as a fraction; None without both."""
    noisy = np.asarray(busy, dtype=bool)
    if not noisy.any() or noisy.all():
        return None
    return float(math.expm1(np.median(x[noisy]) - np.median(x[~noisy])))


def met(name: str, value, goals: dict | None = None) -> bool:
    goal, sense = (GOALS if goals is None else goals)[name]
    return value is not None and (value <= goal if sense == "at most" else value >= goal)


def render_results(fig: dict) -> str:
    """The results file as the docs' tables."""
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.0f}%"

    rule = fig["rule"]
    lines = [f"Recorded: {fig['runs']} runs ({fig['busy_runs']} with one core kept busy) of {len(fig['points'])} "
             f"points, {fig['samples_recorded']} samples each; {fig['histories']} simulated histories a row "
             f"(circular block bootstrap, blocks of {fig['block']} runs, {fig['established']} established nights "
             f"first), seed {fig['seed']}. Rule: {budget(rule)}, CUSUM "
             f"k {rule['k']:g} h {rule['h']:.2f}, floors {pct(rule['step_floor'])} (one night) and "
             f"{pct(rule['drift_floor'])} (cumulative), {rule['min_nights']} nights before the first alarm, Pelt "
             f"penalty {rule['penalty']:g}.", "",
             "| point | median | night-to-night noise | within-run error of the median (9 samples) | busy core |",
             "|---|---|---|---|---|"]
    for p, n in fig["noise"].items():
        busy = "n/a" if n["busy_slowdown"] is None else f"{100 * n['busy_slowdown']:+.1f}%"
        lines.append(f"| {p} | {n['median']:.4g} | {100 * n['night_sigma']:.1f}% | {100 * n['within_sigma']:.1f}% "
                     f"| {busy} |")
    labels = {"false_alarms_per_100": (FALSE_ALARM_LABEL, f"<= {FALSE_ALARM_GOAL:.2f}"),
              "step10_first_night": ("10% step caught on its first night", ">= 95%"),
              "step5_within_3": ("5% step caught within 3 nights", ">= 90%"),
              "drift1_before_5pct": ("drift of 1% a night caught before 5%", ">= 90%"),
              "named_exactly": ("change night named exactly (5% and 10% steps)", ">= 80%")}
    gauss = fig.get("gaussian", {})
    lines += ["", "The goals on the recorded nights (9 samples a night), and the same rule on synthetic runners whose "
              "night-to-night noise is known (Gaussian, 1% within a run): what the goals ask of a runner.", "",
              "| measure | recorded nights | goal | met | " + " | ".join(f"Gaussian {100 * float(g):g}% noise"
                                                                     for g in gauss) + " |",
              "|---|---|---|---|" + "---|" * len(gauss)]
    for name, (label, goal) in labels.items():
        def shown(v, name=name):
            return f"{v:.2f}" if name == "false_alarms_per_100" else pct(v)

        v = fig["goals"][name]
        lines.append(f"| {label} | {shown(v)} | {goal} | {'yes' if met(name, v) else 'NO'} | "
                     + " | ".join(shown(g[name]) for g in gauss.values()) + " |")
    lines += ["", "Recorded nights, 9 samples a night:", "",
              "| step | caught on its first night | within 3 nights | named exactly |", "|---|---|---|---|"]
    for s, d in fig["steps"].items():
        lines.append(f"| {100 * float(s):g}% | {pct(d['first_night'])} | {pct(d['within_3'])} | "
                     f"{pct(d['named_exactly'])} |")
    d = fig["drift"]
    lines += ["", f"A drift of 1% a night: caught before it reaches 5% {pct(d['before_5pct'])}, within 6 nights "
              f"{pct(d['within_6'])}, its first night named {pct(d['named_exactly'])} of those."]
    if "accepted" in fig:
        lines += ["", accepted_text(fig["accepted"], fig["clean"]["9"], len(fig["points"]))]
    lines += ["", "Per 100 clean nights of this history: nights with a false alarm (the nightly fails), nights that "
              "fail (an alarm stays open until two nights are back at the level), alarms summed over the points, "
              "speedups noted (they fail nothing).", "",
              "| samples a night | false alarms | failing nights | alarms over points | speedups noted | 5% step "
              "within 3 nights | 10% step on its first night |", "|---|---|---|---|---|---|---|"]
    for k in ("3", "5", "9"):
        c, b = fig["clean"][k], fig["by_samples"][k]
        lines.append(f"| {k} | {c['false_alarms_per_100']:.2f} | {c['failing_nights_per_100']:.2f} | "
                     f"{c['point_alarms_per_100']:.2f} | {c['speedups_per_100']:.2f} | "
                     f"{pct(b['0.05']['within_3'])} | {pct(b['0.1']['first_night'])} |")
    lines += ["", f"Pelt's penalty, calibrated on the synthetic {100 * GAUSSIAN[0]:g}% runner (where most steps are "
              "caught, so the shares are not of a handful):", "",
              "| Pelt penalty | named exactly, 5% step | named exactly, 10% step |", "|---|---|---|"]
    for pen, d in fig["penalty"].items():
        mark = " (the rule's)" if float(pen) == rule["penalty"] else ""
        lines.append(f"| {pen}{mark} | {pct(d['0.05'])} | {pct(d['0.1'])} |")
    return "\n".join(lines)
