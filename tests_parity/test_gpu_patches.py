"""The GPU tier's logic, checked without a GPU: bucketing, graph keys, the LRU, padding, the graph and compile
wrappers (with test doubles for capture and compile), global-flag restore, conflicts, device defaults, and that
every GPU patch is inert on a CPU model. What needs CUDA itself is in test_gpu_parity.py (`-m cuda`).
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

import fastpath
from fastpath import device_defaults
from fastpath.gpu import compiled, flags, graphs
from fastpath.gpu.padding import fill_padded, llm_call_shape, padded
from fastpath.gpu.shapes import Buckets, GraphKey, LRUCache, graph_key
from fastpath.registry import COMPILED_LLM, LLM_FORWARD_PATCHES, PROCESS_GLOBAL
from fastpath.testing import tolerance
from fastpath.testing.parity import Run, record_generation
from fastpath.testing.speed import bench
from fastpath.testing.speed.measure import Variant, interleaved_variants

GPU_PATCHES = [n for n, p in fastpath.PATCHES.items() if p.devices == ("cuda",)]
POINT = dict(text=["Hi there.", "This sentence is a little bit longer than the first one."], language="en", num_step=4)


# --- buckets, keys, LRU -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, expected", [(1, 64), (63, 64), (64, 64), (65, 128), (300, 320), (1000, 1024)])
def test_plain_buckets_round_up_to_the_multiple(n, expected):
    assert Buckets(64).length(n) == expected


@pytest.mark.parametrize("multiple, growth", [(64, 1.0), (32, 1.25), (64, 1.5), (16, 2.0)])
def test_bucket_ladder_bounds_padding_and_rung_count(multiple, growth):
    buckets = Buckets(multiple, growth)
    ladder = buckets.ladder(4096)
    assert ladder == sorted(set(ladder)) and all(r % multiple == 0 for r in ladder)
    for n in range(1, 4097):
        b = buckets.length(n)
        assert b >= n and b in ladder
        # waste: under one multiple, or under a growth fraction of the length (rounded up to a multiple)
        assert b - n < multiple or b <= math.ceil(n * growth / multiple) * multiple + multiple, (n, b)
    if growth > 1.0:  # geometric: logarithmically many rungs beyond the linear start
        linear = math.ceil(multiple / (growth - 1) / multiple) + 1
        assert len(ladder) <= linear + math.ceil(math.log(4096 / multiple, growth)) + 1, ladder


@pytest.mark.parametrize("kwargs", [dict(multiple=0), dict(multiple=1.5), dict(growth=0.9), dict(growth=float("nan"))])
def test_bad_bucket_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="bucket"):
        Buckets(**kwargs)
    with pytest.raises(ValueError, match="cannot bucket"):
        Buckets().length(0)


def test_graph_key_shares_a_bucket_and_separates_everything_else():
    b = Buckets(64)
    key = graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b)
    assert key == GraphKey(2, 320, 320, "torch.bfloat16", "cuda:0", "sdpa")
    assert graph_key(2, 257, 257, torch.bfloat16, "cuda:0", "sdpa", b) == key  # same bucket, same graph
    others = [
        graph_key(1, 300, 300, torch.bfloat16, "cuda:0", "sdpa", b),  # rows
        graph_key(2, 321, 321, torch.bfloat16, "cuda:0", "sdpa", b),  # next bucket
        graph_key(2, 300, 300, torch.float16, "cuda:0", "sdpa", b),  # dtype
        graph_key(2, 300, 300, torch.bfloat16, "cuda:1", "sdpa", b),  # device
        graph_key(2, 300, 300, torch.bfloat16, "cuda:0", "eager", b),  # attention implementation
        graph_key(2, 300, 400, torch.bfloat16, "cuda:0", "sdpa", b),  # wider keys (trimmed layout)
    ]
    assert len({key, *others}) == 1 + len(others)
    trimmed = graph_key(3, 40, 300, torch.bfloat16, "cuda:0", "sdpa", b)
    assert (trimmed.length, trimmed.keys) == (64, 320)
    with pytest.raises(ValueError, match="narrower"):
        graph_key(1, 10, 9, torch.float32, "cpu", "sdpa", b)


def test_lru_evicts_the_least_recently_used_and_counts():
    evicted = []
    cache = LRUCache(2, on_evict=lambda k, v: evicted.append((k, v)))
    made = []

    def make(name):
        return lambda: made.append(name) or name.upper()

    assert cache.get_or_create("a", make("a")) == "A"
    assert cache.get_or_create("b", make("b")) == "B"
    assert cache.get_or_create("a", make("a")) == "A"  # hit: "a" becomes most recent
    assert cache.get_or_create("c", make("c")) == "C"  # evicts "b"
    assert made == ["a", "b", "c"] and evicted == [("b", "B")]
    assert cache.keys() == ["a", "c"] and len(cache) == 2 and "b" not in cache
    assert cache.stats.as_dict() == {"hits": 1, "misses": 3, "evictions": 1, "failures": 0}
    cache.clear()
    assert len(cache) == 0 and [k for k, _ in evicted] == ["b", "a", "c"]
    with pytest.raises(ValueError, match="max_entries"):
        LRUCache(0)


# --- padding ------------------------------------------------------------------------------------------------------


def call(G=2, L=5, P=None, H=8, **extra):
    P = P or L
    mask = torch.zeros(G, 1, L, P, dtype=torch.bool)
    mask[:, :, :, :L] = True
    return dict(inputs_embeds=torch.randn(G, L, H), attention_mask=mask, return_dict=True, position_ids=None, **extra)


def test_llm_call_shape_takes_only_what_padding_handles():
    assert llm_call_shape((), call()) == (2, 5, 5)
    assert llm_call_shape((), call(P=9)) == (2, 5, 9)
    assert llm_call_shape((), call(use_cache=False)) == (2, 5, 5)
    refused = [
        ((torch.zeros(1),), call()),  # positional
        ((), call(output_attentions=True)),  # unknown keyword
        ((), call(use_cache=True)),  # a KV cache is asked for
        ((), {**call(), "position_ids": torch.arange(5)[None]}),
        ((), {**call(), "return_dict": False}),
        ((), {**call(), "attention_mask": call()["attention_mask"].float()}),  # additive float mask
        ((), {**call(), "attention_mask": torch.ones(2, 5, dtype=torch.bool)}),  # 2D padding mask
        ((), {**call(), "attention_mask": torch.ones(2, 1, 5, 4, dtype=torch.bool)}),  # fewer keys than queries
        ((), {**call(), "inputs_embeds": None}),
    ]
    for args, kwargs in refused:
        assert llm_call_shape(args, kwargs) is None, sorted(kwargs)


def test_fill_padded_keeps_real_rows_and_isolates_padding():
    torch.manual_seed(0)
    c = call(G=2, L=5, P=7)
    c["attention_mask"][1, :, :, 3:] = False  # a row with fewer real keys
    embeds, mask = padded(c["inputs_embeds"], c["attention_mask"], length=8, keys=10)
    assert embeds.shape == (2, 8, 8) and mask.shape == (2, 1, 8, 10)
    assert torch.equal(embeds[:, :5], c["inputs_embeds"]) and not embeds[:, 5:].any()
    assert torch.equal(mask[:, :, :5, :7], c["attention_mask"])
    assert not mask[:, :, :5, 7:].any(), "real rows must not see padded keys"
    for r in range(5, 8):  # padded rows: themselves only
        expected = torch.zeros(10, dtype=torch.bool)
        expected[r] = True
        assert torch.equal(mask[0, 0, r], expected) and torch.equal(mask[1, 0, r], expected)
    with pytest.raises(ValueError, match="cannot hold"):
        fill_padded(c["inputs_embeds"], c["attention_mask"], torch.empty(2, 4, 8),
                    torch.empty(2, 1, 4, 10, dtype=torch.bool))


def llm_inputs(model, G=2, L=37, P=None, seed=0):
    """Stock-layout LLM inputs of the tiny model: random embeddings, a bidirectional mask over L (of P) keys."""
    g = torch.Generator().manual_seed(seed)
    P = P or L
    embeds = torch.randn(G, L, model.config.llm_config.hidden_size, generator=g)
    mask = torch.zeros(G, 1, L, P, dtype=torch.bool)
    mask[:, :, :, :L] = True
    mask[1, :, :, L - 7:] = False  # second row: 7 padding positions, as stock pads its unconditional rows
    mask[1, :, torch.arange(L - 7, L), torch.arange(L - 7, L)] = True
    return dict(inputs_embeds=embeds, attention_mask=mask, return_dict=True, position_ids=None)


@pytest.mark.cpu
@pytest.mark.parametrize("P, length, keys", [(None, 64, 64), (None, 128, 128), (100, 64, 128)],
                         ids=["one-bucket", "two-buckets", "trimmed-layout"])
def test_padded_forward_computes_the_same_real_rows(model, P, length, keys):
    """Padding is the same function (fp32 CPU, other shapes: equal to rounding, not bit-exact). The trimmed
    layout (mask wider than the sequence) runs under trimmed_cfg's padded-key attention, as in the loop."""
    kwargs = llm_inputs(model, P=P)
    with fastpath.patched(model, ["trimmed_cfg"] if P else []), torch.inference_mode():
        ref = model.llm(**kwargs)[0]
        embeds, mask = padded(kwargs["inputs_embeds"], kwargs["attention_mask"], length, keys)
        out = model.llm(inputs_embeds=embeds, attention_mask=mask, return_dict=True, position_ids=None)[0]
    assert torch.isfinite(out).all(), "a padded row produced NaN/inf"
    err = tolerance.relative_error(out[:, :37], ref)
    assert err < 1e-5, f"padded forward rel err {err:.2e}"


