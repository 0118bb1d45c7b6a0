"""fastpath: reversible inference speedups for a loaded `omnivoice.OmniVoice` model.

    import fastpath
    fastpath.apply(model)                 # every lossless patch (bit-exact on CPU fp32)
    fastpath.apply(model, "trimmed_cfg")  # or one by name
    fastpath.revert(model)                # back to stock
    with fastpath.patched(model): ...

Importing this package patches nothing and does not initialise CUDA.
"""

from fastpath.fingerprints import UpstreamMismatchError
from fastpath.registry import LOSSLESS, PATCHES, NotOmniVoiceError, Patch, UnknownPatchError, apply, applied, patched, revert

__all__ = [
    "LOSSLESS", "PATCHES", "Patch", "apply", "applied", "patched", "revert",
    "NotOmniVoiceError", "UnknownPatchError", "UpstreamMismatchError",
]
__version__ = "0.1.0"
