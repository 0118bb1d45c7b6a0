"""The GPU tier's results file ("gpu-check"): what `fastpath-suite gpu-check` (scripts/gpu_check.sh) leaves in its
folder, gathered into one file of harness.run.results, with a verdict per stage and the speed targets
(harness.speed.targets).

Read from each folder (OUT of the script; several folders, e.g. two calls with STAGES "3 4 4b" and "5", are merged,
a later folder's stage replacing an earlier one's):

    steps.jsonl                 one line per stage run: {"step", "exit", "limit_s", "seconds", "call", "mode",
                                "note"} (the last line of a stage counts)
    machine.json                the machine the stages ran on (the env stage writes it once CUDA answers)
    <stage>.ids                 the node ids pytest collected for a pytest stage, before it ran
    <stage>.xml                 that stage's junit report (parity, speed, patches; --quick: quick-parity, inductor)
    collect.log                 --quick's `pytest -m cuda --collect-only` (the proof that cuda tests are collected)
    bench.json, batching.json,  `fastpath-suite bench --out` (stages 4, 4b, 4c; --quick: targets): every sample of
    packed.json, targets.json   every point and variant, the machine; written after each point ("complete")
    memory/memory.json          `fastpath-suite memory --out` of stage 4d
    stream-gpu-*/streaming.json `fastpath-suite stream --out` of stage 5

Green means it ran: a stage passes when its command exited 0 and, for a pytest stage, every collected test ran
and passed (a skip, or a test not reached before the limit, is not a pass). `stage_verdict` is the rule.

The machine the file is filed under: machine.json's (the GPU the stages ran on); for folders without one, this
machine's GPU when torch sees CUDA, else the machine the bench and streaming files describe (gathering fetched
folders elsewhere: `fastpath-suite gpu-check --gather DIR [DIR ...]`), and this machine only when no file names one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

from harness.run import results
from harness.run.results import hand_over
from harness.audit.false_alarms import junit_counts
from harness.speed.targets import render_targets

KIND = "gpu-check"
TIERS = ("parity", "speed")  # pytest stages of folders written before stages listed their ids
BENCHES = ("bench", "batching", "packed", "targets")
LIMIT_EXITS = (124, 137)  # timeout(1): stopped at the limit (TERM or INT), or killed after the grace
PASS, FAIL, ERROR, NOT_JUDGED = "pass", "fail", "error", "not judged"
FIRST_IDS = 3  # how many not-reached or skipped ids a table cell names


# --- reading the script's folder --------------------------------------------------------------------------------


def read_steps(folder: Path) -> dict:
    """steps.jsonl -> {step: its last line}."""
    path = Path(folder) / "steps.jsonl"
    steps: dict = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                steps[entry["step"]] = {k: entry.get(k) for k in ("exit", "limit_s", "seconds", "call", "mode", "note")}
    return steps


def junit_id(nodeid: str) -> str:
    """A pytest node id as its junit case reads "classname::name" (pytest's junitxml.mangle_test_address: the
    path dotted without .py, classes joined by dots, the parameters kept): tests_parity/test_a.py::test_b[x] ->
    tests_parity.test_a::test_b[x]."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]) + "::" + names[-1]


