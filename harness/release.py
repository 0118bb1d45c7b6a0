"""Two steps on the way to a release: the distribution's name, and from the gate's MAY SHIP to the change that
releases on that omnivoice (docs/release.md).

    fastpath-suite maintain name-check                      # the name in pyproject.toml
    fastpath-suite maintain name-check --results results/   # and the look-up as a results file (docs/release.md)
    fastpath-suite release accept omnivoice==0.2.2          # after the gate's MAY SHIP on it (docs/release.md)

The name is asked of the index with pip's own client, `pip index versions NAME`, against the index pip is
configured for (its configuration is recorded beside the answer), and so are the names it must stay clear of
(NEAR: `fastpath`, the import package's name, which another project holds, and the public peer
`omnivoice-fastpath`). Beside the index's answer, two rules: the name is none of NEAR in PEP 503's normal form, and it
does not hold NEAR's distinctive word ("fastpath"), so that it cannot be taken for the peer (`fastpath-omnivoice`
would be free and still confuse).

Exit status of name-check: 0 the name is free and clear; 1 taken, or too near another; 2 the index could not be asked
(pip's message printed: no answer is not a free name). `release accept`: below, at ACCEPT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness import DISTRIBUTION, REPO_ROOT
from harness.run import results as result_files
from harness.run.results import hand_over

NEAR = ("fastpath", "omnivoice-fastpath")  # taken, and what users of this field already know
CLEAR_OF = ("fastpath",)  # a word a name here must not hold: the peer's distinctive part, and the import name's
NOT_FOUND = "No matching distribution found"


def normalize(name: str) -> str:
    """PEP 503's normal form: what the index treats as the same name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def ask_index(name: str, pip: tuple = (sys.executable, "-m", "pip")) -> dict:
    """pip's answer for one name: {"name", "taken", "versions", "output"}; raises IndexUnreachable when pip fails
    for another reason than "no such distribution"."""
    done = subprocess.run([*pip, "index", "versions", name, "--disable-pip-version-check"], capture_output=True,
                          text=True, timeout=300)
    text = (done.stdout + done.stderr).strip()
    said = [line for line in text.splitlines() if not line.startswith("WARNING:")]  # file:// mirrors without it
    if done.returncode == 0:
        found = re.search(r"^\S+ \(([^)]+)\)", done.stdout, re.M)  # "NAME (LATEST)", NAME as the index spells it
        versions = re.search(r"Available versions: (.+)", done.stdout)
        return {"name": name, "taken": True, "latest": found.group(1) if found else None,
                "versions": versions.group(1).split(", ") if versions else [], "output": said}
    if NOT_FOUND in text:
        return {"name": name, "taken": False, "latest": None, "versions": [], "output": said}
    raise IndexUnreachable(f"pip could not ask the index about {name!r} (exit {done.returncode}):\n{text}\n"
                           "Fix: check the network and pip's index settings (`pip config list`), then rerun")


class IndexUnreachable(RuntimeError):
    pass


def too_near(name: str) -> list[str]:
    """Why `name` could be taken for another project (empty: it could not)."""
    reasons = [f"it is {other!r} to the index (PEP 503)" for other in NEAR if normalize(name) == normalize(other)]
    words = set(normalize(name).split("-"))
    reasons += [f"it holds {word!r}, the word that names {', '.join(NEAR)}" for word in CLEAR_OF if word in words]
    return reasons


def pip_settings(pip: tuple = (sys.executable, "-m", "pip")) -> dict:
    done = subprocess.run([*pip, "config", "list"], capture_output=True, text=True, timeout=60)
    version = subprocess.run([*pip, "--version"], capture_output=True, text=True, timeout=60).stdout.split(" from ")[0]
    configured = re.search(r"^[^=]*\.index-url='([^']+)'", done.stdout, re.M)
    index = os.environ.get("PIP_INDEX_URL") or (configured.group(1) if configured else "https://pypi.org/simple")
    return {"pip": version.strip(), "index_url": index, "config": done.stdout.strip().splitlines()}


def check(name: str = DISTRIBUTION, pip: tuple = (sys.executable, "-m", "pip")) -> dict:
    """The index's answers for `name` and NEAR, the rules' reasons, and the verdict: free, taken or too near."""
    answers = [ask_index(n, pip) for n in (name, *NEAR)]
    reasons = too_near(name)
    mine = answers[0]
    verdict = "free" if not mine["taken"] and not reasons else "taken" if mine["taken"] else "too near"
    return {"name": name, "verdict": verdict, "reasons": reasons, "answers": answers, "index": pip_settings(pip)}


