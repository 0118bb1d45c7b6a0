"""Harness: paired seeds, disk caches, listening pack, audio sanity and the holdout guard (fake model/judge)."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from harness.quality import audio, cache, corpus, evaluate, wer

REPO = Path(__file__).resolve().parents[1]


class FakeModel:
    """Stands in for OmniVoice: audio drawn from torch's global RNG, so reseeding decides the output."""

    sampling_rate = 24000

    def __init__(self):
        self.calls = []
        self.config = types.SimpleNamespace(_name_or_path="fake-checkpoint")

    def generate(self, text, language, voice_clone_prompt=None, **kwargs):
        self.calls.append(dict(text=text, language=language, **kwargs))
        n = int(0.3 * self.sampling_rate * len(text.split()))  # ~3.3 words/s
        return [(0.1 * torch.randn(n)).numpy()]


class FakeJudge:
    def __init__(self, identity="fake-judge"):
        self.identity = identity
        self.calls = 0

    def transcribe(self, wav, sr):
        self.calls += 1
        return f"len {wav.size}"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(evaluate.CACHE_ENV, str(tmp_path / "cache"))  # monkeypatch restores it


SENTENCES = [corpus.Item("s1", "red green blue yellow black white"), corpus.Item("s2", "apple pear plum fig lime")]


def test_cache_dir_follows_env(tmp_path):
    assert cache.cache_dir("audio") == tmp_path / "cache" / "audio"
    assert (tmp_path / "cache" / "audio").is_dir()


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "x.json"

    def broken(tmp):
        tmp.write_text("{half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cache.atomic_write(target, broken)
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    cache.atomic_write(target, lambda tmp: tmp.write_text('{"ok": 1}'))
    assert json.loads(target.read_text()) == {"ok": 1} and list(tmp_path.iterdir()) == [target]


def test_generate_set_is_paired_across_configs_and_reseeds_before_each_generate():
    model = FakeModel()
    a = evaluate.generate_set(model, SENTENCES, {"num_step": 32}, checkpoint_id="ck")
    b = evaluate.generate_set(model, SENTENCES, {"num_step": 16}, checkpoint_id="ck")
    assert [c.seed for c in a] == [c.seed for c in b] == [evaluate.sentence_seed(s.id, 0) for s in SENTENCES]
    assert a[0].seed != a[1].seed
    # same seed, same fake RNG draw: a config that the fake ignores gives identical audio, sentence by sentence
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.wav, y.wav)
    assert [c["num_step"] for c in model.calls] == [32, 32, 16, 16]
    assert all(c["language"] == "en" for c in model.calls)


def test_generate_set_caches_on_disk_by_checkpoint_config_seed_and_text():
    model = FakeModel()
    first = evaluate.generate_set(model, SENTENCES, {"num_step": 32, "tag": "lossless"}, checkpoint_id="ck")
    assert "tag" not in model.calls[0], "the cache tag must not reach model.generate"
    again = evaluate.generate_set(model, SENTENCES, {"num_step": 32, "tag": "lossless"}, checkpoint_id="ck")
    assert len(model.calls) == 2, f"cache miss: {len(model.calls)} generate calls"
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x.wav, y.wav)
    evaluate.generate_set(model, SENTENCES, {"num_step": 32, "tag": "stock"}, checkpoint_id="ck")
    evaluate.generate_set(model, SENTENCES, {"num_step": 32, "tag": "lossless"}, checkpoint_id="other")
    evaluate.generate_set(model, SENTENCES, {"num_step": 32, "tag": "lossless"}, seeds=(1,), checkpoint_id="ck")
    assert len(model.calls) == 8, f"each key change must regenerate; got {len(model.calls)} calls"


@pytest.mark.parametrize("part", ["patch", "patch setting", "synthesize", "fastpath source", "omnivoice source",
                                  "omnivoice version", "torch", "transformers", "dtype", "weights", "checkpoint"])
