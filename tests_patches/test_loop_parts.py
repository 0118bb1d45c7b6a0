"""Parts of the fastpath loop checked alone, against recording stand-ins (no checkpoint): the rows the audio heads get
(`audio_logits`), the GEMM probe's calls (`gemm_rows_independent`), batch_invariant's refusal, and a whole
`generate_iterative` on a stand-in model on `meta`, where a tensor made without the model's device lands elsewhere
(on a CPU-only machine the CPU is both, so CPU parity cannot tell)."""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest
import torch

from fastpath import loop

META = torch.device("meta")

# --- audio_logits ----------------------------------------------------------------------------------------------------


class Heads:
    """Stand-in audio heads [H] -> [C * V]: each row on its own (its bits whatever the call's row count); records the
    rows it was given."""

    def __init__(self, H: int, out: int, dtype=torch.float32):
        self.weight = torch.randn(out, H, generator=torch.Generator().manual_seed(4)).to(dtype)
        self.seen = []

    def __call__(self, flat):
        self.seen.append(flat.clone())
        return torch.cat([torch.nn.functional.linear(row[None], self.weight) for row in flat])


@pytest.mark.parametrize("G, T", [(1, 3), (2, 7), (2, 8), (3, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_heads_run_on_at_least_min_rows_and_give_each_row_its_logits(G, T, dtype):
    """Fewer than MIN_ROWS rows get zero rows up to MIN_ROWS (the kernel of stock's large batch); more run as they are.
    The logits come back per row, float32, [G, T, C, V]."""
    C, V, H = 2, 3, 5
    heads = Heads(H, C * V, dtype)
    model = SimpleNamespace(audio_heads=heads, config=SimpleNamespace(num_audio_codebook=C, audio_vocab_size=V))
    hidden = torch.randn(G, T, H, generator=torch.Generator().manual_seed(5)).to(dtype)
    got = loop.audio_logits(model, hidden)
    (flat,) = heads.seen
    rows = max(G * T, loop.MIN_ROWS)
    assert tuple(flat.shape) == (rows, H), f"{G} x {T} rows reached the heads as {tuple(flat.shape)}, not ({rows}, {H})"
    assert torch.equal(flat[: G * T], hidden.reshape(G * T, H)) and not flat[G * T :].any(), "not the rows, then zeros"
    want = torch.cat([torch.nn.functional.linear(row[None], heads.weight) for row in hidden.reshape(G * T, H)])
    want = want.view(G, T, C, V).float()
    assert got.dtype == torch.float32 and torch.equal(got, want)


# --- gemm_rows_independent -------------------------------------------------------------------------------------------


def probe_model(dtype=torch.float32):
    """A stand-in with the three weights the probe reads: q_proj [300, 8] (300 rows: the probe keeps 256),
    down_proj [8, 12], the heads [20, 8]."""
    weight = lambda *shape: torch.randn(*shape, generator=torch.Generator().manual_seed(6)).to(dtype)  # noqa: E731
    layer = SimpleNamespace(self_attn=SimpleNamespace(q_proj=SimpleNamespace(weight=weight(300, 8))),
                            mlp=SimpleNamespace(down_proj=SimpleNamespace(weight=weight(8, 12))))
    return SimpleNamespace(llm=SimpleNamespace(layers=[layer]), audio_heads=SimpleNamespace(weight=weight(20, 8)))


class Linear:
    """Stand-in for nn.functional.linear as a product and a sum over K per output (rows independent unless
    `other(offset, rows)` says a call's bits differ: then every output one ulp off). Records (the first row's offset
    into the probe's rows, rows, weight shape, dtype) of each call."""

    def __init__(self, other=lambda offset, rows: False):
        self.other, self.calls, self.inputs = other, [], []

    def __call__(self, x, w, bias=None):
        offset = x.storage_offset() // x.size(1)
        self.calls.append((offset, x.size(0), tuple(w.shape), x.dtype))
        self.inputs.append(x)
        out = (x[:, None, :] * w[None]).sum(-1)  # [rows, N]
        return torch.nextafter(out, out + 1) if self.other(offset, x.size(0)) else out


# the probe's calls on one weight: all 88 rows, then 16 to 39 rows at offsets 0, 5 and 17
PROBE_CALLS = [(0, 88)] + [(o, m) for o in (0, 5, 17) for m in range(16, 40)]


def test_the_gemm_probe_calls_every_row_count_at_three_offsets_per_weight_once(monkeypatch):
    gemm = Linear()
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_PROBED", {})
    rng = torch.random.get_rng_state()
    assert loop.gemm_rows_independent(probe_model()) is True
    assert torch.equal(torch.random.get_rng_state(), rng), "the probe drew from the global random stream"
    shapes = [(256, 8), (8, 12), (20, 8)]  # q_proj cut to its first 256 output features
    want = [(o, m, shape, torch.float32) for shape in shapes for o, m in PROBE_CALLS]
    assert gemm.calls == want, "not 88 rows, then 16..39 rows at offsets 0, 5, 17, for each of the three weights"
    first = gemm.inputs[0]
    assert torch.equal(first, torch.randn(88, 8, generator=torch.Generator().manual_seed(0))), "not the seeded rows"
    assert set(loop._PROBED) == {(8, 256, torch.get_num_threads(), torch.float32),
                                 (12, 8, torch.get_num_threads(), torch.float32),
                                 (8, 20, torch.get_num_threads(), torch.float32)}
    calls = len(gemm.calls)
    assert loop.gemm_rows_independent(probe_model()) is True and len(gemm.calls) == calls, "measured twice"


def test_the_gemm_probe_says_no_at_the_first_row_count_with_other_bits_and_remembers_it(monkeypatch):
    """21 rows at offset 5 get other bits: the probe stops there (the first weight's) and answers False, then and
    when asked again, without measuring again."""
    gemm = Linear(other=lambda offset, rows: (offset, rows) == (5, 21))
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_PROBED", {})
    assert loop.gemm_rows_independent(probe_model()) is False
    assert [(o, m) for o, m, *_ in gemm.calls] == PROBE_CALLS[: PROBE_CALLS.index((5, 21)) + 1]
    assert list(loop._PROBED.values()) == [False]
    calls = len(gemm.calls)
    assert loop.gemm_rows_independent(probe_model()) is False and len(gemm.calls) == calls


def test_the_gemm_probe_runs_in_the_weights_dtype_and_per_thread_count(monkeypatch, torch_settings):
    gemm = Linear()
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_PROBED", {})
    assert loop.gemm_rows_independent(probe_model(torch.bfloat16)) is True
    assert {dtype for *_, dtype in gemm.calls} == {torch.bfloat16}
    calls = len(gemm.calls)
    torch.set_num_threads(torch.get_num_threads() + 1)  # put back by torch_settings
    assert loop.gemm_rows_independent(probe_model(torch.bfloat16)) is True
    assert len(gemm.calls) == 2 * calls, "another thread count: not measured again"


# --- enable ----------------------------------------------------------------------------------------------------------


def test_batch_invariant_is_refused_where_gemm_rows_depend_on_the_count_and_the_refusal_says_how_to_fix_it(
        monkeypatch):
    monkeypatch.setattr(loop, "gemm_rows_independent", lambda model: False)
    model = SimpleNamespace()
    with pytest.raises(loop.UnsupportedHereError) as refused:
        loop.enable(model, "batch_invariant")
    assert str(refused.value) == (
        "batch_invariant promises items bit-exact with batch-1 calls, which needs a CPU GEMM whose rows do not "
        "depend on how many rows share the call; this machine's does (fastpath.loop.gemm_rows_independent). "
        "Start Python with MKL_CBWR=AVX2,STRICT (or AUTO,STRICT) to make MKL's rows independent.")
    assert vars(model) == {}, "a refused switch left something on the model"


# --- generate_iterative on meta --------------------------------------------------------------------------------------


class OnMeta:
    """A stand-in OmniVoice on `meta` with the tiny model's config and upstream's scoring: inputs of the lengths
    C_LENS (text i is item i), an LLM and heads of zeros; every tensor it makes is on meta."""

    C_LENS = (30, 21)

    def __init__(self, model, flags):
        self.config, self.device = model.config, META
        self._predict_tokens_with_scoring = types.MethodType(type(model)._predict_tokens_with_scoring, self)
        C, V, H = model.config.num_audio_codebook, model.config.audio_vocab_size, model.llm.config.hidden_size
        self.H, self.C, self.V = H, C, V
        self.llm = self.LLM(H)
        self.audio_heads = lambda flat: torch.zeros(flat.size(0), C * V, device=flat.device)
        self.__dict__[loop.FLAGS_ATTR] = set(flags)
        self.embedded = []  # the input_ids shape of every _prepare_embed_inputs call

    class LLM:
        def __init__(self, H):
            self.H = H
            self.config = SimpleNamespace(_attn_implementation=loop.PADDED_ATTENTION + "sdpa")

        def __call__(self, inputs_embeds, **kwargs):
            return (torch.zeros(*inputs_embeds.shape[:2], self.H, device=inputs_embeds.device),)

    def _prepare_inference_inputs(self, text, target_len, *_):
        c = self.C_LENS[int(text)]
        return {"input_ids": torch.zeros(1, self.C, c, dtype=torch.long, device=META),
                "audio_mask": torch.zeros(1, c, dtype=torch.bool, device=META)}

    def _prepare_embed_inputs(self, input_ids, audio_mask):
        self.embedded.append(tuple(input_ids.shape))
        return torch.zeros(input_ids.size(0), input_ids.size(-1), self.H, device=input_ids.device)

    def __call__(self, input_ids, audio_mask, attention_mask):
        G, C, L = input_ids.shape
        return SimpleNamespace(logits=torch.zeros(G, C, L, self.V, device=input_ids.device))


@pytest.mark.parametrize("flags", [
    pytest.param([], id="stock-loop"),
    pytest.param(["batch_invariant", "static_prefix"], id="grouped"),
    pytest.param(["packed_cfg", "sliced_heads", "static_prefix"], id="packed_cfg"),
])
def test_a_generate_on_a_model_off_the_cpu_keeps_every_tensor_on_its_device(model, monkeypatch, flags):
    """generate_iterative for a stand-in on `meta` (packed_cfg's devices widened to meta): it runs to the end and
    gives meta tokens of each item's length. A tensor the loop makes without the model's device (the tokens, the
    packed logits, the layer ids) lands on the CPU and meets the meta ones, which fails. (batched_scoring's
    unmask_batched sizes a tensor by values, which meta has not: tests_patches/test_device_placement.py runs it.)"""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    monkeypatch.setattr(loop, "packed_devices", lambda: ("meta",))
    layouts, made = [], loop.packed_layout

    def recording(*args, **kwargs):  # a packed layout's index tensors are only read: a CPU one would not fail
        layouts.append(made(*args, **kwargs))
        return layouts[-1]

    monkeypatch.setattr(loop, "packed_layout", recording)
    stand_in = OnMeta(model, flags)
    task = SimpleNamespace(batch_size=2, texts=["0", "1"], target_lens=[7, 4], ref_texts=[None] * 2,
                           ref_audio_tokens=[None] * 2, langs=[None] * 2, instructs=[None] * 2)
    try:
        tokens = loop.generate_iterative(stand_in, task, OmniVoiceGenerationConfig(num_step=2))
    except (RuntimeError, NotImplementedError) as err:
        pytest.fail(f"a tensor of the loop left the model's device (meta): {err}")
    assert [(t.device, tuple(t.shape)) for t in tokens] == [(META, (stand_in.C, 7)), (META, (stand_in.C, 4))]
    placed = {name: value.device for layout in layouts if layout is not None for name, value in vars(layout).items()
              if isinstance(value, torch.Tensor)}
    assert set(placed.values()) <= {META}, placed
    assert bool(placed) == ("packed_cfg" in flags), (flags, placed)


@pytest.mark.parametrize("flags, first, later", [
    # four batches of one row each (prompts 21 and 30 wide, targets at least MIN_ROWS wide), their targets 4 and 7
    pytest.param(["batch_invariant", "static_prefix"], [21, 16, 30, 16], [4, 4, 7, 7], id="grouped"),
    # one packed forward of 128 positions (the 62 rows' own, rounded up to the block), its 2 x 11 target frames
    pytest.param(["packed_cfg", "sliced_heads", "static_prefix"], [128], [22], id="packed_cfg"),
])
def test_static_prefix_embeds_every_position_once_then_only_the_target_frames(model, monkeypatch, flags, first,
                                                                              later):
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    monkeypatch.setattr(loop, "packed_devices", lambda: ("meta",))
    stand_in = OnMeta(model, flags)
    task = SimpleNamespace(batch_size=2, texts=["0", "1"], target_lens=[7, 4], ref_texts=[None] * 2,
                           ref_audio_tokens=[None] * 2, langs=[None] * 2, instructs=[None] * 2)
    loop.generate_iterative(stand_in, task, OmniVoiceGenerationConfig(num_step=3))
    widths = [shape[-1] for shape in stand_in.embedded]
    assert widths == first + later + later, f"positions embedded per call {widths}: not all once, then the targets"


def test_the_loop_prepares_each_items_inputs_as_upstreams_loop_does():
    """generate_iterative asks _prepare_inference_inputs for each item with the arguments upstream's
    _generate_iterative gives it (text, target length, reference text and tokens, language, instruction, denoise),
    in item order: both run on a stand-in that records the calls (and stops them there), every field distinct,
    denoise off (upstream's default is on)."""
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceGenerationConfig

    class Prepared(Exception):
        pass

    class Recorder:
        config = SimpleNamespace(num_audio_codebook=2, audio_mask_id=9, audio_vocab_size=10)
        device = torch.device("cpu")

        def __init__(self):
            self.calls = []

        def _prepare_inference_inputs(self, *args, **kwargs):
            self.calls.append((tuple(id(a) if torch.is_tensor(a) else a for a in args), kwargs))
            if len(self.calls) == 2:
                raise Prepared

    reference = torch.zeros(2, 3)
    task = SimpleNamespace(batch_size=2, texts=["a", "b"], target_lens=[7, 4], ref_texts=["ra", None],
                           ref_audio_tokens=[reference, None], langs=["en", None], instructs=[None, "whisper"],
                           ref_rms=[None, None])
    config = OmniVoiceGenerationConfig(denoise=False)
    calls = []
    for generate in (OmniVoice._generate_iterative, loop.generate_iterative):
        recorder = Recorder()
        with pytest.raises(Prepared):
            generate(recorder, task, config)
        calls.append(recorder.calls)
    assert calls[1] == calls[0], f"fastpath's loop prepared {calls[1]}, upstream's {calls[0]}"
    assert calls[0][0][0][-1] is False, "control: upstream passes denoise"


# --- packed_counts ---------------------------------------------------------------------------------------------------


def counts_of(monkeypatch, c_lens, t_lens, sliced_heads, answer):
    """loop.packed_counts for a stand-in with two LLM weight shapes, (6, 4) and (4, 6), and heads (10, 4), with
    row_count stood in by `answer(shape, least)` -> (its Counts, the row_count calls: (shape, stock rows, stock's
    count, least))."""
    weights = [torch.zeros(6, 4), torch.zeros(4, 6)]
    heads = torch.zeros(10, 4)
    calls = []

    def row_count(ws, rows, stock_count, least):
        (w,) = ws
        shape = "heads" if w is heads else tuple(w.shape)
        calls.append((shape, rows.tolist(), stock_count, least))
        return answer(shape, least)

    monkeypatch.setattr(loop, "llm_weights", lambda model: weights)
    monkeypatch.setattr(loop, "row_count", row_count)
    model = SimpleNamespace(audio_heads=SimpleNamespace(weight=heads))
    return loop.packed_counts(model, c_lens, t_lens, sliced_heads), calls


# two items of prompts 5 and 3 positions, targets 2 and 1: stock's call is 2 x 2 rows of P = 5 (20 rows); the packed
# rows are the prompts' 5 and 3 positions (rows 0-4, 5-7 of stock's call) and the targets' 2 and 1 (rows 10-11, 15)
SLOTS = [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 15]
TARGETS = [3, 4, 7, 10, 11, 15]  # the tail of each row: its target frames


def test_packed_counts_asks_row_count_per_weight_shape_from_min_rows_and_the_heads_for_the_targets(monkeypatch):
    extra = {(6, 4): 0, (4, 6): 3, "heads": 1}
    counts, calls = counts_of(monkeypatch, [5, 3], [2, 1], True, lambda shape, least: least + extra[shape])
    assert calls == [((6, 4), SLOTS, 20, 16), ((4, 6), SLOTS, 20, 16), ("heads", TARGETS, 20, 16)], (
        "11 packed rows, at least MIN_ROWS")
    assert counts == loop.Counts(llm=16, gemms={(4, 6): 19}, heads=17)


def test_packed_counts_runs_the_heads_on_every_position_without_sliced_heads(monkeypatch):
    counts, calls = counts_of(monkeypatch, [5, 3], [2, 1], False, lambda shape, least: least + (shape == (6, 4)))
    assert calls[-1] == ("heads", SLOTS, 20, 16), "the heads from the forward's count, on every packed position"
    assert counts == loop.Counts(llm=16, gemms={(6, 4): 17}, heads=16)


def test_packed_counts_of_more_rows_than_min_rows_start_at_the_rows(monkeypatch):
    counts, calls = counts_of(monkeypatch, [20, 12], [6, 4], True, lambda shape, least: least)
    assert [least for *_, least in calls] == [42, 42, 20], "the forward from its 42 rows, the heads from 2 x 10 frames"
    assert [stock for _, _, stock, _ in calls] == [80, 80, 80]
    assert counts == loop.Counts(llm=42, gemms={}, heads=20)


@pytest.mark.parametrize("missing", [(4, 6), "heads"])
def test_packed_counts_is_none_where_some_gemm_has_no_exact_count(monkeypatch, missing):
    counts, _ = counts_of(monkeypatch, [5, 3], [2, 1], True, lambda shape, least: None if shape == missing else least)
    assert counts is None


# --- packed_layout ---------------------------------------------------------------------------------------------------


def packed_items():
    """Two items for packed_layout, prompts of 5 and 3 positions (ids 10.. and 20.., the last two and one audio),
    targets of 2 and 1 frames; codebooks 2, mask id 99."""
    model = SimpleNamespace(config=SimpleNamespace(num_audio_codebook=2, audio_mask_id=99), device=torch.device("cpu"))
    inputs = []
    for base, c, t in ((10, 5, 2), (20, 3, 1)):
        ids = torch.stack([torch.arange(base, base + c), torch.arange(base + 50, base + 50 + c)])[None]  # [1, 2, c]
        audio = torch.zeros(1, c, dtype=torch.bool)
        audio[0, c - t :] = True
        inputs.append({"input_ids": ids, "audio_mask": audio})
    return model, inputs


@pytest.mark.parametrize("pad", [0, 1, 3, 7], ids=["no-padding", "one-padding-row", "one-padding-segment",
                                                  "two-padding-segments"])
def test_packed_layout_puts_the_rows_back_to_back_and_lists_every_target_frame(monkeypatch, pad):
    """The conditional rows, then the unconditional (their targets), then padding segments of at most P masked ids up
    to the forward's row count; each row's positions from 0, stock's mask per segment (padding on itself only), and
    every target frame: where it sits, its item, kind, frame and column in the packed logits."""
    model, inputs = packed_items()
    counts = loop.Counts(llm=11 + pad, gemms={(4, 6): 30}, heads=20)
    asked = []
    monkeypatch.setattr(loop, "packed_counts", lambda *args: asked.append(args[1:]) or counts)
    packed = loop.packed_layout(model, inputs, [5, 3], [2, 1], [0, 2], sliced_heads=True)
    assert asked == [([5, 3], [2, 1], True)]
    padding = {0: [], 1: [1], 3: [3], 7: [5, 2]}[pad]  # segments of at most P = 5
    lengths = [5, 3, 2, 1] + padding
    starts = [0, 5, 8, 10, 11, 16][: len(lengths)]
    assert (packed.unpacking.starts, packed.unpacking.lengths, packed.unpacking.real_rows) == (
        tuple(starts), tuple(lengths), 4)
    want_ids = [[10, 11, 12, 13, 14, 20, 21, 22, 13, 14, 22] + [99] * pad,
                [60, 61, 62, 63, 64, 70, 71, 72, 63, 64, 72] + [99] * pad]
    assert (packed.input_ids.dtype, packed.audio_mask.dtype, packed.attention_mask.dtype) == (
        torch.long, torch.bool, torch.bool)
    assert packed.input_ids.tolist() == [want_ids]
    assert packed.audio_mask.tolist() == [[False, False, False, True, True, False, False, True, True, True, True]
                                          + [False] * pad]
    assert packed.position_ids.tolist() == [[p for n in lengths for p in range(n)]]
    mask = torch.zeros(len(lengths), 1, 5, 5, dtype=torch.bool)
    for r, n in enumerate(lengths):
        real = n if r < 4 else 0
        mask[r, 0, :real, :real] = True
        for p in range(real, 5):
            mask[r, 0, p, p] = True
    assert torch.equal(packed.attention_mask, mask)
    assert packed.targets.tolist() == [3, 4, 7, 8, 9, 10]
    assert packed.items.tolist() == [0, 0, 1, 0, 0, 1]
    assert packed.kinds.tolist() == [0, 0, 0, 1, 1, 1]
    assert packed.frames.tolist() == [0, 1, 0, 0, 1, 0]
    assert packed.columns.tolist() == [0, 1, 2, 0, 1, 2]
    assert (packed.head_rows, packed.gemm_rows, packed.documents, packed.embeds) == (20, {(4, 6): 30}, None, None)


@pytest.mark.parametrize("sliced_heads", [False, True])
def test_packed_cfgs_layout_rounds_the_rows_up_to_the_block_in_one_padding_segment(monkeypatch, sliced_heads):
    """With documents (packed_cfg): no row count is measured; the 11 positions of the rows are followed by one padding
    segment up to the block's 128, each row a document of its own and the padding one more; the GEMMs run on the
    128 rows, the heads on those or (sliced_heads) on the 2 x 3 target frames."""
    from fastpath.gpu import packed as varlen

    model, inputs = packed_items()
    monkeypatch.setattr(loop, "packed_counts", lambda *args: pytest.fail("packed_cfg measured row counts"))
    packed = loop.packed_layout(model, inputs, [5, 3], [2, 1], [0, 2], sliced_heads=sliced_heads, documents=True)
    assert varlen.BLOCK == 128
    assert packed.unpacking.lengths == (5, 3, 2, 1, 117) and packed.unpacking.starts == (0, 5, 8, 10, 11)
    assert packed.input_ids.shape == (1, 2, 128) and packed.position_ids[0, 11:].tolist() == list(range(117))
    assert packed.audio_mask.dtype == torch.bool and not packed.audio_mask[0, 11:].any()
    assert packed.attention_mask.shape == (1, 1, 1, 1)
    assert (packed.head_rows, packed.gemm_rows) == (6 if sliced_heads else 128, {})
    assert packed.documents.ids.tolist() == [0] * 5 + [1] * 3 + [2] * 2 + [3] + [4] * 117
    assert packed.targets.tolist() == [3, 4, 7, 8, 9, 10]


def test_packed_layout_is_none_without_row_counts(monkeypatch):
    model, inputs = packed_items()
    monkeypatch.setattr(loop, "packed_counts", lambda *args: None)
    assert loop.packed_layout(model, inputs, [5, 3], [2, 1], [0, 2]) is None


# --- index_targets ---------------------------------------------------------------------------------------------------


def test_index_targets_lists_each_rows_frames_repeating_a_short_rows_last():
    """Rows of item 0 (target 2 frames, starting at 3 in its conditional row) and item 1 (1 frame, at 2), conditional
    then unconditional; item 1's columns start at 2."""
    rows = [loop.Row(0, True, 3, 2), loop.Row(1, True, 2, 1), loop.Row(0, False, 0, 2), loop.Row(1, False, 0, 1)]
    group = loop.Group(rows, torch.zeros(4, 2, 5, dtype=torch.long), torch.zeros(4, 5, dtype=torch.bool),
                       torch.zeros(4, 1, 5, 5, dtype=torch.bool))
    assert loop.index_targets(group, [0, 2]) is group
    assert group.frames.tolist() == [[0, 1], [0, 0], [0, 1], [0, 0]]
    assert group.positions.tolist() == [[3, 4], [2, 2], [0, 1], [0, 0]]
    assert group.packed.tolist() == [[0, 1], [2, 2], [0, 1], [2, 2]]
    assert (group.items.tolist(), group.kinds.tolist()) == ([0, 1, 0, 1], [0, 0, 1, 1])


# --- padded_key_attention --------------------------------------------------------------------------------------------


class Inner:
    """A stand-in attention implementation: records its calls; its output [G, L, heads, d] is the query transposed,
    plus 1 where the query is zero (so padding rows show), with weights "w"."""

    def __init__(self):
        self.calls = []

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        self.calls.append(dict(module=module, query=query, key=key, value=value, mask=attention_mask, kwargs=kwargs))
        out = query.transpose(1, 2)
        return out + (out == 0), "w"


def padded_call(monkeypatch, mask, L=3, keys=3, **extra):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = Inner()
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "stand_in", inner)
    generator = torch.Generator().manual_seed(8)
    query = torch.randn(2, 4, L, 3, generator=generator)  # [G, heads, L, d]
    key, value = (torch.randn(2, 2, keys, 3, generator=generator) for _ in range(2))  # [G, kv_heads, keys, d]
    attention = loop.padded_key_attention("stand_in")
    out, weights = attention("module", query, key, value, mask, scaling=0.5, **extra)
    return inner.calls, (query, key, value), out, weights


@pytest.mark.parametrize("P", [4, 5])
def test_the_padded_key_attention_pads_queries_keys_and_values_to_the_masks_width(monkeypatch, P):
    """A [G, 1, L, P] mask wider than the L keys: queries, keys and values get zero rows up to P, the mask False rows,
    and the output is cut back to the L real queries."""
    mask = torch.rand(2, 1, 3, P, generator=torch.Generator().manual_seed(9)) > 0.5
    calls, (query, key, value), out, weights = padded_call(monkeypatch, mask)
    (call,) = calls
    pad = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], P - 3, t.shape[3])], dim=2)  # noqa: E731
    assert call["module"] == "module" and call["kwargs"] == {"scaling": 0.5}
    assert all(torch.equal(call[name], pad(t)) for name, t in zip(("query", "key", "value"), (query, key, value)))
    assert torch.equal(call["mask"], torch.cat([mask, torch.zeros(2, 1, P - 3, P, dtype=torch.bool)], dim=2))
    assert torch.equal(out, query.transpose(1, 2)) and weights == "w", "not the real queries' rows of the output"


