"""`fastpath-suite nightly bisect`: from a flagged night to its commit (harness.nightly.bisect).

The search is shown on small git histories with a stand-in counter (each commit's count read from the commit's own
file, so the answer is known), and, in the controls stage, on a copy of this repository with a commit that adds
work to the unmasking loop, counted for real by each commit's own code
(tests_harness/test_history_bisect.py: the controls stage does not run tests_speed)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from harness.nightly import bisect


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def history(tmp_path, counts: list) -> tuple:
    """A git repository whose commit k writes count.txt = counts[k] (None: a commit whose count cannot be made);
    returns (repo, [sha of each commit])."""
    return commits_with(tmp_path, [("broken" if n is None else n, f"commit {k}") for k, n in enumerate(counts)])


def reads_the_file(repo, commit, signal, point, variant, work):
    text = git(repo, "show", f"{commit}:count.txt")
    return (None, "does not build") if text == "broken" else (int(text), "")


def run(repo, shas, good=0, bad=-1, signal="structure"):
    return bisect.bisect(repo, shas[good], shas[bad], "auto-short-2", signal, log=lambda msg: None,
                         counter=reads_the_file)


@pytest.mark.parametrize("counts, step", [
    pytest.param([100, 100, 100, 120, 120, 120, 120, 120], 3, id="a step in the middle"),
    pytest.param([100, 120], 1, id="the one commit"),
    pytest.param([100, 130, 130, 130, 130, 130, 130], 1, id="the first commit of the range"),
    pytest.param([100, 100, 100, 100, 100, 100, 100, 101], 7, id="the last commit, by one call"),
    pytest.param([100, 99, 100, None, 100, 130, 130], 5, id="a commit that does not build, passed over"),
    pytest.param([100, 100, 100, 90, 90, 90], 3, id="less work: a fall, which the count check fails too"),
])
def test_bisect_finds_the_commit_past_the_floor(tmp_path, counts, step):
    repo, shas = history(tmp_path, counts)
    result = run(repo, shas)
    text = bisect.format_result(result, "GOOD", "BAD")
    assert [s.after.commit for s in result.steps] == [shas[step]] and result.steps[0].named, text
    assert (result.steps[0].before.count, result.first_bad.count) == (counts[step - 1], counts[step])
    assert len(result.probes) <= 2 + (len(counts) - 2).bit_length() + counts.count(None)  # halving, not a scan
    assert f"step: {shas[step]} commit {step}" in text, text
    assert "moved both ways" not in text


@pytest.mark.parametrize("counts, steps", [
    pytest.param([1_000_000, 1_000_000, 1_050_000, 1_050_000, 1_050_000, 945_000, 945_000], {2: +0.05, 5: -0.10},
                 id="a +5% regression, then a -10% gain"),
    pytest.param([1_000_000, 900_000, 900_000, 900_000, 900_000, 945_000, 945_000], {1: -0.10, 5: +0.05},
                 id="a -10% gain, then a +5% regression"),
    pytest.param([1_000_000, 1_300_000, 1_300_000, 1_300_000, 900_000], {1: +0.30, 4: -0.3077},
                 id="a rise at the first commit, the fall at the last"),
    pytest.param([1_000_000, 1_200_000, 1_000_000, 1_000_000, 800_000, 800_000], {4: -0.20},
                 id="BAD fell: a rise undone between two counted commits is not seen by halving"),
])
def test_every_lasting_step_is_found_in_both_directions(tmp_path, counts, steps):
    """The direction is not BAD's alone: a regression and a gain in one range are both named, oldest first, each
    with its own change, and the range is said to have moved both ways."""
    repo, shas = history(tmp_path, counts)
    result = run(repo, shas, signal="instructions")
    text = bisect.format_result(result, "GOOD", "BAD")
    for k, change in steps.items():
        assert f"step: {shas[k]} commit {k}" in text, text
    assert [s.after.commit for s in result.steps] == [shas[k] for k in steps], text
    assert [round(s.change, 4) for s in result.steps] == list(steps.values()), text
    assert all(s.named for s in result.steps)
    both = len({c > 0 for c in steps.values()}) == 2
    assert result.both_ways == both and ("the range moved both ways" in text) == both, text


def test_every_counts_each_commit_and_finds_a_move_undone_before_bad(tmp_path):
    """A rise and its fall inside the range leave GOOD and BAD level: halving says so and points at --every, which
    counts every commit and names both."""
    counts = [100, 100, 130, 130, 100, 100]
    repo, shas = history(tmp_path, counts)
    halved = run(repo, shas)
    assert not halved.steps and len(halved.probes) == 2
    assert "a move undone inside the range (a rise and its fall) is seen with --every" in \
        bisect.format_result(halved, "A", "B")
    every = bisect.bisect(repo, shas[0], shas[-1], "auto-short-2", log=lambda msg: None, counter=reads_the_file,
                          every=True)
    text = bisect.format_result(every, "A", "B")
    assert [(s.after.commit, s.before.count, s.after.count) for s in every.steps] == \
        [(shas[2], 100, 130), (shas[4], 130, 100)], text
    assert len(every.probes) == len(counts) and "the range moved both ways" in text


def test_a_drift_past_the_floor_with_no_one_commit_past_it_is_said_so(tmp_path):
    """Instruction counts creeping up by 0.04% a commit pass the 0.1% floor over the range, and no commit passes it
    alone: reported as a drift over the commits where it happened, not as one commit's step."""
    floor = bisect.floor_of("instructions", "auto-short-2", "lossless")
    counts = [round(10_000_000 * (1 + 0.4 * floor) ** k) for k in range(6)]
    repo, shas = history(tmp_path, counts)
    result = run(repo, shas, signal="instructions")
    text = bisect.format_result(result, "A", "B")
    assert result.steps and not any(s.named for s in result.steps), text
    assert "a drift, no one commit" in text and "step: " not in text, text


