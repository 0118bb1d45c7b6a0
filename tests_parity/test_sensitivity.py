"""The test model hears every input the patches touch: changing one input alone changes the generated tokens, and
the audio with them.

A parity check can only see a difference that reaches its output. If the test checkpoint ignored an input (a codec
whose codebooks are all zeros ignores the reference audio; a decoder that ignores its codes gives every generate of
one length the same waveform), a patch that mixed up that input (one voice's prompt handed to another request, a
stale static prefix, another guidance scale) would pass every bit-exact check. So for each input below, one
generate with it changed is compared with the base generate: the final tokens must differ, and where the tokens
differ, the decoder's audio and the returned waveform must differ too. Runs on any checkpoint (the built ones, or a
real one: it must pass there too). Each row is (input, base, what changes); 4 steps keep it inside the default run.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from harness.parity import record_generation
from harness.points import reference

TEXT = "The weather is lovely today, so we walk."
OTHER_TEXT = "The market is crowded today, so we wait."
BASE = dict(text=TEXT, language="en", num_step=4)
DESIGN = dict(BASE, instruct="female, low pitch")
# the reference as a tensor, not preprocessed: its length (and so the prompt's) stays the same when its content changes
CLONE = dict(BASE, ref="ref_3s", preprocess_prompt=False)


def clip(name: str, reverse: bool = False):
    audio, rate = sf.read(reference(name)[0], dtype="float32")
    return torch.from_numpy(np.ascontiguousarray(audio[::-1] if reverse else audio)), rate


def generate_kwargs(setting: dict) -> tuple:
    """(generate kwargs, seed) of a row's setting: 'ref' becomes ref_audio + ref_text, 'reversed' reverses it."""
    kwargs = dict(setting)
    seed = kwargs.pop("seed", 0)
    ref = kwargs.pop("ref", None)
    reverse = kwargs.pop("reversed", False)
    if ref:
        kwargs["ref_audio"] = clip(ref, reverse)
        kwargs.setdefault("ref_text", reference(ref)[1])
    return kwargs, seed


# (input, base setting, the change); the base's defaults are upstream's (OmniVoiceGenerationConfig)
ROWS = [
    ("text", CLONE, dict(text=OTHER_TEXT)),
    ("language", DESIGN, dict(language="de")),
    ("instruct", DESIGN, dict(instruct="male, high pitch")),
    ("reference audio content (same length)", CLONE, dict(reversed=True)),
    ("reference text", CLONE, dict(ref_text="A different transcript of the same clip.")),
    ("duration", CLONE, dict(duration=2.0)),
    ("speed", CLONE, dict(speed=1.3)),
    ("guidance scale", CLONE, dict(guidance_scale=3.0)),
    ("t_shift", CLONE, dict(t_shift=0.5)),
    ("layer penalty", CLONE, dict(layer_penalty_factor=1.0)),
    ("position temperature", CLONE, dict(position_temperature=1.0)),
    ("class temperature", CLONE, dict(class_temperature=1.0)),
    ("denoise", CLONE, dict(denoise=False)),
    ("num_step", CLONE, dict(num_step=5)),
    ("seed", CLONE, dict(seed=1)),
]


@pytest.fixture(scope="module")
def base_runs(model):
    runs = {}
    for name, setting in (("clone", CLONE), ("design", DESIGN)):
        kwargs, seed = generate_kwargs(setting)
        runs[id(setting)] = record_generation(model, seed=seed, **kwargs)
    return runs


def differs(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape != b.shape or not np.array_equal(a, b)


def changed_parts(base, other) -> dict:
    """For tokens, decoded audio and waveforms: whether each differs between the two runs (any item)."""
    def any_differs(x, y):
        return len(x) != len(y) or any(differs(torch.as_tensor(p).numpy(), torch.as_tensor(q).numpy())
                                       for p, q in zip(x, y))

    return {part: any_differs(getattr(base, part), getattr(other, part)) for part in ("tokens", "decoded", "waveforms")}


@pytest.mark.cpu
@pytest.mark.parametrize(("name", "base", "change"), ROWS, ids=[row[0] for row in ROWS])
def test_changing_one_input_changes_the_tokens_and_the_audio(model, base_runs, name, base, change):
    kwargs, seed = generate_kwargs({**base, **change})
    other = record_generation(model, seed=seed, **kwargs)
    changed = changed_parts(base_runs[id(base)], other)
    assert changed["tokens"], f"{name} changed and the generated tokens did not: the test model ignores it"
    assert changed["decoded"] and changed["waveforms"], (
        f"{name} changed the tokens but not the audio ({changed}): the decoder ignores the codes")
