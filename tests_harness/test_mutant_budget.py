"""The measure behind CI's mutants stage (harness.audit.mutant_budget): each recent change's lines as HEAD still has
them, replayed so that CI's own stage judges exactly those lines, and the figures of the stage's runs."""

from __future__ import annotations

import subprocess

import pytest

from harness.audit import mutant_budget, mutant_rooms, mutants

PATH = "fastpath/registry.py"  # a file of the scope: recent_changes reads only those


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def commit(repo, lines, message):
    (repo / PATH).write_text("\n".join(lines) + "\n")
    git(repo, "add", PATH)
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path):
    """A history of four changes on main: A writes five lines, B rewrites lines 2 and 3, C rewrites line 3 again, and
    a merge brings a branch's commit E that rewrote line 5 (the branch starts at C)."""
    repo = tmp_path / "repo"
    (repo / "fastpath").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    lines = [f"line {i}" for i in range(1, 6)]
    a = commit(repo, lines, "A")
    b = commit(repo, lines[:1] + ["two by B", "three by B"] + lines[3:], "B")
    c = commit(repo, lines[:1] + ["two by B", "three by C"] + lines[3:], "C")
    git(repo, "checkout", "-q", "-b", "side")
    e = commit(repo, lines[:1] + ["two by B", "three by C", "line 4", "five by E"], "E")
    git(repo, "checkout", "-q", "main")
    (repo / "other.txt").write_text("not in the scope\n")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-qm", "outside the scope")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = git(repo, "rev-parse", "HEAD")
    return repo, {"A": a, "B": b, "C": c, "E": e, "merge": merge}


def test_each_change_is_the_lines_head_still_blames_on_it_a_merge_those_of_what_it_brought(history):
    repo, ids = history
    changes = mutant_budget.recent_changes(10, repo)
    # newest first, the change outside the scope left out; A, the root, has no parent to diff against
    assert [c for c, _ in changes] == [ids["merge"], ids["C"], ids["B"]]
    assert all(files == [PATH] for _, files in changes)
    blamed = {c: mutant_budget.blamed_lines(c, files, repo) for c, files in changes}
    assert blamed[ids["merge"]] == {PATH: {5}}  # E's line, brought in by the merge
    assert blamed[ids["C"]] == {PATH: {3}}
    assert blamed[ids["B"]] == {PATH: {2}}  # its line 3 is C's now
    assert mutant_budget.blamed_lines(ids["B"], ["fastpath/gone.py"], repo) == {}
    # read at a given commit, whatever the checkout holds now: at C, the merge is not there yet
    assert [c for c, _ in mutant_budget.recent_changes(10, repo, ids["C"])] == [ids["C"], ids["B"]]
    assert mutant_budget.blamed_lines(ids["B"], [PATH], repo, ids["B"]) == {PATH: {2, 3}}


def test_a_replayed_change_is_exactly_its_lines_to_the_stages_diff(history, tmp_path):
    repo, ids = history
    clone, side = mutant_budget.replay(repo, {PATH: {2, 5}}, tmp_path / "replay")
    assert git(clone, "rev-parse", "HEAD") == ids["merge"]  # the stage judges HEAD's code, unmarked
    assert (clone / PATH).read_text() == (repo / PATH).read_text()
    assert mutants.changed_lines(side, clone) == {PATH: {2, 5}}
    assert git(repo, "branch", "--list", "replay") == ""  # the source checkout is left as it was
    # a commit given: the clone holds that commit's code, the marks on its lines
    clone, side = mutant_budget.replay(repo, {PATH: {3}}, tmp_path / "at-c", ids["C"])
    assert git(clone, "rev-parse", "HEAD") == ids["C"] and mutants.changed_lines(side, clone) == {PATH: {3}}


