"""The two probes the packed layout relies on, checked on fresh random data (another seed than theirs): the row
count `loop.row_count` picks gives every real row stock's bits, and the query/key cut `loop.attention_cut` picks
gives every real query stock's bits. End to end the parity tier checks the same through generate."""

from __future__ import annotations

import pytest
import torch

from fastpath import loop


def fresh(shape, seed: int = 1234):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.cpu
@pytest.mark.parametrize(("c_lens", "t_lens"), [([62], [43]), ([140], [42]), ([116, 140, 383], [24, 42, 234])],
                         ids=["auto-short", "clone-short", "mixed-3"])
def test_row_count_gives_every_row_stocks_bits(model, c_lens, t_lens):
    B, P = len(c_lens), max(c_lens)
    lengths = c_lens + t_lens
    rows = torch.cat([torch.arange(n) + r * P for r, n in enumerate(lengths)])
    for w in loop.llm_weights(model):
        count = loop.row_count([w], rows, 2 * B * P, max(sum(lengths), loop.MIN_ROWS))
        if count is None:
            pytest.skip(f"no exact row count on this machine for these lengths ({tuple(w.shape)}): the call runs "
                        "stock's layout (tests_patches/test_registry.py::"
                        "test_a_call_without_an_exact_row_count_runs_stocks_layout)")
        assert sum(lengths) <= count <= 2 * B * P
        with torch.no_grad():
            x = fresh((2 * B * P, w.shape[1]))
            stock = torch.nn.functional.linear(x, w)[rows]
            packed = torch.nn.functional.linear(torch.cat([x[rows], x[: count - len(rows)]]), w)[: len(rows)]
        assert torch.equal(packed, stock), f"{tuple(w.shape)}: rows at count {count} differ from stock's"


@pytest.mark.cpu
@pytest.mark.parametrize(("P", "n"), [(140, 42), (361, 142), (596, 352), (383, 24), (243, 45), (236, 117)])
def test_attention_cut_gives_every_real_query_stocks_bits(model, P, n):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn = model.llm.layers[0].self_attn
    inner = model.llm.config._attn_implementation.split("|")[-1]
    h, kv, d = model.llm.config.num_attention_heads, model.llm.config.num_key_value_heads, attn.head_dim
    mask = torch.zeros(1, 1, P, P, dtype=torch.bool)
    mask[..., :n, :n] = True
    mask[0, 0, torch.arange(n, P), torch.arange(n, P)] = True
    q, k, v = (fresh((1, P, heads, d), seed).transpose(1, 2) for heads, seed in ((h, 1), (kv, 2), (kv, 3)))
    kwargs = {"scaling": attn.scaling, "dropout": 0.0}
    Q, K = loop.attention_cut(inner, attn, q, k, mask, n, kwargs)
    assert n <= Q <= P and Q <= K <= P
    with torch.no_grad():
        stock = ALL_ATTENTION_FUNCTIONS[inner](attn, q, k, v, mask, **kwargs)[0][:, :n]
        cut = ALL_ATTENTION_FUNCTIONS[inner](attn, q[:, :, :Q], k[:, :, :K], v[:, :, :K], mask[..., :Q, :K],
                                             **kwargs)[0][:, :n]
    assert torch.equal(cut, stock), f"cut ({Q}, {K}) of ({n}, {P}) gives other bits than stock's full width"


# The points where, on the AVX-512 Xeon, the packed rows cross MKL's kernel switches (the GEMMs at K = 2048 and
# 3072, the heads at 128 rows) and attention is cut: the full-size model's shapes, which the tiny model lacks.
FULL_SIZE_POINTS = ["clone3-short-32", "clone3-medium-32", "clone6-short-32", "clone6-medium-32", "clone6-long-32"]


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_SIZE_POINTS)
def test_the_stack_is_bit_exact_on_the_full_size_model(full_checkpoint, name):
    """2 steps of stock and of the lossless stack on the full-size checkpoint: every per-step logit, score,
    token and waveform equal (what scripts/full_size_parity.py tabulates over the whole grid)."""
    import fastpath
    from harness.model.checkpoint import load_model
    from harness.parity.parity import compare_runs, record_generation
    from harness.speed.bench import point_kwargs

    model = load_model(full_checkpoint)
    kwargs = point_kwargs(name, model, {}, steps=2)
    stock = record_generation(model, seed=0, **kwargs)
    with fastpath.patched(model):
        stack = record_generation(model, seed=0, **kwargs)
    problems = compare_runs(stock, stack)
    assert not problems, f"{name} at full size: not bit-exact:\n  " + "\n  ".join(problems)


@pytest.mark.cpu
def test_padded_gemms_runs_only_the_named_shapes_on_more_rows(model):
    """loop.padded_gemms: the GEMMs of the named weight shape see that many rows, the others the forward's own;
    the forward's output is the same shape and (rows being independent here or not) every hook is gone after."""
    weights = loop.llm_weights(model)
    shape = tuple(weights[0].shape)
    seen: dict = {}
    linears = [m for m in model.llm.layers.modules() if isinstance(m, torch.nn.Linear)]
    embeds, spies = fresh((1, 20, model.llm.config.hidden_size)), []
    try:
        with torch.no_grad(), loop.padded_gemms(model, {shape: 37}, 20):  # spies after its hooks: they see its rows
            spies = [m.register_forward_pre_hook(
                lambda m, a: seen.setdefault(tuple(m.weight.shape), set()).add(a[0].size(1))) for m in linears]
            hidden = model.llm(inputs_embeds=embeds, return_dict=True)[0]
    finally:
        for spy in spies:
            spy.remove()
    assert hidden.shape == (1, 20, model.llm.config.hidden_size)
    assert seen.pop(shape) == {37}, f"{shape}: not run on the 37 rows asked for"
    assert all(rows == {20} for rows in seen.values()), f"other shapes padded: {seen}"
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in linears), "padded_gemms left a hook behind"


