"""prefix_kv_cache per refresh interval r: time per unmasking step and token agreement with the exact run.

    fastpath-suite prefix --size full --point clone6-medium-16 --refresh 1 2 4 8 --rounds 3

Timing: the lossless stack alone ("exact") and the stack + prefix_kv_cache at each r, interleaved round by round
after one warm-up each (`measure.interleaved`); seconds per step = generate wall time / num_step, so reference
encoding (prompt reused) and decoding are in it, as a user sees them. Agreement: the share of the final audio
tokens [C, T] equal to the exact run's, same seed (the random draws are identical, so every difference is the
stale prefix), averaged over `--seeds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

import fastpath
from fastpath import loop
from harness.run.cli import int_at_least
from harness.parity.parity import kept_tokens
from harness.model.points import point
from harness.speed.measure import timed_generate


def final_tokens(model, seed: int, kwargs: dict) -> list:
    with kept_tokens(model) as out:
        torch.manual_seed(seed)
        model.generate(**kwargs)
    return out


@contextmanager
def configured(model, refresh: int | None):
    """The lossless stack, plus prefix_kv_cache at refresh interval `refresh` unless it is None (exact)."""
    extra = [] if refresh is None else ["prefix_kv_cache"]
    with fastpath.patched(model, list(fastpath.LOSSLESS) + extra):
        if refresh is not None:
            loop.set_prefix_refresh(model, refresh)
        yield model


def agreement(model, kwargs: dict, refresh: int, seeds) -> float:
    """Mean share of final tokens equal to the exact (lossless stack) run's, over seeds."""
    shares = []
    for seed in seeds:
        with configured(model, None):
            exact = final_tokens(model, seed, kwargs)
        with configured(model, refresh):
            cached = final_tokens(model, seed, kwargs)
        equal = sum(int((a == b).sum()) for a, b in zip(exact, cached))
        shares.append(equal / sum(a.numel() for a in exact))
    return statistics.mean(shares)


def measure(model, name: str, refreshes, rounds: int, seeds, progress=None) -> dict:
    from harness.run.progress import QUIET

    kwargs = point(name).generate_kwargs(model)
    steps = kwargs["num_step"]
    variants = [("exact", None)] + [(f"r={n}", n) for n in refreshes]
    samples = {label: [] for label, _ in variants}
    with (progress or QUIET).stage("timing", total=(rounds + 1) * len(variants)) as step:
        for r in range(rounds + 1):  # interleaved: exact, r=1, r=2, ... in every round; round 0 is the warm-up
            for label, refresh in variants:
                with configured(model, refresh):
                    seconds, _ = timed_generate(model, 0, **kwargs)
                if r:
                    samples[label].append(seconds / steps)
                step(f"{label} " + (f"round {r}/{rounds}" if r else "warm-up"))
    exact = statistics.median(samples["exact"])
    out = {"point": name, "num_step": steps, "rounds": rounds, "seeds": list(seeds), "rows": []}
    for label, refresh in variants:
        per_step = statistics.median(samples[label])
        row = {"variant": label, "seconds_per_step": per_step, "speedup": exact / per_step, "samples": samples[label]}
        if refresh is not None:
            row["agreement"] = agreement(model, kwargs, refresh, seeds)
        out["rows"].append(row)
    return out


def format_table(result: dict, machine: str | None) -> str:
    """The rows; a speedup whose rounds disagree (harness.speed.stability's rule) shows as unstable."""
    from harness.speed import stability

    where = f", {machine}" if machine else ""
    checkpoint = f"Checkpoint {result['checkpoint']}: " if result.get("checkpoint") else ""
    lines = [f"{checkpoint}prefix_kv_cache at {result['point']} ({result['num_step']} steps){where}; median of "
             f"{result['rounds']} interleaved rounds; agreement over seeds {result['seeds']}",
             "", "| variant | s/step | speedup vs exact | token agreement |", "|---|---|---|---|"]
    exact = result["rows"][0]["samples"]
    notes = []
    for row in result["rows"]:
        agree = f"{100 * row['agreement']:.2f}%" if "agreement" in row else "100% (reference)"
        speedup = f"{row['speedup']:.2f}x"
        if "agreement" in row:
            judged = stability.judge_rounds(exact, {row["variant"]: row["samples"]}, result.get("load"))
            if not judged.stable:
                speedup = "unjudged" if judged.rounds < stability.MIN_ROUNDS else "unstable"
                notes.append(f"{row['variant']}: {judged.message}")
        lines.append(f"| {row['variant']} | {row['seconds_per_step']:.3f} | {speedup} | {agree} |")
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))


def render_results(figures: dict) -> str:
    return format_table(figures, None)


def main(argv=None) -> int:
    from harness.model.checkpoint import load_model, resolve_checkpoint
    from harness.run.machine import machine_info

    from harness.run import results
    from harness.run.progress import Progress
    from harness.run.machine import load_average

    parser = argparse.ArgumentParser(prog="fastpath-suite prefix", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"), help="built test checkpoint size")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint folder instead of the built one")
    parser.add_argument("--point", default="clone6-medium-16", help="a speed point of fixtures/points.json")
    parser.add_argument("--refresh", type=int_at_least(1), nargs="+", default=[1, 2, 4, 8],
                        help="refresh intervals of the prefix cache to time")
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="interleaved rounds after one warm-up")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds the agreement averages over")
    parser.add_argument("--out", type=Path, default=None, help="JSON with the rows, samples and machine")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    checkpoint = resolve_checkpoint(args.checkpoint, size=args.size)
    model = load_model(checkpoint)
    result = {"checkpoint": checkpoint.identity,
              **measure(model, args.point, args.refresh, args.rounds, args.seeds, Progress("prefix", args.quiet))}
    result["load"] = load_average()
    info = machine_info(str(model.device))
    print(format_table(result, f"{info['cpu_model']}, {info['torch_threads']} threads, torch {torch.__version__}"))
    results.write_if_asked(args, "prefix", dict(result), str(model.device))
    result["machine"] = info
    result["command"] = results.command_line()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
