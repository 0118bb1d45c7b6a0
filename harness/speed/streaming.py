"""Time to first audio (TTFA) and underruns of `fastpath.stream`, against one `generate` call of the whole text.

A round of a variant is one request: the clock starts at the call and each piece's arrival is read when the
generator hands it over (pieces are NumPy arrays on the CPU, so the device has finished them). TTFA = arrival of
the first piece; a `generate` call's TTFA is its whole wall time (nothing plays before it returns). The listener
starts playback at the first piece and plays in real time; a piece that arrives after the audio before it has
finished playing is an underrun, and the listener waits for it (`playback`). Rounds alternate the variants
(A B C A B C ...) after one warm-up round each, which is reported apart and kept out of the figures.

    fastpath-suite stream --out out/stream [--size full] [--steps 8] [--rounds 4] [--device cpu]
                          [--dtype bfloat16] [--apply defaults]

`--apply` patches the model once for the whole run (e.g. the GPU tier, whose graph captures should not be redone
every round) and then compares `generate` with `stream` on it.

writes OUT/streaming.json (machine, command, raw rounds) and OUT/streaming.md (the table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

VARIANTS = {  # name -> (how the text is generated, patches)
    "generate": ("whole", ()),
    "stream": ("stream", ()),
    "stream+lossless": ("stream", "lossless"),
}


@dataclass
class Listen:
    """One request as a listener hears it."""

    ttfa: float  # seconds from the call to the first audio
    waits: list = field(default_factory=list)  # seconds waited before each later piece (0.0: it was ready)
    total: float = 0.0  # seconds from the call to the last piece
    audio: float = 0.0  # seconds of audio handed out

    @property
    def underrun(self) -> float:
        return float(sum(self.waits))

    @property
    def underruns(self) -> int:
        return sum(w > 0 for w in self.waits)


def playback(arrivals: list, durations: list) -> list:
    """Seconds the listener waits before each piece after the first: playback starts at the first arrival and
    runs in real time; a piece that is not there when the audio before it ends is waited for."""
    waits, ends = [], arrivals[0] + durations[0]
    for arrival, duration in zip(arrivals[1:], durations[1:]):
        waits.append(max(0.0, arrival - ends))
        ends = max(ends, arrival) + duration
    return waits


def listen_stream(model, kwargs: dict, seed: int = 0) -> Listen:
    import torch

    import fastpath

    kwargs = dict(kwargs)
    text = kwargs.pop("text")
    torch.manual_seed(seed)
    arrivals, durations = [], []
    start = time.perf_counter()
    for piece in fastpath.stream(model, text, **kwargs):
        arrivals.append(time.perf_counter() - start)
        durations.append(piece.shape[-1] / model.sampling_rate)
    return Listen(arrivals[0], playback(arrivals, durations), arrivals[-1], float(sum(durations)))


def listen_whole(model, kwargs: dict, seed: int = 0) -> Listen:
    import torch

    from fastpath.gpu import synchronize

    synchronize(model.device)
    torch.manual_seed(seed)
    start = time.perf_counter()
    audio = model.generate(**kwargs)[0]
    seconds = time.perf_counter() - start
    return Listen(seconds, [], seconds, audio.shape[-1] / model.sampling_rate)


def interleaved_listens(model, kwargs: dict, rounds: int, variants: dict = VARIANTS, seed: int = 0,
                        on_call=None) -> dict:
    """{variant: {"warmup": Listen, "rounds": [Listen] * rounds}}, variants alternated round by round;
    `on_call(round, variant)` after each request (progress)."""
    import fastpath

    out = {name: {"warmup": None, "rounds": []} for name in variants}
    for r in range(rounds + 1):
        for name, (how, patches) in variants.items():
            names = list(fastpath.LOSSLESS) if patches == "lossless" else list(patches)
            with fastpath.patched(model, names):
                heard = (listen_stream if how == "stream" else listen_whole)(model, kwargs, seed)
            if r == 0:
                out[name]["warmup"] = heard
            else:
                out[name]["rounds"].append(heard)
            if on_call:
                on_call(r, name)
    return out


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summary(rounds: list) -> dict:
    """p50/p95 (linear interpolation between rounds) of TTFA and of the total underrun, and the worst count."""
    ttfa = [r.ttfa for r in rounds]
    under = [r.underrun for r in rounds]
    return {"ttfa_p50": percentile(ttfa, 50), "ttfa_p95": percentile(ttfa, 95),
            "underrun_p50": percentile(under, 50), "underrun_p95": percentile(under, 95),
            "underruns_max": max(r.underruns for r in rounds), "pieces": len(rounds[0].waits) + 1,
            "audio": rounds[0].audio, "total_p50": percentile([r.total for r in rounds], 50)}


def table(results: dict) -> str:
    """Markdown: one row per point and variant."""
    header = ("| point | variant | TTFA p50 | TTFA p95 | underrun p50 (s waited) | underrun p95 | waits (most) | "
              "pieces | audio s | last piece p50 |")
    rows = [header, "|" + "---|" * 10]
    for point, by_variant in results.items():
        for name, data in by_variant.items():
            s = summary(data["rounds"])
            under = "- | - | -" if name == "generate" else \
                f"{s['underrun_p50']:.2f} | {s['underrun_p95']:.2f} | {s['underruns_max']}"
            rows.append(f"| {point} | {name} | {s['ttfa_p50']:.2f} | {s['ttfa_p95']:.2f} | {under} | {s['pieces']} | "
                        f"{s['audio']:.1f} | {s['total_p50']:.2f} |")
    return "\n".join(rows)


def main(argv: list | None = None) -> int:
    from harness.run import results as results_files
    from harness.model.checkpoint import add_model_arguments, load_model_of
    from harness.run.cli import int_at_least
    from harness.run.progress import Progress

    parser = argparse.ArgumentParser(prog="fastpath-suite stream", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for streaming.json and streaming.md")
    add_model_arguments(parser, size="full")
    parser.add_argument("--steps", type=int_at_least(1), default=None, help="unmasking steps (default: each point's)")
    parser.add_argument("--rounds", type=int_at_least(1), default=4, help="interleaved rounds after one warm-up")
    parser.add_argument("--points", nargs="*", default=None, help="stream point names (default: all)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                        help="which of VARIANTS to time")
    parser.add_argument("--apply", nargs="*", default=None,
                        help="patch names, or 'defaults' (fastpath.defaults: what pays on the device), applied once")
    results_files.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("stream", args.quiet)

    import fastpath
    from harness.run.machine import machine_info
    from harness.model.points import load_points

    checkpoint, model = load_model_of(args)
    variants = {name: VARIANTS[name] for name in args.variants}
    if args.apply is not None:
        fastpath.apply(model, fastpath.defaults(model) if args.apply == ["defaults"] else args.apply)
        variants = {"generate": ("whole", ()), "stream": ("stream", ())}
    points = [p for p in load_points("stream") if not args.points or p.name in args.points]
    results, raw = {}, {}
    prompts: dict = {}
    for p in points:
        kwargs = p.generate_kwargs(model, prompts)
        if args.steps:
            kwargs["num_step"] = args.steps
        name = f"{p.voice}-{p.text}-{kwargs['num_step']}"
        with progress.stage(name, total=(args.rounds + 1) * len(variants)) as step:
            results[name] = interleaved_listens(
                model, kwargs, args.rounds, variants,
                on_call=lambda r, v: step(f"{v} " + (f"round {r}/{args.rounds}" if r else "warm-up")))
        raw[name] = {v: {"warmup": asdict(d["warmup"]), "rounds": [asdict(r) for r in d["rounds"]]}
                     for v, d in results[name].items()}
        print("\n".join(table({name: results[name]}).splitlines()[2:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = results_files.command_line()
    info = {"machine": machine_info(args.device), "checkpoint": checkpoint.identity, "command": command,
            "applied": fastpath.applied(model), "rounds": args.rounds, "points": raw}
    (args.out / "streaming.json").write_text(json.dumps(info, indent=1))
    (args.out / "streaming.md").write_text(table(results) + "\n")
    print(table(results))
    results_files.write_if_asked(args, "stream", {k: info[k] for k in ("checkpoint", "applied", "rounds", "points")},
                                 args.device)
    return 0


def render_results(figures: dict) -> str:
    """A stream results file as the table (raw rounds rebuilt as Listen)."""
    results = {name: {v: {"warmup": Listen(**d["warmup"]), "rounds": [Listen(**r) for r in d["rounds"]]}
                      for v, d in by_variant.items()} for name, by_variant in figures["points"].items()}
    applied = ", ".join(figures["applied"]) or "none"
    return (f"Checkpoint {figures['checkpoint']}; patches applied for the whole run: {applied}; seconds, median (p50) "
            f"and p95 of {figures['rounds']} interleaved rounds after one warm-up.\n\n" + table(results))


if __name__ == "__main__":
    sys.exit(main())
