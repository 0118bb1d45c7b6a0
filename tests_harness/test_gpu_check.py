"""`fastpath-suite gpu-check` (scripts/gpu_check.sh) is a script a runner can trust: green means every stage ran and
passed. Run here, without a GPU: the script is driven through PYTHON by a stand-in interpreter that fakes what
needs a GPU (the env check, the checkpoints' build, pytest, the bench) and runs the real one for the rest (the
results file); the rule (`stage_verdict`) and the targets are pure functions, checked on built cases."""

from __future__ import annotations

import contextlib
import json
import re
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"
QUICK_TESTS = len(re.findall(r'^\s+"\$PARITY_FILE::', SCRIPT.read_text(), re.M))  # the script's quick selection
H200 = REPO_ROOT / "baselines" / "cuda-nvidia-h200__torch-2.11.0-cu130__omnivoice-0.2.1.json"

# The stand-in interpreter. PLAN (JSON, env FAKE_PLAN) says per stage what its fake does: "pass", "fail" (the first
# test fails), "skip" (every test skips), "hang" (until SIGINT: pytest then writes a report of the first two tests,
# as pytest does of the tests it finished; a bench writes its first point, then waits to be killed).
FAKE = '''#!{python}
import json, os, re, sys, time
from pathlib import Path

REAL, ARGS = {python!r}, sys.argv[1:]
PLAN = json.loads(os.environ.get("FAKE_PLAN", "{{}}"))


def value(flag):
    for i, a in enumerate(ARGS):
        if a == flag:
            return ARGS[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]


def values(flag):
    i = ARGS.index(flag) + 1
    out = []
    while i < len(ARGS) and not ARGS[i].startswith("--"):
        out.append(ARGS[i])
        i += 1
    return out


def ids():
    explicit = [a for i, a in enumerate(ARGS) if "::" in a and ARGS[i - 1] != "--deselect"]
    return explicit or [f"{{a}}/test_fake.py::test_{{k}}[p{{k}}]" for a in ARGS if re.fullmatch(r"tests_\\w+", a)
                        for k in range(3)]


def junit(path, cases):
    rows = []
    for nodeid, outcome in cases:
        file, _, name = nodeid.partition("::")
        inner = {{"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped message='y'/>"}}[outcome]
        rows.append(f'<testcase classname="{{file[:-3].replace("/", ".")}}" name="{{name}}" time="0.1">{{inner}}</testcase>')
    Path(path).write_text('<testsuites><testsuite name="pytest" time="1.0">' + "".join(rows) + "</testsuite></testsuites>")


def pytest_run():
    if "--collect-only" in ARGS:
        found = [] if PLAN.get("collect") == "empty" else ids()
        print("\\n".join(found) + f"\\n\\n{{len(found)}} tests collected")
        return 0 if found else 5
    report = value("--junitxml")
    plan = PLAN.get(Path(report).stem, "pass")
    if plan == "hang":
        try:
            time.sleep(600)
        except KeyboardInterrupt:
            junit(report, [(i, "passed") for i in ids()[:2]])
            print("KeyboardInterrupt: 2 passed")
            return 2
    outcome = {{"fail": "failed", "skip": "skipped"}}.get(plan, "passed")
    junit(report, [(i, outcome if k == 0 else "passed") for k, i in enumerate(ids())])
    return 1 if plan == "fail" else 0


def bench():
    out, points, variants = Path(value("--out")), values("--points"), values("--variants")
    rounds = int(value("--rounds"))
    plan = PLAN.get(out.stem, "pass")
    done = points[:1] if plan == "hang" else points
    rtf = {{"stock@bf16": 0.2, "gpu@bf16": 0.05, "preset@bf16": 0.02}}
    results = {{p: {{v: {{"rtf": [rtf.get(v, 0.1)] * rounds, "seconds": [1.0] * rounds, "audio_seconds": 5.0,
                      "first_call_seconds": 2.0, "load": [0.5] * rounds}} for v in variants}} for p in done}}
    out.write_text(json.dumps({{"command": "bench", "checkpoint": "full", "points_planned": points,
                               "complete": plan != "hang", "results": results}}))
    if plan == "hang":
        Path(str(out) + ".started").touch()
        time.sleep(600)
    return 1 if plan == "fail" else 0


if ARGS[:2] == ["-m", "harness.gpu_check"] and "--environment" in ARGS:
    print("gpu Fake GPU | capability (9, 0)")
    Path(value("--out"), "machine.json").write_text(Path(os.environ["FAKE_MACHINE"]).read_text())
    sys.exit(0)
if ARGS[:1] == ["-c"] and "build_checkpoint" in ARGS[1]:
    print("checkpoints built (fake)")
    sys.exit(0)
if ARGS[:2] == ["-m", "pytest"]:
    sys.exit(pytest_run())
if ARGS[:2] == ["-m", "harness.speed.bench"]:
    sys.exit(bench())
os.execv(REAL, [REAL, *ARGS])
'''


