"""The suite's report on one checkpoint: which patches apply, parity verdicts, work counters, timing.

    python -m harness report                      # built test checkpoints, CPU fp32
    python -m harness report --checkpoint PATH    # a real OmniVoice checkpoint

Parity and work run on the checkpoint (default: the tiny test checkpoint). Timing runs where compute dominates:
the full-size test checkpoint (Qwen3-0.6B dimensions; `--timing-size tiny` for a quick look at per-call
overhead only), or the given real checkpoint; stock, the public omnivoice-fastpath 0.1.0 when installed (the
`peers` extra) and the lossless stack, interleaved, with each one's FLOP bound (harness.speed.bench).
Writes `out/report.md` and `out/report.json`; exits 1 when a lossless patch is not bit-exact or does not apply.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import fastpath
from fastpath import fingerprints
from harness import machine
from harness.checkpoint import load_model, resolve_checkpoint
from harness.parity import POINTS, compare_runs, record_generation, resolve_point
from harness.points import point
from harness.speed import bench
from harness.speed.measure import count_work

REPORT_POINTS = ("auto_voice", "voice_clone_audio", "batch_of_3", "long_chunked")
WORK_POINT = "clone6-medium-32"
# a short auto-voice request (where trimming used to lose) and voice cloning with the 6.5 s reference
TIMING_POINTS = ("auto-short-10", "clone6-medium-16")
TIMING_STEPS = 8  # as the README's grid: every step has the same shapes, so fewer steps keep the ratio


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


def parity_rows(model, tmp_dir: Path) -> list:
    rows = []
    sets = [(n,) for n in fastpath.LOSSLESS] + [tuple(fastpath.LOSSLESS)]
    for point_name in REPORT_POINTS:
        kwargs = resolve_point(model, POINTS[point_name], tmp_dir)
        stock = record_generation(model, seed=0, **kwargs)
        for patches in sets:
            with fastpath.patched(model, list(patches)):
                problems = compare_runs(stock, record_generation(model, seed=0, **kwargs))
            rows.append({"point": point_name, "patches": "+".join(patches), "bit_exact": not problems,
                         "first_difference": problems[0] if problems else None,
                         "scoring_calls": len(stock.steps) // 4})
    return rows


def measure_work(model) -> dict:
    kwargs = point(WORK_POINT).generate_kwargs(model)
    stock = count_work(model, **kwargs).as_dict()
    with fastpath.patched(model):
        fast = count_work(model, **kwargs).as_dict()
    return {"point": WORK_POINT, "stock": stock, "fastpath": fast}


def peer_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(module) is not None for module, _ in bench.PEERS.values())


def measure_timing(ckpt, rounds: int) -> dict:
    """TIMING_POINTS on `ckpt`, CPU fp32: stock, the public package if installed, the lossless stack."""
    names = ["stock"] + (["peer"] if peer_installed() else []) + ["lossless"]
    specs = {s.name: s for s in (bench.parse_variant(n, "cpu", "fp32") for n in names)}
    variants = bench.build_variants(ckpt, list(specs.values()), "cpu")
    results = bench.run_variant_bench(variants, TIMING_POINTS, rounds, TIMING_STEPS)
    flops = bench.flop_bounds(variants, TIMING_POINTS, TIMING_STEPS)
    return {"checkpoint": f"{ckpt.identity} ({ckpt.kind})", "rounds": rounds, "steps": TIMING_STEPS,
            "peer_installed": "peer" in names,
            "table": bench.format_table(results, specs, machine.summary(), flops),
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
    peer = "" if r["peer_installed"] else (" The public omnivoice-fastpath is not installed, so it is not in the "
                                           f"table: {bench.PEERS_INSTALL}.")
    out += ["", f"## Timing on {r['checkpoint']} (CPU fp32, {r['steps']} steps, {r['rounds']} interleaved rounds "
                f"after one warm-up each)",
            "", "RTF = seconds per second of audio; speedups are stock's median over the variant's; the bound is "
            "stock's FLOPs of the whole generate over the variant's (a perfect implementation of the same arithmetic), efficiency = "
            f"speedup / bound.{peer}", "", r["table"],
            "", f"Verdict: **{'PASS' if report['ok'] else 'FAIL'}**", ""]
    return "\n".join(out)


def run_report(checkpoint: str | None, size: str, out_dir: Path, rounds: int, command: str,
               timing_size: str = "full") -> dict:
    started = time.perf_counter()
    ckpt = resolve_checkpoint(checkpoint, size=size)
    timing_ckpt = ckpt if checkpoint else resolve_checkpoint(None, size=timing_size)
    model = load_model(ckpt)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "command": command,
        "checkpoint": f"{ckpt.identity} ({ckpt.kind})",
        "environment": {"machine": machine.summary(), **machine.versions(("torch", "transformers", "omnivoice"))},
        "patches": check_patches(),
        "parity": parity_rows(model, out_dir),
        "work": measure_work(model),
        "timing": measure_timing(timing_ckpt, rounds),
    }
    report["ok"] = all(r["upstream"] == "applies" for r in report["patches"]) and all(r["bit_exact"] for r in report["parity"])
    report["seconds"] = time.perf_counter() - started
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    (out_dir / "report.md").write_text(render_report(report))
    return report
