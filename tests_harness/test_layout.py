"""The harness's rooms: one folder per job, each importing only the folders below it (pyproject.toml's
[tool.importlinter] layers contract, checked by import-linter), every module in a room, every room documented."""

from __future__ import annotations

import ast
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


# A dynamic import is one import-linter cannot see: importlib.import_module(...) or __import__(...), however imported
# or renamed. Its target is the literal it is given; for any other argument, every string constant of the module that
# names a harness module ("harness.room.module", or "module:function" as a table of them holds), and an f-string's
# literal head ("harness.{name}": any module under it).
HARNESS_NAME = re.compile(r"harness(\.\w+)+")


def layers() -> list:
    """[(names, independent)] top first: the contract's lines, each a list of modules ('|': independent, ':' not)."""
    return [([n.strip() for n in re.split(r"[|:]", line)], ":" not in line) for line in contract_layers()]


def placed(module: str, contract: list) -> tuple | None:
    """(layer index, the contract's name) of the layer module that holds `module`; None when none does."""
    for i, (names, _) in enumerate(contract):
        for name in names:
            if module == name or module.startswith(name + "."):
                return i, name
    return None


def dynamic_targets(source: str) -> list:
    """[(line, target)] of the dynamic imports of one module's source (see above); a target ending in '.' is any
    module under that name."""
    tree = ast.parse(source)
    aliases = {"import_module", "__import__"}
    aliases |= {a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "importlib"
                for a in node.names if a.name == "import_module" and a.asname}
    named = [(node.lineno, node.value.split(":")[0]) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and HARNESS_NAME.fullmatch(node.value.split(":")[0]) and node.value.count(":") <= 1]
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in aliases:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append((node.lineno, arg.value))
        elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            head = arg.values[0].value
            if head.startswith("harness."):
                found.append((node.lineno, head))
        else:
            found += named
    return sorted(set(found))


def dynamic_imports_up(root: Path) -> list:
    """'importer -> target (file:line)' for each dynamic import under root/harness/ that the layers contract forbids:
    a target in a layer above the importer's, or in another module of an independent layer (a target 'harness.x.'
    reaches every module under it)."""
    contract = layers()
    out = []
    for path in sorted((root / "harness").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        importer = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        here = placed(importer, contract)
        for line, target in dynamic_targets(path.read_text()):
            if not target.startswith("harness."):
                continue
            reach = [m for m in (placed(name, contract) for names, _ in contract for name in names)
                     if target.endswith(".") and (m[1] + ".").startswith(target)] or [placed(target, contract)]
            for there in filter(None, reach):
                up = here is None or there[0] < here[0]
                beside = here is not None and there[0] == here[0] and there[1] != here[1] and contract[here[0]][1]
                if up or beside:
                    out.append(f"{importer} -> {target.rstrip('.')} ({rel}.py:{line})")
                    break
    return out


def test_no_dynamic_import_runs_up_the_layers():
    """The contract at run time too: import-linter sees only import statements, so a room that imports a room above
    it by name (importlib) keeps the contract KEPT while the arrow runs up (the results renderer once did, for every
    kind; now each room hands its renderers over)."""
    found = dynamic_imports_up(REPO_ROOT)
    assert not found, "dynamic imports the layers contract forbids:\n  " + "\n  ".join(found)


PLANTED = {  # room module -> (a planted dynamic import, what the check must name), each written another way
    "run/results.py": ("import importlib\n\ndef planted():\n    return importlib.import_module('harness.gate.gate')\n",
                       "harness.run.results -> harness.gate.gate"),
    "model/codec.py": ("def planted():\n    return __import__('harness.speed.bench')\n",
                       "harness.model.codec -> harness.speed.bench"),
    "parity/parity.py": ("from importlib import import_module as load\nTABLE = {'x': 'harness.audit.mutants:render_results'}"
                         "\n\ndef planted(kind):\n    return load(TABLE[kind].split(':')[0])\n",
                         "harness.parity.parity -> harness.audit.mutants"),
    "run/progress.py": ("import importlib\n\ndef planted(room):\n    return importlib.import_module(f'harness.{room}')\n",
                        "harness.run.progress -> harness"),
    "gate/goldens.py": ("import importlib\n\ndef planted():\n    return importlib.import_module('harness.serving.serving')\n",
                        "harness.gate.goldens -> harness.serving.serving"),  # a room beside it on an independent line
}


@pytest.mark.parametrize("module", sorted(PLANTED))
def test_a_dynamic_import_up_is_caught_naming_it(tmp_path, monkeypatch, module):
    """The known-worse control: a copy of harness/ with one dynamic import planted against the contract (up, or
    beside on an independent line), each written a way a stranger would: importlib, __import__, a renamed
    import_module fed from a table, an f-string."""
    shutil.copytree(HARNESS, tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "harness" / module
    code, named = PLANTED[module]
    path.write_text(path.read_text() + "\n\n" + code)
    found = dynamic_imports_up(tmp_path)
    assert [f for f in found if f.startswith(named + " (")] and len(found) == 1, found


def test_every_module_lives_in_a_room_the_contract_places():
    flat = sorted(p.name for p in HARNESS.glob("*.py") if p.name not in TOP)
    assert not flat, f"modules on harness/'s floor outside any room: {flat}; move each into the room of its job"
    placed = {name for layer in contract_layers() for name in re.split(r"[|:]", layer)}
    placed = {name.strip() for name in placed}
    missing = [room for room in rooms() if f"harness.{room}" not in placed]
    assert not missing, f"rooms the import contract does not place in a layer: {missing} (pyproject.toml)"
    top = {f"harness.{Path(name).stem}" for name in TOP - {"__init__.py"}}
    first = contract_layers()[:2]  # the command line, then the jobs that span rooms
    assert set("|".join(first).replace(" ", "").split("|")) == top, first


@pytest.mark.parametrize("room", rooms())
def test_every_room_says_its_job_and_its_page_names_the_room(room):
    doc = (HARNESS / room / "__init__.py").read_text()
    pages = re.findall(r"docs/([\w-]+\.md)", doc)
    assert pages, f"harness/{room}/__init__.py does not name its page in docs/"
    for page in pages:
        text = (REPO_ROOT / "docs" / page).read_text()
        assert f"harness/{room}/" in text, f"docs/{page} does not name the folder harness/{room}/"
