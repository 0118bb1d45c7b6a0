"""The shared-state guard (harness.audit.shared_state, conftest.py's shared_state_guard): what a patch must never change
is recorded before any test applies one, and every test that leaves it changed fails, naming the attribute, in
whatever order the tests run."""

from __future__ import annotations

import functools
import subprocess
import sys
import types

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


# --- torch.compile's own doing: its compile cache in an upstream module, its wrappers of a shared class ------------

SOURCE = "def doubled(x):\n    return torch.cat([x, x]) * 2\n"


def function_of(module):
    """A function of `module` (its globals are the module's, as for a function defined there) with a code object of
    its own: dynamo's cache for it starts empty whatever compiled before in this process."""
    code = next(c for c in compile(SOURCE, f"<{module.__name__}>", "exec").co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(code, vars(module), "doubled")


def compiled_call(fn, x):
    """torch.compile with the eager backend (the same backend object each call, so a second compile of `fn` hits
    dynamo's cache, whose code reads the globals the first one installed)."""
    return torch.compile(fn, backend="eager")(x)


@pytest.mark.parametrize("planted", [None, "planted_beside_the_compile"])
def test_a_compile_of_an_upstream_function_is_its_cache_not_a_leak(model, planted):
    """dynamo installs the names its compiled code reads (`__compiled_fn_*`, `__builtins_dict___N`, ...) in the
    globals of the module whose function it compiles (for compiled_vocoder, the codec's module, which the guard
    records): the guard neither reports nor deletes them, and a second compile (a cache hit) still works. A leak
    planted beside them is still reported and removed."""
    from torch._dynamo.utils import _cleanup_owners  # dynamo's record of the globals it installs

    module = sys.modules[type(model.audio_tokenizer).__module__]
    where = f"module {module.__name__}"
    record, fn, x = shared_state.take(model), function_of(module), torch.ones(2, 3)
    try:
        if planted:
            setattr(module, planted, 1)
        assert torch.equal(compiled_call(fn, x), fn(x))
        # what the compile installed, all in dynamo's record (but its aliases of modules it imports, which the guard
        # passes as it passes any import: `__import_torch_dot__dynamo_dot_utils`)
        added = sorted(name for name in set(vars(module)) - set(record.namespaces[where]) - {planted}
                       if not isinstance(getattr(module, name), types.ModuleType))
        owned = {name for key, name in dict(_cleanup_owners) if key == id(vars(module))}
        assert added and set(added) <= owned, (added, owned)
        reported, foreign = shared_state.changed(record), shared_state.foreign(record)
        shared_state.restore(record)
        assert torch.equal(compiled_call(fn, x), fn(x))  # a NameError when restore deleted the cache's names
        assert reported == ([f"{where}.{planted}"] if planted else []) and foreign == []
        assert set(added) <= set(vars(module)) and not hasattr(module, planted or "doubled")
    finally:
        if planted and hasattr(module, planted):
            delattr(module, planted)


def test_a_replacement_by_a_value_of_dynamos_is_still_a_replacement(model, monkeypatch):
    """`OmniVoice._generate_iterative = torch._dynamo.disable` rebinds what every model shares: reported, whatever
    module the new value comes from."""
    from omnivoice import OmniVoice

    record = shared_state.take(model)
    monkeypatch.setattr(OmniVoice, "_generate_iterative", torch._dynamo.disable)
    assert shared_state.changed(record) == ["class omnivoice.models.omnivoice.OmniVoice._generate_iterative"]
    shared_state.restore(record)
    assert OmniVoice._generate_iterative is record.namespaces[
        "class omnivoice.models.omnivoice.OmniVoice"]["_generate_iterative"]


# wrappers written as torch/_dynamo/mutation_guard.py writes its own (ensure_patched: functools.wraps around the
# original; install_generation_tagging_init: a closure over it), compiled as that file's code
WRAPPERS = """
def wraps(original):
    @functools.wraps(original)
    def custom_setattr(self, *args, **kwargs):
        return original(self, *args, **kwargs)
    return custom_setattr

def closes_over(original):
    def patched_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
    return patched_init
"""


def dynamo_style(kind: str, original, filename: str):
    scope = {"__name__": "torch._dynamo.mutation_guard", "functools": functools}
    exec(compile(WRAPPERS, filename, "exec"), scope)
    return scope[kind](original)


@pytest.mark.parametrize("kind, of_the_recorded_value, in_dynamos_file, exempt", [
    pytest.param("wraps", True, True, True, id="functools.wraps-of-the-recorded-value"),
    pytest.param("closes_over", True, True, True, id="closure-over-the-recorded-value"),
    pytest.param("closes_over", False, True, False, id="closure-over-another-value"),
    pytest.param("wraps", True, False, False, id="the-same-wrapper-defined-elsewhere"),
])
def test_only_dynamos_own_wrapper_of_the_recorded_value_is_exempt(model, monkeypatch, kind, of_the_recorded_value,
                                                                  in_dynamos_file, exempt):
    """A dynamo wrapper (code in torch/_dynamo/mutation_guard.py) around the value it replaces is torch's once-per-
    process doing: left as it is. A closure in that file over anything else, or the same wrapper written elsewhere,
    is a replacement: reported and put back."""
    import torch._dynamo.mutation_guard
    from omnivoice import OmniVoice

    record = shared_state.take(model)
    filename = torch._dynamo.mutation_guard.__file__ if in_dynamos_file else __file__
    wrapper = dynamo_style(kind, OmniVoice.generate if of_the_recorded_value else OmniVoice.__init__, filename)
    monkeypatch.setattr(OmniVoice, "generate", wrapper)
    assert shared_state.changed(record) == ([] if exempt else ["class omnivoice.models.omnivoice.OmniVoice.generate"])
    shared_state.restore(record)
    assert (OmniVoice.generate is wrapper) is exempt


def test_without_dynamos_record_an_added_module_global_says_it_could_not_be_told_apart(model, monkeypatch):
    """Another torch that keeps no record of its compile globals: an added module global is reported, and the report
    says why it could not be told from a compile cache entry (never a guess from the name)."""
    import omnivoice.models.omnivoice as upstream
    import torch._dynamo.utils  # noqa: F401  (dynamo loaded: a compile could have run)

    monkeypatch.setattr(shared_state, "DYNAMO_RECORD", ("torch._dynamo.utils", "_no_such_record"))
    record = shared_state.take(model)
    assert record.compiled is None
    try:
        upstream.__compiled_fn_planted = 1
        (line,) = shared_state.changed(record)
    finally:
        del upstream.__compiled_fn_planted
    assert line.startswith("module omnivoice.models.omnivoice.__compiled_fn_planted (added; ") and \
        "torch._dynamo.utils._no_such_record" in line and "cannot be told apart" in line, line
