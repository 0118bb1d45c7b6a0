"""docs/controls.md's table of every gate's controls, and the rule that a listed control never skips where it runs.

Each row names a test (a gate's known-equivalent or known-worse check) and the run that runs it: `default`, `ci`
(`.ci/run`'s controls stage), `nightly:slow`, `nightly:speed` or `gpu`. A row whose figures can only be recorded on
the machine they describe (a wall-time baseline, a ratio floor) says so: `nightly:speed, per machine once
recorded`; on a machine with nothing recorded it is "not judged" (harness.run.strict), never a quiet skip.

`skip_is_a_failure` is the rule conftest.py applies to every test's report: a listed control that runs here (not
left out by its run's selection: `slow` without --slow, `cuda` without a GPU, `real_weights` without a checkpoint)
and skips anyway fails in strict mode, naming the row, the reason and the fix; a skip that says "not applicable"
(harness.run.strict.not_applicable) is the one skip of a control that does not. tests_harness/test_controls.py
checks the table against the collected tests and the runs' command lines.
"""

from __future__ import annotations

from harness import REPO_ROOT

DOC = REPO_ROOT / "docs" / "controls.md"
RUNS = ("default", "ci", "nightly:slow", "nightly:speed", "gpu")
PER_MACHINE = "per machine once recorded"  # a run's qualifier: "nightly:speed, per machine once recorded"


def table(doc=DOC) -> list:
    """The rows: {gate, control, kind, test, runs, run, per_machine}."""
    rows = []
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3].startswith("`tests_"):
            run, _, qualifier = (part.strip() for part in cells[4].partition(","))
            rows.append({"gate": cells[0], "control": cells[1], "kind": cells[2], "test": cells[3].strip("`"),
                         "runs": cells[4], "run": run, "per_machine": qualifier == PER_MACHINE,
                         "qualifier": qualifier})
    return rows


def row_of(nodeid: str, rows: list) -> dict | None:
    """The row that lists this test (a parametrized one by its name, or one of its parameters exactly)."""
    for row in rows:
        if nodeid == row["test"] or (nodeid.startswith(row["test"] + "[") and "[" not in row["test"]):
            return row
    return None


def skip_is_a_failure(row: dict, reason: str, left_out: bool) -> str | None:
    """Why a listed control's skip fails the run, or None: a skip its run's selection made (`left_out`) is not the
    control's run; a control that cannot apply here by design ("not applicable": the installed omnivoice lacks the
    API it checks, or a patch it needs refuses this machine; harness.run.strict.not_applicable) is counted and named
    in the summary, never a failure; a per-machine control may be "not judged" on a machine with nothing recorded
    yet; any other skip hides a control that should have run."""
    from harness.run import strict

    if left_out or reason.startswith(strict.NA_PREFIX) or (row["per_machine"] and reason.startswith(strict.PREFIX)):
        return None
    return (f"a control listed in docs/controls.md ({row['gate']}: {row['kind']}, runs {row['runs']}) skipped where "
            f"it runs: {reason}. A control that does not run checks nothing: provide what it needs, or mark the "
            f"row '{PER_MACHINE}' when its figures can only be recorded on each machine")
