"""The same-run ratio gate's helper (harness/speed/floors.py): skip with the entry to add, or gate with one retry."""

from __future__ import annotations

import pytest

from harness.speed import floors


def test_no_floor_measures_once_and_skips_with_the_entry_to_add(monkeypatch):
    monkeypatch.setattr(floors, "ratio_floor", lambda key, size, name: None)
    calls = []

    def attempt(n):
        calls.append(n)
        return 1.5, "a 1.5 s, b 1.0 s"

    with pytest.raises(pytest.skip.Exception, match=r"measured 1\.500x.*\"floor\": 1\.35"):
        floors.gated_ratio("cpu-x", "full", "p", attempt, "2 rounds")
    assert calls == [1]


@pytest.mark.parametrize(("ratios", "calls"), [([2.5], [1]), ([1.5, 2.5], [1, 2]), ([1.5, 1.6], [1, 2])])
def test_a_ratio_under_the_floor_is_measured_once_more(monkeypatch, ratios, calls):
    monkeypatch.setattr(floors, "ratio_floor", lambda key, size, name: 2.0)
    made = []

    def attempt(n):
        made.append(n)
        return ratios[n - 1], "measured"

    ratio, floor = floors.gated_ratio("cpu-x", "full", "p", attempt, "2 rounds")
    assert (ratio, floor, made) == (ratios[-1], 2.0, calls)
