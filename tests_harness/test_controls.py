"""docs/controls.md is true: every gate's controls listed there exist and run where the table says, every day.

The table's `runs` column names a run; each run is a selection that this test evaluates on the collected tests:
`default` (the default run: no slow, cuda, mps or real_weights mark), `ci` (the stage `.ci/run` runs after the
default run, on every change: its pytest line read from .ci/run), `nightly:slow` and `nightly:speed` (the nightly
workflow's jobs, their folders and -m expressions read from .github/workflows/nightly.yml), `gpu` (the gpu
workflow's -m expression). A listed test that is gone, or that the run no longer reaches, fails here. That a listed
control which the run reaches does not skip there is checked as it runs (conftest.py, harness.audit.controls): its skip
fails the run, unless the row says its figures are recorded per machine and the skip says "not judged".
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import yaml
from _pytest.mark.expression import Expression

from harness import REPO_ROOT

from harness.audit import controls

DOC = controls.DOC
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CI = REPO_ROOT / ".ci" / "run"
NOT_DEFAULT = ("slow", "cuda", "mps", "real_weights")


table = controls.table


def pytest_call(line: str) -> tuple:
    """(folders, -m expression, --slow given) of one `python -m pytest ...` command line."""
    words = shlex.split(line.split("|")[0].split("&&")[-1])
    args = words[words.index("pytest") + 1:]
    expr = args[args.index("-m") + 1] if "-m" in args else None
    return [a for a in args if a.startswith("tests_")], expr, "--slow" in args


def pytest_calls(workflow: str, job: str) -> list:
    """(matrix device, folders, -m expression, --slow given) of every `python -m pytest` line of a workflow job,
    once per row of its matrix (device "" for a job without one)."""
    spec = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"][job]
    rows = spec.get("strategy", {}).get("matrix", {}).get("include", [{}])
    calls = []
    for row in rows:
        for step in spec["steps"]:
            for line in str(step.get("run", "")).splitlines():
                if "python -m pytest" not in line:
                    continue
                line = re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: str(row[m.group(1)]), line)
                calls.append((row.get("device", ""), *pytest_call(line)))
    assert calls, f"no pytest call in {workflow} job {job}"
    return calls


def ci_calls() -> list:
    """The pytest lines of .ci/run after its first (the README's test command, the default run)."""
    lines = [line for line in CI.read_text().splitlines() if "python -m pytest" in line and not line.lstrip().startswith("#")]
    assert len(lines) >= 2, f"{CI}: the default run and then the controls stage, two pytest lines; found {lines}"
    return [("", *pytest_call(line)) for line in lines[1:]]


def runs(name: str):
    """A predicate on (nodeid, mark names) for a run named in the table."""
    if name == "default":
        return lambda nodeid, marks: not set(marks) & set(NOT_DEFAULT)
    if name == "ci":
        calls = ci_calls()
    else:
        workflow, job = {"nightly:slow": ("nightly.yml", "slow"), "nightly:speed": ("nightly.yml", "speed"),
                         "gpu": ("gpu.yml", "cuda")}[name]
        calls = pytest_calls(workflow, job)
    if name.startswith("nightly"):
        calls = [c for c in calls if c[0] in ("", "cpu")]  # the CPU row of a matrix, or a job without one
    predicates = [selection(folders, expr, slow) for _, folders, expr, slow in calls]
    return lambda nodeid, marks: any(selected(nodeid, marks) for selected in predicates)


def selection(folders: list, expr: str | None, slow: bool):
    """A predicate on (nodeid, mark names) for one pytest call: its folders, its -m expression, and whether slow
    tests run (--slow, or "slow" in the expression, as conftest.py decides)."""
    compiled, slow = (Expression.compile(expr) if expr else None), slow or "slow" in (expr or "")
    return lambda nodeid, marks: ((not folders or nodeid.split("/")[0] in folders)
                                  and (compiled is None or compiled.evaluate(lambda m, **_: m in marks))
                                  and (slow or "slow" not in marks))


def collected(request, files) -> dict:
    """{nodeid: mark names} of the tests in `files` (`collected_items`)."""
    return {nodeid: marks for nodeid, (marks, _) in collected_items(request, files).items()}


def collected_items(request, files) -> dict:
    """{nodeid: (mark names, fixture names)} of the tests in `files`: from this session where it collected them
    whole, else from a collection of those files alone (a run of a subset)."""
    items = {i.nodeid: ({m.name for m in i.iter_markers()}, set(getattr(i, "fixturenames", ())))
             for i in request.session.items}
    have = {n.split("::")[0] for n in items}
    if set(files) <= have and not request.config.getoption("markexpr") and not request.config.getoption("keyword"):
        return items
    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "-p", "tests_harness.marks_plugin", *sorted(set(files))],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    out = {}
    for line in done.stdout.splitlines():
        for kind, at in (("MARKS ", 0), ("FIXTURES ", 1)):
            if line.startswith(kind):
                nodeid, _, names = line[len(kind):].rpartition(" ")  # a parameter id may hold spaces; names do not
                out.setdefault(nodeid, (set(), set()))[at].update(set(names.split(",")) - {""})
    assert out, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_the_table_lists_a_control_of_each_kind_for_every_gate():
    rows = table()
    assert len(rows) >= 20, f"only {len(rows)} rows read from {DOC}"
    kinds = {}
    for row in rows:
        assert row["kind"] in ("equivalent", "worse"), row
        assert row["run"] in controls.RUNS and row["qualifier"] in ("", controls.PER_MACHINE), row
        assert not row["per_machine"] or row["run"] == "nightly:speed", f"only wall-time figures are per machine: {row}"
        kinds.setdefault(row["gate"].split(" (")[0], set()).add(row["kind"])
    for gate in ("version bump", "parity", "quality", "speed", "work counters", "goldens"):
        assert kinds.get(gate) == {"equivalent", "worse"}, (gate, kinds.get(gate))


