"""The speed-regression rule, per-point verdicts, and the report CLI.

Rule: an operating point *regresses* only when both hold
  1. its median got slower by more than the factor:  new_median / base_median - 1 > max_slowdown  (default 0.10,
     overridable per point in the base file), and
  2. the slowdown is not noise: a one-sided Mann-Whitney U test over the raw samples (scipy.stats.mannwhitneyu,
     alternative="greater", method="exact", new vs base) gives p < alpha (default 0.002). Exact whatever the ties:
     scipy's default switches to the normal approximation at the first tie, which gives 6 fully separated samples
     against 6 p = 0.0025 (above alpha, so a 2x slowdown with one tied pair of timings would pass).
The factor keeps small, real but harmless drifts (another kernel version, a warmer machine) from failing CI; the
test keeps one unlucky median from doing so. A rank test is used because timing samples are skewed and carry
outliers (a stall, a page fault) that a t-test would let dominate.

With few samples the test cannot reach alpha at all: the smallest one-sided p for n and m samples is 1 / C(n+m, n)
(every new sample slower than every base sample), e.g. 1/252 ~ 0.004 for 5 against 5. Such comparisons raise
InsufficientSamplesError instead of passing by construction.

The speed tests' gate against this machine's stored baseline is `gate_on_baseline`: every measured point the file
has is judged (`judge_points`) before a point it lacks is reported, so a regression fails whatever else is missing.

CLI::

    fastpath-suite compare BASE.json NEW.json [--out DIR] [--max-slowdown 0.10] [--alpha 0.002]

prints one row per operating point, writes DIR/report.md, DIR/chart.png and DIR/verdicts.json when --out is
given, and exits 1 when a point regressed, 2 on bad input (the error says the fix), 3 when no point regressed but
one is "unstable" (a side's IQR above stability.MAX_SAMPLE_SPREAD of its median: rerun on an idle machine), 0
otherwise. BASE and NEW are each a baseline file or a pytest-benchmark --benchmark-json file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from scipy import stats

from harness.speed.baselines import (
    NON_NEGATIVE,
    BaselineError,
    PointSamples,
    SpeedRun,
    load_run,
    read_run,
)

DEFAULT_MAX_SLOWDOWN = 0.10
DEFAULT_ALPHA = 0.002
VERDICTS = ("ok", "faster", "slower-not-significant", "regressed", "unstable")


class InsufficientSamplesError(BaselineError):
    """The sample counts make p < alpha impossible, so the comparison could never fail; measure more samples."""


@dataclass(frozen=True)
class SpeedVerdict:
    """Outcome of comparing one operating point.

    change: new_median / base_median - 1 (0.20 means 20% slower). p_value: one-sided Mann-Whitney U p that the new
    samples are slower than the base samples. verdict: one of VERDICTS:
      "regressed"              change > max_slowdown and p_value < alpha: fails the run
      "slower-not-significant" change > max_slowdown but the test cannot tell it from noise
      "faster"                 change < -max_slowdown and the mirrored test (new faster) gives p < alpha
      "ok"                     within the factor either way
      "unstable"               (the command line only, `mark_unstable`) a side's samples spread so far that the
                               change is not a measurement: IQR > stability.MAX_SAMPLE_SPREAD x median
    """

    name: str
    metric: str
    base_median: float
    new_median: float
    change: float
    p_value: float
    verdict: str
    max_slowdown: float
    alpha: float
    n_base: int
    n_new: int


def min_p_value(n_base: int, n_new: int) -> float:
    """Smallest one-sided Mann-Whitney U p reachable with these sample counts: 1 / C(n_base + n_new, n_base)."""
    return 1.0 / math.comb(n_base + n_new, n_base)


def min_samples_for_alpha(alpha: float) -> int:
    """Fewest samples per side (equal counts) for which p < alpha is reachable at all; 6 for alpha = 0.002."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    n = 1
    while min_p_value(n, n) >= alpha:
        n += 1
    return n


def check_reachable(name: str, n_base: int, n_new: int, alpha: float) -> None:
    """Raise InsufficientSamplesError when n_base against n_new samples can never give p < alpha."""
    floor = min_p_value(n_base, n_new)
    if floor >= alpha:
        raise InsufficientSamplesError(
            f"point {name!r}: {n_base} base against {n_new} new samples can never give an exact Mann-Whitney p below "
            f"alpha={alpha:g} (the smallest possible p is 1/C({n_base + n_new},{n_base}) = {floor:.3g}), so a "
            f"regression could never be flagged. Measure at least {min_samples_for_alpha(alpha)} samples per "
            "point on both sides, or raise alpha."
        )


