"""Every check that compares audio bites: one sample of one decoded chunk changed, or one code of one codebook changed
before it is decoded, makes it fail.

The mutations (harness.parity.parity.decoded_changed, code_changed) act on `audio_tokenizer.decode` of the candidate side
only; the tokens generate made are untouched, so only a comparison of the audio can see them. Two sizes of
one-sample change: one ulp (the smallest change there is), which the checks that compare the decoder's own audio
bit for bit must see; and 1e-3 (-60 dBFS, 33 steps of int16), which must reach every check that compares only the
waveform generate returns (upstream's post-processing rounds the audio to int16 in its silence trimming, and scales
it to the reference's level, and either can swallow one ulp). The places, and who uses each:

- parity.compare_runs: the parity tier (tests_parity: bitexact, batched, mutations, probes, packed CFG, prefix
  cache, GPU determinism), composition and registry tests, the copies and lean-LLM tests, the report's table;
  at one item, and at the middle chunk of the chunked long-form point, whose seams are upstream's cross-fade;
- the report's bit-exact verdicts (harness.report.parity_rows);
- the stream against upstream's chunked generate (tests_parity.test_stream.stream_problems): every chunk's decoded
  audio and the joined stream, the change made inside the seam's cross-fade;
- goldens (harness.gate.goldens.compare_point): the decoded-audio and waveform sha256 under this machine's numerics key;
  the portable part compares lengths exactly and each waveform's RMS in 32 blocks within 1e-6, which one sample
  cannot move (named so: `waveform_rms`), and which one code must;
- the version gate's behaviour records (harness.gate.behaviour.compare): decoded audio and waveforms, bit for bit.
"""

from __future__ import annotations

import pytest

import fastpath
from harness import report
from harness.gate import behaviour
from harness.gate import goldens
from harness.parity.parity import POINTS, code_changed, compare_runs, decoded_changed, record_generation

pytestmark = pytest.mark.cpu
STEPS = 4

MUTATIONS = {
    "one sample, one ulp": lambda model, call, sample=None, when=None: decoded_changed(model, call, sample, None, when),
    "one sample by 1e-3": lambda model, call, sample=None, when=None: decoded_changed(model, call, sample, 1e-3, when),
    "one code of codebook 3": lambda model, call, sample=None, when=None: code_changed(model, call, 3, None, when),
}


def mutated(mutation: str, model, call: int, **options):
    return MUTATIONS[mutation](model, call, **options)


def fired(calls: list, call: int) -> None:
    assert len(calls) > call, f"the mutation never reached decode call {call}: the check was not exercised"


def parity_problems(model, mutation: str, point: str, call: int) -> list:
    kwargs = dict(POINTS[point], num_step=STEPS)
    stock = record_generation(model, seed=0, **kwargs)
    with mutated(mutation, model, call) as calls:
        candidate = record_generation(model, seed=0, **kwargs)
    fired(calls, call)
    return compare_runs(stock, candidate)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_parity_comparison_bites_on_one_item(model, mutation):
    problems = parity_problems(model, mutation, "auto_voice", call=0)
    assert any(p.startswith("decoded audio[0]:") for p in problems), problems
    if mutation != "one sample, one ulp":  # one ulp may round away in the int16 trimming; the decoded audio has it
        assert any(p.startswith("waveform[0]:") for p in problems), problems


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_parity_comparison_bites_on_the_middle_chunk_of_a_long_text(model, mutation):
    problems = parity_problems(model, mutation, "long_chunked", call=1)
    assert any(p.startswith("decoded audio[1]:") for p in problems), problems
    assert not any(p.startswith(("decoded audio[0]:", "decoded audio[2]:")) for p in problems), problems
    if mutation != "one sample, one ulp":
        assert any(p.startswith("waveform[0]:") for p in problems), problems  # the three chunks joined


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_report_bit_exact_verdicts_bite(model, mutation, monkeypatch, tmp_path):
    monkeypatch.setattr(report, "REPORT_POINTS", ("auto_voice",))
    monkeypatch.setattr(fastpath, "LOSSLESS", ("sliced_heads",))
    monkeypatch.setitem(POINTS, "auto_voice", dict(POINTS["auto_voice"], num_step=STEPS))
    with mutated(mutation, model, None, when=lambda: bool(fastpath.applied(model))) as calls:  # every patched decode
        rows = report.parity_rows(model, tmp_path)
    fired(calls, 1)
    assert rows and not any(row["bit_exact"] for row in rows), rows
    assert all(row["first_difference"].startswith("decoded audio[0]:") for row in rows), rows


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_stream_comparison_bites_inside_a_seam(model, mutation):
    from harness.model.points import reference
    from tests_parity.test_stream import stream_problems

    audio, text = reference("ref_6s")
    prompt = model.create_voice_clone_prompt(ref_audio=audio, ref_text=text)
    calls = []

    def mutation_of(m):  # chunk 1, sample 100: inside the cross-fade with chunk 0 (2400 samples)
        context = mutated(mutation, m, 1, sample=100)
        calls.append(context)
        return context

    problems = stream_problems(model, prompt, "clone", mutation=mutation_of)
    assert calls, "the stream ran without the mutation"
    assert any(p.startswith("chunk 1 decoded audio:") for p in problems), problems
    if mutation != "one sample, one ulp":  # scaled to the reference's level, one ulp can round away
        assert any(p.startswith("joined stream:") for p in problems), problems


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_goldens_bite(model, mutation):
    kwargs = goldens.point_kwargs(model, "voice_clone_audio")
    golden = goldens.summarise_run(record_generation(model, seed=goldens.SEED, **kwargs))
    with mutated(mutation, model, 0) as calls:
        observed = goldens.summarise_run(record_generation(model, seed=goldens.SEED, **kwargs))
    fired(calls, 0)
    key = next(iter(golden["exact"]))
    parts = goldens.compare_point(observed, golden, key)
    assert "decoded: sha256 differs (exact, recorded for this machine)" in parts, parts
    moved_rms = any(p.startswith("waveform_rms: moved") for p in parts)
    assert moved_rms == (mutation == "one code of codebook 3"), (
        f"the portable part compares block RMS: one code must move it, one sample must not ({parts})")


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_behaviour_comparison_bites(model, mutation):
    def record(setting: dict) -> dict:
        return {"omnivoice": "x", "device": "cpu", "dtype": "fp32", "settings": {"voice_clone_audio": setting}}

    stock = behaviour.record_setting(model, "voice_clone_audio")
    with mutated(mutation, model, 0) as calls:
        candidate = behaviour.record_setting(model, "voice_clone_audio")
    fired(calls, 0)
    differences = behaviour.compare(record(stock), record(candidate)).get("voice_clone_audio", [])
    assert any(d.startswith("decoded[0]:") for d in differences), differences
    if mutation != "one sample, one ulp":
        assert any(d.startswith("waveforms[0]:") for d in differences), differences
