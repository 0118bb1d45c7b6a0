"""`fastpath-suite nightly alert`: a flagged night reaches a person (harness.nightly.alert).

Each test runs the real check (`nightly check --out`) over a history of exact counts whose nights ran at the commits
of a small git repository (each commit's count read from its own file, so bisect's answer is known), then the alert
against a stand-in `gh` (tests_speed/gh_standin.py) that keeps a small forge and records every call. The nightly
workflow's own alert step runs the same way, in bash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import REPO_ROOT
from harness.nightly import alert
from harness.nightly.history import History, Night, accept, night_id, save_history, split_key
from harness.nightly.history import main as history_main
from tests_speed.test_bisect import git, history

POINT = "auto-short-2/lossless"
KEY = "cpu-test-avx2-2c-2t__torch-2.14.1__omnivoice-0.2.1"
PAGE = "https://github.com/example/fastpath/actions/runs/7/artifacts/9"
RUN = "https://github.com/example/fastpath/actions/runs/7"
STANDIN = Path(__file__).with_name("gh_standin.py")


@pytest.fixture
def repo(tmp_path):
    """Commit k writes count.txt = the k-th count: the work rose at commit 3 and a revert at commit 6 undid it."""
    return history(tmp_path, [100, 100, 100, 104, 104, 104, 100])


class Counter:
    """bisect's counter: each commit's count read from its own file; the commits it was asked for, recorded."""

    def __init__(self):
        self.asked = []

    def __call__(self, repo, commit, signal, point, variant, work):
        self.asked.append(commit)
        return int(git(repo, "show", f"{commit}:count.txt")), ""


class Nightly:
    """A history of exact counts, one night appended at a time, checked and alerted on as the workflow does."""

    def __init__(self, tmp_path, repo):
        self.tmp, (self.repo, self.shas) = tmp_path, repo
        self.path = tmp_path / "history" / "history-cpu-structure.json"
        self.path.parent.mkdir()
        self.nights = []
        self.forge = tmp_path / "forge"
        self.forge.mkdir()
        self.gh = tmp_path / "gh"
        self.gh.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "{self.forge}" "$@"\n')
        self.gh.chmod(0o755)
        self.counter = Counter()

    def night(self, commit: int, ops: float) -> str:
        date = f"2026-12-{len(self.nights) + 1:02d}T03:17:00Z"
        points = {POINT: {"metric": "ops", "samples": [float(ops)], "extra": {}}}
        sha = self.shas[commit]
        self.nights.append(Night(id=night_id(date, sha, points), date=date, commit=sha, command="nightly",
                                 machine={"device_key": KEY}, points=points, versions=split_key(KEY)[1]))
        save_history(History(machine_key=split_key(KEY)[0], nights=list(self.nights), accepted=self.accepted()),
                     self.path)
        return self.nights[-1].id

    def accepted(self) -> list:
        return json.loads(self.path.read_text())["accepted"] if self.path.exists() else []

    def check(self) -> int:
        return history_main(["check", str(self.path), "--out", str(self.tmp / "out" / "history")])

    def alert(self, *extra) -> int:
        return alert.main([str(self.tmp / "out" / "history" / "alarms.json"), str(self.path), "--gh", str(self.gh), "--page",
                           PAGE, "--run-url", RUN, "--repo", str(self.repo), *extra], counter=self.counter)

    def calls(self) -> list:
        path = self.forge / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def issues(self) -> list:
        return json.loads((self.forge / "forge.json").read_text())["issues"]


def verbs(calls) -> list:
    return [" ".join(c["argv"][:2]) for c in calls]


@pytest.fixture
def nightly(tmp_path, repo):
    return Nightly(tmp_path, repo)


def flag(nightly) -> str:
    """Three nights at the old count (commits 0, 1, 1), then the night that ran commit 5: the work rose in 2..5."""
    for commit in (0, 1, 1):
        nightly.night(commit, 100)
    began = nightly.night(5, 104)
    assert nightly.check() == 1
    return began


def test_a_flagged_night_files_one_issue_with_its_range_the_commit_bisect_found_and_the_page(nightly, capsys):
    began = flag(nightly)
    assert nightly.alert() == 0, capsys.readouterr().err
    calls = nightly.calls()
    assert verbs(calls) == ["issue list", "label create", "issue create"], verbs(calls)
    create = calls[-1]
    title, text = create["argv"][create["argv"].index("--title") + 1], create["stdin"]
    assert title == f"nightly: {POINT} more work by +4.0% since 2026-12-04 (exact counts, history-cpu-structure)", title
    shas = nightly.shas
    assert f"`{shas[1][:12]}..{shas[5][:12]}`" in text, text  # the last good night's commit to the flagged one's
    assert f"Bisect found: `{shas[3]}` commit 3 (100 -> 104, +4.000%)" in text, text
    assert PAGE in text and RUN in text and began in text, text
    assert f"nightly accept {nightly.path} {POINT} --night {began}" in text, text
    assert f"<!-- nightly-alert-key: history-cpu-structure.json|{POINT}|slower|{began} -->" in text
    assert [i["state"] for i in nightly.issues()] == ["open"]
    assert "filed https://github.com/example/fastpath/issues/1" in capsys.readouterr().out


def test_a_second_flagged_night_of_the_same_change_comments_and_bisects_nothing(nightly):
    flag(nightly)
    assert nightly.alert() == 0
    bisected = list(nightly.counter.asked)
    nightly.night(5, 104)
    assert nightly.check() == 1
    before = len(nightly.calls())
    assert nightly.alert() == 0
    assert verbs(nightly.calls()[before:]) == ["issue list", "issue comment"]
    assert nightly.calls()[-1]["argv"][2] == "1"
    assert nightly.counter.asked == bisected, "the change was bisected once, when it was filed"
    [issue] = nightly.issues()
    assert issue["state"] == "open" and "Still open on the night" in issue["comments"][0], issue


def test_a_fixed_change_closes_its_issue_naming_the_night_it_was_fixed(nightly):
    flag(nightly)
    assert nightly.alert() == 0
    fixed = nightly.night(6, 100)  # the revert: the counts are back where they were
    assert nightly.check() == 0
    before = len(nightly.calls())
    assert nightly.alert() == 0
    close = nightly.calls()[before:]
    assert verbs(close) == ["issue list", "issue close"], verbs(close)
    argv = close[-1]["argv"]
    assert argv[2] == "1" and argv[argv.index("--reason") + 1] == "completed", argv
    assert f"Fixed: the rule found {POINT} back at its old level (100) on the night `{fixed}`" in argv[-1], argv
    assert [i["state"] for i in nightly.issues()] == ["closed"]


def test_an_accepted_change_closes_its_issue_with_the_reason(nightly):
    began = flag(nightly)
    assert nightly.alert() == 0
    accept(nightly.path, POINT, began, "a planned change: one more norm")
    assert nightly.check() == 0
    before = len(nightly.calls())
    assert nightly.alert() == 0
    argv = nightly.calls()[-1]["argv"]
    assert verbs(nightly.calls()[before:]) == ["issue list", "issue close"]
    assert argv[argv.index("--reason") + 1] == "not planned" and "a planned change: one more norm" in argv[-1], argv


def test_a_failing_forge_client_fails_the_step_naming_the_call(nightly, capsys):
    flag(nightly)
    (nightly.forge / "fail").touch()
    assert nightly.alert() == 2
    err = capsys.readouterr().err
    assert "issue list" in err and "failed (exit 1)" in err and "Bad credentials" in err, err
    assert "did not reach it whole" in err


def test_a_client_that_cannot_be_run_is_named_with_the_fix(nightly, capsys):
    flag(nightly)
    nightly.gh = nightly.tmp / "no-such-gh"
    assert nightly.alert() == 2
    assert "not found: install GitHub's command-line client" in capsys.readouterr().err


def test_a_check_that_wrote_no_verdict_is_an_error_not_a_quiet_pass(nightly, capsys):
    nightly.night(0, 100)
    assert nightly.alert() == 2
    assert "the check did not write its verdict" in capsys.readouterr().err
    assert nightly.calls() == []


def test_an_issue_of_a_history_not_judged_here_is_left_open(nightly):
    """Each runner alerts on its own histories: the GPU runner's open issue is not closed by the CPU runner's night."""
    (nightly.forge / "forge.json").write_text(json.dumps({"labels": ["nightly-alert"], "issues": [{
        "number": 1, "title": "nightly: p slower", "labels": ["nightly-alert"], "state": "open", "url": "u",
        "comments": [], "body": "x\n<!-- nightly-alert-key: history-cuda-wall.json|p|slower|abc -->"}]}))
    for commit in (0, 1):
        nightly.night(commit, 100)
    assert nightly.check() == 0
    assert nightly.alert() == 0
    assert verbs(nightly.calls()) == ["issue list"]


def test_the_plan_files_comments_and_closes_by_key():
    change = alert.Change("history/h.json", "p", "ops", "slower", "n1", {})
    other = alert.Change("history/h.json", "q", "ops", "slower", "n2", {})
    issues = [alert.Issue(7, "p", change.key), alert.Issue(8, "gone", "h.json|r|slower|n0"),
              alert.Issue(9, "cuda", "g.json|p|slower|n1"), alert.Issue(10, "by hand", None)]
    actions = [(a, c.point if c else None, i.number if i else None)
               for a, c, i in alert.plan([change, other], issues, {"h.json"})]
    assert actions == [("comment", "p", 7), ("create", "q", None), ("close", None, 8)], actions


# --- the nightly workflow's step ------------------------------------------------------------------------------


def workflow_steps() -> tuple:
    """(the nightly workflow, its speed job's steps, the step that runs the alert)."""
    spec = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    steps = spec["jobs"]["speed"]["steps"]
    step = next((s for s in steps if "fastpath-suite nightly alert" in s.get("run", "")), None)
    assert step is not None, "nightly.yml's speed job has no step that runs `fastpath-suite nightly alert`"
    return spec, steps, step


def test_the_nightly_alerts_after_the_check_and_the_upload_with_a_token_that_may_write_issues():
    spec, steps, step = workflow_steps()
    names = [s.get("name") for s in steps]
    assert names.index("Changes over the histories") < names.index("Upload results, the histories and their page") \
        < steps.index(step), names
    assert spec["permissions"]["issues"] == "write"
    assert step["env"]["GH_TOKEN"] == "${{ github.token }}" and "steps.upload.outputs.artifact-url" in step["env"]["PAGE"]
    assert "steps.check.outcome == 'failure'" in step["if"] and "always()" in step["if"], step["if"]
    assert steps[0]["uses"].startswith("actions/checkout@") and steps[0]["with"]["fetch-depth"] == 0


def test_the_workflows_alert_step_files_an_issue_on_a_flagged_night(nightly):
    """The step's own script, in bash as the runner runs it, with `.venv/bin/fastpath-suite` running this checkout's
    harness and the stand-in gh: one issue, with the page the upload step linked."""
    flag(nightly)
    _, _, step = workflow_steps()
    bin_ = nightly.tmp / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "fastpath-suite").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m harness "$@"\n')
    (bin_ / "fastpath-suite").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SIGNALS": "wall instructions structure",
           "HISTORY": "history-cpu", "PAGE": PAGE, "FASTPATH_GH": str(nightly.gh), "GH_TOKEN": "t"}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=nightly.tmp,
                          env=env, capture_output=True, text=True, timeout=600)  # a hang guard
    # the step bisects the checkout it runs in: here a folder without the nights' commits, which the issue says
    assert done.returncode == 0, done.stdout + done.stderr
    assert verbs(nightly.calls()) == ["issue list", "label create", "issue create"]
    text = nightly.calls()[-1]["stdin"]
    assert PAGE in text and "could not search the range" in text, text
