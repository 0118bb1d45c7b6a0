"""From a flagged night to its commits: every commit of a range at which the count of a point moved past its floor.

    fastpath-suite nightly bisect GOOD BAD --point auto-short-2 [--signal structure|instructions] [--every]

Like `git bisect run`: the commits GOOD..BAD (BAD's first-parent line, oldest first) are searched by halving; each
one probed is checked out in its own git worktree and counted there by its own code (`python -m harness <signal>
--points P --variants V --out FILE`, this environment's interpreter and packages, the checkpoint cache shared). A
segment of the range whose two ends count within the floor of each other is taken to hold no lasting step; one whose
ends differ past it is split at its middle and both halves searched, so every move that lasts is found, in either
direction: a +5% regression and a -10% gain in one range are both named, and the range is said to have moved both
ways. A move undone inside the range (a rise and its fall between two counted commits) is invisible to halving:
`--every` counts every commit and compares neighbours. A commit whose count command fails (it does not build or
import, or its code cannot count the point) is skipped and named, never a step, and the search goes on around it.

A GOOD that is not on BAD's first-parent line (a commit of a branch merged into it) is refused, naming the merge to
start from: the line's commits before the merge lack GOOD's changes, and would each look like a step.

`--count-with this` holds the counting method fixed instead: each commit's `fastpath/` (the patches) is counted by
this checkout's harness (`python -m harness.counts.<signal>` over a folder that links this `harness/` beside the
commit's `fastpath/`; the instruction count's valgrind child starts in that folder, and refuses a count whose child
imported any other fastpath). It reaches commits from before the counting command existed, and a range across which
the counting code itself changed; a commit whose patches this harness cannot drive is skipped and named.

The floor: exact counts (structure: operator calls) move only when the work does, so any change is a step; instruction
counts wobble by a few hundredths of a percent with the heap, so the floor is the point's stored margin
(baselines/instructions.json) or 0.1%. Exit 0: GOOD and BAD count within the floor (no lasting step); 1: every
step found is named (one commit each); 2: bad input, or a step lies among skipped commits, or the count drifted past
the floor with no one commit past it.
"""

from __future__ import annotations

import json
import os
import re
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
    verdict: str  # against GOOD's count: "same" (within the floor), "more", "less"; or "skipped"
    why: str = ""
    seconds: float = 0.0


@dataclass
class Step:
    """A move past the floor between two counted commits of the range: at `after` when nothing lies between them,
    else at one of the skipped commits between them or at `after` (`candidates`), or spread over them all (`drift`:
    the two counts differ past the floor, and no commit between them that was counted is past it from either)."""
    before: Probe
    after: Probe
    candidates: list = field(default_factory=list)
    drift: bool = False

    @property
    def change(self) -> float:
        return self.after.count / self.before.count - 1

    @property
    def named(self) -> bool:
        return not self.candidates and not self.drift


@dataclass
class Bisection:
    point: str
    signal: str
    floor: float
    good: Probe
    bad: Probe
    probes: list = field(default_factory=list)  # every commit counted, in the order counted (GOOD and BAD first)
    steps: list = field(default_factory=list)  # every move past the floor found, oldest first, either direction
    every: bool = False  # every commit counted (--every), not halving

    @property
    def step(self) -> bool:
        return bool(self.steps)

    @property
    def both_ways(self) -> bool:
        return len({s.change > 0 for s in self.steps}) == 2

    @property
    def first_bad(self) -> Probe | None:  # the first step's commit
        return self.steps[0].after if self.steps else None

    @property
    def candidates(self) -> list:  # the first step's, when it lies among skipped commits
        return self.steps[0].candidates if self.steps else []


