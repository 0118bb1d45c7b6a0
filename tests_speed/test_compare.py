"""The regression rule on synthetic timings, and the compare CLI.

Timings are lognormal (right-skewed like real ones) with a coefficient of variation of a few percent; "drift"
moves a whole rerun by a lognormal factor, as a warmer machine or another kernel build does between runs. No model
is loaded.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from harness.speed.baselines import (
    FORMAT,
    FORMAT_VERSION,
    BaselineError,
    PointSamples,
    load_run,
    save_baseline,
)
from harness.speed.compare import (
    DEFAULT_ALPHA,
    InsufficientSamplesError,
    SpeedVerdict,
    build_parser,
    compare_point,
    compare_speed_runs,
    gate_on_baseline,
    judge_points,
    main as compare_main,
    min_p_value,
    min_samples_for_alpha,
    new_only_points,
    probability,
    should_remeasure,
    slowdown_fraction,
)

REPO = Path(__file__).resolve().parents[1]
KEY = "cpu-test-cpu-2c-2t__torch-2.0.0__omnivoice-0.2.1"
RERUNS = 200  # seeded synthetic reruns per scenario
N = 15  # samples per point and side
CV = 0.04  # within-run coefficient of variation
DRIFT = 0.02  # run-to-run shift (lognormal sigma) of a clean rerun
MEDIAN = 0.40


def timings(rng: np.random.Generator, n: int = N, median: float = MEDIAN, cv: float = CV, drift: float = 0.0) -> tuple:
    """n lognormal timings with the given median and CV, the whole run shifted by a lognormal drift factor."""
    sigma = math.sqrt(math.log1p(cv**2))  # lognormal sigma for this CV
    run_median = median * rng.lognormal(0.0, drift) if drift else median
    return tuple(run_median * rng.lognormal(0.0, sigma, n))


def point(samples, name="p", metric="rtf", max_slowdown=None) -> PointSamples:
    return PointSamples(name=name, metric=metric, samples=tuple(samples), max_slowdown=max_slowdown)


def baseline_dict(points: dict[str, tuple], key: str = KEY, overrides: dict | None = None) -> dict:
    overrides = overrides or {}
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "device_key": key, "machine": {}, "command": "test",
        "points": {name: {"metric": "rtf", "samples": list(s), "max_slowdown": overrides.get(name)}
                   for name, s in points.items()},
    }


def false_alarm_bound(trials: int, alpha: float) -> int:
    """Most false alarms a calibrated level-alpha test gives in `trials` clean reruns, except 1 time in 1000."""
    return int(stats.binom.ppf(0.999, trials, alpha))


# ---- the sample-count floor ------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.002, 0.01, 0.05])
def test_min_samples_for_alpha_agrees_with_scipy_exact_test(alpha):
    n = min_samples_for_alpha(alpha)

    def separated(k: int) -> tuple:  # every new sample slower than every base sample
        return np.arange(k) + 100.0, np.arange(k) + 0.0

    p_at_n = stats.mannwhitneyu(*separated(n), alternative="greater", method="exact").pvalue
    p_below = stats.mannwhitneyu(*separated(n - 1), alternative="greater", method="exact").pvalue
    assert p_at_n < alpha <= p_below, f"n={n}: exact p {p_at_n:.4g} at n, {p_below:.4g} at n-1, alpha {alpha}"
    assert min_p_value(n, n) == pytest.approx(p_at_n)


def test_min_p_value_for_five_against_five_is_one_in_252():
    assert min_p_value(5, 5) == pytest.approx(1 / 252)
    assert min_samples_for_alpha(DEFAULT_ALPHA) > 5


def test_thirty_percent_slowdown_on_three_samples_cannot_reach_alpha():
    rng = np.random.default_rng(3)
    base, new = point(timings(rng, n=3)), point(timings(rng, n=3, median=MEDIAN * 1.3))
    with pytest.raises(InsufficientSamplesError) as info:
        compare_point(base, new)
    message = str(info.value)
    assert f"at least {min_samples_for_alpha(DEFAULT_ALPHA)} samples" in message, message
    assert "1/C(6,3) = 0.05" in message, message


def test_a_twofold_slowdown_with_a_tie_is_flagged():
    """Timings rounded to the millisecond tie easily; the rule's test stays exact (scipy's default would switch to
    the normal approximation at the tie and give p = 0.0025 > alpha: a 2x slowdown passed)."""
    base = point([1.00, 1.01, 1.02, 1.03, 1.04, 1.05])
    new = point([2.0, 2.0, 2.1, 2.2, 2.3, 2.4])
    verdict = compare_point(base, new)
    assert verdict.verdict == "regressed", verdict
    assert verdict.p_value == pytest.approx(min_p_value(6, 6)), verdict.p_value  # the floor check_reachable assumes


# ---- detection and false alarms ----------------------------------------------------------------------------------


def test_flags_a_twenty_percent_slowdown_with_realistic_noise():
    detected = 0
    for seed in range(RERUNS):
        rng = np.random.default_rng(seed)
        base = point(timings(rng, drift=DRIFT))
        new = point(timings(rng, median=MEDIAN * 1.20, drift=DRIFT))
        detected += compare_point(base, new).verdict == "regressed"
    print(f"20% slowdown, CV {CV:.0%}, drift {DRIFT:.0%}, n={N}: detected {detected}/{RERUNS}")
    # Power requirement, not a recorded result: miss at most 3% of real 20% slowdowns.
    assert detected >= 0.97 * RERUNS, f"detected only {detected}/{RERUNS} 20% slowdowns"


@pytest.mark.parametrize("drift", [0.0, DRIFT], ids=["same-machine-state", "run-to-run-drift"])
def test_clean_reruns_do_not_raise_false_alarms(drift):
    alarms = test_alone = 0
    for seed in range(RERUNS):
        rng = np.random.default_rng(10_000 + seed)
        verdict = compare_point(point(timings(rng, drift=drift)), point(timings(rng, drift=drift)))
        alarms += verdict.verdict == "regressed"
        test_alone += verdict.p_value < DEFAULT_ALPHA
    bound = false_alarm_bound(RERUNS, DEFAULT_ALPHA)
    print(f"clean reruns, drift {drift:.0%}: rule {alarms}/{RERUNS} false alarms, Mann-Whitney alone "
          f"{test_alone}/{RERUNS}, binomial bound {bound}")
    assert alarms <= bound, f"{alarms}/{RERUNS} false alarms on clean reruns (bound {bound})"
    if drift == 0.0:  # with no drift the test alone must be calibrated: p < alpha at most alpha of the time
        assert test_alone <= bound, f"p < {DEFAULT_ALPHA} in {test_alone}/{RERUNS} identical reruns (bound {bound})"


def test_five_percent_slowdown_is_not_flagged_even_when_significant():
    rng = np.random.default_rng(5)
    base = point(timings(rng, cv=0.02))
    new = point([s * 1.05 for s in timings(rng, cv=0.02)])
    verdict = compare_point(base, new)
    assert verdict.p_value < DEFAULT_ALPHA, f"setup: expected a significant 5% slowdown, p={verdict.p_value:.3g}"
    assert 0.0 < verdict.change < 0.10 and verdict.verdict == "ok", verdict


def test_large_but_noisy_slowdown_is_not_significant():
    base = point([1.00, 1.10, 1.20, 1.30, 1.40, 1.50])
    new = point([0.90, 1.20, 1.40, 1.50, 1.60, 2.00])  # median +16%, ranks overlap
    verdict = compare_point(base, new)
    assert verdict.change > 0.10 and verdict.p_value >= DEFAULT_ALPHA, verdict
    assert verdict.verdict == "slower-not-significant" and not should_remeasure(verdict)


def test_one_stall_in_the_new_run_does_not_regress():
    rng = np.random.default_rng(7)
    new = list(timings(rng))
    new[4] *= 10  # one page-fault-sized outlier
    verdict = compare_point(point(timings(rng)), point(new))
    assert verdict.verdict == "ok", verdict


def test_a_twenty_percent_speedup_is_faster_and_its_slowdown_p_is_large():
    rng = np.random.default_rng(11)
    verdict = compare_point(point(timings(rng)), point(timings(rng, median=MEDIAN * 0.8)))
    assert verdict.verdict == "faster" and verdict.change < -0.10 and verdict.p_value > 0.5, verdict


def test_per_point_factor_overrides_the_default():
    rng = np.random.default_rng(13)
    base_samples, new_samples = timings(rng), timings(rng, median=MEDIAN * 1.20)
    loose = compare_point(point(base_samples, max_slowdown=0.25), point(new_samples))
    strict = compare_point(point(base_samples), point(new_samples))
    assert (loose.verdict, loose.max_slowdown) == ("ok", 0.25), loose
    assert (strict.verdict, strict.max_slowdown) == ("regressed", 0.10), strict


def test_should_remeasure_only_a_regression():
    fields = dict(name="p", metric="rtf", base_median=1.0, new_median=1.3, change=0.3, p_value=1e-5,
                  max_slowdown=0.1, alpha=0.002, n_base=15, n_new=15)
    assert {v: should_remeasure(SpeedVerdict(verdict=v, **fields)) for v in ("ok", "faster", "slower-not-significant",
            "regressed")} == {"ok": False, "faster": False, "slower-not-significant": False, "regressed": True}


# ---- runs: matching points, devices and formats ----------------------------------------------------------------


def test_compare_runs_over_baseline_and_pytest_benchmark_files():
    rng = np.random.default_rng(17)
    base = baseline_dict({"short": timings(rng), "long": timings(rng)}, overrides={"long": 0.3})
    def bench(name: str, samples) -> dict:
        return {"name": f"test_rtf[{name}]", "extra_info": {"point": name, "rtf_samples": list(samples)},
                "stats": {"data": [1.0]}}

    new = {
        "machine_info": {"fastpath": {"device_key": KEY}},
        "commit_info": {"id": "def456"},
        "benchmarks": [
            bench("short", timings(rng, median=MEDIAN * 1.2)),
            bench("long", timings(rng, median=MEDIAN * 1.2)),
            bench("extra", [0.5] * 6),
        ],
    }
    verdicts = {v.name: v for v in compare_speed_runs(base, new)}
    assert [*verdicts] == ["short", "long"]
    assert verdicts["short"].verdict == "regressed" and verdicts["long"].verdict == "ok", verdicts
    assert new_only_points(base, new) == ["extra"]


def test_a_base_point_missing_from_the_new_run_is_an_error():
    rng = np.random.default_rng(19)
    base = baseline_dict({"short": timings(rng), "long": timings(rng)})
    with pytest.raises(BaselineError, match=r"lacks point\(s\) \['long'\]"):
        compare_speed_runs(base, baseline_dict({"short": timings(rng)}))


def test_runs_from_different_devices_are_refused_unless_allowed():
    rng = np.random.default_rng(23)
    base = baseline_dict({"p": timings(rng)})
    new = baseline_dict({"p": timings(rng)}, key="cuda-nvidia-h200__torch-2.0.0__omnivoice-0.2.1")
    with pytest.raises(BaselineError, match="--allow-device-mismatch"):
        compare_speed_runs(base, new)
    assert len(compare_speed_runs(base, new, allow_device_mismatch=True)) == 1


def test_different_metrics_are_refused():
    rng = np.random.default_rng(29)
    with pytest.raises(BaselineError, match="'rtf' but new measures 'seconds'"):
        compare_point(point(timings(rng)), point(timings(rng), metric="seconds"))


# ---- CLI ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["-0.1", "nan", "inf", "ten"])
def test_slowdown_parser_rejects(text):
    with pytest.raises(Exception) as info:
        slowdown_fraction(text)
    assert info.type.__name__ == "ArgumentTypeError" and "0.10" in str(info.value)


@pytest.mark.parametrize("text", ["0", "1", "1.5", "-0.01", "x"])
def test_alpha_parser_rejects(text):
    with pytest.raises(Exception) as info:
        probability(text)
    assert info.type.__name__ == "ArgumentTypeError" and "0.002" in str(info.value)


def test_parser_defaults_and_bad_option_exit_2(capsys):
    args = build_parser().parse_args(["a.json", "b.json"])
    assert (args.max_slowdown, args.alpha, args.out) == (0.10, 0.002, None)
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["a.json", "b.json", "--alpha", "1.5"])
    assert info.value.code == 2 and "--alpha" in capsys.readouterr().err


def run_cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness.speed.compare", *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # a hang guard, not a bound


def save_run(path: Path, points: dict[str, tuple]) -> Path:
    save_baseline(path, device_key=KEY, machine={}, points={n: {"samples": list(s)} for n, s in points.items()},
                  command="synthetic", commit="test")
    return path


def test_cli_exits_1_on_regression_and_writes_report_and_chart(tmp_path):
    rng = np.random.default_rng(31)
    base = save_run(tmp_path / "base.json", {"short": timings(rng), "long": timings(rng)})
    new = save_run(tmp_path / "new.json", {"short": timings(rng, median=MEDIAN * 1.25), "long": timings(rng)})
    proc = run_cli(base, new, "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSED: short" in proc.stderr
    rows = {line.split()[0]: line.split()[-1] for line in proc.stdout.splitlines()[2:4]}
    assert rows == {"short": "regressed", "long": "ok"}, proc.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| short |" in report and "regressed" in report and "![base vs new samples](chart.png)" in report
    assert (tmp_path / "out" / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert [v["verdict"] for v in verdicts] == ["regressed", "ok"]


def test_cli_exits_0_on_a_clean_rerun(tmp_path):
    rng = np.random.default_rng(37)
    base = save_run(tmp_path / "base.json", {"short": timings(rng)})
    new = save_run(tmp_path / "new.json", {"short": timings(rng)})
    proc = run_cli(base, new, "--max-slowdown", "0.1", "--alpha", "0.002")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "short" in proc.stdout and not (tmp_path / "out").exists()


def test_cli_exits_2_on_a_corrupt_file_with_the_fix(tmp_path):
    rng = np.random.default_rng(41)
    base = save_run(tmp_path / "base.json", {"short": timings(rng)})
    new = tmp_path / "new.json"
    new.write_text(base.read_text()[:100])
    proc = run_cli(base, new)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not valid JSON" in proc.stderr and "truncated" in proc.stderr, proc.stderr


# --- the stored-baseline gate of the speed tests (gate_on_baseline) --------------------------------------------

SAVE = ".venv/bin/python -m pytest tests_speed/test_rtf.py --slow --save-baseline -k baseline"


def config(strict_inputs: bool):
    """A pytest config of the strict mode given (harness.run.strict reads its "strict_inputs" option)."""
    return type("Config", (), {"getoption": staticmethod(lambda name: strict_inputs)})()


def stored_baseline(tmp_path, names) -> Path:
    """baselines/<KEY>.json holding `names`, each with 8 clean timings around MEDIAN."""
    rng = np.random.default_rng(3)
    path = tmp_path / f"{KEY}.json"
    save_baseline(path, device_key=KEY, machine={"device": "cpu"}, command=SAVE,
                  points={name: {"metric": "rtf", "samples": list(timings(rng, n=8))} for name in names})
    return path


def measured(rng, factors: dict) -> dict:
    """{name: 8 timings around factors[name] x MEDIAN}."""
    return {name: point(timings(rng, n=8, median=MEDIAN * factor), name=name) for name, factor in factors.items()}


@pytest.mark.parametrize("strict_inputs", [True, False], ids=["strict", "not-strict"])
def test_a_regression_is_reported_whatever_else_the_baseline_lacks(tmp_path, strict_inputs):
    """The baseline has the first variant and not the second: the first, 2x slower on both measurements, fails the
    test in either mode, before the missing point is said (which alone would skip it under --no-strict-inputs)."""
    path = stored_baseline(tmp_path, ["auto-short-10/stock"])
    rng = np.random.default_rng(4)
    factors = {"auto-short-10/stock": 2.0, "auto-short-10/fastpath": 1.0}
    again = []

    def remeasure():
        again.append(1)
        return measured(rng, factors)

    with pytest.raises(pytest.fail.Exception,
                       match=r"speed regressed:\n  auto-short-10/stock: \+\d+\.\d% slower") as failed:
        gate_on_baseline(config(strict_inputs), path, KEY, measured(rng, factors), SAVE, remeasure)
    assert failed.value.pytrace is False, "the verdict is reported alone, without the harness's traceback"
    assert again == [1], "a regressed point is measured once more before it fails"
    regressed, missing = judge_points(load_run(path).points, measured(rng, factors), path.name)
    assert len(regressed) == 1 and missing == ["auto-short-10/fastpath"], (regressed, missing)


def test_a_regression_not_seen_again_on_the_fresh_samples_passes(tmp_path):
    path = stored_baseline(tmp_path, ["p/stock"])
    rng = np.random.default_rng(5)
    gate_on_baseline(config(True), path, KEY, measured(rng, {"p/stock": 2.0}), SAVE,
                     remeasure=lambda: measured(rng, {"p/stock": 1.0}))


def test_a_point_the_baseline_lacks_fails_naming_the_command_or_is_not_judged(tmp_path):
    """A file of this machine without a measured point is a missing input: strict, a failure naming the command
    that records it; --no-strict-inputs, not judged. The points it has were judged first (none regressed)."""
    path = stored_baseline(tmp_path, ["p/stock"])
    run = measured(np.random.default_rng(6), {"p/stock": 1.0, "p/fastpath": 1.0})
    with pytest.raises(pytest.fail.Exception, match=r"^MISSING INPUT: .* has no point p/fastpath .*record it on this "
                                                    r"machine: .*--save-baseline"):
        gate_on_baseline(config(True), path, KEY, run, SAVE)
    with pytest.raises(pytest.skip.Exception, match=r"^not judged: .* has no point p/fastpath"):
        gate_on_baseline(config(False), path, KEY, run, SAVE)


@pytest.mark.parametrize("strict_inputs", [True, False], ids=["strict", "not-strict"])
def test_no_baseline_for_this_machine_is_not_judged_in_either_mode(tmp_path, strict_inputs):
    """A wall-time figure can only be recorded on the machine it describes: with no file for this device key the
    gate is not judged, strict or not, and the reason names the command that records it."""
    run = measured(np.random.default_rng(7), {"p/stock": 2.0})
    with pytest.raises(pytest.skip.Exception, match=r"^not judged: no speed baseline for this machine .*"
                                                    r"record it on this machine: .*--save-baseline"):
        gate_on_baseline(config(strict_inputs), tmp_path / f"{KEY}.json", KEY, run, SAVE)


@pytest.mark.parametrize("text, match", [
    ('{"format": "fastpath-speed-baseline", "format_version": 1, "device_key": "cpu-other", "points": {}}',
     "is for device key 'cpu-other'"),
    ('{"points": ', "not valid JSON"),
], ids=["another-machine", "truncated"])
def test_a_corrupt_or_foreign_baseline_is_an_error(tmp_path, text, match):
    path = tmp_path / f"{KEY}.json"
    path.write_text(text)
    with pytest.raises(BaselineError, match=match):
        gate_on_baseline(config(True), path, KEY, measured(np.random.default_rng(8), {"p/stock": 1.0}), SAVE)


# --- a GPU runner's gate: its own card's baseline, or a failure naming how to record it ----------------------------

GPU_KEY = "cuda-nvidia-h100-80gb-hbm3__torch-2.14.1-cu130__omnivoice-0.2.1"
GPU_SAVE = "python -m pytest -m cuda tests_speed/test_gpu_speed.py --save-baseline"


def gpu_baseline(folder: Path, key: str, factor: float = 1.0) -> Path:
    path = folder / f"{key}.json"
    save_baseline(path, device_key=key, machine={"device": "cuda"}, command=GPU_SAVE,
                  points={"p/gpu@bf16": {"metric": "rtf", "samples": list(timings(np.random.default_rng(9), n=8,
                                                                                    median=MEDIAN * factor))}})
    return path


@pytest.mark.parametrize("stored, worse", [
    ("cuda-nvidia-h100-80gb-hbm3__torch-2.11.0-cu130__omnivoice-0.2.1", "torch-2.11.0-cu130 where this machine has "
                                                                         "torch-2.14.1-cu130"),
    ("cuda-nvidia-h100-80gb-hbm3__torch-2.14.1-cu130__omnivoice-0.2.0", "omnivoice-0.2.0 where this machine has "
                                                                         "omnivoice-0.2.1"),
    (None, None),
], ids=["older-torch", "older-omnivoice", "none"])
def test_a_gpu_runner_without_its_own_baseline_fails_naming_the_record_command_and_the_near_misses(tmp_path, stored,
                                                                                                worse):
    """On a GPU runner a stored baseline is a missing input (strict: a failure; lenient: not judged), and the message
    names the same card's baselines that another torch or omnivoice keeps from matching. Another card's is no near
    miss."""
    gpu_baseline(tmp_path, "cuda-nvidia-h200__torch-2.14.1-cu130__omnivoice-0.2.1")
    if stored:
        gpu_baseline(tmp_path, stored)
    run = measured(np.random.default_rng(10), {"p/gpu@bf16": 1.0})
    with pytest.raises(pytest.fail.Exception) as failed:
        gate_on_baseline(config(True), tmp_path / f"{GPU_KEY}.json", GPU_KEY, run, GPU_SAVE, absent="missing")
    text = str(failed.value)
    assert text.startswith(f"MISSING INPUT: no speed baseline for this machine ({GPU_KEY})"), text
    assert f"record it on this machine: {GPU_SAVE}" in text and "h200" not in text, text
    assert (worse in text) if worse else "the same hardware has only" not in text, text
    with pytest.raises(pytest.skip.Exception, match="^not judged: no speed baseline for this machine"):
        gate_on_baseline(config(False), tmp_path / f"{GPU_KEY}.json", GPU_KEY, run, GPU_SAVE, absent="missing")


def test_a_gpu_runner_with_its_own_baseline_is_judged_by_it(tmp_path):
    path = gpu_baseline(tmp_path, GPU_KEY)
    rng = np.random.default_rng(11)
    gate_on_baseline(config(True), path, GPU_KEY, measured(rng, {"p/gpu@bf16": 1.0}), GPU_SAVE, absent="missing")
    with pytest.raises(pytest.fail.Exception, match="speed regressed"):
        gate_on_baseline(config(True), path, GPU_KEY, measured(rng, {"p/gpu@bf16": 2.0}), GPU_SAVE,
                         remeasure=lambda: measured(rng, {"p/gpu@bf16": 2.0}), absent="missing")


def bench_run(folder: Path, key: str, factor: float) -> Path:
    path = folder / "new.json"
    save_baseline(path, device_key=key, machine={"device": "cuda"}, command="fastpath-suite bench ...",
                  points={"p/gpu@bf16": {"metric": "rtf", "samples": list(timings(np.random.default_rng(12), n=8,
                                                                                    median=MEDIAN * factor))}})
    return path


def test_compare_stored_finds_the_baseline_of_the_new_runs_device_key(tmp_path, monkeypatch, capsys):
    """`fastpath-suite compare stored NEW`: the baseline stored for NEW's device key, never a file named by hand for
    another torch (the documented GPU example once named one that no runner of the pinned torch matches)."""
    import harness

    monkeypatch.setattr(harness, "BASELINES", tmp_path / "baselines")
    gpu_baseline(tmp_path / "baselines", "cuda-nvidia-h100-80gb-hbm3__torch-2.11.0-cu130__omnivoice-0.2.1")
    assert compare_main(["stored", str(bench_run(tmp_path, GPU_KEY, 1.0))]) == 2
    err = capsys.readouterr().err
    assert "no speed baseline for this machine" in err and "torch-2.11.0-cu130 where this machine has" in err, err
    assert "--save-baseline" in err, err
    gpu_baseline(tmp_path / "baselines", GPU_KEY)
    assert compare_main(["stored", str(bench_run(tmp_path, GPU_KEY, 1.0))]) == 0
    assert compare_main(["stored", str(bench_run(tmp_path, GPU_KEY, 2.0))]) == 1


@pytest.mark.parametrize("new_median, change, verdict", [
    (0.0, 0.0, "ok"),  # no wait on either side
    (0.05, math.inf, "ok"),  # a wait inside the slack: no ratio to a zero base, and not worse
    (0.1, math.inf, "ok"),  # exactly the slack is allowed
    (0.2, math.inf, "regressed"),  # past it
])
def test_a_wait_the_base_never_had_is_judged_by_its_slack_in_seconds(new_median, change, verdict):
    spread = [0.0] if new_median == 0.0 else [-0.004, -0.002, 0.0, 0.002, 0.004]
    new = [new_median + spread[i % len(spread)] for i in range(N)]
    got = compare_point(point([0.0] * N, metric="underrun"), point(sorted(new), metric="underrun"))
    assert got.new_median == pytest.approx(new_median, abs=1e-12)
    assert (got.change, got.verdict) == (change, verdict)


# --- each field of a verdict, each boundary of the rule ----------------------------------------------------------

BASE7 = (0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03)  # median exactly 1.0


def scaled(factor: float) -> tuple:
    """BASE7 moved so that its median is exactly `factor`, its samples all above (factor > 1) or below the base's."""
    return tuple(factor + (x - 1.0) for x in BASE7)