def test_a_commit_that_does_not_build_is_skipped_and_named(tmp_path):
    repo, shas = history(tmp_path, [100, 100, None, 100, 100, 140])
    result = run(repo, shas)
    assert result.first_bad.commit == shas[5]
    [skipped] = [p for p in result.probes if p.verdict == "skipped"]
    assert skipped.commit == shas[2]
    assert f"skipped (could not be counted, not steps): {shas[2][:12]} (does not build)" in \
        bisect.format_result(result, "A", "B")


def test_a_counter_that_raises_at_one_commit_skips_it_not_a_step(tmp_path):
    """A stranger's counter raises (not answers None) where the package does not import: that commit is skipped
    and named with the error, the search goes on, and the step is still the commit that moved."""
    repo, shas = history(tmp_path, [100, 100, 100, 100, 100, 120, 120])

    def raises_at_3(repo_, commit, *args):  # the middle: the first commit the halving probes
        if commit == shas[3]:
            raise ImportError("cannot import name 'apply' from 'fastpath'")
        return reads_the_file(repo_, commit, *args)

    result = bisect.bisect(repo, shas[0], shas[-1], "p", log=lambda m: None, counter=raises_at_3)
    text = bisect.format_result(result, "A", "B")
    assert [s.after.commit for s in result.steps] == [shas[5]] and result.steps[0].named, text
    assert f"{shas[3][:12]} (the count raised ImportError: cannot import name 'apply'" in text, text


def test_a_step_hidden_among_skipped_commits_names_them_all(tmp_path):
    repo, shas = history(tmp_path, [100, None, 130])
    result = run(repo, shas)
    assert [p.commit for p in result.candidates] == [shas[1], shas[2]]
    assert "a step among skipped commits" in bisect.format_result(result, "A", "B")


def test_a_range_with_no_step_says_so(tmp_path):
    repo, shas = history(tmp_path, [100, 130, 100, 100])  # a rise that went away again: BAD is not past the floor
    result = run(repo, shas)
    assert not result.step and result.first_bad is None
    assert "no step between GOOD and BAD: BAD counts 100 against GOOD's 100" in bisect.format_result(result, "A", "B")