def test_audio_cache_key_changes_with_everything_that_decides_the_audio(model, part):
    """Each part alone makes a new entry (the old key named only checkpoint id, version, config, seed, text and
    prompt: after a change to a lossy patch the tier scored the old audio)."""

    def key():
        return evaluate.audio_key(model, {"num_step": 2}, 7, "red green", checkpoint_id="ck")

    original = before = key()
    assert key() == before, "the key is not stable"
    with pytest.MonkeyPatch.context() as monkeypatch:
        changed_key(model, part, key, before, monkeypatch)
    assert key() == original, "the model was not put back as it was"


def changed_key(model, part, key, before, monkeypatch):
    """Change `part` alone, check the key moved, put the model back."""
    import fastpath
    from fastpath import loop
    from harness.run import machine

    restore = []
    if part == "patch":
        fastpath.apply(model, "sliced_heads")
        restore.append(lambda: fastpath.revert(model))
    elif part == "patch setting":
        fastpath.apply(model, "prefix_kv_cache")
        restore.append(lambda: fastpath.revert(model))
        before = key()
        loop.set_prefix_refresh(model, 4)
    elif part == "synthesize":
        after = evaluate.audio_key(model, {"num_step": 2}, 7, "red green", checkpoint_id="ck",
                                   synthesize=lambda **kw: None)
        assert after != before
        return
    elif part in ("fastpath source", "omnivoice source"):
        real = evaluate.tree_digest
        target = "fastpath" if part == "fastpath source" else "omnivoice"
        monkeypatch.setattr(evaluate, "tree_digest", lambda folder, *rest: "edited" if Path(folder).name == target
                            else real(folder, *rest))
    elif part in ("omnivoice version", "transformers"):
        name = "omnivoice" if part == "omnivoice version" else "transformers"
        real_version = machine.package_version
        monkeypatch.setattr(machine, "package_version", lambda n: "0+local" if n == name else real_version(n))
    elif part == "torch":
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    elif part == "dtype":
        model.to(torch.float64)
        restore.append(lambda: model.to(torch.float32))
    elif part == "weights":
        weight = model.audio_heads.weight
        saved = weight.detach()[0, 0].clone()
        with torch.no_grad():
            weight[0, 0] += 1.0
        restore.append(lambda: weight.data[0, 0].copy_(saved))
    elif part == "checkpoint":
        assert evaluate.audio_key(model, {"num_step": 2}, 7, "red green", checkpoint_id="other") != before
        return
    try:
        assert key() != before, f"{part} changed and the audio key did not"
    finally:
        for undo in restore:
            undo()


def test_generate_set_with_several_seeds_groups_by_sentence():
    clips = evaluate.generate_set(FakeModel(), SENTENCES, {}, seeds=(0, 1), checkpoint_id="ck")
    assert [c.id for c in clips] == ["s1#s0", "s2#s0", "s1#s1", "s2#s1"]
    assert [c.group for c in clips] == ["s1", "s2", "s1", "s2"]


def test_transcribe_set_caches_by_audio_and_judge_identity():
    clips = evaluate.generate_set(FakeModel(), SENTENCES, {}, checkpoint_id="ck")
    j = FakeJudge()
    first = evaluate.transcribe_set(j, clips)
    assert evaluate.transcribe_set(j, clips) == first and j.calls == 2, j.calls
    other = FakeJudge("another-judge")
    evaluate.transcribe_set(other, clips)
    assert other.calls == 2, "a different judge identity must not reuse transcripts"
    records = [json.loads(p.read_text()) for p in evaluate.cache_dir("transcripts").glob("*.json")]
    assert {r["judge"] for r in records} == {"fake-judge", "another-judge"}


def test_listening_pack_lists_worst_sentences_first(tmp_path):
    clips = evaluate.generate_set(FakeModel(), SENTENCES, {}, checkpoint_id="ck")
    refs = [c.text for c in clips]
    ref_hyps = refs
    cand_hyps = ["red green blue", "apple pear plum fig"]  # s1 loses 3 words, s2 loses 1
    rs = wer.score_set([c.id for c in clips], refs, ref_hyps, "j")
    cs = wer.score_set([c.id for c in clips], refs, cand_hyps, "j")
    index = evaluate.write_listening_pack(tmp_path / "pack", clips, clips, ref_hyps, cand_hyps, rs, cs)
    text = index.read_text()
    assert text.index("| 1 | s1 | 0 -> 3") < text.index("| 2 | s2 | 0 -> 1"), text
    assert "| red green blue |" in text and SENTENCES[0].text in text
    wavs = sorted(p.name for p in index.parent.glob("*.wav"))
    assert wavs == ["01_s1_cand.wav", "01_s1_ref.wav", "02_s2_cand.wav", "02_s2_ref.wav"], wavs
    assert sf.info(index.parent / wavs[0]).samplerate == FakeModel.sampling_rate


