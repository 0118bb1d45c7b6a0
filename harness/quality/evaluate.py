"""Generation harness: generate_set -> transcribe_set -> score, with on-disk caches shared by xdist workers.

Caches (harness.quality.cache) live under env FASTPATH_CACHE or <repo>/.cache/: audio/ keyed by everything that decides a waveform
(audio_key: the checkpoint's id and its loaded weights' digest, the generating code, i.e. the sources of the
installed omnivoice and fastpath, the patches applied with their settings and the synthesizer, torch and
transformers versions, device and dtype; then config, seed, text, voice prompt), transcripts/ keyed by (audio
sha256, judge identity: weights, decoding, engine versions and instruction set). Every write
goes to a temp file in the same folder and is moved into place with os.replace, so concurrent workers only
ever see whole files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import soundfile as sf

from . import audio, corpus, wer
from .audio import Clip  # noqa: F401  (harness.quality.evaluate.Clip: the clip of a set, defined below the judges)
from .cache import CACHE_ENV, atomic_write, cache_dir  # noqa: F401
from .stats import (DEFAULT_MARGIN_POINTS, MOS_FIELDS, MOS_MARGIN, SIM_MARGIN, SIM_UNIT, Overall, Verdict, gate,
                    score_gate)

# Seeds per holdout sentence of the real-checkpoint gate, from the size rule (stats.seeds_needed) on the simulated
# reference of tests_quality/test_operating.py (WER 6%): median pick 35, 80th percentile 43. A run's own pilot
# decides in the end: with fewer than it needs the verdict is "underpowered: need N" (--quality-seeds N).
HOLDOUT_SEEDS = 40
from harness import REPO_ROOT
from harness.run.machine import tree_digest

SOURCES = (".py", ".json")  # what of a package's folder is its code (code_identity)


def _sha256(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def sentence_seed(sentence_id: str, base_seed: int) -> int:
    """Seed derived from the sentence id, so every config generates sentence k from the same noise."""
    return int(_sha256(f"{sentence_id}:{base_seed}".encode())[:8], 16) % 2**31


def checkpoint_identity(path: str | os.PathLike) -> str:
    """Folder name + sha256 of config files + size and mtime of weight files (hashing GBs of weights is slow)."""
    path = Path(path)
    if not path.is_dir():
        return str(path)
    parts = [path.name]
    for f in sorted(path.rglob("*")):
        if f.suffix == ".json":
            parts.append(f"{f.relative_to(path)}:{_sha256(f.read_bytes())[:12]}")
        elif f.suffix in (".safetensors", ".bin", ".pt", ".pth"):
            st = f.stat()
            parts.append(f"{f.relative_to(path)}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)


def _voice_prompt_identity(prompt) -> str | None:
    if prompt is None:
        return None
    tokens = prompt.ref_audio_tokens.detach().cpu().numpy()
    return _sha256(tokens.tobytes(), prompt.ref_text.encode(), repr(float(prompt.ref_rms)).encode())[:16]


def weights_digest(model) -> str | None:
    """sha256 over the loaded parameters and buffers (names, shapes, dtypes, bytes): the checkpoint's content as it
    was generated with, whatever it was loaded from (a folder, a hub id). About 1 s a GB."""
    if not hasattr(model, "state_dict"):
        return None
    import torch

    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes, whatever the dtype (bf16 has no numpy)
    return h.hexdigest()[:16]


def code_identity(model, synthesize: Callable | None = None) -> dict:
    """What generates the audio besides its inputs: the installed omnivoice and fastpath sources, the patches
    applied to this model and their settings, the synthesizer, torch and transformers, device and dtype."""
    import inspect

    import omnivoice
    import torch

    import fastpath
    from fastpath import loop, registry
    from harness.run import machine

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    own = getattr(model, "__dict__", {})  # what fastpath put on this instance
    if synthesize is None:
        synth = None
    else:
        try:
            synth = f"{synthesize.__module__}.{synthesize.__qualname__}:" + _sha256(
                inspect.getsource(synthesize).encode())[:12]
        except (OSError, TypeError):
            synth = f"{getattr(synthesize, '__module__', '?')}.{getattr(synthesize, '__qualname__', repr(synthesize))}"
    return {
        "omnivoice": machine.package_version("omnivoice"),
        "omnivoice_sources": tree_digest(Path(omnivoice.__file__).parent, SOURCES)[:16],
        "fastpath_sources": tree_digest(Path(fastpath.__file__).parent, SOURCES)[:16],
        "patches": list(own.get(registry.APPLIED_ATTR, [])),
        "patch_settings": {"loop": sorted(own.get(loop.FLAGS_ATTR, ())), "prefix_refresh": own.get(loop.REFRESH_ATTR)},
        "synthesize": synth,
        "torch": torch.__version__,
        "transformers": machine.package_version("transformers"),
        "device": str(first.device) if first is not None else "cpu",
        "dtype": str(first.dtype) if first is not None else None,
    }


def audio_key(model, config: dict, seed: int, text: str, voice_prompt=None, checkpoint_id: str | None = None,
              synthesize: Callable | None = None, *, weights: str | None = None, code: dict | None = None) -> str:
    """The cache key of one generated clip: every part that decides it (module docstring). `weights` and `code`
    (weights_digest, code_identity of this model) may be given when computed once for a whole set."""
    if checkpoint_id is None:
        checkpoint_id = checkpoint_identity(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    parts = {"checkpoint": checkpoint_id, "weights": weights if weights is not None else weights_digest(model),
             "code": code if code is not None else code_identity(model, synthesize), "config": config,
             "voice_prompt": _voice_prompt_identity(voice_prompt), "seed": seed, "text": text}
    return _sha256(json.dumps(parts, sort_keys=True, default=str).encode())[:32]


def generate_set(
    model,
    sentences: Sequence[corpus.Item],
    config: dict,
    seeds: Sequence[int] = (0,),
    *,
    voice_prompt=None,
    checkpoint_id: str | None = None,
    synthesize: Callable | None = None,
) -> list[Clip]:
    """Generate every sentence once per base seed with `model.generate(text=..., language="en", **config)`.

    config: generate kwargs (num_step, guidance_scale, ...); the key "tag" is not passed on, it only names
    what the kwargs cannot show (e.g. a patch stack applied to the model, or `synthesize`) so its audio is cached
    apart. synthesize: (**generate kwargs) -> waveform in place of `model.generate(...)[0]`, e.g. the concatenated
    `fastpath.stream`.
    """
    import torch

    kwargs = {k: v for k, v in config.items() if k != "tag"}
    weights, code = weights_digest(model), code_identity(model, synthesize)  # once per set
    make = synthesize or (lambda **kw: model.generate(**kw)[0])
    clips = []
    for base in seeds:
        for item in sentences:
            seed = sentence_seed(item.id, base)
            key = audio_key(model, config, seed, item.text, voice_prompt, checkpoint_id, synthesize, weights=weights,
                            code=code)
            path = cache_dir("audio") / (key + ".wav")
            if path.exists():
                wav, sr = sf.read(path, dtype="float32")
            else:
                torch.manual_seed(seed)  # right before generate: the same seed gives the same sample
                wav = np.asarray(make(text=item.text, language="en", voice_clone_prompt=voice_prompt, **kwargs),
                                 dtype=np.float32).reshape(-1)
                sr = int(model.sampling_rate)
                atomic_write(path, lambda tmp: sf.write(tmp, wav, sr, format="WAV", subtype="FLOAT"))
            clip_id = item.id if len(seeds) == 1 else f"{item.id}#s{base}"
            clips.append(Clip(clip_id, item.text, wav, sr, group=item.id, seed=seed))
    return clips


def transcribe_set(judge, clips: Sequence[Clip]) -> list[str]:
    """Transcribe every clip with `judge`, caching each transcript by (audio sha256, judge identity); the set is
    refused by name (audio.BadAudio) when any clip is bad, before the judge or its cache is consulted."""
    audio.refuse(audio.check_clips(clips, "WER"))
    hears = getattr(judge, "hears", lambda language: language == "en")  # a judge without it: English-only
    unheard = [c.language for c in clips if not hears(c.language)]
    if unheard:
        from .judge import CannotHear

        raise CannotHear(getattr(getattr(judge, "path", None), "name", "in use"), unheard)
    judge_key = _sha256(judge.identity.encode())[:16]
    out = []
    for clip in clips:
        lang = "" if clip.language == "en" else f"-{clip.language}"  # English keys as before the languages came
        path = cache_dir("transcripts") / f"{clip.sha256[:32]}-{judge_key}{lang}.json"
        if path.exists():
            out.append(json.loads(path.read_text())["text"])
            continue
        text = (judge.transcribe(clip.wav, clip.sr) if clip.language == "en"
                else judge.transcribe(clip.wav, clip.sr, clip.language))
        record = json.dumps({"text": text, "audio_sha256": clip.sha256, "judge": judge.identity,
                             "language": clip.language})
        atomic_write(path, lambda tmp: tmp.write_text(record))
        out.append(text)
    return out


def score_clips(judge, clips: Sequence[Clip]) -> tuple[wer.ScoredSet, list[str]]:
    """transcribe_set then wer.score_set; returns the scores and the transcripts."""
    hyps = transcribe_set(judge, clips)
    scored = wer.score_set([c.id for c in clips], [c.text for c in clips], hyps, judge.identity,
                           groups=[c.group for c in clips], languages=[c.language for c in clips])
    return scored, hyps


def write_listening_pack(
    out_dir: str | os.PathLike,
    ref: Sequence[Clip],
    cand: Sequence[Clip],
    ref_hyps: Sequence[str] | None,
    cand_hyps: Sequence[str] | None,
    ref_scored: wer.ScoredSet | None,  # None: WER not judged (no transcript table)
    cand_scored: wer.ScoredSet | None,
    worst: int = 10,
    verdict=None,
    scores: dict | None = None,
) -> Path:
    """WAV pairs of the `worst` sentences by error increase (cand - ref), with an index.md to listen from; then,
    for every judged score in `scores` ({"SIM": (ref [N], cand [N]), ...}, higher is better), a table of the
    `worst` clips by its drop (cand - ref, worst first) with the clips' other scores beside them."""
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    lines = ["# Listening pack: worst sentences by error increase" if ref_scored is not None
             else "# Listening pack (WER not judged)", ""]
    if verdict is not None:
        lines += ["```", verdict.format(), "```", ""]
    order = []
    if ref_scored is not None:
        increase = cand_scored.errors - ref_scored.errors  # [N]
        order = [i for i in np.argsort(-increase, kind="stable")[:worst]]
        lines += ["| # | id | errors ref -> cand | text | ref transcript | cand transcript | audio |",
                  "|---|---|---|---|---|---|---|"]
    for rank, i in enumerate(order, 1):
        r, c = ref[i], cand[i]
        stem = f"{rank:02d}_{r.id.replace('#', '_')}"
        sf.write(out / f"{stem}_ref.wav", r.wav, r.sr)
        sf.write(out / f"{stem}_cand.wav", c.wav, c.sr)
        lines.append(
            f"| {rank} | {r.id} | {ref_scored.errors[i]} -> {cand_scored.errors[i]} (of {ref_scored.words[i]}) "
            f"| {r.text} | {ref_hyps[i]} | {cand_hyps[i]} | [ref]({stem}_ref.wav) [cand]({stem}_cand.wav) |"
        )
    for name, (r_s, c_s) in (scores or {}).items():
        drop = np.asarray(c_s) - np.asarray(r_s)
        others = [n for n in scores if n != name]
        lines += ["", f"## Worst clips by {name} (candidate - reference, worst first)", "",
                  f"| # | id | {name} ref -> cand | " + "".join(f"{n} ref -> cand | " for n in others) + "audio |",
                  "|---|---|---|" + "---|" * len(others) + "---|"]
        for rank, i in enumerate(np.argsort(drop, kind="stable")[:worst], 1):
            r, c = ref[i], cand[i]
            stem = f"{name.lower()}{rank:02d}_{r.id.replace('#', '_')}"
            sf.write(out / f"{stem}_ref.wav", r.wav, r.sr)
            sf.write(out / f"{stem}_cand.wav", c.wav, c.sr)
            cells = "".join(f"{scores[n][0][i]:.3f} -> {scores[n][1][i]:.3f} | " for n in others)
            lines.append(f"| {rank} | {r.id} | {r_s[i]:.3f} -> {c_s[i]:.3f} ({drop[i]:+.3f}) | {cells}"
                         f"[ref]({stem}_ref.wav) [cand]({stem}_cand.wav) |")
    index = out / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index