def format_check(figures: dict) -> str:
    lines = [f"{figures['name']}: {figures['verdict'].upper()}"]
    for a in figures["answers"]:
        lines.append(f"  pip index versions {a['name']}: "
                     + (f"taken ({a['latest']}; {len(a['versions'])} versions)" if a["taken"] else "not on the index"))
    lines += [f"  too near: {r}" for r in figures["reasons"]]
    return "\n".join(lines)


def render_results(figures: dict) -> str:
    lines = [f"The distribution's name `{figures['name']}`: **{figures['verdict']}**, asked of the index with "
             f"{figures['index']['pip']} (`pip index versions NAME`) from {figures['index']['index_url']} (pip's "
             f"settings: {'; '.join(figures['index']['config']) or 'none'}).", "",
             "| name | on the index | latest | pip said |", "|---|---|---|---|"]
    for a in figures["answers"]:
        said = " ".join(a["output"])[:160].replace("|", "/")
        lines.append(f"| `{a['name']}` | {'taken' if a['taken'] else 'free'} | {a['latest'] or ''} | {said} |")
    if figures["reasons"]:
        lines += ["", "Too near another project: " + "; ".join(figures["reasons"]) + "."]
    return "\n".join(lines) + "\n"


hand_over({"name": render_results})  # this job's results kind, for the docs pages (harness.run.results)


class Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, the example line kept as written."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite maintain name-check", formatter_class=Help,
                                     description="The distribution's name on the package index: free for this "
                                                 "project, and not one a user takes for another.")
    parser.add_argument("name", nargs="?", default=DISTRIBUTION, help="the name to check: pyproject.toml's by default")
    result_files.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        figures = check(args.name)
    except IndexUnreachable as err:
        print(f"fastpath-suite maintain name-check: {err}", file=sys.stderr)
        return 2
    print(format_check(figures))
    result_files.write_if_asked(args, "name", figures)
    return 0 if figures["verdict"] == "free" else 1




# --- from the gate's MAY SHIP to a release: `fastpath-suite release accept` ----------------------------------------

ACCEPT = """From the gate's MAY SHIP on an omnivoice release to the change that releases on it (docs/release.md).

    fastpath-suite gate omnivoice==0.2.2 --results results/     # the verdict: out/gate/omnivoice-0.2.2, results/gate/
    fastpath-suite release accept omnivoice==0.2.2              # the change to commit

Refused (exit 1, the reason and its fix printed) unless the gate's verdict on exactly that release is MAY SHIP: read
from the gate's folder (verdict.json, whose state must follow from its checks' fields as the gate reads them), and
recorded in results/gate/ by the same run (the record the declared range is checked against; every verdict there on
the release must be MAY SHIP), made at a commit of this checkout with nothing uncommitted, whose patches (fastpath/,
its fingerprints.json aside) are this checkout's as it is now. Then it writes, in this checkout:

  fastpath/fingerprints.json   the release under the candidate's fingerprint of every upstream name a patch relies
                               on, read from the source the gate judged (its venv, or --source) as the gate reads it
  fixtures/goldens/V.json      the goldens the gate observed (OUT/goldens-<name>.json), or this machine's hashes
                               added to those recorded
  fixtures/upstream/omnivoice_releases.json   the release, when the list lacks it
  pyproject.toml               the omnivoice range the records now verify, which must admit what it admitted and V

and prints what changed and the commit to make; it commits nothing, and a second run changes nothing. Exit 0: done
(or nothing left to change); 1: refused, or not judged (no verdict); 2: a file it reads is corrupt or not what it
should be (named, with the fix).
"""

VERDICT_FILE = "verdict.json"
PACKAGE = "omnivoice"


class Refused(RuntimeError):
    """The verdict does not let this release through (or there is none); the message says why and names the fix."""


class StepError(RuntimeError):
    """A file the step reads is corrupt or not the one it should be; the message names it and the fix."""


