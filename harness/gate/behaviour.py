"""What stock OmniVoice computes, over a grid of settings that reaches every path, compared exactly between two
omnivoice versions run on the same machine in the same job (the version-bump gate's `behaviour` check).

Grid: every parity point (auto voice, design, clone from audio and from a prompt object, a mixed batch, chunked
long text, one word, a non-verbal tag, Chinese, digits) at 8 steps, and variations of the sampler and the
pipeline: class_temperature > 0 (the top-k path), position_temperature 0 and higher, guidance scales, t_shift,
layer penalty, denoise off, a reference text without final punctuation, a fixed duration, a speed, 16 steps,
other seeds. Recorded per setting: every scoring call's
conditional and unconditional logits, predicted tokens, scores and unmasking order (positions by score, stable),
the final tokens, the target lengths, the decoder's audio and the waveforms (logits whole for the first KEEP_LOGITS calls of a setting,
as a sha256 after). Compared bit for bit; the report names the setting, the scoring call (generation pass, step,
item) and the first differing element.

    fastpath-suite maintain behaviour OUT.pt       # record the installed omnivoice's behaviour on the tiny checkpoint
    fastpath-suite maintain behaviour OUT.pt --device cuda --dtype bf16   # ... where a service runs it (the gate's --device)

On CUDA the recording runs in deterministic settings (torch.use_deterministic_algorithms, a fixed cuBLAS
workspace, TF32 and cudnn.benchmark off), so two versions' records compare bit for bit; a release whose change shows
only in bf16 on CUDA (0.2.1 fixed flex attention running in fp32 under bf16) is seen only there. A record says its
device and dtype, and records of another device or dtype are refused rather than compared.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

from harness.model.devices import DTYPE_NAMES, torch_dtype

NUM_STEP = 8
SEED = 0
KEEP_LOGITS = 1  # scoring calls of a setting whose logits are kept whole (where a change shows first); later: sha256
PARTS = ("c_logits", "u_logits", "pred_tokens", "scores", "order")

# name -> (parity point, generate overrides, seed)
GRID = {
    **{point: (point, {}, SEED) for point in (
        "auto_voice", "voice_design", "voice_clone_audio", "voice_clone_prompt", "batch_of_3", "long_chunked",
        "one_word", "nonverbal_tag", "chinese", "digits")},
    "auto_voice/class_temperature=1.0": ("auto_voice", {"class_temperature": 1.0}, SEED),
    "batch_of_3/class_temperature=0.7": ("batch_of_3", {"class_temperature": 0.7}, SEED),
    "auto_voice/position_temperature=0": ("auto_voice", {"position_temperature": 0.0}, SEED),
    "auto_voice/position_temperature=10": ("auto_voice", {"position_temperature": 10.0}, SEED),
    "auto_voice/guidance_scale=0": ("auto_voice", {"guidance_scale": 0.0}, SEED),
    "auto_voice/guidance_scale=3.5": ("auto_voice", {"guidance_scale": 3.5}, SEED),
    "auto_voice/t_shift=0.5": ("auto_voice", {"t_shift": 0.5}, SEED),
    "auto_voice/layer_penalty_factor=0": ("auto_voice", {"layer_penalty_factor": 0.0}, SEED),
    "voice_clone_audio/denoise=False": ("voice_clone_audio", {"denoise": False}, SEED),
    # a reference text without final punctuation: upstream adds it (add_punctuation) before encoding the prompt
    "voice_clone_audio/ref_text_unpunctuated": ("voice_clone_audio", {"ref_text": lambda kw: kw["ref_text"][:-1]},
                                                SEED),
    "auto_voice/duration=2.5": ("auto_voice", {"duration": 2.5}, SEED),
    "auto_voice/speed=1.3": ("auto_voice", {"speed": 1.3}, SEED),
    "voice_design/num_step=16": ("voice_design", {"num_step": 16}, SEED),
    "auto_voice/seed=1": ("auto_voice", {}, 1),
    "voice_clone_audio/seed=2": ("voice_clone_audio", {}, 2),
}


def from_run(run) -> dict:
    """A setting's record from `parity.record_generation`'s run: every scoring call named by generation pass, step and
    item (upstream scores item by item within a step) with its predicted tokens, scores and unmasking order, and its
    logits whole for the first KEEP_LOGITS calls, as a sha256 after (the grid's record is 130 MB, not 500 MB: a
    400 MB torch.save failed once mid-write here); then the final tokens, target lengths, the decoder's audio of each
    chunk or item and the waveforms."""
    import numpy as np
    import torch

    steps = dict(run.steps)
    calls = []
    for n in range(len(run.steps) // 4):
        p, (items, first) = next((i, pass_) for i, pass_ in reversed(list(enumerate(run.passes))) if pass_[1] <= n)
        step, item = divmod(n - first, items)
        scores = steps[f"call {n} scores"]
        call = {"where": f"pass {p} step {step} item {item}", "pred_tokens": steps[f"call {n} pred_tokens"],
                "scores": scores, "order": torch.argsort(scores.flatten().float(), descending=True, stable=True)}
        for key in ("c_logits", "u_logits"):
            logits = steps[f"call {n} {key}"]
            call[key] = logits if n < KEEP_LOGITS else digest(logits)
        calls.append(call)
    return {"calls": calls, "tokens": run.tokens, "target_lens": [int(t.shape[-1]) for t in run.tokens],
            "decoded": [torch.from_numpy(d) for d in run.decoded],
            "waveforms": [torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)) for w in run.waveforms]}


def record_setting(model, name: str) -> dict:
    """One setting's record (from_run), or {'error': text} when it raised. A raise is no behaviour: compare() does
    not compare it, and raised() names it (in one version: a difference; in both: the check could not run)."""
    from harness.gate.goldens import point_kwargs
    from harness.parity.parity import record_generation

    point, overrides, seed = GRID[name]
    try:
        kwargs = {**point_kwargs(model, point), "postprocess_output": False}
        kwargs.update({k: v(kwargs) if callable(v) else v for k, v in overrides.items()})
        return from_run(record_generation(model, seed=seed, **kwargs))
    except Exception as err:  # noqa: BLE001 - a refused setting is a behaviour too
        return {"error": f"{type(err).__name__}: {err}"}


DTYPES = tuple(DTYPE_NAMES)  # fp32, bf16, fp16 (harness.model.devices)
DEVICES = ("cpu", "cuda")
# setting -> {"device" or "device/dtype": why the setting cannot run there}. Empty: no setting is known to fail
# where the gate runs the grid. A setting listed for the device and dtype a grid ran on that raised in both versions
# leaves the check not run whole (INCOMPLETE); any other setting that raised in both versions is an ERROR.
CANNOT_RUN: dict = {}


def cannot_run(name: str, device: str, dtype: str) -> str | None:
    """Why the grid says setting `name` cannot run on `device` in `dtype` (CANNOT_RUN), or None."""
    table = CANNOT_RUN.get(name, {})
    return table.get(f"{device}/{dtype}") or table.get(device)


def deterministic(device: str) -> None:
    """What makes a CUDA run repeat itself bit for bit (a fresh process: before its first cuBLAS call)."""
    import os

    import torch

    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def record(path: str | Path, names=None, device: str = "cpu", dtype: str = "fp32") -> None:
    """Record the grid with the installed omnivoice on the tiny test checkpoint, on `device` in `dtype`, into `path`
    (torch.save)."""
    import importlib.metadata as md

    import torch

    from harness.model.checkpoint import build_checkpoint, load_model

    deterministic(device)
    model = load_model(build_checkpoint("tiny"), device=device, dtype=torch_dtype(dtype))
    with tracing() as calls:
        settings = {n: record_setting(model, n) for n in names or GRID}
    out = {"omnivoice": md.version("omnivoice"), "device": device, "dtype": dtype, "settings": settings, **calls}
    torch.save(out, path)


def where(record_: dict) -> tuple:
    """(device, dtype) a record was made on (records from before the option: the CPU in fp32)."""
    return record_.get("device", "cpu"), record_.get("dtype", "fp32")


@contextlib.contextmanager
def tracing():
    """Which omnivoice functions the grid runs ('path/in/package.py:qualname'): 'called', all of them, and
    'under_patched', those running while a function a patch relies on is on the stack (what the patches rely on
    transitively). sys.setprofile, removed on exit."""
    import omnivoice

    from fastpath.registry import relied_on

    root = str(Path(omnivoice.__file__).parent) + "/"
    relied = set(relied_on())
    called, under = set(), set()

    def name_of(code):
        return f"{code.co_filename[len(root):]}:{code.co_qualname}"

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        name = name_of(frame.f_code)
        called.add(name)
        back = frame.f_back
        while back is not None:
            if back.f_code.co_filename.startswith(root) and back.f_code.co_qualname in relied:
                under.add(name)
                break
            back = back.f_back

    out = {}
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield out
    finally:
        sys.setprofile(previous)
        out.update(called=sorted(called), under_patched=sorted(under))


def digest(tensor) -> str:
    """sha256 of a tensor's shape, dtype and bytes."""
    import hashlib

    t = tensor.detach().contiguous().cpu()
    return hashlib.sha256(f"{tuple(t.shape)} {t.dtype}".encode() + t.numpy().tobytes()).hexdigest()


