"""Command line: `python -m fastpath report` (the suite's report) and `python -m fastpath fingerprints`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from fastpath.cli import int_at_least


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m fastpath")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="report on a checkpoint: patches, parity, work, timing",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    rep.add_argument("--checkpoint", default=None,
                     help="a real OmniVoice checkpoint folder, or 'hf' (env FASTPATH_CHECKPOINT); default: built test checkpoint")
    rep.add_argument("--size", choices=("tiny", "full"), default="tiny", help="size of the built test checkpoint")
    rep.add_argument("--out", type=Path, default=Path("out"), help="folder for report.md and report.json")
    rep.add_argument("--rounds", type=int_at_least(1), default=5, help="interleaved timing rounds per variant")
    sub.add_parser("fingerprints", add_help=False,
                   help="upstream fingerprints of the installed omnivoice (or --source FILE) vs the known ones; "
                        "`python -m fastpath fingerprints --help` for its options")
    if argv and argv[0] == "fingerprints":  # its own parser (fastpath.fingerprints.main) takes the rest
        from fastpath import fingerprints

        return fingerprints.main(argv[1:])
    args = parser.parse_args(argv)

    from fastpath.testing.checkpoint import CheckpointError
    from fastpath.testing.report import run_report

    try:
        report = run_report(args.checkpoint, args.size, args.out, args.rounds,
                            "python -m fastpath " + " ".join(shlex.quote(a) for a in argv))
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((args.out / "report.md").read_text())
    print(f"written: {args.out / 'report.md'}, {args.out / 'report.json'} ({report['seconds']:.0f} s)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
