"""Real-checkpoint quality: speedup configs vs stock through the three gates (GPU, real weights): WER (the words),
SIM (the voice: GE2E cosine to the voice prompt's audio) and MOS (DNSMOS OVRL and P.808); a candidate passes only
when all three pass.

Stock is 32 sampling steps with a ~10 s voice prompt. Candidates: 16, 12 and 10 steps; a ~3 s voice prompt;
the lossless patch stack; the lossless stack + prefix_kv_cache (lossy) at refresh intervals 2 and 4; streaming
(fastpath.stream, its pieces concatenated, against one whole-text generate call of the same multi-sentence texts).

Dev and holdout: the pilot runs stock on the dev set (4 seeds a sentence) and sizes the runs (stats.seeds_needed);
every decision is taken on the holdout set (evaluate.gate_on_holdout), each sentence at --quality-seeds seeds
(default evaluate.HOLDOUT_SEEDS), the seeds of a sentence one resampling block. A non-passing verdict leaves a
listening pack under <cache>/packs/<name>/; an underpowered one names the seeds it needs and the command.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.quality import audio, corpus, evaluate, stats

pytestmark = [pytest.mark.real_weights, pytest.mark.cuda, pytest.mark.quality]

STOCK = {"num_step": 32}
PILOT_SEEDS = 4
RERUN = "pytest tests_quality/test_real_checkpoint.py --checkpoint PATH --quality-seeds {seeds}"

# Voice prompts are made by the model itself (fixed seed), so no audio file has to ship with the suite.
LONG_PROMPT_TEXT = ("The morning train was quiet, so she read the paper and watched the fields go by "
                    "until the city came into view.")  # ~10 s
SHORT_PROMPT_TEXT = "Good morning, thank you for coming."  # ~3 s
PARAGRAPH = 3  # holdout sentences joined into one streamed text: about three chunks, two joins, per text


@pytest.fixture(scope="module")
def real_model(request):
    import torch

    try:
        ckpt = request.getfixturevalue("real_checkpoint")  # root conftest: skips, saying how to provide one
    except pytest.FixtureLookupError:
        pytest.skip("no real_checkpoint fixture: run from the repo root so conftest.py is loaded")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: torch.cuda.is_available() is False")
    from harness.model.checkpoint import load_model

    return load_model(ckpt, device="cuda"), ckpt.identity


@pytest.fixture(scope="module")
def seeds(request) -> tuple:
    return tuple(range(request.config.getoption("quality_seeds") or evaluate.HOLDOUT_SEEDS))


def voice_prompt(model, text: str, like=None):
    """(voice prompt, its audio (wav, sr)): the model's own render of `text` (seed 0), in auto voice or, with
    `like`, in that prompt's voice (so a shorter prompt is the same speaker)."""
    import torch

    torch.manual_seed(0)
    wav = model.generate(text=text, language="en", num_step=32, voice_clone_prompt=like)[0]
    prompt = model.create_voice_clone_prompt((torch.from_numpy(wav).unsqueeze(0), model.sampling_rate), text)
    return prompt, (wav, model.sampling_rate)


@pytest.fixture(scope="module")
def stock(real_model):
    """(voice prompt, maker of stock sets, the prompt's audio): (sentences, seeds) -> clips, cached on disk."""
    model, identity = real_model
    prompt, prompt_audio = voice_prompt(model, LONG_PROMPT_TEXT)

    def make(sentences, seeds):
        return evaluate.generate_set(model, sentences, {**STOCK, "tag": "stock"}, seeds, voice_prompt=prompt,
                                     checkpoint_id=identity)

    return prompt, make, prompt_audio


@pytest.fixture(scope="module")
def judges(voice_judge, mos_judge):
    return {"voice_judge": voice_judge, "mos_judge": mos_judge}


