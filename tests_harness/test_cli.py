"""The one command line (`fastpath-suite <verb>`) and every command the README and docs/ show: each documented
`fastpath-suite` line is parsed by its verb's own parser (a dry run: options, values and choices checked, nothing
run), each `pytest` line's paths, markers and options exist, each Python snippet compiles. A documented command
cannot rot unseen."""

from __future__ import annotations

import argparse
import contextlib
import os
import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import GROUPS, JOBS, OLD, ROOT, every_verb, main

VERBS = every_verb()  # {"report": Verb, "counts structure": Verb, ...}

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@pytest.fixture(autouse=True)
def command_restored(monkeypatch):
    """main() records the verb it runs in harness.run.results.COMMAND (a module global): put it back after."""
    from harness.run import results

    monkeypatch.setattr(results, "COMMAND", results.COMMAND)


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


def test_the_command_line_lists_the_jobs_first_then_each_group_under_its_heading(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    jobs, _, rest = out.partition("Your jobs:\n")[2].partition("\n\n")
    for verb, v in JOBS.items():
        assert re.search(rf"^  {re.escape(verb)} +{re.escape(v.summary)}$", jobs, re.M), (verb, out)
    for group, (heading, _, subs) in GROUPS.items():
        if group in ("counts", "nightly"):  # jobs with subverbs: one line each among the jobs
            assert re.search(rf"^  {group} +{re.escape(heading)}: {re.escape(' | '.join(subs))}$", jobs, re.M), out
            continue
        block = rest.partition(f"(fastpath-suite {group} <verb>):\n")[2].partition("\n\n")[0]
        assert block, f"no heading for the group {group}:\n{out}"
        for sub, v in subs.items():
            assert re.search(rf"^  {re.escape(sub)} +{re.escape(v.summary)}$", block, re.M), (group, sub, out)
    assert out.index("Your jobs:") < out.index("(fastpath-suite audit <verb>)") < out.index("(fastpath-suite maintain")
    assert main(["no-such-verb"]) == 2 and "unknown verb 'no-such-verb'" in capsys.readouterr().err
    assert main(["nightly", "no-such-verb"]) == 2 and "unknown verb 'no-such-verb'" in capsys.readouterr().err
    for group in GROUPS:  # a group alone lists its verbs
        assert main([group]) == 2
        listing = capsys.readouterr().out
        assert all(f"  {sub} " in listing for sub in GROUPS[group][2]), listing


@pytest.mark.parametrize("command", [pytest.param(["fastpath-suite", "maintain", "fingerprints"], id="fastpath-suite",
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
    assert proc.returncode == 0 and "Your jobs:" in proc.stdout, proc.stderr


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_has_help_showing_its_defaults_and_its_example(verb, capfd):
    target = VERBS[verb].target
    example = f"\nexample:\n  {VERBS[verb].example}\n"
    assert re.match(rf"(\S+=\S+ |\S.* && )*fastpath-suite {verb}( |$)", VERBS[verb].example), VERBS[verb].example
    if target.startswith("scripts/"):
        assert (ROOT / target).exists(), target
        if target.endswith(".sh"):
            assert main([*verb.split(), "--help"]) == 0
            out = capfd.readouterr().out
            assert f"usage: fastpath-suite {verb}" in out and out.endswith(example), out
            return
    assert main([*verb.split(), "--help"]) == 0
    out = capfd.readouterr().out
    assert out.endswith(example), f"{verb}: --help does not end with its example\n{out}"
    assert f"usage: fastpath-suite {verb}" in out, out
    assert "usage:" in out, out
    if "--" in out.partition("\nexample:")[0].split("options:")[-1].replace("--help", ""):  # a verb with options shows their defaults
        assert "(default:" in out, f"{verb}: --help does not show defaults (ArgumentDefaultsHelpFormatter)\n{out}"


def spelling(words: list) -> str:
    """The verb `fastpath-suite WORDS...` names, in its grouped spelling ("nightly append"); an old spelling fails."""
    assert words and words[0] not in OLD, f"`{' '.join(words[:2])}` is an old spelling: write `{OLD.get(words[0])}`"
    verb = " ".join(words[:2]) if " ".join(words[:2]) in VERBS else words[0]
    assert verb in VERBS, f"unknown verb {verb!r}; known: {', '.join(VERBS)}"
    return verb


@contextlib.contextmanager
def parsing_only():
    """Every argparse parser, while inside, raises DryRun(namespace) instead of returning it (restored after)."""
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise DryRun(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_only
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def dry_run(words: list):
    """Parse `fastpath-suite VERB ARGS` with the verb's own parser and stop there: DryRun(namespace), or
    argparse's SystemExit (2 on a wrong option or value, 0 for --help)."""
    verb = spelling(words)
    args = words[len(verb.split()):]
    target = VERBS[verb].target
    with parsing_only():
        if target.endswith(".py"):  # a script whose main() reads sys.argv
            name = "script_" + re.sub(r"\W", "_", verb)
            spec = importlib.util.spec_from_file_location(name, ROOT / target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            saved, sys.argv = sys.argv, [target, *args]
            try:
                return module.main()
            finally:
                sys.argv = saved
        return main(words)


@pytest.mark.parametrize("words", suite_commands())
def test_every_documented_command_parses(words, capsys):
    words = words[1:]
    if words in (["--help"], ["-h"]):
        assert main(words) == 0 and "Your jobs:" in capsys.readouterr().out
        return
    target = VERBS[spelling(words)].target
    if target.endswith(".sh"):  # a bash script: each option it is given must be one its header documents
        header = (ROOT / target).read_text()
        unknown = [w for w in words[1:] if w.startswith("--") and w.split("=")[0] not in header]
        assert not unknown, f"{target} has no option {unknown}"
        return
    if "--help" in words or "-h" in words:  # the verb's help and its example
        assert dry_run(words) == 0
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
             if "History (not regenerated)" not in text[:m.start()]
             and text.rfind("<!-- rendered by", 0, m.start()) <= text.rfind("<!-- end of", 0, m.start())]  # a record
    assert not found, "old entry points in the docs (use `fastpath-suite <verb>`):\n" + "\n".join(found)


def test_the_readme_is_a_guide_not_a_log():
    text = (ROOT / "README.md").read_text()
    words = len(re.findall(r"\S+", text))
    assert words <= 2200, f"README.md has {words} words (about 2,000 is the doorway's size); the depth belongs in docs/"
    logs = re.findall(r"\b[0-9a-f]{7,40}\b(?=[^|]*)|\b\d{1,2}:\d{2}(?::\d{2})? ?UTC\b|\bissues? \d+\b", text)
    assert not [x for x in logs if not x.isdigit()], f"README.md names commits, times or issues: {logs}"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert all((ROOT / p).exists() for p in linked), f"README links missing pages: {sorted(p for p in linked if not (ROOT / p).exists())}"


@pytest.mark.parametrize("old", sorted(OLD))
def test_every_old_spelling_still_runs_its_verb_and_names_the_new_spelling(old, capsys, monkeypatch):
    """`fastpath-suite history append ...` runs what `fastpath-suite nightly append ...` runs: the same parser gives
    the same options for the new verb's example (a script verb: the same script with the same arguments), and the
    note on stderr names the new spelling."""
    new = OLD[old].split()
    verb = " ".join(new) if " ".join(new) in VERBS else " ".join(new + [next(iter(GROUPS[new[0]][2]))])
    example = shlex.split(VERBS[verb].example.rpartition("&& ")[2])
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", example[0]):
        example = example[1:]
    args = example[1 + len(verb.split()):]
    as_old = [old, *verb.split()[len(new):], *args]
    target = VERBS[verb].target
    if target.startswith("scripts/"):
        calls = []
        monkeypatch.setattr(subprocess, "call", lambda command: calls.append(command) or 0)
        assert main(as_old) == 0 and main([*verb.split(), *args]) == 0
        assert len(calls) == 2 and calls[0] == calls[1] and str(ROOT / target) in calls[0], calls
    else:
        with pytest.raises(DryRun) as before:
            dry_run_any(as_old)
        with pytest.raises(DryRun) as after:
            dry_run(["fastpath-suite", *verb.split(), *args][1:])
        assert vars(before.value.namespace) == vars(after.value.namespace)
    err = capsys.readouterr().err
    assert f"`{old}` is now `{OLD[old]}`" in err, err


def dry_run_any(words: list):
    """dry_run without the spelling check (an old spelling goes through main's forwarding)."""
    with parsing_only():
        return main(words)


# What each example costs on a 2-core machine; an example costlier than the default run can carry is slow (run
# with --slow, before a change to its verb is called done), one that needs a GPU is cuda. Every verb has a row.
EXAMPLE_MARKS = {
    "report": [pytest.mark.slow],  # about 3 minutes: the parity stage and tiny timing
    "gate": [pytest.mark.slow],  # every check on an identical release: about 12 minutes
    "grid": [pytest.mark.slow],
    "stream": [pytest.mark.slow],
    "memory": [pytest.mark.slow],
    "prefix": [pytest.mark.slow],
    "serve-check": [pytest.mark.slow],  # omnivoice-server in its own venv
    # where CUDA is usable, the quick look itself (about 8 minutes, full-size checkpoint): only --slow starts it, and
    # never `pytest -m cuda` (a pytest inside pytest); without CUDA it stops at once with exit 4, which the default
    # run checks through the script itself (tests_harness/test_gpu_check.py)
    "gpu-check": [pytest.mark.slow],
    "counts instructions": [pytest.mark.slow],  # callgrind: about 2 minutes
    "nightly rates": [pytest.mark.slow],
    "nightly bisect": [pytest.mark.slow],  # a worktree and a count per commit
    "nightly record": [pytest.mark.slow],  # one run under callgrind, about 7 minutes
    "audit false-alarms": [pytest.mark.slow],  # the default run on a fresh clone
    "audit stability": [pytest.mark.slow],
    "audit known-answer": [pytest.mark.slow],
    "audit speed-gate-check": [pytest.mark.slow],  # about 15 minutes
    "audit mutants": [pytest.mark.slow],
    "audit mutant-budget": [pytest.mark.slow],  # the mutants of the files of three changes generated: minutes
    "audit shards": [pytest.mark.slow],  # the default run twice
    "maintain goldens": [pytest.mark.slow],
    "maintain behaviour": [pytest.mark.slow],
    "maintain full-size-parity": [pytest.mark.slow],  # builds the full-size checkpoint
}


# Examples whose non-zero exit is the verb's finding: (exit codes, the pattern its output then shows).
EXAMPLE_EXITS = {
    # on a machine without a usable GPU: exit 1 naming what is missing
    "cuda-check": ((0, 1), r"CUDA is not usable: (the driver|the wheel|a device)|device key cuda-"),
    # a sample of two mutants: exit 1 names a survivor (fixtures/mutants/equivalent.json or a new test settles it)
    "audit mutants": ((0, 1), r"SURVIVED: fastpath\."),
    # a machine where CUDA is not usable: exit 4 at the first stage, naming what is missing (driver, wheel, device)
    "gpu-check": ((0, 4), r"CUDA is not usable here: (the driver|the wheel|a device)"),
    # a checkout where the gate has not passed omnivoice 0.2.2: refused as not judged, naming the gate command to run
    "release accept": ((1,), r"REFUSED: not judged: no gate verdict .* Fix: run `fastpath-suite gate omnivoice==0\.2\.2"),
}


def test_every_example_has_a_row_saying_its_cost():
    cheap = [v for v in VERBS if v not in EXAMPLE_MARKS]
    assert set(EXAMPLE_MARKS) <= set(VERBS), sorted(set(EXAMPLE_MARKS) - set(VERBS))
    assert cheap, "no example runs in the default run"


@pytest.fixture
def example_folder(tmp_path):
    """Where an example runs: a git checkout's shape (the nightly's scripts work in one) that sees the
    repository's fixtures, baselines and results, with `fastpath-suite` on PATH running this checkout."""
    for name in ("fixtures", "baselines", "results"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    script = Path(sys.executable).parent / "fastpath-suite"  # the install's own command, as a user runs it
    assert script.exists(), f"{script} is missing: run `bash scripts/install.sh`, which writes it"
    env = {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}"}
    return tmp_path, env


@pytest.mark.parametrize("verb", [pytest.param(v, marks=EXAMPLE_MARKS.get(v, [])) for v in VERBS])
def test_every_example_runs(verb, example_folder):
    folder, env = example_folder
    if verb == "audit peer-rates":  # its input is recorded per machine
        import json

        from harness.run import strict
        from harness.run.machine import hardware_key, machine_info

        key = hardware_key(machine_info("cpu"))
        if not json.loads((ROOT / "baselines" / "ratio_floors.json").read_text())["floors"].get(key, {}).get("full"):
            strict.not_judged(f"no ratio floors recorded for {key} (baselines/ratio_floors.json), which peer-rates "
                              "simulates against", "record them on this machine: docs/speed.md, 'Same-run ratios and ratio floors'")
    example = VERBS[verb].example
    proc = subprocess.run(["bash", "-c", example], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=3600)  # a hang guard, not a bound
    codes, finding = EXAMPLE_EXITS.get(verb, ((0,), None))
    assert proc.returncode in codes, f"`{example}` exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if proc.returncode:  # a finding the verb exists to report, not a failure to run
        assert re.search(finding, proc.stdout), proc.stdout[-3000:]
    assert proc.stdout.strip() or proc.stderr.strip(), f"`{example}` said nothing"


def test_the_command_reference_is_what_every_parser_prints():
    import harness.__main__ as suite

    rendered, page = suite.commands_page(), suite.COMMANDS_PAGE.read_text()
    assert rendered == page, ("docs/commands.md is not what the verbs' parsers print: run `fastpath-suite maintain "
                              "commands` and commit the page\n" + "\n".join(
                                  __import__("difflib").unified_diff(page.splitlines(), rendered.splitlines(),
                                                                     "docs/commands.md", "the parsers", lineterm="",
                                                                     n=1)))
    # every verb the listing names has its section, and each section is that verb's own help
    for spelling in VERBS:
        assert f"## `fastpath-suite {spelling}`" in page
    assert "usage: fastpath-suite gate" in page and "usage: python -m fastpath fingerprints" in page


def test_maintain_commands_writes_the_page_and_its_check_fails_on_a_stale_one(tmp_path, monkeypatch, capsys):
    import harness.__main__ as suite

    monkeypatch.setattr(suite, "commands_page", lambda: "# Commands\n\nthe parsers' help\n")
    page = tmp_path / "commands.md"
    assert suite.maintain_commands(["--check", "--page", str(page)]) == 1  # missing
    assert "run `fastpath-suite maintain commands`" in capsys.readouterr().err
    assert suite.maintain_commands(["--page", str(page)]) == 0
    assert page.read_text() == "# Commands\n\nthe parsers' help\n"
    assert suite.maintain_commands(["--check", "--page", str(page)]) == 0
    page.write_text("# Commands\n\nan older help\n")
    assert suite.maintain_commands(["--check", "--page", str(page)]) == 1