@pytest.fixture
def fake(tmp_path):
    """(run, OUT): run(plan, *args, **env) runs the script through the stand-in; OUT is where it writes."""
    from harness.run.machine import machine_info

    python = tmp_path / "python"
    python.write_text(FAKE.format(python=sys.executable))
    python.chmod(0o755)
    machine = dict(machine_info("cpu"), device="cuda", gpu_name="Fake GPU H0")
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    out = tmp_path / "out"

    def env(plan: dict, **extra) -> dict:
        return {**os.environ, "PYTHON": str(python), "OUT": str(out), "FASTPATH_NO_WHEELS": "1",
                "FAKE_PLAN": json.dumps(plan), "FAKE_MACHINE": str(tmp_path / "machine.json"), **extra}

    def run(plan: dict, *args: str, **extra) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env(plan, **extra), capture_output=True,
                              text=True, timeout=300)  # a hang guard, not a bound

    run.env = env
    return run, out


def results_file(out: Path) -> dict:
    from harness.run import results

    paths = sorted((out / "results" / "gpu-check").glob("*.json"))
    assert len(paths) == 1, f"one gpu-check results file expected in {out / 'results'}, found {paths}"
    return results.load(paths[0])


def test_a_failing_stage_makes_the_script_exit_non_zero(fake):
    run, out = fake
    proc = run({"quick-parity": "fail"}, "--quick", STAGES="quick-parity")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    figures = results_file(out)["figures"]
    assert figures["mode"] == "quick"
    assert figures["verdicts"]["quick-parity"]["verdict"] == "fail", figures["verdicts"]
    assert "quick-parity: fail: 1 failed: tests_parity.test_gpu_parity::test_gpu_patch_is_close" in proc.stdout


def test_a_call_whose_every_stage_passes_exits_0(fake):
    run, out = fake
    proc = run({}, "--quick")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "all 6 stages passed" in proc.stdout, proc.stdout[-2000:]  # env, checkpoints and the four of --quick
    figures = results_file(out)["figures"]
    assert figures["tests"]["quick-parity"]["passed"] == QUICK_TESTS and figures["collect"]["collected"] == 9
    from harness.speed.targets import target_figures

    # the stand-in's RTFs: stock 0.2, the stack 0.05 (4x), the preset 0.02 (10x); a batch as slow as one call each
    assert [(r["verdict"], round(r["figure"], 2)) for r in target_figures(figures)] == [
        ("met", 4.0), ("met", 10.0), ("not met", 1.0)]
    from harness.gpu_check import render_results

    text = render_results(figures)
    assert text.startswith("A first look") and "| targets | pass | 0 |" in text
    assert "| GPU stack vs stock eager bf16, equal steps | 3.5x | 0.2000 | 0.0500 | 4.00x | met | targets.json |" in text


