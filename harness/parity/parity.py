"""Bit-exact parity: record everything a generation computes, then compare two runs element by element.

`record_generation` reseeds, runs `model.generate`, and keeps, per unmasking step and item, the conditional and
unconditional logits at the positions the sampler reads (the arguments of `_predict_tokens_with_scoring`), the
predicted tokens and scores, the final tokens, the decoder's audio of every chunk or item (what
`audio_tokenizer.decode` returns, before upstream's post-processing: its int16 round trip in the silence trimming
would hide a change smaller than 1/32768) and the waveform generate returns. `compare_runs` says how many
elements differ and where, for each of them; an empty list means bit-exact (`torch.equal`, max |diff| == 0.0).

`decoded_changed` and `code_changed` change one decoded chunk by one sample, or one code of one codebook before it
is decoded: the mutations that show a waveform check bites (tests_harness/test_waveform_checks.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fastpath.instance import overridden
from harness.model.points import PARITY, reference

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
    decoded: list = field(default_factory=list)  # per decode call and item in it: np.ndarray float32 [1, samples]


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
            overridden(model, "_generate_iterative", recording_iterate), kept_decoded(model) as decoded:
        torch.manual_seed(seed)
        run.waveforms = [np.asarray(w) for w in model.generate(**generate_kwargs)]
    run.decoded = decoded
    return run


def audio_values(out):
    """The [B, 1, samples] tensor of an audio_tokenizer.decode result (a ModelOutput, or the tensor itself)."""
    return out.audio_values if hasattr(out, "audio_values") else out


def _with_audio_values(out, values):
    if hasattr(out, "audio_values"):
        out.audio_values = values
        return out
    return values


@contextmanager
def _changed_decode(model, call: int | None, when, codes=None, audio=None):
    """audio_tokenizer.decode with its `call`-th call (counting only calls where `when()` holds; None: every such
    call) changed: `codes(codes) -> codes` before it decodes, `audio(values) -> values` after. Yields the list of
    counted calls (so a test can check the mutation fired)."""
    calls = []

    def change(decode):
        def run(*args, **kwargs):
            hit = when is None or when()
            if hit:
                calls.append(1)
            hit = hit and (call is None or len(calls) - 1 == call)
            if hit and codes is not None:
                given = kwargs.pop("audio_codes") if "audio_codes" in kwargs else args[0]
                args = (codes(given.clone()), *(args[1:] if args and args[0] is given else args))
            out = decode(*args, **kwargs)
            return _with_audio_values(out, audio(audio_values(out).clone())) if hit and audio is not None else out

        return run

    with overridden(model.audio_tokenizer, "decode", change):
        yield calls


def decoded_changed(model, call: int | None = 0, sample: int | None = None, by: float | None = None, when=None):
    """A context in which the `call`-th audio_tokenizer.decode of the model (counted from 0; a chunk or an item;
    only calls where `when()` holds count) returns its audio with one sample changed: `sample` (default: the middle
    one) moved by `by`, or to the next float up when `by` is None (one ulp). What a waveform check must catch."""
    def change(values):  # [B, 1, samples]
        at = values.shape[-1] // 2 if sample is None else sample
        x = values[0, 0, at]
        values[0, 0, at] = torch.nextafter(x, torch.tensor(float("inf"), dtype=x.dtype)) if by is None else x + by
        return values

    return _changed_decode(model, call, when, audio=change)


def code_changed(model, call: int | None = 0, codebook: int = 0, frame: int | None = None, when=None):
    """A context in which the `call`-th audio_tokenizer.decode of the model decodes its codes with one changed:
    codebook `codebook` at `frame` (default: the middle one) set to the next entry. The tokens generate made are
    untouched: only a check that compares the audio can see it."""
    size = model.audio_tokenizer.config.codebook_size

    def change(codes):  # [B, C, T]
        at = codes.shape[-1] // 2 if frame is None else frame
        codes[0, codebook, at] = (codes[0, codebook, at] + 1) % size
        return codes

    return _changed_decode(model, call, when, codes=change)


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


@contextmanager
def kept_decoded(model):
    """Within the block, the audio of every `audio_tokenizer.decode` call (float32 [1, samples] per item) is
    appended to the yielded list."""
    out: list = []

    def keep(decode):
        def run(*args, **kwargs):
            result = decode(*args, **kwargs)
            out.extend(np.array(a.detach().float().cpu().numpy()) for a in audio_values(result))
            return result

        return run

    with overridden(model.audio_tokenizer, "decode", keep):
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
    candidate = Run(per_item_calls(stock.steps, candidate.steps), candidate.tokens, candidate.waveforms,
                    decoded=candidate.decoded)
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
    for part in ("decoded", "waveforms"):
        a_list, b_list = getattr(stock, part), getattr(candidate, part)
        if len(a_list) != len(b_list):
            problems.append(f"{part}: {len(a_list)} vs {len(b_list)}")
        name = "decoded audio" if part == "decoded" else "waveform"
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            msg = describe_difference(f"{name}[{i}]", torch.from_numpy(a), torch.from_numpy(b))
            if msg:
                problems.append(msg)
    return problems[:limit]
