"""The version-bump gate's quality-set check on the espeak-ng set in Seed-TTS-eval's layout: its three known answers,
through the gate itself (`fastpath-suite audit known-answer --metric clone-set --results results/`).

Each case gates a stand-in fork of the installed omnivoice (harness.quality.clone_run: the fork's STANDIN_DAMAGE
decides what the espeak stand-in says in its environment) against the installed release, with
`--checks quality-set --quality-set <set>/en --quality-synth espeak`:

| case | the candidate's outputs | expected |
|---|---|---|
| identical | the release's, unchanged | the check passes (the gate INCOMPLETE only for the checks left out) |
| noise | white noise at 10 dB SNR over every clip | refused: MUST NOT SHIP, MOS P.808 failed |
| swap | two prompts' voices exchanged (words and sound unchanged) | refused: MUST NOT SHIP, SIM failed and nothing else |

and the German list through the same check, which tiny.en cannot hear: "not judged" (INCOMPLETE), never a pass;
then judged on SIM and MOS alone (`--quality-metrics sim,mos`), where its swapped voices are refused on SIM.
Each case's venv is made under .cache/gate/ (reused), the set under <cache>/espeak-set/.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from harness.quality import espeak_set, speech
from harness.quality.cache import cache_dir

# Each damage's known answer, as verdicts per metric: (metrics that must fail, whether no other metric may). A
# metric that is neither passed nor failed is undecided ("underpowered": 12 clips in 4 prompts' blocks decide
# little), which refuses a candidate too, but is not what the damage is known to be refused on.
KNOWN = {
    "none": ((), True),  # every metric passes
    "noise": (("MOS-P808",), False),  # refused on MOS (SIM, hearing the noise, may fail as well)
    "swap": (("SIM",), True),  # refused on SIM alone: the words and the sound are the same
}


def as_known(damage: str, verdicts: dict) -> bool:
    """Whether {metric: verdict} is `damage`'s known answer (KNOWN): passed when undamaged, refused on what the
    damage is known to break."""
    must, only = KNOWN[damage]
    failed = {m for m, v in verdicts.items() if v == "fail"}
    if damage == "none":
        return bool(verdicts) and all(v == "pass" for v in verdicts.values())
    return set(must) <= failed and (not only or failed == set(must))


ALL = ("wer", "sim", "mos")
CASES = (  # (case, damage, list, expected state, judged at all, metrics judged)
    ("identical", "none", "en", "incomplete", True, ALL),
    ("noise", "noise", "en", "must-not-ship", True, ALL),
    ("swap", "swap", "en", "must-not-ship", True, ALL),
    ("identical, German (tiny.en)", "none", "de", "incomplete", False, ALL),  # not judged, never a pass
    ("swap, German (SIM and MOS)", "swap", "de", "must-not-ship", True, ("sim", "mos")),
)


def run_case(folder: Path, case: tuple, work: Path, log=print, workers: int = 1) -> dict:
    from importlib import metadata

    from harness.gate import candidate as cand
    from harness.gate import gate

    name, damage, lang, expected, judged_at_all, metrics_judged = case
    fork = cand.edited_copy(work / f"omnivoice-{damage}",
                            {"__init__.py": [("__all__ = [", f"STANDIN_DAMAGE = {damage!r}\n\n__all__ = [")]},
                            f"{metadata.version('omnivoice')}+{damage}")
    start = time.perf_counter()
    out = work / (f"out-{damage}-{lang}" + (f"-{workers}-workers" if workers > 1 else ""))
    report = gate.run_gate(str(fork), "current", out, checks=("quality-set",), quality_set=str(folder / lang),
                           quality_synth="espeak", log=log, quality_metrics=metrics_judged, workers=workers)
    row = {c["name"]: c for c in report["checks"]}["quality-set"]
    verdict_file = out / "quality-set" / "verdict.json"
    metrics = json.loads(verdict_file.read_text())["metrics"] if verdict_file.is_file() else []
    verdicts = {m["metric"]: m["verdict"] for m in metrics}
    meets = report["state"] == expected and (as_known(damage, verdicts) if judged_at_all else not metrics)
    return {"case": name, "damage": damage, "list": lang, "judged": list(metrics_judged), "state": report["state"],
            "expected": expected,
            "status": row["status"], "summary": row["summary"], "metrics": metrics, "meets": meets,
            "seconds": round(time.perf_counter() - start, 1)}


def run(log=print) -> dict:
    folder = espeak_set.build(cache_dir("espeak-set"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastpath-clone-set-") as tmp:
        for k, case in enumerate(CASES, 1):
            log(f"case {k}/{len(CASES)}: {case[0]}")
            rows.append(run_case(folder, case, Path(tmp) / f"case{k}", log))
    from harness.quality import sets

    return {"espeak": speech.espeak_version(), "languages": sets.read_set(folder).languages, "rows": rows}


def render_results(data: dict) -> str:
    items = ", ".join(f"{n} {lang}" for lang, n in data["languages"].items())
    lines = [f"The gate's `quality-set` check on the espeak-ng set in Seed-TTS-eval's layout ({data['espeak']}; "
             f"items: {items}), each candidate a stand-in fork gated against "
             "the installed omnivoice with the espeak synthesizer and the default judges. Per metric: candidate - "
             "reference and its bounds (WER in points, lower is better; SIM and MOS higher is better).", "",
             "| case | list | judged on | gate | expected | as expected | metrics (Δ [lower, upper], verdict) |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        cells = "; ".join(f"{m['metric']} {m['delta']:+.3f} [{m['lower']:+.3f}, {m['upper']:+.3f}] {m['verdict']}"
                          for m in r["metrics"]) or r["summary"].replace("|", "/")[:200]
        lines.append(f"| {r['case']} | {r['list']} | {', '.join(m.upper() for m in r['judged'])} | {r['state']} | "
                     f"{r['expected']} | "
                     f"{'yes' if r['meets'] else '**no**'} | {cells} |")
    return "\n".join(lines) + "\n"


def main(args, progress) -> int:
    from harness.run import results

    data = run(log=progress.say)
    print(render_results(data))
    results.write_if_asked(args, "known-answer-clone", data)
    return 0 if all(r["meets"] for r in data["rows"]) else 1
