"""fastpath.stream against upstream's chunked generate, on CPU fp32, bit for bit.

The reference is stock `model.generate(text, audio_chunk_threshold=0, <same kwargs>)`, reseeded the same way: the
call whose chunks the stream hands out one by one. Which parity holds, and why (fastpath/streaming.py):
- per chunk, always: the tokens of every chunk equal upstream's (the stream runs upstream's `_generate_chunked`,
  so the same `_generate_iterative` calls draw from the random generator in the same order), and so does the
  decoder's audio of every chunk;
- joined, with a voice prompt and postprocess_output=False: the concatenated stream equals upstream's waveform
  (the seams are upstream's `cross_fade_chunks`, the level and edge fades upstream's arithmetic, all local);
- joined, in auto voice: upstream levels the whole to a peak of 0.5, the stream by the first chunk's peak (the
  whole does not exist when the first chunk goes out); compared with upstream's functions applied that way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fastpath
from fastpath import fingerprints
from fastpath.instance import overridden
from fastpath.streaming import _Join, edge_durations, upstream_checked
from harness.parity.parity import describe_difference, kept_decoded, kept_tokens, record_generation
from harness.model.points import load_spec, reference
from harness.run import strict

TEXT = load_spec()["texts"]["three"]
CHUNK_SECONDS = 2.0  # three chunks of the three-sentence text on the tiny checkpoint (asserted below)
HANG = 600.0  # seconds: a hang guard for the waits below, not a bound (a busy machine may take minutes)
STEPS = 8  # the chunking and the joins are what is tested here; each step is the loop the bit-exact tier checks at 32
STACKS = [pytest.param((), id="stock"), pytest.param(tuple(fastpath.LOSSLESS), id="lossless")]


@pytest.fixture(scope="module")
def prompt(model):
    audio, text = reference("ref_6s")
    return model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)


def voice_kwargs(voice: str, prompt) -> dict:
    kwargs = dict(language="en", postprocess_output=False, audio_chunk_duration=CHUNK_SECONDS, num_step=STEPS)
    return dict(kwargs, voice_clone_prompt=prompt) if voice == "clone" else kwargs


def streamed(model, seed: int, **kwargs):
    """(pieces, tokens of every chunk) of one stream, reseeded as record_generation reseeds."""
    with kept_tokens(model) as tokens:
        torch.manual_seed(seed)
        pieces = list(fastpath.stream(model, TEXT, **kwargs))
    return pieces, tokens


@torch.inference_mode()
def decode(model, tokens):
    return model.audio_tokenizer.decode(tokens.unsqueeze(0)).audio_values[0].cpu().numpy()


def upstream_levelled_by_first_chunk(model, tokens, gen_config):
    """Auto voice as the stream promises it, from upstream's functions: the chunks' decodes joined by
    cross_fade_chunks, levelled by the first chunk's peak, then fade_and_pad_audio."""
    from omnivoice.models.omnivoice import cross_fade_chunks, fade_and_pad_audio

    chunks = [decode(model, t) for t in tokens]
    audio = cross_fade_chunks(chunks, model.sampling_rate) / np.abs(chunks[0]).max() * 0.5
    fade, pad = edge_durations(gen_config)
    return fade_and_pad_audio(audio, pad, fade, model.sampling_rate)[0]


# stock and the whole stack in both voices; each lossless patch alone with the voice prompt under --slow (the stack
# row covers them together in the default run's time budget; the patches act the same per chunk in either voice)
EQUALITY_CASES = [pytest.param(voice, stack.values[0], id=f"{voice}-{stack.id}") for voice in ("clone", "auto")
                  for stack in STACKS] + [pytest.param("clone", (name,), id=f"clone-{name}", marks=pytest.mark.slow)
                                          for name in fastpath.LOSSLESS]