# --- the CUDA-graph wrapper, with a capture double on CPU ---------------------------------------------------------


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


# --- the compile wrappers, with a compiler double ------------------------------------------------------------------


def eager_compiler(calls):
    def compile_(fn, mode, dynamic):
        calls.append((mode, dynamic))
        return fn

    return compile_


@pytest.mark.cpu
def test_compiled_llm_pads_to_buckets_and_compiles_once(model):
    calls = []
    wrapper = compiled.compile_llm(model, mode="default", devices=("cpu",), compiler=eager_compiler(calls))
    try:
        assert compiled.compile_llm(model) is wrapper  # idempotent
        with torch.inference_mode():
            for L in (37, 50, 100):
                kwargs = llm_inputs(model, L=L)
                assert tolerance.relative_error(model.llm(**kwargs)[0], wrapper.inner(**kwargs)[0]) < 1e-5
        s = compiled.stats(model)["llm"]
        assert calls == [("default", True)] and s["shapes"] == 2 and len(s["first_call_seconds"]) == 2, s
    finally:
        compiled.uncompile_llm(model)
    assert "forward" not in model.llm.__dict__ and compiled.LLM_ATTR not in model.__dict__


@pytest.mark.cpu
def test_compiled_vocoder_wraps_decode_on_the_instance(model):
    calls = []
    tokenizer = model.audio_tokenizer
    wrapper = compiled.compile_vocoder(model, devices=("cpu",), compiler=eager_compiler(calls))
    try:
        codes = torch.randint(0, 1024, (1, 8, 20))
        with torch.inference_mode():
            out = tokenizer.decode(codes).audio_values
            ref = wrapper.inner(codes).audio_values
        assert torch.equal(out, ref) and calls == [("default", True)] and wrapper.stats()["shapes"] == 1
    finally:
        compiled.uncompile_vocoder(model)
    assert "decode" not in tokenizer.__dict__


