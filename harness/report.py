"""The suite's report on one checkpoint: which patches apply, parity verdicts, work counters, timing.

    fastpath-suite report                      # built test checkpoints, CPU fp32
    fastpath-suite report --checkpoint PATH    # a real OmniVoice checkpoint

Parity and work run on the checkpoint (default: the tiny test checkpoint). Timing runs where compute dominates:
the full-size test checkpoint (Qwen3-0.6B dimensions; `--timing-size tiny` for a quick look at per-call
overhead only), or the given real checkpoint; stock, the public packages when installed (the `peers` extra:
omnivoice-fastpath 0.1.0, and omnivoice-tts-inference 0.1.0 at the auto-voice point only, having no voice cloning)
and the lossless stack, interleaved, with each one's FLOP bound (harness.speed.bench).
Writes `out/report.md` and `out/report.json`; exits 1 when a lossless patch is not bit-exact or does not apply.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import fastpath
from fastpath import fingerprints
from harness.run import machine
from harness.run.results import hand_over
from harness.model.checkpoint import load_model, resolve_checkpoint
from harness.parity.parity import POINTS, compare_runs, record_generation, resolve_point
from harness.model.points import point
from harness.speed import bench
from harness.speed.measure import count_work

REPORT_POINTS = ("auto_voice", "voice_clone_audio", "batch_of_3", "long_chunked")
WORK_POINT = "clone6-medium-32"
# a short auto-voice request (where trimming used to lose) and a short sentence cloned from the 3 s reference
TIMING_POINTS = ("auto-short-10", "clone3-short-32")
TIMING_STEPS = 8  # as `fastpath-suite grid`: every step has the same shapes, so fewer steps keep the ratio


def check_patches() -> list:
    rows = []
    for name, patch in fastpath.PATCHES.items():
        try:
            fingerprints.check(patch.relies_on, name)
            status = "applies"
        except fingerprints.UpstreamMismatchError as err:
            status = "refused: " + str(err).splitlines()[1].strip()
        rows.append({"patch": name, "lossless": patch.lossless, "devices": list(patch.devices), "upstream": status})
    return rows


def parity_rows(model, tmp_dir: Path, progress=None) -> list:
    from harness.run.progress import QUIET

    rows = []
    sets = [(n,) for n in fastpath.LOSSLESS] + [tuple(fastpath.LOSSLESS)]
    with (progress or QUIET).stage("parity", total=len(REPORT_POINTS) * (1 + len(sets))) as step:
        for point_name in REPORT_POINTS:
            kwargs = resolve_point(model, POINTS[point_name], tmp_dir)
            stock = record_generation(model, seed=0, **kwargs)
            step(f"{point_name} stock")
            for patches in sets:
                with fastpath.patched(model, list(patches)):
                    problems = compare_runs(stock, record_generation(model, seed=0, **kwargs))
                rows.append({"point": point_name, "patches": "+".join(patches), "bit_exact": not problems,
                             "first_difference": problems[0] if problems else None,
                             "scoring_calls": len(stock.steps) // 4})
                step(f"{point_name} {'+'.join(patches) if len(patches) == 1 else 'all lossless'}")
    return rows


def measure_work(model) -> dict:
    kwargs = point(WORK_POINT).generate_kwargs(model)
    stock = count_work(model, **kwargs).as_dict()
    with fastpath.patched(model):
        fast = count_work(model, **kwargs).as_dict()
    return {"point": WORK_POINT, "stock": stock, "fastpath": fast}


def peers_installed() -> dict:
    """Each peer variant of harness.speed.bench.PEERS -> whether its package is installed."""
    import importlib.util

    return {name: importlib.util.find_spec(peer.module) is not None for name, peer in bench.PEERS.items()}


def timing_variants() -> list:
    """stock, every installed peer, the lossless stack."""
    return ["stock"] + [name for name, installed in peers_installed().items() if installed] + ["lossless"]


def measure_timing(ckpt, rounds: int, progress=None) -> dict:
    """TIMING_POINTS on `ckpt`, CPU fp32: stock, the public packages that are installed, the lossless stack."""
    from harness.speed import stability

    names = timing_variants()
    specs = {s.name: s for s in (bench.parse_variant(n, "cpu", "fp32") for n in names)}
    variants = bench.build_variants(ckpt, list(specs.values()), "cpu")
    results = bench.run_variant_bench(variants, TIMING_POINTS, rounds, TIMING_STEPS, progress)
    if progress:
        progress.say("counting FLOPs for the bound (no clock)")
    flops = bench.flop_bounds(variants, TIMING_POINTS, TIMING_STEPS)
    judged = [stability.judge(r) for r in results.values()]
    return {"checkpoint": f"{ckpt.identity} ({ckpt.kind})", "rounds": rounds, "steps": TIMING_STEPS,
            "peers_missing": [n for n in bench.PEERS if n not in names],
            "table": bench.format_table(results, specs, machine.summary(), flops),
            "judged": all(j.judged for j in judged), "stable": all(j.stable for j in judged),
            "figures": bench.figures_of(results, specs, f"{ckpt.identity} ({ckpt.kind})", "cpu", TIMING_STEPS, flops),
            "results": {p: {v: {"median_rtf": s.median, "iqr": s.iqr, "first_call_s": s.first_call_seconds}
                            for v, s in r.items()} for p, r in results.items()},
            "flops": flops}


def render_report(report: dict) -> str:
    env = report["environment"]
    out = [f"# fastpath report: {report['checkpoint']}",
           "", f"Machine: {env['machine']}; torch {env['torch']}, transformers {env['transformers']}, "
               f"omnivoice {env['omnivoice']}; CPU fp32; command: `{report['command']}`", "",
           "## Patches", "", "| patch | lossless | meant for | upstream fingerprints |", "|---|---|---|---|"]
    out += [f"| {r['patch']} | {r['lossless']} | {', '.join(r['devices'])} | {r['upstream']} |" for r in report["patches"]]
    out += ["", "## Bit-exact parity against stock (seed 0, default settings)", "",
            "| point | patches | verdict |", "|---|---|---|"]
    out += [f"| {r['point']} | {r['patches']} | {'bit-exact' if r['bit_exact'] else 'DIFFERS: ' + r['first_difference']} |"
            for r in report["parity"]]
    w = report["work"]
    out += ["", f"## Work per generate ({w['point']}; exact counts, no clock)", "",
            "| counter | stock | fastpath | fastpath/stock |", "|---|---|---|---|"]
    for key, value in w["stock"].items():
        fast = w["fastpath"][key]
        out.append(f"| {key} | {value:,} | {fast:,} | {fast / value:.3f} |" if value else f"| {key} | {value} | {fast} | - |")
    r = report["timing"]
    missing = [bench.PEERS[n].requirement for n in r.get("peers_missing", [])]
    peer = (f" Not installed, so not in the table: {', '.join(missing)} ({bench.PEERS_INSTALL})." if missing else "")
    out += ["", f"## Timing on {r['checkpoint']} (CPU fp32, {r['steps']} steps, {r['rounds']} interleaved rounds "
                f"after one warm-up each)",
            "", "RTF = seconds per second of audio; speedups are stock's median over the variant's; the bound is "
            "stock's FLOPs of the whole generate over the variant's (a perfect implementation of the same arithmetic), efficiency = "
            f"speedup / bound. A point whose interleaved rounds disagree by more than "
            f"{stability_limit():.0%} on a ratio shows \"unstable\" instead of a speedup, and one timed in fewer than "
            f"{min_rounds()} rounds \"unjudged\" (docs/speed.md).{peer}",
            "", r["table"],
            "", f"Verdict: **{'PASS' if report['ok'] else 'FAIL'}** (patches apply and are bit-exact; "
                f"{timing_verdict(r)})", ""]
    return "\n".join(out)


def timing_verdict(timing: dict) -> str:
    """The timing's part of the verdict: stable, unstable, or unjudged (too few rounds for the rule)."""
    if not timing.get("judged", True):
        return (f"the timing is unjudged: {timing['rounds']} round(s) are too few to judge, at least {min_rounds()} "
                f"rounds are needed (--rounds {min_rounds()}), so no speedup is claimed")
    return "the timing " + ("is stable" if timing.get("stable", True) else "is unstable, so no speedup is claimed")


