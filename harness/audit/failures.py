"""Writes the id of each test that fails to a file (a pytest plugin: `-p harness.audit.failures`; the file is named by
FASTPATH_FAILURES, nothing is written without it).

mutmut runs the tests on the unmutated code first (its stats run, then a clean run), inside its own process, and when
one fails it prints only "failed to collect stats" after its spinner. `audit mutants` gives mutmut's pytest this plugin
and names the tests in this file when mutmut stops before running a mutant.
"""

from __future__ import annotations

import os

ENV = "FASTPATH_FAILURES"


# mutmut's runs of the unmutated code: "stats", and "" for its clean run (unset outside mutmut). A mutant's run (its
# name), and mutmut's check that a forced failure fails ("fail"), fail tests on purpose: not recorded
UNMUTATED = ("", "stats")


def _write(nodeid: str, when: str) -> None:
    path = os.environ.get(ENV)
    if path and os.environ.get("MUTANT_UNDER_TEST", "") in UNMUTATED:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{nodeid} ({when})\n")


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        _write(report.nodeid, report.when)


def pytest_collectreport(report) -> None:
    if report.failed:
        _write(report.nodeid or "(the test selection)", "collection")
