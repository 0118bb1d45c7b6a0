"""packed_cfg's logic on CPU: the layout, the document block mask, the buckets and the scoring, against the padded
path (stock) within fp32 rounding, with the patch's devices widened to the CPU (on CUDA it is compared with stock in
tests_parity/test_gpu_parity.py).

Not bit-exact by design: the rows attend through FlexAttention (eager on CPU) instead of stock's SDPA over padded
rows, so the reductions run in another order. The tolerances below are data, each with its reason.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import fastpath
from fastpath.gpu import packed
from fastpath.instance import overridden
from harness.parity.parity import record_generation
from harness.model.points import PARITY, load_spec
from harness.parity.tolerance import closeness

MIXED_8 = load_spec()["texts"]["mixed8"]
STACK = ["packed_cfg", "sliced_heads", "static_prefix", "batched_scoring"]  # the GPU stack's loop switches


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(packed, "PACKED_DEVICES", ("cuda", "cpu"))


# These tests run packed_cfg's attention on the CPU, where it is eager FlexAttention by design (the CPU is not in
# COMPILED_FLEX_DEVICES: they check the layout and the mask, not the kernel; the compiled flex on CPU is
# tests_patches/test_inductor.py's). torch warns, once per process, that eager flex materialises every score: here
# that is what is meant, so each such test ignores that warning itself; no filter hides it suite-wide, where eager
# flex would be a fallback (packed.stats() counts every eager call and why; past the compile bound, EagerFlexWarning).
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")


# --- the document block mask ------------------------------------------------------------------------------------

# row lengths (the packed length is their sum rounded up to 128): rows inside one block, rows across blocks, a row
# ending on a block's edge, one row filling whole blocks, many one-position rows
LENGTHS = [
    pytest.param([5, 9, 3], id="three-in-one-block"),
    pytest.param([300, 170, 140, 60], id="across-blocks"),
    pytest.param([128, 128, 5], id="on-the-edges"),
    pytest.param([384], id="whole-blocks"),
    pytest.param([1] * 40 + [200], id="one-position-rows"),
]


@pytest.mark.parametrize("lengths", LENGTHS)
def test_the_block_mask_is_the_one_flex_builds_from_the_rule(lengths):
    """Built from each block's first and last segment (tensor ops only) vs `create_block_mask` evaluating the rule
    at every (query, key): the same blocks, partial and full."""
    n = packed.packed_length(sum(lengths))
    ids = packed.document_ids(lengths, n, "cpu")
    ours = packed.document_block_mask(ids)
    theirs = create_block_mask(lambda b, h, q, kv: ids[q] == ids[kv], 1, 1, n, n, device="cpu")
    assert n % packed.BLOCK == 0 and n - sum(lengths) < packed.BLOCK
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert torch.equal(ours.kv_num_blocks, theirs.kv_num_blocks), (ours.kv_num_blocks, theirs.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)


def test_a_length_off_the_block_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="packed_length"):
        packed.document_block_mask(torch.zeros(100, dtype=torch.int32))


# atol for one attention output over fp32 inputs of unit scale: a softmax-weighted sum of up to 300 values,
# reduced in another order than SDPA's (measured max |diff| about 3e-7 here)
ATTENTION_ATOL = 2e-6


@EAGER_FLEX
@pytest.mark.parametrize("lengths", LENGTHS)
def test_each_row_attends_over_its_own_keys_only(lengths):
    """document_attention on packed rows equals SDPA on each row alone (grouped-query heads, as Qwen3's)."""
    n = packed.packed_length(sum(lengths))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, 16, generator=generator) for heads in (4, 2, 2))
    docs = packed.Documents(packed.document_ids(lengths, n, "cpu"))
    out, _ = packed.document_attention(None, q, k, v, docs, scaling=0.25)  # [1, N, heads, d]
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        alone = torch.nn.functional.scaled_dot_product_attention(q[:, :, rows], k[:, :, rows], v[:, :, rows],
                                                                 scale=0.25, enable_gqa=True)
        diff = (out[0, rows] - alone[0].transpose(0, 1)).abs().max().item()
        assert diff <= ATTENTION_ATOL, f"row at {start} (length {length}): max |diff| {diff:.2e}"
        start += length