class TextJudge(FakeJudge):
    """Hears a clip's sentence, or nothing for the clips in `deaf` (by audio digest)."""

    def __init__(self, texts, deaf=()):
        super().__init__("text-judge")
        self.texts, self.deaf = texts, set(deaf)

    def transcribe(self, wav, sr):
        key = evaluate.Clip("x", "", wav, sr, "x").sha256
        return "" if key in self.deaf else self.texts[wav.size]


def test_compare_sets_writes_a_pack_only_when_the_gate_fails(tmp_path):
    clips = evaluate.generate_set(FakeModel(), SENTENCES, {}, checkpoint_id="ck")
    same = evaluate.compare_sets(FakeJudge(), clips, clips, pack_dir=tmp_path / "pack")
    assert same.verdict.passed and same.pack is None, same.verdict.format()
    louder = [evaluate.Clip(c.id, c.text, c.wav * 2, c.sr, c.group) for c in clips]
    judge = TextJudge({c.wav.size: c.text for c in clips}, deaf=[c.sha256 for c in louder])
    worse = evaluate.compare_sets(judge, clips, louder, margin_points=1.0, pack_dir=tmp_path / "pack")
    assert not worse.verdict.passed and worse.pack is not None and worse.pack.is_file(), worse.verdict.format()


class TestCheckAudio:
    SR = 24000
    TEXT = "one two three four five six seven eight nine"  # 9 words -> 3.3 s expected at 2.7 words/s

    def speech_like(self, seconds=3.3, amp=0.1):
        t = np.arange(int(seconds * self.SR)) / self.SR
        return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

    def test_clean_clip_has_no_problems(self):
        assert audio.check_clip(self.speech_like(), self.SR, ("WER", "SIM", "MOS")) is None
        assert audio.check_duration(self.speech_like(), self.SR, self.TEXT) is None

    @pytest.mark.parametrize(
        "edit, problem",
        [
            (lambda w: np.where(np.arange(w.size) == 5, np.nan, w), "non-finite (1 of 79200"),
            (lambda w: w * 1e-5, "silent (peak 1e-06"),
            (lambda w: np.clip(w * 30, -1, 1), "clipped ("),
            (lambda w: w[:0], "empty (0 samples"),
            (lambda w: w[:100], "too short for the SIM judge (67 samples at 16 kHz, limit 19200"),
        ],
    )
    def test_each_problem_is_reported(self, edit, problem):
        found = audio.check_clip(edit(self.speech_like()), self.SR, ("WER", "SIM", "MOS"), "clip c")
        assert found is not None and found.format().startswith(f"clip c is {problem}"), found

    @pytest.mark.parametrize("edit", [lambda w: w[: w.size // 4], lambda w: np.tile(w, 4)])
    def test_a_cut_or_run_on_clip_has_an_implausible_duration(self, edit):
        found = audio.check_duration(edit(self.speech_like()), self.SR, self.TEXT, name="clip c")
        assert found is not None and "clip c is of implausible duration for 9 words" in found.format(), found


def test_corpus_sets_are_big_enough_and_separate():
    dev, longform = corpus.load_corpus("dev"), corpus.load_corpus("longform")
    holdout = corpus.read_holdout_for_gate()
    assert len(dev) >= 48 and len(holdout) >= 48, (len(dev), len(holdout))
    assert len(holdout) == corpus.HOLDOUT_SENTENCES, "the simulated sizes (test_operating.py) assume this count"
    assert not {i.text for i in dev} & {i.text for i in holdout}, "dev and holdout share a sentence"
    for item in dev + holdout:
        assert 6 <= len(item.text.split()) <= 20, item
    for item in longform:  # > 30 s at a brisk 3 words/s, so OmniVoice chunks it
        assert len(item.text.split()) / 3.0 > 30, (item.id, len(item.text.split()))


def test_load_corpus_refuses_the_holdout():
    with pytest.raises(corpus.HoldoutAccess, match="gate_on_holdout"):
        corpus.load_corpus("holdout")


def test_only_the_gate_reads_the_holdout():
    """Static check over the package and every tier: the holdout reader is called from gate_on_holdout only."""
    callers = []
    files = [p for d in ("fastpath", "harness", "tests_parity", "tests_speed", "tests_quality", "scripts")
             for p in (REPO / d).rglob("*.py")]
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                literal_args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if name == "read_holdout_for_gate" or (name == "_read" and "holdout" in literal_args):
                    callers.append(f"{path.relative_to(REPO)}::{fn.name}")
    allowed = {"harness/quality/evaluate.py::gate_on_holdout",
               "harness/quality/corpus.py::read_holdout_for_gate",
               "tests_quality/test_evaluate.py::test_corpus_sets_are_big_enough_and_separate",
               "tests_quality/test_evaluate.py::test_gate_on_holdout_reads_the_holdout"}
    assert set(callers) <= allowed, f"holdout read outside the gate: {sorted(set(callers) - allowed)}"
    assert "harness/quality/evaluate.py::gate_on_holdout" in callers


def test_gate_on_holdout_reads_the_holdout():
    model = FakeModel()

    def make(sentences, seeds):
        return evaluate.generate_set(model, sentences, {}, seeds, checkpoint_id="ck")

    out = evaluate.gate_on_holdout(FakeJudge(), make, make, seeds=(0, 1), label="fake")
    assert out.verdict.n_sentences == len(corpus.read_holdout_for_gate()) >= 48
    assert out.verdict.seeds == 2 and out.verdict.n_clips == 2 * out.verdict.n_sentences
    assert {c["text"] for c in model.calls} == {i.text for i in corpus.read_holdout_for_gate()}


def test_generate_set_on_real_omnivoice_is_reproducible(model, tmp_path, monkeypatch):
    """Through the real OmniVoice.generate (root conftest's built test checkpoint on CPU): the per-sentence
    reseed makes a fresh generation equal the cached one, sample for sample."""
    items = corpus.load_corpus("dev")[:1]
    first = evaluate.generate_set(model, items, {"num_step": 2}, checkpoint_id="built-test-checkpoint")
    assert first[0].sr == model.sampling_rate and first[0].wav.ndim == 1 and first[0].wav.size > 0
    monkeypatch.setenv(evaluate.CACHE_ENV, str(tmp_path / "fresh-cache"))  # force a second real generate
    torch.manual_seed(999)  # a different global RNG state must not matter
    again = evaluate.generate_set(model, items, {"num_step": 2}, checkpoint_id="built-test-checkpoint")
    np.testing.assert_array_equal(first[0].wav, again[0].wav)


def test_generate_set_can_synthesize_with_the_stream(model):
    """The streaming candidate's path (test_real_checkpoint.test_streaming) on the tiny checkpoint: `synthesize`
    replaces generate, reseeded the same way; with a voice prompt the concatenated stream is upstream's chunked
    generate of the paragraph, bit for bit."""
    import fastpath
    from harness.model.points import reference

    prompt = model.create_voice_clone_prompt(*reference("ref_3s"))
    paragraph = [corpus.Item("p1", "The first sentence is short. The second one is a little longer. A third ends it.")]
    config = {"num_step": 4, "postprocess_output": False, "audio_chunk_duration": 2.0}

    def streamed(**kwargs):
        return np.concatenate(list(fastpath.stream(model, **kwargs)))

    stream = evaluate.generate_set(model, paragraph, {**config, "tag": "stream"}, voice_prompt=prompt,
                                   checkpoint_id="ck", synthesize=streamed)
    chunked = evaluate.generate_set(model, paragraph, {**config, "audio_chunk_threshold": 0}, voice_prompt=prompt,
                                    checkpoint_id="ck")
    np.testing.assert_array_equal(stream[0].wav, chunked[0].wav)


# --- bad audio, the refusal, and the verdicts decided from the judges' figures ------------------------------------


def tone(seconds, sr=16000, amp=0.1):
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_a_clip_with_no_name_given_is_the_clip():
    assert audio.check_clip(np.zeros(0, np.float32), 16000).format() == "the clip is empty (0 samples, limit 1)"
    assert audio.check_clip(np.full(400, 1e-3), 16000) is None  # a peak of exactly SILENT_PEAK is not silent


def test_bad_audio_names_each_side_each_judges_floor_and_the_prompt_sim_would_embed():
    """WER's floor on each clip of each side, named with its side; then what SIM would embed (the prompt's audio),
    leaving out the clips already named."""
    ref = [evaluate.Clip("a", "x", tone(3.0), 16000, "a"), evaluate.Clip("b", "x", tone(300 / 16000), 16000, "b")]
    cand = [evaluate.Clip("a", "x", tone(3.0, amp=1e-5), 16000, "a"), evaluate.Clip("b", "x", tone(3.0), 16000, "b")]
    problems = evaluate.bad_audio(ref, cand, sim=True, mos=True, prompt=(tone(1.0), 16000))
    assert [p.format() for p in problems] == [
        "clip b (reference) is too short for the WER judge (300 samples at 16 kHz, limit 400: Whisper's STFT window)",
        "clip a (candidate) is silent (peak 1e-05, limit 0.001)",
        "the voice prompt's audio is too short for the SIM judge (16000 samples at 16 kHz, limit 19200: 0.75 of "
        "GE2E's 1.6 s partial utterance)"]
    assert evaluate.bad_audio(ref[:1], ref[:1]) == []  # WER alone, clean clips: nothing
    assert evaluate.bad_audio(ref[:1], ref[:1], sim=True, prompt=(tone(1.0), 16000))[0].judge == "SIM"


def test_a_comparison_with_bad_audio_is_refused_before_any_judge_runs():
    clips = [evaluate.Clip(f"s{i}", "x", tone(3.0), 16000, f"s{i}") for i in range(3)]
    judge = FakeJudge()
    out = evaluate.compare_sets(judge, clips, clips, label="short prompt", voice_judge=types.SimpleNamespace(),
                                prompt=(tone(1.0), 16000))
    assert isinstance(out.verdict, audio.Refused) and out.overall is out.verdict and not out.passed
    assert (out.ref, out.cand, out.pack, out.scores, judge.calls) == (None, None, None, {}, 0)
    assert out.verdict.label == "short prompt"
    assert [p.name for p in out.verdict.problems] == ["the voice prompt's audio"]


def paired_clips(n_sentences=6, seeds=2):
    return [evaluate.Clip(f"s{i}#{k}", f"word{i} two three", tone(0.05), 16000, f"s{i}")
            for k in range(seeds) for i in range(n_sentences)]


def test_decide_gates_sim_alone_in_the_judges_unit_over_sentence_blocks(tmp_path):
    from harness.quality import stats

    clips = paired_clips()
    rng = np.random.default_rng(3)
    r = 0.8 + rng.normal(0, 0.01, len(clips))
    c = r - 0.1  # a voice that drifted: fails
    judge = types.SimpleNamespace(identity="wavlm-x", unit="WavLM cosine")
    out = evaluate.decide(None, clips, clips, {"SIM": (r, c)}, label="L", rerun="go {seeds}", voice_judge=judge,
                          sim_margin=0.05, pack_dir=tmp_path / "pack")
    want = stats.score_gate("SIM", "WavLM cosine", r, c, [x.group for x in clips], 0.05, "wavlm-x", "L", "go {seeds}")
    assert out.verdict is None and (out.ref, out.cand) == (None, None)
    assert out.overall.verdicts == (want,) and out.overall.label == "L" and want.verdict == "fail"
    assert out.pack == tmp_path / "pack" / "index.md" and out.pack.is_file()
    np.testing.assert_array_equal(out.scores["SIM"][1], c)
    no_unit = evaluate.decide(None, clips, clips, {"SIM": (r, r)}, voice_judge=types.SimpleNamespace(identity="g"))
    assert no_unit.overall.verdicts[0].unit == "GE2E cosine" and no_unit.overall.verdicts[0].margin == 0.02
    assert no_unit.pack is None


def test_decide_gates_each_field_of_the_mos_judge_at_the_mos_margin():
    from harness.quality import stats

    clips = paired_clips()
    rng = np.random.default_rng(4)
    x, y = 3 + rng.normal(0, 0.05, len(clips)), 4 + rng.normal(0, 0.05, len(clips))
    judge = types.SimpleNamespace(identity="utmos", fields=(("MOS-X", "x", "unit X"), ("MOS-Y", "y", "unit Y")))
    out = evaluate.decide(None, clips, clips, {"MOS-X": (x, x + 0.01), "MOS-Y": (y, y)}, mos_judge=judge,
                          mos_margin=0.3, label="L", rerun="go {seeds}")
    groups = [c.group for c in clips]
    assert out.overall.verdicts == (
        stats.score_gate("MOS-X", "unit X", x, x + 0.01, groups, 0.3, "utmos", "L", "go {seeds}"),
        stats.score_gate("MOS-Y", "unit Y", y, y, groups, 0.3, "utmos", "L", "go {seeds}"))
    assert all(v.rerun.startswith("go ") and v.label == "L" for v in out.overall.verdicts), out.overall.format()
    default = evaluate.decide(None, clips, clips, {"MOS-X": (x, x), "MOS-Y": (y, y)}, mos_judge=judge)
    assert [v.margin for v in default.overall.verdicts] == [0.1, 0.1]


def test_decide_keeps_whole_number_scores_as_float_arrays_on_both_sides():
    """A judge may give whole-number ratings (1-5): the scores kept for the comparison are floats on both sides."""
    clips = paired_clips()
    judge = types.SimpleNamespace(identity="rater", fields=(("MOS-X", "x", "unit X"),))
    ratings = [3, 4] * 6
    out = evaluate.decide(None, clips, clips, {"MOS-X": (ratings, ratings)}, mos_judge=judge)
    assert [side.dtype for side in out.scores["MOS-X"]] == [np.float64, np.float64]
    assert out.overall.verdicts[0].verdict == "pass"


def test_compare_sets_gates_sim_and_mos_at_the_margins_it_is_given(monkeypatch):
    clips = [evaluate.Clip(f"s{i}#{k}", "one two three four five", tone(3.0), 16000, f"s{i}")
             for k in range(2) for i in range(6)]  # clean for every judge
    rng = np.random.default_rng(5)
    r, m = 0.8 + rng.normal(0, 0.01, len(clips)), 3 + rng.normal(0, 0.05, len(clips))
    figures = {"SIM": (r, r - 0.03), "MOS-X": (m, m - 0.2)}  # within the margins given, past the default ones
    monkeypatch.setattr(evaluate, "judge_figures", lambda *args: figures)
    voice_judge = types.SimpleNamespace(identity="g")
    mos_judge = types.SimpleNamespace(identity="utmos", fields=(("MOS-X", "x", "unit X"),))
    out = evaluate.compare_sets(None, clips, clips, voice_judge=voice_judge, mos_judge=mos_judge, sim_margin=0.05,
                                mos_margin=0.3)
    assert [(v.metric, v.margin, v.verdict) for v in out.overall.verdicts] == [
        ("SIM", 0.05, "pass"), ("MOS-X", 0.3, "pass")], out.overall.format()
    default = evaluate.compare_sets(None, clips, clips, voice_judge=voice_judge, mos_judge=mos_judge)
    assert [(v.margin, v.verdict) for v in default.overall.verdicts] == [
        (evaluate.SIM_MARGIN, "fail"), (evaluate.MOS_MARGIN, "fail")], default.overall.format()


def test_decide_puts_wer_first_in_one_verdict_with_sim_and_alone_has_no_overall():
    from harness.quality import stats

    clips = paired_clips()
    texts = [c.text for c in clips]
    hyps = (texts, texts[:-1] + ["word5"])
    judge = FakeJudge("whisper-x")
    alone = evaluate.decide(judge, clips, clips, {"hyps": hyps}, margin_points=2.0, label="L")
    ref = wer.score_set([c.id for c in clips], texts, hyps[0], "whisper-x", groups=[c.group for c in clips])
    cand = wer.score_set([c.id for c in clips], texts, hyps[1], "whisper-x", groups=[c.group for c in clips])
    assert alone.overall is None and alone.verdict == stats.gate(ref, cand, margin_points=2.0, label="L")
    both = evaluate.decide(judge, clips, clips, {"hyps": hyps, "SIM": (np.ones(12), np.ones(12))},
                           voice_judge=types.SimpleNamespace(identity="g"))
    assert [getattr(v, "metric", "WER") for v in both.overall.verdicts] == ["WER", "SIM"]
    assert both.overall.verdicts[0] is both.verdict and both.ref.judge == "whisper-x"


def test_compare_sets_without_a_label_or_rerun_shows_neither():
    clips = evaluate.generate_set(FakeModel(), SENTENCES, {}, checkpoint_id="ck")
    out = evaluate.compare_sets(FakeJudge(), clips, clips)
    assert (out.verdict.label, out.verdict.rerun, out.pack, out.overall) == ("", "", None, None)
    again = evaluate.compare_sets(FakeJudge(), clips, clips, label="L", rerun="again {seeds}")
    assert (again.verdict.label, again.verdict.rerun) == ("L", f"again {again.verdict.seeds_needed}")
    short = [evaluate.Clip(c.id, c.text, c.wav[:10], c.sr, c.group) for c in clips]
    refused = evaluate.compare_sets(FakeJudge(), clips, short)
    assert refused.verdict.format().startswith("[REFUSED] candidate: bad audio: clip s1 (candidate) is too short")


# --- audio's checks on their own (harness.quality.audio) -----------------------------------------------------------

@pytest.mark.parametrize("n, sr, at_16k", [(16000, 16000, 16000), (24000, 24000, 16000), (44100, 44100, 16000),
                                          (100, 24000, 67), (1, 24000, 1), (5, 48000, 2), (7, 22050, 6),
                                          (3, 8000, 6)])
def test_a_clips_length_at_the_judges_rate_is_rounded_up(n, sr, at_16k):
    assert audio.judge_samples(n, sr) == at_16k == audio.to_judge_rate(np.zeros(n, np.float32), sr).size


def test_judges_are_named_one_several_or_none_and_an_unknown_one_is_refused():
    assert audio._judges(None) == () and audio._judges("SIM") == ("SIM",)
    assert audio._judges(["WER", "MOS"]) == ("WER", "MOS")
    with pytest.raises(ValueError) as err:
        audio._judges(("WER", "PESQ", "X"))
    assert str(err.value) == "unknown judge 'PESQ': choose among ('WER', 'SIM', 'MOS')"


@pytest.mark.parametrize("wave, judge, says", [
    (np.zeros((2, 3), np.float32), None, "not mono (shape (2, 3), limit one dimension [T])"),
    (np.zeros(0, np.float32), ("WER", "SIM"), "empty (0 samples, limit 19200)"),
    (np.zeros(0, np.float32), "MOS", "empty (0 samples, limit 321)"),
    (np.array([0.1, np.nan, np.inf, 0.2, -np.inf], np.float32), None, "non-finite (3 of 5 samples NaN or inf, "
                                                                      "limit 0)"),
    (np.full(350, 0.1, np.float32), ("MOS", "WER"), "too short for the WER judge (350 samples at 16 kHz, limit 400: "
                                                    "Whisper's STFT window)"),
    (np.full(320, 0.1, np.float32), ("WER", "MOS"), "too short for the WER judge (320 samples at 16 kHz, limit 400: "
                                                    "Whisper's STFT window)"),
    (np.full(320, 0.1, np.float32), "MOS", "too short for the MOS judge (320 samples at 16 kHz, limit 321: "
                                           "DNSMOS's mel frame)"),
    (np.full(19199, 0.1, np.float32), "SIM", "too short for the SIM judge (19199 samples at 16 kHz, limit 19200: "
                                             "0.75 of GE2E's 1.6 s partial utterance)"),
    (np.full(400, 0.000999), None, "silent (peak 0.000999, limit 0.001)"),
    (np.r_[np.full(2, 0.999), np.full(998, 0.5)], None, "clipped (0.20% of samples at |x| >= 0.999, limit 0.1%)"),
    (np.r_[np.full(2, -1.5), np.full(998, 0.5)], None, "clipped (0.20% of samples at |x| >= 0.999, limit 0.1%)"),
], ids=["not-mono", "empty-strictest", "empty-mos", "non-finite", "short-wer", "short-strictest-first", "short-mos",
        "short-sim", "silent", "clipped", "beyond-full-scale"])
def test_each_defect_names_the_clip_its_measure_and_its_limit(wave, judge, says):
    found = audio.check_clip(wave, 16000, judge, "clip c")
    assert found is not None and found.format() == f"clip c is {says}", found


@pytest.mark.parametrize("wave, judge", [
    (np.full(400, 0.1, np.float32), ("WER", "MOS")),  # exactly WER's floor
    (np.full(19200, 0.1, np.float32), "SIM"),
    (np.full(10, 0.1, np.float32), None),  # no judge: no floor
    (np.r_[np.full(1, 0.999), np.full(999, 0.5)], None),  # exactly 0.1% at full scale
    (np.r_[np.full(5, 0.9989), np.full(995, 0.5)], None),  # below the clip level
])
def test_a_clip_at_each_limit_is_heard(wave, judge):
    assert audio.check_clip(wave, 16000, judge) is None


def test_each_bad_clip_is_named_with_its_side_and_refused_in_one_error():
    good, bad = tone(1.0), np.zeros(100, np.float32)
    clips = [evaluate.Clip(f"c{i}", "x", wav, 16000, "g") for i, wav in enumerate([good, bad, good, bad])]
    assert [p.name for p in audio.check_clips(clips, "WER", "candidate")] == ["clip c1 (candidate)",
                                                                             "clip c3 (candidate)"]
    found = audio.check_clips(clips, None)
    assert [p.format() for p in found] == ["clip c1 is silent (peak 0, limit 0.001)",
                                           "clip c3 is silent (peak 0, limit 0.001)"]
    assert audio.refuse([]) is None and audio.require(good, 16000, "WER") is None
    with pytest.raises(audio.BadAudio) as err:
        audio.refuse(found)
    assert str(err.value) == ("refused: bad audio: clip c1 is silent (peak 0, limit 0.001); clip c3 is silent (peak 0, "
                              "limit 0.001)") and err.value.problems == tuple(found)
    with pytest.raises(audio.BadAudio) as err:
        audio.refuse(found * 4)
    assert str(err.value).endswith("; clip c1 is silent (peak 0, limit 0.001); and 3 more")
    with pytest.raises(audio.BadAudio) as err:
        audio.require(tone(0.02), 16000, "WER", "clip w")
    assert str(err.value) == ("refused: bad audio: clip w is too short for the WER judge (320 samples at 16 kHz, "
                              "limit 400: Whisper's STFT window)")
    with pytest.raises(audio.BadAudio, match=r"^refused: bad audio: the clip is too short for the SIM judge"):
        audio.require(tone(1.0), 16000, "SIM")


@pytest.mark.parametrize("samples, found", [
    (1334, None), (8333, None),  # 9 words at 2.7 words/s: 3.33 s expected, 1.33 s to 8.33 s allowed
    (1333, "the clip is of implausible duration for 9 words (1.33 s, limit 1.33-8.33 s)"),
    (8334, "the clip is of implausible duration for 9 words (8.33 s, limit 1.33-8.33 s)"),
])
def test_a_duration_is_plausible_within_its_factor_of_the_words_at_the_default_rate(samples, found):
    problem = audio.check_duration(np.zeros(samples, np.float32), 1000, TestCheckAudio.TEXT)
    assert (problem and problem.format()) == found


def test_a_duration_is_judged_at_the_rate_and_factor_given_its_ends_included():
    def check(samples):
        return audio.check_duration(np.zeros(samples, np.float32), 1000, "two words", words_per_second=2.0,
                                    duration_factor=2.0, name="clip d")

    assert check(500) is None and check(2000) is None  # 1 s expected: 0.5 s to 2 s
    assert check(499).format() == "clip d is of implausible duration for 2 words (0.50 s, limit 0.50-2.00 s)"
    assert check(2001) is not None and check(2001).measured == "2.00 s"
