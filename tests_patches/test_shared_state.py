"""The shared-state guard (harness.audit.shared_state, conftest.py's shared_state_guard): what a patch must never change
is recorded before any test applies one, and every test that leaves it changed fails, naming the attribute, in
whatever order the tests run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import fastpath
from harness import REPO_ROOT
from harness.audit import shared_state

CHILD = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-p", "tests_patches.planted_leaks",
         "tests_patches/planted_leaks.py", "tests_patches/test_registry.py",
         "-k", "planted_leaks or (leaky and (idempotent or instance_only))"]


def run_planted(folder):
    """The planted defects (tests_patches/planted_leaks.py) in a child pytest, in the default run's order: the
    leaky patch applied by test_apply_is_idempotent before test_patches_touch_the_instance_only runs."""
    return subprocess.run(CHILD, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)  # a hang guard


@pytest.mark.early.with_args(run_planted)
def test_a_class_level_enable_with_an_instance_only_revert_fails_the_run(early):
    """Known worse, in the real order: the test that applied the leaky patch first fails at its end, naming the
    class attribute, and the instance-only test fails too; so do the tests that leave a torch setting or a fastpath
    function in an upstream module behind. (Before the guard, the leaky pair passed: the class was already patched
    when the instance-only test took its own 'before'.)"""
    out = early.stdout + early.stderr
    assert early.returncode == 1, out[-3000:]
    attribute = "class omnivoice.models.omnivoice.OmniVoice._generate_iterative"
    expected = {
        "ERROR tests_patches/test_registry.py::test_apply_is_idempotent[leaky]": attribute,
        "FAILED tests_patches/test_registry.py::test_patches_touch_the_instance_only[leaky]": attribute,
        "ERROR tests_patches/planted_leaks.py::test_leaves_a_torch_setting_changed":
            "torch.backends.cuda.matmul.allow_tf32: False -> True",
        "ERROR tests_patches/planted_leaks.py::test_leaves_a_fastpath_function_in_an_upstream_module":
            "module omnivoice.models.omnivoice.planted_loop is fastpath's apply",
    }
    for line, named in expected.items():
        assert line in out, f"{line!r} not reported:\n{out[-3000:]}"
        assert named in out, f"{named!r} not named:\n{out[-3000:]}"


def test_a_fastpath_object_in_an_upstream_namespace_is_found_whatever_the_order(model, monkeypatch):
    """An object of fastpath's put on an upstream class before the record was taken is in the record, so a
    comparison with the record cannot see it; the scan for fastpath's objects finds it all the same."""
    from omnivoice import OmniVoice

    monkeypatch.setattr(OmniVoice, "_generate_iterative", fastpath.apply, raising=True)
    record = shared_state.take(model)
    assert shared_state.changed(record) == []
    assert shared_state.foreign(record) == ["class omnivoice.models.omnivoice.OmniVoice._generate_iterative is "
                                            "fastpath's apply"]


def test_changes_are_named_and_put_back(model, pristine):
    import omnivoice.models.omnivoice as upstream
    from omnivoice import OmniVoice

    record = shared_state.take(model)
    original, threads = OmniVoice.generate, torch.get_num_threads()
    try:
        OmniVoice.generate = lambda self, **kwargs: None
        upstream.planted = 1
        del upstream._get_time_steps
        torch.set_num_threads(threads + 1)
        assert shared_state.changed(record) == [
            "class omnivoice.models.omnivoice.OmniVoice.generate", "module omnivoice.models.omnivoice._get_time_steps",
            "module omnivoice.models.omnivoice.planted", f"torch.get_num_threads(): {threads} -> {threads + 1}"]
        shared_state.restore(record)
        assert shared_state.changed(record) == [] and OmniVoice.generate is original
        assert not hasattr(upstream, "planted") and torch.get_num_threads() == threads
    finally:
        OmniVoice.generate = original
        torch.set_num_threads(threads)
        if not hasattr(upstream, "_get_time_steps"):
            upstream._get_time_steps = pristine.namespaces["module omnivoice.models.omnivoice"]["_get_time_steps"]
    assert shared_state.changed(pristine) == []
