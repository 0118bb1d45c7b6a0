"""An omnivoice candidate in its own virtual environment, sharing everything else with this one.

`prepare(parse_spec("omnivoice==0.2.0"))` makes `.cache/gate/omnivoice-0.2.0/venv` with `python -m venv
--without-pip`, installs the candidate into it with this interpreter's pip (`pip --python VENV/bin/python
install --no-deps`), then adds a .pth file that appends this environment's site-packages *after* the venv's
own. So torch, transformers, pytest and fastpath come from here and only omnivoice differs. The candidate is
installed before the .pth exists, so pip never sees (or touches) this environment's packages; requirements the
candidate declares and this environment lacks are installed into the venv afterwards.

A candidate is `NAME==X` (from the package index: `omnivoice==0.2.0`, or a fork such as `lahgtna-omnivoice==0.1.5`),
a `.whl` file, `git+URL[@REF]` (a branch, tag or commit of a git repository: upstream's master as it would be
installed), a checkout folder (one with a pyproject.toml or setup.py: built and installed by pip as it is, uncommitted
changes included), or a source folder holding `omnivoice/` without one (copied in as is; a dist-info beside it that
installs the package gives its name and version, else it is `omnivoice 0+local`). `current` is this environment
itself, nothing is made. A git candidate and a checkout are installed as pip installs them (`pip install
git+URL@REF`, `pip install FOLDER`: built by their own build backend, isolated, so the package index serves it), and
their declared requirements as for a release; the version pip reports, the commit (pip's direct_url.json for a git
URL; `git rev-parse HEAD` and `git status` for a checkout) and the declared requirements are in `Env.source`. A git
candidate's venv is reused only while REF still names the commit it was built from (`git ls-remote`).

A candidate is found by the import package it installs, not by its distribution's name: the distribution in the
venv whose RECORD (or top_level.txt) holds `omnivoice/` is the candidate, and the verdict names it ("lahgtna-omnivoice
0.1.5"). For a fork, the venv also gets an `omnivoice-<version>.dist-info` alias (METADATA and a GATE_ALIAS file
naming the fork) so that code run there which asks `importlib.metadata.version("omnivoice")` (fastpath's own
messages, the goldens, the behaviour record) reads the candidate's version, not this environment's through the .pth.
Anything that stops the candidate from installing or importing raises CandidateError with the installer's message:
the candidate is broken (the gate's verdict: MUST NOT SHIP, exit 1). Where the gate's side failed instead (the index
or the git host could not be reached, git is missing: `CandidateError.gate_side`), the gate could not judge (exit 2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from harness import REPO_ROOT
from harness.model.checkpoint import cache_dir
from harness.run.machine import tree_digest

MAIN_SITE = Path(sysconfig.get_paths()["purelib"])
UPSTREAM_FILE = Path("omnivoice") / "models" / "omnivoice.py"
PTH_NAME = "zz_fastpath_shared_site.pth"
PACKAGE = "omnivoice"  # the import package a candidate must install, whatever its distribution is called
GATE_ALIAS = "fastpath_gate_alias.json"  # marks the gate's own omnivoice dist-info alias of a fork (not a candidate)
LAYOUT = 2  # of a candidate's venv (2: forks aliased); a venv made by another layout is made again
HOW = ("pass omnivoice==X.Y.Z (or NAME==X.Y.Z of a fork that installs the omnivoice package), a path to a .whl, "
       "git+URL@REF (e.g. git+https://github.com/k2-fsa/OmniVoice@master), a checkout folder (with a pyproject.toml), "
       "a folder holding omnivoice/, or 'current'")
# what pip and git say when the source itself could not be reached: the gate's side, not the candidate
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Name or service "
    r"not known|Max retries exceeded|ConnectTimeoutError|ReadTimeoutError|Connection refused|Network is unreachable|"
    r"Could not resolve host|unable to access|Could not fetch URL|ProxyError|SSLError|could not read Username|"
    r"terminal prompts disabled|No space left on device", re.IGNORECASE)


class CandidateError(RuntimeError):
    """The candidate cannot be found or installed; the message names the fix. gate_side: the failure is the gate's
    own (the source could not be reached, a tool is missing), not the candidate's."""

    def __init__(self, message: str, gate_side: bool = False):
        super().__init__(message)
        self.gate_side = gate_side


