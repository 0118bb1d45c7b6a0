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


# --- each reader on its own: formats, fields and every message whole ------------------------------------------------

@pytest.mark.parametrize("text, found", [
    ("\n  \nu1|p|a.wav|t\n", "seed-tts"),
    ("a\tb\tc\td\te\tf|g\n", "seed-tts"),  # a '|' decides, whatever the tabs
    ("\na\tb\tc\td\te\tf\n", "librispeech-pc"),
    ("a\tb\tc\td\te\tf\nnot a line of either\n", "librispeech-pc"),  # the first line with text decides
])
def test_the_format_is_told_by_the_first_line_with_text(tmp_path, text, found):
    path = tmp_path / "list.lst"
    path.write_text(text, encoding="utf-8")
    assert sets.detect_format(path) == found


def test_a_list_of_neither_format_or_no_line_is_refused_with_the_line_it_read(tmp_path):
    path = tmp_path / "list.lst"
    line = "a\tb\tc\td\te\t" + "x" * 100  # five tabs: six fields, one too many for neither
    path.write_text(f"\n{line}\tg\n", encoding="utf-8")
    with pytest.raises(sets.SetError) as err:
        sets.detect_format(path)
    assert err.value.problems == [f"{path}:1: neither a Seed-TTS-eval line (utt|prompt text|prompt wav|target text) "
                                  f"nor a LibriSpeech-PC line (six tab-separated fields): {(line + chr(9) + 'g')[:80]!r}"]
    path.write_text(" \n\n", encoding="utf-8")
    with pytest.raises(sets.SetError) as err:
        sets.detect_format(path)
    assert err.value.problems == [f"{path}: no item (an empty list)"]
    assert str(err.value) == (f"evaluation set {path}: 1 problem(s); fix the list or its files (no item is dropped):\n"
                              f"  {path}: no item (an empty list)")


def test_a_set_error_shows_twenty_problems_and_counts_the_rest():
    err = sets.SetError("s.lst", [f"p{i}" for i in range(23)])
    lines = str(err).splitlines()
    assert lines[0] == "evaluation set s.lst: 23 problem(s); fix the list or its files (no item is dropped):"
    assert lines[1:] == [f"  p{i}" for i in range(20)] + ["  ... and 3 more"] and len(err.problems) == 23
    assert "more" not in str(sets.SetError("s.lst", [f"p{i}" for i in range(20)]))


def test_seed_tts_fields_are_stripped_and_a_fifth_names_the_ground_truth(tmp_path):
    folder = tmp_path / "ZH"
    folder.mkdir()
    path = folder / "meta.lst"
    path.write_text(" u1 | A prompt. | wavs/a.wav | To say. | truth/a.wav\nu2|P.|wavs/b.wav|T.| \n\n"
                    "u3|P.|wavs/c.wav|T.|x|y\nu4|P.\n", encoding="utf-8")
    problems = []
    first, second = sets._seed_tts(path, None, problems)
    assert first == sets.CloneItem("u1", folder / "wavs/a.wav", "A prompt.", "To say.", "zh", f"{path}:1",
                                   folder / "truth/a.wav")
    assert second.target_wav is None and second.where == f"{path}:2"
    assert problems == [
        f"{path}:4: 6 fields, expected 4 (utt|prompt text|prompt wav|target text) or 5 (and the ground-truth wav)",
        f"{path}:5: 2 fields, expected 4 (utt|prompt text|prompt wav|target text) or 5 (and the ground-truth wav)"]
    assert {i.language for i in sets._seed_tts(path, "ja", [])} == {"ja"}


def test_a_seed_tts_list_outside_a_language_folder_says_which_folders_name_one(tmp_path):
    path = tmp_path / "mine" / "meta.lst"
    path.parent.mkdir()
    path.write_text("u1|P.|a.wav|T.\n", encoding="utf-8")
    problems = []
    (item,) = sets._seed_tts(path, None, problems)
    assert item.language == "?"
    assert problems == [f"{path}: the language is not known from the folder 'mine' (Seed-TTS-eval keeps each "
                        f"language's list in its folder: en, zh, ja, ko, de, fr, es, it, pt, ru): put the list in a "
                        f"folder named after its language (<set>/en/meta.lst)"]


def test_librispeechs_tree_is_the_first_beside_the_list_holding_the_speaker_or_named_whole(tmp_path):
    path = tmp_path / "list.lst"
    for tree in ("test-clean", "LibriSpeech/test-clean"):
        (tmp_path / tree / "1089").mkdir(parents=True)
    assert sets.librispeech_root(path, "1089-134686-0000") == tmp_path / "LibriSpeech" / "test-clean"
    assert sets.librispeech_root(path, "1089") == tmp_path / "LibriSpeech" / "test-clean"
    (tmp_path / "121").mkdir()
    assert sets.librispeech_root(path, "121-121726-0005") == tmp_path
    looked = f"{tmp_path / 'LibriSpeech' / 'test-clean'}, {tmp_path / 'test-clean'}, {tmp_path}"
    for first, speaker in (("2300-131720-0000", "2300"), (None, "")):
        with pytest.raises(sets.SetError) as err:
            sets.librispeech_root(path, first)
        assert err.value.problems == [f"{path}: LibriSpeech's test-clean tree is not beside the list (looked for the "
                                      f"speaker folder {speaker!r} in {looked}): put it, or a link to it, at "
                                      f"{tmp_path / 'LibriSpeech' / 'test-clean'}"]


