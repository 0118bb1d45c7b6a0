"""The CUDA-graph wrapper (fastpath/gpu/graphs.py) on the CPU: its logic with a capture double, its CUDA branches
(capture_cuda_graph, replay events, the pool, the capturing check, synchronize) through a recording fake of
torch.cuda (tests_patches/fake_cuda.py), and the numerics settings in its key."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fastpath.gpu import flags, graphs, synchronize
from fastpath.gpu.shapes import Buckets
from harness.parity import tolerance
from harness.model.devices import llm_inputs
from harness.parity.parity import record_generation
from tests_patches.fake_cuda import FakeCuda

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
    graphed = graphs.install(model, devices=("cpu",), capture=capture_double(model.llm), api=FakeCuda())
    try:
        yield graphed
    finally:
        graphs.remove(model)


@pytest.fixture
def graphed(model):
    g = graphs.install(model, buckets=Buckets(64), max_graphs=2, devices=("cpu",), capture=capture_double(model.llm),
                       api=FakeCuda())
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
def test_failed_capture_runs_eagerly_and_is_tried_again_a_bounded_number_of_times(model, caplog):
    tries = []

    def broken(run, pool):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.install(model, devices=("cpu",), capture=broken)
    try:
        with torch.inference_mode(), caplog.at_level(logging.WARNING, logger=graphs.__name__):
            kwargs = llm_inputs(model)
            ref = model.__dict__[graphs.GRAPHS_ATTR].inner(**kwargs)[0]
            outs = [model.llm(**kwargs)[0] for _ in range(graphs.CAPTURE_TRIES + 2)]
        assert all(torch.equal(out, ref) for out in outs), "a shape whose capture failed did not run eagerly"
        s = graphs.stats(model)
        assert len(tries) == s["failures"] == graphs.CAPTURE_TRIES, f"{len(tries)} captures tried: {s}"
        assert s["graphs"] == 0 and s["misses"] == 1 and "not permitted" in s["errors"][0]
        for_good = [r for r in caplog.records if "runs eagerly for good" in r.getMessage()]
        assert [r.levelno for r in for_good] == [logging.WARNING], caplog.text  # said once, after the last try
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


# --- what the captured forward is called with: a recording LLM double ----------------------------------------------


class RecordingLLM(torch.nn.Module):
    """An LLM double whose forward records the keyword arguments of each call (tensors cloned, a packed call's
    `fastpath_documents` as its ids) and returns hidden states [G, L, H] that depend on every input: the embeddings,
    the mask (keys each row sees), the positions and the segment ids."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.config = type("Config", (), {"_attn_implementation": "sdpa"})()
        self.calls = []

    def forward(self, *args, **kwargs):
        self.calls.append({k: v.ids.clone() if k == "fastpath_documents" else
                           v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        hidden = kwargs["inputs_embeds"] * 2
        if kwargs.get("attention_mask") is not None:
            hidden = hidden + kwargs["attention_mask"].sum(-1).transpose(1, 2)  # [G, 1, L] -> [G, L, 1]
        if kwargs.get("position_ids") is not None:
            hidden = hidden + kwargs["position_ids"][..., None]
        if kwargs.get("fastpath_documents") is not None:
            hidden = hidden + kwargs["fastpath_documents"].ids[None, :, None]
        return (hidden,)


def packed_kwargs(N=6, H=3, seed=0, lengths=(4, 2)):
    """A packed call as packed_cfg's loop makes it: embeddings [1, N, H], a [1, 1, 1, 1] placeholder mask, positions
    [1, N] counting from 0 in each row, and the segment of each position."""
    from fastpath.gpu.packed import Documents

    g = torch.Generator().manual_seed(seed)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
    return dict(inputs_embeds=torch.randn(1, N, H, generator=g), attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool),
                return_dict=True, position_ids=positions + seed, fastpath_documents=Documents(ids))


def call_without(kwargs, name):
    return {k: v for k, v in kwargs.items() if k != name}


# what changes in a packed call (packed_kwargs' N 6, H 3), whether cuda_graphs can replay it
PACKED_CALLS = [
    pytest.param(lambda kw: ((), kw), 6, id="the-loops-call"),
    pytest.param(lambda kw: ((), {**kw, "use_cache": False}), 6, id="every-handled-argument"),
    pytest.param(lambda kw: ((), {**kw, "return_dict": None}), 6, id="return-dict-none"),
    pytest.param(lambda kw: ((), call_without(kw, "fastpath_documents")), None, id="no-documents"),
    pytest.param(lambda kw: ((kw["inputs_embeds"],), call_without(kw, "inputs_embeds")), None, id="positional"),
    pytest.param(lambda kw: ((), {**kw, "output_attentions": False}), None, id="another-argument"),
    pytest.param(lambda kw: ((), {**kw, "use_cache": True}), None, id="kv-cache-asked"),
    pytest.param(lambda kw: ((), {**kw, "return_dict": False}), None, id="tuple-asked"),
    pytest.param(lambda kw: ((), {**kw, "inputs_embeds": kw["inputs_embeds"].tolist()}), None, id="embeds-a-list"),
    pytest.param(lambda kw: ((), call_without(kw, "position_ids")), None, id="no-positions"),
    pytest.param(lambda kw: ((), {**kw, "inputs_embeds": kw["inputs_embeds"][0]}), None, id="embeds-2d"),
    pytest.param(lambda kw: ((), {**kw, "inputs_embeds": kw["inputs_embeds"].expand(2, -1, -1)}), None,
                 id="two-rows"),
    pytest.param(lambda kw: ((), {**kw, "position_ids": torch.arange(7)[None]}), None, id="positions-too-long"),
    pytest.param(lambda kw: ((), {**kw, "position_ids": kw["position_ids"].expand(2, -1)}), None,
                 id="positions-two-rows"),
    pytest.param(lambda kw: ((), {**kw, "fastpath_documents": type(kw["fastpath_documents"])(
        torch.zeros(7, dtype=torch.int32))}), None, id="documents-too-long"),
]


@pytest.mark.parametrize("change, length", PACKED_CALLS)
def test_a_packed_call_is_replayable_only_keyword_only_on_one_row_of_n_positions_without_a_kv_cache(change, length):
    args, kwargs = change(packed_kwargs())
    assert graphs.packed_call_length(args, kwargs) == length


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_captured_forward_gets_the_calls_own_arguments_at_its_static_shape(packed):
    """Every run of the captured forward (at capture, at each replay) is called as the caller called the LLM: a
    padded call with its embeddings and mask padded to the bucket, no positions; a packed call with its placeholder
    mask, positions and segment ids; both asking for a dict and no KV cache. Each call returns its own hidden
    states, those of the forward on its own inputs."""
    llm = RecordingLLM()
    graphed = graphs.GraphedForward(llm, llm.forward, Buckets(8), devices=("cpu",), capture=capture_double(llm))
    tiny = SimpleNamespace(config=SimpleNamespace(llm_config=SimpleNamespace(hidden_size=3)))
    calls = [packed_kwargs(seed=seed) if packed else llm_inputs(tiny, L=10, seed=seed) for seed in range(3)]
    with torch.inference_mode():
        outs = [graphed(**kwargs)[0] for kwargs in calls]
        runs = list(llm.calls)  # the capture's run on the first call's inputs, then a replay's run per call
        eager = [llm(**kwargs)[0] for kwargs in calls]
    s = graphed.stats()
    assert (s["graphs"], s["misses"], s["hits"], s["passthrough"]) == (1, 1, 2, 0), s
    assert graphed.cache.values()[0].graph.replays == len(calls) and len(runs) == 1 + len(calls)
    handled = {"inputs_embeds", "attention_mask", "position_ids", "return_dict", "use_cache"}
    for kwargs, run in zip([calls[0], *calls], runs):
        assert set(run) == handled | ({"fastpath_documents"} if packed else set()), sorted(run)
        assert run["return_dict"] is True and run["use_cache"] is False, run
        if packed:
            mask = run["attention_mask"]
            assert mask.dtype == torch.bool and torch.equal(mask, kwargs["attention_mask"]), mask
            assert torch.equal(run["inputs_embeds"], kwargs["inputs_embeds"])
            assert torch.equal(run["position_ids"], kwargs["position_ids"])
            assert torch.equal(run["fastpath_documents"], kwargs["fastpath_documents"].ids)
        else:
            assert run["position_ids"] is None
            assert run["inputs_embeds"].shape == (2, 16, 3) and run["attention_mask"].shape == (2, 1, 16, 16)
            assert torch.equal(run["inputs_embeds"][:, :10], kwargs["inputs_embeds"])
            assert torch.equal(run["attention_mask"][:, :, :10, :10], kwargs["attention_mask"])
    for out, ref in zip(outs, eager):
        assert torch.equal(out, ref), "a replay's hidden states are not the forward of its own inputs"


# --- the CUDA branches on the CPU: the real capture_cuda_graph and replay through a fake torch.cuda ------------------

CPU = torch.device("cpu")  # the inputs' device; the fake's current device is cuda:0, as a model on cuda:1 meets it

# what graphs.py, fastpath.gpu.synchronize and the stream worker call on torch.cuda: the fake must take what the
# installed torch takes
CUDA_NAMES = ["Stream", "Event", "CUDAGraph", "graph", "device", "current_stream", "stream", "graph_pool_handle",
              "is_current_stream_capturing", "synchronize", "Stream.wait_stream", "Stream.wait_event",
              "Stream.synchronize", "Event.record", "CUDAGraph.capture_begin", "CUDAGraph.capture_end",
              "CUDAGraph.replay", "CUDAGraph.pool"]


def parameters(obj) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


@pytest.mark.parametrize("name", CUDA_NAMES)
def test_the_fake_cuda_api_takes_what_torch_cuda_takes(name):
    fake, real = (functools.reduce(getattr, name.split("."), root) for root in (FakeCuda(), torch.cuda))
    assert parameters(fake) == parameters(real), \
        f"{name}: fake {inspect.signature(fake)}, torch {inspect.signature(real)}"


def test_every_cuda_function_graphs_calls_is_in_the_signature_check():
    called = set(re.findall(r"\bapi\.(\w+)\(", inspect.getsource(graphs)))
    assert called and called <= set(CUDA_NAMES), f"not checked against torch.cuda: {sorted(called - set(CUDA_NAMES))}"


@pytest.fixture
def fake_cuda(model):
    """cuda_graphs on the CPU model through the fake API, capturing with the real capture_cuda_graph."""
    fake = FakeCuda()
    graphed = graphs.install(model, buckets=Buckets(64), devices=("cpu",), api=fake)
    try:
        yield graphed, fake
    finally:
        graphs.remove(model)


@pytest.mark.cpu
def test_capture_warms_up_on_a_side_stream_of_the_inputs_device_and_captures_into_one_pool(model, fake_cuda):
    graphed, fake = fake_cuda
    runs = []  # (current stream of the inputs' device, capturing) at every forward that runs the modules

    def seen(*_):
        runs.append((fake.current_stream(CPU), fake.is_current_stream_capturing()))

    handle = model.llm.norm.register_forward_hook(seen)
    try:
        with torch.inference_mode():
            out = {L: model.llm(**llm_inputs(model, L=L, seed=L))[0] for L in (40, 100)}  # two buckets, two captures
            runs.append("eager")
            ref = {L: graphed.inner(**llm_inputs(model, L=L, seed=L))[0] for L in (40, 100)}
    finally:
        handle.remove()
    sides, default = [c.on for c in fake.calls if c.name == "Stream"], fake.default_stream(CPU)
    assert [side.device for side in sides] == [CPU, CPU]
    assert runs == [(sides[0], False)] * graphs.WARMUP_CALLS + [(sides[0], True)] + \
        [(sides[1], False)] * graphs.WARMUP_CALLS + [(sides[1], True)] + ["eager", (default, False), (default, False)]
    waits = [(c.on, c.kwargs["stream"]) for c in fake.calls if c.name == "Stream.wait_stream"]
    assert waits == [(sides[0], default), (default, sides[0]), (sides[1], default), (default, sides[1])]
    captures = [c.kwargs for c in fake.calls if c.name == "graph"]
    assert [(c["pool"], c["stream"], c["capture_error_mode"]) for c in captures] == \
        [(graphed.pool, side, "thread_local") for side in sides]
    assert fake.names().count("graph_pool_handle") == 1 and graphed.pool is not None  # one pool, every shape
    for L in out:
        assert tolerance.relative_error(out[L], ref[L]) < 1e-5, f"L={L}: the replayed graph is not the forward"


@pytest.mark.cpu
def test_a_replay_waits_for_the_previous_replays_event_and_records_its_own(model, fake_cuda):
    graphed, fake = fake_cuda
    with torch.inference_mode():
        for seed in range(3):  # one shape: captured and replayed, then replayed twice
            kwargs = llm_inputs(model, L=40, seed=seed)
            out, ref = model.llm(**kwargs)[0], graphed.inner(**kwargs)[0]
            assert tolerance.relative_error(out, ref) < 1e-5, f"replay {seed} is not the forward of its inputs"
    order = [c for c in fake.calls if c.name in ("Stream.wait_event", "CUDAGraph.replay", "Event.record")]
    assert [c.name for c in order] == ["CUDAGraph.replay", "Event.record"] + \
        ["Stream.wait_event", "CUDAGraph.replay", "Event.record"] * 2
    records, waits = [c for c in order if c.name == "Event.record"], [c for c in order if c.name == "Stream.wait_event"]
    assert [w.kwargs["event"] for w in waits] == [r.on for r in records[:2]] and len({id(r.on) for r in records}) == 3
    default = fake.default_stream(CPU)  # the inputs' device's current stream
    assert all(r.kwargs["stream"] is default for r in records) and all(w.on is default for w in waits)


@pytest.mark.cpu
def test_a_call_while_another_capture_runs_passes_through_uncaptured(model, fake_cuda):
    graphed, fake = fake_cuda
    kwargs = llm_inputs(model, L=40)
    with torch.inference_mode():
        ref = graphed.inner(**kwargs)[0]
        with fake.graph(fake.CUDAGraph()):  # someone captures a larger call on this thread
            out = model.llm(**kwargs)[0]
    assert graphed.passthrough == 1 and len(graphed.cache) == 0 and graphed.pool is None, graphs.stats(model)
    assert torch.equal(out, ref)


@pytest.mark.cpu
def test_capture_and_replay_run_on_the_inputs_device_not_the_current_one(model, fake_cuda):
    graphed, fake = fake_cuda
    fake.default_capture_stream = fake.default_stream(0)  # torch.cuda.graph's own stream, made by an earlier capture
    with torch.inference_mode():
        for seed in range(2):
            model.llm(**llm_inputs(model, L=40, seed=seed))
    names = set(fake.names())
    assert {"device", "Stream", "graph", "CUDAGraph.capture_begin", "CUDAGraph.replay", "Event.record",
            "synchronize"} <= names, names
    elsewhere = [(c.name, str(c.device)) for c in fake.calls if c.device != CPU]
    assert not elsewhere, f"calls on another device than the inputs': {elsewhere}"
    assert fake.device_now() == torch.device("cuda", 0), "the current device was not put back"


@pytest.mark.cpu
def test_synchronize_waits_through_the_api_for_the_devices_given():
    fake = FakeCuda()
    synchronize("cpu", api=fake, devices=("cpu",))
    synchronize("cpu", api=fake)  # the CPU is not among the default devices ("cuda",): nothing to wait for
    assert [(c.name, c.device) for c in fake.calls] == [("synchronize", CPU)]


# --- numerics: the process settings a graph bakes in are part of its key -------------------------------------------


@contextlib.contextmanager
def switched(read, write, value):
    before = read()
    write(value)
    try:
        yield
    finally:
        write(before)


def toggled(obj, name):
    return switched(lambda: getattr(obj, name), lambda value: setattr(obj, name, value), not getattr(obj, name))


def sdp_toggled(kind):
    read = getattr(torch.backends.cuda, f"{kind}_sdp_enabled")
    return switched(read, getattr(torch.backends.cuda, f"enable_{kind}_sdp"), not read())


def sdp_reordered():
    order = [SDPBackend(i) for i in torch._C._get_sdp_priority_order()]
    return sdpa_kernel(order[::-1], set_priority=True)  # every backend on, another priority


MATMUL, CUDNN = torch.backends.cuda.matmul, torch.backends.cudnn
# base (the first and third call), change (the second call): each changes one setting of Numerics
NUMERICS_CHANGES = [
    pytest.param(contextlib.nullcontext, lambda: toggled(MATMUL, "allow_tf32"), id="matmul-tf32"),
    pytest.param(contextlib.nullcontext, lambda: toggled(CUDNN, "allow_tf32"), id="cudnn-tf32"),
    pytest.param(contextlib.nullcontext, lambda: toggled(MATMUL, "allow_fp16_reduced_precision_reduction"),
                 id="fp16-reduction"),
    pytest.param(contextlib.nullcontext, lambda: toggled(MATMUL, "allow_bf16_reduced_precision_reduction"),
                 id="bf16-reduction"),
    pytest.param(contextlib.nullcontext, lambda: torch.autocast("cpu", dtype=torch.bfloat16), id="autocast-on"),
    pytest.param(functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16),
                 functools.partial(torch.autocast, "cpu", dtype=torch.float16), id="autocast-dtype"),
    *[pytest.param(contextlib.nullcontext, functools.partial(sdp_toggled, kind), id=f"sdp-{kind}")
      for kind in ("flash", "mem_efficient", "math", "cudnn")],
    pytest.param(contextlib.nullcontext, lambda: sdpa_kernel([SDPBackend.MATH]), id="sdpa-kernel-math"),
    pytest.param(contextlib.nullcontext, sdp_reordered, id="sdpa-priority"),
]


