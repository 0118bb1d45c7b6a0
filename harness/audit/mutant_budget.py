"""How many mutants recent changes touch, and how long CI's mutants stage takes on them: measured, not estimated.

`.ci/run` judges every mutant of the lines a change touched (`audit mutants --changed-since auto`) within a cap and a
budget. For each of the last N first-parent commits that changed a file of the mutation scope, this takes the lines
of this checkout that `git blame` still gives to that commit (a line rewritten since belongs to a later change),
and runs CI's stage on exactly those lines, with `.ci/run`'s own cap and budget: in a clone of this checkout's
commit, a side commit that marks those lines is the base of `--changed-since`, so the stage judges this checkout's
code as it would judge the change. Each change gets its mutants by room, the stage's wall time and its exit (0
passed, 1 a survivor, 3 not judged: past the cap or the budget). With --count-only the mutants are counted (one
generation of the files) and no stage runs.

    fastpath-suite audit mutant-budget --commits 8 --results results/
    fastpath-suite audit mutant-budget --commits 30 --count-only
    fastpath-suite audit mutant-budget --commits 8 --max-mutants 70   # a larger cap, to size it
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.audit import mutant_rooms, mutants
from harness.run.progress import Progress, clock

ROOT = mutants.ROOT
CI = ROOT / ".ci" / "run"
MARK = "  # replayed by audit mutant-budget"
EXITS = {0: "passed", 1: "survivor", 2: "error", 3: "not judged"}


class BudgetError(RuntimeError):
    """Bad input to the measurement; the message names the fix."""


def git(*args, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def ci_stage(path: Path = CI, max_mutants: int | None = None, budget: int | None = None) -> dict:
    """The cap and budget of `.ci/run`'s mutants stage, read from its line; one given replaces CI's (to size it)."""
    found = re.search(r"audit mutants --changed-since \S+ --max-mutants (\d+) --budget (\d+)",
                      path.read_text() if path.exists() else "")
    if not found:
        raise BudgetError(f"{path}: no line `fastpath-suite audit mutants --changed-since auto --max-mutants N "
                          "--budget S` (CI's mutants stage) to measure; restore it, or update this reader")
    return {"max_mutants": max_mutants or int(found[1]), "budget": budget or int(found[2])}


def recent_changes(n: int, source: Path = ROOT, head: str = "HEAD") -> list:
    """The last `n` first-parent commits up to `head` that changed a file of the scope, newest first, as (commit,
    files)."""
    found = []
    for commit in git("rev-list", "--first-parent", head, cwd=source).split():
        parent = git("rev-list", "--parents", "-n", "1", commit, cwd=source).split()[1:2]
        if not parent:
            break
        files = git("diff", "--name-only", parent[0], commit, "--", *mutants.MODULES, cwd=source).split()
        if files:
            found.append((commit, files))
            if len(found) == n:
                break
    return found


def blamed_lines(commit: str, files: list, source: Path = ROOT, head: str = "HEAD") -> dict:
    """{path: the lines (1-based) of the file at `head` that git blame gives to `commit`, or, for a merge, to a
    commit it brought in}; files gone since are left out."""
    brought = set(git("rev-list", f"{commit}^1..{commit}", cwd=source).split())
    there = set(git("ls-tree", "-r", "--name-only", head, "--", *files, cwd=source).split())
    out = {}
    for path in files:
        if path not in there:
            continue
        porcelain = git("blame", "--porcelain", head, "--", path, cwd=source)
        # a header line: <40 hex> <line in the original> <line in the final file> [<lines in the group>]
        lines = {int(final) for sha, final in re.findall(r"(?m)^([0-9a-f]{40}) \d+ (\d+)", porcelain)
                 if sha in brought}
        if lines:
            out[path] = lines
    return out


def clone_at(source: Path, commit: str, clone: Path) -> Path:
    """A clone of `source` sharing its objects, checked out (detached) at `commit`."""
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(source), str(clone)], check=True,
                   capture_output=True)
    git("checkout", "-q", "--detach", commit, cwd=clone)
    return clone


def replay(source: Path, lines: dict, folder: Path, head: str | None = None) -> tuple:
    """A clone of `source` at `head` (its HEAD by default) in `folder` and, on a side branch, a commit that marks
    each of `lines`: (the clone, the side commit). `changed_lines(side commit, clone)` is then `lines`."""
    head = head or git("rev-parse", "HEAD", cwd=source)
    clone = clone_at(source, head, folder / "clone")
    git("checkout", "-q", "-b", "replay", head, cwd=clone)
    for path, numbers in lines.items():
        text = (clone / path).read_text().split("\n")
        for n in numbers:
            text[n - 1] += MARK
        (clone / path).write_text("\n".join(text))
    git("-c", "user.name=mutant-budget", "-c", "user.email=mutant-budget@localhost", "commit", "-q", "-am",
        "replayed lines", cwd=clone)
    side = git("rev-parse", "HEAD", cwd=clone)
    git("checkout", "-q", "--detach", head, cwd=clone)
    return clone, side


def run_stage(source: Path, lines: dict, folder: Path, stage: dict, head: str) -> dict:
    """CI's stage on `lines` of `source` at commit `head`: {"seconds", "exit", "mutants": {room: n}, "killed",
    "survived", "not_judged"}."""
    clone, side = replay(source, lines, folder, head)
    out = folder / "results"
    command = [sys.executable, "-m", "harness", "audit", "mutants", "--changed-since", side, "--source", str(clone),
               "--max-mutants", str(stage["max_mutants"]), "--budget", str(stage["budget"]),
               "--work", str(folder / "work"), "--results", str(out), "--quiet"]
    started = time.monotonic()
    # as CI runs it: strict inputs (.ci/run exports FASTPATH_STRICT=1)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "FASTPATH_STRICT": "1"})
    seconds = time.monotonic() - started
    row = {"seconds": seconds, "exit": done.returncode, "mutants": {}, "killed": 0, "survived": 0, "not_judged": 0}
    if done.returncode not in EXITS or done.returncode == 2:
        raise BudgetError(f"CI's stage stopped with exit {done.returncode} on {len(lines)} file(s); its output "
                          f"ends:\n{(done.stdout + done.stderr)[-3000:]}")
    written = list(out.glob("mutants-change/*.json"))
    if written:  # none where the lines hold no mutant: the stage passes at once
        figures = json.loads(written[0].read_text())["figures"]
        for m in figures["mutants"]:
            row["mutants"][m["room"]] = row["mutants"].get(m["room"], 0) + 1
        for room, n in figures.get("capped_rooms", {}).items():
            row["mutants"][room] = row["mutants"].get(room, 0) + n
        s = figures["summary"]
        row.update(killed=s["killed"], survived=s["survived"],
                   not_judged=s["not_judged"] + len(figures.get("capped", [])))
    return row


def count(source: Path, changes: list, folder: Path, head: str = "HEAD") -> list:
    """{room: mutants} of each change's blamed lines, from one generation of every file they touch at `head`."""
    paths = sorted({p for lines in changes for p in lines})
    counts = [{} for _ in changes]
    if not paths:
        return counts
    clone = clone_at(source, head, folder / "clone")
    mutants.prepare(folder / "gen", (), clone, paths)
    for m in mutants.generate(folder / "gen", paths):
        if not mutant_rooms.decides(m.path, m.function):
            continue
        for lines, counted in zip(changes, counts):
            if mutants.touching([m], lines):
                room = mutant_rooms.room_of(m.path).name
                counted[room] = counted.get(room, 0) + 1
    return counts


