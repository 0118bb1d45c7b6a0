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

What a stream owns: only itself. It never changes what the model does for other callers: the worker runs upstream's
`_generate_chunked` with a view of the model whose `_generate_iterative` is the stream's (wait for credit, run the
model's own `_generate_iterative`, hand the tokens over); the model's instance dict is not touched. While a stream
is open, `model.generate` from this thread or any other runs as it would without it. The only thing the stream
adds to the model is a forward pre-hook on `audio_heads` that acts on the worker's thread alone (it stops the
worker at its next unmasking step once the stream is cancelled), removed when the worker leaves.

Reproducibility: the stream draws from torch's global random generator on the worker thread, as `generate` does
on its caller's. Seed before `stream(...)`: the stream alone reproduces. A `generate` run between two pieces
while the worker waits (it is one chunk ahead and waits for the caller to take it: `Stream.waiting` > 0) gives
exactly what it gives alone, and the stream's later chunks then draw after it (they differ from a stream run
alone, as a second `generate` would). A `generate` that runs while the worker generates interleaves its draws
with the stream's: both finish with their own audio, neither is reproducible.

One stream per model at a time (`StreamBusyError`); while one is open, `fastpath.apply` / `revert` /
`copy.deepcopy` of a patched model are refused with the same error. Ending a stream: exhaust it; `close()`
(or leaving a `with` block) cancels and returns once the worker has stopped; `cancel()` can be called from any
thread (a request handler when its client goes away) and returns at once, the reading thread's loop then ends
(`Stream.cancelled`). A stream that is dropped, or still open when the interpreter exits, is cancelled: its
worker is a daemon thread and never holds up the exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import queue
import threading
import weakref

import numpy as np

from fastpath import fingerprints
from fastpath.registry import STREAM_RELIES_ON, StreamBusyError, _check_model, _open_streams

CHUNK_SECONDS = 4.0  # default audio_chunk_duration: about one sentence a chunk (docs/serving.md)
PREPROCESS_ARGS = ("language", "ref_text", "ref_audio", "voice_clone_prompt", "instruct", "duration", "speed",
                   "normalize_text")
POLL_SECONDS = 0.05  # how often a waiting worker looks for a cancel


class _Cancelled(Exception):
    pass


@dataclasses.dataclass
class _Worker:  # per model, kept across streams: CUDA graphs and compiled code keep per-thread state
    jobs: queue.SimpleQueue  # callables; None stops the thread (the model was freed)
    thread: threading.Thread
    cuda_stream: object
    busy: threading.Lock


_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
CUDA_STREAM_DEVICES = ("cuda",)  # device types whose worker runs on a CUDA stream of its own (a test widens it)


def _cuda():
    """The CUDA API the worker's stream goes through: torch.cuda (a CPU test's recording fake in its place)."""
    import torch

    return torch.cuda
UNSPLIT_LIMIT = 2.0  # a text upstream cannot split whose audio is longer than this many chunks is refused


def stream(model, text: str, *, generation_config=None, **kwargs) -> "Stream":
    """Generate `text` chunk by chunk and yield each chunk's audio as soon as it is decoded.

    Args:
        model: a loaded `omnivoice.OmniVoice` (stock or patched).
        text: one text (a stream is one utterance), with sentence punctuation where it may be split.
        generation_config: an `OmniVoiceGenerationConfig` (used as it is, its audio_chunk_duration too), or its
            fields as keyword arguments (not both).
        **kwargs: `generate`'s other arguments (language, voice_clone_prompt, ref_audio, ref_text, instruct,
            duration, speed, normalize_text) and generation config fields; `audio_chunk_duration` sets the chunk
            size (default CHUNK_SECONDS); `audio_chunk_threshold` is refused (a stream always chunks).
    Returns:
        A `Stream`, already generating its first chunk: iterate it for 1-D float32 arrays at `model.sampling_rate`,
        whose concatenation is the utterance.
    """
    import torch
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    _check_model(model)
    if not isinstance(text, str):
        raise TypeError(f"stream takes one text (a str), got {type(text).__name__}; for several texts, stream each "
                        f"or call model.generate")
    if not text.strip():
        raise ValueError("stream got an empty text: pass the words to speak")
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
    if not generation_config.audio_chunk_duration > 0:
        raise ValueError(f"audio_chunk_duration must be > 0 seconds, got {generation_config.audio_chunk_duration!r}")
    model.eval()
    with torch.inference_mode():  # as generate runs it
        task = model._preprocess_all(text=text, preprocess_prompt=generation_config.preprocess_prompt, **prep)
    _refuse_unsplittable(model, task, generation_config)
    return Stream(model, task, generation_config)


