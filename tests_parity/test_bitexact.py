"""CPU fp32: every lossless patch, alone and stacked, is bit-exact against stock OmniVoice.

Compared per run: the conditional and unconditional logits at the positions the sampler reads at every step,
the predicted tokens and scores, the final tokens, and the waveform (`torch.equal`; a failure says how many
elements differ, by how much and where). Default generation settings (32 steps, position_temperature 5.0, which
draws random numbers), reseeded right before each run.
"""

from __future__ import annotations

import pytest
import torch

import fastpath
from harness.model.checkpoint import load_model
from harness.run import strict
from harness.parity.parity import (
    POINTS,
    PointUnsupported,
    compare_runs,
    record_generation,
    resolve_point,
)

# every lossless patch alone, then the whole lossless stack (the GPU tier's lossy patches are inert on CPU: checked
# bit-exact there by tests_patches/test_registry.py and test_gpu_registry.py, and against stock with tolerances by
# test_gpu_parity on CUDA)
PATCH_SETS = [(name,) for name in fastpath.LOSSLESS] + [tuple(fastpath.LOSSLESS)]
# The stack runs at every point but SLOW_POINTS in the default run; each patch alone at these four (auto voice, voice clone, a
# mixed batch, a one-word target that takes the small-GEMM path) and at the other six under --slow, to keep the
# default run within its time budget (README, "Running the suite").
SINGLE_PATCH_POINTS = ("auto_voice", "voice_clone_audio", "batch_of_3", "one_word")
# long_chunked (a 40 s paragraph at 32 steps, 9 to 18 s) under --slow too: in the default run upstream's chunked path
# with the stack is checked bit for bit per chunk by tests_parity/test_stream.py (the same _generate_chunked calls)
SLOW_POINTS = ("long_chunked",)


def cases():
    for point in POINTS:
        for patches in PATCH_SETS:
            alone_elsewhere = len(patches) == 1 and point not in SINGLE_PATCH_POINTS
            yield pytest.param(point, patches, id=f"{point}-{'+'.join(patches)}",
                               marks=[pytest.mark.slow] if alone_elsewhere or point in SLOW_POINTS else [])


@pytest.fixture(scope="module")
def stock_runs(model, tmp_path_factory):
    """Stock runs first (unpatched model), one per operating point, seed 0."""
    assert fastpath.applied(model) == []
    cache = {}

    def get(name):
        if name not in cache:
            try:
                kwargs = resolve_point(model, POINTS[name], tmp_path_factory)
            except PointUnsupported as err:  # an older omnivoice under the upstream gate: not a missing input
                strict.not_applicable(f"the {name} point", str(err))
            cache[name] = (kwargs, record_generation(model, seed=0, **kwargs))
        return cache[name]

    return get


@pytest.mark.cpu
@pytest.mark.parametrize(("point", "patches"), cases())
def test_lossless_patch_is_bit_exact(model, stock_runs, point, patches):
    kwargs, stock = stock_runs(point)
    assert stock.steps and stock.tokens and stock.waveforms, "the stock run recorded nothing"
    with fastpath.patched(model, list(patches)):
        candidate = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, candidate)
    assert not problems, f"{'+'.join(patches)} on {point} is not bit-exact:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_loop_with_no_switch_is_stock(model, stock_runs):
    """The reimplemented unmasking loop itself, all switches off, equals upstream's."""
    from fastpath import loop

    kwargs, stock = stock_runs("batch_of_3")
    model.__dict__["_generate_iterative"] = lambda task, cfg: loop.generate_iterative(model, task, cfg)
    try:
        candidate = record_generation(model, seed=0, **kwargs)
    finally:
        del model.__dict__["_generate_iterative"]
    assert not compare_runs(stock, candidate)


@pytest.mark.cpu
def test_stock_is_deterministic_under_reseed(model, stock_runs):
    """Parity compares runs; that only means something if stock repeats itself exactly."""
    kwargs, stock = stock_runs("auto_voice")
    again = record_generation(model, seed=0, **kwargs)
    assert not compare_runs(stock, again)
    other_seed = record_generation(model, seed=1, **kwargs)
    assert compare_runs(stock, other_seed), "a different seed gave identical output: the seed is not used"


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("point", ["voice_clone_audio", "batch_of_3"])
def test_full_size_stack_is_bit_exact(full_checkpoint, point, tmp_path_factory):
    """The same check on the full-size model (Qwen3-0.6B dimensions): other GEMM and SDPA blockings."""
    model = load_model(full_checkpoint)
    kwargs = resolve_point(model, POINTS[point], tmp_path_factory)
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model):
        candidate = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, candidate)
    assert not problems, f"lossless stack on full-size {point}:\n  " + "\n  ".join(problems)


def test_tiny_checkpoint_sees_target_lengths_that_stress_kernels(model):
    """The points must include a short target (< 2 query blocks) so the small-GEMM path is exercised."""
    lens = []
    for name in ("one_word", "batch_of_3"):
        task = model._preprocess_all(**{k: v for k, v in POINTS[name].items() if k in ("text", "language")})
        lens += task.target_lens
    assert min(lens) < 40, f"shortest target is {min(lens)} frames; add a shorter text to POINTS"
    assert len(set(lens)) > 1, f"all targets are {lens[0]} frames: the mixed batch has no second length"


# (patch, position temperature): the points above sample at upstream's default (5.0); these are the other sides of
# upstream's `position_temperature > 0` switch, through each of the loop's two unmasking paths
TEMPERATURES = [
    pytest.param("trimmed_cfg", 0.0, id="per-item-no-noise"),  # upstream's per-item scoring: no noise at 0
    pytest.param("trimmed_cfg", 0.5, id="per-item-mild-noise"),  # noise below 1 is still noise, on both paths
    pytest.param("batched_scoring", 0.5, id="batched-mild-noise"),
]


@pytest.mark.cpu
@pytest.mark.parametrize("patch, temperature", TEMPERATURES)
def test_position_temperatures_other_than_the_default_are_stock(model, patch, temperature):
    kwargs = dict(text="No noise on the positions.", language="en", num_step=4, position_temperature=temperature)
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model, [patch]):
        candidate = record_generation(model, seed=0, **kwargs)
    assert stock.steps and stock.tokens, "the stock run recorded nothing"
    problems = compare_runs(stock, candidate)
    assert not problems, f"{patch} at position_temperature {temperature} is not bit-exact:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_an_item_with_nothing_left_to_unmask_leaves_the_next_items_stock(model):
    """A target of a few frames runs out of masked tokens before the last step (k = 0 at the steps after it), while
    the item after it still unmasks at those steps. Upstream skips such an item at that step (no scoring, no random
    draw) and goes on to the next: the per-item path must too, with position noise on, bit for bit."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    from fastpath.loop import unmasking_schedules

    kwargs = dict(text=["Hi.", "The item after it is a whole sentence long."], language="en", duration=[0.2, None])
    task, defaults = model._preprocess_all(**kwargs), OmniVoiceGenerationConfig()  # generate's defaults
    schedules = unmasking_schedules(task.target_lens, defaults, model.config.num_audio_codebook)
    idle = [step for step, k in enumerate(schedules[0]) if k == 0]
    assert idle and all(schedules[1][step] > 0 for step in idle), (task.target_lens, schedules)  # the case is there
    assert defaults.position_temperature > 0  # each unmasked item draws noise
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model, ["trimmed_cfg"]):
        candidate = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, candidate)
    assert not problems, "an item with nothing to unmask changed the next:\n  " + "\n  ".join(problems)
