"""`python -m fastpath fingerprints`, the wheel's own command line, run in this process: what it prints for a source
whose functions it knows and one whose function changed, and the usage errors that name the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fastpath import __main__ as cli
from fastpath.fingerprints import fingerprints_in, load_known
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
