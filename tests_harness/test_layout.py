"""The harness's rooms: one folder per job, each importing only the folders below it (pyproject.toml's
[tool.importlinter] layers contract, checked by import-linter), every module in a room, every room documented."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT

HARNESS = REPO_ROOT / "harness"
TOP = {"__init__.py", "__main__.py", "report.py", "gpu_check.py", "release.py"}  # the command line, cross-room jobs


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    tool = Path(sys.executable).parent / "lint-imports"
    assert tool.exists(), f"{tool} is missing: import-linter is in the test group (bash scripts/install.sh)"
    return subprocess.run([str(tool), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


def rooms() -> list:
    return sorted(p.name for p in HARNESS.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def contract_layers() -> list:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    block = re.search(r"layers = \[(.*?)\]", text.partition("\n[tool.importlinter]\n")[2], re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def test_no_room_imports_a_room_above_it_and_no_import_runs_in_a_circle():
    done = lint_imports(REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout, done.stdout


def test_an_import_running_back_up_fails_the_contract(tmp_path):
    """The known-worse control: the same contract on a copy of harness/ with one planted arrow back up (the
    results file importing the gate) must be broken, naming that import."""
    shutil.copytree(HARNESS, tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    contract = (REPO_ROOT / "pyproject.toml").read_text().partition("\n[tool.importlinter]\n")[2]
    (tmp_path / "pyproject.toml").write_text("[tool.importlinter]\n" + contract)
    results = tmp_path / "harness" / "run" / "results.py"
    results.write_text(results.read_text() + "\n\ndef planted():\n    from harness.gate import gate\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0 and "harness.run.results -> harness.gate.gate" in done.stdout, done.stdout


def test_every_module_lives_in_a_room_the_contract_places():
    flat = sorted(p.name for p in HARNESS.glob("*.py") if p.name not in TOP)
    assert not flat, f"modules on harness/'s floor outside any room: {flat}; move each into the room of its job"
    placed = {name for layer in contract_layers() for name in re.split(r"[|:]", layer)}
    placed = {name.strip() for name in placed}
    missing = [room for room in rooms() if f"harness.{room}" not in placed]
    assert not missing, f"rooms the import contract does not place in a layer: {missing} (pyproject.toml)"
    top = {f"harness.{Path(name).stem}" for name in TOP - {"__init__.py"}}
    assert set(contract_layers()[0].replace(" ", "").split("|")) == top, contract_layers()[0]


@pytest.mark.parametrize("room", rooms())
def test_every_room_says_its_job_and_its_page_names_the_room(room):
    doc = (HARNESS / room / "__init__.py").read_text()
    pages = re.findall(r"docs/([\w-]+\.md)", doc)
    assert pages, f"harness/{room}/__init__.py does not name its page in docs/"
    for page in pages:
        text = (REPO_ROOT / "docs" / page).read_text()
        assert f"harness/{room}/" in text, f"docs/{page} does not name the folder harness/{room}/"
