"""One name for each thing: the README, docs/, the workflows and every --help spell the nightly's verbs and files as
the command line and the nightly workflow do."""

from __future__ import annotations

import re
from pathlib import Path

from harness.run import results

ROOT = results.ROOT
# docs/results.md is left out: it quotes each results file's command as it was typed then
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "results.md")]
SOURCES = [*PAGES, *sorted((ROOT / "harness").rglob("*.py")), *sorted((ROOT / "scripts").glob("*")),
           *sorted((ROOT / ".github" / "workflows").glob("*.yml")), ROOT / ".ci" / "run"]
OLD_VERB = re.compile(r"`(?:fastpath-suite )?history (?:check|append|accept|rates|bisect|record|fetch|store)\b")


def where(path: Path, text: str, start: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, start) + 1}"


def test_the_nightly_verbs_are_spelled_as_the_command_line_spells_them():
    old = [f"{where(p, t, m.start())}: {m.group(0)}" for p in SOURCES if p.is_file()
           for t in [p.read_text(errors="replace")] for m in OLD_VERB.finditer(t)]
    assert not old, "`history <verb>` is `fastpath-suite nightly <verb>`:\n" + "\n".join(old)


def test_the_readme_names_the_run_files_and_histories_the_nightly_workflow_writes():
    """The workflow writes out/<signal>.json and appends it to history/history-<device>-<signal>.json."""
    readme = (ROOT / "README.md").read_text()
    workflow = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    assert "--benchmark-json=out/wall.json" in workflow
    assert re.findall(r"--benchmark-json=(\S+)", readme) == ["out/wall.json"], re.findall(r"--benchmark-json=\S+", readme)
    appends = re.findall(r"nightly append (\S+) (\S+)", readme)
    assert appends, "the README shows no `nightly append`"
    for history, run in appends:
        signal = re.fullmatch(r"out/(\w+)\.json", run)
        assert signal and history == f"history/history-cpu-{signal[1]}.json", (history, run)
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"history/speed-[\w-]+\.json|out/speed\.json", text):
            raise AssertionError(f"{where(page, text, m.start())}: {m.group(0)} (the workflow's files: "
                                 "out/wall.json, history/history-<device>-<signal>.json)")


def test_no_page_or_help_names_a_tool_outside_the_suite():
    """The GPU script's help and the docs speak of a GPU machine and its time limit, not of the tool some workplace
    lends machines through (its call, its arguments, its limits)."""
    from harness.__main__ import script_help

    outside = re.compile(r"device tool|the `?run`? tool|run\(command|carry=|carried wheels|carry \.whl|\ba lent\b|\blent (?:GPU|machine)")
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    texts["fastpath-suite gpu-check --help"] = script_help(ROOT / "scripts" / "gpu_check.sh")
    found = [f"{name}: {m.group(0)}" for name, text in texts.items() for m in outside.finditer(text)]
    assert not found, "\n".join(found)
