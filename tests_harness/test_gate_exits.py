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
    reason = str(failure) if isinstance(failure, cand.CandidateError) else f"{type(failure).__name__}: {failure}"
    assert f"error: the gate could not run: {reason}\n" in capsys.readouterr().err


def test_a_source_the_gate_cannot_reach_is_never_a_verdict_on_the_candidate(monkeypatch, tmp_path):
    """run_gate: an install failure on the gate's side (gate_side) propagates (exit 2, no verdict). (One of the
    candidate's own is the install row of a could-not-run verdict: tests_harness/test_gate_candidates.py.)"""
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


def test_the_verdict_keeps_its_fields_and_adds_the_exit_status(tmp_path):
    report = report_of(planted("must-not-ship"))
    for key in ("ship", "state", "blocked_by", "not_run", "errors", "reason", "checks", "not_applicable", "api"):
        assert key in report, key
    assert report["exit_status"] == gate.EXIT["must-not-ship"] == 1


# --- the command line: what main hands run_gate, what it prints, what it refuses ------------------------------


def gate_run(monkeypatch, report=None):
    """run_gate and write_results faked: what main passes them is recorded; run_gate answers with `report`."""
    seen = {}

    def run_gate(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return report or report_of(PASS)

    monkeypatch.setattr(gate, "run_gate", run_gate)
    monkeypatch.setattr(gate, "write_results", lambda args, figures: seen.update(results=(args, figures)))
    monkeypatch.setattr(gate.result_files, "COMMAND", None)
    return seen


def test_the_gate_without_options_runs_every_check_on_the_cpu_in_fp32_against_this_environment(monkeypatch):
    """The documented defaults (docs/gate.md; --help shows them), as run_gate receives them."""
    seen = gate_run(monkeypatch)
    assert gate.main(["omnivoice==9.9.9"]) == 0
    out = (gate.REPO_ROOT / "out" / "gate" / "omnivoice-9.9.9").resolve()
    assert seen["args"] == ("omnivoice==9.9.9", "current", out, gate.CHECKS, 0, None, False,
                            "fastpath-suite gate omnivoice==9.9.9"), seen["args"]
    kwargs = dict(seen["kwargs"])
    assert callable(kwargs.pop("log")) and isinstance(kwargs.pop("progress"), gate.Progress)
    assert kwargs == {"parity_select": None, "accepted": {}, "device": "cpu", "dtype": "fp32", "quality_set": None,
                      "quality_synth": "omnivoice", "quality_metrics": gate.QUALITY_METRICS,
                      "judges": {"wer": None, "sim": None, "mos": None}, "workers": 1, "engine": "local",
                      "gpus": None}, kwargs


def test_each_option_reaches_the_gate_run_as_given(monkeypatch, tmp_path):
    seen = gate_run(monkeypatch)
    argv = ["omnivoice==9.9.9", "--against", "omnivoice==0.2.0", "--out", str(tmp_path / "o"), "--checks",
            "parity, work", "--rtf-rounds", "2", "--checkpoint", "/ckpt", "--quality-synth", "espeak",
            "--quality-metrics", "SIM,mos", "--judge", "/w", "--sim-judge", "/s", "--mos-judge", "/m", "--workers", "3",
            "--engine", "ray", "--gpus", "0, 1,", "--fresh", "--parity-k", "clone", "--accept",
            " auto_voice = reviewed: a fix ", "--accept", "*=all reviewed", "--device", "cuda", "--dtype", "bf16"]
    assert gate.main(argv) == 0
    assert seen["args"] == ("omnivoice==9.9.9", "omnivoice==0.2.0", (tmp_path / "o").resolve(), ("parity", "work"),
                            2, "/ckpt", True, gate.shlex.join(["fastpath-suite", "gate", *argv])), seen["args"]
    kwargs = {k: v for k, v in seen["kwargs"].items() if k not in ("log", "progress")}
    assert kwargs == {"parity_select": "clone", "accepted": {"auto_voice": "reviewed: a fix", "*": "all reviewed"},
                      "device": "cuda", "dtype": "bf16", "quality_set": None, "quality_synth": "espeak",
                      "quality_metrics": ("sim", "mos"), "judges": {"wer": "/w", "sim": "/s", "mos": "/m"},
                      "workers": 3, "engine": "ray", "gpus": ["0", "1"]}, kwargs


@pytest.mark.parametrize("item", ["auto_voice", "auto_voice=", "auto_voice=   "])
def test_an_accept_without_a_reason_is_refused_naming_the_form(monkeypatch, capsys, item):
    seen = gate_run(monkeypatch)
    with pytest.raises(SystemExit) as usage:
        gate.main(["omnivoice==9.9.9", "--accept", item])
    assert usage.value.code == 2 and not seen
    assert f"error: --accept {item!r}: give SETTING=REASON (the reason is recorded)" in capsys.readouterr().err


@pytest.mark.parametrize("state", ["may-ship", "must-not-ship", "error", "incomplete"])
def test_the_verdict_is_printed_with_where_it_was_written_and_handed_to_the_results_file(monkeypatch, tmp_path,
                                                                                          capsys, state):
    report = {**report_of(planted(state)), "seconds": 12.4}
    seen = gate_run(monkeypatch, report)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path), "--results", str(tmp_path / "r")]) == \
        gate.EXIT[state]
    printed = capsys.readouterr().out
    assert printed == (gate.render_table(report) + f"\n\nwritten: {tmp_path / 'verdict.md'}, "
                       f"{tmp_path / 'verdict.json'} (12 s)\n"), printed
    args, figures = seen["results"]
    assert (args.results, figures) == (tmp_path / "r", gate.results_figures(report))


@pytest.mark.parametrize("failure, said", [
    (cand.CandidateError("pip could not reach the package index"), "pip could not reach the package index"),
    (OSError("disk full"), "OSError: disk full"),
])
def test_the_gates_own_failure_is_printed_with_its_reason_and_no_verdict(monkeypatch, tmp_path, capsys, failure,
                                                                         said):
    seen = gate_run(monkeypatch)

    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(gate, "run_gate", broken)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path)]) == 2
    printed = capsys.readouterr()
    assert (printed.out, printed.err, seen) == ("", f"error: the gate could not run: {said}\n", {})


def test_a_quality_set_or_a_judge_that_is_not_there_is_refused_before_any_environment_is_made(monkeypatch, tmp_path,
                                                                                            capsys):
    seen = gate_run(monkeypatch)
    missing = tmp_path / "no-set" / "meta.lst"
    assert gate.main(["omnivoice==9.9.9", "--quality-set", str(missing)]) == 2
    assert capsys.readouterr().err.startswith("error: the gate could not run: ") and not seen
    from harness.quality import sets

    monkeypatch.setattr(sets, "read_set", lambda path: None)  # a set that reads: the judges are checked next
    assert gate.main(["omnivoice==9.9.9", "--quality-set", str(missing), "--quality-metrics", "sim,mos", "--mos-judge",
                      str(tmp_path / "utmos.pt")]) == 2
    assert capsys.readouterr().err == (f"error: the gate could not run: --mos-judge {tmp_path / 'utmos.pt'} is not a "
                                       f"file: give utmos_state_dict.pt\n") and not seen
