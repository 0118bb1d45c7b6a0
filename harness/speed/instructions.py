"""Instructions executed per call, counted by callgrind: a speed signal that does not move with the machine's load.

Wall time on these shared 2-core VMs moves 3-20% between processes and doubles beside a busy neighbour; the number
of instructions a call executes, counted by valgrind's callgrind, moves by hundredths of a percent and not at all
with the load (docs/history.md). So every counting point (harness.speed.calls) is also run under callgrind, one
thread, seeds and inputs fixed, and its count goes into a history of its own, judged with floors set from its own
noise.

How (the field's way: valgrind's client requests, as torch.utils.benchmark's callgrind support uses them): one
child process runs under ``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no``. It imports torch,
loads the models and runs every point once at valgrind's uninstrumented speed (the warm-up: imports, first-call
allocations and lazy initialisation stay outside every count), turns instrumentation on (``callgrind_control -i
on``), then for each point switches collection on as the counted part begins (``torch._C._valgrind_toggle``) and
off as it ends, dumping the counts (``torch._C._valgrind_toggle_and_dump_stats``). The parent reads each dump's
total (Ir). Importing torch under valgrind is most of a child's time, so one child counts every point.

A count depends on the code that runs: torch and omnivoice, the valgrind version and the processor's vendor (MKL
picks code by it); the kernels' instruction sets are pinned (CHILD_ENV). These make the run's device key
(`device_key`), and a history holds one key.

    fastpath-suite instructions                     # every counting point, stock and lossless: a run file
    fastpath-suite instructions --points clone3-short-2 --variants lossless --check baselines/instructions.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from harness import REPO_ROOT

BASELINE = REPO_ROOT / "baselines" / "instructions.json"
METRIC = "instructions"
# The environment every count is made in: one thread, a fixed hash seed (Python's string hashing changes the
# instructions of dict and set operations from process to process otherwise), and fixed kernel instruction sets.
# Valgrind emulates FMA instructions with a helper call each, so MKL's and oneDNN's AVX2 (FMA) GEMM kernels crawl
# under it (a 112x1024x3072 product: 22 s) and a full-size forward would take hours; their SSE4 kernels slow down as
# ordinary code does (docs/history.md, "Instructions"). The count is then the count of the SSE4 GEMMs (the same
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


def cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(line.split(":")[1].strip(), "other")
    except OSError:
        pass
    return "unknown"


def device_key(valgrind: str, capability: str, versions: dict) -> str:
    """What a count depends on: valgrind's version, the processor's vendor (MKL picks code by it), the CPU capability
    torch sees under valgrind, torch and omnivoice. The kernels' instruction sets are fixed by CHILD_ENV, whatever
    the caller's environment says, so they are not part of the key."""
    return (f"callgrind-{valgrind}-{cpu_vendor()}-{capability.lower()}__torch-{versions.get('torch')}"
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
    """Under valgrind: warm every (point, variant) up, switch instrumentation on, count each once, in order; write
    the order and what the counts depend on to spec["out"]."""
    import torch

    from harness.checkpoint import build_checkpoint, load_model
    from harness.machine import versions
    from harness.speed import calls

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

    def say(text):
        if not spec.get("quiet"):
            print(f"[instructions {spec.get('label', '')}] {text}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    for i, (name, _, warm) in enumerate(runs, 1):
        warm(calls.nothing)
        say(f"warm-up {i}/{len(runs)}: {name} ({time.perf_counter() - start:.0f} s)")
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    window, order, took = _counted(), [], []
    for i, (name, call, _) in enumerate(runs, 1):
        begun = time.perf_counter()
        call(window)
        order.append(name)
        took.append(time.perf_counter() - begun)
        left = (len(runs) - i) * sum(took) / len(took)
        say(f"counted {i}/{len(runs)}: {name} ({took[-1]:.0f} s; about {left / 60:.0f} min left)")
    Path(spec["out"]).write_text(json.dumps({"order": order, "capability": torch.backends.cpu.get_cpu_capability(),
                                             "versions": versions(), "seconds": took}))
    return 0


# --- the parent ---------------------------------------------------------------------------------------------------

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


def count(points: list, variants: list, keep: Path | None = None, quiet: bool = False) -> dict:
    """{"counts": {"<point>/<variant>": instructions}, "key": device key, ...}: one valgrind child per checkpoint
    size, the children side by side (a count does not move with the load, and each child is one thread)."""
    from harness.speed import calls

    by_size: dict = {}
    for name in points:
        by_size.setdefault(calls.point_named(name).size, []).append(name)  # an unknown name is refused here
    version = valgrind_version()
    root = Path(tempfile.mkdtemp(prefix="fastpath-callgrind-")) if keep is None else Path(keep)
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                                 os.environ.get("PYTHONPATH")]))}
    started, children = time.perf_counter(), {}
    for size, names in by_size.items():
        folder = root / size
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("callgrind.out*"):
            old.unlink()
        spec = folder / "spec.json"
        spec.write_text(json.dumps({"points": names, "variants": variants, "out": str(folder / "order.json"),
                                    "label": size, "quiet": quiet}))
        command = [*VALGRIND, f"--callgrind-out-file={folder / 'callgrind.out'}", sys.executable, "-m",
                   "harness.speed.instructions", "--child", str(spec)]
        children[size] = (folder, command, subprocess.Popen(command, env=env, cwd=REPO_ROOT,
                                                            stdout=subprocess.DEVNULL))
    counts, metas = {}, []
    for size, (folder, command, child_process) in children.items():
        if child_process.wait() != 0:
            for _, _, other in children.values():
                other.kill()
            raise InstructionsError(f"the callgrind child for the {size} points exited {child_process.returncode} "
                                    f"(its messages are above); command: {' '.join(command)}")
        meta = json.loads((folder / "order.json").read_text())
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
            "seconds": round(time.perf_counter() - started, 1),
            "call_seconds": {name: t for m in metas for name, t in zip(m["order"], m["seconds"])}}


