"""What each job costs: the wall time each of the suite's jobs took on the machines it ran on, read from the results
files that recorded it, and the jobs no file has measured yet, each with the command that would.

The table is docs/ci.md's block "job-costs" (`fastpath-suite maintain results` renders it). Its sources:

    the default run     results/false-alarms (fresh clones: install, then pytest) and results/shards (pytest serial
                        and sharded, from a cold cache)
    the report          results/report ("seconds")
    .ci/run             results/job-ci, written by `fastpath-suite audit costs ci`
    the gate            results/gate ("seconds" of each verdict)
    a night             results/job-nightly-speed and results/job-nightly-slow (`audit costs`), and the part
                        results/instructions measures alone (counting every point under callgrind)
    the GPU tier        results/gpu-check (each stage's seconds)

`fastpath-suite audit costs` prints that table from the results files (`--dir`). `fastpath-suite audit costs JOB`
runs a job that records no time of its own (`.ci/run`, the nightly's two jobs) in a checkout (`--cwd`, e.g. a fresh
clone) and, with `--results DIR`, writes its wall time and exit status as the results kind `job-JOB`. Exit: 0 for the
table; the job's own exit status; 2 for an unknown job, a `--cwd` that is not a folder or a results file that cannot
be read.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from harness.run import results

# A job that records no time of its own -> (what it is, the command it runs, as its workflow or script runs it)
JOBS = {
    "ci": ("CI on a clean clone (`.ci/run`): the default run, the slow controls, the instruction-count check, the "
           "mutants of the change", "bash .ci/run"),
    "nightly-speed": ("the nightly speed job on the CPU runner (`nightly.yml`, `speed`): the full-size speed tier, "
                      "instructions under callgrind and exact counts",
                      "mkdir -p out && .venv/bin/python -m pytest tests_speed --slow -m \"slow and not cuda\" "
                      "--benchmark-json=out/wall.json && .venv/bin/fastpath-suite counts instructions --out "
                      "out/instructions.json --keep out/callgrind && .venv/bin/fastpath-suite counts structure --out "
                      "out/structure.json"),
    "nightly-slow": ("the nightly slow job (`nightly.yml`, `slow`): the slow tier beyond speed",
                     "mkdir -p out && .venv/bin/python -m pytest --slow -m \"slow and not cuda\" tests_patches "
                     "tests_harness tests_parity tests_quality --junitxml=out/slow.xml"),
}


def kind(job: str) -> str:
    return f"job-{job}"


def run_job(job: str, cwd: Path) -> dict:
    """Run `job`'s command in `cwd` (its output goes to this process's); its figures: wall seconds and exit."""
    command = JOBS[job][1]
    start = time.monotonic()
    code = subprocess.call(["bash", "-c", command], cwd=cwd)
    return {"job": job, "runs": command, "seconds": round(time.monotonic() - start, 1), "exit": code}


def render_results(figures: dict) -> str:
    """docs/results.md's section of a job-time file (kind job-JOB)."""
    return (f"{JOBS.get(figures['job'], (figures['job'],))[0]}: `{figures['runs']}` took "
            f"{minutes(figures['seconds'])} (exit {figures['exit']}).\n")


# --- the table of docs/ci.md -----------------------------------------------------------------------------------


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def files(results_dir: Path, name: str) -> list:
    """(path, data) of every results file of kind `name`, each checked as results.load checks it."""
    return [(path, results.load(path)) for path in sorted(Path(results_dir).glob(f"{name}/*.json"))]


def source(path: Path, data: dict) -> str:
    return f"{data['date'][:10]}, `{path.parent.name}/{path.name}`"


def default_run_rows(results_dir: Path) -> list:
    rows = []
    for path, data in files(results_dir, "false-alarms"):
        for run in data["figures"]["runs"]:
            rows.append((f"install, then `pytest` serially, on a fresh clone ({run['settings']})",
                         data["machine_summary"], f"{minutes(run['wall_s'])} (install {minutes(run['install_s'])}, "
                                                  f"pytest {minutes(run['pytest_s'])}), exit {run['exit_code']}",
                         source(path, data)))
    for path, data in files(results_dir, "shards"):
        runs = data["figures"]["runs"]
        rows.append(("`pytest` from a cold cache: serial, and sharded (`-n auto`: "
                     f"{data['figures']['workers']} workers)", data["machine_summary"],
                     f"{minutes(runs['serial']['wall_s'])}, {minutes(runs['sharded']['wall_s'])}", source(path, data)))
    return rows


def report_rows(results_dir: Path) -> list:
    return [("`fastpath-suite report`", data["machine_summary"], minutes(data["figures"]["seconds"]),
             source(path, data)) for path, data in files(results_dir, "report") if "seconds" in data["figures"]]


