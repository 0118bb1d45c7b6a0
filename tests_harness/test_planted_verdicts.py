"""Known answers for the harness rooms: for each decision module, a planted mutant that flips its verdict each way
(pass to fail, fail to pass) is killed by its test (fixtures/mutants/planted.json). Each plant is made in a copy of
the checkout and the named tests run there in a child pytest; the unplanted copy passes the same tests (the
known-equivalent control). These show that each room's tests bite, whatever a sample's score says."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.audit import mutant_rooms

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "fixtures" / "mutants" / "planted.json"
ROWS = json.loads(PLANTED.read_text())["planted"]


def row_id(row) -> str:
    return f"{row['path'].split('/')[-1][:-3]}.{row['function']}:{row['flips'].replace(' ', '-')}"


def planted_text(text: str, row: dict) -> str:
    """The file with the row's line of its function replaced (its indentation and trailing comment kept); an error
    naming the row where the function or the line is not there once."""
    tree = ast.parse(text)
    cls, _, name = row["function"].rpartition(".")
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None) if cls else tree.body
    node = next((n for n in body or () if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert node is not None, f"{row['path']}: no function {row['function']}; update {PLANTED.name}"
    lines = text.splitlines(keepends=True)
    at = [i for i in range(node.lineno - 1, node.end_lineno)
          if lines[i].split("  #")[0].strip() == row["before"]]
    assert len(at) == 1, f"{row['path']} {row['function']}: {row['before']!r} found {len(at)} times; update {PLANTED.name}"
    line = lines[at[0]]
    indent, rest = line[: len(line) - len(line.lstrip())], line.strip()
    comment = rest[len(row["before"]):]
    lines[at[0]] = indent + row["after"] + comment + "\n"
    return "".join(lines)


def copy_checkout(to: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def run_tests(copy: Path, tests: list) -> subprocess.CompletedProcess:
    from harness.model.checkpoint import cache_dir

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(PYTHONPATH=str(copy), FASTPATH_CACHE=str(cache_dir()))  # the copy's harness; the built checkpoints
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "-n", "0", *tests],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{row id: the child pytest on the planted copy}, and "control": the same tests on the unplanted copy; two
    copies, one plant at a time in each, two at once."""
    copies = [copy_checkout(tmp_path_factory.mktemp(f"copy{i}")) for i in range(2)]
    control = run_tests(copies[0], sorted({t for row in ROWS for t in row["killed_by"]}))

    def plant(i: int) -> list:
        copy, done = copies[i], []
        for row in ROWS[i::2]:
            path = copy / row["path"]
            original = path.read_text()
            path.write_text(planted_text(original, row))
            try:
                done.append((row_id(row), run_tests(copy, row["killed_by"])))
            finally:
                path.write_text(original)
        return done

    with ThreadPoolExecutor(2) as pool:
        found = dict(pair for part in pool.map(plant, range(2)) for pair in part)
    return {"control": control, **found}


def test_every_decision_module_has_a_plant_each_way():
    harness_files = [p for room in mutant_rooms.ROOMS for p, f in room.files.items() if f is not mutant_rooms.ALL]
    for path in harness_files:
        ways = {row["flips"] for row in ROWS if row["path"] == path}
        assert ways == {"pass to fail", "fail to pass"} or path in MODULES_WITH_ONE_WAY, f"{path}: {sorted(ways)}"
    for row in ROWS:
        assert mutant_rooms.decides(row["path"], row["function"]), f"{row_id(row)} is outside the mutated scope"
        planted_text((ROOT / row["path"]).read_text(), row)  # the line is there, once


# a module of a room whose verdict has one direction only: nothing there turns a failure into a pass
MODULES_WITH_ONE_WAY: dict = {}


@pytest.mark.slow
@pytest.mark.control
def test_the_unplanted_copy_passes_every_named_test(outcomes):
    done = outcomes["control"]
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.mark.slow
@pytest.mark.control
@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_each_planted_verdict_flip_is_killed_by_its_test(outcomes, row):
    done = outcomes[row_id(row)]
    out = done.stdout + done.stderr
    # 1: a test failed. Not 0 (the plant survived), nor 2, 3, 4 or 5 (the run broke, or collected nothing)
    assert done.returncode == 1, f"{row_id(row)}: exit {done.returncode}, not a failing test\n{out[-3000:]}"
    assert "failed" in done.stdout.strip().splitlines()[-1], out[-2000:]  # pytest's last line of its own
