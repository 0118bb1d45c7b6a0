"""The upstream version-bump gate: may fastpath ship on top of another omnivoice?

    fastpath-suite gate omnivoice==0.2.0 [--against current] [--out DIR] [--results results/] [--quiet]
    fastpath-suite gate path/to/omnivoice-X.whl      # or a fork's wheel: any distribution that installs omnivoice/
    fastpath-suite gate path/to/source-folder        # a folder holding omnivoice/
    fastpath-suite gate lahgtna-omnivoice==0.1.5     # a fork from the index, named in the verdict by its distribution
    fastpath-suite gate git+https://github.com/k2-fsa/OmniVoice@master   # upstream's master, installed as pip would
    fastpath-suite gate path/to/OmniVoice-checkout   # a checkout (pyproject.toml): pip builds it as it is

(`python -m harness.gate.gate ...` is the same.)

The candidate gets its own venv (`harness.gate.candidate`: only omnivoice differs from this environment).
Checks, in order, each with a status: pass, changed-as-expected, changed, fail or skipped.

| check | measures | blocks the bump when |
|---|---|---|
| install | the candidate installs the omnivoice package (found by the package, whatever the distribution is called; a git URL or a checkout built by pip, its declared requirements installed, its commit recorded) and `omnivoice.models.omnivoice` imports | it does not (the candidate is broken: MUST NOT SHIP, exit 1, state could-not-run, pip's or the import's message in the row; every later check skips). Where the source could not be reached (index, git host), the gate could not judge: exit 2 |
| api | the public functions (no private part in the path or name) of the --against version's package that the candidate's lacks (package fingerprints) | never: its own line of the verdict, expected for a downgrade, a WARNING naming each function for an upgrade; a test that needs one is "not applicable" to the candidate (harness.run.strict.not_applicable), counted and named in the verdict (`not_applicable`), never blocking |
| fingerprints | AST fingerprint of every upstream name a patch relies on, vs the `--against` version's source; and of every function of the package, each changed one marked by the behaviour grid's call trace (on the generation path; relied on by patches, directly or transitively); a unified diff per changed one in OUT/fingerprints/ | a relied-on name changed to a fingerprint not recorded as known to work in fastpath/fingerprints.json ("changed": review the diff, and record it only once parity passes); other changed functions are reported, and the behaviour check decides |
| behaviour | stock generation over harness.gate.behaviour.GRID (every mode and sampler branch; per-step logits, scores, predicted tokens, unmasking order, final tokens, target lengths, waveform), recorded in both versions' environments in this job and compared bit for bit | any difference not accepted by name (`--accept SETTING=REASON`, recorded in the verdict), a setting that raised in one version only included. A setting that raised in both is not compared, and there is no verdict: ERROR, or INCOMPLETE where behaviour.CANNOT_RUN says it cannot run on this device |
| goldens | stock output on the tiny checkpoint vs fixtures/goldens/<version>.json, per operating point | never: the record for versions that can no longer be installed |
| parity | the parity tier (pytest tests_parity; with --device cuda its CPU rows and its CUDA rows, -m cuda, each run once) run in the candidate's env, the candidate's fingerprints accepted as under review (FASTPATH_REVIEWED_UPSTREAM; never the blanket override, which would flip tests that assert a refusal), and in the --against env to compare skips | any test fails or errors, or a test that passes on the --against version skips on the candidate (named; a test "not applicable" to the candidate, which lacks the API it checks, is named and never blocks); skips are compared only with a healthy --against run (exit 0, a test passed), else the check is "error" (ERROR, its log named) |
| work | exact work counters (FLOPs, LLM calls and positions, head rows, ...) of stock and of the lossless stack on the tiny checkpoint, in both environments, same job | the stack's share of stock's work (stack / stock, per counter) grows by more than WORK_SLACK; where stock does none of a work, the stack does more of it than before or than stock (work_lost) |
| rtf | optional interleaved RTF on tiny (`--rtf-rounds N`) | never (noisy, informational) |
| quality-set | with `--quality-set PATH` (a Seed-TTS-eval meta.lst or its folder, or a LibriSpeech-PC list: harness.quality.sets): every item generated in both environments (`harness.quality.clone_run`: the real checkpoint with the lossless stack, or `--quality-synth espeak`, the offline stand-in that checks the gate itself), into OUT/quality-set/<side>/<id>.wav, then judged item by item against the item's own prompt (WER in its language, SIM to its prompt's audio, MOS) with the quality gate's paired statistics, candidate against --against | the candidate is not shown non-inferior on every metric (a listening pack in OUT/quality-set/pack/). Given a set, the verdict needs it (Check.required): without a real checkpoint (synth omnivoice) it is INCOMPLETE, a language the WER judge cannot hear "not judged" (INCOMPLETE, the fix named); without a set it is skipped and changes nothing |
| quality | tests_quality's real-weights tier, when a real checkpoint is given (--checkpoint, FASTPATH_CHECKPOINT or the Hugging Face cache) | a test fails. With a real checkpoint the verdict needs it (Check.required): a run that raised or timed out is ERROR, one whose every test skipped INCOMPLETE (the first skip's reason named); without one it is skipped and changes nothing |

Exit status, whose the finding is (EXIT; the verdict's `exit_status`): 0 MAY SHIP; 1 MUST NOT SHIP, the candidate's:
a check that ran found it worse, or it does not install or import (state could-not-run, pip's or the import's
message in the install row); 2 ERROR, the gate's own: it could not judge (a needed check raised or timed out, the
parity check's --against run was broken, the --against version does not install or import, the index or the git
host could not be reached, a bad command line or candidate name: no verdict on the candidate, rerun once the cause
is fixed); 3 INCOMPLETE, not judged: a needed check (fingerprints, behaviour, parity, work; quality when it runs on a
real checkpoint) was skipped, run on a part (--parity-k) or left out (--checks), or with --device cuda the CUDA
parity rows could not run here. An informational check (goldens, rtf, quality without a real checkpoint) that could
not run is reported as "error" and changes nothing.
The verdict is read from the checks' fields (Check.status, .blocks, .complete, .required), never from their
summaries.
Writes OUT/verdict.json, OUT/verdict.md and each step's log; with `--results DIR` also a "gate" results file
(the verdict and one row per check: render_results). Progress (each environment prepared, each check started and
finished, with a counter and the elapsed time) goes to stderr, none with --quiet; the table and verdict to stdout.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastpath import fingerprints
from fastpath.registry import relied_on
from harness import REPO_ROOT
from harness.run import machine
from harness.gate import candidate as cand
from harness.gate import goldens as gold
from harness.gate.behaviour import DEVICES as GRID_DEVICES, DTYPES as GRID_DTYPES
from harness.run import results as result_files
from harness.run.cli import int_at_least
from harness.run.progress import Progress, clock
from harness.run.workers import ENGINES

STATUSES = ("pass", "changed-as-expected", "changed", "fail", "skipped", "error")  # error: the check could not run
CHECKS = ("fingerprints", "behaviour", "goldens", "parity", "work", "rtf", "quality-set", "quality")
BLOCKING = ("fingerprints", "behaviour", "parity", "work")  # without all four there is no verdict
WORK_SLACK = 0.01  # the stack's work / stock's may grow this much (relative) before the bump is refused
WORK_POINTS = ("clone6-medium-32", "auto-short-10")  # speed points: a voice clone at 32 steps, a short auto voice
COUNTERS = ("flops", "llm_calls", "llm_positions", "head_rows", "embedded_positions", "reference_encodes")
# exit status per verdict state, read as whose the finding is: 0 pass; 1 the candidate's (a check found it worse, or it
# does not install or import); 2 the gate's own (it could not judge: ERROR, and every failure to start); 3 not judged
EXIT = {"may-ship": 0, "must-not-ship": 1, "could-not-run": 1, "error": 2, "incomplete": 3}
GATE_ERROR = EXIT["error"]  # also argparse's status for a bad command line
EXIT_HELP = """exit status (whose the finding is):
  0  MAY SHIP: every needed check ran whole and none blocks
  1  MUST NOT SHIP, the candidate's fault: a check that ran found it worse, or it does not install or import
     (pip's or the import's message in the install row; verdict state could-not-run)
  2  ERROR, the gate's own: it could not judge (a needed check raised or timed out, a comparison run was broken,
     the --against version does not install or import, the index or git host could not be reached, a bad command
     line or candidate name); no verdict on the candidate: fix the cause and rerun
  3  INCOMPLETE, not judged: a needed check was left out (--checks), skipped, run on a part (--parity-k), or with
     --device cuda the CUDA parity rows cannot run on this machine"""


@dataclass
class Check:
    """One check's finding. The verdict reads only the fields (status, blocks, complete), never the summary: the
    summary and details are text for people and hold upstream names of any spelling."""

    name: str
    status: str  # one of STATUSES
    blocks: bool
    summary: str
    details: list = field(default_factory=list)
    complete: bool = True  # False: the check ran on a part of what it covers (parity with --parity-k)
    required: bool = False  # True: no verdict without it run whole, as the BLOCKING ones (quality on real weights)
    not_applicable: list = field(default_factory=list)  # [(test, reason)]: rows that cannot apply to the candidate

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")


# --- verdict rules: pure functions of measured data ---------------------------------------------------------


def rule_fingerprints(rows: list, candidate_version: str, against_version: str,
                      candidate_file: str = "<candidate>/omnivoice/models/omnivoice.py") -> Check:
    """rows: [{'name', 'against', 'candidate', 'known'}], fingerprints (None: not defined) and the versions
    fingerprints.json records as known to work for the candidate's fingerprint."""
    changed = [r for r in rows if r["candidate"] != r["against"]]
    unknown = [r for r in changed if not r["known"]]
    if not changed:
        return Check("fingerprints", "pass", False,
                     f"all {len(rows)} relied-on upstream names identical to {against_version}")
    details = []
    for r in changed:
        state = (f"recorded as known to work in {', '.join(r['known'])}" if r["known"]
                 else "missing from the candidate" if r["candidate"] is None else "NOT recorded as known to work")
        details.append(f"{r['name']}: {r['against']} -> {r['candidate']} ({state})")
    if not unknown:
        return Check("fingerprints", "changed-as-expected", False,
                     f"{len(changed)} changed, all reviewed and recorded: {', '.join(r['name'] for r in changed)}",
                     details)
    names = [r["name"] for r in unknown]
    details.append(
        f"fix: read the diffs in fingerprints/; if the patch logic still holds and the parity tier passes, record "
        f"with `fastpath-suite maintain fingerprints --source {candidate_file} --version "
        f"{candidate_version} --record --only {' '.join(names)}`")
    return Check("fingerprints", "changed", True,
                 f"refused: {', '.join(names)} changed in omnivoice {candidate_version} (unreviewed)", details)