def unreachable(said: str) -> bool:
    """Whether an installer's message says the source could not be reached (UNREACHABLE)."""
    return bool(UNREACHABLE.search(said))


@dataclass(frozen=True)
class Spec:
    text: str  # as given on the command line
    kind: str  # "current" | "index" | "wheel" | "git" | "checkout" | "source"
    target: str  # requirement, wheel path, git+URL@REF, checkout folder or package folder
    name: str  # folder name under .cache/gate/
    url: str = ""  # git: the repository, without git+ and @REF
    ref: str | None = None  # git: the branch, tag or commit asked for (None: the repository's HEAD)


def installs_package(dist: metadata.Distribution) -> bool:
    """Whether a distribution installs the omnivoice import package: its top_level.txt or RECORD names it; a
    dist-info with neither counts when its name is omnivoice. The gate's alias of a fork is not one."""
    if dist.read_text(GATE_ALIAS) is not None:
        return False
    top = dist.read_text("top_level.txt")
    if top is not None:
        return PACKAGE in top.split()
    files = dist.files
    if files:
        return any(f.parts[0] == PACKAGE for f in files)
    return canonicalize_name(dist.metadata["Name"] or "") == PACKAGE


def providers(folder: Path) -> list:
    """[(dist-info path, Distribution)] of the distributions in `folder` (a site-packages, or a source folder) that
    install the omnivoice package."""
    found = []
    for info in sorted(Path(folder).glob("*.dist-info")):
        dist = metadata.PathDistribution(info)
        if installs_package(dist):
            found.append((info, dist))
    return found


def provider(site: Path) -> tuple:
    """(distribution name, version) of the one distribution in `site` that installs the omnivoice package."""
    found = providers(site)
    if not found:
        raise CandidateError(f"no distribution in {site} installs the omnivoice package (no dist-info whose RECORD or "
                             f"top_level.txt names omnivoice/): give a wheel, a requirement or a folder whose "
                             f"distribution installs it")
    if len(found) > 1:
        raise CandidateError(f"{len(found)} distributions in {site} install the omnivoice package "
                             f"({', '.join(info.name for info, _ in found)}): give a candidate with one")
    dist = found[0][1]
    return dist.metadata["Name"], dist.version


def package_folder(folder: Path) -> Path | None:
    """The omnivoice package inside a source folder (folder/omnivoice, or the folder itself), or None."""
    for pkg in (folder / "omnivoice", folder):
        if (pkg / "__init__.py").is_file() and (pkg / "models" / "omnivoice.py").is_file():
            return pkg
    return None


