"""Results files of the gate, the false-alarm runs and the GPU script: each written from files in the shape its
command leaves, read back by harness.run.results and rendered into the results page. No model, no subprocess."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest

from harness import gpu_check

from harness.audit import false_alarms

from harness.gate import gate

from harness.run import results
from harness.run.machine import machine_info

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
skipped="1" tests="5" time="{time}">
<testcase classname="tests_parity.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests_parity.test_a" name="test_ok2[x|y]" time="0.1"/>
<testcase classname="tests_parity.test_a" name="test_bad" time="0.1"><failure message="not bit-exact">x</failure>
</testcase>
<testcase classname="tests_parity.test_b" name="test_broken" time="0.1"><error message="boom">y</error></testcase>
<testcase classname="tests_parity.test_b" name="test_skip" time="0.0"><skipped message="slow"/></testcase>
</testsuite></testsuites>"""


# --- the gate ---------------------------------------------------------------------------------------------------


def gate_figures(state="must-not-ship"):
    checks = [gate.Check("install", "pass", False, "omnivoice 0.3.0 imports from /venv"),
              gate.Check("fingerprints", "changed", True, "refused: OmniVoice._generate_iterative | changed"),
              gate.Check("goldens", "error", False, "could not run: RuntimeError: boom")]
    report = gate.verdict(checks)
    report.update(candidate={"spec": "omnivoice==0.3.0", "version": "0.3.0", "python": "/venv/bin/python"},
                  against={"spec": "current", "version": "0.2.1", "python": "/usr/bin/python"},
                  accepted={"auto_voice": "reviewed: new rounding"}, seconds=412.3)
    assert report["state"] == state
    return gate.results_figures(report)


def test_gate_figures_are_raw_and_render_the_verdict_and_one_row_per_check():
    figures = gate_figures()
    json.dumps(figures)  # serialisable as it is
    assert figures["checks"][1] == {"name": "fingerprints", "status": "changed", "blocking": True,
                                    "summary": "refused: OmniVoice._generate_iterative | changed"}
    text = gate.render_results(figures)
    assert "MUST NOT SHIP (blocked by: fingerprints)" in text and "`0.3.0`" in text and "`0.2.1`" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert [r.split(" | ")[0] for r in rows] == ["| install", "| fingerprints", "| goldens"]
    assert "_generate_iterative \\| changed" in text, "a | in a summary is escaped, not a new column"
    assert "`auto_voice`: reviewed: new rounding" in text and "412 s" in text
    assert gate.render_results(figures) == text


def test_gate_help_is_the_verbs_with_results_and_quiet(capsys):
    with pytest.raises(SystemExit):
        gate.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: fastpath-suite gate") and "--results DIR" in out and "--quiet" in out


def test_gate_writes_its_results_file_and_keeps_progress_off_stdout(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_run_gate(candidate, against, out, checks, rtf_rounds, checkpoint, fresh, command, log=print,
                      progress=None, **kwargs):
        log("check 1/1: fingerprints started, 0:00 elapsed")
        report = gate.verdict([gate.Check("fingerprints", "pass", False, "ok")])
        report.update(candidate={"spec": candidate, "version": "9.9.9"}, against={"spec": against, "version": "1"},
                      accepted={}, seconds=1.0, command=command)
        seen.append(command)
        return report

    monkeypatch.setattr(gate, "run_gate", fake_run_gate)
    argv = ["omnivoice==9.9.9", "--out", str(tmp_path / "o"), "--results", str(tmp_path / "results")]
    monkeypatch.setattr(results, "COMMAND", ["gate", *argv])  # as the dispatcher sets it
    assert gate.main(argv) == 3  # only fingerprints ran: INCOMPLETE
    captured = capsys.readouterr()
    assert "[gate] check 1/1: fingerprints" in captured.err and "check 1/1" not in captured.out
    assert "MAY SHIP" not in captured.out and "INCOMPLETE" in captured.out
    [path] = (tmp_path / "results" / "gate").glob("*.json")
    data = results.load(path)
    assert data["command"] == seen[0] and seen[0].startswith("fastpath-suite gate omnivoice==9.9.9 --out ")
    [verdict] = data["figures"]["verdicts"]  # one verdict per candidate and --against (gate.gathered)
    assert verdict["state"] == "incomplete" and verdict["checks"][0]["name"] == "fingerprints"
    monkeypatch.setattr(results, "COMMAND", None)  # `python -m harness.gate.gate`: the same form
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path / "o"), "--quiet"]) == 3
    assert capsys.readouterr().err == "" and seen[1] == f"fastpath-suite gate omnivoice==9.9.9 --out {tmp_path / 'o'} --quiet"