def rule_goldens(differences: dict, against_version: str, candidate_version: str) -> Check:
    """differences: {goldens version: {point: [differing parts]}} (goldens.match_versions)."""
    if not differences:
        return Check("goldens", "skipped", False,
                     "no goldens recorded: run `fastpath-suite maintain goldens --record`")
    same = gold.matching(differences)
    if against_version in same:
        return Check("goldens", "pass", False, f"stock output identical to the {against_version} goldens at every point")
    if same:
        return Check("goldens", "changed-as-expected", False,
                     f"stock output matches the goldens of {', '.join(same)}, not {against_version}")
    ref = against_version if against_version in differences else sorted(differences)[-1]
    moved = {p: parts for p, parts in differences[ref].items() if parts}
    return Check("goldens", "changed", False,
                 f"stock behaviour changed: {len(moved)}/{len(differences[ref])} points differ from the "
                 f"{ref} goldens, and no known version matches",
                 [f"{p}: {'; '.join(parts)}" for p, parts in moved.items()])


def rule_behaviour(differences: dict, accepted: dict, settings: int, versions: tuple,
                   raised: dict | None = None) -> Check:
    """differences: {setting: [what differs]} (behaviour.compare); accepted: {setting or '*': reason}; raised:
    {setting: {'against', 'candidate': error or None, 'cannot_run': reason or None}} (behaviour.raised), the settings
    not compared. One that raised in both versions is no behaviour: unless a difference already blocks, the check is
    "error" (ERROR), or "skipped" and not complete (INCOMPLETE) where the grid says each such setting cannot run on
    this device; never a pass, whatever --accept says."""
    raised = raised or {}
    both = {n: r for n, r in raised.items() if r["against"] is not None and r["candidate"] is not None}
    compared = f"{settings - len(raised)} of {settings} settings compared bit for bit"
    unrun = [f"{n}: raised in both versions, not compared: {r['against']}"
             + ("" if r["against"] == r["candidate"] else f" (against) vs {r['candidate']} (candidate)")
             + (f"; the grid says it cannot run here: {r['cannot_run']}" if r["cannot_run"] else "")
             for n, r in both.items()]
    if not differences and not raised:
        return Check("behaviour", "pass", False,
                     f"stock generation bit-identical to {versions[1]} at all {settings} settings")
    details = []
    for name, diffs in differences.items():
        reason = accepted.get(name) or accepted.get("*")
        state = f"ACCEPTED ({reason})" if reason else "NOT accepted"
        details.append(f"{name} [{state}]: " + "; ".join(diffs[:3]))
    refused = [n for n in differences if not (accepted.get(n) or accepted.get("*"))]
    by_error = {}  # the errors of the settings that raised in both versions, each with the settings it ended
    for n, r in both.items():
        by_error.setdefault(r["candidate"] if r["against"] == r["candidate"] else
                            f"{r['against']} (against) vs {r['candidate']} (candidate)", []).append(n)
    not_run = "; ".join(f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''} raised {error}"
                        for error, names in by_error.items())
    if refused:
        details.append("to accept a reviewed change: --accept 'SETTING=REASON' (once per setting, or '*=REASON'); "
                       "the reason is recorded in the verdict")
        return Check("behaviour", "changed", True,
                     f"stock generation differs from {versions[1]} at {len(refused)} of {settings} settings: "
                     f"{', '.join(refused[:6])}{' ...' if len(refused) > 6 else ''}; {compared}"
                     + (f"; {len(both)} raised in both versions: {not_run}" if both else ""), details + unrun)
    if both and all(r["cannot_run"] for r in both.values()):
        return Check("behaviour", "skipped", False,
                     f"not run whole: {len(both)} of {settings} settings cannot run on this device (the grid says "
                     f"so): {not_run}; {compared}", details + unrun, complete=False)
    if both:
        return Check("behaviour", "error", False,
                     f"could not run: {len(both)} of {settings} settings raised in both versions: {not_run}; "
                     f"{compared}", details + unrun)
    return Check("behaviour", "changed-as-expected", False,
                 f"{len(differences)} of {settings} settings differ, every one accepted by name; {compared}", details)


def tally(result: dict) -> str:
    """'N passed, N failed, N errors, N not applicable, N skipped' of a pytest run (parse_junit), each count after
    the passes only when there is one: "failed" is said only where a test ran and failed."""
    parts = [f"{result['passed']} passed"]
    parts += [f"{len(result.get(key, ()))} {word}" for key, word in (
        ("failed", "failed"), ("errors", "errors"), ("not_applicable", "not applicable"), ("skipped", "skipped"))
        if result.get(key)]
    return ", ".join(parts)


def unhealthy(result: dict) -> str | None:
    """Why a pytest run (parse_junit) cannot be compared with, or None. A comparison run must exit 0 with at least
    one test passed: a run that crashed, was interrupted (its junit file may hold the passes of a part), failed
    or skipped everything says nothing about which tests run on that version."""
    if result["failed"] or result["errors"] or result["returncode"] != 0:
        return f"pytest exit {result['returncode']}, {tally(result)}"
    if result["passed"] == 0:
        return f"no test passed ({tally(result)})"
    return None


def rule_parity(result: dict, against: dict | None = None) -> Check:
    """result: {'returncode', 'passed', 'passed_tests': [test], 'failed': [(test, message)], 'errors': [...],
    'skipped': [...]}, of the candidate; against: the same of the --against version (with 'version' and 'log'),
    whose passing tests must not skip on the candidate (a release that drops what a test needs turns the test into
    a skip, not a failure). The --against run must be healthy (`unhealthy`) before any skip is compared: when it is
    not, a candidate that runs clean gets status error (no verdict), never pass."""
    bad = result["failed"] + result["errors"]
    counts = tally(result)
    ran_before = set(against.get("passed_tests", ())) if against else set()
    newly = [(test, msg) for test, msg in result["skipped"] if test in ran_before]
    # a test that cannot apply to the candidate (strict.not_applicable: an API it lacks) is counted and named, never
    # a block, whether or not it ran on the --against version
    absent = list(result.get("not_applicable", ()))
    details = [f"{test}: {msg}" for test, msg in bad[:20]]
    details += [f"not applicable to the candidate{' (ran on ' + against.get('version', 'the --against version') + ')' if against and test in ran_before else ''}: {test}: {msg}"
                for test, msg in absent]
    details += [f"ran on {against.get('version', 'the --against version')}, SKIPS on the candidate: {test}: {msg}"
                for test, msg in newly] if against else []
    details += [f"skipped {test}: {msg}" for test, msg in result["skipped"]
                if "slow" not in msg and test not in ran_before][:10]
    if bad or result["returncode"] != 0 or result["passed"] == 0:
        why = "not bit-exact or broken" if bad else f"pytest exit {result['returncode']}"
        return Check("parity", "fail", True, f"{why}: {counts}", details, not_applicable=absent)
    broken = unhealthy(against) if against else None
    if broken:
        log = against.get("log", "parity-against.log")
        return Check("parity", "error", False,
                     f"could not compare skips: the --against run ({against.get('version', 'the --against version')}) "
                     f"is broken: {broken}; read {log}, fix what stops it, and rerun (candidate: {counts})",
                     [f"{test}: {msg}" for test, msg in (against["failed"] + against["errors"])[:10]]
                     + [f"the --against run's log: {log}"], not_applicable=absent)
    if newly:
        return Check("parity", "fail", True, f"{len(newly)} parity test(s) that ran on the --against version skip "
                                             f"on the candidate: {counts}", details, not_applicable=absent)
    compared = f"; skips compared with the --against version's run ({against['passed']} passed)" if against else ""
    return Check("parity", "pass", False, f"bit-exact: {counts}{compared}", details, not_applicable=absent)