def test_instruction_counts_use_the_points_stored_margin_as_the_floor(tmp_path):
    floor = bisect.floor_of("instructions", "auto-short-2", "lossless")
    assert 0 < floor < 0.01
    repo, shas = history(tmp_path, [1_000_000, int(1_000_000 * (1 + floor / 2)), int(1_000_000 * (1 + 2 * floor))])
    result = run(repo, shas, signal="instructions")
    assert [s.after.commit for s in result.steps] == [shas[2]]  # the wobble below the margin is not a step
    assert bisect.floor_of("structure", "auto-short-2", "lossless") == 0


@pytest.mark.parametrize("counts, code", [
    pytest.param([100, 100], 0, id="no step"), pytest.param([100, 120], 1, id="a step named"),
    pytest.param([100, None, 120], 2, id="a step among skipped commits"),
])
def test_the_exit_status_says_what_was_found(tmp_path, monkeypatch, capsys, counts, code):
    repo, shas = history(tmp_path, counts)
    monkeypatch.setattr(bisect, "count_at", lambda *a, **kw: reads_the_file(*a[:6]))
    assert bisect.main([shas[0], shas[-1], "--point", "auto-short-2", "--repo", str(repo)]) == code
    capsys.readouterr()


def test_bad_ranges_are_refused_naming_the_fix(tmp_path):
    repo, shas = history(tmp_path, [100, 120])
    with pytest.raises(bisect.BisectError, match="not an ancestor"):
        run(repo, shas, good=1, bad=0)
    with pytest.raises(bisect.BisectError, match="no commit"):
        run(repo, shas, good=1, bad=1)
    with pytest.raises(bisect.BisectError, match="failed"):
        bisect.bisect(repo, "no-such-commit", shas[1], "p", counter=reads_the_file, log=lambda m: None)
    (tmp_path / "b").mkdir()
    broken, bshas = history(tmp_path / "b", [None, 120])
    with pytest.raises(bisect.BisectError, match="GOOD .* cannot be counted: does not build"):
        run(broken, bshas)


def branched(tmp_path) -> tuple:
    """main: base (100) - main work (100) - more main work (100) - merge of side (90) - slower (99: +10%);
    side, from base: faster (90: the gain the merge brings). Returns (repo, {name: sha})."""
    repo, shas = history(tmp_path, [100])
    named = {"base": shas[0]}

    def commit(name, count):
        (repo / "count.txt").write_text(str(count))
        git(repo, "commit", "-q", "--allow-empty", "-am", name)
        named[name] = git(repo, "rev-parse", "HEAD")

    git(repo, "checkout", "-q", "-b", "side")
    commit("faster", 90)
    git(repo, "checkout", "-q", "main")
    commit("main work", 100)
    commit("more main work", 100)
    git(repo, "merge", "-q", "--no-ff", "--no-commit", "side")
    (repo / "count.txt").write_text("90")
    git(repo, "commit", "-q", "-am", "merge side")
    named["merge side"] = git(repo, "rev-parse", "HEAD")
    commit("slower", 99)
    return repo, named


def test_a_good_on_a_merged_branch_is_refused_naming_the_merge(tmp_path):
    """GOOD on a branch merged into BAD's line: the line's commits before the merge lack GOOD's gain, and counted
    against GOOD's count the first of them ("main work") looked like the step. Refused, naming the merge to start
    from; started there, the regression is found."""
    repo, c = branched(tmp_path)
    with pytest.raises(bisect.BisectError) as refused:
        bisect.bisect(repo, c["faster"], c["slower"], "p", log=lambda m: None, counter=reads_the_file)
    message = str(refused.value)
    assert f"merge {c['merge side'][:12]} (merge side)" in message, message
    assert f"nightly bisect {c['merge side'][:12]} {c['slower']}" in message and c["more main work"][:12] in message
    result = bisect.bisect(repo, c["merge side"], c["slower"], "p", log=lambda m: None, counter=reads_the_file)
    assert [s.after.commit for s in result.steps] == [c["slower"]]


