"""Speaker similarity (SIM, GE2E) and predicted MOS (DNSMOS) gated like WER: the statistic's direction and
verdicts on made-up scores, the judges on real espeak-ng speech (an equivalent set passes, a shifted voice and noise
are refused), the stream voice check, and the operating characteristics (simulation in the default run; the
espeak-ng tables under --slow, every night)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from harness.quality import corpus, evaluate, mos, stats, voice

from harness.audit import known_scores
from harness.quality.evaluate import Clip
from harness.audit.simulate import SPREADS, ScoreModel, score_pass_rate

GROUPS = [f"s{i}" for i in range(30) for _ in range(2)]


def scores(rng, delta=0.0, within=0.01):
    base = rng.normal(0.9, 0.02, 30).repeat(2)
    return base + rng.normal(0, within, 60), base + rng.normal(0, within, 60) + delta


@pytest.mark.parametrize("delta, want", [
    pytest.param(0.0, "pass", id="equivalent"),
    pytest.param(-0.05, "fail", id="worse-by-2.5-margins"),
    pytest.param(+0.05, "pass", id="better"),
])
def test_the_score_gate_is_one_sided_in_the_right_direction(delta, want):
    """Higher is better: a candidate 0.05 below the reference (margin 0.02) fails, one above it passes."""
    ref, cand = scores(np.random.default_rng(1), delta)
    v = stats.score_gate("SIM", stats.SIM_UNIT, ref, cand, GROUPS, 0.02, "judge")
    assert v.verdict == want, v.format()
    assert v.lower <= v.delta <= v.upper and abs(v.delta - delta) < 0.01, v.format()
    if want == "fail":
        assert v.worse and v.upper < -v.margin and v.p_noninferior > stats.ALPHA, v.format()


def test_a_small_noisy_run_is_underpowered_naming_the_seeds_it_needs():
    ref, cand = scores(np.random.default_rng(2), 0.0, within=0.08)
    v = stats.score_gate("MOS-OVRL", "DNSMOS P.835 OVRL", ref, cand, GROUPS, 0.02, "judge",
                         rerun="pytest --quality-seeds {seeds}")
    assert v.verdict == "underpowered" and v.seeds_needed > 2, v.format()
    assert f"--quality-seeds {v.seeds_needed}" in v.rerun and f"need {v.seeds_needed}" in v.format()


def test_the_score_gate_refuses_unpaired_scores_and_a_bad_margin():
    ref, cand = scores(np.random.default_rng(3))
    with pytest.raises(ValueError, match=r"\(60,\) reference and \(59,\) candidate"):
        stats.score_gate("SIM", "u", ref, cand[:-1], GROUPS, 0.02, "j")
    with pytest.raises(ValueError, match="margin"):
        stats.score_gate("SIM", "u", ref, cand, GROUPS, 0.0, "j")


def test_one_verdict_passes_only_when_every_metric_passes():
    rng = np.random.default_rng(4)
    good = stats.score_gate("SIM", "u", *scores(rng), GROUPS, 0.02, "j")
    bad = stats.score_gate("MOS-OVRL", "u", *scores(rng, -0.05), GROUPS, 0.02, "j")
    slow = stats.score_gate("MOS-P808", "u", *scores(rng, 0.0, 0.08), GROUPS, 0.02, "j")
    assert stats.Overall((good, good)).passed
    assert stats.Overall((good, bad, slow)).verdict == "fail"
    under = stats.Overall((good, slow), "cand")
    assert under.verdict == "underpowered" and under.seeds_needed == slow.seeds_needed
    text = stats.Overall((good, bad), "cand").format()
    assert text.startswith("[FAIL] cand: SIM pass, MOS-OVRL fail") and "margin 0.02" in text


def test_the_listening_pack_lists_each_score_worst_first(tmp_path):
    from harness.quality import wer

    clips = [Clip(f"s{i}", "a b c", np.zeros(100, np.float32), 16000, f"s{i}") for i in range(4)]
    scored = wer.score_set([c.id for c in clips], [c.text for c in clips], ["a b c"] * 4, "j")
    sim = (np.array([0.9, 0.9, 0.9, 0.9]), np.array([0.9, 0.7, 0.85, 0.95]))
    index = evaluate.write_listening_pack(tmp_path / "pack", clips, clips, ["a b c"] * 4, ["a b c"] * 4, scored,
                                          scored, scores={"SIM": sim, "MOS-OVRL": (np.ones(4), np.ones(4))})
    text = index.read_text()
    section = text.split("## Worst clips by SIM")[1].split("##")[0]
    rows = [line.split("|")[2].strip() for line in section.splitlines() if line.startswith("| ") and "s" in line
            and "id" not in line]
    assert rows[:3] == ["s1", "s2", "s0"], section
    assert "0.900 -> 0.700 (-0.200)" in section and "## Worst clips by MOS-OVRL" in text


def test_mos_scores_at_a_fixed_level_in_one_window():
    """The level is normalised (RMS -25 dBFS, peak at most 0.99) and a short clip is tiled to one 9.01 s window."""
    rng = np.random.default_rng(5)
    quiet, loud = 0.01 * rng.standard_normal(24000), 0.5 * rng.standard_normal(24000)
    a, b = mos.at_level(quiet, 24000), mos.at_level(loud, 24000)
    for x in (a, b):
        assert abs(20 * np.log10(np.sqrt(np.mean(x.astype(np.float64) ** 2))) - mos.LEVEL_DBFS) < 0.01
    assert np.max(np.abs(mos.at_level(np.r_[np.zeros(10000), 1.0], 16000))) <= mos.PEAK + 1e-6
    pytest.importorskip("speechmos", reason="the predicted-MOS judge: bash scripts/install.sh")
    w = mos.one_window(a)
    assert w.size == int(9.01 * 16000) and np.array_equal(w[: a.size], a)


@pytest.mark.parametrize("module, judge", [("resemblyzer", "voice"), ("speechmos", "mos")])
def test_a_missing_judge_names_the_fix(monkeypatch, module, judge):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, f"{module}.dnsmos", None)
    load = voice.weights_path if judge == "voice" else mos.model_dir
    with pytest.raises(ImportError, match="bash scripts/install.sh"):
        load()


# -- the judges on real speech (default run: the fast version) ----------------------------------------------------

FAST_SIM_SENTENCES = 16  # at 16 the equivalent set's lower bound is -0.002 and the shifted set's upper -0.027
FAST_MOS_SENTENCES = 8  # at 8 the equivalent set's lower bounds are -0.11 (OVRL) and -0.12 (P808), noise's upper -0.30
FAST_MOS_MARGIN = 0.25  # the default run's small set (8 clips a side) has the power for this margin, not 0.1
SHIFT_2X = 1.05  # about twice SIM_MARGIN (measured: docs/results.md, "known-answer-sim" calibration)


def fast_sets(items, damage="none", factor=1.0):
    ref = [known_scores.clip(items, g, 0, 0) for g in range(len(items))]
    cand = [known_scores.clip(items, g, 1, 0, damage, factor) for g in range(len(items))]
    return ref, cand


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.quality
def test_sim_passes_the_same_voices_and_refuses_a_shifted_voice(voice_judge, espeak):
    """16 dev sentences, each in its speaker's voice at two seeds: the second seed passes the SIM gate against the
    first (SIM to the speaker's prompt), the same set shifted x1.05 in pitch and formants (about twice the margin)
    is refused."""
    items = corpus.load_corpus("dev")[:FAST_SIM_SENTENCES]
    ref, same = fast_sets(items)
    _, shifted = fast_sets(items, factor=SHIFT_2X)
    r = known_scores.sims(voice_judge, items, ref)
    groups = [c.group for c in ref]
    ok = stats.score_gate("SIM", stats.SIM_UNIT, r, known_scores.sims(voice_judge, items, same), groups,
                          stats.SIM_MARGIN, voice_judge.identity)
    worse = stats.score_gate("SIM", stats.SIM_UNIT, r, known_scores.sims(voice_judge, items, shifted), groups,
                             stats.SIM_MARGIN, voice_judge.identity)
    print("\n" + ok.format() + "\n" + worse.format())
    assert ok.passed, ok.format()
    assert worse.verdict == "fail" and worse.delta < -stats.SIM_MARGIN, worse.format()
    assert json.loads(voice_judge.identity)["weights_sha256"]


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.quality
def test_mos_passes_an_equivalent_set_and_refuses_noise(mos_judge, espeak):
    """8 dev sentences at two seeds: the second passes both DNSMOS gates (OVRL and P808) against the first at the
    fast margin; the second with white noise at 10 dB SNR is refused."""
    items = corpus.load_corpus("dev")[:FAST_MOS_SENTENCES]
    ref, same = fast_sets(items)
    _, noisy = fast_sets(items, "noise-10db")
    groups = [c.group for c in ref]
    verdicts = {}
    for name, cand in (("equivalent", same), ("noise", noisy)):
        verdicts[name] = stats.Overall(tuple(
            stats.score_gate(metric, unit, mos.mos_scores(mos_judge, ref, field),
                             mos.mos_scores(mos_judge, cand, field), groups, FAST_MOS_MARGIN, mos_judge.identity)
            for metric, field, unit in stats.MOS_FIELDS), name)
        print("\n" + verdicts[name].format())
    assert verdicts["equivalent"].passed, verdicts["equivalent"].format()
    assert verdicts["noise"].verdict == "fail", verdicts["noise"].format()


@pytest.mark.quality
def test_the_stream_check_passes_one_voice_and_refuses_a_switch_of_voice(voice_judge, espeak):
    """Streams of three espeak-ng chunks: four in one voice pass voice.seam_check; four that switch to a female
    voice at a seam are refused, at that seam."""
    items = corpus.load_corpus("dev")
    for i in range(4):
        speaker = known_scores.SPEAKERS[i]
        one = voice.seam_check(voice_judge, *known_scores.stream_chunks(items, 3 * i, speaker, i))
        at = 1 + i % 2
        switched = voice.seam_check(voice_judge, *known_scores.stream_chunks(
            items, 3 * i, speaker, i, switch_to=known_scores.FEMALE[i], at=at))
        assert one.passed, one.format()
        assert not switched.passed and switched.seams[at - 1] < voice.SEAM_FLOOR, switched.format()
        assert "VOICE CHANGED" in switched.format()


# -- operating characteristics by simulation ------------------------------------------------------------------

DATASETS = 400
# The table's size (60 sentences x 3 seeds) with the spread measured on espeak-ng speech (dev set, 3 seeds): SIM
# within a sentence 0.008, between sentences 0.017; DNSMOS OVRL within 0.17 (P808's 0.11 is easier).
SCORE_SIZES = [
    pytest.param(ScoreModel(60, 3, **SPREADS["sim"]), stats.SIM_MARGIN, id="sim-espeak-table"),
    pytest.param(ScoreModel(60, 3, **SPREADS["mos"]), stats.MOS_MARGIN, id="mos-ovrl-espeak-table"),
]
# The real checkpoint's holdout (48 x 40) with the same spreads: every night (--slow).
HOLDOUT_SIZES = [
    pytest.param(ScoreModel(corpus.HOLDOUT_SENTENCES, evaluate.HOLDOUT_SEEDS, **SPREADS["sim"]), stats.SIM_MARGIN,
                 id="sim-holdout", marks=pytest.mark.slow),
    pytest.param(ScoreModel(corpus.HOLDOUT_SENTENCES, evaluate.HOLDOUT_SEEDS, **SPREADS["mos"]), stats.MOS_MARGIN,
                 id="mos-ovrl-holdout", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("model, margin", SCORE_SIZES + HOLDOUT_SIZES)
def test_at_the_margin_the_score_gate_passes_at_most_5_percent(model, margin):
    rate = score_pass_rate(model, margin, margin, "spread", 0.0, DATASETS, seed=21)
    print(f"\n{model}, margin {margin}: worse by the margin passes {rate:.1%}")
    assert rate <= 0.05, f"passes {rate:.1%} of {DATASETS} data sets at Δ = -margin"


@pytest.mark.slow
@pytest.mark.parametrize("model, margin", SCORE_SIZES)
def test_at_the_margin_concentrated_the_score_gate_passes_at_most_5_percent(model, margin):
    """The same loss carried by 20% of the sentences (a voice that drifts on some texts only)."""
    rate = score_pass_rate(model, margin, margin, "concentrated", 0.2, DATASETS, seed=22)
    assert rate <= 0.05, f"passes {rate:.1%} of {DATASETS} data sets at Δ = -margin, concentrated"


@pytest.mark.parametrize("model, margin", SCORE_SIZES + HOLDOUT_SIZES)
def test_an_equivalent_candidate_passes_the_score_gate_with_the_promised_power(model, margin):
    rate = score_pass_rate(model, margin, 0.0, "spread", 0.0, DATASETS, seed=23)
    print(f"\n{model}, margin {margin}: equivalent passes {rate:.1%}")
    assert rate >= 0.76, f"an equivalent candidate passes only {rate:.1%}"


# -- the espeak-ng tables (every night) --------------------------------------------------------------------------

@pytest.mark.quality
@pytest.mark.slow
@pytest.mark.parametrize("metric", ["sim", "mos"])
def test_operating_characteristics_of_the_score_gates_on_espeak_speech(metric, espeak, request):
    """The tables of docs/results.md: 20 repetitions of every case (60 sentences x 3 seeds). Cold on the 2-core
    AVX2 EPYC: SIM about 6 min (most of it the calibration), MOS about 15 min; cached afterwards."""
    request.getfixturevalue("voice_judge" if metric == "sim" else "mos_judge")
    data = known_scores.run(metric, reps=20)
    text = known_scores.render_results(data)
    print("\n" + text)
    assert all(r["meets"] for r in data["rows"]), text
    for t, cal in data["calibration"].items():  # the shifts are what their rows say
        assert abs(cal["true_delta"] + float(t) * stats.SIM_MARGIN) < 0.1 * stats.SIM_MARGIN, cal


@pytest.mark.quality
@pytest.mark.slow
def test_the_stream_check_on_espeak_streams(voice_judge, espeak):
    """The stream-voice table: 40 streams of each kind; one voice refused <= 5%, a switch of sex >= 95%."""
    data = known_scores.run_stream(40)
    text = known_scores.render_stream_results(data)
    print("\n" + text)
    assert all(r["meets"] is not False for r in data["rows"]), text


class TextJudge:
    """A WER judge that hears every clip say its own text (the words are not what this test is about)."""

    identity = "text-judge"

    def __init__(self, texts):
        self.texts = texts

    def transcribe(self, wav, sr):
        return self.texts[wav.size]


class LevelJudge:
    """A MOS judge that scores a clip by its peak: the real one is tested above, this one keeps the test quick."""

    identity = "level-judge"

    def score(self, wav, sr):
        return {"ovrl": float(np.max(np.abs(wav))), "p808": 3.0, "sig": 3.0, "bak": 3.0}


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.quality
def test_compare_sets_judges_all_three_and_packs_the_voice_that_drifted(voice_judge, espeak, tmp_path):
    """The real-checkpoint tier's path: compare_sets with a judge for each metric, SIM by the real GE2E encoder
    against the speaker's prompt; a candidate in a shifted voice (x1.08) keeps its words and its sound but fails on
    SIM, the verdict names the metric, and the pack lists its clips worst SIM first."""
    items = corpus.load_corpus("dev")[:12]
    def make(seed, factor):
        clips = []
        for it in items:
            wav, sr = known_scores.render_in_voice(it, "en-us+m1", seed)
            clips.append(Clip(f"{it.id}#0", it.text, known_scores.shift(wav, sr, factor), sr, it.id, seed))
        return clips

    ref, cand, other = make(0, 1.0), make(1, 1.08), make(1, 1.0)
    texts = {c.wav.size: c.text for c in ref + cand + other}
    out = evaluate.compare_sets(TextJudge(texts), ref, cand, label="shifted", pack_dir=tmp_path / "pack",
                                voice_judge=voice_judge, mos_judge=LevelJudge(),
                                prompt=known_scores.prompt_audio("en-us+m1"), mos_margin=1.0)
    text = out.overall.format()
    assert [v.verdict for v in out.overall.verdicts] == ["pass", "fail", "pass", "pass"], text
    assert text.startswith("[FAIL] shifted: WER pass, SIM fail, MOS-OVRL pass, MOS-P808 pass") and not out.passed
    assert set(out.scores) == {"SIM", "MOS-OVRL", "MOS-P808"}
    index = out.pack.read_text()
    assert "## Worst clips by SIM" in index and "## Worst clips by MOS-P808" in index and "[FAIL] shifted" in index
    same = evaluate.compare_sets(TextJudge(texts), ref, other, voice_judge=voice_judge, mos_judge=LevelJudge(),
                                 prompt=known_scores.prompt_audio("en-us+m1"), mos_margin=1.0)
    assert same.passed and same.overall.verdict == "pass", same.overall.format()


@pytest.mark.quality
def test_auto_voice_sim_compares_halves_with_the_reference_clip(voice_judge, espeak):
    """Without a prompt, each side's score is SIM(its first half, the reference clip's second half): the same voice
    at another seed scores about what the reference does, another voice (female) far less."""
    items = corpus.load_corpus("dev")[:6]
    make = lambda voice_name, seed: [Clip(f"{it.id}#0", it.text, *known_scores.render_in_voice(it, voice_name, seed),
                                          it.id, seed) for it in items]
    ref = make("en-us+m1", 0)
    r, same = voice.sim_scores(voice_judge, ref, make("en-us+m1", 1))
    r2, other = voice.sim_scores(voice_judge, ref, make("en-us+f2", 1))
    assert np.array_equal(r, r2) and np.all(r < 0.999), "the reference's own score is a half against a half"
    assert abs(same.mean() - r.mean()) < 0.03 and other.mean() < r.mean() - 0.1, (r, same, other)
    with pytest.raises(ValueError, match="not paired"):
        voice.sim_scores(voice_judge, ref, ref[::-1])
