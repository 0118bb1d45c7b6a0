"""The count signals: callgrind dumps read, stored counts checked; exact operator counts named; the conditions a
night ran in. (The counting under valgrind itself runs in `.ci/run` and the nightly: importing torch under
valgrind takes minutes.)"""

from __future__ import annotations

import json

import pytest
import torch

from harness.run import strict
from harness.speed import conditions
from harness.counts import instructions
from harness.counts import structure
from harness.nightly.changes import differences


def test_a_callgrind_dump_gives_its_total(tmp_path):
    dump = tmp_path / "callgrind.out.1"
    dump.write_text("# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 158812345\n"
                    "fl=(1) x.c\nfn=(1) f\n3 12\ntotals: 158812345\n")
    assert instructions.dump_total(dump) == 158_812_345
    (tmp_path / "bad").write_text("events: Ir\n")
    with pytest.raises(instructions.InstructionsError, match="no totals line"):
        instructions.dump_total(tmp_path / "bad")


# --- the per-change check of stored counts (instructions --check, --record) ----------------------------------------

KEY = "callgrind-3.19.0-avx2__torch-2.14.1__omnivoice-0.2.1"


def stored_counts(path, keys: dict):
    """A file of stored counts: {key: ({name: (count, margin)}, {point: (ratio, margin)})}."""
    path.write_text(json.dumps({"format": instructions.FORMAT, "format_version": instructions.FORMAT_VERSION,
                                "keys": {key: {"counts": {n: {"count": c, "margin": m} for n, (c, m) in counts.items()},
                                               "ratios": {p: {"ratio": r, "margin": m} for p, (r, m) in ratios.items()}}
                                         for key, (counts, ratios) in keys.items()}}))
    return path


def counted(monkeypatch, counts: dict, key: str = KEY):
    """Make `instructions --points ...` count `counts` without valgrind."""
    measured = {"counts": counts, "key": key, "valgrind": "3.19.0", "capability": "AVX2", "versions": {},
                "machine": {"cpu_model": "Test CPU"}, "seconds": 0.0, "call_seconds": {}}
    monkeypatch.setattr(instructions, "count", lambda *args, **kwargs: measured)


def check_command(path, *more):
    return ["--points", "a", "--variants", "stock", "lossless", "--check", str(path), "--quiet", *more]


def test_stored_counts_are_checked_against_their_margins(tmp_path, monkeypatch, capsys):
    """Each count and each stack-to-stock ratio has its own margin; above it is named with both numbers."""
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (1_000_000, 0.002), "a/lossless":
                                                            (1_000_000, 0.02)}, {"a": (1.0, 0.002)})})
    counted(monkeypatch, {"a/stock": 1_001_999, "a/lossless": 1_001_999})  # within both margins
    assert instructions.main(check_command(path)) == 0
    assert "summary: passed: 3 figure(s) within their margins" in capsys.readouterr().out
    counted(monkeypatch, {"a/stock": 1_000_000, "a/lossless": 1_015_000})  # the count within 2%, the ratio 1.5% up
    assert instructions.main(check_command(path)) == 1
    out = capsys.readouterr().out
    assert ("MORE WORK: a: the lossless stack executes 1.01500x stock's instructions against 1.00000x stored "
            "(+1.500%, margin 0.200%)") in out, out
    assert "MORE WORK: a/lossless" not in out and "2 figure(s) within their margins, 1 more work" in out, out
    counted(monkeypatch, {"a/stock": 1_015_000, "a/lossless": 1_015_000})  # stock 1.5% up, the ratio as stored
    assert instructions.main(check_command(path)) == 1
    out = capsys.readouterr().out
    assert "MORE WORK: a/stock: 1,015,000 instructions against 1,000,000 stored (+1.500%, margin 0.200%)" in out, out
    assert "1 more work, 0 less work, 0 not stored" in out


def test_a_key_not_stored_fails_and_names_the_record_command(tmp_path, monkeypatch, capsys):
    """Another valgrind (or torch) is another key: not a pass judged by the ratios alone. Stock and the stack both
    30% up keep their ratio."""
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (1_000_000, 0.002), "a/lossless":
                                                            (900_000, 0.002)}, {"a": (0.9, 0.002)})})
    other = KEY.replace("3.19.0", "3.22.0")
    counted(monkeypatch, {"a/stock": 1_300_000, "a/lossless": 1_170_000}, key=other)
    assert instructions.main(check_command(path)) == 1
    out = capsys.readouterr().out
    assert f"MISSING: no stored counts for device key {other} (stored: {KEY})" in out, out
    assert f"fastpath-suite counts instructions --points a --variants stock lossless --record {path}" in out, out
    assert "summary: FAILED" in out
    assert instructions.main(check_command(path, "--no-strict-inputs")) == strict.NOT_JUDGED
    out = capsys.readouterr().out
    assert "NOT JUDGED: no stored counts" in out and "summary: not judged" in out, out


def test_a_point_or_ratio_not_stored_under_a_stored_key_fails(tmp_path, monkeypatch, capsys):
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (1_000_000, 0.002), "a/lossless":
                                                            (900_000, 0.002), "b/stock": (500_000, 0.002)},
                                                           {"a": (0.9, 0.002)})})
    counted(monkeypatch, {"a/stock": 1_000_000, "a/lossless": 900_000, "b/stock": 500_000, "b/lossless": 400_000,
                          "c/stock": 100})
    assert instructions.main(check_command(path)) == 1
    out = capsys.readouterr().out
    for gap in ("no stored count of b/lossless", "no stored count of c/stock", "no stored lossless/stock ratio of b"):
        assert gap in out, (gap, out)
    assert "MISSING:" in out and "--record" in out and "3 not stored" in out, out
    assert instructions.main(check_command(path, "--no-strict-inputs")) == strict.NOT_JUDGED
    assert "summary: not judged" in capsys.readouterr().out


