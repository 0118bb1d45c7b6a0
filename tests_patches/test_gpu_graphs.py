"""The CUDA-graph wrapper (fastpath/gpu/graphs.py) with a capture double, on the CPU."""

from __future__ import annotations

import pytest
import torch

from fastpath.gpu import graphs
from fastpath.gpu.shapes import Buckets
from harness import tolerance
from harness.devices import llm_inputs
from harness.parity import record_generation

POINT = dict(text=["Hi there.", "This sentence is a little bit longer than the first one."], language="en", num_step=4)


# --- the CUDA-graph wrapper, with a capture double on CPU ------------------------------------------------------------


class FakeGraph:
    """What capture returns: replay() reruns the captured function into the same static output (as a graph does)."""

    def __init__(self, run, hidden):
        self.run, self.hidden, self.replays = run, hidden, 0

    def replay(self):
        self.replays += 1
        self.hidden.copy_(self.run())


def fake_capture(run, pool):
    out = run()
    with torch.inference_mode(False), torch.no_grad():
        hidden = torch.empty_like(out)  # an ordinary tensor, as the graph's own memory is to replay
    hidden.copy_(out)
    return FakeGraph(run, hidden), hidden


@pytest.fixture
def graphed(model):
    g = graphs.install(model, buckets=Buckets(64), max_graphs=2, devices=("cpu",), capture=fake_capture)
    try:
        yield g
    finally:
        graphs.remove(model)


@pytest.mark.cpu
def test_graph_wrapper_replays_per_bucket_and_matches_eager(model, graphed):
    with torch.inference_mode():
        out = [model.llm(**llm_inputs(model, L=L, seed=L)) for L in (37, 50, 64, 65)]
        ref = [graphed.inner(**llm_inputs(model, L=L, seed=L)) for L in (37, 50, 64, 65)]
    for L, o, r in zip((37, 50, 64, 65), out, ref):
        assert o[0].shape == r[0].shape == (2, L, model.config.llm_config.hidden_size)
        assert tolerance.relative_error(o[0], r[0]) < 1e-5
    s = graphs.stats(model)
    assert s["misses"] == 2 and s["hits"] == 2 and s["graphs"] == 2, s  # 37, 50, 64 share the 64 bucket
    assert [k.length for k in s["keys"]] == [64, 128] and s["failures"] == 0 and s["passthrough"] == 0
    entry = graphed.cache.values()[0]
    assert entry.graph.replays == 3
    buffer = entry.embeds.data_ptr()
    with torch.no_grad():  # outside inference mode too: the static buffers are ordinary tensors
        model.llm(**llm_inputs(model, L=40))
    assert entry.graph.replays == 4 and entry.embeds.data_ptr() == buffer, "a replay must reuse the static inputs"


@pytest.mark.cpu
def test_graph_output_is_a_copy_of_the_static_buffer(model, graphed):
    with torch.inference_mode():
        first = model.llm(**llm_inputs(model, L=40, seed=1))[0]
        kept = first.clone()
        model.llm(**llm_inputs(model, L=40, seed=2))  # replays into the same static output
    assert torch.equal(first, kept), "a replay overwrote an output the caller still holds"


@pytest.mark.cpu
def test_graph_lru_bound_holds_and_evicts(model, graphed):
    with torch.inference_mode():
        for L in (30, 100, 150, 30):  # buckets 64, 128, 192, 64 with max_graphs=2
            model.llm(**llm_inputs(model, L=L))
    s = graphs.stats(model)
    assert len(s["keys"]) == 2 and s["evictions"] == 2 and s["misses"] == 4, s
    assert [k.length for k in s["keys"]] == [192, 64] and len(s["capture_seconds"]) == 4


@pytest.mark.cpu
def test_failed_capture_runs_eagerly_and_is_counted(model):
    def broken(run, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.install(model, devices=("cpu",), capture=broken)
    try:
        with torch.inference_mode():
            kwargs = llm_inputs(model)
            out = model.llm(**kwargs)[0]
            again = model.llm(**kwargs)[0]
            ref = model.__dict__[graphs.GRAPHS_ATTR].inner(**kwargs)[0]
        assert torch.equal(out, ref) and torch.equal(again, ref)
        s = graphs.stats(model)
        assert s["failures"] == 1 and s["graphs"] == 0 and s["misses"] == 1 and s["hits"] == 1
        assert "not permitted" in s["errors"][0]
    finally:
        graphs.remove(model)


@pytest.mark.cpu
def test_uncapturable_calls_pass_through(model, graphed):
    kwargs = llm_inputs(model)
    with torch.no_grad():
        model.llm(**kwargs, output_attentions=False)  # an argument the padding does not handle
    model.llm(**kwargs)  # gradients enabled: never captured
    assert graphs.stats(model)["passthrough"] == 2 and len(graphed.cache) == 0


@pytest.mark.cpu
def test_generation_through_graph_doubles_is_close_to_stock(model):
    stock = record_generation(model, seed=0, **POINT)
    graphs.install(model, devices=("cpu",), capture=fake_capture)
    try:
        candidate = record_generation(model, seed=0, **POINT)
        s = graphs.stats(model)
    finally:
        graphs.remove(model)
    close = tolerance.closeness(candidate, stock)
    assert close.rel_error < 1e-5 and close.argmax_agreement > 0.999, close.describe()
    assert s["graphs"] == 1 and s["hits"] == POINT["num_step"] - 1, s  # stock: one [2B, L] batch every step
