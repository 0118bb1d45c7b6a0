"""The GPU tier's speed targets: aims of the benchmark's report, never floors of a test.

A target is a speedup the GPU stack aims at on a card (the stack at 3.5x stock eager, the full preset at 8x, a batch
of 8 at 3x one call each): the median RTF of one (point, variant) over another's, read from bench runs (a gpu-check
results file, a bench --out JSON, or a stored speed baseline of baselines/). A card that misses one is not a
regression: the speed tests judge a runner against its own stored baseline and against stock in the same run
(tests_speed/test_gpu_speed.py). The figure is printed only where harness.speed.stability judges its rounds a
measurement. `render_page` renders the block of docs/gpu.md, "Targets", from every card's files (harness.run.results).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from harness.run import results

NOT_JUDGED = "not judged"


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class Target:
    """A speedup the GPU stack aims at: median RTF of `base` over median RTF of `other`, each a (point, variant)."""

    name: str
    base: tuple
    other: tuple
    goal: float


TARGETS = (
    Target("GPU stack vs stock eager bf16, equal steps", ("clone6-medium-32", "stock@bf16"),
           ("clone6-medium-32", "gpu@bf16"), 3.5),
    Target("full preset (GPU stack + 12 steps) vs stock eager bf16 at 32 steps", ("clone6-medium-32", "stock@bf16"),
           ("clone6-medium-32", "preset@bf16"), 8.0),
    # the same audio either way, so the RTF ratio is the ratio of utterances per second
    Target("a mixed batch of 8 vs one call each, GPU stack", ("clone3-mixed8-16-each", "gpu@bf16"),
           ("clone3-mixed8-16", "gpu@bf16"), 3.0),
)


def sample_tables(source) -> list:
    """[(label, {(point, variant): [RTF samples in round order]})] of one source: a gpu-check results file's figures
    (one table per bench stage), a bench --out JSON, or a stored speed baseline (harness.speed.baselines: points named
    "<point>/<variant>"); a dict as loaded, or a path to one of those files."""
    if isinstance(source, (str, Path)):
        label, data = Path(source).name, json.loads(Path(source).read_text())
    else:
        label, data = None, source
    if isinstance(data, dict) and data.get("format") == results.FORMAT:  # a whole results file
        data = data["figures"]
    if isinstance(data, dict) and "bench" in data and "steps" in data:  # gpu-check figures
        return [(f"{name}.json", {(p, v): s["rtf"] for p, by in b["points"].items() for v, s in by.items()})
                for name, b in data["bench"].items()]
    if isinstance(data, dict) and "results" in data:  # bench --out
        return [(label or "bench", {(p, v): s["rtf"] for p, by in data["results"].items() for v, s in by.items()})]
    if isinstance(data, dict) and data.get("format") == "fastpath-speed-baseline":
        from harness.speed.baselines import read_run

        run = read_run(data, label or "baseline")
        return [(label or data.get("device_key"),
                 {tuple(n.split("/", 1)): list(p.samples) for n, p in run.points.items() if "/" in n})]
    raise ValueError(f"{label or 'the source'} is neither gpu-check figures, a bench --out JSON nor a speed baseline")


def target_figures(*sources) -> list:
    """Each target's figure from the first table holding both its sides: {"target", "goal", "base", "other" (median
    RTFs), "figure" (their ratio, None unless judged), "verdict" (met, not met, not judged, not measured), "reason",
    "source"}. Both sides at one point are interleaved rounds: harness.speed.stability judges the spread of the
    per-round ratios; sides at two points ran one after the other: each side's own spread is judged (compare's rule)."""
    from harness.speed import stability

    tables = [t for source in sources for t in sample_tables(source)]
    out = []
    for target in TARGETS:
        row = {"target": target.name, "goal": target.goal, "base": None, "other": None, "figure": None,
               "source": None}
        found = next(((label, t) for label, t in tables if target.base in t and target.other in t), None)
        if found is None:
            lacking = sorted({"/".join(side) for side in (target.base, target.other)
                              if not any(side in t for _, t in tables)}) or ["both sides in one run"]
            out.append(dict(row, verdict="not measured", reason=f"no run has {', '.join(lacking)}"))
            continue
        label, table = found
        base, other = table[target.base], table[target.other]
        row.update(base=statistics.median(base), other=statistics.median(other), source=label)
        ratio = row["base"] / row["other"]
        if target.base[0] == target.other[0]:
            judged = stability.judge_rounds(base, {"other": other}) if len(base) == len(other) else None
            problem = ("the two sides have different round counts" if judged is None
                       else None if judged.stable else judged.message)
            if judged is not None and judged.judged and not judged.stable:
                problem += (f"; per-round ratios spread {judged.spreads['other']:.0%} of their median (stable: at "
                            f"most {stability.MAX_RATIO_SPREAD:.0%})")
        else:
            problem = spread_problem(base, other)
        if problem:
            out.append(dict(row, verdict=NOT_JUDGED, reason=problem))
        else:
            out.append(dict(row, figure=ratio, verdict="met" if ratio >= target.goal else "not met", reason=""))
    return out


def spread_problem(*sides) -> str | None:
    """Why a ratio of two runs with no rounds in common is not a measurement (each side's IQR / median against
    MAX_SAMPLE_SPREAD, at least MIN_ROUNDS samples a side), or None."""
    from harness.speed import stability

    rounds = min(len(side) for side in sides)
    if rounds < stability.MIN_ROUNDS:
        return f"unjudged: {rounds} round(s); at least {stability.MIN_ROUNDS} show whether the timing holds"
    if any(stability.sample_spread(side) > stability.MAX_SAMPLE_SPREAD for side in sides):
        return stability.advice(None)
    return None


def render_targets(*sources) -> str:
    """The speed targets as a markdown table: goal, the two medians, the figure reached, met or not.

    Args:
        sources: gpu-check figures (a results file's "figures", or the whole file), bench --out JSONs or stored speed
            baselines (baselines/cuda-*.json), as dicts or paths; a target is read from the first that holds both
            its sides. "not measured" where none does; "not judged" where the rounds are too noisy or too few for
            the ratio to be a measurement (harness.speed.stability), and then no figure is printed.
    """
    lines = ["| target | goal | base median RTF | compared median RTF | figure reached | verdict | from |",
             "|---|---|---|---|---|---|---|"]
    for r in target_figures(*sources):
        base = "-" if r["base"] is None else f"{r['base']:.4f}"
        other = "-" if r["other"] is None else f"{r['other']:.4f}"
        figure = "-" if r["figure"] is None else f"{r['figure']:.2f}x"
        verdict = r["verdict"] + (f": {r['reason']}" if r["reason"] else "")
        lines.append(f"| {r['target']} | {r['goal']:g}x | {base} | {other} | {figure} | {cell(verdict)} | "
                     f"{cell(r['source'] or '-')} |")
    return "\n".join(lines)


def render_page(results_dir: Path = results.RESULTS_DIR, baselines_dir: Path | None = None) -> str:
    """docs/gpu.md's "Targets" block: one table per card, from its gpu-check results files (results/gpu-check/) and its
    stored speed baselines (baselines/cuda-*.json), each saying the machine, date, commit and command it came from."""
    from harness import BASELINES

    sources = []
    for path in sorted(Path(results_dir).glob("gpu-check/*.json")):
        data = results.load(path)
        sources.append((data["machine_summary"], path, data["date"][:10], data["commit"], data["command"], data))
    for path in sorted(Path(baselines_dir or BASELINES).glob("cuda-*.json")):
        data = json.loads(path.read_text())
        card = (data.get("machine") or {}).get("gpu_name") or data.get("device_key")
        sources.append((card, path, str(data.get("created_utc"))[:10], data.get("commit"), data.get("command"), data))
    if not sources:
        return "No GPU run has left a results file or a stored baseline yet: `fastpath-suite gpu-check --quick` on a GPU."
    out = []
    for card, path, date, commit, command, data in sources:
        where = path.relative_to(path.parents[1]) if len(path.parents) > 1 else path
        out += [f"**{card}**: `{where}`, measured {date} at commit `{(commit or 'unknown')[:12]}` with `{command}`.", "",
                render_targets(data), ""]
    return "\n".join(out).rstrip()
