"""The release step (harness.release.accept, `fastpath-suite release accept`): from the gate's MAY SHIP on an omnivoice
release to the change that releases on it. Each case runs on a copy of the files the step edits (a git checkout in
tmp_path), with a planted 0.2.2: the installed omnivoice copied, its version set to 0.2.2 and one relied-on function
changed (`_get_time_steps` clamps its result), and the gate's verdict on it written as the gate writes it (the
verdict rule itself decides its state). Never the worktree's own pyproject.toml or fingerprints.json."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT, release
from harness.__main__ import main as suite
from harness.gate import candidate as cand
from harness.gate import gate, versions
from harness.run import results as result_files

SPEC, VERSION = "omnivoice==0.2.2", "0.2.2"
PLANTED_EDIT = {"models/omnivoice.py": [("    return timesteps\n", "    return timesteps.clamp(0.0, 1.0)\n")]}
EDITED_FILES = ("pyproject.toml", "fastpath/fingerprints.json", "fixtures/upstream/omnivoice_releases.json")


def git(root: Path, *args) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=test", "-c", "user.email=test@example.invalid",
                           *args], capture_output=True, text=True, check=True).stdout.strip()


def a_report(python: Path, spec: str = SPEC, version: str = VERSION, blocked: str | None = None,
             left_out: tuple = ()) -> dict:
    """A gate report as run_gate writes verdict.json: the verdict rule's own state over planted check rows."""
    checks = [gate.Check("install", "pass", False, f"omnivoice {version} installs"),
              gate.Check("api", "pass", False, "every public function")]
    worse = {"fingerprints": "changed", "behaviour": "changed"}  # the status each check gives what it refuses
    checks += [gate.Check(name, worse.get(name, "fail") if name == blocked else "pass", name == blocked,
                          f"{name}: planted") for name in gate.BLOCKING if name not in left_out]
    checks.append(gate.Check("goldens", "pass", False, "identical to the 0.2.1 goldens"))
    report = gate.verdict(checks)
    report.update(candidate={"spec": spec, "distribution": "omnivoice", "version": version, "python": str(python)},
                  against={"spec": "current", "distribution": "omnivoice", "version": "0.2.1",
                           "python": sys.executable},
                  environment={}, command=f"fastpath-suite gate {spec} --results results/", accepted={}, seconds=321.5)
    return report


class Planted:
    """A checkout of the files the step edits (committed), the candidate's venv site, and the gate's folder."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "checkout"
        for rel in EDITED_FILES:
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO_ROOT / rel, self.root / rel)
        shutil.copytree(REPO_ROOT / "fixtures" / "goldens", self.root / "fixtures" / "goldens")
        (self.root / "fastpath" / "loop.py").write_text("# the patches, as the gate judged them\n")
        git(self.root, "init", "-q")
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", "the checkout the gate ran on")
        self.commit = git(self.root, "rev-parse", "HEAD")
        self.checkout = release.Checkout(self.root)
        self.venv = tmp_path / "venv"
        self.site = self.venv / "lib" / "python3.11" / "site-packages"
        cand.edited_copy(self.site, PLANTED_EDIT, VERSION)
        self.out = tmp_path / "out"
        self.out.mkdir()

    def gate_ran(self, report: dict, dirty: bool = False, record: bool = True, goldens: bool = True) -> dict:
        """What `fastpath-suite gate SPEC --results results/` leaves: verdict.json and the observed goldens in the
        gate's folder, and the verdict gathered into results/gate/ with the commit it ran at."""
        (self.out / "verdict.json").write_text(json.dumps(report, indent=1))
        if goldens:
            observed = json.loads((REPO_ROOT / "fixtures" / "goldens" / "0.2.1.json").read_text())
            observed["omnivoice"] = report["candidate"]["version"]  # stock unchanged: 0.2.1's outputs
            (self.out / f"goldens-{cand.parse_spec(report['candidate']['spec']).name}.json").write_text(
                json.dumps(observed))
        if record:
            entry = {**gate.results_figures(report), "command": report["command"], "commit": self.commit,
                     "dirty": dirty, "date": "2026-12-06T12:00:00Z"}
            self.record([entry])
        return report

    def record(self, entries: list, name: str | None = None) -> Path:
        """A "gate" results file of these verdicts in results/gate/: this machine's, or another's by `name`."""
        folder = self.root / "results" if name is None else self.root.parent / "elsewhere"
        path = result_files.record("gate", {"verdicts": entries}, folder, commit=self.commit)
        return path if name is None else path.rename(self.root / "results" / "gate" / name)

    def state(self) -> dict:
        """sha256 of every file of the checkout outside .git: what a refused step must leave as it was."""
        return {p.relative_to(self.root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.rglob("*")) if p.is_file() and ".git" not in p.parts}

    def accept(self, spec: str = SPEC, **kwargs):
        return release.accept(spec, self.out, self.checkout, **kwargs)


@pytest.fixture
def planted(tmp_path):
    return Planted(tmp_path)


