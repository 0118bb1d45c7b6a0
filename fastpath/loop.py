"""The fastpath unmasking loop: upstream `OmniVoice._generate_iterative` with switches.

Lossless (bit-exact on CPU fp32):
- `trimmed_cfg`: stock runs the B conditional and B unconditional rows as one batch padded to the longest
  conditional row; here every row of the step is packed back to back along the sequence axis of one forward
  ([1, sum of row lengths], each row's positions counting from 0), so projections, MLPs and heads do no work on
  padding and the step still streams the weights once. Only inside attention are the rows unpacked into stock's
  [2B, heads, width, d] layout, zero-padded behind a mask: the CPU SDPA kernel blocks queries and keys by count,
  and its reductions round differently at other counts (max |diff| 1.5e-7 without the padding). Each row then
  runs on as few of its queries and keys as `attention_cut` has measured to keep stock's bits. The GEMMs run on
  fewer rows than stock's, and CPU GEMM libraries pick their kernel by the row count: MKL's AVX-512 sgemm
  switches kernels at about K/8 rows (measured: above 128 rows for K = 1024, 256 for K = 2048, 384 for
  K = 3072, at N >= 1024), and under its AVX2 cap the tiny checkpoint's narrow shapes give a row other bits at
  other counts and places in the call with no simple rule. So each GEMM of the packed forward gets as many
  padding rows as make every row's bits the ones it gets in stock's call: `row_count` measures that once per
  layout and weight shape (random rows at their real places, the model's own weights, this machine's kernels);
  the forward runs at the least of these counts and only the GEMMs whose shape needs more run on more rows
  (e.g. only the K = 2048 projection, above 256 rows). A call for which some GEMM has no such count runs
  stock's layout and says so in `model._fastpath_warnings`.
  On CPU in float32 the packed forward is `lean_llm`: transformers' Qwen3 forward restated op for op (the same
  kernels, so the same bits) into buffers kept for the layout, each GEMM on its own row count from zero rows
  past the packed ones, because fresh multi-MB tensors cost page faults (full size, clone6-long, 2 steps: a
  generate 11.1 -> 9.1 s); elsewhere, or if transformers' source is not the one it restates, the LLM's own
  forward runs with `padded_gemms` hooks padding the shapes that need more.
- `sliced_heads`: the audio heads (hidden -> 8 x 1025 logits) run only on the target positions the sampler
  reads, not on style, text and reference positions.
- `static_prefix`: the input embedding of the static prefix (style, text, reference) is computed once per
  generation; each step re-embeds only the target frames.
- `batched_scoring`: all items of a batch scored and unmasked at once (`unmask_batched`), logits packed along
  the frame axis; the random numbers are the ones upstream draws item by item, read in its order.

Opt in:
- `batch_invariant`: rows attend over their own item's length, not the batch's longest; each item then equals
  a batch-1 call of it (deterministic settings), and a mixed-length batch costs what its items cost alone. Rows
  run as batches of equal length (`trimmed_groups`), one forward per distinct length.
- `prefix_kv_cache` (lossy): the conditional rows' prefix keys/values are reused between refresh steps
  (`prefix_cached_llm`).

GPU tier (not bit-exact, `fastpath.gpu.packed`):
- `packed_cfg`: trimmed_cfg's packed layout with each row attending over its own keys only (FlexAttention and a
  document block mask) instead of being unpacked into stock's padded rows; active on PACKED_DEVICES (CUDA), inert
  elsewhere.

Everything else (schedule, scoring, Gumbel position sampling, the order random numbers are drawn in) is
upstream's own code or follows it step for step, so the random stream and the per-step logits stay the same.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types
from dataclasses import dataclass, field

import torch

from fastpath import instance
from fastpath.instance import WARNINGS_ATTR

FEATURES = ("trimmed_cfg", "sliced_heads", "static_prefix", "batched_scoring", "batch_invariant", "prefix_kv_cache",
            "packed_cfg")
FLAGS_ATTR = "_fastpath_loop"  # instance attribute: the set of switches that are on
TRIMMED_LAYOUT = ("trimmed_cfg", "batch_invariant", "prefix_kv_cache", "packed_cfg")  # rows at their own lengths
GROUPED_LAYOUT = ("batch_invariant", "prefix_kv_cache")  # ... as batches of equal length; trimmed_cfg alone packs
REFRESH_ATTR = "_fastpath_prefix_refresh"  # instance attribute: prefix_kv_cache's refresh interval in steps
DEFAULT_REFRESH = 2  # the mildest staleness; agreement and speed per interval: fastpath-suite prefix, baselines/prefix_kv_cache.json
MIN_ROWS = 16  # no GEMM of fewer rows than this: small-M kernels round differently from stock's large batch
INEXACT_ROWS = ("trimmed_cfg ran stock's layout (padded rows) for a call on this machine: no row count of the packed "
                "forward gave every row the bits of stock's call (fastpath.loop.row_count), so fewer rows would "
                "not be bit-exact.")
GROUPED_FULL_HEADS = ("sliced_heads runs the heads on every position with batch_invariant or prefix_kv_cache on this "
                      "machine: its CPU GEMM gives a row other bits when the call has another number of rows "
                      "(fastpath.loop.gemm_rows_independent).")
_PROBED: dict = {}  # (K, N, threads, dtype) -> bool: gemm_rows_independent's measurements in this process


def gemm_rows_independent(model) -> bool:
    """Whether `nn.functional.linear` gives every row the same bits whatever the number of rows (>= MIN_ROWS) and
    the row's place in the call, on the model's own shapes (q_proj, down_proj and the audio heads; up to 256
    output features). Measured once per shape and thread count in this process; always True off the CPU, where no
    patch claims bit-exactness. 16 to 39 rows at three offsets in an 88-row call: every residue of the kernels'
    row blocks (6 for MKL's AVX2 kernel, 8 / 16 / 24 for others)."""
    layer = model.llm.layers[0]
    weights = [layer.self_attn.q_proj.weight, layer.mlp.down_proj.weight, model.audio_heads.weight]
    if weights[0].device.type != "cpu":
        return True
    for weight in weights:
        w = weight.detach()[:256]  # [N, K]
        key = (w.shape[1], w.shape[0], torch.get_num_threads(), w.dtype)
        if key not in _PROBED:
            x = torch.randn(88, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)  # [88, K]
            with torch.no_grad():
                whole = torch.nn.functional.linear(x, w)  # [88, N]
                _PROBED[key] = all(torch.equal(torch.nn.functional.linear(x[o:o + m], w), whole[o:o + m])
                                   for o in (0, 5, 17) for m in range(MIN_ROWS, MIN_ROWS + 24) if o + m <= 88)
        if not _PROBED[key]:
            return False
    return True


def enable(model, feature: str) -> None:
    """Switch `feature` (one of FEATURES) on for this instance; the first one installs the loop."""
    if feature == "batch_invariant" and not gemm_rows_independent(model):
        raise UnsupportedHereError(
            "batch_invariant promises items bit-exact with batch-1 calls, which needs a CPU GEMM whose rows do not "
            "depend on how many rows share the call; this machine's does (fastpath.loop.gemm_rows_independent). "
            "Start Python with MKL_CBWR=AVX2,STRICT (or AUTO,STRICT) to make MKL's rows independent.")
    flags = model.__dict__.setdefault(FLAGS_ATTR, set())
    flags.add(feature)
    instance.install(model, "_generate_iterative", types.MethodType(generate_iterative, model))
    if feature in TRIMMED_LAYOUT:
        install_padded_key_attention(model)


def disable(model, feature: str) -> None:
    """Switch `feature` off; the last one removes the loop and every setting it kept on the instance."""
    flags = model.__dict__.get(FLAGS_ATTR, set())
    flags.discard(feature)
    if feature in TRIMMED_LAYOUT and not set(TRIMMED_LAYOUT) & flags:
        remove_padded_key_attention(model)
    if not flags:
        for attr in (FLAGS_ATTR, REFRESH_ATTR):
            model.__dict__.pop(attr, None)
        instance.restore(model, "_generate_iterative")


def effective_flags(model, flags) -> set:
    """The switches a generate runs with: `flags`, less sliced_heads in the grouped layouts (batch_invariant,
    prefix_kv_cache) where this machine's GEMM rows depend on the row count (the packed and stock layouts
    choose their row counts with `row_count` instead). Reads the model, changes nothing."""
    flags = set(flags)
    if "sliced_heads" in flags and set(GROUPED_LAYOUT) & flags and not gemm_rows_independent(model):
        flags.discard("sliced_heads")
    return flags


def note_once(model, message: str = INEXACT_ROWS) -> None:
    """Say, once, on the model (`model._fastpath_warnings`) what a call could not do (default: it ran stock's
    layout for want of exact rows)."""
    warnings = model.__dict__.setdefault(WARNINGS_ATTR, [])
    if message not in warnings:
        warnings.append(message)


_ROW_COUNTS: dict = {}  # row_count's answers in this process: (shapes, threads, row map, least) -> count or None
PROBE_SCAN = 8  # row counts tried one by one above the least (every residue of the kernels' row blocks)


def llm_weights(model) -> list:
    """One weight of every distinct GEMM shape in an LLM layer (projections, MLP)."""
    layer, shapes = model.llm.layers[0], {}
    for module in (*vars(layer.self_attn)["_modules"].values(), *vars(layer.mlp)["_modules"].values()):
        if isinstance(module, torch.nn.Linear):
            shapes.setdefault(tuple(module.weight.shape), module.weight)
    return list(shapes.values())


def row_count(weights, stock_rows, stock_count: int, least: int):
    """The smallest row count >= `least` at which `nn.functional.linear` gives rows 0..n-1 of a call the bits that
    rows `stock_rows` ([n], n <= least) of a `stock_count`-row call get, for every weight in `weights`; None if
    none up to `stock_count` does. Measured on random rows (the kernel depends on the shapes, not the values) by
    trying least .. least + PROBE_SCAN - 1, then bisecting above for the kernels' row-count threshold. Off the CPU
    (no patch claims bit-exactness there) and where nothing is trimmed, `least`."""
    if weights[0].device.type != "cpu" or (least == stock_count and len(stock_rows) == stock_count):
        return least
    rows = stock_rows.cpu()
    key = (tuple((tuple(w.shape), w.dtype) for w in weights), torch.get_num_threads(), stock_count, least,
           len(rows), hash(rows.numpy().tobytes()))
    if key in _ROW_COUNTS:
        return _ROW_COUNTS[key]
    from torch.utils._python_dispatch import _disable_current_modes

    generator = torch.Generator().manual_seed(0)
    probes = []  # (weight, inputs [stock_count, K], stock's bits of the rows [n, N])
    with torch.no_grad(), _disable_current_modes():  # unseen by a FLOP counter around the generate it serves
        for w in weights:
            x = torch.randn(stock_count, w.shape[1], generator=generator).to(w.dtype)
            probes.append((w, x, torch.nn.functional.linear(x, w)[rows]))

        def exact(count: int) -> bool:
            for w, x, want in probes:
                filler = x[: count - len(rows)]
                got = torch.nn.functional.linear(torch.cat([x[rows], filler]), w)[: len(rows)]
                if not torch.equal(got, want):
                    return False
            return True

        found = next((c for c in range(least, min(least + PROBE_SCAN, stock_count + 1)) if exact(c)), None)
        if found is None and least + PROBE_SCAN <= stock_count and exact(stock_count):
            low, high = least + PROBE_SCAN - 1, stock_count  # exact(high); below `low` none was
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (low, mid) if exact(mid) else (mid, high)
            found = high
    if len(_ROW_COUNTS) > 512:
        _ROW_COUNTS.clear()
    _ROW_COUNTS[key] = found
    return found


class UnsupportedHereError(RuntimeError):
    """A patch cannot keep its promise on this machine; the message says why and what would make it possible."""


@dataclass
class Row:
    item: int  # index into the task
    cond: bool  # conditional (full prompt) or unconditional (target only) row
    start: int  # first target position in this row
    length: int  # number of target positions (t_len)


@dataclass
class Group:
    """One forward batch of rows of one width L: input_ids [G, C, L], audio_mask [G, L], attention_mask
    [G, 1, L, P] with P = L in the stock layout and P = the stock width in the trimmed one."""

    rows: list
    input_ids: torch.Tensor
    audio_mask: torch.Tensor
    attention_mask: torch.Tensor
    embeds: torch.Tensor | None = None  # [G, L, H], static_prefix only
    # Where each row's target frames sit, from `index_targets`; T = the longest target among the rows.
    items: torch.Tensor | None = None  # [G] item of each row
    kinds: torch.Tensor | None = None  # [G] 0 for a conditional row, 1 for an unconditional one
    frames: torch.Tensor | None = None  # [G, T] target frame 0..t_len-1, the last one repeated past t_len
    positions: torch.Tensor | None = None  # [G, T] sequence position of that frame in the row: start + frame
    packed: torch.Tensor | None = None  # [G, T] column of that frame in the packed logits: item offset + frame
    head_rows: int | None = None  # sliced_heads in stock's layout: rows of the heads' GEMM (row_count; 0: all)
    prefix_kv: object = None  # prefix_kv_cache: a transformers DynamicCache of the prefix keys/values [G, kv, start, d]


def set_prefix_refresh(model, refresh: int) -> None:
    """prefix_kv_cache: recompute the prefix keys/values every `refresh` unmasking steps (1: every step, exact)."""
    if isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1:
        raise ValueError(f"prefix refresh {refresh!r} must be an integer >= 1 (1 recomputes the prefix every step)")
    model.__dict__[REFRESH_ATTR] = refresh


def index_targets(group: Group, offsets: list) -> Group:
    """Index tensors that move every row's target frames in one op (a short row repeats its last frame, so
    gathers and scatters stay in bounds and a repeated write writes the same value). offsets: each item's
    first column in the packed logits [2, C, sum(t_len), V]."""
    device = group.input_ids.device
    T = max(r.length for r in group.rows)
    frames = torch.stack([torch.arange(T).clamp(max=r.length - 1) for r in group.rows])  # [G, T]
    starts = torch.tensor([r.start for r in group.rows])[:, None]  # [G, 1]
    first = torch.tensor([offsets[r.item] for r in group.rows])[:, None]  # [G, 1]
    group.frames, group.positions = frames.to(device), (starts + frames).to(device)
    group.packed = (first + frames).to(device)
    group.items = torch.tensor([r.item for r in group.rows], device=device)
    group.kinds = torch.tensor([0 if r.cond else 1 for r in group.rows], device=device)
    return group


def unmasking_schedules(target_lens, gen_config, num_codebooks):
    """Tokens to unmask per step for each item, as upstream computes them."""
    from omnivoice.models.omnivoice import _get_time_steps

    timesteps = _get_time_steps(
        t_start=0.0, t_end=1.0, num_step=gen_config.num_step, t_shift=gen_config.t_shift
    ).tolist()
    schedules = []
    for t_len in target_lens:
        total = t_len * num_codebooks
        rem, sched = total, []
        for step in range(gen_config.num_step):
            if step == gen_config.num_step - 1:
                num = rem
            else:
                num = min(math.ceil(total * (timesteps[step + 1] - timesteps[step])), rem)
            sched.append(int(num))
            rem -= int(num)
        schedules.append(sched)
    return schedules


def padded_groups(model, inputs_list, c_lens, t_lens):
    """Stock layout: one batch of 2B rows padded to max(c_lens), masks exactly as upstream builds them."""
    B, C, device = len(inputs_list), model.config.num_audio_codebook, model.device
    max_c = max(c_lens)
    ids = torch.full((2 * B, C, max_c), model.config.audio_mask_id, dtype=torch.long, device=device)
    audio_mask = torch.zeros((2 * B, max_c), dtype=torch.bool, device=device)
    attention = torch.zeros((2 * B, 1, max_c, max_c), dtype=torch.bool, device=device)
    rows = [None] * (2 * B)
    for i, inp in enumerate(inputs_list):
        c_len, u_len = c_lens[i], t_lens[i]
        ids[i, :, :c_len] = inp["input_ids"]
        audio_mask[i, :c_len] = inp["audio_mask"]
        attention[i, :, :c_len, :c_len] = True
        ids[B + i, :, :u_len] = inp["input_ids"][..., -u_len:]
        audio_mask[B + i, :u_len] = inp["audio_mask"][..., -u_len:]
        attention[B + i, :, :u_len, :u_len] = True
        if max_c > u_len:
            pad = torch.arange(u_len, max_c, device=device)
            attention[B + i, :, pad, pad] = True
        rows[i] = Row(i, True, c_len - u_len, u_len)
        rows[B + i] = Row(i, False, 0, u_len)
    return [Group(rows, ids, audio_mask, attention)]


def trimmed_groups(model, inputs_list, c_lens, t_lens, own_width: bool = False, by_start: bool = False):
    """Each row at its own length; rows of equal length (and key width) share a batch.

    The attention mask is [G, 1, W, P]: True on the row's own keys, False on the key padding that
    `padded_key_attention` adds, so every query reduces over P keys: the stock batch's width max(c_lens), or with
    `own_width` the row's item's own c_len, the width a batch-1 call of that item reduces over. With `by_start`,
    only rows whose target starts at the same position share a batch (one prefix length per batch, for
    prefix_kv_cache).
    """
    max_c = max(c_lens)
    C, mask_id = model.config.num_audio_codebook, model.config.audio_mask_id
    members = []  # (row, input_ids [1, C, length], audio_mask [1, length], key width P)
    for i, inp in enumerate(inputs_list):
        u, width = t_lens[i], (c_lens[i] if own_width else max_c)
        members.append((Row(i, True, c_lens[i] - u, u), inp["input_ids"], inp["audio_mask"], width))
    for i, inp in enumerate(inputs_list):
        u, width = t_lens[i], (c_lens[i] if own_width else max_c)
        members.append((Row(i, False, 0, u), inp["input_ids"][..., -u:], inp["audio_mask"][..., -u:], width))
    row_len = lambda m: m[1].size(-1)  # noqa: E731
    buckets: list = []  # longest rows first; a row joins the last bucket if it has the same key width and length
    order = (lambda m: (m[3], -row_len(m), m[0].start)) if by_start else (lambda m: (m[3], -row_len(m)))
    for m in sorted(members, key=order):  # stable: cond rows before uncond at a tie
        last = buckets[-1] if buckets else None
        same_start = not by_start or (last and last[0][0].start == m[0].start)
        if last and same_start and last[0][3] == m[3] and row_len(last[0]) == row_len(m):
            last.append(m)
        else:
            buckets.append([m])
    groups = []
    for bucket in buckets:
        rows, P = [m[0] for m in bucket], bucket[0][3]
        width = max(row_len(bucket[0]), min(MIN_ROWS, P))
        ids = torch.full((len(rows), C, width), mask_id, dtype=torch.long, device=model.device)  # [G, C, W]
        audio_mask = torch.zeros((len(rows), width), dtype=torch.bool, device=model.device)  # [G, W]
        attention = torch.zeros((len(rows), 1, width, P), dtype=torch.bool, device=model.device)  # [G, 1, W, P]
        for g, (_, row_ids, row_mask, _) in enumerate(bucket):
            length = row_ids.size(-1)
            ids[g, :, :length] = row_ids[0]
            audio_mask[g, :length] = row_mask[0]
            attention[g, :, :length, :length] = True
            pad = torch.arange(length, width, device=model.device)
            attention[g, :, pad, pad] = True  # a padding query attends to itself only, as upstream's do
        groups.append(Group(rows, ids, audio_mask, attention))
    return groups


@dataclass
class Unpacking:
    """How unpacked_attention lays the N packed positions out in stock's attention batch [R, heads, P, d]."""

    starts: tuple  # packed position of each of the R segments' first
    lengths: tuple  # positions of each segment (at most P)
    real_rows: int  # the first 2B segments are rows; the others padding
    cuts: list = field(default_factory=list)  # each segment's (queries, keys) from attention_cut: set by the
    # first layer of the layout's first forward (every layer and step has the same shapes and mask)
    buffers: list = field(default_factory=list)  # query, key, value [R, P, heads, d]: zeros, each layer writes
    # the rows shorter than P into their first positions (the rest stays zero); made by the first layer


@dataclass
class Packed:
    """trimmed_cfg's layout: every row of a step back to back along the sequence axis of one forward.

    The N packed positions hold the B conditional rows (item order), then the B unconditional rows, then, if the
    rows add up to fewer than MIN_ROWS positions, a padding segment. Attention unpacks them into stock's layout:
    R segments of P = max(c_lens) positions each (`unpacking`), masked as `attention_mask` says. Every target frame of
    every row is listed once (M = 2 x sum(t_lens) frames) with where it sits in the forward (`targets`), which item,
    kind and frame it is, and its column in the packed logits [2, C, sum(t_lens), V].
    """

    input_ids: torch.Tensor  # [1, C, N]
    audio_mask: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]: each row's positions count from 0, as in stock's batch
    attention_mask: torch.Tensor  # [R, 1, P, P] bool: stock's mask for each real row; self only on padding
    unpacking: Unpacking  # where each packed position sits in stock's attention batch (unpacked_attention)
    targets: torch.Tensor  # [M]: packed position of each target frame
    items: torch.Tensor  # [M]
    kinds: torch.Tensor  # [M]: 0 conditional, 1 unconditional
    frames: torch.Tensor  # [M]: 0..t_len-1
    columns: torch.Tensor  # [M]: item offset + frame
    head_rows: int  # rows of the heads' GEMM: the M target frames (sliced_heads) or all N positions, then padding
    gemm_rows: dict  # LLM weight shape -> rows of its GEMM where more than N (`padded_gemms`)
    embeds: torch.Tensor | None = None  # [1, N, H], static_prefix only
    buffers: dict = field(default_factory=dict)  # lean_llm's intermediates, kept for the layout's every step
    documents: object = None  # packed_cfg: fastpath.gpu.packed.Documents, each row over its own keys (then
    # attention_mask is a [1, 1, 1, 1] placeholder, unpacking unused, and no row count is measured)