def _refuse_unsplittable(model, task, gen_config) -> None:
    """Upstream splits a text at its punctuation only: a long text without any is one chunk, and a stream of it
    gives nothing until the whole is made. The split and the length are `_generate_chunked`'s own."""
    from omnivoice.utils.text import chunk_text_punctuation

    rate, frames, text = model.audio_tokenizer.config.frame_rate, task.target_lens[0], task.texts[0]
    seconds = frames / rate
    if seconds <= UNSPLIT_LIMIT * gen_config.audio_chunk_duration:
        return
    chunk_len = int(gen_config.audio_chunk_duration * rate / (frames / len(text)))
    if len(chunk_text_punctuation(text=text, chunk_len=chunk_len, min_chunk_len=3)) == 1:
        raise ValueError(
            f"this text cannot stream: it has no sentence punctuation upstream can split it at, so it is one chunk "
            f"of about {seconds:.0f} s (audio_chunk_duration={gen_config.audio_chunk_duration} s) and no audio "
            f"would come before the whole is made. Add punctuation (. , ; : ! ?) between its sentences or clauses, "
            f"or call model.generate")


@functools.lru_cache(maxsize=2)
def upstream_checked(allow: bool) -> tuple:
    """The fingerprint check of STREAM_RELIES_ON, once per process (15 ms: not on every request's way to its first
    audio); a refusal raises and is not cached."""
    return tuple(fingerprints.check(STREAM_RELIES_ON, "stream", allow=allow))


def _serve(jobs: queue.SimpleQueue) -> None:  # the worker thread; holds no model between jobs
    while True:
        job = jobs.get()
        if job is None:
            return
        job()
        del job


def _worker(model) -> _Worker:
    worker = _workers.get(model)
    if worker is None:
        atexit.unregister(_cancel_open_streams)  # once in the process, from the first worker on
        atexit.register(_cancel_open_streams)
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(jobs,), name="fastpath-stream", daemon=True)
        thread.start()
        on_stream = model.device.type in CUDA_STREAM_DEVICES
        worker = _Worker(jobs, thread, _cuda().Stream(model.device) if on_stream else None, threading.Lock())
        _workers[model] = worker
        weakref.finalize(model, jobs.put, None)
    return worker


def _wait(action, cancel: threading.Event) -> None:
    """Retry `action(timeout)` (False: not yet) until it succeeds; raise _Cancelled once `cancel` is set."""
    while not cancel.is_set():
        if action(POLL_SECONDS):
            return
    raise _Cancelled


class _ChunkingView:
    """What upstream's `_generate_chunked` sees as `self` on the worker: the model (every attribute read through),
    except `_generate_iterative`, the stream's per-chunk function. The model itself is not changed."""

    def __init__(self, model, each_chunk):
        self._model, self._generate_iterative = model, each_chunk

    def __getattr__(self, name):
        return getattr(self._model, name)