def junit_cases(path: Path) -> dict | None:
    """{"classname::name": {"outcome": passed | failed | skipped, "properties": {name: value}}} of a junit report
    (record_property values as pytest wrote them, strings); None when there is no readable report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = {}
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases[f"{case.get('classname')}::{case.get('name')}"] = {"outcome": outcome, "properties": properties}
    return cases


def collected_ids(path: Path) -> list | None:
    """The node ids `pytest --collect-only -q` printed (its lines before the first blank one, "path::name"); None
    when there is no such file."""
    if not Path(path).is_file():
        return None
    listing = Path(path).read_text().split("\n\n")[0]
    return [line for line in listing.splitlines() if "::" in line and not line.startswith((" ", "ERROR"))]


def stage_tests(folder: Path, name: str) -> dict:
    """A pytest stage: junit counts, what was collected and did not run (skipped, not reached), record_property
    values per test."""
    xml = folder / f"{name}.xml"
    counts = junit_counts(xml)
    cases = junit_cases(xml) or {}
    figures = counts or {"passed": None, "failed": None, "errors": None, "skipped": None, "failed_tests": [],
                         "seconds": None}
    figures["report"] = counts is not None
    ids = collected_ids(folder / f"{name}.ids")
    figures["collected"] = None if ids is None else len(ids)
    figures["not_reached"] = [] if ids is None else [i for i in ids if junit_id(i) not in cases]
    as_collected = {junit_id(i): i for i in ids or []}  # junit's names back to node ids, where collected
    figures["skipped_tests"] = [as_collected.get(i, i) for i, c in cases.items() if c["outcome"] == "skipped"]
    figures["properties"] = {i: c["properties"] for i, c in cases.items() if c["properties"]}
    return figures


def bench_figures(path: Path) -> dict:
    """A bench --out JSON, raw: per point and variant the samples (RTF, seconds, load) and the warm-up call;
    `complete` false when the bench was stopped before its last point (the points it finished are kept)."""
    data = json.loads(Path(path).read_text())
    keep = ("rtf", "seconds", "audio_seconds", "first_call_seconds", "load")
    return {"command": data.get("command"), "checkpoint": data.get("checkpoint"), "device_key": data.get("device_key"),
            "variants": data.get("variants", {}), "complete": data.get("complete", True),
            "points_planned": data.get("points_planned"),
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


def pytest_stages(folder: Path, steps: dict) -> list:
    """The pytest stages of a folder: those whose ids or junit report is there, and the old tiers that ran."""
    names = [s for s in steps if (folder / f"{s}.ids").is_file() or (folder / f"{s}.xml").is_file()]
    return names + [t for t in TIERS if t not in names and ((folder / f"{t}.xml").is_file() or t in steps)]


def gather(folders) -> tuple:
    """(figures, machine info or None) of the script's folders: machine.json's, else the bench/streaming files'."""
    figures = {"mode": None, "steps": {}, "tests": {}, "bench": {}, "stream": {}}
    machine = None
    modes = set()
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder the GPU script wrote")
        steps = read_steps(folder)
        figures["steps"].update(steps)
        modes |= {s["mode"] for s in steps.values() if s.get("mode")}
        for name in pytest_stages(folder, steps):
            figures["tests"][name] = stage_tests(folder, name)
        ids = collected_ids(folder / "collect.log")
        if ids is not None:
            figures["collect"] = {"collected": len(ids), "files": sorted({i.split("::")[0] for i in ids})}
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
        if (folder / "machine.json").is_file():
            machine = json.loads((folder / "machine.json").read_text())
    if not (figures["steps"] or figures["tests"] or figures["bench"] or figures["stream"]):
        raise FileNotFoundError(f"nothing of the GPU script in {', '.join(map(str, folders))} (no steps.jsonl, "
                                "junit report, bench.json or streaming.json)")
    figures["mode"] = "quick" if "quick" in modes else "full" if modes else None  # a quick call is never the full tier
    figures["verdicts"] = {name: dict(zip(("verdict", "reason"), stage_verdict(name, figures)))
                           for name in figures["steps"]}
    return figures, machine


# --- the rule: green means it ran -------------------------------------------------------------------------------


def first_ids(ids: list) -> str:
    return ", ".join(ids[:FIRST_IDS]) + (" ..." if len(ids) > FIRST_IDS else "")


