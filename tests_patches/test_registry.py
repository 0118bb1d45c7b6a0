"""Meta-tests over the patch registry, and the errors bad input gets.

Every registered patch: documented, has a parity test, reverts to stock exactly, is idempotent, touches only
the instance. (Importing fastpath applies nothing and does not initialise CUDA: the wheel's test in
test_package.py. That a one-ulp change to any
lossless patch is caught: tests_parity/test_mutations.py.)
"""

from __future__ import annotations

import re

import pytest
import torch

import fastpath
from fastpath import fingerprints, registry
from fastpath.instance import WARNINGS_ATTR
from harness import REPO_ROOT
from harness.audit import shared_state
from harness.model.checkpoint import (
    CheckpointError,
    check_checkpoint_folder,
    resolve_checkpoint,
)
from harness.parity.parity import compare_runs, record_generation
from harness.run import strict
from tests_parity.test_bitexact import PATCH_SETS, POINTS

DEVICES = {"cpu", "cuda", "mps"}
POINT = dict(POINTS["batch_of_3"], num_step=8)  # every path of the loop at a quarter of the default 32 steps


def instance_state(model) -> dict:
    """What a patch may touch: the instance dict, and the LLM's attention implementation."""
    return {"keys": sorted(model.__dict__), "attn": model.llm.config._attn_implementation}


def class_state() -> dict:
    from omnivoice import OmniVoice

    return {k: v for k, v in vars(OmniVoice).items()}


def refused_here(model, name: str) -> None:
    """batch_invariant refuses a machine whose GEMM rows depend on the row count: check that (the model left as it
    was), then end the test as not applicable (harness.run.strict.refused_by_design)."""
    from fastpath import loop

    if name == "batch_invariant" and not loop.gemm_rows_independent(model):
        before = instance_state(model)
        with pytest.raises(loop.UnsupportedHereError, match="MKL_CBWR"):
            fastpath.apply(model, name)
        assert instance_state(model) == before and fastpath.applied(model) == []
        strict.not_applicable(f"{name} on this model", f"{name} refuses this machine by design: its GEMM rows "
                              f"depend on the row count (the refusal checked, the model left as it was)")


@pytest.fixture(scope="module")
def stock_run(model):
    return record_generation(model, seed=0, **POINT)


@pytest.mark.parametrize("name", list(fastpath.PATCHES))
def test_patch_is_registered_completely(name):
    patch = fastpath.PATCHES[name]
    assert patch.summary.strip(), f"{name} has no summary"
    assert set(patch.devices) <= DEVICES and patch.devices, f"{name} devices {patch.devices}"
    assert patch.relies_on, f"{name} declares no upstream functions"
    known = fingerprints.load_known()
    missing = [n for n in patch.relies_on if n not in known]
    assert not missing, f"{name} relies on {missing} without recorded fingerprints"
    if patch.lossless:
        assert (name,) in PATCH_SETS, f"lossless patch {name} has no bit-exact parity test"


def test_lossless_and_lossy_are_kept_apart(model):
    """What the docs call lossless is what the registry applies by default, and no lossy patch is on by default
    where bit-exactness is claimed (CPU, MPS)."""
    page = (REPO_ROOT / "docs" / "patches.md").read_text()
    # the registry table: | `name` | lossless | meant for (devices) | what it does |
    documented = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \| yes \| (?:cpu|cuda|mps)", page, re.M)}
    assert documented == set(fastpath.LOSSLESS), f"docs/patches.md's table says lossless: {sorted(documented)}"
    for device in ("cpu", "mps"):
        lossy = set(fastpath.defaults(device)) - set(fastpath.LOSSLESS)
        assert not lossy, f"lossy patches {sorted(lossy)} are on by default on {device}"
    try:
        assert fastpath.apply(model) == list(fastpath.LOSSLESS), "apply(model) applies more than the lossless set"
    finally:
        fastpath.revert(model)


