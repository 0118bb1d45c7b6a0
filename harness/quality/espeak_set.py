"""A small evaluation set in Seed-TTS-eval's exact layout, made of espeak-ng speech: the field's format, offline.

    <folder>/en/meta.lst, <folder>/en/prompt-wavs/*.wav      (and de/: German, a second language espeak speaks)
    <folder>/voices.json                                      prompt wav -> the espeak voice that spoke it

Each language has its prompt voices (VOICES: espeak variants of both sexes), each prompting an equal share of the
language's target sentences: every item is a voice-clone request whose prompt is a sentence in one voice and whose
target is another sentence, to be said in that voice. The target text is never the prompt's. English: 4 voices x 3
items; German: 6 voices x 5 items (its SIM judged without WER: the swap below is decided there only at that size;
at 4 x 3 German's SIM verdict was undecided).

`outputs` stands in for a TTS system that clones perfectly: it says each item's target text in its prompt's espeak
voice (what voices.json records), with the damage asked for:
  * "none": the reference, and an identical candidate;
  * "noise": white noise at 10 dB SNR over each clip;
  * "swap": the voices of the first two prompts of each language exchanged (every item of those prompts is said in
    the other's voice; words and sound unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from . import speech
from .audio import Clip

# (language, espeak voice, its variants: the prompts' voices, both sexes, told apart by GE2E)
VOICES = {"en": ("en-us", ("m1", "f2", "m3", "f4")), "de": ("de", ("m2", "f1", "m4", "f3", "m6", "f5"))}
PROMPT_TEXTS = {
    "en": ("The morning train was quiet, so she read the paper on the way.",
           "We walked along the river until the lights came on in the town.",
           "He fixed the old radio and played it for the whole street to hear.",
           "Please put the blue folder back on the shelf when you are done."),
    "de": ("Der Zug am Morgen war ruhig, und sie las die Zeitung auf dem Weg.",
           "Wir gingen am Fluss entlang, bis in der Stadt die Lichter angingen.",
           "Er reparierte das alte Radio und spielte es für die ganze Straße.",
           "Bitte stell den blauen Ordner zurück ins Regal, wenn du fertig bist.",
           "Am Samstag fuhren wir mit dem Fahrrad zum Markt in der Altstadt.",
           "Sie öffnete das Fenster, weil die Sonne schon warm ins Zimmer schien."),
}
TARGET_TEXTS = {
    "en": ("A cold wind came down from the hills before the rain.",
           "The children counted the boats as they sailed past the harbour.",
           "Her brother painted the fence a bright shade of green.",
           "Nobody knew where the little grey cat had gone that night.",
           "The baker opens his shop at six every morning of the week.",
           "They planted apple trees along the edge of the garden.",
           "The concert ended late, and the last bus had already left.",
           "Bring a warm coat, because the evenings are getting colder.",
           "The library will be closed on the first Monday of the month.",
           "A small boat drifted slowly towards the far side of the lake.",
           "The teacher wrote three simple questions on the board.",
           "We found an old map hidden inside a book about the sea."),
    "de": ("Ein kalter Wind kam vor dem Regen von den Hügeln herunter.",
           "Die Kinder zählten die Boote, die am Hafen vorbeifuhren.",
           "Ihr Bruder strich den Zaun in einem hellen Grün.",
           "Niemand wusste, wohin die kleine graue Katze gegangen war.",
           "Der Bäcker öffnet seinen Laden jeden Morgen um sechs Uhr.",
           "Sie pflanzten Apfelbäume am Rand des Gartens.",
           "Das Konzert endete spät, und der letzte Bus war schon weg.",
           "Nimm einen warmen Mantel mit, die Abende werden kälter.",
           "Die Bibliothek bleibt am ersten Montag im Monat geschlossen.",
           "Ein kleines Boot trieb langsam zum anderen Ufer des Sees.",
           "Die Lehrerin schrieb drei einfache Fragen an die Tafel.",
           "Wir fanden eine alte Karte in einem Buch über das Meer.",
           "Der Hund schlief den ganzen Nachmittag vor dem warmen Ofen.",
           "Meine Schwester lernt seit dem Sommer jeden Tag Klavier.",
           "Auf dem Dach saßen zwei Tauben und schauten auf die Straße.",
           "Das Museum zeigt in diesem Winter alte Bilder aus der Stadt.",
           "Nach dem Essen tranken wir Tee und sprachen über die Reise.",
           "Der Zug nach Hamburg hatte heute fast eine Stunde Verspätung.",
           "Im Garten blühen jetzt die ersten roten Rosen des Jahres.",
           "Der alte Mann füttert jeden Morgen die Enten im Park.",
           "Wir haben für das Wochenende einen Tisch im Restaurant bestellt.",
           "Die Straße war nach dem Sturm voller Äste und nasser Blätter.",
           "Mein Nachbar repariert sein Auto immer selbst in der Garage.",
           "Im Herbst sammeln die Kinder bunte Blätter für die Schule.",
           "Das Flugzeug landete pünktlich trotz des starken Nebels.",
           "Sie kaufte frisches Brot und ein Stück Käse beim Bäcker.",
           "Der Fluss ist nach dem langen Regen über die Ufer getreten.",
           "Am Abend spielten wir Karten und hörten leise Musik.",
           "Die neue Brücke verbindet die beiden Teile der Stadt.",
           "Er schrieb seiner Großmutter einen langen Brief zum Geburtstag."),
}
RATE, PITCH = 170, 50
NOISE_SNR_DB = 10.0
DAMAGES = ("none", "noise", "swap")


def build(folder: str | Path, languages=("en", "de")) -> Path:
    """Write the set under `folder` (idempotent: the same files every time); returns the folder."""
    folder = Path(folder)
    voices = {}
    for lang in languages:
        base, variants = VOICES[lang]
        (folder / lang / "prompt-wavs").mkdir(parents=True, exist_ok=True)
        targets = TARGET_TEXTS[lang]
        per_prompt = len(targets) // len(variants)
        lines = []
        for p, (variant, prompt_text) in enumerate(zip(variants, PROMPT_TEXTS[lang])):
            voice = f"{base}+{variant}"
            name = f"prompt-wavs/{lang}_p{p}_{variant}.wav"
            wav, sr = speech.render(prompt_text, voice, RATE, PITCH)
            sf.write(folder / lang / name, wav, sr, subtype="PCM_16")
            voices[f"{lang}/{name}"] = voice
            for k in range(per_prompt):
                i = p * per_prompt + k
                lines.append(f"{lang}_{i:02d}_p{p}|{prompt_text}|{name}|{targets[i]}")
        (folder / lang / "meta.lst").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "voices.json").write_text(json.dumps(voices, indent=1, sort_keys=True) + "\n")
    return folder


def voice_of(item) -> str:
    """The espeak voice that spoke the item's prompt: voices.json in the set's folder (the first above the prompt
    that holds one), keyed by the prompt's path under that folder."""
    root = next(p for p in item.prompt_wav.parents if (p / "voices.json").is_file())
    return json.loads((root / "voices.json").read_text())[item.prompt_wav.relative_to(root).as_posix()]


