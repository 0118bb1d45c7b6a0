"""The count signals: callgrind dumps read, stored counts checked; exact operator counts named; the conditions a
night ran in. (The counting under valgrind itself runs in `.ci/run` and the nightly: importing torch under
valgrind takes minutes.)"""

from __future__ import annotations

import pytest
import torch

from harness.speed import conditions, instructions, structure
from harness.speed.changes import differences


def test_a_callgrind_dump_gives_its_total(tmp_path):
    dump = tmp_path / "callgrind.out.1"
    dump.write_text("# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 158812345\n"
                    "fl=(1) x.c\nfn=(1) f\n3 12\ntotals: 158812345\n")
    assert instructions.dump_total(dump) == 158_812_345
    (tmp_path / "bad").write_text("events: Ir\n")
    with pytest.raises(instructions.InstructionsError, match="no totals line"):
        instructions.dump_total(tmp_path / "bad")


def test_stored_counts_are_checked_against_their_floor():
    stored = {"floor": 0.01, "ratio_floor": 0.01, "keys": {"k": {"a/stock": 1_000_000, "a/lossless": 1_000_000,
                                                                  "b/lossless": 2_000_000}},
              "ratios": {"a": 1.0}}
    measured = {"key": "k", "counts": {"a/stock": 1_000_000, "a/lossless": 1_009_999, "b/lossless": 2_030_000}}
    worse, notes = instructions.check(measured, stored)
    assert len(worse) == 1 and worse[0].startswith("b/lossless: 2,030,000 instructions against 2,000,000 stored (+1.50%")
    assert notes == []
    # another machine kind: no counts stored for its key, the same-run ratio is still judged
    more = {"key": "other", "counts": {"a/stock": 1_200_000, "a/lossless": 1_230_000}}
    worse, notes = instructions.check(more, stored)
    assert worse == ["a: the lossless stack executes 1.0250x stock's instructions against 1.0000x stored (+2.50%, "
                     "floor 1.00%)"], worse
    assert "no stored counts for other" in notes[0] and "--record" in notes[0]
    with pytest.raises(instructions.InstructionsError, match="nothing to compare"):
        instructions.check({"key": "other", "counts": {"a/lossless": 5}}, stored)
    with pytest.raises(instructions.InstructionsError, match="lack 'ratios'"):
        instructions.check(measured, {"floor": 0.01, "ratio_floor": 0.01, "keys": {}})


def test_operator_counts_and_bytes_are_exact_and_named():
    x = torch.ones(4, 4)
    with structure.OperatorCounts() as ops:
        y = x @ x  # a new 64-byte tensor
        y.add_(1)  # in place: nothing allocated
        _ = y.view(16)  # a view: nothing allocated
    assert ops.calls["aten.mm.default"] == 1 and ops.calls["aten.add_.Tensor"] == 1, ops.calls
    assert ops.bytes == 64
    before = {"ops": 3, "bytes": 64, "by_kind": dict(ops.calls)}
    after = {"ops": 4, "bytes": 128, "by_kind": {**ops.calls, "aten.mm.default": 2}}
    assert differences(before, after) == ["ops: 3 -> 4 (+1)", "bytes: 64 -> 128 (+64)",
                                          "aten.mm.default: 1 -> 2 calls (+1)"]


def test_conditions_say_why_a_night_is_busy():
    assert conditions.busy({"load_average": 0.4, "cpus": 2, "steal_share": 0.0, "wait_share": 0.01}) is None
    why = conditions.busy({"load_average": 4.1, "cpus": 2, "steal_share": 0.09, "wait_share": 0.4})
    assert "waited for a CPU 40%" in why and "stole 9%" in why and "load average 4.1 on 2 CPUs" in why
    assert conditions.busy(None) is None and conditions.busy({"wait_share": None}) is None
    snap = conditions.start()
    sum(i * i for i in range(200_000))
    now = conditions.since(snap)
    assert set(now) == {"load_average", "cpus", "steal_share", "wait_share"}
    assert now["wait_share"] is None or now["wait_share"] >= 0.0


def test_structure_counts_the_streams_worker_and_repeats_exactly(model):
    """The stream makes its chunks in a worker thread, which a dispatch mode of the caller's thread does not see:
    the first chunk's counts include the worker's unmasking loop (its LLM forwards and scoring), and a second
    measurement gives the same numbers exactly."""
    from harness.speed import calls

    point = calls.point_named("stream-three-2")
    call = calls.make_call(model, point, "stock", {})
    call(calls.nothing)
    first = structure.measure_call(model, call)
    assert structure.measure_call(model, call) == first

    def caller_thread_only(window):  # the same call with a window that has no worker part
        def plain():
            return window()
        return call(plain)

    alone = structure.measure_call(model, caller_thread_only)
    assert first["llm_positions"] == alone["llm_positions"] > 0  # the hooks see every thread
    assert first["flops"] > alone["flops"] and first["ops"] > alone["ops"], (first["ops"], alone["ops"])
    extra = differences(alone, first)
    assert any(line.startswith("aten.") and "calls (+" in line for line in extra), extra


def test_one_more_operator_in_the_hot_loop_is_named_exactly(model):
    """A change that adds work to every LLM forward is a fact: the operator and how many calls more."""
    from fastpath.instance import overridden

    from harness.speed import calls

    point = calls.point_named("auto-short-2")
    call = calls.make_call(model, point, "stock", {})
    call(calls.nothing)
    before = structure.measure_call(model, call)

    def one_more(forward):
        def run(*args, **kwargs):
            out = forward(*args, **kwargs)
            torch.special.expit(torch.zeros(1))  # an operator the model itself never calls
            return out
        return run

    with overridden(model.llm, "forward", one_more):
        after = structure.measure_call(model, call)
    forwards = before["llm_calls"]
    assert forwards > 0 and after["llm_calls"] == forwards
    assert f"aten.special_expit.default: 0 -> {forwards} calls (+{forwards})" in differences(before, after)
    assert after["ops"] == before["ops"] + 2 * forwards  # the zeros and the sigmoid
