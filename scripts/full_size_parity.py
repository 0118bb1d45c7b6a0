"""Bit-exactness of the lossless stack against stock at grid points of the full-size test checkpoint, with the row
counts `fastpath.loop.row_count` chose (the parity tier itself runs on the tiny checkpoint).

    fastpath-suite maintain full-size-parity [--steps 2] POINT ...   e.g. clone3-short-32 clone3-mixed8-16

Every per-step logit, score, predicted token, final token and waveform is compared (harness.parity.parity); exit 1 if any
point differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import fastpath
from fastpath import loop
from harness.model.checkpoint import load_model, resolve_checkpoint
from harness.parity.parity import compare_runs, record_generation
from harness.speed.bench import point_kwargs
from harness.speed.measure import sequence_lengths


def main() -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite maintain full-size-parity", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("points", nargs="+", help="speed points of fixtures/points.json, e.g. clone3-short-32")
    parser.add_argument("--steps", type=int, default=2, help="unmasking steps per point (every step has the same shapes)")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())  # MKL's state as after the first explicit setting (conftest.py)
    model = load_model(resolve_checkpoint(None, size="full"))
    prompts: dict = {}
    failed = 0
    print("| point | stock rows | own | packed LLM rows, heads rows; padded GEMMs (N x K: rows) | attention (real, P) -> (queries, keys) "
          "| stock s | stack s | bit-exact |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.points:
        kwargs = point_kwargs(name, model, prompts, args.steps)
        c_lens, t_lens = sequence_lengths(model, kwargs)
        counts = loop.packed_counts(model, c_lens, t_lens, True)
        loop._ATTENTION_CUTS.clear()
        start = time.perf_counter()
        stock = record_generation(model, 0, **kwargs)
        stock_s = time.perf_counter() - start
        with fastpath.patched(model):
            start = time.perf_counter()
            stack = record_generation(model, 0, **kwargs)
            stack_s = time.perf_counter() - start
        problems = compare_runs(stock, stack, limit=3)
        failed += bool(problems)
        packed = ("stock's layout" if counts is None else f"{counts.llm}, {counts.heads}"
                  + "".join(f"; {n}x{k}: {rows}" for (n, k), rows in sorted(counts.gemms.items())))
        cuts = ", ".join(f"({key[2]}, {key[1]}) -> {cut}" for key, cut in loop._ATTENTION_CUTS.items())
        print(f"| {name} | {2 * len(c_lens) * max(c_lens)} | {sum(c_lens) + sum(t_lens)} | {packed} | {cuts} "
              f"| {stock_s:.1f} | "
              f"{stack_s:.1f} | {'yes' if not problems else 'NO: ' + '; '.join(problems)} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
