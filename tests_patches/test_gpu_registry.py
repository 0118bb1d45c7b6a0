"""The registry's GPU block: every GPU patch is inert on a CPU model and reverts exactly; patches replacing the
LLM forward refuse each other."""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath.gpu import compiled, flags, graphs
from fastpath.registry import COMPILED_LLM, PROCESS_GLOBAL
from harness.model.devices import llm_inputs

GPU_PATCHES = [n for n, p in fastpath.PATCHES.items() if p.devices == ("cuda",)]


# --- every GPU patch is inert on a CPU model, and reverts exactly ----------------------------------------------------


def submodule_state(model) -> dict:
    return {"llm": sorted(model.llm.__dict__), "tokenizer": sorted(model.audio_tokenizer.__dict__)}


@pytest.mark.cpu
@pytest.mark.parametrize("name", GPU_PATCHES)
def test_gpu_patch_is_inert_on_cpu_and_reverts(model, name):
    before = submodule_state(model)
    settings = flags.read()
    with fastpath.patched(model, name):
        with torch.inference_mode():
            model.llm(**llm_inputs(model))
            model.audio_tokenizer.decode(torch.randint(0, 1024, (1, 8, 5)))
        for attr in (graphs.GRAPHS_ATTR, compiled.LLM_ATTR, compiled.VOCODER_ATTR):
            wrapper = model.__dict__.get(attr)
            if wrapper is not None:
                assert wrapper.passthrough >= 1, f"{name} did not hand the CPU call to the stock code"
                assert getattr(wrapper, "compiled", None) is None, f"{name} compiled on CPU"
                assert len(getattr(wrapper, "cache", [])) == 0, f"{name} captured on CPU"
        assert flags.read() == settings, f"{name} changed process settings for a CPU model"
    assert submodule_state(model) == before


# --- conflicts and the registry's GPU block --------------------------------------------------------------------------


def test_gpu_patches_are_registered_as_tolerance_checked_cuda_patches():
    for name in GPU_PATCHES:
        patch = fastpath.PATCHES[name]
        assert not patch.lossless and patch.devices == ("cuda",), name
    assert set(GPU_PATCHES) == {"cuda_graphs", *COMPILED_LLM, "compiled_vocoder", "packed_cfg", "cuda_tf32"}
    assert set(PROCESS_GLOBAL) <= set(GPU_PATCHES)
    for name, patch in fastpath.PATCHES.items():  # conflicts are declared both ways
        for other in patch.conflicts:
            assert name in fastpath.PATCHES[other].conflicts, (name, other)


@pytest.mark.parametrize("first, second", [("cuda_graphs", "compiled_llm"),
                                           ("compiled_llm", "compiled_llm_max_autotune")])
def test_patches_replacing_the_llm_forward_refuse_each_other(model, first, second):
    with pytest.raises(fastpath.ConflictingPatchesError, match="revert one first"):
        fastpath.apply(model, [first, second])
    assert fastpath.applied(model) == [] and "forward" not in model.llm.__dict__, "a refused apply touched the model"
    with fastpath.patched(model, first):
        with pytest.raises(fastpath.ConflictingPatchesError):
            fastpath.apply(model, second)
        assert fastpath.applied(model) == [first]