def test_librispeech_pc_rows_are_read_with_their_tree_and_bad_rows_named(tmp_path):
    path = tmp_path / "list.lst"
    path.write_text("bad\trow\n\n" + "\t".join(ROWS[0]) + "\n" + "\t".join(["1089-134686", *ROWS[1][1:]]) + "\n"
                    + "\t".join(f" {f} " for f in ROWS[1]) + "\n", encoding="utf-8")
    problems = []
    items = sets._librispeech_pc(path, tmp_path / "root", problems)
    assert items == [
        sets.CloneItem("1089-134686-0001", tmp_path / "root/1089/134686/1089-134686-0000.flac", ROWS[0][2], ROWS[0][5],
                       "en", f"{path}:3"),
        sets.CloneItem("121-121726-0007", tmp_path / "root/121/121726/121-121726-0005.flac", ROWS[1][2], ROWS[1][5],
                       "en", f"{path}:5")]
    assert problems == [f"{path}:1: 2 tab-separated fields, expected 6 (prompt utt, prompt seconds, prompt text, "
                        f"target utt, target seconds, target text)",
                        f"{path}:4: prompt utterance '1089-134686' is not LibriSpeech's SPEAKER-CHAPTER-NUMBER"]
    (tmp_path / "test-clean" / "1089").mkdir(parents=True)  # found by the first six-field row's speaker
    assert sets._librispeech_pc(path, None, [])[0].prompt_wav == tmp_path / "test-clean/1089/134686/1089-134686-0000.flac"
    no_row = tmp_path / "none.lst"
    no_row.write_text("bad\trow\n", encoding="utf-8")
    problems = []
    assert sets._librispeech_pc(no_row, tmp_path / "root", problems) == []  # no six-field row: named, no item
    assert problems == [f"{no_row}:1: 2 tab-separated fields, expected 6 (prompt utt, prompt seconds, prompt text, "
                        f"target utt, target seconds, target text)"]
    with pytest.raises(sets.SetError, match="looked for the speaker folder '' in"):
        sets._librispeech_pc(no_row, None, [])


def test_a_list_that_is_not_there_or_of_no_known_format_or_only_blank_is_refused(tmp_path):
    with pytest.raises(sets.SetError) as err:
        sets.read_set(tmp_path)
    assert err.value.problems == [f"{tmp_path / 'meta.lst'}: no such list (a Seed-TTS-eval meta.lst, or a "
                                  f"LibriSpeech-PC .lst)"]
    path = seed_tts(tmp_path, ["", " "])
    with pytest.raises(ValueError) as err:
        sets.read_set(path, format="csv")
    assert str(err.value) == "unknown set format 'csv': one of ('seed-tts', 'librispeech-pc')"
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path, format="seed-tts")
    assert err.value.problems == [f"{path}: no item (only blank lines)"]


def test_an_item_with_no_id_and_a_prompt_that_is_not_audio_are_named(tmp_path):
    path = seed_tts(tmp_path, ["|A prompt.|prompt-wavs/a.wav|Say.", "u2|P.|prompt-wavs/b.wav|Say."], good_wavs())
    (path.parent / "prompt-wavs" / "b.wav").write_bytes(b"RIFF")
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path)
    first, second = err.value.problems
    assert first == f"{path}:1: empty id"
    assert second.startswith(f"{path}:2: prompt wav {path.parent / 'prompt-wavs' / 'b.wav'} is not audio soundfile "
                             f"can read (") and second.endswith(")")


def test_a_prompt_at_the_sim_floor_is_read_and_one_sample_under_is_named(tmp_path):
    path = seed_tts(tmp_path, GOOD[:1], {"a.wav": (voice(2.0)[:19200], 16000)})
    assert len(sets.read_set(path).items) == 1
    (path.parent / "prompt-wavs" / "a.wav").unlink()
    sf.write(path.parent / "prompt-wavs" / "a.wav", voice(2.0)[:19199], 16000)
    with pytest.raises(sets.SetError) as err:
        sets.read_set(path)
    assert err.value.problems == [f"{path}:1: prompt wav {path.parent / 'prompt-wavs' / 'a.wav'} is too short for "
                                  f"the SIM judge (19199 samples at 16 kHz (1.20 s), limit 19200: the SIM judge's "
                                  f"floor)"]


def test_an_id_in_two_lists_of_a_set_folder_is_a_duplicate(tmp_path):
    seed_tts(tmp_path, GOOD, good_wavs(), folder="en")
    zh = seed_tts(tmp_path, ["u2|一个提示。|prompt-wavs/c.wav|要说的句子。"], {"c.wav": (voice(2.0), 16000)}, folder="zh")
    with pytest.raises(sets.SetError) as err:
        sets.read_set(tmp_path)
    assert err.value.problems == [f"{zh}:1: duplicate id 'u2' (first at {tmp_path / 'en' / 'meta.lst'}:2)"]
    assert str(err.value).startswith(f"evaluation set {tmp_path}: 1 problem(s)")
