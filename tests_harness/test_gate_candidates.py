"""What the version-bump gate takes as a candidate: a fork (a distribution of another name that installs the
`omnivoice` package) is gated and named by its distribution and version; a candidate that cannot be installed or
imported is broken: state could-not-run (no other check could run on it), MUST NOT SHIP, exit 1, with the installer's
own message; never the gate's own error (exit 2).

Each candidate is a wheel built here (no index needed): its own venv, made under the test's folder."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from harness.gate import gate
from harness.gate import candidate as cand

# five venvs and pip installs, about a minute: beyond the default run's budget; .ci/run's controls stage runs them
# on every change
pytestmark = [pytest.mark.slow, pytest.mark.control]


def build_wheel(folder: Path, name: str, version: str, files: dict, requires_python: str | None = None) -> Path:
    """A pure-Python wheel of distribution `name` holding `files` ({path in the wheel: bytes}), with its dist-info
    (METADATA, WHEEL, RECORD with each file's sha256)."""
    stem = name.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += f"Requires-Python: {requires_python}\n" if requires_python else ""
    files = {**files, f"{info}/METADATA": meta.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for path, data in files.items()] + [f"{info}/RECORD,,"]
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name_in_wheel, data in files.items():
            wheel.writestr(name_in_wheel, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def installed_package(extra: dict | None = None) -> dict:
    """This environment's omnivoice package as wheel files, plus `extra` ({path: text}) appended to those files."""
    root = cand.current_env().site
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "omnivoice").rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts}
    for path, text in (extra or {}).items():
        files[path] = files.get(path, b"") + text.encode()
    return files


FORK = ("forked-omnivoice", "9.9.9")
FORK_ADDS = {"omnivoice/utils/common.py": "\n\ndef fork_only():\n    return 'fork'\n"}  # one added function


@pytest.fixture(scope="module")
def fork_wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("fork"), *FORK, installed_package(FORK_ADDS))


def test_a_fork_under_another_distribution_name_is_a_candidate(fork_wheel, venvs):
    """Found by the import package it installs (its RECORD), not by its distribution's name; code in its venv that
    asks importlib.metadata for omnivoice's version reads the fork's, not this environment's."""
    env = cand.prepare(cand.parse_spec(str(fork_wheel)), root=venvs)
    found = env.import_check()
    assert found["ok"], found
    assert (found["distribution"], found["version"]) == FORK, found
    assert Path(found["file"]).resolve().is_relative_to(env.site.resolve()), found
    done = env.run(["-c", "import importlib.metadata as m; print(m.version('omnivoice'))"])
    assert done.stdout.strip() == FORK[1], done.stdout + done.stderr


def test_the_gate_names_a_fork_by_its_distribution_and_version(fork_wheel, prepare_here, tmp_path):
    report = gate.run_gate(str(fork_wheel), "current", tmp_path / "out", checks=("fingerprints",),
                           log=lambda msg: None)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["candidate"]["distribution"] == FORK[0] and report["candidate"]["version"] == FORK[1], report
    assert checks["install"]["status"] == "pass" and "forked-omnivoice 9.9.9" in checks["install"]["summary"]
    assert report["state"] == "incomplete", gate.render_table(report)  # only the fingerprints ran
    assert f"verdict: forked-omnivoice 9.9.9 against omnivoice {report['against']['version']}" in gate.render_table(
        report)
    assert "utils/common.py:fork_only: added [call path not traced" in "\n".join(checks["fingerprints"]["details"])
    assert "1 changed function(s), not traced" in checks["fingerprints"]["summary"], checks["fingerprints"]
    assert "# Upstream gate: forked-omnivoice 9.9.9" in (tmp_path / "out" / "verdict.md").read_text()
    assert gate.render_results(gate.results_figures(report)).startswith("forked-omnivoice `9.9.9` (`")


def not_a_wheel(folder: Path) -> Path:
    path = folder / "omnivoice-9.9.9-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    return path


BROKEN = {
    "corrupt": (not_a_wheel, "is invalid"),  # a file that is no wheel at all
    # a requirement the installer cannot meet
    "requires-python": (lambda folder: build_wheel(folder, "omnivoice", "9.9.9", installed_package(),
                                                   requires_python="<3"), "requires a different Python"),
    # installs, but its module raises on import
    "does-not-import": (lambda folder: build_wheel(folder, "omnivoice", "9.9.9", installed_package(
        {"omnivoice/models/omnivoice.py": "\nraise ImportError('this build needs libfoo')\n"})),
                        "ImportError: this build needs libfoo"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_candidate_that_cannot_be_installed_or_imported_could_not_run(case, prepare_here, tmp_path, capsys):
    make, message = BROKEN[case]
    wheel = make(tmp_path)
    out = tmp_path / "out"
    assert gate.main([str(wheel), "--checks", "fingerprints", "--out", str(out), "--quiet"]) == 1
    printed = capsys.readouterr().out
    assert message in printed, printed  # the installer's (or the import's) own words
    assert "MUST NOT SHIP (the candidate is broken, no check could run on it)" in printed, printed
    report = json.loads((out / "verdict.json").read_text())
    assert (report["state"], report["ship"], report["blocked_by"], report["errors"], report["exit_status"]) == (
        "could-not-run", False, ["install"], [], 1), report
    install = report["checks"][0]
    assert (install["name"], install["status"], install["blocks"]) == ("install", "fail", True), install
    assert [c["status"] for c in report["checks"][1:]] == ["skipped"], report["checks"]
    assert "the candidate is broken" in (out / "verdict.md").read_text()
    assert message in gate.render_results(gate.results_figures(report))  # a results file says why, too
