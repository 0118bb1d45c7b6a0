"""Evaluation sets in the field's formats (harness.quality.sets): a Seed-TTS-eval meta.lst and a LibriSpeech-PC
list read as the sets ship, and every bad set refused with its file and line, never an item dropped.

The audio here is synthetic (a voiced buzz with a syllable rhythm): the reader judges files, not speech."""

from __future__ import annotations

import re

import numpy as np
import pytest
import soundfile as sf

from harness.quality import audio, sets


def voice(seconds: float, sr: int = 16000, f0: float = 120.0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    buzz = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))
    return (0.3 * buzz / np.abs(buzz).max() * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def seed_tts(root, lines, wavs=None, folder="en"):
    """A Seed-TTS-eval layout: ROOT/FOLDER/meta.lst and FOLDER/prompt-wavs/NAME.wav ({name: (wav, sr)})."""
    base = root / folder
    (base / "prompt-wavs").mkdir(parents=True)
    for name, (wav, sr) in (wavs or {}).items():
        sf.write(base / "prompt-wavs" / name, wav, sr)
    (base / "meta.lst").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return base / "meta.lst"


GOOD = ["u1|A prompt in the first voice.|prompt-wavs/a.wav|The first sentence to say.",
        "u2|A prompt in the second voice.|prompt-wavs/b.wav|The second sentence to say."]


def good_wavs():
    return {"a.wav": (voice(2.0), 16000), "b.wav": (voice(2.5, 24000, 210.0), 24000)}


def test_a_seed_tts_list_reads_as_it_ships(tmp_path):
    path = seed_tts(tmp_path, GOOD + [""], good_wavs())  # a trailing blank line is no item
    got = sets.read_set(path)
    assert got.format == "seed-tts" and got.languages == {"en": 2}
    a, b = got.items
    assert (a.id, a.prompt_text, a.target_text) == ("u1", "A prompt in the first voice.", "The first sentence to say.")
    assert a.prompt_wav == path.parent / "prompt-wavs" / "a.wav" and a.where == f"{path}:1"
    wav, sr = b.prompt_audio()
    assert sr == 24000 and wav.shape == (60000,) and wav.dtype == np.float32
    assert sets.read_set(path.parent).items == got.items  # the folder names its meta.lst


def test_the_language_comes_from_the_folder_or_is_given(tmp_path):
    path = seed_tts(tmp_path, GOOD, good_wavs(), folder="my-set")
    with pytest.raises(sets.SetError,
                       match=r"language is not known from the folder 'my-set'.*a folder named after its language"):
        sets.read_set(path)
    assert sets.read_set(path, language="de").languages == {"de": 2}


def bad_case(tmp_path, case):
    """A two-item set with one defect; returns (path, the line it is on)."""
    wavs, lines = good_wavs(), list(GOOD)
    if case == "missing wav":
        del wavs["b.wav"]
    elif case == "not audio":
        wavs.pop("b.wav")
    elif case == "wrong sample rate":
        wavs["b.wav"] = (voice(2.0, 8000), 8000)
    elif case == "empty target text":
        lines[1] = "u2|A prompt in the second voice.|prompt-wavs/b.wav|  "
    elif case == "empty prompt text":
        lines[1] = "u2||prompt-wavs/b.wav|The second sentence to say."
    elif case == "duplicate id":
        lines[1] = lines[1].replace("u2|", "u1|")
    elif case == "prompt below the SIM floor":
        wavs["b.wav"] = (voice(1.0), 16000)
    elif case == "silent prompt":
        wavs["b.wav"] = (np.zeros(32000, np.float32), 16000)
    elif case == "wrong field count":
        lines[1] = "u2|A prompt.|prompt-wavs/b.wav"
    path = seed_tts(tmp_path, lines, wavs)
    if case == "not audio":
        (path.parent / "prompt-wavs" / "b.wav").write_text("<html>not found</html>")
    return path, f"{path}:2"


CASES = {  # case -> what the error says about line 2
    "missing wav": r"prompt wav \S+b\.wav does not exist \(item 'u2'",
    "not audio": r"prompt wav \S+b\.wav is not audio soundfile can read",
    "wrong sample rate": r"prompt wav \S+b\.wav is 8000 Hz, below the judges' 16000 Hz",
    "empty target text": r"empty target text \(item 'u2'\)",
    "empty prompt text": r"empty prompt text \(item 'u2'\)",
    "duplicate id": r"duplicate id 'u1' \(first at \S+meta\.lst:1\)",
    "prompt below the SIM floor": r"prompt wav \S+b\.wav is too short for the SIM judge \(16000 samples at 16 kHz "
                                  r"\(1\.00 s\), limit 19200",
    "silent prompt": r"prompt wav \S+b\.wav is silent",
    "wrong field count": r"3 fields, expected 4",
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_set_is_refused_naming_the_line(tmp_path, case):
    path, line = bad_case(tmp_path, case)
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path)
    assert err.value.problems and all(p.startswith(line) for p in err.value.problems), err.value.problems
    assert any(re.search(CASES[case], p) for p in err.value.problems), err.value.problems
    assert "no item is dropped" in str(err.value)


def test_every_defect_is_named_at_once(tmp_path):
    lines = GOOD + ["u3||prompt-wavs/none.wav|Third.", "u1|Again.|prompt-wavs/a.wav|Fourth."]
    path = seed_tts(tmp_path, lines, good_wavs())
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path)
    assert [p.split(": ", 1)[0] for p in err.value.problems] == [f"{path}:3", f"{path}:3", f"{path}:4"]