def one_sided_p(new, base, alternative: str) -> float:
    """The rule's test: one-sided Mann-Whitney U, exact null distribution (the floor check_reachable assumes)."""
    return float(stats.mannwhitneyu(new, base, alternative=alternative, method="exact").pvalue)


def compare_point(base: PointSamples, new: PointSamples, *, max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
                  alpha: float = DEFAULT_ALPHA) -> SpeedVerdict:
    """Apply the rule to one point. ``base.max_slowdown``, when set, overrides ``max_slowdown``."""
    if base.metric != new.metric:
        raise BaselineError(
            f"point {base.name!r}: base measures {base.metric!r} but new measures {new.metric!r}; compare runs "
            "that record the same metric (pytest-benchmark runs need extra_info['rtf_samples'] to give 'rtf')."
        )
    check_reachable(base.name, len(base.samples), len(new.samples), alpha)
    factor = base.max_slowdown if base.max_slowdown is not None else max_slowdown
    p_slower = one_sided_p(new.samples, base.samples, "greater")
    if base.median == 0.0:  # a wait the base never had (NON_NEGATIVE metrics): its slack in seconds, not a ratio
        change = math.inf if new.median > 0 else 0.0
        worse = new.median > NON_NEGATIVE.get(base.metric, 0.0)
    else:
        change = new.median / base.median - 1.0
        worse = change > factor
    if worse:
        verdict = "regressed" if p_slower < alpha else "slower-not-significant"
    elif change < -factor and one_sided_p(new.samples, base.samples, "less") < alpha:
        verdict = "faster"
    else:
        verdict = "ok"
    return SpeedVerdict(
        name=base.name, metric=base.metric, base_median=base.median, new_median=new.median, change=change,
        p_value=p_slower, verdict=verdict, max_slowdown=factor, alpha=alpha,
        n_base=len(base.samples), n_new=len(new.samples),
    )


def as_run(data: dict | SpeedRun, label: str) -> SpeedRun:
    return data if isinstance(data, SpeedRun) else read_run(data, label)


def compare_speed_runs(base: dict | SpeedRun, new: dict | SpeedRun, *, max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
                 alpha: float = DEFAULT_ALPHA, allow_device_mismatch: bool = False) -> list[SpeedVerdict]:
    """Verdicts for every point of ``base``, in base order.

    Args:
        base, new: parsed baseline or pytest-benchmark JSON (or a ``SpeedRun`` from ``load_run``).
        max_slowdown: default factor; a point's own ``max_slowdown`` in ``base`` wins.
        alpha: significance level of the one-sided Mann-Whitney U test.
        allow_device_mismatch: compare even when both runs name different device keys.

    Raises BaselineError when the runs are for different devices, a base point is missing from ``new``, metrics
    differ, or the sample counts cannot reach alpha (InsufficientSamplesError). Points only in ``new`` get no
    verdict (see ``new_only_points``).
    """
    base_run, new_run = as_run(base, "base"), as_run(new, "new")
    if (not allow_device_mismatch and base_run.device_key and new_run.device_key
            and base_run.device_key != new_run.device_key):
        raise BaselineError(
            f"base ({base_run.source}) was measured on {base_run.device_key!r} but new ({new_run.source}) on "
            f"{new_run.device_key!r}; speed only compares on the same device key. Compare runs from the same "
            "machine, or pass allow_device_mismatch=True (--allow-device-mismatch) to compare anyway."
        )
    missing = [name for name in base_run.points if name not in new_run.points]
    if missing:
        raise BaselineError(
            f"new ({new_run.source}) lacks point(s) {missing} that base ({base_run.source}) has, so they would pass "
            f"unchecked. New has {sorted(new_run.points)}. Measure those points again, or re-create the base "
            "without them."
        )
    return [compare_point(point, new_run.points[name], max_slowdown=max_slowdown, alpha=alpha)
            for name, point in base_run.points.items()]


def new_only_points(base: dict | SpeedRun, new: dict | SpeedRun) -> list[str]:
    """Points measured in ``new`` that ``base`` lacks (no verdict possible)."""
    base_run, new_run = as_run(base, "base"), as_run(new, "new")
    return [name for name in new_run.points if name not in base_run.points]


