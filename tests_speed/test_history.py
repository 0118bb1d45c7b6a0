"""The nightly history file: appending nights, refusing what does not belong, accepting a slowdown; the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.speed.baselines import save_baseline
from harness.nightly.history import HistoryError, accept, append, load_history, main, night_id, save_history

KEY = "cpu-test-avx2-2c-2t__torch-2.14.1__omnivoice-0.2.1"
BUMPED = "cpu-test-avx2-2c-2t__torch-2.15.0__omnivoice-0.2.1"  # the same machine, torch bumped
MACHINE = "cpu-test-avx2-2c-2t"


def run_file(path, medians: dict, date: str, commit: str = "c0ffee", key: str = KEY, spread: float = 0.01):
    """A speed baseline file (the format `bench --save-baseline` writes) with 9 samples per point about `medians`."""
    offsets = np.linspace(-spread, spread, 9)
    points = {name: {"samples": [m * (1 + o) for o in offsets]} for name, m in medians.items()}
    save_baseline(path, device_key=key, machine={"device": "cpu", "cpu_model": "Test CPU", "versions": {"torch": "x"}},
                  points=points, command="test", commit=commit, created_utc=date)
    return path


def nightly(tmp_path, levels: list, point="p", start_day=1, **extra_points):
    """A history with one night per value of `levels` (median of `point`), plus constant `extra_points`."""
    history = tmp_path / "history.json"
    for i, level in enumerate(levels):
        day = start_day + i
        run = run_file(tmp_path / f"run{day}.json", {point: level, **extra_points},
                       f"2026-11-{day:02d}T03:17:00+00:00" if day <= 30 else f"2026-12-{day - 30:02d}T03:17:00+00:00",
                       commit=f"{day:040x}")
        append(history, [run])
    return history


def test_append_creates_then_the_same_run_twice_changes_nothing(tmp_path):
    history = tmp_path / "h.json"
    run = run_file(tmp_path / "r.json", {"a": 0.4, "b": 1.2}, "2026-11-01T03:17:00+00:00")
    h, added = append(history, [run])
    assert added and len(h.nights) == 1 and h.device_key == KEY and h.machine_key == MACHINE
    before = history.read_bytes()
    h, added = append(history, [run])
    assert not added and len(h.nights) == 1
    assert history.read_bytes() == before, "importing the same run again rewrote the history"


def test_nights_are_kept_in_date_order_and_keep_their_samples(tmp_path):
    history = tmp_path / "h.json"
    append(history, [run_file(tmp_path / "late.json", {"a": 0.5}, "2026-11-03T03:17:00+00:00")])
    append(history, [run_file(tmp_path / "early.json", {"a": 0.4}, "2026-11-02T03:17:00+00:00")])
    h = load_history(history)
    assert [n.date[:10] for n in h.nights] == ["2026-11-02", "2026-11-03"]
    assert h.nights[0].median("a") == pytest.approx(0.4)
    assert len(h.nights[0].points["a"]["samples"]) == 9


def test_a_run_of_another_machine_is_refused_naming_the_deliberate_fix(tmp_path, capsys):
    """A night of another machine is refused, naming both machines and the command that starts a new history on
    purpose; that command keeps the old history beside the new one."""
    history = tmp_path / "h.json"
    append(history, [run_file(tmp_path / "a.json", {"a": 0.4}, "2026-11-01T03:17:00+00:00")])
    other_key = "cpu-other-avx512-16c-16t__torch-2.14.1__omnivoice-0.2.1"
    other = run_file(tmp_path / "b.json", {"a": 0.4}, "2026-11-02T03:17:00+00:00", key=other_key)
    with pytest.raises(HistoryError, match="speed only compares on one machine") as err:
        append(history, [other])
    message = str(err.value)
    assert f"'{MACHINE}'" in message and "'cpu-other-avx512-16c-16t'" in message, message
    assert f"`fastpath-suite nightly append {history} {other} --new-history`" in message, message
    assert message == (
        f"{other} was measured on machine 'cpu-other-avx512-16c-16t' (device key {other_key!r}), but {history} is the "
        f"history of machine '{MACHINE}': speed only compares on one machine (new versions of torch, omnivoice or any "
        "package on the same machine are not refused: the night records them, an event on the history). Append it to "
        "that machine's own history (a file that does not exist yet starts one), or start a new history here on "
        f"purpose: `fastpath-suite nightly append {history} {other} --new-history` (the old file is kept beside it).")
    assert len(load_history(history).nights) == 1
    capsys.readouterr()
    assert main(["append", str(history), str(other), "--new-history"]) == 0
    [kept] = [p for p in tmp_path.iterdir() if p.name.startswith("h.before-")]
    assert f"the old one is kept as {kept}" in capsys.readouterr().out
    assert load_history(kept).machine_key == MACHINE and len(load_history(kept).nights) == 1
    new = load_history(history)
    assert new.machine_key == "cpu-other-avx512-16c-16t"
    assert [n.machine["device_key"] for n in new.nights] == [other_key]


def test_the_files_of_one_night_join_and_may_not_measure_a_point_twice(tmp_path):
    history = tmp_path / "h.json"
    tiny = run_file(tmp_path / "tiny.json", {"a": 0.4}, "2026-11-01T03:17:00+00:00")
    full = run_file(tmp_path / "full.json", {"b": 7.0}, "2026-11-01T03:19:00+00:00")
    h, _ = append(history, [tiny, full], labels=["busy-core"])
    assert set(h.nights[0].points) == {"a", "b"} and h.nights[0].labels == ("busy-core",)
    again = run_file(tmp_path / "again.json", {"a": 0.5}, "2026-11-01T03:20:00+00:00")
    with pytest.raises(HistoryError, match="one night measures a point once"):
        append(history, [tiny, again])


def test_a_pytest_benchmark_file_is_a_night(tmp_path):
    data = {"machine_info": {"node": "runner", "fastpath": {"device_key": KEY, "versions": {"torch": "x"}}},
            "commit_info": {"id": "abc"}, "datetime": "2026-11-01T03:17:00",
            "benchmarks": [{"name": "test_rtf", "extra_info": {"point": "auto-short-10", "rtf_samples": [0.4] * 8},
                            "stats": {"data": [1.0] * 8}}]}
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(data))
    h, added = append(tmp_path / "h.json", [path])
    assert added and h.nights[0].commit == "abc" and h.nights[0].points["auto-short-10"]["metric"] == "rtf"
    assert h.nights[0].machine["node"] == "runner"


def corrupt(path):
    path.write_text(path.read_text()[:40])


def foreign(path):
    path.write_text(json.dumps({"format": "fastpath-speed-baseline", "points": {}}))


def old_version(path):
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))


def hand_edited(path):
    data = json.loads(path.read_text())
    data["nights"][0]["points"]["a"]["samples"][0] *= 0.5
    path.write_text(json.dumps(data))


def no_versions(path):
    data = json.loads(path.read_text())
    del data["nights"][0]["versions"]
    path.write_text(json.dumps(data))


def no_samples(path):
    data = json.loads(path.read_text())
    data["nights"][0]["points"]["a"]["samples"] = []
    path.write_text(json.dumps(data))


def edit_night(change):
    def damage(path):
        data = json.loads(path.read_text())
        data["nights"][0] = change(data["nights"][0])
        path.write_text(json.dumps(data))
    return damage


def without(key):
    return lambda night: {k: v for k, v in night.items() if k != key}


def point_without_samples(night):
    night["points"]["a"] = {"metric": "rtf"}
    return night


@pytest.mark.parametrize("damage, phrases", [
    (corrupt, ["not readable JSON", "truncated or corrupt", "Restore"]),
    (foreign, ["not a fastpath speed history", "foreign"]),
    (old_version, ["format_version 99", "this suite reads 1 and 2"]),
    (hand_edited, ["does not match its samples", "edited by hand"]),
    (no_samples, ["'samples' is empty"]),
    (no_versions, ["night 0 lacks its versions", "a change of versions could not be seen", "Restore"]),
    (edit_night(lambda night: [night]), ["night 0 is list, expected an object.", "Restore"]),
    (edit_night(without("date")), ["night 0 lacks ['date'].", "Restore"]),
    (edit_night(lambda night: {**night, "points": {}}), ["night 0 has no points.", "Restore"]),
    (edit_night(point_without_samples), ["night 0: point 'a' has no samples.", "Restore"]),
], ids=["truncated", "foreign", "format-version", "hand-edited", "empty-samples", "no-versions", "not-an-object",
        "no-date", "no-points", "no-samples-field"])
def test_a_bad_history_is_refused_naming_the_fix(tmp_path, damage, phrases):
    history = tmp_path / "h.json"
    append(history, [run_file(tmp_path / "a.json", {"a": 0.4}, "2026-11-01T03:17:00+00:00")])
    damage(history)
    with pytest.raises(HistoryError) as err:
        load_history(history)
    for phrase in phrases:
        assert phrase in str(err.value), str(err.value)


def test_a_missing_history_names_the_command_that_starts_one(tmp_path):
    with pytest.raises(HistoryError, match="fastpath-suite nightly append"):
        load_history(tmp_path / "none.json")


def test_save_is_atomic_when_the_write_fails(tmp_path, monkeypatch):
    history = tmp_path / "h.json"
    h, _ = append(history, [run_file(tmp_path / "a.json", {"a": 0.4}, "2026-11-01T03:17:00+00:00")])
    before = history.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("harness.speed.baselines.os.fsync", broken)
    with pytest.raises(OSError):
        save_history(h, history)
    assert history.read_bytes() == before and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


STEADY = [1.0, 1.004, 0.997, 1.002, 0.999, 1.003, 0.998, 1.001, 1.0, 0.996, 1.004, 1.0]


def test_check_fails_on_a_slowdown_until_it_is_accepted(tmp_path, capsys):
    history = nightly(tmp_path, STEADY + [1.10, 1.101, 1.099], other=0.5)
    out = tmp_path / "out"
    assert main(["check", str(history), "--out", str(out)]) == 1
    alarms = json.loads((out / "alarms.json").read_text())
    assert [a["point"] for a in alarms] == ["p"], alarms
    began = alarms[0]["began"]
    h = load_history(history)
    assert h.nights[len(STEADY)].id == began, "the change was not placed on the night it began"
    assert abs(alarms[0]["change"] - 0.10) < 0.01
    summary = (out / "summary.md").read_text()
    assert "1 slowdown(s): this night fails" in summary and f"--night {began}" in summary
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["accept", str(history), "p", "--night", began, "--reason", "bigger model, on purpose"]) == 0
    capsys.readouterr()
    assert main(["check", str(history)]) == 0
    assert "10.0% slower since" in capsys.readouterr().out.split("Changes found before")[1]
    assert load_history(history).accepted[0]["reason"] == "bigger model, on purpose"


def test_check_passes_a_steady_history_and_says_what_it_learns(tmp_path, capsys):
    history = nightly(tmp_path, STEADY)
    assert main(["check", str(history)]) == 0
    assert "No slowdown open" in capsys.readouterr().out
    (tmp_path / "short").mkdir()
    short = nightly(tmp_path / "short", STEADY[:3])
    assert main(["check", str(short)]) == 0
    assert "learning (3 nights)" in capsys.readouterr().out


def test_accept_refuses_an_unknown_point_or_night_and_an_empty_reason(tmp_path):
    history = nightly(tmp_path, STEADY[:3])
    night = load_history(history).nights[0].id
    with pytest.raises(HistoryError, match="has no point 'q'"):
        accept(history, "q", night, "why")
    with pytest.raises(HistoryError, match="has no night 'nope'"):
        accept(history, "p", "nope", "why")
    with pytest.raises(HistoryError, match="give the reason"):
        accept(history, "p", night, " ")


def test_the_cli_exits_2_with_the_fix_on_bad_input(tmp_path, capsys):
    assert main(["check", str(tmp_path / "none.json")]) == 2
    assert "fastpath-suite nightly append" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["append", str(tmp_path / "h.json"), str(bad)]) == 2
    assert "neither a fastpath speed baseline nor a pytest-benchmark" in capsys.readouterr().err


def test_accept_refuses_a_night_on_which_nothing_began(tmp_path, capsys):
    """Accepting a night where the rule found no slowdown of that point is refused (it exited 0 and recorded it)."""
    history = nightly(tmp_path, STEADY + [1.10, 1.101, 1.099], other=0.5)
    h = load_history(history)
    quiet_night = h.nights[3].id
    with pytest.raises(HistoryError, match="no slowdown of p began on night"):
        accept(history, "p", quiet_night, "why")
    assert main(["accept", str(history), "other", "--night", h.nights[len(STEADY)].id, "--reason", "why"]) == 2
    assert "the rule found no slowdown of it" in capsys.readouterr().err
    assert load_history(history).accepted == []


@pytest.mark.parametrize("alpha", ["0", "-0.01", "nan", "5", "x"])
def test_check_refuses_an_alpha_outside_its_range(tmp_path, capsys, alpha):
    history = nightly(tmp_path, STEADY)
    with pytest.raises(SystemExit) as stop:
        main(["check", str(history), "--alpha", alpha])
    assert stop.value.code == 2 and "(0, 1]" in capsys.readouterr().err


def test_a_wall_time_night_beside_competing_work_is_not_judged(tmp_path, capsys):
    """A night whose run recorded a busy machine (the measuring process waited for a CPU half its time): its wall
    time is shown, not judged, and check exits 3; a 30% slowdown that night raises nothing."""
    history = nightly(tmp_path, STEADY)
    busy = run_file(tmp_path / "busy.json", {"p": 1.3}, "2026-11-20T03:17:00+00:00")
    data = json.loads(busy.read_text())
    data["machine"]["conditions"] = {"load_average": 3.8, "cpus": 2, "steal_share": 0.0, "wait_share": 0.5}
    busy.write_text(json.dumps(data))
    append(history, [busy])
    assert main(["check", str(history)]) == 3
    out = capsys.readouterr().out
    assert "not judged (busy machine)" in out and "waited for a CPU 50%" in out and "SLOWER" not in out


def busy_night(tmp_path, day: int, level: float = 1.0, name: str = "busy", **points):
    """A run measured beside competing work (its process waited for a CPU half its time)."""
    run = run_file(tmp_path / f"{name}{day}.json", {"p": level, **points},
                   f"2026-11-{day:02d}T03:17:00+00:00" if day <= 30 else f"2026-12-{day - 30:02d}T03:17:00+00:00",
                   commit=f"{day:040x}")
    data = json.loads(run.read_text())
    data["machine"]["conditions"] = {"load_average": 3.8, "cpus": 2, "steal_share": 0.0, "wait_share": 0.5}
    run.write_text(json.dumps(data))
    return run


def test_nights_not_judged_in_a_row_fail_past_the_historys_limit(tmp_path, capsys):
    """Busy nights are not judged (exit 3) up to the history's stated limit of nights in a row (written into the
    file, 7 unless set); the night that passes it fails (exit 1), naming the point, the streak, the limit and what
    to do, and a quiet night ends the streak. Busy nights used to exit 3 for ever: a slowdown landing in a busy
    stretch was never judged."""
    from harness.nightly.history import NOT_JUDGED_LIMIT

    history = nightly(tmp_path, STEADY)
    assert json.loads(history.read_text())["not_judged_limit"] == NOT_JUDGED_LIMIT
    first = len(STEADY) + 1
    for day in range(first, first + NOT_JUDGED_LIMIT):
        append(history, [busy_night(tmp_path, day, level=1.3)])  # 30% slower, in a busy stretch
    capsys.readouterr()
    assert main(["check", str(history)]) == 3
    out = capsys.readouterr().out
    assert f"{NOT_JUDGED_LIMIT} nights in a row, the history allows {NOT_JUDGED_LIMIT}" in out, out
    append(history, [busy_night(tmp_path, first + NOT_JUDGED_LIMIT, level=1.3)])
    out_dir = tmp_path / "out"
    assert main(["check", str(history), "--out", str(out_dir)]) == 1
    summary = (out_dir / "summary.md").read_text()
    assert f"Not judged for {NOT_JUDGED_LIMIT + 1} nights in a row: this night fails" in summary, summary
    assert f"wall time of p not judged for {NOT_JUDGED_LIMIT + 1} nights" in summary
    assert f"the history allows {NOT_JUDGED_LIMIT}" in summary
    assert "quiet machine" in summary and "--label judge-busy" in summary and "--not-judged-limit" in summary
    [alarm] = json.loads((out_dir / "alarms.json").read_text())
    assert (alarm["kind"], alarm["streak"], alarm["limit"]) == ("not judged", NOT_JUDGED_LIMIT + 1, NOT_JUDGED_LIMIT)
    streak_began = load_history(history).nights[-(NOT_JUDGED_LIMIT + 1)]
    assert (alarm["point"], alarm["began"], alarm["began_date"], alarm["commit"], alarm["change"], alarm["rule"]) == \
        ("p", streak_began.id, streak_began.date, streak_began.commit, None, "not-judged limit"), alarm
    assert alarm["detail"] == ["the measuring process waited for a CPU 50% of its CPU time; load average 3.8 on 2 CPUs"]
    assert "not judged for" in (out_dir / "index.html").read_text()
    # the limit is the history's: raised knowingly, the same streak is within it
    assert main(["append", str(history), str(tmp_path / f"busy{first}.json"),
                 "--not-judged-limit", str(NOT_JUDGED_LIMIT + 2)]) == 0
    assert load_history(history).not_judged_limit == NOT_JUDGED_LIMIT + 2
    assert main(["check", str(history)]) == 3
    # a quiet night ends the streak and is judged: the slowdown that landed in the busy stretch is seen
    append(history, [run_file(tmp_path / "quiet.json", {"p": 1.3}, "2026-12-05T03:17:00+00:00")])
    assert main(["check", str(history)]) == 1
    assert "SLOWER" in capsys.readouterr().out


def test_a_night_labelled_judge_busy_is_judged_whatever_its_load(tmp_path, capsys):
    """The person says the load is the runner's normal: the night is judged (a 30% slowdown fails it)."""
    history = nightly(tmp_path, STEADY)
    main(["append", str(history), str(busy_night(tmp_path, len(STEADY) + 1, level=1.3)), "--label", "judge-busy"])
    capsys.readouterr()
    assert main(["check", str(history)]) == 1
    assert "**SLOWER**" in capsys.readouterr().out