@dataclasses.dataclass
class Comparison:
    verdict: Verdict | audio.Refused | None  # WER's (None: left out); Refused when a clip was bad (no judge ran)
    ref: wer.ScoredSet | None
    cand: wer.ScoredSet | None
    pack: Path | None
    overall: Overall | audio.Refused | None = None  # every metric judged (WER, and SIM and MOS with their judges)
    scores: dict = dataclasses.field(default_factory=dict)  # {"SIM": (ref [N], cand [N]), "MOS": ...}

    @property
    def passed(self) -> bool:
        return (self.overall or self.verdict).passed


def mos_fields(mos_judge) -> tuple:
    """(metric, field, unit) of each figure a MOS judge gives: its own `fields`, else DNSMOS's (stats.MOS_FIELDS)."""
    return getattr(mos_judge, "fields", MOS_FIELDS)


def judged_scores(ref: Sequence[Clip], cand: Sequence[Clip], voice_judge=None, mos_judge=None,
                  prompt: tuple | list | None = None) -> dict:
    """{"SIM": (ref [N], cand [N]), "MOS-OVRL": (...), "MOS-P808": (...)} for the judges given (voice.sim_scores:
    to the prompt's audio when cloned, auto voice otherwise; the MOS judge's own fields: DNSMOS's stats.MOS_FIELDS at
    a fixed level, or UTMOS's)."""
    from . import mos, voice

    out = {}
    if voice_judge is not None:
        out["SIM"] = voice.sim_scores(voice_judge, ref, cand, prompt)
    if mos_judge is not None:
        for name, field, _ in mos_fields(mos_judge):
            out[name] = (mos.mos_scores(mos_judge, ref, field), mos.mos_scores(mos_judge, cand, field))
    return out


