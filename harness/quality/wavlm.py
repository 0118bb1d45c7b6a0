"""The field's speaker-similarity judge beside GE2E: a WavLM speaker-verification model (transformers
`WavLMForXVector`), loaded from a local folder only, never the hub.

    --sim-judge PATH / FASTPATH_SIM_JUDGE=PATH   a folder holding config.json, preprocessor_config.json and the
                                                 weights (e.g. `microsoft/wavlm-base-plus-sv` saved with
                                                 save_pretrained, or a WavLM-large verification model)

SIM of two clips is the cosine of their x-vectors (`.embeddings`), each clip resampled to 16 kHz and passed whole
through the folder's own feature extractor. Seed-TTS-eval reports the cosine of WavLM-large verification embeddings;
figures from this judge are comparable with those only when the folder holds that model. Its known answers need the
real weights: here its loading and scoring path is tested on a randomly initialised model of the same class
(tests_quality/test_field_judges.py). A clip it must not hear is refused by the same checks as GE2E's (audio.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np

from . import audio
from .audio import JUDGE_SR, to_judge_rate
from .cache import cached_array
from .judge import file_sha256

ENV = "FASTPATH_SIM_JUDGE"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def weights_file(path: Path) -> Path:
    found = [path / name for name in WEIGHTS if (path / name).is_file()]
    if not (path / "config.json").is_file() or not found:
        raise FileNotFoundError(
            f"SIM judge folder {path} has no config.json and weights ({' or '.join(WEIGHTS)}); point --sim-judge / "
            f"{ENV} at a WavLMForXVector folder saved with save_pretrained (e.g. microsoft/wavlm-base-plus-sv, "
            "downloaded on a machine that reaches the hub and copied here)")
    return found[0]


@dataclasses.dataclass
class WavLMJudge:
    """A loaded WavLMForXVector and its feature extractor; `identity` is recorded in every result and keys its
    cache."""

    model: object
    extractor: object
    identity: str
    unit: str = "WavLM x-vector cosine"

    def embed(self, wav: np.ndarray, sr: int) -> np.ndarray:
        import torch

        audio.require(wav, sr, "SIM")
        x = to_judge_rate(wav, sr)

        def compute() -> np.ndarray:
            inputs = self.extractor(x, sampling_rate=JUDGE_SR, return_tensors="pt")
            with torch.inference_mode():
                emb = self.model(**inputs).embeddings[0].float()
            return (emb / emb.norm().clamp_min(1e-12)).numpy().astype(np.float32)

        return cached_array("voice", x.tobytes() + self.identity.encode(), compute)

    def similarity(self, a: tuple[np.ndarray, int], b: tuple[np.ndarray, int]) -> float:
        return float(np.dot(self.embed(*a), self.embed(*b)))


@functools.lru_cache(maxsize=2)
def load(folder: str) -> WavLMJudge:
    """The model in `folder` on CPU, from local files only (a folder without its files is refused, naming how to
    provide one)."""
    from transformers import AutoFeatureExtractor, WavLMForXVector

    from harness.run import machine

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"SIM judge folder {path} does not exist (from --sim-judge / {ENV})")
    weights = weights_file(path)
    model = WavLMForXVector.from_pretrained(str(path), local_files_only=True).eval()
    extractor = AutoFeatureExtractor.from_pretrained(str(path), local_files_only=True)
    config = json.loads((path / "config.json").read_text())
    identity = json.dumps({"judge": "WavLMForXVector", "model": path.name, "weights_sha256": file_sha256(weights)[:16],
                           "layers": config.get("num_hidden_layers"), "hidden": config.get("hidden_size"),
                           "input_sr": JUDGE_SR, "cpu_isa": machine.isa_tag(machine.cpu_isa()),
                           "engine": {n: machine.package_version(n) for n in ("torch", "transformers")}},
                          sort_keys=True)
    return WavLMJudge(model, extractor, identity)