@EAGER_FLEX
def test_off_the_compiled_devices_the_attention_runs_eager_counted_with_its_reason():
    """On a device not in COMPILED_FLEX_DEVICES each call is an eager call in packed.stats(), with its reason and
    its packed length; nothing compiles."""
    n, before = 256, packed.stats()
    q, k, v = (torch.randn(1, heads, n, 16) for heads in (4, 2, 2))
    packed.document_attention(None, q, k, v, packed.Documents(packed.document_ids([100, 150], n, "cpu")))
    after, why = packed.stats(), "cpu is not in COMPILED_FLEX_DEVICES"
    assert after["eager_calls"].get(why, 0) == before["eager_calls"].get(why, 0) + 1, (before, after)
    assert (after["compiles"], after["compiled_calls"]) == (before["compiles"], before["compiled_calls"]) and \
        n in after["lengths"], (before, after)


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """document_attention's compiled branch on the CPU, its compile replaced by the uncompiled `_flex` (eager
    FlexAttention: the branch's padding to the rung, its mask and its counts are what is tested, not inductor's
    kernel), with counters of its own."""
    monkeypatch.setattr(packed, "COMPILED_FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(packed, "_compiled_flex", lambda: packed._flex)
    monkeypatch.setattr(packed, "STATS", packed.FlexStats())


# 260 positions in two rows: packed length 384, rung 512; head dim 16 with a scale other than its default 1/4
ROWS, SCALE = [200, 60], 0.3


def packed_qkv(n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, 16, generator=generator) for heads in (4, 2, 2)]  # grouped-query heads


def each_row_alone(q, k, v, lengths):
    """SDPA on each row alone: [1, sum(lengths), heads, d]."""
    rows, start = [], 0
    for length in lengths:
        s = slice(start, start + length)
        rows.append(torch.nn.functional.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s], scale=SCALE,
                                                                     enable_gqa=True).transpose(1, 2))
        start += length
    return torch.cat(rows, dim=1)


@EAGER_FLEX
def test_on_the_compiled_devices_each_row_attends_over_its_own_keys_at_the_rung(compiled_on_cpu):
    """The compiled branch: query, key and value padded to the rung, the rung's block mask, the caller's scale:
    each row's output is SDPA over that row alone, the padding cut off; one compiled call at its rung."""
    n = packed.packed_length(sum(ROWS))
    q, k, v = packed_qkv(n)
    docs = packed.Documents(packed.document_ids(ROWS, n, "cpu"))
    out, weights = packed.document_attention(None, q, k, v, docs, scaling=SCALE)
    assert out.shape == (1, n, 4, 16) and weights is None
    diff = (out[:, : sum(ROWS)] - each_row_alone(q, k, v, ROWS)).abs().max().item()
    assert diff <= ATTENTION_ATOL, f"max |diff| {diff:.2e}"
    assert list(docs.masks) == [packed.rung(n)], "the mask is not the rung's"
    stats = packed.stats()
    assert (stats["compiled_calls"], stats["eager_calls"], stats["lengths"], stats["rungs"]) == (1, {}, [n], [512])


