"""What each generation of an omnivoice-server process made, written as JSON lines (the serving check's recorder).

harness.serving.serving runs this file inside the server's process before the server starts (`runpy.run_path(...)
["install"](path)`), in the serving environment, where neither `harness` nor this checkout is importable: it uses
the standard library and what the server brings. It wraps the server's one call of the model
(`OmniVoiceAdapter.call(request, model)`, one per generation: a request, or one sentence of a stream) and, on the
model's audio tokenizer instance, `decode`, which upstream calls with the final tokens of every item or chunk
(codes [1, C, T]). Per generation one line: the request's text, mode and seed, the worker thread, the monotonic
start and end, sha256 and shape of every token tensor decoded, and `fastpath.applied(model)` (None without
fastpath). Stock and patched servers are recorded the same way; nothing here changes what they compute.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time


def install(path: str) -> None:
    from omnivoice_server.services.inference import OmniVoiceAdapter

    lock = threading.Lock()
    local = threading.local()
    call = OmniVoiceAdapter.call
    hooked = set()

    def hook_decode(model) -> None:
        tokenizer = model.audio_tokenizer
        if id(tokenizer) in hooked:
            return
        decode = tokenizer.decode  # the bound method the model would call

        def decode_recorded(codes, *args, **kwargs):
            record = getattr(local, "record", None)
            if record is not None:
                c = codes.detach().cpu().contiguous()
                record["tokens"].append([list(c.shape), hashlib.sha256(c.numpy().tobytes()).hexdigest()])
            return decode(codes, *args, **kwargs)

        tokenizer.decode = decode_recorded
        hooked.add(id(tokenizer))

    def applied(model):
        try:
            import fastpath
        except ImportError:
            return None
        return fastpath.applied(model)

    def call_recorded(self, req, model):
        with lock:
            hook_decode(model)
        record = {"text": req.text, "mode": req.mode, "seed": req.seed, "thread": threading.current_thread().name,
                  "applied": applied(model), "tokens": [], "start": time.monotonic()}
        local.record = record
        try:
            return call(self, req, model)
        finally:
            local.record = None
            record["end"] = time.monotonic()
            with lock, open(path, "a") as out:
                out.write(json.dumps(record) + "\n")

    OmniVoiceAdapter.call = call_recorded