def stability_limit() -> float:
    from harness.speed.stability import MAX_RATIO_SPREAD

    return MAX_RATIO_SPREAD


def min_rounds() -> int:
    from harness.speed.stability import MIN_ROUNDS

    return MIN_ROUNDS


STAGES = ("build", "parity", "work", "timing")


def plan(checkpoint: str | None, rounds: int, timing_size: str) -> str:
    """What the report will do, and about how long it takes on this machine kind (from an earlier results file)."""
    timing_on = "the given checkpoint" if checkpoint else f"the {timing_size} test checkpoint"
    names = timing_variants()
    calls = sum(not bench.cannot_run(n, p) for n in names for p in TIMING_POINTS) * (rounds + 1)
    return (f"will check {len(fastpath.PATCHES)} patches against upstream, compare {len(REPORT_POINTS)} points bit "
            f"for bit ({len(fastpath.LOSSLESS) + 1} patch sets each), count the work of one call, and time "
            f"{len(TIMING_POINTS)} points x {len(names)} variants ({', '.join(names)}; a variant only at the points "
            f"it can run) x {rounds} rounds (+1 warm-up: {calls} calls) on {timing_on}. " + estimate())


def estimate() -> str:
    """About how long, from the newest report results file of this machine kind (else of any machine)."""
    from harness.run import results

    key = machine.hardware_key(machine.machine_info("cpu"))
    files = sorted((results.RESULTS_DIR / "report").glob("*.json"))
    same = [f for f in files if f.stem == key]
    for path in same or files:
        try:
            data = results.load(path)
        except results.ResultsError:
            continue
        seconds = data["figures"].get("seconds")
        if seconds:
            where = "this machine kind" if same else f"{data['machine_summary']} (none recorded for this one)"
            return f"About {seconds / 60:.0f} minutes on {where}, from {path.relative_to(results.ROOT)}."
    return "No earlier run is recorded, so no estimate: the timing stage prints one as it goes."


