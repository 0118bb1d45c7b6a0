"""Planted defects for tests_patches/test_shared_state.py, loaded only by its child pytest
(`-p tests_patches.planted_leaks tests_patches/planted_leaks.py ...`; the default run does not collect this file).

- A patch `leaky` whose enable puts its loop on the OmniVoice class and whose revert clears only the instance. The
  loop is one object, so applying it again rebinds the class to the same function: a test that takes its own
  "before" after an earlier test applied it sees nothing change.
- Two tests that leave shared state changed: a torch setting, and a fastpath function added to an upstream module.
"""

import fastpath
from fastpath import registry

UPSTREAM = []


def loop(self, task, gen_config):
    return UPSTREAM[0](self, task, gen_config)


def enable(model):
    from omnivoice import OmniVoice

    if not UPSTREAM:
        UPSTREAM.append(OmniVoice._generate_iterative)
    OmniVoice._generate_iterative = loop  # the defect: the class, which every model shares
    model.__dict__["_generate_iterative"] = loop.__get__(model)


def disable(model):
    model.__dict__.pop("_generate_iterative", None)  # the instance only


def pytest_configure(config):
    registry.PATCHES["leaky"] = registry.Patch("leaky", True, ("cpu",), (), "planted: enables on the class",
                                               enable, disable)


def test_leaves_a_torch_setting_changed():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32


def test_leaves_a_fastpath_function_in_an_upstream_module():
    import omnivoice.models.omnivoice as upstream

    upstream.planted_loop = fastpath.apply