# --- false alarms -----------------------------------------------------------------------------------------------


def false_alarm_runs(folder, n=3, invocation="20261201T000000Z-1", commit="a" * 40):
    """What scripts/false_alarms.sh leaves: run<i>.json always, run<i>.xml when pytest wrote a report."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, n + 1):
        busy = i == n
        meta = {"run": i, "runs": n, "settings": "plain" + (", one core busy" if busy else ""), "env": [],
                "avx2": False, "one_core_busy": busy, "exit_code": 1 if i != 2 else 0, "wall_s": 400 + i,
                "install_s": 40, "pytest_s": 360 + i, "commit": commit, "invocation": invocation}
        (folder / f"run{i}.json").write_text(json.dumps(meta))
        if i == 1:
            (folder / f"run{i}.xml").write_text(JUNIT.format(time="357.5"))
        elif i == 2:
            (folder / f"run{i}.xml").write_text(JUNIT.format(time="350").replace(
                '<failure message="not bit-exact">x</failure>', "").replace('<error message="boom">y</error>', ""))
    return folder


def test_false_alarms_record_reads_the_scripts_files(tmp_path):
    out = false_alarm_runs(tmp_path / "out")
    path = false_alarms.record(out, tmp_path / "results", runs=3, command="fastpath-suite audit false-alarms 3 --busy 1")
    data = results.load(path)
    assert path.parent.name == "false-alarms" and data["command"] == "fastpath-suite audit false-alarms 3 --busy 1"
    figures = data["figures"]
    assert figures["commit"] == "a" * 40
    first, second, third = figures["runs"]
    assert (first["passed"], first["failed"], first["skipped"]) == (2, 2, 1)
    assert first["failed_tests"] == ["tests_parity.test_a::test_bad", "tests_parity.test_b::test_broken"]
    assert (second["failed"], second["report"], third["report"], third["passed"]) == (0, True, False, None)
    assert (third["wall_s"], third["install_s"], third["settings"]) == (403, 40, "plain, one core busy")
    assert figures["failures_per_test"] == {"tests_parity.test_a::test_bad": 1, "tests_parity.test_b::test_broken": 1}
    page = results.render(tmp_path / "results")
    assert "## False alarms of the default suite on fresh clones" in page
    assert "| 1 | plain | 401 (40 + 361) | 1 | 2 | 2 | 1 | tests_parity.test_a::test_bad, " in page
    assert "| 3 | plain, one core busy | 403 (40 + 363) | 1 | - | - | - | no junit report" in page
    assert "Runs that did not pass: 2 of 3" in page and "`tests_parity.test_a::test_bad`: 1/3" in page


def test_false_alarms_without_runs_takes_the_newest_call_of_the_script(tmp_path):
    out = false_alarm_runs(tmp_path / "out", n=5, invocation="old")
    for path in out.glob("run*.json"):
        os.utime(path, (1e9, 1e9))
    false_alarm_runs(out, n=2, invocation="new")  # a later call of 2 runs over the same folder
    figures = false_alarms.gather(out)
    assert [r["run"] for r in figures["runs"]] == [1, 2]
    assert false_alarms.main(["--out", str(tmp_path / "empty"), "--results", str(tmp_path / "r")]) == 2


# --- the GPU script ---------------------------------------------------------------------------------------------


def gpu_machine():
    info = machine_info("cpu")
    info.update(device="cuda", gpu_name="NVIDIA H200", cuda_available=True, compute_capability="9.0",
                cuda_version="13.0")
    return info


def bench_json(points: dict, variants: list, rounds: int, command: str) -> dict:
    """harness.speed.bench main's --out JSON: vars(measure.Samples) per point and variant."""
    from harness.speed.measure import Samples

    out = {}
    for name, rtfs in points.items():
        out[name] = {}
        for v, rtf in zip(variants, rtfs):
            s = Samples(v, ())
            for r in range(rounds + 1):
                s.add(r, rtf * 5.0 * (1 + 0.01 * (r % 2)), 5.0)
            s.load = [0.5] * rounds
            out[name][v] = vars(s)
    return {"command": command, "checkpoint": "full", "device_key": "cuda-nvidia-h200__torch-2.9__omnivoice-0.2.1",
            "machine": gpu_machine(), "variants": {v: {"patches": [], "dtype": "bf16", "overrides": {}}
                                                   for v in variants},
            "results": out, "flops": None, "flops_of": None}