def run_file(measured: dict, command: str) -> dict:
    """A speed-baseline-format run file of the counts (metric "instructions"), which `history append` takes."""
    from harness.machine import machine_info
    from harness.speed.baselines import FORMAT, FORMAT_VERSION, git_commit

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "device_key": measured["key"],
            "machine": {**machine_info("cpu"), "valgrind": measured["valgrind"],
                        "capability_under_valgrind": measured["capability"]},
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


def check(measured: dict, stored: dict) -> tuple:
    """(more work, notes) against the stored counts. More work: a count above the stored count of this device key by
    more than `floor`, or the stack's count over stock's (same run, so the machine cancels) above the stored ratio by
    more than `ratio_floor`; each named with both numbers. Notes: what could not be compared, and why.
    `stored`: {"floor", "ratio_floor", "keys": {device key: {"<point>/<variant>": count}}, "ratios": {point: r}}."""
    for field in ("floor", "ratio_floor", "keys", "ratios"):
        if field not in stored:
            raise InstructionsError(f"the stored counts lack {field!r}: not a file `fastpath-suite instructions "
                                    f"--record` wrote")
    worse, notes = [], []
    known = stored["keys"].get(measured["key"])
    floor, ratio_floor = float(stored["floor"]), float(stored["ratio_floor"])
    if known is None:
        notes.append(f"no stored counts for {measured['key']} (stored: {', '.join(sorted(stored['keys']))}): only "
                     f"the stack-to-stock ratios were compared; record this machine kind's counts with "
                     f"`fastpath-suite instructions --record`")
    else:
        for name, n in measured["counts"].items():
            if name not in known:
                notes.append(f"no stored count of {name} for this key")
                continue
            change = n / known[name] - 1
            if change > floor:
                worse.append(f"{name}: {n:,} instructions against {known[name]:,} stored ({change:+.2%}, floor "
                             f"{floor:.2%})")
    for point, r in ratios(measured["counts"]).items():
        if point not in stored["ratios"]:
            notes.append(f"no stored lossless/stock ratio of {point}")
            continue
        change = r / stored["ratios"][point] - 1
        if change > ratio_floor:
            worse.append(f"{point}: the lossless stack executes {r:.4f}x stock's instructions against "
                         f"{stored['ratios'][point]:.4f}x stored ({change:+.2%}, floor {ratio_floor:.2%})")
    if not worse and known is None and not ratios(measured["counts"]):
        raise InstructionsError("nothing to compare: no stored counts for this key and no point counted in both "
                                "variants (pass --variants stock lossless)")
    return worse, notes


