"""Every operating point of the suite, from one file (fixtures/points.json), as `generate` keyword arguments:
the parity tier's and the goldens' (`PARITY`), the CUDA tolerance tier's (`GPU_PARITY`), the speed tier's (`point`:
RTF and streaming points)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness import REPO_ROOT

POINTS_FILE = REPO_ROOT / "fixtures" / "points.json"
REFERENCE = REPO_ROOT / "fixtures" / "reference"


def reference(name: str) -> tuple:
    """(path of fixtures/reference/<name>.wav, its transcript)."""
    return str(REFERENCE / f"{name}.wav"), (REFERENCE / f"{name}.txt").read_text().strip()


@dataclass(frozen=True)
class Point:
    text: str
    voice: str
    num_step: int
    weight: float
    each: bool = False  # a list of texts generated one call per text instead of as one batch

    @property
    def name(self) -> str:
        return f"{self.voice}-{self.text}-{self.num_step}" + ("-each" if self.each else "")

    def generate_kwargs(self, model, prompts: dict | None = None, postprocess: bool | None = None):
        """Keyword arguments for model.generate; for an `each` point, a list of them (one call per text). Voice
        prompts are encoded once (outside any timing).

        postprocess (default: off for a built random-weight checkpoint, on for real weights) is upstream's
        silence trimming (pydub, on the CPU): a random decoder's output has no pauses to trim, and the stored
        speed baselines of the built checkpoints were measured without it.
        """
        spec = load_spec()
        kwargs = dict(text=spec["texts"][self.text], language="en", num_step=self.num_step)
        if postprocess is None:
            postprocess = not is_random_checkpoint(model)
        if not postprocess:
            kwargs["postprocess_output"] = False
        ref = spec["voices"][self.voice].get("ref")
        if ref:
            prompts = {} if prompts is None else prompts
            if ref not in prompts:
                audio, text = reference(ref)
                prompts[ref] = model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
            kwargs["voice_clone_prompt"] = prompts[ref]
        if self.each:
            return [dict(kwargs, text=text) for text in kwargs["text"]]
        return kwargs


def is_random_checkpoint(model) -> bool:
    """True for a checkpoint built by harness.model.checkpoint (it carries fastpath_recipe.json)."""
    return (Path(model.config.name_or_path) / "fastpath_recipe.json").is_file()


def load_spec() -> dict:
    return json.loads(POINTS_FILE.read_text())


def load_points(section: str = "speed") -> list:
    """The RTF points ("speed") or the streaming points ("stream")."""
    return [Point(**p) for p in load_spec()[section]]


def parity_points() -> dict:
    """name -> generate() kwargs; a 'ref' (or a list of them, one per text) becomes ref_audio + ref_text
    ('voice_clone_prompt' stays a name)."""
    out = {}
    for name, kwargs in load_spec()["parity"].items():
        kwargs = dict(kwargs)
        if "ref" in kwargs:
            ref = kwargs.pop("ref")
            if isinstance(ref, list):
                kwargs["ref_audio"], kwargs["ref_text"] = (list(x) for x in zip(*map(reference, ref)))
            else:
                kwargs["ref_audio"], kwargs["ref_text"] = reference(ref)
        out[name] = kwargs
    return out


PARITY = parity_points()
GPU_PARITY = load_spec()["gpu_parity"]


def point(name: str) -> Point:
    every = load_points() + load_points("stream")
    for p in every:
        if p.name == name:
            return p
    raise KeyError(f"no speed or stream point {name!r}; known: {[p.name for p in every]}")


def headline(medians: dict) -> float:
    """S = sum(weight * median RTF) over the points in `medians` (name -> median RTF), weights renormalised."""
    pts = {p.name: p for p in load_points()}
    total = sum(pts[n].weight for n in medians)
    if total <= 0:
        raise ValueError(f"the points {sorted(medians)} all have weight 0; S needs weighted points")
    return sum(pts[n].weight * rtf for n, rtf in medians.items()) / total
