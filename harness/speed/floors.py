"""Same-run ratio floors (baselines/ratio_floors.json): a ratio of two variants timed interleaved in one run, gated
per hardware key and checkpoint size, since a clock figure from one machine is not a fact about another. A floor
not recorded for this machine can only be recorded by measuring on it: such a gate is not judged
(harness.run.strict.not_judged), the figure measured here and the entry that records it in the reason."""

from __future__ import annotations

import json

from harness import REPO_ROOT

from harness.run import strict
from harness.speed.baselines import BaselineError

FLOORS_FILE = REPO_ROOT / "baselines" / "ratio_floors.json"


def ratio_floor(key: str, size: str, name: str) -> float | None:
    """The floor recorded for this hardware key, checkpoint size and point, or None."""
    data = json.loads(FLOORS_FILE.read_text())
    if data.get("format") != "fastpath-ratio-floors-v2":
        raise BaselineError(f"{FLOORS_FILE} is not a ratio-floor file (format fastpath-ratio-floors-v2); restore it "
                            f"with git checkout")
    entry = data["floors"].get(key, {}).get(floor_size(size), {}).get(name)
    return None if entry is None else float(entry["floor"])


def floor_size(size: str) -> str:
    """The checkpoint size a floor is kept under: a real checkpoint uses the full-size entries."""
    return "full" if size == "real" else size


def unrecorded(key: str, size: str, measured: dict) -> None:
    """Not judged, in either mode: no floor is recorded for this machine. measured: {entry name: (ratio, what was
    measured)}; the reason says each figure and the entries that record them (floor = 0.9 x the ratio)."""
    figures = "; ".join(f"{name!r} measured {ratio:.3f}x ({how})" for name, (ratio, how) in measured.items())
    entries = {name: {"floor": round(0.9 * ratio, 2), "measured": how} for name, (ratio, how) in measured.items()}
    strict.not_judged(f"no ratio floor recorded for this machine ({key}), {size}: {figures}",
                      f"to gate on this machine, add under \"floors\" in {FLOORS_FILE}: "
                      f"{json.dumps({key: {floor_size(size): entries}})}")


def remeasured_once(attempt, floor: float) -> float:
    """attempt(n) -> (ratio, what was measured); a ratio under the floor is measured once more. The last ratio."""
    for n in (1, 2):
        ratio, measured = attempt(n)
        print(f"{measured}, ratio {ratio:.3f} (floor {floor}, attempt {n})")
        if ratio >= floor:
            break
    return ratio


def gated_ratio(key: str, size: str, name: str, attempt, method: str) -> tuple:
    """(ratio, floor) for a same-run ratio gate. attempt(n) -> (ratio, what was measured). With no floor recorded
    for this machine: measure once and end as not judged, saying the figure and the entry to add (`method` says how
    it was measured); else measure, and once more when under the floor (`remeasured_once`)."""
    floor = ratio_floor(key, size, name)
    if floor is None:
        ratio, measured = attempt(1)
        unrecorded(key, size, {name: (ratio, f"{measured}, {method}")})
    return remeasured_once(attempt, floor), floor
