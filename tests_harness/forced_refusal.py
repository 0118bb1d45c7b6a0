"""Planted for tests_harness/test_controls.py, loaded only by its child pytest (`-p tests_harness.forced_refusal`): this
machine as an AVX2-only Intel runner computes, where MKL's GEMM gives a row other bits when the call has another
number of rows, so batch_invariant refuses to apply by design (fastpath.loop.gemm_rows_independent is False)."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    from fastpath import loop

    loop.gemm_rows_independent = lambda model: False
