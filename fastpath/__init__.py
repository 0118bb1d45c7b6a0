"""fastpath: reversible inference speedups for a loaded `omnivoice.OmniVoice` model.

    import fastpath
    fastpath.apply(model)                 # every lossless patch (bit-exact on CPU fp32)
    fastpath.apply(model, "trimmed_cfg")  # or one by name
    fastpath.revert(model)                # back to stock
    with fastpath.patched(model): ...
    for piece in fastpath.stream(model, text, language="en"): ...  # chunk by chunk, one ahead; .cancel() any thread
    fastpath.apply(model, fastpath.defaults(model))  # what pays on the model's device (GPU tier on CUDA)

Importing this package patches nothing and does not initialise CUDA.
"""

from fastpath.device_defaults import FULL_PRESET, defaults
from fastpath.fingerprints import UpstreamMismatchError
from fastpath.streaming import Stream, StreamBusyError, stream
from fastpath.registry import (
    LOSSLESS,
    PATCHES,
    ConflictingPatchesError,
    NotOmniVoiceError,
    Patch,
    UnknownPatchError,
    applied,
    apply,
    patched,
    revert,
)

__all__ = [
    "LOSSLESS", "PATCHES", "Patch", "apply", "applied", "patched", "revert",
    "NotOmniVoiceError", "UnknownPatchError", "UpstreamMismatchError",
    "defaults", "FULL_PRESET", "ConflictingPatchesError", "stream", "Stream", "StreamBusyError",
]
__version__ = "0.1.0"