def main(argv=None) -> int:
    from harness import results
    from harness.results import command_line
    from harness.speed import calls

    parser = argparse.ArgumentParser(prog="fastpath-suite instructions", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    calls.add_arguments(parser)
    parser.add_argument("--check", type=Path, default=None,
                        help="compare with stored counts (e.g. baselines/instructions.json): exit 1 above the floor")
    parser.add_argument("--record", action="store_true",
                        help=f"store these counts as this machine kind's in {BASELINE.relative_to(REPO_ROOT)}")
    parser.add_argument("--keep", type=Path, default=None, help="keep the callgrind dumps in this folder")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    points = args.points or [p.name for p in calls.load_points()]
    try:
        if not args.quiet:
            print(f"[instructions] counting {len(points)} point(s) x {len(args.variants)} variant(s) under callgrind, "
                  f"one process per checkpoint size side by side (importing torch under valgrind takes minutes: "
                  f"about 7 for the tiny points, 9 for the full-size one, here)", file=sys.stderr, flush=True)
        measured = count(points, args.variants, args.keep, args.quiet)
        for name, n in measured["counts"].items():
            print(f"{name}: {n:,} instructions")
        print(f"device key: {measured['key']}; {measured['seconds']:.0f} s in all")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(run_file(measured, command_line()), indent=1) + "\n")
            print(f"run file: {args.out}")
        if args.record:
            record(measured)
        results.write_if_asked(args, "instructions", {k: measured[k] for k in (
            "counts", "key", "valgrind", "capability", "versions", "seconds", "call_seconds")} | {
            "ratios": ratios(measured["counts"]), "child_env": CHILD_ENV})
        if args.check:
            try:
                stored = json.loads(args.check.read_text())
            except json.JSONDecodeError as err:
                raise InstructionsError(f"{args.check} is not readable JSON ({err}): restore it from git") from None
            worse, notes = check(measured, stored)
            for line in notes:
                print(f"note: {line}")
            for line in worse:
                print(f"MORE WORK: {line}")
            if worse:
                return 1
            print(f"no more work than stored ({args.check}: counts within {float(stored['floor']):.2%}, "
                  f"stack-to-stock ratios within {float(stored['ratio_floor']):.2%})")
    except (InstructionsError, KeyError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


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


FLOOR = 0.01  # more instructions than stored by this share is more work (docs/history.md: what noise and an
# ordinary change move a count by)
RATIO_FLOOR = 0.01


def record(measured: dict, path: Path = BASELINE) -> None:
    """Store the counts of this device key and the stack-to-stock ratios (other keys kept)."""
    from harness.speed.baselines import write_atomic

    stored = json.loads(path.read_text()) if path.exists() else {}
    stored["_about"] = ("Instructions each counting point executes under callgrind (fastpath-suite instructions "
                        "--record), per device key, and the lossless stack's count over stock's; `--check` fails "
                        "on more than floor / ratio_floor above them.")
    stored.setdefault("floor", FLOOR)
    stored.setdefault("ratio_floor", RATIO_FLOOR)
    stored.setdefault("keys", {}).setdefault(measured["key"], {}).update(measured["counts"])
    stored.setdefault("ratios", {}).update(ratios(measured["counts"]))
    write_atomic(path, json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"stored: {path} ({measured['key']})")


if __name__ == "__main__":
    raise SystemExit(main())
