"""An evaluation set generated and judged over several workers (harness.quality.shards, harness.run.workers): the items
are split deterministically, each item's output is the serial run's, the merged figures give the serial verdict,
and a worker that dies or an item that fails is named, never dropped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from harness.run import workers
from harness.gate.gate import metric_figures
from harness.quality import cache, clone_run, espeak_set, evaluate, sets, shards

pytestmark = pytest.mark.quality


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    folder = espeak_set.build(tmp_path_factory.mktemp("seedtts-espeak"), languages=("en",))
    return folder / "en" / "meta.lst"


def test_the_split_gives_every_item_to_exactly_one_worker_the_same_way_each_time():
    items = [f"u{i}" for i in range(11)]
    for n in (1, 2, 3, 11, 12):
        parts = shards.split(items, n)
        assert len(parts) == n and sorted(i for p in parts for i in p) == sorted(items)
        assert parts == shards.split(list(items), n)
    assert shards.split(items, 3)[1] == ("u1", "u4", "u7", "u10")


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "1/0"])
def test_a_shard_that_is_not_k_of_n_is_refused(text):
    with pytest.raises(Exception, match="K/N|K must be"):
        shards.parse_shard(text)


def wavs(folder: Path) -> dict:
    """{name: (samples as bytes, rate)}: the samples, not the file's bytes (libsndfile's PEAK chunk of a float wav
    carries the time it was written)."""
    return {p.name: (sf.read(p, dtype="float32")[0].tobytes(), sf.info(p).samplerate) for p in sorted(folder.glob("*.wav"))}


def test_each_workers_items_are_the_serial_runs_samples(espeak, english, tmp_path, monkeypatch):
    """clone_run --shard K/N writes exactly worker K's items, each the samples a serial run writes (espeak's stand-in
    with its noise: the damage of an item is its place in the whole set, not in the worker's share)."""
    import omnivoice

    monkeypatch.setattr(omnivoice, "STANDIN_DAMAGE", "noise", raising=False)
    clone_run.run(str(english), str(tmp_path / "serial"), synth="espeak", log=lambda m: None)
    so_far = set()
    for k in range(3):
        clone_run.run(str(english), str(tmp_path / "sharded"), synth="espeak", log=lambda m: None, shard=(k, 3))
        so_far |= {f"{i.id}.wav" for i in shards.split(sets.read_set(english).items, 3)[k]}
        manifest = json.loads((tmp_path / "sharded" / f"manifest-{k}-of-3.json").read_text())
        assert manifest["shard"] == [k, 3] and len(manifest["items"]) == 4
        assert set(wavs(tmp_path / "sharded")) == so_far  # worker k wrote its own items and no other
    assert wavs(tmp_path / "sharded") == wavs(tmp_path / "serial")
    assert len(wavs(tmp_path / "serial")) == 12


def write_outputs(eval_set, folder: Path, damage: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for clip in espeak_set.outputs(eval_set, damage):
        sf.write(folder / f"{clip.id}.wav", clip.wav, clip.sr, subtype="FLOAT")
    return folder


def figures_of(comparison) -> list:
    return [metric_figures(v) for v in comparison.overall.verdicts]


def plant_a_wrong_transcript(cache: Path) -> str:
    """One cached transcript of the cache at `cache` rewritten to words no clip says; its file name."""
    path = sorted((cache / "transcripts").glob("*.json"))[0]
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record | {"text": "planted words that no clip says"}))
    return path.name


@pytest.mark.slow
@pytest.mark.control  # each side computes every figure: 1.5 to 3.5 minutes per row on the 2-core machine
@pytest.mark.parametrize("damage", ["none", "noise"])
def test_a_set_judged_over_two_workers_gets_the_serial_verdict(espeak, judge, voice_judge, mos_judge, english,
                                                               tmp_path, damage, request, monkeypatch):
    """Each side judges with its own empty cache (FASTPATH_CACHE), so the equality is shown by computing: the
    workers compute every transcript, embedding and MOS the serial run did, into their own cache, and a wrong
    transcript planted in the serial side's cache after its run is not read by them."""
    eval_set = sets.read_set(english)
    ref = write_outputs(eval_set, tmp_path / "against", "none")
    cand = write_outputs(eval_set, tmp_path / "candidate", damage)
    caches = {side: tmp_path / f"cache-{side}" for side in ("serial", "sharded")}
    monkeypatch.setenv(cache.CACHE_ENV, str(caches["serial"]))
    serial = evaluate.compare_set_folders(judge, eval_set, ref, cand, label="candidate", voice_judge=voice_judge,
                                          mos_judge=mos_judge)
    computed = cache.judge_entries(caches["serial"])
    assert all(computed.values()), {kind: len(e) for kind, e in computed.items()}  # the serial side computed
    planted = plant_a_wrong_transcript(caches["serial"])
    serial_cache = cache.judge_entries(caches["serial"])
    names = {key: request.config.getoption(option) for key, option in (("wer", "judge"), ("sim", "sim_judge"),
                                                                        ("mos", "mos_judge"))}
    monkeypatch.setenv(cache.CACHE_ENV, str(caches["sharded"]))  # the workers inherit it
    sharded = shards.judge_set(english, ref, cand, 2, tmp_path / "judged", judges=names, label="candidate",
                               log=lambda m: None)
    assert figures_of(sharded) == figures_of(serial)  # every metric's means, bounds, verdict: equal, not close
    assert sharded.passed == serial.passed == (damage == "none")
    for name, (r, c) in serial.scores.items():
        assert np.array_equal(sharded.scores[name][0], r) and np.array_equal(sharded.scores[name][1], c), name
    for side in ("ref", "cand"):  # each clip's word errors, as the serial run counted them
        a, b = getattr(sharded, side), getattr(serial, side)
        assert a.ids == b.ids and np.array_equal(a.errors, b.errors) and np.array_equal(a.words, b.words), side
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "judged").glob("judged-*.json"))]
    assert sorted(i for r in records for i in r["items"]) == sorted(i.id for i in eval_set.items)
    workers_wrote = cache.judge_entries(caches["sharded"])
    for kind in cache.JUDGE_KINDS:  # every entry the serial run computed, the workers computed too, in their cache
        assert sorted(workers_wrote[kind]) == sorted(computed[kind]), kind
    assert workers_wrote["transcripts"][planted] == computed["transcripts"][planted]  # computed, not the planted one
    assert cache.judge_entries(caches["serial"]) == serial_cache  # and the workers wrote nothing into the serial's


