"""The Ray engine (harness.run.workers.run_ray) on a Ray cluster of several nodes on this machine, started by Ray's own
means for it (ray.cluster_utils.Cluster: a head that runs no task, two nodes of one CPU each, joined through
RAY_ADDRESS): jobs run as tasks on the other nodes, with the settings this process has; their logs are written as
they run; one deadline holds for all of them and what is left is cancelled; a node lost mid-run is named with its
items; and an evaluation set judged over Ray tasks, each side with its own empty cache, gets the serial verdict.
A control of the distributed path, run by `.ci/run` (which installs Ray first); Ray is not in the default install.

The cluster is this test's own: its processes, its temp folder (RAY_TMPDIR, so the user's /tmp/ray and its
ray_current_cluster are left alone), stopped by Cluster.shutdown, never by `ray stop` (which ends every Ray process
of the user on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import soundfile as sf

from harness.run import workers

pytestmark = [pytest.mark.slow, pytest.mark.control]

NODE = {"num_cpus": 1, "object_store_memory": 100 * 2**20}  # 24 GiB and 2 cores: a small store, one task a node


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="the Ray engine's control needs Ray: .venv/bin/pip install 'ray==2.60.0' "
                                      "(.ci/run installs it before its controls stage; docs/sharding.md)")
    from ray.cluster_utils import Cluster

    # A short folder of its own: Ray's socket paths must stay under the 107 characters of a unix socket.
    temp = Path(tempfile.mkdtemp(prefix="fp-ray-", dir="/tmp"))
    (temp / "ray").mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(temp))  # where Ray writes ray_current_cluster: ours, not the user's
        head = Cluster(initialize_head=True, head_node_args=dict(NODE, num_cpus=0, temp_dir=str(temp / "ray"),
                                                                 include_dashboard=False))
        try:
            for _ in range(2):
                head.add_node(**NODE, temp_dir=str(temp / "ray"))
            head.wait_for_nodes()
            env.setenv("RAY_ADDRESS", head.address)
            head.temp = str(temp / "ray")
            yield head
        finally:
            head.shutdown()  # this cluster's own processes, node by node
            shutil.rmtree(temp, ignore_errors=True)


def fake_python(tmp_path: Path, body: str) -> Path:
    """A stand-in interpreter for shards.generate's jobs: prints its pid and arguments, then runs `body` (sh)."""
    path = tmp_path / "fake-python"
    path.write_text(f'#!/bin/sh\necho "started pid $$ args $*"\n{body}\n')
    path.chmod(0o755)
    return path


def started_pid(log: Path) -> int | None:
    for line in log.read_text().splitlines():
        if line.startswith("started pid "):
            return int(line.split()[2])
    return None


def node_of(log: Path) -> str | None:
    for line in log.read_text().splitlines():
        if line.startswith("# ray: node "):
            return line.split()[3].rstrip(",")
    return None


def alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its parent's wait counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def ended_within(pids, seconds: float) -> list[int]:
    """The pids still running after `seconds`."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    from harness.quality import espeak_set
    from harness.run.installed import require_tool

    require_tool("espeak-ng", "apt-get install -y espeak-ng (scripts/install.sh does)")
    return espeak_set.build(tmp_path_factory.mktemp("set"), languages=("en",)) / "en" / "meta.lst"


def test_jobs_run_as_ray_tasks_and_a_failure_is_named(cluster, tmp_path):
    code = "import os, sys; print('pid', os.getpid(), 'arg', sys.argv[1]); sys.exit(int(sys.argv[1]))"
    jobs = [workers.Job(f"job {k}", (sys.executable, "-c", code, str(k)), tmp_path / f"job-{k}.log") for k in (0, 3)]
    lines = []
    out = workers.run_jobs(jobs, engine="ray", log=lines.append)
    assert [d.exit for d in out] == [0, 3]
    assert "arg 0" in (tmp_path / "job-0.log").read_text() and "arg 3" in (tmp_path / "job-3.log").read_text()
    assert out[1].why() == f"job 3 exited 3; log {tmp_path / 'job-3.log'}"
    assert any("ray: 2 task(s) on a cluster of 2 CPU(s)" in line for line in lines), lines
    assert str(os.getpid()) not in (tmp_path / "job-0.log").read_text()  # a process of its own, not this one


SETTINGS = {"FASTPATH_CACHE": "cache-of-this-run", "FASTPATH_STRICT": "0", "FASTPATH_JUDGE": "/judges/whisper",
            "FASTPATH_SIM_JUDGE": "/judges/wavlm", "FASTPATH_MOS_JUDGE": "/judges/utmos.pt",
            "CT2_FORCE_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def test_a_task_on_another_node_sees_the_settings_of_this_process(cluster, tmp_path, monkeypatch):
    """Settings made after the cluster started (so its nodes' own environments lack them) reach a task on a node
    that is not this process's: sent in Ray's runtime_env. A job's own env goes on top of them."""
    for name, value in SETTINGS.items():
        monkeypatch.setenv(name, str(tmp_path / value) if name == "FASTPATH_CACHE" else value)
    code = f"import json, os; print('seen', json.dumps({{k: os.environ.get(k) for k in {sorted(SETTINGS)!r}}}))"
    jobs = [workers.Job("reads", (sys.executable, "-c", code), tmp_path / "reads.log"),
            workers.Job("own env", (sys.executable, "-c", code), tmp_path / "own.log", {"FASTPATH_STRICT": "1"})]
    assert all(d.ok for d in workers.run_jobs(jobs, engine="ray", log=lambda m: None))
    seen = [json.loads(next(line for line in j.log.read_text().splitlines() if line.startswith("seen "))[5:])
            for j in jobs]
    assert seen[0] == {k: os.environ[k] for k in SETTINGS}, seen[0]
    assert seen[1] == dict(seen[0], FASTPATH_STRICT="1")
    # No OMP_NUM_THREADS here: the task computes with the threads this process started with (an xdist worker's
    # run's, FASTPATH_DEFAULT_THREADS), not the 1 Ray gives a 1-CPU task.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = workers.Job("threads", (sys.executable, "-c", "import os; print('seen', os.environ.get('OMP_NUM_THREADS'))"),
                          tmp_path / "threads.log")
    assert all(d.ok for d in workers.run_jobs([threads], engine="ray", log=lambda m: None))
    from harness.run.machine import started_threads

    assert f"seen {started_threads()}" in threads.log.read_text().splitlines(), threads.log.read_text()
    nodes = {node_of(j.log) for j in jobs}
    assert None not in nodes and cluster.head_node.node_id not in nodes  # on the task nodes, not this one's


def test_one_deadline_holds_for_all_jobs_and_what_is_left_is_cancelled(cluster, english, tmp_path):
    """Three shards on a cluster of two CPUs, each job sleeping far past the limit: the run ends one limit after
    it started (not one per job), every shard is named with the limit and its items, the two that ran have their
    own output in their logs and their processes ended, and the third, which never got a CPU, is cancelled too. The
    bound is the limit plus the cancelled tasks' grace (workers.CANCEL_GRACE_S, after which Ray kills their workers)
    and 5 s for that kill: under CI's load a graceful cancel can miss its grace (a run took 20.3 s, over a bound of
    twice the limit), and the forced path is part of the contract. One limit per job would be 3 x 15 s."""
    from harness.quality import sets, shards

    limit = 15.0
    python = fake_python(tmp_path, "exec sleep 120")
    start = time.monotonic()
    with pytest.raises(shards.ShardFailure) as err:
        shards.generate(english, tmp_path / "out", 3, "espeak", python=python, engine="ray", logs=tmp_path,
                        timeout=limit, log=lambda m: None)
    took = time.monotonic() - start
    bound = limit + workers.CANCEL_GRACE_S + 5.0
    assert took < bound < 3 * limit, f"{took:.0f} s for a {limit:.0f} s limit (bound {bound:.0f} s)"
    logs = [tmp_path / f"out-generate-{k}-of-3.log" for k in range(3)]
    shares = shards.split(sets.read_set(english).items, 3)
    for k, (log, share) in enumerate(zip(logs, shares)):
        assert (f"generating shard {k} of 3 did not finish (stopped after the {limit:.0f} s limit, its Ray task "
                f"cancelled); log {log}: items {', '.join(i.id for i in share)}") in str(err.value)
    pids = [p for p in map(started_pid, logs) if p is not None]
    assert len(pids) == 2, [log.read_text() for log in logs]  # the log as it ran, kept after the limit
    assert ended_within(pids, 10) == []  # cancelled, not left sleeping on their nodes
    assert all(f"# ray: stopped after the {limit:.0f} s limit" in log.read_text() for log in logs)
    quick = workers.run_jobs([workers.Job("after", (sys.executable, "-c", "print('ran')"), tmp_path / "after.log")],
                             engine="ray", timeout=60, log=lambda m: None)
    assert quick[0].ok  # the cancelled tasks gave their CPUs back


