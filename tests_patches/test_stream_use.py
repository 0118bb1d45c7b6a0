"""fastpath.stream under real use: beside plain generate calls, cancelled from another thread, abandoned, given
bad input, with patches applied or reverted meanwhile. CPU, tiny checkpoint. (A script that ends with a stream
still open must exit promptly: tests_patches/test_package.py runs such a script, from the wheel.)

Every wait here has a deadline, so a stream that takes over the model fails the test instead of hanging it.
"""

from __future__ import annotations

import copy
import gc
import threading
import time

import pytest
import torch

import fastpath
from harness.parity.parity import describe_difference
from harness.model.points import load_spec, reference

TEXT = load_spec()["texts"]["three"]
OTHER = "A plain generate call, with words of its own."
DEADLINE = 600.0  # seconds: a hang guard for each wait, not a bound (a few seconds when all is well; minutes on a
# busy machine, which must not fail a test)
pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def prompt(model):
    audio, text = reference("ref_6s")
    return model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)


def kwargs(prompt, steps: int = 8) -> dict:  # three chunks of TEXT on the tiny checkpoint (tests_parity/test_stream.py)
    return dict(language="en", voice_clone_prompt=prompt, postprocess_output=False, audio_chunk_duration=2.0,
                num_step=steps)


def generate(model, prompt, seed: int, **overrides):
    torch.manual_seed(seed)
    return model.generate(text=OTHER, **{**kwargs(prompt), **overrides})[0]


GREEDY = dict(position_temperature=0.0)  # with class_temperature 0 (upstream's default): no random draw at all


