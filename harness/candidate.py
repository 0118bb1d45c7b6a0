"""An omnivoice candidate in its own virtual environment, sharing everything else with this one.

`prepare(parse_spec("omnivoice==0.2.0"))` makes `.cache/gate/omnivoice-0.2.0/venv` with `python -m venv
--without-pip`, installs the candidate into it with this interpreter's pip (`pip --python VENV/bin/python
install --no-deps`), then adds a .pth file that appends this environment's site-packages *after* the venv's
own. So torch, transformers, pytest and fastpath come from here and only omnivoice differs. The candidate is
installed before the .pth exists, so pip never sees (or touches) this environment's packages; requirements the
candidate declares and this environment lacks are installed into the venv afterwards.

A candidate is `omnivoice==X` (from the package index), a `.whl` file, or a source folder holding `omnivoice/`
(copied in as is; an `omnivoice-*.dist-info` beside it gives its version, else it is `0+local`). `current` is
this environment itself, nothing is made.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness import REPO_ROOT
from harness.checkpoint import cache_dir
from harness.machine import tree_digest

MAIN_SITE = Path(sysconfig.get_paths()["purelib"])
UPSTREAM_FILE = Path("omnivoice") / "models" / "omnivoice.py"
PTH_NAME = "zz_fastpath_shared_site.pth"
HOW = "pass omnivoice==X.Y.Z, a path to an omnivoice .whl, a folder holding omnivoice/, or 'current'"


class CandidateError(RuntimeError):
    """The candidate cannot be found or installed; the message names the fix."""


@dataclass(frozen=True)
class Spec:
    text: str  # as given on the command line
    kind: str  # "current" | "index" | "wheel" | "source"
    target: str  # requirement, wheel path or package folder
    name: str  # folder name under .cache/gate/


def package_folder(folder: Path) -> Path | None:
    """The omnivoice package inside a source folder (folder/omnivoice, or the folder itself), or None."""
    for pkg in (folder / "omnivoice", folder):
        if (pkg / "__init__.py").is_file() and (pkg / "models" / "omnivoice.py").is_file():
            return pkg
    return None


def parse_spec(text: str) -> Spec:
    if text == "current":
        return Spec(text, "current", "", "current")
    if text.startswith("omnivoice=="):
        version = text.split("==", 1)[1].strip()
        if not version:
            raise CandidateError(f"{text!r} names no version; {HOW}")
        return Spec(text, "index", f"omnivoice=={version}", f"omnivoice-{version}")
    path = Path(text).expanduser()
    if path.suffix == ".whl":
        if not path.is_file():
            raise CandidateError(f"wheel {path} does not exist; {HOW}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]  # a rebuilt wheel of the same name is new
        return Spec(text, "wheel", str(path.resolve()), f"{path.stem}-{digest}")
    if path.is_dir():
        pkg = package_folder(path)
        if pkg is None:
            raise CandidateError(f"{path} holds no omnivoice package (omnivoice/__init__.py and "
                                 f"omnivoice/models/omnivoice.py); {HOW}")
        digest = tree_digest(pkg)[:12]
        return Spec(text, "source", str(pkg.resolve()), f"src-{path.resolve().name}-{digest}")
    raise CandidateError(f"cannot read candidate {text!r}; {HOW}")


@dataclass
class Env:
    spec: Spec
    python: Path
    site: Path  # the site-packages that holds this environment's omnivoice
    notes: tuple = ()

    @property
    def upstream_file(self) -> Path:
        return self.site / UPSTREAM_FILE

    def run(self, args, *, extra_env=None, timeout=None, log: Path | None = None) -> subprocess.CompletedProcess:
        """Run this environment's python with `args` in the repo root (fastpath importable from it)."""
        env = dict(os.environ, PYTHONNOUSERSITE="1", **(extra_env or {}))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        done = subprocess.run([str(self.python), *map(str, args)], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"$ {self.python} {' '.join(map(str, args))}\n# exit {done.returncode}\n"
                           f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        return done

    def import_check(self) -> dict:
        """{'ok': True, 'version', 'file'} when `import omnivoice.models.omnivoice` works here, else the error."""
        # the distribution first: a candidate without one is refused before the import (about 8 s here)
        code = ("import json, importlib.metadata as m, pathlib\n"
                "d = m.distribution('omnivoice')\n"
                "info = {'version': d.version, 'file': '', 'dist': str(d.locate_file(''))}\n"
                f"if pathlib.Path(info['dist']).resolve() == pathlib.Path({str(self.site)!r}).resolve():\n"
                "    import omnivoice.models.omnivoice as o\n"
                "    info['file'] = o.__file__\n"
                "print(json.dumps(info))\n")
        done = self.run(["-c", code], timeout=600)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
            return {"ok": False, "error": lines[-1] if lines else f"exit {done.returncode}",
                    "traceback": done.stderr[-4000:]}
        info = json.loads(done.stdout.strip().splitlines()[-1])
        if info["file"] and not Path(info["file"]).resolve().is_relative_to(self.site.resolve()):
            return {"ok": False, "error": f"omnivoice imported from {info['file']}, not from {self.site}: the "
                                          f"candidate is shadowed; delete {self.site.parent.parent.parent} and rerun",
                    "traceback": ""}
        if Path(info["dist"]).resolve() != self.site.resolve():
            return {"ok": False, "error": f"no distribution named omnivoice in {self.site} (its version would be read "
                                          f"from {info['dist']}, this environment's {info['version']}): give a "
                                          f"candidate whose metadata names it omnivoice (Name: omnivoice in its "
                                          f"dist-info METADATA)", "traceback": ""}
        return {"ok": True, **info}


def current_env() -> Env:
    try:
        dist = metadata.distribution("omnivoice")
    except metadata.PackageNotFoundError as err:
        raise CandidateError("omnivoice is not installed in this environment; bash scripts/install.sh") from err
    return Env(parse_spec("current"), Path(sys.executable), Path(dist.locate_file("")))


def _pip(python: Path, *args) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise CandidateError(f"`{' '.join(cmd)}` failed:\n{done.stderr[-3000:]}\nFix: check the candidate "
                             f"name and that the package index is reachable")


def _venv_site(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def _copy_source(spec: Spec, site: Path) -> None:
    pkg = Path(spec.target)
    shutil.copytree(pkg, site / "omnivoice", ignore=shutil.ignore_patterns("__pycache__"))
    infos = sorted(pkg.parent.glob("omnivoice-*.dist-info")) if pkg.name == "omnivoice" else []
    if infos:
        shutil.copytree(infos[-1], site / infos[-1].name)
    else:
        info = site / "omnivoice-0+local.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omnivoice\nVersion: 0+local\n")


def _install_missing_requirements(python: Path) -> tuple:
    """Install what the candidate requires and this environment lacks; returns what was installed."""
    code = (
        "import json, importlib.metadata as m\n"
        "from packaging.requirements import Requirement\n"
        "missing = []\n"
        "for text in m.requires('omnivoice') or []:\n"
        "    r = Requirement(text)\n"
        "    if r.marker and not r.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    try:\n"
        "        ok = r.specifier.contains(m.version(r.name), prereleases=True)\n"
        "    except m.PackageNotFoundError:\n"
        "        ok = False\n"
        "    if not ok:\n"
        "        missing.append(str(r))\n"
        "print(json.dumps(missing))\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise CandidateError(f"cannot read the candidate's requirements:\n{done.stderr[-2000:]}")
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    if missing:
        _pip(python, "install", *missing)
    return tuple(missing)


def prepare(spec: Spec, root: Path | None = None, fresh: bool = False) -> Env:
    """The candidate's environment, made once per candidate (reused while its spec and content are the same)."""
    if spec.kind == "current":
        return current_env()
    folder = (root or cache_dir() / "gate") / spec.name
    python = folder / "venv" / "bin" / "python"
    marker = folder / "candidate.json"
    if not fresh and marker.is_file() and python.exists():
        made = json.loads(marker.read_text())
        if made.get("spec") == spec.name and made.get("main_site") == str(MAIN_SITE):
            return Env(spec, python, Path(made["site"]), tuple(made.get("notes", ())))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    site = _venv_site(python)
    if spec.kind == "source":
        _copy_source(spec, site)
    else:
        _pip(python, "install", "--no-deps", spec.target)
    (site / PTH_NAME).write_text(f"import site; site.addsitedir({str(MAIN_SITE)!r})\n")
    installed = _install_missing_requirements(python)
    notes = (f"installed missing requirements: {', '.join(installed)}",) if installed else ()
    marker.write_text(json.dumps({"spec": spec.name, "text": spec.text, "site": str(site), "main_site": str(MAIN_SITE),
                                  "notes": list(notes)}, indent=1))
    return Env(spec, python, site, notes)


def edited_copy(dest: Path, edits: dict, version: str) -> Path:
    """Copy this environment's omnivoice package to dest/omnivoice with text edits, as a source candidate.

    Args:
        dest: folder to create (must not exist).
        edits: {path inside the package: [(old, new), ...]}; each `old` must occur exactly once.
        version: the version its dist-info declares, e.g. "0.2.1+floor".
    """
    src = current_env()
    pkg = dest / "omnivoice"
    shutil.copytree(src.site / "omnivoice", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, changes in edits.items():
        path = pkg / rel
        text = path.read_text()
        for old, new in changes:
            if text.count(old) != 1:
                raise CandidateError(f"{old!r} occurs {text.count(old)} times in {rel} of omnivoice "
                                     f"{metadata.version('omnivoice')}, not once; adjust the edit")
            text = text.replace(old, new)
        path.write_text(text)
    info = dest / f"omnivoice-{version}.dist-info"
    info.mkdir()
    meta = metadata.distribution("omnivoice").read_text("METADATA") or "Metadata-Version: 2.1\nName: omnivoice\n"
    lines = [ln for ln in meta.splitlines() if not ln.startswith("Version:")]
    lines.insert(2, f"Version: {version}")
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    return dest
