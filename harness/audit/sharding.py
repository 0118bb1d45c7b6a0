"""The suite over several processes (pytest-xdist): do the serial and the sharded run give the same verdicts, test
for test, and which is faster here?

    fastpath-suite audit shards compare SERIAL.xml SHARDED.xml    # two junit reports: every test id, its outcome
    fastpath-suite audit shards measure [--workers 2] [--results results]

`compare` reads two pytest junit reports (`pytest --junitxml F`) and lists every test id whose outcome (passed,
failed, error, skipped) differs, or that only one run has; exit 0 when they agree test for test, 1 when not, 2 on a
file that is not a junit report.

`measure` runs the default run twice from a cold cache (an empty FASTPATH_CACHE each: the test checkpoint, the
espeak clips and the judges' caches built again, as on a fresh clone): serially, then sharded (`-n WORKERS`, the
distribution conftest.py gives under xdist), compares the two reports as `compare` does and writes both wall times,
the test counts and the agreement with `--results DIR` (kind "shards"; docs/results.md). Exit 1 when the runs
disagree or either run fails.

How the suite is made safe under xdist (docs/sharding.md): the checkpoint is built under a file lock, once per
machine; every cache file is written whole (temp file, then os.replace); results, temp folders and ports are each
worker's own (pytest's tmp_path per worker, ports bound to 0); `-n` distributes with `--dist loadscope`, so a
module's tests (and its module-scoped model) stay on one worker; each worker runs on its share of the threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from harness import REPO_ROOT

OUTCOMES = ("passed", "failed", "error", "skipped")


class JunitError(ValueError):
    """A file that is not a pytest junit report; the message names it and how to make one."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str
    message: str = ""


def read_junit(path: str | os.PathLike) -> dict[str, Outcome]:
    """{test id: Outcome} of a pytest junit report. The id is the report's classname and name (the module path and
    the test with its parameters). A test with an error in its teardown after a pass counts as an error."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise JunitError(f"{path}: not a readable junit report ({err}); write one with "
                         f"`pytest --junitxml {path}`") from err
    if root.tag not in ("testsuites", "testsuite"):
        raise JunitError(f"{path}: its root is <{root.tag}>, not a junit <testsuites>; write one with "
                         f"`pytest --junitxml {path}`")
    out: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("error", "failure", "skipped"):  # the worst first: a teardown error beats the pass before it
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = found.get("message", "") or ""
                break
        if test_id in out and OUTCOMES.index(out[test_id].outcome) in (1, 2):
            continue  # the same id twice (a call and a teardown report): keep the failure
        out[test_id] = Outcome(outcome, message)
    return out


@dataclasses.dataclass
class Agreement:
    tests: int
    only_first: list
    only_second: list
    differ: list  # (id, first outcome, second outcome, first message, second message)
    counts: dict  # {"first": {outcome: n}, "second": {...}}

    @property
    def agree(self) -> bool:
        return not (self.only_first or self.only_second or self.differ)

    def format(self, first: str = "serial", second: str = "sharded", limit: int = 20) -> str:
        def counted(c):
            return ", ".join(f"{n} {o}" for o, n in c.items() if n)

        lines = [f"{first}: {counted(self.counts['first'])}", f"{second}: {counted(self.counts['second'])}"]
        if self.agree:
            lines.append(f"AGREE: all {self.tests} test ids have the same outcome in both runs")
            return "\n".join(lines)
        lines.append(f"DIFFER: {len(self.differ)} test(s) with another outcome, {len(self.only_first)} only in the "
                     f"{first} run, {len(self.only_second)} only in the {second} run")
        for test_id, a, b, ma, mb in self.differ[:limit]:
            lines.append(f"  {test_id}: {first} {a}, {second} {b}")
            for side, msg in ((first, ma), (second, mb)):
                if msg:
                    lines.append(f"      {side}: {msg.splitlines()[0][:160]}")
        for name, ids in ((first, self.only_first), (second, self.only_second)):
            for test_id in ids[:limit]:
                lines.append(f"  only in the {name} run: {test_id}")
        return "\n".join(lines)


def compare(first: dict[str, Outcome], second: dict[str, Outcome]) -> Agreement:
    """Every test id of both reports: the ids only one has, and those whose outcome differs."""
    differ = [(i, first[i].outcome, second[i].outcome, first[i].message, second[i].message)
              for i in sorted(first.keys() & second.keys()) if first[i].outcome != second[i].outcome]
    counts = {side: {o: sum(1 for v in run.values() if v.outcome == o) for o in OUTCOMES}
              for side, run in (("first", first), ("second", second))}
    return Agreement(len(first.keys() | second.keys()), sorted(first.keys() - second.keys()),
                     sorted(second.keys() - first.keys()), differ, counts)


# --- measure: the default run serial and sharded, each from a cold cache ------------------------------------


def default_run(junit: Path, workers: str | None, cache: Path, log=print, extra: tuple = ()) -> dict:
    """One default run (`python -m pytest`, sharded over `workers` when given) with FASTPATH_CACHE=cache; its wall
    time, exit code and junit report."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *extra]
    if workers:
        command += ["-n", str(workers)]
    env = dict(os.environ, FASTPATH_CACHE=str(cache))
    log(f"[shards] {'sharded over ' + str(workers) + ' workers' if workers else 'serial'}: {' '.join(command[1:])} "
        f"(cold cache {cache})")
    start = last = time.perf_counter()
    lines = []
    with subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            done_pct = re.search(r"\[\s*(\d+)%\]\s*$", line)
            now = time.perf_counter()
            if done_pct and now - last >= 30 and int(done_pct.group(1)) > 0:  # pytest's own progress, every 30 s
                last, pct = now, int(done_pct.group(1))
                log(f"[shards]   {pct}% of the tests after {now - start:.0f} s, about "
                    f"{(now - start) * (100 - pct) / pct:.0f} s left")
        code = proc.wait()
    took = time.perf_counter() - start
    output = "".join(lines)
    tail = output.strip().splitlines()[-1:] or [""]
    log(f"[shards]   exit {code} in {took:.0f} s: {tail[0]}")
    started = re.search(r"created: (\d+)/\d+ workers", output)
    return {"workers": int(started.group(1)) if started else 0, "exit": code, "wall_s": round(took, 1),
            "summary": tail[0], "output_tail": output[-4000:]}


