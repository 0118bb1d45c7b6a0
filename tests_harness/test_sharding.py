"""The suite over several processes (harness.audit.sharding, conftest.py): two junit reports compared test for test, and
one GPU per xdist worker (`--gpus`), whose plumbing is shown here on CPU: each worker sees only its own index, and
each test's report says which worker and GPU ran it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import REPO_ROOT

from harness.audit import sharding

pytest_plugins = ["pytester"]


def junit(path: Path, cases: dict) -> Path:
    """A junit report in pytest's layout: {"mod.path::name": outcome}."""
    suite = ET.Element("testsuite", name="pytest")
    for test_id, outcome in cases.items():
        classname, name = test_id.split("::")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0.1")
        if outcome != "passed":
            ET.SubElement(case, {"failed": "failure"}.get(outcome, outcome), message=f"{outcome} here")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path)
    return path


def test_two_reports_with_the_same_outcome_for_every_test_agree(tmp_path):
    cases = {"tests_a.test_x::test_one": "passed", "tests_a.test_x::test_two[p]": "skipped",
             "tests_b.test_y::test_three": "failed"}
    agreement = sharding.compare(sharding.read_junit(junit(tmp_path / "a.xml", cases)),
                                 sharding.read_junit(junit(tmp_path / "b.xml", dict(reversed(cases.items())))))
    assert agreement.agree and agreement.tests == 3
    assert agreement.counts["first"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert "AGREE: all 3 test ids" in agreement.format()


def test_an_outcome_that_differs_or_a_test_only_one_run_has_is_named(tmp_path):
    serial = junit(tmp_path / "serial.xml", {"m::test_one": "passed", "m::test_two": "passed", "m::test_gone": "passed"})
    sharded = junit(tmp_path / "sharded.xml", {"m::test_one": "passed", "m::test_two": "error", "m::test_new": "skipped"})
    agreement = sharding.compare(sharding.read_junit(serial), sharding.read_junit(sharded))
    assert not agreement.agree
    assert agreement.differ == [("m::test_two", "passed", "error", "", "error here")]
    assert agreement.only_first == ["m::test_gone"] and agreement.only_second == ["m::test_new"]
    text = agreement.format()
    assert "m::test_two: serial passed, sharded error" in text
    assert "only in the serial run: m::test_gone" in text and "only in the sharded run: m::test_new" in text
    assert sharding.main(["compare", str(serial), str(sharded)]) == 1
    assert sharding.main(["compare", str(serial), str(serial)]) == 0


@pytest.mark.parametrize("content", ["not xml at all", "<html><body/></html>"])
def test_a_file_that_is_not_a_junit_report_is_refused_naming_how_to_make_one(tmp_path, content, capsys):
    path = tmp_path / "report.xml"
    path.write_text(content)
    with pytest.raises(sharding.JunitError, match=r"report\.xml.*pytest --junitxml"):
        sharding.read_junit(path)
    assert sharding.main(["compare", str(path), str(path)]) == 2
    assert "pytest --junitxml" in capsys.readouterr().err


# --- one GPU per worker --------------------------------------------------------------------------------------

# The suite's own hooks (conftest.py at the repository root) loaded into a pytester run under another module name
# (the run's own conftest is "conftest"), without the rest of the suite's session machinery.
ROOT_HOOKS = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("fastpath_root_conftest", {str(REPO_ROOT / "conftest.py")!r})
root = importlib.util.module_from_spec(spec)
spec.loader.exec_module(root)
pytest_addoption = root.pytest_addoption
pytest_cmdline_main = root.pytest_cmdline_main
pytest_report_header = root.pytest_report_header
pytest_runtest_setup = root.pytest_runtest_setup
"""

SEEN = """
import json, os
from pathlib import Path

from harness.run.machine import placement

def test_sees(request):
    out = Path(os.environ["SEEN_DIR"]) / (request.node.nodeid.replace("/", "_").replace(":", "_") + ".json")
    out.write_text(json.dumps({"test": request.node.nodeid, "env": os.environ.get("CUDA_VISIBLE_DEVICES"),
                               "placement": placement()}))
"""


def test_each_worker_sees_only_its_own_gpu_and_each_report_says_which_ran_it(pytester, tmp_path, monkeypatch):
    pytester.makeconftest(ROOT_HOOKS)
    for name in ("test_one", "test_two", "test_three", "test_four"):
        pytester.makepyfile(**{name: SEEN})
    seen = tmp_path / "seen"
    seen.mkdir()
    monkeypatch.setenv("SEEN_DIR", str(seen))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    report = tmp_path / "junit.xml"
    result = pytester.runpytest_subprocess("--gpus", "0,1", f"--junitxml={report}", timeout=300)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*one worker per GPU: gw0 sees GPU 0, gw1 sees GPU 1*"])
    runs = [json.loads(p.read_text()) for p in seen.iterdir()]
    assert len(runs) == 4
    for run in runs:  # gw<k> was given GPU k and nothing else, and says so
        worker = run["placement"]["worker"]
        assert worker in ("gw0", "gw1") and run["env"] == worker[2:], run
        assert run["placement"]["cuda_visible_devices"] == run["env"]
    assert {r["placement"]["worker"] for r in runs} == {"gw0", "gw1"}, "both workers ran tests"
    properties = {case.get("classname"): {p.get("name"): p.get("value") for p in case.iter("property")}
                  for case in ET.parse(report).getroot().iter("testcase")}
    assert len(properties) == 4
    assert all(p["cuda_visible_devices"] == p["worker"][2:] for p in properties.values()), properties


def test_gpus_with_workers_of_its_own_or_none_to_list_is_a_usage_error(pytester, monkeypatch):
    pytester.makeconftest(ROOT_HOOKS)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    both = pytester.runpytest_subprocess("--gpus", "0,1", "-n", "2", timeout=120)
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--gpus starts one worker per GPU: leave out -n and --tx*"])
    bad = pytester.runpytest_subprocess("--gpus", "0,0", timeout=120)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*distinct GPU indices*"])
    monkeypatch.setenv("PATH", str(pytester.path))  # no nvidia-smi on the PATH
    none = pytester.runpytest_subprocess("--gpus", "all", timeout=120)
    assert none.ret == pytest.ExitCode.USAGE_ERROR
    none.stderr.fnmatch_lines(["*--gpus all: nvidia-smi lists no GPU here (nvidia-smi not found)*leave --gpus out*"])
