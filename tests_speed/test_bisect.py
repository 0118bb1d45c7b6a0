"""`fastpath-suite nightly bisect`: from a flagged night to its commit (harness.nightly.bisect).

The search is shown on small git histories with a stand-in counter (each commit's count read from the commit's own
file, so the answer is known), and, in the controls stage, on a copy of this repository with a commit that adds
work to the unmasking loop, counted for real by each commit's own code
(tests_harness/test_history_bisect.py: the controls stage does not run tests_speed)."""

from __future__ import annotations

import subprocess

import pytest

from harness.nightly import bisect


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def history(tmp_path, counts: list) -> tuple:
    """A git repository whose commit k writes count.txt = counts[k] (None: a commit whose count cannot be made);
    returns (repo, [sha of each commit])."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = []
    for k, n in enumerate(counts):
        (repo / "count.txt").write_text("broken" if n is None else str(n))
        git(repo, "add", "count.txt")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {k}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


def reads_the_file(repo, commit, signal, point, variant, work):
    text = git(repo, "show", f"{commit}:count.txt")
    return (None, "does not build") if text == "broken" else (int(text), "")


def run(repo, shas, good=0, bad=-1, signal="structure"):
    return bisect.bisect(repo, shas[good], shas[bad], "auto-short-2", signal, log=lambda msg: None,
                         counter=reads_the_file)


@pytest.mark.parametrize("counts, step", [
    pytest.param([100, 100, 100, 120, 120, 120, 120, 120], 3, id="a step in the middle"),
    pytest.param([100, 120], 1, id="the one commit"),
    pytest.param([100, 100, 100, 100, 100, 100, 100, 101], 7, id="the last commit, by one call"),
    pytest.param([100, 99, 100, None, 100, 130, 130], 5, id="a commit that does not build, passed over"),
    pytest.param([100, 100, 100, 90, 90, 90], 3, id="less work: a fall, which the count check fails too"),
    pytest.param([100, 120, 100, 80, 80], 3, id="BAD fell: a rise on the way is not its step"),
])
def test_bisect_finds_the_first_commit_past_the_floor(tmp_path, counts, step):
    repo, shas = history(tmp_path, counts)
    result = run(repo, shas)
    assert result.step and not result.candidates
    assert result.first_bad.commit == shas[step], bisect.format_result(result, "GOOD", "BAD")
    assert (result.good.count, result.first_bad.count) == (counts[step - 1], counts[step])
    assert len(result.probes) <= 2 + (len(counts) - 2).bit_length() + counts.count(None)  # halving, not a scan
    text = bisect.format_result(result, "GOOD", "BAD")
    assert f"first bad commit: {shas[step]} commit {step}" in text, text


def test_a_commit_that_does_not_build_is_skipped_and_named(tmp_path):
    repo, shas = history(tmp_path, [100, 100, None, 100, 100, 140])
    result = run(repo, shas)
    assert result.first_bad.commit == shas[5]
    [skipped] = [p for p in result.probes if p.verdict == "skipped"]
    assert skipped.commit == shas[2]
    assert f"skipped (could not be counted): {shas[2][:12]} (does not build)" in bisect.format_result(result, "A", "B")


def test_a_step_hidden_among_skipped_commits_names_them_all(tmp_path):
    repo, shas = history(tmp_path, [100, None, 130])
    result = run(repo, shas)
    assert [p.commit for p in result.candidates] == [shas[1], shas[2]]
    assert "the step lies in one of these" in bisect.format_result(result, "A", "B")


def test_a_range_with_no_step_says_so(tmp_path):
    repo, shas = history(tmp_path, [100, 130, 100, 100])  # a rise that went away again: BAD is not past the floor
    result = run(repo, shas)
    assert not result.step and result.first_bad is None
    assert "no step in the range: BAD counts 100 against GOOD's 100" in bisect.format_result(result, "A", "B")


def test_instruction_counts_use_the_points_stored_margin_as_the_floor(tmp_path):
    floor = bisect.floor_of("instructions", "auto-short-2", "lossless")
    assert 0 < floor < 0.01
    repo, shas = history(tmp_path, [1_000_000, int(1_000_000 * (1 + floor / 2)), int(1_000_000 * (1 + 2 * floor))])
    result = run(repo, shas, signal="instructions")
    assert result.first_bad.commit == shas[2]  # the wobble below the margin is not a step
    assert bisect.floor_of("structure", "auto-short-2", "lossless") == 0


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


def test_a_flagged_night_of_a_count_history_prints_its_bisect_command(tmp_path, capsys):
    from harness.nightly.history import History, Night, main, night_id, save_history

    def night(day: int, ops: float) -> Night:
        points = {"auto-short-2/lossless": {"metric": "ops", "samples": [ops], "extra": {"bytes": 4096, "flops": 10}}}
        date = f"2026-11-{day:02d}T03:17:00+00:00"
        return Night(id=night_id(date, f"{day:040x}", points), date=date, commit=f"{day:040x}", command="test",
                     machine={"cpu_model": "Test CPU"}, points=points)

    path = tmp_path / "structure.json"
    save_history(History(device_key="cpu-test", nights=[night(1, 100.0), night(2, 100.0), night(3, 120.0)], path=path),
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