@dataclass
class Counts:
    """Rows of a packed step's GEMMs on this machine (`packed_counts`)."""

    llm: int  # positions of the packed forward: the rows' own, plus padding where every LLM GEMM needs more
    gemms: dict  # weight shape (N, K) -> rows of that LLM GEMM, for the shapes that need more than `llm`
    heads: int  # rows of the heads' GEMM


def packed_counts(model, c_lens, t_lens, sliced_heads: bool) -> Counts | None:
    """Rows of the packed forward's GEMMs, one count per weight shape, and of the heads' GEMM (the target frames
    with sliced_heads, else every packed position), for rows of these lengths: the least counts with stock's bits
    (`row_count`), at least the rows' own and MIN_ROWS; None if some GEMM has none on this machine."""
    B, P = len(c_lens), max(c_lens)
    lengths = list(c_lens) + list(t_lens)  # conditional rows, then unconditional (their targets' lengths)
    slots = torch.cat([torch.arange(n) + r * P for r, n in enumerate(lengths)])  # row of each in stock's call
    least = max(sum(lengths), MIN_ROWS)
    counts = {tuple(w.shape): row_count([w], slots, 2 * B * P, least) for w in llm_weights(model)}
    if None in counts.values():
        return None
    llm = min(counts.values())  # the forward's positions; the shapes that need more pad their own GEMM
    heads = [model.audio_heads.weight]
    if sliced_heads:  # the target frames: the tail of each row
        tails = zip(lengths, 2 * list(t_lens))
        targets = torch.cat([torch.arange(r * P + n - t, r * P + n) for r, (n, t) in enumerate(tails)])
        head_rows = row_count(heads, targets, 2 * B * P, max(len(targets), MIN_ROWS))
    else:
        head_rows = row_count(heads, slots, 2 * B * P, llm)
    if head_rows is None:
        return None
    return Counts(llm, {shape: n for shape, n in counts.items() if n > llm}, head_rows)


