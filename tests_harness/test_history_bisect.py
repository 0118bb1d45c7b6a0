"""`fastpath-suite nightly bisect` on a real history: a copy of this repository with a commit that adds work to the
unmasking loop, among commits that add none and one that does not import, each counted by its own code
(harness.nightly.bisect; the search itself on small histories: tests_speed/test_bisect.py)."""

from __future__ import annotations

import subprocess

import pytest

from harness import REPO_ROOT
from harness.nightly import bisect
from harness.counts import calls


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


STEP_LINE = "        unmask(model, tokens, logits, [s[step] for s in schedules], t_lens, offsets, gen_config, layer_ids)\n"


@pytest.mark.slow  # six counts by six commits' own code, each a fresh interpreter: about a minute here
@pytest.mark.control
def test_bisect_finds_the_commit_that_adds_work_to_the_loop(tmp_path):
    """A copy of this repository with five commits: a comment, a commit that does not import, its fix, one that adds
    an operator call to every unmasking step, a comment again. bisect over them, counted for real (structure),
    names the fourth, the counts on both sides, and the one it skipped."""
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", "--no-hardlinks", str(REPO_ROOT), str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    loop = repo / "fastpath" / "loop.py"
    source = loop.read_text()
    assert source.count(STEP_LINE) == 1, "the unmasking step's line moved: update STEP_LINE"
    edits = [
        ("a comment", source.replace(STEP_LINE, STEP_LINE + "        # one step done\n")),
        ("does not import", source.replace(STEP_LINE, STEP_LINE + "        (\n")),
        ("fixed", source.replace(STEP_LINE, STEP_LINE + "        # one step done\n")),
        ("work added to the loop", source.replace(STEP_LINE, STEP_LINE + "        tokens.add_(0)\n")),
        ("a comment again", source.replace(STEP_LINE, STEP_LINE + "        tokens.add_(0)  # on purpose\n")),
    ]
    base = git(repo, "rev-parse", "HEAD")
    shas = []
    for subject, text in edits:
        loop.write_text(text)
        git(repo, "commit", "-q", "-am", subject)
        shas.append(git(repo, "rev-parse", "HEAD"))
    result = bisect.bisect(repo, base, shas[-1], "auto-short-2", "structure", log=lambda msg: None)
    text = bisect.format_result(result, base[:12], shas[-1][:12])
    assert result.step and not result.candidates, text
    assert result.first_bad.commit == shas[3], text
    steps = calls.point_named("auto-short-2").num_step
    assert result.first_bad.count == result.good.count + steps, text  # one operator call more a step
    assert [p.commit for p in result.probes if p.verdict == "skipped"] == [shas[1]], text
    assert "does not import" in text
