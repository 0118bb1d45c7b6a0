"""The mutation run (harness.audit.mutants): its choice of mutants, its score and its verdict on a change.

The end-to-end tests run the command on a copy of this checkout with one planted change to fastpath/registry.py,
against that module's tests only: a line no test reads leaves survivors and fails the change, naming the diff and
the command to run it again; listed as equivalent, the same mutants pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.audit import mutant_rooms, mutants
from harness.audit.mutants import Mutant
from harness.run.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


def mutant(name="fastpath.registry.x_applied__mutmut_1", path="fastpath/registry.py", function="applied",
           lines=(322,), before="x = 1", after="x = 2", status=""):
    return Mutant(name=name, path=path, function=function, lines=list(lines), before=before, after=after,
                  diff="", status=status)


def test_the_interval_is_the_exact_binomial_one():
    # Clopper-Pearson: all of 10 killed -> lower bound (0.025)^(1/10) = 0.6915; none -> upper 1 - that
    low, high = mutants.interval(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** 0.1, abs=1e-9)
    low, high = mutants.interval(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** 0.1, abs=1e-9)
    low, high = mutants.interval(180, 200)
    assert low < 0.9 < high < 0.95


def test_a_timeout_counts_as_killed_and_an_unrun_mutant_is_not_judged():
    ms = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}") for i in range(1, 6)]
    codes = {ms[0].name: (1, 1.0), ms[1].name: (0, 2.0), ms[2].name: (36, 9.0), ms[3].name: (33, 0.0)}
    summary = mutants.judge(ms, {"codes": codes, "tests": {"fastpath.registry.x_applied": ["t::a"]}})
    assert [m.status for m in ms] == ["killed", "survived", "timeout", "no tests", "not judged"]
    assert (summary["killed"], summary["survived"], summary["timeouts"], summary["not_judged"]) == (2, 2, 1, 1)
    assert summary["score"] == 0.5 and ms[1].tests == ["t::a"]
    # a function that runs at import meets unknown tests: its survivor is not judged, not a survivor
    lazy = mutant(name="fastpath.registry.x__lazy__mutmut_4", function="_lazy")
    summary = mutants.judge([lazy], {"codes": {lazy.name: (0, 4.0)}, "tests": {}})
    assert lazy.status == "not judged" and summary["survived"] == 0


def _fake_runs(monkeypatch, first: dict, second: dict):
    """run_mutants replaced: the first call returns `first` codes, the second `second` (only those finish)."""
    calls = []

    def fake(work, chosen, children, budget, progress, tests=mutants.TESTS, multiplier=mutants.MULTIPLIER,
             stats=True):
        calls.append(([m.name for m in chosen], children, multiplier))
        codes = first if len(calls) == 1 else second
        return {"codes": dict(codes), "tests": {}, "completed": set(codes), "out_of_time": len(calls) > 1 and
                len(second) < len(chosen), "seconds": 100.0}

    monkeypatch.setattr(mutants, "run_mutants", fake)
    return calls


def test_a_timeout_counts_only_when_it_times_out_again_alone(monkeypatch):
    from harness.run.progress import Progress

    ms = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}") for i in range(1, 4)]
    calls = _fake_runs(monkeypatch, {ms[0].name: (-24, 72.5), ms[1].name: (-24, 72.5), ms[2].name: (1, 3.0)},
                       {ms[0].name: (-24, 217.0), ms[1].name: (0, 30.0)})
    ran = mutants.run_and_confirm(Path("work"), ms, 2, None, Progress("test", quiet=True))
    assert calls[1] == ([ms[0].name, ms[1].name], 1, mutants.MULTIPLIER * mutants.CONFIRM)
    summary = mutants.judge(ms, ran)
    # slow beside another mutant but passing alone: a survivor, not a kill
    assert [m.status for m in ms] == ["timeout", "survived", "killed"] and summary["killed"] == 2
    # the confirmation cut short by the budget: that mutant is not judged, and says why
    ms = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}") for i in range(1, 3)]
    _fake_runs(monkeypatch, {ms[0].name: (-24, 72.5), ms[1].name: (-24, 72.5)}, {ms[0].name: (-24, 217.0)})
    ran = mutants.run_and_confirm(Path("work"), ms, 2, 1000.0, Progress("test", quiet=True))
    summary = mutants.judge(ms, ran)
    assert [m.status for m in ms] == ["timeout", "not judged"] and ran["unconfirmed"] == [ms[1].name]
    assert summary["killed"] == 1 and summary["not_judged"] == 1


def stand_in_mutmut(work: Path, main: str) -> None:
    """A work folder whose `python -m mutmut` (run_mutants' command, run there) is `main`: the folder comes first on
    the child's sys.path."""
    (work / "setup.cfg").write_text("[mutmut]\ntimeout_multiplier = 4\n")
    (work / "mutants").mkdir(exist_ok=True)
    (work / "mutmut").mkdir()
    (work / "mutmut" / "__init__.py").write_text("")
    (work / "mutmut" / "__main__.py").write_text(main)


# mutmut as it meets a failing test on the unmutated code: pytest in its own process, then its spinner and one line
FAKE_MUTMUT = """\
import sys
sys.path.insert(0, {root!r})
import pytest
code = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "-p", "harness.audit.failures", "tests_x"]) if {run} else 1
for _ in range(50):
    print("\\u2819 Running stats")
print(f"failed to collect stats. runner returned {{int(code)}}")
sys.exit(1)
"""
TESTS_X = """\
import pytest


@pytest.fixture
def broken():
    raise RuntimeError("a fixture that breaks")


def test_fine():
    pass


def test_wrong():
    assert 1 == 2


def test_set_up_wrong(broken):
    pass
""" + "".join(f"\n\n@pytest.mark.skip(reason='not here')\ndef test_skipped_{i}():\n    pass\n" for i in range(60))


@pytest.mark.parametrize("run, broken_import, named", [
    (True, False, "2 test(s) failed on the unmutated code:\n  tests_x/test_x.py::test_wrong (call)\n"
                  "  tests_x/test_x.py::test_set_up_wrong (setup)\n"),
    # a test file that cannot be imported: pytest stops after collection, and the file is what is named
    (True, True, "1 test(s) failed on the unmutated code:\n  tests_x/test_broken.py (collection)\n"),
    (False, False, "no test was reported failing (a crash, or pytest's own error); its output ends:"),
], ids=["a-test-fails", "a-file-fails-to-import", "no-test-ran"])
def test_a_run_that_stops_before_any_mutant_names_the_tests_that_failed(tmp_path, run, broken_import, named):
    """mutmut prints its spinner and "failed to collect stats" when a test fails on the unmutated code, never the
    test: the error names each failing test (harness.audit.failures), however long pytest's summary, and says so
    when no test was reported (a crash before pytest, or pytest's own error)."""
    stand_in_mutmut(tmp_path, FAKE_MUTMUT.format(root=str(ROOT), run=run))
    (tmp_path / "tests_x").mkdir()
    (tmp_path / "tests_x" / "test_x.py").write_text(TESTS_X)
    if broken_import:
        (tmp_path / "tests_x" / "test_broken.py").write_text("import no_such_module_here\n")
    with pytest.raises(mutants.MutantsError) as err:
        mutants.run_mutants(tmp_path, [mutant()], 1, None, Progress("test", quiet=True), tests=("tests_x",))
    message = str(err.value)
    assert named in message, message
    assert "\u2819" not in message and re.search(r"failed to collect stats\. runner returned [12]\b", message), message


@pytest.mark.parametrize("under_test, recorded", [
    (None, True), ("", True), ("stats", True),  # outside mutmut, its clean run, its stats run: the unmutated code
    ("fastpath.registry.x_applied__mutmut_3", False), ("fail", False),  # failures meant to happen
])
def test_the_failures_file_records_only_the_runs_of_the_unmutated_code(tmp_path, monkeypatch, under_test, recorded):
    from harness.audit import failures

    path = tmp_path / "failures.txt"
    monkeypatch.setenv(failures.ENV, str(path))
    if under_test is None:
        monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    else:
        monkeypatch.setenv("MUTANT_UNDER_TEST", under_test)
    failures.pytest_runtest_logreport(types.SimpleNamespace(failed=True, nodeid="tests_x/test_x.py::t", when="call"))
    failures.pytest_collectreport(types.SimpleNamespace(failed=True, nodeid="tests_x/test_y.py"))
    failures.pytest_runtest_logreport(types.SimpleNamespace(failed=False, nodeid="tests_x/test_x.py::u", when="call"))
    expected = "tests_x/test_x.py::t (call)\ntests_x/test_y.py (collection)\n"
    assert (path.read_text() if path.exists() else "") == (expected if recorded else "")


def test_a_mutants_seconds_come_from_mutmuts_log_where_its_meta_says_zero(tmp_path):
    """mutmut 3.8's meta file can hold 0.0 for a mutant's duration; its debug log's "Completed" line has the time the
    mutant took, and that is what the results (and `audit mutant-budget`'s estimate) must carry."""
    name = "fastpath.registry.x_applied__mutmut_1"
    (tmp_path / "mutants" / "fastpath").mkdir(parents=True)
    stand_in_mutmut(tmp_path, "import json\n"
                    f"open('mutants/mutmut-debug.log', 'w').write('Completed {name}: exit=1 (7.25s)\\n')\n"
                    f"json.dump({{'exit_code_by_key': {{{name!r}: 1}}, 'durations_by_key': {{{name!r}: 0.0}}}}, "
                    "open('mutants/fastpath/registry.py.meta', 'w'))\n")
    ran = mutants.run_mutants(tmp_path, [mutant(name=name)], 1, None, Progress("test", quiet=True), tests=("t",))
    assert ran["codes"] == {name: (1, 7.25)}, ran["codes"]


def test_a_stale_equivalent_entry_is_an_error_naming_it():
    ms = [mutant()]
    row = {"path": "fastpath/registry.py", "function": "applied", "before": "x = 1", "after": "x = 2", "reason": "r"}
    run, equivalent = mutants.split_equivalent(ms, [row])
    assert run == [] and equivalent == ms
    stale = dict(row, after="x = 3")
    with pytest.raises(mutants.MutantsError, match="(?s)no longer exist.*'x = 1' -> 'x = 3'"):
        mutants.split_equivalent(ms, [row, stale])


def test_an_equivalent_entry_needs_a_reason(tmp_path):
    path = tmp_path / "equivalent.json"
    path.write_text(json.dumps({"equivalent": [{"path": "p", "function": "f", "before": "a", "after": "b",
                                                "reason": " "}]}))
    with pytest.raises(mutants.MutantsError, match="a reason"):
        mutants.load_equivalent(path)


def test_the_reviewed_lists_are_well_formed_and_apart():
    equivalent = mutants.load_equivalent()
    gpu = mutants.load_equivalent(mutants.NEEDS_GPU, "needs_gpu")
    for row in equivalent + gpu:
        assert row["path"] in mutants.MODULES, row
        assert mutant_rooms.decides(row["path"], row["function"]), f"{row} is outside the scope"
    # "equivalent" is the same behaviour on every device: a reason that only a GPU can tell belongs in needs_gpu
    for row in equivalent:
        assert not re.search(r"only a GPU|GPU run can tell|where the mutants run", row["reason"]), row
    key = lambda r: (r["path"], r["function"], r["before"], r["after"])  # noqa: E731
    assert not {key(r) for r in equivalent} & {key(r) for r in gpu}


def test_the_scope_is_every_file_of_fastpath_and_the_named_functions_of_the_harness():
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fastpath").rglob("*.py"))
    rooms = {room.name: room for room in mutant_rooms.ROOMS}
    assert sorted(list(rooms["patches"].files) + list(rooms["gpu"].files)) == on_disk
    assert all(room.files[p] is mutant_rooms.ALL for room in (rooms["patches"], rooms["gpu"]) for p in room.files)
    import ast

    for room in mutant_rooms.ROOMS:
        for path, functions in room.files.items():
            assert (ROOT / path).is_file(), path
            if functions is mutant_rooms.ALL:
                continue
            assert path.startswith("harness/"), path
            tree = ast.parse((ROOT / path).read_text())
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            defined |= {f"{c.name}.{n.name}" for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            assert set(functions) <= defined, f"{path}: no function {sorted(set(functions) - defined)}"
        for test in room.tests:
            assert (ROOT / test.split("::")[0]).exists(), f"room {room.name}: no {test}"
    with pytest.raises(ValueError, match="no mutant room"):
        mutant_rooms.rooms(["nowhere"])
    with pytest.raises(ValueError, match="in no mutant room"):
        mutant_rooms.room_of("harness/report.py")


def test_a_score_per_room_and_overall():
    ms = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}") for i in range(1, 5)]
    for m, room in zip(ms, ("patches", "patches", "gate", "gate")):
        m.room = room
    codes = {ms[0].name: (1, 1.0), ms[1].name: (1, 1.0), ms[2].name: (1, 1.0), ms[3].name: (0, 1.0)}
    summary = mutants.judge(ms, {"codes": codes, "tests": {}})
    assert summary["score"] == 0.75 and summary["rooms"]["patches"]["score"] == 1.0
    assert summary["rooms"]["gate"]["killed"] == 1 and summary["rooms"]["gate"]["survived"] == 1
    assert list(summary["rooms"]) == ["patches", "gate"]


def test_an_import_time_mutant_is_not_judged_whatever_its_outcome():
    killed = mutant(name="fastpath.registry.x__lazy__mutmut_1", function="_lazy")
    survived = mutant(name="fastpath.registry.x__lazy__mutmut_2", function="_lazy")
    summary = mutants.judge([killed, survived], {"codes": {killed.name: (1, 1.0), survived.name: (0, 1.0)},
                                                 "tests": {}})
    assert killed.status == survived.status == "not judged"
    assert summary["judged"] == 0 and summary["not_judged"] == 2


def test_the_seed_is_fixed_by_the_commit_and_a_training_seed_is_never_the_headline(tmp_path, monkeypatch):
    a, b = "1c8523d" + "0" * 33, "3dac162" + "0" * 33
    assert mutants.auto_seed(a) == mutants.auto_seed(a) != mutants.auto_seed(b)
    seeds = tmp_path / "training_seeds.json"
    seeds.write_text(json.dumps({"training": [{"seed": 7, "why": "tests written against its survivors"}]}))
    read = mutants.training_seeds
    monkeypatch.setattr(mutants, "training_seeds", lambda: read(seeds))

    def args(**given):
        return types.SimpleNamespace(**{"changed_since": None, "names": None, "needs_gpu": False, "training": None,
                                        **given})

    assert mutants.kind_of(args(), 8) == "mutants"
    with pytest.raises(mutants.MutantsError, match="seed 7 is a training seed"):
        mutants.kind_of(args(), 7)
    assert mutants.kind_of(args(training="before"), 7) == "mutants-before"
    with pytest.raises(mutants.MutantsError, match="not listed"):
        mutants.kind_of(args(training="after"), 8)
    assert mutants.kind_of(args(changed_since="auto"), 7) == "mutants-change"
    seeds.write_text("{}")
    with pytest.raises(mutants.MutantsError, match="not a list of training seeds"):
        read(seeds)
    # the project's own list: seed 1 trained on, so it is never a headline
    assert 1 in read()


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _copy_of_checkout(tmp_path) -> Path:
    """This checkout's files as they are on disk, as the first commit of a new repository."""
    copy = tmp_path / "repo"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    _git(copy, "init", "-q", "-b", "main")
    _git(copy, "add", "-A")
    _git(copy, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return copy


@pytest.mark.parametrize("mode, child_sees", [
    ("stats", ""),  # the stats run's child: no mutmut configuration to record in, so it runs the original code
    ("fastpath.registry.x_apply__mutmut_1", "fastpath.registry.x_apply__mutmut_1"),  # a mutant's: runs it too
    ("fail", "fail"),  # mutmut's forced-failure check reaches children as well
])
def test_a_child_of_the_stats_run_runs_the_original_code_and_a_mutants_child_the_mutant(tmp_path, mode, child_sees):
    (tmp_path / "sitecustomize.py").write_text(mutants.STATS_CHILD)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MUTANT_UNDER_TEST=mode)
    done = subprocess.run([sys.executable, "-c", "import os; print(repr(os.environ['MUTANT_UNDER_TEST']))"],
                          env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == repr(child_sees)


CHILD_CLI = """import sys


def double(x):
    return x * 2


def half(x):
    return x // 2


if __name__ == "__main__":
    print(double(int(sys.argv[1])))
"""
CHILD_TEST = """import subprocess
import sys

from pkg.cli import half


def test_half_here():
    assert half(6) == 3


def test_double_in_a_child():
    done = subprocess.run([sys.executable, "-m", "pkg.cli", "3"], capture_output=True, text=True)
    assert done.stdout.strip() == "6", done.stderr
"""


@pytest.mark.parametrize("plugins, status", [
    ([], "no tests"),  # mutmut's stats run never sees the child's calls: the mutants meet no test
    (["-p", "harness.audit.child_calls"], "killed"),  # credited to the test that started the child, which kills them
])
def test_a_function_a_test_reaches_only_in_a_child_process_meets_that_test(tmp_path, plugins, status):
    # a project whose only test runs the function as `python -m pkg.cli` (as the tests of fastpath's command line do)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "cli.py").write_text(CHILD_CLI)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cli.py").write_text(CHILD_TEST)
    args = "".join(f"    {a}\n" for a in ["-p", "no:cacheprovider", *plugins])
    (tmp_path / "setup.cfg").write_text("[mutmut]\nsource_paths =\n    pkg\npytest_add_cli_args_test_selection =\n"
                                        f"    tests\npytest_add_cli_args =\n{args}")
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "sitecustomize.py").write_text(mutants.STATS_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "mutants"), str(ROOT)]))
    env.pop("MUTANT_UNDER_TEST", None)
    subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    found = dict(line.strip().rsplit(": ", 1) for line in done.stdout.splitlines() if "x_double__mutmut_" in line)
    assert found and set(found.values()) == {status}, done.stdout + done.stderr