def stage_verdict(name: str, figures: dict) -> tuple:
    """(verdict, reason) of one stage. pass: exited 0, and a pytest stage ran every test it collected and each
    passed. fail: a test failed, or the command said so (a non-zero exit of its own). error: the stage's own run
    broke: stopped at its limit (exit 124/137, naming the tests not reached), not started (no time left), pytest's
    own error (exits 2-4: interrupted, internal error, usage or collection). not judged: it ran but something it
    checks did not (tests skipped, none collected, no file written)."""
    step = figures["steps"].get(name)
    if step is None:
        return ERROR, "no line in steps.jsonl: the stage never finished"
    code, limit = step["exit"], step.get("limit_s")
    if step.get("note"):
        return ERROR, step["note"]
    tests = figures["tests"].get(name)
    stopped = f"stopped at its {limit} s limit after {step.get('seconds')} s" if code in LIMIT_EXITS else None
    if tests is not None:
        missing = tests.get("not_reached") or []
        reached = f"not reached: {len(missing)} ({first_ids(missing)})" if missing else None
        if tests.get("failed"):
            return FAIL, "; ".join(filter(None, [f"{tests['failed']} failed: {first_ids(tests['failed_tests'])}",
                                                 stopped, reached]))
        if stopped or code in (2, 3, 4) or (code and missing):
            return ERROR, "; ".join(filter(None, [stopped or f"pytest exit {code} (see {name}.log)", reached]))
        if tests.get("collected") == 0 or code == 5:
            return NOT_JUDGED, "collected no test: the selection is empty here"
        if tests.get("skipped"):
            return NOT_JUDGED, (f"{tests['skipped']} skipped: {first_ids(tests['skipped_tests'])} (a skipped test "
                                "did not run: green means it ran)")
        if missing:
            return NOT_JUDGED, reached
        if code:
            return FAIL, f"pytest exit {code} (see {name}.log)"
        if not tests.get("report"):
            return NOT_JUDGED, f"no junit report ({name}.xml)"
        return PASS, f"{tests['passed']} passed"
    if stopped:
        bench = figures["bench"].get(name)
        done = (f"; points done: {', '.join(bench['points']) or 'none'} of {', '.join(bench['points_planned'])}"
                if bench and bench.get("points_planned") else "")
        return ERROR, stopped + done
    if code:
        return FAIL, f"exit {code} (see {name}.log)"
    if name == "collect":
        count = (figures.get("collect") or {}).get("collected")
        if not count:
            return NOT_JUDGED, "no cuda test collected (collect.log): the tier would run nothing"
        return PASS, f"{count} cuda tests collected in {', '.join(figures['collect']['files'])}"
    if name in BENCHES and name not in figures["bench"]:
        return NOT_JUDGED, f"exited 0 without writing {name}.json"
    return PASS, "exit 0"


def failed_stages(figures: dict) -> list:
    return [name for name, v in figures["verdicts"].items() if v["verdict"] != PASS]


# --- the results file -------------------------------------------------------------------------------------------


def machine_line(info: dict) -> str:
    """One line for a machine info dict of another machine (harness.run.machine.summary describes this one)."""
    from harness.run.machine import isa_tag

    cpu = (f"{info.get('cpu_model')} ({isa_tag(info['isa'])})" if info.get("isa") else str(info.get("cpu_model")))
    return (f"{info['gpu_name']}, " if info.get("gpu_name") else "") + (
        f"{cpu}, {info.get('usable_cpus') or info.get('logical_cores')} usable CPUs of {info.get('logical_cores')}, "
        f"{info.get('torch_threads')} torch threads, {str(info.get('platform')).split('-')[0]}")


def write_file(figures: dict, machine: dict, summary: str, results_dir: Path, command: str | None) -> Path:
    """results.record's file, for the machine the stages ran on instead of this process's (no torch import, so
    recording after every stage costs a fraction of a second); written whole, then renamed into place, so a call
    stopped while writing leaves the previous file."""
    from harness.run.machine import hardware_key

    commit, dirty = results.checkout_state()
    data = {"format": results.FORMAT, "version": results.VERSION, "kind": KIND, "machine": machine,
            "machine_key": hardware_key(machine), "machine_summary": summary, "commit": commit, "dirty": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command or results.command_line(), "figures": figures}
    path = Path(results_dir) / KIND / f"{data['machine_key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(partial, path)
    return path


def record(out_dir, results_dir: Path = results.RESULTS_DIR, command: str | None = None) -> Path:
    """Write one gpu-check results file into results_dir from the script's folder(s) out_dir (a path or a list)."""
    folders = [out_dir] if isinstance(out_dir, (str, Path)) else list(out_dir)
    figures, machine = gather(folders)
    calls = list(dict.fromkeys(s["call"] for s in figures["steps"].values() if s.get("call")))
    command = command or "; ".join(calls) or None
    stated = [Path(f) / "machine.json" for f in folders if (Path(f) / "machine.json").is_file()]
    if stated:  # the env stage's record of the GPU the stages ran on
        own = json.loads(stated[-1].read_text())
        return write_file(figures, own, machine_line(own), results_dir, command)
    import torch

    if torch.cuda.is_available():
        return results.record(KIND, figures, results_dir, device="cuda", command=command)
    if machine is None:
        return results.record(KIND, figures, results_dir, device="cpu", command=command)
    return write_file(figures, machine, machine_line(machine), results_dir, command)


