"""The suite's report on one checkpoint: which patches apply, parity verdicts, work counters, a timing ratio.

    python -m harness report                      # the built tiny test checkpoint, CPU fp32
    python -m harness report --checkpoint PATH    # a real OmniVoice checkpoint

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
from harness.speed.measure import count_work, interleaved

REPORT_POINTS = ("auto_voice", "voice_clone_audio", "batch_of_3", "long_chunked")
WORK_POINT = "clone6-medium-32"


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


def measure_ratio(model, rounds: int) -> dict:
    kwargs = point(WORK_POINT).generate_kwargs(model)
    samples = interleaved(model, {"stock": (), "fastpath": fastpath.LOSSLESS}, kwargs, rounds)
    return {"point": WORK_POINT, "rounds": rounds,
            **{k: {"median_rtf": s.median, "iqr": s.iqr, "first_call_s": s.first_call_seconds} for k, s in samples.items()},
            "ratio": samples["stock"].median / samples["fastpath"].median}


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
    out += ["", f"## Timing ({r['point']}, {r['rounds']} interleaved rounds after one warm-up each)", "",
            f"Median RTF stock {r['stock']['median_rtf']:.4f} (IQR {r['stock']['iqr']:.4f}), fastpath "
            f"{r['fastpath']['median_rtf']:.4f} (IQR {r['fastpath']['iqr']:.4f}): **{r['ratio']:.2f}x**. "
            f"On the tiny checkpoint this is dominated by per-call overhead; see the README for the full-size figures.",
            "", f"Verdict: **{'PASS' if report['ok'] else 'FAIL'}**", ""]
    return "\n".join(out)


def run_report(checkpoint: str | None, size: str, out_dir: Path, rounds: int, command: str) -> dict:
    started = time.perf_counter()
    ckpt = resolve_checkpoint(checkpoint, size=size)
    model = load_model(ckpt)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "command": command,
        "checkpoint": f"{ckpt.identity} ({ckpt.kind})",
        "environment": {"machine": machine.summary(), **machine.versions(("torch", "transformers", "omnivoice"))},
        "patches": check_patches(),
        "parity": parity_rows(model, out_dir),
        "work": measure_work(model),
        "timing": measure_ratio(model, rounds),
    }
    report["ok"] = all(r["upstream"] == "applies" for r in report["patches"]) and all(r["bit_exact"] for r in report["parity"])
    report["seconds"] = time.perf_counter() - started
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    (out_dir / "report.md").write_text(render_report(report))
    return report