def done(k: int, n: int, code, tmp_path) -> workers.Done:
    return workers.Done(workers.Job(f"judging shard {k} of {n}", ("python",), tmp_path / f"judge-{k}.log"), code,
                        "" if code is not None else "ray: NodeDiedError")


def test_a_worker_that_died_and_an_item_that_failed_are_named_with_their_items(english, tmp_path):
    eval_set = sets.read_set(english)
    first, second = shards.split(eval_set.items, 2)
    figures = {"hyps": ["a", "a"], "SIM": [0.9, 0.9]}
    records = [
        {"items": {i.id: (dict(figures) if n else {"error": "BadAudio: clip u (candidate) is silent"})
                   for n, i in enumerate(first)}},
        {"items": {i.id: dict(figures) for i in second[:2]}},  # died after its second item
    ]
    with pytest.raises(shards.ShardFailure) as err:
        shards.merge(eval_set, records, [done(0, 2, 0, tmp_path), done(1, 2, -9, tmp_path)])
    text = str(err.value)
    assert f"item {first[0].id}: BadAudio: clip u (candidate) is silent (worker 0" in text
    lost = [i.id for i in second[2:]]
    assert f"worker 1 of 2: judging shard 1 of 2 exited -9; log {tmp_path / 'judge-1.log'}" in text
    assert f"gave no figures for {len(lost)} item(s): {', '.join(lost)}" in text
    assert len(err.value.problems) == 2
    with pytest.raises(shards.ShardFailure, match="did not finish \\(ray: NodeDiedError\\)"):
        shards.merge(eval_set, [records[0] | {"items": {i.id: figures for i in first}}, None],
                     [done(0, 2, 0, tmp_path), done(1, 2, None, tmp_path)])
    whole = shards.merge(eval_set, [{"items": {i.id: figures for i in first}}, {"items": {i.id: figures for i in second}}],
                         [done(0, 2, 0, tmp_path), done(1, 2, 0, tmp_path)])
    assert whole["SIM"] == ([0.9] * 12, [0.9] * 12)


def test_local_workers_each_run_with_their_own_gpu_and_a_failure_is_named(tmp_path):
    code = "import os, sys; print(os.environ.get('CUDA_VISIBLE_DEVICES')); sys.exit(int(sys.argv[1]))"
    jobs = [workers.Job(f"job {k}", (sys.executable, "-c", code, str(k)), tmp_path / f"job-{k}.log") for k in range(3)]
    out = workers.run_jobs(jobs, gpus=["4", "7"], log=lambda m: None)
    assert [d.exit for d in out] == [0, 1, 2]
    assert [(tmp_path / f"job-{k}.log").read_text().splitlines()[-1] for k in range(3)] == ["4", "7", "4"]
    assert out[2].why() == f"job 2 exited 2; log {tmp_path / 'job-2.log'}"
    slow = workers.run_jobs([workers.Job("sleeper", (sys.executable, "-c", "import time; time.sleep(60)"),
                                         tmp_path / "sleep.log")], timeout=1, log=lambda m: None)
    assert slow[0].exit is None and "stopped after the 1 s limit" in slow[0].why()


def test_omnivoice_items_generated_in_shards_are_the_serial_runs(english, checkpoint, model):
    """The omnivoice synthesizer (the tiny test checkpoint: what flows is random, the plumbing is the real one): each
    worker's share, stock and with the lossless stack, equals the serial run's samples item for item (each item's
    seed is its id's, not its place in the share), and the stack's equal stock's (bit-exact on CPU fp32)."""
    eval_set = sets.read_set(english)
    eval_set = shards.subset(eval_set, eval_set.items[:4])

    def generated(stack: bool, share=None) -> dict:
        only = None if share is None else {i.id for i in share}
        return {i: wav.tobytes() for i, wav, _ in clone_run.omnivoice_clips(eval_set, checkpoint, model=model,
                                                                            stack=stack, only=only)}

    serial = generated(False)
    assert len(serial) == 4 and len(set(serial.values())) == 4  # four different outputs
    parts = shards.split(eval_set.items, 2)
    for stack in (False, True):
        merged = {}
        for share in parts:
            merged.update(generated(stack, share))
        assert merged == serial, f"stack={stack}: {[i for i in serial if merged.get(i) != serial[i]]}"