def test_a_node_lost_mid_run_is_named_with_its_items(cluster, english, tmp_path):
    """Two shards on the two task nodes; shard 0 ends at once, and the node running shard 1 is killed while it runs
    (Cluster.remove_node, no grace: its raylet and workers die). Shard 1 is named with Ray's error and its items,
    its log keeps what the job wrote before, and the job's process did not outlive its worker."""
    from harness.quality import sets, shards

    python = fake_python(tmp_path, 'case "$*" in *"--shard 0/2"*) exit 0;; esac\nexec sleep 120')
    log = tmp_path / "out-generate-1-of-2.log"
    killed = {}

    def kill_the_node_of_shard_1():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.is_file() and started_pid(log) and node_of(log)):
            time.sleep(0.2)
        node = next((n for n in cluster.worker_nodes if n.node_id == node_of(log)), None) if log.is_file() else None
        if node is not None:
            killed.update(pid=started_pid(log), node=node.node_id)
            cluster.remove_node(node, allow_graceful=False)

    killer = threading.Thread(target=kill_the_node_of_shard_1)
    killer.start()
    try:
        start = time.monotonic()
        with pytest.raises(shards.ShardFailure) as err:
            shards.generate(english, tmp_path / "out", 2, "espeak", python=python, engine="ray", logs=tmp_path,
                            timeout=180, log=lambda m: None)
        took = time.monotonic() - start
    finally:
        killer.join()
        while len(cluster.worker_nodes) < 2:  # the module's cluster as it was, for the tests after this one
            cluster.add_node(**NODE, temp_dir=cluster.temp)
    assert killed, f"shard 1 never started on a task node: {log.read_text() if log.is_file() else 'no log'}"
    assert took < 120, f"{took:.0f} s: the loss was not seen, the run waited for the limit"
    items = ", ".join(i.id for i in shards.split(sets.read_set(english).items, 2)[1])
    text = str(err.value)
    assert len(err.value.problems) == 1 and "generating shard 1 of 2 did not finish (ray: " in text, text
    assert text.endswith(f"; log {log}: items {items}"), text
    assert f"started pid {killed['pid']}" in log.read_text() and "# ray: " in log.read_text().splitlines()[-1]
    assert ended_within([killed["pid"]], 10) == []  # the job's process died with its worker


def test_a_set_judged_over_ray_tasks_gets_the_serial_verdict(cluster, english, tmp_path, request, monkeypatch):
    """Each side with its own empty cache (FASTPATH_CACHE set here after the cluster started: the tasks get it from
    this process): the Ray tasks compute every transcript, embedding and MOS the serial run did, in their own cache,
    and do not read a wrong transcript planted in the serial side's cache."""
    from harness.gate.gate import metric_figures
    from harness.quality import cache, espeak_set, evaluate, sets, shards
    from harness.quality.shards import load_judges

    eval_set = sets.read_set(english)
    sides = {}
    for side, damage in (("against", "none"), ("candidate", "swap")):
        sides[side] = tmp_path / side
        sides[side].mkdir()
        for clip in espeak_set.outputs(eval_set, damage):
            sf.write(sides[side] / f"{clip.id}.wav", clip.wav, clip.sr, subtype="FLOAT")
    names = {key: request.config.getoption(option) for key, option in (("wer", "judge"), ("sim", "sim_judge"),
                                                                        ("mos", "mos_judge"))}
    judge, voice_judge, mos_judge = load_judges(("wer", "sim", "mos"), names)
    caches = {side: tmp_path / f"cache-{side}" for side in ("serial", "sharded")}
    monkeypatch.setenv(cache.CACHE_ENV, str(caches["serial"]))
    serial = evaluate.compare_set_folders(judge, eval_set, sides["against"], sides["candidate"], label="candidate",
                                          voice_judge=voice_judge, mos_judge=mos_judge)
    computed = cache.judge_entries(caches["serial"])
    assert all(computed.values()), {kind: len(e) for kind, e in computed.items()}
    planted = sorted(computed["transcripts"])[0]
    path = caches["serial"] / "transcripts" / planted
    path.write_text(json.dumps(json.loads(path.read_text()) | {"text": "planted words that no clip says"}))
    monkeypatch.setenv(cache.CACHE_ENV, str(caches["sharded"]))
    sharded = shards.judge_set(eval_set.path, sides["against"], sides["candidate"], 2, tmp_path / "judged",
                               judges=names, label="candidate", engine="ray", log=lambda m: None)
    assert [metric_figures(v) for v in sharded.overall.verdicts] == [metric_figures(v) for v in serial.overall.verdicts]
    assert not sharded.passed  # two prompts' voices swapped: refused on SIM, by both
    workers_wrote = cache.judge_entries(caches["sharded"])
    for kind in cache.JUDGE_KINDS:  # computed on the task nodes into their own cache, every entry
        assert sorted(workers_wrote[kind]) == sorted(computed[kind]), kind
    assert workers_wrote["transcripts"][planted] == computed["transcripts"][planted]
