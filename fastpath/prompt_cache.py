"""Voice-prompt cache: the reference encoding is reused across calls, keyed by audio content.

`create_voice_clone_prompt` runs silence removal and the audio tokenizer's encoder on every call (1-2 s for a
real tokenizer). A dubbing job calls it with the same reference hundreds of times. The cache key is the audio's
content (file bytes, or waveform bytes + sample rate), the reference text and the preprocess flag, so a renamed
file hits and an edited one misses.

Bounded: at most `max_entries` prompts and `max_bytes` of their tokens (on the tokenizer's device), the least
recently used dropped first; defaults DEFAULT_MAX_ENTRIES and DEFAULT_MAX_BYTES, changed with `set_limits`.
Every call gets its own prompt (its tokens a copy of the cached ones), so a caller that changes what it got
changes nothing in the cache. Safe to call from several threads (two first calls of one reference both encode).

Entries can be saved to and loaded from disk; a file made with another audio tokenizer is refused, and every
entry of a file is checked (key, text, level, tokens' dtype, shape and code range) before any is added.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import re
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from fastpath import instance

CACHE_ATTR = "_fastpath_prompt_cache"
FORMAT = "fastpath-voice-prompt-cache"
FORMAT_VERSION = 2  # 2: tokenizer identity from dtype, shape and the first bytes of each tensor
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 64 * 2**20  # a 10 s reference is 8 x 250 int64 codes, 16 KB: the entry bound comes first
IDENTITY_BYTES = 4096  # per tensor of the tokenizer: what its identity reads
KEY = re.compile(r"[0-9a-f]{64}")


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
    """Which audio tokenizer made the tokens: its config, and each tensor's name, dtype, shape and first
    IDENTITY_BYTES bytes, gathered on its device and copied to the host at once (never a whole tensor)."""
    h = hashlib.sha256(model.audio_tokenizer.config.to_json_string().encode())
    heads = []
    for name, tensor in sorted(model.audio_tokenizer.state_dict().items()):
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        flat = tensor.detach().reshape(-1)  # a view of a contiguous tensor
        heads.append(flat[: max(1, IDENTITY_BYTES // flat.element_size())].contiguous().view(torch.uint8))
    if heads:
        h.update(torch.cat(heads).cpu().numpy().tobytes())
    return h.hexdigest()[:24]


def _own_copy(prompt):
    """The same prompt with its own tokens."""
    return dataclasses.replace(prompt, ref_audio_tokens=prompt.ref_audio_tokens.clone())


def _size(prompt) -> int:
    return prompt.ref_audio_tokens.numel() * prompt.ref_audio_tokens.element_size()


def _limit(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class PromptCache:
    """Stands in for the instance's `create_voice_clone_prompt`: an LRU of prompts by content key."""

    def __init__(self, original, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES):
        self.original = original  # the instance's unpatched bound create_voice_clone_prompt
        self.max_entries, self.max_bytes = _limit("max_entries", max_entries), _limit("max_bytes", max_bytes)
        self.entries: OrderedDict = OrderedDict()  # key -> prompt, least recently used first
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0
        self.lock = threading.Lock()

    def __call__(self, ref_audio, ref_text=None, preprocess_prompt=True):
        key = prompt_key(ref_audio, ref_text, preprocess_prompt)
        with self.lock:
            stored = self.entries.get(key)
            if stored is not None:
                self.entries.move_to_end(key)
                self.hits += 1
                return _own_copy(stored)
            self.misses += 1
        prompt = self.original(ref_audio=ref_audio, ref_text=ref_text, preprocess_prompt=preprocess_prompt)
        self.put(key, prompt)
        return prompt

    def put(self, key: str, prompt) -> None:
        """Keep a copy of `prompt` under `key`, then drop the least recently used beyond the bounds (a prompt
        larger than max_bytes alone is not kept)."""
        kept = _own_copy(prompt)
        with self.lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self.nbytes -= _size(old)
            if _size(kept) > self.max_bytes:
                return
            self.entries[key] = kept
            self.nbytes += _size(kept)
            self._fit()

    def _fit(self) -> None:
        while len(self.entries) > self.max_entries or self.nbytes > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.nbytes -= _size(dropped)
            self.evictions += 1

    def set_limits(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        with self.lock:
            if max_entries is not None:
                self.max_entries = _limit("max_entries", max_entries)
            if max_bytes is not None:
                self.max_bytes = _limit("max_bytes", max_bytes)
            self._fit()

    def stats(self) -> dict:
        with self.lock:
            return {"entries": len(self.entries), "bytes": self.nbytes, "max_entries": self.max_entries,
                    "max_bytes": self.max_bytes, "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions}

    def __deepcopy__(self, memo):
        twin = PromptCache(copy.deepcopy(self.original, memo), self.max_entries, self.max_bytes)
        with self.lock:
            twin.entries = copy.deepcopy(self.entries, memo)
            twin.nbytes, twin.hits, twin.misses, twin.evictions = self.nbytes, self.hits, self.misses, self.evictions
        return twin


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


def set_limits(model, max_entries: int | None = None, max_bytes: int | None = None) -> None:
    """Bound the model's voice-prompt cache (defaults DEFAULT_MAX_ENTRIES prompts, DEFAULT_MAX_BYTES of tokens);
    what no longer fits is dropped now, least recently used first."""
    _cache_of(model).set_limits(max_entries, max_bytes)


def stats(model) -> dict:
    """Entries, bytes, bounds, hits, misses and evictions of the model's voice-prompt cache."""
    return _cache_of(model).stats()


def save(model, path) -> None:
    """Write every cached prompt to `path` (atomic)."""
    cache = _cache_of(model)
    with cache.lock:
        entries = list(cache.entries.items())
    blob = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(model),
        "entries": {
            k: {"ref_audio_tokens": p.ref_audio_tokens.detach().cpu(), "ref_text": p.ref_text, "ref_rms": float(p.ref_rms)}
            for k, p in entries
        },
    }
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    torch.save(blob, tmp)
    os.replace(tmp, path)


def entry_problem(model, key, entry) -> str | None:
    """What is wrong with one saved entry for this model, or None."""
    codebooks = model.config.num_audio_codebook
    codes = getattr(model.audio_tokenizer.config, "codebook_size", model.config.audio_mask_id)
    if not isinstance(key, str) or not KEY.fullmatch(key):
        return f"key {key!r} is not a sha256 hex digest"
    if not isinstance(entry, dict) or set(entry) != {"ref_audio_tokens", "ref_text", "ref_rms"}:
        return f"entry {key[:12]} has fields {sorted(entry) if isinstance(entry, dict) else type(entry).__name__}"
    tokens, text, rms = entry["ref_audio_tokens"], entry["ref_text"], entry["ref_rms"]
    if not isinstance(text, str):
        return f"entry {key[:12]}: ref_text is {type(text).__name__}, not str"
    if not isinstance(rms, float) or not math.isfinite(rms) or rms < 0:
        return f"entry {key[:12]}: ref_rms {rms!r} is not a finite level >= 0"
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        return f"entry {key[:12]}: tokens are {getattr(tokens, 'dtype', type(tokens).__name__)}, not int64 codes"
    if tokens.dim() != 2 or tokens.shape[0] != codebooks or tokens.shape[1] < 1:
        return f"entry {key[:12]}: tokens of shape {tuple(tokens.shape)}, this model needs [{codebooks}, frames]"
    if int(tokens.min()) < 0 or int(tokens.max()) >= codes:
        return (f"entry {key[:12]}: codes from {int(tokens.min())} to {int(tokens.max())}, this tokenizer's are 0 to "
                f"{codes - 1}")
    return None


def load(model, path) -> int:
    """Add the prompts saved in `path` to the model's cache (each checked first: all or none are added); returns
    how many were added."""
    from omnivoice.models.omnivoice import VoiceClonePrompt

    cache = _cache_of(model)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt file
        raise PromptCacheError(f"{path} is not a readable voice-prompt cache ({err}); delete it and rebuild") from err
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise PromptCacheError(f"{path} is not a {FORMAT} file; delete it and rebuild")
    if blob.get("format_version") != FORMAT_VERSION:
        raise PromptCacheError(f"{path} is a {FORMAT} v{blob.get('format_version')} file, this fastpath reads "
                               f"v{FORMAT_VERSION}; delete it and rebuild (fastpath.prompt_cache.save)")
    if blob.get("tokenizer") != tokenizer_identity(model):
        raise PromptCacheError(
            f"{path} was made with another audio tokenizer; its tokens do not fit this model. Delete it and rebuild"
        )
    entries = blob.get("entries")
    if not isinstance(entries, dict):
        raise PromptCacheError(f"{path} holds no entries table; delete it and rebuild")
    for key, entry in entries.items():
        problem = entry_problem(model, key, entry)
        if problem:
            raise PromptCacheError(f"{path}: {problem}; nothing was loaded. Delete it and rebuild")
    device = model.audio_tokenizer.device
    for key, e in entries.items():
        cache.put(key, VoiceClonePrompt(ref_audio_tokens=e["ref_audio_tokens"].to(device, torch.long),
                                        ref_text=e["ref_text"], ref_rms=e["ref_rms"]))
    return len(entries)