def test_the_night_after_an_accepted_slowdown_is_judged(tmp_path, capsys):
    """`history accept` after a 10% slowdown, then a night a further 25% slower: that night fails, judged against
    the accepted level (it was the first of five "learning" nights, which raised nothing)."""
    from datetime import datetime, timedelta, timezone

    history = nightly(tmp_path, STEADY + [1.10, 1.101], other=0.5)
    h = load_history(history)
    began = h.nights[len(STEADY)].id
    assert main(["accept", str(history), "p", "--night", began, "--reason", "bigger model, on purpose"]) == 0
    capsys.readouterr()
    assert main(["check", str(history)]) == 0
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat(timespec="seconds")
    append(history, [run_file(tmp_path / "worse.json", {"p": 1.10 * 1.25, "other": 0.5}, tomorrow, commit="f" * 40)])
    out = tmp_path / "out"
    assert main(["check", str(history), "--out", str(out)]) == 1
    alarms = json.loads((out / "alarms.json").read_text())
    assert [(a["point"], a["began"], a["kind"]) for a in alarms] == [("p", load_history(history).nights[-1].id,
                                                                      "slower")], alarms
    assert abs(alarms[0]["change"] - 0.25) < 0.01, alarms


def test_each_statistical_history_spends_its_share_of_the_suites_alpha(tmp_path, capsys):
    """alpha is one false alarm per 100 clean nights for the whole suite: each of the statistical histories it
    keeps (CPU wall time, CPU instructions, GPU wall time) spends alpha / 3, whatever number of files one `check`
    is given (each runner checks its own). A night between the per-file threshold and the suite's share: an alarm
    under alpha per file (the old rule, `--statistical-histories 1`), none under the suite's share; and a call
    with more statistical histories than the suite declares is refused."""
    import statistics

    from harness.nightly.changes import ALPHA, STATISTICAL_HISTORIES, Rule, check_history, predictive, step_threshold

    steady = [float(np.exp(0.02 * v)) for v in np.random.default_rng(3).standard_normal(20)]
    x = np.log(steady)
    mu, sigma, n = statistics.median(x), statistics.stdev(x), len(x)
    per_file = step_threshold(Rule(points=1, histories=1).budget, n)
    share = step_threshold(Rule(points=1).budget, n)
    assert share > per_file
    tonight = float(np.exp(mu + (per_file + share) / 2 * predictive(sigma, n)))
    assert tonight / np.exp(mu) - 1 > 0.05, "tonight is under the one-night floor: the test shows nothing"
    history = nightly(tmp_path, steady + [tonight])
    reports = check_history(load_history(history))
    assert [r.rule.history_alpha for r in reports] == [pytest.approx(ALPHA / len(STATISTICAL_HISTORIES))]
    assert reports[0].rule.budget == pytest.approx(ALPHA / len(STATISTICAL_HISTORIES) / 2)
    assert main(["check", str(history)]) == 0, capsys.readouterr().out
    assert f"{ALPHA / 3:.4g} for this history (one of 3 statistical histories" in capsys.readouterr().out
    assert main(["check", str(history), "--statistical-histories", "1"]) == 1
    # the CPU runner's call: wall time and instructions (exact counts spend none); the GPU runner's: wall time only
    (tmp_path / "counts").mkdir()
    counts = nightly(tmp_path / "counts", [1e9] * 5)
    data = json.loads(counts.read_text())
    for night in data["nights"]:
        night["points"]["p"]["metric"] = "instructions"
        night["id"] = night_id(night["date"], night["commit"], night["points"])
    counts.write_text(json.dumps(data))
    for files in ([history, counts], [history]):
        shares = [r.rule.history_alpha for path in files for r in check_history(load_history(path))]
        assert shares == [pytest.approx(ALPHA / 3)] * len(files), (files, shares)
    capsys.readouterr()
    assert main(["check", str(history), str(counts), str(history), str(counts)]) == 2
    assert "--statistical-histories" in capsys.readouterr().err
    assert main(["check", str(history), str(counts), str(history), str(counts),
                 "--statistical-histories", "4"]) == 0