def test_ratios_are_stored_per_key(tmp_path):
    """Two machine kinds' keys recorded one after the other: each keeps its own stack-to-stock ratio."""
    path = tmp_path / "stored.json"
    first = {"key": KEY, "counts": {"a/stock": 1_000_000, "a/lossless": 900_000}, "kind": "one", "source": "1",
             "machine": {}}
    second = {"key": KEY.replace("avx2", "avx512"), "counts": {"a/stock": 1_000_000, "a/lossless": 950_000},
              "kind": "two", "source": "2", "machine": {}}
    instructions.record([first], path)
    instructions.record([second], path)
    stored = instructions.load_stored(path)
    assert stored["keys"][KEY]["ratios"]["a"]["ratio"] == 0.9
    assert stored["keys"][second["key"]]["ratios"]["a"]["ratio"] == 0.95
    verdict = instructions.check(first, stored)
    assert (verdict.more, verdict.less, verdict.missing, verdict.within) == ([], [], [], 3)


def test_counts_are_gated_both_ways(tmp_path, monkeypatch, capsys):
    """Less work than the margin allows fails too, naming the command that records the new figure: a stored figure
    left where it was would let a later change give the gain back unseen."""
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (1_000_000, 0.002), "a/lossless":
                                                            (900_000, 0.002)}, {"a": (0.9, 0.002)})})
    counted(monkeypatch, {"a/stock": 1_000_000, "a/lossless": 891_000})  # the stack 1% faster
    assert instructions.main(check_command(path, "--out", str(tmp_path / "run.json"))) == 1
    out = capsys.readouterr().out
    assert "LESS WORK: a/lossless: 891,000 instructions against 900,000 stored (-1.000%, margin 0.200%)" in out, out
    assert "LESS WORK: a: the lossless stack executes 0.89100x" in out, out
    assert (f"LESS WORK: record the new figure with fastpath-suite counts instructions --points a --variants stock lossless "
            f"--record {path}") in out, out
    assert f"fastpath-suite counts instructions --record {path} --from {tmp_path / 'run.json'}" in out
    # the fix it names works: recording less work needs no flag, and the rerun passes
    assert instructions.main(["--record", str(path), "--from", str(tmp_path / "run.json"), "--quiet"]) == 0
    assert instructions.main(check_command(path)) == 0
    capsys.readouterr()
    # more work: refused by --record unless --accept-more-work, which the check's message names
    counted(monkeypatch, {"a/stock": 1_000_000, "a/lossless": 900_000})
    assert instructions.main(check_command(path, "--out", str(tmp_path / "back.json"))) == 1
    out = capsys.readouterr().out
    assert (f"fastpath-suite counts instructions --points a --variants stock lossless --record {path} --accept-more-work"
            in out), out
    before = path.read_text()
    assert instructions.main(["--record", str(path), "--from", str(tmp_path / "back.json"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "MORE WORK: a/lossless: 900,000 against 891,000 stored" in out and "--accept-more-work" in out, out
    assert path.read_text() == before
    assert instructions.main(["--record", str(path), "--from", str(tmp_path / "back.json"), "--accept-more-work",
                              "--quiet"]) == 0
    assert instructions.load_stored(path)["keys"][KEY]["counts"]["a/lossless"]["count"] == 900_000


@pytest.mark.parametrize("count, margin, says", [
    (0, 0.002, "the stored count of a/stock is 0, not a positive whole number"),
    (-5, 0.002, "the stored count of a/stock is -5"),
    (1.5, 0.002, "the stored count of a/stock is 1.5"),
    ("1000", 0.002, "the stored count of a/stock is '1000'"),
    (1000, None, "a/stock has margin None"),
    (1000, 0, "a/stock has margin 0"),
])
def test_a_stored_count_that_cannot_be_used_is_an_error_naming_the_fix(tmp_path, monkeypatch, capsys, count, margin,
                                                                        says):
    """A stored 0 once raised ZeroDivisionError (a traceback); every unusable stored figure is exit 2 and a message
    that says to restore the file from git or record it again."""
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (count, margin), "a/lossless": (900, 0.002)},
                                                           {"a": (0.9, 0.002)})})
    if margin is None:
        data = json.loads(path.read_text())
        del data["keys"][KEY]["counts"]["a/stock"]["margin"]
        path.write_text(json.dumps(data))
    counted(monkeypatch, {"a/stock": 1000, "a/lossless": 900})
    assert instructions.main(check_command(path)) == 2
    err = capsys.readouterr().err
    assert says in err and f"git checkout -- {path}" in err and "--record" in err, err
    assert "Traceback" not in err


