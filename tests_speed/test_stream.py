"""Streaming speed: time to first audio (TTFA) and underruns of fastpath.stream (harness/speed/streaming.py).

Default run, clock-free: the playback model, and the work done before the first audio (LLM positions counted, the
worker held at the start of chunk 1 so the count is exact) against one whole-text generate call.
--slow, full-size, CPU: the same-run ratio (whole-text generate's wall time / the stream's TTFA, interleaved) at
or above the floor recorded for this machine (baselines/ratio_floors.json); TTFA and underrun samples against the
stored per-device baseline (baselines/<device key>.json, points "stream/<point>/ttfa" and ".../underrun").
README, "Streaming", has the figures of every point on this machine and the command.
"""

from __future__ import annotations

import statistics
import threading

import pytest

import fastpath
from fastpath.instance import overridden
from harness import REPO_ROOT
from harness.machine import device_key, hardware_key, machine_info
from harness.points import point
from harness.speed.baselines import (
    BaselineError,
    PointSamples,
    add_points,
    load_baseline,
)
from harness.speed.compare import compare_point
from harness.speed.floors import gated_ratio
from harness.speed.measure import on_llm_forward
from harness.speed.streaming import interleaved_listens, listen_stream, playback

STEPS = 8  # as the README's CPU grid: every step has the same shapes, so fewer steps scale the time, not the ratio
RATIO_POINT, RATIO_ROUNDS = "clone6-three-32", 2
BASELINE_POINT, BASELINE_ROUNDS = "clone6-three-32", 6  # >= 6 a side, or Mann-Whitney can never reach p < 0.002
ZERO_UNDERRUN_SLACK = 0.1  # seconds: where the baseline never waited (a GPU keeps up), a median wait up to this passes
SAVE_COMMAND = ".venv/bin/python -m pytest tests_speed/test_stream.py --slow --save-baseline -k baseline"


@pytest.mark.parametrize(("arrivals", "durations", "waits"), [
    ([1.0, 2.0, 3.0], [3.0, 3.0, 3.0], [0.0, 0.0]),  # each piece there before the audio before it ends
    ([1.0, 2.0, 10.0], [3.0, 3.0, 3.0], [0.0, 3.0]),  # the third arrives 3 s after the second stops playing
    ([1.0, 6.0, 7.0], [2.0, 2.0, 1.0], [3.0, 0.0]),  # a late piece shifts the playback of the ones after it
    ([0.5], [4.0], []),
])
def test_playback_waits_for_late_pieces(arrivals, durations, waits):
    assert playback(arrivals, durations) == pytest.approx(waits, abs=1e-12)


@pytest.mark.cpu
@pytest.mark.parametrize(("name", "most"), [
    ("auto-six-32", 0.25),  # chunk 0 of six, alone (no reference): a small share of the whole text's positions
    ("clone6-six-32", 0.4),  # every chunk carries the 6 s reference prompt, so chunk 0 costs more of the whole
])
def test_first_audio_costs_the_first_chunks_work(model, name, most):
    """LLM positions run before the first piece is handed out / those of one whole-text generate call."""
    kwargs = dict(point(name).generate_kwargs(model), num_step=STEPS)
    positions = []
    hooks = on_llm_forward(model, lambda hidden: positions.append(hidden.shape[0] * hidden.shape[1]))
    release, calls = threading.Event(), []

    def hold_chunk_1(iterate):
        def run(task, cfg):
            calls.append(1)
            if len(calls) == 2:
                release.wait(timeout=10)  # a stream that waits for chunk 1 before handing out chunk 0 runs on
            return iterate(task, cfg)

        return run

    try:
        model.generate(**kwargs)
        whole = sum(positions)
        positions.clear()
        text = kwargs.pop("text")
        with overridden(model, "_generate_iterative", hold_chunk_1):
            stream = fastpath.stream(model, text, **kwargs)
            next(stream)
            first = sum(positions)
            release.set()
            stream.close()
    finally:
        for h in hooks:
            h.remove()
    share = first / whole
    print(f"{name}: {first} of {whole} LLM positions before the first audio ({share:.3f})")
    assert 0 < share <= most, f"{name}: the first audio needed {share:.3f} of a whole generate's work (most {most})"


