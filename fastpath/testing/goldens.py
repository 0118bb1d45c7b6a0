"""Goldens: what stock OmniVoice computes on the tiny test checkpoint, recorded per omnivoice version.

For each parity operating point (`parity.POINTS`) at `NUM_STEP` = 8 unmasking steps and seed 0, a golden keeps
the final tokens, a sha256 of the waveform bytes (float32), and a sha256 of the per-step conditional and
unconditional logits (float32 bytes, in call order: the `Run` of `parity.record_generation`). They are stored in
`fixtures/goldens/<omnivoice version>.json`. Comparing the installed version's stock output with every stored
file says which known version it behaves like, and per point which parts moved.

8 steps instead of the default 32: the schedule, scoring and sampling code all run the same way, at a quarter
of the time. The saved-prompt point uses the prompt in memory (no save/load round trip, which omnivoice < 0.2.1
lacks): goldens are about generation, the file round trip is the parity tier's business.

Bit-identical logits need the same torch build and CPU kernels; each file records its environment and a
mismatch there is reported as a possible cause.

    python -m fastpath.testing.goldens            # compare the installed omnivoice's stock output with the goldens
    python -m fastpath.testing.goldens --record   # write fixtures/goldens/<installed version>.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

from fastpath.testing.checkpoint import REPO_ROOT

GOLDENS_DIR = REPO_ROOT / "fixtures" / "goldens"
NUM_STEP = 8
SEED = 0
PARTS = ("scoring_calls", "tokens", "logits", "waveform")  # what is compared per point


class GoldensError(RuntimeError):
    """Goldens cannot be recorded or compared; the message names the fix."""


def environment() -> dict:
    out = {}
    for name in ("omnivoice", "torch", "transformers", "tokenizers", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["machine"] = f"{platform.machine()} {cpu_name()}"
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def checkpoint_identity(path: Path) -> dict:
    """Which weights the goldens were made with: digests of the two weight files."""
    return {"model_sha256": file_sha256(path / "model.safetensors"),
            "audio_tokenizer_sha256": file_sha256(path / "audio_tokenizer" / "model.safetensors")}


def point_kwargs(model, name: str) -> dict:
    """generate() kwargs of a parity point at NUM_STEP steps; the saved-prompt point gets its prompt in memory."""
    from fastpath.testing.parity import POINTS, REF_3S

    kwargs = dict(POINTS[name], num_step=NUM_STEP)
    if kwargs.get("voice_clone_prompt") == "ref_3s":
        kwargs["voice_clone_prompt"] = model.create_voice_clone_prompt(ref_audio=REF_3S[0], ref_text=REF_3S[1])
    return kwargs


def summarise_run(run) -> dict:
    """One point's golden: final tokens, sha256 of the logits and of the waveform (float32 bytes)."""
    import numpy as np
    import torch

    logits = hashlib.sha256()
    for name, tensor in run.steps:
        if name.endswith("logits"):  # c_logits, u_logits: [1, C, T, V]
            logits.update(tensor.to(torch.float32).contiguous().numpy().tobytes())
    wave = hashlib.sha256()
    for w in run.waveforms:
        wave.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
    return {
        "scoring_calls": len(run.steps) // 4,
        "tokens": [t.tolist() for t in run.tokens],  # per item or chunk: [C, T]
        "logits": logits.hexdigest(),
        "waveform": wave.hexdigest(),
        "waveform_samples": [int(np.asarray(w).size) for w in run.waveforms],
    }


def record_goldens(model, points=None) -> dict:
    """Stock outputs of `model` (unpatched) at each point: {point: golden}."""
    from fastpath.testing.parity import POINTS, record_generation

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


def compare_point(observed: dict, golden: dict) -> list:
    """The parts of one point that differ (empty: identical), each with a short description."""
    out = []
    for part in PARTS:
        if observed.get(part) == golden.get(part):
            continue
        if part == "tokens":
            out.append(_token_difference(observed["tokens"], golden["tokens"]))
        elif part == "scoring_calls":
            out.append(f"scoring_calls: {observed.get(part)} vs {golden.get(part)}")
        else:
            out.append(f"{part}: sha256 differs")
    return out


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
    for key in ("torch", "transformers", "tokenizers", "numpy", "machine"):
        if golden_file["environment"].get(key) != observed_env.get(key):
            notes.append(f"{key} {observed_env.get(key)} here, {golden_file['environment'].get(key)} in the goldens")
    return notes


def describe(differences: dict, goldens: dict, observed_env: dict, observed_ckpt: dict | None = None) -> str:
    """Readable report: which versions match, and per version and point what differs."""
    lines = []
    same = matching(differences)
    lines.append(f"stock omnivoice {observed_env.get('omnivoice')} matches the goldens of: "
                 f"{', '.join(same) if same else 'no known version'}")
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

    from fastpath.testing.checkpoint import build_checkpoint, checkpoint_key, load_model

    path = build_checkpoint("tiny")
    model = load_model(path)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    points_out = record_goldens(model, points)
    return {
        "_about": "Stock OmniVoice outputs on the tiny test checkpoint (fastpath.testing.goldens): final tokens, "
                  "sha256 of the per-step logits and of the waveform, float32 bytes.",
        "omnivoice": environment()["omnivoice"],
        "environment": environment(),
        "checkpoint": {"size": "tiny", "key": checkpoint_key("tiny"), **checkpoint_identity(path)},
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastpath.testing.goldens", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--record", action="store_true",
                        help=f"write {GOLDENS_DIR.relative_to(REPO_ROOT)}/<installed omnivoice version>.json")
    parser.add_argument("--out", type=Path, default=None, help="also write the observed goldens to this file")
    parser.add_argument("--folder", type=Path, default=GOLDENS_DIR, help="where the known goldens are")
    args = parser.parse_args(argv)

    observed = build_observed()
    if args.out:
        write_goldens(observed, args.out)
    if args.record:
        path = write_goldens(observed, args.folder / f"{observed['omnivoice']}.json")
        print(f"recorded {path} ({observed['seconds']} s)")
        return 0
    goldens = load_goldens(args.folder)
    if not goldens:
        print(f"no goldens in {args.folder}; record them with `python -m fastpath.testing.goldens --record`",
              file=sys.stderr)
        return 1
    differences = match_versions(observed["points"], goldens)
    print(describe(differences, goldens, observed["environment"], weight_digests(observed)))
    return 0 if matching(differences) else 1


def weight_digests(data: dict) -> dict:
    """The weight-file digests of a goldens file (its cache key differs per omnivoice version; these must not)."""
    return {k: v for k, v in data.get("checkpoint", {}).items() if k.endswith("sha256")}


if __name__ == "__main__":
    raise SystemExit(main())
