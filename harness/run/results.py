"""Results as data: every measuring command can write its figures, with where and how they were measured, into
`results/<kind>/<machine>.json`; `fastpath-suite maintain results` renders docs/results.md from those files.

A results file (JSON):

    {"format": "fastpath-results", "version": 1, "kind": "report",
     "machine": {... harness.run.machine.machine_info ...}, "machine_key": "cpu-amd-epyc-...",
     "machine_summary": "AMD EPYC ... (avx2), 2 usable CPUs of 2, ...",
     "commit": "<git HEAD>", "dirty": false, "date": "2026-12-01T16:02:11Z",
     "command": "fastpath-suite report --results results", "figures": {... the command's own ...}}

One file per kind and machine (the newest run replaces the last): the docs show the current figures of every
machine the project has measured on. Other pages hold blocks rendered the same way between two marks (`BLOCKS`: the
GPU targets in docs/gpu.md from results/gpu-check/ and the stored GPU baselines, the GPU script's time limits in
docs/gpu.md from the script and results/gpu-check/, the GPU tolerance rows in docs/parity.md from their code, what
each job costs in docs/ci.md from the results files that timed it). docs/results.md is never edited by hand; tests_harness/test_results.py
fails when it differs from what `fastpath-suite maintain results` renders, and a file that is not a results file (or of
another format version, or of a kind nothing renders) is refused with its path and the fix. Each kind's renderer is
handed over by the room that writes it (`hand_over`, from its __init__.py): this room imports no room above it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "results"
RESULTS_PAGE = ROOT / "docs" / "results.md"
FORMAT, VERSION = "fastpath-results", 1

# kind -> (section title, the verb that writes it); the page shows the sections in this order. The function that
# renders a kind's figures as markdown is handed over from above (hand_over).
KINDS = {
    "codec": ("The test checkpoint's codec: what it carries", "maintain checkpoint"),
    "report": ("CPU: stock, the public package and the lossless stack (the suite's report)", "report"),
    "grid": ("CPU speed over the whole grid of speed points", "grid"),
    "bench": ("Other bench runs", "bench"),
    "gpu-check": ("GPU tier", "gpu-check"),
    "stream": ("Streaming: time to first audio and underruns", "stream"),
    "prefix": ("Approximate prefix cache: speed and drift", "prefix"),
    "simulate": ("Quality gate: operating characteristics (simulation)", "audit simulate"),
    "simulate-sim": ("Speaker-similarity gate: operating characteristics (simulation)", "audit simulate"),
    "simulate-mos": ("Predicted-MOS gate: operating characteristics (simulation)", "audit simulate"),
    "known-answer": ("Quality gate: operating characteristics (real espeak-ng speech)", "audit known-answer"),
    "known-answer-sim": ("Speaker-similarity gate: operating characteristics (real espeak-ng speech)", "audit known-answer"),
    "known-answer-mos": ("Predicted-MOS gate: operating characteristics (real espeak-ng speech)", "audit known-answer"),
    "known-answer-clone": ("Version gate on an evaluation set (Seed-TTS-eval's layout, espeak-ng speech)",
                           "audit known-answer --metric clone-set"),
    "stream-voice": ("A stream keeps its voice: the seam check on espeak-ng streams", "audit known-answer"),
    "history-rates": ("Nightly history rule: operating characteristics on recorded nights", "nightly rates"),
    "history-rates-instructions": ("Nightly history rule on instruction counts: operating characteristics on "
                                   "recorded runs", "nightly rates"),
    "instructions": ("Instructions per call under callgrind, and how long counting them takes", "counts instructions"),
    "instructions-margins": ("Instruction counts stored for the per-change check, and their margins",
                             "counts instructions --record"),
    "stability": ("Unstable timings: the rule's rates", "audit stability"),
    "false-alarms": ("False alarms of the default suite on fresh clones", "audit false-alarms"),
    "gate": ("Version-bump gate findings", "gate"),
    "shards": ("The default run serial and sharded over xdist workers", "audit shards"),
    "mutants": ("Mutation score of what decides (the headline): a fresh sample, no test written against it",
                "audit mutants"),
    "mutants-before": ("Mutation score of a training sample, before the tests written against its survivors",
                       "audit mutants --training before"),
    "mutants-after": ("Mutation score of a training sample, after the tests written against its survivors",
                      "audit mutants --training after"),
    "mutants-change": ("Mutants of a change's lines (CI's stage)", "audit mutants --changed-since"),
    "mutants-gpu": ("Mutants only a GPU run can observe, run on a device", "audit mutants --needs-gpu"),
    "mutants-budget": ("Mutants of recent changes, and CI's mutants stage timed on each",
                       "audit mutant-budget"),
    "serving": ("Serving: omnivoice-server with fastpath against stock", "serve-check"),
    "name": ("The distribution's name on the package index", "maintain name-check"),
    "job-ci": ("CI on a clean clone (`.ci/run`): its wall time", "audit costs ci"),
    "job-nightly-speed": ("The nightly speed job on the CPU runner: its wall time", "audit costs nightly-speed"),
    "job-nightly-slow": ("The nightly slow job: its wall time", "audit costs nightly-slow"),
}

COMMAND: list | None = None  # the argv the dispatcher ran (set by harness.__main__), for the "command" field
# Blocks inside other docs pages, rendered the same way: name -> page in docs/ (its renderer, taking the results
# folder, handed over from above like a kind's)
BLOCKS = {"gpu-targets": "gpu.md", "gpu-tolerances": "parity.md", "gpu-limits": "gpu.md", "job-costs": "ci.md"}
# What the rooms above hand over: each a {kind or block name: renderer} or a function returning one (so a room's
# modules are imported only when a page is rendered). This room imports none of them (pyproject.toml's layers
# contract, kept at run time too: tests_harness/test_layout.py); each room's __init__.py and each top-level job hands
# its own when imported, and `fastpath-suite maintain results` imports them all first (harness.__main__).
HANDED: list = []


def hand_over(renderers) -> None:
    """Called from a room above, as it is imported: `renderers` is {kind or block name: function} or a function
    returning one."""
    if renderers not in HANDED:
        HANDED.append(renderers)


def renderer(name: str):
    """The function handed over for a kind (figures -> markdown) or a block (results folder -> markdown)."""
    for renderers in HANDED:
        table = renderers() if callable(renderers) else renderers
        if name in table:
            return table[name]
    raise ResultsError(f"no renderer handed over for {name!r}: the room that writes it hands it over when imported "
                       "(its __init__.py, or the top-level job's module); `fastpath-suite maintain results` imports "
                       "every room first")


def block_marks(name: str) -> tuple:
    return (f"<!-- rendered by `fastpath-suite maintain results` ({name}): do not edit by hand -->",
            f"<!-- end of {name} -->")


def render_block(name: str, page_text: str, results_dir: Path = RESULTS_DIR) -> str:
    """`page_text` with the block `name` between its marks rendered anew; ResultsError when the marks are missing."""
    page = BLOCKS[name]
    begin, end = block_marks(name)
    if page_text.count(begin) != 1 or page_text.count(end) != 1 or page_text.index(begin) > page_text.index(end):
        raise ResultsError(f"docs/{page}: the block {name!r} needs its two marks, once each and in order:\n{begin}\n"
                           f"{end}")
    body = renderer(name)(results_dir)
    head, rest = page_text.split(begin)
    return f"{head}{begin}\n{body.rstrip()}\n{end}{rest.split(end, 1)[1]}"


class ResultsError(ValueError):
    """A results file that cannot be read as one; the message names the file and the fix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--results DIR and --quiet, the options every measuring verb shares."""
    parser.add_argument("--results", type=Path, default=None, metavar="DIR",
                        help="also write a results file into DIR (e.g. results/), rendered by `fastpath-suite maintain results`")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def command_line() -> str:
    if COMMAND is not None:
        return shlex.join(["fastpath-suite", *COMMAND])
    return shlex.join(["python", *sys.argv])


def git(*args: str, cwd: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def checkout_state(cwd: Path = ROOT) -> tuple:
    """(HEAD's commit or None, whether tracked files differ from it), results and their page aside."""
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results", ":!docs/results.md",
                     cwd=cwd))
    return git("rev-parse", "HEAD", cwd=cwd) or None, dirty


