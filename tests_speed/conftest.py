"""Speed-tier fixtures: the full-size model, an injected slowdown for validating the gate, baseline paths."""

from __future__ import annotations

import time

import pytest

from fastpath import instance
from harness.checkpoint import load_model


@pytest.fixture(scope="session")
def full_model(full_checkpoint):
    return load_model(full_checkpoint)


@pytest.fixture
def slowdown(request):
    """With --inject-slowdown F, every LLM forward of a model passed to `slowdown(model)` takes (1 + F) x as long."""
    fraction = request.config.getoption("inject_slowdown")
    undo = []

    def inject(model):
        if not fraction:
            return model
        real = model.llm.forward

        def slowed(*args, **kwargs):
            start = time.perf_counter()
            out = real(*args, **kwargs)
            time.sleep(fraction * (time.perf_counter() - start))
            return out

        instance.install(model.llm, "forward", slowed)
        undo.append(model)
        return model

    yield inject
    for model in undo:
        instance.restore(model.llm, "forward")
