"""Streaming speed: time to first audio (TTFA) and underruns of fastpath.stream (harness/speed/streaming.py).

Default run, clock-free: the playback model, and the work done before the first audio (LLM positions counted, the
worker held at the start of chunk 1 so the count is exact) against one whole-text generate call.
--slow, full-size, CPU: the same-run ratio (whole-text generate's wall time / the stream's TTFA, interleaved) at
or above the floor recorded for this machine (baselines/ratio_floors.json); TTFA and underrun samples against the
stored per-device baseline (baselines/<device key>.json, points "stream/<point>/ttfa" and ".../underrun").
`fastpath-suite stream --out out/stream --results results/` measures every point (docs/results.md).
"""

from __future__ import annotations

import statistics
import threading

import pytest

import fastpath
from fastpath.instance import overridden
from harness import REPO_ROOT
from harness.run.machine import device_key, hardware_key, machine_info
from harness.model.points import point
from harness.speed.baselines import BaselineError, PointSamples, add_points, load_baseline, read_run
from harness.speed.compare import gate_on_baseline, judge_points
from harness.speed.floors import gated_ratio
from harness.speed.measure import on_llm_forward
from harness.speed.streaming import interleaved_listens, listen_stream, playback

HANG = 600.0  # seconds: a hang guard for the wait below, not a bound (a busy machine may take minutes)
STEPS = 8  # as the README's CPU grid: every step has the same shapes, so fewer steps scale the time, not the ratio
RATIO_POINT, RATIO_ROUNDS = "clone6-three-32", 2
BASELINE_POINT, BASELINE_ROUNDS = "clone6-three-32", 6  # >= 6 a side, or Mann-Whitney can never reach p < 0.002
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
    release, calls, stuck = threading.Event(), [], []

    def hold_chunk_1(iterate):
        def run(task, cfg):
            calls.append(1)
            if len(calls) == 2 and not release.wait(HANG):  # chunk 1 waits until chunk 0 is out
                stuck.append(1)  # a stream that waits for chunk 1 before handing out chunk 0 gets here
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
    assert not stuck, f"{name}: the stream held chunk 0 back until chunk 1 was made"
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
    baseline median is 0 (the device kept up) regresses above baselines.NON_NEGATIVE's slack. Both are judged before
    one the file lacks is reported (harness.speed.compare.gate_on_baseline)."""
    info = machine_info("cpu")
    key = device_key(info)
    path = REPO_ROOT / "baselines" / f"{key}.json"
    model = slowdown(full_model)
    kwargs = dict(point(BASELINE_POINT).generate_kwargs(model), num_step=STEPS)
    variants = {"stream+lossless": ("stream", "lossless")}
    names = {metric: f"stream/{BASELINE_POINT}@{STEPS}/{metric}" for metric in ("ttfa", "underrun")}

    def measure() -> dict:
        rounds = interleaved_listens(model, kwargs, BASELINE_ROUNDS, variants)["stream+lossless"]["rounds"]
        return {names["ttfa"]: PointSamples(names["ttfa"], "ttfa", tuple(r.ttfa for r in rounds)),
                names["underrun"]: PointSamples(names["underrun"], "underrun", tuple(r.underrun for r in rounds))}

    samples = measure()
    if request.config.getoption("save_baseline"):
        points = {name: {"metric": s.metric, "samples": list(s.samples),
                         "extra": {"checkpoint": full_checkpoint.identity, "steps": STEPS}}
                  for name, s in samples.items()}
        add_points(path, device_key=key, machine=info, points=points, command=SAVE_COMMAND)
    gate_on_baseline(request.config, path, key, samples, SAVE_COMMAND, remeasure=measure)


def test_listen_stream_reads_every_piece(model):
    """The measurement itself: the first piece (TTFA) comes no later than the last, waits are never negative, and
    the pieces add up to the seconds of audio of three sentences."""
    kwargs = dict(point("auto-three-32").generate_kwargs(model), num_step=4)
    heard = listen_stream(model, kwargs)
    assert 0 < heard.ttfa <= heard.total
    assert len(heard.waits) >= 2 and all(w >= 0 for w in heard.waits)
    assert heard.audio > 5.0, f"{heard.audio:.1f} s of audio for three sentences"


def test_a_device_that_keeps_up_saves_zero_underruns_and_is_gated_by_the_slack(tmp_path):
    """Zero waits are measurements: saved, read back, compared by the slack (a base median of 0 has no ratio); the
    points keep their max_slowdown, also when re-saved."""
    path = tmp_path / "cpu-test.json"
    names = {"ttfa": "stream/p/ttfa", "underrun": "stream/p/underrun"}
    points = {names["ttfa"]: {"metric": "ttfa", "samples": [1.0, 1.1, 1.0, 1.2, 1.1, 1.0], "max_slowdown": 0.3},
              names["underrun"]: {"metric": "underrun", "samples": [0.0] * 6}}
    machine = {"device": "cpu"}
    add_points(path, device_key="cpu-test", machine=machine, points=points, command=SAVE_COMMAND)
    resaved = {names["ttfa"]: {"metric": "ttfa", "samples": [1.0, 1.1, 1.0, 1.2, 1.1, 1.05]}}
    add_points(path, device_key="cpu-test", machine=machine, points=resaved, command=SAVE_COMMAND)
    stored = read_run(load_baseline(path, "cpu-test", SAVE_COMMAND)).points
    assert stored[names["underrun"]].median == 0.0 and stored[names["ttfa"]].max_slowdown == 0.3

    def run(ttfa, underrun):
        return {names["ttfa"]: PointSamples(names["ttfa"], "ttfa", tuple(ttfa)),
                names["underrun"]: PointSamples(names["underrun"], "underrun", tuple(underrun))}

    same = run([1.3, 1.35, 1.3, 1.4, 1.3, 1.35], [0.0, 0.02, 0.0, 0.05, 0.0, 0.01])  # +25% < 30%
    assert judge_points(stored, same, path.name) == ([], [])
    waits = run([1.3, 1.35, 1.3, 1.4, 1.3, 1.35], [0.4, 0.5, 0.45, 0.6, 0.5, 0.55])
    (failure,), missing = judge_points(stored, waits, path.name)
    assert "underrun: now waits 0.50 s" in failure and not missing, failure
    with pytest.raises(BaselineError, match="negative"):
        add_points(path, device_key="cpu-test", machine=machine, command=SAVE_COMMAND,
                   points={names["underrun"]: {"metric": "underrun", "samples": [0.0, -0.1] * 3}})