def test_a_margin_is_derived_from_the_spread_of_its_runs(tmp_path):
    """Two machine kinds: the figure is the median of their medians, the margin 5 x the larger of the pooled
    within-kind sd and the farther kind's offset (rounded up to 0.001%), never below the floor."""
    path = tmp_path / "stored.json"

    def run(kind, stock, i):
        return {"key": KEY, "counts": {"a/stock": stock, "a/lossless": stock // 2}, "kind": kind, "source": str(i),
                "machine": {}}

    figures = instructions.record([run("one", 1_000_000, 1), run("one", 1_002_000, 2), run("two", 1_004_000, 3)],
                                  path)
    entry = instructions.load_stored(path)["keys"][KEY]["counts"]["a/stock"]
    # kind one's median 1,001,000, kind two's 1,004,000: the figure 1,002,500, each kind 1,500 (0.1496%) from it;
    # the sd within kind one, log(1.002) / sqrt(2) = 0.1413%, is the smaller
    assert entry["count"] == 1_002_500 and entry["runs"] == 3
    assert entry["margin"] == pytest.approx(0.00749, abs=1e-12), entry
    assert entry["margin_from"]["machine_kinds"] == 2
    assert figures["counts"]["a/stock"]["machines"]["one"]["runs"] == 2
    # a single run measures no spread: the stored margin stays, and a first figure gets the fallback
    instructions.record([run("one", 1_001_000, 4)], path)
    again = instructions.load_stored(path)["keys"][KEY]["counts"]["a/stock"]
    assert again["count"] == 1_001_000 and again["margin"] == entry["margin"]
    instructions.record([run("one", 1_000_000, 5) | {"key": "callgrind-3.22.0-avx2__torch-2__omnivoice-1"}], path)
    fresh = instructions.load_stored(path)["keys"]["callgrind-3.22.0-avx2__torch-2__omnivoice-1"]["counts"]
    assert fresh["a/stock"]["margin"] == instructions.FALLBACK_MARGIN
    with pytest.raises(instructions.InstructionsError, match="the same run given twice"):
        instructions.record([run("one", 1_000_000, 6), run("one", 1_000_000, 7)], tmp_path / "other.json")


def test_a_count_is_made_in_the_context_of_a_whole_run(tmp_path, monkeypatch):
    """Counting one call alone hands the valgrind child every counting point of its size (stock, then the stack, in
    the points' order) to warm up and make in turn, and names the one to count: the calls before a counted call are
    those of a whole run, whatever was asked."""
    from harness.counts import calls

    started = []

    class Child:
        returncode = 1

        def __init__(self, command, **kwargs):
            started.append(command)

        def wait(self):
            return 1

        def kill(self):
            pass

    monkeypatch.setattr(instructions, "valgrind_version", lambda: "3.19.0")
    monkeypatch.setattr(instructions.subprocess, "Popen", Child)
    with pytest.raises(instructions.InstructionsError, match="exited 1"):
        instructions.count(["clone3-short-2"], ["lossless"], keep=tmp_path, quiet=True)
    spec = json.loads((tmp_path / "tiny" / "spec.json").read_text())
    assert spec["points"] == [p.name for p in calls.load_points() if p.size == "tiny"]
    assert spec["variants"] == ["stock", "lossless"] and spec["counted"] == ["clone3-short-2/lossless"], spec
    assert started and started[0][-1] == str(tmp_path / "tiny" / "spec.json")


def test_the_key_names_no_vendor_and_old_keys_migrate(tmp_path):
    """Intel's count of auto-short-2 fell within the AMD machines' spread (docs/nightly.md), so the key no longer
    splits by vendor; keys written with the vendor read as today's, in run files and in a history."""
    from harness.nightly import history

    assert instructions.device_key("3.19.0", "AVX2", {"torch": "2.14.1", "omnivoice": "0.2.1"}) == KEY
    for old in ("callgrind-3.19.0-amd-avx2__torch-2.14.1__omnivoice-0.2.1",
                "callgrind-3.19.0-intel-avx2__torch-2.14.1__omnivoice-0.2.1"):
        assert instructions.migrated_key(old) == KEY
    assert instructions.migrated_key(KEY) == KEY
    assert instructions.migrated_key("cpu-amd-epyc-avx2-2c-2t__torch-2.14.1__omnivoice-0.2.1") == \
        "cpu-amd-epyc-avx2-2c-2t__torch-2.14.1__omnivoice-0.2.1"
    measured = {"counts": {"a/stock": 1000}, "key": KEY, "machine": {"cpu_model": "Test CPU"}}
    old_run, new_run = tmp_path / "old.json", tmp_path / "new.json"
    old_run.write_text(json.dumps(instructions.run_file(measured | {
        "key": "callgrind-3.19.0-amd-avx2__torch-2.14.1__omnivoice-0.2.1"}, "test")))
    new_run.write_text(json.dumps(instructions.run_file(measured | {"counts": {"a/stock": 1001}}, "test")))
    assert [run["key"] for run in instructions.load_runs([old_run])] == [KEY]
    history.append(tmp_path / "history.json", [old_run])
    history.append(tmp_path / "history.json", [new_run])  # a history of the older key takes today's runs
    assert history.load_history(tmp_path / "history.json").device_key == KEY


def test_the_stored_counts_are_consistent():
    """baselines/instructions.json: every key in today's form, with both variants' counts of every counting point,
    each stack-to-stock ratio, and a margin for each from the spread of runs on more than one machine kind; the
    results page's table shows these figures, and every run they were recorded from passes the check."""
    from harness.run import results
    from harness.counts import calls

    stored = instructions.load_stored(instructions.BASELINE)
    points = [p.name for p in calls.load_points()]
    assert stored["keys"], "no key stored"
    for key, figures in stored["keys"].items():
        assert instructions.migrated_key(key) == key, key
        assert set(figures["counts"]) == {f"{p}/{v}" for p in points for v in ("stock", "lossless")}, key
        assert set(figures["ratios"]) == set(points), key
        for name, entry in [*figures["counts"].items(), *figures["ratios"].items()]:
            assert entry["margin_from"].get("machine_kinds", 0) >= 2, (key, name, entry["margin_from"])
            assert instructions.MARGIN_FLOOR <= entry["margin"] < instructions.FALLBACK_MARGIN, (key, name, entry)
        for point in points:
            ratio = figures["counts"][f"{point}/lossless"]["count"] / figures["counts"][f"{point}/stock"]["count"]
            assert abs(ratio / figures["ratios"][point]["ratio"] - 1) < figures["ratios"][point]["margin"], point
    shown = [results.load(path)["figures"] for path in sorted((results.RESULTS_DIR / "instructions-margins")
                                                                .glob("*.json"))]
    assert {fig["key"] for fig in shown} == set(stored["keys"]), "results/instructions-margins/ and the stored keys"
    for fig in shown:  # every run the margins were recorded from passes the check
        for run in instructions.load_runs([instructions.REPO_ROOT / name for name in fig["files"]]):
            verdict = instructions.check(run, stored)
            assert (verdict.more, verdict.less, verdict.missing) == ([], [], []), (run["source"], verdict)
        for table, value in (("counts", "count"), ("ratios", "ratio")):
            for name, found in fig[table].items():
                entry = stored["keys"][fig["key"]][table][name]
                assert (found["value"], found["margin"]) == (entry[value], entry["margin"]), (name, found, entry)


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
    from harness.counts import calls

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

    from harness.counts import calls

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


# --- the rule's pieces on their own: machine kinds, spreads, margins, verdicts -------------------------------------

def test_a_run_without_a_full_machine_description_is_of_its_processors_kind_or_unknown():
    xeon = {"cpu_model": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"}
    assert instructions.machine_kind(xeon) == "intel-xeon-gold-6338"
    assert instructions.machine_kind({}) == "unknown"


def test_the_stack_to_stock_ratio_is_taken_only_where_both_variants_were_counted():
    counts = {"a/stock": 1000, "a/lossless": 900, "b/lossless": 50, "c/stock": 10}
    assert instructions.ratios(counts) == {"a": 0.9}


def test_a_figures_spread_is_the_median_of_kinds_medians_with_a_pooled_sd_and_the_farthest_offset():
    """Kind one has 3 runs (2 degrees of freedom), kind two 2 (1): the sd is pooled weighted by them."""
    import math
    import statistics

    one, two = [100.0, 101.0, 103.0], [104.0, 106.0]
    found = instructions.spread({"one": one, "two": two})
    value = (101.0 + 105.0) / 2  # the median of the kinds' medians, whatever each kind's run count
    logs = [[math.log(x) for x in runs] for runs in (one, two)]
    sd = math.sqrt((2 * statistics.variance(logs[0]) + 1 * statistics.variance(logs[1])) / 3)
    offset = 2.0 / value  # each kind's median is 2 from the figure
    assert found["value"] == value
    assert found["sd"] == pytest.approx(sd, rel=1e-12)
    assert found["offset"] == pytest.approx(offset, rel=1e-12)
    assert found["widest"] == pytest.approx(3.0 / value, rel=1e-12)  # 100 and 106 are 3 from 103
    assert found["margin"] == math.ceil(5 * max(sd, offset) * 1e5) / 1e5
    assert found["machines"] == {
        "one": {"runs": 3, "median": 101.0, "sd": pytest.approx(statistics.stdev(logs[0]), rel=1e-12),
                "range": 3.0 / 101.0},
        "two": {"runs": 2, "median": 105.0, "sd": pytest.approx(statistics.stdev(logs[1]), rel=1e-12),
                "range": 2.0 / 105.0},
    }


def test_identical_runs_get_the_floor_margin_and_one_run_measures_no_spread():
    same = instructions.spread({"one": [1000, 1000], "two": [1000]})
    assert (same["value"], same["sd"], same["offset"], same["widest"], same["margin"]) == (1000, 0.0, 0.0, 0.0,
                                                                                          instructions.MARGIN_FLOOR)
    assert same["machines"]["two"] == {"runs": 1, "median": 1000, "sd": None, "range": 0.0}
    alone = instructions.spread({"one": [1000]})
    assert (alone["sd"], alone["margin"]) == (None, None)


def test_a_change_of_exactly_the_margin_is_within_it_both_ways():
    stored = {"keys": {KEY: {"counts": {"a/stock": {"count": 1000, "margin": 0.5}},
                             "ratios": {"a": {"ratio": 0.5, "margin": 0.5}}}}}
    for stock, lossless in ((1500, 750), (500, 250)):
        verdict = instructions.check({"key": KEY, "counts": {"a/stock": stock, "a/lossless": lossless}}, stored)
        assert (verdict.key, verdict.more, verdict.less, verdict.within) == (KEY, [], [], 2), verdict
        assert verdict.missing == [f"no stored count of a/lossless for {KEY}"]
    verdict = instructions.check({"key": KEY, "counts": {"a/stock": 1501}}, stored)
    assert verdict.more == ["a/stock: 1,501 instructions against 1,000 stored (+50.100%, margin 50.000%)"]
    verdict = instructions.check({"key": KEY, "counts": {"a/stock": 499}}, stored)
    assert verdict.less == ["a/stock: 499 instructions against 1,000 stored (-50.100%, margin 50.000%)"]
    verdict = instructions.check({"key": KEY, "counts": {"a/stock": 1000}}, {"keys": {}})
    assert verdict.missing == [f"no stored counts for device key {KEY} (stored: none)"] and verdict.within == 0


def run_of(kind: str, stock: int, lossless: int, source: str, key: str = KEY) -> dict:
    return {"key": key, "counts": {"a/stock": stock, "a/lossless": lossless}, "kind": kind, "source": source,
            "machine": {"reported": f"{kind} cpu"}}


def test_what_record_returns_says_each_figure_and_how_its_margin_was_derived(tmp_path):
    """Two runs of one kind: each figure the median, its margin from their spread, nothing stored before."""
    path = tmp_path / "stored.json"
    runs = [run_of("one", 1_000_000, 800_000, "r1"), run_of("one", 1_002_000, 800_000, "r2")]
    figures = instructions.record(runs, path)
    assert (figures["key"], figures["rule"], figures["sources"]) == (KEY, instructions.rule(), ["r1", "r2"])
    assert figures["kinds"] == {"one": {"runs": 2, "reported": "one cpu"}}
    assert figures["accepted_more_work"] == []
    stock = figures["counts"]["a/stock"]
    found = instructions.spread({"one": [1_000_000, 1_002_000]})
    assert stock == {"value": 1_001_000, "margin": found["margin"], "sd": found["sd"], "offset": 0.0,
                     "widest": found["widest"], "machines": found["machines"], "stored_before": None}
    assert sorted(figures["ratios"]) == ["a"] and figures["ratios"]["a"]["value"] == pytest.approx(0.8 / 1.001)
    stored = json.loads(path.read_text())
    assert stored["_about"] == instructions.ABOUT and stored["rule"] == instructions.rule()
    assert stored["keys"][KEY]["counts"]["a/stock"] == {
        "count": 1_001_000, "runs": 2, "margin": found["margin"],
        "margin_from": {"runs": 2, "machine_kinds": 1, "sd": found["sd"], "offset": 0.0}}
    # one run more: no spread measured, the stored margin and its derivation kept; stored_before says the old figure
    again = instructions.record([run_of("one", 1_001_500, 800_000, "r3")], path)
    assert again["counts"]["a/stock"]["stored_before"] == 1_001_000
    assert json.loads(path.read_text())["keys"][KEY]["counts"]["a/stock"] == {
        "count": 1_001_500, "runs": 1, "margin": found["margin"],
        "margin_from": {"runs": 2, "machine_kinds": 1, "sd": found["sd"], "offset": 0.0}}


def test_a_first_figure_from_one_run_gets_the_fallback_margin_saying_so(tmp_path):
    path = tmp_path / "stored.json"
    figures = instructions.record([run_of("one", 1000, 500, "r1")], path)
    assert figures["counts"]["a/stock"]["margin"] == instructions.FALLBACK_MARGIN
    assert figures["counts"]["a/stock"]["stored_before"] is None
    entry = json.loads(path.read_text())["keys"][KEY]["counts"]["a/stock"]
    assert entry == {"count": 1000, "runs": 1, "margin": instructions.FALLBACK_MARGIN,
                     "margin_from": {"runs": 1, "fallback": True}}


def test_more_work_is_refused_naming_each_figure_and_the_flag_and_accepted_with_it(tmp_path):
    path = tmp_path / "stored.json"
    instructions.record([run_of("one", 1000, 500, "r1")], path)
    before = path.read_text()
    with pytest.raises(instructions.MoreWorkRefused) as refused:
        instructions.record([run_of("one", 1011, 500, "r2")], path)
    assert str(refused.value) == (
        "MORE WORK: a/stock: 1,011 against 1,000 stored (+1.100%, margin 1.000%)\n"
        f"not stored: these are more work than {path} holds for {KEY}; if the added work is meant, store them with "
        "--accept-more-work (and say why in the commit)")
    assert path.read_text() == before
    figures = instructions.record([run_of("one", 1011, 500, "r2")], path, accept_more_work=True)
    assert figures["accepted_more_work"] == ["a/stock: 1,011 against 1,000 stored (+1.100%, margin 1.000%)"]
    assert json.loads(path.read_text())["keys"][KEY]["counts"]["a/stock"]["count"] == 1011, "accepted, not stored"


def test_a_figure_exactly_its_stored_margin_above_is_not_more_work(tmp_path):
    path = tmp_path / "stored.json"
    instructions.record([run_of("one", 1000, 500, "r1")], path)
    assert instructions.record([run_of("one", 1010, 505, "r2")], path)["accepted_more_work"] == []


def test_runs_of_several_keys_or_none_are_refused_naming_how_many():
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.record([run_of("one", 1, 1, "r1"), run_of("one", 2, 1, "r2", key="other")])
    assert str(err.value) == f"runs of 2 device keys ({KEY}, other): record each key's runs apart"
    with pytest.raises(instructions.InstructionsError, match=r"^runs of 0 device keys \(none\)"):
        instructions.record([])


LOAD_FIX = ("give the run files `fastpath-suite counts instructions --out` wrote, a history of counts or a "
            "results/instructions/ file")


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_runs_are_read_from_run_files_and_results_files_each_with_its_key_kind_and_source(tmp_path):
    from harness.speed import baselines

    machine = {"cpu_model": "Test CPU"}
    run = write(tmp_path / "run.json", {"format": baselines.FORMAT, "device_key": KEY, "machine": machine, "points": {
        "a/stock": {"metric": "instructions", "samples": [1000.0]}, "a/lossless": {"metric": "instructions",
                                                                                     "samples": [900]}}})
    results = write(tmp_path / "results.json", {"format": "fastpath-results", "kind": "instructions",
                                                "machine": machine, "figures": {"key": KEY, "counts": {"a/stock": 7}}})
    runs = instructions.load_runs([run, results])
    assert runs == [
        {"key": KEY, "counts": {"a/stock": 1000, "a/lossless": 900}, "machine": machine, "kind": "test", "source": run},
        {"key": KEY, "counts": {"a/stock": 7}, "machine": machine, "kind": "test", "source": results}]
    assert type(runs[0]["counts"]["a/stock"]) is int


@pytest.mark.parametrize("data, says", [
    ({"format": "fastpath-results", "kind": "quality", "figures": {}}, "format 'fastpath-results' is not a run of "
                                                                       "counts"),
    ([1, 2], "format None is not a run of counts"),
    ({"format": "fastpath-speed-baseline", "device_key": KEY, "points": {"a": {"metric": "rtf", "samples": [1]}}},
     "'a' is not one instruction count"),
    ({"format": "fastpath-speed-baseline", "device_key": KEY, "points": {"a": {"metric": "instructions",
                                                                               "samples": [1, 2]}}},
     "'a' is not one instruction count"),
    ({"format": "fastpath-speed-baseline", "device_key": KEY, "points": {"a": {"metric": "instructions",
                                                                               "samples": [10.5]}}},
     "'a' is not one instruction count"),
    ({"format": "fastpath-speed-baseline", "device_key": KEY, "points": {"a": {"metric": "instructions",
                                                                               "samples": [0]}}},
     "'a' is not one instruction count"),
    ({"format": "fastpath-speed-baseline", "device_key": KEY, "points": {}}, "no device key or no counts"),
    ({"format": "fastpath-speed-baseline", "points": {"a": {"metric": "instructions", "samples": [5]}}},
     "no device key or no counts"),
], ids=["other-results", "not-a-dict", "another-metric", "two-samples", "a-fraction", "zero", "no-counts", "no-key"])
def test_a_file_that_is_not_a_run_of_counts_is_an_error_naming_the_files_to_give(tmp_path, data, says):
    path = write(tmp_path / "x.json", data)
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.load_runs([path])
    assert str(err.value) == f"{path}: {says}; {LOAD_FIX}"


def test_an_unreadable_file_is_an_error_naming_the_files_to_give(tmp_path):
    (tmp_path / "x.json").write_text('{"format": ')
    with pytest.raises(instructions.InstructionsError, match=rf"^{tmp_path / 'x.json'}: not readable \(.*\); "
                                                             rf"give the run files"):
        instructions.load_runs([tmp_path / "x.json"])


def test_the_report_names_each_runs_figures_the_fix_of_each_kind_and_a_summary(capsys):
    stored = {"keys": {KEY: {"counts": {"a/stock": {"count": 1000, "margin": 0.01}},
                             "ratios": {"a": {"ratio": 0.5, "margin": 0.01}}}}}
    runs = [{"key": KEY, "counts": {"a/stock": 1100, "a/lossless": 550}, "source": "r1"},
            {"key": KEY, "counts": {"a/stock": 900}, "source": "r2"}]
    assert instructions.report(runs, stored, ("CMD", "AGAIN"), True) == 1
    record = "CMD (or, without counting again: AGAIN)"
    assert capsys.readouterr().out.splitlines() == [
        "MORE WORK: r1: a/stock: 1,100 instructions against 1,000 stored (+10.000%, margin 1.000%)",
        "MORE WORK: the change adds work to a counted call; find where (`--keep DIR` keeps the callgrind dumps for "
        "callgrind_annotate), or if it is meant, store the new counts: CMD --accept-more-work",
        "LESS WORK: r2: a/stock: 900 instructions against 1,000 stored (-10.000%, margin 1.000%)",
        f"LESS WORK: record the new figure with {record} (left as stored, a later change could give the gain back "
        "unseen)",
        f"MISSING: r1: no stored count of a/lossless for {KEY}; record them: {record} (one run keeps each figure's "
        "stored margin, or 1%; runs from --out given to --from set margins from their spread: docs/nightly.md)",
        "summary: FAILED: 1 figure(s) within their margins, 1 more work, 1 less work, 1 not stored",
    ]


def test_one_run_missing_a_figure_is_not_judged_when_not_strict_and_one_within_passes(capsys):
    stored = {"keys": {KEY: {"counts": {"a/stock": {"count": 1000, "margin": 0.01}}, "ratios": {}}}}
    only = [{"key": KEY, "counts": {"a/stock": 1000, "b/stock": 5}, "source": "r1"}]
    assert instructions.report(only, stored, ("CMD", None), False) == strict.NOT_JUDGED
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"NOT JUDGED: no stored count of b/stock for {KEY}; record them: CMD (one run keeps")
    assert out[1:] == ["summary: not judged: 1 figure(s) within their margins, 0 more work, 0 less work, 1 not stored"]
    assert instructions.report(only[:0] + [{**only[0], "counts": {"a/stock": 1000}}], stored, ("CMD", None),
                               True) == 0
    assert capsys.readouterr().out == ("summary: passed: 1 figure(s) within their margins, 0 more work, 0 less work, "
                                       "0 not stored\n")


@pytest.mark.parametrize("machine, kind", [
    ({"isa": {"capability": "AVX2", "extensions": [], "limits": {}}, "cpu_model": "AMD EPYC 7B13", "usable_cpus": 2,
      "torch_threads": 2}, "cpu-amd-epyc-7b13-avx2-2c-2t"),
    ({"device": "cuda:0", "gpu_name": "NVIDIA H100"}, "cuda-nvidia-h100"),
    ({"device": "cuda:0", "cpu_model": "AMD EPYC 7B13"}, "amd-epyc-7b13"),  # ValueError: no GPU name
    ({"cpu_model": "AMD EPYC 7B13", "isa": {"capability": "AVX2"}}, "amd-epyc-7b13"),  # KeyError: no extensions
    ({"cpu_model": "AMD EPYC 7B13", "isa": 5}, "amd-epyc-7b13"),  # TypeError
], ids=["full", "gpu", "no-gpu-name", "no-extensions", "isa-not-a-dict"])
def test_a_runs_kind_is_its_hardware_key_or_else_its_processors_name(machine, kind):
    assert instructions.machine_kind(machine) == kind


@pytest.mark.parametrize("value, count, whole, ratio, margin", [
    (1, True, True, True, False),
    (1000, True, True, True, False),
    (1000.0, False, True, True, False),
    (0, False, False, False, False),
    (-3, False, False, False, False),
    (True, False, False, False, False),
    ("5", False, False, False, False),
    (None, False, False, False, False),
    (0.5, False, False, True, True),
    (0.999, False, False, True, True),
    (1e-9, False, False, True, True),
    (1.5, False, False, True, False),
    (-0.5, False, False, False, False),
    (float("inf"), False, False, False, False),
    (float("nan"), False, False, False, False),
])
def test_counts_ratios_and_margins_are_told_apart(value, count, whole, ratio, margin):
    """A stored count: a positive int; a count read from a run: a positive whole number (a history's 1000.0); a
    ratio: a positive finite number; a margin: a ratio below 1."""
    assert (instructions.is_count(value), instructions.is_whole(value), instructions.is_ratio(value),
            instructions.is_margin(value)) == (count, whole, ratio, margin)


def stored_fix(where: str) -> str:
    return (f"restore {where} from git (`git checkout -- {where}`), or record the figure again "
            f"(`fastpath-suite counts instructions --record {where} --from RUN ...`, docs/nightly.md)")


GOOD_KEYS = {KEY: {"counts": {"a/stock": {"count": 1000, "margin": 0.01}}, "ratios": {"a": {"ratio": 0.9,
                                                                                             "margin": 0.01}}}}
CURRENT = {"format": instructions.FORMAT, "format_version": instructions.FORMAT_VERSION}


@pytest.mark.parametrize("stored, says", [
    ([], 'W is not a file of stored counts (no "format": "fastpath-instructions"): {fix}'),
    ({"format": "other", "keys": {}}, 'W is not a file of stored counts (no "format": "fastpath-instructions"): {fix}'),
    ({"floor": 0.01, "keys": {}}, "W is in the older format (one floor for every count, no margins): record runs into "
                                  "it with `fastpath-suite counts instructions --record W --from RUN ...`, which "
                                  "converts it (docs/nightly.md)"),
    ({"format": instructions.FORMAT, "format_version": 1, "keys": GOOD_KEYS},
     "W has format_version 1, this suite reads 2: {fix}"),
    ({"format": instructions.FORMAT, "keys": GOOD_KEYS}, "W has format_version None, this suite reads 2: {fix}"),
    (CURRENT | {"keys": []}, 'W has no "keys": {fix}'),
    (CURRENT | {"keys": {KEY: []}}, f'W: {KEY} lacks its "counts" or its "ratios": {{fix}}'),
    (CURRENT | {"keys": {KEY: {"counts": {}}}}, f'W: {KEY} lacks its "counts" or its "ratios": {{fix}}'),
    (CURRENT | {"keys": {KEY: {"ratios": {}, "counts": []}}}, f'W: {KEY} lacks its "counts" or its "ratios": {{fix}}'),
    (CURRENT | {"keys": {KEY: GOOD_KEYS[KEY] | {"ratios": {"a": {"ratio": 0, "margin": 0.01}}}}},
     f"W: {KEY}: the stored ratio of a is 0, not a positive number: {{fix}}"),
    (CURRENT | {"keys": {KEY: GOOD_KEYS[KEY] | {"ratios": {"a": 0.9}}}},
     f"W: {KEY}: the stored ratio of a is 0.9, not a positive number: {{fix}}"),
    (CURRENT | {"keys": {KEY: GOOD_KEYS[KEY] | {"counts": {"a/stock": 1000}}}},
     f"W: {KEY}: the stored count of a/stock is 1000, not a positive whole number: {{fix}}"),
    (CURRENT | {"keys": {KEY: GOOD_KEYS[KEY] | {"ratios": {"a": {"ratio": 0.9, "margin": 1}}}}},
     f"W: {KEY}: a has margin 1, not a share between 0 and 1: {{fix}}"),
], ids=["not-a-dict", "another-format", "older-format", "another-version", "no-version", "no-keys", "key-not-a-dict",
        "no-ratios", "counts-not-a-dict", "ratio-zero", "ratio-bare", "count-bare", "margin-one"])
def test_stored_counts_that_cannot_be_used_are_named_with_their_fix(stored, says):
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.check_stored(stored, "W")
    assert str(err.value) == says.format(fix=stored_fix("W"))


def test_usable_stored_counts_are_returned_as_they_are():
    stored = CURRENT | {"keys": GOOD_KEYS}
    assert instructions.check_stored(stored, "W") is stored
    assert instructions.check_stored(CURRENT | {"keys": {}}, "W") == CURRENT | {"keys": {}}


def test_record_replaces_an_unusable_figure_of_a_current_file_and_refuses_a_file_it_cannot_read(tmp_path):
    """A file in today's format is recorded into as it is: a figure whose stored margin cannot be used is replaced
    (with the fallback margin, no stored figure before it). A file in another format or version, or not JSON, is
    refused naming the fix, and left as it was."""
    path = stored_counts(tmp_path / "stored.json", {KEY: ({"a/stock": (1000, 5)}, {})})  # margin 5: not a share
    figures = instructions.record([run_of("one", 1000, 500, "r1")], path)
    assert figures["counts"]["a/stock"]["stored_before"] is None
    entry = instructions.load_stored(path)["keys"][KEY]["counts"]["a/stock"]
    assert (entry["count"], entry["margin"]) == (1000, instructions.FALLBACK_MARGIN)
    for data, says in (({"format": instructions.FORMAT, "format_version": 1, "keys": {}},
                        f"{path} has format_version 1, this suite reads 2: {stored_fix(str(path))}"),
                       ({"format": "other", "format_version": 2, "keys": {}},
                        f'{path} is not a file of stored counts (no "format": "fastpath-instructions"): '
                        f'{stored_fix(str(path))}')):
        path.write_text(json.dumps(data))
        with pytest.raises(instructions.InstructionsError) as err:
            instructions.record([run_of("one", 1000, 500, "r1")], path)
        assert str(err.value) == says
        assert json.loads(path.read_text()) == data
    path.write_text("{")
    with pytest.raises(instructions.InstructionsError, match=rf"^{path} is not readable JSON \(.*\): restore it from "
                                                             rf"git \(`git checkout -- {path}`\)$"):
        instructions.record([run_of("one", 1000, 500, "r1")], path)


def test_record_converts_a_file_of_the_older_format_keeping_its_floor_as_each_counts_margin(tmp_path):
    path = tmp_path / "stored.json"
    old_key = KEY.replace("3.19.0-", "3.19.0-amd-")
    path.write_text(json.dumps({"floor": 0.02, "keys": {old_key: {"a/stock": 1000, "b/stock": 70}}}))
    figures = instructions.record([run_of("one", 1015, 500, "r1")], path)  # 1.5% up: within the old 2% floor
    assert figures["counts"]["a/stock"]["stored_before"] == 1000 and figures["accepted_more_work"] == []
    stored = instructions.load_stored(path)
    assert stored["keys"][KEY]["counts"]["b/stock"] == {"count": 70, "margin": 0.02,
                                                        "margin_from": {"older_format": True}}
    assert stored["keys"][KEY]["counts"]["a/stock"]["margin"] == 0.02  # one run: the stored margin kept
    path.write_text(json.dumps({"floor": 1, "keys": {old_key: {"a/stock": 1000}}}))
    with pytest.raises(instructions.InstructionsError, match="^the stored counts are in the older format and lack a "
                                                             "usable floor or keys: restore them from git"):
        instructions.record([run_of("one", 1000, 500, "r1")], path)


def test_a_history_of_counts_gives_each_night_as_a_run_and_a_broken_one_its_own_error(tmp_path):
    from harness.nightly import history

    measured = {"counts": {"a/stock": 1000}, "key": KEY, "machine": {"cpu_model": "Test CPU"}}
    one, two, path = tmp_path / "one.json", tmp_path / "two.json", tmp_path / "history.json"
    one.write_text(json.dumps(instructions.run_file(measured, "test")))
    two.write_text(json.dumps(instructions.run_file(measured | {"counts": {"a/stock": 1001}}, "test")))
    history.append(path, [one])
    history.append(path, [two])
    nights = history.load_history(path).nights
    runs = instructions.load_runs([path])
    assert [(run["key"], run["counts"], run["kind"], run["source"]) for run in runs] == [
        (KEY, {"a/stock": 1000}, "test", f"{path} (night {nights[0].id})"),
        (KEY, {"a/stock": 1001}, "test", f"{path} (night {nights[1].id})")]
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"format_version": 99}))
    with pytest.raises(history.HistoryError) as expected:
        history.load_history(path)
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.load_runs([path])
    assert str(err.value) == str(expected.value) and str(err.value).startswith(f"{path} has format_version 99")