@pytest.mark.parametrize("mask", [
    pytest.param(None, id="no-mask"),
    pytest.param(torch.ones(2, 1, 3, 3, dtype=torch.bool), id="as-wide-as-the-keys"),
    pytest.param(torch.ones(2, 1, 3, 2, dtype=torch.bool), id="narrower-than-the-keys"),
    pytest.param(torch.ones(2, 1, 5, dtype=torch.bool), id="not-4-d"),
])
def test_the_padded_key_attention_passes_a_call_it_need_not_pad_as_it_is(monkeypatch, mask):
    calls, (query, key, value), out, weights = padded_call(monkeypatch, mask)
    (call,) = calls
    assert call["module"] == "module" and call["kwargs"] == {"scaling": 0.5}
    assert all(call[name] is t for name, t in zip(("query", "key", "value", "mask"), (query, key, value, mask)))
    assert torch.equal(out, query.transpose(1, 2) + (query.transpose(1, 2) == 0)) and weights == "w"


def test_prefix_kv_caches_fewer_queries_than_keys_pass_as_they_are(monkeypatch):
    mask = torch.ones(2, 1, 2, 5, dtype=torch.bool)
    calls, (query, key, _), out, _ = padded_call(monkeypatch, mask, L=2, keys=5)
    assert calls[0]["query"] is query and calls[0]["key"] is key and calls[0]["mask"] is mask