def mark_unstable(verdicts: list[SpeedVerdict], base: SpeedRun, new: SpeedRun) -> list[SpeedVerdict]:
    """Each verdict, or "unstable" where the base's or the new run's samples of the point spread more than
    stability.MAX_SAMPLE_SPREAD of their median: neither a pass nor a regression can be read from them."""
    from dataclasses import replace

    from harness.speed.stability import MAX_SAMPLE_SPREAD, sample_spread

    out = []
    for v in verdicts:
        spread = max(sample_spread(list(base.points[v.name].samples)), sample_spread(list(new.points[v.name].samples)))
        out.append(replace(v, verdict="unstable") if spread > MAX_SAMPLE_SPREAD else v)
    return out


def should_remeasure(verdict: SpeedVerdict) -> bool:
    """True when this verdict would fail the run, so the point should be measured once more before failing.

    The second measurement must be compared on its own, fresh samples against the same base (not pooled with the
    first), and the run fails only if that comparison regresses too.
    """
    return verdict.verdict == "regressed"


def regression_line(base: PointSamples, verdict: SpeedVerdict, source: str) -> str:
    """One line saying how a regressed point got worse, against `source` (the baseline file's name)."""
    if base.median == 0:
        worse = f"now waits {verdict.new_median:.2f} s (median) where it never did"
    else:
        worse = f"{verdict.change:+.1%} {'worse' if base.metric in NON_NEGATIVE else 'slower'}"
    return f"{base.name}: {worse} (p={verdict.p_value:.2g}) vs {source}"


def judge_points(stored: dict, measured: dict, source: str, remeasure=None) -> tuple[list, list]:
    """Every measured point that has a stored one, judged by the rule before anything is said of those without one,
    so that a regression found is reported whatever else is missing.

    Args:
        stored: {name: PointSamples} of the baseline (`read_run(data).points`: with each point's max_slowdown).
        measured: {name: PointSamples} measured now.
        source: the baseline's name, said in each line.
        remeasure: () -> {name: PointSamples}, fresh samples of every point, called once when a point regressed
            (`should_remeasure`): each such point is judged again on the fresh samples alone (not pooled), and
            regresses only if they do too. None: judged once.

    Returns (regressed, missing): one line per regressed point (`regression_line`), and the names of the measured
    points the baseline lacks, in measured order. Prints one line per point judged.
    """
    verdicts = {name: compare_point(stored[name], new) for name, new in measured.items() if name in stored}
    flagged = [name for name, v in verdicts.items() if should_remeasure(v)]
    if flagged and remeasure is not None:
        fresh = remeasure()
        verdicts.update({name: compare_point(stored[name], fresh[name]) for name in flagged})
    for v in verdicts.values():
        print(f"{v.name}: base {v.base_median:.3f} new {v.new_median:.3f} change {v.change:+.1%} p {v.p_value:.2g} "
              f"-> {v.verdict}{' (measured twice)' if v.name in flagged and remeasure is not None else ''}")
    regressed = [regression_line(stored[name], v, source) for name, v in verdicts.items() if v.verdict == "regressed"]
    return regressed, [name for name in measured if name not in stored]


def gate_on_baseline(config, path, device_key: str, measured: dict, command: str, remeasure=None,
                     absent: str = "not judged") -> None:
    """A pytest speed test's gate against this machine's stored baseline (`baselines/<device key>.json` at `path`).

    No file for this device key: `absent` says what that is. "not judged" (the CPU speed runners: in either mode, a
    wall-time figure can only be recorded on the machine it describes; `command` records it:
    harness.run.strict.not_judged); "missing" (a GPU runner, whose job is to judge its card: harness.run.strict.missing,
    a failure in strict mode naming `command`). Either names the stored baselines of the same hardware that another
    software keeps from matching (baselines.near_misses). A corrupt or foreign file: BaselineError, an
    error, never a pass. Then `judge_points`: a regression fails the test whatever else is missing; after it, a
    measured point the file lacks is a missing input (harness.run.strict.missing: fails naming `command`, or not judged
    under --no-strict-inputs). config: the pytest config (the strict mode)."""
    import pytest

    from harness.run import strict
    from harness.speed.baselines import absent_message, load_baseline

    path = Path(path)
    if absent not in ("not judged", "missing"):
        raise ValueError(f"absent={absent!r}: 'not judged' or 'missing'")
    if not path.exists():
        what, fix = absent_message(path, device_key), f"record it on this machine: {command}"
        if absent == "missing":
            strict.missing(config, what, fix)
        strict.not_judged(what, fix)
    baseline = load_baseline(path, device_key, command)
    regressed, missing = judge_points(read_run(baseline, str(path)).points, measured, path.name, remeasure)
    if regressed:
        pytest.fail("speed regressed:\n  " + "\n  ".join(regressed), pytrace=False)
    if missing:
        strict.missing(config, f"{path} has no point {', '.join(missing)} (the others were judged: none regressed)",
                       f"record it on this machine: {command}")


