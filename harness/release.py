"""The distribution's name on the package index: free for this project, and not one a user takes for another.

    fastpath-suite maintain name-check                      # the name in pyproject.toml
    fastpath-suite maintain name-check --results results/   # and the look-up as a results file (docs/release.md)

The name is asked of the index with pip's own client, `pip index versions NAME`, against the index pip is
configured for (its configuration is recorded beside the answer), and so are the names it must stay clear of
(NEAR: `fastpath`, the import package's name, which another project holds, and the public peer
`omnivoice-fastpath`). Beside the index's answer, two rules: the name is none of NEAR in PEP 503's normal form, and it
does not hold NEAR's distinctive word ("fastpath"), so that it cannot be taken for the peer (`fastpath-omnivoice`
would be free and still confuse).

Exit status: 0 the name is free and clear; 1 taken, or too near another; 2 the index could not be asked (pip's
message printed: no answer is not a free name).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from harness import DISTRIBUTION
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
    parser = argparse.ArgumentParser(prog="fastpath-suite maintain name-check", description=__doc__.splitlines()[0],
                                     formatter_class=Help)
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


if __name__ == "__main__":
    raise SystemExit(main())