def across_a_bump(folder, step: float, bumped: str = BUMPED, before: int = 20, after: int = 4):
    """A history of `before` nights on KEY, then `after` nights on `bumped` (the same machine, torch 2.15.0), each
    appended with the command line; point p has 0.3% night-to-night noise (seeded) and `step` more from the bump
    on, point other is steady."""
    folder.mkdir(exist_ok=True)
    levels = np.exp(np.random.default_rng(5).normal(0.0, 0.003, before + after))
    levels[before:] *= 1 + step
    history = folder / "history.json"
    for i, level in enumerate(levels):
        run = run_file(folder / f"run{i}.json", {"p": float(level), "other": 0.5},
                       f"2026-11-{i + 1:02d}T03:17:00+00:00", commit=f"{i + 1:040x}", key=bumped if i >= before else KEY)
        assert main(["append", str(history), str(run)]) == 0
    return history


@pytest.mark.parametrize("step, code", [
    pytest.param(0.06, 1, id="6%-step-at-the-bump-is-flagged"),
    pytest.param(0.0, 0, id="no-step-at-the-bump-passes"),
])
def test_a_history_across_a_torch_bump_is_appended_and_judged(tmp_path, capsys, step, code):
    """Tonight's torch is 2.15.0, the history's nights 2.14.1, on the same machine: the night is appended (it was
    refused, and every night after it failed), the bump is an event on the history, the summary and the page; a 6%
    step at the bump is flagged and names the versions that changed as its likely cause; no step passes. The rule
    judges the bump night as any night: the same nights with no change of versions get the same verdicts."""
    from harness.nightly.changes import check_history

    history = across_a_bump(tmp_path / "bump", step)
    appended = capsys.readouterr().out
    assert appended.count("versions changed on this night: torch 2.14.1 -> 2.15.0") == 1, appended
    h = load_history(history)
    bump = h.nights[20]
    assert h.machine_key == MACHINE and len(h.nights) == 24 and bump.versions["torch"] == "2.15.0"
    assert [(i, changed) for i, _, changed in h.version_changes()] == [(20, ["torch 2.14.1 -> 2.15.0"])]
    out = tmp_path / "out"
    assert main(["check", str(history), "--out", str(out)]) == code
    alarms = json.loads((out / "alarms.json").read_text())
    summary, page = (out / "summary.md").read_text(), (out / "index.html").read_text()
    assert "### Versions changed" in summary and f"(night {bump.id}, commit {bump.commit[:10]}): torch 2.14.1 -> " \
        "2.15.0" in summary, summary
    assert 'class="versions"' in page and "versions changed: torch 2.14.1 -&gt; 2.15.0" in page
    assert "Versions changed" in page
    if step:
        assert [(a["point"], a["began"], a["versions"]) for a in alarms] == [("p", bump.id,
                                                                             ["torch 2.14.1 -> 2.15.0"])], alarms
        [line] = [line for line in summary.splitlines() if line.startswith("- **p**")]
        assert "slower since 2026-11-21" in line and "the versions changed that night: torch 2.14.1 -> 2.15.0 " \
            "(its likely cause)" in line, line
    else:
        assert alarms == [] and "No slowdown open" in summary, summary
    twin = load_history(across_a_bump(tmp_path / "twin", step, bumped=KEY))
    assert twin.version_changes() == [] and [n.id for n in twin.nights] == [n.id for n in h.nights]

    def verdicts(reports):
        return [(r.point, r.trace.status, [(e.kind, e.rule, e.began, e.alarmed, e.change) for e in r.trace.events])
                for r in reports]

    assert verdicts(check_history(h)) == verdicts(check_history(twin))