def test_the_padded_key_attention_hands_packed_calls_to_their_own_attention(monkeypatch):
    """A call with fastpath_unpacking goes to unpacked_attention, one with fastpath_documents to packed_cfg's
    document_attention, each with every argument; the wrapped implementation is not called."""
    from fastpath.gpu import packed

    seen = []
    monkeypatch.setattr(loop, "unpacked_attention",
                        lambda *args, **kwargs: seen.append(("unpacked", args, kwargs)) or ("unpacked out", None))
    monkeypatch.setattr(packed, "document_attention",
                        lambda *args, **kwargs: seen.append(("documents", args, kwargs)) or ("documents out", None))
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    calls, (query, key, value), out, _ = padded_call(monkeypatch, mask, fastpath_unpacking="U")
    calls2, (query2, key2, value2), out2, _ = padded_call(monkeypatch, mask, fastpath_documents="D")
    assert calls == calls2 == [], "the wrapped attention ran a packed call"
    assert (out, out2) == ("unpacked out", "documents out")
    (kind, args, kwargs), (kind2, args2, kwargs2) = seen
    assert (kind, kind2) == ("unpacked", "documents")
    assert args[:2] == ("stand_in", "module") and args[2] is query and args[3] is key and args[4] is value
    assert args[5] is mask and args[6] == "U" and kwargs == {"scaling": 0.5}
    assert args2[0] == "module" and args2[1] is query2 and args2[2] is key2 and args2[3] is value2
    assert args2[4] == "D" and kwargs2 == {"scaling": 0.5}