def run_report(checkpoint: str | None, size: str, out_dir: Path, rounds: int, command: str,
               timing_size: str = "full", progress=None) -> dict:
    from harness.run.progress import QUIET

    progress = progress or QUIET
    started = time.perf_counter()
    stage_seconds = {}
    progress.say("building or loading the test checkpoints (built once, then read from the cache)")
    ckpt = resolve_checkpoint(checkpoint, size=size)
    timing_ckpt = ckpt if checkpoint else resolve_checkpoint(None, size=timing_size)
    model = load_model(ckpt)
    stage_seconds["build"] = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    patches = check_patches()
    mark = time.perf_counter()
    parity = parity_rows(model, out_dir, progress)
    stage_seconds["parity"] = time.perf_counter() - mark
    progress.say(f"parity: {sum(r['bit_exact'] for r in parity)} of {len(parity)} bit-exact; counting work")
    mark = time.perf_counter()
    work = measure_work(model)
    stage_seconds["work"] = time.perf_counter() - mark
    mark = time.perf_counter()
    timing = measure_timing(timing_ckpt, rounds, progress)
    stage_seconds["timing"] = time.perf_counter() - mark
    report = {
        "command": command,
        "checkpoint": f"{ckpt.identity} ({ckpt.kind})",
        "environment": {"machine": machine.summary(), **machine.versions(("torch", "transformers", "omnivoice"))},
        "patches": patches,
        "parity": parity,
        "work": work,
        "timing": timing,
    }
    report["ok"] = all(r["upstream"] == "applies" for r in report["patches"]) and all(r["bit_exact"] for r in report["parity"])
    report["seconds"] = time.perf_counter() - started
    report["stage_seconds"] = stage_seconds
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    (out_dir / "report.md").write_text(render_report(report))
    return report


def results_figures(report: dict) -> dict:
    """What a report results file keeps: raw figures only (the tables are rendered from them)."""
    return {"checkpoint": report["checkpoint"], "environment": report["environment"], "ok": report["ok"],
            "patches": [{k: r[k] for k in ("patch", "lossless", "upstream")} for r in report["patches"]],
            "parity": [{k: r[k] for k in ("point", "patches", "bit_exact")} for r in report["parity"]],
            "work": report["work"], "timing": report["timing"]["figures"],
            "seconds": round(report["seconds"], 1),
            "stage_seconds": {k: round(v, 1) for k, v in report["stage_seconds"].items()}}


def render_results(figures: dict) -> str:
    """A report results file for docs/results.md: patches, parity and work in a line each, the timing table."""
    applies = sum(r["upstream"] == "applies" for r in figures["patches"])
    exact = sum(r["bit_exact"] for r in figures["parity"])
    w = figures["work"]
    work = ", ".join(f"{k.replace('_', ' ')} x{w['fastpath'][k] / v:.3f}" for k, v in w["stock"].items() if v)
    stages = ", ".join(f"{k} {v / 60:.1f}" for k, v in figures["stage_seconds"].items())
    env = figures["environment"]
    return "\n".join([
        f"Checkpoint {figures['checkpoint']}; torch {env['torch']}, transformers {env['transformers']}, omnivoice "
        f"{env['omnivoice']}. Patches applying: {applies} of {len(figures['patches'])}; bit-exact against stock: "
        f"{exact} of {len(figures['parity'])} (point, patch set) pairs. Work per generate at {w['point']}, fastpath "
        f"over stock (exact counts): {work}. Whole run {figures['seconds'] / 60:.1f} minutes ({stages}).",
        "", bench.render_results(figures["timing"])])


hand_over({"report": render_results})  # this job's results kind, for the docs pages (harness.run.results)


def main(argv=None) -> int:
    from harness.run import results
    from harness.model.checkpoint import CheckpointError
    from harness.run.cli import int_at_least
    from harness.run.progress import Progress

    parser = argparse.ArgumentParser(prog="fastpath-suite report", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--checkpoint", default=None,
                        help="a real OmniVoice checkpoint folder, or 'hf' (env FASTPATH_CHECKPOINT); default: built test checkpoint")
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny", help="size of the built test checkpoint")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for report.md and report.json")
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="interleaved timing rounds per variant")
    parser.add_argument("--timing-size", choices=("tiny", "full"), default="full",
                        help="built checkpoint the timing runs on (without --checkpoint): full, where compute dominates, "
                             "or tiny, which measures per-call overhead only")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("report", args.quiet)
    progress.say(plan(args.checkpoint, args.rounds, args.timing_size))
    try:
        report = run_report(args.checkpoint, args.size, args.out, args.rounds, results.command_line(),
                            args.timing_size, progress)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((args.out / "report.md").read_text())
    print(f"written: {args.out / 'report.md'}, {args.out / 'report.json'} ({report['seconds']:.0f} s)")
    results.write_if_asked(args, "report", results_figures(report))
    return 0 if report["ok"] else 1