@pytest.mark.cpu
@pytest.mark.parametrize("name", list(fastpath.PATCHES))
def test_revert_restores_stock_exactly(model, stock_run, name):
    refused_here(model, name)
    before_instance, before_class = instance_state(model), class_state()
    fastpath.apply(model, name)
    assert fastpath.applied(model) == [name]
    assert class_state() == before_class, f"{name} changed the OmniVoice class"
    assert instance_state(model) != before_instance, f"{name} applied but changed nothing on the instance"
    fastpath.revert(model, name)
    assert instance_state(model) == before_instance
    assert not compare_runs(stock_run, record_generation(model, seed=0, **POINT))


def bit_exact_on_cpu(name: str) -> bool:
    """Lossless patches, and GPU patches (inert off CUDA); batch_invariant has its own parity tests
    (tests_parity/test_batched.py)."""
    patch = fastpath.PATCHES[name]
    return patch.lossless or "cpu" not in patch.devices


@pytest.mark.cpu
@pytest.mark.parametrize("name", list(fastpath.PATCHES))
def test_apply_is_idempotent(model, stock_run, name):
    refused_here(model, name)
    fastpath.apply(model, name)
    once = instance_state(model)
    fastpath.apply(model, name)
    try:
        assert instance_state(model) == once and fastpath.applied(model) == [name]
        if bit_exact_on_cpu(name):
            assert not compare_runs(stock_run, record_generation(model, seed=0, **POINT))
    finally:
        fastpath.revert(model)
    fastpath.revert(model)  # reverting twice is harmless too
    assert fastpath.applied(model) == []


def test_patched_context_reverts_only_what_it_applied(model):
    fastpath.apply(model, "sliced_heads")
    try:
        with fastpath.patched(model, ["sliced_heads", "trimmed_cfg"]):
            assert set(fastpath.applied(model)) == {"sliced_heads", "trimmed_cfg"}
        assert fastpath.applied(model) == ["sliced_heads"]
    finally:
        fastpath.revert(model)


# The lean-import check (import fastpath imports no torch, leaves CUDA and the OmniVoice class alone) runs in the
# wheel's fresh interpreter: tests_patches/test_package.py.


# --- bad input -----------------------------------------------------------------------------------------


def test_apply_to_something_else_names_the_fix():
    with pytest.raises(fastpath.NotOmniVoiceError, match="OmniVoice.from_pretrained") as refused:
        fastpath.apply(torch.nn.Linear(2, 2))
    assert "got torch.nn.modules.linear.Linear." in str(refused.value)  # what it was given, by module and class


def test_unknown_patch_name_lists_the_registered_ones(model):
    with pytest.raises(fastpath.UnknownPatchError, match="trimmed_cfg"):
        fastpath.apply(model, "trimmed-cfg")
    assert fastpath.applied(model) == []


def test_names_default_to_the_lossless_set_and_take_one_name_or_several():
    assert registry._names(None) == list(fastpath.LOSSLESS)
    assert registry._names("sliced_heads") == ["sliced_heads"]
    assert registry._names(("sliced_heads", "trimmed_cfg")) == ["sliced_heads", "trimmed_cfg"]
    with pytest.raises(fastpath.UnknownPatchError) as unknown:
        registry._names(["sliced_heads", "trimmed-cfg"])
    assert str(unknown.value) == f"unknown patch(es) ['trimmed-cfg']; registered: {sorted(fastpath.PATCHES)}"


class Holder:  # what the registry's checks read of a model: its instance dict; and it can be weakly referenced
    pass


def test_conflicts_are_refused_naming_both_and_the_revert():
    model = Holder()
    registry._refuse_conflicts(model, ["compiled_llm", "compiled_vocoder", "cuda_tf32", "sliced_heads"])
    model.__dict__[registry.APPLIED_ATTR] = ["cuda_graphs"]
    with pytest.raises(fastpath.ConflictingPatchesError) as refused:
        registry._refuse_conflicts(model, ["sliced_heads", "compiled_llm"])
    assert str(refused.value) == ("patches 'cuda_graphs' and 'compiled_llm' both replace the same function and cannot "
                                  "be applied together; revert one first (fastpath.revert(model, 'cuda_graphs'))")


