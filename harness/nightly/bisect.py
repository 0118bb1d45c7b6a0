"""From a flagged night to its commit: the first commit of a range whose count of a point moved past its floor.

    fastpath-suite nightly bisect GOOD BAD --point auto-short-2 [--signal structure|instructions]

Like `git bisect run`: the commits GOOD..BAD (first parents, oldest first) are searched by halving; each one probed
is checked out in its own git worktree and counted there by its own code (`python -m harness <signal> --points P
--variants V --out FILE`, this environment's interpreter and packages, the checkpoint cache shared). A probe whose
count moved from GOOD's by more than the floor, the way BAD's did (more work, or less: the count check fails both),
is "bad", else "good"; a commit whose count command fails (it does
not build or import, or its code cannot count the point) is skipped and named, and the search goes on around it.

`--count-with this` holds the counting method fixed instead: each commit's `fastpath/` (the patches) is counted by
this checkout's harness (`python -m harness.counts.<signal>` over a folder that links this `harness/` beside the
commit's `fastpath/`). It reaches commits from before the counting command existed, and a range across which the
counting code itself changed; a commit whose patches this harness cannot drive is skipped and named.

The floor: exact counts (structure: operator calls) move only when the work does, so any change is a step; instruction
counts wobble by a few hundredths of a percent with the heap, so the floor is the point's stored margin
(baselines/instructions.json) or 0.1%. A range whose BAD is not past the floor has no step, and says so (exit 0,
nothing to find); otherwise the answer is the first bad commit, with the counts on both sides and every step taken
(exit 1: a step was found; exit 2: bad input, or the step lies among skipped commits and cannot be told apart).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO_ROOT

SIGNALS = ("structure", "instructions")
STRUCTURE_FLOOR = 0.0  # exact: any change of the operator calls is a step
INSTRUCTIONS_FLOOR = 0.001  # when the point has no stored margin: the margins' own floor (docs/nightly.md)
COUNT_TIMEOUT = 3600


class BisectError(ValueError):
    pass


@dataclass
class Probe:
    commit: str
    subject: str
    count: int | None  # None: skipped
    verdict: str  # "good", "bad", "skipped"
    why: str = ""
    seconds: float = 0.0


@dataclass
class Bisection:
    point: str
    signal: str
    floor: float
    good: Probe
    bad: Probe
    probes: list = field(default_factory=list)  # every commit counted, in the order counted (good and bad first)
    first_bad: Probe | None = None
    candidates: list = field(default_factory=list)  # the step lies in one of these (skipped commits in the way)

    @property
    def step(self) -> bool:
        return self.bad.verdict == "bad"


def git(args: list, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def commit_range(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after GOOD up to BAD, oldest first (first parents: a merged branch counts as its merge)."""
    good_sha, bad_sha = git(["rev-parse", "--verify", f"{good}^{{commit}}"], repo), \
        git(["rev-parse", "--verify", f"{bad}^{{commit}}"], repo)
    if subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, bad_sha], cwd=repo).returncode != 0:
        raise BisectError(f"{good} is not an ancestor of {bad}: give GOOD before BAD on one line of history")
    commits = git(["rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}"], repo).split()
    if not commits:
        raise BisectError(f"{good}..{bad} holds no commit")
    return [good_sha, *commits]


def floor_of(signal: str, point: str, variant: str) -> float:
    if signal == "structure":
        return STRUCTURE_FLOOR
    stored = REPO_ROOT / "baselines" / "instructions.json"
    try:
        data = json.loads(stored.read_text())
        margins = [key["counts"][f"{point}/{variant}"]["margin"] for key in data.get("keys", {}).values()
                   if f"{point}/{variant}" in key.get("counts", {})]
        if margins:
            return float(max(margins))
    except (OSError, ValueError, AttributeError):
        pass
    return INSTRUCTIONS_FLOOR


COUNT_WITH = ("own", "this")


