"""The suite's one command line: `fastpath-suite <verb> ...` (the same as `python -m harness <verb> ...`).

`fastpath-suite --help` lists the user's jobs first, then the suite measuring itself (`audit ...`) and upkeep
(`maintain ...`). Each verb is a small module (or a script under scripts/) with its own `--help`, which ends with
an example line; tests_harness/test_cli.py runs every example. The verbs before the groups (`history`,
`instructions`, `false-alarms`, ...) still work for one release and say their new spelling.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fastpath.__main__ import FFMPEG_WARNING, quiet_ffmpeg_warning

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Verb:
    target: str  # "module:function" taking argv, or a script under scripts/
    summary: str  # one line for the listing
    example: str  # a command line that works on a fresh clone, shown at the end of the verb's --help
    prefix: tuple = ()  # arguments put before the user's (a subcommand of the target)


# a stored baseline every clone has: the compare example compares it with itself (every point "ok")
INTEL = "baselines/cpu-intel-xeon-avx512-amx-avxvnni-bf16-fp16-vnni-2c-2t__torch-2.14.1-cu130__omnivoice-0.2.1.json"

# The user's jobs, in the order a newcomer meets them.
JOBS = {
    "report": Verb("harness.report:main", "the suite's report on a checkpoint: patches, parity, work, timing",
                   "fastpath-suite report --timing-size tiny --rounds 1 --out out/report"),
    "gate": Verb("harness.gate.gate:main", "may an omnivoice version ship? parity, behaviour, quality on a candidate",
                 "fastpath-suite gate omnivoice==0.2.1 --out out/gate"),
    "bench": Verb("harness.speed.bench:main", "interleaved timing of variants (stock, lossless, peer, gpu...) at points",
                  "fastpath-suite bench --size tiny --points auto-short-10 --variants stock lossless --rounds 2"),
    "grid": Verb("harness.speed.bench:grid_main", "bench over every speed point: stock, the public package, lossless",
                 "fastpath-suite grid --size tiny --points auto-short-10 --rounds 1"),
    "compare": Verb("harness.speed.compare:main", "compare two speed runs or baselines point by point",
                    f"fastpath-suite compare {INTEL} {INTEL}"),
    "stream": Verb("harness.speed.streaming:main", "streaming: time to first audio and underruns against generate",
                   "fastpath-suite stream --size tiny --rounds 1 --out out/stream.json"),
    "memory": Verb("harness.speed.service:main", "memory over long service: many generate calls of mixed lengths",
                   "fastpath-suite memory --calls 60 --warmup 20 --num-step 8 --out out/memory"),
    "prefix": Verb("harness.speed.prefix:main", "the approximate prefix-KV cache: speed and how far tokens drift",
                   "fastpath-suite prefix --rounds 1 --seeds 0 --refresh 2"),
    "serve-check": Verb("harness.serving.serving:main",
                        "omnivoice-server with fastpath against stock: same bytes and tokens",
                        "fastpath-suite serve-check --out out/serving"),
    "gpu-check": Verb("scripts/gpu_check.sh", "the GPU tier on a CUDA machine (--quick: a first look in one call)",
                      "fastpath-suite gpu-check --quick"),
    "cuda-check": Verb("harness.model.devices:main", "is CUDA usable here: torch's CUDA build and the device, or what "
                       "is missing (exit 1)", "fastpath-suite cuda-check"),
}

# Jobs with subverbs, and the two groups of verbs that are not the user's jobs: name -> (heading, summary, verbs).
HISTORY = "harness.nightly.history:main"
GROUPS = {
    "counts": ("exact work counts", "exact work: a count that does not move when nothing changed", {
        "structure": Verb("harness.counts.structure:main", "operator calls, bytes and work of each counting point",
                          "fastpath-suite counts structure --points auto-short-2 --out out/structure.json"),
        "instructions": Verb("harness.counts.instructions:main",
                             "instructions each counting point executes, under callgrind",
                             "fastpath-suite counts instructions --points auto-short-2 --variants lossless "
                             "--out out/instructions.json"),
    }),
    "nightly": ("the nightly speed history", "the nightly speed history: append a night, the change rule, its page", {
        "append": Verb(HISTORY, "append one night's run file(s) to a history (created when missing)",
                       "fastpath-suite nightly append out/counts.json "
                       "fixtures/counts/cpu-amd-epyc-avx512-bf16-vnni-2c-2t-tiny-1.json", ("append",)),
        "check": Verb(HISTORY, "the change rule over the histories, and the page (exit 1 on a change)",
                      "fastpath-suite nightly check fixtures/nights/cpu-amd-epyc-avx2-2c-2t-instructions.json "
                      "--out out/history", ("check",)),
        "accept": Verb(HISTORY, "accept a change the rule found: its new level becomes the reference",
                       "cp fixtures/nights/synthetic-slowdown.json nights.json && fastpath-suite nightly accept "
                       "nights.json auto-short-10/lossless@fp32 --night de2229889bf9 --reason 'a planned change'",
                       ("accept",)),
        "rates": Verb(HISTORY, "the rule's operating characteristics on recorded nights",
                      "fastpath-suite nightly rates --histories 200", ("rates",)),
        "bisect": Verb(HISTORY, "from a flagged night to its commit: count a point over a commit range",
                       "fastpath-suite nightly bisect HEAD~1 HEAD --point auto-short-2 --signal structure",
                       ("bisect",)),
        "alert": Verb("harness.nightly.alert:main", "a flagged night reaches a person: an issue per open change, "
                      "commented on while open, closed when fixed or accepted",
                      "fastpath-suite nightly check fixtures/nights/synthetic-slowdown.json --out out/history; "
                      "test -f out/history/alarms.json && fastpath-suite nightly alert out/history/alarms.json "
                      "fixtures/nights/synthetic-slowdown.json --dry-run"),
        "record": Verb("scripts/record_nights.sh", "repeated runs of nightly points: the noise `nightly rates` uses",
                       "fastpath-suite nightly record 1 out/nights.json --signal instructions --points auto-short-2"),
        "fetch": Verb("scripts/nightly_history.sh", "the histories from their branch (nightly-history) into history/",
                      "NEW_HISTORY=1 HISTORY_REMOTE=nowhere fastpath-suite nightly fetch example", ("fetch",)),
        "store": Verb("scripts/nightly_history.sh", "commit the histories onto their branch and push it",
                      "mkdir -p history && cp fixtures/nights/synthetic-slowdown.json history/example.json && "
                      "git init -q --bare history.git && HISTORY_REMOTE=$PWD/history.git fastpath-suite nightly store "
                      "example", ("store",)),
    }),
    "audit": ("the suite measuring itself",
              "the suite measuring itself: how often each gate passes what is equivalent and what is worse", {
        "false-alarms": Verb("scripts/false_alarms.sh", "the default test run N times on fresh clones: failures per test",
                             "fastpath-suite audit false-alarms 1 --reuse-venv"),
        "stability": Verb("harness.audit.under_load:main",
                          "how often the 'unstable timing' rule fires, quiet and under load",
                          "fastpath-suite audit stability --rounds 3 --conditions quiet"),
        "simulate": Verb("harness.audit.simulate:main", "the quality gate's pass rates on simulated data of known truth",
                         "fastpath-suite audit simulate --datasets 50"),
        "known-answer": Verb("harness.audit.known_answer:main", "the quality gate's pass rates on real espeak-ng speech",
                             "fastpath-suite audit known-answer --metric wer --reps 2 --cases equivalent cut"),
        "peer-rates": Verb("scripts/peer_gate_rates.py", "simulated pass rates of the peer speed gate from a grid run",
                           "fastpath-suite audit peer-rates results/grid/cpu-amd-epyc-avx2-2c-2t.json --sims 200"),
        "speed-gate-check": Verb("scripts/validate_speed_gate.sh",
                                 "record a CPU baseline, 5 clean reruns, one slowed run (about 15 minutes)",
                                 "fastpath-suite audit speed-gate-check"),
        "mutants": Verb("harness.audit.mutants:main",
                        "mutation testing of what decides (fastpath/, the harness's rules): a sample, or a change's lines",
                        "fastpath-suite audit mutants --sample 2 --rooms patches --budget 600"),
        "mutant-budget": Verb("harness.audit.mutant_budget:main",
                              "the mutants recent changes touched, and CI's mutants stage run and timed on each",
                              "fastpath-suite audit mutant-budget --commits 3 --count-only"),
        "costs": Verb("harness.audit.costs:main",
                      "what each job costs, from results/; with JOB, run a job that keeps no time and record it",
                      "fastpath-suite audit costs"),
        "shards": Verb("harness.audit.sharding:main",
                       "the suite sharded over xdist workers: serial and sharded runs, test for test",
                       "fastpath-suite audit shards measure --workers 2"),
    }),
    "maintain": ("upkeep", "upkeep: the test checkpoint, recorded upstream behaviour, goldens, results pages", {
        "checkpoint": Verb("harness.model.checkpoint:main",
                           "build the test checkpoint, say where it is and what its codec carries",
                           "fastpath-suite maintain checkpoint --size tiny"),
        "goldens": Verb("harness.gate.goldens:main", "record or check golden outputs of the test checkpoint",
                        "fastpath-suite maintain goldens"),
        "behaviour": Verb("harness.gate.behaviour:main", "record upstream's behaviour (settings it reads, calls it makes)",
                          "fastpath-suite maintain behaviour behaviour.pt"),
        "fingerprints": Verb("harness.__main__:fingerprints", "upstream fingerprints, installed against known",
                             "fastpath-suite maintain fingerprints"),
        "full-size-parity": Verb("scripts/full_size_parity.py", "bit-exactness of the lossless stack at full-size points",
                                 "fastpath-suite maintain full-size-parity clone3-short-32 --steps 1"),
        "commands": Verb("harness.__main__:maintain_commands", "render docs/commands.md from every verb's --help (--check: verify)",
                         "fastpath-suite maintain commands --check"),
        "results": Verb("harness.__main__:maintain_results",
                        "render docs/results.md from the results files (--check: verify)",
                        "fastpath-suite maintain results --check"),
        "name-check": Verb("harness.release:main",
                           "is the distribution's name free on the package index? (pip's own client)",
                           "fastpath-suite maintain name-check"),
    }),
    "release": ("releases", "from the gate's verdict to a release", {
        "accept": Verb("harness.release:accept_main",
                       "from the gate's MAY SHIP on omnivoice==X to the change that releases on it",
                       "fastpath-suite release accept omnivoice==0.2.2"),
    }),
}
JOB_GROUPS = ("counts", "nightly")  # listed with the jobs

# The spellings before the groups -> their new spelling (kept for one release).
OLD = {"history": "nightly", "instructions": "counts instructions", "structure": "counts structure",
       "record-nights": "nightly record", "nightly-history": "nightly"}
OLD.update({verb: f"{group} {verb}" for group in ("audit", "maintain") for verb in GROUPS[group][2]})


def fingerprints(argv) -> int:
    from fastpath.__main__ import fingerprints_main

    return fingerprints_main(argv, prog="fastpath-suite maintain fingerprints")


def hand_renderers() -> None:
    """Import every room and top-level job: each hands harness.run.results the renderers of its results kinds and
    docs blocks as it is imported (the bottom room imports none of the rooms above it, at run time either)."""
    import importlib
    import pkgutil

    import harness

    for found in pkgutil.iter_modules(harness.__path__):
        if found.name != "__main__":
            importlib.import_module(f"harness.{found.name}")


def maintain_results(argv) -> int:
    """`maintain results`: docs/results.md and the docs' rendered blocks, with every room's renderers handed over."""
    from harness.run import results

    hand_renderers()
    return results.main(argv)


def every_verb() -> dict:
    """{"report": Verb, "counts structure": Verb, ...}: every verb by its full spelling."""
    verbs = dict(JOBS)
    verbs.update({f"{group} {sub}": verb for group, (_, _, subs) in GROUPS.items() for sub, verb in subs.items()})
    return verbs


def usage() -> str:
    import textwrap

    width = max(map(len, [*JOBS, *GROUPS, *(sub for _, _, subs in GROUPS.values() for sub in subs)])) + 2
    lines = ["usage: fastpath-suite <verb> [options]   (the same: python -m harness <verb>)", "",
             "The OmniVoice fastpath suite: reports, speed and quality measurements, the version-bump gate.", "",
             "Your jobs:"]
    lines += [f"  {verb:{width}s}{v.summary}" for verb, v in JOBS.items()]
    lines += [f"  {group:{width}s}{GROUPS[group][0]}: {' | '.join(GROUPS[group][2])}" for group in JOB_GROUPS]
    for group, (heading, _, subs) in GROUPS.items():
        if group not in JOB_GROUPS:
            lines += ["", f"{heading[0].upper()}{heading[1:]} (fastpath-suite {group} <verb>):"]
            lines += [f"  {sub:{width}s}{v.summary}" for sub, v in subs.items()]
    lines += ["", "fastpath-suite <verb> --help shows a verb's options, their defaults and an example."]
    lines += textwrap.wrap(f"The spellings before the groups ({', '.join(sorted(OLD))}) still work for one release "
                           "and name their new spelling.", 110)
    lines += ["Tests: pytest -n auto (README.md; docs/ says which tier runs where)."]
    return "\n".join(lines)


def group_usage(group: str) -> str:
    _, summary, subs = GROUPS[group]
    width = max(map(len, subs)) + 2
    lines = [f"usage: fastpath-suite {group} <verb> [options]", "", f"{summary[0].upper()}{summary[1:]}.", "", "verbs:"]
    lines += [f"  {sub:{width}s}{v.summary}" for sub, v in subs.items()]
    lines += ["", f"fastpath-suite {group} <verb> --help shows a verb's options, their defaults and an example."]
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


def run_verb(spelling: str, verb: Verb, argv: list) -> int:
    """Run one verb; with --help, its help and then its example."""
    asked_help = any(a in ("-h", "--help") for a in argv)
    argv = [*verb.prefix, *argv]
    if verb.target.startswith("scripts/"):
        path = ROOT / verb.target
        if asked_help and path.suffix == ".sh":
            print(f"usage: fastpath-suite {spelling} ...\n\n{script_help(path)}")
            code = 0
        else:
            command = [sys.executable, str(path)] if path.suffix == ".py" else ["bash", str(path)]
            sys.stdout.flush()
            code = subprocess.call(command + argv)
    else:
        import importlib

        from harness.run import results

        results.COMMAND = [*spelling.split(), *argv[len(verb.prefix):]]  # as typed, in the new spelling
        module, function = verb.target.split(":")
        try:
            code = getattr(importlib.import_module(module), function)(argv)
        except SystemExit as exit_:  # argparse's --help and usage errors
            if not asked_help:
                raise
            code = exit_.code or 0
    if asked_help:
        print(f"\nexample:\n  {verb.example}")
    return code


# --- docs/commands.md: the command-line reference --------------------------------------------------------------

COMMANDS_PAGE = ROOT / "docs" / "commands.md"
WIDTH = "110"  # argparse wraps help to the terminal's columns: the page's width is fixed

HEAD = """# Commands