@pytest.mark.parametrize("doing", ["apply patches", "revert patches", "copy the model"])
def test_an_open_stream_refuses_what_would_change_its_model(doing):
    model = Holder()
    registry._refuse_while_streaming(model, doing)  # no stream: nothing said
    registry._open_streams[model] = "its job"
    try:
        with pytest.raises(fastpath.StreamBusyError) as refused:
            registry._refuse_while_streaming(model, doing)
    finally:
        del registry._open_streams[model]
    assert str(refused.value) == (
        f"cannot {doing} while a stream of this model is open (its worker is generating with the patches it started "
        f"with): let it finish, or close() / cancel() it first")


def test_the_tables_functions_import_their_module_at_the_call_and_are_named_by_what_they_call():
    """A table function's name (a Patch's repr shows it, and so does the shared-state guard's report of one left
    behind) is its target with its options."""
    call = registry._lazy("no_such_module_for_fastpath:apply", level=2)
    assert call.__qualname__ == "no_such_module_for_fastpath:apply(level=2)"
    with pytest.raises(ModuleNotFoundError, match="no_such_module_for_fastpath"):
        call(None)
    call = registry._lazy("builtins:sorted", key=abs, reverse=True)
    assert call([1, -3, 2]) == [-3, 2, 1]
    assert call.__qualname__ == f"builtins:sorted(key={abs!r}, reverse=True)"
    patch = fastpath.PATCHES["compiled_llm"]
    assert patch.apply.__qualname__ == "fastpath.gpu.compiled:compile_llm(mode='default')"
    assert patch.revert.__qualname__ == "fastpath.gpu.compiled:uncompile_llm()"
    assert "apply=<function fastpath.loop:enable(feature='trimmed_cfg') at " in repr(fastpath.PATCHES["trimmed_cfg"])


def test_relied_on_is_every_patchs_and_the_streams_names_sorted_once():
    names = registry.relied_on()
    assert names == sorted(set(names))
    assert set(registry.STREAM_RELIES_ON) <= set(names) and set(registry.LOOP_RELIES_ON) <= set(names)
    assert {"OmniVoice.create_voice_clone_prompt", "OmniVoice._prepare_embed_inputs"} <= set(names)
    assert set(names) == {n for p in fastpath.PATCHES.values() for n in p.relies_on} | set(registry.STREAM_RELIES_ON)


def test_missing_checkpoint_names_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist.*--checkpoint PATH"):
        resolve_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(CheckpointError, match="not an OmniVoice checkpoint"):
        check_checkpoint_folder(tmp_path)


def test_changed_upstream_function_refuses_to_apply(model, monkeypatch):
    """An upstream source that no known version had: refused, naming the function and versions; override works."""
    real = fingerprints.fingerprint
    monkeypatch.setattr(fingerprints, "fingerprint",
                        lambda name: "0" * 16 if name == "OmniVoice._generate_iterative" else real(name))
    with pytest.raises(fingerprints.UpstreamMismatchError) as err:
        fastpath.apply(model, "trimmed_cfg")
    message = str(err.value)
    assert "OmniVoice._generate_iterative" in message and fingerprints.omnivoice_version() in message
    assert "0.2.1" in message and "allow_unverified=True" in message
    assert fastpath.applied(model) == [], "a refused patch must leave the model untouched"
    fastpath.apply(model, "trimmed_cfg", allow_unverified=True)
    try:
        assert any("_generate_iterative" in w for w in model._fastpath_warnings)
    finally:
        fastpath.revert(model)