IN_ORDER_MODULE = """import pytest

@pytest.fixture(scope="module")
def built():
    with open("setups.txt", "a") as f:
        f.write(__name__ + "\\n")

@pytest.mark.parametrize("i", range(3))
def test_one(built, i):
    pass

def test_two(built):
    pass
"""


@pytest.mark.parametrize("plugin, setups", [([], 6), (["-p", "harness.audit.in_order"], 2)])
def test_tests_named_out_of_order_build_each_modules_fixtures_once_in_order(tmp_path, plugin, setups):
    # mutmut names a run's tests from a set; shuffled, a module's fixtures are built again each time the run returns
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(IN_ORDER_MODULE)
    named = ["test_a.py::test_one[0]", "test_b.py::test_two", "test_a.py::test_two", "test_b.py::test_one[2]",
             "test_a.py::test_one[2]", "test_b.py::test_one[0]"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", *plugin,
                           *named], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "6 passed" in done.stdout
    assert len((tmp_path / "setups.txt").read_text().split()) == setups


def test_a_mutant_is_described_from_the_text_of_its_function_in_mutmuts_file():
    original = "import x\n\n\nclass C:\n    # a comment\n    def f(self, a):\n        return a + 1\n\n\ndef g(b):\n" \
               "    return b\n"
    mutated = ("class C:\n    def f(self, a):\n        return a + 1\n\n    def xǁCǁf__mutmut_1(self, a):\n"
               "        return a - 1\n\n\ndef x_g__mutmut_1(b):\n    return None\n")
    parsed = (original.splitlines(), mutants._defs(original), mutated.splitlines(),
              mutants._defs(mutated, qualified=False))
    method = mutants.describe("m.xǁCǁf__mutmut_1", "m.py", parsed)
    assert (method.function, method.lines, method.before, method.after) == ("C.f", [7], "return a + 1", "return a - 1")
    top = mutants.describe("m.x_g__mutmut_1", "m.py", parsed)
    assert (top.function, top.lines, top.before, top.after) == ("g", [11], "return b", "return None")
    with pytest.raises(mutants.MutantsError, match="x_g__mutmut_2"):
        mutants.describe("m.x_g__mutmut_2", "m.py", parsed)