def outputs(eval_set, damage: str = "none", seed: int = 0, only=None) -> list[Clip]:
    """Each item's target text said by espeak in its prompt's voice (a perfect cloner), with `damage` (DAMAGES);
    one Clip per item, in the set's order, its group the item's prompt (the resampling block: one voice). `only`:
    the ids to say (a worker's share), each as in the whole set (its swap and its noise from its place there)."""
    if damage not in DAMAGES:
        raise ValueError(f"unknown damage {damage!r}: one of {DAMAGES}")
    voices = [voice_of(item) for item in eval_set.items]
    if damage == "swap":
        for lang in sorted({i.language for i in eval_set.items}):
            first = list(dict.fromkeys(v for v, i in zip(voices, eval_set.items) if i.language == lang))[:2]
            swap = {first[0]: first[1], first[1]: first[0]}
            voices = [swap.get(v, v) if i.language == lang else v for v, i in zip(voices, eval_set.items)]
    clips = []
    for n, (item, voice) in enumerate(zip(eval_set.items, voices)):
        if only is not None and item.id not in only:
            continue
        wav, sr = speech.render(item.target_text, voice, RATE, PITCH)
        if damage == "noise":
            rng = np.random.default_rng([seed, n])
            power = float(np.mean(wav.astype(np.float64) ** 2))
            noise = rng.standard_normal(wav.size) * np.sqrt(power / 10 ** (NOISE_SNR_DB / 10))
            wav = np.clip(wav + noise, -0.99, 0.99).astype(np.float32)
        clips.append(Clip(item.id, item.target_text, wav, sr, group=item.prompt_wav.name, seed=seed,
                          language=item.language))
    return clips