def refused(planted: Planted, match: str, spec: str = SPEC, **kwargs):
    before = planted.state()
    with pytest.raises(release.Refused, match=match):
        planted.accept(spec, **kwargs)
    assert planted.state() == before, "a refused step wrote to the checkout"


def test_without_a_verdict_the_step_is_refused_as_not_judged(planted, capsys):
    refused(planted, r"not judged: no gate verdict at .*verdict\.json\. Fix: run `fastpath-suite gate "
                     r"omnivoice==0\.2\.2 --results results/` first")
    assert suite(["release", "accept", SPEC, "--gate-out", str(planted.out)]) == 1  # the command: exit 1, said why
    assert capsys.readouterr().out.startswith("REFUSED: not judged: no gate verdict")


@pytest.mark.parametrize("blocked, left_out, said", [
    ("parity", (), r"MUST NOT SHIP \(blocked by: parity\), not MAY SHIP"),
    ("fingerprints", (), r"MUST NOT SHIP \(blocked by: fingerprints\), not MAY SHIP"),
    (None, ("work",), r"INCOMPLETE: no verdict, checks the verdict needs not run whole: work \(left out"),
], ids=["must-not-ship-parity", "must-not-ship-fingerprints", "incomplete"])
def test_a_verdict_other_than_may_ship_is_refused_naming_it(planted, blocked, left_out, said):
    planted.gate_ran(a_report(planted.venv / "bin" / "python", blocked=blocked, left_out=left_out))
    refused(planted, said)


def test_a_may_ship_written_over_a_blocked_verdict_is_refused(planted):
    """The state is read from the checks' fields, as the gate decides it: a state edited to may-ship is not one."""
    report = a_report(planted.venv / "bin" / "python", blocked="parity")
    report.update(state="may-ship", ship=True)
    planted.gate_ran(report)
    refused(planted, r"says MAY SHIP, but its checks say must-not-ship \(blocked by: parity")


def test_a_verdict_on_another_version_is_refused(planted):
    planted.gate_ran(a_report(planted.venv / "bin" / "python", spec="omnivoice==0.2.3", version="0.2.3"))
    refused(planted, r"the verdict is on omnivoice==0\.2\.3 \(omnivoice 0\.2\.3\), not omnivoice==0\.2\.2")
    other = planted.venv.parent / "other-site"  # the verdict on 0.2.2, a source of another release
    cand.edited_copy(other, {}, "0.2.1")
    planted.gate_ran(a_report(planted.venv / "bin" / "python"))
    refused(planted, r"holds omnivoice 0\.2\.1, and the verdict is on omnivoice 0\.2\.2", source=other)


@pytest.mark.parametrize("text, said", [
    ("{not json", r"verdict\.json is not readable as JSON"),
    (json.dumps({"kind": "nightly", "points": {}}), r"is not a verdict of `fastpath-suite gate` \(no state, checks"),
], ids=["not-json", "foreign"])
def test_a_corrupt_or_foreign_verdict_is_an_error_naming_the_file(planted, capsys, text, said):
    (planted.out / "verdict.json").write_text(text)
    with pytest.raises(release.StepError, match=said):
        planted.accept()
    assert suite(["release", "accept", SPEC, "--gate-out", str(planted.out)]) == 2  # could not run: exit 2
    assert "error: the release step could not run:" in capsys.readouterr().err


def test_a_verdict_not_recorded_in_results_or_contradicted_there_is_refused(planted):
    report = planted.gate_ran(a_report(planted.venv / "bin" / "python"), record=False)
    refused(planted, r"not judged: the gate's verdict on omnivoice==0\.2\.2 is not recorded in .*results/gate/")
    entry = {**gate.results_figures(report), "command": report["command"], "commit": planted.commit, "dirty": True,
             "date": "2026-12-06T12:00:00Z"}
    planted.record([entry])
    refused(planted, r"made on a checkout with uncommitted changes, so it judged no commit")
    planted.record([{**entry, "dirty": False}])
    worse = a_report(planted.venv / "bin" / "python", blocked="work")
    planted.record([{**gate.results_figures(worse), "command": "fastpath-suite gate omnivoice==0.2.2", "dirty": False,
                     "commit": planted.commit, "date": "2026-12-05T12:00:00Z"}], name="another-machine.json")
    refused(planted, r"another-machine\.json also holds a verdict on omnivoice==0\.2\.2 against current "
                     r"\(2026-12-05T12:00:00Z\): MUST NOT SHIP \(blocked by: work\)")


def test_a_verdict_made_on_other_patches_is_stale(planted):
    planted.gate_ran(a_report(planted.venv / "bin" / "python"))
    (planted.root / "fastpath" / "loop.py").write_text("# the patches, changed after the gate ran\n")
    git(planted.root, "commit", "-q", "-am", "a patch changed")
    refused(planted, r"stale: the verdict on omnivoice==0\.2\.2 was made at \w{12}, and the patches changed since "
                     r"\(fastpath/loop\.py\)")
    (planted.root / "fastpath" / "loop.py").write_text("# the patches, as the gate judged them\n")
    (planted.root / "fastpath" / "new_patch.py").write_text("# not yet committed\n")
    refused(planted, r"the patches changed since \(fastpath/new_patch\.py\)")