def git(args: list, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def commit_range(repo: Path, good: str, bad: str) -> list[str]:
    """GOOD and the commits after it up to BAD, oldest first, on BAD's first-parent line (a merged branch counts as
    its merge). A GOOD off that line (on a branch merged into it) is refused, naming the merge to start from: the
    line's commits before that merge lack GOOD's changes, and counted against GOOD's count each would look like a
    step."""
    good_sha, bad_sha = git(["rev-parse", "--verify", f"{good}^{{commit}}"], repo), \
        git(["rev-parse", "--verify", f"{bad}^{{commit}}"], repo)
    if subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, bad_sha], cwd=repo).returncode != 0:
        raise BisectError(f"{good} is not an ancestor of {bad}: give GOOD before BAD on one line of history")
    commits = git(["rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}"], repo).split()
    if not commits:
        raise BisectError(f"{good}..{bad} holds no commit")
    if git(["rev-parse", f"{commits[0]}^1"], repo) != good_sha:  # the line walked back past GOOD: GOOD is beside it
        merge = next(c for c in commits if subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, c],
                                                           cwd=repo).returncode == 0)
        subject = git(["log", "-1", "--format=%s", merge], repo)
        before = git(["rev-parse", f"{merge}^1"], repo)
        raise BisectError(
            f"{good} is not on {bad}'s first-parent line: it came in with the merge {merge[:12]} ({subject}), and "
            f"the line's commits before that merge lack its changes. Start from the merge: `nightly bisect "
            f"{merge[:12]} {bad}`, or from the commit before it on the line ({before[:12]}) to count the merge too; "
            f"to search the branch itself, give BAD on it")
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
IMPORT_ERRORS = ("SyntaxError", "IndentationError", "ImportError", "ModuleNotFoundError")


