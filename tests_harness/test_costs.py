"""What each job costs: `fastpath-suite audit costs JOB` records the wall time of a job that keeps none of its own,
and docs/ci.md's table (`audit costs` alone prints it) renders every timed job from its results files and names the
command for each job no file has timed."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from harness.audit import costs
from harness.run import results

ROOT = results.ROOT


@pytest.fixture
def stand_in(monkeypatch):
    """The job `ci` as a stand-in that takes a moment and exits 3."""
    monkeypatch.setitem(costs.JOBS, "ci", ("a stand-in for CI", "sleep 0.3; exit 3"))


def test_job_time_records_the_jobs_wall_time_and_exit(stand_in, tmp_path, capsys):
    out = tmp_path / "results"
    assert costs.main(["ci", "--cwd", str(tmp_path), "--results", str(out)]) == 3  # the job's own exit
    [path] = list((out / "job-ci").glob("*.json"))
    data = results.load(path)
    figures = data["figures"]
    assert figures["job"] == "ci" and figures["runs"] == "sleep 0.3; exit 3" and figures["exit"] == 3
    assert 0.3 <= figures["seconds"] < 30, figures
    assert data["commit"] == "unknown"  # tmp_path is no checkout: not this checkout's commit
    assert "ci: `sleep 0.3; exit 3` took" in capsys.readouterr().err


def test_job_time_refuses_a_folder_that_is_not_there(tmp_path, capsys):
    assert costs.main(["ci", "--cwd", str(tmp_path / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_the_cost_table_says_what_no_file_has_measured_and_the_command_that_would(tmp_path):
    page = costs.render_page(tmp_path)
    for command in ("fastpath-suite audit false-alarms 1 --results results/",
                    "fastpath-suite audit costs ci --cwd CLEAN_CLONE --results results/",
                    "fastpath-suite gate omnivoice==0.2.1 --results results/",
                    "fastpath-suite audit costs nightly-speed --results results/",
                    "fastpath-suite audit costs nightly-slow --results results/"):
        assert f"not measured: `{command}` records it" in page, page
    assert not re.search(r"\d+\.\d min", page), page


def test_the_cost_table_shows_each_timed_job_on_its_machine(stand_in, tmp_path):
    out = tmp_path / "results"
    assert costs.main(["ci", "--cwd", str(tmp_path), "--results", str(out)]) == 3
    for kind in ("false-alarms", "gate", "instructions"):  # files the project measured
        shutil.copytree(ROOT / "results" / kind, out / kind)
    page = costs.render_page(out)
    ci = next(line for line in page.splitlines() if line.startswith("| CI on every change"))
    assert "`sleep 0.3; exit 3`" in ci and ", exit 3 |" in ci and "min" in ci, ci
    gate = json.loads((ROOT / "results" / "gate" / "cpu-amd-epyc-avx512-bf16-vnni-2c-2t.json").read_text())
    for verdict in gate["figures"]["verdicts"]:
        assert f"`fastpath-suite gate {verdict['candidate']['spec']}` ({verdict['state']})" in page
        assert f"| {verdict['seconds'] / 60:.1f} min |" in page
    assert "not measured: `fastpath-suite audit costs ci" not in page
    assert "not measured: `fastpath-suite audit costs nightly-slow --results results/` records it" in page


def test_the_nightly_jobs_run_what_the_nightly_workflow_runs():
    """The commands `audit costs` times are the workflow's own (the CPU runner's marker), and CI's is .ci/run."""
    workflow = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    cpu = workflow.replace('"${{ matrix.marker }}"', '"slow and not cuda"')
    for job in ("nightly-speed", "nightly-slow"):
        for part in costs.JOBS[job][1].split(" && "):
            assert part == "mkdir -p out" or part in cpu, f"{job}: `{part}` is not what nightly.yml runs"
    assert costs.JOBS["ci"][1] == "bash .ci/run" and (ROOT / ".ci" / "run").is_file()


def test_without_a_job_it_prints_the_table_of_the_results_folder(tmp_path, capsys):
    assert costs.main(["--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == costs.render_page(tmp_path)
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "x.json").write_text("{not json")
    assert costs.main(["--dir", str(tmp_path)]) == 2 and "x.json" in capsys.readouterr().err