def safe(text: str) -> str:
    """A name for a folder: letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def git_spec(text: str) -> Spec:
    """git+URL[@REF][#fragment], as pip reads it: REF after the last '@' of the URL's path."""
    parts = urlsplit(text.removeprefix("git+"))
    if not parts.scheme or not parts.path.strip("/"):
        raise CandidateError(f"{text!r} is not a git URL (git+https://host/owner/repo@REF, git+file:///path@REF); {HOW}")
    path, ref = parts.path, None
    if "@" in path:
        path, ref = path.rsplit("@", 1)
        if not ref:
            raise CandidateError(f"{text!r} names no ref after '@': give a branch, a tag or a commit; {HOW}")
    url = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    repo = Path(path.rstrip("/")).name.removesuffix(".git")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return Spec(text, "git", text, f"git-{safe(repo)}-{safe(ref or 'HEAD')}-{digest}", url=url, ref=ref)


def checkout_digest(folder: Path) -> str:
    """sha256 over a checkout's files as a build reads them: git's own folder, caches and build outputs left out."""
    skip = {".git", "__pycache__", "build", "dist", ".venv", ".cache", ".tox", ".nox"}
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(p in skip or p.endswith(".egg-info") for p in parts):
            h.update(str(Path(*parts)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def parse_spec(text: str) -> Spec:
    if text == "current":
        return Spec(text, "current", "", "current")
    if text.startswith("git+"):
        return git_spec(text)
    path = Path(text).expanduser()
    if "==" in text and not path.exists():
        try:
            req = Requirement(text)
        except InvalidRequirement as err:
            raise CandidateError(f"{text!r} is not a requirement ({err}); {HOW}") from None
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1 or not pins[0] or req.extras or req.marker or req.url:
            raise CandidateError(f"{text!r} names no single version; {HOW}")
        name = canonicalize_name(req.name)
        return Spec(text, "index", f"{name}=={pins[0]}", f"{name}-{pins[0]}")
    if path.suffix == ".whl":
        if not path.is_file():
            raise CandidateError(f"wheel {path} does not exist; {HOW}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]  # a rebuilt wheel of the same name is new
        return Spec(text, "wheel", str(path.resolve()), f"{path.stem}-{digest}")
    if path.is_dir() and ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
        folder = path.resolve()
        return Spec(text, "checkout", str(folder), f"checkout-{safe(folder.name)}-{checkout_digest(folder)[:12]}")
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
    source: dict = field(default_factory=dict)  # where it came from: source_record

    @property
    def upstream_file(self) -> Path:
        return self.site / UPSTREAM_FILE

    def distribution(self) -> tuple:
        """(name, version) of the distribution that installs this environment's omnivoice package."""
        if self.spec.kind == "current":
            names = metadata.packages_distributions().get(PACKAGE, [])
            here = [metadata.distribution(n) for n in dict.fromkeys(names)]
            here = [d for d in here if Path(d.locate_file("")).resolve() == self.site.resolve()]
            if len(here) == 1:
                return here[0].metadata["Name"], here[0].version
        return provider(self.site)

    def run_env(self) -> dict:
        """What this environment's python runs with, beside the caller's environment: no user site, the repository
        first on the path (fastpath and the harness importable)."""
        return {"PYTHONNOUSERSITE": "1",
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}

    def run(self, args, *, extra_env=None, timeout=None, log: Path | None = None) -> subprocess.CompletedProcess:
        """Run this environment's python with `args` in the repo root (fastpath importable from it)."""
        env = dict(os.environ, **self.run_env())
        env.update(extra_env or {})
        done = subprocess.run([str(self.python), *map(str, args)], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"$ {self.python} {' '.join(map(str, args))}\n# exit {done.returncode}\n"
                           f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        return done

    def import_check(self) -> dict:
        """{'ok': True, 'distribution', 'version', 'file'} when a distribution here installs the omnivoice package,
        `import omnivoice.models.omnivoice` works, and importlib.metadata here reads that version for omnivoice;
        else {'ok': False, 'error', 'traceback'}."""
        try:  # the distribution first: a candidate without one is refused before the import (about 8 s here)
            name, version = self.distribution()
        except CandidateError as err:
            return {"ok": False, "error": str(err), "traceback": ""}
        code = ("import json, importlib.metadata as m\n"
                "import omnivoice.models.omnivoice as o\n"
                "print(json.dumps({'file': o.__file__, 'metadata_version': m.version('omnivoice')}))\n")
        done = self.run(["-c", code], timeout=600)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
            return {"ok": False, "error": lines[-1] if lines else f"exit {done.returncode}",
                    "traceback": done.stderr[-4000:]}
        info = json.loads(done.stdout.strip().splitlines()[-1])
        venv = self.site.parent.parent.parent
        if not Path(info["file"]).resolve().is_relative_to(self.site.resolve()):
            return {"ok": False, "error": f"omnivoice imported from {info['file']}, not from {self.site}: the "
                                          f"candidate is shadowed; delete {venv} and rerun", "traceback": ""}
        if info["metadata_version"] != version:
            return {"ok": False, "error": f"importlib.metadata in {self.python} reads omnivoice "
                                          f"{info['metadata_version']}, not the candidate's {name} {version} (this "
                                          f"environment's, through the shared site): delete {venv} and rerun",
                    "traceback": ""}
        return {"ok": True, "distribution": name, "version": version, "file": info["file"]}


def current_env() -> Env:
    """This environment, its site-packages the folder its omnivoice package is in (found without importing it)."""
    found = importlib.util.find_spec(PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise CandidateError("omnivoice is not installed in this environment; bash scripts/install.sh")
    return Env(parse_spec("current"), Path(sys.executable), Path(list(found.submodule_search_locations)[0]).parent)


def _pip(python: Path, *args) -> None:
    """This interpreter's pip, run on the venv's interpreter; its own message in the error when it fails (gate_side
    when it says the source could not be reached)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        if unreachable(said):
            raise CandidateError(f"pip could not reach the package index or the git host: `{' '.join(cmd)}` exited "
                                 f"{done.returncode}:\n{said[-3000:]}\nFix: the runner's access to the package index "
                                 f"or the git host (network, proxy, credentials, disk), then rerun: the candidate was "
                                 f"not judged", gate_side=True)
        raise CandidateError(f"pip could not install it: `{' '.join(cmd)}` exited {done.returncode}:\n"
                             f"{said[-3000:]}\n"
                             f"Fix: check the candidate (its name and version, the file: a whole, valid wheel whose "
                             f"requirements this Python meets, or the source: a ref that exists and a tree that builds)")


def git(*args, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """git, never waiting for a password; CandidateError (gate_side) where git is not installed."""
    found = shutil.which("git")
    if found is None:
        raise CandidateError("git is not installed, and a git candidate or a checkout needs it: apt-get install git",
                             gate_side=True)
    return subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))


def remote_commit(spec: Spec) -> str | None:
    """The commit spec.ref names at spec.url now (a branch or a tag; the repository's HEAD when none), by `git
    ls-remote`; None where ls-remote lists no such ref (a commit id: fixed, or a ref pip will say is missing)."""
    ref = spec.ref or "HEAD"
    done = git("ls-remote", spec.url, ref, f"{ref}^{{}}")  # ^{}: the commit an annotated tag points at
    if done.returncode != 0:
        said = done.stderr.strip()
        raise CandidateError(f"git ls-remote {spec.url} failed: {said[-2000:]}", gate_side=unreachable(said))
    found = dict(reversed(line.split("\t", 1)) for line in done.stdout.splitlines() if "\t" in line)
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"):
        if name in found:
            return found[name]
    return None


def checkout_state(folder: Path) -> dict:
    """A checkout's commit (`git rev-parse HEAD`) and whether its tree differs from it (`git status --porcelain`:
    changes and untracked files, which a build reads); {} when it is not a git checkout."""
    head = git("rev-parse", "HEAD", cwd=folder)
    if head.returncode != 0:
        return {}
    top = git("rev-parse", "--show-toplevel", cwd=folder).stdout.strip()
    status = git("status", "--porcelain", "--", ".", cwd=folder).stdout
    return {"commit": head.stdout.strip(), "dirty": bool(status.strip()), "repository": top}


def source_record(spec: Spec, site: Path, installed: tuple = ()) -> dict:
    """Where a candidate came from: its kind, the distribution and version pip installed, for a git URL the commit
    pip checked out and the ref asked for (its direct_url.json, PEP 610), for a checkout its commit and whether it had
    uncommitted changes; the requirements it declares (no extras) and those installed into its venv."""
    info, dist = providers(site)[0]
    record = {"kind": spec.kind, "spec": spec.text, "distribution": dist.metadata["Name"], "version": dist.version}
    direct = info / "direct_url.json"
    data = json.loads(direct.read_text()) if direct.is_file() else {}
    if spec.kind == "git":
        vcs = data.get("vcs_info", {})
        record.update(url=data.get("url", spec.url), ref=vcs.get("requested_revision", spec.ref),
                      commit=vcs.get("commit_id"))
    elif spec.kind == "checkout":
        record.update(path=spec.target, **checkout_state(Path(spec.target)))
    declared = [str(r) for r in map(Requirement, dist.requires or [])
                if not (r.marker and not r.marker.evaluate({"extra": ""}))]
    record.update(requires=declared, installed_requirements=list(installed))
    return record


def _venv_site(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def _copy_source(spec: Spec, site: Path) -> None:
    """The package, and the dist-info beside it that installs it (a fork's too; RECORD or top_level.txt naming
    omnivoice/, or a dist-info named omnivoice), else one for omnivoice 0+local."""
    pkg = Path(spec.target)
    shutil.copytree(pkg, site / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    infos = providers(pkg.parent) if pkg.name == PACKAGE else []
    if len(infos) > 1:
        raise CandidateError(f"{len(infos)} dist-infos beside {pkg} install the omnivoice package "
                             f"({', '.join(info.name for info, _ in infos)}): keep the candidate's only")
    if infos:
        shutil.copytree(infos[0][0], site / infos[0][0].name)
    else:
        info = site / "omnivoice-0+local.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omnivoice\nVersion: 0+local\n")
        (info / "top_level.txt").write_text(f"{PACKAGE}\n")


def _alias(site: Path, name: str, version: str) -> None:
    """For a fork: an omnivoice dist-info in the venv that says the fork's version (see the module's docstring)."""
    info = site / f"{PACKAGE}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\nSummary: the gate's "
                                   f"alias of {name} {version}, which installs the omnivoice package here\n")
    (info / GATE_ALIAS).write_text(json.dumps({"distribution": name, "version": version}) + "\n")


def _install_missing_requirements(python: Path, name: str = PACKAGE) -> tuple:
    """Install what the candidate requires and this environment lacks; returns what was installed."""
    code = (
        "import json, importlib.metadata as m\n"
        "from packaging.requirements import Requirement\n"
        "missing = []\n"
        f"for text in m.requires({name!r}) or []:\n"
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
    """The candidate's environment, made once per candidate (reused while its spec and content are the same); one
    maker at a time per folder (a file lock: parallel gates or xdist workers wait, then reuse it)."""
    if spec.kind == "current":
        return current_env()
    from filelock import FileLock

    base = root or cache_dir() / "gate"
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / f".{spec.name}.lock")):
        return _prepare(spec, base / spec.name, fresh)


def _reusable(spec: Spec, made: dict) -> bool:
    """A venv made before serves while it was made for this spec by this layout on this environment, and, for a git
    candidate, while the ref still names the commit it was built from."""
    if (made.get("spec"), made.get("main_site"), made.get("layout")) != (spec.name, str(MAIN_SITE), LAYOUT):
        return False
    if spec.kind != "git":
        return True
    built = (made.get("source") or {}).get("commit") or ""
    now = remote_commit(spec)
    return bool(built) and (built == now if now else bool(spec.ref) and built.startswith(spec.ref))


def _prepare(spec: Spec, folder: Path, fresh: bool) -> Env:
    python = folder / "venv" / "bin" / "python"
    marker = folder / "candidate.json"
    if not fresh and marker.is_file() and python.exists():
        made = json.loads(marker.read_text())
        if _reusable(spec, made):
            source = made.get("source") or {}
            if spec.kind == "checkout":  # the same tree: its commit and state as they are now
                source = {**source, **checkout_state(Path(spec.target))}
            return Env(spec, python, Path(made["site"]), tuple(made.get("notes", ())), source)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    site = _venv_site(python)
    if spec.kind == "source":
        _copy_source(spec, site)
    else:  # a git URL or a checkout is built by pip with its own build backend, as `pip install` builds it
        _pip(python, "install", "--no-deps", spec.target)
    name, version = provider(site)
    (site / PTH_NAME).write_text(f"import site; site.addsitedir({str(MAIN_SITE)!r})\n")
    installed = _install_missing_requirements(python, name)
    notes = (f"installed missing requirements: {', '.join(installed)}",) if installed else ()
    if canonicalize_name(name) != PACKAGE:
        _alias(site, name, version)
        notes += (f"{name} {version} installs the omnivoice package: gated as a fork",)
    source = source_record(spec, site, installed)
    marker.write_text(json.dumps({"spec": spec.name, "text": spec.text, "site": str(site), "main_site": str(MAIN_SITE),
                                  "layout": LAYOUT, "notes": list(notes), "source": source}, indent=1))
    return Env(spec, python, site, notes, source)


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
