"""Closeness of two runs that are not meant to be bit-exact (GPU patches, low precision): numbers, not verdicts.

The parity tier's `record_generation` records, per scoring call, the logits the sampler reads. Across a whole
generation one different token changes every later step's input, so only the first step compares like with like:
`first_step` takes each item's step-0 conditional and unconditional logits ([1, C, T, V]), computed from the same
fully masked input in both runs. Over the whole run, the final tokens and the waveforms are compared too.

    relative error   ||a - b|| / ||b|| over the step-0 logits, in float64 (b: the reference run)
    argmax agreement share of step-0 positions (codebook x frame) whose most likely token is the same
    token agreement  share of final tokens that are equal, over all items
    waveform cosine  cosine similarity of the waveforms (the shorter length), lowest over items
    waveform SNR     10 log10(||b||^2 / ||a - b||^2) in dB, lowest over items
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch


def relative_error(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64).flatten()
    b = torch.as_tensor(b, dtype=torch.float64).flatten()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    denom = torch.linalg.vector_norm(b).item()
    diff = torch.linalg.vector_norm(a - b).item()
    return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)


def argmax_agreement(a, b) -> float:
    """Share of positions (all but the last dim) where argmax over the last dim is the same."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a.argmax(-1) == b.argmax(-1)).double().mean().item()


def token_agreement(a_list, b_list) -> float:
    """Share of equal tokens over items ([C, T] each); an item whose shape differs counts as all different."""
    same = total = 0
    for a, b in zip(a_list, b_list, strict=True):
        a, b = torch.as_tensor(a).cpu(), torch.as_tensor(b).cpu()
        total += max(a.numel(), b.numel())
        if a.shape == b.shape:
            same += int((a == b).sum())
    return same / total if total else 1.0


def _trim(a, b) -> tuple:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    n = min(a.size, b.size)
    return a[:n], b[:n]


def waveform_cosine(a, b) -> float:
    a, b = _trim(a, b)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def waveform_snr_db(a, b) -> float:
    """SNR of a against the reference b, in dB (inf when equal)."""
    a, b = _trim(a, b)
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(b**2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def first_step(run, items: int) -> list:
    """[(c_logits, u_logits)] of step 0 for each of `items` items: the first `items` scoring calls."""
    steps = dict(run.steps)
    return [(steps[f"call {i} c_logits"], steps[f"call {i} u_logits"]) for i in range(items)]


@dataclass
class Closeness:
    rel_error: float
    argmax_agreement: float
    token_agreement: float
    waveform_cosine: float
    waveform_snr_db: float

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"step-0 logits rel err {self.rel_error:.2e}, argmax agreement {self.argmax_agreement:.4f}; "
                f"tokens {self.token_agreement:.4f}; waveform cosine {self.waveform_cosine:.4f}, "
                f"SNR {self.waveform_snr_db:.1f} dB")


def closeness(candidate, reference, item: int | None = None) -> Closeness:
    """How close a recorded run is to a reference run (both from `record_generation`, same seed and input): over all
    items, or over item `item` alone (its step-0 logits, its tokens, its waveform: a batch whose items got each
    other's draws shows here even where the pooled figures would average it out)."""
    from harness.parity.parity import Run, per_item_calls

    items = len(reference.tokens)
    if len(candidate.tokens) != items:
        raise ValueError(f"runs generated {len(candidate.tokens)} vs {items} token tensors: different inputs?")
    # batched_scoring scores several items in one call: split it per item as upstream scores them (found on the
    # H200: the GPU stack's batch of 2 compared its packed 43 + 70 frames with stock's first item's 43)
    candidate = Run(per_item_calls(reference.steps, candidate.steps), candidate.tokens, candidate.waveforms,
                    decoded=candidate.decoded)
    cand, ref = first_step(candidate, items), first_step(reference, items)
    if item is not None:
        keep = slice(item, item + 1)
        cand, ref = cand[keep], ref[keep]
        candidate = Run([], candidate.tokens[keep], candidate.waveforms[keep], decoded=candidate.decoded)
        reference = Run([], reference.tokens[keep], reference.waveforms[keep], decoded=reference.decoded)
    a = torch.cat([torch.cat([c.flatten(), u.flatten()]) for c, u in cand]).float()
    b = torch.cat([torch.cat([c.flatten(), u.flatten()]) for c, u in ref]).float()
    agree = [argmax_agreement(x, y) for (cx, ux), (cy, uy) in zip(cand, ref) for x, y in ((cx, cy), (ux, uy))]
    sizes = [x.numel() // x.shape[-1] for c, u in ref for x in (c, u)]
    waves = list(zip(candidate.waveforms, reference.waveforms, strict=True))
    return Closeness(
        rel_error=relative_error(a, b),
        argmax_agreement=sum(g * n for g, n in zip(agree, sizes)) / sum(sizes),
        token_agreement=token_agreement(candidate.tokens, reference.tokens),
        waveform_cosine=min(waveform_cosine(x, y) for x, y in waves) if waves else 1.0,
        waveform_snr_db=min(waveform_snr_db(x, y) for x, y in waves) if waves else math.inf,
    )


@dataclass(frozen=True)
class Row:
    """One tolerance row of the GPU tier: a patch set at a checkpoint size and dtype, the bounds its closeness to
    stock at the same precision must keep, what a GPU measured (None: not measured yet; the first GPU run prints it),
    the card that measured it, and why the bounds are what they are (a bound looser than measured says why)."""

    name: str
    patches: tuple
    size: str
    dtype: str
    max_rel_err: float
    min_argmax: float
    min_tokens: float
    measured: tuple | None  # (rel err, argmax agreement or None, token agreement) as measured
    card: str | None
    why: str

    def refused(self, close: Closeness) -> list:
        """What of `close` is outside this row's bounds (empty: within)."""
        return [f"{what} {value:.3g} {sign} {bound}" for what, value, sign, bound, bad in (
            ("step-0 rel err", close.rel_error, ">", self.max_rel_err, close.rel_error > self.max_rel_err),
            ("argmax agreement", close.argmax_agreement, "<", self.min_argmax, close.argmax_agreement < self.min_argmax),
            ("token agreement", close.token_agreement, "<", self.min_tokens, close.token_agreement < self.min_tokens),
        ) if bad]