def main(argv=None) -> int:
    from harness.run import results
    from harness.run.cli import int_at_least

    parser = argparse.ArgumentParser(prog="fastpath-suite audit mutant-budget", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--commits", type=int_at_least(1), default=8, help="how many recent changes to measure")
    parser.add_argument("--count-only", action="store_true",
                        help="count each change's mutants by room; run no stage (no times, no exits)")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose history and HEAD are read")
    parser.add_argument("--max-mutants", type=int_at_least(1), default=None,
                        help="the stage's cap to measure (default: .ci/run's), to size a new one")
    parser.add_argument("--budget", type=int_at_least(1), default=None, metavar="SECONDS",
                        help="the stage's budget to measure (default: .ci/run's)")
    parser.add_argument("--within-cap", action="store_true",
                        help="count first; run the stage only on the changes within the cap (CI fails the others as "
                             "not judged, after at most the budget)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("mutant-budget", quiet=args.quiet)
    try:
        stage = ci_stage(max_mutants=args.max_mutants, budget=args.budget)
        source = args.source.resolve()
        # one commit measured, whatever lands in the checkout while the stages run
        head = git("rev-parse", "HEAD", cwd=source)
        changes = recent_changes(args.commits, source, head)
        rows = []
        for commit, files in changes:
            lines = blamed_lines(commit, files, source, head)
            rows.append({"commit": commit, "subject": git("log", "-1", "--format=%s", commit, cwd=source)[:80],
                         "files": sorted(lines), "lines": sum(map(len, lines.values())), "mutants": {},
                         "seconds": None, "exit": None})
            rows[-1]["_lines"] = lines
        with tempfile.TemporaryDirectory(prefix="mutant-budget-") as tmp:
            if args.count_only or args.within_cap:
                progress.say(f"counting the mutants of {len(rows)} change(s)' lines (one generation)")
                for row, counted in zip(rows, count(source, [r["_lines"] for r in rows], Path(tmp) / "count", head)):
                    row["mutants"] = counted
            if not args.count_only:
                runs = [row for row in rows if not args.within_cap or sum(row["mutants"].values()) <=
                        stage["max_mutants"]]
                started = time.monotonic()
                for i, row in enumerate(runs, 1):
                    left = (time.monotonic() - started) / (i - 1) * (len(runs) - i + 1) if i > 1 else None
                    progress.say(f"{i}/{len(runs)}: CI's stage on the {row['lines']} line(s) HEAD still has of "
                                 f"{row['commit'][:12]}" + (f"; about {clock(left)} left" if left else ""))
                    if not row["_lines"]:
                        row.update(seconds=0.0, exit=0)  # nothing of it left at HEAD: the stage passes at once
                        continue
                    row.update(run_stage(source, row["_lines"], Path(tmp) / f"change-{i}", stage, head))
    except (BudgetError, mutants.MutantsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for row in rows:
        del row["_lines"]
        row["total"] = sum(row["mutants"].values())
    figures = summary(rows, stage, measured=not args.count_only)
    results.write_if_asked(args, "mutants-budget", figures, commit=head)
    print(render_results(figures))
    return 0


def quantile(values: list, q: float):
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)] if values else None


def summary(rows: list, stage: dict, measured: bool) -> dict:
    totals = [row["total"] for row in rows]
    seconds = [row["seconds"] for row in rows if row["seconds"] is not None]
    return {"changes": rows, "stage": stage, "measured": measured,
            "mutants_median": statistics.median(totals) if totals else None, "mutants_p90": quantile(totals, 0.9),
            "mutants_max": max(totals, default=None), "over_cap": sum(t > stage["max_mutants"] for t in totals),
            "seconds_median": statistics.median(seconds) if seconds else None,
            "seconds_p90": quantile(seconds, 0.9), "seconds_max": max(seconds, default=None),
            # not judged in full: past the cap, or left unrun by the budget (the exit says 1 where a survivor is
            # among those that ran, which CI reports first)
            "not_fitting": sum(bool(row.get("not_judged")) or row["exit"] == 3 or row["total"] > stage["max_mutants"]
                               for row in rows) if measured else None}


def render_results(figures: dict) -> str:
    # the rows are the measurement; what is said of them is derived again here, so a file written before a fix of
    # the summary renders with the fix
    figures = summary(figures["changes"], figures["stage"], figures["measured"])
    rows, stage = figures["changes"], figures["stage"]
    out = [f"{len(rows)} recent change(s) of the mutation scope, replayed on the lines HEAD still has of each: "
           f"mutants of those lines median {figures['mutants_median']}, 90th percentile {figures['mutants_p90']}, "
           f"most {figures['mutants_max']}; {figures['over_cap']} over CI's cap of {stage['max_mutants']}.", ""]
    if figures["measured"]:
        out += [f"CI's stage (budget {stage['budget']} s) on each, timed: median {clock(figures['seconds_median'] or 0)}"
                f", 90th percentile {clock(figures['seconds_p90'] or 0)}, most {clock(figures['seconds_max'] or 0)}; "
                f"{figures['not_fitting']} of {len(rows)} did not fit (mutants not judged: past the cap or the "
                f"budget).", ""]
    else:
        out += ["Counted only (--count-only): no stage ran, so no times.", ""]
    out += ["| commit | change | lines at HEAD | mutants by room | all | stage | killed | survived | not judged | "
            "exit |", "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        rooms = ", ".join(f"{room} {n}" for room, n in sorted(row["mutants"].items())) or "none"
        took = ("not run: over the cap" if row["seconds"] is None and figures["measured"] else
                "n/a" if row["seconds"] is None else clock(row["seconds"]))
        exit_ = "n/a" if row["exit"] is None else EXITS.get(row["exit"], str(row["exit"]))
        counts = " | ".join("n/a" if row["exit"] is None else str(row.get(k, 0))
                            for k in ("killed", "survived", "not_judged"))
        out += [f"| `{row['commit'][:12]}` | {row['subject'].replace('|', '/')} | {row['lines']} | {rooms} | "
                f"{row['total']} | {took} | {counts} | {exit_} |"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