def test_a_format_1_history_is_read_as_format_2_and_goes_on_across_a_bump(tmp_path):
    """A history written before a night kept its versions (format 1: one device key, versions included, for the
    whole file) is read as format 2: the key's machine part is the machine, each night's versions its own key's (or
    the file's, where a night names none); tonight's torch bump is appended, and the file is written as format 2."""
    history = nightly(tmp_path, STEADY[:3])
    data = json.loads(history.read_text())
    for night in data["nights"]:
        del night["versions"]
    del data["nights"][0]["machine"]["device_key"]
    del data["machine_key"]
    history.write_text(json.dumps({**data, "format_version": 1, "device_key": KEY}))
    h = load_history(history)
    assert h.machine_key == MACHINE
    assert [n.versions for n in h.nights] == [{"omnivoice": "0.2.1", "torch": "2.14.1"}] * 3
    bumped = run_file(tmp_path / "bumped.json", {"p": 1.0}, "2026-11-04T03:17:00+00:00", commit="b" * 40, key=BUMPED)
    h, added = append(history, [bumped])
    assert added and json.loads(history.read_text())["format_version"] == 2
    assert [changed for _, _, changed in load_history(history).version_changes()] == [["torch 2.14.1 -> 2.15.0"]]


@pytest.mark.parametrize("key, machine, versions", [
    ("cpu-amd-epyc-avx2-2c-2t__torch-2.14.1-cu130__omnivoice-0.2.1", "cpu-amd-epyc-avx2-2c-2t",
     {"torch": "2.14.1-cu130", "omnivoice": "0.2.1"}),
    ("cuda-nvidia-h200__torch-2.15.0-cu130__omnivoice-0.2.1", "cuda-nvidia-h200",
     {"torch": "2.15.0-cu130", "omnivoice": "0.2.1"}),
    ("callgrind-3.19.0-avx2__torch-2.14.1__omnivoice-0.2.1", "callgrind-avx2",
     {"valgrind": "3.19.0", "torch": "2.14.1", "omnivoice": "0.2.1"}),
    ("callgrind-3.19.0-amd-avx2__torch-2.14.1__omnivoice-0.2.1", "callgrind-avx2",  # the older form, with a vendor
     {"valgrind": "3.19.0", "torch": "2.14.1", "omnivoice": "0.2.1"}),
    ("structure__torch-2.14.1__omnivoice-0.2.1", "structure", {"torch": "2.14.1", "omnivoice": "0.2.1"}),
], ids=["cpu", "gpu", "instructions", "instructions-older-form", "structure"])
def test_a_device_key_splits_into_its_machine_and_its_versions(key, machine, versions):
    from harness.nightly.history import split_key
    from harness.run.machine import device_key, hardware_key, machine_info

    assert split_key(key) == (machine, versions)
    info = machine_info("cpu")
    assert split_key(device_key(info))[0] == hardware_key(info), "the machine is not the key's hardware part"