def test_changed_lines_and_the_base_of_a_change(tmp_path):
    copy = _copy_of_checkout(tmp_path)
    path = copy / "fastpath" / "registry.py"
    text = path.read_text().replace("def applied(model) -> list:\n",
                                    "def applied(model) -> list:\n    limit = 64  # planted\n", 1)
    path.write_text(text)
    _git(copy, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "planted")
    line = text.splitlines().index("    limit = 64  # planted") + 1
    base = mutants.resolve_base("auto", copy)  # on main itself: the last commit's parent
    assert base == _git(copy, "rev-parse", "HEAD^")
    assert mutants.changed_lines(base, copy) == {"fastpath/registry.py": {line}}
    near = [mutant(lines=(line,)), mutant(lines=(line + 1,)), mutant(path="fastpath/loop.py", lines=(line,))]
    assert mutants.touching(near, {"fastpath/registry.py": {line}}) == near[:1]
    with pytest.raises(mutants.MutantsError, match="not a commit"):
        mutants.resolve_base("no-such-ref", copy)


def _run(copy, tmp_path, *extra, which=("--changed-since", "auto")):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "harness", "mutants", *which, "--source",
                           str(copy), "--work", str(tmp_path / "work"), "--modules", "fastpath/registry.py",
                           "--tests", "tests_patches/test_registry.py", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
