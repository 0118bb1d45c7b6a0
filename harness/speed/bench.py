"""Interleaved A/B timing of stock vs fastpath on chosen operating points; prints a table, writes JSON.

    fastpath-suite bench --size full --points clone6-medium-16 --rounds 3 --out out/bench.json

Variants by name (`--variants`), each optionally at a dtype (`name@bf16`), for the GPU tier:

    fastpath-suite bench --size full --device cuda --points clone6-medium-32 \\
        --variants stock@fp32 stock@bf16 gpu@bf16 preset@bf16 --rounds 5 --out out/gpu.json \\
        --save-baseline out/baseline.json

    stock      no patch                        lossless   the CPU-exact stack (fastpath.LOSSLESS)
    peer       the public omnivoice-fastpath 0.1.0 (`pip install -e .[peers]`): apply_trimmed_cfg(model)
    tts-inference  omnivoice-tts-inference 0.1.0 (`pip install -e .[peers]`): its own OmniVoice class, loaded
               from the same checkpoint folder, default settings (sdpa; its FlashInfer and int8 modes are not run);
               auto-voice points only: it has no voice cloning and takes one text per call
    batch-invariant  lossless + batch_invariant    prefix-kv  lossless + prefix_kv_cache (lossy, refresh 2)
    gpu        fastpath.defaults(device)       preset     gpu + fastpath.FULL_PRESET (12 steps)
    stock-preset  no patch, 12 steps           gpu-compiled / gpu-reduce-overhead / gpu-max-autotune
                                               gpu with cuda_graphs replaced by that compile mode

Each distinct (dtype, patch set) gets its own model instance, patched once (captures and compiles are paid in
the warm-up round, reported as first-call seconds, never in the samples).

The FLOP bound (`--bound`, CPU): each variant's FLOPs of one whole generate at the point's shapes and the timed
step count (`flop_bounds`: counted at 2 steps, the loop's share scaled: every step has the same shapes), by
torch's flop counter with the CPU attention kernel added; bound = first
variant's FLOPs / this variant's, the speedup a perfect implementation of the same arithmetic would reach where
compute is all that costs; efficiency = measured speedup / bound. Stock, the public package and this project
side by side, at full size:

    fastpath-suite bench --size full --variants stock peer lossless --points auto-short-10 \
        clone6-medium-16 --rounds 3 --bound --out out/peers.json
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import fastpath
from harness.model.checkpoint import load_model, resolve_checkpoint
from harness.run.cli import int_at_least
from harness.model.devices import DTYPE_NAMES, torch_dtype
from harness.run.machine import device_key, machine_info, summary
from harness.speed.measure import Variant, count_work, interleaved_variants
from harness.model.points import point

DTYPES = tuple(DTYPE_NAMES)
PEERS_INSTALL = ("pip install -e '.[peers]' (omnivoice-fastpath==0.1.0 and omnivoice-tts-inference==0.1.0, the "
                 "public packages this project compares with)")


@dataclass(frozen=True)
class Peer:
    """Another package's OmniVoice inference, timed beside stock and this project from the same checkpoint folder:
    either a function it applies to a stock-loaded model instance (`apply`), or its own model class (`model_class`),
    loaded with `from_pretrained(folder, device_map=device, dtype=dtype)`."""

    module: str  # import name
    requirement: str  # what the `peers` extra installs
    apply: str | None = None
    model_class: str | None = None
    voice_cloning: bool = True
    batches: bool = True  # generate() takes a list of texts

    def cannot_run(self, point_name: str) -> str | None:
        """Why this peer cannot run a point of fixtures/points.json, or None."""
        from harness.model.points import load_spec, point

        p, spec = point(point_name), load_spec()
        if not self.voice_cloning and spec["voices"][p.voice].get("ref"):
            return f"{self.requirement} has no voice cloning (its codec loads decode-only: no encoder for a reference)"
        if not self.batches and not p.each and isinstance(spec["texts"][p.text], list):
            return f"{self.requirement}'s generate() takes one text, not a batch"
        return None


# variant name -> the package it runs
PEERS = {
    "peer": Peer("omnivoice_fastpath", "omnivoice-fastpath==0.1.0", apply="apply_trimmed_cfg"),
    "tts-inference": Peer("omnivoice_tts", "omnivoice-tts-inference==0.1.0", model_class="OmniVoice",
                          voice_cloning=False, batches=False),
}
BOUND_STEPS = 2
BASELINE_COMMAND = "fastpath-suite bench ... --save-baseline PATH"


@dataclass(frozen=True)
class VariantSpec:
    name: str  # as given, e.g. "gpu@bf16"
    patches: tuple
    dtype: str
    overrides: dict = field(default_factory=dict, hash=False, compare=False)


def _replace_graphs(patches: list, mode_patch: str) -> tuple:
    return tuple(mode_patch if p == "cuda_graphs" else p for p in patches) if "cuda_graphs" in patches \
        else tuple(patches) + (mode_patch,)


def variant_table(device: str) -> dict:
    """Variant name -> (patches, generate overrides) on `device`."""
    gpu = list(fastpath.defaults(device))
    return {
        "stock": ((), {}),
        "peer": ((), {}),  # PEERS: the patch is applied when its model is built
        "tts-inference": ((), {}),  # PEERS: its own model class, no fastpath patch
        "stock-preset": ((), dict(fastpath.FULL_PRESET)),
        "lossless": (tuple(fastpath.LOSSLESS), {}),
        "batch-invariant": (tuple(fastpath.LOSSLESS) + ("batch_invariant",), {}),
        "prefix-kv": (tuple(fastpath.LOSSLESS) + ("prefix_kv_cache",), {}),  # default refresh interval
        "gpu": (tuple(gpu), {}),
        "preset": (tuple(gpu), dict(fastpath.FULL_PRESET)),
        "gpu-packed": (tuple(gpu) + ("packed_cfg",), {}),  # the stack with packed CFG (off by default until measured)
        "gpu-compiled": (_replace_graphs(gpu, "compiled_llm"), {}),
        "gpu-reduce-overhead": (_replace_graphs(gpu, "compiled_llm_reduce_overhead"), {}),
        "gpu-max-autotune": (_replace_graphs(gpu, "compiled_llm_max_autotune"), {}),
    }


def parse_variant(text: str, device: str, default_dtype: str) -> VariantSpec:
    """'gpu' or 'gpu@bf16' -> VariantSpec; an unknown name or dtype raises ArgumentTypeError listing the known."""
    name, _, dtype = text.partition("@")
    dtype = dtype or default_dtype
    table = variant_table(device)
    if name not in table:
        raise argparse.ArgumentTypeError(f"unknown variant {name!r}; known: {sorted(table)}")
    if dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {dtype!r} in {text!r}; known: {list(DTYPES)}")
    patches, overrides = table[name]
    return VariantSpec(text if "@" in text else f"{name}@{dtype}", patches, dtype, overrides)


def peer_module(name: str):
    """The module of a peer variant; a clear error naming the install when it is missing."""
    import importlib

    module = PEERS[name].module
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise SystemExit(f"variant {name!r} needs the {module} package, which is not installed: {PEERS_INSTALL}") from err


def peer_apply(name: str):
    """The function a peer variant applies to a stock model instance."""
    return getattr(peer_module(name), PEERS[name].apply)


def load_peer_model(name: str, ckpt, device: str, dtype: str):
    """A peer's own model class loaded from the checkpoint folder, the way its README loads one."""
    model = getattr(peer_module(name), PEERS[name].model_class).from_pretrained(
        str(ckpt.path), device_map=device, dtype=torch_dtype(dtype))
    # its loader leaves the folder unrecorded; transformers' from_pretrained records it, and harness.model.points reads it
    # to tell a built checkpoint (no silence trimming on random weights) from a real one
    model.config.name_or_path = str(ckpt.path)
    return model