def record(kind: str, figures: dict, out_dir: Path, device: str = "cpu", command: str | None = None,
           commit: str | None = None, dirty: bool = False) -> Path:
    """Write figures as results/<kind>/<machine key>.json under out_dir; returns the path. `commit`: the commit
    measured when it is not this checkout's as it is now (fresh clones of a ref: clean by construction; a long
    run's checkout when it began, `dirty` saying whether it had uncommitted changes then)."""
    from harness.run.machine import hardware_key, machine_info, summary

    if kind not in KINDS:
        raise ValueError(f"unknown results kind {kind!r}; known: {sorted(KINDS)}")
    info = machine_info(device)
    key = hardware_key(info)
    if not commit:
        commit, dirty = checkout_state()
    data = {"format": FORMAT, "version": VERSION, "kind": kind, "machine": info, "machine_key": key,
            "machine_summary": (f"{info['gpu_name']}, " if info.get("gpu_name") else "") + summary(),
            "commit": commit, "dirty": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command or command_line(), "figures": figures}
    path = Path(out_dir) / kind / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def write_if_asked(args, kind: str, figures: dict, device: str = "cpu", commit: str | None = None,
                   dirty: bool = False) -> Path | None:
    """record() when the command was given --results DIR; says where on stdout."""
    if getattr(args, "results", None) is None:
        return None
    path = record(kind, figures, args.results, device, commit=commit, dirty=dirty)
    print(f"results file: {path}")
    return path


