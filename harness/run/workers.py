"""Worker processes for work that splits into independent jobs (an evaluation set's items, a sweep's points), on
this machine or on a Ray cluster, and what became of each: a job that dies is named with its exit and its log,
never dropped.

Engines (docs/sharding.md):
  * local: one process per job, all started at once (as many jobs as workers); with `gpus`, job k sees only GPU
    gpus[k % len(gpus)] (CUDA_VISIBLE_DEVICES), as `pytest --gpus` gives one GPU to each xdist worker.
  * ray: each job a Ray task running the same command on whichever node of the cluster has a free CPU (and GPU:
    `gpus` asks one per task, and Ray sets the task's CUDA_VISIBLE_DEVICES). `ray.init()` joins the cluster that
    RAY_ADDRESS names (`ray start --head` on one machine, `ray start --address HEAD:6379` on the others), else
    starts one on this machine. The command's paths (repository, set, output folders) must be the same on every
    node: a shared filesystem, as on any cluster that runs evaluation sets.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

from harness import REPO_ROOT

ENGINES = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class Job:
    name: str  # e.g. "shard 1 of 4"
    argv: tuple  # the whole command, its python first
    log: Path  # its stdout and stderr
    env: dict = dataclasses.field(default_factory=dict)  # added to the worker's environment


@dataclasses.dataclass(frozen=True)
class Done:
    job: Job
    exit: int | None  # None: it never finished (the engine lost it: a node died, a timeout)
    error: str = ""  # the engine's reason when exit is None

    @property
    def ok(self) -> bool:
        return self.exit == 0

    def why(self) -> str:
        if self.exit is None:
            return f"{self.job.name} did not finish ({self.error}); log {self.job.log}"
        return f"{self.job.name} exited {self.exit}; log {self.job.log}"


def _gpu_env(job: Job, k: int, gpus) -> dict:
    return dict(job.env, **({"CUDA_VISIBLE_DEVICES": str(gpus[k % len(gpus)])} if gpus else {}))


def run_local(jobs, gpus=None, timeout: float | None = None, log=print) -> list[Done]:
    """Every job in its own process at once; waits for all, saying how many are done and about how long is left."""
    start, procs, files = time.monotonic(), [], []
    for k, job in enumerate(jobs):
        job.log.parent.mkdir(parents=True, exist_ok=True)
        f = open(job.log, "w")
        f.write(f"$ {' '.join(map(str, job.argv))}\n")
        f.flush()
        files.append(f)
        procs.append(subprocess.Popen(list(map(str, job.argv)), cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT,
                                      env=dict(os.environ, **_gpu_env(job, k, gpus))))
    finished: dict[int, Done] = {}
    last = 0.0
    try:
        while len(finished) < len(jobs):
            for k, (job, proc) in enumerate(zip(jobs, procs)):
                if k not in finished and proc.poll() is not None:
                    finished[k] = Done(job, proc.returncode)
                    took = time.monotonic() - start
                    left = took / len(finished) * (len(jobs) - len(finished))
                    log(f"[workers] {job.name}: exit {proc.returncode} after {took:.0f} s; {len(finished)} of "
                        f"{len(jobs)} done" + (f", about {left:.0f} s left" if len(finished) < len(jobs) else ""))
            took = time.monotonic() - start
            if timeout is not None and took > timeout:
                for k, proc in enumerate(procs):
                    if k not in finished:
                        proc.kill()
                        proc.wait()
                        finished[k] = Done(jobs[k], None, f"stopped after the {timeout:.0f} s limit")
                break
            if took - last >= 60:
                last = took
                log(f"[workers] {len(finished)} of {len(jobs)} done after {took:.0f} s")
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for f in files:
            f.close()
    return [finished[k] for k in range(len(jobs))]


def run_ray(jobs, gpus=None, timeout: float | None = None, log=print) -> list[Done]:
    """Every job as a Ray task (module docstring); the task's output is written to the job's log here."""
    try:
        import ray
    except ImportError as err:
        raise RuntimeError("the ray engine needs Ray: .venv/bin/pip install 'ray==2.60.0' (docs/sharding.md)") from err

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    log(f"[workers] ray: {len(jobs)} task(s) on a cluster of {ray.cluster_resources().get('CPU', 0):.0f} CPU(s), "
        f"{ray.cluster_resources().get('GPU', 0):.0f} GPU(s)")

    @ray.remote(num_cpus=1, num_gpus=1 if gpus else 0, max_retries=0)
    def task(argv, env, cwd):
        import os as _os
        import subprocess as _sp

        done = _sp.run(list(argv), cwd=cwd, env=dict(_os.environ, **env), capture_output=True, text=True)
        return done.returncode, done.stdout[-200_000:], done.stderr[-200_000:]

    refs = [task.remote(tuple(map(str, j.argv)), dict(j.env), str(REPO_ROOT)) for j in jobs]
    out = []
    try:
        for job, ref in zip(jobs, refs):
            job.log.parent.mkdir(parents=True, exist_ok=True)
            try:
                code, stdout, stderr = ray.get(ref, timeout=timeout)
            except Exception as err:  # a node lost, a task killed, the limit: the engine's reason, named
                job.log.write_text(f"$ {' '.join(map(str, job.argv))}\n# ray: {type(err).__name__}: {err}\n")
                out.append(Done(job, None, f"ray: {type(err).__name__}"))
                continue
            job.log.write_text(f"$ {' '.join(map(str, job.argv))}\n{stdout}{stderr}")
            out.append(Done(job, code))
            log(f"[workers] {job.name}: exit {code}; {len(out)} of {len(jobs)} done")
    finally:
        if started_here:
            ray.shutdown()
    return out


def run_jobs(jobs, engine: str = "local", gpus=None, timeout: float | None = None, log=print) -> list[Done]:
    """Run every job on `engine` (ENGINES); one Done per job, in the jobs' order."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: one of {ENGINES}")
    return (run_local if engine == "local" else run_ray)(list(jobs), gpus=gpus, timeout=timeout, log=log)