# The patches' own check (fastpath.fingerprints.check, what apply() calls), run where the planted 0.2.2 is the
# omnivoice imported, against each fingerprints.json given: {label: the patches it refuses}.
CHECK = """
import json, sys
from pathlib import Path
import omnivoice.models.omnivoice as upstream
from fastpath import fingerprints
from fastpath.registry import PATCHES
out = {"version": fingerprints.omnivoice_version(), "file": upstream.__file__, "refused": {}}
for label, known in json.loads(sys.argv[1]).items():
    fingerprints.KNOWN_FILE = Path(known)
    out["refused"][label] = []
    for name, patch in sorted(PATCHES.items()):
        try:
            fingerprints.check(patch.relies_on, name)
        except fingerprints.UpstreamMismatchError:
            out["refused"][label].append(name)
print(json.dumps(out))
"""


def patches_refused(site: Path, known_files: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTPATH_ALLOW_UNVERIFIED_UPSTREAM",
                                                          "FASTPATH_REVIEWED_UPSTREAM", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT)]), PYTHONNOUSERSITE="1")
    done = subprocess.run([sys.executable, "-c", CHECK, json.dumps({k: str(v) for k, v in known_files.items()})],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)  # a hang guard
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_after_may_ship_the_range_widens_and_the_patches_accept_the_release(planted):
    before_file = planted.venv.parent / "fingerprints-before.json"
    shutil.copy(planted.checkout.known_file, before_file)
    planted.gate_ran(a_report(planted.venv / "bin" / "python"))
    assert not versions.declared_range(planted.checkout.pyproject).contains(VERSION)

    done = planted.accept()
    assert done.range == ">=0.1.5,<=0.2.2"
    assert versions.declared_range(planted.checkout.pyproject).contains(VERSION)
    assert dict(done.changed) == {"fastpath/fingerprints.json": "edited", "fixtures/goldens/0.2.2.json": "new",
                                  "fixtures/upstream/omnivoice_releases.json": "edited", "pyproject.toml": "edited"}
    assert done.fingerprints["_get_time_steps"][1] == [], "the planted change is a fingerprint not known before"
    assert all(before for name, (_, before) in done.fingerprints.items() if name != "_get_time_steps")
    # the repository's own agreements hold on the copy: the range admits exactly the verified releases
    # (tests_patches/test_omnivoice_range.py) and those the gate passes in results/gate (tests_harness/test_gate.py)
    verified = versions.verified_versions(planted.checkout.known_file, planted.checkout.goldens)
    releases = versions.known_releases(planted.checkout.releases)
    assert VERSION in verified and VERSION in releases
    assert versions.admitted(versions.declared_range(planted.checkout.pyproject), releases) == verified
    assert versions.range_for(verified, releases) == done.range

    found = patches_refused(planted.site, {"before": before_file, "after": planted.checkout.known_file})
    assert found["version"] == VERSION and Path(found["file"]).is_relative_to(planted.site), found
    assert found["refused"]["before"], "the planted 0.2.2 was not refused before the step: it plants nothing"
    assert found["refused"]["after"] == [], found

    recorded = planted.state()
    again = planted.accept()
    assert again.changed == [] and planted.state() == recorded, "a second run changed the checkout"
    git(planted.root, "add", "-A")
    git(planted.root, "commit", "-q", "-m", "omnivoice 0.2.2")  # committed: the verdict's commit is older now
    assert planted.accept().changed == [] and planted.state() == recorded


def test_the_command_prints_the_change_to_commit(planted):
    planted.gate_ran(a_report(planted.venv / "bin" / "python"))
    text = release.report_accepted(planted.accept(), SPEC, planted.root)
    assert "NEW: not known before" in text and "declared range: omnivoice>=0.1.5,<=0.2.2" in text
    assert re.search(r"^ pyproject\.toml +\| +2 \+-$", text, re.M), text  # git diff --stat of the edited files
    add = next(line for line in text.splitlines() if line.strip().startswith("git add "))
    record = next((planted.root / "results" / "gate").glob("*.json")).relative_to(planted.root).as_posix()
    assert shlex.split(add)[2:] == ["fastpath/fingerprints.json", "fixtures/goldens/0.2.2.json",
                                    "fixtures/upstream/omnivoice_releases.json", "pyproject.toml", record,
                                    "docs/results.md"]
    commit = shlex.split(next(line for line in text.splitlines() if line.strip().startswith("git commit ")))
    assert commit[:3] == ["git", "commit", "-m"] and commit[4] == "-m", commit
    assert commit[3] == ("omnivoice 0.2.2: MAY SHIP by the gate, recorded; the wheel admits it "
                         "(omnivoice>=0.1.5,<=0.2.2)")
    assert "1 not known before" in commit[5] and "commit " + planted.commit[:12] in commit[5], commit[5]
    assert "nothing to change" in release.report_accepted(planted.accept(), SPEC, planted.root)