def bad_audio(ref: Sequence[Clip], cand: Sequence[Clip], sim: bool = False, mos: bool = False,
              prompt: tuple | list | None = None) -> list[audio.Problem]:
    """Every clip no judge of the comparison may hear, by name: each clip against WER's (and MOS's) checks, then what
    the SIM judge would embed (voice.sim_problems: the prompt's audio, or the halves in auto voice) of the clips
    still clean."""
    judges = ("WER", "MOS") if mos else ("WER",)
    problems = audio.check_clips(ref, judges, "reference") + audio.check_clips(cand, judges, "candidate")
    if sim:
        from . import voice

        bad = tuple(p.name for p in problems)
        problems += [p for p in voice.sim_problems(ref, cand, prompt) if not p.name.startswith(bad)]
    return problems


def compare_sets(
    judge,
    ref: Sequence[Clip],
    cand: Sequence[Clip],
    margin_points: float = DEFAULT_MARGIN_POINTS,
    label: str = "",
    pack_dir: str | os.PathLike | None = None,
    rerun: str = "",
    voice_judge=None,
    mos_judge=None,
    prompt: tuple | list | None = None,  # (wav, sr) for every clip, or a list: one per clip
    sim_margin: float = SIM_MARGIN,
    mos_margin: float = MOS_MARGIN,
) -> Comparison:
    """Transcribe and score both sets, run the WER gate (margin in WER points) and, with their judges, the SIM and
    MOS gates (one verdict over all: `Comparison.overall`); write a listening pack when it does not pass. With
    `judge` None, WER is left out (a language no WER judge at hand hears): SIM and MOS decide, and at least one of
    their judges is needed.

    Every clip of both sets (and the prompt's audio) is checked first for what each judge given will hear
    (`bad_audio`): with any bad clip the comparison is `audio.Refused`, a failing verdict naming each, and no judge
    runs."""
    if judge is None and voice_judge is None and mos_judge is None:
        raise ValueError("nothing to judge with: give the WER judge, or a SIM or MOS judge")
    problems = bad_audio(ref, cand, voice_judge is not None, mos_judge is not None, prompt)
    if problems:
        refused = audio.Refused(tuple(problems), label)
        return Comparison(refused, None, None, None, refused)
    figures = judge_figures(judge, ref, cand, voice_judge, mos_judge, prompt)
    return decide(judge, ref, cand, figures, margin_points, label, pack_dir, rerun, voice_judge, mos_judge,
                  sim_margin, mos_margin)