def test_a_verdict_carries_every_figure_it_was_judged_by_with_the_default_factor_and_alpha():
    """Seven samples all slower than seven: p is the exact floor 1/C(14, 7), the change new/base - 1."""
    verdict = compare_point(point(BASE7, name="short"), point(scaled(2.0), name="short"))
    assert verdict == SpeedVerdict(name="short", metric="rtf", base_median=1.0, new_median=2.0, change=1.0,
                                   p_value=pytest.approx(1 / math.comb(14, 7)), verdict="regressed", max_slowdown=0.10,
                                   alpha=0.002, n_base=7, n_new=7)


def test_uneven_sample_counts_are_counted_on_their_own_side():
    verdict = compare_point(point(BASE7), point(scaled(2.0)[:6]))
    assert (verdict.n_base, verdict.n_new) == (7, 6)
    assert verdict.p_value == pytest.approx(min_p_value(7, 6)) == pytest.approx(1 / math.comb(13, 6))


def test_a_looser_alpha_lets_fewer_samples_be_judged_and_is_carried_into_the_verdict():
    """4 against 4 can reach p = 1/70 < 0.05 but not 0.002: the alpha given decides whether they can be judged."""
    base, new = point(BASE7[:4]), point(scaled(2.0)[:4])
    verdict = compare_point(base, new, alpha=0.05, max_slowdown=0.5)
    assert (verdict.verdict, verdict.alpha, verdict.max_slowdown) == ("regressed", 0.05, 0.5)
    with pytest.raises(InsufficientSamplesError):
        compare_point(base, new)


