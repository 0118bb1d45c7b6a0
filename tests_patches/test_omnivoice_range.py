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