def variant_peer(variant: str) -> str | None:
    """The PEERS name of a variant ("tts-inference@fp32" -> "tts-inference"), None for this project's."""
    name = variant.partition("@")[0]
    return name if name in PEERS else None


def cannot_run(variant: str, point_name: str) -> str | None:
    """Why a variant cannot run a point (a peer without voice cloning at a cloned point), or None."""
    peer = variant_peer(variant)
    return PEERS[peer].cannot_run(point_name) if peer else None


def check_points(variants, names) -> None:
    """The first variant is the base every other is compared with: it must run every point."""
    base = next(iter(variants))
    for name in names:
        reason = cannot_run(base, name)
        if reason:
            raise ValueError(f"{base} cannot run {name}, and the first variant is the one the others are compared "
                             f"with: {reason}; put another variant first or choose other points")


def build_variants(ckpt, specs: list, device: str) -> dict:
    """One model per distinct (dtype, patches kept applied, peer); returns name -> measure.Variant."""
    from fastpath.registry import PROCESS_GLOBAL

    models: dict = {}
    out = {}
    for spec in specs:
        kept = tuple(sorted(p for p in spec.patches if p not in PROCESS_GLOBAL))
        peer = variant_peer(spec.name)
        key = (spec.dtype, kept, peer)
        if key not in models:
            if peer and PEERS[peer].model_class:
                models[key] = load_peer_model(peer, ckpt, device, spec.dtype)
            else:
                models[key] = load_model(ckpt, device=device, dtype=torch_dtype(spec.dtype))
            if peer and PEERS[peer].apply:
                peer_apply(peer)(models[key])
        out[spec.name] = Variant(models[key], spec.patches, dict(spec.overrides))
    return out


