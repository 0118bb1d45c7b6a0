"""Evaluation sets in the field's formats: each item a voice-clone request (prompt audio, prompt text, target text,
language), read whole and checked before anything is generated.

Two formats, as the sets ship:

* Seed-TTS-eval (`meta.lst`, BytedanceSpeech/seed-tts-eval): one item per line, `utt|prompt text|prompt wav|target
  text`, the wav's path relative to the list's folder (a fifth field, the ground-truth target wav of some lists, is
  read and kept). The language is the list's folder name (`seedtts_testset/en/meta.lst`, `.../zh/meta.lst`), or
  given (`language=`).
* LibriSpeech-PC (`*.lst` as F5-TTS ships its "test-clean 4-10 s" cross-sentence list): one item per line, six
  tab-separated fields `prompt utt, prompt seconds, prompt text, target utt, target seconds, target text`; the prompt's
  audio is `<root>/<speaker>/<chapter>/<prompt utt>.flac` in LibriSpeech's test-clean tree, found beside the list
  (`LibriSpeech/test-clean/`, `test-clean/`, or the list's own folder) or given (`audio_root=`). English.

`read_set` refuses a set with every defect found, each named by its file and line (`SetError`): a line with the
wrong number of fields, an empty text, a duplicate id, a missing prompt wav, a file that is not audio, a prompt
below the judges' 16 kHz, or a prompt the SIM judge cannot embed (shorter than its floor, silent, clipped). Blank
lines are the only lines passed over; no item is ever dropped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import soundfile as sf

from . import audio

FORMATS = ("seed-tts", "librispeech-pc")
# a list's folder that names its language (Seed-TTS-eval: en/, zh/; zh/hardcase.lst is in zh/ too)
LANGUAGES_BY_FOLDER = ("en", "zh", "ja", "ko", "de", "fr", "es", "it", "pt", "ru")
MIN_PROMPT_SR = audio.JUDGE_SR  # a prompt below it lacks the band every judge hears (and the model's 24 kHz)


@dataclasses.dataclass(frozen=True)
class CloneItem:
    """One voice-clone request of an evaluation set: generate `target_text` in the voice of `prompt_wav` (whose
    words are `prompt_text`), in `language`. `where`: the list's file and line, for every message about it."""

    id: str
    prompt_wav: Path
    prompt_text: str
    target_text: str
    language: str
    where: str
    target_wav: Path | None = None  # the ground truth, where the list names one

    def prompt_audio(self) -> tuple[np.ndarray, int]:
        """The prompt's audio as float32 mono [T] and its rate (channels averaged)."""
        wav, sr = sf.read(self.prompt_wav, dtype="float32", always_2d=True)
        return wav.mean(axis=1), int(sr)