@pytest.mark.parametrize("factor, verdict", [(1.5, "ok"), (1.51, "regressed"), (0.5, "ok"), (0.49, "faster")])
def test_a_change_of_exactly_the_factor_is_allowed_either_way(factor, verdict):
    got = compare_point(point(BASE7), point(scaled(factor)), max_slowdown=0.5)
    assert got.change == pytest.approx(factor - 1.0, abs=1e-12)
    assert got.verdict == verdict, got


def test_a_large_speedup_that_noise_could_explain_is_ok_not_faster():
    base = (0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0)
    new = (0.4, 0.6, 0.7, 0.7, 0.7, 1.5, 2.5)
    assert stats.mannwhitneyu(new, base, alternative="less", method="exact").pvalue > DEFAULT_ALPHA
    got = compare_point(point(base), point(new))
    assert (got.change, got.verdict) == (pytest.approx(-0.3), "ok")


def test_at_exactly_the_smallest_reachable_p_the_samples_cannot_be_judged():
    """3 against 3 reach p = 1/20 at best: at alpha = 0.05 that is not below alpha, so it is refused naming the fix."""
    with pytest.raises(InsufficientSamplesError) as refused:
        compare_point(point(BASE7[:3], name="short"), point(scaled(2.0)[:3], name="short"), alpha=1 / 20)
    assert str(refused.value) == (
        "point 'short': 3 base against 3 new samples can never give an exact Mann-Whitney p below alpha=0.05 (the "
        "smallest possible p is 1/C(6,3) = 0.05), so a regression could never be flagged. Measure at least 4 samples "
        "per point on both sides, or raise alpha.")
    assert compare_point(point(BASE7[:4]), point(scaled(2.0)[:4]), alpha=1 / 20).verdict == "regressed"


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5])
def test_an_alpha_outside_zero_to_one_is_refused_naming_it(alpha):
    with pytest.raises(ValueError) as err:
        min_samples_for_alpha(alpha)
    assert str(err.value) == f"alpha must be in (0, 1), got {alpha!r}"


