"""Real-checkpoint quality: speedup configs vs stock through the gate on the dev set (GPU, real weights).

Stock is 32 sampling steps with a ~10 s voice prompt. Candidates: 16, 12 and 10 steps; a ~3 s voice prompt;
the lossless patch stack; the lossless stack + prefix_kv_cache (lossy) at refresh intervals 2 and 4. Each verdict is printed; a non-passing one leaves a listening pack under
<cache>/packs/<name>/.
"""

from __future__ import annotations

import pytest

from harness.quality import corpus, evaluate

pytestmark = [pytest.mark.real_weights, pytest.mark.cuda, pytest.mark.quality]

STOCK = {"num_step": 32}
# Voice prompts are made by the model itself (fixed seed), so no audio file has to ship with the suite.
LONG_PROMPT_TEXT = ("The morning train was quiet, so she read the paper and watched the fields go by "
                    "until the city came into view.")  # ~10 s
SHORT_PROMPT_TEXT = "Good morning, thank you for coming."  # ~3 s


@pytest.fixture(scope="module")
def real_model(request):
    import torch

    try:
        ckpt = request.getfixturevalue("real_checkpoint")  # root conftest: skips, saying how to provide one
    except pytest.FixtureLookupError:
        pytest.skip("no real_checkpoint fixture: run from the repo root so conftest.py is loaded")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: torch.cuda.is_available() is False")
    from harness.checkpoint import load_model

    return load_model(ckpt, device="cuda"), ckpt.identity


@pytest.fixture(scope="module")
def dev_sentences():
    return corpus.load_corpus("dev")


def voice_prompt(model, text: str):
    import torch

    torch.manual_seed(0)
    wav = model.generate(text=text, language="en", num_step=32)[0]
    return model.create_voice_clone_prompt((torch.from_numpy(wav).unsqueeze(0), model.sampling_rate), text)


@pytest.fixture(scope="module")
def stock_set(real_model, dev_sentences):
    model, identity = real_model
    prompt = voice_prompt(model, LONG_PROMPT_TEXT)
    clips = evaluate.generate_set(model, dev_sentences, STOCK, voice_prompt=prompt, checkpoint_id=identity)
    return prompt, clips


def gate_candidate(judge, stock_set, clips, name, margin):
    _, ref = stock_set
    problems = {c.id: p for c in clips if (p := evaluate.check_audio(c.wav, c.sr, c.text))}
    assert not problems, f"{name}: audio problems {problems}"
    out = evaluate.compare_sets(judge, ref, clips, margin=margin, label=name,
                               pack_dir=evaluate.cache_dir("packs") / name)
    text = out.verdict.format()
    print("\n" + text)
    assert out.verdict.passed, f"{text}\nlistening pack: {out.pack}"


@pytest.mark.parametrize("steps", [16, 12, 10])
def test_fewer_steps(judge, real_model, stock_set, dev_sentences, wer_margin, steps):
    model, identity = real_model
    prompt, _ = stock_set
    clips = evaluate.generate_set(model, dev_sentences, {"num_step": steps}, voice_prompt=prompt,
                                 checkpoint_id=identity)
    gate_candidate(judge, stock_set, clips, f"{steps}-steps", wer_margin)


def test_three_second_reference(judge, real_model, stock_set, dev_sentences, wer_margin):
    model, identity = real_model
    prompt = voice_prompt(model, SHORT_PROMPT_TEXT)
    clips = evaluate.generate_set(model, dev_sentences, STOCK, voice_prompt=prompt, checkpoint_id=identity)
    gate_candidate(judge, stock_set, clips, "3s-reference", wer_margin)


def test_lossless_stack(judge, real_model, stock_set, dev_sentences, wer_margin):
    import fastpath

    model, identity = real_model
    prompt, _ = stock_set
    fastpath.apply(model, fastpath.LOSSLESS)
    try:  # the model is shared by the module: always revert
        clips = evaluate.generate_set(model, dev_sentences, {**STOCK, "tag": "lossless"}, voice_prompt=prompt,
                                     checkpoint_id=identity)
    finally:
        fastpath.revert(model)
    gate_candidate(judge, stock_set, clips, "lossless", wer_margin)


@pytest.mark.parametrize("refresh", [2, 4])
def test_prefix_kv_cache(judge, real_model, stock_set, dev_sentences, wer_margin, refresh):
    """The approximate prefix cache decides here: its token agreement on random weights (README) says how much
    it changes, only a real checkpoint can say whether that is audible in WER."""
    import fastpath
    from fastpath import loop

    model, identity = real_model
    prompt, _ = stock_set
    fastpath.apply(model, list(fastpath.LOSSLESS) + ["prefix_kv_cache"])
    loop.set_prefix_refresh(model, refresh)
    try:
        clips = evaluate.generate_set(model, dev_sentences, {**STOCK, "tag": f"prefix-kv-r{refresh}"},
                                     voice_prompt=prompt, checkpoint_id=identity)
    finally:
        fastpath.revert(model)
    gate_candidate(judge, stock_set, clips, f"prefix-kv-r{refresh}", wer_margin)