@pytest.mark.control
def test_a_planted_surviving_mutant_fails_the_change_until_listed_as_equivalent(tmp_path):
    copy = _copy_of_checkout(tmp_path)
    path = copy / "fastpath" / "registry.py"
    path.write_text(path.read_text().replace("def applied(model) -> list:\n",
                                             "def applied(model) -> list:\n    limit = 64  # read by nothing\n", 1))
    _git(copy, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "planted")
    done = _run(copy, tmp_path, "--results", str(tmp_path / "results"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SURVIVED: fastpath.registry.x_applied__mutmut_" in done.stdout
    assert "+    limit = " in done.stdout and "run it again: fastpath-suite audit mutants --names" in done.stdout
    figures = json.loads(next((tmp_path / "results" / "mutants-change").glob("*.json")).read_text())["figures"]
    survivors = [m for m in figures["mutants"] if m["status"] == "survived"]
    assert survivors and all(m["before"] == "limit = 64  # read by nothing" for m in survivors)
    # the known-equivalent control: the same mutants, reviewed as equivalent, pass; nothing else of the change
    listed = tmp_path / "equivalent.json"
    listed.write_text(json.dumps({"equivalent": [
        {k: m[k] for k in ("path", "function", "before", "after")} | {"reason": "planted: read by nothing"}
        for m in survivors]}))
    again = _run(copy, tmp_path, "--equivalent", str(listed))
    assert again.returncode == 0, again.stdout + again.stderr
    # asked for by name, a reviewed mutant is left out as well: its review stands, nothing runs
    named = _run(copy, tmp_path, "--equivalent", str(listed), which=("--names", survivors[0]["name"]))
    assert named.returncode == 0, named.stdout + named.stderr
    assert "1 named mutant(s), 1 of them reviewed as equivalent or needing a GPU: nothing to run" in named.stdout, \
        named.stdout


def _fake_selection(monkeypatch, tmp_path, n: int):
    """main() with mutmut replaced: `n` mutants on one changed line of registry.py, each killed when run."""
    from harness.run import results

    ms = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}", lines=(10,)) for i in range(1, n + 1)]
    monkeypatch.setattr(mutants, "resolve_base", lambda ref, source: "b" * 40)
    monkeypatch.setattr(mutants, "changed_lines", lambda base, source, modules: {"fastpath/registry.py": {10}})
    monkeypatch.setattr(results, "checkout_state", lambda source: ("c" * 40, False))
    monkeypatch.setattr(mutants, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(mutants, "generate", lambda work, paths: [Mutant(**vars(m)) for m in ms])
    ran = []

    def run(work, chosen, children, budget, progress, tests):
        ran.extend(m.name for m in chosen)
        return {"codes": {m.name: (1, 1.0) for m in chosen}, "tests": {}, "completed": {m.name for m in chosen},
                "out_of_time": False, "seconds": 1.0, "unconfirmed": []}

    monkeypatch.setattr(mutants, "run_and_confirm", run)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"equivalent": [], "needs_gpu": []}))
    return ran, ["--changed-since", "auto", "--work", str(tmp_path / "w"), "--equivalent", str(empty),
                 "--gpu-list", str(empty), "--quiet"]