def judge_figures(judge, ref: Sequence[Clip], cand: Sequence[Clip], voice_judge=None, mos_judge=None,
                  prompt: tuple | list | None = None) -> dict:
    """What every judge gives every clip, paired by position: {"hyps": (ref transcripts [N], cand [N])} with the
    WER judge, and judged_scores' {"SIM": (ref [N], cand [N]), "MOS-...": ...}. Each figure is the clip's own (a
    clip's figure does not depend on the others), so the figures of a set judged in shards and merged in the set's
    order are those of the whole set judged at once (harness.quality.shards)."""
    out = {}
    if judge is not None:
        out["hyps"] = (transcribe_set(judge, ref), transcribe_set(judge, cand))
    out.update(judged_scores(ref, cand, voice_judge, mos_judge, prompt))
    return out


def decide(judge, ref: Sequence[Clip], cand: Sequence[Clip], figures: dict,
           margin_points: float = DEFAULT_MARGIN_POINTS, label: str = "", pack_dir=None, rerun: str = "",
           voice_judge=None, mos_judge=None, sim_margin: float = SIM_MARGIN, mos_margin: float = MOS_MARGIN
           ) -> Comparison:
    """compare_sets' verdict from the judges' figures (judge_figures): WER's gate on the transcripts, SIM's and
    MOS's on their scores, one Overall; the listening pack when it does not pass."""
    verdict = ref_scored = cand_scored = ref_hyps = cand_hyps = None
    if judge is not None:
        ref_hyps, cand_hyps = (list(h) for h in figures["hyps"])
        ref_scored, cand_scored = (
            wer.score_set([c.id for c in clips], [c.text for c in clips], hyps, judge.identity,
                          groups=[c.group for c in clips], languages=[c.language for c in clips])
            for clips, hyps in ((ref, ref_hyps), (cand, cand_hyps)))
        verdict = gate(ref_scored, cand_scored, margin_points=margin_points, label=label, rerun=rerun)
    scores = {name: (np.asarray(r, dtype=float), np.asarray(c, dtype=float))
              for name, (r, c) in figures.items() if name != "hyps"}
    groups = [c.group for c in ref]
    gated = [verdict] if verdict is not None else []
    if "SIM" in scores:
        unit = getattr(voice_judge, "unit", SIM_UNIT)  # the judge's own: GE2E's cosine is not WavLM's
        gated.append(score_gate("SIM", unit, *scores["SIM"], groups, sim_margin, voice_judge.identity, label, rerun))
    for name, _, unit in mos_fields(mos_judge) if mos_judge is not None else ():
        gated.append(score_gate(name, unit, *scores[name], groups, mos_margin, mos_judge.identity, label, rerun))
    overall = Overall(tuple(gated), label) if len(gated) > 1 or verdict is None else None
    pack = None
    if not (overall or verdict).passed and pack_dir is not None:
        pack = write_listening_pack(pack_dir, ref, cand, ref_hyps, cand_hyps, ref_scored, cand_scored,
                                    verdict=overall or verdict, scores=scores)
    return Comparison(verdict, ref_scored, cand_scored, pack, overall, scores)