@dataclass(frozen=True)
class Checkout:
    """The files of a checkout that the step reads and writes (this one, or a copy of them in a test)."""

    root: Path

    @property
    def pyproject(self) -> Path:
        return self.root / "pyproject.toml"

    @property
    def known_file(self) -> Path:
        return self.root / "fastpath" / "fingerprints.json"

    @property
    def goldens(self) -> Path:
        return self.root / "fixtures" / "goldens"

    @property
    def releases(self) -> Path:
        return self.root / "fixtures" / "upstream" / "omnivoice_releases.json"

    @property
    def results(self) -> Path:
        return self.root / "results"


@dataclass
class Accepted:
    version: str
    range: str  # the declared omnivoice range after the step
    fingerprints: dict  # {name: (fingerprint, [versions it was known in before])}
    verdict: str  # where the verdict is recorded, and when
    record: str  # the results file that records it, relative to the root (committed with the change)
    changed: list = field(default_factory=list)  # [(path relative to the root, "new" | "edited")]


def release_spec(text: str) -> str:
    """argparse type: an upstream omnivoice release pinned to one version (the range is omnivoice's)."""
    try:
        req = Requirement(text)
    except InvalidRequirement as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a requirement ({err}): give omnivoice==X.Y.Z") from None
    pins = [s.version for s in req.specifier if s.operator == "=="]
    if canonicalize_name(req.name) != PACKAGE or len(pins) != 1 or len(req.specifier) != 1 or req.extras \
            or req.marker or req.url:
        raise argparse.ArgumentTypeError(f"{text!r}: give omnivoice==X.Y.Z, the upstream release the gate passed (a "
                                         f"fork, a wheel or a folder is no release of omnivoice: its range is not "
                                         f"widened by its verdict)")
    return text


def read_verdict(folder: Path, spec: str) -> tuple:
    """(report, checks) of the gate's verdict.json in `folder`: Refused (not judged) when there is none, StepError
    when it is not a gate's verdict."""
    from harness.gate import gate

    path = Path(folder) / VERDICT_FILE
    if not path.is_file():
        raise Refused(f"not judged: no gate verdict at {path}. Fix: run `fastpath-suite gate {spec} --results "
                      f"results/` first (or pass --gate-out the folder it wrote)")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StepError(f"{path} is not readable as JSON ({err}). Fix: rerun the gate, which writes it") from None
    need = {"state": str, "checks": list, "candidate": dict, "against": dict, "seconds": (int, float)}
    wrong = [k for k, kind in need.items() if not isinstance(report.get(k) if isinstance(report, dict) else None,
                                                             kind)]
    if not wrong and not all(isinstance(report[side].get("spec"), str) for side in ("candidate", "against")):
        wrong = ["candidate.spec or against.spec"]
    if wrong:
        raise StepError(f"{path} is not a verdict of `fastpath-suite gate` (no {', '.join(wrong)}). Fix: give "
                        f"--gate-out the folder the gate wrote, or rerun the gate")
    try:
        checks = [gate.Check(**c) for c in report["checks"]]
    except (TypeError, ValueError) as err:
        raise StepError(f"{path}: its checks are not the gate's ({err}). Fix: rerun the gate") from None
    return report, checks


def rule_may_ship(report: dict, checks: list, spec: str) -> str:
    """The release a verdict lets through (its version), else Refused: the verdict is on `spec` exactly, from the
    index, installs omnivoice itself (not a fork), and says MAY SHIP because its checks' fields do (gate.verdict,
    as the gate decided), not because its state was written so."""
    from harness.gate import gate

    candidate = report["candidate"]
    if candidate["spec"] != spec:
        raise Refused(f"the verdict is on {candidate['spec']} (omnivoice {candidate.get('version')}), not {spec}. "
                      f"Fix: run `fastpath-suite gate {spec} --results results/`, or accept {candidate['spec']}")
    if report["state"] != "may-ship":
        try:
            said = gate.headline(report)
        except (KeyError, TypeError):
            said = report["state"].upper()
        raise Refused(f"the gate's verdict on {spec} is {said}, not MAY SHIP. Fix: a release needs the gate's MAY "
                      f"SHIP: read its verdict.md (docs/gate.md, 'Reviewing a new upstream') and rerun the gate")
    found = gate.verdict(checks)
    if found["state"] != "may-ship":
        blocked, not_run = ", ".join(found["blocked_by"]) or "none", ", ".join(found["not_run"]) or "none"
        raise Refused(f"the verdict on {spec} says MAY SHIP, but its checks say {found['state']} (blocked by: "
                      f"{blocked}; not run whole: {not_run}): it was edited, or written by another gate. Fix: rerun "
                      f"the gate")
    pinned = spec.partition("==")[2]
    if canonicalize_name(candidate.get("distribution") or "") != PACKAGE or candidate.get("version") != pinned:
        raise Refused(f"the verdict on {spec} judged {candidate.get('distribution')} {candidate.get('version')}, not "
                      f"omnivoice {pinned}. Fix: rerun the gate on {spec}")
    return pinned