def test_a_run_without_a_machine_is_of_the_unknown_kind_and_a_results_file_without_figures_is_refused(tmp_path):
    from harness.speed import baselines

    run = write(tmp_path / "run.json", {"format": baselines.FORMAT, "device_key": KEY, "points": {
        "a/stock": {"metric": "instructions", "samples": [5]}}})
    assert instructions.load_runs([run]) == [{"key": KEY, "counts": {"a/stock": 5}, "machine": {}, "kind": "unknown",
                                              "source": run}]
    results = write(tmp_path / "results.json", {"format": "fastpath-results", "kind": "instructions"})
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.load_runs([run, results])
    assert str(err.value) == f"{results}: no device key or no counts; {LOAD_FIX}"


def test_recording_into_a_file_of_another_kind_names_that_file(tmp_path):
    """--record into an existing file that is not stored counts (no "format", no older "floor") is refused naming the
    file it read, so the fix (`git checkout -- FILE`) points at it."""
    path = tmp_path / "not-counts.json"
    path.write_text(json.dumps({"something": "else"}))
    with pytest.raises(instructions.InstructionsError, match=r"not-counts\.json is not a file of stored counts"):
        instructions.record([run_of("one", 1000, 500, "r1")], path)


def test_recording_into_a_file_that_is_not_an_object_is_refused_as_check_stored_names_it(tmp_path):
    """A stored file holding a JSON list is refused before anything is read from it, with check_stored's words."""
    path = tmp_path / "stored.json"
    path.write_text("[]")
    with pytest.raises(instructions.InstructionsError) as expected:
        instructions.check_stored([], str(path))
    with pytest.raises(instructions.InstructionsError) as err:
        instructions.record([run_of("one", 1000, 500, "r1")], path)
    assert str(err.value) == str(expected.value) and str(err.value).startswith(str(path))
    assert json.loads(path.read_text()) == []
