"""Describe the machine a speed run was measured on, and derive the key that names its baseline.

Speed numbers are only comparable on the same hardware with the same speed-relevant software, so every baseline
and every run records ``machine_info(device)`` and is filed under ``device_key(info)``.

torch is imported inside the functions, not at module import, and CUDA is only queried when the device asked for
is CUDA, so describing a CPU run never initialises a GPU.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from harness import DISTRIBUTION

# Distributions whose versions are recorded. Only torch and omnivoice enter the device key (see device_key).
RECORDED_PACKAGES = ("torch", "transformers", "omnivoice", DISTRIBUTION)  # DISTRIBUTION: the patches, as installed
KEY_PACKAGES = ("torch", "omnivoice")

# CPU extensions that select other kernels (MKL, oneDNN, CTranslate2 dispatch on them beside torch's own
# capability), as /proc/cpuinfo names them, and the short tag each gets in a key.
KERNEL_EXTENSIONS = {"amx_tile": "amx", "avx512_bf16": "bf16", "avx512_fp16": "fp16", "avx512_vnni": "vnni",
                     "avx_vnni": "avxvnni"}
# Environment variables that cap the instruction set a library uses. Setting the first three to AVX2 on an AVX-512
# machine comes close to an AVX2-only one (docs/machines.md); CT2_FORCE_CPU_ISA does it for the judge.
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA", "MKL_CBWR")


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """CPU model name: /proc/cpuinfo on Linux, sysctl on macOS, else platform.processor()/machine()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5, check=True
            ).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def versions(names=("omnivoice", "torch", "transformers", "tokenizers", "numpy")) -> dict:
    """{distribution: installed version or None}: the software half of every record the harness writes."""
    return {name: package_version(name) for name in names}


def tree_digest(folder, suffixes: tuple | None = None) -> str:
    """sha256 (hex) over the relative paths and bytes of a folder's files (only `suffixes` when given), caches
    left out: the identity of a package's sources."""
    import hashlib

    folder = Path(folder)
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and (suffixes is None or path.suffix in suffixes):
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


THREADS_ENV = "FASTPATH_DEFAULT_THREADS"  # the process's torch threads before a test run divided them (conftest.py)


def started_threads() -> int:
    """The torch thread count this process started with: THREADS_ENV where a test run set it before its xdist
    workers took their share of the threads, else torch's count now."""
    import torch

    return int(os.environ.get(THREADS_ENV) or torch.get_num_threads())


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none): named beside a timing that did not hold."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def summary() -> str:
    """One line for reports: processor, instruction set, cores and threads, system."""
    import torch

    return (f"{cpu_model()} ({isa_tag(cpu_isa())}), {usable_cpus()} usable CPUs of {os.cpu_count()}, "
            f"{torch.get_num_threads()} torch threads, "
            f"{platform.system()} {platform.machine()}")


def cpu_flags() -> list:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return value.split()
    except OSError:
        pass
    return []


def cpu_isa() -> dict:
    """What selects the CPU kernels, and so their rounding and speed: torch's CPU capability (after any
    ATEN_CPU_CAPABILITY cap), the AVX-512 / AMX / VNNI flags of the processor, and the ISA caps set in the
    environment."""
    import torch

    flags = cpu_flags()
    return {
        "capability": str(torch.backends.cpu.get_cpu_capability()).lower(),
        "flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))),
        "extensions": sorted(tag for flag, tag in KERNEL_EXTENSIONS.items() if flag in flags),
        "limits": {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)},
    }


def isa_tag(isa: dict) -> str:
    """`avx512+amx+bf16` or, with caps in the environment, `avx2+amx+...~mkl-avx2~onednn-avx2`: a key part."""
    tag = "+".join([isa["capability"], *isa["extensions"]])
    caps = [f"{name.split('_')[0].lower()}-{value.lower()}" for name, value in sorted(isa["limits"].items())
            if name != "ATEN_CPU_CAPABILITY"]  # that one shows in the capability itself
    return "~".join([tag, *caps])