def stream_problems(model, prompt, voice: str, patches=(), mutation=None, kept: dict | None = None) -> list:
    """What differs between a stream and upstream's chunked generate of the same text and seed: every chunk's
    tokens, every chunk's decoded audio, the joined stream against the waveform (empty: equal bit for bit).
    `mutation(model)`: a context entered around the stream only (tests_harness/test_waveform_checks.py);
    `kept`: gets the joined stream under "joined"."""
    kwargs = voice_kwargs(voice, prompt)
    stock = record_generation(model, seed=0, text=TEXT, audio_chunk_threshold=0, **kwargs)
    assert len(stock.tokens) >= 3, f"upstream made {len(stock.tokens)} chunks: the test needs a text of 3 or more"
    with fastpath.patched(model, list(patches)), (mutation(model) if mutation else contextlib.nullcontext()), \
            kept_decoded(model) as decoded:
        pieces, tokens = streamed(model, seed=0, **kwargs)
        assert fastpath.applied(model) == list(patches), "the stream changed the applied patches"
    if len(tokens) != len(stock.tokens):
        return [f"chunks: stream {len(tokens)}, upstream {len(stock.tokens)}"]
    problems = [describe_difference(f"chunk {i} tokens", a, b) for i, (a, b) in enumerate(zip(stock.tokens, tokens))]
    problems += [describe_difference(f"chunk {i} decoded audio", torch.from_numpy(a), torch.from_numpy(b))
                 for i, (a, b) in enumerate(zip(stock.decoded, decoded))]
    assert len(pieces) >= len(tokens), f"{len(pieces)} pieces for {len(tokens)} chunks: not streamed chunk by chunk"
    joined = np.concatenate(pieces)
    if kept is not None:
        kept["joined"] = joined
    expected = stock.waveforms[0] if voice == "clone" else upstream_levelled_by_first_chunk(
        model, stock.tokens, generation_config(**{k: v for k, v in kwargs.items() if k != "language"}))
    problems.append(describe_difference("joined stream", torch.from_numpy(expected), torch.from_numpy(joined)))
    return [p for p in problems if p]


@pytest.mark.cpu
@pytest.mark.parametrize(("voice", "patches"), EQUALITY_CASES)
def test_stream_equals_upstreams_chunked_generate(model, prompt, voice, patches):
    problems = stream_problems(model, prompt, voice, patches)
    assert not problems, "\n".join(problems)


@pytest.mark.cpu
def test_streams_of_two_voices_of_one_length_are_their_own(model):
    """Two references of equal length and different content (ref_3s, ref_3s_b), streamed with the lossless stack:
    each stream equals upstream's chunked generate with its own voice, and the two streams differ."""
    joined = []
    for name in ("ref_3s", "ref_3s_b"):
        audio, text = reference(name)
        prompt = model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
        kept: dict = {}
        problems = stream_problems(model, prompt, "clone", tuple(fastpath.LOSSLESS), kept=kept)
        assert not problems, f"{name}: " + "\n".join(problems)
        joined.append(kept["joined"])
    assert joined[0].shape != joined[1].shape or not np.array_equal(*joined), "two voices streamed the same audio"


def synthetic_chunks(lengths, seed: int, loudest_first: bool = True) -> list:
    rng = np.random.default_rng(seed)
    chunks = [(rng.standard_normal((1, n)) * 0.1).astype(np.float32) for n in lengths]
    if loudest_first and chunks[0].size:
        chunks[0][0, 0] = 0.9  # the first chunk's peak is the whole's: upstream's level and the stream's agree
    return chunks


# (chunk lengths in samples, ref_rms, fade_duration, pad_duration): short chunks below the seam fade (2400 samples
# at 24 kHz) and below the edge fade, a single chunk, rms above and below upstream's 0.1, no fades, long fades
JOIN_CASES = [
    ([30000, 20000, 40000], 0.05, 0.1, 0.1),
    ([30000, 20000, 40000], 0.3, 0.1, 0.1),
    ([30000, 20000, 40000], None, 0.1, 0.1),
    ([1000, 30000, 500, 800, 20000], 0.05, 0.1, 0.1),
    ([500, 700, 900], 0.05, 0.1, 0.1),
    ([30000], 0.05, 0.1, 0.1),
    ([3000], None, 0.1, 0.1),
    ([30000, 20000], 0.05, 0.0, 0.0),
    ([30000, 3000, 20000], 0.05, 0.25, 0.05),
]


