"""The Ray engine (harness.run.workers.run_ray) on a local Ray cluster started as docs/sharding.md starts one (`ray start
--head`, joined through RAY_ADDRESS): jobs run as tasks, their output and failures come back named, and an
evaluation set judged over Ray tasks gets the serial verdict. A control of the distributed path, run by `.ci/run`
(which installs Ray first); Ray is not in the default install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from harness.run import workers

pytestmark = [pytest.mark.slow, pytest.mark.control]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray", reason="the Ray engine's control needs Ray: .venv/bin/pip install 'ray==2.60.0' "
                                      "(.ci/run installs it before its controls stage; docs/sharding.md)")
    from harness.serving.serving import free_port

    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    port = free_port()
    temp = tmp_path_factory.mktemp("ray")
    start = subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
                            "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
                           capture_output=True, text=True, timeout=180)
    assert start.returncode == 0, start.stdout + start.stderr
    before = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    try:
        yield os.environ["RAY_ADDRESS"]
    finally:
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)


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


def test_a_set_judged_over_ray_tasks_gets_the_serial_verdict(cluster, tmp_path, request):
    from harness.gate.gate import metric_figures
    from harness.quality import espeak_set, evaluate, sets, shards
    from harness.quality.shards import load_judges

    folder = espeak_set.build(tmp_path / "set", languages=("en",))
    eval_set = sets.read_set(folder / "en" / "meta.lst")
    sides = {}
    for side, damage in (("against", "none"), ("candidate", "swap")):
        sides[side] = tmp_path / side
        sides[side].mkdir()
        for clip in espeak_set.outputs(eval_set, damage):
            sf.write(sides[side] / f"{clip.id}.wav", clip.wav, clip.sr, subtype="FLOAT")
    names = {key: request.config.getoption(option) for key, option in (("wer", "judge"), ("sim", "sim_judge"),
                                                                        ("mos", "mos_judge"))}
    judge, voice_judge, mos_judge = load_judges(("wer", "sim", "mos"), names)
    serial = evaluate.compare_set_folders(judge, eval_set, sides["against"], sides["candidate"], label="candidate",
                                          voice_judge=voice_judge, mos_judge=mos_judge)
    sharded = shards.judge_set(eval_set.path, sides["against"], sides["candidate"], 2, tmp_path / "judged",
                               judges=names, label="candidate", engine="ray", log=lambda m: None)
    assert [metric_figures(v) for v in sharded.overall.verdicts] == [metric_figures(v) for v in serial.overall.verdicts]
    assert not sharded.passed  # two prompts' voices swapped: refused on SIM, by both