def test_the_sim_floor_is_the_judges(tmp_path):
    """A judge with a lower floor (min_prompt_samples) accepts the prompt GE2E refuses."""
    path, _ = bad_case(tmp_path, "prompt below the SIM floor")
    assert sets.read_set(path, min_prompt_samples=8000).items[1].id == "u2"
    assert audio.MIN_SAMPLES["SIM"] == 19200


def librispeech(root, rows, speakers=("1089-134686-0000", "121-121726-0005"), tree="LibriSpeech/test-clean"):
    for utt in speakers:
        spk, chapter, _ = utt.split("-")
        folder = root / tree / spk / chapter
        folder.mkdir(parents=True, exist_ok=True)
        sf.write(folder / f"{utt}.flac", voice(4.2), 16000)
    path = root / "librispeech_pc_test_clean_cross_sentence.lst"
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    return path


ROWS = [["1089-134686-0000", "4.2", "He hoped there would be stew for dinner.", "1089-134686-0001", "5.1",
         "Stuff it into you, his belly counselled him."],
        ["121-121726-0005", "4.2", "Also a popular contrivance.", "121-121726-0007", "6.0",
         "Heaven, a good place to be raised to."]]


@pytest.mark.parametrize("tree", ["LibriSpeech/test-clean", "test-clean", "."])
def test_a_librispeech_pc_list_reads_with_the_tree_beside_it(tmp_path, tree):
    got = sets.read_set(librispeech(tmp_path, ROWS, tree=tree))
    assert got.format == "librispeech-pc" and got.languages == {"en": 2}
    first = got.items[0]
    assert first.id == "1089-134686-0001" and first.prompt_text == "He hoped there would be stew for dinner."
    assert first.target_text == "Stuff it into you, his belly counselled him."
    assert first.prompt_wav.resolve() == (tmp_path / tree / "1089" / "134686" / "1089-134686-0000.flac").resolve()


def test_a_librispeech_pc_list_without_its_tree_names_where_it_looked(tmp_path):
    path = librispeech(tmp_path, ROWS, tree="elsewhere")
    with pytest.raises(sets.SetError,
                       match=r"test-clean tree is not beside the list .*a link to it, at .*LibriSpeech/test-clean"):
        sets.read_set(path)
    assert len(sets.read_set(path, audio_root=tmp_path / "elsewhere").items) == 2


def test_a_librispeech_pc_line_with_a_missing_prompt_is_named(tmp_path):
    path = librispeech(tmp_path, ROWS + [["2300-131720-0000", "4.0", "Text.", "2300-131720-0001", "5", "More."]])
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{path}:3: prompt wav ")
    assert "2300-131720-0000.flac does not exist" in err.value.problems[0]


def test_a_list_in_neither_format_is_refused(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text("id1\tjust a corpus line\n")
    with pytest.raises(sets.SetError, match="neither a Seed-TTS-eval line"):
        sets.read_set(path)
    empty = tmp_path / "en" / "meta.lst"
    empty.parent.mkdir()
    empty.write_text("\n\n")
    with pytest.raises(sets.SetError, match="no item"):
        sets.read_set(empty)


def test_the_gate_refuses_a_bad_set_before_it_makes_any_environment(tmp_path, monkeypatch, capsys):
    from harness.gate import candidate
    from harness.gate import gate

    path, line = bad_case(tmp_path, "wrong sample rate")
    monkeypatch.setattr(candidate, "prepare", lambda *a, **k: pytest.fail("an environment was made for a bad set"))
    assert gate.main(["omnivoice==0.2.1", "--quality-set", str(path), "--quality-synth", "espeak",
                      "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{line}: prompt wav" in err and "8000 Hz" in err, err


def test_a_folder_of_one_list_per_language_reads_as_one_set_with_the_judges_floor(tmp_path):
    """seedtts_testset/en/ and zh/: every list read alike (min_prompt_samples reaches each), as one set of the
    folder; a folder with its own meta.lst is that list, whatever lies below it."""
    seed_tts(tmp_path, GOOD, good_wavs(), folder="en")
    seed_tts(tmp_path, ["z1|一个提示。|prompt-wavs/c.wav|要说的句子。"], {"c.wav": (voice(1.0), 16000)}, folder="zh")
    with pytest.raises(sets.SetError, match=r"zh/meta\.lst:1: prompt wav \S+c\.wav is too short for the SIM judge"):
        sets.read_set(tmp_path)
    got = sets.read_set(tmp_path, min_prompt_samples=8000)
    assert (got.path, got.format, got.languages) == (tmp_path, "seed-tts", {"en": 2, "zh": 1})
    assert [i.id for i in got.items] == ["u1", "u2", "z1"]
    own = tmp_path / "en"
    seed_tts(own, ["d1|A prompt.|prompt-wavs/d.wav|Deeper."], {"d.wav": (voice(2.0), 16000)}, folder="de")
    assert [i.id for i in sets.read_set(own).items] == ["u1", "u2"]