def point_kwargs(name: str, model, prompts: dict, steps: int | None = None):
    """generate kwargs of a point (a list for an `each` point), with its step count replaced by `steps` if given."""
    kwargs = point(name).generate_kwargs(model, prompts)
    if steps is None:
        return kwargs
    return [dict(k, num_step=steps) for k in kwargs] if isinstance(kwargs, list) else dict(kwargs, num_step=steps)


def runnable(variants: dict, name: str) -> dict:
    """The variants that can run point `name` (a peer without voice cloning is left out of a cloned point)."""
    return {v: variant for v, variant in variants.items() if not cannot_run(v, name)}


def run_variant_bench(variants: dict, names, rounds: int, steps: int | None = None, progress=None,
                      on_point=None) -> dict:
    """Points x variants (name -> measure.Variant), interleaved; voice prompts encoded once with the first model.
    A variant that cannot run a point (`cannot_run`) is left out of that point's results. `progress`
    (harness.run.progress.Progress) shows a step per timed call; `on_point(results so far)` runs after each point."""
    from harness.run.progress import QUIET

    check_points(variants, names)
    progress = progress or QUIET
    prompts: dict = {}
    first = next(iter(variants.values())).model
    out = {}
    total = sum(len(runnable(variants, name)) for name in names) * (rounds + 1)
    with progress.stage("timing", total=total) as step:
        for name in names:
            def on_call(r, v, name=name):
                step(f"{name} {v} " + ("warm-up" if r == 0 else f"round {r}/{rounds}"))

            out[name] = interleaved_variants(runnable(variants, name), point_kwargs(name, first, prompts, steps),
                                             rounds, on_call=on_call)
            if on_point:
                on_point(out)
    return out


def flop_bounds(variants: dict, names, steps: int | None = None) -> dict:
    """point -> variant -> FLOPs of one whole generate (text preparation, the unmasking loop, decoding; voice prompts
    are encoded before, as in the timed calls) at `steps` unmasking steps (None: the point's own), each variant's
    model with its patches. Counted at BOUND_STEPS steps, whole call and loop alone; the loop's share is scaled to
    `steps` (every step has the same shapes), so the bound compares the same work the clock measures."""
    from harness.speed.measure import patched_if_any

    prompts: dict = {}
    first = next(iter(variants.values())).model
    out = {}
    for name in names:
        timed, counted = (point_kwargs(name, first, prompts, n) for n in (steps, BOUND_STEPS))
        pairs = list(zip(timed, counted)) if isinstance(timed, list) else [(timed, counted)]
        out[name] = {}
        for v, variant in runnable(variants, name).items():
            total = 0.0
            with patched_if_any(variant.model, variant.patches):
                for t, k in pairs:
                    call = {**k, **variant.overrides}
                    loop = count_work(variant.model, seed=0, **call).flops
                    whole = count_work(variant.model, seed=0, whole_call=True, **call).flops
                    total += whole + (t["num_step"] / BOUND_STEPS - 1) * loop
            out[name][v] = round(total)
    return out


