"""Candidates from source, as pip installs them: `git+URL@REF` (upstream's master, in no release) and a checkout
folder. How the gate reads such a candidate, which commit a ref names, when a venv made before still serves, and what
the verdict says of where the candidate came from run in the default run (a git repository made here, no index);
the gate end to end on a git repository of omnivoice 0.2.1 with a planted commit after its tag, built by pip from
its pyproject.toml (hatchling from the package index), runs in the controls stage (fixtures/upstream/master_candidate.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from harness import REPO_ROOT
from harness.gate import candidate as cand
from harness.gate import gate

FIXTURE = REPO_ROOT / "fixtures" / "upstream" / "master_candidate.py"


def master_candidate():
    spec = importlib.util.spec_from_file_location("master_candidate", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_repo(folder, files: dict):
    """A git repository with one commit of `files` ({name: text}) on master, tagged v1 (annotated)."""
    mc = master_candidate()
    folder.mkdir(parents=True)
    mc.git(folder, "init", "-q", "-b", "master")
    for name, text in files.items():
        (folder / name).write_text(text)
    mc.git(folder, "add", "-A")
    mc.git(folder, "commit", "-q", "-m", "one")
    mc.git(folder, "tag", "-a", "v1", "-m", "v1")
    return mc


# --- reading a candidate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, url, ref", [
    ("git+https://github.com/k2-fsa/OmniVoice@master", "https://github.com/k2-fsa/OmniVoice", "master"),
    ("git+ssh://git@github.com/k2-fsa/OmniVoice.git@v0.2.1", "ssh://git@github.com/k2-fsa/OmniVoice.git", "v0.2.1"),
    ("git+file:///srv/omnivoice", "file:///srv/omnivoice", None),
    ("git+https://github.com/k2-fsa/OmniVoice@0123abc#egg=omnivoice", "https://github.com/k2-fsa/OmniVoice",
     "0123abc"),
])
def test_a_git_url_is_read_as_pip_reads_it(text, url, ref):
    """REF after the last '@' of the URL's path (a user in the host part is not one); the whole text goes to pip."""
    spec = cand.parse_spec(text)
    assert (spec.kind, spec.target, spec.url, spec.ref) == ("git", text, url, ref), spec
    assert all(c.isalnum() or c in "._-" for c in spec.name), spec.name
    assert spec.name.startswith("git-OmniVoice-" if "OmniVoice" in url else "git-omnivoice-HEAD-"), spec.name


def test_git_urls_that_name_nothing_are_refused_naming_the_form():
    for text in ("git+https://github.com/k2-fsa/OmniVoice@", "git+nonsense", "git+https://github.com"):
        with pytest.raises(cand.CandidateError, match=r"git\+https://host/owner/repo@REF|names no ref"):
            cand.parse_spec(text)
    assert cand.parse_spec("git+https://h/o/r@a").name != cand.parse_spec("git+https://h/o/r@b").name


