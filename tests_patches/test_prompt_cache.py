"""The voice-prompt cache: keyed by content, saved and loaded, refusing foreign files."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

import fastpath
from fastpath import prompt_cache
from harness.parity.parity import REF_3S, compare_runs, record_generation
from harness.model.points import reference

REF_6S = reference("ref_6s")


@pytest.fixture
def cached(model):
    fastpath.apply(model, "prompt_cache")
    yield model
    fastpath.revert(model)


def test_hits_on_same_content_misses_on_other(cached, tmp_path):
    cache = cached._fastpath_prompt_cache
    first = cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1])
    renamed = tmp_path / "renamed.wav"
    shutil.copy(REF_6S[0], renamed)
    again = cached.create_voice_clone_prompt(ref_audio=str(renamed), ref_text=REF_6S[1])
    assert torch.equal(again.ref_audio_tokens, first.ref_audio_tokens) and (cache.hits, cache.misses) == (1, 1)
    cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1])
    assert (cache.hits, cache.misses) == (2, 1), "hits are counted, not flagged"
    cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1] + " extra")
    cached.create_voice_clone_prompt(ref_audio=REF_6S[0], ref_text=REF_6S[1], preprocess_prompt=False)
    cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    assert (cache.hits, cache.misses) == (2, 4)


def test_generate_with_ref_audio_goes_through_the_cache(cached):
    cached.generate(text="Hi.", language="en", ref_audio=REF_3S[0], ref_text=REF_3S[1], num_step=2)
    cached.generate(text="Hi again.", language="en", ref_audio=REF_3S[0], ref_text=REF_3S[1], num_step=2)
    assert cached._fastpath_prompt_cache.hits == 1


def test_waveform_key_covers_sample_rate():
    wave = torch.zeros(1, 2400)
    assert prompt_cache.audio_key((wave, 24000)) != prompt_cache.audio_key((wave, 16000))


def test_save_load_round_trip(cached, tmp_path, checkpoint):
    made = cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    path = tmp_path / "prompts.pt"
    prompt_cache.save(cached, path)
    from harness.model.checkpoint import load_model

    other = load_model(checkpoint)
    fastpath.apply(other, "prompt_cache")
    assert prompt_cache.load(other, path) == 1
    loaded = other.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    assert other._fastpath_prompt_cache.hits == 1
    assert torch.equal(loaded.ref_audio_tokens, made.ref_audio_tokens) and loaded.ref_rms == made.ref_rms


def test_load_refuses_corrupt_and_foreign_files(cached, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(prompt_cache.PromptCacheError, match="delete it and rebuild"):
        prompt_cache.load(cached, bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "something-else"}, foreign)
    with pytest.raises(prompt_cache.PromptCacheError, match="is not a"):
        prompt_cache.load(cached, foreign)
    cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    other_tok = tmp_path / "other.pt"
    prompt_cache.save(cached, other_tok)
    blob = torch.load(other_tok, weights_only=True)
    blob["tokenizer"] = "0" * 24
    torch.save(blob, other_tok)
    with pytest.raises(prompt_cache.PromptCacheError, match="another audio tokenizer"):
        prompt_cache.load(cached, other_tok)


def test_save_needs_the_patch(model, tmp_path):
    with pytest.raises(prompt_cache.PromptCacheError, match="fastpath.apply"):
        prompt_cache.save(model, tmp_path / "x.pt")


def test_a_caller_that_changes_its_prompt_changes_nothing_in_the_cache(cached):
    made = cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    kept = made.ref_audio_tokens.clone()
    made.ref_audio_tokens.add_(5)  # the miss's caller changes what it got
    hit = cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    hit.ref_audio_tokens.add_(7)  # and a hit's caller
    again = cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    assert torch.equal(again.ref_audio_tokens, kept), "a caller's change reached the cached prompt"
    assert again is not hit and again.ref_audio_tokens.data_ptr() != hit.ref_audio_tokens.data_ptr()


def references(n: int) -> list:
    """n distinct one-second waveforms (their own cache keys), with a reference text (no ASR)."""
    rng = np.random.default_rng(0)
    return [((torch.from_numpy(rng.standard_normal((1, 24000)).astype(np.float32) * 0.1), 24000), "Hello there.")
            for _ in range(n)]


def voices() -> list:
    """54 references of distinct content, ((waveform [1, samples], 24000), text): 30 one-second windows of the 6 s
    recording at other offsets (real speech, all of one length) and 24 clips of seeded noise of 0.6 to 1.5 s; one
    reference text for all, so that only the audio tells two voices of one length apart."""
    import soundfile as sf

    speech, rate = sf.read(REF_6S[0], dtype="float32")
    windows = [speech[i * 4000 : i * 4000 + rate] for i in range(30)]
    rng = np.random.default_rng(1)
    noise = [rng.standard_normal(int(rate * (0.6 + 0.9 * i / 23))).astype(np.float32) * 0.05 for i in range(24)]
    return [((torch.from_numpy(np.ascontiguousarray(w))[None], rate), "One reference text for every voice.")
            for w in windows + noise]


@pytest.mark.cpu
@pytest.mark.slow  # about 90 s: beyond the default run's budget; .ci/run's controls stage runs it on every change
@pytest.mark.control
def test_a_cache_serving_many_voices_gives_each_request_its_own_voice(model):
    """54 voices (30 of one length), each once and then 20 of them again in another order, through a cache bounded at
    16 entries (hits, misses and evictions all happen): every request's logits, tokens and audio equal the same request
    on the model without the cache. A cache keyed or filled wrongly hands one voice's tokens to another request."""
    refs = voices()
    requests = list(range(len(refs))) + [int(i) for i in np.random.default_rng(2).permutation(len(refs))[:20]]
    point = dict(text="Hi there.", language="en", num_step=2)

    def run(i):  # one seed for all: only the voice tells two requests apart
        return record_generation(model, seed=0, ref_audio=refs[i][0], ref_text=refs[i][1], **point)

    stock = {i: run(i) for i in range(len(refs))}
    assert len({stock[i].tokens[0].numpy().tobytes() for i in range(30)}) == 30, (
        "voices of one length gave the same tokens: the test model cannot tell them apart")
    with fastpath.patched(model, "prompt_cache"):
        prompt_cache.set_limits(model, max_entries=16)
        problems = {n: compare_runs(stock[i], run(i)) for n, i in enumerate(requests)}
        stats = prompt_cache.stats(model)
    assert stats["hits"] > 0 and stats["evictions"] > 0, stats
    wrong = {f"request {n} (voice {requests[n]})": p[0] for n, p in problems.items() if p}
    assert not wrong, f"{len(wrong)} of {len(requests)} requests differ from the model without the cache: {wrong}"