def test_the_smallest_p_counts_the_arrangements_of_both_sides():
    assert min_p_value(2, 3) == pytest.approx(1 / 10) and min_p_value(1, 1) == pytest.approx(1 / 2)


def test_the_factor_and_alpha_given_reach_every_points_verdict_in_base_order():
    base = baseline_dict({"b": BASE7, "a": BASE7}, overrides={"a": 0.9})
    new = baseline_dict({"a": scaled(1.3), "b": scaled(1.3)})
    verdicts = compare_speed_runs(base, new, max_slowdown=0.5, alpha=0.01)
    assert [(v.name, v.max_slowdown, v.alpha, v.verdict) for v in verdicts] == [("b", 0.5, 0.01, "ok"),
                                                                               ("a", 0.9, 0.01, "ok")]
    assert [v.verdict for v in compare_speed_runs(base, new)] == ["regressed", "ok"]


def test_a_run_that_records_no_device_key_is_compared_with_any():
    base, new = baseline_dict({"p": BASE7}), baseline_dict({"p": BASE7}, key=None)
    assert [v.verdict for v in compare_speed_runs(base, new)] == ["ok"]
    assert [v.verdict for v in compare_speed_runs(new, base)] == ["ok"]


def test_the_device_mismatch_error_names_both_runs_and_keys_and_the_flag():
    base = baseline_dict({"p": BASE7})
    other = "cuda-nvidia-h200__torch-2.0.0__omnivoice-0.2.1"
    with pytest.raises(BaselineError) as refused:
        compare_speed_runs(base, baseline_dict({"p": BASE7}, key=other))
    assert str(refused.value) == (
        f"base (base) was measured on {KEY!r} but new (new) on {other!r}; speed only compares on the same device "
        "key. Compare runs from the same machine, or pass allow_device_mismatch=True (--allow-device-mismatch) to "
        "compare anyway.")


