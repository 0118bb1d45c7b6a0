"""The gate's exit status says whose the finding is: 0 MAY SHIP, 1 the candidate's (a check found it worse, or it does
not install or import), 2 the gate's own (it could not judge), 3 not judged. Each from a planted verdict through
main(), each failure to start, and pip's own words sorted into the candidate's and the gate's side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.gate import candidate as cand
from harness.gate import gate

PASS = [gate.Check(n, "pass", False, "ok") for n in gate.BLOCKING]


def planted(state: str) -> list:
    """Checks whose verdict is `state`."""
    return {
        "may-ship": PASS,
        "must-not-ship": PASS + [gate.Check("behaviour", "changed", True, "differs at auto_voice")],
        "could-not-run": [gate.could_not_run("omnivoice==9.9.9", {"ok": False, "error": "ERROR: No matching "
                                                                  "distribution found for omnivoice==9.9.9",
                                                                  "traceback": ""}, installed=False)],
        "error": [c if c.name != "work" else gate.Check("work", "error", False, "could not run: probe failed")
                  for c in PASS],
        "incomplete": [c for c in PASS if c.name != "parity"],
    }[state]


def report_of(checks: list) -> dict:
    return {**gate.verdict(checks), "candidate": {"spec": "omnivoice==9.9.9", "distribution": "omnivoice",
                                                  "version": "9.9.9"},
            "against": {"spec": "current", "distribution": "omnivoice", "version": "0.2.1"}, "seconds": 1.0}


@pytest.mark.parametrize("state, code", [("may-ship", 0), ("must-not-ship", 1), ("could-not-run", 1), ("error", 2),
                                         ("incomplete", 3)])
def test_each_verdict_exits_with_whose_the_finding_is(state, code, monkeypatch, tmp_path, capsys):
    """A broken candidate (does not install or import) is the candidate's: 1, as MUST NOT SHIP; an error is the
    gate's own: 2; the verdict file says the same (exit_status)."""
    report = report_of(planted(state))
    assert (report["state"], report["exit_status"]) == (state, code), report
    monkeypatch.setattr(gate, "run_gate", lambda *a, **k: report)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path)]) == code
    printed = capsys.readouterr().out
    assert ("MUST NOT SHIP" in printed) == (code == 1), printed


def test_a_candidate_that_does_not_install_is_refused_as_broken_naming_pips_words():
    report = report_of(planted("could-not-run"))
    install = report["checks"][0]
    assert (install["status"], install["blocks"], report["blocked_by"], report["errors"]) == (
        "fail", True, ["install"], []), report
    assert gate.headline(report) == ("MUST NOT SHIP (the candidate is broken, no check could run on it): omnivoice==9.9.9 "
                                     "does not install: ERROR: No matching distribution found for omnivoice==9.9.9")


@pytest.mark.parametrize("failure", [
    cand.CandidateError("pip could not reach the candidate's source: Could not resolve host", gate_side=True),
    cand.CandidateError("the --against environment does not import omnivoice: ImportError"),
    subprocess.CalledProcessError(1, ["python", "-m", "venv"]),
], ids=["source-unreachable", "against-broken", "venv-failed"])
def test_the_gates_own_failures_exit_2_with_the_reason(failure, monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(gate, "run_gate", broken)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path)]) == 2
    assert "error: the gate could not run" in capsys.readouterr().err


def test_a_source_the_gate_cannot_reach_is_never_a_verdict_on_the_candidate(monkeypatch, tmp_path):
    """run_gate: an install failure on the gate's side (gate_side) propagates (exit 2, no verdict); one of the
    candidate's own is the install row of a could-not-run verdict."""
    def prepare(spec, fresh=False):
        raise cand.CandidateError(f"cannot reach {spec.text}", gate_side=spec.kind != "current")

    monkeypatch.setattr(cand, "prepare", prepare)
    with pytest.raises(cand.CandidateError, match="cannot reach omnivoice==9.9.9"):
        gate.run_gate("omnivoice==9.9.9", "current", tmp_path, checks=("fingerprints",), log=lambda m: None)
    assert not (tmp_path / "verdict.json").exists()


def test_bad_command_lines_and_names_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        gate.main(["omnivoice==9.9.9", "--device", "tpu"])
    assert usage.value.code == gate.GATE_ERROR == 2
    assert gate.main([str(tmp_path / "nothing.whl")]) == 2
    assert gate.main(["git+https://github.com/k2-fsa/OmniVoice@"]) == 2
    assert "names no ref" in capsys.readouterr().err


def test_help_lists_each_exit_status(capsys):
    with pytest.raises(SystemExit) as done:
        gate.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for line in ("0  MAY SHIP", "1  MUST NOT SHIP, the candidate's fault", "2  ERROR, the gate's own",
                 "3  INCOMPLETE, not judged"):
        assert line in text, text
    assert "git+URL@REF" in text


UNREACHABLE = [  # pip's and git's own words where the source could not be reached
    "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(\"Failed to establish a new "
    "connection: [Errno 111] Connection refused\")': /simple/omnivoice/\nERROR: No matching distribution found",
    "fatal: unable to access 'https://github.com/k2-fsa/OmniVoice/': Could not resolve host: github.com",
    "fatal: could not read Username for 'https://github.com': terminal prompts disabled",
]
THE_CANDIDATES = [  # the candidate's own: it is not there, or it is broken
    "ERROR: Could not find a version that satisfies the requirement omnivoice==9.9.9 (from versions: 0.1.5, 0.2.0)\n"
    "ERROR: No matching distribution found for omnivoice==9.9.9",
    "ERROR: omnivoice-9.9.9-py3-none-any.whl is not a valid wheel filename.",
    "error: pathspec 'nobranch' did not match any file(s) known to git",
    "ERROR: Package 'omnivoice' requires a different Python: 3.11.2 not in '<3'",
]


@pytest.mark.parametrize("said, gate_side", [(s, True) for s in UNREACHABLE] + [(s, False) for s in THE_CANDIDATES])
def test_pips_words_are_sorted_into_the_gates_side_and_the_candidates(said, gate_side):
    assert cand.unreachable(said) == gate_side


def test_an_index_that_cannot_be_reached_is_the_gates_side_and_a_missing_version_the_candidates(tmp_path, monkeypatch):
    """pip itself, run as the gate runs it: against an index on a closed port (gate_side), and against a reachable
    source that lacks the version (the candidate's)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip names a connection error only in its warning before a retry
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(cand.CandidateError) as closed:
        cand._pip(python, "install", "--no-deps", "omnivoice==9.9.9")
    assert closed.value.gate_side and "could not reach the package index" in str(closed.value), str(closed.value)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(cand.CandidateError) as missing:
        cand._pip(python, "install", "--no-deps", "omnivoice==9.9.9")
    assert not missing.value.gate_side and "No matching distribution" in str(missing.value), str(missing.value)


def test_the_verdict_file_keeps_its_fields_and_adds_the_exit_status(tmp_path):
    report = report_of(planted("must-not-ship"))
    for key in ("ship", "state", "blocked_by", "not_run", "errors", "reason", "checks", "not_applicable", "api"):
        assert key in report, key
    assert json.loads(json.dumps(report))["exit_status"] == 1
