"""Streaming: `stream(model, text, **generate_kwargs)` yields the waveform chunk by chunk, generating one chunk ahead.

    for piece in fastpath.stream(model, "First sentence. Second one. A third.", language="en"):
        player.write(piece)          # 1-D float32 at model.sampling_rate; playback can start at the first piece

Stages per chunk: the worker thread generates chunk k+1 (upstream's `_generate_chunked`, unchanged) while the
caller's thread decodes chunk k, joins it to the audio before it and hands it out. The worker starts chunk k+1
only once the caller has taken chunk k, so it is never more than one chunk ahead. On CUDA the worker runs on its
own CUDA stream, so the decode of chunk k overlaps the unmasking of chunk k+1.

What is upstream's: the text is split, and every chunk generated, by upstream's own long-text path, run on the task
`_preprocess_all` builds. The boundaries (`chunk_text_punctuation` at `audio_chunk_duration`), each chunk's target
length and reference (the voice prompt; in auto voice, chunk 0's tokens and text) and the order of the random draws
are therefore those of `model.generate(text, audio_chunk_threshold=0, ...)`; the threshold is what a stream leaves
out (it always chunks). `audio_chunk_duration` defaults to CHUNK_SECONDS here, not upstream's 15 s, which would
make a three-sentence text one chunk. Every lossless patch applies: they replace what the chunks call.

Parity with that `generate` call (CPU fp32, tests_parity/test_stream.py), per chunk and joined:
- every chunk's tokens are bit-exact with upstream's (the same `_generate_iterative` calls in the same order), and
  its audio is the same `audio_tokenizer.decode` call of them;
- the joins are upstream's `cross_fade_chunks`, run seam by seam: a seam's fades touch only the last fade of the
  audio before it and the first of the chunk after, so the stream holds that much back until the next chunk
  exists. The level (a voice prompt's rms) and the edge fades and padding are upstream's arithmetic in upstream's
  order. So with a voice prompt and `postprocess_output=False` the concatenated stream equals upstream's waveform
  bit for bit;
- two steps of upstream's post-processing read the whole waveform, which a stream never has before its end: in
  auto voice upstream scales to a peak of 0.5 over the whole, the stream by the first chunk's peak; with
  `postprocess_output=True` upstream removes silences from the whole, the stream runs upstream's `remove_silence`
  on each chunk's audio (each chunk's edge silences are trimmed too, so pauses at the joins are shorter).

Cancelling (`close()`, leaving the loop, or dropping the generator) stops the worker at its next unmasking step and
restores the model's instance dict and hooks: a stock model stays stock, a patched one patched. One stream per model
at a time. The stream draws from torch's global random generator exactly as `generate` does, on the worker
thread: seed before calling, and draw nothing from it while a stream runs if the result must be reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fastpath import fingerprints
from fastpath.instance import overridden
from fastpath.registry import STREAM_RELIES_ON, _check_model

CHUNK_SECONDS = 4.0  # default audio_chunk_duration: about one sentence a chunk (README, "Streaming")
PREPROCESS_ARGS = ("language", "ref_text", "ref_audio", "voice_clone_prompt", "instruct", "duration", "speed",
                   "normalize_text")
POLL_SECONDS = 0.05  # how often a waiting worker looks for a cancel


class StreamBusyError(RuntimeError):
    pass


class _Cancelled(Exception):
    pass


@dataclasses.dataclass
class _Worker:  # per model, kept across streams: CUDA graphs and compiled code keep per-thread state
    executor: ThreadPoolExecutor
    cuda_stream: object
    busy: threading.Lock


_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stream(model, text: str, *, generation_config=None, **kwargs):
    """Generate `text` chunk by chunk and yield each chunk's audio as soon as it is decoded.

    Args:
        model: a loaded `omnivoice.OmniVoice` (stock or patched).
        text: one text (a stream is one utterance).
        generation_config: an `OmniVoiceGenerationConfig` (used as it is, its audio_chunk_duration too), or its
            fields as keyword arguments (not both).
        **kwargs: `generate`'s other arguments (language, voice_clone_prompt, ref_audio, ref_text, instruct,
            duration, speed, normalize_text) and generation config fields; `audio_chunk_duration` sets the chunk
            size (default CHUNK_SECONDS); `audio_chunk_threshold` is refused (a stream always chunks).
    Returns:
        A generator of 1-D float32 arrays at `model.sampling_rate`, whose concatenation is the utterance.
    """
    import torch
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    _check_model(model)
    if not isinstance(text, str):
        raise TypeError(f"stream takes one text (a str), got {type(text).__name__}; for several texts, stream each "
                        f"or call model.generate")
    upstream_checked(os.environ.get(fingerprints.ENV_ALLOW) == "1")
    prep = {name: kwargs.pop(name) for name in PREPROCESS_ARGS if name in kwargs}
    if "audio_chunk_threshold" in kwargs:
        raise TypeError("stream always chunks: drop audio_chunk_threshold (the matching generate call passes "
                        "audio_chunk_threshold=0)")
    fields = {f.name for f in dataclasses.fields(OmniVoiceGenerationConfig)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise TypeError(f"unknown argument(s) {unknown}: neither generate arguments {list(PREPROCESS_ARGS)} nor "
                        f"OmniVoiceGenerationConfig fields {sorted(fields)}")
    if generation_config is not None and kwargs:
        raise TypeError(f"pass generation_config or its fields {sorted(kwargs)}, not both")
    if generation_config is None:
        generation_config = OmniVoiceGenerationConfig(**{"audio_chunk_duration": CHUNK_SECONDS, **kwargs})
    model.eval()
    with torch.inference_mode():  # as generate runs it
        task = model._preprocess_all(text=text, preprocess_prompt=generation_config.preprocess_prompt, **prep)
    return _chunks(model, task, generation_config)


@functools.lru_cache(maxsize=2)
def upstream_checked(allow: bool) -> tuple:
    """The fingerprint check of STREAM_RELIES_ON, once per process (15 ms: not on every request's way to its first
    audio); a refusal raises and is not cached."""
    return tuple(fingerprints.check(STREAM_RELIES_ON, "stream", allow=allow))


def _worker(model) -> _Worker:
    import torch

    worker = _workers.get(model)
    if worker is None:
        on_cuda = model.device.type == "cuda"
        worker = _Worker(ThreadPoolExecutor(1, thread_name_prefix="fastpath-stream"),
                         torch.cuda.Stream(model.device) if on_cuda else None, threading.Lock())
        _workers[model] = worker
    return worker


def _wait(action, cancel: threading.Event) -> None:
    """Retry `action(timeout)` (False: not yet) until it succeeds; raise _Cancelled once `cancel` is set."""
    while not cancel.is_set():
        if action(POLL_SECONDS):
            return
    raise _Cancelled


def _chunks(model, task, gen_config):
    import torch

    worker = _worker(model)
    if not worker.busy.acquire(blocking=False):
        raise StreamBusyError("another stream of this model is still open: exhaust it or close() it first")
    handoff: queue.Queue = queue.Queue()  # ("tokens", [C, T]) per chunk, then ("end", None) or ("error", exc)
    credit = threading.Semaphore(1)  # chunks the worker may start: one now, one more each time the caller takes one
    cancel = threading.Event()

    def take_credit(timeout: float) -> bool:
        return credit.acquire(timeout=timeout)

    def handing_over(iterate):
        def each_chunk(sub_task, cfg):  # upstream calls this once per chunk (batch 1: one text)
            _wait(take_credit, cancel)
            tokens = iterate(sub_task, cfg)
            if worker.cuda_stream is not None:
                worker.cuda_stream.synchronize()  # the tokens are final before another stream reads them
            handoff.put(("tokens", tokens[0]))
            return tokens

        return each_chunk

    def stop_if_cancelled(module, args):
        if cancel.is_set():
            raise _Cancelled

    def work() -> None:
        try:
            streams = torch.cuda.stream(worker.cuda_stream) if worker.cuda_stream is not None \
                else contextlib.nullcontext()
            with torch.inference_mode(), streams:
                model._generate_chunked(task, gen_config)
            handoff.put(("end", None))
        except _Cancelled:
            pass
        except BaseException as err:  # handed to the caller's thread, raised there
            handoff.put(("error", err))

    join = _Join(model, gen_config, task.ref_rms[0])
    hook = model.audio_heads.register_forward_pre_hook(stop_if_cancelled)  # runs once per unmasking step
    try:
        with overridden(model, "_generate_iterative", handing_over):
            if worker.cuda_stream is not None:  # what this thread queued (the prompt's encoding) comes first
                worker.cuda_stream.wait_stream(torch.cuda.current_stream(model.device))
            job = worker.executor.submit(work)
            try:
                while True:
                    kind, value = handoff.get()
                    if kind == "end":
                        break
                    if kind == "error":
                        raise value
                    credit.release()  # the caller holds chunk k: the worker may start chunk k+1
                    piece = join.add(_decode(model, value))
                    if piece is not None:
                        yield piece
            finally:
                cancel.set()
                job.result()  # the worker has left upstream's code before the instance dict is put back
        last = join.finish()
        if last is not None:
            yield last
    finally:
        hook.remove()
        worker.busy.release()


def _decode(model, tokens):
    """Upstream's decode of one chunk, as `_decode_and_post_process` makes it: [C, T] -> float32 [1, samples]."""
    import torch

    device = model.audio_tokenizer.device
    with torch.inference_mode():
        codes = tokens.to(device)
        if codes.is_cuda:
            codes.record_stream(torch.cuda.current_stream())  # made on the worker's stream, read on this one
        return model.audio_tokenizer.decode(codes.unsqueeze(0)).audio_values[0].cpu().numpy()