def test_pilot_on_dev_sizes_the_holdout_runs(judge, judges, stock, seeds, wer_margin):
    """Stock on dev (4 seeds a sentence): the spread of each metric across seeds (WER; SIM to the prompt's audio; MOS
    OVRL and P808) says how many seeds a holdout run needs for an equivalent candidate to pass 80% of the time at its
    margin; fewer than the most any metric needs fails here, naming N."""
    from harness.quality import mos

    _, make, prompt_audio = stock
    dev = corpus.load_corpus("dev")
    clips = make(dev, range(PILOT_SEEDS))
    audio.refuse(evaluate.bad_audio(clips, clips, sim=True, mos=True, prompt=prompt_audio))  # by name, as the gate does
    scored, _ = evaluate.score_clips(judge, clips)
    scale = (len(dev) / corpus.HOLDOUT_SENTENCES) ** 0.5  # the same spread over the holdout's sentences
    se, k = stats.equivalent_se(scored.errors, scored.words, scored.groups)
    needs = {"WER": stats.seeds_needed(se * scale, k, stats.margin_fraction(wer_margin), corpus.HOLDOUT_SENTENCES)}
    groups = [c.group for c in clips]
    sim = [judges["voice_judge"].similarity((c.wav, c.sr), prompt_audio) for c in clips]
    per_score = {"SIM": (sim, stats.SIM_MARGIN)}
    for name, field, _ in stats.MOS_FIELDS:
        per_score[name] = (mos.mos_scores(judges["mos_judge"], clips, field), stats.MOS_MARGIN)
    for name, (values, margin) in per_score.items():
        se_s, k_s = stats.equivalent_se(-np.asarray(values), np.ones(len(values)), groups)
        needs[name] = stats.seeds_needed(se_s * scale, k_s, margin, corpus.HOLDOUT_SENTENCES) if se_s > 0 else 1
    needed = max(needs.values())
    print(f"\npilot on dev: stock WER {100 * scored.wer:.2f}%, SIM {np.mean(sim):.3f}; seeds a holdout sentence "
          f"needs: {needs} (this run: {len(seeds)})")
    assert len(seeds) >= needed, f"underpowered: need {needed} seeds per sentence: {RERUN.format(seeds=needed)}"


def gate_candidate(judge, judges, real_model, stock, seeds, name, margin_points, config, patches=(), refresh=None,
                   prompt=None):
    """Gate a candidate (generate kwargs `config`, with `patches` applied while it generates) against stock on the
    holdout by WER, SIM (to the stock prompt's audio: the voice asked for) and MOS; asserts a pass of all three,
    printing the verdict."""
    import fastpath
    from fastpath import loop

    model, identity = real_model
    stock_prompt, make_stock, stock_audio = stock

    def make_candidate(sentences, seeds_):
        fastpath.apply(model, list(patches))
        try:  # the model is shared by the module: always revert
            if refresh is not None:
                loop.set_prefix_refresh(model, refresh)
            clips = evaluate.generate_set(model, sentences, {**config, "tag": name}, seeds_,
                                          voice_prompt=prompt or stock_prompt, checkpoint_id=identity)
        finally:
            fastpath.revert(model)
        made.extend(clips)
        return clips

    made = []
    out = evaluate.gate_on_holdout(judge, make_stock, make_candidate, seeds=seeds, margin_points=margin_points,
                                   label=name, pack_dir=evaluate.cache_dir("packs") / name, rerun=RERUN,
                                   prompt=stock_audio, **judges)
    text = out.overall.format()  # bad audio on either side: "[REFUSED] name: bad audio: clip ..." (no judge ran)
    print("\n" + text)
    assert out.overall.passed, f"{text}\nlistening pack: {out.pack}"
    cut = [p.format() for c in made if (p := audio.check_duration(c.wav, c.sr, c.text, name=f"clip {c.id}"))]
    assert not cut, f"{name}: {len(cut)} clip(s) cut short or run on: {cut[:5]}"


@pytest.mark.parametrize("steps", [16, 12, 10])
def test_fewer_steps(judge, judges, real_model, stock, seeds, wer_margin, steps):
    gate_candidate(judge, judges, real_model, stock, seeds, f"{steps}-steps", wer_margin, {"num_step": steps})