def generation_config(**fields):
    """An OmniVoiceGenerationConfig of these fields; a field this omnivoice lacks (the edge fade and padding before
    0.2.0) must equal what upstream then uses, or the case does not apply to this version."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    known = {f.name for f in dataclasses.fields(OmniVoiceGenerationConfig)}
    config = OmniVoiceGenerationConfig(**{k: v for k, v in fields.items() if k in known})
    fixed = dict(zip(("fade_duration", "pad_duration"), edge_durations(config)))
    unsupported = sorted(k for k, v in fields.items() if k not in known and fixed.get(k) != v)
    if unsupported:
        strict.not_applicable(f"the join with {unsupported} changed", f"this omnivoice has no setting {unsupported} "
                              f"(added in 0.2.0), which the case changes")
    return config


def post_process(owner, audio, ref_rms, config):
    """Upstream's OmniVoice._post_process_audio, which took `postprocess_output` before 0.2.0 and `gen_config` since."""
    import inspect

    from omnivoice.models.omnivoice import OmniVoice

    if "gen_config" in inspect.signature(OmniVoice._post_process_audio).parameters:
        return OmniVoice._post_process_audio(owner, audio, ref_rms=ref_rms, gen_config=config)
    return OmniVoice._post_process_audio(owner, audio, ref_rms=ref_rms, postprocess_output=config.postprocess_output)


@pytest.mark.cpu
@pytest.mark.parametrize(("lengths", "ref_rms", "fade", "pad"), JOIN_CASES)
def test_join_is_upstreams_decode_and_post_process(lengths, ref_rms, fade, pad):
    """The joining stage alone, on chunks of every awkward length, against upstream's own code: cross_fade_chunks
    and OmniVoice._post_process_audio called on the whole."""
    from omnivoice.models.omnivoice import cross_fade_chunks

    config = generation_config(postprocess_output=False, fade_duration=fade, pad_duration=pad)
    owner = SimpleNamespace(sampling_rate=24000)
    chunks = synthetic_chunks(lengths, seed=len(lengths))
    expected = post_process(owner, cross_fade_chunks([c.copy() for c in chunks], 24000), ref_rms, config)[0]
    join = _Join(owner, config, ref_rms)
    pieces = [p for c in chunks for p in [join.add(c.copy())] if p is not None] + [join.finish()]
    problem = describe_difference("joined", torch.from_numpy(expected), torch.from_numpy(np.concatenate(pieces)))
    assert problem is None, problem


@pytest.mark.cpu
def test_join_with_postprocess_trims_each_chunk():
    """postprocess_output=True: upstream's remove_silence runs on each chunk (the whole is never there), then
    the same join; a chunk's leading silence goes before the first audio is handed out."""
    from omnivoice.models.omnivoice import cross_fade_chunks, remove_silence

    rate, owner = 24000, SimpleNamespace(sampling_rate=24000)
    chunks = synthetic_chunks([24000, 24000], seed=3)
    chunks = [np.concatenate([np.zeros((1, rate), np.float32), c, np.zeros((1, rate), np.float32)], axis=-1)
              for c in chunks]  # one second of silence on each side
    on = generation_config(postprocess_output=True)
    trimmed = [remove_silence(c, rate, mid_sil=500, lead_sil=100, trail_sil=100) for c in chunks]
    expected = post_process(owner, cross_fade_chunks(trimmed, rate), 0.05, generation_config(postprocess_output=False))[0]
    join = _Join(owner, on, 0.05)
    pieces = [p for c in chunks for p in [join.add(c)] if p is not None] + [join.finish()]
    joined = np.concatenate(pieces)
    assert np.array_equal(joined, expected)
    assert joined.size < sum(c.shape[-1] for c in chunks) - rate, "the chunks' edge silences were not trimmed"


