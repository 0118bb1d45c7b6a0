"""The omnivoice range fastpath declares is exactly the set of versions the suite verifies (harness/gate/versions.py):
no release it has not checked installs beside it, and none it has checked is refused (omnivoice-server 0.2.5, for
one, needs omnivoice < 0.2.0: docs/serving.md)."""

from __future__ import annotations

import json

import pytest
from packaging.specifiers import SpecifierSet

from harness.gate import versions


def test_the_declared_omnivoice_range_admits_exactly_the_verified_versions():
    declared = versions.declared_range()
    verified = versions.verified_versions()
    releases = versions.known_releases()
    fix = f"declare \"omnivoice{versions.range_for(verified, releases)}\" in pyproject.toml"
    assert verified, "no verified omnivoice version (fingerprints and goldens both recorded)"
    refused = [v for v in verified if not declared.contains(v)]
    assert not refused, f"omnivoice{declared} refuses verified version(s) {refused}: {fix}"
    unverified = [v for v in versions.admitted(declared, releases) if v not in verified]
    assert not unverified, (f"omnivoice{declared} admits release(s) the suite has not verified {unverified} "
                            f"(no recorded fingerprints or goldens): {fix}, or verify them (docs/gate.md)")
    assert set(verified) <= set(releases), (f"verified versions {sorted(set(verified) - set(releases))} are not in "
                                            f"{versions.RELEASES_FILE.name}: add them")


def test_the_installed_omnivoice_is_a_verified_version():
    """What the suite's own environment runs is one of the versions it verifies (the patches apply on it)."""
    from fastpath.fingerprints import omnivoice_version

    assert omnivoice_version() in versions.verified_versions()


@pytest.mark.parametrize("fingerprints, goldens, releases, expected", [
    # every release between the oldest and the newest verified: one interval
    ({"0.1.5", "0.2.0", "0.2.1"}, {"0.1.5", "0.2.0", "0.2.1"}, ["0.1.4", "0.1.5", "0.2.0", "0.2.1"], ">=0.1.5,<=0.2.1"),
    # goldens missing for one: it is left out, and the release between is excluded by name
    ({"0.1.5", "0.2.0", "0.2.1"}, {"0.1.5", "0.2.1"}, ["0.1.5", "0.2.0", "0.2.1"], ">=0.1.5,<=0.2.1,!=0.2.0"),
    # a fingerprint of one relied-on name missing for 0.2.1: the newest verified is 0.2.0
    ({"0.1.5", "0.2.0"}, {"0.1.5", "0.2.0", "0.2.1"}, ["0.1.5", "0.2.0", "0.2.1"], ">=0.1.5,<=0.2.0"),
])
def test_verified_versions_need_fingerprints_and_goldens_and_the_range_follows(tmp_path, fingerprints, goldens,
                                                                              releases, expected):
    """The verified set is computed from the records (not typed anywhere), and the range derived from it admits
    exactly it: the check above can fail."""
    from fastpath.fingerprints import KNOWN_FILE
    from fastpath.registry import relied_on

    known = json.loads(KNOWN_FILE.read_text())
    names = relied_on()
    # the last relied-on name lacks a fingerprint for the versions not in `fingerprints`
    for fps in known["functions"][names[-1]].values():
        fps[:] = [v for v in fps if v in fingerprints]
    known_file = tmp_path / "fingerprints.json"
    known_file.write_text(json.dumps(known))
    folder = tmp_path / "goldens"
    folder.mkdir()
    for version in goldens:
        (folder / f"{version}.json").write_text(json.dumps({"omnivoice": version}))
    verified = versions.verified_versions(known_file, folder)
    assert verified == sorted(fingerprints & goldens, key=lambda v: tuple(map(int, v.split("."))))
    spec = versions.range_for(verified, releases)
    assert spec == expected
    assert versions.admitted(SpecifierSet(spec), releases) == [r for r in releases if r in verified]


def test_a_range_that_drifts_from_the_verified_set_is_named(tmp_path):
    """A declared range one release too wide, and one that drops a verified version, fail with the fix."""
    verified, releases = versions.verified_versions(), versions.known_releases()
    older = [r for r in releases if versions.Version(r) < versions.Version(verified[0])]
    for requirement, wrong in ((f"omnivoice>={older[-1]},<={verified[-1]}", older[-1]),
                               (f"omnivoice>={verified[-1]}", verified[0])):
        pyproject = tmp_path / "pyproject.toml"
        pyproject.write_text(f'[project]\nname = "x"\ndependencies = ["{requirement}", "torch>=2.4"]\n')
        declared = versions.declared_range(pyproject)
        assert set(versions.admitted(declared, releases)) != set(verified), requirement
        assert (wrong in versions.admitted(declared, releases)) != (wrong in verified), requirement