def test_mutants_past_the_cap_are_named_and_not_judged(monkeypatch, tmp_path, capsys):
    """Known worse: a change with more mutants than --max-mutants. Before, the run took a seeded 40 and passed; now
    each mutant past the cap is named as not judged and the run exits 3 (a failure of CI's stage)."""
    ran, argv = _fake_selection(monkeypatch, tmp_path, 5)
    assert mutants.main(argv + ["--max-mutants", "2"]) == 3
    out = capsys.readouterr().out
    assert len(ran) == 2 and "NOT JUDGED: 3 mutant(s) of the changed lines past --max-mutants 2" in out
    assert all(f"fastpath.registry.x_applied__mutmut_{i}" in out.split("NOT JUDGED")[1] for i in range(1, 6)
               if f"fastpath.registry.x_applied__mutmut_{i}" not in ran)
    # the known-equivalent control: every mutant within the cap runs, all killed, exit 0
    ran.clear()
    assert mutants.main(argv + ["--max-mutants", "5"]) == 0 and len(ran) == 5
    assert "NOT JUDGED" not in capsys.readouterr().out


def test_a_set_of_tests_that_fails_unmutated_leaves_its_mutants_not_judged_and_the_others_run(monkeypatch, tmp_path,
                                                                                               capsys):
    # a stranger's fault: one room's tests fail on the unmutated code (mutmut's stats run stops). Before, the whole
    # command stopped there and the rooms already run were lost with it
    _, argv = _fake_selection(monkeypatch, tmp_path, 2)
    strict_mutants = [mutant(name=f"harness.run.strict.x_outcome__mutmut_{i}", path="harness/run/strict.py",
                             function="outcome", lines=(10,)) for i in (1, 2)]
    patches = [mutant(name=f"fastpath.registry.x_applied__mutmut_{i}", lines=(10,)) for i in (1, 2)]
    monkeypatch.setattr(mutants, "changed_lines", lambda base, source, modules: {
        "fastpath/registry.py": {10}, "harness/run/strict.py": {10}})
    monkeypatch.setattr(mutants, "generate", lambda work, paths: [
        Mutant(**vars(m)) for m in patches + strict_mutants if m.path in paths])
    ran = []

    def run(work, chosen, children, budget, progress, tests):
        if "tests_patches/test_registry.py" in tests:  # the patches' tests that import registry.py
            raise mutants.MutantsError("mutmut stopped before running a mutant (exit 1): a test failed")
        ran.extend(m.name for m in chosen)
        return {"codes": {m.name: (1, 1.0) for m in chosen}, "tests": {}, "completed": {m.name for m in chosen},
                "out_of_time": False, "seconds": 1.0, "unconfirmed": []}

    monkeypatch.setattr(mutants, "run_and_confirm", run)
    assert mutants.main(argv) == 2
    out = capsys.readouterr().out
    assert sorted(ran) == [m.name for m in strict_mutants]
    assert "score: 2 killed of 2 = 100.0%" in out and "; 2 not judged;" in out, out
    for m in patches:
        assert f"not judged: {m.name} (fastpath/registry.py line 10): its tests failed on the unmutated code" in out
    assert "NOT JUDGED: the 2 mutant(s) of pytest tests_patches" in out and "a test failed" in out