def streaming_json() -> dict:
    """harness.speed.streaming main's streaming.json: asdict(Listen) per round."""
    from harness.speed.streaming import Listen

    def listen(ttfa, waits):
        return asdict(Listen(ttfa=ttfa, waits=waits, total=ttfa + 2.0, audio=6.5))

    rounds = {"generate": [listen(1.2 + 0.01 * r, []) for r in range(3)],
              "stream": [listen(0.15 + 0.01 * r, [0.0, 0.02 * r]) for r in range(3)]}
    return {"machine": gpu_machine(), "checkpoint": "full", "command": "python -m harness.speed.streaming --size full",
            "applied": [], "rounds": 3,
            "points": {"clone6-six-32": {v: {"warmup": listen(9.0, [0.0, 0.0]), "rounds": rs}
                                         for v, rs in rounds.items()}}}


def gpu_folder(folder):
    """What scripts/gpu_check.sh leaves in $OUT (stage 4b's batching bench stopped at its limit)."""
    folder.mkdir(parents=True)
    call = "STAGES='3 4 4b 5' fastpath-suite gpu-check"
    steps = [("parity", 0, 240), ("speed", 124, 120), ("bench", 0, 100), ("batching", 124, 60),
             ("stream-gpu-stock", 0, 60)]
    (folder / "steps.jsonl").write_text("".join(
        json.dumps({"step": s, "exit": e, "limit_s": lim, "seconds": 30, "call": call}) + "\n" for s, e, lim in steps))
    (folder / "parity.xml").write_text(JUNIT.format(time="201.5"))
    (folder / "bench.json").write_text(json.dumps(bench_json(
        {"clone6-medium-32": [0.1, 0.05, 0.02], "auto-short-10": [0.2, 0.1, 0.04]},
        ["stock@fp32", "stock@bf16", "gpu@bf16"], 6, "python -m harness.speed.bench --size full --device cuda")))
    (folder / "stream-gpu-stock").mkdir()
    (folder / "stream-gpu-stock" / "streaming.json").write_text(json.dumps(streaming_json()))
    return folder