def public_api(package: dict) -> set:
    """The public functions of a package (package_fingerprints' keys, 'path.py:qualname'): no part of the module
    path or the qualified name private (a leading underscore; __init__.py is the package's own), none local."""
    out = set()
    for key in package:
        path, name = key.split(":", 1)
        parts = [p for p in path.removesuffix(".py").split("/") if p != "__init__"] + name.split(".")
        if not any(p.startswith(("_", "<")) for p in parts):
            out.add(key)
    return out


def rule_api(missing: list, versions: tuple, names: tuple = ("omnivoice", "omnivoice")) -> Check:
    """missing: the public API (public_api) the --against version has and the candidate lacks; versions, names:
    (candidate, against). A user of the candidate meets the difference whatever the checks find, so it is its own
    line: for a downgrade (candidate older) expected, for an upgrade (or the same version) a warning naming each
    name. Never blocks: a test that needs a missing name is not applicable to the candidate (strict.not_applicable)."""
    from packaging.version import InvalidVersion, Version

    cand, base = f"{names[0]} {versions[0]}", f"{names[1]} {versions[1]}"
    if not missing:
        return Check("api", "pass", False, f"{cand} has every public function of {base}")
    try:
        downgrade = Version(versions[0]) < Version(versions[1])
    except InvalidVersion:
        downgrade = False
    listed = ", ".join(missing)
    if downgrade:
        return Check("api", "changed-as-expected", False,
                     f"{cand} lacks {len(missing)} public function(s) that {base} has (a downgrade: expected; code "
                     f"written for {versions[1]} that calls them will not find them): {listed}", list(missing))
    return Check("api", "changed", False,
                 f"WARNING: {cand} removes {len(missing)} public function(s) that {base} has: {listed}; code that "
                 f"calls them breaks on {versions[0]}", list(missing))


def check_api(env, against, versions, names) -> Check:
    mine = public_api(fingerprints.package_fingerprints(env.site / "omnivoice"))
    theirs = public_api(fingerprints.package_fingerprints(against.site / "omnivoice"))
    return rule_api(sorted(theirs - mine), versions, names)


def work_lost(sa: int, fa: int, sc: int, fc: int) -> str | None:
    """Why the stack lost ground to stock on one counter (stock sa on --against -> sc on the candidate, the stack fa ->
    fc), or None. Where stock does some of the work on both versions, the stack's share of it (stack / stock) may not
    grow by more than WORK_SLACK; the share has no value where stock does none, and there the stack may not do more
    of the work than before (stock does none on both), any of it (stock stopped doing it), or more of it than stock
    (stock newly does it)."""
    grow = 1 + WORK_SLACK
    if sa and sc:
        ra, rc = fa / sa, fc / sc
        if rc <= ra * grow:
            return None
        return f"{rc / ra - 1:+.1%}" if ra else "the stack did none of it before"
    if not sc and not sa:
        return f"stock does none of it, the stack {fa} -> {fc}" if fc > fa * grow else None
    if not sc:
        return f"stock no longer does it, the stack still does {fc}" if fc else None
    return f"stock newly does {sc}, the stack more: {fc}" if fc > sc * grow else None


def rule_work(candidate: dict, against: dict, candidate_version: str, against_version: str) -> Check:
    """candidate/against: {point: {'stock': counters, 'fastpath': counters}} (probe_work). Compared as the stack's
    share of stock's work per counter (work_lost), so longer speech in a release (both grow) does not block, and a
    stack that lost ground relative to stock does, named by point and counter."""
    worse, moved, names = [], [], []
    missing = sorted(set(candidate) ^ set(against))
    for point in sorted(set(candidate) & set(against)):
        for key in COUNTERS:
            sa, fa = against[point]["stock"][key], against[point]["fastpath"][key]
            sc, fc = candidate[point]["stock"][key], candidate[point]["fastpath"][key]
            if sa and sc:
                line = (f"{point} {key}: stack/stock {fa / sa:.4f} on {against_version} -> {fc / sc:.4f} on "
                        f"{candidate_version}")
            else:
                line = f"{point} {key}: stock {sa} -> {sc}, stack {fa} -> {fc} ({against_version} -> {candidate_version})"
            why = work_lost(sa, fa, sc, fc)
            if why:
                worse.append(f"{line} ({why})")
                names.append(f"{point} {key}")
            elif (sa, fa) != (sc, fc):
                moved.append(line + (f" (stock {sa} -> {sc})" if sa and sc else ""))
    if missing:
        return Check("work", "fail", True, f"work not measured on both versions at {missing}", [])
    if worse:
        return Check("work", "fail", True, f"the lossless stack lost ground to stock on {candidate_version} in "
                                           f"{len(worse)} counter(s): {', '.join(names[:6])}"
                                           f"{' ...' if len(names) > 6 else ''}", worse + moved)
    if moved:
        return Check("work", "changed", False, "work counts moved, the stack's share of stock's did not grow",
                     moved)
    return Check("work", "pass", False, "identical work counts, stock and lossless stack", [])


def rule_rtf(candidate: list, against: list, threshold: float = 0.10) -> Check:
    """candidate/against: median RTFs of the lossless stack, one per interleaved round. Never blocks."""
    if not candidate or not against:
        return Check("rtf", "skipped", False, "not measured (--rtf-rounds 0)")
    ratio = statistics.median(candidate) / statistics.median(against)
    status = "pass" if abs(ratio - 1) <= threshold else "changed"
    return Check("rtf", status, False, f"median RTF candidate/against = {ratio:.3f} over {len(candidate)} rounds "
                                       f"(informational: shared-machine noise; |ratio-1| > {threshold} is 'changed')",
                 [f"candidate {[round(x, 4) for x in candidate]}", f"against {[round(x, 4) for x in against]}"])


def rule_quality(result: dict | None, reason: str = "", required: bool = False) -> Check:
    """result: the quality tier's pytest run (parse_junit), None when it was not run (`reason` says why); required:
    a real checkpoint was given, so the check is one the verdict needs run whole (Check.required): a run whose every
    test skipped is then INCOMPLETE (the first skip's reason in the summary), and one that could not run ERROR."""
    if result is None:
        return Check("quality", "skipped", False, f"skipped: {reason}", required=required)
    bad = result["failed"] + result["errors"]
    if bad or result["returncode"] not in (0, 5):
        why = (f"{len(bad)} quality tests failed" if bad
               else f"the quality run crashed: pytest exit {result['returncode']}")
        return Check("quality", "fail", True, f"{why}: {tally(result)}", [f"{t}: {m}" for t, m in bad[:10]],
                     required=required)
    if result["passed"] == 0:
        reason = result["skipped"][0][1] if result["skipped"] else "no quality test ran"
        return Check("quality", "skipped", False, f"skipped: {reason}",
                     [f"skipped {t}: {m}" for t, m in result["skipped"][:10]], required=required)
    return Check("quality", "pass", False, f"{result['passed']} quality tests passed", required=required)


def verdict(checks: list) -> dict:
    """From the checks' fields alone (status, blocks, complete, required; never their summaries): could-not-run
    when the candidate did not install or import (the install check's status is not "pass": no check ran on it; the
    candidate is broken, MUST NOT SHIP, exit 1); else ship only when nothing blocks and every needed check ran whole: the BLOCKING ones, and any marked
    required (the quality check when a real checkpoint was given). A needed check left out, skipped or run on a
    part (complete False) makes the verdict INCOMPLETE (no answer), unless something already blocks; a needed check
    that could not run (status "error": it raised, timed out, or its comparison run was broken) makes it ERROR (no
    answer, exit 2), unless something that ran already blocks. Any other check that could not run is reported and
    changes nothing."""
    ran = {c.name: c for c in checks}
    install = ran.get("install")
    if install is not None and install.status != "pass":  # the candidate is broken: no check ran on it
        return {"ship": False, "state": "could-not-run", "blocked_by": ["install"], "not_run": [], "errors": [],
                "reason": install.summary.removeprefix("could not run: "), "checks": [asdict(c) for c in checks],
                "exit_status": EXIT["could-not-run"]}
    blocking = [c.name for c in checks if c.blocks]
    needed = list(BLOCKING) + [c.name for c in checks if c.required and c.name not in BLOCKING]
    errors = [n for n in needed if n in ran and ran[n].status == "error"]
    missing = [n for n in needed if n not in ran or ran[n].status == "skipped" or not ran[n].complete]
    state = ("must-not-ship" if blocking else "error" if errors else "incomplete" if missing else "may-ship")
    api = ran.get("api")
    return {"ship": state == "may-ship", "state": state, "blocked_by": blocking, "not_run": missing,
            "errors": errors, "reason": None, "checks": [asdict(c) for c in checks], "exit_status": EXIT[state],
            "not_applicable": [{"check": c.name, "test": t, "reason": r} for c in checks for t, r in c.not_applicable],
            "api": None if api is None or api.status == "pass" else {"status": api.status, "summary": api.summary,
                                                                      "missing": list(api.details)}}


# --- measurements ------------------------------------------------------------------------------------------