def recorded_verdicts(results: Path, spec: str) -> list:
    """[(file, verdict)] of every verdict on `spec` in results/gate/*.json: every machine, every --against."""
    from harness.run import results as result_files

    out = []
    for path in sorted((Path(results) / "gate").glob("*.json")):
        try:
            figures = result_files.load(path)["figures"]
        except result_files.ResultsError as err:
            raise StepError(str(err)) from None
        entries = figures.get("verdicts") or ([figures] if "state" in figures else [])  # one verdict: the old layout
        out += [(path, v) for v in entries if v.get("candidate", {}).get("spec") == spec]
    return out


def same_run(report: dict, entry: dict) -> bool:
    """Whether a results/gate verdict was written by the gate run that wrote `report` (verdict.json): the same
    candidate, --against, state, seconds and checks."""
    def key(v):
        return (v["candidate"]["spec"], v["candidate"].get("version"), v["against"]["spec"], v["state"],
                v.get("seconds"), [(c["name"], c["status"]) for c in v.get("checks", [])])

    try:
        return key(report) == key(entry)
    except (KeyError, TypeError):
        return False


def rule_recorded(report: dict, entries: list, spec: str, results: Path) -> tuple:
    """The (file, verdict) in results/gate/ of the run that wrote `report`, else Refused: not recorded there (the
    range is checked against that record), another verdict on the release there that is not MAY SHIP, or a run on
    uncommitted changes or no commit (it judged no commit of the patches)."""
    from harness.gate import gate

    same = [(path, e) for path, e in entries if same_run(report, e)]
    if not same:
        raise Refused(f"not judged: the gate's verdict on {spec} is not recorded in {results}/gate/ ({len(entries)} "
                      f"other verdict(s) on it there). Fix: rerun `fastpath-suite gate {spec} --results results/`: "
                      f"results/gate/ is the record the declared range is checked against")
    for path, e in entries:
        if e.get("state") != "may-ship":
            try:
                said = gate.headline(e)
            except (KeyError, TypeError):
                said = str(e.get("state")).upper()
            raise Refused(f"{path.name} also holds a verdict on {spec} against {e['against']['spec']} "
                          f"({e.get('date', 'undated')}): {said}; the range may admit only a release every recorded "
                          f"verdict passes. Fix: rerun the gate there with --results, or remove that verdict and say "
                          f"why in the commit")
    path, entry = same[-1]
    if entry.get("dirty") or not entry.get("commit"):
        raise Refused(f"the verdict on {spec} ({path.name}) was made "
                      + ("on a checkout with uncommitted changes" if entry.get("commit") else "outside a git checkout")
                      + ", so it judged no commit of the patches. Fix: commit what it ran on (the fingerprints you "
                        f"recorded, say) and rerun `fastpath-suite gate {spec} --results results/`")
    return path, entry