@pytest.mark.cpu
@pytest.mark.parametrize("base, change", NUMERICS_CHANGES)
def test_a_change_of_numerics_captures_anew_and_changing_back_replays_the_first_graph(model, graphed,
                                                                                      torch_settings, base, change):
    kwargs = llm_inputs(model, L=40)
    with torch.inference_mode(), base():
        model.llm(**kwargs)
        with change():
            model.llm(**kwargs)
        model.llm(**kwargs)
    s = graphs.stats(model)
    assert (s["misses"], s["hits"], s["graphs"]) == (2, 1, 2), s
    first, second = (k.numerics for k in reversed(s["keys"]))  # most recently used first
    assert first != second, s["keys"]


@pytest.mark.cpu
def test_graphs_captured_with_tf32_are_not_replayed_after_cuda_tf32_reverts(model, graphed, torch_settings):
    kwargs, before = llm_inputs(model, L=40), flags.read()
    with torch.inference_mode():
        flags.write(flags.SETTINGS)  # what cuda_tf32 sets on a CUDA model
        model.llm(**kwargs)
        flags.write({name: before[name] for name in flags.SETTINGS})  # what its revert puts back
        model.llm(**kwargs)
    s = graphs.stats(model)
    assert (s["misses"], s["hits"]) == (2, 0), f"a graph captured with TF32 on was replayed with it off: {s}"