def numerics_key() -> str:
    """Names what the bits of a CPU fp32 result depend on: processor model, the kernel-selecting ISA (see cpu_isa),
    torch threads and torch build. Exact hashes (goldens) hold only under one such key: MKL takes other code paths
    on AMD and Intel processors of the same capability, and the capability moves every vectorised kernel."""
    import torch

    return (f"{slug(cpu_model())}__{isa_tag(cpu_isa())}__{torch.get_num_threads()}t__"
            f"torch-{slug(torch.__version__)}")


def physical_cores() -> int | None:
    """Physical core count (psutil when installed, else counted from /proc/cpuinfo), None when unknown."""
    try:
        import psutil

        count = psutil.cpu_count(logical=False)
        if count:
            return int(count)
    except ImportError:
        pass
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical_id = value.strip()
                elif key == "core id":
                    core_id = value.strip()
                elif not line.strip() and core_id is not None:
                    cores.add((physical_id or "0", core_id))
                    physical_id = core_id = None
        if core_id is not None:
            cores.add((physical_id or "0", core_id))
    except OSError:
        return None
    return len(cores) or None


def nvidia_driver_version() -> str | None:
    """NVIDIA driver version from nvidia-smi (torch does not expose it), None when unavailable."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[:1]
    return first[0].strip() if first else None


def gpu_info(device: str) -> dict:
    """CUDA details for ``device`` ("cuda", "cuda:1"); only touches CUDA when such a device is asked for."""
    import torch

    info: dict = {"cuda_available": None, "gpu_name": None, "gpu_driver": None, "cuda_version": None,
                  "compute_capability": None, "gpu_uuid": None}
    if not device.startswith("cuda"):
        return info
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["cuda_version"] = torch.version.cuda
    if info["cuda_available"]:
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        info["gpu_name"] = torch.cuda.get_device_name(index)
        info["compute_capability"] = f"{major}.{minor}"
        info["gpu_driver"] = nvidia_driver_version()
        info["gpu_uuid"] = str(getattr(torch.cuda.get_device_properties(index), "uuid", "")) or None
    return info


def placement() -> dict:
    """Which process of a sharded run measured: the pytest-xdist worker (None when not sharded) and the GPUs it was
    given (CUDA_VISIBLE_DEVICES as set, e.g. by `pytest --gpus all`; None when unset). Results carry it, so a
    sharded GPU run says which GPU ran what."""
    return {"worker": os.environ.get("PYTEST_XDIST_WORKER"), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"),
                     proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
    `cpu.cfs_period_us`), None where there is none: a container limited to 2 CPUs on a 16-core host has
    os.cpu_count() == 16 but runs like 2."""
    paths = {"": "/"}
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    except (OSError, ValueError):
        pass
    v2 = [root / paths[""].lstrip("/") / "cpu.max", root / "cpu.max"]
    for path in v2:
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    v1 = paths.get("cpu", "/").lstrip("/")
    for folder in (root / "cpu" / v1, root / "cpu,cpuacct" / v1, root / "cpu", root / "cpu,cpuacct"):
        try:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota <= 0 or period <= 0 else quota / period
    return None