def format_table(results: dict, variants: dict, machine: str | None, flops: dict | None = None) -> str:
    """Medians per variant, the speedup of each over the first, and with `flops` the FLOP bound and efficiency.

    A point whose rounds fail the stability rule (harness.speed.stability) shows "unstable" instead of its
    speedups, with the reason under the table: a ratio the rounds disagree on is not a measurement; one with fewer
    rounds than the rule needs shows "unjudged". A variant that could not run a point shows "-" there, with the
    reason under the table."""
    from harness.speed import stability

    base, *others = list(variants)
    head = ["point"] + [f"{v} RTF (median, IQR)" for v in variants] + [f"{o} vs {base}" for o in others]
    if flops:
        head += [f"{o} bound" for o in others] + [f"{o} efficiency" for o in others]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    notes = []
    for name, samples in results.items():
        judged = stability.judge(samples)
        ran = [o for o in others if o in samples]
        speedups = {o: samples[base].median / samples[o].median for o in ran}
        cells = [f"{samples[v].median:.3f} ({samples[v].iqr:.3f})" if v in samples else "-" for v in variants]
        cells += ["-" if o not in ran else f"{speedups[o]:.2f}x" if judged.stable else judged.verdict for o in others]
        if flops:
            bounds = {o: flops[name][base] / flops[name][o] for o in ran}
            cells += [f"{bounds[o]:.2f}x" if o in ran else "-" for o in others]
            cells += [f"{speedups[o] / bounds[o]:.2f}" if judged.stable and o in ran else "-" for o in others]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        notes += [f"{name}: {v} not run: {cannot_run(v, name) or 'no samples'}" for v in variants if v not in samples]
        if not judged.stable:
            spread = ", ".join(f"{v} {x:.0%}" for v, x in judged.spreads.items()) if judged.judged else ""
            notes.append(f"{name}: {judged.message}" + (f"; per-round ratios spread {spread} of their median "
                         f"(stable: at most {stability.MAX_RATIO_SPREAD:.0%})" if spread else ""))
    text = "\n".join(lines)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return text + (f"\n\nMachine: {machine}" if machine else "")


def format_first_calls(results: dict) -> str:
    lines = ["| point | variant | first call s (warm-up: captures, compiles) | median s |", "|---|---|---|---|"]
    for name, samples in results.items():
        for v, s in samples.items():
            median_s = sorted(s.seconds)[len(s.seconds) // 2]
            lines.append(f"| {name} | {v} | {s.first_call_seconds:.3f} | {median_s:.4f} |")
    return "\n".join(lines)


def baseline_points(results: dict, specs: dict, checkpoint: str) -> dict:
    """save_baseline points: '<point>/<variant>' -> RTF samples with the variant's settings as extra."""
    points = {}
    for name, samples in results.items():
        for v, s in samples.items():
            spec = specs[v]
            points[f"{name}/{v}"] = {"metric": "rtf", "samples": s.rtf, "extra": {
                "checkpoint": checkpoint, "dtype": spec.dtype, "patches": list(spec.patches),
                "overrides": spec.overrides, "audio_seconds": s.audio_seconds,
                "first_call_seconds": s.first_call_seconds}}
    return points


def build_parser(prog: str = "fastpath-suite bench", **defaults) -> argparse.ArgumentParser:
    from harness.run import results

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny", help="built test checkpoint size")
    parser.add_argument("--checkpoint", default=None, help="a real checkpoint folder instead of the built one")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="dtype of variants named without @dtype")
    parser.add_argument("--points", nargs="+", default=["clone6-medium-32"], help="names from fixtures/points.json (speed)")
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="timed rounds per variant, after one warm-up")
    parser.add_argument("--num-step", type=int_at_least(1), default=None,
                        help="unmasking steps for every point instead of its own (not with --save-baseline)")
    parser.add_argument("--variants", nargs="+", default=["stock", "lossless"], metavar="NAME[@DTYPE]",
                        help="variants to time, the first is the one the others are compared with")
    parser.add_argument("--bound", action="store_true",
                        help="also count each variant's FLOPs (CPU) and print the FLOP bound and efficiency")
    parser.add_argument("--out", type=Path, default=None, help="JSON with every sample and the machine")
    parser.add_argument("--save-baseline", type=Path, default=None, metavar="PATH",
                        help="also write the samples as a speed baseline (harness.speed.baselines)")
    results.add_arguments(parser)
    parser.set_defaults(**defaults)
    return parser


def grid_parser() -> argparse.ArgumentParser:
    """`fastpath-suite grid`: bench over every speed point of fixtures/points.json, full size, stock against the
    public package and the lossless stack, 8 steps (every step has the same shapes, so the variants' ratio is the
    one at any count, less the fixed costs of encoding and decoding), with the FLOP bound."""
    from harness.model.points import load_points

    return build_parser("fastpath-suite grid", size="full", num_step=8, rounds=3, bound=True,
                        variants=["stock", "peer", "lossless"],
                        points=[p.name for p in load_points("speed") if not p.name.endswith("-each")])


def figures_of(results: dict, specs: dict, checkpoint: str, device: str, steps, flops) -> dict:
    """The raw figures a results file keeps: every sample, so the page renders the same table from them."""
    return {"checkpoint": checkpoint, "device": device, "steps": steps,
            "variants": {n: {"patches": list(s.patches), "dtype": s.dtype, "overrides": s.overrides}
                         for n, s in specs.items()},
            "points": {p: {v: {"rtf": s.rtf, "load": s.load, "first_call_s": s.first_call_seconds}
                           for v, s in r.items()} for p, r in results.items()},
            "flops": flops}


