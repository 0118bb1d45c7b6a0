"""The behaviour check compares every field it records: two records of a real setting that differ in one field
alone, whichever, are reported as changed, naming that field; identical records are not. The fields are taken
from a real record (harness.gate.behaviour.record_setting on the test checkpoint), so a field added to the record is
covered without a change here. Without this the check's completeness was exercised only by the gate's slow
end-to-end runs."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.gate import behaviour

SETTING = "voice_clone_prompt"  # the grid setting used: a voice prompt, so every part of the record is filled


@pytest.fixture(scope="module")
def record(model):
    rec = behaviour.record_setting(model, SETTING)
    assert "error" not in rec, rec
    return rec


def changed(value):
    """`value` with one element moved by the least step its type has (one ulp, one unit, one character)."""
    if isinstance(value, torch.Tensor):
        moved = value.clone(memory_format=torch.contiguous_format)
        flat = moved.view(-1)
        if moved.is_floating_point():
            flat[0] = torch.nextafter(flat[0], flat[0] + 1)
        elif moved.dtype == torch.bool:
            flat[0] = ~flat[0]
        else:
            flat[0] += 1
        return moved
    if isinstance(value, str):
        return value[:-1] + ("1" if value[-1] != "1" else "2")
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        assert value, "an empty list has no element to change"
        return [changed(value[0])] + value[1:]
    raise AssertionError(f"no way to change a {type(value).__name__}: teach changed() this field's type")


def fields(rec) -> list:
    """Paths of every field of a setting's record: each key of the first and of the last scoring call (whole
    logits and digests), and every other top-level key."""
    calls = rec["calls"]
    assert len(calls) > behaviour.KEEP_LOGITS, "the record should hold whole logits and digests"
    paths = [("calls", n, key) for n in sorted({0, len(calls) - 1}) for key in calls[n]]
    return paths + [(key,) for key in rec if key != "calls"]


def with_field_changed(rec, path):
    out = copy.copy(rec)
    if path[0] == "calls":
        out["calls"] = list(rec["calls"])
        call = dict(out["calls"][path[1]])
        call[path[2]] = changed(call[path[2]])
        out["calls"][path[1]] = call
    else:
        out[path[0]] = changed(rec[path[0]])
    return out


def compare(a, c):
    return behaviour.compare({"settings": {SETTING: a}}, {"settings": {SETTING: c}})


@pytest.mark.cpu
def test_every_recorded_field_is_compared(record):
    assert compare(record, copy.deepcopy(record)) == {}, "identical records reported as different"
    paths = fields(record)
    assert {p[-1] for p in paths} >= {*behaviour.PARTS, "where", "tokens", "target_lens", "waveforms"}, paths
    unreported = []
    for path in paths:
        found = compare(record, with_field_changed(record, path)).get(SETTING, [])
        named = [d for d in found if str(path[-1]) in d]
        if not named:
            unreported.append(f"{path}: {found or 'no difference reported'}")
    assert not unreported, "changes the behaviour check does not report:\n  " + "\n  ".join(unreported)


@pytest.mark.cpu
def test_a_field_one_version_records_and_the_other_does_not_is_reported(record):
    extra = dict(record, new_field=torch.zeros(3))
    assert compare(record, extra) == {SETTING: ["new_field: recorded by one version only"]}
    call = dict(record["calls"][0], new_part=torch.zeros(2))
    more = dict(record, calls=[call] + record["calls"][1:])
    found = compare(record, more)[SETTING]
    assert any("scoring call 0" in d and "new_part" in d for d in found), found


@pytest.mark.cpu
def test_the_grid_record_holds_settings_and_the_meta_fields_only(tmp_path):
    """What compare() leaves out of a record (RECORD_META: the version and the call trace) is all the record holds
    besides the settings: a new top-level field must be compared or declared meta."""
    path = tmp_path / "behaviour.pt"
    behaviour.record(path, names=["one_word"])
    rec = torch.load(path, weights_only=False)
    assert set(rec) == {"settings", *behaviour.RECORD_META}, sorted(rec)
    assert list(rec["settings"]) == ["one_word"] and rec["called"], rec["called"][:5]


@pytest.mark.cpu
def test_a_record_says_its_device_and_dtype_and_another_dtype_is_refused(tmp_path):
    """The grid in bf16 (the gate's --dtype): the record says where it ran, it repeats itself, its numbers are not
    fp32's, and a comparison against an fp32 record is refused naming the option instead of reported as a change."""
    records = {}
    for name, dtype in (("fp32", "fp32"), ("bf16", "bf16"), ("bf16-again", "bf16")):
        behaviour.record(tmp_path / f"{name}.pt", names=["one_word"], dtype=dtype)
        records[name] = torch.load(tmp_path / f"{name}.pt", weights_only=False)
    assert behaviour.where(records["bf16"]) == ("cpu", "bf16")
    assert behaviour.compare(records["bf16"], records["bf16-again"]) == {}
    as_fp32 = dict(records["bf16"], dtype="fp32")  # bf16 numbers under an fp32 label: they differ from fp32's
    assert behaviour.compare(records["fp32"], as_fp32), "bf16 recorded the same numbers as fp32"
    with pytest.raises(ValueError, match="same --device and --dtype"):
        behaviour.compare(records["fp32"], records["bf16"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equal_means_the_same_bits_nan_included_and_a_zero_keeps_its_sign(dtype):
    """Two records of an identical release that hold a NaN are identical (torch.equal says they differ), and
    0.0 against -0.0 is a difference (torch.equal says they are equal), in tensors and in plain numbers alike."""
    values = torch.tensor([1.0, float("nan"), 0.0, -2.5], dtype=dtype)
    assert behaviour.first_difference(values, values.clone()) is None
    signed = values.clone()
    signed[2] = -0.0
    found = behaviour.first_difference(values, signed)
    assert found and found.startswith("first at (2,): 0.0 vs -0.0; 1 of 4 differ"), found
    moved = values.clone()
    moved[1] = 3.0
    assert behaviour.first_difference(values, moved).startswith("first at (1,): nan vs 3.0"), "a NaN became a number"

    def rec(waveform, length):
        return {"settings": {"s": {"calls": [], "waveforms": [waveform], "duration": length}}}

    assert behaviour.compare(rec(values, float("nan")), rec(values.clone(), float("nan"))) == {}
    assert behaviour.compare(rec(values, 0.0), rec(values.clone(), -0.0)) == {"s": ["duration: 0.0 vs -0.0"]}
    assert list(behaviour.compare(rec(values, 1.0), rec(signed, 1.0))["s"]) == [
        "waveforms[0]: " + behaviour.first_difference(values, signed)]


# --- the comparison's words, on records built by hand (no model) -----------------------------------------------


def test_a_field_one_side_lacks_is_named_absent_or_present_and_plain_numbers_by_their_values():
    t = torch.zeros(2)
    assert behaviour.field_difference(None, t) == "absent vs present"
    assert behaviour.field_difference(t, None) == "present vs absent"
    assert behaviour.field_difference("ab", None) == "present vs absent"
    assert behaviour.field_difference("ab", "ab") is None
    assert behaviour.field_difference("ab", "ac") == "sha256 differs (whole logits kept for the first KEEP_LOGITS " \
                                                     "calls only)"
    assert behaviour.field_difference([3, 4], [3, 4]) is None and behaviour.field_difference(3, 4) == "3 vs 4"
    assert behaviour.field_difference(torch.tensor([1, 2]), torch.tensor([1, 2, 3])) == (
        "shape/dtype (2,) torch.int64 vs (3,) torch.int64")


def test_a_setting_that_raised_or_was_not_recorded_is_listed_with_both_sides_and_the_grids_word(monkeypatch):
    monkeypatch.setattr(behaviour, "CANNOT_RUN", {"b": {"cuda/bf16": "no bf16 kernel", "cuda": "no cuda kernel"}})
    ok = {"calls": []}
    against = {"device": "cuda", "dtype": "bf16", "settings": {"a": ok, "b": {"error": "E1"}, "c": ok}}
    candidate = {"device": "cuda", "dtype": "bf16", "settings": {"a": ok, "b": {"error": "E2"}, "d": ok}}
    assert behaviour.raised(against, candidate) == {
        "b": {"against": "E1", "candidate": "E2", "cannot_run": "no bf16 kernel"},
        "c": {"against": None, "candidate": "not recorded", "cannot_run": None},
        "d": {"against": "not recorded", "candidate": None, "cannot_run": None}}
    assert behaviour.cannot_run("b", "cuda", "fp32") == "no cuda kernel", "the device's word covers every dtype"
    assert behaviour.cannot_run("b", "cpu", "bf16") is None and behaviour.cannot_run("a", "cuda", "bf16") is None
    assert behaviour.where({}) == ("cpu", "fp32"), "a record from before the option: the CPU in fp32"


def test_the_scoring_calls_are_compared_up_to_the_first_that_differs_then_every_other_field():
    def call(where, logit):
        return {"where": where, "c_logits": torch.tensor([logit]), "extra": 1}

    a = {"calls": [call("pass 0 step 0", 0.0), call("pass 0 step 1", 0.0), call("y", 0.0)],
         "tokens": [torch.zeros(2)], "lens": 3}
    c = {"calls": [call("pass 0 step 0", 0.0), call("pass 0 step 2", 1.0), call("x", 2.0)],
         "tokens": [torch.zeros(2), torch.ones(2)], "lens": 3.0}
    assert behaviour.compare_setting(a, c) == [
        "scoring call 1 where: pass 0 step 1 vs pass 0 step 2",
        "scoring call 1 (pass 0 step 1) c_logits: first at (0,): 0.0 vs 1.0; 1 of 1 differ, max |diff| 1",
        "tokens: 1 vs 2",
    ], "call 2 follows from call 1: not listed; 3 and 3.0 are the same number"
    assert behaviour.compare_setting(a, {**a, "calls": a["calls"][:2], "new": 1}) == [
        "new: recorded by one version only", "scoring calls: 3 vs 2"]
    assert behaviour.compare_setting(a, a) == []
    assert behaviour.compare({"settings": {"s": a, "t": a}}, {"settings": {"s": a}}) == {
        "t": ["recorded by one version only"]}


def test_a_part_one_scoring_call_recorded_and_the_other_did_not_is_reported_whichever_side_has_it():
    with_part = {"calls": [{"where": "w", "c_logits": torch.zeros(1), "u_logits": torch.zeros(1)}]}
    without = {"calls": [{"where": "w", "c_logits": torch.zeros(1)}]}
    assert behaviour.compare_setting(with_part, without) == ["scoring call 0 (w) u_logits: present vs absent"]
    assert behaviour.compare_setting(without, with_part) == ["scoring call 0 (w) u_logits: absent vs present"]
