"""Speed baselines on disk, and reading saved runs of either kind into per-point samples.

A baseline is one JSON file per device key, ``baselines/<device_key>.json``::

    {
      "format": "fastpath-speed-baseline",
      "format_version": 1,
      "device_key": "cpu-amd-epyc-avx2-2c-2t__torch-2.14.1__omnivoice-0.2.1",
      "machine": {...machine_info(device)...},
      "created_utc": "2025-01-01T00:00:00+00:00",
      "command": "pytest tests_speed -m slow --save-baseline",
      "commit": "3f2c...",
      "points": {
        "<point name>": {"metric": "rtf", "samples": [0.41, 0.40, ...], "median": 0.405, "iqr": 0.01,
                          "max_slowdown": 0.15, "extra": {...}}
      }
    }

``max_slowdown`` is optional per point (the comparison default applies when it is absent). ``median`` and ``iqr``
are for people reading the file; comparisons always recompute from ``samples``, and loading refuses a file whose
stored median no longer matches its samples (a hand edit).

A *run* is either such a file or a pytest-benchmark ``--benchmark-json`` file; ``read_run`` turns both into a
``SpeedRun`` of ``PointSamples``s. Every problem raises ``BaselineError`` with a message that says how to fix it; nothing is
skipped silently.
"""

from __future__ import annotations

import json
import re
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from scipy import stats


# An instruction-count device key of the older form named the processor's vendor (instructions.device_key).
OLD_KEY = re.compile(r"^(callgrind-[^_]+?)-(?:amd|intel|other|unknown)-(?=[^-_]+__)")


def migrated_key(key):
    """A device key of the older form, which named the processor's vendor (callgrind-3.19.0-amd-avx2__torch-...),
    in today's form (callgrind-3.19.0-avx2__torch-...); any other key as it is."""
    return OLD_KEY.sub(r"\1-", key) if isinstance(key, str) else key


FORMAT = "fastpath-speed-baseline"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)
MEDIAN_REL_TOL = 1e-9


class BaselineError(Exception):
    """A baseline or run file is missing, corrupt, foreign or for another device; the message names the fix."""


@dataclass(frozen=True)
class PointSamples:
    """Raw samples of one operating point (e.g. RTF of one sentence length on one device)."""

    name: str
    metric: str
    samples: tuple[float, ...]
    max_slowdown: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def iqr(self) -> float:
        return float(stats.iqr(self.samples))


@dataclass(frozen=True)
class SpeedRun:
    """One saved measurement: where it came from, which device it was measured on, and its points."""

    source: str
    kind: str  # "baseline" or "pytest-benchmark"
    device_key: str | None
    commit: str | None
    command: str | None
    created_utc: str | None
    points: dict[str, PointSamples]


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """HEAD commit of the git checkout at ``cwd`` (with "-dirty" when there are uncommitted changes), or None."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


# Metrics that are waits, not timings: 0 is a measurement (a device that keeps up with playback never waits), and a
# base median of 0 is compared by its slack (harness.speed.compare): a new median above it, significantly, regresses.
NON_NEGATIVE = {"underrun": 0.1}  # metric -> seconds of median wait allowed where the base never waited


def check_samples(samples: object, where: str, fix: str, metric: str = "rtf") -> tuple[float, ...]:
    """Samples as floats, or BaselineError when they are missing, empty, non-numeric, non-finite, or below the
    metric's domain (timings > 0; the NON_NEGATIVE metrics >= 0)."""
    if not isinstance(samples, (list, tuple)):
        raise BaselineError(f"{where}: 'samples' is {type(samples).__name__}, expected a list of numbers. {fix}")
    if not samples:
        raise BaselineError(f"{where}: 'samples' is empty, so there is nothing to compare against. {fix}")
    bad = [s for s in samples if isinstance(s, bool) or not isinstance(s, (int, float))]
    if bad:
        raise BaselineError(f"{where}: 'samples' holds non-numbers {bad[:3]!r}. {fix}")
    values = tuple(float(s) for s in samples)
    if metric in NON_NEGATIVE:
        bad = [v for v in values if not math.isfinite(v) or v < 0]
        kind, rule = "negative", f"a {metric} (seconds waited) must be a finite number >= 0"
    else:
        bad = [v for v in values if not math.isfinite(v) or v <= 0]
        kind, rule = "non-positive", "a timing must be a positive finite number"
    if bad:
        raise BaselineError(f"{where}: 'samples' holds {len(bad)} non-finite or {kind} value(s), e.g. {bad[0]!r}; "
                            f"{rule}. {fix}")
    return values