@EAGER_FLEX
def test_past_the_compile_bound_a_new_rung_runs_eager_warned_and_a_compiled_one_still_runs_compiled(
        compiled_on_cpu, monkeypatch):
    """With MAX_COMPILES compiles done, a call whose key compiled already runs compiled; one at a rung never
    compiled runs eager FlexAttention at N, still each row over its own keys, warned (EagerFlexWarning, naming the
    length, its rung, the bound and the rungs compiled) and counted with its reason."""
    n = packed.packed_length(sum(ROWS))
    q, k, v = packed_qkv(n)
    first, _ = packed.document_attention(None, q, k, v, packed.Documents(packed.document_ids(ROWS, n, "cpu")),
                                         scaling=SCALE)
    monkeypatch.setattr(packed, "MAX_COMPILES", 0)  # the bound reached: no compile left
    compiled_out, _ = packed.document_attention(None, q, k, v, packed.Documents(packed.document_ids(ROWS, n, "cpu")),
                                                scaling=SCALE)  # its key compiled already
    assert torch.equal(compiled_out, first)
    assert packed.stats()["compiled_calls"] == 2 and packed.stats()["eager_calls"] == {}
    lengths = [500, 100]  # packed length 640: the next rung, 2048, never compiled
    big = packed.packed_length(sum(lengths))
    q2, k2, v2 = packed_qkv(big, seed=1)
    docs = packed.Documents(packed.document_ids(lengths, big, "cpu"))
    with pytest.warns(packed.EagerFlexWarning, match=rf"packed length {big} \(rung 2048\) runs eager.*"
                      r"compile bound is reached \(0 compiles, fastpath.gpu.packed.MAX_COMPILES = 0; "
                      r"rungs compiled: \[512\]\)"):
        out, _ = packed.document_attention(None, q2, k2, v2, docs, scaling=SCALE)
    assert list(docs.masks) == [None], "the eager call runs at N, with the mask at N"
    diff = (out[:, : sum(lengths)] - each_row_alone(q2, k2, v2, lengths)).abs().max().item()
    assert diff <= ATTENTION_ATOL, f"max |diff| {diff:.2e}"
    stats = packed.stats()
    assert (stats["compiled_calls"], stats["eager_calls"], stats["lengths"], stats["rungs"]) == \
        (2, {"compile bound (0) reached": 1}, [n, big], [512]), stats


@pytest.mark.parametrize("lengths, total", [
    pytest.param([300, 170, 140], 2048, id="eleven-padding-blocks"),  # 610 positions: N 640, rung 2048
    pytest.param([200, 60], 512, id="one-padding-block"),  # 260 positions: N 384, rung 512
])
def test_padding_up_to_the_rung_adds_blocks_that_see_only_themselves(lengths, total):
    """The compiled flex's mask at the rung: the rows' blocks as at N, then each padding block a segment of its own
    (one full diagonal block of work each, never N x N), against `create_block_mask` evaluating the rule."""
    n = packed.packed_length(sum(lengths))
    assert packed.rung(n) == total
    docs = packed.Documents(packed.document_ids(lengths, n, "cpu"))
    ids = packed.padded_ids(docs.ids, total)
    ours, theirs = docs.block_mask(total), create_block_mask(lambda b, h, q, kv: ids[q] == ids[kv], 1, 1, total, total,
                                                            device="cpu")
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)
    pad_blocks = ours.to_dense()[0, 0, n // packed.BLOCK:]  # [padding blocks, all key blocks]
    assert torch.equal(pad_blocks.sum(-1), torch.ones(len(pad_blocks), dtype=pad_blocks.dtype)), pad_blocks
    assert torch.equal(docs.block_mask().to_dense(), packed.document_block_mask(docs.ids).to_dense())


# --- generate: packed against the padded path --------------------------------------------------------------------

# point, generate settings, max step-0 rel err, min argmax agreement, min token agreement
CLOSE = [
    # fp32 through another attention kernel: rounding only (measured rel err about 2e-7); no argmax may flip
    pytest.param("voice_clone_audio", dict(num_step=8), 1e-5, 1.0, 1.0, id="clone"),
    pytest.param("auto_voice", dict(num_step=8), 1e-5, 1.0, 1.0, id="auto"),
    # eight lengths packed in one forward and scored together: over their ~10^5 scored positions a near-tie can
    # flip at fp32 rounding (measured: one in 10^4 at step 0); then the sampler follows another path
    pytest.param("mixed8", dict(num_step=4, position_temperature=0.0), 1e-5, 0.999, 0.99, id="mixed8-deterministic"),
    pytest.param("mixed8", dict(num_step=8), 1e-5, 0.999, 0.99, id="mixed8-sampling", marks=pytest.mark.slow),
]


def request(point: str, settings: dict) -> dict:
    base = dict(text=MIXED_8, language="en") if point == "mixed8" else dict(PARITY[point])
    return {**base, **settings}


@EAGER_FLEX
@pytest.mark.cpu
@pytest.mark.parametrize("point, settings, max_rel_err, min_argmax, min_tokens", CLOSE)
def test_packed_cfg_is_close_to_the_padded_path(model, on_cpu, point, settings, max_rel_err, min_argmax, min_tokens):
    kwargs = request(point, settings)
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model, STACK):
        candidate = record_generation(model, seed=0, **kwargs)
    close = closeness(candidate, stock)
    assert close.rel_error <= max_rel_err, f"{point}: {close.describe()} (max rel err {max_rel_err})"
    assert close.argmax_agreement >= min_argmax, f"{point}: {close.describe()} (min argmax {min_argmax})"
    assert close.token_agreement >= min_tokens, f"{point}: {close.describe()} (min tokens {min_tokens})"


