"""Speed-tier fixtures: the full-size model, an injected slowdown for validating the gate, baseline paths."""

from __future__ import annotations

import pytest

from harness.model.checkpoint import load_model
from harness.speed.measure import slow_llm


@pytest.fixture(scope="session")
def full_model(full_checkpoint):
    return load_model(full_checkpoint)


@pytest.fixture
def slowdown(request):
    """With --inject-slowdown F, every LLM forward of a model passed to `slowdown(model)` takes (1 + F) x as long
    (`harness.speed.measure.slow_llm`); undone after the test."""
    fraction = request.config.getoption("inject_slowdown")
    handles = []

    def inject(model):
        if fraction:
            handles.extend(slow_llm(model, fraction))
        return model

    yield inject
    for handle in handles:
        handle.remove()