def test_fingerprint_ignores_formatting_but_not_behaviour():
    a = "def f(x):\n    '''doc'''\n    return x + 1  # comment\n"
    b = "def f(x):\n\n    return (x +\n            1)\n"
    c = "def f(x):\n    return x + 2\n"
    assert fingerprints.fingerprint_source(a) == fingerprints.fingerprint_source(b)
    assert fingerprints.fingerprint_source(a) != fingerprints.fingerprint_source(c)


SNIPPET = "class A:\n    def f(self, x, *a, y=1, **k):\n        'doc'\n        return [i async for i in x] if x else {**k, 'y': y}\n"


def test_fingerprint_is_the_same_on_every_python(monkeypatch):
    """Python 3.12 added an empty `type_params` field to every def and class, which changed `ast.dump` and made
    every recorded fingerprint 'unknown' on the H200's Python 3.12 (found on its first run). The canonical form
    omits empty fields: the snippet's value was computed on Pythons 3.11.7, 3.12.1 and 3.13.0 and is the same."""
    assert fingerprints.fingerprint_source(SNIPPET) == "1f6b28c430921985"
    import ast

    fields = ast.FunctionDef._fields  # play the other Python: add the field (3.11) or take it away (3.12+)
    other = tuple(f for f in fields if f != "type_params") if "type_params" in fields else fields + ("type_params",)
    before = ast.dump(ast.parse(SNIPPET))
    tree = ast.parse(SNIPPET)
    monkeypatch.setattr(ast.FunctionDef, "_fields", other)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and "type_params" in other:
            node.type_params = []
    assert ast.dump(tree) != before  # what the old fingerprint hashed
    assert fingerprints.canonical(tree) == fingerprints.canonical(ast.parse(SNIPPET))


# a value of FASTPATH_REVIEWED_UPSTREAM that is not a review, and what its error says is wrong
NOT_REVIEWS = [
    pytest.param("{not json", "Expecting property name", id="not-json"),
    pytest.param('{"functions": {}}', "'version'", id="no-version"),
    pytest.param('{"version": "0.2.1"}', "'functions'", id="no-functions"),
    pytest.param('{"version": "0.2.1", "functions": [1, 2]}', "cannot convert", id="functions-not-a-mapping"),
    pytest.param('{"version": "0.2.1", "functions": {"OmniVoice.generate": 1}}',
                 "names and fingerprints must be strings", id="fingerprint-not-a-string"),
]


@pytest.mark.parametrize("value, why", NOT_REVIEWS)
def test_a_review_that_is_not_one_is_refused_naming_its_format_and_the_fix(monkeypatch, value, why):
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, value)
    with pytest.raises(fingerprints.UpstreamMismatchError) as raised:
        fingerprints.reviewed()
    message = str(raised.value)
    assert message.startswith(f"{fingerprints.ENV_REVIEWED} is not a review of upstream fingerprints (") and \
        why in message, message
    assert '{"version": "X.Y.Z", "functions": {"Name": "fingerprint"}}' in message and \
        "fastpath.fingerprints.review_value" in message and "unset it to use fingerprints.json alone" in message


def test_a_review_reads_its_version_and_fingerprints_and_none_set_is_none(monkeypatch):
    monkeypatch.delenv(fingerprints.ENV_REVIEWED, raising=False)
    assert fingerprints.reviewed() == (None, {})
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, "  ")
    assert fingerprints.reviewed() == (None, {})
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, ' {"version": 3, "functions": {"OmniVoice.generate": "ab12"}} ')
    assert fingerprints.reviewed() == ("3", {"OmniVoice.generate": "ab12"})


