"""Composition: after any sequence of applies and reverts of any patches, the model generates bit for bit what a
fresh model with only the patches still applied generates, and a full revert leaves nothing behind.

Random sequences from hypothesis's stateful testing (seeded by hypothesis's database-free derandomised run, so a
rerun draws the same sequences). Every registered patch takes part: the GPU ones are inert on a CPU model, pairs
that replace the same function must be refused without touching the model, and so must batch_invariant on a
machine whose GEMM rows depend on the row count.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

import fastpath
from fastpath import instance, loop
from harness.checkpoint import load_model
from harness.parity import compare_runs, record_generation

POINT = dict(text=["Hi there.", "Medium length words here."], language="en", num_step=3)  # two items: every path
NAMES = sorted(fastpath.PATCHES)
REFUSALS = (fastpath.ConflictingPatchesError, loop.UnsupportedHereError)


def own_state(model) -> dict:
    """What patches may change: the instance dicts of the model and the submodules patches touch, and the LLM's
    attention implementation."""
    parts = {"model": model, "llm": model.llm, "tokenizer": model.audio_tokenizer}
    return {"dicts": {k: dict(vars(m)) for k, m in parts.items()}, "attn": model.llm.config._attn_implementation,
            "remembered": [instance._saved.get(m) for m in parts.values()]}


def same_state(a: dict, b: dict) -> bool:
    return (a["attn"] == b["attn"] and a["remembered"] == b["remembered"]
            and all(a["dicts"][k].keys() == b["dicts"][k].keys()
                    and all(a["dicts"][k][n] is b["dicts"][k][n] for n in a["dicts"][k]) for k in a["dicts"]))


@pytest.fixture(scope="module")
def fresh(checkpoint):
    return load_model(checkpoint)


@pytest.mark.cpu
def test_any_sequence_of_applies_and_reverts_composes(model, fresh):
    pristine = own_state(model)

    class Sequences(RuleBasedStateMachine):
        @rule(names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        def apply(self, names):
            before, state = fastpath.applied(model), own_state(model)
            try:
                fastpath.apply(model, names)
            except REFUSALS:
                assert fastpath.applied(model) == before and same_state(own_state(model), state), \
                    f"a refused apply of {names} changed the model"

        @precondition(lambda self: fastpath.applied(model))
        @rule(data=st.data())
        def revert(self, data):
            applied = fastpath.applied(model)
            names = data.draw(st.lists(st.sampled_from(applied), min_size=1, unique=True))
            assert fastpath.revert(model, names) == [n for n in applied if n not in names]

        def teardown(self):
            try:
                still = fastpath.applied(model)
                ours = record_generation(model, seed=0, **POINT)
                with fastpath.patched(fresh, sorted(still)):
                    theirs = record_generation(fresh, seed=0, **POINT)
                problems = compare_runs(theirs, ours)
                assert not problems, f"after the sequence, {still} differs from a fresh model with them:\n  " + \
                    "\n  ".join(problems[:4])
            finally:
                fastpath.revert(model)
            assert same_state(own_state(model), pristine), "a full revert left something behind"

    run_state_machine_as_test(Sequences, settings=settings(
        max_examples=8, stateful_step_count=6, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck)))
