"""The unstable-timing rule's operating characteristics: long interleaved runs (stock, lossless) under no load,
intermittent load (busy processes switched on and off at random) and steady load, the rule
(harness.speed.stability) applied to every run of 3 consecutive rounds.

    fastpath-suite audit stability --rounds 24 --results results/
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time

from harness.speed.stability import MAX_RATIO_SPREAD, MIN_ROUNDS, ratio_spread

BUSY = "while True: pass"


class Load:
    """Competing processes (pure-Python busy loops, one per core): off, on throughout ('steady'), or switched on
    and off at random ('intermittent': on and off periods drawn uniformly from `period` seconds)."""

    def __init__(self, kind: str, processes: int, period: tuple, seed: int):
        self.kind, self.processes, self.period = kind, processes, period
        self.random = random.Random(seed)
        self.procs: list = []
        self.on = False
        self.switch_at = 0.0

    def __enter__(self):
        if self.kind != "quiet":
            self.procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(self.processes)]
            self.on = True
            self.switch_at = time.monotonic() + self.random.uniform(*self.period)
        return self

    def tick(self) -> None:
        """Called between timed calls and from a timer thread: switch the intermittent load when due."""
        if self.kind != "intermittent" or time.monotonic() < self.switch_at:
            return
        import signal

        self.on = not self.on
        for p in self.procs:
            p.send_signal(signal.SIGCONT if self.on else signal.SIGSTOP)
        self.switch_at = time.monotonic() + self.random.uniform(*self.period)

    def __exit__(self, *exc):
        import signal

        for p in self.procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
        self.procs = []


def windows(base: list, other: list, width: int) -> list:
    """Every run of `width` consecutive rounds in a long sequence: (spread, median ratio) each."""
    out = []
    for start in range(len(base) - width + 1):
        b, o = base[start:start + width], other[start:start + width]
        out.append((ratio_spread(b, o), statistics.median(x / y for x, y in zip(b, o))))
    return out


def measure_rates(model, kwargs: dict, variants: dict, rounds: int, width: int, conditions: list, period: tuple,
                  processes: int, progress, seed: int = 0) -> dict:
    """Long interleaved sequences of `rounds` rounds under each load condition; the rule applied to every window of
    `width` consecutive rounds. Returns per condition the windows' spreads and ratios, the share called unstable,
    and (for the reference, the quiet condition's median ratio) the share of windows called stable whose ratio is
    more than 10% off it: the harm a missed call does."""
    import threading

    from harness.speed.measure import interleaved

    out = {}
    for i, kind in enumerate(conditions):
        calls = (rounds + 1) * len(variants)
        with Load(kind, processes, period, seed + i) as load, progress.stage(f"{kind} load", total=calls) as step:
            stop = threading.Event()

            def ticker():
                while not stop.wait(0.05):
                    load.tick()

            thread = threading.Thread(target=ticker, daemon=True)
            thread.start()
            try:
                samples = interleaved(model, variants, kwargs, rounds, on_call=lambda r, n: step(f"round {r} {n}"))
            finally:
                stop.set()
                thread.join()
        base, other = (s.rtf for s in samples.values())
        out[kind] = {"rtf": {n: s.rtf for n, s in samples.items()},
                     "load": [x for s in samples.values() for x in s.load],
                     "windows": windows(base, other, width)}
    reference = statistics.median(r for _, r in out[conditions[0]]["windows"]) if conditions[0] == "quiet" else None
    for kind, data in out.items():
        w = data["windows"]
        data["unstable_share"] = sum(s > MAX_RATIO_SPREAD for s, _ in w) / len(w)
        if reference is not None:
            passed = [r for s, r in w if s <= MAX_RATIO_SPREAD]
            data["stable_but_off_share"] = sum(abs(r / reference - 1) > 0.10 for r in passed) / len(w)
        data["windows_count"] = len(w)
    return {"reference_ratio": reference, "conditions": out}


def main(argv=None) -> int:
    import argparse

    from harness.run import results
    from harness.model.checkpoint import load_model, resolve_checkpoint
    from harness.run.cli import int_at_least
    from harness.run.progress import Progress
    from harness.speed.bench import point_kwargs

    parser = argparse.ArgumentParser(prog="fastpath-suite audit stability", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=("tiny", "full"), default="full", help="built test checkpoint")
    parser.add_argument("--point", default="auto-short-10", help="a speed point of fixtures/points.json")
    parser.add_argument("--steps", type=int_at_least(1), default=8,
                        help="unmasking steps per call (the report times at 8)")
    parser.add_argument("--rounds", type=int_at_least(MIN_ROUNDS), default=30,
                        help="interleaved rounds per condition (stock, lossless)")
    parser.add_argument("--width", type=int_at_least(MIN_ROUNDS), default=MIN_ROUNDS,
                        help="rounds per judged run (the report's default rounds)")
    parser.add_argument("--conditions", nargs="+", choices=("quiet", "steady", "intermittent"),
                        default=["quiet", "intermittent"], help="load conditions, quiet first")
    parser.add_argument("--period", type=float, nargs=2, default=[5.0, 30.0], metavar=("MIN", "MAX"),
                        help="seconds the intermittent load stays on, then off (uniform)")
    parser.add_argument("--processes", type=int_at_least(1), default=None,
                        help="busy processes of the load; None: one per CPU")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    args.processes = args.processes or os.cpu_count() or 1  # here: the help is the same on every machine
    import fastpath

    progress = Progress("stability", args.quiet)
    model = load_model(resolve_checkpoint(None, size=args.size))
    kwargs = point_kwargs(args.point, model, {}, args.steps)
    variants = {"stock": (), "lossless": tuple(fastpath.LOSSLESS)}
    progress.say(f"{len(args.conditions)} conditions x {args.rounds} rounds x 2 variants on the {args.size} "
                 f"checkpoint, {args.point} at {args.steps} steps")
    rates = measure_rates(model, kwargs, variants, args.rounds, args.width, args.conditions, tuple(args.period),
                          args.processes, progress)
    figures = {"rule": {"max_ratio_spread": MAX_RATIO_SPREAD, "min_rounds": MIN_ROUNDS},
               "setup": {"size": args.size, "point": args.point, "steps": args.steps, "rounds": args.rounds,
                         "width": args.width, "period_s": list(args.period), "processes": args.processes},
               **rates}
    print(render(figures))
    results.write_if_asked(args, "stability", figures)
    return 0


def render(figures: dict) -> str:
    """The rates as a markdown table (also docs/results.md's section)."""
    setup = figures["setup"]
    lines = [f"Rule: unstable when the per-round ratios of a run of {setup['width']} rounds span more than "
             f"{figures['rule']['max_ratio_spread']:.0%} of their median. Every window of {setup['width']} "
             f"consecutive rounds of {setup['rounds']} interleaved rounds (stock, lossless) per condition, "
             f"{setup['size']} checkpoint, {setup['point']} at {setup['steps']} steps; intermittent load: "
             f"{setup['processes']} busy processes, on and off for {setup['period_s'][0]:g}-{setup['period_s'][1]:g} s "
             "at random. Windows overlap, so they are not independent: about one in "
             f"{setup['width']} is.", "",
             "| load | windows | called unstable | called stable but ratio >10% off the quiet median | "
             "spread (median, largest) | median ratio (stock/lossless) |", "|---|---|---|---|---|---|"]
    for kind, data in figures["conditions"].items():
        n = data["windows_count"]
        spreads = [s for s, _ in data["windows"]]
        ratios = [r for _, r in data["windows"]]
        off = data.get("stable_but_off_share")
        lines.append(f"| {kind} | {n} | {data['unstable_share']:.0%} ({round(data['unstable_share'] * n)}/{n}) | "
                     + ("-" if off is None else f"{off:.0%} ({round(off * n)}/{n})")
                     + f" | {statistics.median(spreads):.2f}, {max(spreads):.2f} | {statistics.median(ratios):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
