"""The wheel is the patch package alone, it works outside the checkout, and the layers import downwards only.

Layers, lowest first: fastpath.instance and fastpath.fingerprints (leaves) < the rest of fastpath < harness < the
tiers. Nothing in fastpath imports harness; nothing imports in a circle.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness import DISTRIBUTION, REPO_ROOT
from harness.model.checkpoint import build_checkpoint
from harness.model.points import load_spec

# The wheel's build and script run beside the other tests (pytest.mark.early) at the lowest priority: they take the
# cores the tests leave idle, and do not hold up torch's threads, which wait for each other in every parallel region.
NICE = ["nice", "-n", "19"] if shutil.which("nice") else []
# Hang guards only, not a judgement of speed: at the lowest priority on a busy machine this work has no upper bound
# on its time (a `pip wheel` took over 300 s beside three busy processes); a hang still ends the test.
HANG = 1800
THREE_CHUNKS = load_spec()["texts"]["three"]  # three chunks at 2 s on the tiny checkpoint: the worker is still busy


def release_checks(wheel, folder) -> dict:
    """The release workflow's own check step (.github/workflows/release.yml, "Check them": twine check, the wheel's
    files and name, the tag against the version) run in bash on this wheel, as the runner would: once under the tag
    of the wheel's version, once under another tag. {tag: CompletedProcess}."""
    import yaml

    jobs = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "release.yml").read_text())["jobs"]
    (script,) = [s["run"] for s in jobs["build"]["steps"] if s.get("name") == "Check them"]
    (folder / "dist").mkdir(parents=True)
    shutil.copy(wheel, folder / "dist")
    version = wheel.name.split("-")[1]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(folder), "REF_TYPE": "tag"}
    return {tag: subprocess.run([*NICE, "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=folder,
                                env={**env, "REF_NAME": tag}, capture_output=True, text=True, timeout=HANG)
            for tag in (f"v{version}", "v99.0.0")}


def build_and_use_the_wheel(folder):
    """Build the wheel from a copy of the checkout, unpack it, and run a user's script on it in a fresh interpreter
    outside the checkout: `import fastpath` imports no torch, importing omnivoice after it leaves CUDA uninitialised
    and the OmniVoice class unpatched (a lean import), then load, apply, generate, revert, and a stream left open at
    the exit. One interpreter for both checks: each start costs about 9 s of imports on a 2-core machine. Returns
    the wheel's file names and METADATA, the script's result and what its exit handler saw of the open stream."""
    source = folder / "src"  # a copy: building in the checkout would leave build/ there
    shutil.copytree(REPO_ROOT, source, ignore=lambda d, names: [n for n in names if n in (
        ".git", ".venv", ".cache", "out", "build", "__pycache__") or n.endswith(".egg-info")])
    subprocess.run([*NICE, sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(folder), str(source)], check=True, capture_output=True, timeout=HANG)
    (wheel,) = folder.glob("*.whl")
    release = release_checks(wheel, folder / "release")
    names = zipfile.ZipFile(wheel).namelist()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    unpacked = folder / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    code = (
        "import fastpath, sys\n"
        f"assert fastpath.__file__.startswith({str(unpacked)!r}), fastpath.__file__\n"
        "assert 'torch' not in sys.modules, 'import fastpath imported torch'\n"
        "import torch\n"
        "from omnivoice import OmniVoice\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised'\n"
        "assert not [k for k in vars(OmniVoice) if 'fastpath' in k], 'class patched at import'\n"
        f"model = OmniVoice.from_pretrained({str(build_checkpoint('tiny'))!r})\n"
        "assert fastpath.apply(model) == list(fastpath.LOSSLESS)\n"
        "model.generate(text='Hello.', language='en', num_step=2)\n"
        "assert fastpath.revert(model) == []\n"
        "assert 'harness' not in sys.modules\n"
        "import atexit\n"  # registered before the stream's own exit handler, so it runs after it (last in, first out)
        "atexit.register(lambda: print('at exit: cancelled', stream._cancel.is_set(), 'stopped', stream._stopped.is_set(), "
        "flush=True))\n"
        f"stream = fastpath.stream(model, {THREE_CHUNKS!r}, language='en', num_step=4, audio_chunk_duration=2.0)\n"
        "next(stream)\n"
        "print('ok', flush=True)\n"
    )
    try:
        done = subprocess.run([*NICE, sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=HANG,
                              env={"PYTHONPATH": str(unpacked), "PATH": "/usr/bin:/bin", "HOME": str(folder)})
    except subprocess.TimeoutExpired as err:
        return {"wheel": wheel.name, "names": names, "metadata": metadata, "release": release, "timeout": err.timeout}
    lines = done.stdout.splitlines()
    return {"wheel": wheel.name, "names": names, "metadata": metadata, "release": release, "timeout": None,
            "returncode": done.returncode,
            "ended": "ok" in lines, "at_exit": [line for line in lines if line.startswith("at exit:")],
            "stderr": done.stderr[-3000:]}


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.early.with_args(build_and_use_the_wheel)  # with_args: a lone callable would be decorated
def test_the_wheel_holds_the_patches_and_needs_torch_and_omnivoice_alone(early):
    """The wheel's files and requirements, and a user's script on it (build_and_use_the_wheel; it starts when
    collection ends, beside the other tests)."""
    names, metadata = early["names"], early["metadata"].splitlines()
    # no harness, no tiers: the import package and the distribution's metadata alone
    assert {n.split("/")[0] for n in names} == {"fastpath", early["wheel"].split("-py")[0] + ".dist-info"}, names
    assert f"Name: {DISTRIBUTION}" in metadata, [line for line in metadata if line.startswith("Name:")]
    assert early["wheel"].startswith(DISTRIBUTION.replace("-", "_") + "-"), early["wheel"]
    requires = {(r := Requirement(line.split(":", 1)[1])).name: r for line in metadata
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert sorted(requires) == ["omnivoice", "torch"], requires
    # the omnivoice range it declares is the one pyproject.toml states (what the suite verifies, README)
    assert requires["omnivoice"].specifier == declared()["omnivoice"].specifier, requires["omnivoice"]
    # the release workflow's checks pass on it under its version's tag, and refuse another tag
    (good, ok), (bad, refused) = early["release"].items()
    assert ok.returncode == 0 and "PASSED" in ok.stdout and "ok:" in ok.stdout, (good, ok.stdout, ok.stderr)
    assert refused.returncode != 0 and f"tag {bad} is not the version" in refused.stderr, (bad, refused.stderr)
    if early["timeout"] is not None:
        pytest.fail(f"the script did not exit in {early['timeout']:.0f} s (the hang guard): an open stream held up the "
                    f"interpreter's exit")
    assert early["returncode"] == 0 and early["ended"], early["stderr"]
    # the event, not a duration (a clock here fails on a busy machine with nothing wrong): at the exit, the stream
    # left open was cancelled and its worker left upstream's code before the interpreter went down
    assert early["at_exit"] == ["at exit: cancelled True stopped True"], (early["at_exit"], early["stderr"])


def declared() -> dict:
    """{name: Requirement} of pyproject.toml's [project] dependencies (read without tomllib: Python 3.10)."""
    import re

    block = re.search(r"^dependencies = \[(.*?)^\]", (REPO_ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    return {(r := Requirement(s)).name: r for s in re.findall(r'"([^"]+)"', block)}


def test_the_declared_omnivoice_range_is_what_the_suite_verifies():
    """The wheel's range (checked against the built metadata above) is the versions the goldens cover: every version
    with recorded goldens is inside it, and the newest is its upper bound."""
    from packaging.version import Version

    recorded = sorted(Version(p.stem) for p in (REPO_ROOT / "fixtures" / "goldens").glob("*.json"))
    spec = declared()["omnivoice"].specifier
    assert recorded and all(spec.contains(v) for v in recorded), (str(spec), recorded)
    assert not spec.contains(Version(f"{recorded[-1].major}.{recorded[-1].minor}.{recorded[-1].micro + 1}")), spec


def imports(path, modules) -> set:
    """The first-party modules (of `modules`) a file imports, function-level imports included: `from a import b`
    counts as a.b where that is a module, else as a."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out.update(subs or {node.module})
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out & modules


def module_name(path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_layers_import_downwards_and_nothing_in_a_circle():
    files = {module_name(p): p for root in ("fastpath", "harness") for p in (REPO_ROOT / root).rglob("*.py")}
    graph = {name: imports(path, set(files)) - {name} for name, path in files.items()}
    upward = {name: sorted(m for m in deps if m.startswith("harness")) for name, deps in graph.items()
              if name.startswith("fastpath")}
    assert not any(upward.values()), f"the patches import the harness: {upward}"
    for leaf in ("fastpath.instance", "fastpath.fingerprints"):
        assert not graph[leaf], f"{leaf} must be a leaf, imports {graph[leaf]}"
    # a circle: some module reaches itself through its imports (function-level imports included)
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"import circle through {start}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