def format_table(verdicts: list[SpeedVerdict]) -> str:
    """Plain-text table, one row per point."""
    header = ("point", "metric", "n base/new", "base median", "new median", "change", "factor", "p", "verdict")
    rows = [header] + [
        (v.name, v.metric, f"{v.n_base}/{v.n_new}", f"{v.base_median:.4g}", f"{v.new_median:.4g}",
         ("unstable" if v.verdict == "unstable" else f"{v.change:+.1%}"), f"{v.max_slowdown:.0%}", f"{v.p_value:.2g}", v.verdict)
        for v in verdicts
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe_run(run: SpeedRun) -> str:
    return (f"`{run.source}` ({run.kind}; device key `{run.device_key or 'unknown'}`; commit "
            f"`{run.commit or 'unknown'}`; created {run.created_utc or 'unknown'}; command "
            f"`{run.command or 'not recorded'}`)")


def stability_limit() -> float:
    from harness.speed.stability import MAX_SAMPLE_SPREAD

    return MAX_SAMPLE_SPREAD


def result_line(verdicts: list[SpeedVerdict]) -> str:
    regressed = [v.name for v in verdicts if v.verdict == "regressed"]
    unstable = [v.name for v in verdicts if v.verdict == "unstable"]
    if regressed:
        return "REGRESSED: " + ", ".join(regressed)
    if unstable:
        return "UNSTABLE (no verdict; rerun on an idle machine): " + ", ".join(unstable)
    return "no significant regression"


def write_report(path: Path, base: SpeedRun, new: SpeedRun, verdicts: list[SpeedVerdict], chart_name: str | None) -> None:
    """Markdown report: inputs, rule, per-point table, points without verdict, chart."""
    alpha = verdicts[0].alpha if verdicts else DEFAULT_ALPHA
    lines = [
        "# Speed comparison",
        "",
        f"- base: {describe_run(base)}",
        f"- new: {describe_run(new)}",
        f"- rule: a point regresses when its median is slower than the factor allows (new/base - 1 > factor) AND "
        f"a one-sided Mann-Whitney U test over the raw samples gives p < {alpha:g}.",
        f"- a point is unstable (no verdict) when either side's IQR is above {stability_limit():.0%} of its median.",
        f"- result: **{result_line(verdicts)}**",
        "",
        "| point | metric | n base/new | base median | new median | change | factor | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {v.name} | {v.metric} | {v.n_base}/{v.n_new} | {v.base_median:.4g} | {v.new_median:.4g} | "
        f"{'unstable' if v.verdict == 'unstable' else f'{v.change:+.1%}'} | {v.max_slowdown:.0%} | {v.p_value:.2g} | "
        f"{v.verdict} |"
        for v in verdicts
    ]
    extra = new_only_points(base, new)
    if extra:
        lines += ["", f"Points only in new (no baseline, no verdict): {', '.join(extra)}."]
    if base.device_key is None or new.device_key is None:
        lines += ["", "Note: a run does not record its device key, so the runs may come from different machines."]
    if chart_name:
        lines += ["", f"![base vs new samples]({chart_name})"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


VERDICT_COLORS = {"ok": "tab:gray", "faster": "tab:green", "slower-not-significant": "tab:orange",
                  "regressed": "tab:red", "unstable": "tab:purple"}


def draw_chart(path: Path, base: SpeedRun, new: SpeedRun, verdicts: list[SpeedVerdict]) -> None:
    """Box plot with the raw samples on top, base vs new per point, each scaled by its base median.

    Scaling puts points of different sizes on one axis; the dashed segment is each point's 1 + factor.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rng = np.random.default_rng(0)  # jitter only; fixed so the chart is reproducible
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(verdicts) + 2), 4.5), layout="constrained")
    for i, v in enumerate(verdicts):
        scaled = [np.asarray(run.points[v.name].samples) / v.base_median for run in (base, new)]
        boxes = ax.boxplot(scaled, positions=[i - 0.2, i + 0.2], widths=0.3, showfliers=False, patch_artist=True)
        for patch, color in zip(boxes["boxes"], ("tab:blue", VERDICT_COLORS[v.verdict]), strict=True):
            patch.set(facecolor=color, alpha=0.35)
        for x, values in zip((i - 0.2, i + 0.2), scaled, strict=True):
            ax.plot(x + rng.uniform(-0.06, 0.06, len(values)), values, ".", color="black", markersize=3)
        ax.hlines(1 + v.max_slowdown, i - 0.4, i + 0.4, colors="tab:red", linestyles="dashed", linewidth=1)
    ax.axhline(1.0, color="tab:blue", linewidth=0.8)
    ax.set_xticks(range(len(verdicts)))
    ax.set_xticklabels([f"{v.name}\n{v.change:+.1%} {v.verdict}" for v in verdicts], fontsize=8)
    ax.set_ylabel(f"sample / base median ({verdicts[0].metric if verdicts else ''}; lower is faster)")
    ax.set_title("Speed: base (blue, left) vs new (right, coloured by verdict); dashed = 1 + factor")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def slowdown_fraction(text: str) -> float:
    """argparse type: a finite fraction >= 0 (0.10 means 10% slower is still allowed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction such as 0.10 for 10%") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite fraction >= 0, such as 0.10 for 10%")
    return value


def probability(text: str) -> float:
    """argparse type: a significance level strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a level such as 0.002") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be strictly between 0 and 1, such as 0.002")
    return value


STORED = "stored"  # compare's BASE: the baseline stored for the new run's device key


def stored_for(run: SpeedRun, folder: Path | None = None) -> Path:
    """baselines/<device key of run>.json, or BaselineError naming the near misses and how to record one."""
    from harness import BASELINES
    from harness.speed.baselines import absent_message

    if not run.device_key:
        raise BaselineError(f"{run.source} records no device key, so no stored baseline can be chosen for it; pass "
                            "the baseline file instead of 'stored'")
    path = Path(folder or BASELINES) / f"{run.device_key}.json"
    if not path.exists():
        raise BaselineError(f"{absent_message(path, run.device_key)}. Record one on this machine: the command that "
                            f"measured {run.source} with --save-baseline {path} (bench), or `pytest ... "
                            "--save-baseline` (the speed tier), then commit it")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastpath-suite compare",
        description="Compare two speed runs point by point (median slowdown above a factor AND one-sided "
                    "Mann-Whitney U p < alpha). Exit 1 on a regression, 2 on bad input, 3 when a point's samples "
                    "spread too far to judge (unstable), 0 otherwise.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("base", type=Path, help="baseline file or pytest-benchmark --benchmark-json file, or "
                                                "'stored': the baseline stored for NEW's device key in baselines/")
    parser.add_argument("new", type=Path, help="the run to judge, same kinds as BASE")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.md, chart.png and verdicts.json (none: print only)")
    parser.add_argument("--max-slowdown", type=slowdown_fraction, default=DEFAULT_MAX_SLOWDOWN,
                        help="allowed median slowdown as a fraction, unless a base point sets its own")
    parser.add_argument("--alpha", type=probability, default=DEFAULT_ALPHA,
                        help="significance level of the one-sided Mann-Whitney U test")
    parser.add_argument("--allow-device-mismatch", action="store_true",
                        help="compare runs whose device keys differ")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        new = load_run(args.new)
        base = load_run(stored_for(new) if str(args.base) == STORED else args.base)
        verdicts = mark_unstable(compare_speed_runs(base, new, max_slowdown=args.max_slowdown, alpha=args.alpha,
                                                    allow_device_mismatch=args.allow_device_mismatch), base, new)
    except BaselineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(verdicts))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        draw_chart(args.out / "chart.png", base, new, verdicts)
        write_report(args.out / "report.md", base, new, verdicts, "chart.png")
        (args.out / "verdicts.json").write_text(json.dumps([asdict(v) for v in verdicts], indent=2) + "\n")
        print(f"wrote {args.out / 'report.md'}, {args.out / 'chart.png'} and {args.out / 'verdicts.json'}")
    regressed = [v.name for v in verdicts if v.verdict == "regressed"]
    if regressed:
        print(f"REGRESSED: {', '.join(regressed)}", file=sys.stderr)
        return 1
    unstable = [v.name for v in verdicts if v.verdict == "unstable"]
    if unstable:
        from harness.run.machine import load_average
        from harness.speed.stability import MAX_SAMPLE_SPREAD, advice

        print(f"UNSTABLE: {', '.join(unstable)}: a side's samples spread more than {MAX_SAMPLE_SPREAD:.0%} of their "
              f"median, so no verdict; {advice(load_average())}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
