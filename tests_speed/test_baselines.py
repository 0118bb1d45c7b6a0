"""Baseline files and machine keys: round trip, atomic writes, and a BaselineError naming the fix for every bad input.

No model is loaded; these run in a few seconds on CPU.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from pathlib import Path

import pytest

from harness import DISTRIBUTION
from harness.run.machine import device_key, extend_machine_info, machine_info
from harness.speed import baselines
from harness.speed.baselines import (
    BaselineError,
    load_baseline,
    load_run,
    save_baseline,
)

REPO = Path(__file__).resolve().parents[1]
CREATE = "pytest tests_speed -m slow --save-baseline"
KEY = "cpu-test-cpu-2c-2t__torch-2.0.0__omnivoice-0.2.1"
MACHINE = {"device": "cpu", "cpu_model": "Test CPU", "logical_cores": 2, "torch_threads": 2,
           "versions": {"torch": "2.0.0", "omnivoice": "0.2.1"}}
POINTS = {
    "short": {"samples": [0.41, 0.40, 0.43, 0.39, 0.42, 0.40], "metric": "rtf", "extra": {"chars": 40}},
    "long": {"samples": [0.30, 0.31, 0.29, 0.30, 0.32, 0.30], "max_slowdown": 0.2},
}


def write_baseline(path: Path) -> dict:
    return save_baseline(path, device_key=KEY, machine=MACHINE, points=POINTS, command=CREATE, commit="abc123")


def test_add_points_keeps_the_other_points_and_replaces_its_own(tmp_path):
    path = tmp_path / f"{KEY}.json"
    baselines.add_points(path, device_key=KEY, machine=MACHINE, points=POINTS, command=CREATE)  # a new file
    new = {"long": {"samples": [0.5] * 6, "metric": "rtf"}, "stream/ttfa": {"samples": [2.0] * 6, "metric": "ttfa"}}
    baselines.add_points(path, device_key=KEY, machine=MACHINE, points=new, command=CREATE)
    points = load_baseline(path, KEY, CREATE)["points"]
    assert sorted(points) == ["long", "short", "stream/ttfa"]
    assert points["short"]["samples"] == POINTS["short"]["samples"] and points["short"]["extra"] == {"chars": 40}
    assert points["long"]["samples"] == [0.5] * 6 and points["stream/ttfa"]["metric"] == "ttfa"
    with pytest.raises(BaselineError):  # another machine's file is never merged into
        baselines.add_points(path, device_key="cpu-other", machine=MACHINE, points=new, command=CREATE)


def test_round_trip_keeps_samples_and_metadata(tmp_path):
    path = tmp_path / "baselines" / f"{KEY}.json"
    written = write_baseline(path)
    loaded = load_baseline(path, KEY, CREATE)
    assert loaded == written
    assert loaded["format"] == baselines.FORMAT and loaded["format_version"] == baselines.FORMAT_VERSION
    assert loaded["command"] == CREATE and loaded["commit"] == "abc123" and loaded["machine"] == MACHINE
    for name, entry in POINTS.items():
        point = loaded["points"][name]
        assert point["samples"] == entry["samples"]
        assert point["median"] == pytest.approx(statistics.median(entry["samples"]))
        q1, _, q3 = statistics.quantiles(entry["samples"], n=4, method="inclusive")  # numpy's default "linear"
        assert point["iqr"] == pytest.approx(q3 - q1)
    assert loaded["points"]["long"]["max_slowdown"] == 0.2 and loaded["points"]["short"]["max_slowdown"] is None
    assert loaded["points"]["short"]["extra"] == {"chars": 40}
    assert [p.name for p in tmp_path.joinpath("baselines").iterdir()] == [path.name], "temp file left behind"


def test_save_is_atomic_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / f"{KEY}.json"
    write_baseline(path)
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(baselines.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_baseline(path)
    assert path.read_bytes() == before, "a failed save changed the existing baseline"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "temp file left behind"


@pytest.mark.parametrize(
    "samples, phrase",
    [([], "empty"), ([0.4, float("nan")], "non-finite"), ([0.4, -1.0], "non-positive"), (["0.4"], "non-numbers"),
     (None, "expected a list")],
    ids=["empty", "nan", "negative", "string", "missing"],
)
def test_save_refuses_bad_samples_before_writing(tmp_path, samples, phrase):
    path = tmp_path / "b.json"
    with pytest.raises(BaselineError, match=phrase) as info:
        save_baseline(path, device_key=KEY, machine=MACHINE, points={"p": {"samples": samples}}, command=CREATE)
    assert "Fix the measurement" in str(info.value)
    assert not path.exists()


def set_field(key, value):
    def mutate(path: Path, data: dict) -> None:
        data[key] = value
        path.write_text(json.dumps(data))
    return mutate


def set_point_field(key, value):
    def mutate(path: Path, data: dict) -> None:
        data["points"]["short"][key] = value
        path.write_text(json.dumps(data))  # json writes NaN for float("nan"), as a hand edit might
    return mutate


def drop_point_field(key):
    def mutate(path: Path, data: dict) -> None:
        del data["points"]["short"][key]
        path.write_text(json.dumps(data))
    return mutate


BAD_FILES = [
    pytest.param(lambda path, data: path.unlink(), ["No speed baseline", KEY], id="missing-file"),
    pytest.param(lambda path, data: path.write_text(path.read_text()[: len(path.read_text()) // 2]),
                 ["not valid JSON", "truncated", "git checkout"], id="truncated"),
    pytest.param(lambda path, data: path.write_text(""), ["not valid JSON"], id="empty-file"),
    pytest.param(lambda path, data: path.write_text("[1, 2]"), ["not a fastpath speed baseline"], id="json-list"),
    pytest.param(lambda path, data: path.write_text(json.dumps({"machine_info": {}, "benchmarks": []})),
                 ["not a fastpath speed baseline", "format=None", "foreign"], id="pytest-benchmark-file"),
    pytest.param(set_field("format", "someone-elses-format"), ["'someone-elses-format'", "foreign"],
                 id="foreign-format"),
    pytest.param(set_field("format_version", 2), ["format_version 2", "reads [1]"], id="newer-version"),
    pytest.param(set_field("device_key", "cuda-nvidia-h200__torch-2.0.0__omnivoice-0.2.1"),
                 ["'cuda-nvidia-h200__torch-2.0.0__omnivoice-0.2.1'", f"this machine is '{KEY}'"], id="other-device"),
    pytest.param(set_field("points", {}), ["'points' is missing or empty"], id="no-points"),
    pytest.param(drop_point_field("samples"), ["'short'", "no 'samples'"], id="no-samples"),
    pytest.param(set_point_field("samples", []), ["'short'", "'samples' is empty"], id="empty-samples"),
    pytest.param(set_point_field("samples", [0.4, float("nan"), 0.41]), ["'short'", "non-finite"], id="nan-sample"),
    pytest.param(set_point_field("samples", [0.4, float("inf")]), ["non-finite"], id="inf-sample"),
    pytest.param(set_point_field("samples", [0.4, "fast"]), ["non-numbers"], id="string-sample"),
    pytest.param(set_point_field("median", 0.1), ["stored median 0.1", "edited by hand"], id="edited-median"),
    pytest.param(set_point_field("max_slowdown", -0.5), ["'max_slowdown' is -0.5"], id="negative-factor"),
]


@pytest.mark.parametrize("corrupt, phrases", BAD_FILES)
def test_bad_baseline_raises_error_naming_the_fix(tmp_path, corrupt, phrases):
    path = tmp_path / f"{KEY}.json"
    corrupt(path, write_baseline(path))
    with pytest.raises(BaselineError) as info:
        load_baseline(path, KEY, CREATE)
    message = str(info.value)
    assert CREATE in message, f"the fix (the create command) is missing from: {message}"
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} missing from: {message}"


def test_load_run_rejects_foreign_json(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(BaselineError, match="nor a pytest-benchmark --benchmark-json file"):
        load_run(path)


def test_machine_info_describes_cpu_without_touching_cuda():
    import torch

    info = machine_info("cpu")
    json.dumps(info)  # must be storable in a baseline
    assert info["cpu_model"] and info["logical_cores"] == os.cpu_count()
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["versions"]["torch"] == torch.__version__ and info["python"]
    assert set(info["versions"]) >= {"torch", "transformers", "omnivoice", DISTRIBUTION}
    assert info["versions"][DISTRIBUTION], "the patches' own distribution is not found installed"
    assert info["gpu_name"] is None and info["cuda_available"] is None
    assert not torch.cuda.is_initialized(), "describing a CPU run initialised CUDA"


def test_device_key_is_stable_filename_safe_and_tracks_speed_relevant_fields():
    info = machine_info("cpu")
    key = device_key(info)
    assert key == device_key(machine_info("cpu")), "key changed between two calls on one machine"
    assert re.fullmatch(r"[a-z0-9._-]+", key), f"not filename-safe: {key}"
    assert key.startswith("cpu-") and "torch-" in key and "omnivoice-" in key, key

    def changed(**fields) -> str:
        other = json.loads(json.dumps(info))
        for name, value in fields.items():
            if name in ("torch", "omnivoice", "transformers"):
                other["versions"][name] = value
            else:
                other[name] = value
        return device_key(other)

    assert changed(torch="9.9.9+cu999") != key
    assert changed(omnivoice="9.9.9") != key
    assert changed(torch_threads=97) != key
    assert changed(usable_cpus=97) != key
    assert changed(logical_cores=97, usable_cpus=None) != key  # a record made before usable_cpus: logical cores
    assert changed(cpu_model="Other CPU") != key
    assert changed(transformers="9.9.9") == key, "transformers moved the key; it is recorded, not keyed"


@pytest.mark.parametrize("files, cgroup, limit", [
    ({"cpu.max": "200000 100000\n"}, "0::/\n", 2.0),  # cgroup v2 at the root
    ({"job/cpu.max": "150000 100000\n"}, "0::/job\n", 1.5),  # v2, the process's own cgroup
    ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # v2 without a quota
    ({"cpu/docker/x/cpu.cfs_quota_us": "1600000\n", "cpu/docker/x/cpu.cfs_period_us": "100000\n"},
     "4:cpu,cpuacct:/docker/x\n", 16.0),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "4:cpu,cpuacct:/\n", None),  # v1 none
], ids=["v2-root", "v2-own", "v2-max", "v1", "v1-none"])
def test_cgroup_cpu_limits_are_read(tmp_path, files, cgroup, limit):
    from harness.run.machine import cgroup_cpu_limit

    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "self-cgroup").write_text(cgroup)
    assert cgroup_cpu_limit(tmp_path, tmp_path / "self-cgroup") == limit


def test_containers_limited_to_2_and_to_16_cpus_on_one_host_get_different_keys():
    from harness.run.machine import usable_cpus

    info = machine_info("cpu")
    host = dict(info, logical_cores=64)
    two = device_key(dict(host, usable_cpus=usable_cpus(limit=2.0, affinity=64)))
    sixteen = device_key(dict(host, usable_cpus=usable_cpus(limit=16.0, affinity=64)))
    assert two != sixteen and "-2c-" in two and "-16c-" in sixteen, (two, sixteen)
    assert usable_cpus(limit=None, affinity=8) == 8 and usable_cpus(limit=1.5, affinity=8) == 2
    assert info["usable_cpus"] == usable_cpus()


def test_device_key_for_cuda_uses_the_gpu_and_refuses_a_missing_one():
    gpu = {"device": "cuda", "gpu_name": "NVIDIA H200", "versions": {"torch": "2.14.1+cu130", "omnivoice": "0.2.1"}}
    assert device_key(gpu) == "cuda-nvidia-h200__torch-2.14.1-cu130__omnivoice-0.2.1"
    with pytest.raises(ValueError, match="torch.cuda.is_available"):
        device_key({**gpu, "gpu_name": None, "cuda_available": False})


def test_extend_machine_info_adds_ours_under_fastpath():
    pytest_benchmark_info = {"node": "x", "cpu": {"brand_raw": "y"}}
    extend_machine_info(pytest_benchmark_info, "cpu")
    ours = pytest_benchmark_info["fastpath"]
    assert pytest_benchmark_info["node"] == "x", "pytest-benchmark's own fields were touched"
    assert ours["device"] == "cpu" and ours["device_key"] == device_key(machine_info("cpu"))


def test_reads_a_real_pytest_benchmark_json(pytester, monkeypatch):
    """SpeedRun pytest-benchmark for real (pytester, in this process: torch is imported once) with the machine-info
    hook, then read its --benchmark-json."""
    pytester.makeconftest("""
        from harness.run.machine import extend_machine_info

        def pytest_benchmark_update_machine_info(config, machine_info):
            extend_machine_info(machine_info, "cpu")
    """)
    pytester.makepyfile(test_points="""
        def test_rtf(benchmark):
            benchmark.extra_info["point"] = "cpu-short"
            benchmark.extra_info["rtf_samples"] = [0.40, 0.41, 0.39, 0.42, 0.40, 0.41]
            benchmark.extra_info["max_slowdown"] = 0.15
            benchmark.pedantic(sum, args=([1, 2],), rounds=6)

        def test_plain(benchmark):
            benchmark.pedantic(sum, args=([1, 2],), rounds=7)
    """)
    out = pytester.path / "run.json"
    # in an xdist worker of a sharded run, pytest-benchmark would read the worker's name and time nothing
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--benchmark-json={out}",
                                          "test_points.py")
    assert result.ret == 0, result.stdout.str()
    run = load_run(out)
    assert run.kind == "pytest-benchmark"
    assert run.device_key == device_key(machine_info("cpu"))
    assert sorted(run.points) == ["cpu-short", "test_plain"]
    rtf = run.points["cpu-short"]
    assert rtf.metric == "rtf" and rtf.samples == (0.40, 0.41, 0.39, 0.42, 0.40, 0.41) and rtf.max_slowdown == 0.15
    plain = run.points["test_plain"]
    assert plain.metric == "seconds" and len(plain.samples) == 7 and all(s > 0 for s in plain.samples)


def test_every_stored_baseline_has_a_key_the_key_function_produces_from_its_machine():
    """A file whose device key device_key() no longer produces from the file's own machine info never matches a
    run again (a key from before the instruction set entered it): the slow gate would skip on those machines."""
    files = sorted((REPO / "baselines").glob("c*-*.json"))
    assert files, "no per-device baselines found"
    wrong = []
    for path in files:
        data = json.loads(path.read_text())
        if data.get("format") != baselines.FORMAT:
            continue
        try:
            key = device_key(data["machine"])
        except ValueError as err:
            wrong.append(f"{path.name}: {err}")
            continue
        if key != data["device_key"] or path.stem != key:
            wrong.append(f"{path.name}: recorded key {data['device_key']}, its machine gives {key}")
    assert not wrong, "stale baselines (re-measure on that machine, or remove):\n  " + "\n  ".join(wrong)
