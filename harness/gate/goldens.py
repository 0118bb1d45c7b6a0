"""Goldens: what stock OmniVoice computes on the tiny test checkpoint, recorded per omnivoice version.

For each parity operating point (`parity.POINTS`) at `NUM_STEP` = 8 unmasking steps and seed 0, a golden keeps
two kinds of facts, stored in `fixtures/goldens/<omnivoice version>.json`:

- portable, compared on every machine: the number of scoring calls, the final tokens and the waveform lengths
  (exactly); the mean and standard deviation of every per-step conditional and unconditional logits tensor, and
  the RMS of each waveform in `WAVE_BLOCKS` blocks (within `TOLERANCES`, set from the differences measured
  between instruction sets, far below what a one-frame or one-token change moves);
- exact, per machine: sha256 of the per-step logits, of the decoder's audio of every chunk or item (before
  upstream's post-processing, whose int16 round trip would hide a change below 1/32768) and of the waveform
  (float32 bytes), under the
  `numerics_key` of the machine that recorded them (processor, torch's CPU capability and the kernel-selecting
  extensions, ISA caps in the environment, threads, torch build). Bits hold only there: the same code gave other
  logits bits on an AVX2 and an AVX-512 machine, and on an AMD and an Intel one of the same capability (docs/machines.md,
  "Machines differ"). On a machine whose key is recorded they are compared; on any other the report says they
  were not, and `test_stock_bits_match_the_goldens_recorded_for_this_machine` skips saying how to record them.

8 steps instead of the default 32: the schedule, scoring and sampling code all run the same way, at a quarter
of the time. The saved-prompt point uses the prompt in memory (no save/load round trip, which omnivoice < 0.2.1
lacks): goldens are about generation, the file round trip is the parity tier's business.

    fastpath-suite maintain goldens            # compare the installed omnivoice's stock output with the goldens
    fastpath-suite maintain goldens --record   # add this machine's exact hashes (portable parts must agree),
                                                  # or write fixtures/goldens/<installed version>.json if new
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from harness import REPO_ROOT

from harness.run import machine

GOLDENS_DIR = REPO_ROOT / "fixtures" / "goldens"
NUM_STEP = 8
SEED = 0
EXACT_PARTS = ("scoring_calls", "tokens", "waveform_samples")  # integers: equal on every machine
HASHED_PARTS = ("logits", "decoded", "waveform")  # sha256 of float32 bytes: equal only under one numerics key
WAVE_BLOCKS = 32
# Portable summaries, compared within these tolerances: logits moments as |change of mean or std| / std of the
# golden tensor, waveform as |change of a block's RMS|. Measured on one AMD EPYC between AVX-512, AVX2 (emulated)
# and torch's scalar kernels (ATEN_CPU_CAPABILITY=default), all 11 points: at most 2.0e-8 (logits) and 1.0e-7
# (waveform, the calibrated decoder's convolutions); earlier, on one Intel Xeon, 1.6e-8 and 0 (a decoder that ignored
# its codes). The tolerances sit 10x and 50x above that, and far below what one code moves (0.3 in a block).
TOLERANCES = {"logits_moments": 1e-6, "waveform_rms": 1e-6}


class GoldensError(RuntimeError):
    """Goldens cannot be recorded or compared; the message names the fix."""


def environment() -> dict:
    """Versions, the machine in one line, and the numerics key the exact hashes are filed under."""
    return {**machine.versions(), "machine": machine.summary(), "numerics_key": machine.numerics_key()}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def checkpoint_digests(path: Path) -> dict:
    """Which weights the goldens were made with: digests of the two weight files."""
    return {"model_sha256": file_sha256(path / "model.safetensors"),
            "audio_tokenizer_sha256": file_sha256(path / "audio_tokenizer" / "model.safetensors")}


def point_kwargs(model, name: str) -> dict:
    """generate() kwargs of a parity point at NUM_STEP steps; the saved-prompt point gets its prompt in memory."""
    from harness.parity.parity import POINTS, REF_3S

    kwargs = dict(POINTS[name], num_step=NUM_STEP)
    if kwargs.get("voice_clone_prompt") == "ref_3s":
        kwargs["voice_clone_prompt"] = model.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    return kwargs


def summarise_run(run) -> dict:
    """One point's golden: its portable parts and, under this machine's numerics key, the exact hashes."""
    import numpy as np
    import torch

    logits = hashlib.sha256()
    moments = []
    for name, tensor in run.steps:
        if name.endswith("logits"):  # c_logits, u_logits: [1, C, T, V]
            t = tensor.to(torch.float32).contiguous()
            logits.update(t.numpy().tobytes())
            d = t.to(torch.float64)
            moments.append([d.mean().item(), d.std().item()])
    decoded = hashlib.sha256()
    for d in run.decoded:
        decoded.update(np.ascontiguousarray(d, dtype=np.float32).tobytes())
    wave = hashlib.sha256()
    rms = []
    for w in run.waveforms:
        w = np.ascontiguousarray(w, dtype=np.float32)
        wave.update(w.tobytes())
        blocks = np.array_split(w.astype(np.float64).ravel(), WAVE_BLOCKS)
        rms.append([float(np.sqrt(np.mean(b * b))) if b.size else 0.0 for b in blocks])
    return {
        "scoring_calls": len(run.steps) // 4,
        "tokens": [t.tolist() for t in run.tokens],  # per item or chunk: [C, T]
        "waveform_samples": [int(np.asarray(w).size) for w in run.waveforms],
        "logits_moments": moments,  # per logits tensor in call order: [mean, std]
        "waveform_rms": rms,  # per waveform: WAVE_BLOCKS block RMS values
        "exact": {machine.numerics_key(): {"logits": logits.hexdigest(), "decoded": decoded.hexdigest(),
                                           "waveform": wave.hexdigest()}},
    }


def record_goldens(model, points=None) -> dict:
    """Stock outputs of `model` (unpatched) at each point: {point: golden}."""
    from harness.parity.parity import POINTS, record_generation

    if getattr(model, "_fastpath_applied", None):
        raise GoldensError("goldens record stock behaviour: call fastpath.revert(model) first")
    return {name: summarise_run(record_generation(model, seed=SEED, **point_kwargs(model, name)))
            for name in (points or POINTS)}


def load_goldens(folder: Path = GOLDENS_DIR) -> dict:
    """{omnivoice version: goldens file content} for every fixtures/goldens/*.json."""
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        out[data["omnivoice"]] = data
    return out


def _token_difference(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"tokens: {len(a)} vs {len(b)} tensors"
    shapes_a = [(len(t), len(t[0]) if t else 0) for t in a]
    shapes_b = [(len(t), len(t[0]) if t else 0) for t in b]
    if shapes_a != shapes_b:
        return f"tokens: shapes {shapes_a} vs {shapes_b}"
    total = sum(r * c for r, c in shapes_a)
    differ = sum(x != y for ta, tb in zip(a, b) for ra, rb in zip(ta, tb) for x, y in zip(ra, rb))
    return f"tokens: {differ}/{total} differ"


def _summary_difference(part: str, observed: list, golden: list) -> str | None:
    """How far a portable summary moved beyond its tolerance, or None within it."""
    if len(observed) != len(golden):
        return f"{part}: {len(observed)} vs {len(golden)} entries"
    for i, (a, b) in enumerate(zip(observed, golden)):
        if len(a) != len(b):
            return f"{part}: entry {i} has {len(a)} vs {len(b)} values"
    tol, worst, where = TOLERANCES[part], 0.0, None
    for i, (a, b) in enumerate(zip(observed, golden)):
        scale = b[1] if part == "logits_moments" and b[1] > 0 else 1.0  # logits: relative to the tensor's std
        for j, (x, y) in enumerate(zip(a, b)):
            if math.isnan(x) or math.isnan(y):  # |x - y| would be NaN, and NaN > worst is False
                if math.isnan(x) and math.isnan(y):
                    continue
                worst, where = math.nan, (i, j)
                break
            change = abs(x - y) / scale
            if change > worst:
                worst, where = change, (i, j)
        if math.isnan(worst):
            break
    if worst <= tol:
        return None
    what = ("tensor {}, {}".format(where[0], ("mean", "std")[where[1]]) if part == "logits_moments"
            else f"waveform {where[0]}, block {where[1]}")
    return f"{part}: moved {worst:.3g} at {what} (tolerance {tol:g})"


def compare_point(observed: dict, golden: dict, key: str | None = None) -> list:
    """The parts of one point that differ (empty: identical), each with a short description. The exact hashes
    are compared when `golden` has them for numerics key `key` (this machine's, by default)."""
    out = []
    for part in EXACT_PARTS:
        if observed.get(part) == golden.get(part):
            continue
        if part == "tokens":
            out.append(_token_difference(observed["tokens"], golden["tokens"]))
        else:
            out.append(f"{part}: {observed.get(part)} vs {golden.get(part)}")
    for part in TOLERANCES:
        if part not in golden:
            out.append(f"{part}: not in the goldens (record them: fastpath-suite maintain goldens --record)")
        else:
            moved = _summary_difference(part, observed[part], golden[part])
            if moved:
                out.append(moved)
    key = key or next(iter(observed["exact"]))
    recorded = golden.get("exact", {}).get(key)
    if recorded:
        out += [f"{part}: sha256 differs (exact, recorded for this machine)" if part in recorded else
                f"{part}: no sha256 recorded for this machine (record them: fastpath-suite maintain goldens --record)"
                for part in HASHED_PARTS if observed["exact"][key][part] != recorded.get(part)]
    return out


def exact_keys(golden_file: dict) -> list:
    """The numerics keys a goldens file holds exact hashes for (every point must have them)."""
    per_point = [set(p.get("exact", {})) for p in golden_file["points"].values()]
    return sorted(set.intersection(*per_point)) if per_point else []


def compare(observed: dict, golden_file: dict) -> dict:
    """{point: [differing parts]} over the points both have; a point missing on one side is reported too."""
    points = golden_file["points"]
    out = {}
    for name in sorted(set(observed) | set(points)):
        if name not in points:
            out[name] = ["not in the goldens"]
        elif name not in observed:
            out[name] = ["not recorded"]
        else:
            out[name] = compare_point(observed[name], points[name])
    return out


def match_versions(observed: dict, goldens: dict) -> dict:
    """{version: {point: [differing parts]}} for every stored goldens file."""
    return {version: compare(observed, data) for version, data in goldens.items()}


def matching(differences: dict) -> list:
    """The versions whose goldens the observed output equals at every point."""
    return sorted(v for v, by_point in differences.items() if not any(by_point.values()))


def environment_notes(observed_env: dict, golden_file: dict) -> list:
    """Why bits may differ besides omnivoice: another torch build, CPU, or other weights."""
    notes = []
    for key in ("torch", "transformers", "tokenizers", "numpy"):
        if golden_file["environment"].get(key) != observed_env.get(key):
            notes.append(f"{key} {observed_env.get(key)} here, {golden_file['environment'].get(key)} in the goldens")
    return notes


def coverage(goldens: dict, key: str) -> str:
    """What a comparison on the machine with numerics key `key` compares: one honest line."""
    exact = sorted(v for v, data in goldens.items() if key in exact_keys(data))
    line = (f"compared on every machine: {', '.join(EXACT_PARTS)} exactly; logits moments and waveform block RMS "
            f"within {TOLERANCES}. ")
    if exact:
        return line + f"Bit-exact logits, decoded audio and waveform hashes also compared (recorded for this " \
                      f"machine, {key}, in {', '.join(exact)})."
    return line + (f"Bit-exact hashes NOT compared: none recorded for this machine ({key}); record them with "
                   f"`fastpath-suite maintain goldens --record`.")


def describe(differences: dict, goldens: dict, observed_env: dict, observed_ckpt: dict | None = None,
             key: str | None = None) -> str:
    """Readable report: what was compared, which versions match, and per version and point what differs."""
    lines = []
    same = matching(differences)
    lines.append(f"stock omnivoice {observed_env.get('omnivoice')} matches the goldens of: "
                 f"{', '.join(same) if same else 'no known version'}")
    if key:
        lines.append(coverage(goldens, key))
    for version, by_point in sorted(differences.items()):
        if version in same:
            continue
        moved = {p: parts for p, parts in by_point.items() if parts}
        lines.append(f"  vs {version}: {len(moved)}/{len(by_point)} points differ")
        for point, parts in moved.items():
            lines.append(f"    {point}: {'; '.join(parts)}")
        notes = environment_notes(observed_env, goldens[version])
        if observed_ckpt and observed_ckpt != weight_digests(goldens[version]):
            notes.append("the tiny checkpoint's weights differ from the ones these goldens were made with")
        if notes:
            lines.append("    (environment differs: " + "; ".join(notes) + ")")
    return "\n".join(lines)


def build_observed(points=None) -> dict:
    """Load the tiny test checkpoint with the installed omnivoice and record its stock goldens file content."""
    import torch

    from harness.model.checkpoint import build_checkpoint, checkpoint_key, load_model

    path = build_checkpoint("tiny")
    model = load_model(path)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    points_out = record_goldens(model, points)
    return {
        "_about": "Stock OmniVoice outputs on the tiny test checkpoint (harness.gate.goldens): portable parts "
                  "(scoring calls, final tokens, waveform lengths; logits moments and waveform block RMS) and, per "
                  "numerics key, sha256 of the per-step logits, the decoded audio and the waveform, float32 bytes.",
        "omnivoice": environment()["omnivoice"],
        "environment": environment(),
        "checkpoint": {"size": "tiny", "key": checkpoint_key("tiny"), **checkpoint_digests(path)},
        "settings": {"num_step": NUM_STEP, "seed": SEED, "device": "cpu", "dtype": "float32", "threads": threads},
        "seconds": round(time.perf_counter() - start, 1),
        "points": points_out,
    }


def write_goldens(data: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    points = data["points"]
    # one line per point keeps the file diffable and small enough to review
    body = {k: v for k, v in data.items() if k != "points"}
    text = json.dumps(body, indent=1, sort_keys=True)[:-2] + ',\n "points": {\n'
    text += ",\n".join(f"  {json.dumps(name)}: {json.dumps(points[name], sort_keys=True)}" for name in sorted(points))
    text += "\n }\n}\n"
    path.write_text(text)
    return path


def merge_goldens(observed: dict, recorded: dict) -> dict:
    """`recorded` with this machine's exact hashes added from `observed`, after checking that the portable parts
    agree at every point (otherwise GoldensError: the behaviour differs, not only the bits)."""
    moved = {name: [d for d in compare_point(observed["points"][name], golden) if "not in the goldens" not in d]
             for name, golden in recorded["points"].items() if name in observed["points"]}
    moved = {name: parts for name, parts in moved.items() if parts}
    missing = sorted(set(recorded["points"]) ^ set(observed["points"]))
    if moved or missing:
        raise GoldensError(f"omnivoice {recorded['omnivoice']}: the portable parts differ from the recorded goldens "
                           f"({moved or ''}{' points ' + str(missing) if missing else ''}); this is a change of "
                           f"behaviour, not of bits: find out why before replacing the file (--replace)")
    merged = json.loads(json.dumps(recorded))
    for name, golden in merged["points"].items():
        ours = observed["points"][name]
        for part in TOLERANCES:
            golden.setdefault(part, ours[part])
        golden.setdefault("exact", {}).update(ours["exact"])
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite maintain goldens", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--record", action="store_true",
                        help=f"add this machine's exact hashes to {GOLDENS_DIR.relative_to(REPO_ROOT)}/<installed "
                             f"omnivoice version>.json (its portable parts must agree), or write it if new")
    parser.add_argument("--replace", action="store_true", help="with --record: overwrite the file instead")
    parser.add_argument("--out", type=Path, default=None, help="also write the observed goldens to this file")
    parser.add_argument("--folder", type=Path, default=GOLDENS_DIR, help="where the known goldens are")
    args = parser.parse_args(argv)

    observed = build_observed()
    if args.out:
        write_goldens(observed, args.out)
    if args.record:
        path = args.folder / f"{observed['omnivoice']}.json"
        data = observed
        if path.exists() and not args.replace:
            try:
                data = merge_goldens(observed, json.loads(path.read_text()))
            except GoldensError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
        write_goldens(data, path)
        print(f"recorded {path} ({observed['seconds']} s; exact hashes for {next(iter(observed['points'].values()))['exact'].keys()})")
        return 0
    goldens = load_goldens(args.folder)
    if not goldens:
        print(f"no goldens in {args.folder}; record them with `fastpath-suite maintain goldens --record`",
              file=sys.stderr)
        return 1
    differences = match_versions(observed["points"], goldens)
    print(describe(differences, goldens, observed["environment"], weight_digests(observed),
                   key=observed["environment"]["numerics_key"]))
    return 0 if matching(differences) else 1


def weight_digests(data: dict) -> dict:
    """The weight-file digests of a goldens file (its cache key differs per omnivoice version; these must not)."""
    return {k: v for k, v in data.get("checkpoint", {}).items() if k.endswith("sha256")}


if __name__ == "__main__":
    raise SystemExit(main())
