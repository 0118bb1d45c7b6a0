"""A setting that raised is no behaviour. The behaviour check once compared two equal errors as "no difference": a
grid where every setting raised the same error in both versions read "bit-identical ... at all 25 settings", pass,
and the gate said MAY SHIP. Now a setting that raised in either version is not compared and is counted: in one
version it is a difference, named; in both (equal errors or not) the check is ERROR, or INCOMPLETE where the grid says
the setting cannot run on this device, and the verdict never says MAY SHIP. The summary says how many settings were
compared and names each one that raised, with its error."""

from __future__ import annotations

import pytest
import torch

from harness.gate import behaviour, gate

VERSIONS = ("0.2.2", "0.2.1")  # (candidate, against)


def ran(value: float = 0.0) -> dict:
    """A setting's record where it ran (the fields compare reads; a real one: tests_harness/test_behaviour.py)."""
    return {"calls": [], "tokens": [torch.zeros(2, 3, dtype=torch.long)], "target_lens": [3],
            "waveforms": [torch.full((8,), value)]}


def grid(settings: dict, device: str = "cpu", dtype: str = "fp32") -> dict:
    return {"omnivoice": "x", "device": device, "dtype": dtype, "settings": settings}


def judged(against: dict, candidate: dict, accepted: dict | None = None):
    """(the behaviour check, the gate's verdict, its headline) with every other needed check passing."""
    check = gate.check_behaviour({"against": against, "candidate": candidate}, VERSIONS, accepted or {})
    others = [gate.Check(name, "pass", False, "ok") for name in ("install", "fingerprints", "parity", "work")]
    report = gate.verdict([*others, check])
    return check, report, gate.headline(report)


NAMES = sorted(behaviour.GRID)
SAME = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x8 and 16x8)"


def test_the_same_error_at_every_setting_in_both_versions_is_an_error_not_bit_identical():
    """The reported case: 25 settings, each raising the same error in both versions."""
    errors = grid({n: {"error": SAME} for n in NAMES})
    check, report, said = judged(errors, errors)
    assert (check.status, report["state"]) == ("error", "error"), (check.status, check.summary)
    assert said.startswith("ERROR") and "MAY SHIP" not in said, said
    assert f"0 of {len(NAMES)} settings compared" in check.summary and SAME in check.summary, check.summary
    assert "bit-identical" not in check.summary, check.summary
    named = [d for d in check.details if "raised in both versions" in d]
    assert len(named) == len(NAMES) and all(SAME in d for d in named), check.details


def test_an_error_in_some_settings_only_is_an_error_naming_them_and_counting_the_rest():
    settings = {n: ran() for n in NAMES}
    settings["chinese"] = settings["digits"] = {"error": "KeyError: 'zh'"}
    check, report, said = judged(grid(settings), grid(dict(settings)))
    assert (check.status, report["state"]) == ("error", "error") and "MAY SHIP" not in said, check.summary
    assert f"{len(NAMES) - 2} of {len(NAMES)} settings compared" in check.summary, check.summary
    assert "chinese, digits raised KeyError: 'zh'" in check.summary, check.summary


def test_different_errors_in_the_two_versions_are_an_error_naming_both():
    """Neither version ran the setting: there is no behaviour to call changed or unchanged."""
    settings = {n: ran() for n in NAMES}
    check, report, _ = judged(grid({**settings, "one_word": {"error": "ValueError: old"}}),
                              grid({**settings, "one_word": {"error": "TypeError: new"}}))
    assert (check.status, report["state"]) == ("error", "error"), check.summary
    assert "one_word raised ValueError: old (against) vs TypeError: new (candidate)" in check.summary, check.summary