def load(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ResultsError(f"{path}: not readable as JSON ({err}); delete it or rerun the command that wrote it "
                           "with --results") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsError(f"{path}: not a fastpath results file (no \"format\": \"{FORMAT}\"); results/ holds only "
                           "files written by a `fastpath-suite <verb> --results results/` run: move it elsewhere")
    if data.get("version") != VERSION:
        raise ResultsError(f"{path}: results format version {data.get('version')!r}, this suite reads {VERSION}; "
                           "rerun the command that wrote it with this checkout")
    if data.get("kind") not in KINDS:
        raise ResultsError(f"{path}: kind {data.get('kind')!r} is not one the page renders ({sorted(KINDS)})")
    missing = [k for k in ("machine_summary", "commit", "date", "command", "figures") if k not in data]
    if missing:
        raise ResultsError(f"{path}: missing {missing}; rerun the command that wrote it with --results")
    return data


def render(results_dir: Path = RESULTS_DIR) -> str:
    """docs/results.md from every results file under results_dir."""
    files = sorted(Path(results_dir).glob("*/*.json"))
    by_kind: dict = {}
    for path in files:
        data = load(path)
        if path.parent.name != data["kind"]:
            raise ResultsError(f"{path}: a {data['kind']!r} file in the {path.parent.name!r} folder; move it to "
                               f"results/{data['kind']}/")
        by_kind.setdefault(data["kind"], []).append((path, data))
    out = ["# Results", "",
           "Rendered by `fastpath-suite maintain results` from the files in `results/`; do not edit by hand. Each table says",
           "the machine, the commit, the date and the exact command that measured it. Add or refresh a table by",
           "running that command with `--results results/` and then `fastpath-suite maintain results`.", ""]
    for kind, (title, verb) in KINDS.items():
        out += [f"## {title}", ""]
        entries = by_kind.get(kind, [])
        if not entries:
            out += [f"No results file yet: `fastpath-suite {verb} --results results/` writes one.", ""]
            continue
        for path, data in entries:
            commit = (data["commit"] or "unknown")[:12] + (" (with uncommitted changes)" if data["dirty"] else "")
            out += [f"### {data['machine_summary']}", "",
                    f"Measured {data['date'][:10]} at commit `{commit}` with `{data['command']}` "
                    f"(file `{path.relative_to(results_dir.parent) if path.is_relative_to(results_dir.parent) else path}`).",
                    "", renderer(kind)(data["figures"]).rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite maintain results", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is not the rendering")
    parser.add_argument("--dir", type=Path, default=RESULTS_DIR, help="the results folder")
    parser.add_argument("--page", type=Path, default=RESULTS_PAGE, help="the page to write or check")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help=f"the folder of the pages whose blocks are rendered too ({', '.join(sorted(BLOCKS))})")
    args = parser.parse_args(argv)
    try:
        pages = {args.page: render(args.dir)}
        for name, page in BLOCKS.items():
            page = args.docs / page
            if page.exists():  # a folder of pages without it (a test's) renders the others
                pages[page] = render_block(name, pages.get(page, page.read_text()), args.dir)
    except ResultsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        stale = [page for page, text in pages.items() if not page.exists() or page.read_text() != text]
        if stale:
            print(f"{', '.join(map(str, stale))}: not what `fastpath-suite maintain results` renders from {args.dir}: "
                  "run it and commit the pages", file=sys.stderr)
            return 1
        print(f"{', '.join(map(str, pages))} match {args.dir}")
        return 0
    for page, text in pages.items():
        page.write_text(text)
    print(f"written: {', '.join(map(str, pages))} from {len(list(args.dir.glob('*/*.json')))} results files")
    return 0