The command-line reference: each verb's `--help`, as `fastpath-suite maintain commands` renders it from the verbs'
own parsers (do not edit by hand; a test fails when this page is not what the parsers print). What the verbs are for,
and in which order a newcomer meets them: [README.md](../README.md); each tier's page explains its options.
"""


@contextlib.contextmanager
def _fixed_width():
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "PYTHONWARNINGS")}
    os.environ["COLUMNS"] = WIDTH
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _relative_defaults():
    """A default under the checkout is shown relative to it (docs/results.md, not /home/you/clone/docs/results.md),
    before argparse wraps the line: the page is the same in every clone."""
    import argparse

    expand = argparse.HelpFormatter._expand_help

    def relative(self, action):
        return expand(self, action).replace(f"{ROOT}/", "").replace(str(ROOT), ".")

    argparse.HelpFormatter._expand_help = relative
    try:
        yield
    finally:
        argparse.HelpFormatter._expand_help = expand


def captured(function, argv) -> str:
    """What `function(argv)` prints (stdout and stderr), at the page's width."""
    out = io.StringIO()
    with _fixed_width(), _relative_defaults(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            function(argv)
        except SystemExit:
            pass
    return out.getvalue().rstrip()


def sections() -> list:
    """(heading, text) of every verb in the listing's order, then `python -m fastpath`."""
    from fastpath.__main__ import fingerprints_main
    from fastpath.__main__ import main as package_main

    out = [("fastpath-suite", captured(main, ["--help"]))]
    for spelling, verb in every_verb().items():
        if verb.target.endswith(".py"):  # a Python script runs in a process of its own: its output is read
            with _fixed_width():
                done = subprocess.run([sys.executable, str(ROOT / verb.target), "--help"], capture_output=True,
                                      text=True, cwd=ROOT)
            text = f"{done.stdout.rstrip()}\n\nexample:\n  {verb.example}"
        else:
            text = captured(main, [*spelling.split(), "--help"])
        out.append((f"fastpath-suite {spelling}", text))
    out += [("python -m fastpath", captured(package_main, [])),
            ("python -m fastpath fingerprints", captured(fingerprints_main, ["--help"]))]
    return out


def commands_page() -> str:
    # between the marks every rendered block has: a record of what the verbs print (a script's own header may
    # show how it runs without the suite installed)
    body = [HEAD, "<!-- rendered by `fastpath-suite maintain commands`: do not edit by hand -->\n"]
    for heading, text in sections():
        body += [f"## `{heading}`\n", "```text", text, "```\n"]
    return "\n".join(body + ["<!-- end of commands -->\n"])


def maintain_commands(argv) -> int:
    """`maintain commands`: docs/commands.md, every verb's --help as its parser prints it (a test checks it is
    current, so an option, a default or a help text cannot change without the page)."""
    import argparse

    parser = argparse.ArgumentParser(prog="fastpath-suite maintain commands",
                                     description="Render docs/commands.md from every verb's --help.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is not what the parsers print")
    parser.add_argument("--page", type=Path, default=COMMANDS_PAGE, help="the page to write or check")
    args = parser.parse_args(argv)
    text = commands_page()
    if args.check:
        if not args.page.exists() or args.page.read_text() != text:
            print(f"{args.page}: not what the verbs' parsers print: run `fastpath-suite maintain commands` and "
                  "commit the page", file=sys.stderr)
            return 1
        print(f"{args.page} matches the verbs' parsers")
        return 0
    args.page.write_text(text)
    print(f"written: {args.page} ({text.count(chr(10) + '## ')} commands)")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    quiet_ffmpeg_warning()  # here, and in the Python processes a verb starts (PYTHONWARNINGS is inherited)
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          f"ignore:{FFMPEG_WARNING}:RuntimeWarning"]))
    if argv[0] in OLD:
        new = OLD[argv[0]].split()
        print(f"fastpath-suite: `{argv[0]}` is now `{' '.join(new)}` (the old spelling works for one release)",
              file=sys.stderr)
        argv = new + argv[1:]
    verb, rest = argv[0], argv[1:]
    if verb in JOBS:
        return run_verb(verb, JOBS[verb], rest)
    if verb in GROUPS:
        subs = GROUPS[verb][2]
        if not rest or rest[0] in ("-h", "--help", "help"):
            print(group_usage(verb))
            return 0 if rest else 2
        if rest[0] not in subs:
            print(f"fastpath-suite {verb}: unknown verb {rest[0]!r}\n\n{group_usage(verb)}", file=sys.stderr)
            return 2
        return run_verb(f"{verb} {rest[0]}", subs[rest[0]], rest[1:])
    print(f"fastpath-suite: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
