"""Instructions executed per call, counted by callgrind: a speed signal that does not move with the machine's load.

Wall time on these shared 2-core VMs moves 3-20% between processes and doubles beside a busy neighbour; the number
of instructions a call executes, counted by valgrind's callgrind, moves by hundredths of a percent and not at all
with the load (docs/nightly.md). So every counting point (harness.counts.calls) is also run under callgrind, one
thread, seeds and inputs fixed, and its count goes into a history of its own, judged with floors set from its own
noise.

How (the field's way: valgrind's client requests, as torch.utils.benchmark's callgrind support uses them): one
child process runs under ``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no``. It imports torch,
loads the models and runs every point once at valgrind's uninstrumented speed (the warm-up: imports, first-call
allocations and lazy initialisation stay outside every count), turns instrumentation on (``callgrind_control -i
on``), then for each point switches collection on as the counted part begins (``torch._C._valgrind_toggle``) and
off as it ends, dumping the counts (``torch._C._valgrind_toggle_and_dump_stats``). The parent reads each dump's
total (Ir). Importing torch under valgrind is most of a child's time, so one child counts every point.

A count depends on the code that runs: torch and omnivoice, the valgrind version and the CPU capability torch sees
under valgrind; the kernels' instruction sets are pinned (CHILD_ENV). These make the run's device key
(`device_key`), and a history holds one key. The processor's vendor is not in it: AMD and Intel machines count
within the margins of one another (docs/counts.md).

Every change is checked against the stored counts (`--check`, baselines/instructions.json): each counted call, and
the lossless stack's count over stock's in the same run, must be within its own margin of the figure stored for the
key, in both directions (`check`). The margins come from the measured spread of the runs they were recorded from
(`spread`, `record`).

    fastpath-suite counts instructions                     # every counting point, stock and lossless: a run file
    fastpath-suite counts instructions --points clone3-short-2 --variants stock lossless --check baselines/instructions.json
    fastpath-suite counts instructions --record baselines/instructions.json --from out/counts-1.json out/counts-2.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from harness import REPO_ROOT
from harness.speed.baselines import migrated_key  # noqa: F401 - the instruction keys' older form, read as today's

BASELINE = REPO_ROOT / "baselines" / "instructions.json"
FORMAT, FORMAT_VERSION = "fastpath-instructions", 2  # of BASELINE
METRIC = "instructions"
# A stored figure's margin (docs/counts.md, "Every change is checked too"): MARGIN_SPREADS times the larger of the
# within-machine standard deviation and the largest offset of a machine kind's median from the stored figure (5 x
# the larger is at least the offset plus 4 sd: a clean run on the farthest kind passes unless it is 4 sd out),
# never below MARGIN_FLOOR (what no recorded run measures: another checkout folder, another machine kind's GEMMs).
MARGIN_SPREADS = 5
MARGIN_FLOOR = 0.001
FALLBACK_MARGIN = 0.01  # a figure recorded from one run with no margin stored before: the old floor of every count
# The environment every count is made in: one thread, a fixed hash seed (Python's string hashing changes the
# instructions of dict and set operations from process to process otherwise), and fixed kernel instruction sets.
# Valgrind emulates FMA instructions with a helper call each, so MKL's and oneDNN's AVX2 (FMA) GEMM kernels crawl
# under it (a 112x1024x3072 product: 22 s) and a full-size forward would take hours; their SSE4 kernels slow down as
# ordinary code does (docs/counts.md). The count is then the count of the SSE4 GEMMs (the same
# multiply-adds in narrower vectors: it scales with the work as the AVX2 kernels' would) and does not depend on
# which vector units the machine has. ATen's own kernels are held at AVX2, the
# widest valgrind 3.19 presents on any machine of this project.
CHILD_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "avx2"}
VALGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no")
HOW_TO_INSTALL = "install valgrind (Debian: apt-get install valgrind; scripts/install.sh does)"


class InstructionsError(RuntimeError):
    """Counting could not run, or a run file or stored count cannot be used; the message names the fix."""


def valgrind_version() -> str:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise InstructionsError(f"valgrind (with callgrind_control) is not on PATH: {HOW_TO_INSTALL}")
    out = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return out.removeprefix("valgrind-")


def device_key(valgrind: str, capability: str, versions: dict) -> str:
    """What a count depends on: valgrind's version, the CPU capability torch sees under valgrind, torch and
    omnivoice. The kernels' instruction sets are fixed by CHILD_ENV, whatever the caller's environment says, so they
    are not part of the key; nor is the processor's vendor (an Intel Xeon counted within the AMD machines' spread:
    docs/nightly.md)."""
    return (f"callgrind-{valgrind}-{capability.lower()}__torch-{versions.get('torch')}"
            f"__omnivoice-{versions.get('omnivoice')}")


# --- the child: runs under valgrind ------------------------------------------------------------------------------

def _counted():
    """Collection on for the block; off and dumped at its end (one dump file per block). Callgrind's collection
    state is per thread: `window.worker()` switches it on in another thread for the part of the block that thread
    runs (the stream's worker), and off again before the block's end dumps."""
    import contextlib
    import threading

    import torch

    owner = []

    @contextlib.contextmanager
    def window():
        owner[:] = [threading.get_ident()]
        torch._C._valgrind_toggle()
        try:
            yield
        finally:
            torch._C._valgrind_toggle_and_dump_stats()

    @contextlib.contextmanager
    def worker():
        other = threading.get_ident() not in owner
        if other:
            torch._C._valgrind_toggle()
        try:
            yield
        finally:
            if other:
                torch._C._valgrind_toggle()

    window.worker = worker
    return window


def child(spec_path: Path) -> int:
    """Under valgrind: warm every (point, variant) of spec["points"] x spec["variants"] up, switch instrumentation
    on, then make each call once, in that order, counting those named in spec["counted"] and stopping after the
    last of them; write the order counted and what the counts depend on to spec["out"].

    spec["points"] is every counting point of one checkpoint size, whatever was asked: a call's count moves by up to
    a tenth of a percent with the calls made before it in the process (the heap they leave), so a counted call is
    always preceded by the same warm-ups and calls, and counting two points gives the counts a run of all of them
    gives (docs/nightly.md)."""
    import torch

    from harness.model.checkpoint import build_checkpoint, load_model
    from harness.run.machine import versions
    from harness.counts import calls

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    if not torch._C._valgrind_supported_platform():
        raise InstructionsError("this torch build has no valgrind client requests (torch._C._valgrind_toggle)")
    points = [calls.point_named(name) for name in spec["points"]]
    models = {size: load_model(build_checkpoint(size)) for size in dict.fromkeys(p.size for p in points)}
    prompts = {size: {} for size in models}
    runs = [(f"{p.name}/{v}", calls.make_call(models[p.size], p, v, prompts[p.size]),
             calls.make_call(models[p.size], p, v, prompts[p.size], warmup=True))
            for p in points for v in spec["variants"]]
    counted = set(spec["counted"])
    last = max(i for i, (name, _, _) in enumerate(runs) if name in counted)

    def say(text):
        if not spec.get("quiet"):
            print(f"[instructions {spec.get('label', '')}] {text}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    for i, (name, _, warm) in enumerate(runs, 1):
        warm(calls.nothing)
        say(f"warm-up {i}/{len(runs)}: {name} ({time.perf_counter() - start:.0f} s)")
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    window, order, took = _counted(), [], []
    for i, (name, call, _) in enumerate(runs[:last + 1], 1):
        begun = time.perf_counter()
        if name not in counted:
            call(calls.nothing)  # made, not counted: the calls after it see the same process as in a whole run
            say(f"made {i}/{last + 1}: {name}, not counted ({time.perf_counter() - begun:.0f} s)")
            continue
        call(window)
        order.append(name)
        took.append(time.perf_counter() - begun)
        left = (len(counted) - len(order)) * sum(took) / len(took)
        say(f"counted {len(order)}/{len(counted)}: {name} ({took[-1]:.0f} s; about {left / 60:.0f} min left)")
    import fastpath

    Path(spec["out"]).write_text(json.dumps({"order": order, "capability": torch.backends.cpu.get_cpu_capability(),
                                             "versions": versions(), "seconds": took,
                                             "fastpath": str(Path(fastpath.__file__).parent)}))
    return 0


# --- the parent: counting ----------------------------------------------------------------------------------------

def dump_total(path: Path) -> int:
    """The total instruction count (Ir) of one callgrind dump: its "totals:" line (or "summary:")."""
    total = None
    for line in Path(path).read_text(errors="replace").splitlines():
        match = re.match(r"(totals|summary):\s+(\d+)", line)
        if match:
            total = int(match.group(2))
    if total is None:
        raise InstructionsError(f"{path}: no totals line; not a callgrind dump")
    return total


def code_root() -> Path:
    """The folder this process imported `harness` from, links not resolved: the child counts the code beside it.
    `nightly bisect --count-with this` runs in a folder linking this checkout's harness/ beside a commit's fastpath/;
    REPO_ROOT resolves the link back to this checkout, and a child started there would count this checkout's
    fastpath at every commit."""
    import harness

    return Path(harness.__file__).parent.parent


def fastpath_folder() -> Path:
    """The fastpath package this process imports (links resolved): the one the child must count."""
    import importlib.util

    return Path(importlib.util.find_spec("fastpath").origin).resolve().parent


def count(points: list, variants: list, keep: Path | None = None, quiet: bool = False) -> dict:
    """{"counts": {"<point>/<variant>": instructions}, "key": device key, "machine": ..., ...}: one valgrind child
    per checkpoint size, the children side by side (a count does not move with the load, and each child is one
    thread)."""
    from harness.run.machine import machine_info
    from harness.counts import calls

    by_size: dict = {}
    for name in points:
        by_size.setdefault(calls.point_named(name).size, []).append(name)  # an unknown name is refused here
    version = valgrind_version()
    root = Path(tempfile.mkdtemp(prefix="fastpath-callgrind-")) if keep is None else Path(keep)
    code = code_root()
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(code),
                                                                                 os.environ.get("PYTHONPATH")]))}
    started, children = time.perf_counter(), {}
    for size, names in by_size.items():
        folder = root / size
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("callgrind.out*"):
            old.unlink()
        spec = folder / "spec.json"
        spec.write_text(json.dumps({"points": [p.name for p in calls.load_points() if p.size == size],
                                    "variants": list(calls.VARIANTS),
                                    "counted": [f"{name}/{v}" for name in names for v in variants],
                                    "out": str(folder / "order.json"), "label": size, "quiet": quiet}))
        command = [*VALGRIND, f"--callgrind-out-file={folder / 'callgrind.out'}", sys.executable, "-m",
                   "harness.counts.instructions", "--child", str(spec)]
        children[size] = (folder, command, subprocess.Popen(command, env=env, cwd=code, stdout=subprocess.DEVNULL))
    counts, metas = {}, []
    for size, (folder, command, child_process) in children.items():
        if child_process.wait() != 0:
            for _, _, other in children.values():
                other.kill()
            raise InstructionsError(f"the callgrind child for the {size} points exited {child_process.returncode} "
                                    f"(its messages are above); command: {' '.join(command)}")
        meta = json.loads((folder / "order.json").read_text())
        if Path(meta.get("fastpath", "")).resolve() != fastpath_folder():
            raise InstructionsError(f"the callgrind child counted the fastpath in {meta.get('fastpath')}, not this "
                                    f"process's ({fastpath_folder()}): its PYTHONPATH or folder is wrong")
        dumps = sorted(folder.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(meta["order"]):
            raise InstructionsError(f"{len(dumps)} callgrind dumps for {len(meta['order'])} counted calls in {folder}")
        counts.update({name: dump_total(path) for name, path in zip(meta["order"], dumps)})
        metas.append(meta)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
    capability = metas[0]["capability"]
    return {"counts": {name: counts[name] for name in sorted(counts, key=lambda n: (points.index(n.split("/")[0]),
                                                                                     variants.index(n.split("/")[1])))},
            "key": device_key(version, capability, metas[0]["versions"]), "valgrind": version,
            "capability": capability, "versions": metas[0]["versions"],
            "machine": {**machine_info("cpu"), "valgrind": version, "capability_under_valgrind": capability},
            "seconds": round(time.perf_counter() - started, 1),
            "call_seconds": {name: t for m in metas for name, t in zip(m["order"], m["seconds"])}}


def run_file(measured: dict, command: str) -> dict:
    """A speed-baseline-format run file of the counts (metric "instructions"), which `nightly append` takes."""
    from harness.speed.baselines import FORMAT, FORMAT_VERSION, git_commit

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "device_key": measured["key"],
            "machine": measured["machine"],
            "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
            "commit": git_commit(REPO_ROOT),
            "points": {name: {"metric": METRIC, "samples": [n], "median": n, "extra": {}}
                       for name, n in measured["counts"].items()}}


def ratios(counts: dict) -> dict:
    """{point: lossless / stock} for the points counted in both variants."""
    out = {}
    for name, n in counts.items():
        point, variant = name.split("/")
        if variant == "lossless" and f"{point}/stock" in counts:
            out[point] = n / counts[f"{point}/stock"]
    return out


# --- runs recorded before: run files, histories, results files ---------------------------------------------------

def machine_kind(machine: dict) -> str:
    """The machine kind a run was counted on: its hardware key (processor, instruction set, CPUs), or for a count
    reported without a full machine description, its processor's name."""
    from harness.run.machine import hardware_key, slug

    try:
        return hardware_key(machine)
    except (ValueError, KeyError, TypeError):
        return slug(str(machine.get("cpu_model", "unknown")))


def load_runs(paths: list) -> list:
    """Counted runs from the files the counting commands write: run files (`--out`), histories of counts (`history
    append`, `record-nights --signal instructions`: every night is a run) and `--results` files of this verb. Each
    run: {"key", "counts", "machine", "kind", "source"}; the key in today's form (migrated_key)."""
    from harness.run import results
    from harness.speed import baselines
    from harness.nightly import history

    runs = []
    for path in map(Path, paths):
        fix = (f"give the run files `fastpath-suite counts instructions --out` wrote, a history of counts or a "
               f"results/instructions/ file")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InstructionsError(f"{path}: not readable ({err}); {fix}") from None
        found = data.get("format") if isinstance(data, dict) else None
        if found == baselines.FORMAT:
            pieces = [(data.get("device_key"), data.get("points"), data.get("machine"), str(path))]
        elif found == history.FORMAT:
            try:
                nights = history.load_history(path).nights
            except history.HistoryError as err:
                raise InstructionsError(str(err)) from None
            pieces = [(n.machine.get("device_key") or data.get("device_key"), n.points, n.machine,
                       f"{path} (night {n.id})") for n in nights]  # each night's own key: versions move
        elif found == results.FORMAT and data.get("kind") == "instructions":
            figures = data.get("figures") or {}
            pieces = [(figures.get("key"), {name: {"metric": METRIC, "samples": [n]}
                                            for name, n in (figures.get("counts") or {}).items()},
                       data.get("machine"), str(path))]
        else:
            raise InstructionsError(f"{path}: format {found!r} is not a run of counts; {fix}")
        for key, points, machine, source in pieces:
            counts = {}
            for name, entry in (points or {}).items():
                samples = entry.get("samples") if isinstance(entry, dict) else None
                if entry.get("metric") != METRIC or not isinstance(samples, list) or len(samples) != 1 \
                        or not is_whole(samples[0]):
                    raise InstructionsError(f"{source}: {name!r} is not one instruction count; {fix}")
                counts[name] = int(samples[0])
            if not isinstance(key, str) or not counts:
                raise InstructionsError(f"{source}: no device key or no counts; {fix}")
            runs.append({"key": migrated_key(key), "counts": counts, "machine": dict(machine or {}),
                         "kind": machine_kind(machine or {}), "source": source})
    return runs


def is_count(value) -> bool:
    """A stored count: a positive whole number, written as one (JSON's 1000, not 1000.0 or "1000")."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_whole(value) -> bool:
    """A count read from a run (a history keeps its samples as floats): a positive whole number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value == int(value) and value > 0


# --- the stored counts and their margins ---------------------------------------------------------------------------

def spread(by_kind: dict) -> dict:
    """A stored figure and its margin from the runs of one figure grouped by machine kind ({kind: [value, ...]}).

    value: the median of the kinds' medians (a kind with many runs does not outvote the others). sd: the standard
    deviation of log(value) within a kind, pooled over the kinds with 2 runs or more (None when there is none).
    offset: the largest |kind's median / value - 1|. widest: the largest |run / value - 1|. margin:
    max(MARGIN_FLOOR, MARGIN_SPREADS x max(sd, offset)), rounded up to 0.001%; None when no spread was measured (no
    kind with 2 runs)."""
    medians = {kind: statistics.median(values) for kind, values in by_kind.items()}
    value = statistics.median(medians.values())
    pooled = [(len(v) - 1, statistics.variance([math.log(x) for x in v])) for v in by_kind.values() if len(v) > 1]
    dof = sum(d for d, _ in pooled)
    sd = math.sqrt(sum(d * var for d, var in pooled) / dof) if dof else None
    offset = max(abs(m / value - 1) for m in medians.values())
    widest = max(abs(x / value - 1) for v in by_kind.values() for x in v)
    margin = None if sd is None else max(MARGIN_FLOOR, math.ceil(MARGIN_SPREADS * max(sd, offset) * 1e5) / 1e5)
    machines = {kind: {"runs": len(v), "median": medians[kind],
                       "sd": statistics.stdev([math.log(x) for x in v]) if len(v) > 1 else None,
                       "range": (max(v) - min(v)) / medians[kind]} for kind, v in by_kind.items()}
    return {"value": value, "sd": sd, "offset": offset, "widest": widest, "margin": margin, "machines": machines}


def check_stored(stored: object, where: str) -> dict:
    """The stored counts, validated: every key with its counts and ratios, every count a positive integer, every
    ratio positive, every margin in (0, 1). InstructionsError naming the fix otherwise (never a traceback)."""
    fix = (f"restore {where} from git (`git checkout -- {where}`), or record the figure again "
           f"(`fastpath-suite counts instructions --record {where} --from RUN ...`, docs/nightly.md)")
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        if isinstance(stored, dict) and "floor" in stored:
            raise InstructionsError(f"{where} is in the older format (one floor for every count, no margins): "
                                    f"record runs into it with `fastpath-suite counts instructions --record {where} --from "
                                    f"RUN ...`, which converts it (docs/nightly.md)")
        raise InstructionsError(f"{where} is not a file of stored counts (no \"format\": \"{FORMAT}\"): {fix}")
    if stored.get("format_version") != FORMAT_VERSION:
        raise InstructionsError(f"{where} has format_version {stored.get('format_version')!r}, this suite reads "
                                f"{FORMAT_VERSION}: {fix}")
    if not isinstance(stored.get("keys"), dict):
        raise InstructionsError(f"{where} has no \"keys\": {fix}")
    for key, figures in stored["keys"].items():
        if not isinstance(figures, dict) or not isinstance(figures.get("counts"), dict) \
                or not isinstance(figures.get("ratios"), dict):
            raise InstructionsError(f"{where}: {key} lacks its \"counts\" or its \"ratios\": {fix}")
        for value_name, table, good, what in (("count", "counts", is_count, "a positive whole number"),
                                               ("ratio", "ratios", is_ratio, "a positive number")):
            for name, entry in figures[table].items():
                value = entry.get(value_name) if isinstance(entry, dict) else entry
                if not isinstance(entry, dict) or not good(value):
                    raise InstructionsError(f"{where}: {key}: the stored {value_name} of {name} is {value!r}, not "
                                            f"{what}: {fix}")
                if not is_margin(entry.get("margin")):
                    raise InstructionsError(f"{where}: {key}: {name} has margin {entry.get('margin')!r}, not a share "
                                            f"between 0 and 1: {fix}")
    return stored


def is_ratio(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def is_margin(value) -> bool:
    return is_ratio(value) and value < 1


def load_stored(path: Path) -> dict:
    try:
        stored = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InstructionsError(f"no stored counts at {path}: give the file `fastpath-suite counts instructions --record` "
                                f"writes (baselines/instructions.json)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise InstructionsError(f"{path} is not readable JSON ({err}): restore it from git "
                                f"(`git checkout -- {path}`)") from None
    return check_stored(stored, str(path))


@dataclass
class Verdict:
    """One run against the stored figures of its key: lines of more work, less work, what is not stored, and how
    many figures were within their margins."""

    key: str
    more: list = field(default_factory=list)
    less: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    within: int = 0


def check(measured: dict, stored: dict) -> Verdict:
    """Each count of the run against the stored count of its device key and its margin, and each stack-to-stock
    ratio (same run, so the machine cancels) against the key's stored ratio and its margin, in both directions:
    above by more than the margin is more work, below by more than the margin is less work (a figure not updated
    would let a later change give the gain back unseen). What is not stored is listed in `missing`.
    `stored`: as check_stored returns it."""
    key = migrated_key(measured["key"])
    verdict = Verdict(key=key)
    known = stored["keys"].get(key)
    if known is None:
        verdict.missing.append(f"no stored counts for device key {key} (stored: "
                               f"{', '.join(sorted(stored['keys'])) or 'none'})")
        return verdict
    compared = [(name, n, known["counts"].get(name), "count", f"{name}: {n:,} instructions against {{stored:,}} "
                 f"stored") for name, n in measured["counts"].items()]
    compared += [(point, r, known["ratios"].get(point), "ratio", f"{point}: the lossless stack executes {r:.5f}x "
                  f"stock's instructions against {{stored:.5f}}x stored") for point, r in
                 ratios(measured["counts"]).items()]
    for name, value, entry, field_name, text in compared:
        if entry is None:
            what = "count" if field_name == "count" else "lossless/stock ratio"
            verdict.missing.append(f"no stored {what} of {name} for {key}")
            continue
        change = value / entry[field_name] - 1
        line = f"{text.format(stored=entry[field_name])} ({change:+.3%}, margin {entry['margin']:.3%})"
        if change > entry["margin"]:
            verdict.more.append(line)
        elif change < -entry["margin"]:
            verdict.less.append(line)
        else:
            verdict.within += 1
    return verdict


class MoreWorkRefused(InstructionsError):
    """--record of counts that are more work than the stored ones, without --accept-more-work."""


def record(runs: list, path: Path = BASELINE, accept_more_work: bool = False) -> dict:
    """Store the counts and stack-to-stock ratios of one device key from its runs (other keys kept); returns what
    was stored with how each margin was derived (the `instructions-margins` results).

    Per figure: the median of the machine kinds' medians, and its margin from their spread (`spread`). From one run
    (no spread measured) the figure's stored margin is kept, or FALLBACK_MARGIN when there is none. A figure above
    the stored one by more than its stored margin is more work: refused (MoreWorkRefused, nothing written) unless
    `accept_more_work`. Less work needs no flag."""
    from harness.speed.baselines import write_atomic

    keys = sorted({run["key"] for run in runs})
    if len(keys) != 1:
        raise InstructionsError(f"runs of {len(keys)} device keys ({', '.join(keys) or 'none'}): record each key's "
                                f"runs apart")
    seen = {}
    for run in runs:
        same = json.dumps(run["counts"], sort_keys=True)
        if same in seen:
            raise InstructionsError(f"the same run given twice ({seen[same]} and {run['source']}): give each run "
                                    f"once, or its spread is understated")
        seen[same] = run["source"]
    key, path = keys[0], Path(path)
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InstructionsError(f"{path} is not readable JSON ({err}): restore it from git "
                                    f"(`git checkout -- {path}`)") from None
        if isinstance(stored, dict) and "floor" in stored and "format" not in stored:
            stored = from_older_format(stored)
        elif not isinstance(stored, dict) or stored.get("format") != FORMAT \
                or stored.get("format_version") != FORMAT_VERSION:
            check_stored(stored, str(path))  # names what is wrong
    else:
        stored = {"format": FORMAT, "format_version": FORMAT_VERSION, "keys": {}}
    before = stored.setdefault("keys", {}).get(key) or {}
    kinds: dict = {}
    for run in runs:
        kinds.setdefault(run["kind"], {"runs": 0, "reported": run["machine"].get("reported")})["runs"] += 1
    figures = {"key": key, "rule": rule(), "sources": [run["source"] for run in runs], "kinds": kinds, "counts": {},
               "ratios": {}}
    entries, more = {"counts": {}, "ratios": {}}, []
    for table, field_name, values_of in (("counts", "count", lambda run: run["counts"]),
                                         ("ratios", "ratio", lambda run: ratios(run["counts"]))):
        names = list(dict.fromkeys(name for run in runs for name in values_of(run)))
        for name in names:
            by_kind: dict = {}
            for run in runs:
                if name in values_of(run):
                    by_kind.setdefault(run["kind"], []).append(values_of(run)[name])
            found = spread(by_kind)
            value = round(found["value"]) if field_name == "count" else found["value"]
            old = (before.get(table) or {}).get(name)
            old_ok = isinstance(old, dict) and is_margin(old.get("margin")) and \
                (is_count if field_name == "count" else is_ratio)(old.get(field_name))
            runs_of = sum(len(v) for v in by_kind.values())
            if found["margin"] is not None:
                margin, derived = found["margin"], {"runs": runs_of, "machine_kinds": len(by_kind),
                                                    "sd": found["sd"], "offset": found["offset"]}
            elif old_ok:
                margin, derived = old["margin"], old.get("margin_from") or {"kept": True}
            else:
                margin, derived = FALLBACK_MARGIN, {"runs": runs_of, "fallback": True}
            if old_ok and value > old[field_name] * (1 + old["margin"]):
                shown = f"{value:,}" if field_name == "count" else f"{value:.5f}"
                before_shown = f"{old[field_name]:,}" if field_name == "count" else f"{old[field_name]:.5f}"
                more.append(f"{name}: {shown} against {before_shown} stored ({value / old[field_name] - 1:+.3%}, "
                            f"margin {old['margin']:.3%})")
            entries[table][name] = {field_name: value, "runs": runs_of, "margin": margin, "margin_from": derived}
            figures[table][name] = {"value": value, "margin": margin, "sd": found["sd"], "offset": found["offset"],
                                    "widest": found["widest"], "machines": found["machines"],
                                    "stored_before": old.get(field_name) if old_ok else None}
    if more and not accept_more_work:
        raise MoreWorkRefused("\n".join(f"MORE WORK: {line}" for line in more) + f"\nnot stored: these are more work "
                              f"than {path} holds for {key}; if the added work is meant, store them with "
                              f"--accept-more-work (and say why in the commit)")
    stored["_about"] = ABOUT
    stored["rule"] = rule()
    for table in ("counts", "ratios"):
        stored["keys"].setdefault(key, {}).setdefault(table, {}).update(entries[table])
    check_stored(stored, str(path))
    write_atomic(path, json.dumps(stored, indent=1, sort_keys=True) + "\n")
    figures["accepted_more_work"] = more
    return figures


def from_older_format(stored: dict) -> dict:
    """A file of the older format (one floor for every count, one ratio per point for all keys, keys naming the
    vendor) as today's: each count with the old floor as its margin, under its key's migrated form. The ratios are
    left out (which key they were recorded under is not known): recording a key's runs stores its own."""
    floor = stored.get("floor")
    if not is_margin(floor) or not isinstance(stored.get("keys"), dict):
        raise InstructionsError("the stored counts are in the older format and lack a usable floor or keys: restore "
                                "them from git, or move the file away and record every key again")
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "keys": {migrated_key(key): {"counts": {name: {"count": n, "margin": floor, "margin_from":
                                                           {"older_format": True}} for name, n in counts.items()},
                                         "ratios": {}} for key, counts in stored["keys"].items()}}


def rule() -> dict:
    return {"floor": MARGIN_FLOOR, "spreads": MARGIN_SPREADS, "fallback": FALLBACK_MARGIN,
            "text": f"margin = max({MARGIN_FLOOR:.1%}, {MARGIN_SPREADS} x max(sd, offset)); from one run, the stored "
                    f"margin, else {FALLBACK_MARGIN:.0%}"}


ABOUT = ("Instructions each counting point executes under callgrind, per device key, and the lossless stack's count "
         "over stock's (same run), each with its margin: `fastpath-suite counts instructions --check` fails on a figure "
         "more than its margin above (MORE WORK) or below (LESS WORK) it. Written by `fastpath-suite counts instructions "
         "--record`; how each margin was derived is in its margin_from (docs/counts.md).")


def main(argv=None) -> int:
    from harness.run import results
    from harness.run import strict
    from harness.run.results import command_line
    from harness.counts import calls

    parser = argparse.ArgumentParser(prog="fastpath-suite counts instructions", description=__doc__.split("\n")[0],
                                     epilog="Exit status of --check: 0 every figure within its margin; 1 MORE WORK, "
                                            "LESS WORK or (strict) MISSING; 2 could not run; 3 not judged (a figure "
                                            "not stored, with --no-strict-inputs). --record: 1 when it refuses more "
                                            "work.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    calls.add_arguments(parser)
    parser.add_argument("--check", type=Path, default=None, metavar="FILE",
                        help="compare with stored counts (e.g. baselines/instructions.json): exit 1 when a count or "
                             "stack-to-stock ratio is more than its margin above or below its stored figure")
    parser.add_argument("--record", type=Path, nargs="?", const=BASELINE, default=None, metavar="FILE",
                        help=f"store the counts and their margins as this device key's (FILE: "
                             f"{BASELINE.relative_to(REPO_ROOT)})")
    parser.add_argument("--from", dest="runs", type=Path, nargs="+", default=None, metavar="RUN",
                        help="check or record these runs instead of counting: run files (--out), histories of "
                             "counts, results/instructions/ files; several runs give each figure's margin from "
                             "their spread")
    parser.add_argument("--accept-more-work", action="store_true",
                        help="--record even counts that are more work than the stored ones beyond their margins")
    parser.add_argument("--keep", type=Path, default=None, help="keep the callgrind dumps in this folder")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    results.add_arguments(parser)
    strict.add_argument(parser)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.check and args.record:
        parser.error("give --check or --record, not both (record after a check says what it found)")
    if args.accept_more_work and not args.record:
        parser.error("--accept-more-work goes with --record")
    if args.runs and not (args.check or args.record):
        parser.error("--from gives runs to --check or --record")
    points = args.points or [p.name for p in calls.load_points()]
    try:
        if args.runs:
            runs = load_runs(args.runs)
        else:
            if not args.quiet:
                print(f"[instructions] counting {len(points)} point(s) x {len(args.variants)} variant(s) under "
                      f"callgrind, one process per checkpoint size side by side (importing torch under valgrind "
                      f"takes minutes: about 7 for the tiny points, 9 for the full-size one, here)", file=sys.stderr,
                      flush=True)
            measured = count(points, args.variants, args.keep, args.quiet)
            for name, n in measured["counts"].items():
                print(f"{name}: {n:,} instructions")
            print(f"device key: {measured['key']}; {measured['seconds']:.0f} s in all")
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(run_file(measured, command_line()), indent=1) + "\n")
                print(f"run file: {args.out}")
            results.write_if_asked(args, "instructions", {k: measured[k] for k in (
                "counts", "key", "valgrind", "capability", "versions", "seconds", "call_seconds")} | {
                "ratios": ratios(measured["counts"]), "child_env": CHILD_ENV})
            runs = [{**measured, "kind": machine_kind(measured["machine"]), "source": "this run"}]
        if args.record:
            try:
                figures = record(runs, args.record, args.accept_more_work)
            except MoreWorkRefused as err:
                print(err)
                return 1
            for line in figures["accepted_more_work"]:
                print(f"MORE WORK, accepted: {line}")
            print(f"stored: {args.record} ({figures['key']}: {len(figures['counts'])} counts, "
                  f"{len(figures['ratios'])} ratios, from {len(runs)} run(s))")
            results.write_if_asked(args, "instructions-margins", figures | {"files": [str(p) for p in args.runs or ()]})
        if args.check:
            return report(runs, load_stored(args.check), how_to_record(args, points), args.strict_inputs)
    except (InstructionsError, KeyError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def how_to_record(args, points: list) -> tuple:
    """(the command that stores what a check found, the same from the run file already written or None)."""
    stored = str(args.check)
    if args.runs:
        return shlex.join(["fastpath-suite", "counts", "instructions", "--record", stored, "--from", *map(str, args.runs)]), None
    command = shlex.join(["fastpath-suite", "counts", "instructions", "--points", *points, "--variants", *args.variants,
                          "--record", stored])
    again = shlex.join(["fastpath-suite", "counts", "instructions", "--record", stored, "--from", str(args.out)]) if args.out \
        else None
    return command, again


def report(runs: list, stored: dict, how: tuple, strict_inputs: bool) -> int:
    """Print each run's verdict and a summary; the exit status: 1 on more or less work, else 1 (strict) or 3 (not
    judged) when a figure is not stored, else 0."""
    from harness.run import strict

    command, again = how
    record_command = command + (f" (or, without counting again: {again})" if again else "")
    more, less, missing, within = [], [], [], 0
    for run in runs:
        verdict = check(run, stored)
        where = f"{run['source']}: " if len(runs) > 1 else ""
        more += [where + line for line in verdict.more]
        less += [where + line for line in verdict.less]
        missing += [where + line for line in verdict.missing]
        within += verdict.within
    for line in more:
        print(f"MORE WORK: {line}")
    if more:
        print(f"MORE WORK: the change adds work to a counted call; find where (`--keep DIR` keeps the callgrind "
              f"dumps for callgrind_annotate), or if it is meant, store the new counts: "
              f"{command} --accept-more-work")
    for line in less:
        print(f"LESS WORK: {line}")
    if less:
        print(f"LESS WORK: record the new figure with {record_command} (left as stored, a later change could give "
              f"the gain back unseen)")
    status = 1 if more or less else 0
    if missing:
        status_missing, line = strict.outcome(strict_inputs, "; ".join(missing),
                                              f"record them: {record_command} (one run keeps each figure's stored "
                                              f"margin, or {FALLBACK_MARGIN:.0%}; runs from --out given to --from "
                                              f"set margins from their spread: docs/nightly.md)")
        print(line)
        status = status or status_missing
    judged = "not judged" if status == strict.NOT_JUDGED else ("FAILED" if status else "passed")
    print(f"summary: {judged}: {within} figure(s) within their margins, {len(more)} more work, {len(less)} less "
          f"work, {len(missing)} not stored")
    return status


def render_results(figures: dict) -> str:
    """The counts of one run, the stack's count over stock's, and how long each counted call and the run took."""
    lines = [f"Device key `{figures['key']}` (valgrind {figures['valgrind']}, torch's capability under valgrind "
             f"{figures['capability']}; kernels pinned: " + ", ".join(f"`{k}={v}`" for k, v in
                                                                        figures["child_env"].items()
                                                                        if k not in ("TOKENIZERS_PARALLELISM",))
             + f"). The run took {figures['seconds'] / 60:.1f} minutes in all (one valgrind process per checkpoint "
             f"size, side by side; most of it importing torch under valgrind).", "",
             "| point | stock | lossless stack | stack / stock | counted call (s), stock / stack |",
             "|---|---:|---:|---:|---:|"]
    counts, took = figures["counts"], figures["call_seconds"]
    for point in dict.fromkeys(name.split("/")[0] for name in counts):
        a, b = counts.get(f"{point}/stock"), counts.get(f"{point}/lossless")
        r = figures["ratios"].get(point)
        lines.append(f"| {point} | {a:,} | {b:,} | {r:.4f} | {took.get(f'{point}/stock', 0):.0f} / "
                     f"{took.get(f'{point}/lossless', 0):.0f} |" if a and b else
                     f"| {point} | {a or 'n/a'} | {b or 'n/a'} | n/a | |")
    return "\n".join(lines)


def render_margins(figures: dict) -> str:
    """The stored figures of one device key and how each margin was derived: per machine kind, the runs, their
    median against the stored figure, their spread."""
    kinds = figures["kinds"]
    rule_ = figures["rule"]
    lines = [f"Stored in `baselines/instructions.json` for device key `{figures['key']}`, from "
             f"{len(figures['sources'])} runs on {len(kinds)} machine kinds. Each figure is the median of the kinds' "
             f"medians; its margin is max({rule_['floor']:.1%}, {rule_['spreads']} x max(sd, offset)): sd is the "
             f"within-kind standard deviation of the log count, pooled over the kinds with two runs or more, "
             f"offset the farthest kind's median from the figure; widest run: the farthest single run from it (no "
             f"recorded run fails the check while it is below the margin). A cell: runs, median against the stored "
             f"figure, sd, range (max - min).", "",
             "| figure | stored | sd (pooled) | farthest kind | widest run | margin | " + " | ".join(
                 f"{kind}{' (reported: ' + about['reported'] + ')' if about.get('reported') else ''}"
                 for kind, about in kinds.items()) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---|" * len(kinds)]

    def cell(found, machine):
        if machine is None:
            return ""
        text = f"{machine['runs']}: {machine['median'] / found['value'] - 1:+.4%}"
        if machine["sd"] is not None:
            text += f", sd {machine['sd']:.4%}, range {machine['range']:.4%}"
        return text

    for table, label in (("counts", "{}"), ("ratios", "{} lossless/stock")):
        for name, found in figures[table].items():
            value = f"{found['value']:,}" if table == "counts" else f"{found['value']:.5f}"
            sd = "n/a" if found["sd"] is None else f"{found['sd']:.4%}"
            lines.append(f"| {label.format(name)} | {value} | {sd} | {found['offset']:.4%} | {found['widest']:.4%} | "
                         f"{found['margin']:.3%} | "
                         + " | ".join(cell(found, found["machines"].get(kind)) for kind in kinds) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