# --- the env stage: is CUDA usable, and on what ------------------------------------------------------------------


def environment(out: Path | None) -> int:
    """Print the versions, the GPU and its device key, and write out/machine.json; 4 (naming what is missing: the
    wheel, the driver or a device) when CUDA is not usable, or when the suite does not import; else 0."""
    import importlib.metadata as md
    import platform
    import subprocess

    import torch

    from harness.model.devices import cuda_problem
    from harness.run.machine import device_key, machine_info

    print(f"python {platform.python_version()} | torch {torch.__version__} | cuda {torch.version.cuda} | "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    for name in ("omnivoice", "transformers", "tokenizers", "soundfile", "pytest", "pytest-benchmark", "scipy",
                 "triton"):
        try:
            print(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            print(f"{name} MISSING")
    problem = cuda_problem()
    if problem:
        print(f"CUDA is not usable here: {problem}")
        return 4
    print(f"gpu {torch.cuda.get_device_name()} | capability {torch.cuda.get_device_capability()} | "
          f"{torch.cuda.device_count()} device(s)")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,"
                              "power.draw,memory.used", "--format=csv"], capture_output=True, text=True, timeout=30)
        print(smi.stdout.strip() or smi.stderr.strip())
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"nvidia-smi: {err}")
    try:
        import fastpath.gpu.graphs  # noqa: F401
        import omnivoice  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure stops the tier here, with its words
        print(f"the suite does not import here: {type(err).__name__}: {err}")
        return 4
    info = machine_info("cuda")
    print(f"device key {device_key(info)}")
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "machine.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    return 0


# --- rendering (docs/results.md) ------------------------------------------------------------------------------


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def exit_text(step: dict | None) -> str:
    if not step:
        return "-"
    code = step["exit"]
    return f"{code}: stopped at the {step['limit_s']} s limit" if code in LIMIT_EXITS else str(code)


def render_stages(figures: dict) -> list:
    """Each stage's verdict, its measured seconds against its limit."""
    lines = ["Stages (green means it ran: a skipped or unreached test is not a pass):", "",
             "| stage | verdict | exit | seconds | limit s | why |", "|---|---|---|---|---|---|"]
    for name, step in figures["steps"].items():
        v = figures["verdicts"].get(name) or {"verdict": "-", "reason": ""}
        lines.append(f"| {name} | {v['verdict']} | {step['exit']} | {step.get('seconds')} | {step.get('limit_s')} | "
                     f"{cell(v['reason'])} |")
    return lines