def test_every_listed_control_exists_and_runs_where_the_table_says(request):
    rows = table()
    tests = collected(request, [r["test"].split("::")[0] for r in rows])
    wrong = []
    for row in rows:
        params = {n: m for n, m in tests.items() if n == row["test"] or n.startswith(row["test"] + "[")}
        if not params:
            wrong.append(f"{row['test']}: not collected (renamed or removed? update {DOC.name})")
            continue
        run = runs(row["run"])
        if not any(run(n, marks) for n, marks in params.items()):
            marks = sorted(set().union(*params.values()))
            wrong.append(f"{row['test']}: {row['run']} does not run it (marks: {marks})")
    assert not wrong, "docs/controls.md is out of date:\n  " + "\n  ".join(wrong)


def test_the_ci_stage_runs_exactly_the_tables_ci_rows(request):
    """`.ci/run`'s controls stage is the tests marked `control`: each is listed as `ci` (so its time is accounted
    for and its control documented), and each `ci` row is marked."""
    files = sorted(str(f.relative_to(REPO_ROOT)) for folder in ("tests_patches", "tests_harness", "tests_parity",
                                                                 "tests_quality") for f in (REPO_ROOT / folder).glob("test_*.py"))
    tests = collected(request, files)
    stage = runs("ci")
    selected = {n for n, marks in tests.items() if stage(n, marks)}
    listed = {r["test"] for r in table() if r["run"] == "ci"}
    unlisted = sorted(n for n in selected if not any(n == t or n.startswith(t + "[") for t in listed))
    assert selected and not unlisted, f"marked `control` but not a `ci` row of {DOC.name}: {unlisted}"


def test_the_nightly_slow_job_runs_the_slow_tier_of_every_folder_but_speed():
    ((_, folders, expr, slow),) = pytest_calls("nightly.yml", "slow")
    assert slow and expr == "slow and not cuda", (expr, slow)
    assert sorted(folders) == ["tests_harness", "tests_parity", "tests_patches", "tests_quality"], folders
    ((_, speed_folders, speed_expr, _),) = [c for c in pytest_calls("nightly.yml", "speed") if c[0] == "cpu"]
    assert speed_folders == ["tests_speed"] and speed_expr == "slow and not cuda"


@pytest.mark.parametrize("name, nodeid, marks, expected", [
    ("default", "tests_a/test_x.py::t", set(), True),
    ("default", "tests_a/test_x.py::t", {"slow"}, False),
    ("nightly:slow", "tests_parity/test_x.py::t", {"slow", "cpu"}, True),
    ("nightly:slow", "tests_parity/test_x.py::t", {"cpu"}, False),
    ("nightly:slow", "tests_speed/test_x.py::t", {"slow"}, False),
    ("nightly:speed", "tests_speed/test_x.py::t", {"slow"}, True),
    ("gpu", "tests_parity/test_x.py::t", {"cuda"}, True),
    ("gpu", "tests_parity/test_x.py::t", {"slow"}, False),
    ("gpu", "tests_parity/test_x.py::t", {"slow", "cuda"}, False),  # skipped there: no --slow
    ("ci", "tests_harness/test_x.py::t", {"slow", "control"}, True),
    ("ci", "tests_quality/test_x.py::t", {"control"}, True),
    ("ci", "tests_harness/test_x.py::t", {"slow"}, False),  # slow but not a control: nightly only
    ("ci", "tests_harness/test_x.py::t", {"control", "cuda"}, False),
])
def test_run_selections_read_from_the_workflows(name, nodeid, marks, expected):
    assert runs(name)(nodeid, marks) is expected


