"""The CUDA-graph wrapper (fastpath/gpu/graphs.py) with a capture double, on the CPU."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from fastpath.gpu import graphs
from fastpath.gpu.shapes import Buckets
from harness.parity import tolerance
from harness.model.devices import llm_inputs
from harness.parity.parity import record_generation

POINT = dict(text=["Hi there.", "This sentence is a little bit longer than the first one."], language="en", num_step=4)


# --- the CUDA-graph wrapper, with a capture double on CPU ------------------------------------------------------------


def storages(llm) -> list:
    return [(name, id(t), t.data_ptr()) for name, t in list(llm.named_parameters()) + list(llm.named_buffers())]


class FakeGraph:
    """What capture returns: replay() reruns the captured function into the same static output (as a graph does).
    A real graph reads the weights at the addresses they had at capture; this one refuses to replay once any of
    them changed (a real one would read freed or old memory). `pause` widens the window between reading the
    static inputs and writing the static output, as a replay on a busy GPU does."""

    def __init__(self, run, hidden, llm, pause: float = 0.0):
        self.run, self.hidden, self.replays, self.llm, self.pause = run, hidden, 0, llm, pause
        self.storages = storages(llm)

    def replay(self):
        now = storages(self.llm)
        stale = [name for (name, *was), (_, *is_) in zip(self.storages, now) if was != is_]
        if stale or len(now) != len(self.storages):
            raise AssertionError(f"replay of stale weights: {len(stale)} storages changed ({stale[:3]}), "
                                 f"{len(self.storages)} -> {len(now)} tensors")
        self.replays += 1
        time.sleep(self.pause)
        self.hidden.copy_(self.run())


def capture_double(llm, pause: float = 0.0):
    def capture(run, pool):
        out = run()
        with torch.inference_mode(False), torch.no_grad():
            hidden = torch.empty_like(out)  # an ordinary tensor, as the graph's own memory is to replay
        hidden.copy_(out)
        return FakeGraph(run, hidden, llm, pause), hidden

    return capture


@contextlib.contextmanager
def graph_doubles(model):
    """cuda_graphs' wrapper on a CPU model with the capture double, removed after; yields the GraphedForward."""
    graphed = graphs.install(model, devices=("cpu",), capture=capture_double(model.llm))
    try:
        yield graphed
    finally:
        graphs.remove(model)


@pytest.fixture
def graphed(model):
    g = graphs.install(model, buckets=Buckets(64), max_graphs=2, devices=("cpu",), capture=capture_double(model.llm))
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
def test_failed_capture_runs_eagerly_and_is_tried_again_a_bounded_number_of_times(model):
    tries = []

    def broken(run, pool):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.install(model, devices=("cpu",), capture=broken)
    try:
        with torch.inference_mode():
            kwargs = llm_inputs(model)
            ref = model.__dict__[graphs.GRAPHS_ATTR].inner(**kwargs)[0]
            outs = [model.llm(**kwargs)[0] for _ in range(graphs.CAPTURE_TRIES + 2)]
        assert all(torch.equal(out, ref) for out in outs), "a shape whose capture failed did not run eagerly"
        s = graphs.stats(model)
        assert len(tries) == s["failures"] == graphs.CAPTURE_TRIES, f"{len(tries)} captures tried: {s}"
        assert s["graphs"] == 0 and s["misses"] == 1 and "not permitted" in s["errors"][0]
    finally:
        graphs.remove(model)


@pytest.mark.cpu
def test_a_capture_that_failed_once_is_captured_on_a_later_call(model):
    """A capture can fail for a passing reason (another thread's CUDA work in global capture mode)."""
    double, failed = capture_double(model.llm), []

    def once_broken(run, pool):
        if not failed:
            failed.append(1)
            raise RuntimeError("operation not permitted when stream is capturing")
        return double(run, pool)

    graphs.install(model, devices=("cpu",), capture=once_broken)
    try:
        with torch.inference_mode():
            for _ in range(3):
                model.llm(**llm_inputs(model))
        s = graphs.stats(model)
        assert s["failures"] == 1 and s["graphs"] == 1, f"the shape was not captured after one failure: {s}"
        assert model.__dict__[graphs.GRAPHS_ATTR].cache.values()[0].graph.replays == 2  # calls 2 (captured) and 3
    finally:
        graphs.remove(model)


@pytest.fixture
def own_model(checkpoint):
    """A model of its own: these tests replace and move its weights."""
    from harness.model.checkpoint import load_model

    return load_model(checkpoint)