def test_a_folder_with_a_pyproject_is_a_checkout_pip_builds(tmp_path):
    """A checkout (pyproject.toml) is built by pip; a folder holding omnivoice/ without one is still copied in as it
    is; the checkout's venv name follows its content, so an edit makes a new candidate."""
    checkout = tmp_path / "OmniVoice"
    (checkout / "omnivoice" / "models").mkdir(parents=True)
    (checkout / "omnivoice" / "__init__.py").write_text("")
    (checkout / "omnivoice" / "models" / "omnivoice.py").write_text("X = 1\n")
    assert cand.parse_spec(str(checkout)).kind == "source"
    (checkout / "pyproject.toml").write_text("[project]\nname = 'omnivoice'\nversion = '0.2.1'\n")
    spec = cand.parse_spec(str(checkout))
    assert (spec.kind, spec.target) == ("checkout", str(checkout.resolve())) and spec.name.startswith("checkout-OmniVoice-")
    (checkout / "omnivoice" / "models" / "omnivoice.py").write_text("X = 2\n")
    edited = cand.parse_spec(str(checkout)).name
    assert edited != spec.name
    # Python's caches are not the checkout's content: the same candidate
    (checkout / "omnivoice" / "__pycache__").mkdir()
    (checkout / "omnivoice" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    assert cand.parse_spec(str(checkout)).name == edited


# --- which commit, and when a venv made before serves --------------------------------------------------------


def test_the_commit_a_ref_names_is_read_from_the_repository(tmp_path):
    repo = tmp_path / "repo"
    mc = small_repo(repo, {"a.txt": "1\n"})
    first = mc.git(repo, "rev-parse", "HEAD")
    url = f"git+{repo.as_uri()}"
    assert cand.remote_commit(cand.parse_spec(f"{url}@master")) == first
    assert cand.remote_commit(cand.parse_spec(f"{url}@v1")) == first, "an annotated tag names its commit"
    assert cand.remote_commit(cand.parse_spec(url)) == first, "no ref: the repository's HEAD"
    assert cand.remote_commit(cand.parse_spec(f"{url}@{first[:10]}")) is None, "a commit id is no ref to list"
    (repo / "a.txt").write_text("2\n")
    mc.git(repo, "commit", "-q", "-am", "two")
    second = mc.git(repo, "rev-parse", "HEAD")
    assert cand.remote_commit(cand.parse_spec(f"{url}@master")) == second != first
    assert cand.remote_commit(cand.parse_spec(f"{url}@v1")) == first
    with pytest.raises(cand.CandidateError) as missing:
        cand.remote_commit(cand.parse_spec(f"git+{(tmp_path / 'nothing').as_uri()}@master"))
    assert not missing.value.gate_side, "a repository that is not there is the candidate's, not the gate's"


def test_a_git_venv_is_reused_only_while_its_ref_names_the_commit_it_was_built_from(tmp_path):
    repo = tmp_path / "repo"
    mc = small_repo(repo, {"a.txt": "1\n"})
    built = mc.git(repo, "rev-parse", "HEAD")
    spec = cand.parse_spec(f"git+{repo.as_uri()}@master")
    made = {"spec": spec.name, "main_site": str(cand.MAIN_SITE), "layout": cand.LAYOUT, "source": {"commit": built}}
    assert cand._reusable(spec, made)
    assert not cand._reusable(spec, {**made, "source": {}}), "a venv that recorded no commit is made again"
    (repo / "a.txt").write_text("2\n")
    mc.git(repo, "commit", "-q", "-am", "master moved")
    assert not cand._reusable(spec, made), "master moved on: the venv of its old commit must not serve"
    pinned = cand.parse_spec(f"git+{repo.as_uri()}@{built[:12]}")
    assert cand._reusable(pinned, {**made, "spec": pinned.name}), "a commit id names the same commit for ever"


def test_a_checkout_records_its_commit_and_whether_it_has_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    mc = small_repo(repo, {"pyproject.toml": "[project]\nname = 'x'\n"})
    state = cand.checkout_state(repo)
    assert state == {"commit": mc.git(repo, "rev-parse", "HEAD"), "dirty": False, "repository": str(repo)}, state
    (repo / "new.py").write_text("")  # untracked: a build reads it
    assert cand.checkout_state(repo)["dirty"]
    (tmp_path / "plain").mkdir()
    assert cand.checkout_state(tmp_path / "plain") == {}, "a folder that is no git checkout records no commit"


# --- what the verdict says of the source ---------------------------------------------------------------------


def installed_from_git(site, commit: str) -> None:
    """A site-packages where pip installed omnivoice 0.2.1 from a git URL (its dist-info, direct_url.json too)."""
    info = site / "omnivoice-0.2.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omnivoice\nVersion: 0.2.1\nRequires-Dist: torch>=2.4\n"
                                   "Requires-Dist: fastpath-planted-requirement==1.0\n"
                                   "Requires-Dist: jiwer==3.1.0; extra == 'eval'\n")
    (info / "top_level.txt").write_text("omnivoice\n")
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///srv/omnivoice", "vcs_info": {
        "vcs": "git", "requested_revision": "master", "commit_id": commit}}))