@pytest.mark.slow
@pytest.mark.control
def test_the_stage_fails_on_a_planted_survivor_in_the_gpu_code_and_in_the_gate(tmp_path):
    """Known worse, in two rooms the stage used to skip: a line nothing reads, planted in fastpath/gpu/padding.py's
    llm_call_shape and in harness/gate/versions.py's declared_requirement (a small file: mutmut generates every
    mutant of a file it mutates), committed as one change on main. CI's command (`--changed-since auto`, every room)
    fails naming a survivor of each, with its room. (Before the scope took in fastpath/gpu/ and the harness, neither
    line was mutated, and the stage passed on them.)"""
    copy = _copy_of_checkout(tmp_path)
    plants = {"fastpath/gpu/padding.py": "def llm_call_shape(args: tuple, kwargs: dict):\n",
              "harness/gate/versions.py": "def declared_requirement(pyproject: Path = PYPROJECT) -> Requirement:\n"}
    for path, line in plants.items():
        text = (copy / path).read_text()
        assert line in text, f"{path}: the planted function's first line moved; update this test"
        (copy / path).write_text(text.replace(line, line + "    limit = 64  # read by nothing\n", 1))
    _git(copy, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "planted in two rooms")
    done = subprocess.run([sys.executable, "-m", "harness", "mutants", "--changed-since", "auto", "--source",
                           str(copy), "--work", str(tmp_path / "work"), "--tests",
                           "tests_patches/test_gpu_padding.py::test_llm_call_shape_takes_only_what_padding_handles",
                           "tests_patches/test_omnivoice_range.py::test_the_declared_omnivoice_range_admits_exactly_"
                           "the_verified_versions"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "SURVIVED: fastpath.gpu.padding.x_llm_call_shape__mutmut_" in out, out[-3000:]
    assert "SURVIVED: harness.gate.versions.x_declared_requirement__mutmut_" in out, out[-3000:]
    assert re.search(r"^  gpu: \d+ killed of \d+", out, re.M) and re.search(r"^  gate: \d+ killed of \d+", out, re.M)


def test_a_change_meets_first_the_tests_that_import_its_files(tmp_path):
    tests = tmp_path / "tests_x"
    tests.mkdir()
    (tests / "test_plain.py").write_text("import fastpath.gpu.graphs\n")
    (tests / "test_from.py").write_text("from fastpath.gpu import graphs as g\n")
    (tests / "test_inner.py").write_text("from fastpath.gpu.graphs import GraphedForward\n")
    (tests / "test_other.py").write_text("from fastpath.gpu import packed  # graphs, by name in a comment\n"
                                         "import fastpath.gpu\nfrom . import graphs\nX = 'fastpath.gpu.graphs'\n")
    (tmp_path / "test_node.py").write_text("import fastpath.gpu.graphs\n")
    room = mutant_rooms.Room("r", {"fastpath/gpu/graphs.py": None}, ("tests_x", "test_node.py::test_a", "more.py"),
                             ("tests_x/test_plain.py::test_slow", "tests_x/test_other.py::test_slow"))
    (tmp_path / "more.py").write_text("import fastpath.loop\n")
    own = mutant_rooms.own_tests(room, ["fastpath/gpu/graphs.py"], tmp_path)
    assert own == ("tests_x/test_from.py", "tests_x/test_inner.py", "tests_x/test_plain.py", "test_node.py::test_a",
                   "--deselect=tests_x/test_plain.py::test_slow")
    # a package's __init__ is imported by every import of a module inside it
    assert mutant_rooms.own_tests(room, ["fastpath/__init__.py"], tmp_path)[:6] == (
        "tests_x/test_from.py", "tests_x/test_inner.py", "tests_x/test_other.py", "tests_x/test_plain.py",
        "test_node.py::test_a", "more.py")
    # no test file imports it: the room's whole selection, never an empty one
    assert mutant_rooms.own_tests(room, ["fastpath/streaming.py"], tmp_path) == mutant_rooms.selection(room)
    assert mutant_rooms.module_name("fastpath/gpu/__init__.py") == "fastpath.gpu"


def _narrow_then_whole(monkeypatch, tmp_path, whole_codes: dict, whole_finishes: bool = True, narrow_code: int = 0):
    """main() on two mutants of a changed line of registry.py: the narrow run (the tests that import it) kills
    mutant 1 and gives 2 `narrow_code` (0 survived; 33 no tests, which mutmut gives without running it); the room's
    whole selection gives `whole_codes`."""
    ran, argv = _fake_selection(monkeypatch, tmp_path, 2)
    whole = mutant_rooms.selection(mutant_rooms.room_of("fastpath/registry.py"))
    calls = []

    def run(work, chosen, children, budget, progress, tests):
        calls.append((tests == whole, [m.name for m in chosen]))
        codes = ({m.name: (whole_codes[m.name], 1.0) for m in chosen if whole_finishes} if tests == whole else
                 {m.name: (1 if m.name.endswith("_1") else narrow_code, 1.0) for m in chosen})
        done = {n for n in codes if codes[n][0] != 33}  # mutmut's log has no line for a "no tests" mutant
        return {"codes": codes, "tests": {}, "completed": done, "out_of_time": not done, "seconds": 1.0,
                "unconfirmed": []}

    monkeypatch.setattr(mutants, "run_and_confirm", run)
    return calls, argv


@pytest.mark.parametrize("narrow", [0, 33])
@pytest.mark.parametrize("code, finishes, exit_code, said", [
    (1, True, 0, "score: 2 killed of 2 = 100.0%"),  # killed by a test of another file: no survivor
    (0, True, 1, "SURVIVED: fastpath.registry.x_applied__mutmut_2"),  # survives everything: the change fails
    (33, True, 1, "SURVIVED: fastpath.registry.x_applied__mutmut_2 (fastpath/registry.py line 10); no test calls"),
    (0, False, 3, "not judged: fastpath.registry.x_applied__mutmut_2 (fastpath/registry.py line 10): survived the "
                  "tests that import its file; the room's whole selection did not finish within the budget"),
])
def test_a_survivor_of_its_files_own_tests_is_judged_on_the_rooms_whole_selection(monkeypatch, tmp_path, capsys,
                                                                                    code, finishes, exit_code, said,
                                                                                    narrow):
    calls, argv = _narrow_then_whole(monkeypatch, tmp_path, {"fastpath.registry.x_applied__mutmut_2": code},
                                     finishes, narrow)
    assert mutants.main(argv + ["--budget", "100", "--results", str(tmp_path / "res")]) == exit_code
    out = capsys.readouterr().out
    assert said in out, out
    # the whole run's time, its budget running out and its row are the run's, as the narrow run's are
    assert ("did not finish within --budget 100 s" in out) == (not finishes), out
    figures = json.loads(next((tmp_path / "res").glob("mutants-change/*.json")).read_text())["figures"]
    assert [(t["mutants"], t["seconds"], t.get("widened", False)) for t in figures["timings"]] == [
        (2, 1.0, False), (1, 1.0, True)]
    assert 2.0 <= figures["seconds"] < 3.0
    # the narrow run first, with both; then the whole selection with the survivor alone
    assert calls == [(False, ["fastpath.registry.x_applied__mutmut_1", "fastpath.registry.x_applied__mutmut_2"]),
                     (True, ["fastpath.registry.x_applied__mutmut_2"])]