def test_the_cache_is_bounded_least_recently_used_first(cached):
    stats = prompt_cache.stats(cached)
    assert (stats["max_entries"], stats["max_bytes"]) == (prompt_cache.DEFAULT_MAX_ENTRIES,
                                                          prompt_cache.DEFAULT_MAX_BYTES)
    refs = references(3)
    prompt_cache.set_limits(cached, max_entries=2)
    call = lambda i: cached.create_voice_clone_prompt(ref_audio=refs[i][0], ref_text=refs[i][1])  # noqa: E731
    size = call(0).ref_audio_tokens.nbytes
    call(1)
    call(0)  # 0 is now the most recently used
    call(2)  # over the bound: 1 goes
    stats = prompt_cache.stats(cached)
    assert (stats["entries"], stats["evictions"], stats["bytes"]) == (2, 1, 2 * size), stats
    misses = stats["misses"]
    call(0)
    call(2)
    assert prompt_cache.stats(cached)["misses"] == misses, "a recently used prompt was dropped"
    call(1)
    assert prompt_cache.stats(cached)["misses"] == misses + 1, "the least recently used prompt was kept"
    prompt_cache.set_limits(cached, max_entries=10, max_bytes=size)  # bytes bound: one prompt fits
    stats = prompt_cache.stats(cached)
    assert (stats["entries"], stats["bytes"]) == (1, size), stats
    prompt_cache.set_limits(cached, max_entries=1, max_bytes=1 << 30)  # 1 is a bound like any other
    stats = prompt_cache.stats(cached)
    assert (stats["entries"], stats["max_entries"]) == (1, 1), stats
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            prompt_cache.set_limits(cached, max_entries=bad)


class Copies(torch.overrides.TorchFunctionMode):
    """Bytes of the tensors handed to a copying function (to, cpu, contiguous, clone, numpy, cat)."""

    NAMES = {"to", "cpu", "contiguous", "clone", "numpy", "cat"}

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES and args:
            tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            self.bytes += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))
        return func(*args, **(kwargs or {}))