def move(model):  # model.cpu().cuda() on a CPU machine: every storage moves, the values are the same
    model.to(torch.float64).to(torch.float32)


def reload(model):  # load_state_dict(assign=True) of other weights
    state = {k: v.clone() for k, v in model.llm.state_dict().items()}
    state["layers.0.mlp.down_proj.weight"] *= 2
    model.llm.load_state_dict(state, assign=True)


def adapter(model):  # an adapter that replaces a module by a wrapper with weights of its own (as peft's LoRA does)
    class Adapted(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base, self.up = base, torch.nn.Linear(base.in_features, base.out_features, bias=False)
            torch.nn.init.normal_(self.up.weight, std=0.02)

        def forward(self, x):
            return self.base(x) + self.up(x)

    mlp = model.llm.layers[0].mlp
    mlp.down_proj = Adapted(mlp.down_proj)


def load_in_place(model):  # load_state_dict without assign: new values at the old addresses
    state = {k: v.clone() for k, v in model.llm.state_dict().items()}
    state["layers.0.mlp.down_proj.weight"] *= 2
    model.llm.load_state_dict(state)


# change, whether the graphs must be captured again (an in-place load keeps them: the graph reads the new values)
WEIGHT_CHANGES = [pytest.param(move, 1, id="move"), pytest.param(reload, 1, id="load-assign"),
                  pytest.param(adapter, 1, id="adapter"), pytest.param(load_in_place, 0, id="load-in-place")]


@pytest.mark.cpu
@pytest.mark.parametrize("change, recaptures", WEIGHT_CHANGES)
def test_a_change_of_the_weights_captures_anew_instead_of_replaying_stale_memory(own_model, change, recaptures):
    graphed = graphs.install(own_model, devices=("cpu",), capture=capture_double(own_model.llm))
    kwargs = llm_inputs(own_model, L=40, seed=3)
    with torch.inference_mode():
        own_model.llm(**kwargs)
        own_model.llm(**kwargs)  # captured, then replayed
        change(own_model)
        out = own_model.llm(**kwargs)[0]
        ref = graphed.inner(**kwargs)[0]  # eager, on the weights as they are now
    s = graphs.stats(own_model)
    assert s["recaptures"] == recaptures and s["graphs"] == 1, s
    assert tolerance.relative_error(out, ref) < 1e-5, "the forward after the change is not the changed model's"
    assert len(s["capture_seconds"]) == 1 + recaptures, s


@pytest.mark.cpu
def test_recapture_drops_the_graphs(model, graphed):
    with torch.inference_mode():
        model.llm(**llm_inputs(model, L=40))
        graphs.recapture(model)
        model.llm(**llm_inputs(model, L=40))
    s = graphs.stats(model)
    assert s["recaptures"] == 1 and s["misses"] == 2 and s["graphs"] == 1, s


@pytest.mark.cpu
def test_calls_from_two_threads_each_get_their_own_output(model):
    """The static buffers are shared: two threads' calls of one shape must not replay each other's inputs."""
    graphs.install(model, buckets=Buckets(64), devices=("cpu",), capture=capture_double(model.llm, pause=0.005))
    try:
        inputs = {L: llm_inputs(model, L=L, seed=L) for L in (40, 50)}  # one bucket: one graph for both
        with torch.inference_mode():
            expected = {L: model.__dict__[graphs.GRAPHS_ATTR].inner(**kw)[0] for L, kw in inputs.items()}
        wrong = []

        def calls(L):
            with torch.inference_mode():
                for _ in range(8):
                    out = model.llm(**inputs[L])[0]
                    if tolerance.relative_error(out, expected[L]) > 1e-5:
                        wrong.append(L)

        threads = [threading.Thread(target=calls, args=(L,)) for L in inputs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)  # a hang guard, not a bound
        assert not any(t.is_alive() for t in threads), "a replaying thread hung"
        assert graphs.stats(model)["graphs"] == 1
        assert not wrong, f"{len(wrong)} of 16 calls got another thread's output (lengths {sorted(set(wrong))})"
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
    with graph_doubles(model):
        candidate = record_generation(model, seed=0, **POINT)
        s = graphs.stats(model)
    close = tolerance.closeness(candidate, stock)
    assert close.rel_error < 1e-5 and close.argmax_agreement > 0.999, close.describe()
    assert s["graphs"] == 1 and s["hits"] == POINT["num_step"] - 1, s  # stock: one [2B, L] batch every step