def gate_rows(results_dir: Path) -> list:
    rows = []
    for path, data in files(results_dir, "gate"):
        for verdict in data["figures"].get("verdicts", [data["figures"]]):
            rows.append((f"`fastpath-suite gate {verdict['candidate']['spec']}` ({verdict['state']})",
                         data["machine_summary"], minutes(verdict["seconds"]), source(path, data)))
    return rows


def job_rows(results_dir: Path, job: str) -> list:
    return [(f"`{data['figures']['runs']}`", data["machine_summary"],
             f"{minutes(data['figures']['seconds'])}, exit {data['figures']['exit']}", source(path, data))
            for path, data in files(results_dir, kind(job))]


def instructions_rows(results_dir: Path) -> list:
    return [("`fastpath-suite counts instructions`: every counting point under callgrind",
             data["machine_summary"], minutes(data["figures"]["seconds"]), source(path, data))
            for path, data in files(results_dir, "instructions") if "seconds" in data["figures"]]


def gpu_rows(results_dir: Path) -> list:
    rows = []
    for path, data in files(results_dir, "gpu-check"):
        steps = data["figures"].get("steps", {})
        total = sum(step.get("seconds") or 0 for step in steps.values())
        rows.append((f"`fastpath-suite gpu-check` ({data['figures'].get('mode') or 'full'}: "
                     f"{', '.join(steps)})", data["machine_summary"], minutes(total), source(path, data)))
    return rows


def not_measured(command: str) -> list:
    return [("-", "-", f"not measured: {command} records it", "-")]


def render_page(results_dir: Path = results.RESULTS_DIR) -> str:
    """docs/ci.md's block: one row per measured run of each job, "not measured" where no file has one."""
    jobs = [
        ("the default run (`bash scripts/install.sh && .venv/bin/python -m pytest -n auto`)",
         default_run_rows(results_dir), "`fastpath-suite audit false-alarms 1 --results results/`"),
        ("the report (`bash scripts/install.sh && .venv/bin/fastpath-suite report`)", report_rows(results_dir),
         "`fastpath-suite report --results results/`"),
        ("CI on every change (`.ci/run`)", job_rows(results_dir, "ci"),
         "`fastpath-suite audit costs ci --cwd CLEAN_CLONE --results results/`"),
        ("the gate on a release", gate_rows(results_dir), "`fastpath-suite gate omnivoice==0.2.1 --results results/`"),
        ("a night, speed job (CPU runner)", job_rows(results_dir, "nightly-speed"),
         "`fastpath-suite audit costs nightly-speed --results results/`"),
        ("a night, speed job: its callgrind part", instructions_rows(results_dir),
         "`fastpath-suite counts instructions --results results/`"),
        ("a night, slow job", job_rows(results_dir, "nightly-slow"),
         "`fastpath-suite audit costs nightly-slow --results results/`"),
        ("the GPU tier (`fastpath-suite gpu-check`, on a GPU machine)", gpu_rows(results_dir),
         "`fastpath-suite gpu-check --gather out/gpu` after a `gpu-check` call on a GPU machine"),
    ]
    lines = ["| job | what ran | machine | wall time | measured, file in `results/` |", "|---|---|---|---|---|"]
    for job, rows, command in jobs:
        for i, (what, machine, took, where) in enumerate(rows or not_measured(command)):
            lines.append(f"| {job if i == 0 else ''} | {what} | {machine} | {took} | {where} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite audit costs", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("job", nargs="?", choices=sorted(JOBS), help="the job to run and time; none: print the table "
                        "of what each job costs. " + "; ".join(f"{name}: {what} (`{command}`)"
                                                              for name, (what, command) in JOBS.items()))
    parser.add_argument("--dir", type=Path, default=results.RESULTS_DIR, help="the results folder the table reads")
    parser.add_argument("--cwd", type=Path, default=results.ROOT,
                        help="the checkout the job runs in (CI's: a fresh clone); its commit is the one recorded")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.job is None:
        try:
            print(render_page(args.dir), end="")
        except results.ResultsError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    if not args.cwd.is_dir():
        print(f"error: --cwd {args.cwd}: not a folder; give the checkout the job runs in (e.g. a fresh clone)",
              file=sys.stderr)
        return 2
    commit, dirty = results.checkout_state(args.cwd)  # as the job begins (the job may change the checkout)
    figures = run_job(args.job, args.cwd)
    if not args.quiet:
        print(f"{args.job}: `{figures['runs']}` took {minutes(figures['seconds'])}, exit {figures['exit']}",
              file=sys.stderr)
    results.write_if_asked(args, kind(args.job), figures, commit=commit or "unknown", dirty=dirty)
    return figures["exit"]


if __name__ == "__main__":
    raise SystemExit(main())