def edge_durations(gen_config) -> tuple:
    """(fade_duration, pad_duration) of the edges: the config's, or where it has none (omnivoice before 0.2.0)
    the defaults of `fade_and_pad_audio`, which `_post_process_audio` then calls without them."""
    import inspect

    from omnivoice.models.omnivoice import fade_and_pad_audio

    defaults = inspect.signature(fade_and_pad_audio).parameters
    return tuple(getattr(gen_config, name, defaults[name].default) for name in ("fade_duration", "pad_duration"))


class _Join:
    """Upstream's `_decode_and_post_process` of the chunk list, one chunk at a time.

    Stages: silence removal per chunk (postprocess_output) -> `cross_fade_chunks` seam by seam (holding back
    `held` samples, at least one fade) -> level -> edge fades and padding (the first piece waits until it covers
    the fade-in; the fade-out and padding go on the last piece).
    """

    def __init__(self, model, gen_config, ref_rms):
        self.rate, self.config, self.ref_rms = model.sampling_rate, gen_config, ref_rms
        self.fade_duration, self.pad_duration = edge_durations(gen_config)
        self.fade = int(self.fade_duration * self.rate)  # fade_and_pad_audio's fade_samples
        self.pad = int(self.pad_duration * self.rate)
        seam_fade = int(0.3 * self.rate) // 3  # cross_fade_chunks' fade_n at its default silence_duration
        self.held = max(seam_fade, self.fade)
        self.tail = None  # raw [1, <= held] samples not yet final: the next seam fades them out
        self.peak = None  # auto voice: the first chunk's peak sets the level
        self.waiting = []  # levelled [1, n] pieces before the first one goes out (it must cover the fade-in)
        self.started = False

    def add(self, audio):
        from omnivoice.models.omnivoice import cross_fade_chunks, remove_silence

        if self.config.postprocess_output:
            audio = remove_silence(audio, self.rate, mid_sil=500, lead_sil=100, trail_sil=100)
        if audio.shape[-1] == 0:
            return None
        if self.peak is None and self.ref_rms is None:
            self.peak = np.abs(audio).max()
        merged = audio if self.tail is None else cross_fade_chunks([self.tail, audio], self.rate)
        final, self.tail = merged[:, : -self.held], merged[:, -self.held:]  # all held while shorter than that
        return self._out(self._level(final))

    def finish(self):
        from omnivoice.models.omnivoice import fade_and_pad_audio

        if self.tail is None:
            return None
        last = self._level(self.tail)
        if not self.started:  # all of it fits in the held-back samples: upstream's function on the whole
            whole = np.concatenate(self.waiting + [last], axis=-1)
            return fade_and_pad_audio(whole, self.pad_duration, self.fade_duration, self.rate)[0]
        if self.fade > 0:
            last[..., -self.fade:] *= np.linspace(1, 0, self.fade, dtype=np.float32)[np.newaxis, :]
        return np.concatenate([last, np.zeros((1, self.pad), dtype=last.dtype)], axis=-1)[0]

    def _level(self, audio):
        """`_post_process_audio`'s volume step, same expression and order."""
        if self.ref_rms is not None and self.ref_rms < 0.1:
            return audio * self.ref_rms / 0.1
        if self.ref_rms is None and self.peak > 1e-6:
            return audio / self.peak * 0.5
        return audio

    def _out(self, audio):
        if self.started:
            return audio[0] if audio.shape[-1] else None
        self.waiting.append(audio)
        first = np.concatenate(self.waiting, axis=-1)
        if first.shape[-1] < self.fade:  # the fade-in must lie within the first piece
            return None
        self.waiting, self.started = [], True
        first = first.copy()
        if self.fade > 0:
            first[..., : self.fade] *= np.linspace(0, 1, self.fade, dtype=np.float32)[np.newaxis, :]
        return np.concatenate([np.zeros((1, self.pad), dtype=first.dtype), first], axis=-1)[0]