def test_the_instruction_counts_of_a_history_across_a_bump_keep_each_nights_key(tmp_path):
    """`counts instructions` reads the runs of a history of counts: each night under its own key (torch 2.14.1,
    then 2.15.0), not one key for the file."""
    from harness.counts import instructions

    old = "callgrind-3.19.0-avx2__torch-2.14.1__omnivoice-0.2.1"
    new = "callgrind-3.19.0-avx2__torch-2.15.0__omnivoice-0.2.1"
    history = tmp_path / "instructions.json"
    for day, key in ((1, old), (2, new)):
        run = tmp_path / f"run{day}.json"
        data = instructions.run_file({"counts": {"a/stock": 1000 + day}, "key": key,
                                      "machine": {"cpu_model": "Test CPU"}}, "test")
        run.write_text(json.dumps({**data, "created_utc": f"2026-11-0{day}T03:17:00Z"}))
        append(history, [run])
    assert [changed for _, _, changed in load_history(history).version_changes()] == [["torch 2.14.1 -> 2.15.0"]]
    assert [run["key"] for run in instructions.load_runs([history])] == [old, new]


def test_accepting_the_same_change_twice_records_it_once(tmp_path):
    history = nightly(tmp_path, STEADY + [1.10, 1.101, 1.099], other=0.5)
    began = load_history(history).nights[len(STEADY)].id
    accept(history, "p", began, "bigger model, on purpose")
    written = history.read_text()
    again = accept(history, "p", began, "said twice")
    assert [(a["point"], a["night"], a["reason"]) for a in again.accepted] == [("p", began,
                                                                                "bigger model, on purpose")]
    assert history.read_text() == written  # the file is left as it was