def count_at(repo: Path, commit: str, signal: str, point: str, variant: str, work: Path,
             python: str = sys.executable, count_with: str = "own") -> tuple[int | None, str]:
    """The point's count at `commit`, in a worktree of `repo`: by the commit's own code, or (count_with "this") by
    this checkout's harness driving the commit's fastpath/. (count, "") or (None, why)."""
    tree = work / commit[:12]
    if tree.exists():
        shutil.rmtree(tree)
    git(["worktree", "add", "--detach", "--force", str(tree), commit], repo)
    out = work / f"{commit[:12]}-{signal}.json"
    where = tree
    command = [python, "-m", "harness", signal]
    if count_with == "this":
        where = work / f"{commit[:12]}-overlay"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        (where / "harness").symlink_to(REPO_ROOT / "harness", target_is_directory=True)
        (where / "fastpath").symlink_to(tree / "fastpath", target_is_directory=True)
        command = [python, "-m", f"harness.counts.{signal}"]
    env = {**os.environ, "PYTHONPATH": str(where), "FASTPATH_CACHE": os.environ.get("FASTPATH_CACHE",
                                                                                     str(REPO_ROOT / ".cache"))}
    try:
        done = subprocess.run(command + ["--points", point, "--variants", variant, "--quiet", "--out", str(out)],
                              cwd=where, env=env, capture_output=True, text=True, timeout=COUNT_TIMEOUT)
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            return None, f"the count exited {done.returncode}: {last[0][:200]}"
        return int(json.loads(out.read_text())["points"][f"{point}/{variant}"]["median"]), ""
    except subprocess.TimeoutExpired:
        return None, f"the count did not finish in {COUNT_TIMEOUT} s"
    except (KeyError, ValueError) as err:
        return None, f"the count's run file has no {point}/{variant}: {err}"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
        shutil.rmtree(work / f"{commit[:12]}-overlay", ignore_errors=True)


def bisect(repo: Path, good: str, bad: str, point: str, signal: str = "structure", variant: str = "lossless",
           log=print, counter=count_at) -> Bisection:
    """The search (module docstring). `counter(repo, commit, signal, point, variant, work) -> (count, why)`."""
    if signal not in SIGNALS:
        raise BisectError(f"unknown signal {signal!r}: one of {SIGNALS}")
    commits = commit_range(Path(repo), good, bad)
    floor = floor_of(signal, point, variant)
    subjects = dict(line.split(" ", 1) for line in git(["log", "--no-walk=unsorted", "--format=%H %s", *commits],
                                                         Path(repo)).splitlines() if " " in line)
    probes: dict[str, Probe] = {}
    sign = 0  # BAD's direction once it is counted (+1 more work, -1 less); before that a move either way counts

    def past(count: int, reference: int) -> bool:
        up, down = count > reference * (1 + floor), count < reference * (1 - floor)
        return up if sign > 0 else down if sign < 0 else up or down

    with tempfile.TemporaryDirectory(prefix="fastpath-bisect-") as tmp:
        def probe(commit: str, reference: int | None) -> Probe:
            started = time.perf_counter()
            log(f"[bisect] counting {point}/{variant} ({signal}) at {commit[:12]} {subjects.get(commit, '')[:60]} "
                f"({len(probes) + 1} counted so far)")
            count, why = counter(Path(repo), commit, signal, point, variant, Path(tmp))
            if count is None:
                verdict = "skipped"
            elif reference is None:
                verdict = "good"
            else:
                verdict = "bad" if past(count, reference) else "good"
            p = Probe(commit, subjects.get(commit, ""), count, verdict, why, round(time.perf_counter() - started, 1))
            probes[commit] = p
            log(f"[bisect]   {commit[:12]}: " + (f"{count:,} ({verdict})" if count is not None else f"skipped: {why}"))
            return p

        first = probe(commits[0], None)
        if first.count is None:
            raise BisectError(f"GOOD {good} ({commits[0][:12]}) cannot be counted: {first.why}")
        last = probe(commits[-1], first.count)
        if last.count is None:
            raise BisectError(f"BAD {bad} ({commits[-1][:12]}) cannot be counted: {last.why}")
        sign = (last.count > first.count) - (last.count < first.count)
        result = Bisection(point, signal, floor, first, last)
        if last.verdict == "good":
            result.probes = list(probes.values())
            return result
        lo, hi = 0, len(commits) - 1  # commits[lo] good, commits[hi] bad
        while hi - lo > 1:
            inside = [i for i in range(lo + 1, hi) if commits[i] not in probes]
            if not inside:
                break  # every commit between is skipped
            mid = (lo + hi) // 2
            mid = min(inside, key=lambda i: (abs(i - mid), i))  # the middle, or the nearest not yet skipped
            p = probe(commits[mid], first.count)
            if p.verdict == "bad":
                hi = mid
            elif p.verdict == "good":
                lo = mid
        between = [probes[c] for c in commits[lo + 1:hi] if c in probes]  # skipped ones, if the search stopped
        result.probes = list(probes.values())
        result.first_bad = probes[commits[hi]]
        result.candidates = between + [probes[commits[hi]]] if between else []
        result.good = probes[commits[lo]]
        return result


