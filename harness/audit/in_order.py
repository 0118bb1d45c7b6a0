"""Runs the tests named on the command line in their files' order (a pytest plugin: `-p harness.audit.in_order`).

mutmut names each run's tests (its clean run, each mutant's run) from a set, so pytest gets them shuffled. pytest runs
them in the order named, and a module's fixtures (a model built, reference outputs generated) are torn down each time
the next test is in another module and built again when the run comes back (docs/mutants.md says what that cost).
"""

from __future__ import annotations

import pytest


def natural(item) -> tuple:
    """Where the test sits: its file, its line, then its parameters' places in their lists."""
    path, line, _ = item.location
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    return path, line or 0, tuple(sorted(indices.items()))


@pytest.hookimpl(tryfirst=True)  # before pytest's own reordering by higher-scoped parameters, which it keeps
def pytest_collection_modifyitems(items) -> None:
    items.sort(key=natural)
