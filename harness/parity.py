"""Bit-exact parity: record everything a generation computes, then compare two runs element by element.

`record_generation` reseeds, runs `model.generate`, and keeps, per unmasking step and item, the conditional and
unconditional logits at the positions the sampler reads (the arguments of `_predict_tokens_with_scoring`), the
predicted tokens and scores, the final tokens and the waveform. `compare_runs` says how many elements differ
and where, for each of them; an empty list means bit-exact (`torch.equal`, max |diff| == 0.0).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fastpath.instance import overridden
from harness.points import PARITY, reference

REF_3S = reference("ref_3s")  # the saved-prompt point's reference
POINTS = PARITY  # name -> generate() kwargs (fixtures/points.json, "parity"); "voice_clone_prompt" marks the saved-prompt path


class PointUnsupported(RuntimeError):
    """The installed omnivoice lacks the API an operating point exercises (the gate runs older versions)."""


def resolve_point(model, point: dict, tmp_dir) -> dict:
    """Materialise a saved voice prompt: create with the stock model, save to `tmp_dir`, load back."""
    from omnivoice.models.omnivoice import VoiceClonePrompt

    kwargs = dict(point)
    if kwargs.get("voice_clone_prompt") == "ref_3s":
        if not hasattr(VoiceClonePrompt, "save"):
            raise PointUnsupported("the saved-prompt point needs VoiceClonePrompt.save/load, which this omnivoice "
                                   "lacks (added in 0.2.1)")
        tmp_dir = tmp_dir.mktemp("prompt") if hasattr(tmp_dir, "mktemp") else Path(tmp_dir)
        path = tmp_dir / "ref_3s.pt"
        model.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1]).save(str(path))
        kwargs["voice_clone_prompt"] = VoiceClonePrompt.load(str(path))
    return kwargs


@dataclass
class Run:
    steps: list = field(default_factory=list)  # [(name, tensor)] in call order: c_logits, u_logits, pred, scores
    tokens: list = field(default_factory=list)  # per generated item or chunk: [C, T]
    waveforms: list = field(default_factory=list)  # per item: np.ndarray [samples]
    passes: list = field(default_factory=list)  # per _generate_iterative call: (items, index of its first call)


def record_generation(model, seed: int, **generate_kwargs) -> Run:
    """Reseed, generate, and record per-step logits, tokens and waveforms (instance hooks, removed after)."""
    run = Run()

    def recording_predict(predict):
        def record(c_logits, u_logits, gen_config):
            pred, scores = predict(c_logits, u_logits, gen_config)
            n = len(run.steps) // 4
            run.steps += [
                (f"call {n} c_logits", c_logits.detach().clone()),
                (f"call {n} u_logits", u_logits.detach().clone()),
                (f"call {n} pred_tokens", pred.detach().clone()),
                (f"call {n} scores", scores.detach().clone()),
            ]
            return pred, scores

        return record

    def recording_iterate(iterate):
        def record(task, gen_config):
            run.passes.append((getattr(task, "batch_size", 1), len(run.steps) // 4))
            out = iterate(task, gen_config)
            run.tokens += [t.detach().clone() for t in out]
            return out

        return record

    with overridden(model, "_predict_tokens_with_scoring", recording_predict), \
            overridden(model, "_generate_iterative", recording_iterate):
        torch.manual_seed(seed)
        run.waveforms = [np.asarray(w) for w in model.generate(**generate_kwargs)]
    return run


@contextmanager
def kept_tokens(model):
    """Within the block, the tokens of every `_generate_iterative` call ([C, T] per item or chunk, cloned) are
    appended to the yielded list."""
    out: list = []

    def keep(iterate):
        def run(task, gen_config):
            tokens = iterate(task, gen_config)
            out.extend(t.detach().clone() for t in tokens)
            return tokens

        return run

    with overridden(model, "_generate_iterative", keep):
        yield out


def describe_difference(name: str, a, b) -> str | None:
    """None when a and b are bit-identical, else how many elements differ, by how much and where."""
    a = torch.as_tensor(a)
    b = torch.as_tensor(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{name}: shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    if torch.equal(a, b):
        return None
    both_nan = torch.isnan(a) & torch.isnan(b) if a.is_floating_point() else torch.zeros_like(a, dtype=torch.bool)
    differ = (a != b) & ~both_nan
    if not differ.any():
        return None  # equal up to NaN positions that are NaN in both
    idx = differ.nonzero()
    first = tuple(idx[0].tolist())
    if a.is_floating_point():
        finite = differ & torch.isfinite(a) & torch.isfinite(b)
        maxdiff = (a[finite] - b[finite]).abs().max().item() if finite.any() else float("nan")
        detail = f"max |diff| {maxdiff:.3e}"
    else:
        detail = f"{a[first].item()} vs {b[first].item()} at first"
    return f"{name}: {int(differ.sum())}/{a.numel()} elements differ, {detail}, first at {first}"


def per_item_calls(reference: list, steps: list) -> list:
    """`steps` with each batched scoring call (several items packed along the frame axis: [1, C, sum(t_len), ...])
    split into per-item calls, cut by the frame counts of the matching calls in `reference` (upstream scores one
    item per call)."""
    out, done = [], 0
    for n in range(0, len(steps) - 3, 4):
        call, start = steps[n : n + 4], 0
        while start < call[0][1].size(2):
            ref = reference[4 * done : 4 * done + 4]
            if len(ref) < 4:  # more items than the reference scored: keep the rest whole, the counts will differ
                out += [(name, tensor[:, :, start:]) for name, tensor in call]
                break
            t_len = ref[0][1].size(2)
            out += [(name, tensor[:, :, start : start + t_len]) for (name, _), (_, tensor) in zip(ref, call)]
            start, done = start + t_len, done + 1
    return out


def compare_runs(stock: Run, candidate: Run, limit: int = 12) -> list:
    """Every difference between two runs (empty list: bit-exact), stopping after `limit` messages. Scoring calls
    that cover several items at once are compared item by item (`per_item_calls`)."""
    problems = []
    candidate = Run(per_item_calls(stock.steps, candidate.steps), candidate.tokens, candidate.waveforms)
    if len(stock.steps) != len(candidate.steps):
        problems.append(f"scoring calls: {len(stock.steps) // 4} vs {len(candidate.steps) // 4}")
    for (name, a), (_, b) in zip(stock.steps, candidate.steps):
        msg = describe_difference(name, a, b)
        if msg:
            problems.append(msg)
        if len(problems) >= limit:
            return problems
    if len(stock.tokens) != len(candidate.tokens):
        problems.append(f"token tensors: {len(stock.tokens)} vs {len(candidate.tokens)}")
    for i, (a, b) in enumerate(zip(stock.tokens, candidate.tokens)):
        msg = describe_difference(f"tokens[{i}]", a, b)
        if msg:
            problems.append(msg)
    if len(stock.waveforms) != len(candidate.waveforms):
        problems.append(f"waveforms: {len(stock.waveforms)} vs {len(candidate.waveforms)}")
    for i, (a, b) in enumerate(zip(stock.waveforms, candidate.waveforms)):
        msg = describe_difference(f"waveform[{i}]", torch.from_numpy(a), torch.from_numpy(b))
        if msg:
            problems.append(msg)
    return problems[:limit]