def test_a_merge_inside_the_range_counts_as_one_commit(tmp_path):
    """GOOD on the line before the merge: the merge's gain and the later regression are both steps."""
    repo, c = branched(tmp_path)
    result = bisect.bisect(repo, c["more main work"], c["slower"], "p", log=lambda m: None, counter=reads_the_file)
    assert [(s.after.commit, s.after.count) for s in result.steps] == [(c["merge side"], 90), (c["slower"], 99)]
    assert result.both_ways


def test_a_flagged_night_of_a_count_history_prints_its_bisect_command(tmp_path, capsys):
    from harness.nightly.history import History, Night, main, night_id, save_history

    def night(day: int, ops: float) -> Night:
        points = {"auto-short-2/lossless": {"metric": "ops", "samples": [ops], "extra": {"bytes": 4096, "flops": 10}}}
        date = f"2026-11-{day:02d}T03:17:00+00:00"
        return Night(id=night_id(date, f"{day:040x}", points), date=date, commit=f"{day:040x}", command="test",
                     machine={"cpu_model": "Test CPU"}, points=points)

    path = tmp_path / "structure.json"
    save_history(History(machine_key="cpu-test", nights=[night(1, 100.0), night(2, 100.0), night(3, 120.0)], path=path),
                 path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert (f"bisect auto-short-2/lossless: fastpath-suite nightly bisect {2:040x} {3:040x} --point auto-short-2 "
            f"--signal structure") in out, out


STAND_IN = """#!/usr/bin/env bash
# a stand-in interpreter: records where and how it was asked to count, then writes the run file
echo "$PWD $*" > "{log}"
out="${{@: -1}}"
echo '{{"points": {{"auto-short-2/lossless": {{"median": 7}}}}}}' > "$out"
"""


@pytest.mark.parametrize("count_with", ["own", "this"])
def test_count_with_this_drives_each_commits_patches_with_this_harness(tmp_path, count_with):
    """--count-with this: the count runs in a folder where `harness` is this checkout's and `fastpath` the commit's
    (linked), as `python -m harness.counts.<signal>`; own: in the commit's worktree, as `python -m harness <signal>`."""
    repo, shas = history(tmp_path, [1])
    (repo / "fastpath").mkdir()
    (repo / "fastpath" / "marker.py").write_text("# the commit's patches\n")
    git(repo, "add", "fastpath")
    git(repo, "commit", "-q", "-m", "patches")
    log = tmp_path / "asked.txt"
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(log=log))
    python.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    sha = git(repo, "rev-parse", "HEAD")
    seen = {}

    def spy(args):  # what the folder held while the count ran (it is removed after)
        where = args.split()[0]
        from pathlib import Path

        seen.update(harness=Path(where, "harness").resolve(), fastpath=Path(where, "fastpath", "marker.py").exists(),
                    fastpath_target=Path(where, "fastpath").resolve())

    real_run = subprocess.run

    def run(command, **kw):
        done = real_run(command, **kw)
        if command[0] == str(python):
            spy(log.read_text())
        return done

    import unittest.mock as mock

    with mock.patch.object(bisect.subprocess, "run", run):
        count, why = bisect.count_at(repo, sha, "structure", "auto-short-2", "lossless", work, python=str(python),
                                     count_with=count_with)
    assert (count, why) == (7, "")
    asked = log.read_text().split()
    assert seen["fastpath"], "the commit's fastpath/ is where the count runs"
    if count_with == "this":
        assert asked[1:3] == ["-m", "harness.counts.structure"], asked
        assert seen["harness"] == bisect.REPO_ROOT / "harness", seen
        assert seen["fastpath_target"].name == "fastpath" and seen["fastpath_target"].parent.name == sha[:12]
    else:
        assert asked[1:4] == ["-m", "harness", "structure"], asked
        assert asked[0].endswith(sha[:12])
    assert not list(work.iterdir()) or all(p.suffix == ".json" for p in work.iterdir()), "worktree and links removed"