def test_collected_tests_that_skip_are_not_a_pass(fake):
    run, out = fake
    proc = run({"inductor": "skip"}, "--quick", STAGES="inductor")
    assert proc.returncode == 1, proc.stdout[-3000:]
    verdict = results_file(out)["figures"]["verdicts"]["inductor"]
    assert verdict["verdict"] == "not judged" and "1 skipped: tests_patches/test_inductor.py::" in verdict["reason"]


def test_a_stage_past_its_limit_fails_and_names_the_tests_it_did_not_reach(fake):
    run, out = fake
    proc = run({"parity": "hang"}, STAGES="3", PARITY_LIMIT="2")
    assert proc.returncode == 1, proc.stdout[-3000:]
    tests = results_file(out)["figures"]["tests"]
    assert tests["patches"]["passed"] == 3 and tests["speed"]["passed"] == 3  # the stages around it still ran
    assert tests["parity"]["passed"] == 2 and tests["parity"]["collected"] == 3
    assert tests["parity"]["not_reached"] == ["tests_parity/test_fake.py::test_2[p2]"]
    assert "parity: not reached: 1\n  tests_parity/test_fake.py::test_2[p2]" in proc.stdout  # in the log
    page = results_file(out)
    from harness.gpu_check import render_results

    text = render_results(page["figures"])
    assert "not reached: 1 (first ids tests_parity/test_fake.py::test_2[p2])" in text
    [row] = [line for line in text.splitlines() if line.startswith("| parity | error | 124 | ")]
    assert "| 2 | stopped at its 2 s limit after " in row and "; not reached: 1 (" in row, row


