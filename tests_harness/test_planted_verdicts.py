"""Known answers for the harness rooms: for each decision module, a planted mutant that flips its verdict each way
(pass to fail, fail to pass) is killed by its test (fixtures/mutants/planted.json). One child pytest runs every named
test once without a plant (the known-equivalent control: all pass), then each plant's tests with the plant swapped
into the live function (harness.audit.planted), then every test again without a plant (all pass again). These show that each room's tests bite, whatever a sample's score
says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.audit import mutant_rooms, planted

ROOT = planted.ROOT
ROWS = planted.rows()
NAMED = sorted({t for row in ROWS for t in row["killed_by"]})


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{row id: {"ran": node ids, "failed": node ids with the phase}, "control": the same without a plant}."""
    out = tmp_path_factory.mktemp("planted") / "outcomes.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env[planted.OUT_ENV] = str(out)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.audit.planted",
                           "-q", "-n", "0", *NAMED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0 and out.exists(), f"exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}"
    return json.loads(out.read_text())


def test_every_decision_module_has_a_plant_each_way():
    harness_files = [p for room in mutant_rooms.ROOMS for p, f in room.files.items() if f is not mutant_rooms.ALL]
    for path in harness_files:
        ways = {row["flips"] for row in ROWS if row["path"] == path}
        assert ways == {"pass to fail", "fail to pass"} or path in MODULES_WITH_ONE_WAY, f"{path}: {sorted(ways)}"
    for row in ROWS:
        assert mutant_rooms.decides(row["path"], row["function"]), f"{planted.row_id(row)} is outside the mutated scope"


@pytest.mark.parametrize("row", ROWS, ids=planted.row_id)
def test_each_plant_compiles_into_its_live_function(row):
    func, code = planted.planted_code(row)  # the line is there once, and the planted code fits the function
    assert code is not func.__code__


def test_a_plant_is_put_back_after_its_tests():
    row = ROWS[0]
    func, _ = planted.planted_code(row)
    original = func.__code__
    with planted.planted(row):
        assert func.__code__ is not original
    assert func.__code__ is original


# a module of a room whose verdict has one direction only: nothing there turns a failure into a pass
MODULES_WITH_ONE_WAY: dict = {}


@pytest.mark.slow
@pytest.mark.control
@pytest.mark.parametrize("when", ["control", "control after"])
def test_the_unplanted_checkout_passes_every_named_test(outcomes, when):
    control = outcomes[when]
    assert control["failed"] == [], control["failed"]
    for test in NAMED:
        assert planted.chosen_ids(control["ran"], [test]), f"{test} collected nothing"


@pytest.mark.slow
@pytest.mark.control
@pytest.mark.parametrize("row", ROWS, ids=planted.row_id)
def test_each_planted_verdict_flip_is_killed_by_its_test(outcomes, row):
    done = outcomes[planted.row_id(row)]
    assert "error" not in done, done.get("error")
    assert done["ran"], f"{planted.row_id(row)}: none of {row['killed_by']} was collected"
    assert done["failed"], f"{planted.row_id(row)} survived {len(done['ran'])} test(s): {done['ran']}"
