"""`--device cuda` gates the CUDA patches too: the parity check runs the tier's CPU rows and its CUDA rows (-m cuda) in
both versions and compares them. On this CPU machine: the selection the gate builds (the pytest arguments, and what
they collect), the verdict where the CUDA rows ran, failed or skipped (planted runs), and the real answer here, where
CUDA is not usable: not judged (INCOMPLETE), never a pass. On a GPU runner: `fastpath-suite gate CANDIDATE --device
cuda` (docs/gate.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from harness import REPO_ROOT
from harness.gate import candidate as cand
from harness.gate import gate
from harness.model.devices import cuda_problem

GPU_MODULE = "tests_parity/test_gpu_parity.py"


def test_the_cuda_device_selects_the_cpu_and_the_cuda_parity_rows():
    assert gate.parity_runs() == {"parity": ["tests_parity"]}, "the CPU gate runs the default run's selection"
    assert gate.parity_runs("one_word") == {"parity": ["tests_parity", "-k", "one_word"]}
    assert gate.parity_runs(None, "cuda") == {"parity": ["tests_parity", "-m", "not cuda"],
                                              "parity-cuda": ["tests_parity", "-m", "cuda"]}
    assert gate.parity_runs("revert", "cuda")["parity-cuda"] == ["tests_parity", "-m", "cuda", "-k", "revert"]


NICE = ["nice", "-n", "19"] if shutil.which("nice") else []  # beside the other tests: the cores they leave idle


def collected(args: list) -> set:
    done = subprocess.run([*NICE, sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-p",
                           "no:cacheprovider"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line.split("[", 1)[0] for line in done.stdout.splitlines() if "::" in line}


def collect_the_selections(folder) -> dict:
    """What pytest collects for the CUDA gate's two parity runs and for the CPU gate's one (three pytest processes,
    about 45 s of one core: started when collection ends)."""
    runs = gate.parity_runs(None, "cuda")
    return {"cuda": collected(runs["parity-cuda"]), "cpu": collected(runs["parity"]),
            "default": collected(gate.parity_runs()["parity"])}


@pytest.mark.early.with_args(collect_the_selections)
def test_the_cuda_rows_are_the_gpu_parity_tests_and_the_two_runs_cover_the_tier_once(early):
    """What the two runs collect (pytest itself, in a subprocess): the CUDA run exactly the CUDA parity tests, the
    CPU run none of them, and together every test the default selection collects."""
    cuda, cpu = early["cuda"], early["cpu"]
    assert cuda and all(t.startswith(GPU_MODULE) for t in cuda), sorted(cuda)[:5]
    assert not cuda & cpu
    assert cuda | cpu == early["default"]


def junit(passed=(), failed=(), skipped=(), returncode=0):
    return {"returncode": returncode, "passed": len(passed), "passed_tests": list(passed), "failed": list(failed),
            "errors": [], "skipped": list(skipped), "not_applicable": []}


CPU_OK = junit(passed=["tests_parity/test_bitexact.py::test_a"])
CUDA_OK = junit(passed=[f"{GPU_MODULE}::test_revert_gives_stock_back_on_cuda[cuda_graphs]"])


class Env:
    def __init__(self, name):
        self.python = name


def gate_parity(monkeypatch, tmp_path, runs: dict, problems: dict | None = None) -> tuple:
    """check_parity with --device cuda, each pytest run answered from `runs` ({(env, log name): junit}) and the CUDA
    question from `problems` ({env: why}); returns the check and the runs asked for."""
    asked = []

    def run_pytest(env, args, out, name, extra_env=None):
        asked.append((env.python, name, args))
        return runs[(env.python, name.removesuffix("-against"))]

    monkeypatch.setattr(gate, "run_pytest", run_pytest)
    monkeypatch.setattr(gate, "tier_environment", lambda *a, **k: {})
    monkeypatch.setattr(gate, "cuda_problem_in", lambda env: (problems or {}).get(env.python))
    check = gate.check_parity(Env("cand"), tmp_path, None, "9.9.9", Env("base"), "0.2.1", device="cuda")
    return check, asked


def test_cuda_rows_that_ran_in_both_versions_are_compared(monkeypatch, tmp_path):
    runs = {(e, n): (CUDA_OK if n == "parity-cuda" else CPU_OK) for e in ("cand", "base")
            for n in ("parity", "parity-cuda")}
    check, asked = gate_parity(monkeypatch, tmp_path, runs)
    assert (check.status, check.blocks, check.complete) == ("pass", False, True), check
    assert "CPU and CUDA rows (1 CUDA rows passed)" in check.summary, check.summary
    assert [(e, n) for e, n, _ in asked] == [("cand", "parity"), ("cand", "parity-cuda"), ("base", "parity-against"),
                                             ("base", "parity-cuda-against")]
    assert {tuple(a) for *_, a in asked} == {("tests_parity", "-m", "not cuda"), ("tests_parity", "-m", "cuda")}


def test_a_cuda_row_that_fails_or_stops_running_on_the_candidate_blocks(monkeypatch, tmp_path):
    test = f"{GPU_MODULE}::test_revert_gives_stock_back_on_cuda[cuda_graphs]"
    base = {("base", "parity"): CPU_OK, ("base", "parity-cuda"): CUDA_OK, ("cand", "parity"): CPU_OK}
    failed = {**base, ("cand", "parity-cuda"): junit(failed=[(test, "not bit-exact")], returncode=1)}
    check, _ = gate_parity(monkeypatch, tmp_path, failed)
    assert (check.status, check.blocks) == ("fail", True) and test in check.details[0], check
    skips = {**base, ("cand", "parity-cuda"): junit(skipped=[(test, "needs cuda_graphs")])}
    check, _ = gate_parity(monkeypatch, tmp_path, skips)
    assert (check.status, check.blocks) == ("fail", True), check
    assert any(f"SKIPS on the candidate: {test}" in d for d in check.details), check.details


def test_cuda_rows_that_cannot_run_are_not_judged_never_a_pass(monkeypatch, tmp_path):
    runs = {(e, "parity"): CPU_OK for e in ("cand", "base")}
    check, asked = gate_parity(monkeypatch, tmp_path, runs, {"cand": "the wheel: a CPU build",
                                                            "base": "the wheel: a CPU build"})
    assert (check.status, check.blocks, check.complete) == ("skipped", False, False), check
    assert check.summary.startswith("not judged: the CUDA parity rows (--device cuda: pytest tests_parity -m cuda) "
                                    "cannot run here: the wheel: a CPU build;"), check.summary
    assert [n for _, n, _ in asked] == ["parity", "parity-against"], "no CUDA row is run where CUDA is not usable"
    report = gate.verdict([c for c in [gate.Check(n, "pass", False, "") for n in gate.BLOCKING] if c.name != "parity"]
                          + [check])
    assert (report["state"], report["exit_status"]) == ("incomplete", 3), report
    assert "cannot run here: the wheel: a CPU build" in gate.headline(report), gate.headline(report)
    only_skips = {**runs, **{(e, "parity-cuda"): junit(skipped=[(f"{GPU_MODULE}::t", "bf16 needs 8.0")])
                             for e in ("cand", "base")}}
    check, _ = gate_parity(monkeypatch, tmp_path, only_skips)
    assert (check.status, check.complete) == ("skipped", False), check
    assert "no CUDA parity row ran (-m cuda): every one skipped, the first: " in check.summary, check.summary
    one_side = gate_parity(monkeypatch, tmp_path, runs, {"base": "the driver"})[0]
    assert "cannot run here: against: the driver" in one_side.summary, one_side.summary


def test_a_cpu_row_that_fails_still_blocks_where_the_cuda_rows_cannot_run(monkeypatch, tmp_path):
    runs = {("cand", "parity"): junit(failed=[("tests_parity/test_bitexact.py::test_a", "not bit-exact")],
                                      returncode=1), ("base", "parity"): CPU_OK}
    check, _ = gate_parity(monkeypatch, tmp_path, runs, {"cand": "no GPU", "base": "no GPU"})
    assert (check.status, check.blocks) == ("fail", True), check
    assert "the CUDA parity rows did not run: no GPU" in check.details, check.details


@pytest.mark.skipif(cuda_problem() is None, reason="CUDA is usable here: this test shows the answer where it is not")
def test_here_without_cuda_the_gate_says_it_cannot_run_the_cuda_rows(monkeypatch, tmp_path):
    """The real question, asked in this environment as the gate asks it, on this CPU machine: the CUDA rows are not
    run and the parity check is not judged, naming why (pytest's runs answered from planted results)."""
    env = cand.current_env()
    asked = []

    def run_pytest(env, args, out, name, extra_env=None):
        asked.append(name)
        return CPU_OK

    monkeypatch.setattr(gate, "run_pytest", run_pytest)
    monkeypatch.setattr(gate, "tier_environment", lambda *a, **k: {})
    check = gate.check_parity(env, tmp_path, None, "0.2.1", None, device="cuda")
    assert asked == ["parity"], asked
    assert (check.status, check.complete) == ("skipped", False) and cuda_problem() in check.summary, check.summary
