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

Not bit-exact (another attention kernel, another reduction order), so lossless=False: on CUDA it is compared with
stock under tolerances (tests_parity/test_gpu_parity.py); its logic (layout, document mask, buckets, scoring) is
tested on CPU against the padded path within fp32 rounding (tests_parity/test_packed_cfg.py), by widening
PACKED_DEVICES. On other devices it applies and stays inert, as the other GPU patches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

BLOCK = 128  # FlexAttention's default sparse block: the packed length is a multiple of it
PACKED_DEVICES = ("cuda",)  # where packed_cfg changes the layout; elsewhere the call runs as without it


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


@dataclass(eq=False)
class Documents:
    """The segment of each packed position, passed to the LLM call as `fastpath_documents`; its block mask is
    built by the first layer of a forward and shared by the others."""

    ids: torch.Tensor  # [N] int32
    mask: object = None  # BlockMask

    def block_mask(self):
        if self.mask is None:
            self.mask = document_block_mask(self.ids)
        return self.mask


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)  # the fused kernel; eager flex materialises all scores


def document_attention(module, query, key, value, documents: Documents, scaling=None, dropout: float = 0.0,
                       **kwargs):
    """An attention of transformers' interface over packed rows: query [1, heads, N, d], key/value
    [1, kv_heads, N, d] -> ([1, N, heads, d], None). Compiled FlexAttention on CUDA; eager elsewhere (correct,
    unfused: the CPU tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    if dropout:
        raise ValueError("packed_cfg runs inference only (dropout 0)")
    flex = _compiled_flex() if query.device.type == "cuda" else flex_attention
    out = flex(query, key, value, block_mask=documents.block_mask(), scale=scaling,
               enable_gqa=query.size(1) != key.size(1))  # [1, heads, N, d]
    return out.transpose(1, 2).contiguous(), None