def test_index_targets_puts_its_indices_on_the_groups_device():
    rows = [loop.Row(0, True, 3, 2), loop.Row(0, False, 0, 2)]
    group = loop.Group(rows, torch.zeros(2, 2, 5, dtype=torch.long, device=META),
                       torch.zeros(2, 5, dtype=torch.bool, device=META), torch.zeros(2, 1, 5, 5, device=META))
    loop.index_targets(group, [0])
    placed = {name: getattr(group, name).device for name in ("frames", "positions", "packed", "items", "kinds")}
    assert set(placed.values()) == {META}, placed


# --- padded_groups, trimmed_groups -----------------------------------------------------------------------------------


def square(size, width, real, pad_diagonal: bool = True):
    """[size, width] bool: True on the real x real block, and (pad_diagonal) on the diagonal past it."""
    mask = torch.zeros(size, width, dtype=torch.bool)
    mask[:real, :real] = True
    if pad_diagonal:
        for p in range(real, size):
            mask[p, p] = True
    return mask


def test_padded_groups_is_stocks_batch_of_two_b_rows_masked_as_upstream():
    """Stock's layout of items with prompts 5 and 3, targets 2 and 1: conditional rows padded to 5 (their padding
    masked out entirely, as upstream's), then the unconditional rows (their targets), whose padding attends to
    itself."""
    model, inputs = packed_items()
    (group,) = loop.padded_groups(model, inputs, [5, 3], [2, 1])
    assert group.rows == [loop.Row(0, True, 3, 2), loop.Row(1, True, 2, 1), loop.Row(0, False, 0, 2),
                          loop.Row(1, False, 0, 1)]
    assert group.input_ids[:, 0].tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 99, 99], [13, 14, 99, 99, 99],
                                              [22, 99, 99, 99, 99]]
    assert group.input_ids[:, 1].tolist() == [[60, 61, 62, 63, 64], [70, 71, 72, 99, 99], [63, 64, 99, 99, 99],
                                              [72, 99, 99, 99, 99]]
    assert group.audio_mask.tolist() == [[False, False, False, True, True], [False, False, True, False, False],
                                         [True, True, False, False, False], [True, False, False, False, False]]
    want = torch.stack([square(5, 5, 5), square(5, 5, 3, pad_diagonal=False), square(5, 5, 2), square(5, 5, 1)])
    assert torch.equal(group.attention_mask, want[:, None])


