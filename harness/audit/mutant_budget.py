"""How many mutants recent changes touched, and the time CI's mutants stage needs to judge all of them.

`.ci/run` judges every mutant of the lines a change touched (`audit mutants --changed-since auto`) within a budget.
This measures what that budget must hold: for each of the last N commits on the first-parent line that changed a
file of the mutation scope, that commit's own mutants of its changed lines (generated from the commit's files, as
the stage would), by room; then the stage's time for each, estimated from the measured timings of a sampled run
(results kind mutants, mutants-after or mutants-before of this machine: each set of tests' stats and clean runs,
and the mean seconds of a mutant of each room, with the run's workers).

    fastpath-suite audit mutant-budget --commits 30 --results results/
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.audit import mutant_rooms, mutants
from harness.run.progress import Progress, clock

ROOT = mutants.ROOT
TIMED_KINDS = ("mutants", "mutants-after", "mutants-before")  # the sampled runs whose timings the estimate reads


def git(*args, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def recent_changes(n: int, source: Path = ROOT) -> list:
    """The last `n` first-parent commits that changed a file of the scope, newest first, as (commit, files)."""
    found = []
    for commit in git("rev-list", "--first-parent", "HEAD", cwd=source).split():
        parent = git("rev-list", "--parents", "-n", "1", commit, cwd=source).split()[1:2]
        if not parent:
            break
        files = git("diff", "--name-only", parent[0], commit, "--", *mutants.MODULES, cwd=source).split()
        if files:
            found.append((commit, files))
            if len(found) == n:
                break
    return found


def touched_at(commit: str, files: list, work: Path, source: Path = ROOT) -> dict:
    """{room: mutants of the lines `commit` changed}, generated from that commit's own files."""
    tree = work / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=source, check=True,
                   capture_output=True)
    try:
        parent = git("rev-parse", f"{commit}^", cwd=tree)
        lines = mutants.changed_lines(parent, tree, files)
        paths = [p for p in files if p in lines and (tree / p).is_file()]
        counts = {}
        if paths:
            mutants.prepare(work / "gen", (), tree, paths)
            for m in mutants.generate(work / "gen", paths):
                if mutant_rooms.decides(m.path, m.function) and mutants.touching([m], lines):
                    room = mutant_rooms.room_of(m.path).name
                    counts[room] = counts.get(room, 0) + 1
        return counts
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=source, capture_output=True)


def timings(results_dir: Path, machine_key: str) -> dict | None:
    """From the newest sampled run of this machine: {"children", "setup": {room: seconds}, "per_mutant": {room:
    seconds}}, or None where there is none."""
    from harness.run import results

    runs = [results.load(p) for kind in TIMED_KINDS for p in [results_dir / kind / f"{machine_key}.json"]
            if p.exists()]
    runs = [r for r in runs if r["figures"].get("timings")]
    if not runs:
        return None
    run = max(runs, key=lambda r: r["date"])
    figures, setup, per = run["figures"], {}, {}
    for group in figures["timings"]:
        for room in group["rooms"]:  # generating the files' mutants, then the stats and clean runs
            setup[room] = group.get("generate_seconds", 0.0) + (group["setup_seconds"] or 0.0)
    for room in {m["room"] for m in figures["mutants"]}:
        # a mutant's 0.0 is no timing (mutmut's meta before the log's seconds were read): never a free mutant
        seconds = [m["seconds"] for m in figures["mutants"] if m["room"] == room and m["seconds"]]
        if seconds:
            per[room] = statistics.fmean(seconds)
    return {"children": figures["children"], "setup": setup, "per_mutant": per, "from": f"{run['kind']} of "
            f"{run['date'][:10]} at {run['commit'][:12]}"}


def stage_seconds(counts: dict, timed: dict) -> float | None:
    """The stage's time for one change: each set of tests it reaches pays its stats and clean runs, then its
    mutants run `children` at a time. None where a room has no timing."""
    by_tests = {}
    for room, n in counts.items():
        tests = mutant_rooms.selection(mutant_rooms.rooms([room])[0])
        by_tests.setdefault(tests, []).append((room, n))
    total = 0.0
    for rooms in by_tests.values():
        if any(room not in timed["per_mutant"] or room not in timed["setup"] for room, _ in rooms):
            return None
        total += max(timed["setup"][room] for room, _ in rooms)
        total += sum(n * timed["per_mutant"][room] for room, n in rooms) / timed["children"]
    return total


def main(argv=None) -> int:
    from harness.run import results
    from harness.run.cli import int_at_least
    from harness.run.machine import hardware_key, machine_info

    parser = argparse.ArgumentParser(prog="fastpath-suite audit mutant-budget", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--commits", type=int_at_least(1), default=30, help="how many recent changes to measure")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose history is read")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("mutant-budget", quiet=args.quiet)
    changes = recent_changes(args.commits, args.source)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mutant-budget-") as tmp:
        for i, (commit, files) in enumerate(changes, 1):
            progress.say(f"{i}/{len(changes)}: {commit[:12]} ({len(files)} file(s) of the scope)")
            counts = touched_at(commit, files, Path(tmp), args.source)
            rows.append({"commit": commit, "subject": git("log", "-1", "--format=%s", commit, cwd=args.source)[:80],
                         "files": files, "mutants": counts, "total": sum(counts.values())})
    key = hardware_key(machine_info("cpu"))
    timed = timings(results.RESULTS_DIR, key)
    for row in rows:
        row["seconds"] = stage_seconds(row["mutants"], timed) if timed else None
    figures = summary(rows, timed)
    results.write_if_asked(args, "mutants-budget", figures)
    print(render_results(figures))
    return 0


def summary(rows: list, timed: dict | None) -> dict:
    totals = sorted(row["total"] for row in rows)
    seconds = sorted(row["seconds"] for row in rows if row["seconds"] is not None)

    def quantile(values, q):
        return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)] if values else None

    return {"changes": rows, "timings": timed, "mutants_median": statistics.median(totals) if totals else None,
            "mutants_p90": quantile(totals, 0.9), "mutants_max": totals[-1] if totals else None,
            "seconds_p90": quantile(seconds, 0.9), "seconds_max": seconds[-1] if seconds else None}


def render_results(figures: dict) -> str:
    rows = figures["changes"]
    out = [f"{len(rows)} recent change(s) of the mutation scope: mutants of their changed lines, median "
           f"{figures['mutants_median']}, 90th percentile {figures['mutants_p90']}, most {figures['mutants_max']}.", ""]
    timed = figures["timings"]
    if timed:
        out += [f"The stage's time for each, estimated from the timings of {timed['from']} ({timed['children']} "
                f"worker(s)): 90th percentile {clock(figures['seconds_p90'] or 0)}, most "
                f"{clock(figures['seconds_max'] or 0)}.", ""]
    else:
        out += ["Not timed: no sampled run of this machine with timings in results/ (run `fastpath-suite audit "
                "mutants --sample 300 --results results/` first).", ""]
    out += ["| commit | change | mutants by room | all | stage, estimated |", "|---|---|---|---:|---:|"]
    for row in rows:
        rooms = ", ".join(f"{room} {n}" for room, n in sorted(row["mutants"].items())) or "none"
        took = "n/a" if row["seconds"] is None else clock(row["seconds"])
        out += [f"| `{row['commit'][:12]}` | {row['subject'].replace('|', '/')} | {rooms} | {row['total']} | {took} |"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