def test_the_not_judged_limit_is_a_whole_number_of_nights_zero_or_more():
    from harness.nightly.history import NOT_JUDGED_LIMIT, check_limit

    assert check_limit(0) == 0 and check_limit(3) == 3
    for bad in (-1, 2.5, "7", True, None):
        with pytest.raises(ValueError) as refused:
            check_limit(bad)
        assert str(refused.value) == (f"not_judged_limit {bad!r} is not a whole number of nights, 0 or more "
                                      f"(default {NOT_JUDGED_LIMIT})")


@pytest.mark.parametrize("key, machine, versions", [
    pytest.param("cpu-x-2c__torch-2.14.1-cu130__omnivoice-0.2.1", "cpu-x-2c",
                 {"torch": "2.14.1-cu130", "omnivoice": "0.2.1"}, id="a wall-time key"),
    pytest.param("callgrind-3.22.0-avx2__torch-2.14.1", "callgrind-avx2", {"valgrind": "3.22.0", "torch": "2.14.1"},
                 id="an instruction count's key: valgrind is a version"),
    pytest.param("cpu-x-2c", "cpu-x-2c", {}, id="a key without versions"),
])
def test_split_key_names_the_machine_and_each_packages_version(key, machine, versions):
    from harness.nightly.history import split_key

    assert split_key(key) == (machine, versions)