def in_thread(call):
    """Run `call` on another thread; returns a function that waits (DEADLINE) and gives its result or raises."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as err:  # noqa: BLE001 - re-raised on the waiting thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result():
        thread.join(DEADLINE)
        assert not thread.is_alive(), f"still running after {DEADLINE:.0f} s: the call is stuck"
        if "error" in out:
            raise out["error"]
        return out["value"]

    return result


def eventually(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE:.0f} s: {what}"
        time.sleep(0.01)


def waiting(stream) -> int:
    """`Stream.waiting`, checked: the worker is never more than one chunk ahead of the reader, nor behind it."""
    count = stream.waiting
    assert count in (0, 1), f"waiting {count}: the chunks made and the chunks taken are counted wrong"
    return count


def untouched(model) -> dict:
    return {"dict": dict(model.__dict__), "hooks": dict(model.audio_heads._forward_pre_hooks)}


def test_a_generate_between_two_pieces_gives_what_it_gives_alone(model, prompt):
    alone = generate(model, prompt, seed=7)
    torch.manual_seed(0)
    solo = list(fastpath.stream(model, TEXT, **kwargs(prompt)))
    before = untouched(model)
    torch.manual_seed(0)
    stream = fastpath.stream(model, TEXT, **kwargs(prompt))
    try:
        pieces = [next(stream)]
        eventually(lambda: waiting(stream) == 1, "the worker made the next chunk")  # and now waits for the reader
        between = in_thread(lambda: generate(model, prompt, seed=7))()
        pieces += list(stream)
        assert waiting(stream) == 0, "every chunk made was taken"
    finally:
        stream.close()
    problem = describe_difference("a generate between two pieces of a stream", torch.from_numpy(alone),
                                  torch.from_numpy(between))
    assert problem is None, f"{problem}: it differs from the same generate alone"
    assert len(pieces) == len(solo), f"{len(pieces)} pieces, {len(solo)} from the stream alone"
    problems = [describe_difference(f"piece {i}", torch.from_numpy(a), torch.from_numpy(b))
                for i, (a, b) in enumerate(zip(solo[:2], pieces[:2]))]
    assert not any(problems), f"the pieces drawn before the generate differ from the stream alone: {problems}"
    assert sum(p.size for p in pieces) == sum(p.size for p in solo)  # the later ones draw after it: same length
    assert untouched(model) == before, "the stream left something on the model"


def test_a_generate_beside_a_running_stream_finishes_with_its_own_audio(model, prompt):
    """True concurrency: the generate's thread is held at its second step until the stream, busy on a chunk, has
    been closed. The stream draws from the global generator meanwhile, so the generate runs greedy (GREEDY: it draws
    nothing) and its audio must equal the same greedy generate alone, sample for sample."""
    alone = generate(model, prompt, seed=7, **GREEDY)
    steps = {"worker": 0, "other": 0}
    hold, closed = threading.Event(), threading.Event()

    def count(module, args):
        if threading.current_thread().name == "fastpath-stream":
            steps["worker"] += 1
        elif threading.current_thread().name == "other":
            steps["other"] += 1
            if steps["other"] == 2:
                hold.set()
                closed.wait(DEADLINE)

    handle = model.audio_heads.register_forward_pre_hook(count)
    try:
        stream = fastpath.stream(model, TEXT, **kwargs(prompt, steps=16))
        next(stream)  # the worker now makes chunk 1
        result: dict = {}
        other = threading.Thread(target=lambda: result.setdefault("audio", generate(model, prompt, seed=7, **GREEDY)),
                                 name="other", daemon=True)
        other.start()
        assert hold.wait(DEADLINE), "the other thread's generate never reached its second step"
        worker_steps = steps["worker"]
        stream.close()
        closed.set()
        other.join(DEADLINE)
        assert not other.is_alive(), "the generate beside the stream never finished"
    finally:
        handle.remove()
    assert "audio" in result, "the generate beside the stream raised (see the thread's traceback above)"
    problem = describe_difference("the generate beside the stream", torch.from_numpy(alone),
                                  torch.from_numpy(result["audio"]))
    assert problem is None, f"{problem}: not the audio it gives alone"
    assert worker_steps > 0, "the test did not overlap the two: the worker ran no step while the generate was held"


def test_cancel_from_another_thread_ends_the_readers_loop(model, prompt):
    before = untouched(model)
    stream = fastpath.stream(model, TEXT, **kwargs(prompt, steps=32))
    reader = in_thread(lambda: [p.size for p in stream])
    time.sleep(0.2)  # the reader is inside next(), waiting on the worker
    stream.cancel()
    read = reader()
    assert stream.cancelled and len(read) < 3, f"the stream was not cancelled: {len(read)} pieces"
    stream.close()
    assert untouched(model) == before, "a cancelled stream left its hook or something else on the model"
    with pytest.raises(StopIteration):
        next(stream)


def test_applies_reverts_and_copies_wait_for_the_stream(model, prompt):
    fastpath.apply(model, "sliced_heads")
    try:
        stream = fastpath.stream(model, TEXT, **kwargs(prompt))
        next(stream)
        for doing, call in (("apply patches", lambda: fastpath.apply(model, "trimmed_cfg")),
                            ("revert patches", lambda: fastpath.revert(model)),
                            ("copy the model", lambda: copy.deepcopy(model))):
            with pytest.raises(fastpath.StreamBusyError, match=f"^cannot {doing} while a stream .*close"):
                call()
        assert fastpath.applied(model) == ["sliced_heads"]
        with pytest.raises(fastpath.StreamBusyError,
                           match=r"^another stream of this model is still open: exhaust it or close\(\) it first$"):
            fastpath.stream(model, TEXT, **kwargs(prompt))
        stream.close()
        assert fastpath.apply(model, "trimmed_cfg") == ["sliced_heads", "trimmed_cfg"]
    finally:
        fastpath.revert(model)
    assert fastpath.applied(model) == [] and "_generate_iterative" not in model.__dict__


def test_a_dropped_stream_stops_its_worker(model, prompt):
    before = untouched(model)
    stream = fastpath.stream(model, TEXT, **kwargs(prompt))
    next(stream)
    del stream
    gc.collect()
    eventually(lambda: untouched(model) == before, "the dropped stream's worker stopped and left the model as it was")
    fastpath.stream(model, TEXT, **kwargs(prompt)).close()  # the model is free for the next one


def test_bad_input_is_refused_with_the_fix(model, prompt):
    for empty in ("", "   \n"):
        with pytest.raises(ValueError, match="empty text"):
            fastpath.stream(model, empty)
    unsplit = " ".join(["words without a single mark between them"] * 12)
    with pytest.raises(ValueError, match=r"cannot stream.*Add punctuation"):
        fastpath.stream(model, unsplit, **kwargs(prompt))
    with pytest.raises(ValueError, match="audio_chunk_duration"):
        fastpath.stream(model, TEXT, **{**kwargs(prompt), "audio_chunk_duration": 0})
    with fastpath.stream(model, TEXT, **kwargs(prompt)) as stream:  # the refusals left the model free
        assert next(stream).size > 0
        with stream._reading:  # another thread is inside next()
            with pytest.raises(RuntimeError) as busy:
                next(stream)
        assert str(busy.value) == ("another thread is reading this stream: read it from one thread (cancel() is the "
                                   "call for other threads)")
        assert next(stream).size > 0


def test_bad_calls_are_refused_before_anything_starts_and_say_why(model, prompt):
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    def refusal(error, text=TEXT, **call):
        with pytest.raises(error) as refused:
            fastpath.stream(model, text, **call)
        return str(refused.value)

    assert refusal(ValueError, "") == "stream got an empty text: pass the words to speak"
    assert refusal(TypeError, ["One.", "Two."]) == ("stream takes one text (a str), got list; for several texts, "
                                                    "stream each or call model.generate")
    assert refusal(TypeError, audio_chunk_threshold=0) == (
        "stream always chunks: drop audio_chunk_threshold (the matching generate call passes audio_chunk_threshold=0)")
    unknown = refusal(TypeError, language="en", num_steps=8)
    assert unknown.startswith("unknown argument(s) ['num_steps']: neither generate arguments ['language', ") and \
        " nor OmniVoiceGenerationConfig fields [" in unknown and "'num_step'" in unknown, unknown
    assert refusal(TypeError, generation_config=OmniVoiceGenerationConfig(), num_step=8, guidance_scale=2.0) == (
        "pass generation_config or its fields ['guidance_scale', 'num_step'], not both")
    assert refusal(ValueError, **{**kwargs(prompt), "audio_chunk_duration": -1.0}) == (
        "audio_chunk_duration must be > 0 seconds, got -1.0")


def test_a_models_worker_thread_ends_when_the_model_is_collected():
    """One worker per model, kept across its streams; the model's collection stops the thread (a server that loads
    and drops models does not pile up threads)."""
    from fastpath import streaming

    class Model:  # what _worker reads of a model
        device = torch.device("cpu")

    model = Model()
    worker = streaming._worker(model)
    assert streaming._worker(model) is worker and worker.cuda_stream is None
    assert worker.thread.is_alive() and worker.thread.daemon and worker.thread.name == "fastpath-stream"
    del model
    gc.collect()
    worker.thread.join(60.0)
    assert not worker.thread.is_alive(), "the worker thread of a collected model is still running"


def test_a_stream_whose_construction_failed_is_collected_quietly():
    """A Stream that never got its cancel event (its __init__ raised before setting it) is dropped without an
    error from __del__: no "Exception ignored" noise in a server's log."""
    from fastpath.streaming import Stream

    half_built = Stream.__new__(Stream)
    assert half_built.__del__() is None


