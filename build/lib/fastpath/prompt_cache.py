"""Voice-prompt cache: the reference encoding is reused across calls, keyed by audio content.

`create_voice_clone_prompt` runs silence removal and the audio tokenizer's encoder on every call (1-2 s for a
real tokenizer). A dubbing job calls it with the same reference hundreds of times. The cache key is the audio's
content (file bytes, or waveform bytes + sample rate), the reference text and the preprocess flag, so a renamed
file hits and an edited one misses. Entries can be saved to and loaded from disk; a file made with another
audio tokenizer is refused.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from fastpath import instance

CACHE_ATTR = "_fastpath_prompt_cache"
FORMAT = "fastpath-voice-prompt-cache"
FORMAT_VERSION = 1


class PromptCacheError(RuntimeError):
    pass


def audio_key(ref_audio) -> str:
    h = hashlib.sha256()
    if isinstance(ref_audio, (str, os.PathLike)):
        h.update(b"file:")
        h.update(Path(ref_audio).read_bytes())
    else:
        waveform, sr = ref_audio
        if isinstance(waveform, torch.Tensor):
            waveform = waveform.detach().cpu().numpy()
        arr = np.ascontiguousarray(waveform)
        h.update(f"wave:{arr.dtype}:{arr.shape}:{int(sr)}:".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def prompt_key(ref_audio, ref_text, preprocess_prompt) -> str:
    return hashlib.sha256(f"{audio_key(ref_audio)}|{ref_text!r}|{bool(preprocess_prompt)}".encode()).hexdigest()


def tokenizer_identity(model) -> str:
    """Which audio tokenizer made the tokens: its config and a digest of its weights."""
    h = hashlib.sha256(model.audio_tokenizer.config.to_json_string().encode())
    for name, tensor in sorted(model.audio_tokenizer.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()[:4096])
    return h.hexdigest()[:24]


class PromptCache:
    def __init__(self, original):
        self.original = original  # the instance's unpatched bound create_voice_clone_prompt
        self.entries: dict = {}
        self.hits = 0
        self.misses = 0

    def __call__(self, ref_audio, ref_text=None, preprocess_prompt=True):
        key = prompt_key(ref_audio, ref_text, preprocess_prompt)
        prompt = self.entries.get(key)
        if prompt is None:
            self.misses += 1
            prompt = self.original(ref_audio=ref_audio, ref_text=ref_text, preprocess_prompt=preprocess_prompt)
            self.entries[key] = prompt
        else:
            self.hits += 1
        return prompt


def apply(model) -> None:
    if CACHE_ATTR in model.__dict__:
        return
    cache = PromptCache(model.create_voice_clone_prompt)
    instance.install(model, CACHE_ATTR, cache)
    instance.install(model, "create_voice_clone_prompt", cache)


def revert(model) -> None:
    instance.restore(model, "create_voice_clone_prompt")
    instance.restore(model, CACHE_ATTR)


def _cache_of(model) -> PromptCache:
    cache = model.__dict__.get(CACHE_ATTR)
    if cache is None:
        raise PromptCacheError("the voice-prompt cache is not applied: call fastpath.apply(model, 'prompt_cache') first")
    return cache


def save(model, path) -> None:
    """Write every cached prompt to `path` (atomic)."""
    cache = _cache_of(model)
    blob = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(model),
        "entries": {
            k: {"ref_audio_tokens": p.ref_audio_tokens.detach().cpu(), "ref_text": p.ref_text, "ref_rms": float(p.ref_rms)}
            for k, p in cache.entries.items()
        },
    }
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load(model, path) -> int:
    """Add the prompts saved in `path` to the model's cache; returns how many were added."""
    from omnivoice.models.omnivoice import VoiceClonePrompt

    cache = _cache_of(model)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt file
        raise PromptCacheError(f"{path} is not a readable voice-prompt cache ({err}); delete it and rebuild") from err
    if not isinstance(blob, dict) or blob.get("format") != FORMAT or blob.get("format_version") != FORMAT_VERSION:
        raise PromptCacheError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} file; delete it and rebuild")
    if blob["tokenizer"] != tokenizer_identity(model):
        raise PromptCacheError(
            f"{path} was made with another audio tokenizer; its tokens do not fit this model. Delete it and rebuild"
        )
    for key, e in blob["entries"].items():
        cache.entries[key] = VoiceClonePrompt(ref_audio_tokens=e["ref_audio_tokens"], ref_text=e["ref_text"], ref_rms=e["ref_rms"])
    return len(blob["entries"])