def patches_changed_since(root: Path, commit: str) -> list:
    """The files of fastpath/ (its fingerprints.json aside: this step writes it) that differ between `commit` and
    the checkout as it is now, tracked or untracked: a verdict made on other patches says nothing of these."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    if git("rev-parse", "--git-dir").returncode:
        raise StepError(f"{root} is not a git checkout: the step compares the patches with those the gate judged "
                        f"(its commit). Fix: run it in the checkout the gate ran in")
    if git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode:
        raise Refused(f"the verdict's commit {commit[:12]} is not in this checkout's history (a shallow clone, or "
                      f"another repository's verdict). Fix: fetch it (`git fetch --unshallow`), or rerun the gate here")
    paths = ["--", "fastpath", ":(exclude)fastpath/fingerprints.json"]
    changed, untracked = git("diff", "--name-only", commit, *paths), git("ls-files", "--others", "--exclude-standard",
                                                                          *paths)
    if changed.returncode or untracked.returncode:
        raise StepError(f"git could not compare fastpath/ with {commit[:12]}: {changed.stderr}{untracked.stderr}")
    return sorted(set(changed.stdout.split()) | set(untracked.stdout.split()))


def candidate_site(report: dict, version: str, source: Path | None = None) -> Path:
    """The folder holding the omnivoice the gate judged (its venv's site-packages, from verdict.json's interpreter),
    or `source`; Refused when it is gone or holds another release."""
    from harness.gate import candidate as cand

    if source is None:
        venv = Path(report["candidate"].get("python") or "/nonexistent/bin/python").parents[1]
        sites = [s for s in sorted(venv.glob("lib/python*/site-packages")) if (s / cand.UPSTREAM_FILE).is_file()]
        if len(sites) != 1:
            raise Refused(f"the environment the gate judged omnivoice {version} in ({venv}) is gone. Fix: rerun the "
                          f"gate (it makes it again), or pass --source FOLDER holding omnivoice/ and its dist-info")
        source = sites[0]
    source = Path(source)
    if not (source / cand.UPSTREAM_FILE).is_file():
        raise Refused(f"{source} holds no {cand.UPSTREAM_FILE}. Fix: --source is a folder holding omnivoice/ and its "
                      f"dist-info (a site-packages)")
    try:
        name, found = cand.provider(source)
    except cand.CandidateError as err:
        raise Refused(f"{source}: {err}") from None
    if canonicalize_name(name) != PACKAGE or found != version:
        raise Refused(f"{source} holds {name} {found}, and the verdict is on omnivoice {version}: the fingerprints "
                      f"recorded must be those of the release the gate judged. Fix: pass the source of omnivoice "
                      f"{version}")
    return source


def candidate_fingerprints(site: Path, version: str) -> dict:
    """{relied-on name: fingerprint} of the candidate's source, as the gate reads it (gate.fingerprint_rows)."""
    from fastpath import fingerprints
    from fastpath.registry import relied_on
    from harness.gate import candidate as cand

    found = fingerprints.fingerprints_in((site / cand.UPSTREAM_FILE).read_text(encoding="utf-8"), relied_on())
    missing = [n for n, fp in found.items() if fp is None]
    if missing:
        raise Refused(f"omnivoice {version} does not define {', '.join(missing)}, which the patches rely on: they "
                      f"cannot apply on it. Fix: the patches must change first (docs/gate.md)")
    return found


def with_fingerprints(text: str, found: dict, version: str) -> str:
    """fingerprints.json's text with `version` under each name's fingerprint in `found`: what
    fastpath.fingerprints.record writes, into this checkout's file rather than the imported package's."""
    data = json.loads(text)
    for name, fp in sorted(found.items()):
        versions = data["functions"].setdefault(name, {}).setdefault(fp, [])
        if version not in versions:
            versions.append(version)
            versions.sort()
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def with_goldens(checkout: Checkout, gate_out: Path, name: str, version: str) -> tuple:
    """(path, new text or None) of fixtures/goldens/<version>.json: the gate's observed goldens, or this machine's
    hashes merged into those recorded (gate goldens.merge_goldens); None when nothing is to be added."""
    from harness.gate import goldens as gold

    path = checkout.goldens / f"{version}.json"
    observed_file = Path(gate_out) / f"goldens-{name}.json"
    if not observed_file.is_file():
        if path.is_file():
            return path, None
        raise Refused(f"not judged: no goldens of omnivoice {version}: the gate's folder holds no {observed_file.name} "
                      f"(its goldens check did not run) and {path} does not exist. Fix: rerun the gate with every "
                      f"check, or record them with the candidate's interpreter: `python -m harness maintain goldens "
                      f"--record`")
    try:
        observed = json.loads(observed_file.read_text())
        recorded = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError) as err:
        raise StepError(f"goldens not readable ({err}). Fix: rerun the gate") from None
    if observed.get("omnivoice") != version:
        raise Refused(f"{observed_file} holds the goldens of omnivoice {observed.get('omnivoice')}, not {version}. "
                      f"Fix: rerun the gate on omnivoice=={version}")
    try:
        data = gold.merge_goldens(observed, recorded) if recorded is not None else observed
    except gold.GoldensError as err:
        raise Refused(f"{path}: {err}") from None
    with tempfile.TemporaryDirectory() as tmp:  # the goldens' own layout (one line a point), as they write it
        text = gold.write_goldens(data, Path(tmp) / path.name).read_text()
    return path, (None if path.is_file() and path.read_text() == text else text)


