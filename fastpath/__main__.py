"""Command line of the patch package: `python -m fastpath fingerprints` (the suite's report is `fastpath-suite
report`, in the repository beside the tiers).

    python -m fastpath fingerprints            # show the installed version's fingerprints vs the known ones
    python -m fastpath fingerprints --record   # add the installed version to fingerprints.json (after review!)
    python -m fastpath fingerprints --source path/to/omnivoice/models/omnivoice.py --version 0.2.0 [--record]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

# pydub, which omnivoice imports, warns on import when no ffmpeg is on PATH. Nothing here asks pydub to decode a
# file (the suite reads and writes WAV with soundfile), so the command lines hide that one warning, and only it.
FFMPEG_WARNING = "Couldn't find ffmpeg or avconv"


def quiet_ffmpeg_warning() -> None:
    warnings.filterwarnings("ignore", message=FFMPEG_WARNING, category=RuntimeWarning)


def fingerprints_main(argv, prog: str = "python -m fastpath fingerprints") -> int:
    """`python -m fastpath fingerprints`: the installed (or --source) fingerprints against the known ones."""
    from fastpath.fingerprints import (
        fingerprint,
        fingerprints_in,
        load_known,
        omnivoice_version,
        record,
    )
    from fastpath.registry import relied_on

    parser = argparse.ArgumentParser(prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     description="Upstream fingerprints of the installed omnivoice vs the known ones.")
    parser.add_argument("--record", action="store_true",
                        help="add these fingerprints to fingerprints.json as known to work (after review and parity)")
    parser.add_argument("--source", type=Path, default=None,
                        help="an omnivoice/models/omnivoice.py to read instead of the installed module (not imported)")
    parser.add_argument("--version", default=None, help="the omnivoice version of --source (needed with --source)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="record only these upstream names (default: every name a patch relies on)")
    args = parser.parse_args(argv)
    if args.source is not None and not args.version:
        parser.error("--source needs --version, the omnivoice version that source belongs to")
    names = relied_on()
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"--only {' '.join(unknown)}: no patch relies on these; known names: {', '.join(names)}")
    if args.source is not None:
        found = fingerprints_in(args.source.read_text(encoding="utf-8"), names)
        version = args.version
    else:
        found = {n: fingerprint(n) for n in names}
        version = omnivoice_version()
    if args.record:
        record(args.only or names, found, version)
    known = load_known()
    print(f"omnivoice {version}" + (f" (source {args.source})" if args.source else ""))
    bad = 0
    for name in names:
        fp = found[name]
        versions = known.get(name, {}).get(fp)
        bad += versions is None
        print(f"  {name:45s} {fp or 'MISSING':16s}  {'known: ' + ', '.join(versions) if versions else 'UNKNOWN'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "fingerprints":
        print("usage: python -m fastpath fingerprints [--record] [--source FILE --version X] [--only NAME ...]\n"
              "(the suite's report: fastpath-suite report, from a checkout of the repository)", file=sys.stderr)
        return 2
    quiet_ffmpeg_warning()
    return fingerprints_main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