def usable_cpus(limit: float | None = None, affinity: int | None = None) -> int:
    """CPUs this process can use: its affinity mask, capped by the cgroup quota (rounded up)."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit() if limit is None else limit
    return min(affinity, math.ceil(limit)) if limit else affinity


def machine_info(device: str) -> dict:
    """Hardware and software that a speed measurement on ``device`` ("cpu", "cuda", "cuda:0", "mps") depends on.

    Args:
        device: the torch device the run measures. CUDA is queried only when it starts with "cuda".

    Returns a JSON-serialisable dict; fields that cannot be found are None rather than missing.
    """
    import torch

    mps_backend = getattr(torch.backends, "mps", None)
    info = {
        "device": device,
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cpus": usable_cpus(),  # affinity and cgroup quota: what the key counts
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "isa": cpu_isa(),
        "platform": platform.platform(),
        "mps_available": bool(mps_backend.is_available()) if mps_backend is not None else False,
        **gpu_info(device),
        "placement": placement(),
        "python": platform.python_version(),
        "versions": {name: package_version(name) for name in RECORDED_PACKAGES},
    }
    info["versions"]["torch"] = torch.__version__  # keeps the build tag (+cu130, +cpu) that metadata may drop
    return info


describe = machine_info  # extend_machine_info's parameter shadows the function name; this alias keeps it reachable


def slug(text: str) -> str:
    """Lower-case, filename-safe form of ``text``: runs of anything but [a-z0-9.] become one '-'."""
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())  # "Intel(R) Xeon(R)" -> "intel xeon"
    text = re.sub(r"\b(cpu|processor|with radeon graphics)\b", " ", text)
    text = re.sub(r"@.*$", "", text)  # drop the clock suffix "@ 2.20GHz"
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-.") or "unknown"


def device_key(info: dict) -> str:
    """Stable, filename-safe key for the hardware and speed-relevant software in ``info`` (from machine_info).

    CPU:  ``cpu-<model>-<isa tag>-<usable cpus>c-<torch threads>t__torch-<v>__omnivoice-<v>`` (isa_tag: the
          capability, e.g. avx512 or avx2, the kernel-selecting extensions, and ISA caps set in the environment;
          usable cpus: the affinity mask capped by the cgroup quota, so containers limited to 2 and to 16 CPUs on
          one host get different keys; the logical core count for records made before it was recorded)
    CUDA: ``cuda-<gpu name>__torch-<v>__omnivoice-<v>`` (torch's local tag, e.g. +cu130, carries the CUDA build)
    MPS:  ``mps-<cpu model>__torch-<v>__omnivoice-<v>``

    torch threads are in the CPU key because they move CPU speed as much as the core count does. transformers and
    fastpath versions are recorded in the machine info but left out of the key: a change there is what the speed
    tier should catch against the existing baseline, not a reason to start a new one.
    """
    device = str(info.get("device", "cpu"))
    if device.startswith("cuda"):
        if not info.get("gpu_name"):
            raise ValueError(
                f"device {device!r} has no GPU name in the machine info (cuda_available={info.get('cuda_available')}); "
                "run on a machine where torch.cuda.is_available() is True, or measure with device 'cpu'"
            )
        hardware = f"cuda-{slug(info['gpu_name'])}"
    elif device.startswith("mps"):
        hardware = f"mps-{slug(str(info.get('cpu_model', 'apple')))}"
    else:
        cores, threads = info.get("usable_cpus") or info.get("logical_cores"), info.get("torch_threads")
        isa = info.get("isa")
        if not isa:
            raise ValueError("the machine info has no 'isa' (recorded before the CPU capability entered the key); "
                             "measure again to get a key for this machine")
        hardware = f"cpu-{slug(str(info.get('cpu_model', 'unknown')))}-{slug(isa_tag(isa))}-{cores}c-{threads}t"
    versions = info.get("versions", {})
    software = "__".join(f"{name}-{slug(str(versions.get(name) or 'none'))}" for name in KEY_PACKAGES)
    return f"{hardware}__{software}"


def hardware_key(info: dict) -> str:
    """The hardware part of device_key (no package versions): what same-run ratio floors are stored under."""
    return device_key(info).split("__")[0]


def extend_machine_info(machine_info: dict, device: str) -> None:
    """Add our description under ``machine_info["fastpath"]`` (with its ``device_key``), in place.

    Meant for the ``pytest_benchmark_update_machine_info(config, machine_info)`` hook, so pytest-benchmark's JSON
    carries the device key that ``compare`` checks.
    """
    ours = describe(device)
    ours["device_key"] = device_key(ours)
    machine_info["fastpath"] = ours