def llm_calls(model, **kwargs) -> list:
    """[(rows, positions)] of every LLM forward of one generate."""
    shapes = []
    handle = model.llm.register_forward_pre_hook(
        lambda _, args, kw: shapes.append(tuple(kw["inputs_embeds"].shape[:2])), with_kwargs=True)
    try:
        torch.manual_seed(0)
        model.generate(**kwargs)
    finally:
        handle.remove()
    return shapes


@EAGER_FLEX
@pytest.mark.cpu
def test_a_mixed_batch_does_no_work_for_its_longest_item(model, on_cpu):
    """Stock: 2B rows of the longest conditional length every step. Packed: one row of every row's own length,
    rounded up to the block; the heads on the target frames only."""
    kwargs = dict(text=MIXED_8, language="en", num_step=2, postprocess_output=False)
    stock = llm_calls(model, **kwargs)
    lengths = []

    def recording(prepare):
        def record(text, t_len, *args):
            out = prepare(text, t_len, *args)
            lengths.append((out["input_ids"].size(-1), t_len))  # (conditional length, target length)
            return out

        return record

    with fastpath.patched(model, STACK), overridden(model, "_prepare_inference_inputs", recording):
        calls = llm_calls(model, **kwargs)
    B, c_max = len(MIXED_8), max(c for c, _ in lengths)
    own = sum(c + t for c, t in lengths)
    assert len(lengths) == B and stock == [(2 * B, c_max)] * 2, stock
    assert calls == [(1, packed.packed_length(own))] * 2, (calls, own)
    assert packed.packed_length(own) < 2 * B * c_max, (own, 2 * B * c_max)


@pytest.mark.cpu
def test_off_its_devices_packed_cfg_is_inert(model):
    """On the CPU (not in PACKED_DEVICES) the patch applies and every call runs stock's layout: bit-exact."""
    from harness.parity.parity import compare_runs

    kwargs = dict(request("batch_of_3", dict(num_step=4)))
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model, "packed_cfg"):
        candidate = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, candidate)
    assert not problems, "\n  ".join(problems)


@pytest.mark.cpu
def test_another_attention_implementation_is_refused_not_read_as_packed(model, on_cpu):
    """Under another attention implementation the rows would see every key of the pack: the call is refused."""
    with fastpath.patched(model, "packed_cfg"):
        wrapper = model.llm.config._attn_implementation
        model.llm.set_attn_implementation("sdpa")
        try:
            with pytest.raises(RuntimeError, match="revert packed_cfg"):
                model.generate(**request("auto_voice", dict(num_step=2)))
        finally:
            model.llm.set_attn_implementation(wrapper)


@EAGER_FLEX
@pytest.mark.cpu
def test_cuda_graphs_replay_packed_calls(model, on_cpu):
    """cuda_graphs' wrapper (capture double on CPU) captures a packed call once per packed length, with the block
    mask built inside the graph from the static segment ids, and its replays give the eager packed run's bits."""
    from fastpath.gpu import graphs
    from harness.parity.parity import compare_runs
    from tests_patches.test_gpu_graphs import graph_doubles

    kwargs = request("batch_of_3", dict(num_step=4))
    with fastpath.patched(model, STACK):
        eager = record_generation(model, seed=0, **kwargs)
        with graph_doubles(model):
            replayed = record_generation(model, seed=0, **kwargs)
            stats = graphs.stats(model)
    problems = compare_runs(eager, replayed)
    assert not problems, "\n  ".join(problems)
    (key,) = stats["keys"]
    assert key.attention.endswith("|packed") and key.rows == 1 and key.length % packed.BLOCK == 0, key
    assert (stats["misses"], stats["hits"], stats["passthrough"]) == (1, 3, 0), stats
