"""Credits the calls a test's child processes make to that test in mutmut's stats run (a pytest plugin:
`-p harness.audit.child_calls`).

mutmut picks a mutant's tests from its stats run: each test, the functions it called. A test that starts a child
(`python -m fastpath`, a gate run, a bisect probe) called its functions in another process, where mutmut's record is
lost, and the mutants of those functions were "no tests" even where such a test would catch them. In the stats run
this plugin names a file in the environment (FASTPATH_MUTANT_CALLS); the work folder's sitecustomize (mutants.py's
STATS_CHILD) makes a child append each function it calls there; after each test the plugin adds them to the test's
calls. In a mutant's run the child inherits the mutant, so the test judges it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ENV = "FASTPATH_MUTANT_CALLS"


def _stats_run() -> bool:
    from mutmut.mutation.trampoline import get_mutant_under_test

    return get_mutant_under_test() == "stats"


def pytest_configure(config) -> None:
    if _stats_run() and ENV not in os.environ:
        fd, name = tempfile.mkstemp(prefix="mutant-calls-", suffix=".txt")
        os.close(fd)
        os.environ[ENV] = name
        config.add_cleanup(lambda: (Path(name).unlink(missing_ok=True), os.environ.pop(ENV, None)))


@pytest.hookimpl(tryfirst=True)  # before mutmut's collector hands the calls seen so far to this test
def pytest_runtest_teardown(item, nextitem) -> None:
    name = os.environ.get(ENV)
    if not name or not _stats_run():
        return
    path = Path(name)
    calls = set(path.read_text().split()) if path.exists() else set()
    if calls:
        from mutmut.state import state

        state()._stats.update(calls)
        path.write_text("")