@pytest.mark.parametrize("threshold", [12, 36, 50])
def test_row_count_bisects_to_the_kernels_row_count_threshold(monkeypatch, threshold):
    """Where no count just above the least gives stock's bits, row_count bisects above for the smallest that does.
    The kernel is stood in for: a GEMM whose bits change where it switches blocking at `threshold` rows (below it,
    every output one ulp off). Stock's call of 64 rows is past the switch; the scan (least 4 .. 4 + PROBE_SCAN - 1)
    is below it, so only the bisection can find it."""
    real = torch.nn.functional.linear

    def kernel(x, w, bias=None):
        out = real(x, w, bias)
        return out if x.size(0) >= threshold else torch.nextafter(out, out + 1)

    monkeypatch.setattr(torch.nn.functional, "linear", kernel)
    monkeypatch.setattr(loop, "_ROW_COUNTS", {})  # its memo is keyed by shapes, not by the kernel
    least = 4
    assert least + loop.PROBE_SCAN <= threshold
    assert loop.row_count([fresh((5, 3))], torch.arange(least), 64, least) == threshold


@pytest.mark.cpu
@pytest.mark.parametrize("mask", ["none", "as wide as the keys"])
def test_the_padded_key_attention_passes_a_call_it_need_not_pad_to_the_attention_it_wraps(model, mask):
    """trimmed_cfg's attention (loop.padded_key_attention) pads keys only up to a wider 4-D mask; a call without a
    mask, or with one as wide as the keys, is the wrapped attention's own call, bit for bit."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn = model.llm.layers[0].self_attn
    inner = model.llm.config._attn_implementation.split("|")[-1]
    h, kv, d = model.llm.config.num_attention_heads, model.llm.config.num_key_value_heads, attn.head_dim
    q, k, v = (fresh((1, 20, heads, d), seed).transpose(1, 2) for heads, seed in ((h, 1), (kv, 2), (kv, 3)))
    m = None if mask == "none" else torch.ones(1, 1, 20, 20, dtype=torch.bool)
    kwargs = {"scaling": attn.scaling, "dropout": 0.0}
    wrapped = loop.padded_key_attention(inner)
    with torch.no_grad():
        want = ALL_ATTENTION_FUNCTIONS[inner](attn, q, k, v, m, **kwargs)[0]
        got = wrapped(attn, q, k, v, m, **kwargs)[0]
    assert torch.equal(got, want)


# (P keys and queries, n real queries, which (Q, K) cuts the stand-in kernel gives stock's bits at, the cut expected)
CUT_CASES = [
    # P = 200: stock's flash kernel runs 64-query blocks from 192 queries up; 64 queries are not enough here, the
    # cut that keeps stock's block count is
    pytest.param(200, 40, lambda Q, K: Q >= 192, (192, 192), id="64-query-blocks"),
    # P = 768: 256-query blocks, so no cut below 768 queries is tried (one at 192 would be, with 64-query blocks)
    pytest.param(768, 40, lambda Q, K: Q >= 192, (768, 768), id="256-query-blocks"),
    # no cut on the list gives stock's bits: the whole width
    pytest.param(100, 40, lambda Q, K: (Q, K) == (100, 100), (100, 100), id="none-exact"),
]


@pytest.mark.parametrize("P, n, exact, want", CUT_CASES)
def test_attention_cut_tries_its_list_in_order_and_falls_back_to_the_whole_width(monkeypatch, P, n, exact, want):
    """attention_cut's short list (queries rounded to 32, then to stock's query block; keys to 64, 512, P) against a
    stand-in kernel whose output for the real queries is stock's only at the cuts `exact` allows."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def kernel(module, q, k, v, mask, **kwargs):  # [B, Q, heads, d]: zeros where exact, ones elsewhere
        Q, K = q.size(2), k.size(2)  # a batch other than stock's one row runs other blocks: other bits
        return torch.full((q.size(0), Q, q.size(1), q.size(3)), 0.0 if exact(Q, K) and q.size(0) == 1 else 1.0), None

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "stand_in", kernel)
    monkeypatch.setattr(loop, "_ATTENTION_CUTS", {})  # its memo is keyed by shapes, not by the kernel
    query, key = torch.zeros(1, 2, P, 4), torch.zeros(1, 1, P, 4)
    mask = torch.ones(1, 1, P, P, dtype=torch.bool)
    assert loop.attention_cut("stand_in", None, query, key, mask, n, {}) == want


def test_row_count_probes_in_the_weights_dtype(monkeypatch):
    """The probe inputs take the weight's dtype: a bf16 weight (a bf16 model's) is probed with bf16 rows, as its
    GEMM runs, and gets a count where its every row has stock's bits."""
    monkeypatch.setattr(loop, "_ROW_COUNTS", {})  # a fresh memo: this call measures
    count = loop.row_count([fresh((5, 3)).to(torch.bfloat16)], torch.arange(4), 16, 4)
    assert count is not None and 4 <= count <= 16