def test_each_judged_point_is_printed_saying_whether_it_was_measured_twice(capsys):
    stored = {"slow": point(BASE7, name="slow"), "same": point(BASE7, name="same")}
    measured = {"slow": point(scaled(2.0), name="slow"), "same": point(BASE7, name="same"),
                "new": point(BASE7, name="new")}
    regressed, missing = judge_points(stored, measured, "k.json",
                                      remeasure=lambda: {"slow": point(scaled(2.0), name="slow")})
    assert regressed == [f"slow: +100.0% slower (p={1 / math.comb(14, 7):.2g}) vs k.json"] and missing == ["new"]
    tied = stats.mannwhitneyu(BASE7, BASE7, alternative="greater", method="exact").pvalue
    assert capsys.readouterr().out.splitlines() == [
        f"slow: base 1.000 new 2.000 change +100.0% p {1 / math.comb(14, 7):.2g} -> regressed (measured twice)",
        f"same: base 1.000 new 1.000 change +0.0% p {tied:.2g} -> ok",
    ]
    judge_points(stored, {"slow": point(scaled(2.0), name="slow")}, "k.json")
    assert capsys.readouterr().out.endswith("-> regressed\n"), "judged once without a remeasure"


def test_an_unknown_absent_mode_is_refused_naming_both(tmp_path):
    with pytest.raises(ValueError) as err:
        gate_on_baseline(config(True), tmp_path / "x.json", KEY, {}, SAVE, absent="skip")
    assert str(err.value) == "absent='skip': 'not judged' or 'missing'"