@pytest.mark.parametrize("side", ["candidate", "against"])
def test_an_error_in_one_version_only_is_a_difference_named_and_not_compared(side):
    settings = {n: ran() for n in NAMES}
    broken = {**settings, "voice_design": {"error": "AttributeError: no attribute 'instruct'"}}
    against, candidate = (settings, broken) if side == "candidate" else (broken, settings)
    check, report, said = judged(grid(against), grid(candidate))
    assert (check.status, check.blocks, report["state"]) == ("changed", True, "must-not-ship"), check.summary
    assert f"{len(NAMES) - 1} of {len(NAMES)} settings compared" in check.summary, check.summary
    where = "the candidate" if side == "candidate" else "the --against version"
    assert any(d.startswith(f"voice_design [NOT accepted]: raised in {where} only: AttributeError") for d in
               check.details), check.details


def test_a_setting_one_version_did_not_record_is_a_difference_and_not_counted_as_compared():
    settings = {n: ran() for n in NAMES}
    check, report, _ = judged(grid(settings), grid({n: r for n, r in settings.items() if n != "digits"}))
    assert (check.status, report["state"]) == ("changed", "must-not-ship"), check.summary
    assert f"{len(NAMES) - 1} of {len(NAMES)} settings compared" in check.summary, check.summary


def test_accepting_every_difference_never_accepts_an_error():
    settings = {n: ran() for n in NAMES}
    check, report, said = judged(grid({**settings, "auto_voice": ran(1.0), "one_word": {"error": SAME}}),
                                 grid({**settings, "one_word": {"error": SAME}}), accepted={"*": "reviewed"})
    assert (check.status, report["state"]) == ("error", "error") and "MAY SHIP" not in said, check.summary


def test_a_difference_and_an_error_block_and_the_error_is_named():
    settings = {n: ran() for n in NAMES}
    check, report, _ = judged(grid({**settings, "one_word": {"error": SAME}}),
                              grid({**settings, "auto_voice": ran(1.0), "one_word": {"error": SAME}}))
    assert (check.status, check.blocks, report["state"]) == ("changed", True, "must-not-ship"), check.summary
    assert f"{len(NAMES) - 1} of {len(NAMES)} settings compared" in check.summary, check.summary
    assert "1 raised in both versions: one_word raised" in check.summary, check.summary


@pytest.mark.parametrize("recorded_on, verdict", [
    (("cuda", "bf16"), "incomplete"),  # the grid says the setting cannot run there: not run whole
    (("cpu", "fp32"), "error"),  # the grid's word covers CUDA in bf16 only: here the raise is the check's own failure
])
def test_an_error_where_the_grid_says_the_setting_cannot_run_is_incomplete_there_only(monkeypatch, recorded_on,
                                                                                      verdict):
    monkeypatch.setattr(behaviour, "CANNOT_RUN", {"long_chunked": {"cuda/bf16": "planted: no bf16 kernel"}},
                        raising=False)
    settings = {n: ran() for n in NAMES}
    records = grid({**settings, "long_chunked": {"error": SAME}}, *recorded_on)
    check, report, said = judged(records, records)
    assert report["state"] == verdict and "MAY SHIP" not in said, (check.status, check.summary)
    if verdict == "incomplete":
        assert (check.status, check.complete) == ("skipped", False), check
        assert said.startswith("INCOMPLETE") and "planted: no bf16 kernel" in " ".join(check.details), said


def test_a_setting_that_raises_in_the_real_recording_is_not_compared(model, monkeypatch):
    """Through record_setting on the test checkpoint: a harness break that makes every recording raise (the same
    error in both versions, as a broken recorder gives) leaves no verdict."""
    import harness.parity.parity

    def broken(*args, **kwargs):
        raise RuntimeError("planted: recorder broken")

    monkeypatch.setattr(harness.parity.parity, "record_generation", broken)
    names = ["one_word", "digits"]
    records = [grid({n: behaviour.record_setting(model, n) for n in names}) for _ in range(2)]
    assert all(r["settings"][n] == {"error": "RuntimeError: planted: recorder broken"} for r in records for n in names)
    check, report, _ = judged(*records)
    assert (check.status, report["state"]) == ("error", "error"), check.summary
    assert "0 of 2 settings compared" in check.summary, check.summary