def render_tests(figures: dict) -> list:
    lines = ["Tests (`pytest -m cuda`):", "",
             "| tier | exit | passed | failed | of which errors | skipped | seconds | failed tests | did not run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for tier, t in figures["tests"].items():
        step = figures["steps"].get(tier)
        missing = t.get("not_reached") or []
        unrun = "; ".join(filter(None, [
            f"not reached: {len(missing)} (first ids {first_ids(missing)})" if missing else None,
            f"skipped: {first_ids(t['skipped_tests'])}" if t.get("skipped_tests") else None])) or "-"
        if not t["report"]:
            lines.append(f"| {tier} | {exit_text(step)} | - | - | - | - | - | no junit report: see {tier}.log | "
                         f"{cell(unrun)} |")
            continue
        failed = first_ids(t["failed_tests"]) if t["failed_tests"] else ""
        lines.append(f"| {tier} | {exit_text(step)} | {t['passed']} | {t['failed']} | {t['errors']} | {t['skipped']} | "
                     f"{t['seconds']:.0f} | {cell(failed) or '-'} | {cell(unrun)} |")
    return lines


def render_properties(figures: dict) -> list:
    """What the tests measured (record_property), one row a value."""
    rows = [(tier, test, name, value) for tier, t in figures["tests"].items()
            for test, props in (t.get("properties") or {}).items() for name, value in props.items()]
    if not rows:
        return []
    lines = ["Measured by the tests (`record_property`):", "", "| tier | test | name | value |", "|---|---|---|---|"]
    for tier, test, name, value in rows:
        value = str(value)
        lines.append(f"| {tier} | {cell(test.split('::')[-1])} | {cell(name)} | "
                     f"{cell(value[:200] + (' ...' if len(value) > 200 else ''))} |")
    return lines


def render_bench(name: str, bench: dict, step: dict | None) -> list:
    from harness.speed.stability import judge

    variants = None
    cut = ("" if bench.get("complete", True) else
           f"; cut off: points done {', '.join(bench['points']) or 'none'} of {', '.join(bench['points_planned'] or [])}")
    lines = [f"Bench `{name}` (`{cell(bench['command'])}`; exit {exit_text(step)}{cut}):", ""]
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
    """A gpu-check results file's figures as markdown: each stage's verdict and seconds against its limit, test
    counts per tier (and the tests that did not run), the targets, bench medians per point and variant (speedups
    judged by harness.speed.stability), streaming TTFA and underruns, memory, the values the tests measured."""
    parts = []
    if figures.get("mode") == "quick":
        parts.append(["A first look (`fastpath-suite gpu-check --quick`): one bf16 row per CUDA patch, not the whole "
                      "tier."])
    if figures.get("verdicts"):
        parts.append(render_stages(figures))
    if figures["tests"]:
        parts.append(render_tests(figures))
    if figures["bench"]:
        parts.append(["Targets (from the bench runs below):", "", render_targets(figures)])
    for name, bench in figures["bench"].items():
        parts.append(render_bench(name, bench, figures["steps"].get(name)))
    for name, stream in figures["stream"].items():
        parts.append(render_stream(name, stream, figures["steps"].get(name)))
    if figures.get("memory"):
        parts.append(render_memory(figures["memory"], figures["steps"].get("memory")))
    parts.append(render_properties(figures))
    missing = [s for s in figures["steps"] if s not in figures["tests"] and s not in figures["bench"]
               and s not in figures["stream"] and not (s == "memory" and figures.get("memory"))
               and s not in ("env", "checkpoints", "collect")]
    if missing:
        parts.append(["Ran without leaving a result file: "
                      + ", ".join(f"{s} (exit {exit_text(figures['steps'][s])})" for s in missing) + "."])
    parts = [p for p in parts if p]
    return "\n\n".join("\n".join(p) for p in parts) if parts else "No stage of the GPU script left results."


# --- the script's time limits, for docs/gpu.md ---------------------------------------------------------------------

SCRIPT = results.ROOT / "scripts" / "gpu_check.sh"
# `NAME=${NAME:-default}  # stage: what it bounds`, one line per limit of the script
LIMIT_LINE = re.compile(r"^(?P<name>[A-Z_]+)=\$\{(?P=name):-(?P<default>.*)\}\s+#\s*(?P<stage>[a-z0-9-]+|the call): "
                        r"(?P<what>.*)$")


def script_limits(script: Path = SCRIPT) -> list:
    """[(variable, default as the script writes it, stage, what it bounds)] of the script's limit lines, in order."""
    found = [m for m in map(LIMIT_LINE.match, Path(script).read_text().splitlines()) if m]
    return [(m["name"], m["default"], m["stage"], m["what"]) for m in found]


def default_text(default: str) -> str:
    """A default as the page says it: `240`, `240 unless PYTEST_LIMIT is set`, `570 with --quick, else none`."""
    if re.fullmatch(r"\d+", default):
        return default
    fallback = re.fullmatch(r"\$\{([A-Z_]+):-(\d+)\}", default)
    if fallback:
        return f"{fallback[2]} (`{fallback[1]}` where set)"
    quick = re.fullmatch(r'\$\(\[ "\$mode" = quick \] && echo (\d+)\)', default)
    if quick:
        return f"{quick[1]} with `--quick`, else none"
    return f"`{default}`"


def render_limits(results_dir: Path = results.RESULTS_DIR, script: Path = SCRIPT) -> str:
    """docs/gpu.md's block "gpu-limits": each limit of the script with its default, and the seconds its stage took in
    each gpu-check results file (the GPU named), or that no run has measured it."""
    runs = [results.load(path) for path in sorted(Path(results_dir).glob(f"{KIND}/*.json"))]
    gpus = [run["machine"].get("gpu_name") or run["machine_key"] for run in runs]
    lines = ["| variable | default (s) | stage | what it bounds |" + "".join(f" {gpu}: seconds taken |" for gpu in gpus),
             "|---|---|---|---|" + "---|" * len(gpus)]
    for name, default, stage, what in script_limits(script):
        taken = []
        for run in runs:
            step = run["figures"].get("steps", {}).get(stage)
            verdict = run["figures"].get("verdicts", {}).get(stage, {}).get("verdict")
            taken.append(f"{step['seconds']} of {step['limit_s']} ({verdict})" if step else "not run")
        lines.append(f"| `{name}` | {default_text(default)} | {stage} | {cell(what)} |"
                     + "".join(f" {t} |" for t in taken))
    if not runs:
        lines += ["", "No GPU run has written a results file (`results/gpu-check/`) yet, so every default above is an "
                      "estimate; `fastpath-suite gpu-check` prints each stage's seconds beside its limit, and its "
                      "results file keeps them for this table."]
    return "\n".join(lines) + "\n"


hand_over({"gpu-check": render_results, "gpu-limits": render_limits})  # this job's results kind and docs block


# --- the command line --------------------------------------------------------------------------------------------


def summary_lines(figures: dict) -> list:
    """The call's summary: each stage's verdict, measured seconds against its limit, and why."""
    lines = [f"{'stage':22s} {'verdict':11s} {'exit':>4s} {'seconds':>7s} {'limit':>6s}  why"]
    for name, step in figures["steps"].items():
        v = figures["verdicts"][name]
        lines.append(f"{name:22s} {v['verdict']:11s} {step['exit']:>4} {step.get('seconds')!s:>7s} "
                     f"{step.get('limit_s')!s:>6s}  {v['reason']}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.gpu_check", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, nargs="+", default=[Path("out/gpu")],
                        help="the GPU script's folder(s) ($OUT of each call)")
    parser.add_argument("--results", type=Path, default=results.RESULTS_DIR, metavar="DIR",
                        help="the results folder to write into")
    parser.add_argument("--command", default=None,
                        help="the command line to record; default: the calls named in steps.jsonl")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--stage", default=None,
                      help="after recording, print this stage's verdict and every test it did not run; exit 1 "
                           "unless it passed")
    what.add_argument("--summary", action="store_true",
                      help="record nothing: print every stage's verdict and seconds against its limit; exit 1 "
                           "unless all passed")
    what.add_argument("--environment", action="store_true",
                      help="the env stage: versions, the GPU, the device key, --out/machine.json; exit 4 when "
                           "CUDA is not usable")
    args = parser.parse_args(argv)
    if args.environment:
        return environment(args.out[-1])
    try:
        if args.summary:
            figures, _ = gather(args.out)
            print("\n".join(summary_lines(figures)))
            failed = failed_stages(figures)
            print(f"{len(failed)} of {len(figures['verdicts'])} stages did not pass: {', '.join(failed)}" if failed
                  else f"all {len(figures['verdicts'])} stages passed")
            return 1 if failed else 0
        path = record(args.out, args.results, args.command)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"results file: {path}")
    if args.stage is None:
        return 0
    figures, _ = gather(args.out)
    verdict = figures["verdicts"].get(args.stage, {"verdict": ERROR, "reason": "no such stage in steps.jsonl"})
    print(f"{args.stage}: {verdict['verdict']}: {verdict['reason']}")
    tests = figures["tests"].get(args.stage) or {}
    for label, ids in (("not reached", tests.get("not_reached")), ("skipped", tests.get("skipped_tests"))):
        if ids:
            print(f"{args.stage}: {label}: {len(ids)}\n  " + "\n  ".join(ids))
    return 0 if verdict["verdict"] == PASS else 1


if __name__ == "__main__":
    raise SystemExit(main())