CHILD = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--slow", "-p",
         "tests_harness.planted_skip", "tests_speed/test_compare.py::test_cli_exits_0_on_a_clean_rerun",
         "tests_speed/test_compare.py::test_cli_exits_2_on_a_corrupt_file_with_the_fix",
         "tests_speed/test_rtf.py::test_rtf_against_the_stored_baseline"]


def run_planted_skips(folder):
    strict_run = subprocess.run(CHILD, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)  # hang guards
    lenient = subprocess.run([*CHILD, "--no-strict-inputs"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=1200)
    return strict_run, lenient


@pytest.mark.early.with_args(run_planted_skips)
def test_a_listed_control_that_skips_where_it_runs_fails_the_run(early):
    """Known worse, as the tests run: a default-run control that skips fails the run, naming its row; a per-machine
    control's "not judged" skip and an unlisted test's skip stay skips; with --no-strict-inputs nothing fails."""
    strict_run, lenient = early
    out = strict_run.stdout + strict_run.stderr
    assert strict_run.returncode == 1, out[-3000:]
    assert any(line.startswith(("FAILED ", "ERROR ")) and "test_compare.py::test_cli_exits_0_on_a_clean_rerun" in line
               for line in out.splitlines()), out[-3000:]  # skipped at setup: an error of its setup
    assert "a control listed in docs/controls.md (speed (compare rule): equivalent, runs default) skipped where it " \
           "runs: planted: its input is missing" in out, out[-3000:]
    assert any(line.startswith("SKIPPED") and line.endswith(": planted: a test no row lists")
               for line in out.splitlines()), out[-3000:]
    assert "not judged: planted: no baseline recorded for this machine yet" in out, out[-3000:]
    assert ("1 failed" in out or "1 error" in out) and "2 skipped" in out, out[-3000:]
    text = lenient.stdout + lenient.stderr
    assert lenient.returncode == 0 and "3 skipped" in text, text[-3000:]


@pytest.mark.parametrize("row, reason, left_out, fails", [
    ({"run": "default", "per_machine": False}, "its input is missing", False, True),
    ({"run": "default", "per_machine": False}, "slow (...): run with --slow", True, False),
    ({"run": "nightly:speed", "per_machine": True}, "not judged: no baseline for this machine", False, False),
    ({"run": "nightly:speed", "per_machine": True}, "the baseline lacks a point", False, True),
    ({"run": "ci", "per_machine": False}, "not judged: no hashes here", False, True),
    # the installed version lacks the API, or a patch refuses this machine by design: counted, never a failure
    ({"run": "default", "per_machine": False}, "not applicable: the voice_clone_prompt point: needs "
                                              "VoiceClonePrompt.save/load (added in 0.2.1)", False, False),
    ({"run": "ci", "per_machine": True}, "not applicable: batch_invariant refuses this machine by design", False,
     False),
    ({"run": "default", "per_machine": False}, "batch_invariant is not applicable here", False, True),  # said, not marked
])
def test_which_skips_of_a_listed_control_fail(row, reason, left_out, fails):
    row = {"gate": "g", "kind": "equivalent", "runs": row["run"], **row}
    assert (controls.skip_is_a_failure(row, reason, left_out) is not None) is fails


def benchmark_json_calls() -> list:
    """(workflow, matrix device, folders, -m expression, --slow, the JSON file) of every pytest line of a GPU job that
    names --benchmark-json."""
    out = []
    for workflow, job in (("gpu.yml", "cuda"), ("nightly.yml", "speed")):
        spec = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"][job]
        for row in spec.get("strategy", {}).get("matrix", {}).get("include", [{}]):
            for step in spec["steps"]:
                for line in str(step.get("run", "")).splitlines():
                    line = re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: str(row[m.group(1)]), line)
                    json_file = re.search(r"--benchmark-json=(\S+)", line)
                    if "python -m pytest" in line and json_file and row.get("device", "cuda") == "cuda":
                        out.append((workflow, *pytest_call(line), json_file.group(1)))
    return out


def test_the_gpu_jobs_select_timed_tests_that_write_the_json_they_name(request):
    """gpu.yml's `out/cuda.json` and the nightly GPU row's `out/wall.json` (its history) come from pytest-benchmark,
    which writes one only when a selected test uses the `benchmark` fixture: each such line selects at least one."""
    calls = benchmark_json_calls()
    assert {call[0] for call in calls} == {"gpu.yml", "nightly.yml"}, calls
    files = sorted(str(f.relative_to(REPO_ROOT)) for call in calls for folder in call[1]
                   for f in (REPO_ROOT / folder).glob("test_*.py"))
    tests = collected_items(request, files)
    for workflow, folders, expr, slow, json_file in calls:
        selected = selection(folders, expr, slow)
        timed = [n for n, (marks, fixtures) in tests.items() if selected(n, marks) and "benchmark" in fixtures]
        assert timed, f"{workflow}: `pytest {' '.join(folders)} -m {expr!r}` selects no test that writes {json_file}"


