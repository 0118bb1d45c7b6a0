"""Leaks as a stranger writes them (issue 61, item 1), for tests_patches/test_shared_state.py's child pytest; the
default run does not collect this file (its tests must fail). Each test leaves one kind of shared state changed and
puts nothing back; the shared-state guard must fail each one, naming its leak, and put it back, so that the last
test (a stock run, then the patches applied and reverted) passes in the same module and process.
"""

import os

import torch

import fastpath
from tests_parity.test_bitexact import POINTS

SHORT = dict(POINTS["auto_voice"], num_step=2)


def test_control_an_attribute_planted_on_omnivoice():
    from omnivoice import OmniVoice

    OmniVoice.planted_by_a_stranger = 1


def test_registers_fastpaths_padded_attention_as_sdpa():
    from transformers import AttentionInterface

    from fastpath.loop import padded_key_attention

    AttentionInterface.register("sdpa", padded_key_attention("sdpa"))


def test_replaces_torch_nn_functional_silu():
    torch.nn.functional.silu = lambda input, inplace=False: input * torch.sigmoid(input)


def test_replaces_torch_nn_functional_linear():
    original = torch.nn.functional.linear

    def linear(input, weight, bias=None):
        return original(input, weight, bias)

    torch.nn.functional.linear = linear


def test_sets_omnivoices_loop_to_dynamos_disable():
    from omnivoice import OmniVoice

    OmniVoice._generate_iterative = torch._dynamo.disable


def test_applies_fastpath_to_the_shared_model_and_never_reverts(model):
    fastpath.apply(model)
    assert fastpath.applied(model)


def test_leaves_the_blanket_override_set():
    os.environ["FASTPATH_ALLOW_UNVERIFIED_UPSTREAM"] = "1"


def test_after_them_the_shared_state_is_stock(model):
    """Not blamed: every leak above was put back, so the model is stock, the patches apply (no fingerprint refused),
    and a stock run and a patched run both generate."""
    from omnivoice import OmniVoice
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from harness.parity.parity import record_generation

    assert fastpath.applied(model) == [] and "FASTPATH_ALLOW_UNVERIFIED_UPSTREAM" not in os.environ
    assert not hasattr(OmniVoice, "planted_by_a_stranger")
    assert torch.nn.functional.silu.__module__ == "torch.nn.functional" and torch.nn.functional.linear is torch._C._nn.linear
    assert ALL_ATTENTION_FUNCTIONS["sdpa"].__module__ == "transformers.integrations.sdpa_attention"
    stock = record_generation(model, seed=0, **SHORT)
    with fastpath.patched(model):
        patched = record_generation(model, seed=0, **SHORT)
    assert stock.tokens and patched.tokens and fastpath.applied(model) == []
