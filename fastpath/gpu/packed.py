"""Packed classifier-free guidance for CUDA (patch `packed_cfg`): every row of a step in one forward at its own
length, each row attending over its own keys only, with FlexAttention and a document block mask.

Stock runs a step as one batch of 2B rows padded to the longest conditional row: every unconditional row (the
target alone) is padded to its item's conditional length, and every row of a mixed batch to the longest item.
Here the rows are packed back to back along the sequence axis of one [1, N] forward (the layout `trimmed_cfg`
uses, `fastpath.loop.packed_layout`: B conditional rows, then B unconditional rows, positions counting from 0 in
each), N padded up to a multiple of BLOCK with one padding segment so that a bounded set of shapes reaches the
kernels (and CUDA graphs). Attention: a query sees the keys of its own segment only (`Documents`: the segment of
each packed position). FlexAttention runs that block-sparse: a 128 x 128 block of (query, key) positions that
shares no segment is skipped, a block inside one segment runs unmasked, the others with the mask.
Projections, MLPs and the heads (with sliced_heads) run on the rows' own positions plus the bucket's last block.

Compiled FlexAttention (COMPILED_FLEX_DEVICES: CUDA) runs each packed length at its rung of a ladder of powers of
four (BLOCK * 4^k: five rungs up to 32768 positions, more than a batch of eight long items packs), its padding blocks
each a segment of their own (one 128 x 128 block of work each, against the rows' own blocks), compiled once per
rung with static shapes: dynamic shapes were measured to fail to compile on inductor's CPU FlexAttention template
(torch 2.14.1: a C++ compile error at the second length), so the CPU could not run what the GPU runs, while a rung
is the same static kernel on both and a bounded set of shapes for CUDA graphs. At most MAX_COMPILES compiles per
process, under dynamo's own recompile limit (8 per code object, past which it would run eager silently); past the
bound a new rung runs eager FlexAttention (all N x N scores), counted in `stats()` and warned (EagerFlexWarning).

Not bit-exact (another attention kernel, another reduction order), so lossless=False: on CUDA it is compared with
stock under tolerances (tests_parity/test_gpu_parity.py); its logic (layout, document mask, buckets, scoring) is
tested on CPU against the padded path within fp32 rounding (tests_parity/test_packed_cfg.py), by widening
PACKED_DEVICES (eager FlexAttention there); the compiled flex on CPU by widening COMPILED_FLEX_DEVICES
(tests_patches/test_inductor.py). On other devices it applies and stays inert, as the other GPU patches.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

BLOCK = 128  # FlexAttention's default sparse block: the packed length is a multiple of it
PACKED_DEVICES = ("cuda",)  # where packed_cfg changes the layout; elsewhere the call runs as without it
COMPILED_FLEX_DEVICES = ("cuda",)  # where its attention runs compiled FlexAttention; elsewhere eager (correct, unfused)
MAX_COMPILES = 6  # compiles of the flex per process: the five rungs 128..32768 of one dtype, and one to spare;
# under dynamo's own recompile limit of 8 (past which it would run eager without a word)


def packed_length(n: int) -> int:
    """The forward's length for rows of n positions in all: n rounded up to a multiple of BLOCK."""
    return -(-n // BLOCK) * BLOCK


def document_ids(lengths, total: int, device) -> torch.Tensor:
    """[total] int32: segment r at the positions of the r-th row, len(lengths) at the padding after them."""
    ids = torch.full((total,), len(lengths), dtype=torch.int32)
    ids[: sum(lengths)] = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                                  torch.tensor(lengths))
    return ids.to(device)


def document_block_mask(ids: torch.Tensor, block: int = BLOCK):
    """FlexAttention's BlockMask for "a query attends to the keys of its own segment": ids [N] nondecreasing, N a
    multiple of `block`. Built from the first and last segment of each block with tensor ops only (no host sync,
    so it can run inside a CUDA graph capture): two blocks share a segment iff their segment ranges overlap, and
    a pair is full (every query sees every key) iff both blocks lie inside the same single segment."""
    from torch.nn.attention.flex_attention import BlockMask

    N = ids.numel()
    if N % block:
        raise ValueError(f"a packed length of {N} is not a multiple of the block ({block}): use packed_length")
    first, last = ids.view(-1, block)[:, 0], ids.view(-1, block)[:, -1]  # [Nb]
    overlap = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])  # [Nb, Nb] (query, key)
    single = first == last
    full = single[:, None] & single[None, :] & (first[:, None] == first[None, :])

    def ordered(blocks):  # [Nb, Nb] bool -> [1, 1, Nb] counts and [1, 1, Nb, Nb] indices, the chosen ones first
        blocks = blocks[None, None]
        order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
        return blocks.sum(-1, dtype=torch.int32), order.to(torch.int32)

    def same_segment(b, h, q, kv):
        return ids[q] == ids[kv]

    return BlockMask.from_kv_blocks(*ordered(overlap & ~full), *ordered(full), BLOCK_SIZE=block,
                                    mask_mod=same_segment, seq_lengths=(N, N), compute_q_blocks=False)


def rung(n: int) -> int:
    """The compiled flex's length for a packed length n: the smallest BLOCK * 4^k >= n (a coarse ladder: few compiles;
    a padding block costs one block of attention, the projections and MLPs run at n)."""
    length = BLOCK
    while length < n:
        length *= 4
    return length


def padded_ids(ids: torch.Tensor, total: int) -> torch.Tensor:
    """[total] int32: ids [N] (N a multiple of BLOCK), then one new segment per padding block, so a padding query
    attends to its own block only. Tensor ops only (no host sync: built inside CUDA graph captures)."""
    pad = torch.arange(total - ids.numel(), dtype=torch.int32, device=ids.device) // BLOCK + ids[-1] + 1
    return torch.cat([ids, pad])


