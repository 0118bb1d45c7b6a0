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
    node: a shared filesystem, as on any cluster that runs evaluation sets. A task is sent the settings the harness
    reads from this process's environment (`forwarded_env`: FASTPATH_*, the ISA limits, threads, the HF cache) in
    Ray's runtime_env, writes its job's log as it runs, and all tasks share one deadline: at it, what is left is
    cancelled.
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


# What a Ray task is sent of this process's environment (Ray starts a task's worker with its node's environment, not
# the driver's): every FASTPATH_* setting (the cache, strict mode, the judges' paths, the checkpoint), the CPU ISA
# limits (machine.ISA_LIMITS), the thread counts and the Hugging Face cache. PYTHONPATH is not sent: it would sit in
# front of the Ray worker's own imports. A job's own env (the gate's PYTHONPATH among it) goes to its process alone.
FORWARDED_PREFIXES = ("FASTPATH_",)
FORWARDED_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")
CANCEL_GRACE_S = 10.0  # a cancelled task's time to end its job's process before Ray kills its worker


def forwarded_env() -> dict:
    """What a Ray task's worker gets in its environment (runtime_env env_vars): this process's settings that the
    harness reads (FORWARDED_*), and where OMP_NUM_THREADS is not set, the thread count this process started with
    (FASTPATH_DEFAULT_THREADS, which a pytest run sets before its workers divide the threads, else torch's). Ray sets
    OMP_NUM_THREADS to a task's num_cpus (1) when it is unset, and on an AVX2 machine a judge's float sums follow the
    thread count a process starts with: GE2E similarities then differ from the serial run's in the 8th digit, so
    the sharded verdict is not the serial one."""
    from harness.run.machine import ISA_LIMITS, started_threads

    names = set(FORWARDED_NAMES) | set(ISA_LIMITS)
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith(FORWARDED_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", str(started_threads()))
    return env


def _note(job: Job, line: str) -> None:
    with open(job.log, "a") as f:
        f.write(f"# {line}\n")


def run_ray(jobs, gpus=None, timeout: float | None = None, log=print) -> list[Done]:
    """Every job as a Ray task (module docstring). The task writes the job's output into the job's log as it runs (a
    shared filesystem), after a line naming its node. One deadline (`timeout`) holds for all jobs together: at it,
    every task not finished is cancelled (its job's process ended) and named with the limit; a task that Ray lost (a
    node died, a worker killed) is named with Ray's error."""
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
    def task(argv, env, cwd, log_path):
        # Defined here, imports inside: Ray pickles it by value, so a node needs no import of this module.
        import os as _os
        import subprocess as _sp
        import sys as _sys
        import time as _time

        import ray as _ray

        def die_with_the_worker():  # Linux: the job's process is killed when this worker is (a forced cancel)
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        with open(log_path, "a") as f:
            f.write(f"# ray: node {_ray.get_runtime_context().get_node_id()}, worker pid {_os.getpid()}\n")
            f.flush()
            proc = _sp.Popen(list(argv), cwd=cwd, env=dict(_os.environ, **env), stdout=f, stderr=_sp.STDOUT,
                             preexec_fn=die_with_the_worker if _sys.platform.startswith("linux") else None)
            try:
                while proc.poll() is None:  # a short sleep, not wait(): ray.cancel's KeyboardInterrupt lands here
                    _time.sleep(0.2)
                return proc.returncode
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    start, settings = time.monotonic(), {"env_vars": forwarded_env()}
    refs = []
    for job in jobs:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.log.write_text(f"$ {' '.join(map(str, job.argv))}\n")
        refs.append(task.options(runtime_env=settings).remote(tuple(map(str, job.argv)),
                                                              {k: str(v) for k, v in job.env.items()},
                                                              str(REPO_ROOT), str(job.log.resolve())))
    which = {ref: k for k, ref in enumerate(refs)}
    finished: dict[int, Done] = {}
    pending = list(refs)
    try:
        while pending:
            took = time.monotonic() - start
            wait = 60.0 if timeout is None else min(60.0, max(0.0, timeout - took))
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait)
            for ref in ready:
                k = which[ref]
                try:
                    finished[k] = Done(jobs[k], ray.get(ref))
                except Exception as err:  # a node lost, a worker killed: the engine's reason, named
                    reason = f"ray: {type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err) else ''}"
                    _note(jobs[k], reason)
                    finished[k] = Done(jobs[k], None, reason)
                took = time.monotonic() - start
                log(f"[workers] {jobs[k].name}: " + (f"exit {finished[k].exit}" if finished[k].exit is not None
                                                      else finished[k].error)
                    + f" after {took:.0f} s; {len(finished)} of {len(jobs)} done")
            if not ready and timeout is not None and time.monotonic() - start >= timeout:
                break
            if not ready:
                log(f"[workers] {len(finished)} of {len(jobs)} done after {took:.0f} s")
        if pending:  # the deadline: cancel what is left, all at once
            for ref in pending:
                ray.cancel(ref)  # KeyboardInterrupt in the task: its `finally` ends the job's process
            _, stuck = ray.wait(pending, num_returns=len(pending), timeout=CANCEL_GRACE_S)
            for ref in stuck:
                ray.cancel(ref, force=True)  # its worker killed; the job's process dies with it (PDEATHSIG)
            for ref in pending:
                k = which[ref]
                reason = f"stopped after the {timeout:.0f} s limit, its Ray task cancelled"
                _note(jobs[k], f"ray: {reason}")
                finished[k] = Done(jobs[k], None, reason)
            log(f"[workers] the {timeout:.0f} s limit: {len(pending)} task(s) cancelled: "
                + ", ".join(jobs[which[r]].name for r in pending))
    finally:
        if started_here:
            ray.shutdown()
    return [finished[k] for k in range(len(jobs))]


def run_jobs(jobs, engine: str = "local", gpus=None, timeout: float | None = None, log=print) -> list[Done]:
    """Run every job on `engine` (ENGINES); one Done per job, in the jobs' order."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: one of {ENGINES}")
    return (run_local if engine == "local" else run_ray)(list(jobs), gpus=gpus, timeout=timeout, log=log)
