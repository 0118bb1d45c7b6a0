"""Bit-exact parity: record everything a generation computes, then compare two runs element by element.

`record_generation` reseeds, runs `model.generate`, and keeps, per unmasking step and item, the conditional and
unconditional logits at the positions the sampler reads (the arguments of `_predict_tokens_with_scoring`), the
predicted tokens and scores, the final tokens and the waveform. `compare_runs` says how many elements differ
and where, for each of them; an empty list means bit-exact (`torch.equal`, max |diff| == 0.0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Run:
    steps: list = field(default_factory=list)  # [(name, tensor)] in call order: c_logits, u_logits, pred, scores
    tokens: list = field(default_factory=list)  # per generated item or chunk: [C, T]
    waveforms: list = field(default_factory=list)  # per item: np.ndarray [samples]


def record_generation(model, seed: int, **generate_kwargs) -> Run:
    """Reseed, generate, and record per-step logits, tokens and waveforms (instance hooks, removed after)."""
    run = Run()
    predict = model._predict_tokens_with_scoring  # bound: stock or patched
    iterate = model._generate_iterative

    def recording_predict(c_logits, u_logits, gen_config):
        pred, scores = predict(c_logits, u_logits, gen_config)
        n = len(run.steps) // 4
        run.steps += [
            (f"call {n} c_logits", c_logits.detach().clone()),
            (f"call {n} u_logits", u_logits.detach().clone()),
            (f"call {n} pred_tokens", pred.detach().clone()),
            (f"call {n} scores", scores.detach().clone()),
        ]
        return pred, scores

    def recording_iterate(task, gen_config):
        out = iterate(task, gen_config)
        run.tokens += [t.detach().clone() for t in out]
        return out

    had_predict = "_predict_tokens_with_scoring" in model.__dict__
    had_iterate = "_generate_iterative" in model.__dict__
    model.__dict__["_predict_tokens_with_scoring"] = recording_predict
    model.__dict__["_generate_iterative"] = recording_iterate
    try:
        torch.manual_seed(seed)
        run.waveforms = [np.asarray(w) for w in model.generate(**generate_kwargs)]
    finally:
        if had_predict:
            model.__dict__["_predict_tokens_with_scoring"] = predict
        else:
            del model.__dict__["_predict_tokens_with_scoring"]
        if had_iterate:
            model.__dict__["_generate_iterative"] = iterate
        else:
            del model.__dict__["_generate_iterative"]
    return run


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


def compare_runs(stock: Run, candidate: Run, limit: int = 12) -> list:
    """Every difference between two runs (empty list: bit-exact), stopping after `limit` messages."""
    problems = []
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