@dataclass(eq=False)
class Documents:
    """The segment of each packed position, passed to the LLM call as `fastpath_documents`; its block masks are
    built by the first layer of a forward and shared by the others."""

    ids: torch.Tensor  # [N] int32
    masks: dict = field(default_factory=dict)  # None (eager, at N) or a rung -> BlockMask

    def block_mask(self, length: int | None = None):
        """The BlockMask at N (length None), or at `length` >= N: the packed rows, then padding blocks each on its
        own, from new ids (made in the caller's inference mode, as the padded query: see document_attention)."""
        if length not in self.masks:
            self.masks[length] = document_block_mask(self.ids if length is None else padded_ids(self.ids, length))
        return self.masks[length]


@dataclass
class FlexStats:
    """What the packed attention ran: compiles (graphs inductor built), calls, eager calls by reason, lengths."""

    compiles: int = 0
    compiled_calls: int = 0
    eager_calls: Counter = field(default_factory=Counter)  # reason -> calls
    lengths: set = field(default_factory=set)  # packed lengths N seen
    rungs: set = field(default_factory=set)  # lengths the compiled flex ran at
    keys: set = field(default_factory=set)  # compile_key of each call compiled so far


STATS = FlexStats()


class EagerFlexWarning(UserWarning):
    """packed_cfg's attention ran eager FlexAttention where it runs compiled: every N x N score materialised."""


def stats() -> dict:
    """The packed attention's counters in this process: compiles, compiled calls, eager calls and why, lengths.
    Calls are counted as Python runs them: under cuda_graphs, a captured forward's replays are not counted."""
    return {"compiles": STATS.compiles, "max_compiles": MAX_COMPILES, "compiled_calls": STATS.compiled_calls,
            "eager_calls": dict(STATS.eager_calls), "lengths": sorted(STATS.lengths),
            "rungs": sorted(STATS.rungs)}


def _counted_inductor(graph, example_inputs):
    """torch.compile's default backend (inductor), counting each graph it compiles."""
    from torch._inductor.compile_fx import compile_fx

    STATS.compiles += 1
    return compile_fx(graph, example_inputs)


def _flex(query, key, value, block_mask, scale, enable_gqa):
    """FlexAttention, in a function of its own: dynamo's cache (and its recompile limit) is this code's, not shared
    with others in the process that compile flex_attention itself."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


@functools.cache
def _compiled_flex():
    return torch.compile(_flex, backend=_counted_inductor, dynamic=False)  # the fused kernel, static per rung


def compile_key(tensors, scaling, gqa) -> tuple:
    """What dynamo specialises the compiled flex on (static shapes): shape, dtype, device and inference-ness of
    query, key, value [1, heads, rung, d], the scale, GQA and grad mode. A new key is a new compile."""
    return (tuple((tuple(t.shape), t.dtype, str(t.device), t.is_inference()) for t in tensors), scaling, gqa,
            torch.is_grad_enabled())


def admitted(n: int, tensors, scaling, gqa) -> bool:
    """Whether the call at packed length n runs compiled: its key compiled already, or a compile left under
    MAX_COMPILES. Past the bound, warns (EagerFlexWarning) and the caller runs eager."""
    key, length = compile_key(tensors, scaling, gqa), tensors[0].size(2)
    if key in STATS.keys or STATS.compiles < MAX_COMPILES:
        STATS.keys.add(key)
        STATS.rungs.add(length)
        return True
    warnings.warn(f"packed_cfg: FlexAttention at packed length {n} (rung {length}) runs eager, "
                  f"every score materialised: the compile bound is reached ({STATS.compiles} compiles, "
                  f"fastpath.gpu.packed.MAX_COMPILES = {MAX_COMPILES}; rungs compiled: {stats()['rungs']})",
                  EagerFlexWarning, stacklevel=3)
    return False


def document_attention(module, query, key, value, documents: Documents, scaling=None, dropout: float = 0.0,
                       **kwargs):
    """An attention of transformers' interface over packed rows: query [1, heads, N, d], key/value
    [1, kv_heads, N, d] -> ([1, N, heads, d], None). Compiled FlexAttention at N's rung (zero rows appended) on
    COMPILED_FLEX_DEVICES; eager at N elsewhere (correct, unfused: the CPU tests) and past the compile bound."""
    from torch.nn.attention.flex_attention import flex_attention

    if dropout:
        raise ValueError("packed_cfg runs inference only (dropout 0)")
    N, gqa = query.size(2), query.size(1) != key.size(1)
    STATS.lengths.add(N)
    if query.device.type in COMPILED_FLEX_DEVICES:
        length = rung(N)
        # zero rows appended along the sequence dim; new tensors even where N is on the rung, so that what the
        # compiled flex gets (and the mask's ids) are always made in the caller's mode: dynamo specialises on
        # inference tensors, and a length on its rung would otherwise compile again
        tensors = [torch.nn.functional.pad(t, (0, 0, 0, length - N)) for t in (query, key, value)]
        if admitted(N, tensors, scaling, gqa):
            STATS.compiled_calls += 1
            out = _compiled_flex()(*tensors, documents.block_mask(length), scaling, gqa)  # [1, heads, rung, d]
            return out[:, :, :N].transpose(1, 2).contiguous(), None
        why = f"compile bound ({MAX_COMPILES}) reached"
    else:
        why = f"{query.device.type} is not in COMPILED_FLEX_DEVICES"
    STATS.eager_calls[why] += 1
    out = flex_attention(query, key, value, block_mask=documents.block_mask(), scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None  # [1, N, heads, d]