class Stream:
    """One open stream of one utterance (made by `fastpath.stream`): iterate it for the audio pieces.

    Thread-safe: `cancel()` (any thread, returns at once), `close()` (cancel, then wait for the worker to stop;
    not from inside the worker), `waiting` and `cancelled`. The pieces are read by one thread at a time.
    """

    def __init__(self, model, task, gen_config):
        self.model = model
        self.cancelled = False
        self._worker = worker = _worker(model)
        if not worker.busy.acquire(blocking=False):
            raise StreamBusyError("another stream of this model is still open: exhaust it or close() it first")
        self._handoff: queue.Queue = queue.Queue()  # ("tokens", [C, T]) per chunk, then ("end"|"error"|"cancel", x)
        self._cancel = threading.Event()
        self._stopped = threading.Event()  # the worker has left upstream's code and cleaned up
        self._reading = threading.Lock()
        self._ended = False
        self._taken = 0
        self._join = _Join(model, gen_config, task.ref_rms[0])
        try:
            self._job = _Job(model, task, gen_config, worker, self._handoff, self._cancel, self._stopped)
            if worker.cuda_stream is not None:  # what this thread queued (the prompt's encoding) comes first
                worker.cuda_stream.wait_stream(_cuda().current_stream(model.device))
        except BaseException:
            worker.busy.release()
            raise
        _open_streams[model] = self._job  # the job, not this object: a dropped stream is collected (and cancelled)
        worker.jobs.put(self._job)

    @property
    def waiting(self) -> int:
        """Chunks the worker has made that the reader has not taken yet (0 or 1)."""
        return self._job.made - self._taken

    def __iter__(self):
        return self

    def __next__(self):
        if not self._reading.acquire(blocking=False):
            raise RuntimeError("another thread is reading this stream: read it from one thread (cancel() is the "
                               "call for other threads)")
        try:
            while not self._ended:
                if self._cancel.is_set():
                    self._end()
                    self.cancelled = True
                    break
                kind, value = self._handoff.get()
                if kind == "tokens":
                    self._taken += 1
                    self._job.credit.release()  # the reader holds chunk k: the worker may start chunk k+1
                    piece = self._join.add(_decode(self.model, value))
                    if piece is not None:
                        return piece
                    continue
                self._end()
                if kind == "error":
                    raise value
                if kind == "end":
                    last = self._join.finish()
                    if last is not None:
                        return last
                else:
                    self.cancelled = True
            raise StopIteration
        finally:
            self._reading.release()

    def cancel(self) -> None:
        """Stop the stream at the worker's next unmasking step; the reader's loop ends. From any thread."""
        if not self._cancel.is_set():
            self._cancel.set()
            self._handoff.put(("cancel", None))

    def close(self) -> None:
        """Cancel (if still running) and wait until the worker has stopped and the model is as before."""
        if not self._stopped.is_set():
            self.cancel()
        self._end()

    def _end(self) -> None:
        self._ended = True
        if threading.current_thread() is not self._worker.thread:
            self._stopped.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        cancel = getattr(self, "_cancel", None)
        if cancel is not None:
            cancel.set()  # no wait: this may run on any thread, the worker cleans up after itself


class _Job:
    """The worker's part of one stream. It holds no reference to the Stream, so a dropped one is collected (and
    cancels it)."""

    def __init__(self, model, task, gen_config, worker: _Worker, handoff: queue.Queue, cancel: threading.Event,
                 stopped: threading.Event):
        self.model, self.task, self.config, self.worker = model, task, gen_config, worker
        self.handoff, self.cancel, self.stopped = handoff, cancel, stopped
        self.credit = threading.Semaphore(1)  # chunks it may start: one now, one more each time the reader takes one
        self.made = 0
        self.hook = model.audio_heads.register_forward_pre_hook(self.stop_if_cancelled)

    def stop_if_cancelled(self, module, args):  # every unmasking step of every caller; acts on the worker only
        if self.cancel.is_set() and threading.current_thread() is self.worker.thread:
            raise _Cancelled

    def each_chunk(self, sub_task, cfg):  # upstream calls this once per chunk (batch 1: one text)
        _wait(lambda timeout: self.credit.acquire(timeout=timeout), self.cancel)
        tokens = self.model._generate_iterative(sub_task, cfg)
        if self.worker.cuda_stream is not None:
            self.worker.cuda_stream.synchronize()  # the tokens are final before another stream reads them
        self.made += 1
        self.handoff.put(("tokens", tokens[0]))
        return tokens

    def __call__(self) -> None:
        import torch

        try:
            streams = _cuda().stream(self.worker.cuda_stream) if self.worker.cuda_stream is not None \
                else contextlib.nullcontext()
            with torch.inference_mode(), streams:
                type(self.model)._generate_chunked(_ChunkingView(self.model, self.each_chunk), self.task, self.config)
            self.handoff.put(("end", None))
        except _Cancelled:
            self.handoff.put(("cancel", None))
        except BaseException as err:  # handed to the reader's thread, raised there
            self.handoff.put(("error", err))
        finally:
            self.hook.remove()
            if _open_streams.get(self.model) is self:
                del _open_streams[self.model]
            self.worker.busy.release()
            self.stopped.set()
            self.model = self.task = None  # the worker thread keeps this job until its next one


def _cancel_open_streams() -> None:
    """At interpreter exit: cancel every open stream's job and give its worker a moment to leave upstream's code."""
    jobs = list(_open_streams.values())
    for job in jobs:
        job.cancel.set()
    for job in jobs:
        job.stopped.wait(timeout=2.0)


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