@dataclasses.dataclass(frozen=True)
class EvalSet:
    path: Path
    format: str
    items: tuple[CloneItem, ...]

    @property
    def languages(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in self.items:
            out[item.language] = out.get(item.language, 0) + 1
        return out


class SetError(ValueError):
    """A set that cannot be judged as it is: every defect, one line each, named by file and line."""

    def __init__(self, path: Path, problems: list[str]):
        self.problems = list(problems)
        shown = self.problems[:20]
        more = [f"... and {len(self.problems) - 20} more"] if len(self.problems) > 20 else []
        super().__init__(f"evaluation set {path}: {len(self.problems)} problem(s); fix the list or its files (no "
                         f"item is dropped):\n" + "\n".join(f"  {p}" for p in shown + more))


def detect_format(path: Path) -> str:
    """'seed-tts' for '|'-separated lists, 'librispeech-pc' for tab-separated ones (by the first line with text)."""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            if "|" in line:
                return "seed-tts"
            if line.count("\t") == 5:
                return "librispeech-pc"
            raise SetError(Path(path), [f"{path}:1: neither a Seed-TTS-eval line (utt|prompt text|prompt wav|target "
                                        f"text) nor a LibriSpeech-PC line (six tab-separated fields): {line[:80]!r}"])
    raise SetError(Path(path), [f"{path}: no item (an empty list)"])


def _seed_tts(path: Path, language: str | None, problems: list) -> list[CloneItem]:
    if language is None:
        language = path.parent.name.lower() if path.parent.name.lower() in LANGUAGES_BY_FOLDER else None
        if language is None:
            problems.append(f"{path}: the language is not known from the folder {path.parent.name!r} (Seed-TTS-eval "
                            f"keeps each language's list in its folder: {', '.join(LANGUAGES_BY_FOLDER)}): put the "
                            f"list in a folder named after its language (<set>/en/meta.lst)")
            language = "?"
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        fields = line.split("|")
        if len(fields) not in (4, 5):
            problems.append(f"{where}: {len(fields)} fields, expected 4 (utt|prompt text|prompt wav|target text) or "
                            f"5 (and the ground-truth wav)")
            continue
        utt, prompt_text, wav, target = (f.strip() for f in fields[:4])
        truth = path.parent / fields[4].strip() if len(fields) == 5 and fields[4].strip() else None
        items.append(CloneItem(utt, path.parent / wav, prompt_text, target, language, where, truth))
    return items


def librispeech_root(path: Path, first_prompt: str | None) -> Path:
    """Where the LibriSpeech test-clean tree is, beside the list: the first candidate holding the first prompt's
    speaker folder."""
    candidates = [path.parent / "LibriSpeech" / "test-clean", path.parent / "test-clean", path.parent]
    speaker = first_prompt.split("-")[0] if first_prompt else ""
    for root in candidates:
        if speaker and (root / speaker).is_dir():
            return root
    raise SetError(path, [f"{path}: LibriSpeech's test-clean tree is not beside the list (looked for the speaker "
                          f"folder {speaker!r} in {', '.join(str(c) for c in candidates)}): put it, or a link to it, at "
                          f"{candidates[0]}"])


def _librispeech_pc(path: Path, audio_root: Path | None, problems: list) -> list[CloneItem]:
    rows = [(n, line.split("\t")) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()]
    first = next((fields[0].strip() for _, fields in rows if len(fields) == 6), None)
    root = Path(audio_root) if audio_root is not None else librispeech_root(path, first)
    items = []
    for n, fields in rows:
        where = f"{path}:{n}"
        if len(fields) != 6:
            problems.append(f"{where}: {len(fields)} tab-separated fields, expected 6 (prompt utt, prompt seconds, "
                            f"prompt text, target utt, target seconds, target text)")
            continue
        prompt_utt, _, prompt_text, target_utt, _, target = (f.strip() for f in fields)
        parts = prompt_utt.split("-")
        if len(parts) != 3:
            problems.append(f"{where}: prompt utterance {prompt_utt!r} is not LibriSpeech's SPEAKER-CHAPTER-NUMBER")
            continue
        wav = root / parts[0] / parts[1] / f"{prompt_utt}.flac"
        items.append(CloneItem(target_utt, wav, prompt_text, target, "en", where))
    return items


def check_items(items: list[CloneItem], min_prompt_samples: int, problems: list) -> None:
    """Every defect of the items (ids, texts, prompt files and audio), appended to problems."""
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            problems.append(f"{item.where}: duplicate id {item.id!r} (first at {seen[item.id]})")
        else:
            seen[item.id] = item.where
        if not item.id:
            problems.append(f"{item.where}: empty id")
        for name, text in (("prompt text", item.prompt_text), ("target text", item.target_text)):
            if not text:
                problems.append(f"{item.where}: empty {name} (item {item.id!r})")
        if not item.prompt_wav.is_file():
            problems.append(f"{item.where}: prompt wav {item.prompt_wav} does not exist (item {item.id!r}; paths are "
                            f"relative to the list's folder)")
            continue
        try:
            info = sf.info(str(item.prompt_wav))
        except Exception as err:  # noqa: BLE001 - soundfile's LibsndfileError or RuntimeError, by version
            problems.append(f"{item.where}: prompt wav {item.prompt_wav} is not audio soundfile can read "
                            f"({str(err).strip()[:120]})")
            continue
        if info.samplerate < MIN_PROMPT_SR:
            problems.append(f"{item.where}: prompt wav {item.prompt_wav} is {info.samplerate} Hz, below the judges' "
                            f"{MIN_PROMPT_SR} Hz (a prompt without that band would be judged on audio it lacks); "
                            f"use the set's original recording")
            continue
        wav, sr = item.prompt_audio()
        problem = audio.check_clip(wav, sr, None, "prompt")
        if problem is None and audio.judge_samples(wav.size, sr) < min_prompt_samples:
            problem = audio.Problem("prompt", "too short", f"{audio.judge_samples(wav.size, sr)} samples at 16 kHz "
                                    f"({wav.size / sr:.2f} s)", f"{min_prompt_samples}: the SIM judge's floor",
                                    "SIM")
        if problem is not None:
            problems.append(f"{item.where}: {problem.format().replace('prompt', f'prompt wav {item.prompt_wav}', 1)}")


def read_set(path: str | Path, *, format: str | None = None, language: str | None = None,
             audio_root: str | Path | None = None,
             min_prompt_samples: int = audio.MIN_SAMPLES["SIM"]) -> EvalSet:
    """The set at `path` (a Seed-TTS-eval meta.lst or a LibriSpeech-PC list; `format` detected when not given),
    checked whole: SetError with every defect, else every item. min_prompt_samples: the SIM judge's floor at 16 kHz
    (GE2E's by default; a judge with another floor passes its own)."""
    path = Path(path)
    if path.is_dir() and not (path / "meta.lst").is_file() and list(path.glob("*/meta.lst")):
        return combined(path, sorted(path.glob("*/meta.lst")), min_prompt_samples)
    if path.is_dir():
        path = path / "meta.lst"
    if not path.is_file():
        raise SetError(path, [f"{path}: no such list (a Seed-TTS-eval meta.lst, or a LibriSpeech-PC .lst)"])
    format = format or detect_format(path)
    if format not in FORMATS:
        raise ValueError(f"unknown set format {format!r}: one of {FORMATS}")
    problems: list[str] = []
    if format == "seed-tts":
        items = _seed_tts(path, language, problems)
    else:
        items = _librispeech_pc(path, Path(audio_root) if audio_root else None, problems)
    if not items and not problems:
        problems.append(f"{path}: no item (only blank lines)")
    check_items(items, min_prompt_samples, problems)
    if problems:
        raise SetError(path, problems)
    return EvalSet(path, format, tuple(items))


def combined(folder: Path, lists: list[Path], min_prompt_samples: int) -> EvalSet:
    """A set's folder holding one meta.lst per language (seedtts_testset/en/, zh/): every list, read and checked
    alike, as one set; an id in two lists is a duplicate."""
    items, problems = [], []
    for path in lists:
        try:
            items += read_set(path, min_prompt_samples=min_prompt_samples).items
        except SetError as err:
            problems += err.problems
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            problems.append(f"{item.where}: duplicate id {item.id!r} (first at {seen[item.id]})")
        seen.setdefault(item.id, item.where)
    if problems:
        raise SetError(folder, problems)
    return EvalSet(folder, "seed-tts", tuple(items))