class Steps:
    """Counts unmasking steps (audio-head calls) per chunk; can hold one step of one chunk until released."""

    def __init__(self, model, hold_chunk: int | None = None):
        self.model, self.hold_chunk = model, hold_chunk
        self.per_chunk, self.held, self.release = [], threading.Event(), threading.Event()

    def iterate(self, iterate):
        def run(task, cfg):
            self.per_chunk.append(0)
            return iterate(task, cfg)

        return run

    def count(self, module, args):
        self.per_chunk[-1] += 1
        if len(self.per_chunk) - 1 == self.hold_chunk and self.per_chunk[-1] == 2:
            self.held.set()
            self.release.wait(HANG)


def eventually(condition, seconds: float = HANG) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def instance_state(model) -> dict:
    return {"dict": dict(model.__dict__), "heads_hooks": dict(model.audio_heads._forward_pre_hooks),
            "forward_hooks": dict(model.audio_heads._forward_hooks)}


@pytest.mark.cpu
@pytest.mark.parametrize("patches", STACKS)
def test_stream_runs_one_chunk_ahead_and_cancel_stops_mid_chunk(model, prompt, patches):
    kwargs = dict(voice_kwargs("clone", prompt), num_step=16)
    with fastpath.patched(model, list(patches)):
        before = instance_state(model)
        steps = Steps(model, hold_chunk=None)
        handle = model.audio_heads.register_forward_pre_hook(steps.count)
        try:
            with overridden(model, "_generate_iterative", steps.iterate):
                gen = fastpath.stream(model, TEXT, **kwargs)
                next(gen)  # the caller holds chunk 0: the worker makes chunk 1, then waits
                assert eventually(lambda: steps.per_chunk[1:] == [16]), f"chunk 1 never finished: {steps.per_chunk}"
                time.sleep(0.3)  # time enough to start chunk 2, were it allowed
                assert len(steps.per_chunk) == 2, (
                    f"while the caller held chunk 0 the worker ran steps {steps.per_chunk}: not one chunk ahead")
                steps.hold_chunk = 2
                next(gen)  # taking chunk 1 lets chunk 2 start; it is held at its second step
                assert steps.held.wait(HANG), "chunk 2 never started"
                # chunk 2 goes on once close() has asked for the cancel (an event, not a delay: on a busy machine
                # a timer could let chunk 2 finish before close() even ran)
                threading.Thread(target=lambda: gen._cancel.wait(HANG) and steps.release.set(), daemon=True).start()
                gen.close()  # cancels; returns once the worker has stopped
                ran = list(steps.per_chunk)
                time.sleep(0.3)
                assert steps.per_chunk == ran, f"steps ran after close returned: {ran} -> {steps.per_chunk}"
                assert ran[2] < 16, f"cancel did not stop chunk 2 mid-way: steps per chunk {ran}"
        finally:
            handle.remove()
        assert instance_state(model) == before, "the stream left something on the model instance"
        assert fastpath.applied(model) == list(patches)
        again, _ = streamed(model, seed=0, **voice_kwargs("clone", prompt))  # usable, and the same as before
        first, _ = streamed(model, seed=0, **voice_kwargs("clone", prompt))
    assert np.array_equal(np.concatenate(again), np.concatenate(first))


@pytest.mark.cpu
def test_worker_error_reaches_the_caller_and_the_model_is_restored(model, prompt):
    before = instance_state(model)

    def failing(iterate):
        calls = []

        def run(task, cfg):
            calls.append(1)
            if len(calls) == 2:
                raise ValueError("chunk 1 failed")
            return iterate(task, cfg)

        return run

    with overridden(model, "_generate_iterative", failing):
        gen = fastpath.stream(model, TEXT, **voice_kwargs("clone", prompt))
        next(gen)
        with pytest.raises(ValueError, match="chunk 1 failed"):
            list(gen)
    assert instance_state(model) == before