def test_gpu_check_record_gathers_the_scripts_files_under_the_gpu_that_measured(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # gathered on another machine than the GPU's
    path = gpu_check.record(gpu_folder(tmp_path / "out"), tmp_path / "results")
    assert path == tmp_path / "results" / "gpu-check" / "cuda-nvidia-h200.json"
    data = results.load(path)
    assert data["machine_summary"].startswith("NVIDIA H200, ") and data["machine"]["gpu_name"] == "NVIDIA H200"
    assert data["command"] == "STAGES='3 4 4b 5' fastpath-suite gpu-check"
    figures = data["figures"]
    assert figures["tests"]["parity"]["passed"] == 2 and figures["tests"]["parity"]["errors"] == 1
    assert figures["tests"]["speed"]["report"] is False  # stopped at its limit before writing a report
    assert figures["bench"]["bench"]["points"]["auto-short-10"]["gpu@bf16"]["rtf"][0] == pytest.approx(0.04 * 1.01)
    assert figures["stream"]["stream-gpu-stock"]["points"]["clone6-six-32"]["stream"]["warmup_ttfa"] == 9.0
    page = results.render(tmp_path / "results")
    assert "## GPU tier" in page and "### NVIDIA H200, " in page
    assert "| parity | 0 | 2 | 2 | 1 | 1 | 202 | tests_parity.test_a::test_bad, " in page
    assert "| speed | 124: stopped at the 120 s limit | - |" in page
    assert "| clone6-medium-32 | stock@fp32 | 0.1" in page and "| auto-short-10 | gpu@bf16 | 0.04" in page
    assert "5.00x |" in page, "stock@fp32 / gpu@bf16 at auto-short-10: 0.2 / 0.04"
    assert "| clone6-six-32 | stream | 0.160 | " in page and "| clone6-six-32 | generate | 1.210 | " in page
    assert "batching (exit 124: stopped at the 60 s limit)" in page


def test_gpu_check_merges_two_calls_and_judges_batching_pairs(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    first = gpu_folder(tmp_path / "a")
    second = tmp_path / "b"
    second.mkdir()
    (second / "batching.json").write_text(json.dumps(bench_json(
        {"clone3-mixed8-16": [0.02, 0.01], "clone3-mixed8-16-each": [0.08, 0.05]}, ["stock@bf16", "gpu@bf16"], 2,
        "python -m harness.speed.bench --points clone3-mixed8-16 clone3-mixed8-16-each")))
    (second / "steps.jsonl").write_text(json.dumps({"step": "batching", "exit": 0, "limit_s": 60, "seconds": 50,
                                                    "call": "STAGES=4b fastpath-suite gpu-check"}) + "\n")
    figures, machine = gpu_check.gather([first, second])
    assert figures["steps"]["batching"]["exit"] == 0 and machine["gpu_name"] == "NVIDIA H200"
    text = gpu_check.render_results(figures)
    assert "One batch (`clone3-mixed8-16`) against one call per text (`clone3-mixed8-16-each`)" in text
    [row] = [line for line in text.splitlines() if line.startswith("| gpu@bf16 | 0.01")]
    assert row.endswith("| unjudged: 2 round(s); at least 3 show whether the timing holds |"), row  # no ratio
    path = gpu_check.record([first, second], tmp_path / "results")
    assert results.load(path)["command"] == ("STAGES='3 4 4b 5' fastpath-suite gpu-check; "
                                             "STAGES=4b fastpath-suite gpu-check")
    assert gpu_check.main(["--out", str(tmp_path / "nothing"), "--results", str(tmp_path / "r")]) == 2


# --- the prefix cache ------------------------------------------------------------------------------------------


def prefix_figures(checkpoint=True) -> dict:
    """harness.speed.prefix main's results figures: measure()'s rows with their samples, the load, the checkpoint."""
    rows = [{"variant": "exact", "seconds_per_step": 0.5, "speedup": 1.0, "samples": [0.5, 0.52, 0.49]},
            {"variant": "r=4", "seconds_per_step": 0.25, "speedup": 2.0, "samples": [0.25, 0.26, 0.245],
             "agreement": 0.9375}]
    figures = {"point": "clone6-medium-16", "num_step": 16, "rounds": 3, "seeds": [0, 1], "rows": rows, "load": 1.0}
    return dict(figures, checkpoint="full-e4777718bb77ad5e") if checkpoint else figures


def test_prefix_results_name_the_checkpoint_that_was_timed():
    from harness.speed import prefix

    assert results.renderer("prefix") is prefix.render_results
    lines = prefix.render_results(prefix_figures()).splitlines()
    assert lines[0].startswith("Checkpoint full-e4777718bb77ad5e: prefix_kv_cache at clone6-medium-16 (16 steps)")
    assert lines[2:] == ["| variant | s/step | speedup vs exact | token agreement |", "|---|---|---|---|",
                         "| exact | 0.500 | 1.00x | 100% (reference) |", "| r=4 | 0.250 | 2.00x | 93.75% |"]
    # a file written before the checkpoint was recorded still renders
    assert prefix.render_results(prefix_figures(checkpoint=False)).startswith("prefix_kv_cache at clone6-medium-16")


def test_prefix_main_records_the_checkpoint_in_its_results_file(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import harness.model.checkpoint
    from harness.speed import prefix

    measured = {k: v for k, v in prefix_figures(checkpoint=False).items() if k != "load"}
    monkeypatch.setattr(harness.model.checkpoint, "resolve_checkpoint",
                        lambda explicit, size: SimpleNamespace(identity=f"{size}-0123456789abcdef"))
    monkeypatch.setattr(harness.model.checkpoint, "load_model", lambda ckpt: SimpleNamespace(device="cpu"))
    monkeypatch.setattr(prefix, "measure", lambda *a, **k: dict(measured))
    assert prefix.main(["--size", "full", "--results", str(tmp_path), "--quiet"]) == 0
    (path,) = (tmp_path / "prefix").glob("*.json")
    figures = results.load(path)["figures"]
    assert figures["checkpoint"] == "full-0123456789abcdef"
    assert "Checkpoint full-0123456789abcdef: " in results.render(tmp_path)