def test_a_points_series_is_its_nights_and_their_log_medians_in_order():
    from harness.nightly.history import History, Night

    def night(i, points):
        return Night(id=f"n{i}", date=f"2026-11-0{i + 1}", commit=None, command=None, machine={}, points=points)

    nights = [night(0, {"p": {"samples": [1.0, 4.0, 2.0]}}), night(1, {"q": {"samples": [3.0]}}),
              night(2, {"p": {"samples": [8.0, 6.0]}, "q": {"samples": [5.0]}})]
    assert nights[0].median("p") == 2.0 and nights[2].median("p") == 7.0 and nights[1].median("p") is None
    measured, x = History(machine_key="m", nights=nights).series("p")
    assert measured == [nights[0], nights[2]] and x.tolist() == pytest.approx([np.log(2.0), np.log(7.0)])


def test_a_night_keeps_what_its_run_recorded_through_the_file(tmp_path):
    """The command, commit, date, sources, labels, versions and machine of a night are written and read back."""
    run = run_file(tmp_path / "a.json", {"a": 0.4}, "2026-11-01T03:17:00+00:00", commit="ab" * 20)
    history = tmp_path / "h.json"
    _, added = append(history, [run], labels=["busy-core"])
    [night] = load_history(history).nights
    assert (night.id, night.command, night.commit, night.date) == (added.id, "test", "ab" * 20,
                                                                    "2026-11-01T03:17:00+00:00")
    assert (night.sources, night.labels) == ((str(run),), ("busy-core",))
    assert night.versions == {"omnivoice": "0.2.1", "torch": "2.14.1"}  # the key's versions over the recorded "x"
    assert night.machine["device_key"] == KEY and night.machine["cpu_model"] == "Test CPU"
    assert night.points["a"]["metric"] == "rtf" and night.median("a") == pytest.approx(0.4)