@pytest.mark.cpu
@pytest.mark.slow
def test_stream_ttfa_beats_a_whole_generate(full_model, full_checkpoint, slowdown):
    """Whole-text generate's wall time (stock, its TTFA) / the stream's TTFA (lossless stack), interleaved."""
    key, size = hardware_key(machine_info("cpu")), full_checkpoint.kind
    name = f"{RATIO_POINT} stream ttfa vs generate"
    model = slowdown(full_model)
    kwargs = dict(point(RATIO_POINT).generate_kwargs(model), num_step=STEPS)
    variants = {"generate": ("whole", ()), "stream+lossless": ("stream", "lossless")}

    def attempt(n: int) -> tuple:
        heard = interleaved_listens(model, kwargs, RATIO_ROUNDS, variants)
        whole = statistics.median(r.ttfa for r in heard["generate"]["rounds"])
        ttfa = statistics.median(r.ttfa for r in heard["stream+lossless"]["rounds"])
        return whole / ttfa, f"{RATIO_POINT} at {STEPS} steps: generate {whole:.2f} s, stream TTFA {ttfa:.2f} s"

    ratio, floor = gated_ratio(key, size, name, attempt, f"{RATIO_ROUNDS} interleaved rounds, medians")
    assert ratio >= floor, f"{name}: {ratio:.3f}x (floor {floor}) in two measurements"


@pytest.mark.cpu
@pytest.mark.slow
def test_stream_against_the_stored_baseline(full_model, full_checkpoint, slowdown, request):
    """TTFA and total underrun of the stream (lossless stack) vs baselines/<device key>.json: a point regresses
    when its median is more than 10% worse AND Mann-Whitney p < 0.002 (harness.speed.compare); an underrun whose
    baseline median is 0 (the device kept up) may not exceed ZERO_UNDERRUN_SLACK."""
    info = machine_info("cpu")
    key = device_key(info)
    path = REPO_ROOT / "baselines" / f"{key}.json"
    model = slowdown(full_model)
    kwargs = dict(point(BASELINE_POINT).generate_kwargs(model), num_step=STEPS)
    variants = {"stream+lossless": ("stream", "lossless")}

    def measure() -> dict:
        rounds = interleaved_listens(model, kwargs, BASELINE_ROUNDS, variants)["stream+lossless"]["rounds"]
        return {"ttfa": [r.ttfa for r in rounds], "underrun": [r.underrun for r in rounds]}

    names = {metric: f"stream/{BASELINE_POINT}@{STEPS}/{metric}" for metric in ("ttfa", "underrun")}
    samples = measure()
    if request.config.getoption("save_baseline"):
        points = {name: {"metric": metric, "samples": samples[metric],
                         "extra": {"checkpoint": full_checkpoint.identity, "steps": STEPS}}
                  for metric, name in names.items()}
        add_points(path, device_key=key, machine=info, points=points, command=SAVE_COMMAND)
    try:
        baseline = load_baseline(path, key, SAVE_COMMAND)
    except BaselineError as err:
        if not path.exists():
            pytest.skip(str(err))  # says the exact command that creates it
        raise
    bases = {}
    for metric, name in names.items():
        stored = baseline["points"].get(name)
        if stored is None:
            pytest.skip(f"{path} has no point {name}; add it with: {SAVE_COMMAND}")
        bases[metric] = PointSamples(name, metric, tuple(stored["samples"]))

    def failures_of(samples: dict) -> list:
        out = []
        for metric, base in bases.items():
            new = PointSamples(base.name, metric, tuple(samples[metric]))
            if base.median == 0.0:
                print(f"{base.name}: base median 0, new {new.median:.3f} s (slack {ZERO_UNDERRUN_SLACK})")
                if new.median > ZERO_UNDERRUN_SLACK:
                    out.append(f"{base.name}: the listener now waits {new.median:.2f} s (median) where it never did")
                continue
            verdict = compare_point(base, new)
            print(f"{base.name}: base {verdict.base_median:.3f} new {verdict.new_median:.3f} change "
                  f"{verdict.change:+.1%} p {verdict.p_value:.2g} -> {verdict.verdict}")
            if verdict.verdict == "regressed":
                out.append(f"{base.name}: {verdict.change:+.1%} worse (p={verdict.p_value:.2g}) vs {path.name}")
        return out

    failures = failures_of(samples)
    if failures:  # measured once more: the fresh samples, on their own, must regress too
        failures = failures_of(measure())
    assert not failures, "streaming got slower:\n  " + "\n  ".join(failures)


def test_listen_stream_reads_every_piece(model):
    """The measurement itself: the first piece (TTFA) comes no later than the last, waits are never negative, and
    the pieces add up to the seconds of audio of three sentences."""
    kwargs = dict(point("auto-three-32").generate_kwargs(model), num_step=4)
    heard = listen_stream(model, kwargs)
    assert 0 < heard.ttfa <= heard.total
    assert len(heard.waits) >= 2 and all(w >= 0 for w in heard.waits)
    assert heard.audio > 5.0, f"{heard.audio:.1f} s of audio for three sentences"