FAKE_VALGRIND = """#!/usr/bin/env bash
# Stands in for valgrind, and only for it: answers --version; otherwise starts the interpreter it was handed in the
# folder and environment it was started with (as valgrind would), asks it which fastpath it imports and the marker
# the commit planted, writes that to {log}, and exits 3 (no count).
if [ "$1" = "--version" ]; then echo valgrind-3.19.0; exit 0; fi
while [ "${{1#-}}" != "$1" ]; do shift; done  # valgrind's own options
found=$("$1" -c 'import os, fastpath; print(os.path.realpath(fastpath.__file__), getattr(fastpath, "PLANTED", "none"))') \\
    || exit 4
echo "$found" >> "{log}"
exit 3
"""


COUNT_WITH_ROWS = ("this",)


def test_each_probe_counts_its_own_commits_fastpath(tmp_path, monkeypatch):
    """`--count-with this` and `own`, instruction counts, on a copy of this repository whose commits each plant a
    marker in fastpath/: the valgrind child of each probe imports the fastpath of the commit probed (the real
    count_at and instructions.count; only valgrind is a stand-in). The third commit's fastpath does not import: it
    is reported as such. Before the fix, the child was started in this checkout with it first on PYTHONPATH, and
    imported this checkout's fastpath at every commit."""
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", "--no-hardlinks", str(bisect.REPO_ROOT), str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    init = repo / "fastpath" / "__init__.py"
    source, shas = init.read_text(), []
    for marker in ("one", "two", "broken"):
        init.write_text(source + (f"PLANTED = {marker!r}\n" if marker != "broken" else "PLANTED = (\n"))
        git(repo, "commit", "-q", "-am", f"plant {marker}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    tools, log = tmp_path / "bin", tmp_path / "imported.txt"
    tools.mkdir()
    (tools / "valgrind").write_text(FAKE_VALGRIND.format(log=log))
    (tools / "callgrind_control").write_text("#!/bin/sh\nexit 0\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{bisect.os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    for count_with in COUNT_WITH_ROWS:
        for sha, marker in zip(shas, ("one", "two")):
            log.unlink(missing_ok=True)
            count, why = bisect.count_at(repo, sha, "instructions", "auto-short-2", "lossless", work,
                                         count_with=count_with)
            assert count is None and "exited" in why, why  # the stand-in counts nothing
            imported, planted = log.read_text().split()
            assert (imported.startswith(str(work / sha[:12]) + "/fastpath/"), planted) == (True, marker), \
                (count_with, imported, planted)
        log.unlink(missing_ok=True)
        count, why = bisect.count_at(repo, shas[2], "instructions", "auto-short-2", "lossless", work,
                                     count_with=count_with)
        assert count is None and why.startswith("does not import: SyntaxError"), (count_with, why)
        assert shas[2][:12] in why and "/fastpath/__init__.py" in why, why  # the commit's file, not this checkout's
        assert not log.exists()


def test_the_search_logs_each_count_and_returns_every_probe_with_its_verdict(tmp_path):
    """Each commit counted is logged before (the point, the signal, the commit and its subject, how many so far)
    and after (its count and verdict against GOOD's); the result keeps the point, the signal, the floor and every
    probe in the order counted."""
    repo, shas = history(tmp_path, [100, 100, 120])
    lines = []
    result = bisect.bisect(repo, shas[0], shas[2], "auto-short-2", log=lines.append, counter=reads_the_file)
    assert (result.point, result.signal, result.floor, result.every) == ("auto-short-2", "structure", 0.0, False)
    assert [(p.commit, p.subject, p.count, p.verdict, p.why) for p in result.probes] == [
        (shas[0], "commit 0", 100, "same", ""), (shas[2], "commit 2", 120, "more", ""),
        (shas[1], "commit 1", 100, "same", "")]
    assert (result.good.commit, result.bad.commit) == (shas[0], shas[2])
    assert lines == [
        f"[bisect] counting auto-short-2/lossless (structure) at {shas[0][:12]} commit 0 (1 counted so far)",
        f"[bisect]   {shas[0][:12]}: 100 (same)",
        f"[bisect] counting auto-short-2/lossless (structure) at {shas[2][:12]} commit 2 (2 counted so far)",
        f"[bisect]   {shas[2][:12]}: 120 (more)",
        f"[bisect] counting auto-short-2/lossless (structure) at {shas[1][:12]} commit 1 (3 counted so far)",
        f"[bisect]   {shas[1][:12]}: 100 (same)"]


def test_a_commit_that_cannot_be_counted_is_logged_as_skipped_with_why(tmp_path):
    repo, shas = history(tmp_path, [1_000, None, 900])
    lines = []
    result = bisect.bisect(repo, shas[0], shas[2], "p", "instructions", log=lines.append, counter=reads_the_file)
    assert [(p.count, p.verdict, p.why) for p in result.probes] == [(1_000, "same", ""), (900, "less", ""),
                                                                     (None, "skipped", "does not build")]
    assert lines[-1] == f"[bisect]   {shas[1][:12]}: skipped: does not build" and lines[1].endswith(": 1,000 (same)")
    with pytest.raises(bisect.BisectError) as refused:
        bisect.bisect(repo, shas[0], shas[1], "p", log=lines.append, counter=reads_the_file)
    assert str(refused.value) == f"BAD {shas[1]} ({shas[1][:12]}) cannot be counted: does not build"
    with pytest.raises(bisect.BisectError) as refused:
        bisect.bisect(repo, shas[0], shas[2], "p", "wall", log=lines.append, counter=reads_the_file)
    assert str(refused.value) == "unknown signal 'wall': one of ('structure', 'instructions')"


def test_an_instruction_counts_floor_is_the_largest_stored_margin_of_its_point(tmp_path, monkeypatch):
    """The margin of the point under every stored key, the largest; the margins' own floor (0.1%) where none is
    stored or the file cannot be read. Exact counts have no floor."""
    (tmp_path / "baselines").mkdir()
    stored = tmp_path / "baselines" / "instructions.json"
    stored.write_text(json.dumps({"keys": {
        "a": {"counts": {"p/lossless": {"margin": 0.004}, "q/lossless": {"margin": 0.009}}},
        "b": {"counts": {"p/lossless": {"margin": 0.002}}}, "c": {"ratios": {}}}}))
    monkeypatch.setattr(bisect, "REPO_ROOT", tmp_path)
    assert bisect.floor_of("instructions", "p", "lossless") == 0.004
    assert bisect.floor_of("instructions", "p", "stock") == bisect.INSTRUCTIONS_FLOOR == 0.001
    assert bisect.floor_of("structure", "p", "lossless") == bisect.STRUCTURE_FLOOR == 0.0
    stored.write_text("{truncated")
    assert bisect.floor_of("instructions", "p", "lossless") == 0.001
    stored.write_text("[]")
    assert bisect.floor_of("instructions", "p", "lossless") == 0.001


def commits_with(tmp_path, rows: list) -> tuple:
    """A git repository of one commit per (count, message) row (count.txt = count); returns (repo, [sha, ...])."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = []
    for count, message in rows:
        (repo / "count.txt").write_text(str(count))
        git(repo, "add", "count.txt")
        git(repo, "commit", "-q", "--allow-empty", "--allow-empty-message", "-m", message)
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


class Clock:
    """time.perf_counter for bisect: it moves only while a commit is counted, by `seconds` a count."""

    def __init__(self, seconds: float):
        self.now, self.seconds = 0.0, seconds

    def perf_counter(self) -> float:
        return self.now

    def counter(self, *args):
        self.now += self.seconds
        return reads_the_file(*args)


def test_each_probe_keeps_its_whole_subject_and_its_seconds_to_a_tenth(tmp_path, monkeypatch):
    """The log line shows a subject's first 60 characters, the probe keeps it whole (a commit without a message: an
    empty subject) and the seconds its count took, to a tenth; the result says how many commits were counted in how
    many seconds, and its lines are those of the module's format, to the character."""
    long = "Unmask every position of the sentence in one pass, then refine the low-confidence ones"  # 86 characters
    repo, shas = commits_with(tmp_path, [(100, long), (100, "commit 1"), (120, "")])
    clock = Clock(2.26)
    monkeypatch.setattr(bisect, "time", clock)
    lines = []
    result = bisect.bisect(repo, shas[0], shas[2], "auto-short-2", log=lines.append, counter=clock.counter)
    assert [(p.subject, p.seconds) for p in result.probes] == [(long, 2.3), ("", 2.3), ("commit 1", 2.3)]
    assert lines[0] == f"[bisect] counting auto-short-2/lossless (structure) at {shas[0][:12]} {long[:60]} " \
                       "(1 counted so far)"
    assert lines[2] == f"[bisect] counting auto-short-2/lossless (structure) at {shas[2][:12]}  (2 counted so far)"
    text = bisect.format_result(result, "GOOD", "BAD")
    assert text.splitlines() == [
        "bisect GOOD..BAD, point auto-short-2 (structure: operator calls; a step is any change either way between "
        "neighbouring counted commits; halving)",
        f"  {shas[0][:12]}    same             100  (+0.000%)  {long[:70]}",
        f"  {shas[2][:12]}    more             120 (+20.000%)  ",
        f"  {shas[1][:12]}    same             100  (+0.000%)  commit 1",
        f"step: {shas[2]} ",
        f"  counts: 100 at {shas[1][:12]} -> 120 at {shas[2][:12]} (+20.000%, more work)",
        "3 commits counted, 7 s"], text


def test_halving_probes_the_middle_and_the_nearest_earlier_commit_when_the_middle_is_skipped(tmp_path):
    """Halving counts the middle commit of a segment ((lo + hi) // 2); when that one cannot be counted, the nearest
    commit not counted yet, the earlier of two as near. A step with a skipped commit before it lies in one of the
    two: both are named, and the exit status says it is not one commit."""
    repo, shas = history(tmp_path, [100, 100, 100, 100, 120, 120, 120, 120, 120])
    result = run(repo, shas)
    assert [p.commit for p in result.probes] == [shas[i] for i in (0, 8, 4, 2, 3)]
    assert [s.after.commit for s in result.steps] == [shas[4]] and result.steps[0].named
    (tmp_path / "s").mkdir()
    repo, shas = history(tmp_path / "s", [100, 100, 100, 100, None, 120, 120, 120, 120])
    result = run(repo, shas)
    assert [p.commit for p in result.probes] == [shas[i] for i in (0, 8, 4, 3, 5)]
    [step] = result.steps
    assert (step.before.commit, step.after.commit, step.drift) == (shas[3], shas[5], False)
    assert [p.commit for p in step.candidates] == [shas[4], shas[5]] and not step.named
    assert [p.commit for p in result.candidates] == [shas[4], shas[5]] and result.first_bad.commit == shas[5]
    text = bisect.format_result(result, "A", "B")
    assert (f"a step among skipped commits: 100 at {shas[3][:12]} -> 120 at {shas[5][:12]} (+20.000%, more work); "
            f"it lies in one of these: {shas[4][:12]} (skipped), {shas[5][:12]} (more)") in text.splitlines(), text


@pytest.mark.parametrize("counts, verdicts, steps", [
    pytest.param([100, 125], ["same", "same"], [], id="exactly at the floor above: not a step"),
    pytest.param([100, 126], ["same", "more"], [1], id="past the floor above"),
    pytest.param([100, 75], ["same", "same"], [], id="exactly at the floor below: not a step"),
    pytest.param([100, 74], ["same", "less"], [1], id="past the floor below"),
])
def test_a_step_is_a_count_past_the_floor_not_at_it(tmp_path, monkeypatch, counts, verdicts, steps):
    """With a stored margin of 25% (exact in binary), a count of exactly 125 or 75 against 100 is within the floor
    ("same"); one call further is a step, "more" or "less"."""
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "instructions.json").write_text(json.dumps(
        {"keys": {"a": {"counts": {"auto-short-2/lossless": {"margin": 0.25}}}}}))
    monkeypatch.setattr(bisect, "REPO_ROOT", tmp_path)
    repo, shas = history(tmp_path, counts)
    result = run(repo, shas, signal="instructions")
    assert result.floor == 0.25 and [p.verdict for p in result.probes] == verdicts
    assert [s.after.commit for s in result.steps] == [shas[k] for k in steps]
    assert "a step is more than 25.00% either way" in bisect.format_result(result, "A", "B")