@pytest.mark.parametrize("own_width", [False, True])
def test_trimmed_groups_keep_each_row_at_its_length_and_at_least_min_rows_wide(own_width):
    """Items with prompts of 20 and 12 positions, targets 4 and 3: four rows of four lengths, each its own batch, each
    at least MIN_ROWS (16) wide where its key width allows; keys over the stock batch's width (20) or, own_width,
    the item's own; a padding query attends to itself."""
    model = SimpleNamespace(config=SimpleNamespace(num_audio_codebook=1, audio_mask_id=99), device=torch.device("cpu"))
    inputs = [{"input_ids": torch.arange(100, 100 + c)[None, None], "audio_mask": torch.arange(c)[None] >= c - t}
              for c, t in ((20, 4), (12, 3))]
    groups = loop.trimmed_groups(model, inputs, [20, 12], [4, 3], own_width=own_width)
    # (row, its length, its key width, its ids), ordered as the batches are: by key width, then longest first
    rows = [(loop.Row(0, True, 16, 4), 20, 20, range(100, 120)), (loop.Row(1, True, 9, 3), 12, 20, range(100, 112)),
            (loop.Row(0, False, 0, 4), 4, 20, range(116, 120)), (loop.Row(1, False, 0, 3), 3, 20, range(109, 112))]
    if own_width:
        rows = [(row, n, 12 if row.item else 20, ids) for row, n, _, ids in rows]
        rows = [rows[1], rows[3], rows[0], rows[2]]
    assert [g.rows for g in groups] == [[row] for row, *_ in rows]
    widths = [max(n, min(16, P)) for _, n, P, _ in rows]
    assert widths == ([12, 12, 20, 16] if own_width else [20, 16, 16, 16])
    for g, (_, n, P, ids), W in zip(groups, rows, widths):
        assert g.input_ids.tolist() == [[list(ids) + [99] * (W - n)]]
        assert g.audio_mask.shape == (1, W) and not g.audio_mask[0, n:].any()
        assert torch.equal(g.attention_mask, square(W, P, n)[None, None])


