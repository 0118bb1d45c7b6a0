"""Results as data: docs/results.md is exactly what `fastpath-suite maintain results` renders from results/, and a file
that is not a results file is refused with its path and the fix."""

from __future__ import annotations

import json

import pytest

from harness.__main__ import hand_renderers
from harness.run import results


@pytest.fixture(scope="module", autouse=True)
def renderers():
    """Every room's renderers, handed over as `fastpath-suite maintain results` hands them (the bottom room imports
    none of the rooms above it)."""
    hand_renderers()


def test_docs_results_md_is_the_rendering_of_the_results_files():
    rendered = results.render()
    page = results.RESULTS_PAGE.read_text() if results.RESULTS_PAGE.exists() else ""
    assert page == rendered, ("docs/results.md is not what the results files render (a number typed by hand, or a "
                              "results file added without rendering): run `fastpath-suite maintain results` and commit the page")


@pytest.mark.parametrize("name", list(results.BLOCKS))
def test_every_rendered_block_of_the_docs_is_the_rendering_of_its_files(name):
    page = results.ROOT / "docs" / results.BLOCKS[name]
    text = page.read_text()
    assert text == results.render_block(name, text), (f"docs/{page.name}'s block {name!r} is not what its files render "
                                                      "(a figure typed by hand): run `fastpath-suite maintain results`")


def test_a_block_edited_by_hand_or_without_its_marks_is_refused(tmp_path):
    marks = "\n\n".join("\n".join(results.block_marks(name)) for name, page in results.BLOCKS.items()
                         if page == "gpu.md")  # every block of the page, each between its two marks
    page = tmp_path / "gpu.md"
    page.write_text(f"# GPU\n\n{marks}\n\nafter\n")
    args = ["--dir", str(tmp_path / "results"), "--page", str(tmp_path / "results.md"), "--docs", str(tmp_path)]
    assert results.main(args) == 0 and "| target | goal |" in page.read_text() and page.read_text().endswith("after\n")
    assert results.main(["--check", *args]) == 0
    page.write_text(page.read_text().replace("| 3.5x |", "| 3.6x |"))
    assert results.main(["--check", *args]) == 1
    page.write_text("# GPU without the marks\n")
    assert results.main(args) == 2


@pytest.mark.parametrize("kind", list(results.KINDS) + list(results.BLOCKS))
def test_every_kind_and_block_has_a_renderer(kind):
    assert callable(results.renderer(kind)), kind


def test_every_renderer_handed_over_is_of_a_kind_or_block_the_pages_show():
    """A room that hands over a name the page does not list (a typo, a kind never added to KINDS) would render
    nothing: refused here."""
    handed = [name for renderers in results.HANDED for name in (renderers() if callable(renderers) else renderers)]
    unknown = sorted(set(handed) - set(results.KINDS) - set(results.BLOCKS))
    assert not unknown and len(handed) == len(set(handed)), (unknown, sorted(handed))


def test_a_kind_no_room_handed_over_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setattr(results, "HANDED", [])
    with pytest.raises(results.ResultsError, match="no renderer handed over for 'grid'.*maintain results"):
        results.renderer("grid")


STABILITY = {"rule": {"max_ratio_spread": 0.2, "min_rounds": 3},
             "setup": {"size": "tiny", "point": "auto-short-10", "steps": 2, "rounds": 4, "width": 3,
                       "period_s": [1.0, 2.0], "processes": 2},
             "reference_ratio": 1.0,
             "conditions": {"quiet": {"windows": [[0.05, 1.0], [0.1, 1.02]], "unstable_share": 0.0,
                                      "stable_but_off_share": 0.0, "windows_count": 2}}}


def test_a_recorded_file_renders_with_its_machine_commit_date_and_command(tmp_path):
    path = results.record("stability", STABILITY, tmp_path, command="fastpath-suite audit stability --rounds 4")
    data = results.load(path)
    assert path.parent.name == "stability" and path.stem == data["machine_key"]
    page = results.render(tmp_path)
    assert f"### {data['machine_summary']}" in page
    assert f"at commit `{(data['commit'] or 'unknown')[:12]}" in page and data["date"][:10] in page
    assert "`fastpath-suite audit stability --rounds 4`" in page and "| quiet | 2 | 0% (0/2) | 0% (0/2) | 0.08, 0.10 | 1.01 |" in page, page
    assert "No results file yet: `fastpath-suite report --results results/` writes one." in page


def test_a_long_run_records_the_checkout_as_it_began(tmp_path):
    """A command that copies the checkout first (mutants) names that copy's commit and state, not the checkout's
    when it ends; checkout_state reads whichever checkout it is given."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                                  "-m", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "a.txt").write_text("x")
    subprocess.run(["git", "add", "a.txt"], cwd=repo, check=True)  # staged, not committed: dirty
    commit, dirty = results.checkout_state(repo)
    assert commit == results.git("rev-parse", "HEAD", cwd=repo) and len(commit) == 40 and dirty
    data = results.load(results.record("stability", STABILITY, tmp_path / "out", commit=commit, dirty=dirty))
    assert (data["commit"], data["dirty"]) == (commit, True)
    assert f"at commit `{commit[:12]} (with uncommitted changes)`" in results.render(tmp_path / "out")


@pytest.mark.parametrize("content, says", [
    ("{not json", "not readable as JSON"),
    (json.dumps({"schema": "fastpath-speed-baseline"}), "not a fastpath results file"),
    (json.dumps({"format": "fastpath-results", "version": 99, "kind": "report"}), "results format version 99"),
    (json.dumps({"format": "fastpath-results", "version": 1, "kind": "weather"}), "kind 'weather'"),
    (json.dumps({"format": "fastpath-results", "version": 1, "kind": "report"}), "missing"),
])
def test_a_corrupt_or_foreign_file_is_refused_with_the_fix(tmp_path, content, says):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "x.json").write_text(content)
    with pytest.raises(results.ResultsError, match=says) as err:
        results.render(tmp_path)
    assert "x.json" in str(err.value)
    assert results.main(["--dir", str(tmp_path), "--page", str(tmp_path / "page.md"), "--docs", str(tmp_path)]) == 2


def test_check_fails_on_a_page_edited_by_hand(tmp_path):
    page = tmp_path / "results.md"
    assert results.main(["--dir", str(tmp_path), "--page", str(page), "--docs", str(tmp_path)]) == 0
    assert results.main(["--check", "--dir", str(tmp_path), "--page", str(page), "--docs", str(tmp_path)]) == 0
    page.write_text(page.read_text().replace("No results file yet", "1.47x faster"))
    assert results.main(["--check", "--dir", str(tmp_path), "--page", str(page), "--docs", str(tmp_path)]) == 1
