"""`python -m fastpath fingerprints`, the wheel's own command line, run in this process: what it prints for a source
whose functions it knows and one whose function changed, and the usage errors that name the fix."""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest

from fastpath import __main__ as cli
from fastpath import fingerprints
from fastpath.fingerprints import fingerprints_in, load_known, omnivoice_version
from fastpath.registry import relied_on

SOURCE = Path(importlib.util.find_spec("omnivoice").origin).parent / "models" / "omnivoice.py"


def test_without_the_fingerprints_verb_it_prints_its_usage_and_exits_2(capsys):
    assert cli.main([]) == 2 and cli.main(["record"]) == 2
    err = capsys.readouterr().err
    assert err.count("usage: python -m fastpath fingerprints [--record]") == 2
    assert "fastpath-suite report, from a checkout of the repository" in err


@pytest.mark.parametrize("argv, message", [
    (["--source", str(SOURCE)], "--source needs --version, the omnivoice version that source belongs to"),
    (["--only", "NoSuchFunction"], "--only NoSuchFunction: no patch relies on these; known names: "),
])
def test_a_usage_error_names_what_is_missing(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fingerprints", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_source_of_known_functions_prints_each_with_its_versions_and_exits_0(capsys):
    names, known = relied_on(), load_known()
    found = fingerprints_in(SOURCE.read_text(), names)
    assert all(found[n] in known.get(n, {}) for n in names), "the installed omnivoice is one the suite knows"
    assert cli.main(["fingerprints", "--source", str(SOURCE), "--version", "9.9.9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"omnivoice 9.9.9 (source {SOURCE})"
    assert lines[1:] == [f"  {n:45s} {found[n]:16s}  known: {', '.join(known[n][found[n]])}" for n in names]


def test_a_changed_function_is_printed_unknown_and_a_missing_one_missing_and_the_exit_is_1(tmp_path, capsys):
    text = SOURCE.read_text()
    changed = text.replace("def _get_time_steps(", "def _get_time_steps_gone(", 1)
    assert changed != text
    changed = changed.replace("def _gumbel_sample(", "def _gumbel_sample(_planted=None, *, ", 1)
    path = tmp_path / "omnivoice.py"
    path.write_text(changed)
    assert cli.main(["fingerprints", "--source", str(path), "--version", "9.9.9"]) == 1
    out = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert out["_get_time_steps"] == ["MISSING", "UNKNOWN"]
    assert out["_gumbel_sample"][1] == "UNKNOWN" and len(out["_gumbel_sample"][0]) == 16
    assert out["OmniVoice.forward"][1] == "known:"


def test_without_arguments_it_reads_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m fastpath", "fingerprints", "--source", str(SOURCE), "--version", "9.9.9"])
    assert cli.main() == 0
    assert capsys.readouterr().out.splitlines()[0] == f"omnivoice 9.9.9 (source {SOURCE})"
    monkeypatch.setattr(sys, "argv", ["python -m fastpath"])
    assert cli.main() == 2
    assert "usage: python -m fastpath fingerprints" in capsys.readouterr().err


def test_without_a_source_it_prints_the_installed_version(capsys):
    names, known = relied_on(), load_known()
    assert cli.main(["fingerprints"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"omnivoice {omnivoice_version()}"
    found = fingerprints_in(SOURCE.read_text(), names)  # the installed module's source, read without importing it
    assert lines[1:] == [f"  {n:45s} {found[n]:16s}  known: {', '.join(known[n][found[n]])}" for n in names]


def test_the_help_names_each_option_and_its_default(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fingerprints", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m fastpath fingerprints [-h] [--record] [--source SOURCE] "
                          "[--version VERSION] [--only NAME [NAME ...]]")
    for text in ("Upstream fingerprints of the installed omnivoice vs the known ones.",
                 "--record add these fingerprints to fingerprints.json as known to work (after review and parity) "
                 "(default: False)",
                 "--source SOURCE an omnivoice/models/omnivoice.py to read instead of the installed module (not "
                 "imported) (default: None)",
                 "--version VERSION the omnivoice version of --source (needed with --source) (default: None)",
                 "--only NAME [NAME ...] record only these upstream names (default: every name a patch relies on) "
                 "(default: None)"):
        assert text in out, text


@pytest.fixture
def known_file(tmp_path, monkeypatch):
    """A copy of fingerprints.json in tmp_path, for --record to write."""
    path = tmp_path / "fingerprints.json"
    path.write_text(fingerprints.KNOWN_FILE.read_text())
    monkeypatch.setattr(fingerprints, "KNOWN_FILE", path)
    return path


def test_record_only_the_names_given_then_they_print_known(tmp_path, known_file, capsys):
    path = tmp_path / "omnivoice.py"
    path.write_text(SOURCE.read_text().replace("def _gumbel_sample(", "def _gumbel_sample(_planted=None, *, ", 1))
    new = fingerprints_in(path.read_text(), ["_gumbel_sample"])["_gumbel_sample"]
    before = json.loads(known_file.read_text())["functions"]
    assert new not in before["_gumbel_sample"]
    argv = ["fingerprints", "--source", str(path), "--version", "9.9.9", "--record", "--only", "_gumbel_sample"]
    assert cli.main(argv) == 0
    after = json.loads(known_file.read_text())["functions"]
    assert after == {**before, "_gumbel_sample": {**before["_gumbel_sample"], new: ["9.9.9"]}}
    out = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert out["_gumbel_sample"] == [new, "known:", "9.9.9"]


def test_record_without_only_records_every_name(known_file, capsys):
    found = fingerprints_in(SOURCE.read_text(), relied_on())
    assert cli.main(["fingerprints", "--source", str(SOURCE), "--version", "0.0.1", "--record"]) == 0
    after = json.loads(known_file.read_text())["functions"]
    assert all(after[n][fp][0] == "0.0.1" for n, fp in found.items())  # sorted: before every released version


def test_record_refuses_a_name_the_source_lacks(tmp_path, known_file):
    path = tmp_path / "omnivoice.py"
    path.write_text(SOURCE.read_text().replace("def _get_time_steps(", "def _get_time_steps_gone(", 1))
    before = known_file.read_text()
    with pytest.raises(fingerprints.UpstreamMismatchError,
                       match=r"^_get_time_steps is not defined in omnivoice 9\.9\.9; nothing to record$"):
        cli.main(["fingerprints", "--source", str(path), "--version", "9.9.9", "--record"])
    assert known_file.read_text() == before


def test_the_ffmpeg_warning_is_hidden_and_only_it():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_ffmpeg_warning()
        warnings.warn("Couldn't find ffmpeg or avconv - defaulting to ffmpeg, but may not work", RuntimeWarning)
        warnings.warn("Couldn't find ffmpeg or avconv (as a UserWarning)", UserWarning)
        warnings.warn("another runtime warning", RuntimeWarning)
    assert [str(w.message) for w in seen] == ["Couldn't find ffmpeg or avconv (as a UserWarning)",
                                              "another runtime warning"]