REFUSAL_CONTROLS = ["tests_patches/test_registry.py::test_patches_touch_the_instance_only[batch_invariant]",
                    "tests_patches/test_layouts.py::test_the_loop_asks_for_one_prefix_length_per_batch_under_"
                    "prefix_kv_cache_only[batch_invariant]",
                    "tests_parity/test_batched.py::test_two_voices_in_one_batch_each_get_their_own"]


@pytest.mark.control
def test_a_patch_that_refuses_this_machine_by_design_makes_its_controls_not_applicable():
    """As an AVX2-only Intel runner computes (MKL's GEMM rows depend on the row count: planted by
    tests_harness/forced_refusal.py), batch_invariant refuses to apply: the three listed controls that need it are
    not applicable, each named in the summary with the refusal, never failures (they failed as "skipped where it
    runs", or on the refusal itself); the refusal itself is still checked (tests_patches/test_registry.py)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-p",
                           "tests_harness.forced_refusal", *REFUSAL_CONTROLS], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1200)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "3 skipped" in out and "failed" not in out and "error" not in out, out[-3000:]
    section = out.split("not applicable: 3 check(s) cannot apply here by design", 1)
    assert len(section) == 2, out[-3000:]
    for test in REFUSAL_CONTROLS:
        assert f"{test}: " in section[1] and "batch_invariant" in section[1], (test, out[-3000:])


def test_the_table_reads_each_row_of_five_cells_naming_a_test_and_nothing_else(tmp_path):
    doc = tmp_path / "controls.md"
    doc.write_text(
        "# Controls\n\n"
        "| gate | control | kind | test | runs |\n"
        "|---|---|---|---|---|\n"
        "| speed | a 2x slowdown | known-worse | `tests_speed/test_compare.py::test_a` | default |\n"
        "  | counts | one more op |known-worse|`tests_speed/test_counts.py::test_b`| nightly:speed, per machine once "
        "recorded |\n"
        "| quality | a | b | `tests_quality/test_x.py::test_c` | gpu, after the build |\n"
        "| gate | prose | kind | `harness/gate.py` | default |\n"
        "| four | cells | `tests_x.py::t` | default\n"
        "| six | cells | kind | `tests_x.py::t` | default | extra |\n")
    assert controls.table(doc) == [
        {"gate": "speed", "control": "a 2x slowdown", "kind": "known-worse",
         "test": "tests_speed/test_compare.py::test_a",
         "runs": "default", "run": "default", "per_machine": False, "qualifier": ""},
        {"gate": "counts", "control": "one more op", "kind": "known-worse",
         "test": "tests_speed/test_counts.py::test_b",
         "runs": "nightly:speed, per machine once recorded", "run": "nightly:speed", "per_machine": True,
         "qualifier": "per machine once recorded"},
        {"gate": "quality", "control": "a", "kind": "b", "test": "tests_quality/test_x.py::test_c",
         "runs": "gpu, after the build", "run": "gpu", "per_machine": False, "qualifier": "after the build"},
    ]


def test_a_row_lists_its_test_its_parameters_or_exactly_the_one_parameter_it_names():
    whole = {"test": "tests_a.py::test_p"}
    one = {"test": "tests_a.py::test_q[cpu]"}
    rows = [whole, one]
    assert controls.row_of("tests_a.py::test_p", rows) is whole
    assert controls.row_of("tests_a.py::test_p[x-1]", rows) is whole
    assert controls.row_of("tests_a.py::test_q[cpu]", rows) is one
    assert [controls.row_of(n, rows) for n in ("tests_a.py::test_q[gpu]", "tests_a.py::test_q[cpu][x]",
                                               "tests_a.py::test_pp", "tests_a.py::test")] == [None] * 4


def test_a_failing_skip_names_the_row_the_reason_and_both_fixes():
    row = {"gate": "speed", "kind": "known-worse", "runs": "nightly:speed", "per_machine": False}
    assert controls.skip_is_a_failure(row, "no baseline", False) == (
        "a control listed in docs/controls.md (speed: known-worse, runs nightly:speed) skipped where it runs: no "
        "baseline. A control that does not run checks nothing: provide what it needs, or mark the row 'per machine "
        "once recorded' when its figures can only be recorded on each machine")
    assert controls.skip_is_a_failure(row, "not judged: no baseline", False) is not None, "not per machine"
    assert controls.skip_is_a_failure(row | {"per_machine": True}, "not applicable: x", True) is None