def with_release(text: str, version: str) -> str:
    """omnivoice_releases.json's text with `version` in its releases (the list kept on its one line)."""
    data = json.loads(text)
    if version in data["releases"]:
        return text
    data["releases"] = sorted(data["releases"] + [version], key=Version)
    new = re.sub(r'"releases": \[[^\]]*\]', lambda _: '"releases": ' + json.dumps(data["releases"]), text, count=1)
    return new if json.loads(new) == data else json.dumps(data, indent=1) + "\n"


def declared(pyproject_text: str) -> list:
    """The omnivoice requirements of [project] dependencies, as written."""
    import tomllib

    deps = tomllib.loads(pyproject_text)["project"]["dependencies"]
    return [d for d in deps if canonicalize_name(Requirement(d).name) == PACKAGE]


def widened(pyproject_text: str, known_text: str, golden_versions: set, releases: list, version: str) -> tuple:
    """(pyproject's text with the omnivoice range the records verify, that range): harness.gate.versions.range_for
    over the versions fingerprinted and with goldens. Refused unless it admits what the declared range admits among
    the releases, and `version`: the step widens the range by this release, never otherwise."""
    from harness.gate import versions

    found = declared(pyproject_text)
    if len(found) != 1:
        raise StepError(f"pyproject.toml declares {len(found)} omnivoice requirements; the step edits exactly one")
    before = Requirement(found[0]).specifier
    with tempfile.TemporaryDirectory() as tmp:
        known = Path(tmp) / "fingerprints.json"
        known.write_text(known_text)
        verified = sorted(versions.fingerprinted_versions(known) & golden_versions, key=Version)
    spec = versions.range_for(verified, releases)
    was, now = set(versions.admitted(before, releases)), set(versions.admitted(SpecifierSet(spec), releases))
    if now != was | {version}:
        raise Refused(f"the records verify omnivoice{spec} (admits {sorted(now, key=Version)}), and pyproject declares "
                      f"omnivoice{before} (admits {sorted(was, key=Version)}): they disagree beyond omnivoice "
                      f"{version}. Fix: settle that first (`pytest tests_patches/test_omnivoice_range.py` names it)")
    if SpecifierSet(spec) == before:
        return pyproject_text, spec
    written = [m for m in re.finditer(r'"(omnivoice\s*[<>=!~][^"]*)"', pyproject_text) if m.group(1) == found[0]]
    if len(written) != 1:
        raise StepError(f"pyproject.toml writes the requirement {found[0]!r} {len(written)} times; edit it by hand to "
                        f"omnivoice{spec}")
    text = pyproject_text[:written[0].start(1)] + f"omnivoice{spec}" + pyproject_text[written[0].end(1):]
    assert [Requirement(d).specifier for d in declared(text)] == [SpecifierSet(spec)], text
    return text, spec


def accept(spec: str, gate_out: Path, checkout: Checkout = Checkout(REPO_ROOT), source: Path | None = None) -> Accepted:
    """The step: Refused or StepError before anything is written; else every file written and what changed."""
    from harness.gate import candidate as cand
    from harness.gate import versions

    report, checks = read_verdict(gate_out, spec)
    version = rule_may_ship(report, checks, spec)
    where, entry = rule_recorded(report, recorded_verdicts(checkout.results, spec), spec, checkout.results)
    stale = patches_changed_since(checkout.root, entry["commit"])
    if stale:
        raise Refused(f"stale: the verdict on {spec} was made at {entry['commit'][:12]}, and the patches changed "
                      f"since ({', '.join(stale[:8])}{' ...' if len(stale) > 8 else ''}): it says nothing of them. "
                      f"Fix: rerun `fastpath-suite gate {spec} --results results/` on this checkout")
    found = candidate_fingerprints(candidate_site(report, version, source), version)
    try:
        known_text, releases_text = checkout.known_file.read_text(), checkout.releases.read_text()
        pyproject_text = checkout.pyproject.read_text()
        known = json.loads(known_text)["functions"]
    except (OSError, ValueError, KeyError) as err:
        raise StepError(f"a file the step edits is not readable ({err})") from None
    before = {n: known.get(n, {}).get(fp, []) for n, fp in found.items()}
    new_known = with_fingerprints(known_text, found, version)
    goldens_path, goldens_text = with_goldens(checkout, gate_out, cand.parse_spec(spec).name, version)
    new_releases = with_release(releases_text, version)
    golden_versions = versions.golden_versions(checkout.goldens) | {version}
    new_pyproject, declared_range = widened(pyproject_text, new_known, golden_versions,
                                            json.loads(new_releases)["releases"], version)
    changes = [(checkout.known_file, known_text, new_known), (goldens_path, None, goldens_text),
               (checkout.releases, releases_text, new_releases), (checkout.pyproject, pyproject_text, new_pyproject)]
    done = Accepted(version, declared_range, {n: (fp, before[n]) for n, fp in found.items()},
                    f"{where.name}, commit {entry['commit'][:12]}, {entry.get('date', 'undated')}",
                    where.relative_to(checkout.root).as_posix() if where.is_relative_to(checkout.root) else str(where))
    for path, old, new in changes:
        if new is not None and new != old:
            done.changed.append((path.relative_to(checkout.root).as_posix(), "new" if not path.exists() else "edited"))
            path.write_text(new)
    return done


