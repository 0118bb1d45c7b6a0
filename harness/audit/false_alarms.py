"""False alarms of the default suite: the "false-alarms" results file, from what `fastpath-suite audit false-alarms`
(scripts/false_alarms.sh) leaves in out/false_alarms/.

Each run i of the script leaves:

    run<i>.xml    pytest's junit report of the run (missing when the install or pytest never wrote one)
    run<i>.json   {"run", "runs", "settings", "env", "avx2", "one_core_busy", "exit_code", "wall_s", "install_s",
                   "pytest_s", "commit", "invocation"}   (written by the script after the run)

`record` reads them (runs 1..N with --runs N, else every run<i>.json of the newest call of the script, by its
"invocation") and writes results/false-alarms/<machine>.json through harness.run.results; the script calls it at the
end when given --results DIR:

    fastpath-suite audit false-alarms 5 --busy 2 --results results/

A failed test is one whose junit case holds a <failure> or an <error> (as the script's own table counts it).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.run import results

KIND = "false-alarms"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "out" / "false_alarms"


def junit_counts(path: Path) -> dict | None:
    """Counts of a junit report: passed, failed (a <failure> or an <error>: the test did not pass), errors (how
    many of those are errors only), skipped, the failed test ids and the seconds the suites took; None when there
    is no readable report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = list(root.iter("testcase"))
    failed, errors, skipped = [], 0, 0
    for case in cases:
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
            errors += "failure" not in tags
        elif "skipped" in tags:
            skipped += 1
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {"passed": len(cases) - len(failed) - skipped, "failed": len(failed), "errors": errors,
            "skipped": skipped, "failed_tests": failed,
            "seconds": round(sum(float(s.get("time") or 0) for s in suites), 3)}


def run_files(out_dir: Path, runs: int | None = None) -> list:
    """[(i, run<i>.json path)] of the runs to record: 1..runs, or those of the newest invocation."""
    out_dir = Path(out_dir)
    if runs is not None:
        return [(i, out_dir / f"run{i}.json") for i in range(1, runs + 1)]
    found = []
    for path in out_dir.glob("run*.json"):
        number = path.stem[3:]
        if number.isdigit():
            found.append((int(number), path))
    if not found:
        return []
    newest = max(found, key=lambda item: item[1].stat().st_mtime)[1]
    invocation = json.loads(newest.read_text()).get("invocation")
    return sorted((i, p) for i, p in found if json.loads(p.read_text()).get("invocation") == invocation)


def gather(out_dir: Path, runs: int | None = None) -> dict:
    """The figures of a false-alarms results file, from the script's files in out_dir."""
    out_dir = Path(out_dir)
    files = run_files(out_dir, runs)
    if not files:
        raise FileNotFoundError(f"no run<i>.json in {out_dir}: run `fastpath-suite audit false-alarms N` first")
    rows, per_test, commits = [], collections.Counter(), set()
    for i, path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (run {i} of the script did not finish): rerun the script")
        meta = json.loads(path.read_text())
        counts = junit_counts(out_dir / f"run{i}.xml")
        commits.add(meta.get("commit"))
        row = {"run": i, "settings": meta["settings"], "env": meta.get("env", []),
               "avx2": meta.get("avx2", False), "one_core_busy": meta.get("one_core_busy", False),
               "exit_code": meta["exit_code"], "wall_s": meta["wall_s"], "install_s": meta["install_s"],
               "pytest_s": meta["pytest_s"], "report": counts is not None}
        row.update({k: counts[k] for k in ("passed", "failed", "skipped", "failed_tests")} if counts else
                   {"passed": None, "failed": None, "skipped": None, "failed_tests": []})
        per_test.update(row["failed_tests"])
        rows.append(row)
    if len(commits) != 1:
        raise ValueError(f"the runs in {out_dir} are of different commits {sorted(map(str, commits))}: "
                         "record one call of the script at a time (--runs N)")
    return {"commit": commits.pop(), "runs": rows,
            "failures_per_test": dict(sorted(per_test.items(), key=lambda kv: (-kv[1], kv[0])))}


def record(out_dir: Path = DEFAULT_OUT, results_dir: Path = results.RESULTS_DIR, runs: int | None = None,
           command: str | None = None) -> Path:
    """Write the false-alarms results file into results_dir from the script's files in out_dir."""
    figures = gather(out_dir, runs)
    # the runs measured fresh clones of the ref, not this checkout (which may have moved on meanwhile)
    return results.record(KIND, figures, results_dir, command=command, commit=figures.get("commit") or None)


def render_results(figures: dict) -> str:
    """A false-alarms results file's figures as markdown: one row per run, then failures per test."""
    runs = figures["runs"]
    n = len(runs)
    lines = [f"The default test run (`pytest`, after `bash scripts/install.sh`) on {n} fresh clones of "
             f"`{(figures['commit'] or 'unknown')[:12]}`, cold caches.", "",
             "| run | settings | wall s (install + pytest) | exit | passed | failed | skipped | failed tests |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r["report"]:
            failed = ", ".join(r["failed_tests"]).replace("|", "\\|")
            counts = f"{r['passed']} | {r['failed']} | {r['skipped']} | {failed or '-'}"
        else:
            counts = "- | - | - | no junit report: see the run's log"
        lines.append(f"| {r['run']} | {r['settings']} | {r['wall_s']} ({r['install_s']} + {r['pytest_s']}) | "
                     f"{r['exit_code']} | {counts} |")
    alarmed = sum(1 for r in runs if r["exit_code"] != 0)
    per_test = figures["failures_per_test"]
    lines += ["", f"Runs that did not pass: {alarmed} of {n}. Failures per test: "
              + ("none." if not per_test else "; ".join(f"`{t}`: {k}/{n}" for t, k in per_test.items()) + ".")]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.audit.false_alarms", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the script's folder (run<i>.xml, run<i>.json)")
    parser.add_argument("--results", type=Path, default=results.RESULTS_DIR, metavar="DIR",
                        help="the results folder to write into")
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="record runs 1..N; default: every run of the newest call of the script")
    parser.add_argument("--command", default=None, help="the command line to record (the script passes its own)")
    args = parser.parse_args(argv)
    try:
        path = record(args.out, args.results, args.runs, args.command)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"results file: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