# --- messages --------------------------------------------------------------------------------------------------------


def test_a_refresh_interval_below_one_is_refused_naming_the_value_and_the_exact_one():
    model = SimpleNamespace()
    with pytest.raises(ValueError) as refused:
        loop.set_prefix_refresh(model, 0)
    assert str(refused.value) == "prefix refresh 0 must be an integer >= 1 (1 recomputes the prefix every step)"
    loop.set_prefix_refresh(model, 1)
    assert vars(model) == {loop.REFRESH_ATTR: 1}, "the exact interval 1 is accepted"


def test_packed_cfg_refuses_to_run_through_an_attention_that_is_not_fastpaths_wrapper():
    """A packed_cfg layout (documents) whose LLM's attention was changed after the patch: its rows would see every
    key. The refusal names the implementation found and the fix."""
    model = SimpleNamespace(_prepare_embed_inputs=lambda ids, mask: torch.zeros(1, ids.size(-1), 4),
                            llm=SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa")))
    packed = SimpleNamespace(embeds=None, input_ids=torch.zeros(1, 2, 6, dtype=torch.long),
                             audio_mask=torch.zeros(1, 6, dtype=torch.bool), documents="documents")
    with pytest.raises(RuntimeError) as refused:
        loop.packed_logits(model, packed, set())
    assert str(refused.value) == ("packed_cfg needs the LLM's attention to be fastpath's wrapper, and it is 'sdpa': "
                                  "revert packed_cfg before changing the attention implementation, then apply it again")


# --- score_runs ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit, runs", [(60, [list(range(10))]), (59, [list(range(7)), [7, 8, 9]]),
                                         (42, [list(range(7)), [7, 8, 9]]), (41, [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]])])
def test_a_scoring_run_holds_items_up_to_exactly_its_limit(monkeypatch, limit, runs):
    """Items of 4, 3 and 3 frames, C * V = 6 logits a frame: a run takes the next item while the run's logits stay
    at most SCORE_RUN_ELEMENTS (60 holds all ten frames, 42 the first seven, 41 the first four, then six)."""
    logits = torch.arange(2 * 2 * 10 * 3, dtype=torch.float32).reshape(2, 2, 10, 3)  # [2, C, frames, V]
    calls = []

    def predict(cond, uncond, gen_config):
        calls.append((cond[0, 0, :, 0] / 3).long().tolist())
        return cond.argmax(-1), cond.amax(-1)

    monkeypatch.setattr(loop, "SCORE_RUN_ELEMENTS", limit)
    model = SimpleNamespace(_predict_tokens_with_scoring=predict)
    tokens, scores = loop.score_runs(model, logits, [(0, 4), (4, 3), (7, 3)], None)
    assert calls == runs
    assert torch.equal(scores, logits[0:1].amax(-1)) and torch.equal(tokens, logits[0:1].argmax(-1))
