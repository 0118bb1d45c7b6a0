"""The rule that prints "unstable" instead of a speedup (harness/speed/stability.py), in the bench's table, the
report's and compare's, and progress on stderr. Synthetic samples: the truth is known, no clock."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest

from harness.run.progress import Progress
from harness.speed import bench, compare, stability
from harness.speed.measure import Samples


def samples(name: str, rtf: list, load: float | None = 0.5) -> Samples:
    return Samples(name, (), rtf=list(rtf), load=[load] * len(rtf), first_call_seconds=1.0)


def point(stock: list, lossless: list, load: float | None = 0.5) -> dict:
    return {"stock@fp32": samples("stock@fp32", stock, load), "lossless@fp32": samples("lossless@fp32", lossless, load)}


SPECS = {"stock@fp32": None, "lossless@fp32": None}


@pytest.mark.parametrize("stock, lossless, stable", [
    pytest.param([2.0, 2.02, 1.98], [1.6, 1.61, 1.59], True, id="quiet: ratios agree"),
    # a steady load slows both variants of a round alike: rounds differ by 2x, their ratios do not
    pytest.param([2.0, 4.0, 3.0], [1.6, 3.2, 2.4], True, id="steady load: the rule judges ratios, not load"),
    # load on during one round's stock call only: that round's ratio is 1.5x the others'
    pytest.param([2.0, 3.0, 2.0], [1.6, 1.6, 1.6], False, id="intermittent load: one round disturbed"),
    pytest.param([2.0, 2.0, 2.0], [1.6, 3.2, 1.6], False, id="intermittent load on the variant"),
])
def test_the_rule_judges_the_spread_of_per_round_ratios(stock, lossless, stable):
    judged = stability.judge(point(stock, lossless))
    assert judged.stable is stable, judged
    if not stable:
        assert judged.message == "unstable: rerun on an idle machine (load average 0.5 during the run)"


def test_the_threshold_is_the_stated_fraction_of_the_median():
    limit = stability.MAX_RATIO_SPREAD
    # ratios 1.0, 1.0, 1 + limit: spread = limit / median(=1.0), exactly at the limit: stable; a hair over: not
    at = stability.judge(point([1.0, 1.0, 1.0 + limit], [1.0, 1.0, 1.0]))
    over = stability.judge(point([1.0, 1.0, 1.0 + limit + 1e-3], [1.0, 1.0, 1.0]))
    assert at.stable and not over.stable, (at, over)


def test_fewer_rounds_than_the_rule_needs_are_unjudged_not_stable():
    judged = stability.judge(point([2.0, 2.0], [1.0, 1.0]))
    assert not judged.stable and judged.message.startswith("unjudged: 2 round(s)"), judged


def test_the_bench_table_prints_unstable_instead_of_a_speedup():
    results = {"steady": point([2.0, 4.0, 3.0], [1.6, 3.2, 2.4]), "disturbed": point([2.0, 3.0, 2.0], [1.6, 1.6, 1.6], 3.2)}
    flops = {p: {"stock@fp32": 10, "lossless@fp32": 5} for p in results}
    table = bench.format_table(results, SPECS, None, flops)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "1.25x" in rows["steady"] and "unstable" not in rows["steady"], rows
    assert "unstable" in rows["disturbed"] and "x |" not in rows["disturbed"].split("|")[4], rows
    assert "disturbed: unstable: rerun on an idle machine (load average 3.2 during the run)" in table, table


def test_a_bench_results_file_renders_the_same_verdict():
    results = {"disturbed": point([2.0, 3.0, 2.0], [1.6, 1.6, 1.6], 3.2)}
    figures = bench.figures_of(results, {"stock@fp32": bench.parse_variant("stock", "cpu", "fp32"),
                                         "lossless@fp32": bench.parse_variant("lossless", "cpu", "fp32")},
                               "tiny-x", "cpu", 8, None)
    rendered = bench.render_results(json.loads(json.dumps(figures)))
    assert "unstable: rerun on an idle machine (load average 3.2 during the run)" in rendered, rendered


def baseline(path, samples_by_point: dict):
    from harness.speed.baselines import save_baseline

    save_baseline(path, device_key="cpu-test", machine={}, command="test", commit="0" * 40,
                  points={n: {"metric": "rtf", "samples": s} for n, s in samples_by_point.items()})
    return path


def test_compare_calls_a_point_unstable_when_a_side_spreads_and_exits_3(tmp_path, capsys):
    quiet = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0]
    noisy = [1.0, 1.6, 0.9, 2.1, 1.1, 1.5, 1.0]  # IQR far above a quarter of the median
    base = baseline(tmp_path / "base.json", {"a": quiet, "b": quiet})
    new = baseline(tmp_path / "new.json", {"a": quiet, "b": noisy})
    assert compare.main([str(base), str(new)]) == 3
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("b "))
    assert "unstable" in row and "%" not in row.split("unstable")[0].split()[-1], row
    assert "UNSTABLE: b" in err and "rerun on an idle machine" in err, err
    assert compare.main([str(base), str(baseline(tmp_path / "same.json", {"a": quiet, "b": quiet}))]) == 0


def test_progress_prints_plain_lines_with_an_estimate_when_not_a_terminal():
    stream = io.StringIO()
    progress = Progress("bench", stream=stream)
    with progress.stage("timing", total=3) as step:
        for i in range(3):
            step(f"point round {i}")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[bench] timing: 3 steps", lines
    assert lines[1].startswith("[bench] timing 1/3: point round 0, 0:00 elapsed, about ") and "left" in lines[1], lines
    assert lines[3].startswith("[bench] timing 3/3: point round 2") and "left" not in lines[3], lines
    quiet = io.StringIO()
    with Progress("bench", quiet=True, stream=quiet).stage("timing", total=2) as step:
        step("x")
    assert quiet.getvalue() == ""


def test_a_ratio_spread_is_the_range_of_the_per_round_ratios_over_their_median():
    assert stability.ratio_spread([2.0, 3.0, 2.0], [1.0, 1.0, 1.0]) == 0.5
    assert stability.ratio_spread([4.0, 2.0, 3.0, 2.0], [2.0, 1.0, 1.0, 1.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):  # rounds that do not pair up are refused, not cut to the shorter list
        stability.ratio_spread([2.0, 3.0, 2.0], [1.0, 1.0])


def test_judge_rounds_reports_each_variants_spread_and_the_load_it_was_given():
    judged = stability.judge_rounds([2.0, 3.0, 2.0], {"a": [1.0, 1.0, 1.0], "b": [2.0, 3.0, 2.0]}, load=1.5)
    assert judged == stability.Judgement(False, {"a": 0.5, "b": 0.0}, 1.5, 3)
    assert judged.verdict == "unstable" and judged.message == "unstable: rerun on an idle machine (load average 1.5 " \
                                                              "during the run)"
    assert stability.judge_rounds([1.0, 1.0, 1.0], {"a": [1.0, 1.0, 1.0]}) == stability.Judgement(True, {"a": 0.0},
                                                                                                None, 3)


def test_two_rounds_give_spreads_but_no_verdict_and_one_round_gives_neither():
    two = stability.judge_rounds([1.0, 1.0], {"a": [1.0, 1.0]})
    assert two == stability.Judgement(False, {"a": 0.0}, None, 2) and two.verdict == "unjudged"
    assert two.message == "unjudged: 2 round(s); at least 3 show whether the timing holds"
    assert stability.judge_rounds([1.0], {"a": [1.0]}, load=0.3) == stability.Judgement(False, {}, 0.3, 1)


def test_the_highest_load_seen_by_any_variant_is_named_and_none_when_none_was_read():
    judged = stability.judge({"stock@fp32": samples("stock@fp32", [2.0, 3.0, 2.0], 0.5),
                              "lossless@fp32": samples("lossless@fp32", [1.0, 1.0, 1.0], 2.5)})
    assert (judged.load, judged.spreads, judged.stable) == (2.5, {"lossless@fp32": 0.5}, False)
    unread = stability.judge(point([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], load=None))
    assert (unread.load, unread.stable, unread.message) == (None, True, "stable")
    assert stability.advice(None) == "unstable: rerun on an idle machine"


def test_a_samples_spread_is_its_iqr_over_its_median_and_one_sample_spreads_nothing():
    assert stability.sample_spread([1.0, 1.0, 1.25, 1.0, 0.75]) == 0.25  # quartiles 0.875 and 1.125
    assert stability.sample_spread([2.0]) == 0.0


AT_LIMIT = [0.875, 0.875, 1.0, 1.0, 1.0, 1.125, 1.125]  # IQR 0.25 x the median: exactly MAX_SAMPLE_SPREAD


def test_compare_calls_a_point_unstable_when_either_side_spreads_past_the_limit_not_at_it(tmp_path):
    from harness.speed.baselines import load_run

    assert stability.sample_spread(AT_LIMIT) == stability.MAX_SAMPLE_SPREAD
    noisy = [1.0, 1.6, 0.9, 2.1, 1.1, 1.5, 1.0]
    base = load_run(baseline(tmp_path / "base.json", {"at": AT_LIMIT, "noisy": noisy}))
    new = load_run(baseline(tmp_path / "new.json", {"at": AT_LIMIT, "noisy": AT_LIMIT}))
    verdicts = compare.compare_speed_runs(base, new)
    marked = compare.mark_unstable(verdicts, base, new)
    assert [(v.name, v.verdict) for v in marked] == [("at", "ok"), ("noisy", "unstable")]
    assert marked[1] == replace(verdicts[1], verdict="unstable"), "only the verdict changes"