@pytest.mark.parametrize("args, stages, tier, tests, bench", [
    pytest.param(["--quick"], "quick-parity targets", "quick-parity", QUICK_TESTS, "targets", id="quick"),
    pytest.param([], "3 4", "parity", 3, "bench", id="full"),
])
def test_the_results_file_is_there_after_each_stage_when_a_later_one_is_cut_off(fake, args, stages, tier, tests,
                                                                                 bench):
    """A machine that ends a command at its time limit kills it: what the stages before left must be recorded."""
    run, out = fake
    proc = subprocess.Popen(["bash", str(SCRIPT), *args], cwd=out.parent, start_new_session=True,
                            env=run.env({bench: "hang"}, STAGES=stages),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = out / f"{bench}.json.started"
        for _ in range(600):  # a hang guard of 60 s, not a bound
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the whole call, as the tool ends it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert started.exists(), f"the {bench} bench never started"
    figures = results_file(out)["figures"]
    assert figures["verdicts"][tier]["verdict"] == "pass" and figures["tests"][tier]["passed"] == tests
    assert bench not in figures["steps"]


def test_collecting_no_cuda_test_fails_the_quick_look(fake):
    run, out = fake
    proc = run({"collect": "empty"}, "--quick", STAGES="collect")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert results_file(out)["figures"]["verdicts"]["collect"]["verdict"] != "pass"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is usable here: the script would run the GPU tier")
def test_where_cuda_is_not_usable_the_real_script_stops_at_its_first_stage_naming_what_is_missing(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "FASTPATH_NO_WHEELS": "1", "OUT": str(tmp_path / "out"),
           "CHECKPOINT_LIMIT": "5", "STAGES": "none"}  # whatever is asked of it, nothing past the first stage
    proc = subprocess.run(["bash", str(SCRIPT), "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # a hang guard, not a bound
    assert proc.returncode == 4, proc.stdout[-3000:]
    from harness.model.devices import cuda_problem

    assert f"CUDA is not usable here: {cuda_problem()}" in proc.stdout
    assert "checkpoints" not in proc.stdout  # stopped before building anything
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert steps == ["env"], steps


def test_usage_errors_exit_2():
    proc = subprocess.run(["bash", str(SCRIPT), "--no-such-option"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: fastpath-suite gpu-check" in proc.stderr


# --- the rule, on built cases: one per verdict word ---------------------------------------------------------------


def case(exit_code=0, tests=None, **step) -> dict:
    step = {"exit": exit_code, "limit_s": 100, "seconds": 40, **step}
    figures = {"steps": {"s": step}, "tests": {}, "bench": {}}
    if tests is not None:
        figures["tests"]["s"] = {"passed": 3, "failed": 0, "errors": 0, "skipped": 0, "failed_tests": [], "report": True,
                                 "collected": 3, "not_reached": [], "skipped_tests": [], **tests}
    return figures


@pytest.mark.parametrize("figures, verdict, why", [
    pytest.param(case(tests={}), "pass", "3 passed", id="pass"),
    pytest.param(case(1, tests={"failed": 1, "passed": 2, "failed_tests": ["a::t"]}), "fail", "1 failed: a::t",
                 id="fail"),
    pytest.param(case(124, tests={"passed": 1, "not_reached": ["a.py::t2", "a.py::t3"]}, seconds=100), "error",
                 "stopped at its 100 s limit after 100 s; not reached: 2 (a.py::t2, a.py::t3)", id="limit"),
    pytest.param(case(3, tests={"report": False, "passed": None, "not_reached": ["a.py::t"]}), "error",
                 "pytest exit 3", id="internal-error"),
    pytest.param(case(tests={"skipped": 1, "passed": 2, "skipped_tests": ["a::t"]}), "not judged", "1 skipped: a::t",
                 id="skipped"),
    pytest.param(case(5, tests={"collected": 0, "passed": 0}), "not judged", "collected no test", id="none"),
    pytest.param(case(0, note="not started: the call's DEADLINE (570 s) left 4 s"), "error", "not started",
                 id="no-time-left"),
    pytest.param(case(137), "error", "stopped at its 100 s limit", id="killed"),
    pytest.param(case(1), "fail", "exit 1", id="command-failed"),
])
def test_stage_verdict(figures, verdict, why):
    from harness.gpu_check import stage_verdict

    got, reason = stage_verdict("s", figures)
    assert got == verdict and why in reason, (got, reason)


def test_junit_ids_match_what_pytest_collects(tmp_path):
    """A collected node id and its junit case name the same test (a class, parameters with dots and slashes)."""
    from harness.gpu_check import collected_ids, junit_cases, junit_id

    folder = tmp_path / "pkg"
    folder.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('v', ['a.b', 'c/d'])\ndef test_p(v):\n    pass\n\n"
        "class TestC:\n    def test_m(self):\n        pass\n")
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "pkg"]
    listing = subprocess.run([*base, "--collect-only"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    (tmp_path / "x.ids").write_text(listing.stdout)
    subprocess.run([*base, "--junitxml=x.xml"], cwd=tmp_path, capture_output=True, timeout=120)
    ids = collected_ids(tmp_path / "x.ids")
    assert len(ids) == 3, listing.stdout
    assert sorted(map(junit_id, ids)) == sorted(junit_cases(tmp_path / "x.xml"))


# --- targets: from bench runs and stored baselines ----------------------------------------------------------------


def bench_out(rtf: dict, rounds: int = 3, wobble: float = 0.0) -> dict:
    """A bench --out JSON: {(point, variant): RTF}, each round the RTF times (1 +- wobble)."""
    results: dict = {}
    for (point, variant), value in rtf.items():
        samples = [value * (1 + wobble * (-1) ** r) for r in range(rounds)]
        results.setdefault(point, {})[variant] = {"rtf": samples}
    return {"command": "bench", "results": results}


def test_targets_from_a_bench_run_are_met_or_not_or_not_measured():
    from harness.speed.targets import render_targets, target_figures

    run = bench_out({("clone6-medium-32", "stock@bf16"): 0.2, ("clone6-medium-32", "gpu@bf16"): 0.05,
                     ("clone6-medium-32", "preset@bf16"): 0.04})
    rows = {r["target"].split(" ")[0]: r for r in target_figures(run)}
    assert rows["GPU"]["figure"] == pytest.approx(4.0) and rows["GPU"]["verdict"] == "met"
    assert rows["full"]["figure"] == pytest.approx(5.0) and rows["full"]["verdict"] == "not met"
    assert rows["a"]["verdict"] == "not measured" and "clone3-mixed8-16-each/gpu@bf16" in rows["a"]["reason"]
    batch = bench_out({("clone3-mixed8-16", "gpu@bf16"): 0.02, ("clone3-mixed8-16-each", "gpu@bf16"): 0.07})
    [*_, row] = target_figures(run, batch)
    assert row["figure"] == pytest.approx(3.5) and row["verdict"] == "met"
    table = render_targets(run, batch)
    assert "| GPU stack vs stock eager bf16, equal steps | 3.5x | 0.2000 | 0.0500 | 4.00x | met | bench |" in table


def test_a_target_whose_rounds_disagree_or_are_too_few_has_no_figure():
    from harness.speed.targets import target_figures

    noisy = bench_out({("clone6-medium-32", "stock@bf16"): 0.2, ("clone6-medium-32", "gpu@bf16"): 0.05}, rounds=4)
    noisy["results"]["clone6-medium-32"]["stock@bf16"]["rtf"] = [0.2, 0.35, 0.2, 0.35]  # ratios 4 to 7: 55% apart
    [row, *_] = target_figures(noisy)
    assert row["verdict"] == "not judged" and row["figure"] is None and "unstable" in row["reason"], row
    few = bench_out({("clone6-medium-32", "stock@bf16"): 0.2, ("clone6-medium-32", "gpu@bf16"): 0.05}, rounds=2)
    [row, *_] = target_figures(few)
    assert row["verdict"] == "not judged" and "unjudged: 2 round(s)" in row["reason"], row


def test_the_h200_baseline_gives_its_targets_medians():
    """The stored H200 baseline (6 interleaved rounds): stock's rounds spread 0.16-0.27 RTF, so the ratios are judged
    unstable and no figure is printed; the medians are there; it has no batch points."""
    from harness.speed.targets import render_targets, target_figures

    data = json.loads(H200.read_text())
    stock = statistics.median(data["points"]["clone6-medium-32/stock@bf16"]["samples"])
    gpu, preset, batch = target_figures(H200)
    assert gpu["base"] == pytest.approx(stock) and gpu["other"] == pytest.approx(
        statistics.median(data["points"]["clone6-medium-32/gpu@bf16"]["samples"]))
    assert gpu["verdict"] == preset["verdict"] == "not judged" and "unstable" in gpu["reason"]
    assert batch["verdict"] == "not measured"
    assert f"| {data['device_key']} |" in render_targets(data)  # the table names the run it read


# --- the bench keeps the points it finished ------------------------------------------------------------------------


def test_a_bench_stopped_after_its_first_point_keeps_that_point(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from harness.gpu_check import bench_figures
    from harness.speed import bench
    from harness.speed.measure import Samples

    out = tmp_path / "bench.json"
    calls = []

    def interleaved(variants, kwargs, rounds, on_call=None):
        calls.append(1)
        if len(calls) == 2:  # the limit: the first point is on disk already
            assert json.loads(out.read_text())["complete"] is False
            raise KeyboardInterrupt
        return {"stock": Samples("stock", (), rtf=[0.5], seconds=[1.0], audio_seconds=2.0, first_call_seconds=1.0)}

    monkeypatch.setattr(bench, "build_variants", lambda ckpt, specs, device: {
        "stock": SimpleNamespace(model=None, patches=(), overrides={})})
    monkeypatch.setattr(bench, "point_kwargs", lambda *args: {})
    monkeypatch.setattr(bench, "interleaved_variants", interleaved)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--points", "auto-short-2", "auto-short-10", "--variants", "stock", "--rounds", "1", "--quiet",
                    "--out", str(out)])
    kept = bench_figures(out)
    assert kept["complete"] is False and kept["points_planned"] == ["auto-short-2", "auto-short-10"]
    assert list(kept["points"]) == ["auto-short-2"] and kept["points"]["auto-short-2"]["stock"]["rtf"] == [0.5]
