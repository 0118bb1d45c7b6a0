"""The one command line (`fastpath-suite <verb>`) and every command the README and docs/ show: each documented
`fastpath-suite` line is parsed by its verb's own parser (a dry run: options, values and choices checked, nothing
run), each `pytest` line's paths, markers and options exist, each Python snippet compiles. A documented command
cannot rot unseen."""

from __future__ import annotations

import argparse
import os
import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import ROOT, VERBS, main

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


class DryRun(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def blocks(path: Path) -> list:
    """(language, text, line number) of every fenced block of a page."""
    text = path.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def command_lines() -> list:
    """(page, line number, words) of every shell line in a fenced block, env assignments dropped."""
    out = []
    for page in PAGES:
        for language, text, start in blocks(page):
            if language not in ("", "bash", "sh", "shell", "console"):
                continue
            for offset, line in enumerate(text.splitlines(), 1):
                line = line.strip().removeprefix("$ ")
                if not line or line.startswith("#"):
                    continue
                if language not in ("bash", "sh", "shell") and not re.match(r"(\S+/)?(fastpath-suite|pytest) ", line):
                    continue  # an unlabelled block may hold output; its commands start with a known program
                try:
                    words = shlex.split(line, comments=True)
                except ValueError as err:
                    words = ["unparsable:", line, str(err)]
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    words = words[1:]
                if words:
                    out.append((page.relative_to(ROOT), start + offset, words))
    return out


def test_every_documented_shell_line_parses():
    bad = [f"{page}:{line}: {words[1]} ({words[2]})" for page, line, words in command_lines()
           if words[0] == "unparsable:"]
    assert not bad, "\n".join(bad)


def suite_commands() -> list:
    return [pytest.param(words, id=f"{page}:{line}") for page, line, words in command_lines()
            if Path(words[0]).name == "fastpath-suite"]


def pytest_commands() -> list:
    return [pytest.param(words, id=f"{page}:{line}") for page, line, words in command_lines()
            if words[0] == "pytest" or words[:3] == [".venv/bin/python", "-m", "pytest"]]


def test_the_command_line_lists_every_verb_with_one_line_each(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb, (_, summary) in VERBS.items():
        assert re.search(rf"^  {re.escape(verb)} +{re.escape(summary)}$", out, re.M), (verb, out)
    assert main(["no-such-verb"]) == 2 and "unknown verb 'no-such-verb'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [pytest.param(["fastpath-suite", "fingerprints"], id="fastpath-suite",
                                                  marks=[pytest.mark.slow, pytest.mark.control]),
                                     pytest.param(["fastpath", "fingerprints"], id="fastpath",  # .ci/run's controls stage
                                                  marks=[pytest.mark.slow, pytest.mark.control])])
def test_a_command_that_imports_omnivoice_prints_no_third_party_warning(tmp_path, command):
    """pydub (under omnivoice) warns on import when no ffmpeg is on PATH; the command lines hide that one warning."""
    script = Path(sys.executable).parent / command[0]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([str(script), *command[1:]], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=900)  # a hang guard, not a bound
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


