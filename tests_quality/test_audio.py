"""Bad audio is refused by name before any judge hears it: an empty, too short, silent, non-finite or clipped clip
never reaches Whisper (WER), GE2E (SIM) or DNSMOS (MOS); the set comparison the real-checkpoint tier and the gate
run turns it into a failing verdict that names the clip, the defect, the measured value and the limit. Real
speech (espeak-ng renders of the corpus) is never refused."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from harness.quality import corpus, evaluate, speech
from harness.quality.evaluate import Clip

SR = 24000  # OmniVoice's rate: the judges resample from it
JUDGE_SR = 16000


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Embeddings, scores and transcripts of this module's made-up clips stay out of the shared cache."""
    monkeypatch.setenv(evaluate.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def spoken(espeak):
    """A real sentence (espeak-ng, en-us) at SR: the clip every bad clip below is made from."""
    from scipy.signal import resample_poly

    wav, sr = espeak.render("The quick brown fox jumps over the lazy dog near the river bank.")
    return resample_poly(wav, SR, sr).astype(np.float32)


def bad_clips(spoken) -> dict:
    """{defect: (wav at SR, what the refusal must say)}."""
    nan = spoken.copy()
    nan[:] = np.nan  # a bf16 overflow gives an all-NaN clip
    inf = spoken.copy()
    inf[SR] = np.inf
    loud = np.clip(4 * spoken / np.max(np.abs(spoken)), -1, 1)  # hard-clipped at a gain of 4
    return {
        "empty": (np.zeros(0, np.float32), "is empty (0 samples"),
        "one-sample": (spoken[SR : SR + 1], "is too short for the"),
        "silent": (np.zeros_like(spoken), "is silent (peak 0, limit 0.001)"),
        "all-NaN": (nan, f"is non-finite ({spoken.size} of {spoken.size} samples NaN or inf, limit 0)"),
        "one-inf": (inf, f"is non-finite (1 of {spoken.size} samples NaN or inf, limit 0)"),
        "clipped": (loud.astype(np.float32), "is clipped ("),
    }


DEFECTS = ["empty", "one-sample", "silent", "all-NaN", "one-inf", "clipped"]


class Spy:
    """Stands in for a judge's model: records every call, then runs the real one."""

    def __init__(self, real, method=None):
        self.real, self.method, self.calls = real, method, []

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.real(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if name != self.method:
            return attr

        def call(*args, **kwargs):
            self.calls.append(args)
            return attr(*args, **kwargs)

        return call


@pytest.fixture(params=["WER", "SIM", "MOS"])
def judged(request, monkeypatch):
    """(judge name, score(wav, sr): the judge's own entry point, the judge's model spied on)."""
    name = request.param
    if name == "WER":
        judge = request.getfixturevalue("judge")
        spy = Spy(judge.model, "transcribe")
        monkeypatch.setattr(judge, "model", spy)
        return name, judge.transcribe, spy
    if name == "SIM":
        judge = request.getfixturevalue("voice_judge")
        spy = Spy(judge.encoder, "embed_utterance")
        monkeypatch.setattr(judge, "encoder", spy)
        return name, judge.embed, spy
    judge = request.getfixturevalue("mos_judge")
    spy = Spy(judge.model)
    monkeypatch.setattr(judge, "model", spy)
    return name, judge.score, spy


def refusal(call):
    """The error `call` raised; the test fails when the judge returned a score for bad audio instead."""
    try:
        out = call()
    except Exception as err:  # today's crashes are reported by the assertions below, with their type
        return err
    pytest.fail(f"bad audio was judged: the judge returned {out!r}")


@pytest.mark.quality
@pytest.mark.parametrize("defect", DEFECTS)
def test_no_judge_hears_bad_audio(judged, spoken, defect):
    """Each real judge, called on a bad clip, refuses it by name (BadAudio: which clip, which defect, the measured
    value, the limit) and its model never runs."""
    name, score, spy = judged
    wav, says = bad_clips(spoken)[defect]
    err = refusal(lambda: score(wav, SR))
    assert type(err).__name__ == "BadAudio", f"{name} judge on a {defect} clip: {type(err).__name__}: {err}"
    assert str(err).startswith("refused: bad audio: the clip ") and says in str(err), str(err)
    if defect == "one-sample":
        assert f"too short for the {name} judge" in str(err), str(err)
    assert not spy.calls, f"the {name} judge's model ran on a {defect} clip"


def floor(judge_name: str) -> int:
    from harness.quality import audio

    return audio.MIN_SAMPLES[judge_name]


@pytest.mark.quality
def test_each_judges_length_floor_is_its_library_s_own(judge, voice_judge, mos_judge):
    """The floors are the judges' own numbers: Whisper's STFT window (faster-whisper's n_fft), resemblyzer's
    partial-utterance window times the coverage it demands of a padded partial, DNSMOS's P.808 mel frame."""
    from faster_whisper.feature_extractor import FeatureExtractor
    from resemblyzer import VoiceEncoder, hparams
    from speechmos.dnsmos import DNSMOS

    whisper_n_fft = inspect.signature(FeatureExtractor).parameters["n_fft"].default
    coverage = inspect.signature(VoiceEncoder.embed_utterance).parameters["min_coverage"].default
    partial = hparams.partials_n_frames * hparams.sampling_rate * hparams.mel_window_step // 1000
    dnsmos_frame = inspect.signature(DNSMOS.audio_melspec).parameters["frame_size"].default + 1
    assert floor("WER") == whisper_n_fft, (floor("WER"), whisper_n_fft)
    assert floor("SIM") == int(coverage * partial), (floor("SIM"), coverage, partial)
    assert floor("MOS") == dnsmos_frame, (floor("MOS"), dnsmos_frame)


@pytest.mark.quality
def test_just_below_a_judges_floor_is_refused_and_at_it_judged(judged, spoken):
    """Real speech cut to the floor less one sample (at the judges' 16 kHz) is refused as too short, naming the
    judge, the length and the floor; cut at the floor it is judged."""
    from scipy.signal import resample_poly

    name, score, spy = judged
    n = floor(name)
    at_16k = resample_poly(spoken, JUDGE_SR, SR).astype(np.float32)
    start = int(np.argmax(np.abs(at_16k) > 0.1))  # where the voice starts: the cut is speech, not silence
    err = refusal(lambda: score(at_16k[start : start + n - 1], JUDGE_SR))
    assert type(err).__name__ == "BadAudio", f"{type(err).__name__}: {err}"
    assert f"too short for the {name} judge ({n - 1} samples at 16 kHz" in str(err) and f"limit {n}" in str(err), err
    assert not spy.calls
    score(at_16k[start : start + n], JUDGE_SR)  # judged: no error
    assert spy.calls, f"the {name} judge did not run on a clip at its floor"


def test_the_floor_is_counted_at_the_judges_rate():
    """A 24 kHz clip reaches the judges resampled to 16 kHz: its length there decides (scipy's resample_poly gives
    ceil(n * 2 / 3) samples)."""
    from harness.quality import audio

    n = audio.MIN_SAMPLES["SIM"]
    wav = 0.1 * np.sin(np.arange(2 * n) / 7.0).astype(np.float32)
    for size in (n * 3 // 2 - 2, n * 3 // 2 - 1, n * 3 // 2):
        assert audio.to_judge_rate(wav[:size], SR).size == audio.judge_samples(size, SR)
    assert audio.check_clip(wav[: n * 3 // 2 - 2], SR, "SIM") is not None  # 19199 samples at 16 kHz
    assert audio.check_clip(wav[: n * 3 // 2], SR, "SIM") is None


def test_check_clip_names_an_unknown_judge():
    from harness.quality import audio

    with pytest.raises(ValueError, match=r"unknown judge 'PESQ'.*'WER', 'SIM', 'MOS'"):
        audio.check_clip(np.ones(10), SR, "PESQ")


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.quality
def test_real_speech_is_never_refused(dev_renders, espeak):
    """No false refusals: every espeak-ng render of the dev sentences (at espeak's defaults, and at the realisations
    of seeds 0 and 1 that the known-answer tables draw: voice variant, rate 160-190, pitch 40-60), as rendered and
    scaled to a peak of exactly full scale, passes every judge's check, and so does each half (auto-voice SIM embeds
    halves). The same speech hard-clipped at twice that gain, or just under the silence floor, is refused as such:
    the thresholds sit between speech and damage."""
    from harness.quality import audio

    clips = [(c.id, c.wav, c.sr) for c in dev_renders]
    for item in corpus.load_corpus("dev"):
        for seed in (0, 1):
            clips.append((f"{item.id}#s{seed}", *speech.render_as(item.text, speech.realisation(item.id, seed))))
    refused, missed = [], []
    for cid, wav, sr in clips:
        full = wav / np.max(np.abs(wav))
        for name, w in ((cid, wav), (f"{cid} at full scale", full), (f"{cid} first half", wav[: wav.size // 2]),
                        (f"{cid} second half", wav[wav.size // 2 :])):
            if (p := audio.check_clip(w, sr, ("WER", "SIM", "MOS"), name)) is not None:
                refused.append(p.format())
        for damage, w in (("clipped", np.clip(2 * full, -1, 1)), ("silent", full * 0.99 * audio.SILENT_PEAK)):
            p = audio.check_clip(w, sr, ("WER", "SIM", "MOS"), cid)
            if p is None or p.defect != damage:
                missed.append(f"{cid} {damage}: {p}")
    assert not refused, f"{len(refused)} refusals of real speech: {refused[:5]}"
    assert not missed, f"{len(missed)} damaged clips not refused as such: {missed[:5]}"
    assert len(clips) == 3 * len(dev_renders) >= 180


class ListeningJudge:
    """A WER judge that hears each clip say its text, and records every clip it was given."""

    identity = "listening-judge"

    def __init__(self, texts):
        self.texts, self.heard = texts, []

    def transcribe(self, wav, sr):
        self.heard.append(wav.size)
        return self.texts.get(wav.size, "")


class RecordingScores:
    """A SIM and MOS judge that scores everything alike and records what it was given."""

    identity = "recording-judge"

    def __init__(self):
        self.heard = []

    def similarity(self, a, b):
        self.heard.append(a[0].size)
        return 0.9

    def score(self, wav, sr):
        self.heard.append(wav.size)
        return {"ovrl": 3.0, "p808": 3.0, "sig": 3.0, "bak": 3.0}


def two_sets(spoken, n=6):
    words = "one two three four five six seven eight"
    ref = [Clip(f"s{i}#s0", words, spoken[: spoken.size - 100 * i], SR, f"s{i}") for i in range(n)]
    return ref, [Clip(c.id, c.text, c.wav.copy(), c.sr, c.group) for c in ref]


@pytest.mark.parametrize("defect", DEFECTS)
def test_a_bad_candidate_clip_is_a_failing_verdict_that_names_it(spoken, defect):
    """The set comparison of the real-checkpoint tier (compare_sets, under gate_on_holdout): one bad candidate clip
    makes the verdict REFUSED, naming the clip and its defect, and none of the three judges hears either set."""
    ref, cand = two_sets(spoken)
    wav, says = bad_clips(spoken)[defect]
    cand[3] = Clip(cand[3].id, cand[3].text, wav, SR, cand[3].group)
    wer_judge = ListeningJudge({c.wav.size: c.text for c in ref})
    scores = RecordingScores()
    out = evaluate.compare_sets(wer_judge, ref, cand, label="cand", voice_judge=scores, mos_judge=scores,
                                prompt=(spoken, SR))
    text = out.overall.format() if out.overall is not None else out.verdict.format()
    assert not out.passed and out.overall is not None and out.overall.verdict == "refused", text
    assert text.startswith("[REFUSED] cand: bad audio: clip s3#s0 (candidate) ") and says in text, text
    assert not wer_judge.heard and not scores.heard, f"judges heard bad audio: {wer_judge.heard} {scores.heard}"


def test_a_silent_reference_and_a_short_voice_prompt_are_refused_too(spoken):
    """The reference side and the voice prompt's audio (what SIM compares with) go through the same check."""
    ref, cand = two_sets(spoken)
    ref[0] = Clip(ref[0].id, ref[0].text, np.zeros_like(spoken), SR, ref[0].group)
    out = evaluate.compare_sets(ListeningJudge({}), ref, cand, label="cand", voice_judge=RecordingScores(),
                                prompt=(spoken[:SR], SR))
    text = out.overall.format()
    assert "clip s0#s0 (reference) is silent (peak 0, limit 0.001)" in text, text
    assert "the voice prompt's audio is too short for the SIM judge (16000 samples at 16 kHz" in text, text


def test_auto_voice_sim_refuses_a_clip_whose_half_is_too_short(spoken):
    """Without a prompt SIM embeds halves (voice.sim_scores): a clip long enough whole but not in halves is refused
    as such before any judge runs, and voice.sim_scores itself refuses it by name."""
    from harness.quality import audio, voice

    n = audio.MIN_SAMPLES["SIM"] * 3 // 2  # samples at 24 kHz that make the floor at 16 kHz
    ref, cand = two_sets(spoken)
    cand[1] = Clip(cand[1].id, cand[1].text, spoken[: 2 * n - 10], SR, cand[1].group)
    scores = RecordingScores()
    out = evaluate.compare_sets(ListeningJudge({}), ref, cand, label="cand", voice_judge=scores)
    assert "clip s1#s0 (candidate), first half is too short for the SIM judge" in out.overall.format()
    with pytest.raises(audio.BadAudio, match=r"clip s1#s0 \(candidate\), first half is too short"):
        voice.sim_scores(scores, ref, cand)
    assert not scores.heard


def test_the_gate_s_quality_check_shows_the_refusal(pytester, spoken):
    """The gate runs `pytest tests_quality -m real_weights` in the candidate's env and reads the junit report
    (harness.gate.gate.check_quality): a real-checkpoint test that gates a candidate with a silent clip, as
    test_real_checkpoint.gate_candidate does, fails, and the gate's quality check says why in its details."""
    from harness.gate import gate

    np.save(pytester.path / "spoken.npy", spoken)
    pytester.makepyfile(test_candidate="""
        import numpy as np
        from harness.quality import corpus, evaluate

        def test_candidate():
            spoken = np.load("spoken.npy")
            def make(silent):
                def clips(sentences, seeds):
                    return [evaluate.Clip(f"{s.id}#s{k}", s.text, 0 * spoken if silent and s.id == sentences[5].id
                                          else spoken, 24000, s.id) for s in sentences for k in seeds]
                return clips
            class Judge:
                identity = "j"
                def transcribe(self, wav, sr):
                    return "words"
            out = evaluate.gate_on_holdout(Judge(), make(False), make(True), seeds=(0,), label="16-steps")
            assert out.passed, out.overall.format()
    """)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={junit}")  # in this process: this worktree's harness
    check = gate.rule_quality(gate.parse_junit(junit, result.ret))
    details = " ".join(check.details)
    assert check.status == "fail" and check.blocks, (check.summary, details)
    assert re.search(r"\[REFUSED\] 16-steps: bad audio: clip \S+#s0 \(candidate\) is silent \(peak 0, limit 0\.001\)",
                     details), details


def test_a_stream_with_a_bad_chunk_is_refused_naming_the_chunk(spoken):
    """The seam check (voice.seam_check, run on the real checkpoint's auto-voice streams) embeds every chunk: a silent
    or too short one is refused by its number before the encoder runs."""
    from harness.quality import audio, voice

    scores = RecordingScores()
    with pytest.raises(audio.BadAudio, match=r"chunk 2 of the stream is silent .*chunk 3 of the stream is too short"):
        voice.seam_check(scores, [spoken, np.zeros_like(spoken), spoken[:SR]], SR)
    assert not scores.heard