def test_the_stage_measured_is_the_one_ci_runs(tmp_path):
    stage = mutant_budget.ci_stage()
    line = f"--changed-since auto --max-mutants {stage['max_mutants']} --budget {stage['budget']}"
    assert line in mutant_budget.CI.read_text()
    # sizing another cap: the one given replaces CI's, the budget stays CI's
    assert mutant_budget.ci_stage(max_mutants=70) == {"max_mutants": 70, "budget": stage["budget"]}
    moved = tmp_path / "run"
    moved.write_text(".venv/bin/fastpath-suite audit mutants --changed-since auto\n")  # the cap and budget gone
    with pytest.raises(mutant_budget.BudgetError, match=r"no line .* \(CI's mutants stage\) to measure"):
        mutant_budget.ci_stage(moved)


def row(i, total, seconds, exit_code, not_judged=0):
    return {"commit": f"{i:040x}", "subject": "s|t", "files": [], "lines": 3, "mutants": {"gate": total},
            "total": total, "seconds": seconds, "exit": exit_code, "killed": total - not_judged, "survived": 0,
            "not_judged": not_judged}


def test_the_summary_counts_the_changes_over_the_cap_and_those_the_stage_did_not_fit():
    stage = {"max_mutants": 40, "budget": 1200}
    rows = [row(i, i * 10, 100.0 * i, 3 if i * 10 > 40 else 0, max(0, i * 10 - 40)) for i in range(1, 11)]
    # a change past the cap whose run found a survivor exits 1 (CI names the survivor first): it did not fit either
    rows[5] = {**rows[5], "exit": 1, "survived": 1}
    figures = mutant_budget.summary(rows, stage, measured=True)
    assert (figures["mutants_median"], figures["mutants_p90"], figures["mutants_max"]) == (55.0, 90, 100)
    assert figures["over_cap"] == 6 and figures["not_fitting"] == 6
    assert (figures["seconds_p90"], figures["seconds_max"]) == (900.0, 1000.0)
    text = mutant_budget.render_results(figures)
    assert "6 over CI's cap of 40" in text and "6 of 10 did not fit" in text and \
        "| gate 30 | 30 | 5:00 | 30 | 0 | 0 | passed |" in text and "| 60 | 10:00 | 40 | 1 | 20 | survivor |" in text \
        and "| s/t |" in text
    counted = mutant_budget.summary([dict(r, seconds=None, exit=None) for r in rows], stage, measured=False)
    assert "no stage ran, so no times" in mutant_budget.render_results(counted)
    assert counted["seconds_p90"] is None and counted["not_fitting"] is None


def test_every_room_has_a_selection_of_its_own():
    for room in mutant_rooms.ROOMS:
        selection = mutant_rooms.selection(room)
        assert selection[: len(room.tests)] == room.tests
        assert all(s.startswith("--deselect=") for s in selection[len(room.tests):])


def test_within_the_cap_the_stage_runs_only_on_the_changes_ci_could_pass(monkeypatch, capsys):
    """--within-cap: every change counted, the stage run on those within the cap only; one past it is shown as not
    run and counted as not fitting (CI fails it as not judged)."""
    changes = [("a" * 40, [PATH]), ("b" * 40, [PATH]), ("c" * 40, [PATH])]
    monkeypatch.setattr(mutant_budget, "recent_changes", lambda n, source, head: changes)
    monkeypatch.setattr(mutant_budget, "blamed_lines", lambda commit, files, source, head: {PATH: {1}})
    monkeypatch.setattr(mutant_budget, "git", lambda *args, cwd=None: "h" * 40 if args[0] == "rev-parse" else "s")
    monkeypatch.setattr(mutant_budget, "count", lambda source, lines, folder, head: [{"gate": 5}, {"gate": 90},
                                                                                    {"nightly": 70}])
    ran = []

    def run_stage(source, lines, folder, stage, head):
        ran.append(folder.name)
        return {"seconds": 60.0, "exit": 0, "mutants": {"gate": 5}, "killed": 5, "survived": 0, "not_judged": 0}

    monkeypatch.setattr(mutant_budget, "run_stage", run_stage)
    assert mutant_budget.main(["--within-cap", "--max-mutants", "70", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ran == ["change-1", "change-2"], ran  # the first and the third change: 5 and 70 mutants
    assert "| gate 90 | 90 | not run: over the cap |" in out and "1 of 3 did not fit" in out, out
