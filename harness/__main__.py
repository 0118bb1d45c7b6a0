"""Command line of the harness: `python -m harness report`, the suite's report on a checkpoint."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness.cli import int_at_least


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="report on a checkpoint: patches, parity, work, timing",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    rep.add_argument("--checkpoint", default=None,
                     help="a real OmniVoice checkpoint folder, or 'hf' (env FASTPATH_CHECKPOINT); default: built test checkpoint")
    rep.add_argument("--size", choices=("tiny", "full"), default="tiny", help="size of the built test checkpoint")
    rep.add_argument("--out", type=Path, default=Path("out"), help="folder for report.md and report.json")
    rep.add_argument("--rounds", type=int_at_least(1), default=3, help="interleaved timing rounds per variant")
    rep.add_argument("--timing-size", choices=("tiny", "full"), default="full",
                     help="built checkpoint the timing runs on (without --checkpoint): full, where compute dominates, "
                          "or tiny, which measures per-call overhead only")
    args = parser.parse_args(argv)

    from harness.checkpoint import CheckpointError
    from harness.report import run_report

    try:
        report = run_report(args.checkpoint, args.size, args.out, args.rounds,
                            "python -m harness " + " ".join(shlex.quote(a) for a in argv), args.timing_size)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((args.out / "report.md").read_text())
    print(f"written: {args.out / 'report.md'}, {args.out / 'report.json'} ({report['seconds']:.0f} s)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