def test_the_command_lines_progress_is_written_out_before_each_count_even_to_a_block_buffered_stderr(tmp_path,
                                                                                                      monkeypatch):
    """A count can take minutes (callgrind): the line saying which commit is being counted has left the process
    before the count starts, whatever buffering the stderr it was given has."""
    monkeypatch.setattr(bisect, "REPO_ROOT", tmp_path)
    repo, shas = history(tmp_path, [100, 120])
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    written = []

    def count_at(repo_, commit, signal, point, variant, work, **kw):
        written.append(f"at {commit[:12]} " in raw.getvalue().decode())
        return reads_the_file(repo_, commit, signal, point, variant, work)

    monkeypatch.setattr(bisect, "count_at", count_at)
    assert bisect.main([shas[0], shas[1], "--point", "auto-short-2", "--repo", str(repo)]) == 1
    assert written == [True, True]


def test_the_command_line_counts_the_point_signal_and_variant_it_is_given(tmp_path, monkeypatch, capsys):
    """Each commit is counted at the --point, --signal and --variant given, by the --count-with method; --every
    counts every commit; the log goes to stderr, the result to stdout. A bad range is an error naming the fix, exit 2."""
    monkeypatch.setattr(bisect, "REPO_ROOT", tmp_path)  # no stored margins: the instruction floor is 0.1%
    repo, shas = history(tmp_path, [1_000_000, 1_000_000, 1_002_000])
    asked = []

    def count_at(repo_, commit, signal, point, variant, work, **kw):
        asked.append((commit, signal, point, variant, kw))
        return reads_the_file(repo_, commit, signal, point, variant, work)

    monkeypatch.setattr(bisect, "count_at", count_at)
    assert bisect.main([shas[0], shas[2], "--point", "auto-short-10", "--signal", "instructions", "--variant",
                        "stock", "--repo", str(repo), "--count-with", "this", "--every"]) == 1
    assert asked == [(sha, "instructions", "auto-short-10", "stock", {"count_with": "this"})
                     for sha in (shas[0], shas[2], shas[1])]
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == (f"bisect {shas[0]}..{shas[2]}, point auto-short-10 (instructions: instructions; a "
                                   "step is more than 0.10% either way between neighbouring counted commits; every "
                                   "commit counted)"), out
    assert f"step: {shas[2]} commit 2" in out.splitlines()
    assert err.splitlines()[:2] == [
        f"[bisect] counting auto-short-10/stock (instructions) at {shas[0][:12]} commit 0 (1 counted so far)",
        f"[bisect]   {shas[0][:12]}: 1,000,000 (same)"], err
    assert bisect.main([shas[2], shas[0], "--point", "auto-short-10", "--repo", str(repo)]) == 2
    assert capsys.readouterr() == ("", f"error: {shas[2]} is not an ancestor of {shas[0]}: give GOOD before BAD on "
                                       "one line of history\n")