def test_compile_mode_is_checked():
    with pytest.raises(ValueError, match="reduce-overhead"):
        compiled.check_mode("fast")


# --- every GPU patch is inert on a CPU model, and reverts exactly ---------------------------------------------------


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


# --- process-global flags ------------------------------------------------------------------------------------------


STARTING_STATES = [
    pytest.param(lambda: None, id="torch-defaults"),
    pytest.param(lambda: setattr(torch.backends.cudnn, "benchmark", True), id="cudnn-benchmark-on"),
    pytest.param(lambda: setattr(torch.backends.cudnn, "allow_tf32", False), id="cudnn-tf32-off"),
    pytest.param(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), id="matmul-tf32-already-on"),
    pytest.param(lambda: torch.set_float32_matmul_precision("high"), id="precision-high"),
]


@pytest.fixture
def on_cuda(monkeypatch):
    """Make the flags patch see a CUDA model (the settings themselves exist on every build of torch)."""
    monkeypatch.setattr(flags, "model_device_type", lambda model: "cuda")


@pytest.mark.parametrize("start", STARTING_STATES)
def test_flags_are_set_then_restored_exactly(model, on_cuda, start):
    start()
    before = flags.read()
    fastpath.apply(model, "cuda_tf32")
    try:
        now = flags.read()
        assert {k: now[k] for k in flags.SETTINGS} == flags.SETTINGS
        assert now["float32_matmul_precision"] == "high", "TF32 for CUDA matmuls is what 'high' means"
        fastpath.apply(model, "cuda_tf32")  # idempotent: the record of the first apply stays
        assert model.__dict__[flags.FLAGS_ATTR]["changed"] == {
            k: (before[k], v) for k, v in flags.SETTINGS.items() if before[k] != v}
    finally:
        fastpath.revert(model, "cuda_tf32")
    assert flags.read() == before and flags.FLAGS_ATTR not in model.__dict__


