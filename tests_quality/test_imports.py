"""The quality tier's modules import in layers: no circle, lazy imports included, and no judge imports the harness
that drives it (evaluate), so each judge loads alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "harness.quality"
FOLDER = Path(__file__).resolve().parents[1] / "harness" / "quality"
JUDGES = ("judge", "wer", "voice", "mos")  # Whisper, WER scoring, GE2E, DNSMOS


def imports_of(path: Path) -> set[str]:
    """The harness.quality modules a file imports anywhere in it (top level or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:
                base = f"{PACKAGE}.{base}" if base else PACKAGE
            if base == PACKAGE:  # from . import a, b
                out |= {f"{PACKAGE}.{a.name}" for a in node.names}
            elif base.startswith(PACKAGE + "."):
                out.add(base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
    return {m.split(".")[2] for m in out if len(m.split(".")) > 2}


def graph() -> dict[str, set[str]]:
    return {p.stem: imports_of(p) - {p.stem} for p in FOLDER.glob("*.py") if p.stem != "__init__"}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_the_quality_tier_has_no_import_circle():
    edges = graph()
    assert set(JUDGES) <= set(edges), sorted(edges)
    found = circles(edges)
    assert not found, "import circles (lazy imports count): " + "; ".join(" -> ".join(c) for c in found)


def test_no_judge_imports_evaluate():
    edges = graph()
    bad = {j: sorted(edges[j]) for j in JUDGES if "evaluate" in edges[j]}
    assert not bad, f"judges that import evaluate: {bad}"


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", JUDGES)
def test_a_judge_imports_alone_in_a_fresh_interpreter(module):
    code = (f"import sys, {PACKAGE}.{module}; "
            f"print(sorted(m for m in sys.modules if m.startswith('{PACKAGE}.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,  # a hang guard, not a bound
                          cwd=FOLDER.parents[1], env={**os.environ, "PYTHONPATH": str(FOLDER.parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"'{PACKAGE}.evaluate'" not in done.stdout, f"{module} loaded evaluate: {done.stdout}"
