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
    assert cand.parse_spec(str(checkout)).name != spec.name
    (checkout / "omnivoice" / "__pycache__").mkdir()
    (checkout / "omnivoice" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    assert cand.parse_spec(str(checkout)).name == cand.parse_spec(str(checkout)).name


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