def test_flags_changed_by_someone_else_are_left_alone(model, on_cuda, caplog):
    torch.backends.cudnn.benchmark = True
    fastpath.apply(model, "cuda_tf32")  # turns benchmark off and TF32 matmuls on
    assert torch.backends.cudnn.benchmark is False
    torch.backends.cudnn.benchmark = True  # the user's choice, made while the patch is applied
    with caplog.at_level("WARNING", logger="fastpath.gpu.flags"):
        fastpath.revert(model, "cuda_tf32")
    assert torch.backends.cudnn.benchmark is True and "cudnn_benchmark" in caplog.text
    assert torch.backends.cuda.matmul.allow_tf32 is False, "the patch's own change was not undone"


def test_flags_do_nothing_for_a_cpu_model(model):
    before = flags.read()
    with fastpath.patched(model, "cuda_tf32"):
        assert flags.read() == before
        assert model.__dict__[flags.FLAGS_ATTR] == {"device": "cpu", "changed": {}}


# --- conflicts and the registry's GPU block ------------------------------------------------------------------------


def test_gpu_patches_are_registered_as_tolerance_checked_cuda_patches():
    for name in GPU_PATCHES:
        patch = fastpath.PATCHES[name]
        assert not patch.lossless and patch.devices == ("cuda",), name
    assert set(GPU_PATCHES) == {"cuda_graphs", *COMPILED_LLM, "compiled_vocoder", "cuda_tf32"}
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


# --- device-aware defaults ------------------------------------------------------------------------------------------


def test_every_patch_has_a_default_and_a_reason_on_every_device():
    assert set(device_defaults.TABLE) == set(fastpath.PATCHES), "patches without a default row (or stale rows)"
    for name, row in device_defaults.TABLE.items():
        assert set(row) == set(device_defaults.DEVICES), name
        for device, cell in row.items():
            assert cell.reason.strip(), f"{name} on {device} has no reason"
            if cell.on:
                assert device in fastpath.PATCHES[name].devices, f"{name} on by default on {device}, not meant for it"


def test_defaults_per_device():
    assert fastpath.defaults("cpu") == list(fastpath.LOSSLESS), "on CPU the default is the bit-exact stack"
    cuda = fastpath.defaults("cuda")
    assert "trimmed_cfg" not in cuda and "0.64x" in device_defaults.TABLE["trimmed_cfg"]["cuda"].reason
    assert {"cuda_graphs", "cuda_tf32", "sliced_heads"} <= set(cuda)
    assert len([n for n in cuda if n in LLM_FORWARD_PATCHES]) <= 1, "two patches replacing the LLM forward"
    assert fastpath.defaults("cuda:1") == fastpath.defaults(torch.device("cuda", 0)) == cuda
    assert fastpath.defaults("mps") == list(fastpath.LOSSLESS)
    assert fastpath.FULL_PRESET == {"num_step": 12}
    with pytest.raises(device_defaults.UnknownDeviceError, match="known"):
        fastpath.defaults("xpu")


def test_defaults_read_a_models_device(model):
    assert fastpath.defaults(model) == fastpath.defaults("cpu")
    names, on, reasons = zip(*device_defaults.explain(model))
    assert list(names) == list(fastpath.PATCHES) and all(reasons)


# --- bench variants and the interleaved runner ----------------------------------------------------------------------