def fingerprint_rows(candidate_source: str, against_source: str) -> list:
    names = relied_on()
    known = fingerprints.load_known()
    now, then = fingerprints.fingerprints_in(candidate_source, names), fingerprints.fingerprints_in(against_source, names)
    return [{"name": n, "against": then[n], "candidate": now[n], "known": known.get(n, {}).get(now[n], [])}
            for n in names]


def function_diff(name: str, candidate_source: str, against_source: str, labels=("against", "candidate")) -> str:
    def text(source):
        try:
            return fingerprints.definition_source(source, name).splitlines(keepends=True)
        except KeyError:
            return []

    return "".join(difflib.unified_diff(text(against_source), text(candidate_source),
                                        f"{labels[0]}/{name}", f"{labels[1]}/{name}"))


def package_changes(candidate: dict, against: dict, traces: list) -> list:
    """Every function of the package that differs: [(key, change, marks)], key 'path.py:qualname', change one of
    changed/added/removed; marks from the behaviour traces: 'on the generation path' (the grid ran it),
    'relied on by patches' (it ran under a function a patch relies on)."""
    called = set().union(*(set(t.get("called", ())) for t in traces)) if traces else None
    under = set().union(*(set(t.get("under_patched", ())) for t in traces)) if traces else None
    relied = set(relied_on())
    out = []
    for key in sorted(set(candidate) | set(against)):
        a, c = against.get(key), candidate.get(key)
        if a == c:
            continue
        change = "added" if a is None else "removed" if c is None else "changed"
        marks = []
        if key.endswith((".<body>", ":<module>")):
            marks.append("class or module statements: fields, defaults, constants (not traced)")
        elif called is None:
            marks.append("call path not traced (behaviour check not run)")
        else:
            traced = key in called or any(k.startswith(key + ".<locals>.") for k in called)
            marks.append("ON the generation path" if traced else "not run by the grid")
            if key in under or key.split(":", 1)[1] in relied:
                marks.append("relied on by patches" + ("" if key.split(":", 1)[1] in relied else " (transitively)"))
        out.append((key, change, marks))
    return out


def check_fingerprints(env, against, versions, out: Path, traces: list | None = None) -> Check:
    cand_src, base_src = env.upstream_file.read_text(), against.upstream_file.read_text()
    rows = fingerprint_rows(cand_src, base_src)
    check = rule_fingerprints(rows, versions[0], versions[1], str(env.upstream_file))
    folder = out / "fingerprints"
    folder.mkdir(parents=True, exist_ok=True)
    for r in rows:
        if r["candidate"] != r["against"]:
            path = folder / f"{r['name']}.diff"
            path.write_text(function_diff(r["name"], cand_src, base_src,
                                          (f"omnivoice-{versions[1]}", f"omnivoice-{versions[0]}")))
            check.details.append(f"diff: {path}")
    traces = [t for t in traces or [] if "called" in t]  # a record without a call trace traced nothing
    package = package_changes(fingerprints.package_fingerprints(env.site / "omnivoice"),
                              fingerprints.package_fingerprints(against.site / "omnivoice"), traces)
    on_path = [k for k, _, marks in package if "ON the generation path" in marks]
    check.summary += f"; whole package: {len(package)} changed function(s), " + (
        f"{len(on_path)} on the generation path" + (f" ({', '.join(on_path[:5])})" if on_path else "") if traces
        else "not traced (the behaviour check did not run; it marks each one the grid runs)")
    for key, change, marks in package:
        check.details.append(f"{key}: {change} [{'; '.join(marks)}]")
        if change == "changed":
            rel, name = key.split(":", 1)
            diff = function_diff(name, (env.site / "omnivoice" / rel).read_text(),
                                 (against.site / "omnivoice" / rel).read_text(),
                                 (f"omnivoice-{versions[1]}/{rel}", f"omnivoice-{versions[0]}/{rel}"))
            if diff:
                (folder / f"{rel.replace('/', '.')}.{name}.diff").write_text(diff)
    return check


def run_behaviour(env, out: Path, tag: str, device: str = "cpu", dtype: str = "fp32") -> dict:
    import torch

    path = out / f"behaviour-{tag}.pt"
    path.unlink(missing_ok=True)  # never read a stale file from an earlier run
    done = env.run(["-m", "harness.gate.behaviour", path, "--device", device, "--dtype", dtype], timeout=1800,
                   log=out / f"behaviour-{tag}.log")
    if done.returncode != 0 or not path.is_file():
        raise GateStepError(f"recording behaviour failed in the {tag} environment; see {out / f'behaviour-{tag}.log'}")
    return torch.load(path, weights_only=False)


def check_behaviour(records: dict, versions, accepted: dict) -> Check:
    from harness.gate import behaviour

    theirs, mine = records["against"], records["candidate"]
    differences = behaviour.compare(theirs, mine)
    check = rule_behaviour(differences, accepted, len(set(theirs["settings"]) | set(mine["settings"])), versions,
                           behaviour.raised(theirs, mine))
    check.details.append("grid recorded on {} in {} by both versions".format(*behaviour.where(mine)))
    return check


def run_goldens(env, out: Path) -> dict:
    path = out / f"goldens-{env.spec.name}.json"
    path.unlink(missing_ok=True)  # never read a stale file from an earlier run
    env.run(["-m", "harness.gate.goldens", "--out", path], timeout=1800, log=out / "goldens.log")
    if not path.is_file():
        raise GateStepError(f"recording goldens failed; see {out / 'goldens.log'}")
    return json.loads(path.read_text())


def check_goldens(env, versions, out: Path) -> Check:
    observed = run_goldens(env, out)
    known = gold.load_goldens()
    differences = gold.match_versions(observed["points"], known)
    check = rule_goldens(differences, versions[1], versions[0])
    check.details.append(gold.coverage(known, observed["environment"]["numerics_key"]))
    if versions[0] not in known:
        check.details.append(f"observed: {out / f'goldens-{env.spec.name}.json'} (once reviewed, copy it to "
                             f"fixtures/goldens/{versions[0]}.json to make this behaviour known)")
    weights = gold.weight_digests(observed)
    same_weights = [v for v, data in known.items() if gold.weight_digests(data) == weights]
    check.details.append(f"tiny checkpoint weights (model.safetensors sha256 {weights['model_sha256'][:12]}) equal to "
                         f"those of the goldens of: {', '.join(same_weights) or 'none'}")
    return check


def run_pytest(env, args: list, out: Path, name: str, extra_env=None, timeout=3600) -> dict:
    junit = out / f"{name}-junit.xml"
    junit.unlink(missing_ok=True)
    done = env.run(["-m", "pytest", *args, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                   extra_env=extra_env, timeout=timeout, log=out / f"{name}.log")
    return parse_junit(junit, done.returncode)


def parse_junit(path: Path, returncode: int) -> dict:
    """A pytest run's junit report: passes, failures, errors, and skips apart from the tests that cannot apply here
    by design ("not_applicable": a skip whose reason starts with harness.run.strict.NA_PREFIX, the prefix cut)."""
    from harness.run import strict

    result = {"returncode": returncode, "passed": 0, "passed_tests": [], "failed": [], "errors": [], "skipped": [],
              "not_applicable": []}
    if not path.is_file():
        result["errors"].append(("pytest", f"no junit report (pytest exit {returncode})"))
        return result
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            result["passed"] += 1
            result["passed_tests"].append(test)
            continue
        message = (outcome.get("message") or outcome.text or "").strip().splitlines()
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]
        text = " ".join(ln.strip() for ln in message[:2])  # "X is not bit-exact:" + first diff
        if key == "skipped" and text.startswith(strict.NA_PREFIX):
            key, text = "not_applicable", text.removeprefix(strict.NA_PREFIX)
        result[key].append((test, text[:300]))
    return result


def tier_environment(env, version: str) -> dict:
    """What the gate adds to the environment of the tiers it runs in the candidate's venv (parity, quality): the
    candidate's own fingerprints of the relied-on names, accepted as under review (fingerprints.ENV_REVIEWED), so
    that the patches apply on a changed upstream while a test that makes a fingerprint unknown still sees the
    refusal it asserts. Never the blanket ENV_ALLOW, which would change such a test's outcome (and did: every
    candidate was refused). For the installed version it adds nothing fingerprints.json does not know."""
    found = fingerprints.fingerprints_in(env.upstream_file.read_text(), relied_on())
    return {fingerprints.ENV_REVIEWED: fingerprints.review_value(found, version)}


def parity_args(select: str | None = None, marks: str | None = None) -> list:
    """One pytest run of the parity tier: as the default run selects it (`pytest tests_parity`), or the rows `-m
    marks` selects, and the -k subset."""
    return ["tests_parity"] + (["-m", marks] if marks else []) + (["-k", select] if select else [])


def parity_runs(select: str | None = None, device: str = "cpu") -> dict:
    """{log name: pytest args} of the parity check. On the CPU the default run's selection. With --device cuda the
    patches a GPU service runs are checked too: the CPU rows (-m "not cuda") and the CUDA rows (-m cuda, which asks
    for them: a machine without CUDA cannot leave them out quietly), each row run once."""
    if device != "cuda":
        return {"parity": parity_args(select)}
    return {"parity": parity_args(select, "not cuda"), CUDA_RUN: parity_args(select, "cuda")}