def why_failed(returncode: int, output: str) -> str:
    """Why a count command failed, from its output: the exception it ended with (a traceback's last line), said as
    "does not import" when it is an import-time error, else its last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^([\w.]+\.)?\w*(Error|Exception)\b:?", line)]
    last = (raised or lines or ["no output"])[-1][:200]
    kind = last.split(":")[0].rsplit(".", 1)[-1]
    if kind in IMPORT_ERRORS:
        where = [m for m in (re.match(r'^File "([^"]+)", line (\d+)', line) for line in lines) if m]
        return f"does not import: {last}" + (f" ({where[-1][1]}, line {where[-1][2]})" if where else "")
    return f"the count exited {returncode}: {last}"


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
    # The count imports `harness` and `fastpath` from `where` (first on the path, and the folder of `-m`); the
    # instruction count's valgrind child is started from the folder `harness` was imported from (code_root).
    env = {**os.environ, "PYTHONPATH": str(where), "FASTPATH_CACHE": os.environ.get("FASTPATH_CACHE",
                                                                                     str(REPO_ROOT / ".cache"))}
    try:
        done = subprocess.run(command + ["--points", point, "--variants", variant, "--quiet", "--out", str(out)],
                              cwd=where, env=env, capture_output=True, text=True, timeout=COUNT_TIMEOUT)
        if done.returncode != 0 or not out.is_file():
            return None, why_failed(done.returncode, done.stderr + "\n" + done.stdout)
        return int(json.loads(out.read_text())["points"][f"{point}/{variant}"]["median"]), ""
    except subprocess.TimeoutExpired:
        return None, f"the count did not finish in {COUNT_TIMEOUT} s"
    except (KeyError, ValueError) as err:
        return None, f"the count's run file has no {point}/{variant}: {err}"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
        shutil.rmtree(work / f"{commit[:12]}-overlay", ignore_errors=True)


def bisect(repo: Path, good: str, bad: str, point: str, signal: str = "structure", variant: str = "lossless",
           log=print, counter=count_at, every: bool = False) -> Bisection:
    """The search (module docstring). `counter(repo, commit, signal, point, variant, work) -> (count, why)`; a
    counter that raises at a commit skips that commit, as one that answers (None, why) does."""
    if signal not in SIGNALS:
        raise BisectError(f"unknown signal {signal!r}: one of {SIGNALS}")
    commits = commit_range(Path(repo), good, bad)
    floor = floor_of(signal, point, variant)
    subjects = dict(line.split(" ", 1) for line in git(["log", "--no-walk=unsorted", "--format=%H %s", *commits],
                                                         Path(repo)).splitlines() if " " in line)
    probes: dict[str, Probe] = {}

    def moved(count: int, reference: int) -> int:  # +1 past the floor up, -1 down, 0 within it
        return (count > reference * (1 + floor)) - (count < reference * (1 - floor))

    with tempfile.TemporaryDirectory(prefix="fastpath-bisect-") as tmp:
        def probe(i: int) -> Probe:
            commit, started = commits[i], time.perf_counter()
            log(f"[bisect] counting {point}/{variant} ({signal}) at {commit[:12]} {subjects.get(commit, '')[:60]} "
                f"({len(probes) + 1} counted so far)")
            try:
                count, why = counter(Path(repo), commit, signal, point, variant, Path(tmp))
            except Exception as err:  # noqa: BLE001 - any error of one commit's count skips that commit
                count, why = None, f"the count raised {type(err).__name__}: {err}"
            reference = probes[commits[0]].count if probes else count
            verdict = "skipped" if count is None else ("same", "more", "less")[moved(count, reference)]
            p = Probe(commit, subjects.get(commit, ""), count, verdict, why, round(time.perf_counter() - started, 1))
            probes[commit] = p
            log(f"[bisect]   {commit[:12]}: " + (f"{count:,} ({verdict})" if count is not None else f"skipped: {why}"))
            return p

        first = probe(0)
        if first.count is None:
            raise BisectError(f"GOOD {good} ({commits[0][:12]}) cannot be counted: {first.why}")
        last = probe(len(commits) - 1)
        if last.count is None:
            raise BisectError(f"BAD {bad} ({commits[-1][:12]}) cannot be counted: {last.why}")
        steps = []

        def between(lo: int, hi: int) -> Step | None:  # commits[lo] and commits[hi] counted, all between skipped
            if not moved(probes[commits[hi]].count, probes[commits[lo]].count):
                return None
            skipped = [probes[c] for c in commits[lo + 1:hi]]
            return Step(probes[commits[lo]], probes[commits[hi]], skipped + [probes[commits[hi]]] if skipped else [])

        def search(lo: int, hi: int) -> None:
            """Halving: a segment whose ends count the same (within the floor) holds no step that lasts; one whose
            ends differ is split at its middle counted commit, and each half searched."""
            while True:
                if not moved(probes[commits[hi]].count, probes[commits[lo]].count):
                    return
                inside = [i for i in range(lo + 1, hi) if commits[i] not in probes]
                if not inside:
                    steps.append(between(lo, hi))
                    return
                mid = min(inside, key=lambda i: (abs(i - (lo + hi) // 2), i))  # the middle, or nearest not skipped
                if probe(mid).count is not None:
                    break
            found = len(steps)
            search(lo, mid)
            search(mid, hi)
            if len(steps) == found:  # the ends differ past the floor, neither half does: a drift, no one commit
                steps.append(Step(probes[commits[lo]], probes[commits[hi]], drift=True))

        if every:
            for i in range(1, len(commits) - 1):
                probe(i)
            counted = [i for i, c in enumerate(commits) if probes[c].count is not None]
            steps = [s for s in (between(a, b) for a, b in zip(counted, counted[1:])) if s is not None]
        else:
            search(0, len(commits) - 1)
        order = {c: i for i, c in enumerate(commits)}
        return Bisection(point, signal, floor, first, last, list(probes.values()),
                         sorted(steps, key=lambda s: order[s.after.commit]), every)


def format_result(r: Bisection, good: str, bad: str) -> str:
    unit = "operator calls" if r.signal == "structure" else "instructions"
    floor = "any change" if r.floor == 0 else f"more than {100 * r.floor:.2f}%"
    how = "every commit counted" if r.every else "halving"
    lines = [f"bisect {good}..{bad}, point {r.point} ({r.signal}: {unit}; a step is {floor} either way between "
             f"neighbouring counted commits; {how})"]
    for p in r.probes:
        change = "" if p.count is None else f" ({100 * (p.count / r.good.count - 1):+.3f}%)"
        lines.append(f"  {p.commit[:12]} {p.verdict:>7}  " + (f"{p.count:>14,}" if p.count is not None else
                                                              f"{'-':>14}") + f"{change:>11}  {p.subject[:70]}"
                     + (f"  [{p.why}]" if p.why else ""))
    skipped = [p for p in r.probes if p.verdict == "skipped"]
    if not r.steps:
        lines.append(f"no step between GOOD and BAD: BAD counts {r.bad.count:,} against GOOD's {r.good.count:,} "
                     f"({100 * (r.bad.count / r.good.count - 1):+.3f}%), not past the floor"
                     + ("" if r.every else "; halving sees the moves that last to BAD: a move undone inside the range "
                                           "(a rise and its fall) is seen with --every"))
    if r.both_ways:
        lines.append("the range moved both ways: " + ", ".join(
            f"{100 * s.change:+.3f}% at {s.after.commit[:12]}" + ("" if s.named else " (not one commit: below)")
            for s in r.steps))
    for s in r.steps:
        way = "more work" if s.change > 0 else "less work"
        counts = (f"{s.before.count:,} at {s.before.commit[:12]} -> {s.after.count:,} at {s.after.commit[:12]} "
                  f"({100 * s.change:+.3f}%, {way})")
        if s.drift:
            lines.append(f"a drift, no one commit: {counts}, and no commit counted between them past the floor "
                         f"from either (search it with --every)")
        elif s.candidates:
            lines.append(f"a step among skipped commits: {counts}; it lies in one of these: "
                         + ", ".join(f"{p.commit[:12]} ({p.verdict})" for p in s.candidates))
        else:
            lines.append(f"step: {s.after.commit} {s.after.subject}")
            lines.append(f"  counts: {counts}")
    if skipped:
        lines.append("skipped (could not be counted, not steps): "
                     + ", ".join(f"{p.commit[:12]} ({p.why})" for p in skipped))
    lines.append(f"{len(r.probes)} commits counted, {sum(p.seconds for p in r.probes):.0f} s")
    return "\n".join(lines)


def command_for(good: str, bad: str, point: str, signal: str) -> str:
    """The bisect command for a flagged night's range (what `nightly check` prints beside the alarm)."""
    return f"fastpath-suite nightly bisect {good} {bad} --point {point} --signal {signal}"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="fastpath-suite nightly bisect", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # the example: fastpath-suite's table
    parser.add_argument("good", help="a commit whose count is the reference (the last good night's)")
    parser.add_argument("bad", help="a later commit on the same first-parent line whose count moved (the flagged night's)")
    parser.add_argument("--point", required=True, help="a counting point (fixtures/points.json 'counts')")
    parser.add_argument("--signal", choices=SIGNALS, default="structure",
                        help="structure: exact operator calls (seconds a count); instructions: callgrind (minutes)")
    parser.add_argument("--variant", choices=("stock", "lossless"), default="lossless")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the git checkout whose history is searched")
    parser.add_argument("--count-with", choices=COUNT_WITH, default="own",
                        help="own: each commit counted by its own harness; this: this checkout's harness counts each "
                             "commit's fastpath/ (commits older than the counting command; the method held fixed)")
    parser.add_argument("--every", action="store_true",
                        help="count every commit of the range, not halving: also finds a move undone before BAD (a "
                             "rise and its fall)")
    args = parser.parse_args(argv)
    try:
        result = bisect(args.repo, args.good, args.bad, args.point, args.signal, args.variant,
                        log=lambda msg: print(msg, file=sys.stderr, flush=True),
                        counter=lambda *a: count_at(*a, count_with=args.count_with), every=args.every)
    except BisectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_result(result, args.good, args.bad))
    if not result.steps:
        return 0
    return 1 if all(s.named for s in result.steps) else 2
