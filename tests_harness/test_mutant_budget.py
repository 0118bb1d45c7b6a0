"""The measure behind CI's mutants stage (harness.audit.mutant_budget): each change's mutants by room, and the
stage's time for them from a sampled run's timings."""

from __future__ import annotations

import json

import pytest

from harness.audit import mutant_budget, mutant_rooms

TIMED = {"children": 2, "setup": {"patches": 300.0, "gpu": 300.0, "gate": 60.0},
         "per_mutant": {"patches": 10.0, "gpu": 4.0, "gate": 2.0}, "from": "mutants of 2026-12-06 at abc"}


def test_a_change_pays_each_set_of_tests_once_then_its_mutants_two_at_a_time():
    # patches and gpu share their tests: one stats run (the longer setup), then (10 x 10 s + 5 x 4 s) / 2
    assert mutant_budget.stage_seconds({"patches": 10, "gpu": 5}, TIMED) == pytest.approx(300 + 60)
    # a harness room has its own tests: its setup is paid as well
    assert mutant_budget.stage_seconds({"patches": 10, "gate": 6}, TIMED) == pytest.approx(300 + 50 + 60 + 6)
    assert mutant_budget.stage_seconds({}, TIMED) == 0.0
    # a room the sampled run did not time: no estimate, never a guess
    assert mutant_budget.stage_seconds({"quality": 3}, TIMED) is None


def test_the_summary_reads_the_percentile_of_the_changes():
    rows = [{"commit": f"{i:040x}", "subject": "s", "files": [], "mutants": {"gate": i}, "total": i,
             "seconds": mutant_budget.stage_seconds({"gate": i}, TIMED)} for i in range(1, 11)]
    figures = mutant_budget.summary(rows, TIMED)
    assert (figures["mutants_median"], figures["mutants_p90"], figures["mutants_max"]) == (5.5, 9, 10)
    assert figures["seconds_p90"] == pytest.approx(60 + 9) and figures["seconds_max"] == pytest.approx(70)
    text = mutant_budget.render_results(figures)
    assert "90th percentile 9" in text and "| gate 10 | 10 |" in text
    untimed = mutant_budget.render_results(mutant_budget.summary(rows, None))
    assert "Not timed" in untimed


def test_every_room_has_a_selection_of_its_own():
    for room in mutant_rooms.ROOMS:
        selection = mutant_rooms.selection(room)
        assert selection[: len(room.tests)] == room.tests
        assert all(s.startswith("--deselect=") for s in selection[len(room.tests):])


def test_a_sampled_run_whose_mutants_took_zero_seconds_times_no_mutant(tmp_path):
    """A mutant recorded at 0.0 s is a missing timing (mutmut's meta before its log's seconds were read), not a free
    mutant: the room gets no per-mutant figure, so the stage's time is not estimated rather than underestimated."""
    key = "cpu-test-2c-2t"
    mutants_of = lambda seconds: [{"room": "gate", "seconds": s} for s in seconds]  # noqa: E731
    for kind, seconds, date in (("mutants", [0.0, 0.0], "2026-12-07"), ("mutants-before", [3.0, 5.0], "2026-12-01")):
        (tmp_path / kind).mkdir()
        figures = {"children": 2, "mutants": mutants_of(seconds), "timings": [
            {"rooms": ["gate"], "generate_seconds": 10.0, "setup_seconds": 50.0}]}
        (tmp_path / kind / f"{key}.json").write_text(json.dumps(
            {"format": "fastpath-results", "version": 1, "kind": kind, "machine": {}, "machine_key": key,
             "machine_summary": "test", "commit": "a" * 40, "dirty": False, "date": date, "command": "c",
             "figures": figures}))
    timed = mutant_budget.timings(tmp_path, key)
    assert timed["setup"] == {"gate": 60.0} and timed["per_mutant"] == {}, timed
    assert mutant_budget.stage_seconds({"gate": 4}, timed) is None