@pytest.mark.cpu
def test_bad_calls_are_refused_with_the_fix(model, prompt, monkeypatch):
    with pytest.raises(TypeError, match="one text"):
        fastpath.stream(model, ["a.", "b."])
    with pytest.raises(TypeError, match="audio_chunk_threshold=0"):
        fastpath.stream(model, TEXT, audio_chunk_threshold=0)
    with pytest.raises(TypeError, match="unknown argument"):
        fastpath.stream(model, TEXT, num_steps=8)
    with pytest.raises(fastpath.NotOmniVoiceError):
        fastpath.stream(object(), TEXT)
    first = fastpath.stream(model, TEXT, **voice_kwargs("clone", prompt))
    next(first)
    with pytest.raises(fastpath.StreamBusyError, match="close"):
        fastpath.stream(model, TEXT, **voice_kwargs("clone", prompt))
    first.close()
    again = fastpath.stream(model, TEXT, **voice_kwargs("clone", prompt))
    assert next(again).size > 0  # free again
    again.close()  # a dropped stream's worker ends on its own time, its hook still on the shared model meanwhile
    known = fingerprints.load_known()
    monkeypatch.setattr(fingerprints, "load_known",
                        lambda: {k: v for k, v in known.items() if k != "OmniVoice._generate_chunked"})
    upstream_checked.cache_clear()  # checked once per process: forget the passing check of the calls above
    try:
        with pytest.raises(fastpath.UpstreamMismatchError, match="_generate_chunked"):
            fastpath.stream(model, TEXT)
    finally:
        upstream_checked.cache_clear()


@pytest.mark.cpu
def test_a_worker_without_a_cuda_stream_never_calls_the_cuda_api(checkpoint, monkeypatch):
    """A model on a device without a CUDA stream of its own (the CPU here; a CPU model on a machine with a GPU too)
    streams without one call to torch.cuda: entering torch.cuda.stream(None) does nothing to the work, but its
    StreamContext reads the current CUDA device (torch.cuda.current_device), which starts CUDA on a machine that
    has a GPU. Seen by counting the calls of the worker's way to the CUDA API."""
    from fastpath import streaming
    from harness.model.checkpoint import load_model
    from tests_patches.fake_cuda import FakeCuda

    reached = []
    monkeypatch.setattr(streaming, "_cuda", lambda: reached.append("torch.cuda") or FakeCuda())
    pieces, tokens = streamed(load_model(checkpoint), 0, **voice_kwargs("auto", None))  # a fresh model's worker
    assert pieces and tokens and reached == [], f"a worker without a stream reached torch.cuda {len(reached)} times"


@pytest.mark.cpu
def test_a_worker_on_its_own_cuda_stream_hands_out_the_same_pieces(checkpoint, monkeypatch):
    """The worker's CUDA-stream path, run here through the recording fake of torch.cuda (tests_patches/fake_cuda.py):
    one stream made for the model's device, waiting on the caller's stream when a stream opens, the worker's work
    inside it, and each chunk's tokens synchronised before the reader takes them; the pieces the same as a CPU
    worker's. (The decode's record_stream of CUDA codes is the one part only a GPU runs:
    tests_parity/test_gpu_parity.py, the stream beside cuda_graphs.)"""
    from fastpath import streaming
    from harness.model.checkpoint import load_model
    from tests_patches.fake_cuda import FakeCuda

    kwargs = voice_kwargs("auto", None)
    plain, _ = streamed(load_model(checkpoint), 0, **kwargs)
    fake = FakeCuda()
    monkeypatch.setattr(streaming, "CUDA_STREAM_DEVICES", ("cpu",))
    monkeypatch.setattr(streaming, "_cuda", lambda: fake)
    model = load_model(checkpoint)  # a fresh model: its worker is made here, on the fake's stream
    on_stream, tokens = streamed(model, 0, **kwargs)
    assert len(tokens) >= 2 and len(on_stream) == len(plain), (len(tokens), len(on_stream), len(plain))
    assert all(np.array_equal(a, b) for a, b in zip(on_stream, plain)), "the fake stream changed the audio"
    names = fake.names()
    assert names.count("Stream") == 1 and [c.device for c in fake.calls if c.name == "Stream"] == [model.device]
    assert names.index("Stream") < names.index("Stream.wait_stream") < names.index("stream"), names
    [wait] = [c for c in fake.calls if c.name == "Stream.wait_stream"]  # on the caller's stream of the model's device
    assert wait.kwargs["stream"] is not None and wait.kwargs["stream"].device == model.device, wait
    assert names.count("Stream.synchronize") == len(tokens), names