def test_a_corrupt_baseline_names_the_command_that_records_it_again(tmp_path):
    path = tmp_path / f"{KEY}.json"
    path.write_text('{"points": ')
    with pytest.raises(BaselineError, match=f"re-create it on this machine with: {re.escape(SAVE)}$"):
        gate_on_baseline(config(True), path, KEY, {"p": point(BASE7, name="p")}, SAVE)


def test_the_compare_command_prints_the_table_writes_its_three_files_and_exits_1_on_a_regression(tmp_path, capsys):
    from dataclasses import asdict

    from harness.speed.compare import format_table

    base = save_run(tmp_path / "base.json", {"short": BASE7, "long": BASE7})
    new = save_run(tmp_path / "new.json", {"short": scaled(2.0), "long": BASE7})
    out = tmp_path / "out"
    assert compare_main([str(base), str(new), "--out", str(out), "--alpha", "0.01"]) == 1
    expected = compare_speed_runs(load_run(base), load_run(new), alpha=0.01)
    printed, err = capsys.readouterr()
    assert printed == (f"{format_table(expected)}\nwrote {out / 'report.md'}, {out / 'chart.png'} and "
                       f"{out / 'verdicts.json'}\n")
    assert err == "REGRESSED: short\n"
    assert json.loads((out / "verdicts.json").read_text()) == [asdict(v) for v in expected]
    assert "- result: **REGRESSED: short**" in (out / "report.md").read_text().splitlines()
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_compare_commands_factor_and_device_flag_reach_the_rule(tmp_path, capsys):
    base = save_run(tmp_path / "base.json", {"short": BASE7})
    new = tmp_path / "new.json"
    save_baseline(new, device_key="cpu-other", machine={}, points={"short": {"samples": list(scaled(2.0))}},
                  command="synthetic", commit="test")
    assert compare_main([str(base), str(new)]) == 2
    assert capsys.readouterr().err.startswith(f"error: base ({base}) was measured on {KEY!r} but new ")
    assert compare_main([str(base), str(new), "--allow-device-mismatch"]) == 1
    assert compare_main([str(base), str(new), "--allow-device-mismatch", "--max-slowdown", "1.0"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].split()[-1] == "ok" and "wrote" not in printed


def test_an_unstable_point_names_the_limit_and_the_advice(tmp_path, capsys):
    noisy = [1.0, 1.6, 0.9, 2.1, 1.1, 1.5, 1.0]
    base = save_run(tmp_path / "base.json", {"a": BASE7, "b": BASE7})
    new = save_run(tmp_path / "new.json", {"a": BASE7, "b": noisy})
    assert compare_main([str(base), str(new)]) == 3
    assert capsys.readouterr().err.startswith("UNSTABLE: b: a side's samples spread more than 25% of their median, "
                                              "so no verdict; unstable: rerun on an idle machine")
