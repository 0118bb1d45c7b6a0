"""docs/controls.md is true: every gate's controls listed there exist and run where the table says, every day.

The table's `runs` column names a run; each run is a selection that this test evaluates on the collected tests:
`default` (the default run: no slow, cuda, mps or real_weights mark), `ci` (the stage `.ci/run` runs after the
default run, on every change: its pytest line read from .ci/run), `nightly:slow` and `nightly:speed` (the nightly
workflow's jobs, their folders and -m expressions read from .github/workflows/nightly.yml), `gpu` (the gpu
workflow's -m expression). A listed test that is gone, or that the run no longer reaches, fails here.
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

DOC = REPO_ROOT / "docs" / "controls.md"
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CI = REPO_ROOT / ".ci" / "run"
NOT_DEFAULT = ("slow", "cuda", "mps", "real_weights")


def table() -> list:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3].startswith("`tests_"):
            rows.append({"gate": cells[0], "kind": cells[2], "test": cells[3].strip("`"), "runs": cells[4]})
    return rows


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
    # (folders, expression, whether slow tests run: --slow, or "slow" in the expression, as conftest.py decides)
    predicates = [(folders, Expression.compile(expr) if expr else None, slow or "slow" in (expr or ""))
                  for _, folders, expr, slow in calls]

    def selected(nodeid, marks):
        return any((not folders or nodeid.split("/")[0] in folders)
                   and (expr is None or expr.evaluate(lambda m, **_: m in marks))
                   and (slow or "slow" not in marks) for folders, expr, slow in predicates)

    return selected


def collected(request, files) -> dict:
    """{nodeid: mark names} of the tests in `files`: from this session where it collected them whole, else from a
    collection of those files alone (a run of a subset)."""
    items = {i.nodeid: {m.name for m in i.iter_markers()} for i in request.session.items}
    have = {n.split("::")[0] for n in items}
    if set(files) <= have and not request.config.getoption("markexpr") and not request.config.getoption("keyword"):
        return items
    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "-p", "tests_harness.marks_plugin", *sorted(set(files))],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("MARKS "):
            nodeid, _, marks = line[6:].rpartition(" ")  # a parameter id may hold spaces; mark names do not
            out[nodeid] = set(marks.split(",")) - {""}
    assert out, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_the_table_lists_a_control_of_each_kind_for_every_gate():
    rows = table()
    assert len(rows) >= 20, f"only {len(rows)} rows read from {DOC}"
    kinds = {}
    for row in rows:
        assert row["kind"] in ("equivalent", "worse"), row
        assert row["runs"] in ("default", "ci", "nightly:slow", "nightly:speed", "gpu"), row
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
        run = runs(row["runs"])
        if not any(run(n, marks) for n, marks in params.items()):
            marks = sorted(set().union(*params.values()))
            wrong.append(f"{row['test']}: {row['runs']} does not run it (marks: {marks})")
    assert not wrong, "docs/controls.md is out of date:\n  " + "\n  ".join(wrong)


def test_the_ci_stage_runs_exactly_the_tables_ci_rows(request):
    """`.ci/run`'s controls stage is the tests marked `control`: each is listed as `ci` (so its time is accounted
    for and its control documented), and each `ci` row is marked."""
    files = sorted(str(f.relative_to(REPO_ROOT)) for folder in ("tests_patches", "tests_harness", "tests_parity",
                                                                 "tests_quality") for f in (REPO_ROOT / folder).glob("test_*.py"))
    tests = collected(request, files)
    stage = runs("ci")
    selected = {n for n, marks in tests.items() if stage(n, marks)}
    listed = {r["test"] for r in table() if r["runs"] == "ci"}
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