def bits(tensor):
    """The tensor's elements as integers of the same width (complex: real and imaginary parts apart): equal bits
    are equal values, a NaN equals the same NaN and 0.0 differs from -0.0, which torch.equal and != get backwards."""
    import torch

    t = tensor.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_floating_point():
        return t
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_number(a, b) -> bool:
    """Plain numbers compared as the tensors are: NaN equals NaN, 0.0 differs from -0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def first_difference(a, b) -> str | None:
    """None when equal bit for bit (a NaN equal to the same NaN; 0.0 and -0.0 differ); else shapes, or the first
    differing element, how many and how far (for a digest, only that it differs)."""
    import torch

    if isinstance(a, str) or isinstance(b, str):
        return None if a == b else "sha256 differs (whole logits kept for the first KEEP_LOGITS calls only)"
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    differ = bits(a) != bits(b)
    if a.is_complex():
        differ = differ.any(dim=-1)
    if not differ.any():
        return None
    index = tuple(int(i) for i in torch.nonzero(differ)[0])
    text = f"first at {index}: {a[index].item()} vs {b[index].item()}; {int(differ.sum())} of {a.numel()} differ"
    if a.is_floating_point():
        gap = (a[differ].double() - b[differ].double()).abs()
        finite = gap[torch.isfinite(gap)]
        text += f", max |diff| {finite.max().item() if finite.numel() else float('nan'):.3g}"
        odd = int((~torch.isfinite(gap)).sum())
        text += f" ({odd} with a NaN or inf on a side)" if odd else ""
    return text


def compare(against: dict, candidate: dict) -> dict:
    """{setting: [differences in order]} for every setting that differs, a setting that raised in one version only
    included; a setting that raised in both is left out (raised() names it: an empty dict is identical behaviour
    only where raised() is empty too). Every field a record holds is compared, whatever its name (the top-level
    RECORD_META aside): a field added to from_run is compared without a change here (tests_harness/test_behaviour.py
    changes each field alone)."""
    if where(against) != where(candidate):
        raise ValueError(f"behaviour records of different runs: {'/'.join(where(against))} against "
                         f"{'/'.join(where(candidate))}; record both with the same --device and --dtype")
    out = {}
    for name in sorted(set(against["settings"]) | set(candidate["settings"])):
        a, c = against["settings"].get(name), candidate["settings"].get(name)
        if a is None or c is None:
            diffs = ["recorded by one version only"]
        elif "error" in a and "error" in c:
            continue  # neither version ran it: nothing to compare (raised() names it; the check is not a pass)
        elif "error" in a or "error" in c:
            side, text = ("the --against version", a["error"]) if "error" in a else ("the candidate", c["error"])
            diffs = [f"raised in {side} only: {text}"]
        else:
            diffs = compare_setting(a, c)
        if diffs:
            out[name] = diffs
    return out


def raised(against: dict, candidate: dict) -> dict:
    """{setting: {"against": error or None, "candidate": error or None, "cannot_run": CANNOT_RUN's reason or None}}
    for every setting that raised in either version (or that one version did not record: "not recorded"): none of
    them is compared bit for bit. In one version it is a difference (compare names it); in both, the check could not
    run it, whether the two errors are equal or not."""
    device, dtype = where(candidate)
    out = {}
    for name in sorted(set(against["settings"]) | set(candidate["settings"])):
        a, c = (record["settings"].get(name, {"error": "not recorded"}).get("error") for record in (against, candidate))
        if a is not None or c is not None:
            out[name] = {"against": a, "candidate": c, "cannot_run": cannot_run(name, device, dtype)}
    return out


# a record's top level besides "settings": the version, where it ran (compare refuses another), and the call trace,
# which marks fingerprint changes (harness.gate.gate.package_changes): not behaviour
RECORD_META = ("omnivoice", "device", "dtype", "called", "under_patched")


def compare_setting(a: dict, c: dict) -> list:
    """Differences between two records of one setting: the scoring calls in order up to the first that differs
    (later calls follow from it), then every other field."""
    diffs = [f"{key}: recorded by one version only" for key in sorted(set(a) ^ set(c))]
    calls_a, calls_c = a.get("calls", []), c.get("calls", [])
    if len(calls_a) != len(calls_c):
        diffs.append(f"scoring calls: {len(calls_a)} vs {len(calls_c)}")
    for n, (x, y) in enumerate(zip(calls_a, calls_c)):
        where = f" ({x['where']})" if x.get("where") else ""
        if x.get("where") != y.get("where"):
            diffs.append(f"scoring call {n} where: {x.get('where')} vs {y.get('where')}")
        for part in [p for p in PARTS if p in x or p in y] + sorted((set(x) | set(y)) - set(PARTS) - {"where"}):
            d = field_difference(x.get(part), y.get(part))
            if d:
                diffs.append(f"scoring call {n}{where} {part}: {d}")
        if diffs:
            break  # later calls follow from the first difference
    for key in sorted((set(a) & set(c)) - {"calls"}):
        x, y = a[key], c[key]
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y):
                diffs.append(f"{key}: {len(x)} vs {len(y)}")
            for i, (u, v) in enumerate(zip(x, y)):
                d = field_difference(u, v)
                if d:
                    diffs.append(f"{key}[{i}]: {d}")
        else:
            d = field_difference(x, y)
            if d:
                diffs.append(f"{key}: {d}")
    return diffs


def field_difference(a, b) -> str | None:
    """first_difference for tensors and digests; same_number for plain numbers; equality for anything else."""
    import torch

    if isinstance(a, (str, torch.Tensor)) or isinstance(b, (str, torch.Tensor)):
        if a is None or b is None:
            return f"{'absent' if a is None else 'present'} vs {'absent' if b is None else 'present'}"
        return first_difference(a, b)
    return None if same_number(a, b) else f"{a!r} vs {b!r}"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fastpath-suite maintain behaviour", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("out", type=Path, help="file the record is written to (torch.save), e.g. out/behaviour.pt")
    parser.add_argument("--settings", nargs="+", default=None, choices=sorted(GRID), metavar="NAME",
                        help="record only these grid settings (default: the whole grid)")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where the grid runs (CUDA: deterministic)")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="the model's dtype")
    args = parser.parse_args(argv)
    record(args.out, args.settings, args.device, args.dtype)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