def format_result(r: Bisection, good: str, bad: str) -> str:
    unit = "operator calls" if r.signal == "structure" else "instructions"
    floor = "any change" if r.floor == 0 else f"more than {100 * r.floor:.2f}% either way"
    lines = [f"bisect {good}..{bad}, point {r.point} ({r.signal}: {unit}; a step is {floor} from GOOD's count, in "
             f"the direction BAD moved)"]
    for p in r.probes:
        lines.append(f"  {p.commit[:12]} {p.verdict:>7}  " + (f"{p.count:>14,}" if p.count is not None else
                                                              f"{'-':>14}") + f"  {p.subject[:70]}"
                     + (f"  [{p.why}]" if p.why else ""))
    skipped = [p for p in r.probes if p.verdict == "skipped"]
    if not r.step:
        lines.append(f"no step in the range: BAD counts {r.bad.count:,} against GOOD's {r.good.count:,} "
                     f"({100 * (r.bad.count / r.good.count - 1):+.3f}%), not past the floor")
    elif r.candidates:
        lines.append("the step lies in one of these (skipped commits in the way): "
                     + ", ".join(f"{p.commit[:12]} ({p.verdict})" for p in r.candidates))
    else:
        fb = r.first_bad
        lines.append(f"first bad commit: {fb.commit} {fb.subject}")
        lines.append(f"  counts: {r.good.count:,} at {r.good.commit[:12]} (the last good) -> {fb.count:,} "
                     f"({100 * (fb.count / r.good.count - 1):+.3f}%)")
    if skipped:
        lines.append("skipped (could not be counted): " + ", ".join(f"{p.commit[:12]} ({p.why})" for p in skipped))
    lines.append(f"{len(r.probes)} commits counted, {sum(p.seconds for p in r.probes):.0f} s")
    return "\n".join(lines)


def command_for(good: str, bad: str, point: str, signal: str) -> str:
    """The bisect command for a flagged night's range (what `history check` prints beside the alarm)."""
    return f"fastpath-suite nightly bisect {good} {bad} --point {point} --signal {signal}"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="fastpath-suite nightly bisect", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # the example: fastpath-suite's table
    parser.add_argument("good", help="a commit whose count is the reference (the last good night's)")
    parser.add_argument("bad", help="a later commit whose count rose (the flagged night's)")
    parser.add_argument("--point", required=True, help="a counting point (fixtures/points.json 'counts')")
    parser.add_argument("--signal", choices=SIGNALS, default="structure",
                        help="structure: exact operator calls (seconds a count); instructions: callgrind (minutes)")
    parser.add_argument("--variant", choices=("stock", "lossless"), default="lossless")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the git checkout whose history is searched")
    parser.add_argument("--count-with", choices=COUNT_WITH, default="own",
                        help="own: each commit counted by its own harness; this: this checkout's harness counts each "
                             "commit's fastpath/ (commits older than the counting command; the method held fixed)")
    args = parser.parse_args(argv)
    try:
        result = bisect(args.repo, args.good, args.bad, args.point, args.signal, args.variant,
                        log=lambda msg: print(msg, file=sys.stderr, flush=True),
                        counter=lambda *a: count_at(*a, count_with=args.count_with))
    except BisectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_result(result, args.good, args.bad))
    if not result.step:
        return 0
    return 2 if result.candidates else 1
