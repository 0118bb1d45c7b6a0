"""Memory over long service: device memory after each of many generate calls of mixed lengths, and whether it stays
flat after the warm-up (`fastpath-suite memory`).

A server calls generate for hours with texts of every length. Upstream reports memory growing call after call until
out of memory; a peer measured 2,764 -> 2,862 MiB over 1,000 calls, flat with expandable_segments. Recorded after
every call: on CUDA the allocated and the reserved MiB and the call's peaks of both (torch.cuda), on the CPU the resident set
(psutil). Texts cycle through fixtures/points.json's "mixed8" (one word to about ten seconds), so each call has
another length and new bucketed shapes appear for a while (graphs, allocator blocks); the warm-up is left out of
the verdict. The verdict per series: the growth from the end of the warm-up to the last call, and whether that is
within the bound (FLAT_MIB).

    fastpath-suite memory --size full --device cuda --dtype bfloat16 --apply defaults --calls 1000 --out out/memory
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

from harness.model.checkpoint import add_model_arguments, load_model_of
from harness.run.cli import int_at_least
from harness.run.progress import Progress

FLAT_MIB = {"allocated": 1.0, "reserved": 64.0, "rss": 48.0}  # growth after the warm-up still called flat: allocated
# bytes return to one level (a leaked activation is MiB); the allocator may reserve one more block of its 2-64 MiB
# sizes for a new shape; the resident set wanders by tens of MiB as the C allocator keeps freed pages


def texts() -> list:
    from harness.model.points import load_spec

    return load_spec()["texts"]["mixed8"]


def reading(device) -> dict:
    """MiB now: allocated, reserved and their peaks since the last reading on CUDA (reserved counts the caching
    allocator's blocks, a CUDA graph's pool included); the resident set elsewhere."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        out = {"allocated": torch.cuda.memory_allocated(device) / 2**20,
               "reserved": torch.cuda.memory_reserved(device) / 2**20,
               "peak": torch.cuda.max_memory_allocated(device) / 2**20,
               "peak_reserved": torch.cuda.max_memory_reserved(device) / 2**20}
        torch.cuda.reset_peak_memory_stats(device)
        return out
    import psutil

    return {"rss": psutil.Process().memory_info().rss / 2**20}


def memory_over_calls(model, calls: int, num_step: int, language: str = "en", step=None, series=None) -> dict:
    """Generate `calls` times, cycling through the mixed-length texts; {series: [MiB after each call]}, filled into
    `series` as it goes (an interrupted run keeps what it measured)."""
    lines = texts()
    series = {} if series is None else series
    for n in range(calls):
        model.generate(text=lines[n % len(lines)], language=language, num_step=num_step)
        gc.collect()
        for name, value in reading(model.device).items():
            series.setdefault(name, []).append(round(value, 3))
        if step:
            step(f"call {n + 1}/{calls}")
    return series


def verdict(series: dict, warmup: int) -> dict:
    """{series: {"growth_mib", "flat", "bound_mib"}} from the end of the warm-up to the last call (the peak is
    reported, not judged: it follows the text's length)."""
    out = {}
    for name, values in series.items():
        if name not in FLAT_MIB:
            continue
        if len(values) <= warmup:
            raise ValueError(f"{len(values)} calls leave nothing after a warm-up of {warmup}: use more --calls")
        growth = values[-1] - values[warmup - 1] if warmup else values[-1] - values[0]
        out[name] = {"growth_mib": round(growth, 3), "flat": growth <= FLAT_MIB[name], "bound_mib": FLAT_MIB[name]}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite memory", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for memory.json")
    add_model_arguments(parser, size="tiny")
    parser.add_argument("--apply", nargs="*", default=["defaults"],
                        help="patch names, 'defaults' (fastpath.defaults on the device), or none for stock")
    parser.add_argument("--calls", type=int_at_least(2), default=1000, help="generate calls")
    parser.add_argument("--warmup", type=int_at_least(1), default=50, help="calls left out of the verdict")
    parser.add_argument("--num-step", type=int_at_least(1), default=16, help="unmasking steps per call")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.warmup >= args.calls:
        parser.error(f"--warmup {args.warmup} leaves no call of --calls {args.calls} to judge")

    import fastpath
    from harness.run.machine import machine_info

    progress = Progress("memory", args.quiet)
    checkpoint, model = load_model_of(args)
    patches = fastpath.defaults(model) if args.apply == ["defaults"] else [p for p in args.apply if p != "none"]
    fastpath.apply(model, patches)
    series: dict = {}
    try:
        with progress.stage("generate", total=args.calls) as step:
            memory_over_calls(model, args.calls, args.num_step, step=step, series=series)
    except KeyboardInterrupt:  # SIGINT (timeout -s INT): keep what was measured
        pass
    done = len(next(iter(series.values()), []))
    if done < args.calls:
        print(f"stopped after {done} of {args.calls} calls", file=sys.stderr)
    if done <= args.warmup:
        print(f"error: {done} calls measured, not more than the warm-up of {args.warmup}: nothing to judge",
              file=sys.stderr)
        return 2
    judged = verdict(series, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps({
        "command": " ".join(["fastpath-suite", "memory", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(args.device), "checkpoint": checkpoint.identity, "patches": patches,
        "calls": done, "asked": args.calls, "warmup": args.warmup, "num_step": args.num_step,
        "series": series, "verdict": judged,
    }, indent=1))
    for name, v in judged.items():
        first, last = series[name][args.warmup - 1], series[name][-1]
        print(f"{name}: {first:.1f} MiB after call {args.warmup}, {last:.1f} MiB after call {done}: "
              f"{'flat' if v['flat'] else 'GROWS'} ({v['growth_mib']:+.1f} MiB, bound {v['bound_mib']})")
    for name in ("peak", "peak_reserved"):
        if name in series:
            print(f"{name.replace('_', ' ')} per call: {min(series[name]):.0f}-{max(series[name]):.0f} MiB")
    print(f"written: {args.out / 'memory.json'}")
    return 0 if all(v["flat"] for v in judged.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