def test_accept_says_exactly_why_it_refuses_and_records_what_it_accepts(tmp_path, capsys):
    """Each refusal names what is missing and where to look; an acceptance records the point, the night, the
    reason and when (UTC, to the second), and the command line says what was accepted."""
    import re
    from datetime import datetime, timezone

    history = nightly(tmp_path, STEADY + [1.10, 1.101, 1.099], other=0.5)
    h = load_history(history)
    began, quiet = h.nights[len(STEADY)], h.nights[3]
    refusals = [
        (("q", began.id, "why"), f"{history} has no point 'q'; its points are ['p', 'other']"),
        (("p", "nope", "why"), f"{history} has no night 'nope'; `fastpath-suite nightly check {history}` lists each "
                               "alarm with the night its change began"),
        (("p", began.id, " "), "give the reason the slowdown is accepted (--reason): it is kept in the history"),
        (("p", quiet.id, "why"), f"no slowdown of p began on night {quiet.id} (nor a changed mix of its exact "
                                 f"counts), so there is nothing there to accept; its slowdowns began on: {began.id} "
                                 f"(2026-11-13, open) (`fastpath-suite nightly check {history}` lists them)"),
        (("other", began.id, "why"), f"no slowdown of other began on night {began.id} (nor a changed mix of its exact "
                                     "counts), so there is nothing there to accept; the rule found no slowdown of it "
                                     f"(`fastpath-suite nightly check {history}` lists them)"),
    ]
    for args, message in refusals:
        with pytest.raises(HistoryError) as refused:
            accept(history, *args)
        assert str(refused.value) == message
    assert load_history(history).accepted == []
    before = datetime.now(timezone.utc).replace(microsecond=0)
    assert main(["accept", str(history), "p", "--night", began.id, "--reason", "bigger model"]) == 0
    assert capsys.readouterr().out == f"{history}: the slowdown of p that began on night {began.id} is accepted\n"
    [entry] = load_history(history).accepted
    assert set(entry) == {"point", "night", "reason", "date"}
    assert (entry["point"], entry["night"], entry["reason"]) == ("p", began.id, "bigger model")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["date"]), entry
    when = datetime.fromisoformat(entry["date"].replace("Z", "+00:00"))
    assert before <= when <= datetime.now(timezone.utc)


def test_check_writes_each_open_slowdown_in_full_and_prints_its_bisect_line(tmp_path, capsys):
    """alarms.json holds, per open slowdown, the history, point, metric, kind, the night it began (id, date,
    commit), its size, the rule that fired, what changed and the versions that changed; the wall-time point's bisect
    line names the counting command over the commits of the night before and the night it began."""
    history = nightly(tmp_path, STEADY + [1.10, 1.101, 1.099], other=0.5)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["check", str(history), "--out", str(out)]) == 1
    began = load_history(history).nights[len(STEADY)]
    [alarm] = json.loads((out / "alarms.json").read_text())
    assert alarm == {"history": str(history), "point": "p", "metric": "rtf", "kind": "slower", "began": began.id,
                     "began_date": "2026-11-13T03:17:00+00:00", "commit": f"{13:040x}",
                     "change": pytest.approx(0.10, rel=1e-9), "rule": "step", "detail": [], "versions": []}, alarm
    lines = capsys.readouterr().out.splitlines()
    assert f"written: {out / 'summary.md'}, {out / 'index.html'}, {out / 'alarms.json'}" in lines
    assert lines[-1] == (f"bisect p: a wall-time point; count its work over the range with fastpath-suite nightly "
                         f"bisect {12:040x} {13:040x} --point POINT --signal instructions (a counting point: "
                         "fixtures/points.json 'counts')")


def test_check_refuses_an_empty_history_and_more_statistical_histories_than_declared(tmp_path, capsys):
    from harness.nightly.history import History

    empty = tmp_path / "empty.json"
    save_history(History(machine_key=MACHINE, nights=[]), empty)
    assert main(["check", str(empty)]) == 2
    assert capsys.readouterr().err == f"error: {empty} has no nights yet; append tonight's run first\n"
    history = nightly(tmp_path, STEADY)
    capsys.readouterr()
    assert main(["check", *[str(history)] * 4]) == 2
    listed = ", ".join([str(history)] * 4)
    assert capsys.readouterr().err == (
        f"error: 4 histories judged with noise in one call ({listed}) but the suite's alpha is split over the 3 the "
        "suite declares (CPU wall time, CPU instructions, GPU wall time): that would spend more than the suite's "
        "budget. Pass --statistical-histories N with N the number of statistical histories the whole suite keeps "
        "(every runner's check the same N), or check fewer files.\n")
    assert main(["check", str(history), str(history), "--statistical-histories", "1"]) == 2
    assert "split over --statistical-histories 1: that would spend" in capsys.readouterr().err
    assert main(["check", str(history), str(history), "--statistical-histories", "2"]) == 0
