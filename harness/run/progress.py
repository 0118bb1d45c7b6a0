"""Progress of long work on stderr: what is running, how far it is, about how long is left.

A tqdm bar on a terminal; plain lines (`[report] timing 3/24: clone3-short-32 lossless round 2, 1:02 elapsed,
about 4:10 left`) when stderr is a file or a pipe, so CI logs stay readable; nothing with `quiet`.

    progress = Progress("report", quiet=args.quiet)
    with progress.stage("timing", total=24) as step:
        for ...:
            step("clone3-short-32 lossless round 2")   # one unit of this stage is done

The estimate of what is left is this stage's elapsed time per unit times the units left (tqdm's rate on a
terminal). Work whose units differ in cost (a warm-up round against a timed one) gets a rough estimate; it is
printed as "about".
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss past an hour)."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Stages of one command's work, reported on `stream` (default stderr)."""

    def __init__(self, command: str, quiet: bool = False, stream=None):
        self.command = command
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())

    def say(self, text: str) -> None:
        """One line on the stream (a plan, a stage's result), unless quiet."""
        if not self.quiet:
            print(f"[{self.command}] {text}", file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @contextmanager
    def stage(self, name: str, total: int):
        """A stage of `total` units; yields `step(label)` to call after each unit."""
        begun = time.perf_counter()
        done = [0]
        bar = None
        if not self.quiet and self.terminal:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=f"[{self.command}] {name}", file=self.stream, leave=True,
                       bar_format="{desc}: {n}/{total} {postfix} [{elapsed}<{remaining}]")
        elif not self.quiet:
            self.say(f"{name}: {total} steps")

        def step(label: str = "") -> None:
            done[0] += 1
            if bar is not None:
                bar.set_postfix_str(label, refresh=False)
                bar.update(1)
            elif not self.quiet:
                spent = time.perf_counter() - begun
                left = spent / done[0] * (total - done[0])
                self.say(f"{name} {done[0]}/{total}: {label}, {clock(self.elapsed())} elapsed"
                         + (f", about {clock(left)} left in this stage" if done[0] < total else ""))

        try:
            yield step
        finally:
            if bar is not None:
                bar.close()


QUIET = Progress("", quiet=True)