def packed_layout(model, inputs_list, c_lens, t_lens, offsets, sliced_heads: bool = False,
                  documents: bool = False) -> Packed | None:
    """The Packed layout of a batch (see Packed); offsets: each item's first column in the packed logits. None
    where no row count of the packed forward (or of the heads) gives stock's bits on this machine (`row_count`).
    With `documents` (packed_cfg), rows attend over their own keys with FlexAttention: the forward's length is
    rounded up to its block (one padding segment), and nothing claims stock's bits, so no row count is measured."""
    B, C, device = len(inputs_list), model.config.num_audio_codebook, model.device
    P = max(c_lens)
    segments = [(inp["input_ids"][0], inp["audio_mask"][0]) for inp in inputs_list]  # conditional: [C, c], [c]
    segments += [(inp["input_ids"][0, :, -t:], inp["audio_mask"][0, -t:]) for inp, t in zip(inputs_list, t_lens)]
    lengths = [ids.size(-1) for ids, _ in segments]
    if documents:
        from fastpath.gpu import packed as varlen

        n = varlen.packed_length(sum(lengths))
        counts, P = Counts(n, {}, 2 * sum(t_lens) if sliced_heads else n), n  # one padding segment up to the block
    else:
        counts = packed_counts(model, c_lens, t_lens, sliced_heads)
    if counts is None:
        return None
    pad = counts.llm - sum(lengths)
    while pad > 0:  # padding segments (at most P positions each): masked ids attending to themselves only
        n = min(pad, P)
        segments.append((torch.full((C, n), model.config.audio_mask_id, device=device),
                         torch.zeros(n, dtype=torch.bool, device=device)))
        lengths.append(n)
        pad -= n
    R = len(segments)
    if documents:  # the attention reads the segments, not a mask
        mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
    else:
        mask = torch.zeros((R, 1, P, P), dtype=torch.bool, device=device)
        diagonal = torch.arange(P, device=device)
        for r, n in enumerate(lengths):
            real = n if r < 2 * B else 0
            mask[r, :, :real, :real] = True  # a real row: all its own keys, as stock
            mask[r, :, diagonal[real:], diagonal[real:]] = True  # padding queries: themselves only, as stock's
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0).tolist()  # packed position of each segment's first
    targets, items, kinds, frames = [], [], [], []
    for r in range(2 * B):
        i, t = r % B, t_lens[r % B]
        first = starts[r] + (lengths[r] - t)  # the target is the tail of both rows
        targets.append(torch.arange(first, first + t))
        items.append(torch.full((t,), i))
        kinds.append(torch.full((t,), r // B))
        frames.append(torch.arange(t))
    items, frames, targets = torch.cat(items), torch.cat(frames), torch.cat(targets)
    columns = torch.tensor(offsets)[items] + frames
    return Packed(
        input_ids=torch.cat([ids for ids, _ in segments], dim=1)[None],
        audio_mask=torch.cat([m for _, m in segments])[None],
        position_ids=torch.cat([torch.arange(n) for n in lengths])[None].to(device),
        attention_mask=mask,
        unpacking=Unpacking(tuple(starts), tuple(lengths), 2 * B),
        targets=targets.to(device), items=items.to(device), kinds=torch.cat(kinds).to(device),
        frames=frames.to(device), columns=columns.to(device), head_rows=counts.heads, gemm_rows=counts.gemms,
        documents=varlen.Documents(varlen.document_ids(lengths[: 2 * B], counts.llm, device)) if documents else None,
    )


def packed_logits(model, packed: Packed, flags):
    """Float32 logits at every target frame of the packed forward: [M, C, V]."""
    if "static_prefix" in flags and packed.embeds is not None:  # re-embed the target frames only
        ids = packed.input_ids[0][:, packed.targets][None]  # [1, C, M]
        mask = packed.audio_mask[:, packed.targets]  # [1, M]
        packed.embeds[0, packed.targets] = model._prepare_embed_inputs(ids, mask)[0]
        embeds = packed.embeds
    else:
        embeds = model._prepare_embed_inputs(packed.input_ids, packed.audio_mask)  # [1, N, H]
        if "static_prefix" in flags:
            packed.embeds = embeds = embeds.clone()
    if packed.documents is not None:
        if not model.llm.config._attn_implementation.startswith(PADDED_ATTENTION):  # else the rows see every key
            raise RuntimeError(f"packed_cfg needs the LLM's attention to be fastpath's wrapper, and it is "
                               f"{model.llm.config._attn_implementation!r}: revert packed_cfg before changing the "
                               f"attention implementation, then apply it again")
        hidden = model.llm(inputs_embeds=embeds, attention_mask=packed.attention_mask, return_dict=True,
                           position_ids=packed.position_ids, fastpath_documents=packed.documents)[0]
    elif lean_llm_fits(model, embeds):
        hidden = lean_llm(model, embeds, packed)
    else:
        with padded_gemms(model, packed.gemm_rows, packed.input_ids.size(-1)):
            hidden = model.llm(inputs_embeds=embeds, attention_mask=packed.attention_mask, return_dict=True,
                               position_ids=packed.position_ids, fastpath_unpacking=packed.unpacking)[0]
    if "sliced_heads" in flags:  # heads on the M target frames only (zero rows up to row_count's)
        rows = torch.nn.functional.pad(hidden[0, packed.targets], (0, 0, 0, packed.head_rows - len(packed.targets)))
        return audio_logits(model, rows[None])[0, : len(packed.targets)]
    rows = torch.nn.functional.pad(hidden[0], (0, 0, 0, packed.head_rows - hidden.size(1)))  # every position
    return audio_logits(model, rows[None])[0, packed.targets]


@contextlib.contextmanager
def padded_gemms(model, rows: dict, n: int):
    """While open, each Linear of the LLM's layers whose weight shape is in `rows` runs on that many rows: its
    input [1, n, K] gets zero rows up to it, and its output is cut back to the first n."""
    handles = []
    try:
        for layer in model.llm.layers if rows else ():
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear) and tuple(module.weight.shape) in rows:
                    extra = rows[tuple(module.weight.shape)] - n
                    handles.append(module.register_forward_pre_hook(
                        lambda _, args, extra=extra: (torch.nn.functional.pad(args[0], (0, 0, 0, extra)), *args[1:])))
                    handles.append(module.register_forward_hook(lambda _, args, out: out[:, :n]))
        yield
    finally:
        for handle in handles:
            handle.remove()


# What lean_llm restates, as transformers 5.24.0 has it: AST fingerprints (fingerprints.fingerprint_source) of
# modeling_qwen3's and activations' functions. Another source runs the stock forward and says why.
LEAN_SOURCES = {  # "module of transformers:qualified name" -> fingerprint
    "models.qwen3.modeling_qwen3:Qwen3Model.forward": "78d331188b082985",
    "models.qwen3.modeling_qwen3:Qwen3DecoderLayer.forward": "3dfab9074a7717a1",
    "models.qwen3.modeling_qwen3:Qwen3Attention.forward": "f550cd5a507dfb0a",
    "models.qwen3.modeling_qwen3:Qwen3MLP.forward": "f0f027ae35c6a31b",
    "models.qwen3.modeling_qwen3:Qwen3RMSNorm.forward": "6f260b5d5050da32",
    "models.qwen3.modeling_qwen3:apply_rotary_pos_emb": "97fe9d70f8992b3d",
    "models.qwen3.modeling_qwen3:rotate_half": "e40a6f5690e66564",
    "activations:SiLUActivation.forward": "2b243072a2fe2a9e",
}


@functools.cache
def lean_sources() -> dict:
    """{name in LEAN_SOURCES: fingerprint of the installed transformers' source}; a name whose source cannot be read
    (gone, or no longer a Python function: transformers 5.25 made apply_rotary_pos_emb a kernels function object)
    gets "unreadable: <why>", which no known fingerprint matches: it counts as changed."""
    import importlib
    import inspect

    from fastpath.fingerprints import fingerprint_source

    out = {}
    for name in LEAN_SOURCES:
        module, _, qualified = name.partition(":")
        try:
            obj = importlib.import_module(f"transformers.{module}")
            for part in qualified.split("."):
                obj = getattr(obj, part)
            out[name] = fingerprint_source(inspect.getsource(inspect.unwrap(obj)))
        except (ImportError, AttributeError, TypeError, OSError) as err:
            out[name] = f"unreadable: {type(err).__name__}"
    return out


def lean_llm_misfit(model) -> str:
    """Why lean_llm cannot stand for this model's LLM ("" when it can): it restates transformers 5.24.0's Qwen3
    with silu MLPs, no biases and full attention through trimmed_cfg's attention wrapper."""
    from transformers.activations import SiLUActivation
    from transformers.models.qwen3 import modeling_qwen3 as q3

    config = model.llm.config
    if type(model.llm) is not q3.Qwen3Model or any(type(layer) is not q3.Qwen3DecoderLayer
                                                   or type(layer.mlp.act_fn) is not SiLUActivation
                                                   for layer in model.llm.layers):
        return f"the LLM is a {type(model.llm).__name__}, not transformers' Qwen3Model with silu MLPs"
    if config.attention_bias or getattr(config, "mlp_bias", False):
        return "the LLM's projections have biases"
    if set(config.layer_types) != {"full_attention"} or not config._attn_implementation.startswith(PADDED_ATTENTION):
        return f"the LLM has sliding-window layers or runs attention through {config._attn_implementation!r}"
    changed = [name for name, fp in lean_sources().items() if fp != LEAN_SOURCES[name]]
    if changed:
        return f"the installed transformers' {', '.join(changed)} differ from 5.24.0's"
    return ""


def lean_llm_fits(model, embeds) -> bool:
    """Whether the packed forward runs as lean_llm: on CPU in float32 (where fresh tensors cost page faults; CUDA's
    caching allocator has no such cost) when `lean_llm_misfit` finds nothing; otherwise the LLM's own forward runs
    (the same bits, more memory traffic) and, on CPU, `model._fastpath_warnings` says why, once."""
    if embeds.device.type != "cpu" or embeds.dtype != torch.float32:
        return False
    why = lean_llm_misfit(model)
    if why:
        note_once(model, f"trimmed_cfg runs the LLM's own forward, not fastpath.loop.lean_llm (same bits, slower "
                         f"on CPU): {why}. lean_llm restates transformers 5.24.0's Qwen3 (LEAN_SOURCES).")
    return not why


def lean_llm(model, embeds, packed: Packed):
    """model.llm over the packed positions ([1, N, H] -> the final norm's [1, N, H]) as transformers' Qwen3 computes
    it, op for op in the same order, on the same kernels (so the same bits), but into buffers kept for the layout:
    on CPU a fresh tensor of a few MB is new pages from the OS, and faulting them in cost the packed forward more
    than its elementwise work (full size, clone6-long, 2 steps: a generate 11.1 s through model.llm, 9.7 s with
    glibc told to keep freed memory, 9.1 s here). Each GEMM runs on its own row count (`Packed.gemm_rows`): its
    input buffer has zero rows past N, so no padding is copied."""
    llm, N, H = model.llm, embeds.size(1), embeds.size(2)
    counts = packed.gemm_rows
    R = max([N, *counts.values()])
    first = llm.layers[0].self_attn
    heads, kv_heads, d = first.config.num_attention_heads, first.config.num_key_value_heads, first.head_dim
    inter = llm.layers[0].mlp.intermediate_size
    b = packed.buffers
    if not b:  # zeros: rows past N of every GEMM input stay zero
        cos, sin = llm.rotary_emb(embeds, packed.position_ids)  # [1, N, d]: the same for every step of the layout
        b.update(cos=cos[0, :, None], sin=sin[0, :, None],  # [N, 1, d]
                 **{name: embeds.new_zeros(shape) for name, shape in dict(
                     hidden=(N, H), normed=(R, H), square=(N, H), var=(N, 1), q=(R, heads * d), k=(R, kv_heads * d),
                     v=(R, kv_heads * d), q_square=(N, heads, d), q_var=(N, heads, 1), k_var=(N, kv_heads, 1),
                     k_square=(N, kv_heads, d), query=(N, heads, d), key=(N, kv_heads, d), turned=(N, heads, d),
                     k_turned=(N, kv_heads, d), attended=(R, heads * d),
                     o=(R, H), gate=(R, inter), up=(R, inter), down=(R, H)).items()})

    def linear(module, x, out):  # F.linear's GEMM (torch.mm with the weight transposed), on the shape's rows
        n = counts.get(tuple(module.weight.shape), N)
        return torch.mm(x[:n], module.weight.t(), out=out[:n])[:N]

    def rms_norm(module, x, out, square, var):  # Qwen3RMSNorm.forward in float32
        torch.pow(x, 2, out=square)
        torch.mean(square, -1, keepdim=True, out=var)
        torch.rsqrt(var.add_(module.variance_epsilon), out=var)
        torch.mul(x, var, out=out)
        return torch.mul(module.weight, out, out=out)

    def rotary(x, turned):  # apply_rotary_pos_emb on x [N, heads, d] in place: x * cos + rotate_half(x) * sin
        half = d // 2
        torch.neg(x[..., half:], out=turned[..., :half])
        turned[..., half:].copy_(x[..., :half])
        torch.mul(turned, b["sin"], out=turned)
        x.mul_(b["cos"])
        return x.add_(turned)

    hidden, normed = b["hidden"], b["normed"][:N]
    hidden.copy_(embeds[0])
    inner = llm.config._attn_implementation[len(PADDED_ATTENTION):]
    for layer in llm.layers:
        attn, mlp = layer.self_attn, layer.mlp
        rms_norm(layer.input_layernorm, hidden, normed, b["square"], b["var"])
        q = linear(attn.q_proj, b["normed"], b["q"]).view(N, heads, d)
        k = linear(attn.k_proj, b["normed"], b["k"]).view(N, kv_heads, d)
        v = linear(attn.v_proj, b["normed"], b["v"]).view(N, kv_heads, d)
        query = rotary(rms_norm(attn.q_norm, q, b["query"], b["q_square"], b["q_var"]), b["turned"])
        key = rotary(rms_norm(attn.k_norm, k, b["key"], b["k_square"], b["k_var"]), b["k_turned"])
        attended = b["attended"][:N].view(N, heads, d)
        unpacked_attention(inner, attn, *(t.transpose(0, 1)[None] for t in (query, key, v)), packed.attention_mask,
                           packed.unpacking, out=attended, dropout=0.0, scaling=attn.scaling,
                           sliding_window=attn.sliding_window)
        hidden.add_(linear(attn.o_proj, b["attended"], b["o"]))
        rms_norm(layer.post_attention_layernorm, hidden, normed, b["square"], b["var"])
        gate = torch.nn.functional.silu(linear(mlp.gate_proj, b["normed"], b["gate"]), inplace=True)
        gate.mul_(linear(mlp.up_proj, b["normed"], b["up"]))
        hidden.add_(linear(mlp.down_proj, b["gate"], b["down"]))
    return llm.norm(hidden[None])  # the module itself, once per forward, as model.llm calls it (work counters)


def audio_logits(model, hidden):
    """The audio heads as upstream applies them: hidden [G, T, H] -> float32 logits [G, T, C, V]."""
    G, T, H = hidden.shape
    flat = hidden.reshape(G * T, H)
    if G * T < MIN_ROWS:  # zero rows up to MIN_ROWS: the GEMM kernel of stock's large batch
        flat = torch.nn.functional.pad(flat, (0, 0, 0, MIN_ROWS - G * T))
    out = model.audio_heads(flat)[: G * T]  # [G * T, C * V]
    C, V = model.config.num_audio_codebook, model.config.audio_vocab_size
    return out.view(G, T, C, V).to(torch.float32)


def group_embeds(model, group: Group, flags):
    """inputs_embeds [G, L, H]; with static_prefix the prefix is embedded once and each step re-embeds only the
    target frames (gathered, embedded, scattered back)."""
    if "static_prefix" not in flags:
        return model._prepare_embed_inputs(group.input_ids, group.audio_mask)
    if group.embeds is None:
        group.embeds = model._prepare_embed_inputs(group.input_ids, group.audio_mask).clone()
        return group.embeds
    G, C = group.input_ids.shape[:2]
    rows = torch.arange(G, device=group.embeds.device)[:, None]  # [G, 1]
    ids = group.input_ids.gather(2, group.positions[:, None, :].expand(G, C, -1))  # [G, C, T]
    mask = group.audio_mask.gather(1, group.positions)  # [G, T]
    group.embeds[rows, group.positions] = model._prepare_embed_inputs(ids, mask)  # [G, T, H]
    return group.embeds


def group_logits(model, group: Group, flags, step: int = 0):
    """Float32 logits at every row's target frames: [G, T, C, V] (frames past a row's t_len repeat its last)."""
    rows = torch.arange(len(group.rows), device=group.input_ids.device)[:, None]  # [G, 1]
    if not ({"sliced_heads", "static_prefix", "prefix_kv_cache"} & flags):
        logits = model(
            input_ids=group.input_ids, audio_mask=group.audio_mask, attention_mask=group.attention_mask
        ).logits.to(torch.float32)  # [G, C, L, V]
        return logits[rows, :, group.positions]  # [G, T, C, V]

    # as upstream OmniVoice.forward, with the heads applied separately
    embeds = group_embeds(model, group, flags)
    if "prefix_kv_cache" in flags and group.rows[0].start > 0:
        hidden, first = prefix_cached_llm(model, group, embeds, step)  # hidden covers positions first..W-1
    else:
        hidden, first = model.llm(
            inputs_embeds=embeds, attention_mask=group.attention_mask, return_dict=True, position_ids=None
        )[0], 0
    if "sliced_heads" in flags and not set(GROUPED_LAYOUT) & flags:  # stock's layout: rows with stock's bits
        if group.head_rows is None:
            G, W = group.input_ids.size(0), group.input_ids.size(2)
            stock_rows = (rows * W + group.positions).flatten()  # [G * T] rows of stock's heads call [G * W]
            group.head_rows = row_count([model.audio_heads.weight], stock_rows, G * W,
                                        max(stock_rows.numel(), MIN_ROWS)) or 0  # 0: none, heads on every position
        if group.head_rows:
            picked = hidden[rows, group.positions].flatten(0, 1)  # [G * T, H]
            picked = torch.nn.functional.pad(picked, (0, 0, 0, group.head_rows - picked.size(0)))
            G, T = group.positions.shape
            return audio_logits(model, picked[None])[0, : G * T].unflatten(0, (G, T))  # [G, T, C, V]
    elif "sliced_heads" in flags:
        return audio_logits(model, hidden[rows, group.positions - first])  # heads on [G, T, H] only
    return audio_logits(model, hidden)[rows, group.positions - first]


def prefix_cached_llm(model, group: Group, embeds, step: int):
    """prefix_kv_cache (lossy): the LLM over a batch of conditional rows that share one prefix length `start`.

    At a refresh step (every `refresh` steps, from step 0) the whole rows run, as without the cache, and each
    layer's keys/values of the prefix positions are kept. At the other steps only the target positions run: their
    queries attend over the kept prefix keys/values and their own fresh ones. Stale, because the prefix's keys and
    values depend on the target tokens through bidirectional attention, and those change every step; refresh 1
    is the exact computation. Returns (hidden [G, W - first, H], first).
    """
    from transformers import DynamicCache

    start, refresh = group.rows[0].start, model.__dict__.get(REFRESH_ATTR, DEFAULT_REFRESH)
    if refresh == 1:
        hidden = model.llm(inputs_embeds=embeds, attention_mask=group.attention_mask, return_dict=True)[0]
        return hidden, 0
    if group.prefix_kv is None or step % refresh == 0:
        cache = DynamicCache(config=model.llm.config)
        hidden = model.llm(inputs_embeds=embeds, attention_mask=group.attention_mask, cache=cache, use_cache=True,
                           return_dict=True)[0]
        keep_prefix(cache, start)  # keys/values of the prefix positions only: [G, kv_heads, start, d] per layer
        group.prefix_kv = cache
        return hidden, 0
    W = embeds.size(1)
    hidden = model.llm(
        inputs_embeds=embeds[:, start:],  # [G, W - start, H]; positions continue from the cache's length
        attention_mask=group.attention_mask[:, :, start:, :W],  # [G, 1, W - start, W]: kept prefix + own keys
        cache=group.prefix_kv, use_cache=True, return_dict=True,
    )[0]
    keep_prefix(group.prefix_kv, start)  # drop this step's target keys/values again
    return hidden, start


def keep_prefix(cache, start: int) -> None:
    extra = cache.get_seq_length() - start
    if extra > 0:
        cache.crop(-extra)  # transformers >= 5: crop(-n) removes the last n positions


def gumbel_noise(uniform):
    """upstream `_gumbel_sample`'s noise for given uniforms (its rand_like draw made by the caller)."""
    return -torch.log(-torch.log(uniform + 1e-10) + 1e-10)


def unmask_one_by_one(model, tokens, logits, ks, t_lens, offsets, gen_config, layer_ids):
    """Upstream's per-item scoring and unmasking, verbatim. tokens [B, C, T_max] updated in place; logits
    [2, C, sum(t_len), V]: conditional, unconditional, items packed along the frame axis."""
    from omnivoice.models.omnivoice import _gumbel_sample

    mask_id = model.config.audio_mask_id
    for i, (k, t_len, first) in enumerate(zip(ks, t_lens, offsets)):
        if k <= 0:
            continue
        frames = slice(first, first + t_len)
        pred_tokens, scores = model._predict_tokens_with_scoring(
            logits[0:1, :, frames], logits[1:2, :, frames], gen_config
        )
        scores = scores - (layer_ids * gen_config.layer_penalty_factor)
        if gen_config.position_temperature > 0.0:
            scores = _gumbel_sample(scores, gen_config.position_temperature)
        sample_tokens = tokens[i : i + 1, :, :t_len]
        scores.masked_fill_(sample_tokens != mask_id, -float("inf"))
        _, topk_idx = torch.topk(scores.flatten(), k)
        flat_tokens = sample_tokens.flatten()
        flat_tokens[topk_idx] = pred_tokens.flatten()[topk_idx]
        sample_tokens.copy_(flat_tokens.view_as(sample_tokens))
        tokens[i : i + 1, :, :t_len] = sample_tokens


ONE_DRAW_DEVICES = ("cpu",)  # where one random draw for the batch equals upstream's per-item draws
SCORE_RUN_ELEMENTS = 1 << 20  # logits per scoring call on CPU (4 MiB): larger ones spill the cache and page-fault


def score_runs(model, logits, spans, gen_config):
    """upstream `_predict_tokens_with_scoring` on the packed logits of the given items ((first column, t_len) each,
    in item order) -> pred_tokens, scores [1, C, N]. On CPU, consecutive items are scored together up to
    SCORE_RUN_ELEMENTS logits per call (row-wise work, so runs change no value); elsewhere in one call."""
    C, V = logits.size(1), logits.size(3)
    limit = SCORE_RUN_ELEMENTS if logits.device.type == "cpu" else float("inf")
    runs, run = [], []
    for first, t_len in spans:
        if run and C * V * (sum(n for _, n in run) + t_len) > limit:
            runs.append(run)
            run = []
        run.append((first, t_len))
    runs.append(run)
    preds, scores = [], []
    for run in runs:
        (start, _), (end, last) = run[0], run[-1]
        contiguous = end + last - start == sum(n for _, n in run)
        if contiguous:
            cols = slice(start, end + last)
        else:
            cols = torch.cat([torch.arange(a, a + n, device=logits.device) for a, n in run])
        pred, score = model._predict_tokens_with_scoring(logits[0:1, :, cols], logits[1:2, :, cols], gen_config)
        preds.append(pred)
        scores.append(score)
    if len(runs) == 1:
        return preds[0], scores[0]
    return torch.cat(preds, dim=2), torch.cat(scores, dim=2)


def unmask_batched(model, tokens, logits, ks, t_lens, offsets, gen_config, layer_ids):
    """The same step for all items at once: one scoring call on the packed logits [1, C, sum(t_len), V] (no
    padding: the per-row work over the vocabulary is done once per real frame), one draw of random numbers, one
    top-k over [A, C * T_max] with a k per item. tokens [B, C, T_max] updated in place.

    Same random numbers: upstream draws rand_like([1, C, t_len]) per active item, in item order; one draw of the
    same count, read in that order, is the same numbers on CPU (torch's CPU generator fills sequentially). On
    CUDA the Philox offset advances per call by an amount that depends on the call's size, so there the items
    keep one draw each (one small kernel per item and step, instead of upstream's twenty).
    Same selection: top-k of the same scores, unless two candidates tie exactly at the k-th place (top-k breaks
    ties by position, and positions are numbered over T_max here, over t_len upstream).
    """
    mask_id, device = model.config.audio_mask_id, tokens.device
    active = [i for i, k in enumerate(ks) if k > 0]
    if not active:
        return
    lens = torch.tensor([t_lens[i] for i in active], device=device)  # [A]
    pred_tokens, scores = score_runs(model, logits, [(offsets[i], t_lens[i]) for i in active], gen_config)  # [1, C, N]
    scores = scores - (layer_ids * gen_config.layer_penalty_factor)
    C, N = scores.shape[1:]
    first = torch.cumsum(lens, 0) - lens  # [A] first packed column of each active item
    item = torch.repeat_interleave(torch.arange(len(active), device=device), lens)  # [N]
    if gen_config.position_temperature > 0.0:
        frame = torch.arange(N, device=device) - first[item]  # [N]
        # column n of codebook c is element c * t_len + frame of its item's [C, t_len] draw
        order = C * first[item] + torch.arange(C, device=device)[:, None] * lens[item] + frame  # [C, N]
        if device.type in ONE_DRAW_DEVICES:  # the CPU generator fills sequentially: one call, per-item numbers
            uniform = torch.rand(C * N, dtype=scores.dtype, device=device)
        else:  # CUDA's Philox offset advances per call by an amount set by the call's size: one call per item
            uniform = torch.cat([torch.rand(C * t_lens[i], dtype=scores.dtype, device=device) for i in active])
        uniform = uniform[order]
        scores = scores / gen_config.position_temperature + gumbel_noise(uniform)
    # packed [1, C, N] -> per item [A, C, T]; frames past an item's t_len repeat its last and are masked below
    T = tokens.size(2)
    column = first[:, None] + torch.minimum(torch.arange(T, device=device)[None, :], lens[:, None] - 1)  # [A, T]
    scores = scores[0][:, column].transpose(0, 1)  # [A, C, T]
    pred_tokens = pred_tokens[0][:, column].transpose(0, 1)
    index = torch.tensor(active, device=device)
    sample_tokens = tokens[index]  # [A, C, T]
    real = (torch.arange(T, device=device)[None, :] < lens[:, None])[:, None, :]  # [A, 1, T]
    scores.masked_fill_((sample_tokens != mask_id) | ~real, -float("inf"))
    k = torch.tensor([ks[i] for i in active], device=device)
    top = torch.topk(scores.reshape(len(active), C * T), max(ks[i] for i in active)).indices  # [A, k_max] best first
    chosen = torch.zeros(len(active), C * T, dtype=torch.bool, device=device)
    chosen.scatter_(1, top, torch.arange(top.size(1), device=device)[None, :] < k[:, None])
    tokens[index] = torch.where(chosen.view(-1, C, T), pred_tokens, sample_tokens)


def packed_devices() -> tuple:
    """Where packed_cfg changes the layout (fastpath.gpu.packed.PACKED_DEVICES; the CPU tests widen it)."""
    from fastpath.gpu import packed

    return packed.PACKED_DEVICES


def generate_iterative(model, task, gen_config):
    """Drop-in for `OmniVoice._generate_iterative(task, gen_config)`; returns a list of [C, t_len] tokens."""
    switched_on = model.__dict__.get(FLAGS_ATTR, set())
    flags = effective_flags(model, switched_on)
    if flags != switched_on:
        note_once(model, GROUPED_FULL_HEADS)
    B, C, mask_id = task.batch_size, model.config.num_audio_codebook, model.config.audio_mask_id
    V, device = model.config.audio_vocab_size, model.device
    inputs_list = [
        model._prepare_inference_inputs(
            task.texts[i], task.target_lens[i], task.ref_texts[i], task.ref_audio_tokens[i],
            task.langs[i], task.instructs[i], gen_config.denoise,
        )
        for i in range(B)
    ]
    c_lens = [inp["input_ids"].size(2) for inp in inputs_list]
    t_lens = list(task.target_lens)
    offsets = [sum(t_lens[:i]) for i in range(B)]
    packed = None
    varlen = "packed_cfg" in flags and device.type in packed_devices()
    if set(GROUPED_LAYOUT) & flags:
        layout = trimmed_groups(model, inputs_list, c_lens, t_lens, own_width="batch_invariant" in flags,
                                by_start="prefix_kv_cache" in flags)
    elif varlen or "trimmed_cfg" in flags:
        packed = packed_layout(model, inputs_list, c_lens, t_lens, offsets, "sliced_heads" in flags, varlen)
        layout = []
        if packed is None:  # no exact row count here: stock's layout for this call
            note_once(model)
            layout = padded_groups(model, inputs_list, c_lens, t_lens)
    else:
        layout = padded_groups(model, inputs_list, c_lens, t_lens)
    groups = [index_targets(g, offsets) for g in layout]

    tokens = torch.full((B, C, max(t_lens)), mask_id, dtype=torch.long, device=device)  # [B, C, T_max]
    logits = torch.zeros((2, C, sum(t_lens), V), dtype=torch.float32, device=device)  # cond, uncond; items packed
    schedules = unmasking_schedules(t_lens, gen_config, C)
    layer_ids = torch.arange(C, device=device).view(1, -1, 1)
    # class_temperature > 0 draws noise inside upstream's _predict_tokens_with_scoring (rand_like of the item's
    # logits, before the item's position noise); a batched call would draw it in another order
    unmask = unmask_batched if "batched_scoring" in flags and gen_config.class_temperature <= 0.0 else unmask_one_by_one

    for step in range(gen_config.num_step):
        for group in groups:
            logits[group.kinds[:, None], :, group.packed] = group_logits(model, group, flags, step)  # [G, T, C, V]
        if packed is not None:
            logits[packed.kinds, :, packed.columns] = packed_logits(model, packed, flags)  # [M, C, V]
        unmask(model, tokens, logits, [s[step] for s in schedules], t_lens, offsets, gen_config, layer_ids)
        if packed is not None:  # the new tokens into both rows of every item
            packed.input_ids[0][:, packed.targets] = tokens[packed.items, :, packed.frames].T  # [C, M]
        for group in groups:  # the new tokens into every row: input_ids[g, :, positions[g]] = tokens[item, :, frames]
            rows = torch.arange(len(group.rows), device=device)[:, None]
            group.input_ids[rows, :, group.positions] = tokens[group.items[:, None], :, group.frames]  # [G, T, C]

    return [tokens[i, :, : t_lens[i]] for i in range(B)]


PADDED_ATTENTION = "fastpath_padded_keys|"  # + the implementation it wraps, e.g. "fastpath_padded_keys|sdpa"


def padded_key_attention(inner: str):
    """An attention function that zero-pads keys/values up to the mask's width, then calls `inner`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module, query, key, value, attention_mask, fastpath_unpacking=None, fastpath_documents=None,
                  **kwargs):
        if fastpath_documents is not None:  # packed_cfg: each row over its own keys (fastpath.gpu.packed)
            from fastpath.gpu.packed import document_attention

            return document_attention(module, query, key, value, fastpath_documents, **kwargs)
        if fastpath_unpacking is not None:
            return unpacked_attention(inner, module, query, key, value, attention_mask, fastpath_unpacking, **kwargs)
        # query: [G, heads, L, d]; key/value: [G, kv_heads, L, d]; attention_mask: [G, 1, L, P], P >= L
        # (prefix_kv_cache's cached steps pass fewer queries than keys, with a mask as wide as the keys: as is)
        L = query.size(2)
        pad = 0 if attention_mask is None or attention_mask.dim() != 4 else attention_mask.size(-1) - key.size(2)
        if pad <= 0:
            return ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)
        pad_seq = (0, 0, 0, pad)  # zero rows appended along the sequence dim
        query, key, value = (torch.nn.functional.pad(t, pad_seq) for t in (query, key, value))
        attention_mask = torch.nn.functional.pad(attention_mask, (0, 0, 0, pad), value=False)  # [G, 1, P, P]
        out, weights = ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)
        return out[:, :L], weights  # out: [G, P, heads, d] -> the real query rows

    return attention


def unpacked_attention(inner: str, module, query, key, value, attention_mask, unpacking: Unpacking, out=None,
                       **kwargs):
    """Attention of a packed forward (Packed) as stock computes it: query [1, heads, N, d] and key/value
    [1, kv_heads, N, d] -> out [1, N, heads, d]. Each of the R segments runs as a row of stock's [2B, heads, P, d]
    batch, in stock's memory order (a transpose of [rows, P, heads, d]), with its part of the [R, 1, P, P] mask:
    a segment of P positions as a view of the packed tensors, a shorter one zero-padded to P in
    `unpacking.buffers`, and then on its first Q queries and K keys (`attention_cut`); segments with the same cut
    share a call of `inner`. `out` [N, heads, d]: where to write the output (default: a new tensor)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    starts, lengths, cuts = unpacking.starts, unpacking.lengths, unpacking.cuts
    R, P = attention_mask.size(0), attention_mask.size(-1)
    packed = [t[0].transpose(0, 1) for t in (query, key, value)]  # [N, heads, d] views
    if not cuts:  # the first layer of the layout's first forward; every layer has the same shapes and mask
        cuts += [attention_cut(inner, module, query, key, attention_mask[r : r + 1], n, kwargs)
                 if r < unpacking.real_rows else (n, n) for r, n in enumerate(lengths)]  # padding: itself only
        unpacking.buffers += [t.new_zeros(R, P, *t.shape[1:]) for t in packed]
    runs, first = [], 0  # (first segment, end): a full segment alone, shorter ones with the same cut together
    for r in range(1, R + 1):
        if r == R or lengths[r] == P or lengths[first] == P or cuts[r] != cuts[first]:
            runs.append((first, r))
            first = r
    if out is None:
        out = query.new_empty(query.size(2), query.size(1), query.size(3))  # [N, heads, d]
    weights = None
    for first, end in runs:
        Q, K = cuts[first]
        if lengths[first] == P:  # stock's row as it is: no copy
            s = starts[first]
            rows = [t[s : s + P][None].transpose(1, 2) for t in packed]  # [1, heads, P, d]
        else:
            for r in range(first, end):
                for buffer, t in zip(unpacking.buffers, packed):
                    buffer[r, : lengths[r]] = t[starts[r] : starts[r] + lengths[r]]
            rows = [buffer[first:end].transpose(1, 2) for buffer in unpacking.buffers]  # [rows, heads, P, d]
        q, k, v = rows
        part, weights = ALL_ATTENTION_FUNCTIONS[inner](
            module, q[:, :, :Q], k[:, :, :K], v[:, :, :K], attention_mask[first:end, :, :Q, :K], **kwargs)
        for r in range(first, end):  # part: [rows, Q, heads, d]
            out[starts[r] : starts[r] + lengths[r]] = part[r - first, : lengths[r]]
    return out[None], weights


_ATTENTION_CUTS: dict = {}  # attention_cut's answers in this process


def attention_cut(inner: str, module, query, key, mask, n: int, kwargs) -> tuple:
    """(Q, K): the fewest queries and keys, from a short list, at which `inner` gives a row's n real queries the
    bits they get over all P = mask.size(-1) queries and keys, as in stock's call. The list: queries rounded up
    to 32 with keys rounded up to 64, then to the SDPA kernel's 512-key blocks, then all P keys; then the same
    with queries rounded up to the query block the CPU flash kernel uses at P queries (32 below 192 queries, 64
    below 768, 256 above), at least as many as keep that block (under MKL's AVX2 cap a row's bits change when
    its last query block is 32 rows instead of 64); then (P, P). Measured once per
    (P, n, shapes, threads) on random queries, keys and values in stock's memory order with the row's own mask
    (the kernels' blocking follows the shapes, not the values); (P, P) off the CPU, where nothing claims
    bit-exactness."""
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    P = mask.size(-1)

    def up(x: int, m: int) -> int:  # x rounded up to a multiple of m, at most P
        return min(P, -(-x // m) * m)

    block, least = (256, 768) if P >= 768 else (64, 192) if P >= 192 else (32, 0)  # stock's query blocks
    queries = [up(n, 32), max(up(n, block), min(P, least))]  # ... and a count that keeps stock's blocks
    candidates = [c for c in dict.fromkeys((Q, max(K, Q)) for Q in queries for K in (up(n, 64), up(n, 512), P))
                  if c != (P, P)]
    if not candidates or query.device.type != "cpu":
        return (P, P)
    h, kv_heads, d = query.size(1), key.size(1), query.size(3)
    state = (inner, P, n, h, kv_heads, d, query.dtype, mask.dtype, torch.get_num_threads(), kwargs.get("scaling"),
             hash(mask.cpu().numpy().tobytes()))
    if state not in _ATTENTION_CUTS:
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, P, heads, d, generator=generator).to(query.dtype).transpose(1, 2)
                   for heads in (h, kv_heads, kv_heads))  # [1, heads, P, d] in stock's memory order

        def real_queries(Q: int, K: int):  # [1, n, heads, d]
            return ALL_ATTENTION_FUNCTIONS[inner](module, q[:, :, :Q], k[:, :, :K], v[:, :, :K], mask[..., :Q, :K],
                                                  **kwargs)[0][:, :n]

        with torch.no_grad(), _disable_current_modes():  # unseen by a FLOP counter around the generate it serves
            want = real_queries(P, P)
            _ATTENTION_CUTS[state] = next((c for c in candidates if torch.equal(real_queries(*c), want)), (P, P))
    return _ATTENTION_CUTS[state]


def install_padded_key_attention(model) -> None:
    """Point this model's LLM at the padding wrapper of its current attention implementation."""
    from transformers import AttentionInterface

    current = model.llm.config._attn_implementation
    if current.startswith(PADDED_ATTENTION):
        return
    name = PADDED_ATTENTION + current
    AttentionInterface.register(name, padded_key_attention(current))  # adds a name; changes no existing one
    model.llm.set_attn_implementation(name)


def remove_padded_key_attention(model) -> None:
    current = model.llm.config._attn_implementation
    if current.startswith(PADDED_ATTENTION):
        model.llm.set_attn_implementation(current[len(PADDED_ATTENTION):])
