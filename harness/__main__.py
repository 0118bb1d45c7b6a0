"""The suite's one command line: `fastpath-suite <verb> ...` (the same as `python -m harness <verb> ...`).

Each verb is a small module with its own `--help` (defaults shown); `fastpath-suite --help` lists them. The old
module entry points (`python -m harness.speed.bench`, ...) still work and are the same code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fastpath.__main__ import FFMPEG_WARNING, quiet_ffmpeg_warning

ROOT = Path(__file__).resolve().parents[1]

# verb -> (what runs it: "module:function" taking argv, or a script under scripts/, one line for --help)
VERBS = {
    "report": ("harness.report:main", "the suite's report on a checkpoint: patches, parity, work, timing (command 1)"),
    "gate": ("harness.gate:main", "may an omnivoice version ship? parity, behaviour, quality on a candidate"),
    "bench": ("harness.speed.bench:main", "interleaved timing of variants (stock, lossless, peer, gpu...) at points"),
    "grid": ("harness.speed.bench:grid_main", "bench over every speed point: stock, the public package, lossless"),
    "compare": ("harness.speed.compare:main", "compare two speed runs or baselines point by point"),
    "history": ("harness.speed.history:main", "nightly speed history: append a night, find changes, the page"),
    "instructions": ("harness.speed.instructions:main", "instructions each counting point executes, under callgrind"),
    "structure": ("harness.speed.structure:main", "exact operator calls, bytes and work of each counting point"),
    "stream": ("harness.speed.streaming:main", "streaming: time to first audio and underruns against generate"),
    "memory": ("harness.speed.service:main", "memory over long service: many generate calls of mixed lengths"),
    "prefix": ("harness.speed.prefix:main", "the approximate prefix-KV cache: speed and how far tokens drift"),
    "stability": ("harness.speed.under_load:main", "how often the 'unstable timing' rule fires, quiet and under load"),
    "simulate": ("harness.quality.simulate:main", "the quality gate's pass rates on simulated data of known truth"),
    "known-answer": ("harness.quality.known_answer:main", "the quality gate's pass rates on real espeak-ng speech"),
    "checkpoint": ("harness.checkpoint:main", "build the test checkpoint, say where it is and what its codec carries"),
    "goldens": ("harness.goldens:main", "record or check golden outputs of the test checkpoint"),
    "behaviour": ("harness.behaviour:main", "record upstream's behaviour (settings it reads, calls it makes)"),
    "fingerprints": ("harness.__main__:fingerprints", "upstream fingerprints, installed against known"),
    "false-alarms": ("scripts/false_alarms.sh", "the default test run N times on fresh clones: failures per test"),
    "gpu-check": ("scripts/gpu_check.sh", "the GPU tier in one call on a CUDA machine"),
    "full-size-parity": ("scripts/full_size_parity.py", "bit-exactness of the lossless stack at full-size points"),
    "peer-rates": ("scripts/peer_gate_rates.py", "simulated pass rates of the peer speed gate from a grid run"),
    "nightly-history": ("scripts/nightly_history.sh", "fetch or store the nightly histories (branch nightly-history)"),
    "record-nights": ("scripts/record_nights.sh", "repeated runs of nightly points: the noise `history rates` uses"),
    "speed-gate-check": ("scripts/validate_speed_gate.sh", "record a CPU baseline, 5 clean reruns, one slowed run"),
    "serve-check": ("harness.serving:main", "omnivoice-server with fastpath against stock: same bytes and tokens"),
    "shards": ("harness.sharding:main", "the suite sharded over xdist workers: serial and sharded runs, test for test"),
    "mutants": ("harness.mutants:main", "mutation testing of fastpath/: a seeded sample, or the lines a change touched"),
    "name-check": ("harness.release:main", "is the distribution's name free on the package index? (pip's own client)"),
    "results": ("harness.results:main", "render docs/results.md from the results files (--check: verify)"),
}


def fingerprints(argv) -> int:
    from fastpath.__main__ import fingerprints_main

    return fingerprints_main(argv, prog="fastpath-suite fingerprints")


def usage() -> str:
    width = max(map(len, VERBS))
    lines = ["usage: fastpath-suite <verb> [options]   (the same: python -m harness <verb>)", "",
             "The OmniVoice fastpath suite: reports, speed and quality measurements, the version-bump gate.", "",
             "verbs:"]
    lines += [f"  {verb:{width}s}  {summary}" for verb, (_, summary) in VERBS.items()]
    lines += ["", "fastpath-suite <verb> --help shows a verb's options and their defaults.",
              "Tests: pytest (docs/ in the repository say which tier runs where)."]
    return "\n".join(lines)


def script_help(path: Path) -> str:
    """A script's header comment (bash) or docstring (Python), as its --help."""
    text = path.read_text()
    if path.suffix == ".py":
        import ast

        return ast.get_docstring(ast.parse(text)) or ""
    lines = [line[2:] if line.startswith("# ") else line[1:] for line in text.splitlines()[1:]
             if line.startswith("#")][:40]
    return "\n".join(lines)


def run_script(verb: str, path: Path, argv: list) -> int:
    if any(a in ("-h", "--help") for a in argv) and path.suffix == ".sh":
        print(f"usage: fastpath-suite {verb} ...\n\n{script_help(path)}")
        return 0
    command = [sys.executable, str(path)] if path.suffix == ".py" else ["bash", str(path)]
    return subprocess.call(command + argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    quiet_ffmpeg_warning()  # here, and in the Python processes a verb starts (PYTHONWARNINGS is inherited)
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          f"ignore:{FFMPEG_WARNING}:RuntimeWarning"]))
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"fastpath-suite: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
        return 2
    target = VERBS[verb][0]
    if target.startswith("scripts/"):
        return run_script(verb, ROOT / target, rest)
    import importlib

    from harness import results

    results.COMMAND = argv
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    raise SystemExit(main())
