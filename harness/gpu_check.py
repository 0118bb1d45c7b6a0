"""The GPU tier's results file ("gpu-check"): what `fastpath-suite gpu-check` (scripts/gpu_check.sh) leaves in its
folder, gathered into one file of harness.run.results.

Read from each folder (OUT of the script; several folders, e.g. two calls with STAGES "3 4 4b" and "5", are merged,
a later folder's stage replacing an earlier one's):

    steps.jsonl                 one line per step run: {"step", "exit", "limit_s", "seconds", "call"} (the last line
                                of a step counts)
    parity.xml, speed.xml       pytest's junit reports of `pytest -m cuda tests_parity` / `tests_speed` (stage 3)
    bench.json, batching.json,  `fastpath-suite bench --out` of stages 4, 4b and 4c: every sample of every point
    packed.json                 and variant, the machine
    memory/memory.json          `fastpath-suite memory --out` of stage 4d: the MiB after every call, the verdict
    stream-gpu-*/streaming.json `fastpath-suite stream --out` of stage 5: every round of every point and variant

The machine the file is filed under: this one's GPU when torch sees CUDA (the script records at its end, on the
GPU machine); else the machine the bench and streaming files describe (gathering fetched folders on another
machine: `fastpath-suite gpu-check --gather DIR [DIR ...]`), and this machine only when no file names one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from harness.run import results
from harness.audit.false_alarms import junit_counts

KIND = "gpu-check"
TIERS = ("parity", "speed")
BENCHES = ("bench", "batching", "packed")


def read_steps(folder: Path) -> dict:
    """steps.jsonl -> {step: its last line}."""
    path = Path(folder) / "steps.jsonl"
    steps: dict = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                steps[entry["step"]] = {k: entry.get(k) for k in ("exit", "limit_s", "seconds", "call")}
    return steps


def bench_figures(path: Path) -> dict:
    """A bench --out JSON, raw: per point and variant the samples (RTF, seconds, load) and the warm-up call."""
    data = json.loads(Path(path).read_text())
    keep = ("rtf", "seconds", "audio_seconds", "first_call_seconds", "load")
    return {"command": data.get("command"), "checkpoint": data.get("checkpoint"), "device_key": data.get("device_key"),
            "variants": data.get("variants", {}),
            "points": {point: {variant: {k: s.get(k) for k in keep} for variant, s in by_variant.items()}
                       for point, by_variant in data["results"].items()}}


def stream_figures(path: Path) -> dict:
    """A streaming.json, raw: per point and variant every timed round (the warm-up's TTFA apart)."""
    data = json.loads(Path(path).read_text())
    keep = ("ttfa", "waits", "total", "audio")
    return {"command": data.get("command"), "checkpoint": data.get("checkpoint"), "applied": data.get("applied"),
            "rounds": data.get("rounds"),
            "points": {point: {variant: {"warmup_ttfa": d["warmup"]["ttfa"],
                                         "rounds": [{k: r[k] for k in keep} for r in d["rounds"]]}
                               for variant, d in by_variant.items()}
                       for point, by_variant in data["points"].items()}}


def gather(folders) -> tuple:
    """(figures, machine info from the bench/streaming files or None) of the script's folders."""
    figures = {"steps": {}, "tests": {}, "bench": {}, "stream": {}}
    machine = None
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder the GPU script wrote")
        steps = read_steps(folder)
        figures["steps"].update(steps)
        for tier in TIERS:
            counts = junit_counts(folder / f"{tier}.xml")
            if counts is not None or tier in steps:
                figures["tests"][tier] = counts or {"passed": None, "failed": None, "errors": None, "skipped": None,
                                                     "failed_tests": [], "seconds": None}
                figures["tests"][tier]["report"] = counts is not None
        for name in BENCHES:
            path = folder / f"{name}.json"
            if path.is_file():
                figures["bench"][name] = bench_figures(path)
                machine = json.loads(path.read_text()).get("machine") or machine
        for path in sorted(folder.glob("stream-*/streaming.json")):
            figures["stream"][path.parent.name] = stream_figures(path)
            machine = machine or json.loads(path.read_text()).get("machine")
        if (folder / "memory" / "memory.json").is_file():
            data = json.loads((folder / "memory" / "memory.json").read_text())
            figures["memory"] = {k: data.get(k) for k in ("command", "checkpoint", "patches", "calls", "asked",
                                                          "warmup", "num_step", "series", "verdict")}
            machine = machine or data.get("machine")
    if not (figures["steps"] or figures["tests"] or figures["bench"] or figures["stream"]):
        raise FileNotFoundError(f"nothing of the GPU script in {', '.join(map(str, folders))} (no steps.jsonl, "
                                "junit report, bench.json or streaming.json)")
    return figures, machine


def machine_line(info: dict) -> str:
    """One line for a machine info dict of another machine (harness.run.machine.summary describes this one)."""
    from harness.run.machine import isa_tag

    cpu = (f"{info.get('cpu_model')} ({isa_tag(info['isa'])})" if info.get("isa") else str(info.get("cpu_model")))
    return (f"{info['gpu_name']}, " if info.get("gpu_name") else "") + (
        f"{cpu}, {info.get('usable_cpus') or info.get('logical_cores')} usable CPUs of {info.get('logical_cores')}, "
        f"{info.get('torch_threads')} torch threads, {str(info.get('platform')).split('-')[0]}")


def record(out_dir, results_dir: Path = results.RESULTS_DIR, command: str | None = None) -> Path:
    """Write one gpu-check results file into results_dir from the script's folder(s) out_dir (a path or a list)."""
    from harness.run.machine import hardware_key

    folders = [out_dir] if isinstance(out_dir, (str, Path)) else list(out_dir)
    figures, machine = gather(folders)
    calls = list(dict.fromkeys(s["call"] for s in figures["steps"].values() if s.get("call")))
    command = command or "; ".join(calls) or None
    import torch

    if torch.cuda.is_available():
        return results.record(KIND, figures, results_dir, device="cuda", command=command)
    if machine is None:
        return results.record(KIND, figures, results_dir, device="cpu", command=command)
    with tempfile.TemporaryDirectory() as tmp:  # this machine's file, then filed under the one that measured
        data = json.loads(results.record(KIND, figures, Path(tmp), device="cpu", command=command).read_text())
    data.update(machine=machine, machine_key=hardware_key(machine), machine_summary=machine_line(machine))
    path = Path(results_dir) / KIND / f"{data['machine_key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


# --- rendering (docs/results.md) ------------------------------------------------------------------------------


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def exit_text(step: dict | None) -> str:
    if not step:
        return "-"
    code = step["exit"]
    return f"{code}: stopped at the {step['limit_s']} s limit" if code in (124, 137) else str(code)


def render_tests(figures: dict) -> list:
    lines = ["Tests (`pytest -m cuda`):", "",
             "| tier | exit | passed | failed | of which errors | skipped | seconds | failed tests |",
             "|---|---|---|---|---|---|---|---|"]
    for tier, t in figures["tests"].items():
        step = figures["steps"].get(tier)
        if not t["report"]:
            lines.append(f"| {tier} | {exit_text(step)} | - | - | - | - | - | no junit report: see {tier}.log |")
            continue
        failed = ", ".join(t["failed_tests"][:10]) + (" ..." if len(t["failed_tests"]) > 10 else "")
        lines.append(f"| {tier} | {exit_text(step)} | {t['passed']} | {t['failed']} | {t['errors']} | {t['skipped']} | "
                     f"{t['seconds']:.0f} | {cell(failed) or '-'} |")
    return lines


def render_bench(name: str, bench: dict, step: dict | None) -> list:
    from harness.speed.stability import judge

    variants = None
    lines = [f"Bench `{name}` (`{cell(bench['command'])}`; exit {exit_text(step)}):", ""]
    for point, by_variant in bench["points"].items():
        if variants is None:
            variants = list(by_variant)
            base = variants[0]
            lines += [f"| point | variant | RTF median | RTF IQR | median s per call | first call s | vs {base} |",
                      "|---|---|---|---|---|---|---|"]
        samples = {v: SimpleNamespace(name=v, rtf=s["rtf"], load=s.get("load") or []) for v, s in by_variant.items()}
        verdict = judge(samples)
        first = next(iter(by_variant))
        for v, s in by_variant.items():
            rtf = s["rtf"]
            q = statistics.quantiles(rtf, n=4) if len(rtf) > 1 else [rtf[0]] * 3
            if v == first:
                versus = "-"
            elif verdict.stable:
                versus = f"{statistics.median(by_variant[first]['rtf']) / statistics.median(rtf):.2f}x"
            else:
                versus = verdict.message
            warm = "-" if s["first_call_seconds"] is None else f"{s['first_call_seconds']:.2f}"
            lines.append(f"| {point} | {v} | {statistics.median(rtf):.4f} | {q[2] - q[0]:.4f} | "
                         f"{statistics.median(s['seconds']):.3f} | {warm} | {versus} |")
    pairs = [(p, p + "-each") for p in bench["points"] if p + "-each" in bench["points"]]
    for batch, each in pairs:
        lines += ["", f"One batch (`{batch}`) against one call per text (`{each}`), the same audio (points are "
                      "timed one after the other, so each side's own spread is judged):", "",
                  "| variant | batch RTF median | one call each RTF median | batch throughput / one call each |",
                  "|---|---|---|---|"]
        for v, s in bench["points"][batch].items():
            if v in bench["points"][each]:
                other = bench["points"][each][v]
                b, e = statistics.median(s["rtf"]), statistics.median(other["rtf"])
                lines.append(f"| {v} | {b:.4f} | {e:.4f} | {spread_judged(e / b, s, other)} |")
    return lines


def spread_judged(ratio: float, *sides: dict) -> str:
    """A ratio of two runs with no rounds in common, or why it is not printed (harness.speed.stability: each
    side's IQR / median against MAX_SAMPLE_SPREAD, at least MIN_ROUNDS samples a side)."""
    from harness.speed import stability

    rounds = min(len(side["rtf"]) for side in sides)
    if rounds < stability.MIN_ROUNDS:
        return f"unjudged: {rounds} round(s); at least {stability.MIN_ROUNDS} show whether the timing holds"
    if any(stability.sample_spread(side["rtf"]) > stability.MAX_SAMPLE_SPREAD for side in sides):
        loads = [x for side in sides for x in side.get("load") or [] if x is not None]
        return stability.advice(max(loads) if loads else None)
    return f"{ratio:.2f}x"


def render_stream(name: str, stream: dict, step: dict | None) -> list:
    from harness.speed.streaming import Listen, summary

    applied = ", ".join(stream.get("applied") or []) or "none"
    lines = [f"Streaming `{name}` (`{cell(stream['command'])}`; patches applied: {applied}; exit {exit_text(step)}):",
             "", "| point | variant | TTFA p50 s | TTFA p95 s | underrun p50 s | waits (most) | pieces | audio s | "
                 "last piece p50 s |", "|---|---|---|---|---|---|---|---|---|"]
    for point, by_variant in stream["points"].items():
        for v, d in by_variant.items():
            s = summary([Listen(**r) for r in d["rounds"]])
            under = "-" if v == "generate" else f"{s['underrun_p50']:.2f}"
            most = "-" if v == "generate" else str(s["underruns_max"])
            lines.append(f"| {point} | {v} | {s['ttfa_p50']:.3f} | {s['ttfa_p95']:.3f} | {under} | {most} | "
                         f"{s['pieces']} | {s['audio']:.1f} | {s['total_p50']:.3f} |")
    return lines


def render_memory(memory: dict, step: dict | None) -> list:
    """Memory over long service (harness.speed.service): each series after the warm-up and after the last call."""
    w = memory["warmup"]
    lines = [f"Memory over {memory['calls']} generate calls of mixed lengths (`{cell(memory['command'])}`; "
             f"exit {exit_text(step)}; warm-up {w} calls):", "",
             "| series | MiB after the warm-up | MiB after the last call | growth MiB | bound MiB | verdict |",
             "|---|---|---|---|---|---|"]
    for name, v in memory["verdict"].items():
        values = memory["series"][name]
        lines.append(f"| {name} | {values[w - 1]:.1f} | {values[-1]:.1f} | {v['growth_mib']:+.1f} | {v['bound_mib']} | "
                     f"{'flat' if v['flat'] else 'grows'} |")
    return lines


def render_results(figures: dict) -> str:
    """A gpu-check results file's figures as markdown: test counts per tier, bench medians per point and
    variant (speedups judged by harness.speed.stability), streaming TTFA and underruns."""
    parts = []
    if figures["tests"]:
        parts.append(render_tests(figures))
    for name, bench in figures["bench"].items():
        parts.append(render_bench(name, bench, figures["steps"].get(name)))
    for name, stream in figures["stream"].items():
        parts.append(render_stream(name, stream, figures["steps"].get(name)))
    if figures.get("memory"):
        parts.append(render_memory(figures["memory"], figures["steps"].get("memory")))
    missing = [s for s in figures["steps"] if s not in figures["tests"] and s not in figures["bench"]
               and s not in figures["stream"] and not (s == "memory" and figures.get("memory"))]
    if missing:
        parts.append(["Ran without leaving a result file: "
                      + ", ".join(f"{s} (exit {exit_text(figures['steps'][s])})" for s in missing) + "."])
    return "\n\n".join("\n".join(p) for p in parts) if parts else "No stage of the GPU script left results."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.gpu_check", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, nargs="+", default=[Path("out/gpu")],
                        help="the GPU script's folder(s) ($OUT of each call)")
    parser.add_argument("--results", type=Path, default=results.RESULTS_DIR, metavar="DIR",
                        help="the results folder to write into")
    parser.add_argument("--command", default=None,
                        help="the command line to record; default: the calls named in steps.jsonl")
    args = parser.parse_args(argv)
    try:
        path = record(args.out, args.results, args.command)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"results file: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