def test_a_pyproject_without_one_omnivoice_requirement_is_refused_with_the_fix(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["torch>=2.4"]\n')
    with pytest.raises(versions.VersionsError, match=r'declare exactly one, e\.g\. "omnivoice>='):
        versions.declared_range(pyproject)


def test_a_range_needs_a_verified_version_and_says_how_to_get_one():
    with pytest.raises(versions.VersionsError, match=r"^no verified omnivoice version: record one's fingerprints and "
                                                     r"goldens \(docs/gate\.md\)$"):
        versions.range_for([])


@pytest.mark.parametrize("verified, releases, expected", [
    # versions ordered as versions (0.12.0 is newer than 0.9.0), duplicates once, releases outside the range unnamed
    (["0.12.0", "0.2.1", "0.9.0", "0.2.1"],
     ["0.12.0", "0.10.0", "0.2.1", "0.3.0", "0.9.0", "0.9.1", "0.1.0", "0.13.0", "0.2.1"],
     ">=0.2.1,<=0.12.0,!=0.3.0,!=0.9.1,!=0.10.0"),
    (["0.2.0"], (), ">=0.2.0,<=0.2.0"),
    (["0.2.0", "0.1.5"], ["0.1.5", "0.2.0"], ">=0.1.5,<=0.2.0"),
    # the index may spell a verified release otherwise (0.1.5.0 is 0.1.5): it is not a release to exclude
    (["0.1.5", "0.2.0"], ["0.1.5.0", "0.1.9", "0.2"], ">=0.1.5,<=0.2.0,!=0.1.9"),
])
def test_the_range_runs_from_the_oldest_to_the_newest_verified_and_names_each_release_between_left_out(
        verified, releases, expected):
    assert versions.range_for(verified, releases) == expected


def test_a_pre_release_is_admitted_only_by_a_range_that_names_one():
    releases = ["0.1.0", "0.2.0", "0.3.0rc1", "0.3.0", "0.4.0"]
    assert versions.admitted(SpecifierSet(">=0.2.0,<=0.3.0"), releases) == ["0.2.0", "0.3.0"]
    assert versions.admitted(SpecifierSet(">=0.3.0rc1"), releases) == ["0.3.0rc1", "0.3.0", "0.4.0"]


def test_the_declared_requirement_is_the_omnivoice_entry_and_two_of_them_are_refused(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["torch>=2.4", "omnivoice>=0.1.5,<=0.2.1", "numpy"]\n')
    requirement = versions.declared_requirement(pyproject)
    assert (requirement.name, str(requirement.specifier)) == ("omnivoice", "<=0.2.1,>=0.1.5")
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["omnivoice>=0.1.5", "torch>=2.4", '
                         '"omnivoice<=0.2.1; python_version >= \'3.10\'"]\n')
    fix = r"pyproject\.toml declares 2 omnivoice requirements in \[project\] dependencies; declare exactly one, e\.g\. "
    with pytest.raises(versions.VersionsError, match=fix + r"\"omnivoice>=[^,]+,<=[^\"]+\"$"):
        versions.declared_requirement(pyproject)


def records(tmp_path, monkeypatch, fingerprints: dict, goldens: dict):
    """A fingerprints file and a goldens folder, with two relied-on names."""
    monkeypatch.setattr("fastpath.registry.relied_on", lambda: ["Model.a", "Model.b"])
    known_file = tmp_path / "fingerprints.json"
    known_file.write_text(json.dumps({"functions": fingerprints}))
    folder = tmp_path / "goldens"
    folder.mkdir()
    for name, version in goldens.items():
        (folder / name).write_text(json.dumps({"omnivoice": version}))
    (folder / "notes.txt").write_text(json.dumps({"omnivoice": "9.9.9"}))
    return known_file, folder


def test_a_version_is_fingerprinted_when_every_relied_on_name_has_a_fingerprint_for_it(tmp_path, monkeypatch):
    known_file, _ = records(tmp_path, monkeypatch, {
        "Model.a": {"fp1": ["0.9.0", "0.10.0"], "fp2": ["0.2.0"]},
        "Model.b": {"fp3": ["0.10.0", "0.2.0", "0.3.0"], "fp4": ["0.9.0"]},
        "Model.c": {"fp5": ["0.3.0"]}}, {})
    assert versions.fingerprinted_versions(known_file) == {"0.2.0", "0.9.0", "0.10.0"}
    known_file.write_text(json.dumps({"functions": {"Model.a": {"fp1": ["0.9.0"]}}}))
    assert versions.fingerprinted_versions(known_file) == set()  # Model.b has no fingerprint at all
    monkeypatch.setattr("fastpath.registry.relied_on", lambda: [])
    assert versions.fingerprinted_versions(known_file) == set()


def test_verified_versions_are_fingerprinted_and_have_goldens_read_from_each_files_own_field(tmp_path, monkeypatch):
    known_file, folder = records(tmp_path, monkeypatch, {
        "Model.a": {"fp1": ["0.2.0", "0.9.0", "0.10.0"]}, "Model.b": {"fp2": ["0.2.0", "0.9.0", "0.10.0"]}},
        {"latest.json": "0.10.0", "b.json": "0.9.0", "c.json": "0.3.0"})
    assert versions.golden_versions(folder) == {"0.3.0", "0.9.0", "0.10.0"}
    assert versions.verified_versions(known_file, folder) == ["0.9.0", "0.10.0"]