def commit_message(done: Accepted, spec: str) -> str:
    """Subject and body of the commit the step proposes (no apostrophe: it is printed inside shell quotes)."""
    fresh = sum(1 for _, before in done.fingerprints.values() if not before)
    return (f"omnivoice {done.version}: MAY SHIP by the gate, recorded; the wheel admits it (omnivoice{done.range})"
            f"\n\nThe verdict of the gate on {spec}: MAY SHIP ({done.verdict}). Recorded as verified: the "
            f"fingerprints of the {len(done.fingerprints)} upstream names the patches rely on ({fresh} not known "
            f"before), and the goldens of omnivoice {done.version}.")


def report_accepted(done: Accepted, spec: str, root: Path) -> str:
    lines = [f"omnivoice {done.version}: the gate's MAY SHIP ({done.verdict})", "fingerprints of the relied-on names:"]
    lines += [f"  {n:45s} {fp}  " + (f"known in {', '.join(before)}" if before else "NEW: not known before")
              for n, (fp, before) in sorted(done.fingerprints.items())]
    lines.append(f"declared range: omnivoice{done.range}")
    if not done.changed:
        return "\n".join(lines + ["nothing to change: the release is recorded and admitted already"])
    lines += ["changed (nothing is committed):"] + [f"  {path} ({how})" for path, how in done.changed]
    stat = subprocess.run(["git", "-C", str(root), "diff", "--stat", "--", *(p for p, _ in done.changed)],
                          capture_output=True, text=True).stdout.rstrip()
    lines += [stat] if stat else []
    message = commit_message(done, spec)
    files = [p for p, _ in done.changed] + [done.record, "docs/results.md"]
    lines += ["", "commit it with the verdict's record (rendered into docs/results.md first):",
              "  fastpath-suite maintain results", f"  git add {' '.join(files)}",
              f"  git commit -m {shlex.quote(message.splitlines()[0])} -m {shlex.quote(message.splitlines()[2])}",
              "then open the pull request (the version-bump workflow gates the new range in CI), and release from "
              "the merge: docs/release.md"]
    return "\n".join(lines)


def accept_main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite release accept", description=ACCEPT, formatter_class=Help)
    parser.add_argument("candidate", type=release_spec, help="the release the gate passed: omnivoice==X.Y.Z")
    parser.add_argument("--gate-out", type=Path, default=None,
                        help="the gate's folder (verdict.json, goldens-*.json); None: the gate's own default, "
                             "out/gate/omnivoice-X.Y.Z")
    parser.add_argument("--source", type=Path, default=None,
                        help="a folder holding the release's omnivoice/ and its dist-info, when the venv the gate "
                             "judged it in is gone; None: that venv")
    args = parser.parse_args(argv)
    from harness.gate import candidate as cand

    gate_out = args.gate_out or REPO_ROOT / "out" / "gate" / cand.parse_spec(args.candidate).name
    try:
        done = accept(args.candidate, gate_out, Checkout(REPO_ROOT), args.source)
    except Refused as err:
        print(f"REFUSED: {err}")
        return 1
    except StepError as err:
        print(f"error: the release step could not run: {err}", file=sys.stderr)
        return 2
    print(report_accepted(done, args.candidate, REPO_ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