@pytest.mark.cpu
def test_a_machine_whose_gemm_rows_depend_on_the_row_count(model, stock_run, monkeypatch):
    """Where a CPU GEMM row's bits depend on the call's row count (MKL's AVX2 kernels on Intel), batch_invariant
    refuses, leaving nothing applied, and the grouped layouts run the heads on every position. Run on every machine
    by making the probe say so."""
    from fastpath import loop

    monkeypatch.setattr(loop, "gemm_rows_independent", lambda model: False)
    before = instance_state(model)
    with pytest.raises(loop.UnsupportedHereError, match="MKL_CBWR"):
        fastpath.apply(model, list(fastpath.LOSSLESS) + ["batch_invariant"])
    assert instance_state(model) == before and fastpath.applied(model) == [], "a refused apply must undo the call"
    assert loop.effective_flags(model, loop.FEATURES) == set(loop.FEATURES) - {"sliced_heads"}
    assert loop.effective_flags(model, fastpath.LOSSLESS) == set(fastpath.LOSSLESS), "the packed layout probes itself"


@pytest.mark.cpu
def test_a_call_without_an_exact_row_count_runs_stocks_layout(model, stock_run, monkeypatch):
    """Where no row count of the packed forward gives stock's bits (loop.row_count is None), the stack runs stock's
    layout for that call, bit-exact, and says so. Run on every machine by making the probe say so."""
    from fastpath import loop

    monkeypatch.setattr(loop, "row_count", lambda *args: None)
    before = instance_state(model)
    with fastpath.patched(model):
        candidate = record_generation(model, seed=0, **POINT)
        assert loop.INEXACT_ROWS in model.__dict__[WARNINGS_ATTR]
    assert not compare_runs(stock_run, candidate)
    assert instance_state(model) == before


@pytest.fixture(scope="module")
def second_model(checkpoint):
    """A stock model beside the shared one (an A/B, a fallback in a server process)."""
    from harness.model.checkpoint import load_model

    return load_model(checkpoint)


SHORT = dict(POINTS["auto_voice"], num_step=2)


@pytest.fixture(scope="module")
def second_stock_run(second_model):
    return record_generation(second_model, seed=0, **SHORT)


@pytest.mark.cpu
@pytest.mark.parametrize("names", [[n] for n in fastpath.PATCHES] + [list(fastpath.LOSSLESS)],
                         ids=[*fastpath.PATCHES, "lossless-stack"])
def test_patches_touch_the_instance_only(model, second_model, second_stock_run, names, pristine):
    """Applying and reverting a patch (alone, and the lossless stack) changes no class and no module global a second
    model in the same process shares, and that stock model keeps running stock code while the other is patched.
    Compared with the record taken before any test applied a patch, so an earlier test's leak is not the baseline."""
    if names == ["batch_invariant"]:
        refused_here(model, "batch_invariant")
    assert not shared_state.changed(pristine) + shared_state.foreign(pristine), "shared state changed before the test"
    fastpath.apply(model, names)
    try:
        leaks = shared_state.changed(pristine) + shared_state.foreign(pristine)
        assert not leaks, f"{names} changed shared state: {leaks}"
        assert fastpath.applied(second_model) == []
        assert not compare_runs(second_stock_run, record_generation(second_model, seed=0, **SHORT)), (
            f"the stock model beside one patched with {names} no longer runs stock code")
    finally:
        fastpath.revert(model, names)
    leaks = shared_state.changed(pristine) + shared_state.foreign(pristine)
    assert not leaks, f"reverting {names} left shared state changed: {leaks}"


def test_a_patch_that_sets_its_method_on_the_class_is_caught(model, second_model, second_stock_run, monkeypatch,
                                                             pristine):
    """Known worse for the test above: a 'patch' that puts its loop on the class (here: one that also changes the
    tokens) is named as changed shared state, and the stock model beside it no longer runs stock code."""
    from omnivoice import OmniVoice

    upstream = OmniVoice._generate_iterative

    def on_the_class(self, task, gen_config):
        return [t.roll(1, dims=-1) for t in upstream(self, task, gen_config)]

    monkeypatch.setattr(OmniVoice, "_generate_iterative", on_the_class)
    assert shared_state.changed(pristine) == ["class omnivoice.models.omnivoice.OmniVoice._generate_iterative"]
    assert compare_runs(second_stock_run, record_generation(second_model, seed=0, **SHORT))
