"""The field's MOS judge beside DNSMOS: UTMOS22's strong learner, the figure upstream OmniVoice and the papers report,
through `utmos-pytorch` (a fairseq-free port that matches the original's scores), from a local weights file only.

    --mos-judge PATH / FASTPATH_MOS_JUDGE=PATH   utmos_state_dict.pt (Blinorot/UTMOS-PyTorch on the hub,
                                                 downloaded on a machine that reaches it and copied here)

The weights are loaded strictly (every key of the model, nothing else; the package itself would accept a partial
file): a file of another model is refused by name. Each clip is resampled to 16 kHz and scored alone (batch 1, as
UTMOS recommends), one metric, "UTMOS" (1-5). Its known answers need the real weights: here its loading and scoring
path is tested on a randomly initialised model of the same class (tests_quality/test_field_judges.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from . import audio
from .audio import JUDGE_SR, to_judge_rate
from .cache import atomic_write, cache_dir
from .judge import file_sha256

ENV = "FASTPATH_MOS_JUDGE"
FIELDS = (("UTMOS", "utmos", "UTMOS22 strong"),)  # (metric, field, unit), as stats.MOS_FIELDS for DNSMOS


@dataclasses.dataclass
class UtmosJudge:
    model: object
    identity: str
    fields: tuple = FIELDS

    def score(self, wav: np.ndarray, sr: int) -> dict:
        """{"utmos": score} of one clip (cached on disk by audio and identity); bad audio is refused."""
        import torch

        audio.require(wav, sr, "MOS")
        x = to_judge_rate(wav, sr)
        key = hashlib.sha256(x.tobytes() + self.identity.encode()).hexdigest()[:32]
        path = cache_dir("mos") / f"{key}.json"
        if path.exists():
            return json.loads(path.read_text())
        with torch.inference_mode():
            value = float(self.model.score(torch.from_numpy(x))[0])
        record = {"utmos": value}
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(record)))
        return record


@functools.lru_cache(maxsize=2)
def load(weights: str) -> UtmosJudge:
    """UTMOSModel with the state dict at `weights`, strictly, on CPU."""
    try:
        import torch
        from torch import nn
        from utmos_pytorch.utmos_torch import UTMOSModel, UTMOSScoreTorch, remove_weight_norm_for_jit
    except ImportError as err:
        raise ImportError("the UTMOS judge needs utmos-pytorch: pip install -e . --group quality") from err
    from harness.run import machine

    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"UTMOS weights {path} do not exist (from --mos-judge / {ENV}): give the path of "
                                "utmos_state_dict.pt (Blinorot/UTMOS-PyTorch), copied from a machine that reaches "
                                "the hub")
    model = UTMOSModel()
    state = torch.load(path, map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path} is not a UTMOS22 strong state dict: {len(missing)} of the model's keys missing "
                         f"({', '.join(missing[:3])}...), {len(unexpected)} unexpected; give utmos_state_dict.pt")
    model.eval()
    remove_weight_norm_for_jit(model)
    # the package's scorer (its forward: batch 1, domain 0, judge 288, scaled to 1-5) around the model loaded here;
    # its own constructor would load the file again, without the strict check
    scorer = UTMOSScoreTorch.__new__(UTMOSScoreTorch)
    nn.Module.__init__(scorer)
    scorer.device, scorer.model = "cpu", model
    identity = json.dumps({"judge": "UTMOS22 strong (utmos-pytorch)", "utmos-pytorch":
                           machine.package_version("utmos-pytorch"), "weights_sha256": file_sha256(path)[:16],
                           "input_sr": JUDGE_SR, "cpu_isa": machine.isa_tag(machine.cpu_isa()),
                           "engine": {"torch": machine.package_version("torch")}}, sort_keys=True)
    return UtmosJudge(scorer, identity)