def test_bench_variant_names_and_dtypes():
    gpu = bench.parse_variant("gpu@bf16", "cuda", "fp32")
    assert (gpu.name, gpu.dtype, list(gpu.patches)) == ("gpu@bf16", "bf16", fastpath.defaults("cuda"))
    preset = bench.parse_variant("preset", "cuda", "bf16")
    assert preset.name == "preset@bf16" and preset.overrides == fastpath.FULL_PRESET and preset.patches == gpu.patches
    compiled_variant = bench.parse_variant("gpu-reduce-overhead", "cuda", "bf16")
    assert "cuda_graphs" not in compiled_variant.patches and "compiled_llm_reduce_overhead" in compiled_variant.patches
    assert bench.parse_variant("stock@fp32", "cuda", "bf16").patches == ()
    for bad in ("turbo", "gpu@int8"):
        with pytest.raises(argparse.ArgumentTypeError, match="known"):
            bench.parse_variant(bad, "cuda", "bf16")


@pytest.mark.cpu
def test_bench_variants_write_a_loadable_baseline(tmp_path, capsys):
    from fastpath.testing.speed.baselines import load_baseline

    out, path = tmp_path / "bench.json", tmp_path / "baseline.json"
    assert bench.main(["--size", "tiny", "--points", "auto-short-10", "--rounds", "1", "--variants", "stock",
                       "stock-preset@fp32", "--out", str(out), "--save-baseline", str(path)]) == 0
    data = json.loads(path.read_text())
    baseline = load_baseline(path, data["device_key"], "test")
    assert sorted(baseline["points"]) == ["auto-short-10/stock-preset@fp32", "auto-short-10/stock@fp32"]
    assert baseline["points"]["auto-short-10/stock-preset@fp32"]["extra"]["overrides"] == fastpath.FULL_PRESET
    assert "first call s" in capsys.readouterr().out
    assert json.loads(out.read_text())["variants"]["stock@fp32"]["patches"] == []


@pytest.mark.cpu
def test_interleaved_variants_keep_patches_for_the_run_and_revert(model):
    variants = {"a": Variant(model, ("sliced_heads",)), "b": Variant(model, ("sliced_heads",), {"num_step": 2})}
    out = interleaved_variants(variants, dict(text="Hi there.", language="en", num_step=4), rounds=2)
    assert fastpath.applied(model) == []
    assert [len(s.rtf) for s in out.values()] == [2, 2] and all(s.first_call_seconds for s in out.values())
    with pytest.raises(ValueError, match="own model instance"):
        interleaved_variants({"a": Variant(model, ()), "b": Variant(model, ("sliced_heads",))}, {}, rounds=1)


# --- closeness numbers ----------------------------------------------------------------------------------------------


def test_closeness_numbers_on_known_inputs():
    a = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    assert tolerance.relative_error(a, a) == 0.0
    assert tolerance.relative_error(a * 1.01, a) == pytest.approx(0.01)
    assert tolerance.relative_error(torch.tensor([float("nan")]), torch.tensor([1.0])) == math.inf
    assert tolerance.argmax_agreement(a, torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])) == 0.5
    assert tolerance.token_agreement([torch.tensor([[1, 2], [3, 4]])], [torch.tensor([[1, 2], [3, 0]])]) == 0.75
    assert tolerance.token_agreement([torch.zeros(2, 3)], [torch.zeros(2, 4)]) == 0.0
    wave = torch.sin(torch.linspace(0, 100, 4800)).numpy()
    assert tolerance.waveform_cosine(wave, wave) == pytest.approx(1.0)
    assert tolerance.waveform_cosine(-wave, wave) == pytest.approx(-1.0)
    assert tolerance.waveform_snr_db(wave * 1.01, wave) == pytest.approx(40.0, abs=0.01)
    assert tolerance.waveform_snr_db(wave, wave) == math.inf


def test_closeness_of_a_run_with_itself_is_perfect():
    logits = torch.randn(1, 8, 5, 16)
    run = Run(steps=[("call 0 c_logits", logits), ("call 0 u_logits", logits + 1)],
              tokens=[torch.ones(8, 5, dtype=torch.long)], waveforms=[torch.randn(960).numpy()])
    close = tolerance.closeness(run, run)
    assert (close.rel_error, close.argmax_agreement, close.token_agreement) == (0.0, 1.0, 1.0)
    assert close.waveform_cosine == pytest.approx(1.0)
    assert close.waveform_snr_db == math.inf and "argmax agreement 1.0000" in close.describe()
