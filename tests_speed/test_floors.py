"""The same-run ratio gate's helper (harness/speed/floors.py): not judged with the figure and the entry to add, or
gate with one retry."""

from __future__ import annotations

import pytest

from harness.speed import floors


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