class MissingOutput(ValueError):
    """An item of the set with no wav in a side's output folder: named, never dropped."""


def set_clips(eval_set, folder: str | os.PathLike, side: str) -> list[Clip]:
    """The clips a side generated for every item of `eval_set` (harness.quality.sets), read from folder/<id>.wav,
    in the set's order: each in its item's language, its block the item's prompt (the items of one prompt share a
    voice). MissingOutput names every item without a wav."""
    folder = Path(folder)
    missing = [i.id for i in eval_set.items if not (folder / f"{i.id}.wav").is_file()]
    if missing:
        raise MissingOutput(f"the {side} side wrote no wav for {len(missing)} of {len(eval_set.items)} items of "
                            f"{eval_set.path} in {folder}: {', '.join(missing[:10])}"
                            + (" ..." if len(missing) > 10 else "") + "; every item is judged or the set is refused")
    clips = []
    for item in eval_set.items:
        wav, sr = sf.read(folder / f"{item.id}.wav", dtype="float32", always_2d=True)
        clips.append(Clip(item.id, item.target_text, wav.mean(axis=1), int(sr), group=str(item.prompt_wav),
                          language=item.language))
    return clips


def compare_set_folders(judge, eval_set, ref_dir, cand_dir, label: str = "", pack_dir=None, rerun: str = "",
                        **judges) -> Comparison:
    """compare_sets on an evaluation set's two output folders: each item judged against its own prompt (SIM to
    that prompt's audio), its words in its language (WER, CER for zh and ja), and the same paired statistics,
    each prompt's items one resampling block. `judges`: voice_judge, mos_judge and the margins."""
    ref, cand = set_clips(eval_set, ref_dir, "reference"), set_clips(eval_set, cand_dir, "candidate")
    prompts = [item.prompt_audio() for item in eval_set.items]
    return compare_sets(judge, ref, cand, label=label, pack_dir=pack_dir, rerun=rerun, prompt=prompts, **judges)


def gate_on_holdout(
    judge,
    reference: Callable[[Sequence[corpus.Item], Sequence[int]], list[Clip]],
    candidate: Callable[[Sequence[corpus.Item], Sequence[int]], list[Clip]],
    seeds: Sequence[int] = (0,),
    margin_points: float = DEFAULT_MARGIN_POINTS,
    label: str = "",
    pack_dir: str | os.PathLike | None = None,
    rerun: str = "",
    **judges,
) -> Comparison:
    """The final gate: the only code path that reads the holdout sentences. Tune on "dev", decide here.
    `judges`: compare_sets' voice_judge, mos_judge, prompt (the voice prompt's (wav, sr)) and margins.

    reference, candidate: (sentences, seeds) -> clips, e.g. a `generate_set` of a model in a given state (each
    builds its own, so a patch applied for the candidate cannot leak into the reference). Every sentence is
    generated once per seed; the seeds of a sentence form one resampling block."""
    sentences = corpus.read_holdout_for_gate()
    ref = reference(sentences, seeds)
    cand = candidate(sentences, seeds)
    return compare_sets(judge, ref, cand, margin_points=margin_points, label=label or "holdout", pack_dir=pack_dir,
                        rerun=rerun, **judges)