@pytest.mark.cpu
def test_tf32_set_through_both_of_torchs_apis_is_keyed_not_refused(model, graphed):
    """torch refuses to read cudnn.allow_tf32 once conv and rnn differ (set through its new API): the key reads the
    new API's settings instead, so the calls are captured, not broken, and a further change there is seen too."""
    backends = torch.backends
    settings = [(backends, "fp32_precision"), (backends.cudnn, "fp32_precision"),
                (backends.cuda.matmul, "fp32_precision"), (backends.cudnn.conv, "fp32_precision"),
                (backends.cudnn.rnn, "fp32_precision")]
    before = [getattr(obj, name) for obj, name in settings]
    kwargs = llm_inputs(model, L=40)
    try:
        with torch.inference_mode():
            model.llm(**kwargs)
            backends.cudnn.conv.fp32_precision = "ieee" if before[3] == "tf32" else "tf32"
            with pytest.raises(RuntimeError, match="legacy and new APIs"):
                backends.cudnn.allow_tf32
            model.llm(**kwargs)
            backends.cuda.matmul.fp32_precision = "ieee" if before[2] == "tf32" else "tf32"  # still unreadable
            model.llm(**kwargs)
    finally:
        for (obj, name), value in zip(settings, before):
            setattr(obj, name, value)
    s = graphs.stats(model)
    assert (s["misses"], s["hits"], s["passthrough"]) == (3, 0, 0), s