def test_the_verdict_names_the_commit_pip_installed_and_the_requirements(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    installed_from_git(tmp_path, commit)
    spec = cand.parse_spec("git+file:///srv/omnivoice@master")
    source = cand.source_record(spec, tmp_path, ("fastpath-planted-requirement==1.0",))
    assert source == {"kind": "git", "spec": spec.text, "distribution": "omnivoice", "version": "0.2.1",
                      "url": "file:///srv/omnivoice", "ref": "master", "commit": commit,
                      "requires": ["torch>=2.4", "fastpath-planted-requirement==1.0"],
                      "installed_requirements": ["fastpath-planted-requirement==1.0"]}, source
    side = {"spec": spec.text, "distribution": "omnivoice", "version": "0.2.1", "source": source}
    assert gate.name_of(side) == "omnivoice 0.2.1 at commit 0123456789ab"
    lines = gate.source_lines(source)
    assert lines[0] == f"from file:///srv/omnivoice at master: commit {commit}", lines
    assert "installed into its venv: fastpath-planted-requirement==1.0" in lines[1], lines
    checks = [gate.Check("install", "pass", False, "ok", lines), gate.Check("fingerprints", "changed", True, "x")]
    report = {**gate.verdict(checks), "candidate": side,
              "against": {"spec": "current", "distribution": "omnivoice", "version": "0.2.1"},
              "environment": {"machine": "m", "torch": "t", "transformers": "t"}, "seconds": 1.0, "command": "c",
              "accepted": {}}
    assert "# Upstream gate: omnivoice 0.2.1 at commit 0123456789ab against omnivoice 0.2.1" in gate.render_verdict(report)
    assert "at commit 0123456789ab (`git+file:///srv/omnivoice@master`)" in gate.render_results(
        gate.results_figures(report))
    assert gate.commit_label("0.2.1", commit) == "0.2.1+g0123456789ab", "master is never recorded as the release"
    assert gate.commit_label("0.2.1+floor", commit) == "0.2.1+floor.g0123456789ab"
    assert gate.commit_label("0.2.1", None) == "0.2.1"
    dirty = {**side, "source": {"kind": "checkout", "commit": commit, "dirty": True}}
    assert gate.name_of(dirty) == "omnivoice 0.2.1 at commit 0123456789ab (with uncommitted changes)"
    assert gate.name_of({**side, "source": {}}) == "omnivoice 0.2.1", "a release is named by its version alone"


# --- end to end: upstream's master, as pip installs it ---------------------------------------------------------


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    return master_candidate().build(tmp_path_factory.mktemp("upstream"))


@pytest.mark.slow
@pytest.mark.control
def test_the_gate_on_upstreams_master_names_the_commit_and_the_change(master, prepare_here, monkeypatch, tmp_path,
                                                                       capsys):
    """pip builds the repository at master from its pyproject.toml (hatchling, isolated), the requirement only the
    planted commit declares is installed into the candidate's venv, and the verdict names the planted commit (not
    the tag's) and the function it changed: MUST NOT SHIP, exit 1."""
    links = " ".join(filter(None, [str(master["wheels"]), os.environ.get("PIP_FIND_LINKS")]))
    monkeypatch.setenv("PIP_FIND_LINKS", links)  # the planted requirement's wheel, beside any links pip had
    out = tmp_path / "out"
    code = gate.main([master["url"], "--checks", "fingerprints", "--out", str(out), "--quiet"])
    printed = capsys.readouterr()
    assert code == 1, printed.out + printed.err
    report = json.loads((out / "verdict.json").read_text())
    source = report["candidate"]["source"]
    assert (source["kind"], source["commit"], source["ref"]) == ("git", master["commit"], "master"), source
    assert source["commit"] != master["tag_commit"]
    assert (report["candidate"]["distribution"], report["candidate"]["version"]) == ("omnivoice", "0.2.1"), report
    planted = "fastpath-planted-requirement==1.0"
    assert planted in source["requires"] and source["installed_requirements"] == [planted], source
    checks = {c["name"]: c for c in report["checks"]}
    assert (report["state"], report["blocked_by"], report["exit_status"]) == ("must-not-ship", ["fingerprints"], 1)
    assert "OmniVoice._generate_iterative" in checks["fingerprints"]["summary"], checks["fingerprints"]
    details = "\n".join(checks["fingerprints"]["details"])
    assert "models/omnivoice.py:OmniVoice._generate_iterative: changed" in details, details
    assert f"--version 0.2.1+g{master['commit'][:12]} --record" in details, "to be recorded as the commit, not 0.2.1"
    assert f"commit {master['commit']}" in "\n".join(checks["install"]["details"]), checks["install"]
    assert f"at commit {master['commit'][:12]}" in printed.out and "MUST NOT SHIP" in printed.out, printed.out
    assert f"at commit {master['commit'][:12]}" in (out / "verdict.md").read_text()
    python = report["candidate"]["python"]
    done = subprocess.run([python, "-c", "import fastpath_planted_requirement as p; print(p.__file__, p.PLANTED)"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split()[1] == "True", done.stdout + done.stderr
    assert "/venv/" in done.stdout.split()[0], "the planted requirement must be in the candidate's venv only"
    assert importlib.util.find_spec("fastpath_planted_requirement") is None, "installed into this environment"


@pytest.mark.slow
@pytest.mark.control
def test_a_checkout_is_built_by_pip_as_it_is_with_its_commit_and_its_uncommitted_change(master, venvs, monkeypatch,
                                                                                        tmp_path):
    """A clone of the repository at master with one uncommitted change: pip builds the tree as it is (the change is
    in the candidate's package), the planted requirement is installed from its pyproject.toml, and the record names
    master's commit and says the tree differs from it."""
    links = " ".join(filter(None, [str(master["wheels"]), os.environ.get("PIP_FIND_LINKS")]))
    monkeypatch.setenv("PIP_FIND_LINKS", links)
    checkout = tmp_path / "OmniVoice"
    subprocess.run(["git", "clone", "-q", str(master["repo"]), str(checkout)], check=True)
    init = checkout / "omnivoice" / "__init__.py"
    init.write_text(init.read_text() + "\nUNCOMMITTED = True\n")
    env = cand.prepare(cand.parse_spec(str(checkout)), root=venvs)
    source = env.source
    assert (source["kind"], source["commit"], source["dirty"], source["version"]) == (
        "checkout", master["commit"], True, "0.2.1"), source
    assert source["installed_requirements"] == ["fastpath-planted-requirement==1.0"], source
    assert "UNCOMMITTED = True" in (env.site / "omnivoice" / "__init__.py").read_text(), "built from the tree as it is"
    assert gate.name_of({"distribution": "omnivoice", "version": "0.2.1", "spec": str(checkout), "source": source}) == \
        f"omnivoice 0.2.1 at commit {master['commit'][:12]} (with uncommitted changes)"


# --- a candidate's words, read without a venv (fakes for git, pip and the venv's python) -------------------------


def test_a_candidate_error_is_the_candidates_unless_said_to_be_the_gates():
    assert (str(cand.CandidateError("no such version")), cand.CandidateError("x").gate_side) == ("no such version",
                                                                                                   False)
    assert cand.CandidateError("index down", gate_side=True).gate_side is True


@pytest.mark.parametrize("text, expected", [
    ("current", cand.Spec("current", "current", "", "current")),
    ("omnivoice==0.2.0", cand.Spec("omnivoice==0.2.0", "index", "omnivoice==0.2.0", "omnivoice-0.2.0")),
    ("Lahgtna_OmniVoice==0.1.5", cand.Spec("Lahgtna_OmniVoice==0.1.5", "index", "lahgtna-omnivoice==0.1.5",
                                           "lahgtna-omnivoice-0.1.5")),
])
def test_current_and_a_pinned_release_are_read_whole_with_the_name_pip_knows(text, expected):
    """Every field: `current` has no target, a release's distribution name is canonical (PEP 503) in the target
    pip installs and in the venv's folder name."""
    assert cand.parse_spec(text) == expected


@pytest.mark.parametrize("text, fix", [
    ("omnivoice==", "is not a requirement"),
    ("omnivoice==0.2.0,>=0.1", "names no single version"),
    ("omnivoice[eval]==0.2.0", "names no single version"),
    ("omnivoice==0.2.0; python_version > '3'", "names no single version"),
    ("omnivoice>=0.1,==0.2.0", "names no single version"),
    ("no-such-thing", "cannot read candidate"),
])
def test_a_requirement_that_names_no_single_release_is_refused_naming_the_forms(text, fix):
    with pytest.raises(cand.CandidateError) as refused:
        cand.parse_spec(text)
    said = str(refused.value)
    assert said.startswith(repr(text) if fix != "cannot read candidate" else "cannot read candidate") and fix in said
    assert said.endswith(f"; {cand.HOW}") and not refused.value.gate_side, said


def test_a_wheel_a_setup_py_checkout_and_a_source_folder_are_named_by_their_content(tmp_path):
    """A wheel: its resolved path, named stem + sha256 of its bytes; a folder with setup.py is a checkout; a folder
    that is the package itself is a source; a file named like a requirement that exists is read as a file."""
    import hashlib

    from harness.run.machine import tree_digest

    wheel = tmp_path / "omnivoice==9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    spec = cand.parse_spec(str(wheel))
    digest = hashlib.sha256(b"a wheel").hexdigest()[:12]
    assert spec == cand.Spec(str(wheel), "wheel", str(wheel.resolve()), f"{wheel.stem}-{digest}"), spec
    checkout = tmp_path / "co"
    checkout.mkdir()
    (checkout / "setup.py").write_text("")
    spec = cand.parse_spec(str(checkout))
    assert (spec.kind, spec.target, spec.name) == (
        "checkout", str(checkout.resolve()), f"checkout-co-{cand.checkout_digest(checkout.resolve())[:12]}"), spec
    pkg = tmp_path / "pkg"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "omnivoice.py").write_text("X = 1\n")
    assert cand.package_folder(pkg) == pkg, "the folder is the package itself"
    spec = cand.parse_spec(str(pkg))
    assert spec == cand.Spec(str(pkg), "source", str(pkg.resolve()), f"src-pkg-{tree_digest(pkg)[:12]}"), spec


def test_a_source_folder_needs_both_the_package_init_and_the_model_file(tmp_path):
    (tmp_path / "omnivoice" / "models").mkdir(parents=True)
    (tmp_path / "omnivoice" / "__init__.py").write_text("")
    assert cand.package_folder(tmp_path) is None, "no models/omnivoice.py: not the package"
    with pytest.raises(cand.CandidateError, match=r"holds no omnivoice package \(omnivoice/__init__.py and "
                                                  r"omnivoice/models/omnivoice.py\); pass omnivoice==X"):
        cand.parse_spec(str(tmp_path))
    (tmp_path / "omnivoice" / "__init__.py").unlink()
    (tmp_path / "omnivoice" / "models" / "omnivoice.py").write_text("")
    assert cand.package_folder(tmp_path) is None, "no __init__.py: not the package"
    (tmp_path / "omnivoice" / "__init__.py").write_text("")
    assert cand.package_folder(tmp_path) == tmp_path / "omnivoice"


def test_a_git_candidates_folder_names_the_repository_the_ref_and_a_digest_of_the_whole_text():
    """The URL pip clones keeps its query and drops the fragment; the folder name: the repository without .git, the
    ref made safe for a folder (HEAD when none), and the first 8 hex of sha256 of the text as given."""
    import hashlib

    def digest(text):
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    text = "git+https://github.com/k2-fsa/OmniVoice.git@feature/x?y=1#egg=omnivoice"
    assert cand.parse_spec(text) == cand.Spec(text, "git", text, f"git-OmniVoice-feature_x-{digest(text)}",
                                              url="https://github.com/k2-fsa/OmniVoice.git?y=1", ref="feature/x")
    plain = "git+https://github.com/k2-fsa/OmniVoice.git"
    assert cand.parse_spec(plain) == cand.Spec(plain, "git", plain, f"git-OmniVoice-HEAD-{digest(plain)}",
                                               url="https://github.com/k2-fsa/OmniVoice.git", ref=None)
    two = cand.parse_spec("git+https://host/owner/repo@old@v2")
    assert (two.url, two.ref) == ("https://host/owner/repo@old", "v2"), "REF after the last '@'"


@pytest.mark.parametrize("text, said", [
    ("git+https://host", "is not a git URL (git+https://host/owner/repo@REF, git+file:///path@REF)"),
    ("git+//host/owner/repo", "is not a git URL (git+https://host/owner/repo@REF, git+file:///path@REF)"),
    ("git+https://host/owner/repo@", "names no ref after '@': give a branch, a tag or a commit"),
])
def test_a_git_url_without_a_scheme_a_path_or_a_ref_after_the_at_is_refused_naming_the_form(text, said):
    with pytest.raises(cand.CandidateError) as refused:
        cand.parse_spec(text)
    assert str(refused.value) == f"{text!r} {said}; {cand.HOW}" and not refused.value.gate_side


def dist_info(site, name: str, version: str = "1.0", *, top=None, record=None, alias=False):
    """A dist-info in `site`: METADATA, and top_level.txt, RECORD (files) or the gate's alias marker as asked."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top is not None:
        (info / "top_level.txt").write_text(top)
    if record is not None:
        (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))
    if alias:
        (info / cand.GATE_ALIAS).write_text("{}\n")
    return cand.metadata.PathDistribution(info)


@pytest.mark.parametrize("name, kwargs, installs", [
    ("fork", {"top": "omnivoice\nextra\n"}, True),
    ("omnivoice", {"top": "omnivoice_utils\n"}, False),  # top_level.txt decides over the name
    ("fork", {"record": ["omnivoice/__init__.py", "fork-1.0.dist-info/METADATA"]}, True),
    ("omnivoice", {"record": ["other/omnivoice/__init__.py"]}, False),  # RECORD decides over the name
    ("omnivoice", {}, True),  # neither: the name decides
    ("OmniVoice", {}, True),
    ("fork", {}, False),
    ("omnivoice", {"top": "omnivoice\n", "alias": True}, False),  # the gate's own alias of a fork
])
def test_a_distribution_is_the_candidate_when_it_installs_the_omnivoice_package(tmp_path, name, kwargs, installs):
    assert cand.installs_package(dist_info(tmp_path, name, **kwargs)) is installs


def test_the_one_distribution_that_installs_the_package_is_named_else_the_fix(tmp_path):
    dist_info(tmp_path, "unrelated", top="unrelated\n")
    with pytest.raises(cand.CandidateError) as none:
        cand.provider(tmp_path)
    assert str(none.value) == (f"no distribution in {tmp_path} installs the omnivoice package (no dist-info whose "
                               f"RECORD or top_level.txt names omnivoice/): give a wheel, a requirement or a folder "
                               f"whose distribution installs it")
    dist_info(tmp_path, "lahgtna-omnivoice", "0.1.5", top="omnivoice\n")
    assert cand.provider(tmp_path) == ("lahgtna-omnivoice", "0.1.5")
    dist_info(tmp_path, "omnivoice", "0.2.1", top="omnivoice\n")
    with pytest.raises(cand.CandidateError) as two:
        cand.provider(tmp_path)
    assert str(two.value) == (f"2 distributions in {tmp_path} install the omnivoice package (lahgtna_omnivoice-0.1.5"
                              f".dist-info, omnivoice-0.2.1.dist-info): give a candidate with one")


class FakeRun:
    """subprocess.run's stand-in: records each command and its keywords, answers with the planted outcome."""

    def __init__(self, returncode=0, stdout="", stderr=""):
        self.answer = subprocess.CompletedProcess([], returncode, stdout, stderr)
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        return self.answer


def test_pip_is_this_interpreters_run_on_the_venvs_python_never_waiting_for_a_password(monkeypatch, tmp_path):
    import sys

    fake = FakeRun()
    monkeypatch.setattr(cand.subprocess, "run", fake)
    assert cand._pip(tmp_path / "python", "install", "--no-deps", "omnivoice==0.2.0") is None
    [(cmd, kwargs)] = fake.calls
    assert cmd == [sys.executable, "-m", "pip", "--python", str(tmp_path / "python"), "--disable-pip-version-check",
                   "install", "--no-deps", "omnivoice==0.2.0"], cmd
    assert (kwargs["capture_output"], kwargs["text"], kwargs["env"]["GIT_TERMINAL_PROMPT"]) == (True, True, "0")
    assert kwargs["env"]["PATH"] == os.environ["PATH"], "pip runs with the caller's environment besides"


@pytest.mark.parametrize("stdout, stderr, gate_side", [
    ("", "ERROR: No matching distribution found for omnivoice==9.9.9", False),
    ("ERROR: No matching distribution found for omnivoice==9.9.9", "", False),  # pip said it on stdout only
    ("", "WARNING: Retrying ... Failed to establish a new connection: [Errno 111] Connection refused", True),
])
def test_pips_failure_is_refused_with_its_own_words_and_the_fix_for_whose_side_it_is(monkeypatch, tmp_path, stdout,
                                                                                      stderr, gate_side):
    monkeypatch.setattr(cand.subprocess, "run", FakeRun(1, stdout + "\n", stderr + "\n"))
    with pytest.raises(cand.CandidateError) as failed:
        cand._pip(tmp_path / "python", "install", "x")
    said = (stderr or stdout).strip()
    cmd = " ".join(failed.value.args[0].split("`")[1:2])
    assert cmd.endswith(f"--python {tmp_path / 'python'} --disable-pip-version-check install x"), cmd
    if gate_side:
        expected = (f"pip could not reach the package index or the git host: `{cmd}` exited 1:\n{said}\nFix: the "
                    f"runner's access to the package index or the git host (network, proxy, credentials, disk), then "
                    f"rerun: the candidate was not judged")
    else:
        expected = (f"pip could not install it: `{cmd}` exited 1:\n{said}\nFix: check the candidate (its name and "
                    f"version, the file: a whole, valid wheel whose requirements this Python meets, or the source: a "
                    f"ref that exists and a tree that builds)")
    assert (str(failed.value), failed.value.gate_side) == (expected, gate_side)


def test_pips_words_in_the_error_are_its_last_3000_characters(monkeypatch, tmp_path):
    said = "x" * 100 + "ERROR: " + "y" * 2993
    monkeypatch.setattr(cand.subprocess, "run", FakeRun(2, "", said))
    with pytest.raises(cand.CandidateError) as failed:
        cand._pip(tmp_path / "python", "install", "x")
    assert f"exited 2:\n{said[-3000:]}\nFix:" in str(failed.value) and said[-3001:] not in str(failed.value)


def venv_env(tmp_path, version="0.2.1", name="omnivoice"):
    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True)
    env = cand.Env(cand.Spec("x", "wheel", "x", "x"), tmp_path / "venv" / "bin" / "python", site)
    env.distribution = lambda: (name, version)
    return env, site


def test_the_import_check_imports_the_candidate_in_its_venv_within_ten_minutes(monkeypatch, tmp_path):
    env, site = venv_env(tmp_path, name="lahgtna-omnivoice")
    asked = []

    def run(args, timeout=None, **kwargs):
        asked.append((args, timeout, kwargs))
        return subprocess.CompletedProcess(args, 0, "noise\n" + json.dumps(
            {"file": str(site / "omnivoice" / "models" / "omnivoice.py"), "metadata_version": "0.2.1"}) + "\n", "")

    env.run = run
    assert env.import_check() == {"ok": True, "distribution": "lahgtna-omnivoice", "version": "0.2.1",
                                  "file": str(site / "omnivoice" / "models" / "omnivoice.py")}
    [(args, timeout, kwargs)] = asked
    assert (args[0], timeout, kwargs) == ("-c", 600, {}), (args, timeout, kwargs)
    assert "import omnivoice.models.omnivoice as o" in args[1] and "m.version('omnivoice')" in args[1], args[1]


@pytest.mark.parametrize("returncode, stderr, error, traceback", [
    (1, "Traceback (most recent call last):\n  ...\nImportError: cannot import name 'x'\n\n",
     "ImportError: cannot import name 'x'", "Traceback (most recent call last):\n  ...\n"
     "ImportError: cannot import name 'x'\n\n"),
    (-9, "  \n", "exit -9", "  \n"),
])
def test_a_candidate_that_does_not_import_is_refused_with_the_last_line_it_said(tmp_path, returncode, stderr, error,
                                                                               traceback):
    env, _ = venv_env(tmp_path)
    env.run = lambda args, **kwargs: subprocess.CompletedProcess(args, returncode, "", stderr)
    assert env.import_check() == {"ok": False, "error": error, "traceback": traceback}
    long = "x" * 5000 + "\nImportError: y"
    env.run = lambda args, **kwargs: subprocess.CompletedProcess(args, 1, "", long)
    assert env.import_check()["traceback"] == long[-4000:]


def test_an_import_from_elsewhere_or_another_version_read_is_refused_naming_the_venv_to_delete(tmp_path):
    env, site = venv_env(tmp_path)
    venv = tmp_path / "venv"
    here = str(site / "omnivoice" / "models" / "omnivoice.py")

    def answering(file, version):
        out = json.dumps({"file": file, "metadata_version": version})
        return lambda args, **kwargs: subprocess.CompletedProcess(args, 0, out + "\n", "")

    env.run = answering("/elsewhere/omnivoice/models/omnivoice.py", "0.2.1")
    assert env.import_check() == {"ok": False, "error": f"omnivoice imported from /elsewhere/omnivoice/models/"
                                  f"omnivoice.py, not from {site}: the candidate is shadowed; delete {venv} and rerun",
                                  "traceback": ""}
    env.run = answering(here, "0.2.0")
    assert env.import_check() == {"ok": False, "error": f"importlib.metadata in {env.python} reads omnivoice 0.2.0, "
                                  f"not the candidate's omnivoice 0.2.1 (this environment's, through the shared "
                                  f"site): delete {venv} and rerun", "traceback": ""}


def test_a_venv_where_no_distribution_installs_the_package_is_refused_before_the_import(tmp_path):
    env, _ = venv_env(tmp_path)

    def missing():
        raise cand.CandidateError("no distribution in the venv")

    env.distribution = missing
    env.run = None  # never reached
    assert env.import_check() == {"ok": False, "error": "no distribution in the venv", "traceback": ""}


def ls_remote(monkeypatch, stdout="", returncode=0, stderr=""):
    asked = []

    def git(*args, **kwargs):
        asked.append(args)
        return subprocess.CompletedProcess(args, returncode, stdout, stderr)

    monkeypatch.setattr(cand, "git", git)
    return asked


def test_the_commit_of_a_ref_prefers_the_exact_name_then_the_branch_then_the_tags_commit(monkeypatch):
    lines = "\n".join(["a" * 40 + "\trefs/tags/v1", "b" * 40 + "\trefs/tags/v1^{}", "c" * 40 + "\trefs/heads/v1",
                       "no tab here", "d" * 40 + "\tHEAD"]) + "\n"
    asked = ls_remote(monkeypatch, lines)
    spec = cand.parse_spec("git+https://host/owner/repo@v1")
    assert cand.remote_commit(spec) == "c" * 40, "a branch named like a tag is what pip checks out"
    assert asked == [("ls-remote", "https://host/owner/repo", "v1", "v1^{}")]
    ls_remote(monkeypatch, lines.replace("refs/heads/v1", "refs/heads/main"))
    assert cand.remote_commit(spec) == "b" * 40, "an annotated tag: the commit it points at, not the tag object"
    ls_remote(monkeypatch, "a" * 40 + "\trefs/tags/v1\n")
    assert cand.remote_commit(spec) == "a" * 40, "a lightweight tag"
    asked = ls_remote(monkeypatch, lines)
    assert cand.remote_commit(cand.parse_spec("git+https://host/owner/repo")) == "d" * 40
    assert asked == [("ls-remote", "https://host/owner/repo", "HEAD", "HEAD^{}")]


@pytest.mark.parametrize("stderr, gate_side", [
    ("fatal: unable to access 'https://host/owner/repo/': Could not resolve host: host", True),
    ("fatal: repository 'https://host/owner/repo/' not found", False),
])
def test_a_failed_ls_remote_is_refused_with_gits_words_on_the_side_they_name(monkeypatch, stderr, gate_side):
    ls_remote(monkeypatch, returncode=128, stderr="\n" + stderr + "\n")
    with pytest.raises(cand.CandidateError) as failed:
        cand.remote_commit(cand.parse_spec("git+https://host/owner/repo@main"))
    assert (str(failed.value), failed.value.gate_side) == (f"git ls-remote https://host/owner/repo failed: {stderr}",
                                                           gate_side)


def test_a_venv_made_for_another_spec_layout_or_environment_is_made_again(monkeypatch):
    spec = cand.parse_spec("omnivoice==0.2.0")
    made = {"spec": spec.name, "main_site": str(cand.MAIN_SITE), "layout": cand.LAYOUT}
    assert cand._reusable(spec, made), "a release's venv serves while spec, site and layout are the same"
    for key, other in (("spec", "omnivoice-0.1.5"), ("main_site", "/other/site"), ("layout", cand.LAYOUT + 1)):
        assert not cand._reusable(spec, {**made, key: other}), key
    assert not cand._reusable(spec, {}), "a marker without them"


@pytest.mark.parametrize("ref, built, now, reusable", [
    ("main", "c" * 40, "c" * 40, True),
    ("main", "c" * 40, "d" * 40, False),
    ("cccc", "c" * 40, None, True),  # a commit id ls-remote does not list: the built commit starts with it
    ("dddd", "c" * 40, None, False),
    (None, "c" * 40, None, False),  # no ref and no HEAD listed: nothing to check it against
    ("main", "", "", False),
])
def test_a_git_venv_serves_only_while_its_ref_still_names_the_built_commit(monkeypatch, ref, built, now, reusable):
    spec = cand.parse_spec("git+https://host/owner/repo" + (f"@{ref}" if ref else ""))
    monkeypatch.setattr(cand, "remote_commit", lambda s: now)
    made = {"spec": spec.name, "main_site": str(cand.MAIN_SITE), "layout": cand.LAYOUT, "source": {"commit": built}}
    assert cand._reusable(spec, made) is reusable