def render_results(figures: dict) -> str:
    """A bench or grid results file as its table (the same rule for "unstable" as when it was measured)."""
    from harness.speed.measure import Samples

    results = {p: {v: Samples(v, (), rtf=list(d["rtf"]), load=list(d.get("load") or []),
                              first_call_seconds=d.get("first_call_s")) for v, d in r.items()}
               for p, r in figures["points"].items()}
    steps = f", {figures['steps']} steps" if figures.get("steps") else ""
    rounds = len(next(iter(next(iter(results.values())).values())).rtf) if results else 0
    head = (f"Checkpoint {figures['checkpoint']}, {figures['device']}{steps}, {rounds} interleaved rounds after one "
            "warm-up each; RTF = seconds per second of audio, speedup = the first variant's median RTF over the "
            "variant's" + ("; bound = the FLOP ratio, efficiency = speedup / bound" if figures.get("flops") else "")
            + ".")
    return head + "\n\n" + format_table(results, figures["variants"], None, figures.get("flops"))


def write_out(path: Path, results: dict, complete: bool, **fields) -> None:
    """The --out JSON: every sample of the points done so far, the machine and `fields` (command, checkpoint,
    ...). Written after each point with `complete` false, and at the end, so a bench stopped at a time limit keeps
    the points it finished (`points_planned` names the rest); whole, then renamed into place, so a stop while
    writing leaves the previous version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({**fields, "complete": complete, "results": {
        n: {v: vars(s) for v, s in r.items()} for n, r in results.items()}}, indent=1, default=str))
    partial.replace(path)


def main(argv=None, parser: argparse.ArgumentParser | None = None, kind: str = "bench") -> int:
    from harness.run import results as results_files
    from harness.run.progress import Progress

    from harness.speed import conditions

    parser = parser or build_parser()
    args = parser.parse_args(argv)
    command = results_files.command_line()
    begun = conditions.start()

    if args.num_step is not None and args.save_baseline:
        parser.error("--num-step changes the points, so their baseline would be wrong; drop one of the two")
    ckpt = resolve_checkpoint(args.checkpoint, size=args.size)
    try:
        specs = {s.name: s for s in (parse_variant(v, args.device, args.dtype) for v in args.variants)}
        check_points(specs, args.points)
    except (argparse.ArgumentTypeError, KeyError, ValueError) as err:
        parser.error(str(err))
    progress = Progress(kind, args.quiet)
    progress.say(f"{len(args.points)} point(s) x {len(specs)} variant(s) x {args.rounds} round(s) after a warm-up, "
                 f"{ckpt.identity} on {args.device}")
    variants = build_variants(ckpt, list(specs.values()), args.device)
    described = {"command": command, "checkpoint": ckpt.identity, "points_planned": list(args.points),
                 "variants": {n: {"patches": list(s.patches), "dtype": s.dtype, "overrides": s.overrides}
                              for n, s in specs.items()}}

    def so_far(done: dict) -> None:
        if args.out:
            info = dict(machine_info(args.device), conditions=conditions.since(begun))
            write_out(args.out, done, False, **described, device_key=device_key(info), machine=info)

    results = run_variant_bench(variants, args.points, args.rounds, args.num_step, progress, on_point=so_far)
    if args.bound:
        progress.say("counting FLOPs (no clock)")
    flops = flop_bounds(variants, args.points, args.num_step) if args.bound else None
    info = dict(machine_info(args.device), conditions=conditions.since(begun))  # what the timings ran beside
    gpu = f"{info.get('gpu_name')}, " if info.get("gpu_name") else ""
    machine = f"{gpu}{summary()}, torch {info['versions']['torch']}, {platform.platform()}"
    print(format_table(results, specs, machine, flops))
    print()
    print(format_first_calls(results))
    key = device_key(info)
    if args.out:
        write_out(args.out, results, True, **described, device_key=key, machine=info, flops=flops,
                  flops_of="one whole generate at the timed step count (flop_bounds)" if flops else None)
    if args.save_baseline:
        from harness.speed.baselines import save_baseline

        save_baseline(args.save_baseline, device_key=key, machine=info,
                      points=baseline_points(results, specs, ckpt.identity), command=command)
        print(f"baseline for {key} written to {args.save_baseline}")
    results_files.write_if_asked(args, kind, figures_of(results, specs, ckpt.identity, args.device, args.num_step,
                                                        flops), args.device)
    return 0


def grid_main(argv=None) -> int:
    return main(argv, grid_parser(), "grid")


if __name__ == "__main__":
    raise SystemExit(main())