def measure(workers: str, log=print, extra: tuple = ()) -> dict:
    from harness.run import strict

    figures: dict = {"runs": {}}
    with tempfile.TemporaryDirectory(prefix="fastpath-shards-") as tmp:
        tmp = Path(tmp)
        reports = {}
        for name, n in (("serial", None), ("sharded", workers)):
            (tmp / f"cache-{name}").mkdir()
            reports[name] = tmp / f"{name}.xml"
            figures["runs"][name] = default_run(reports[name], n, tmp / f"cache-{name}", log, extra)
        agreement = compare(read_junit(reports["serial"]), read_junit(reports["sharded"]))
    figures.update(
        workers=figures["runs"]["sharded"]["workers"], asked=str(workers), strict=strict.is_strict(None),
        tests=agreement.tests, agree=agreement.agree,
        counts=agreement.counts, differ=[list(d[:3]) for d in agreement.differ],
        only_serial=agreement.only_first, only_sharded=agreement.only_second,
        speedup=round(figures["runs"]["serial"]["wall_s"] / figures["runs"]["sharded"]["wall_s"], 3),
    )
    for run in figures["runs"].values():
        if run["exit"] == 0:  # a failed run keeps its output's tail in the results file
            del run["output_tail"]
    log(agreement.format())
    return figures


def render_results(figures: dict) -> str:
    """docs/results.md's section: the default run serial and sharded on one machine, and whether they agree."""
    runs = figures["runs"]
    lines = ["| run | wall time of `python -m pytest` | exit | last line |", "|---|---|---|---|"]
    for name in ("serial", "sharded"):
        run = runs[name]
        label = "serial" if name == "serial" else f"sharded, `-n {figures['asked']}` ({figures['workers']} workers)"
        lines.append(f"| {label} | {run['wall_s']:.0f} s | {run['exit']} | {run['summary'].strip('= ')} |")
    agree = ("**the same outcome for every one of the {} test ids**".format(figures["tests"]) if figures["agree"] else
             f"**{len(figures['differ'])} test ids differ, {len(figures['only_serial'])} only serial, "
             f"{len(figures['only_sharded'])} only sharded**")
    lines += ["", f"Sharded over {figures['workers']} workers: {figures['speedup']:.2f} x the serial speed; junit "
                  f"reports compared test for test (`fastpath-suite audit shards compare`): {agree}."]
    lines += [f"- differs: `{d[0]}`: serial {d[1]}, sharded {d[2]}" for d in figures["differ"][:20]]
    lines += ["", "Each run from a cold cache (an empty FASTPATH_CACHE: the test checkpoint, the espeak clips and the "
                  "judges' caches built again, as on a fresh clone after its install), one after the other: one run "
                  "each, on a shared machine where wall time moves between runs (the nightly history's noise table), "
                  "so the speedup is this pair's, not a bound."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from harness.run import results

    parser = argparse.ArgumentParser(prog="fastpath-suite audit shards", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    cmp = verbs.add_parser("compare", help="two junit reports: the same outcome for every test id?",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cmp.add_argument("first", help="junit report of one run (e.g. the serial one)")
    cmp.add_argument("second", help="junit report of the other (e.g. the sharded one)")
    run = verbs.add_parser("measure", help="the default run serial and sharded, each from a cold cache: times and "
                                           "the junit comparison", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--workers", default="auto", help="xdist workers of the sharded run: a number, or auto (one per "
                                                        "usable CPU, as much as memory holds: the README's test command)")
    results.add_arguments(run)
    args = parser.parse_args(argv)
    if args.verb == "compare":
        try:
            agreement = compare(read_junit(args.first), read_junit(args.second))
        except JunitError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(agreement.format(Path(args.first).stem, Path(args.second).stem))
        return 0 if agreement.agree else 1
    figures = measure(args.workers, log=lambda m: print(m, file=sys.stderr, flush=True))
    results.write_if_asked(args, "shards", figures)
    ok = figures["agree"] and all(r["exit"] == 0 for r in figures["runs"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