def test_the_tokenizer_identity_reads_the_first_bytes_of_each_tensor_only(model, monkeypatch):
    real = model.audio_tokenizer.state_dict()
    big = torch.randn(1_000_000)  # 4 MB: an identity that copies whole tensors copies it
    monkeypatch.setattr(model.audio_tokenizer, "state_dict", lambda: {**real, "big": big})
    with Copies() as copies:
        identity = prompt_cache.tokenizer_identity(model)
    bound = 4 * prompt_cache.IDENTITY_BYTES * (len(real) + 1)  # each head passes through at most a few copies
    assert copies.bytes <= bound, f"the identity copied {copies.bytes} bytes (bound {bound})"
    changed = big.clone()
    changed[0] += 1
    monkeypatch.setattr(model.audio_tokenizer, "state_dict", lambda: {**real, "big": changed})
    assert prompt_cache.tokenizer_identity(model) != identity, "a change in a tensor's first bytes went unseen"
    monkeypatch.setattr(model.audio_tokenizer, "state_dict", lambda: {**real, "big": big.reshape(1000, 1000)})
    assert prompt_cache.tokenizer_identity(model) != identity, "a change of shape went unseen"


def saved_blob(cached, tmp_path):
    cached.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    path = tmp_path / "prompts.pt"
    prompt_cache.save(cached, path)
    return path, torch.load(path, weights_only=True)


def spoil_tokens(how):
    def spoil(entry):
        entry["ref_audio_tokens"] = how(entry["ref_audio_tokens"])

    return spoil


# how one saved entry is spoiled, what the refusal names
SPOILED = [
    pytest.param(spoil_tokens(lambda t: t.float()), "not int64", id="float-tokens"),
    pytest.param(spoil_tokens(lambda t: t[:-1]), "shape", id="codebooks"),
    pytest.param(spoil_tokens(lambda t: t[:, :0]), "shape", id="no-frames"),
    pytest.param(spoil_tokens(lambda t: t.flatten()), "shape", id="one-dim"),
    pytest.param(spoil_tokens(lambda t: t + 100_000), "codes from", id="codes-too-high"),
    pytest.param(spoil_tokens(lambda t: t - 1 - t.max()), "codes from", id="negative-codes"),
    pytest.param(lambda e: e.update(ref_rms=math.nan), "ref_rms", id="rms-nan"),
    pytest.param(lambda e: e.update(ref_text=3), "ref_text", id="text-not-str"),
    pytest.param(lambda e: e.pop("ref_rms"), "fields", id="missing-field"),
    pytest.param(spoil_tokens(lambda t: t.tolist()), "tokens are list", id="tokens-a-list"),
]


@pytest.mark.parametrize("spoil, named", SPOILED)
def test_load_checks_every_entry_and_adds_none_of_a_bad_file(cached, tmp_path, spoil, named):
    path, blob = saved_blob(cached, tmp_path)
    key = next(iter(blob["entries"]))
    blob["entries"]["f" * 64] = {k: v.clone() if isinstance(v, torch.Tensor) else v
                                 for k, v in blob["entries"][key].items()}  # a good entry beside the bad one
    spoil(blob["entries"][key])
    torch.save(blob, path)
    before = list(cached._fastpath_prompt_cache.entries)
    with pytest.raises(prompt_cache.PromptCacheError, match=named) as refused:
        prompt_cache.load(cached, path)
    assert list(cached._fastpath_prompt_cache.entries) == before, "a file with a bad entry added some of its entries"
    # the refusal names the entry by the first 12 characters of its key
    assert f"entry {key[:12]} " in str(refused.value) or f"entry {key[:12]}:" in str(refused.value), refused.value


def test_load_refuses_bad_keys_and_old_versions(cached, tmp_path):
    path, blob = saved_blob(cached, tmp_path)
    bad = dict(blob, entries={"not-a-key": next(iter(blob["entries"].values()))})
    torch.save(bad, path)
    with pytest.raises(prompt_cache.PromptCacheError, match="sha256"):
        prompt_cache.load(cached, path)
    torch.save(dict(blob, format_version=1), path)
    with pytest.raises(prompt_cache.PromptCacheError, match="v1 file.*rebuild"):
        prompt_cache.load(cached, path)
