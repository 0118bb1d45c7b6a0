"""Generate an evaluation set's items into a folder of wavs, the field's way (Seed-TTS-eval scores a folder of
`<utt>.wav`), in whichever environment runs it: the version-bump gate runs it in the candidate's venv and in the
--against one, then judges the two folders item by item (harness.gate.gate, check "quality-set").

    python -m harness.quality.clone_run SET OUT --checkpoint PATH [--synth omnivoice]
    python -m harness.quality.clone_run SET OUT --synth espeak
    python -m harness.quality.clone_run SET OUT --checkpoint PATH --shard K/N   # worker K of N (harness.quality.shards)

Synthesizers:
  * omnivoice: the checkpoint loaded with this environment's omnivoice, the lossless stack applied (what ships),
    each item generated from its prompt (`ref_audio` the prompt's file, `ref_text`, `language`) with the item's own
    seed; needs real weights for speech (the test checkpoint's random weights say nothing a judge can hear).
  * espeak: the stand-in that checks the gate itself offline: espeak-ng says each item's target text in the voice
    that spoke its prompt (a set built by harness.quality.espeak_set: voices.json). The environment's omnivoice
    package decides the damage, where a stand-in fork of it sets `STANDIN_DAMAGE` ("noise", "swap";
    harness.quality.espeak_set.DAMAGES); the released omnivoice sets none, so its outputs are the clean ones.

Writes OUT/<id>.wav (float32, the synthesizer's rate) for every item and OUT/manifest.json (the synthesizer, the
omnivoice distribution and version that ran, the items and seeds). An item that fails stops the run, named. With
`--shard K/N` only worker K's share of the items (harness.quality.shards.split) and OUT/manifest-K-of-N.json: each
item's output is the one a serial run gives (its seed is its id's, its damage its place in the whole set's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import soundfile as sf

SYNTHS = ("omnivoice", "espeak")


def item_seed(item_id: str, base: int = 0) -> int:
    from .evaluate import sentence_seed

    return sentence_seed(item_id, base)


def omnivoice_clips(eval_set, checkpoint, device: str = "cpu", num_step: int | None = None, stack: bool = True,
                    model=None, only=None):
    """(id, wav, sr) of every item from OmniVoice, with the lossless stack applied (`stack`) or stock; `model` an
    already loaded one (else loaded from `checkpoint`), left as it was found."""
    import torch

    import fastpath
    from harness.model.checkpoint import load_model

    model = model if model is not None else load_model(checkpoint, device=device)
    if stack:
        fastpath.apply(model)
    extra = {"num_step": num_step} if num_step else {}
    try:
        for item in eval_set.items:
            if only is not None and item.id not in only:
                continue
            torch.manual_seed(item_seed(item.id))
            wav = model.generate(text=item.target_text, language=item.language, ref_audio=str(item.prompt_wav),
                                 ref_text=item.prompt_text, **extra)[0]
            yield item.id, wav, int(model.sampling_rate)
    finally:
        if stack:
            fastpath.revert(model)


def espeak_clips(eval_set, only=None):
    import omnivoice

    from . import espeak_set

    damage = getattr(omnivoice, "STANDIN_DAMAGE", "none")
    for clip in espeak_set.outputs(eval_set, damage, only=only):
        yield clip.id, clip.wav, clip.sr


def run(set_path: str, out: str, synth: str = "omnivoice", checkpoint: str | None = None, device: str = "cpu",
        num_step: int | None = None, log=print, shard: tuple[int, int] = (0, 1), stock: bool = False) -> dict:
    import importlib.metadata as md

    from . import sets
    from .shards import split

    if synth not in SYNTHS:
        raise ValueError(f"unknown synthesizer {synth!r}: one of {SYNTHS}")
    if synth == "omnivoice" and not checkpoint:
        raise ValueError("the omnivoice synthesizer needs --checkpoint PATH (a real OmniVoice checkpoint folder)")
    eval_set = sets.read_set(set_path)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    k, workers = shard
    mine = split(eval_set.items, workers)[k]
    only = None if workers == 1 else {i.id for i in mine}
    clips = (omnivoice_clips(eval_set, checkpoint, device, num_step, stack=not stock, only=only) if synth == "omnivoice"
             else espeak_clips(eval_set, only))
    start, n = time.perf_counter(), len(mine)
    for done, (item_id, wav, sr) in enumerate(clips, 1):
        sf.write(folder / f"{item_id}.wav", wav, sr, subtype="FLOAT")
        if done == 1 or done == n or done % 10 == 0:
            took = time.perf_counter() - start
            log(f"[clone-run] {done}/{n} items, {took:.0f} s, about {took / done * (n - done):.0f} s left")
    manifest = {"set": str(eval_set.path), "synth": synth, "checkpoint": checkpoint, "device": device, "stock": stock,
                "num_step": num_step, "omnivoice": md.version("omnivoice"),  # a fork's venv reads the fork's
                "shard": [k, workers], "items": [{"id": i.id, "seed": item_seed(i.id)} for i in mine]}
    name = "manifest.json" if workers == 1 else f"manifest-{k}-of-{workers}.json"
    (folder / name).write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    from .shards import parse_shard

    parser = argparse.ArgumentParser(prog="python -m harness.quality.clone_run", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("set", help="a Seed-TTS-eval meta.lst (or its folder), or a LibriSpeech-PC list")
    parser.add_argument("out", help="the folder to write <id>.wav and manifest.json into")
    parser.add_argument("--synth", choices=SYNTHS, default="omnivoice")
    parser.add_argument("--checkpoint", default=None, help="a real OmniVoice checkpoint (synth omnivoice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-step", type=int, default=None, help="generate's num_step (omnivoice's default)")
    parser.add_argument("--shard", type=parse_shard, default=(0, 1), help="K/N: only worker K of N's items")
    parser.add_argument("--stock", action="store_true", help="synth omnivoice without the lossless stack (stock)")
    args = parser.parse_args(argv)
    run(args.set, args.out, args.synth, args.checkpoint, args.device, args.num_step,
        log=lambda msg: print(msg, file=sys.stderr, flush=True), shard=args.shard, stock=args.stock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
