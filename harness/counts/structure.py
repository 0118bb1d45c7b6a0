"""Exact structural counts per call, at native speed: operator calls by kind, bytes allocated, the work counters.

The work counters: FLOPs, LLM forwards and positions, head rows, embedded positions, reference encodes. Bytes: those
the operators allocate.

Counted over the same window as the instruction counts (harness.counts.calls), below autograd with a
TorchDispatchMode: every aten operator call, by its name; the bytes of every output tensor an operator creates (not
a view of one of its inputs, not an input written in place); and `harness.speed.measure.counting` with torch's FLOP
counter. None of these moves between runs or machines of one torch and omnivoice version, so a change is a fact
and is named exactly: which operator, how many calls more. (On CUDA the kernel launches and CUDA-graph replays
would go here too; the CPU nightly has neither.)

    fastpath-suite counts structure --out out/structure.json     # every counting point, stock and lossless
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness import REPO_ROOT

METRIC = "ops"


class OperatorCounts(TorchDispatchMode):
    """Operator calls by name and the bytes of the tensors they create."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls[str(func)] += 1  # e.g. aten.mm.default
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs)) if t.numel()}
        self.bytes += sum(t.untyped_storage().nbytes() for t in _tensors(out)
                          if t.numel() and t.untyped_storage().data_ptr() not in inputs)
        return out


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def measure_call(model, call) -> dict:
    """The structural counts of one `call(window)` (harness.counts.calls.make_call). A dispatch mode sees its own
    thread only: `window.worker()` counts, with modes of its own, what another thread runs inside the window (the
    stream's worker)."""
    import threading

    from torch.utils.flop_counter import FlopCounterMode

    from harness.speed.measure import CPU_ATTENTION_FLOPS, counting

    seen, modes, owner = {}, [], []

    def new_modes():
        pair = (OperatorCounts(), FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS))
        modes.append(pair)
        return pair

    @contextlib.contextmanager
    def window():
        owner[:] = [threading.get_ident()]
        ops, flops = new_modes()
        with counting(model) as work, flops, ops:
            yield
        seen["work"] = work

    @contextlib.contextmanager
    def worker():
        if threading.get_ident() in owner:
            yield
            return
        ops, flops = new_modes()
        with flops, ops:
            yield

    window.worker = worker
    call(window)
    calls = sum((ops.calls for ops, _ in modes), Counter())
    return {"ops": sum(calls.values()), "by_kind": dict(sorted(calls.items())),
            "bytes": sum(ops.bytes for ops, _ in modes),
            "flops": sum(int(flops.get_total_flops()) for _, flops in modes),
            **{k: v for k, v in seen["work"].as_dict().items() if k != "flops"}}


def measure(points: list, variants: list, progress=None) -> dict:
    """{"<point>/<variant>": counts} over the counting points, each call warmed up once first."""
    from harness.model.checkpoint import build_checkpoint, load_model
    from harness.run.progress import QUIET
    from harness.counts import calls

    chosen = [calls.point_named(name) for name in points]
    models = {size: load_model(build_checkpoint(size)) for size in dict.fromkeys(p.size for p in chosen)}
    prompts = {size: {} for size in models}
    out = {}
    with (progress or QUIET).stage("structure", total=len(chosen) * len(variants)) as step:
        for p in chosen:
            for v in variants:
                call = calls.make_call(models[p.size], p, v, prompts[p.size])
                call(calls.nothing)
                out[f"{p.name}/{v}"] = measure_call(models[p.size], call)
                step(f"{p.name}/{v}")
    return out


def device_key() -> str:
    from harness.run.machine import versions

    v = versions(("torch", "omnivoice"))
    return f"structure__torch-{v['torch']}__omnivoice-{v['omnivoice']}"


def run_file(counts: dict, command: str) -> dict:
    """A speed-baseline-format run file (metric "ops": the operator calls; the other counters in `extra`), which
    `nightly append` takes."""
    from harness.run.machine import machine_info
    from harness.speed.baselines import FORMAT, FORMAT_VERSION, git_commit

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "device_key": device_key(),
            "machine": machine_info("cpu"), "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command, "commit": git_commit(REPO_ROOT),
            "points": {name: {"metric": METRIC, "samples": [c["ops"]], "median": c["ops"],
                              "extra": {k: v for k, v in c.items() if k != "ops"}}
                       for name, c in counts.items()}}


def main(argv=None) -> int:
    from harness.run.progress import Progress
    from harness.run.results import command_line
    from harness.counts import calls

    parser = argparse.ArgumentParser(prog="fastpath-suite counts structure", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    calls.add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    points = args.points or [p.name for p in calls.load_points()]
    try:
        counts = measure(points, args.variants, Progress("structure", args.quiet))
    except (KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, c in counts.items():
        print(f"{name}: {c['ops']:,} operator calls, {c['bytes']:,} bytes allocated, {c['flops']:,} FLOPs, "
              f"{c['llm_positions']:,} LLM positions")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(run_file(counts, command_line()), indent=1) + "\n")
        print(f"run file: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
