"""docs/gpu.md's table of the GPU script's time limits is rendered from the script's own lines and the seconds each
stage took in the gpu-check results files: no default and no measured second is typed by hand."""

from __future__ import annotations

import re

from harness import gpu_check
from harness.run import results


def test_every_limit_the_script_gives_a_stage_is_in_the_table_under_that_stage():
    script = gpu_check.SCRIPT.read_text()
    used = dict((limit, stage) for stage, limit in
                re.findall(r'run_(?:stage|pytest) ([\w-]+) "\$(\w+_LIMIT)"', script))
    used.update({"ENV_LIMIT": "env", "COLLECT_LIMIT": "collect"})  # the env stage and each pytest stage's listing
    table = {name: stage for name, _, stage, _ in gpu_check.script_limits()}
    assert used.items() <= table.items(), sorted(set(used.items()) - set(table.items()))
    assert table["DEADLINE"] == "the call"


def test_a_default_is_said_as_the_script_takes_it():
    assert gpu_check.default_text("60") == "60"
    assert gpu_check.default_text("${PYTEST_LIMIT:-240}") == "240 (`PYTEST_LIMIT` where set)"
    assert gpu_check.default_text('$([ "$mode" = quick ] && echo 570)') == "570 with `--quick`, else none"


def test_without_a_gpu_run_every_default_is_called_an_estimate(tmp_path):
    page = gpu_check.render_limits(tmp_path)
    assert "| `BENCH_LIMIT` | 100 | bench |" in page and "No GPU run has written a results file" in page, page


def test_a_gpu_runs_seconds_stand_beside_each_limit(tmp_path):
    figures = {"mode": "quick", "steps": {"env": {"exit": 0, "limit_s": 60, "seconds": 12},
                                          "targets": {"exit": 124, "limit_s": 120, "seconds": 120}},
               "verdicts": {"env": {"verdict": "pass", "reason": ""}, "targets": {"verdict": "error", "reason": ""}},
               "tests": {}, "bench": {}, "stream": {}}
    results.record("gpu-check", figures, tmp_path)
    page = gpu_check.render_limits(tmp_path)
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `")}
    assert rows["`ENV_LIMIT`"].endswith("| 12 of 60 (pass) |"), rows["`ENV_LIMIT`"]
    assert rows["`TARGETS_LIMIT`"].endswith("| 120 of 120 (error) |")
    assert rows["`BENCH_LIMIT`"].endswith("| not run |") and "No GPU run" not in page
