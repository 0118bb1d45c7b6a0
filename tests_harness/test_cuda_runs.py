"""Green means it ran: a run that asks for the `cuda` tests where CUDA is not usable fails in strict mode, naming
what is missing (conftest.py, harness.model.devices.cuda_problem); with --no-strict-inputs each is "not judged"; a
run that does not ask for them leaves them out. Run here, on a machine without a usable GPU, in child pytest runs."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from harness import REPO_ROOT
from harness.model.devices import asks_for_cuda, cuda_problem

CUDA_TEST = "tests_speed/test_gpu_speed.py::test_graph_replay_forward_is_not_slower_than_eager"
CPU_TEST = "tests_harness/test_tolerance.py::test_closeness_numbers_on_known_inputs"
BASE = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA"]  # not -q: the header is read
RUNS = {  # name -> extra arguments
    "strict": ["-m", "cuda", CUDA_TEST],
    "lenient": ["-m", "cuda", "--no-strict-inputs", CUDA_TEST],
    "not asked": [CPU_TEST, CUDA_TEST],
}


@pytest.mark.parametrize("markexpr, selected_all_cuda, asked", [
    ("cuda", False, True),
    ("slow and cuda", False, True),
    ("cuda or slow", False, True),
    ("not cuda", False, False),
    ("control and not cuda", False, False),
    ("slow and not cuda", False, False),
    ("", False, False),  # the default run: the cuda tests are left out
    ("", True, True),  # a file of cuda tests named alone
    ("not slow", False, False),
])
def test_a_run_asks_for_the_cuda_tests_when_its_expression_selects_them_by_the_mark(markexpr, selected_all_cuda,
                                                                                     asked, request):
    class Item:
        def __init__(self, marks):
            self.keywords = set(marks)

    items = [Item({"cuda"})] + ([] if selected_all_cuda else [Item({"cpu"})])
    markers = [line.split(":")[0].split("(")[0] for line in request.config.getini("markers")]
    assert "cuda" in markers and asks_for_cuda(markexpr, items, markers) is asked


def run_three(folder):
    procs = {name: subprocess.Popen([*BASE, *args, f"--junitxml={folder / name.replace(' ', '-')}.xml"],
                                    cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, args in RUNS.items()}
    out = {}
    for name, proc in procs.items():
        text, _ = proc.communicate(timeout=900)  # a hang guard
        cases = ET.parse(folder / f"{name.replace(' ', '-')}.xml").getroot().iter("testcase")
        out[name] = (proc.returncode, text, {c.get("name"): [child.tag for child in c if child.tag != "properties"]
                                             for c in cases})  # properties: the xdist worker of a sharded run
    return out


@pytest.mark.skipif(cuda_problem() is None, reason="CUDA is usable here: the GPU runner runs the cuda tests")
@pytest.mark.early.with_args(run_three)
def test_a_run_that_asks_for_cuda_where_it_is_not_usable_fails_naming_what_is_missing(early):
    code, text, cases = early["strict"]
    assert code == 1, text[-3000:]
    assert cases == {"test_graph_replay_forward_is_not_slower_than_eager": ["error"]}, (cases, text[-3000:])  # at its setup
    assert "CUDA is not usable here and this run asks for the cuda tests: the driver" in text, text[-3000:]
    assert "CUDA is not usable here: the driver" in text.split("collected ")[0], text[:3000]  # the header says it first
    code, text, cases = early["lenient"]
    assert code == 0 and cases == {"test_graph_replay_forward_is_not_slower_than_eager": ["skipped"]}, (cases, text[-3000:])
    assert "not judged: 1 check(s)" in text and "CUDA is not usable here" in text, text[-3000:]
    code, text, cases = early["not asked"]
    assert code == 0, text[-3000:]
    assert cases == {"test_closeness_numbers_on_known_inputs": [], "test_graph_replay_forward_is_not_slower_than_eager": ["skipped"]}
    assert "which this run did not ask for" in text, text[-3000:]