def test_three_second_reference(judge, judges, real_model, stock, seeds, wer_margin):
    """A ~3 s prompt of the same speaker (rendered in the stock prompt's voice); SIM is to the stock prompt's audio."""
    model, _ = real_model
    gate_candidate(judge, judges, real_model, stock, seeds, "3s-reference", wer_margin, STOCK,
                   prompt=voice_prompt(model, SHORT_PROMPT_TEXT, like=stock[0])[0])


def test_lossless_stack(judge, judges, real_model, stock, seeds, wer_margin):
    import fastpath

    gate_candidate(judge, judges, real_model, stock, seeds, "lossless", wer_margin, STOCK, patches=fastpath.LOSSLESS)


@pytest.mark.parametrize("refresh", [2, 4])
def test_prefix_kv_cache(judge, judges, real_model, stock, seeds, wer_margin, refresh):
    """The approximate prefix cache decides here: its token agreement on random weights (fastpath-suite prefix) says how much
    it changes, only a real checkpoint can say whether that is audible in WER."""
    import fastpath

    gate_candidate(judge, judges, real_model, stock, seeds, f"prefix-kv-r{refresh}", wer_margin, STOCK,
                   patches=list(fastpath.LOSSLESS) + ["prefix_kv_cache"], refresh=refresh)


def paragraphs(sentences) -> list:
    """Consecutive holdout sentences joined PARAGRAPH at a time (the text a stream splits into chunks again)."""
    groups = [sentences[i : i + PARAGRAPH] for i in range(0, len(sentences), PARAGRAPH)]
    return [corpus.Item("+".join(s.id for s in g), " ".join(s.text for s in g)) for g in groups]


def test_streaming(judge, judges, real_model, stock, seeds, wer_margin):
    """Streaming must not drop or repeat words at the chunk joins, nor change the voice or the sound: WER, SIM (to
    the prompt's audio) and MOS of the concatenated stream vs one whole-text generate call of the same paragraphs
    (each paragraph's seeds one resampling block)."""
    import fastpath

    model, identity = real_model
    prompt, _, prompt_audio = stock

    def streamed(**kwargs):
        return np.concatenate(list(fastpath.stream(model, **kwargs)))

    def maker(how):
        def make(sentences, seeds_):
            return evaluate.generate_set(model, paragraphs(sentences), {**STOCK, "tag": how}, seeds_,
                                         voice_prompt=prompt, checkpoint_id=identity,
                                         synthesize=streamed if how == "stream" else None)

        return make

    out = evaluate.gate_on_holdout(judge, maker("whole"), maker("stream"), seeds=seeds, margin_points=wer_margin,
                                   label="stream", pack_dir=evaluate.cache_dir("packs") / "stream", rerun=RERUN,
                                   prompt=prompt_audio, **judges)
    print("\n" + out.overall.format())
    assert out.overall.passed, f"{out.overall.format()}\nlistening pack: {out.pack}"


def test_a_stream_in_auto_voice_keeps_its_voice(voice_judge, real_model):
    """Auto voice (no prompt) can change the speaker between chunks (upstream issue 255): every seam of every
    stream of the dev paragraphs must keep SIM >= voice.SEAM_FLOOR between consecutive pieces."""
    import torch

    import fastpath
    from harness.quality import voice

    model, _ = real_model
    bad = []
    for i, item in enumerate(paragraphs(corpus.load_corpus("dev"))[:8]):
        torch.manual_seed(i)
        pieces = list(fastpath.stream(model, text=item.text, language="en", num_step=32))
        check = voice.seam_check(voice_judge, pieces, model.sampling_rate)
        print(f"\n{item.id}: {check.format()}")
        if len(pieces) > 1 and not check.passed:
            bad.append(f"{item.id}: {check.format()}")
    assert not bad, "\n".join(bad)
