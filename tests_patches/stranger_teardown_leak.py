"""A leak made in a module-scoped fixture's teardown, for tests_patches/test_shared_state.py's child pytest (not
collected by the default run): its one test passes, and the leak happens after it, when the module's fixtures are
torn down (on the session's, or an xdist worker's, last module: after the last per-test check). It must be reported
at the session's end, and the run must exit non-zero."""

import os

import pytest


@pytest.fixture(scope="module")
def leaky_at_teardown():
    yield
    import torch

    torch.nn.functional.gelu = lambda input, approximate="none": input  # left replaced
    os.environ["OMP_NUM_THREADS"] = "1"  # left set


def test_passes_and_its_fixture_leaks_afterwards(leaky_at_teardown):
    pass