CUDA_RUN = "parity-cuda"
CUDA_PROBE = ("import json; from harness.model.devices import cuda_problem; "
              "print(json.dumps({'problem': cuda_problem()}))")


def cuda_problem_in(env) -> str | None:
    """Why CUDA is not usable in an environment (harness.model.devices.cuda_problem, run there: a candidate may bring
    its own torch), or None."""
    done = env.run(["-c", CUDA_PROBE], timeout=600)
    if done.returncode != 0:
        raise GateStepError(f"could not ask {env.python} whether CUDA is usable: {done.stderr.strip()[-1000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["problem"]


def merge_runs(results: list) -> dict:
    """One parity result (parse_junit) of several pytest runs: counts added, lists joined, the first failing exit
    status (5, nothing selected, counts as none: a run that selected nothing adds nothing)."""
    merged = {"returncode": next((r["returncode"] for r in results if r["returncode"] not in (0, 5)), 0), "passed": 0}
    for key in ("passed_tests", "failed", "errors", "skipped", "not_applicable"):
        merged[key] = [x for r in results for x in r.get(key, ())]
    merged["passed"] = sum(r["passed"] for r in results)
    if all(r["returncode"] == 5 for r in results):
        merged["returncode"] = 5
    return merged


def rule_cuda_rows(check: Check, problem: str | None, cuda: dict | None) -> Check:
    """The parity check with --device cuda: `check` judged the CPU and CUDA rows together (rule_parity); problem: why
    CUDA is not usable here (the CUDA rows were then not run); cuda: the candidate's CUDA run alone (parse_junit).
    The CUDA rows are needed: where they could not run, or none of them ran (every one skipped), the check is not
    judged (skipped, not complete: INCOMPLETE), never a pass; a finding of the rows that ran still blocks, and an
    error stays one."""
    if check.blocks or check.status == "error":
        if problem:
            check.details.append(f"the CUDA parity rows did not run: {problem}")
        return check
    if problem:
        why = f"the CUDA parity rows (--device cuda: pytest tests_parity -m cuda) cannot run here: {problem}"
    elif not cuda or not cuda["passed"]:
        skipped = (cuda or {}).get("skipped") or []
        why = ("no CUDA parity row ran (-m cuda)"
               + (f": every one skipped, the first: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))
    else:
        check.summary += f"; CPU and CUDA rows ({cuda['passed']} CUDA rows passed)"
        return check
    return Check("parity", "skipped", False, f"not judged: {why}; the CPU rows: {check.summary}",
                 check.details + [f"not judged: {why}"], complete=False, not_applicable=check.not_applicable)


def check_parity(env, out: Path, select: str | None = None, version: str = "candidate", against=None,
                 against_version: str = "against", device: str = "cpu") -> Check:
    """The parity tier in the candidate's environment; with `against`, also in that one, so that a test which
    passes there and skips on the candidate is named and blocks. With device cuda also the CUDA rows
    (parity_runs), in both environments, where CUDA is usable in both (rule_cuda_rows)."""
    runs = parity_runs(select, device)
    problem = None
    if CUDA_RUN in runs:
        problems = {side: cuda_problem_in(e) for side, e in (("candidate", env), ("against", against)) if e is not None}
        said = {side: p for side, p in problems.items() if p}
        problem = (next(iter(said.values())) if len(said) == len(problems) and len(set(said.values())) == 1
                   else "; ".join(f"{side}: {p}" for side, p in said.items()) or None)
        if problem:
            runs.pop(CUDA_RUN)
    found = {name: run_pytest(env, args, out, name, tier_environment(env, version)) for name, args in runs.items()}
    result = merge_runs(list(found.values()))
    base = None
    if against is not None:
        base = merge_runs([run_pytest(against, args, out, f"{name}-against", tier_environment(against,
                                                                                                 against_version))
                           for name, args in runs.items()])
        base.update(version=against_version, log=", ".join(str(out / f"{name}-against.log") for name in runs))
    check = rule_parity(result, base)
    if device == "cuda":
        check = rule_cuda_rows(check, problem, found.get(CUDA_RUN))
    if select:
        check.complete = False
        check.summary += f" (only the tests -k {select!r} selects)"
    return check


def probe_work(path: str) -> None:
    """In the environment under test: work counters of stock and the lossless stack at WORK_POINTS -> JSON."""
    import fastpath
    from harness.model.checkpoint import build_checkpoint, load_model
    from harness.model.points import point
    from harness.speed.measure import count_work

    model = load_model(build_checkpoint("tiny"))
    result = {}
    for name in WORK_POINTS:
        kwargs = point(name).generate_kwargs(model)
        stock = count_work(model, **kwargs).as_dict()
        with fastpath.patched(model, allow_unverified=True):
            fast = count_work(model, **kwargs).as_dict()
        result[name] = {"stock": stock, "fastpath": fast}
    Path(path).write_text(json.dumps(result, indent=1))


def probe_rtf(path: str, samples: int = 3) -> None:
    """In the environment under test: median RTF of the lossless stack at WORK_POINTS[0], after one warm-up."""
    import fastpath
    from harness.model.checkpoint import build_checkpoint, load_model
    from harness.model.points import point
    from harness.speed.measure import timed_generate

    model = load_model(build_checkpoint("tiny"))
    kwargs = point(WORK_POINTS[0]).generate_kwargs(model)
    with fastpath.patched(model, allow_unverified=True):
        timed_generate(model, 0, **kwargs)  # warm-up, not counted
        rtfs = [s / a for s, a in (timed_generate(model, 0, **kwargs) for _ in range(samples))]
    Path(path).write_text(json.dumps({"median_rtf": statistics.median(rtfs), "rtf": rtfs}))


def run_probe(env, probe: str, out: Path, tag: str) -> dict:
    path = out / f"{probe}-{tag}.json"
    path.unlink(missing_ok=True)
    code = f"from harness.gate.gate import {probe}; {probe}({str(path)!r})"
    done = env.run(["-c", code], timeout=1800, log=out / f"{probe}-{tag}.log")
    if done.returncode != 0 or not path.is_file():
        raise GateStepError(f"{probe} failed in the {tag} environment; see {out / f'{probe}-{tag}.log'}")
    return json.loads(path.read_text())


def check_work(env, against, versions, out: Path) -> Check:
    mine, theirs = run_probe(env, "probe_work", out, "candidate"), run_probe(against, "probe_work", out, "against")
    return rule_work(mine, theirs, *versions)


def check_rtf(env, against, rounds: int, out: Path) -> Check:
    mine, theirs = [], []
    for r in range(rounds):  # A B A B: a drift of the shared machine hits both alike
        theirs.append(run_probe(against, "probe_rtf", out, f"against-{r}")["median_rtf"])
        mine.append(run_probe(env, "probe_rtf", out, f"candidate-{r}")["median_rtf"])
    return rule_rtf(mine, theirs)


def real_checkpoint(given: str | None) -> str | None:
    """The real checkpoint the quality check runs on: `given` (--checkpoint), else FASTPATH_CHECKPOINT, else a
    snapshot in the local Hugging Face cache; None when there is none."""
    from harness.model.checkpoint import ENV_CHECKPOINT, find_hf_cache

    found = given or os.environ.get(ENV_CHECKPOINT) or find_hf_cache()
    return str(found) if found else None


def check_quality(env, checkpoint: str | None, out: Path, version: str = "candidate") -> Check:
    from harness.model.checkpoint import ENV_CHECKPOINT

    real = real_checkpoint(checkpoint)
    if not real:
        return rule_quality(None, f"no real OmniVoice checkpoint (pass --checkpoint PATH or set {ENV_CHECKPOINT}); "
                                  f"the quality tier judges real speech only")
    result = run_pytest(env, ["tests_quality", "-m", "real_weights", "--checkpoint", real], out, "quality",
                        tier_environment(env, version))
    return rule_quality(result, required=True)


QUALITY_METRICS = ("wer", "sim", "mos")


def check_quality_set(env, against, quality_set: str | None, synth: str, checkpoint: str | None, out: Path,
                      judges: dict | None = None, log=print, metrics=QUALITY_METRICS, workers: int = 1,
                      engine: str = "local", gpus=None) -> Check:
    """The candidate's outputs of an evaluation set against the --against version's, item by item (module
    docstring, check quality-set); over `workers` workers on `engine` (harness.quality.shards: the same verdict)."""
    from harness.quality import evaluate, judge as wer_judge, sets, shards

    if not quality_set:
        return Check("quality-set", "skipped", False, "skipped: no --quality-set given (a Seed-TTS-eval meta.lst or "
                                                      "a LibriSpeech-PC list)")
    real = real_checkpoint(checkpoint) if synth == "omnivoice" else None
    if synth == "omnivoice" and not real:
        from harness.model.checkpoint import ENV_CHECKPOINT

        return Check("quality-set", "skipped", False, f"skipped: the omnivoice synthesizer needs a real OmniVoice "
                                                      f"checkpoint (pass --checkpoint PATH or set {ENV_CHECKPOINT})",
                     required=True)
    eval_set = sets.read_set(quality_set)
    folders = {side: out / "quality-set" / side for side in ("against", "candidate")}
    for side, e in (("against", against), ("candidate", env)):
        log(f"quality-set: generating {len(eval_set.items)} items in the {side} environment ({synth})"
            + (f" over {workers} workers ({engine})" if workers > 1 else ""))
        if workers > 1:
            try:
                shards.generate(quality_set, folders[side], workers, synth, python=e.python, checkpoint=real,
                                extra_env=e.run_env(), engine=engine, gpus=gpus, logs=out, timeout=7200, log=log)
            except shards.ShardFailure as err:
                raise GateStepError(f"generating the set failed in the {side} environment: {err}") from None
            continue
        args = ["-m", "harness.quality.clone_run", str(Path(quality_set).resolve()), str(folders[side]), "--synth",
                synth] + (["--checkpoint", real] if real else [])
        done = e.run(args, timeout=7200, log=out / f"quality-set-{side}.log")
        if done.returncode != 0:
            raise GateStepError(f"generating the set failed in the {side} environment (exit {done.returncode}); see "
                                f"{out / f'quality-set-{side}.log'}")
    judges = judges or {}
    judge = wer_judge.load_judge(judges.get("wer")) if "wer" in metrics else None
    unheard = sorted({i.language for i in eval_set.items if judge is not None and not judge.hears(i.language)})
    if unheard:
        why = wer_judge.CannotHear(json.loads(judge.identity)["model"], unheard)
        return Check("quality-set", "skipped", False, f"not judged: {why}", required=True)
    from harness.quality.mos import load_mos_judge
    from harness.quality.voice import load_voice_judge

    voice_judge = load_voice_judge(judges.get("sim")) if "sim" in metrics else None
    mos_judge = load_mos_judge(judges.get("mos")) if "mos" in metrics else None
    log(f"quality-set: judging {len(eval_set.items)} items on {', '.join(m.upper() for m in metrics)}, candidate "
        f"against --against")
    if workers > 1:
        try:
            result = shards.judge_set(quality_set, folders["against"], folders["candidate"], workers,
                                      out / "quality-set" / "judged", metrics, judges, label="candidate",
                                      pack_dir=out / "quality-set" / "pack", engine=engine, log=log,
                                      loaded=(judge, voice_judge, mos_judge))
        except shards.ShardFailure as err:
            raise GateStepError(str(err)) from None
    else:
        result = evaluate.compare_set_folders(judge, eval_set, folders["against"], folders["candidate"],
                                              label="candidate", pack_dir=out / "quality-set" / "pack",
                                              voice_judge=voice_judge, mos_judge=mos_judge)
    overall = result.overall or result.verdict
    per = {getattr(v, "metric", "WER"): v.passed for v in getattr(overall, "verdicts", (overall,))}
    failed = [m for m, ok in per.items() if not ok]
    languages = ", ".join(f"{n} {lang}" for lang, n in eval_set.languages.items())
    summary = (f"{len(eval_set.items)} items ({languages}) of {eval_set.path.name}, {synth}: "
               + ("non-inferior on " + ", ".join(per) if overall.passed
                  else f"not shown non-inferior on {', '.join(failed) or 'the set'}"))
    details = overall.format().splitlines() + ([f"listening pack: {result.pack}"] if result.pack else [])
    (out / "quality-set" / "verdict.json").write_text(json.dumps(
        {"set": str(eval_set.path), "items": len(eval_set.items), "languages": eval_set.languages, "synth": synth,
         "judged": list(metrics), "passed": overall.passed, "metrics": [metric_figures(v) for v in getattr(overall, "verdicts", (overall,))]},
        indent=1))
    return Check("quality-set", "pass" if overall.passed else "fail", not overall.passed, summary, details,
                 required=True)


def metric_figures(v) -> dict:
    """One metric's row of a quality-set verdict as data: WER in points (lower is better), SIM and MOS in their
    units (higher is better); the bounds are of candidate - reference."""
    if hasattr(v, "metric"):
        return {"metric": v.metric, "verdict": v.verdict, "unit": v.unit, "better": "higher", "ref": v.mean_ref,
                "cand": v.mean_cand, "delta": v.delta, "lower": v.lower, "upper": v.upper, "margin": v.margin,
                "clips": v.n_clips, "judge": v.judge}
    return {"metric": "WER", "verdict": v.verdict, "unit": "WER points", "better": "lower", "ref": 100 * v.wer_ref,
            "cand": 100 * v.wer_cand, "delta": 100 * v.delta_wer, "lower": 100 * v.lower, "upper": 100 * v.upper,
            "margin": 100 * v.margin, "clips": v.n_clips, "judge": v.judge}


class GateStepError(RuntimeError):
    pass


# --- the command -------------------------------------------------------------------------------------------


def run_gate(candidate_text: str, against_text: str, out: Path, checks=CHECKS, rtf_rounds: int = 0,
             checkpoint: str | None = None, fresh: bool = False, command: str = "", log=print,
             parity_select: str | None = None, accepted: dict | None = None, progress: Progress | None = None,
             device: str = "cpu", dtype: str = "fp32", quality_set: str | None = None,
             quality_synth: str = "omnivoice", judges: dict | None = None,
             quality_metrics=QUALITY_METRICS, workers: int = 1, engine: str = "local", gpus=None) -> dict:
    """log: one line per environment prepared and per check started (with a counter and the elapsed time);
    progress: a Progress whose "checks" stage counts the finished checks (none: nothing)."""
    start = time.perf_counter()
    progress = progress if progress is not None else Progress("gate", quiet=True)
    out.mkdir(parents=True, exist_ok=True)
    log(f"plan: prepare 2 environments (candidate {candidate_text}, against {against_text}: a venv each, reused "
        f"from .cache/gate/ when built before), then {len(checks)} checks: {', '.join(checks)}")
    log(f"environment 1/2: {candidate_text}")
    try:
        env, ours = cand.prepare(cand.parse_spec(candidate_text), fresh=fresh), None
    except cand.CandidateError as err:  # it does not install: the installer's message; the candidate is broken
        if err.gate_side:  # the source could not be reached (or a tool is missing): the gate could not judge
            raise
        env, ours = None, {"ok": False, "error": str(err), "traceback": ""}
    log(f"environment 2/2: {against_text}, {clock(time.perf_counter() - start)} elapsed")
    against = cand.prepare(cand.parse_spec(against_text), fresh=fresh)
    ours = ours or env.import_check()
    if ours["ok"]:
        theirs = against.import_check()
        if not theirs["ok"]:
            raise cand.CandidateError(f"the --against environment does not import omnivoice: {theirs['error']}")
    else:  # nothing will run: its name and version are enough
        theirs = dict(zip(("distribution", "version"), against.distribution()))
    versions = (ours.get("version", "?"), theirs["version"])
    names = (ours.get("distribution", "omnivoice") if ours["ok"] else None, theirs.get("distribution", "omnivoice"))
    # what a fingerprint or goldens record of the candidate is filed under: a commit of upstream's master still says
    # its last release's version, and must not be recorded as that release
    recorded_as = (commit_label(versions[0], env.source.get("commit")) if env is not None else versions[0], versions[1])
    results = []
    if not ours["ok"]:
        results.append(could_not_run(candidate_text, ours, installed=env is not None))
        results += [Check(n, "skipped", False, "skipped: the candidate could not be installed or imported")
                    for n in checks]
    else:
        results.append(Check("install", "pass", False, f"{names[0]} {versions[0]}{at_commit({'source': env.source})} "
                                                       f"installs the omnivoice package, which imports from {env.site}",
                             list(env.notes) + source_lines(env.source)))
        try:  # what a user of the candidate meets whatever the checks find: its own line of the verdict
            results.append(check_api(env, against, versions, names))
        except Exception as err:  # noqa: BLE001 - reported, never a finding
            results.append(Check("api", "error", False, f"could not run: {type(err).__name__}: {err}"))
        records = {}

        def behaviour_records():  # recorded once, used by the behaviour check and to mark fingerprint changes
            if not records:
                records.update(against=run_behaviour(against, out, "against", device, dtype),
                               candidate=run_behaviour(env, out, "candidate", device, dtype))
            return records

        steps = {
            "fingerprints": lambda: check_fingerprints(
                env, against, recorded_as, out,
                list(behaviour_records().values()) if "behaviour" in checks else None),
            "behaviour": lambda: check_behaviour(behaviour_records(), versions, accepted or {}),
            "goldens": lambda: check_goldens(env, recorded_as, out),
            "parity": lambda: check_parity(env, out, parity_select, versions[0], against, versions[1], device),
            "work": lambda: check_work(env, against, versions, out),
            "rtf": lambda: check_rtf(env, against, rtf_rounds, out) if rtf_rounds else rule_rtf([], []),
            "quality-set": lambda: check_quality_set(env, against, quality_set, quality_synth, checkpoint, out,
                                                     judges, log, quality_metrics, workers, engine, gpus),
            "quality": lambda: check_quality(env, checkpoint, out, versions[0]),
        }
        # with a real checkpoint the quality check is needed for a verdict: raised or timed out, it is ERROR
        required = ({"quality"} if real_checkpoint(checkpoint) else set()) | ({"quality-set"} if quality_set else set())
        with progress.stage("checks", total=len(checks)) as step:
            for i, name in enumerate(checks, 1):
                t0 = time.perf_counter()
                log(f"check {i}/{len(checks)}: {name} started, {clock(t0 - start)} elapsed")
                try:
                    check = steps[name]()
                except subprocess.TimeoutExpired as err:
                    check = Check(name, "error", False, f"could not run: timed out after {err.timeout:.0f} s: "
                                                        f"{' '.join(map(str, err.cmd))}")
                except Exception as err:  # noqa: BLE001 - a check that could not run is reported, never a finding
                    check = Check(name, "error", False, f"could not run: {type(err).__name__}: {err}")
                check.required = check.required or name in required
                check.details.append(f"took {time.perf_counter() - t0:.0f} s")
                results.append(check)
                step(f"{name} {check.status} in {time.perf_counter() - t0:.0f} s")
    report = verdict(results)
    report.update({
        "candidate": {"spec": candidate_text, "distribution": names[0], "version": versions[0],
                      "python": str(env.python) if env is not None else None,
                      "source": env.source if env is not None else {}},
        "against": {"spec": against_text, "distribution": names[1], "version": versions[1],
                    "python": str(against.python), "source": against.source},
        "environment": {**gold.environment(), "omnivoice": None, "machine": machine.summary()},
        "command": command,
        "accepted": accepted or {},
        "seconds": round(time.perf_counter() - start, 1),
    })
    (out / "verdict.json").write_text(json.dumps(report, indent=1))
    (out / "verdict.md").write_text(render_verdict(report))
    return report


def source_lines(source: dict) -> list:
    """The install row's account of where the candidate came from (candidate.source_record)."""
    if not source.get("kind"):
        return []
    where = {"git": lambda: f"from {source.get('url')} at {source.get('ref') or 'HEAD'}: commit {source.get('commit')}",
             "checkout": lambda: (f"from the checkout {source.get('path')}: commit {source['commit']}"
                                  + (", with uncommitted changes" if source.get("dirty") else ", clean")
                                  if source.get("commit") else f"from {source.get('path')} (not a git checkout)")}
    lines = [where[source["kind"]]()] if source["kind"] in where else []
    lines.append(f"{source['distribution']} {source['version']} as pip installed it ({source['spec']}); declares "
                 + (", ".join(source.get("requires") or []) or "no requirements")
                 + (f"; installed into its venv: {', '.join(source['installed_requirements'])}"
                    if source.get("installed_requirements") else "; each met by this environment"))
    return lines


def could_not_run(candidate_text: str, found: dict, installed: bool) -> Check:
    """The install check of a candidate that did not install (pip's message) or import (the traceback's end): it
    ran, and the candidate failed it (the gate's own failures to reach a source never get here: gate_side)."""
    lines = [ln for ln in found["error"].splitlines() if ln.strip()]
    said = next((ln.strip() for ln in lines if ln.lstrip().startswith("ERROR")), lines[0] if lines else "no message")
    what = "does not import" if installed else "does not install"
    details = found["traceback"].splitlines()[-15:] if found["traceback"] else lines
    return Check("install", "fail", True, f"could not run: {candidate_text} {what}: {said}", details)


def name_of(side: dict) -> str:
    """'lahgtna-omnivoice 0.1.5': the distribution and version of a report's candidate or --against (its spec when
    it did not install)."""
    if "distribution" not in side:  # reports from before forks were named
        return f"omnivoice {side['version']}"
    return f"{side['distribution']} {side['version']}{at_commit(side)}" if side["distribution"] else side["spec"]


def commit_label(version: str, commit: str | None) -> str:
    """The version a candidate built from a commit is recorded under: '0.2.1+g0123456789ab' (a PEP 440 local
    version; '0.2.1+floor.g0123456789ab' where it has one), so that upstream's master, which still says 0.2.1, is
    never recorded as the 0.2.1 release; a release's own version otherwise."""
    if not commit:
        return version
    return f"{version}{'.' if '+' in version else '+'}g{commit[:12]}"


def at_commit(side: dict) -> str:
    """' at commit 0123456789ab' (a git candidate, or a checkout: ' (uncommitted changes)' where its tree differs
    from it), or '' for a release."""
    source = side.get("source") or {}
    if not source.get("commit"):
        return ""
    return f" at commit {source['commit'][:12]}" + (" (with uncommitted changes)" if source.get("dirty") else "")


def headline(report: dict) -> str:
    if report["state"] == "could-not-run":
        return f"MUST NOT SHIP (the candidate is broken, no check could run on it): {report['reason']}"
    if report["state"] == "must-not-ship":
        return f"MUST NOT SHIP (blocked by: {', '.join(report['blocked_by'])})"
    if report["state"] == "error":
        return (f"ERROR: no verdict, checks the verdict needs could not run: {', '.join(report['errors'])} "
                f"(the reason is in their rows; fix it and rerun)")
    if report["state"] == "incomplete":
        return f"INCOMPLETE: no verdict, checks the verdict needs not run whole: {not_run_reasons(report)}"
    return "MAY SHIP"


def verdict_notes(report: dict) -> list:
    """The verdict's lines beside its headline: the public API the --against version has and the candidate lacks
    (its own line: expected for a downgrade, a WARNING for an upgrade), and every test that did not apply to the
    candidate, by name and reason (counted, never blocking)."""
    lines = []
    if report.get("api"):
        lines.append(f"API: {report['api']['summary']}")
    absent = report.get("not_applicable") or []
    if absent:
        lines.append(f"not applicable: {len(absent)} test(s) cannot apply to the candidate (never blocking):")
        lines += [f"  {row['check']}: {row['test']}: {row['reason']}" for row in absent]
    return lines


def not_run_reasons(report: dict) -> str:
    """Each check of report['not_run'] with why, for people: left out (--checks), skipped (its summary: the first
    skip's reason), or run on a part (--parity-k)."""
    rows = {c["name"]: c for c in report["checks"]}
    said = []
    for name in report["not_run"]:
        row = rows.get(name)
        said.append(f"{name} (left out: drop --checks)" if row is None
                    else f"{name} ({row['summary']})" if row["status"] == "skipped"
                    else f"{name} (run on a part: drop --parity-k)")
    return ", ".join(said)


def render_table(report: dict) -> str:
    rows = [("check", "status", "blocks", "summary")]
    rows += [(c["name"], c["status"], "YES" if c["blocks"] else "no", c["summary"]) for c in report["checks"]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    for c in report["checks"]:
        if c["details"]:
            lines.append(f"\n{c['name']}:")
            lines += [f"  {d}" for d in c["details"]]
    lines.append(f"\nverdict: {name_of(report['candidate'])} against {name_of(report['against'])}: {headline(report)}")
    lines += verdict_notes(report)
    return "\n".join(lines)


def render_verdict(report: dict) -> str:
    env = report["environment"]
    notes = [f"- {line.strip()}" for line in verdict_notes(report)]
    out = [f"# Upstream gate: {name_of(report['candidate'])} against {name_of(report['against'])}", "",
           f"**{headline(report)}**", "", *notes, *([""] if notes else []),
           f"Machine: {env['machine']}; torch {env['torch']}, transformers {env['transformers']}; CPU fp32; "
           f"{report['seconds']:.0f} s; command: `{report['command']}`", "",
           "| check | status | blocks | summary |", "|---|---|---|---|"]
    out += [f"| {c['name']} | {c['status']} | {'yes' if c['blocks'] else 'no'} | {c['summary']} |"
            for c in report["checks"]]
    for c in report["checks"]:
        if c["details"]:
            out += ["", f"## {c['name']}", ""] + [f"- {d}" for d in c["details"]]
    return "\n".join(out) + "\n"


def results_figures(report: dict) -> dict:
    """The gate's results-file figures: the verdict and one row per check (details stay in OUT/verdict.*)."""
    return {
        **{side: {k: report[side][k] for k in ("spec", "distribution", "version", "source") if k in report[side]}
           for side in ("candidate", "against")},
        "state": report["state"], "blocked_by": report["blocked_by"], "not_run": report["not_run"],
        "errors": report["errors"], "reason": report.get("reason"), "accepted": report.get("accepted", {}),
        "checks": [{"name": c["name"], "status": c["status"], "blocking": c["blocks"], "summary": c["summary"]}
                   for c in report["checks"]],
        "not_applicable": report.get("not_applicable", []), "api": report.get("api"),
        "seconds": report["seconds"],
    }


def gathered(figures: dict, previous: dict | None) -> dict:
    """A "gate" results file holds one verdict per candidate and --against (`verdicts`, oldest first), each with
    the command, commit and date that measured it: this run's replaces the same pair's, and the verdicts of other
    candidates stay (the gate on 0.1.5 and on 0.2.0 are two runs, and the range test reads both). `previous`: the
    file's figures before (None, or a file of one verdict written before this layout: replaced)."""
    from harness.run import results as result_files

    commit, dirty = result_files.checkout_state()
    entry = {**figures, "command": result_files.command_line(), "commit": commit, "dirty": dirty,
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    pair = (figures["candidate"]["spec"], figures["against"]["spec"])
    kept = [v for v in (previous or {}).get("verdicts", [])
            if (v["candidate"]["spec"], v["against"]["spec"]) != pair]
    return {"verdicts": kept + [entry]}


def write_results(args, figures: dict):
    """--results DIR: this machine's "gate" file with this verdict gathered in (`gathered`)."""
    from harness.run import results as result_files
    from harness.run.machine import hardware_key, machine_info

    if getattr(args, "results", None) is None:
        return None
    path = Path(args.results) / "gate" / f"{hardware_key(machine_info('cpu'))}.json"
    previous = result_files.load(path)["figures"] if path.is_file() else None  # a corrupt file: its error, named
    return result_files.write_if_asked(args, "gate", gathered(figures, previous))


def render_results(figures: dict) -> str:
    """A "gate" results file's figures as markdown: each verdict (`gathered`), its rows not applied and its API
    line, then one row per check."""
    if "verdicts" in figures:
        return "\n\n".join(f"Measured {v['date'][:10]} at commit `{(v['commit'] or 'unknown')[:12]}`"
                             f"{' (with uncommitted changes)' if v['dirty'] else ''} with `{v['command']}`:\n\n"
                             + render_results(v) for v in figures["verdicts"])

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    def side(which: str, before: str) -> str:  # before: how files written before forks were named read
        found = figures[which]
        if "distribution" not in found:
            return f"{before}`{found['version']}` (`{found['spec']}`)"
        return (f"{found['distribution']} `{found['version']}`{at_commit(found)} (`{found['spec']}`)"
                if found["distribution"] else f"`{found['spec']}`")

    lines = [f"{side('candidate', 'omnivoice ')} against {side('against', '')}: **{headline(figures)}**; "
             f"the gate took {figures['seconds']:.0f} s.", "",
             "| check | status | blocks the bump | summary |", "|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {'yes' if c['blocking'] else 'no'} | {cell(c['summary'])} |"
              for c in figures["checks"]]
    notes = verdict_notes(figures)
    if notes:
        lines += [""] + [f"- {cell(line.strip())}" for line in notes]
    if figures.get("accepted"):
        lines += ["", "Behaviour changes accepted by name: "
                  + "; ".join(f"`{k}`: {cell(v)}" for k, v in sorted(figures["accepted"].items())) + "."]
    return "\n".join(lines)


def _checks(text: str) -> tuple:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    return names


def _quality_metrics(text: str) -> tuple:
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in QUALITY_METRICS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown metric(s) {unknown or [text]}; known: {', '.join(QUALITY_METRICS)}")
    return names


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the exit statuses (the epilog) kept as written."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite gate", description=__doc__.split("\n")[0], epilog=EXIT_HELP,
                                     formatter_class=HelpFormatter)
    parser.add_argument("candidate", help="omnivoice==X.Y.Z (or NAME==X.Y.Z of a fork), a path to a .whl, git+URL@REF "
                                          "(upstream's master: git+https://github.com/k2-fsa/OmniVoice@master), a "
                                          "checkout folder (with a pyproject.toml), or a folder holding omnivoice/: "
                                          "any distribution that installs the omnivoice package")
    parser.add_argument("--against", default="current",
                        help="the version to compare with: 'current' (this environment's omnivoice) or a candidate form")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for verdict.json, verdict.md, diffs and logs; None: out/gate/<candidate>")
    parser.add_argument("--checks", type=_checks, default=",".join(CHECKS), help="comma-separated subset of the checks to run")
    parser.add_argument("--rtf-rounds", type=int_at_least(0), default=0,
                        help="interleaved RTF rounds on tiny (informational; each round loads both versions)")
    parser.add_argument("--checkpoint", default=None, help="a real OmniVoice checkpoint folder, for the quality tier "
                                                             "and --quality-set")
    parser.add_argument("--quality-set", default=None, metavar="PATH",
                        help="an evaluation set to generate in both versions and judge item by item: a Seed-TTS-eval "
                             "meta.lst (or its folder, one list per language), or a LibriSpeech-PC list")
    parser.add_argument("--quality-synth", choices=("omnivoice", "espeak"), default="omnivoice",
                        help="what generates the set: omnivoice (the real checkpoint, the lossless stack applied) or "
                             "espeak (the offline stand-in that checks the gate itself; docs/gate.md)")
    parser.add_argument("--quality-metrics", type=_quality_metrics, default=",".join(QUALITY_METRICS),
                        help="what --quality-set is judged on, comma-separated (leave wer out for a language no WER "
                             "judge at hand hears: SIM and MOS decide alone, and the verdict says so)")
    parser.add_argument("--judge", default=None, help="the WER judge for --quality-set: a CTranslate2 Whisper folder "
                                                     "(None: FASTPATH_JUDGE, else the bundled tiny.en)")
    parser.add_argument("--sim-judge", default=None, help="the SIM judge for --quality-set: a WavLMForXVector folder "
                                                         "(None: FASTPATH_SIM_JUDGE, else GE2E)")
    parser.add_argument("--mos-judge", default=None, help="the MOS judge for --quality-set: UTMOS22 strong weights, "
                                                         "utmos_state_dict.pt (None: FASTPATH_MOS_JUDGE, else DNSMOS)")
    parser.add_argument("--workers", type=int_at_least(1), default=1,
                        help="generate and judge --quality-set over this many workers (harness.quality.shards: items "
                             "split deterministically, the same verdict as one worker)")
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="where the workers run: local processes, or Ray tasks on the cluster RAY_ADDRESS names "
                             "(docs/sharding.md)")
    parser.add_argument("--gpus", default=None, type=lambda t: [g.strip() for g in t.split(",") if g.strip()],
                        metavar="0,1,...", help="generate --quality-set on GPUs: with engine local, worker k on GPU k "
                                                "mod their number; with engine ray, each task asks Ray for one GPU")
    parser.add_argument("--fresh", action="store_true", help="rebuild the candidate's venv under .cache/gate/")
    parser.add_argument("--parity-k", default=None, metavar="EXPR",
                        help="run only the parity tests pytest -k EXPR selects (the verdict says so); "
                             "default: the whole tier")
    parser.add_argument("--accept", action="append", default=[], metavar="SETTING=REASON",
                        help="accept a reviewed behaviour change at one grid setting ('*' for all), with the reason "
                             "the verdict records; repeatable")
    parser.add_argument("--device", choices=GRID_DEVICES, default="cpu",
                        help="the device your service runs on: where the behaviour grid runs, both versions alike "
                             "(cuda: deterministic settings); with cuda the parity check also runs the CUDA parity "
                             "rows (-m cuda) in both versions, and is not judged where CUDA is not usable")
    parser.add_argument("--dtype", choices=GRID_DTYPES, default="fp32",
                        help="the dtype of the behaviour grid's model (e.g. bf16 with --device cuda)")
    result_files.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("gate", quiet=args.quiet)
    accepted = {}
    for item in args.accept:
        name, sep, reason = item.partition("=")
        if not sep or not reason.strip():
            parser.error(f"--accept {item!r}: give SETTING=REASON (the reason is recorded)")
        accepted[name.strip()] = reason.strip()
    if args.quality_set:  # a bad set or a judge not there is refused before any environment is made
        from harness.quality import judge, sets, wavlm

        try:
            sets.read_set(args.quality_set)
            if "wer" in args.quality_metrics:
                judge.resolve_judge(args.judge or os.environ.get(judge.JUDGE_ENV))
            if args.sim_judge:
                wavlm.weights_file(Path(args.sim_judge).expanduser())
            if args.mos_judge and not Path(args.mos_judge).expanduser().is_file():
                raise FileNotFoundError(f"--mos-judge {args.mos_judge} is not a file: give utmos_state_dict.pt")
        except (sets.SetError, FileNotFoundError) as err:
            print(f"error: the gate could not run: {err}", file=sys.stderr)
            return GATE_ERROR
    try:
        spec = cand.parse_spec(args.candidate)
        # absolute: the candidate's venv runs its steps in the repository, and a relative folder would be read there
        out = (args.out or REPO_ROOT / "out" / "gate" / spec.name).resolve()
        command = (result_files.command_line() if result_files.COMMAND is not None
                   else shlex.join(["fastpath-suite", "gate", *(sys.argv[1:] if argv is None else argv)]))
        report = run_gate(args.candidate, args.against, out, args.checks, args.rtf_rounds, args.checkpoint,
                          args.fresh, command, log=progress.say, parity_select=args.parity_k, accepted=accepted,
                          progress=progress, device=args.device, dtype=args.dtype, quality_set=args.quality_set,
                          quality_synth=args.quality_synth, quality_metrics=args.quality_metrics,
                          judges={"wer": args.judge, "sim": args.sim_judge, "mos": args.mos_judge},
                          workers=args.workers, engine=args.engine, gpus=args.gpus)
    except cand.CandidateError as err:  # a bad name, an --against that does not install, a source not reached
        print(f"error: the gate could not run: {err}", file=sys.stderr)
        return GATE_ERROR
    except Exception as err:  # noqa: BLE001 - the gate's own failure: exit 2 with the reason, never 1
        print(f"error: the gate could not run: {type(err).__name__}: {err}", file=sys.stderr)
        return GATE_ERROR
    print(render_table(report))
    print(f"\nwritten: {out / 'verdict.md'}, {out / 'verdict.json'} ({report['seconds']:.0f} s)")
    write_results(args, results_figures(report))
    return EXIT[report["state"]]


if __name__ == "__main__":
    raise SystemExit(main())
