"""Which omnivoice releases the suite verifies, and the range fastpath declares for them.

A release is verified when every upstream name a patch or `fastpath.stream` relies on has a fingerprint recorded
for it (`fastpath/fingerprints.json`, so the patches apply on it) and its goldens are recorded
(`fixtures/goldens/<version>.json`). Both are recorded only after the version-bump gate's parity tier passed on
the release (docs/gate.md, "Reviewing a new upstream"). The releases the package index lists are kept in
`fixtures/upstream/omnivoice_releases.json`; the range in pyproject.toml must admit exactly the verified ones among
them (`tests_patches/test_omnivoice_range.py`), so a user's `pip install` gets a release the suite has checked and
every release it has checked stays installable (beside a server that needs an older one, for example).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness import REPO_ROOT

PYPROJECT = REPO_ROOT / "pyproject.toml"
RELEASES_FILE = REPO_ROOT / "fixtures" / "upstream" / "omnivoice_releases.json"
DISTRIBUTION = "omnivoice"


class VersionsError(RuntimeError):
    """The declared range or the records it is checked against cannot be read; the message names the fix."""


def declared_requirement(pyproject: Path = PYPROJECT) -> Requirement:
    """The omnivoice entry of [project] dependencies."""
    found = [Requirement(text) for text in tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]
             if Requirement(text).name == DISTRIBUTION]
    if len(found) != 1:
        raise VersionsError(f"{pyproject} declares {len(found)} omnivoice requirements in [project] dependencies; "
                            f"declare exactly one, e.g. \"omnivoice{range_for(verified_versions())}\"")
    return found[0]


def declared_range(pyproject: Path = PYPROJECT) -> SpecifierSet:
    return declared_requirement(pyproject).specifier


def fingerprinted_versions(known_file: Path | None = None) -> set:
    """The versions for which every relied-on upstream name has a recorded fingerprint."""
    from fastpath.fingerprints import KNOWN_FILE
    from fastpath.registry import relied_on

    known = json.loads(Path(known_file or KNOWN_FILE).read_text())["functions"]
    per_name = [{v for versions in known.get(name, {}).values() for v in versions} for name in relied_on()]
    return set.intersection(*per_name) if per_name else set()


def golden_versions(folder: Path | None = None) -> set:
    """The versions whose goldens are recorded: each file's own `omnivoice` field."""
    from harness.gate.goldens import GOLDENS_DIR

    return {json.loads(path.read_text())["omnivoice"] for path in sorted(Path(folder or GOLDENS_DIR).glob("*.json"))}


def verified_versions(known_file: Path | None = None, goldens: Path | None = None) -> list:
    """Fingerprinted and with goldens, oldest first."""
    return sorted(fingerprinted_versions(known_file) & golden_versions(goldens), key=Version)


def known_releases(path: Path = RELEASES_FILE) -> list:
    """The omnivoice releases the package index lists, as recorded, oldest first."""
    data = json.loads(Path(path).read_text())
    return sorted(data["releases"], key=Version)


def range_for(verified, releases=()) -> str:
    """The specifier that admits exactly `verified` among `releases` (and the verified ones themselves): from the
    oldest to the newest verified, with `!=` for each release between them that is not verified."""
    if not verified:
        raise VersionsError("no verified omnivoice version: record one's fingerprints and goldens (docs/gate.md)")
    ordered = sorted(set(verified), key=Version)
    low, high = ordered[0], ordered[-1]
    holes = [r for r in sorted(set(releases), key=Version)
             if Version(low) < Version(r) < Version(high) and r not in ordered]
    return ",".join([f">={low}", f"<={high}"] + [f"!={r}" for r in holes])


def admitted(specifier: SpecifierSet, versions) -> list:
    """The versions a specifier admits (pre-releases only when it names one, as pip decides; packaging >= 26's
    `contains` admits them by default, so the choice is passed explicitly)."""
    return [v for v in versions if specifier.contains(v, prereleases=bool(specifier.prereleases))]
