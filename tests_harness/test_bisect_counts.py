"""`fastpath-suite nightly bisect --count-with this --signal instructions` on a real history, with real counts: a copy
of this repository where one commit adds a matrix product to every unmasking step of the lossless loop, between a
commit before it and one after it that add no work. Each probe is counted by valgrind (harness.counts.instructions)
driving that commit's fastpath/, and the child refuses a count of any other fastpath; bisect must name the commit
that added the work. (The search itself on small histories, and that each probe's child imports its own commit's
fastpath, cheaply: tests_speed/test_bisect.py.)"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from harness import REPO_ROOT
from harness.nightly import bisect

STEP_LINE = "        unmask(model, tokens, logits, [s[step] for s in schedules], t_lens, offsets, gen_config, layer_ids)\n"
# 256 x 256 x 256 multiply-adds a step (2 steps at the point): 28 M instructions more, +11% of the point's 251 M
# (measured), 100 x its 0.1% margin; the result is dropped, so the generation is unchanged (the stack stays lossless).
WORK = "        torch.mm(torch.ones(256, 256), torch.ones(256, 256))\n"


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


# four valgrind counts of the tiny points (importing torch under valgrind): 7-9 minutes on a 2-core machine, so it
# runs in the nightly slow job, not in CI's controls stage (test_history_bisect.py is bisect's check there)
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="valgrind with callgrind_control is not on PATH: apt-get install valgrind "
                           "(scripts/install.sh does)")
def test_bisect_with_real_instruction_counts_names_the_commit_that_adds_work(tmp_path):
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", "--no-hardlinks", str(REPO_ROOT), str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    loop = repo / "fastpath" / "loop.py"
    source = loop.read_text()
    assert source.count(STEP_LINE) == 1, "the unmasking step's line moved: update STEP_LINE"
    edits = [("a comment before", source.replace(STEP_LINE, STEP_LINE + "        # one step done\n")),
             ("a matrix product a step", source.replace(STEP_LINE, STEP_LINE + WORK)),
             ("a comment after", source.replace(STEP_LINE, STEP_LINE + WORK.rstrip("\n") + "  # on purpose\n"))]
    good, shas = git(repo, "rev-parse", "HEAD"), []
    for subject, text in edits:
        loop.write_text(text)
        git(repo, "commit", "-q", "-am", subject)
        shas.append(git(repo, "rev-parse", "HEAD"))
    started = time.perf_counter()
    result = bisect.bisect(repo, good, shas[-1], "auto-short-2", "instructions", "lossless", log=print,
                           counter=lambda *a: bisect.count_at(*a, count_with="this"))
    text = bisect.format_result(result, good[:12], shas[-1][:12])
    print(text, f"\n{time.perf_counter() - started:.0f} s", sep="")
    assert not [p for p in result.probes if p.count is None], text  # every probe counted
    assert [s.after.commit for s in result.steps] == [shas[1]] and result.steps[0].named, text
    step = result.steps[0]
    assert step.before.commit == shas[0] and 0.01 < step.change < 0.2, text  # the planted work, beyond the margin
    assert len(result.probes) == 4, text  # GOOD, BAD, then halving: the commit before, the step
