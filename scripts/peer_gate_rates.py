"""Operating characteristics of the --slow peer gate (tests_speed/test_rtf.py::
test_lossless_stack_beats_stock_and_the_public_package), simulated from a grid run's rounds.

    fastpath-suite audit peer-rates results/grid/<machine key>.json [--sims 20000]

GRID: a results file of `fastpath-suite grid --results results/`, or a folder of `fastpath-suite bench --out` JSON
files (one per point).

Model: a round's RTF is the variant's true RTF times exp(e), e ~ N(0, s_v), s_v pooled over every point of the grid
(per variant, n - 1 per point). The gate takes the median of 3 rounds per variant, compares the ratio with the floor
recorded for this machine (baselines/ratio_floors.json), and measures once more before failing. Printed: the pass
rate when the truth is the ratio measured in the grid (a clean rerun), and when the stack is slower by 10, 15 or
25% as a whole call (--inject-slowdown F slows the LLM forwards by F, so a whole call by somewhat less).
Within-run noise only: drift between runs is not in the model.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.run.machine import hardware_key, machine_info  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite audit peer-rates", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("grid", type=Path, help="a grid results file, or a folder of bench --out JSON files")
    parser.add_argument("--sims", type=int, default=20000, help="simulated gate runs per cell")
    args = parser.parse_args()
    if args.grid.is_file():  # a results file: the samples are its figures' points
        runs = [{"results": json.loads(args.grid.read_text())["figures"]["points"]}]
    else:
        runs = [json.loads(f.read_text()) for f in sorted(args.grid.glob("*.json"))]
    residuals: dict = {}
    medians: dict = {}
    for run in runs:
        for point, results in run["results"].items():
            for variant, samples in results.items():
                logs = [math.log(x) for x in samples["rtf"]]
                mean = statistics.mean(logs)
                name = variant.split("@")[0]
                residuals.setdefault(name, []).extend((x - mean, len(logs)) for x in logs)
                medians.setdefault(point.rsplit("-", 1)[0], {})[name] = statistics.median(samples["rtf"])
    sd = {v: math.sqrt(sum(e * e / (n - 1) * n for e, n in r) / len(r)) for v, r in residuals.items()}
    print("pooled log-SD of one round:", ", ".join(f"{v} {s:.4f}" for v, s in sd.items()))
    floors = json.loads((ROOT / "baselines" / "ratio_floors.json").read_text())["floors"]
    key = hardware_key(machine_info("cpu"))
    entries = floors.get(key, {}).get("full", {})
    if not entries:
        raise SystemExit(f"no floors recorded for {key} in baselines/ratio_floors.json")
    rng = random.Random(0)

    def passes(true_ratio: float, other: str, floor: float) -> float:
        ok = 0
        for _ in range(args.sims):
            for _attempt in range(2):
                o, s = (statistics.median(math.exp(rng.gauss(0, sd[v])) for _ in range(3)) for v in (other, "lossless"))
                if true_ratio * o / s >= floor:
                    ok += 1
                    break
        return ok / args.sims

    print("| gate entry | floor | measured ratio | passes, clean | stack 10% slower | 15% slower | 25% slower |")
    print("|---|---|---|---|---|---|---|")
    for name, entry in sorted(entries.items()):
        point, _, other = name.partition(" vs ")
        m = medians.get(point.rsplit("-", 1)[0])
        if m is None:
            print(f"| {name} | {entry['floor']} | not in this grid | | | | |")
            continue
        ratio = m[other] / m["lossless"]
        rates = [passes(ratio / slow, other, entry["floor"]) for slow in (1.0, 1.10, 1.15, 1.25)]
        print(f"| {name} | {entry['floor']} | {ratio:.3f}x | " + " | ".join(f"{r:.1%}" for r in rates) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
