"""TF32 matmuls and convolutions, cudnn.benchmark off (patch `cuda_tf32`): process-global settings, restored on revert.

- `torch.backends.cuda.matmul.allow_tf32 = True`: float32 matmuls on tensor cores in TF32 (10 mantissa bits);
  `torch.get_float32_matmul_precision()` then reads "high". Only float32 work changes (an fp32 model, the
  fp32 vocoder); bf16 and fp16 matmuls are not affected.
- `torch.backends.cudnn.allow_tf32 = True`: the same for cuDNN convolutions (the vocoder). torch's default.
- `torch.backends.cudnn.benchmark = False`: with benchmark on, cuDNN times every algorithm for each new input
  shape, and every sentence has a new length; a production write-up measured 8.8 s first-hit latency on novel
  lengths with it on and 0.9 s with it off (reference 003). torch's default.

Why not `torch.set_float32_matmul_precision("high")`, which public write-ups also recommend: on torch >= 2.9 it
also switches oneDNN's CPU matmuls to TF32, and mixing it with the per-backend flags leaves states whose getters
raise ("mix of the legacy and new APIs"). Setting cuBLAS's flag alone gives CUDA the same "high" precision.

These are settings of the process, not of the model. The patch only loosens (a setting already where it wants
it is left alone), records what it changed on the model instance, and revert puts back each one that still holds
the value the patch set; one changed since by someone else is left as it is and named in a warning. On a model
that is not on CUDA the patch changes nothing. A deep copy of the model carries the patch with nothing recorded:
the settings are the original's change, and reverting the copy leaves them to the original.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

FLAGS_ATTR = "_fastpath_cuda_flags"  # model instance attribute: {"device", "changed": {name: (before, set)}}
SETTINGS = {"matmul_allow_tf32": True, "cudnn_allow_tf32": True, "cudnn_benchmark": False}


class Record(dict):
    """{"device", "changed"} kept on the model; its deep copy has changed nothing."""

    def __deepcopy__(self, memo):
        return Record(device=self["device"], changed={})


def _get(getter):
    try:
        return getter()
    except RuntimeError:  # torch >= 2.9 refuses to read a state set through both its old and new APIs
        return None


def read() -> dict:
    """The settings this patch touches (None where torch refuses to read one), and the matmul precision."""
    return {
        "matmul_allow_tf32": _get(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "cudnn_allow_tf32": _get(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": _get(torch.get_float32_matmul_precision),
    }


def write(values: dict) -> None:
    if "matmul_allow_tf32" in values:
        torch.backends.cuda.matmul.allow_tf32 = values["matmul_allow_tf32"]
    if "cudnn_allow_tf32" in values:
        torch.backends.cudnn.allow_tf32 = values["cudnn_allow_tf32"]
    if "cudnn_benchmark" in values:
        torch.backends.cudnn.benchmark = values["cudnn_benchmark"]


def model_device_type(model) -> str:
    return torch.device(model.device).type


def apply(model) -> dict:
    """On a CUDA model, move each setting that is not already there to SETTINGS; record it. Idempotent."""
    if FLAGS_ATTR in model.__dict__:
        return model.__dict__[FLAGS_ATTR]
    device = model_device_type(model)
    changed = {}
    if device == "cuda":
        now = read()
        changed = {k: (now[k], v) for k, v in SETTINGS.items() if now[k] is not None and now[k] != v}
        write({k: v for k, (_, v) in changed.items()})
    record = Record(device=device, changed=changed)
    model.__dict__[FLAGS_ATTR] = record
    return record


def revert(model) -> list:
    """Put back what apply changed; returns the names left alone because they were changed again since."""
    record = model.__dict__.pop(FLAGS_ATTR, None)
    if not record or not record["changed"]:
        return []
    now = read()
    restore = {k: before for k, (before, set_to) in record["changed"].items() if now[k] == set_to}
    left = sorted(set(record["changed"]) - set(restore))
    write(restore)
    if left:
        log.warning("cuda_tf32 revert: %s changed since apply; left as they are now", left)
    return left
