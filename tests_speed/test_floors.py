"""The same-run ratio gate's helper (harness/speed/floors.py): not judged with the figure and the entry to add, or
gate with one retry."""

from __future__ import annotations

import json

import pytest

from harness.speed import floors
from harness.speed.baselines import BaselineError


def test_no_floor_measures_once_and_is_not_judged_with_the_entry_to_add(monkeypatch):
    """A floor is a figure of the machine that measured it: where none is recorded the gate is not judged, in
    either mode (harness.run.strict.not_judged), the figure and the entry under the full size in the reason."""
    monkeypatch.setattr(floors, "ratio_floor", lambda key, size, name: None)
    calls = []

    def attempt(n):
        calls.append(n)
        return 1.5, "a 1.5 s, b 1.0 s"

    with pytest.raises(pytest.skip.Exception, match=r"^not judged: .*'p' measured 1\.500x.*ratio_floors\.json: "
                                                    r"\{\"cpu-x\": \{\"full\": \{\"p\": \{\"floor\": 1\.35"):
        floors.gated_ratio("cpu-x", "real", "p", attempt, "2 rounds")
    assert calls == [1]


def test_every_unrecorded_floor_is_named_with_its_figure():
    with pytest.raises(pytest.skip.Exception) as skipped:
        floors.unrecorded("cpu-x", "full", {"p vs stock": (1.2, "stock 1.2 s"), "p vs peer": (1.1, "peer 1.1 s")})
    reason = str(skipped.value)
    assert "'p vs stock' measured 1.200x (stock 1.2 s)" in reason and "'p vs peer' measured 1.100x" in reason, reason
    assert '"p vs stock": {"floor": 1.08' in reason and '"p vs peer": {"floor": 0.99' in reason, reason


@pytest.mark.parametrize(("ratios", "calls"), [([2.5], [1]), ([1.5, 2.5], [1, 2]), ([1.5, 1.6], [1, 2])])
def test_a_ratio_under_the_floor_is_measured_once_more(monkeypatch, ratios, calls):
    monkeypatch.setattr(floors, "ratio_floor", lambda key, size, name: 2.0)
    made = []

    def attempt(n):
        made.append(n)
        return ratios[n - 1], "measured"

    ratio, floor = floors.gated_ratio("cpu-x", "full", "p", attempt, "2 rounds")
    assert (ratio, floor, made) == (ratios[-1], 2.0, calls)


def floors_file(tmp_path, monkeypatch, data: dict):
    path = tmp_path / "ratio_floors.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(floors, "FLOORS_FILE", path)
    return path


def test_a_floor_is_read_for_its_key_size_and_point_a_real_checkpoint_under_full(tmp_path, monkeypatch):
    floors_file(tmp_path, monkeypatch, {"format": "fastpath-ratio-floors-v2", "floors": {
        "cpu-x": {"full": {"p": {"floor": 2}}, "small": {"p": {"floor": 1.25}}}}})
    assert floors.ratio_floor("cpu-x", "real", "p") == 2.0 and isinstance(floors.ratio_floor("cpu-x", "full", "p"),
                                                                         float)
    assert floors.ratio_floor("cpu-x", "small", "p") == 1.25
    assert [floors.ratio_floor(*where) for where in (("cpu-y", "full", "p"), ("cpu-x", "tiny", "p"),
                                                     ("cpu-x", "full", "q"))] == [None, None, None]


def test_a_file_that_is_not_a_floor_file_is_an_error_naming_the_fix(tmp_path, monkeypatch):
    path = floors_file(tmp_path, monkeypatch, {"format": "fastpath-ratio-floors-v1", "floors": {}})
    with pytest.raises(BaselineError) as err:
        floors.ratio_floor("cpu-x", "full", "p")
    assert str(err.value) == (f"{path} is not a ratio-floor file (format fastpath-ratio-floors-v2); restore it with "
                              "git checkout")


def test_only_a_real_checkpoint_is_kept_under_another_size():
    assert [floors.floor_size(size) for size in ("real", "full", "small")] == ["full", "full", "small"]


def test_a_ratio_at_the_floor_passes_on_the_first_measurement_and_each_attempt_is_printed(capsys):
    made = []

    def attempt(n):
        made.append(n)
        return 2.0, "stock 2.0 s, stack 1.0 s"

    assert floors.remeasured_once(attempt, 2.0) == 2.0 and made == [1]
    assert capsys.readouterr().out == "stock 2.0 s, stack 1.0 s, ratio 2.000 (floor 2.0, attempt 1)\n"


def test_a_recorded_floor_is_read_for_this_key_size_and_point(tmp_path, monkeypatch):
    floors_file(tmp_path, monkeypatch, {"format": "fastpath-ratio-floors-v2", "floors": {
        "cpu-x": {"full": {"p": {"floor": 1.5}}}}})
    assert floors.gated_ratio("cpu-x", "real", "p", lambda n: (1.6, "m"), "2 rounds") == (1.6, 1.5)
