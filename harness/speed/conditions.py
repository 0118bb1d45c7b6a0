"""What a measurement ran beside: the load average, the hypervisor's steal time and how long the measuring process
waited for a CPU. A wall-time night measured beside competing work is recorded but not judged.

`start()` snapshots the counters; `since(snapshot)` gives, over the time between:

- ``load_average``: the 1-minute load average at the end (os.getloadavg);
- ``steal_share``: the share of all CPU time the hypervisor gave to other guests (/proc/stat "steal");
- ``wait_share``: the measuring process's time runnable but waiting on a run queue, over its time on a CPU, summed
  over its threads (/proc/<pid>/task/*/schedstat: run_delay over cpu_time).

`busy(conditions)` says why a night is not fit to judge wall time by, or None. Its bounds (`BOUNDS`) sit between
what a quiet machine and one with a busy neighbour at the same priority measured here (docs/nightly.md). A missing
counter (another OS, a container without /proc) is recorded as None and judged by the others.
"""

from __future__ import annotations

import os
from pathlib import Path

# bound per counter: above it the night is not judged on wall time
BOUNDS = {"wait_share": 0.10, "steal_share": 0.05, "load_per_cpu": 1.5}


def _proc_stat() -> tuple | None:
    """(steal ticks, all ticks) of the whole machine, or None without /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in fields]
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)


def _schedstat(pid: int | None = None) -> tuple | None:
    """(cpu ns, wait ns) summed over the threads of `pid` (this process), or None without schedstat."""
    base = Path(f"/proc/{pid or os.getpid()}/task")
    cpu = wait = 0
    try:
        for task in base.iterdir():
            try:
                values = (task / "schedstat").read_text().split()
            except OSError:
                continue  # a thread that ended meanwhile
            cpu, wait = cpu + int(values[0]), wait + int(values[1])
    except OSError:
        return None
    return cpu, wait


def start() -> dict:
    return {"stat": _proc_stat(), "sched": _schedstat()}


def since(snapshot: dict) -> dict:
    """The conditions between `snapshot` (start()) and now."""
    stat, sched = _proc_stat(), _schedstat()
    steal = wait = None
    if stat and snapshot.get("stat"):
        total = stat[1] - snapshot["stat"][1]
        steal = (stat[0] - snapshot["stat"][0]) / total if total > 0 else 0.0
    if sched and snapshot.get("sched"):
        cpu = sched[0] - snapshot["sched"][0]
        wait = (sched[1] - snapshot["sched"][1]) / cpu if cpu > 0 else 0.0
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"load_average": load, "cpus": os.cpu_count(), "steal_share": steal, "wait_share": wait}


def busy(conditions: dict | None) -> str | None:
    """Why a night's wall time is not fit to judge (measured beside competing work), or None."""
    if not conditions:
        return None
    reasons = []
    if (conditions.get("wait_share") or 0.0) > BOUNDS["wait_share"]:
        reasons.append(f"the measuring process waited for a CPU {conditions['wait_share']:.0%} of its CPU time")
    if (conditions.get("steal_share") or 0.0) > BOUNDS["steal_share"]:
        reasons.append(f"the hypervisor stole {conditions['steal_share']:.0%} of the CPU time")
    load, cpus = conditions.get("load_average"), conditions.get("cpus") or 1
    if load is not None and load / cpus > BOUNDS["load_per_cpu"]:
        reasons.append(f"load average {load:.1f} on {cpus} CPUs")
    return "; ".join(reasons) or None