def test_the_console_script_is_installed_and_runs_from_anywhere(tmp_path):
    script = Path(sys.executable).parent / "fastpath-suite"
    assert script.exists(), f"{script} is missing: run `bash scripts/install.sh`, which writes it"
    proc = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=900)  # a hang guard, not a bound
    assert proc.returncode == 0 and "verbs:" in proc.stdout, proc.stderr


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_has_help_showing_its_defaults(verb, capsys):
    target = VERBS[verb][0]
    if target.startswith("scripts/"):
        assert (ROOT / target).exists(), target
        if target.endswith(".sh"):
            assert main([verb, "--help"]) == 0
            assert f"usage: fastpath-suite {verb}" in capsys.readouterr().out
            return
    with pytest.raises(SystemExit) as exit_:
        dry_run([verb, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out, out
    if "--" in out.split("options:")[-1].replace("--help", ""):  # a verb with options shows their defaults
        assert "(default:" in out, f"{verb}: --help does not show defaults (ArgumentDefaultsHelpFormatter)\n{out}"


def dry_run(words: list):
    """Parse `fastpath-suite VERB ARGS` with the verb's own parser and stop there: DryRun(namespace), or
    argparse's SystemExit (2 on a wrong option or value, 0 for --help)."""
    verb, args = words[0], words[1:]
    assert verb in VERBS, f"unknown verb {verb!r}; known: {', '.join(VERBS)}"
    target = VERBS[verb][0]
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise DryRun(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_only
    try:
        if target.endswith(".py"):  # a script whose main() reads sys.argv
            spec = importlib.util.spec_from_file_location(f"script_{verb.replace('-', '_')}", ROOT / target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            saved, sys.argv = sys.argv, [target, *args]
            try:
                return module.main()
            finally:
                sys.argv = saved
        return main(words)
    finally:
        argparse.ArgumentParser.parse_args = original


@pytest.mark.parametrize("words", suite_commands())
def test_every_documented_command_parses(words, capsys):
    words = words[1:]
    if words in (["--help"], ["-h"]):
        assert main(words) == 0 and "verbs:" in capsys.readouterr().out
        return
    target = VERBS.get(words[0], ("",))[0] if words else ""
    if target.endswith(".sh"):  # a bash script: each option it is given must be one its header documents
        header = (ROOT / target).read_text()
        unknown = [w for w in words[1:] if w.startswith("--") and w.split("=")[0] not in header]
        assert not unknown, f"{target} has no option {unknown}"
        return
    with pytest.raises((DryRun, SystemExit)) as outcome:
        dry_run(words)
    if outcome.type is SystemExit:
        assert outcome.value.code == 0, f"`fastpath-suite {shlex.join(words)}` is refused by its parser"


@pytest.mark.parametrize("words", pytest_commands())
def test_every_documented_pytest_command_names_real_paths_markers_and_options(words, pytestconfig):
    """Options are looked up in this run's own pytest configuration (conftest's included: getoption takes the
    literal --name); a word after an option is its value unless the option is a flag or the word is a path."""
    words = words[3:] if words[0] != "pytest" else words[1:]
    markers = {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-"):
            name, _, inline = word.partition("=")
            try:
                current = pytestconfig.getoption(name)
            except ValueError:
                pytest.fail(f"pytest has no option {name}")
            nxt = words[i + 1] if i + 1 < len(words) else None
            takes = not inline and not isinstance(current, bool) and nxt is not None and not nxt.startswith("-") \
                and not (ROOT / nxt.split("::")[0]).exists()
            value = inline or (nxt if takes else None)
            if name == "-m":
                names = set(re.findall(r"[A-Za-z_]\w*", value or "")) - {"and", "or", "not"}
                assert value and names <= markers, f"-m {value!r}: unregistered markers {names - markers}"
            i += 2 if takes else 1
            continue
        assert (ROOT / word.split("::")[0]).exists(), f"no such test path {word}"
        i += 1


def test_every_documented_python_snippet_compiles():
    for page in PAGES:
        for language, text, start in blocks(page):
            if language == "python":
                try:
                    ast.parse(text)
                except SyntaxError as err:
                    pytest.fail(f"{page.relative_to(ROOT)}:{start + (err.lineno or 0)}: {err.msg}")


def test_the_docs_use_the_one_command_line_only():
    old = re.compile(r"python -m harness\.|bash scripts/(?!install\.sh)|python scripts/")
    found = [f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for page in PAGES for text in [page.read_text()] for m in old.finditer(text)
             if "History (not regenerated)" not in text[:m.start()]]
    assert not found, "old entry points in the docs (use `fastpath-suite <verb>`):\n" + "\n".join(found)


def test_the_readme_is_a_guide_not_a_log():
    text = (ROOT / "README.md").read_text()
    words = len(re.findall(r"\S+", text))
    assert words <= 2500, f"README.md has {words} words; the depth belongs in docs/"
    logs = re.findall(r"\b[0-9a-f]{7,40}\b(?=[^|]*)|\b\d{1,2}:\d{2}(?::\d{2})? ?UTC\b|\bissues? \d+\b", text)
    assert not [x for x in logs if not x.isdigit()], f"README.md names commits, times or issues: {logs}"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert all((ROOT / p).exists() for p in linked), f"README links missing pages: {sorted(p for p in linked if not (ROOT / p).exists())}"