def test_at_exit_every_open_streams_job_is_cancelled_then_waited_for_a_bounded_moment():
    """streaming._cancel_open_streams, the exit handler a stream's first worker registers: each open stream's job is
    cancelled, then each worker gets a moment to stop, never an unbounded wait (a stuck worker must not hold up exit).
    Called here with two stand-in jobs, as the interpreter would call it."""
    from fastpath import registry, streaming

    class Job:
        def __init__(self):
            self.cancel, self.waits, self.cancelled_before_wait = threading.Event(), [], []
            self.stopped = self  # the job's `stopped` event: its wait is recorded

        def wait(self, timeout=None):
            self.cancelled_before_wait.append(all(job.cancel.is_set() for job in jobs))
            self.waits.append(timeout)
            return False  # a worker that did not stop: the handler must still return

    class Model:  # the dictionary's key: any model object, held weakly
        pass

    models, jobs = [Model(), Model()], [Job(), Job()]
    for model, job in zip(models, jobs):
        registry._open_streams[model] = job
    try:
        streaming._cancel_open_streams()
    finally:
        for model in models:
            del registry._open_streams[model]
    for job in jobs:
        assert job.cancel.is_set()
        # every job cancelled before the first wait; one wait each, bounded by a couple of seconds
        assert job.cancelled_before_wait == [True] and len(job.waits) == 1
        assert job.waits[0] is not None and 0 < job.waits[0] <= 2.0, job.waits
