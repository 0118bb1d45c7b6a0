"""Composition: after any sequence of applies and reverts of any patches, the model generates bit for bit what a
fresh model with only the patches still applied generates, and a full revert leaves nothing behind.

By construction first, where the interactions that break real code live (one patch's revert removing state another
applied patch still needs; two patches sharing an instance attribute, the loop or the attention implementation):
every ordered pair of registered patches (apply A, apply B, revert A or B, generate; then revert both), and every
triple of the default stack with two other patches of which one acts on a CPU model (apply the stack, A, B; revert
one of the three, generate; then revert all). Then random sequences from hypothesis's stateful testing on top (derandomised, so a rerun draws
the same sequences; more of them under --slow). Every registered patch takes part: the GPU ones are inert on a CPU
model, pairs that replace the same function must be refused without touching the model, and so must
batch_invariant on a machine whose GEMM rows depend on the row count. References (a fresh model with what is
still applied) are generated once per set of patches and shared.
"""

from __future__ import annotations

import pytest
import torch
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
from fastpath.instance import overridden
from harness.model.checkpoint import load_model
from harness.parity.parity import compare_runs, record_generation

POINT = dict(text=["Hi.", "Two words."], language="en", num_step=2)  # two items of two lengths, two steps: every path
NAMES = sorted(fastpath.PATCHES)
REFUSALS = (fastpath.ConflictingPatchesError, loop.UnsupportedHereError)
STACK = "defaults(cpu)"  # the default stack on the test's CPU model, applied as one

CI = [pytest.mark.slow, pytest.mark.control]  # beyond the default run's budget: .ci/run's controls stage, every change


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


def tokens_as_audio(decode):
    """In place of `_decode_and_post_process(tokens, rms, gen_config)`: the tokens themselves. Decoding was half of
    each sequence's time, and no patch changes it on a CPU model (compiled_vocoder is inert there, bit-exact with
    stock by tests_patches/test_gpu_registry.py): the comparison is of every step's logits and the tokens."""
    def skip(tokens, *args, **kwargs):
        return (torch.cat(tokens, dim=-1) if isinstance(tokens, list) else tokens).cpu().numpy()

    return skip


def generation(model):
    with overridden(model, "_decode_and_post_process", tokens_as_audio):
        return record_generation(model, seed=0, **POINT)


class References:
    """A fresh model's run with exactly a set of patches applied, generated once per set."""

    def __init__(self, model):
        self.model, self.runs = model, {}

    def __call__(self, names) -> object:
        key = frozenset(names)
        if key not in self.runs:
            with fastpath.patched(self.model, sorted(key)):
                self.runs[key] = generation(self.model)
        return self.runs[key]


@pytest.fixture(scope="module")
def references(fresh):
    return References(fresh)


def names_of(step) -> list:
    return fastpath.defaults("cpu") if step == STACK else [step]


def run_sequence(model, references, applies, reverted) -> list:
    """Apply each of `applies` in order (a refused apply must change nothing; the sequence goes on without it), revert
    `reverted`, generate and compare with a fresh model carrying what is still applied; then revert all and check
    that nothing is left. Returns the problems (empty: composes)."""
    pristine = own_state(model)
    problems = []
    try:
        problems += apply_revert_generate(model, references, applies, reverted)
    except Exception as err:  # noqa: BLE001 - named with its sequence, and the next sequences still run
        problems.append(f"raised {type(err).__name__}: {str(err)[:200]}")
    finally:
        fastpath.revert(model)
    if not same_state(own_state(model), pristine):
        problems.append("the full revert left something behind")
    return problems


def apply_revert_generate(model, references, applies, reverted) -> list:
    done = []
    for step in applies:
        before, state = fastpath.applied(model), own_state(model)
        try:
            fastpath.apply(model, names_of(step))
            done.append(step)
        except REFUSALS:  # refused (conflict, or not exact on this machine): nothing changed, the sequence goes on
            if fastpath.applied(model) != before or not same_state(own_state(model), state):
                return [f"the refused apply of {step} changed the model"]
    still = fastpath.revert(model, names_of(reverted))
    expected = [n for n in dict.fromkeys(n for s in done for n in names_of(s)) if n not in names_of(reverted)]
    if still != expected:
        return [f"revert({reverted}) left {still}, expected {expected}"]
    diff = compare_runs(references(still), generation(model))
    return [f"with {still} still applied it differs from a fresh model with them: {diff[:2]}"] if diff else []


PAIRS = [(a, b) for a in NAMES for b in NAMES if a != b]
OTHERS = [n for n in NAMES if n not in fastpath.defaults("cpu")]
# stack + A + B where A or B acts on a CPU model; two patches inert here (the CUDA ones) with the stack change only
# the registry's bookkeeping, which every ordered pair (nightly) and the random sequences (every run) cover
ACTS_HERE = {n for n in NAMES if "cpu" in fastpath.PATCHES[n].devices}
TRIPLES = [(a, b) for i, a in enumerate(OTHERS) for b in OTHERS[i + 1:] if {a, b} & ACTS_HERE]


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.control
def test_every_ordered_pair_composes(model, references):
    """156 ordered pairs x which one is reverted: 312 sequences, each generated and compared bit for bit. About 25 s
    of a fresh clone's default run, beyond its budget: every night (the nightly slow job); the default run keeps
    the default stack with every two other patches and the random sequences."""
    problems = [f"apply {a}, apply {b}, revert {r}: {p}" for a, b in PAIRS for r in (a, b)
                for p in run_sequence(model, references, (a, b), r)]
    assert not problems, f"{len(problems)} problems:\n  " + "\n  ".join(problems[:12])


@pytest.mark.cpu
@pytest.mark.slow  # about 30 s: beyond the default run's budget; .ci/run's controls stage runs it on every change
@pytest.mark.control
def test_every_triple_with_the_default_stack_composes(model, references):
    """The stack, then A, then B (A, B two patches outside it): revert one of the three, generate, compare."""
    problems = [f"apply the stack, {a}, {b}, revert {r}: {p}" for a, b in TRIPLES for r in (STACK, a, b)
                for p in run_sequence(model, references, (STACK, a, b), r)]
    assert not problems, f"{len(problems)} problems:\n  " + "\n  ".join(problems[:12])


@pytest.mark.cpu
@pytest.mark.parametrize("examples", [pytest.param(8, id="8", marks=CI), pytest.param(64, id="64", marks=pytest.mark.slow)])
def test_any_sequence_of_applies_and_reverts_composes(model, references, examples):
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
                problems = compare_runs(references(still), generation(model))
                assert not problems, f"after the sequence, {still} differs from a fresh model with them:\n  " + \
                    "\n  ".join(problems[:4])
            finally:
                fastpath.revert(model)
            assert same_state(own_state(model), pristine), "a full revert left something behind"

    run_state_machine_as_test(Sequences, settings=settings(
        max_examples=examples, stateful_step_count=6, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck)))