def check_max_slowdown(value: object, where: str, fix: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BaselineError(f"{where}: 'max_slowdown' is {value!r}, expected a finite number >= 0 or null. {fix}")
    return float(value)


def check_extra(value: object, where: str, fix: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BaselineError(f"{where}: 'extra' is {type(value).__name__}, expected an object or null. {fix}")
    return dict(value)


def baseline_points(data: dict, source: str, fix: str) -> dict[str, PointSamples]:
    """Validated points of a baseline-format dict."""
    raw = data.get("points")
    if not isinstance(raw, dict) or not raw:
        raise BaselineError(f"{source}: 'points' is missing or empty, so nothing can be compared. {fix}")
    points = {}
    for name, entry in raw.items():
        where = f"{source}: point {name!r}"
        if not isinstance(entry, dict):
            raise BaselineError(f"{where} is {type(entry).__name__}, expected an object with 'samples'. {fix}")
        if "samples" not in entry:
            raise BaselineError(f"{where} has no 'samples'; raw samples are needed for the test. {fix}")
        samples = check_samples(entry["samples"], where, fix, str(entry.get("metric", "rtf")))
        point = PointSamples(
            name=name,
            metric=str(entry.get("metric", "rtf")),
            samples=samples,
            max_slowdown=check_max_slowdown(entry.get("max_slowdown"), where, fix),
            extra=check_extra(entry.get("extra"), where, fix),
        )
        stored = entry.get("median")
        if stored is not None and not math.isclose(stored, point.median, rel_tol=MEDIAN_REL_TOL):
            raise BaselineError(
                f"{where}: stored median {stored!r} does not match its samples (median {point.median!r}); "
                f"the file was edited by hand. {fix}"
            )
        points[name] = point
    return points


def benchmark_points(data: dict, source: str) -> dict[str, PointSamples]:
    """Points of a pytest-benchmark JSON dict.

    Name: ``extra_info["point"]`` when the test set it, else the benchmark's ``name``.
    PointSamples: ``extra_info["rtf_samples"]`` (metric "rtf") when present, else ``extra_info["samples"]`` (metric
    ``extra_info["metric"]``, default "seconds": a test's own timings), else the raw timings ``stats["data"]``
    (metric "seconds"). ``extra_info["max_slowdown"]`` overrides the default factor for that point.
    """
    fix = (
        "Write the run with pytest --benchmark-json=PATH (which keeps raw samples), or with --benchmark-save "
        "together with --benchmark-save-data."
    )
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise BaselineError(f"{source}: pytest-benchmark file has no benchmarks; the run measured nothing. {fix}")
    points: dict[str, PointSamples] = {}
    for bench in benchmarks:
        extra = dict(bench.get("extra_info") or {})
        name = str(extra.pop("point", None) or bench.get("name") or "")
        where = f"{source}: benchmark {name!r}"
        if not name:
            raise BaselineError(f"{source}: a benchmark has neither extra_info['point'] nor a name. {fix}")
        if name in points:
            raise BaselineError(f"{where} appears twice; give each operating point its own extra_info['point'].")
        if "rtf_samples" in extra:
            metric, samples = "rtf", extra.pop("rtf_samples")
        elif "samples" in extra:  # a test's own timings of another metric (e.g. a CUDA forward, in seconds)
            metric, samples = str(extra.pop("metric", "seconds")), extra.pop("samples")
        else:
            metric, samples = "seconds", (bench.get("stats") or {}).get("data")
            if samples is None:
                raise BaselineError(f"{where} has neither extra_info['rtf_samples'] nor stats['data']. {fix}")
        points[name] = PointSamples(
            name=name,
            metric=metric,
            samples=check_samples(samples, where, fix, metric),
            max_slowdown=check_max_slowdown(extra.pop("max_slowdown", None), where, fix),
            extra=extra,
        )
    return points


def read_run(data: object, source: str = "<dict>") -> SpeedRun:
    """A ``SpeedRun`` from a parsed baseline file or pytest-benchmark JSON file; BaselineError for anything else."""
    if not isinstance(data, dict):
        raise BaselineError(
            f"{source} holds a JSON {type(data).__name__}, not an object; it is neither a fastpath speed baseline "
            "nor a pytest-benchmark --benchmark-json file. Pass one of those."
        )
    if data.get("format") == FORMAT:
        fix = "Re-create the baseline (see the speed tier's --save-baseline option)."
        check_format_version(data, source, fix)
        return SpeedRun(
            source=source, kind="baseline", device_key=data.get("device_key"), commit=data.get("commit"),
            command=data.get("command"), created_utc=data.get("created_utc"),
            points=baseline_points(data, source, fix),
        )
    if "benchmarks" in data and "machine_info" in data:
        ours = (data.get("machine_info") or {}).get("fastpath") or {}
        return SpeedRun(
            source=source, kind="pytest-benchmark", device_key=ours.get("device_key"),
            commit=(data.get("commit_info") or {}).get("id"), command=None, created_utc=data.get("datetime"),
            points=benchmark_points(data, source),
        )
    raise BaselineError(
        f"{source} is not a fastpath speed baseline (format={data.get('format')!r}, expected {FORMAT!r}) nor a "
        "pytest-benchmark --benchmark-json file (no 'benchmarks'/'machine_info'). Pass one of those."
    )


def check_format_version(data: dict, source: str, fix: str) -> None:
    version = data.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise BaselineError(
            f"{source} has format_version {version!r}; this fastpath reads {list(SUPPORTED_FORMAT_VERSIONS)}. "
            f"Use the fastpath version that wrote it, or {fix[0].lower()}{fix[1:]}"
        )


def read_json(path: Path, fix: str) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{path} does not exist. {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BaselineError(f"{path} cannot be read ({err}). {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BaselineError(
            f"{path} is not valid JSON ({err}); the file is truncated or corrupt. "
            f"Restore it (git checkout -- {path}) or {fix[0].lower()}{fix[1:]}"
        ) from None


def load_run(path: str | os.PathLike) -> SpeedRun:
    """Read a baseline or pytest-benchmark JSON file into a ``SpeedRun``."""
    path = Path(path)
    return read_run(read_json(path, "Pass a baseline file or a pytest-benchmark --benchmark-json file."), str(path))


# A device key is "<hardware>__torch-<v>__omnivoice-<v>" (harness.run.machine.device_key): a baseline is used only
# where all three parts match, since each of them changes the speed (the card or CPU; the kernels torch brings, its CUDA
# build in its local tag; the code that runs). Everything else a machine info holds is recorded, not matched: the
# driver, clocks, the host, Python, transformers, the fastpath commit.


def near_misses(device_key: str, folder: str | os.PathLike) -> list[str]:
    """The stored baselines in `folder` for the same hardware as `device_key` but other software, each as "NAME
    (torch-2.11.0-cu130 where this machine has torch-2.14.1-cu130)": why none of them is this machine's."""
    hardware, *software = device_key.split("__")
    out = []
    for path in sorted(Path(folder).glob(f"{hardware}__*.json")):
        _, *theirs = path.stem.split("__")
        differ = [f"{t} where this machine has {o}" for t, o in zip(theirs, software) if t != o]
        if differ and len(theirs) == len(software):
            out.append(f"{path.name} ({', '.join(differ)})")
    return out


def absent_message(path: Path, device_key: str) -> str:
    """What is missing when no baseline is stored for this device key, with the near misses that do not count."""
    near = near_misses(device_key, path.parent)
    return (f"no speed baseline for this machine ({device_key}) at {path}"
            + (f"; the same hardware has only {'; '.join(near)}, which another software does not compare with"
               if near else ""))


def load_baseline(path: str | os.PathLike, expected_device_key: str, create_command: str) -> dict:
    """Read and validate the baseline at ``path`` for this machine; returns the parsed file.

    Args:
        path: ``baselines/<device_key>.json``.
        expected_device_key: ``device_key(machine_info(device))`` of the machine measuring now.
        create_command: the command that (re)creates this baseline, quoted in every error message.

    Raises BaselineError, naming the fix, when the file is missing, not JSON or truncated, not a baseline,
    of an unsupported format_version, for another device key, or has missing/empty/non-finite samples.
    """
    path = Path(path)
    if not path.exists():
        what = absent_message(path, expected_device_key)
        raise BaselineError(f"{what[0].upper()}{what[1:]}. Create it on this machine with: {create_command}")
    fix = f"Re-create it on this machine with: {create_command}"
    data = read_json(path, fix)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise BaselineError(
            f"{path} is not a fastpath speed baseline (format={found!r}, expected {FORMAT!r}); "
            f"a foreign file is in the baselines folder. Move it away and {fix[0].lower()}{fix[1:]}"
        )
    check_format_version(data, str(path), fix)
    found_key = data.get("device_key")
    if found_key != expected_device_key:
        raise BaselineError(
            f"{path} is for device key {found_key!r}, but this machine is {expected_device_key!r}; speed "
            f"numbers only compare on the same hardware and software. {fix}"
        )
    baseline_points(data, str(path), fix)
    return data


def add_points(path: str | os.PathLike, *, device_key: str, machine: dict, points: dict, command: str) -> dict:
    """`save_baseline` of `points` together with the points already in the file at `path` (read strictly, same
    device key): each test records its own points without dropping the others'."""
    kept = {}
    if Path(path).exists():
        kept = {name: {k: v for k, v in entry.items() if k in ("metric", "samples", "max_slowdown", "extra")}
                for name, entry in load_baseline(path, device_key, command)["points"].items()}
    new = {}
    for name, entry in points.items():  # a re-saved point keeps its reviewed max_slowdown unless it brings one
        old = kept.get(name, {}).get("max_slowdown")
        new[name] = {**entry, "max_slowdown": old} if entry.get("max_slowdown") is None and old is not None else entry
    return save_baseline(path, device_key=device_key, machine=machine, points={**kept, **new}, command=command)


def save_baseline(
    path: str | os.PathLike,
    *,
    device_key: str,
    machine: dict,
    points: dict[str, dict],
    command: str,
    commit: str | None = None,
    created_utc: str | None = None,
) -> dict:
    """Write a baseline atomically (temp file in the same folder, fsync, rename); returns what was written.

    Args:
        path: destination, normally ``baselines/<device_key>.json``; parent folders are created.
        device_key: ``device_key(machine)``.
        machine: ``machine_info(device)`` of the measuring machine.
        points: ``{name: {"samples": [...], "metric": "rtf", "max_slowdown": 0.15 or None, "extra": {...}}}``;
            only "samples" is required. Median and IQR are computed here.
        command: the command that produced the samples (recorded, and quoted by later errors).
        commit: source commit; defaults to ``git_commit()`` of the current directory.
        created_utc: ISO timestamp; defaults to now.

    Invalid samples raise BaselineError before anything is written.
    """
    path = Path(path)
    fix = "Fix the measurement before saving it as a baseline."
    body = {}
    for name, entry in points.items():
        where = f"point {name!r}"
        metric = str(entry.get("metric", "rtf"))
        samples = check_samples(entry.get("samples"), where, fix, metric)
        point = PointSamples(name=name, metric=metric, samples=samples)
        body[name] = {
            "metric": point.metric,
            "samples": list(samples),
            "median": point.median,
            "iqr": point.iqr,
            "max_slowdown": check_max_slowdown(entry.get("max_slowdown"), where, fix),
            "extra": check_extra(entry.get("extra"), where, fix),
        }
    if not body:
        raise BaselineError(f"No points to save to {path}. {fix}")
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "device_key": device_key,
        "machine": machine,
        "created_utc": created_utc or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "commit": commit if commit is not None else git_commit(),
        "points": body,
    }
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")
    return data


def write_atomic(path: Path, text: str) -> None:
    """Write text to path through a temp file beside it (fsync, rename): a killed job leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; baselines and histories are shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
