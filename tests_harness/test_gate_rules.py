"""The gate's rules and checks (harness.gate.gate), each output in whole: every rule's Check (status, blocks, summary,
details, complete, required, not_applicable) on a case built to reach each of its branches, the verdict's whole
dict, and the checks that run things (check_parity, check_quality, check_quality_set, run_gate) against recording
fakes that say which arguments each one passes on. The summaries and details are what a person reads to act on a
verdict (the fix command, the log to read, the settings named), so they are asserted as written.
Fast, pure Python: no venv, no child process, no judge loaded."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import types
from pathlib import Path

import pytest

from fastpath import fingerprints
from harness.gate import candidate as cand
from harness.gate import gate
from harness.quality import stats
from harness.run import strict

Check = gate.Check


def ok_checks(*but: str) -> list:
    """A passing check of each BLOCKING name, but those named."""
    return [Check(n, "pass", False, "ok") for n in gate.BLOCKING if n not in but]


# --- the argument types and the Check itself ------------------------------------------------------------------


def test_checks_are_read_from_a_comma_separated_list_and_an_unknown_one_is_refused_by_name():
    assert gate._checks(" fingerprints, parity,,work ") == ("fingerprints", "parity", "work")
    assert gate._checks("") == ()
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        gate._checks("parity,speed,golden")
    assert str(refused.value) == ("unknown check(s) ['speed', 'golden']; known: fingerprints, behaviour, goldens, "
                                  "parity, work, rtf, quality-set, quality")


def test_quality_metrics_are_lower_cased_once_each_and_an_unknown_or_empty_list_is_refused():
    assert gate._quality_metrics(" WER,sim, wer ,Mos") == ("wer", "sim", "mos")
    with pytest.raises(argparse.ArgumentTypeError) as unknown:
        gate._quality_metrics("wer,pesq")
    assert str(unknown.value) == "unknown metric(s) ['pesq']; known: wer, sim, mos"
    with pytest.raises(argparse.ArgumentTypeError) as empty:
        gate._quality_metrics(" , ")
    assert str(empty.value) == "unknown metric(s) [' , ']; known: wer, sim, mos"


def test_a_check_takes_each_known_status_and_refuses_any_other_naming_them():
    for status in gate.STATUSES:
        assert Check("x", status, False, "").status == status
    with pytest.raises(ValueError) as refused:
        Check("x", "ok", False, "")
    assert str(refused.value) == f"status 'ok' is not one of {gate.STATUSES}"


# --- rule_fingerprints ----------------------------------------------------------------------------------------


def row(name, against, candidate, known=()):
    return {"name": name, "against": against, "candidate": candidate, "known": list(known)}


def test_fingerprints_identical_pass_counting_the_names():
    rows = [row("f", "a", "a", ["0.2.1"]), row("g", "b", "b")]
    assert gate.rule_fingerprints(rows, "0.3.0", "0.2.1") == Check(
        "fingerprints", "pass", False, "all 2 relied-on upstream names identical to 0.2.1")


def test_fingerprint_changes_recorded_as_known_are_listed_with_their_versions():
    rows = [row("A.f", "a1", "a2", ["0.2.2", "0.2.3"]), row("g", "g1", "g1", ["0.2.1"]), row("h", "h1", "h2", ["x"])]
    assert gate.rule_fingerprints(rows, "0.2.3", "0.2.1") == Check(
        "fingerprints", "changed-as-expected", False, "2 changed, all reviewed and recorded: A.f, h",
        ["A.f: a1 -> a2 (recorded as known to work in 0.2.2, 0.2.3)", "h: h1 -> h2 (recorded as known to work in x)"])


def test_an_unreviewed_or_removed_name_blocks_with_the_command_that_records_it():
    rows = [row("A.f", "a1", "a2"), row("B.h", "b1", None), row("C.k", "c1", "c2", ["0.2.2"]), row("s", "s", "s")]
    check = gate.rule_fingerprints(rows, "0.3.0", "0.2.1", "/x/omnivoice.py")
    assert check == Check("fingerprints", "changed", True, "refused: A.f, B.h changed in omnivoice 0.3.0 (unreviewed)", [
        "A.f: a1 -> a2 (NOT recorded as known to work)",
        "B.h: b1 -> None (missing from the candidate)",
        "C.k: c1 -> c2 (recorded as known to work in 0.2.2)",
        "fix: read the diffs in fingerprints/; if the patch logic still holds and the parity tier passes, record with "
        "`fastpath-suite maintain fingerprints --source /x/omnivoice.py --version 0.3.0 --record --only A.f B.h`"])
    default = gate.rule_fingerprints(rows[:1], "0.3.0", "0.2.1")
    assert "--source <candidate>/omnivoice/models/omnivoice.py --version" in default.details[-1], default.details


# --- rule_goldens ---------------------------------------------------------------------------------------------


def test_no_goldens_is_skipped_naming_the_command_that_records_them():
    assert gate.rule_goldens({}, "0.2.1", "0.3.0") == Check(
        "goldens", "skipped", False, "no goldens recorded: run `fastpath-suite maintain goldens --record`")


def test_goldens_identical_to_the_against_versions_pass():
    differences = {"0.2.0": {"p": ["tokens differ"]}, "0.2.1": {"p": [], "q": []}}
    assert gate.rule_goldens(differences, "0.2.1", "0.3.0") == Check(
        "goldens", "pass", False, "stock output identical to the 0.2.1 goldens at every point")


def test_goldens_of_other_known_versions_are_named():
    differences = {"0.2.1": {"p": ["x"]}, "0.2.2": {"p": []}, "0.2.3": {"p": []}}
    assert gate.rule_goldens(differences, "0.2.1", "0.2.3") == Check(
        "goldens", "changed-as-expected", False, "stock output matches the goldens of 0.2.2, 0.2.3, not 0.2.1")


def test_goldens_that_moved_are_counted_against_the_against_versions_else_the_newest_never_blocking():
    differences = {"0.2.0": {"p": ["z"]}, "0.2.1": {"p": ["a", "b"], "q": [], "r": ["c"]}, "0.2.2": {"p": ["y"]}}
    assert gate.rule_goldens(differences, "0.2.1", "0.3.0") == Check(
        "goldens", "changed", False,
        "stock behaviour changed: 2/3 points differ from the 0.2.1 goldens, and no known version matches",
        ["p: a; b", "r: c"])
    unknown_against = {"0.2.0": {"p": ["x"], "q": ["w"]}, "0.2.1": {"p": ["y"], "q": []}, "0.1.5": {"p": ["v"]}}
    assert gate.rule_goldens(unknown_against, "0.1.0", "0.3.0") == Check(
        "goldens", "changed", False,
        "stock behaviour changed: 1/2 points differ from the 0.2.1 goldens, and no known version matches", ["p: y"])


# --- rule_behaviour -------------------------------------------------------------------------------------------

VERSIONS = ("0.3.0", "0.2.1")  # (candidate, against)
TO_ACCEPT = ("to accept a reviewed change: --accept 'SETTING=REASON' (once per setting, or '*=REASON'); the reason is "
             "recorded in the verdict")


def both_raised(error, candidate_error=None, cannot_run=None) -> dict:
    return {"against": error, "candidate": candidate_error or error, "cannot_run": cannot_run}


def test_behaviour_identical_at_every_setting_passes():
    assert gate.rule_behaviour({}, {}, 25, VERSIONS) == Check(
        "behaviour", "pass", False, "stock generation bit-identical to 0.2.1 at all 25 settings")
    assert gate.rule_behaviour({}, {}, 25, VERSIONS, {}) == gate.rule_behaviour({}, {}, 25, VERSIONS, None)


def test_behaviour_differences_block_naming_six_settings_the_first_three_differences_and_what_raised_in_both():
    differences = {f"s{i}": [f"d{i}a", f"d{i}b", f"d{i}c", f"d{i}d"] for i in range(8)}
    raised = {"r1": both_raised("E"), "r2": both_raised("E", "F", "no bf16 here"),
              "o1": {"against": None, "candidate": "boom", "cannot_run": None}}
    check = gate.rule_behaviour(differences, {"s0": "reviewed", "zz": "unused"}, 30, VERSIONS, raised)
    assert check == Check(
        "behaviour", "changed", True,
        "stock generation differs from 0.2.1 at 7 of 30 settings: s1, s2, s3, s4, s5, s6 ...; 27 of 30 settings "
        "compared bit for bit; 2 raised in both versions: r1 raised E; r2 raised E (against) vs F (candidate)",
        ["s0 [ACCEPTED (reviewed)]: d0a; d0b; d0c"] + [f"s{i} [NOT accepted]: d{i}a; d{i}b; d{i}c" for i in range(1, 8)]
        + [TO_ACCEPT, "r1: raised in both versions, not compared: E",
           "r2: raised in both versions, not compared: E (against) vs F (candidate); the grid says it cannot run here: "
           "no bf16 here"])


def test_six_refused_settings_are_named_without_an_ellipsis_and_nothing_said_of_raising_where_none_did():
    differences = {f"s{i}": ["d"] for i in range(6)}
    check = gate.rule_behaviour(differences, {}, 10, VERSIONS)
    assert check.summary == ("stock generation differs from 0.2.1 at 6 of 10 settings: s0, s1, s2, s3, s4, s5; "
                             "10 of 10 settings compared bit for bit"), check.summary
    assert (check.status, check.blocks, check.complete) == ("changed", True, True)


def test_a_setting_accepted_by_name_keeps_its_own_reason_over_the_blanket_one():
    differences = {"a": ["x"], "b": ["y", "z"]}
    check = gate.rule_behaviour(differences, {"a": "by name", "*": "blanket"}, 25, VERSIONS)
    assert check == Check("behaviour", "changed-as-expected", False,
                          "2 of 25 settings differ, every one accepted by name; 25 of 25 settings compared bit for bit",
                          ["a [ACCEPTED (by name)]: x", "b [ACCEPTED (blanket)]: y; z"])
    assert gate.rule_behaviour(differences, {"a": "by name"}, 25, VERSIONS).summary.startswith(
        "stock generation differs from 0.2.1 at 1 of 25 settings: b;")


def test_settings_that_raised_in_both_versions_are_an_error_named_by_their_error():
    raised = {f"b{i}": both_raised("E") for i in range(8)}
    check = gate.rule_behaviour({}, {}, 20, VERSIONS, raised)
    assert check == Check(
        "behaviour", "error", False,
        "could not run: 8 of 20 settings raised in both versions: b0, b1, b2, b3, b4, b5 ... raised E; 12 of 20 "
        "settings compared bit for bit", [f"b{i}: raised in both versions, not compared: E" for i in range(8)])
    for n, named in ((6, "b0, b1, b2, b3, b4, b5"), (7, "b0, b1, b2, b3, b4, b5 ...")):
        some = gate.rule_behaviour({}, {}, 20, VERSIONS, {f"b{i}": both_raised("E") for i in range(n)})
        assert f"raised in both versions: {named} raised E;" in some.summary, some.summary
    accepted = gate.rule_behaviour({"a": ["x"]}, {"*": "reviewed"}, 20, VERSIONS, {"c": both_raised("E")})
    assert (accepted.status, accepted.blocks) == ("error", False), "a setting that did not run is never accepted"
    assert accepted.details == ["a [ACCEPTED (reviewed)]: x", "c: raised in both versions, not compared: E"]


def test_settings_the_grid_says_cannot_run_here_are_not_judged_and_only_when_every_one_says_so():
    raised = {"c1": both_raised("no kernel", cannot_run="cuda only"), "c2": both_raised("no kernel", cannot_run="x")}
    check = gate.rule_behaviour({}, {}, 20, VERSIONS, raised)
    assert check == Check(
        "behaviour", "skipped", False,
        "not run whole: 2 of 20 settings cannot run on this device (the grid says so): c1, c2 raised no kernel; 18 of "
        "20 settings compared bit for bit",
        ["c1: raised in both versions, not compared: no kernel; the grid says it cannot run here: cuda only",
         "c2: raised in both versions, not compared: no kernel; the grid says it cannot run here: x"], complete=False)
    mixed = dict(raised, c3=both_raised("boom"))
    assert gate.rule_behaviour({}, {}, 20, VERSIONS, mixed).status == "error"


# --- unhealthy, rule_parity -----------------------------------------------------------------------------------


def run(passed=0, failed=(), errors=(), skipped=(), returncode=0, not_applicable=None, passed_tests=None):
    """A pytest run as parse_junit gives it."""
    out = {"returncode": returncode, "passed": passed, "failed": list(failed), "errors": list(errors),
           "skipped": list(skipped), "passed_tests": list(passed_tests or [])}
    if not_applicable is not None:
        out["not_applicable"] = list(not_applicable)
    return out


def test_a_run_is_healthy_only_when_it_exits_0_with_a_test_passed_and_none_failed():
    assert gate.unhealthy(run(passed=2)) is None
    assert gate.unhealthy(run(passed=1, failed=[("t", "x")], returncode=1)) == "pytest exit 1, 1 passed, 1 failed"
    assert gate.unhealthy(run(passed=2, errors=[("t", "x")])) == "pytest exit 0, 2 passed, 1 errors"
    assert gate.unhealthy(run(passed=3, returncode=2)) == "pytest exit 2, 3 passed"
    assert gate.unhealthy(run(skipped=[("a", "s"), ("b", "s")])) == "no test passed (0 passed, 2 skipped)"


def test_a_failing_parity_run_blocks_listing_twenty_failures_then_ten_skips():
    failed = [(f"t::f{i}", "not bit-exact") for i in range(15)]
    errors = [(f"t::e{i}", "AttributeError") for i in range(7)]
    skipped = [("t::slow", "slow: run with --slow")] + [(f"t::s{i}", "no checkpoint") for i in range(12)]
    na = [("t::na", "lacks save")]
    check = gate.rule_parity(run(passed=3, failed=failed, errors=errors, skipped=skipped, returncode=1,
                                 not_applicable=na))
    assert check == Check(
        "parity", "fail", True, "not bit-exact or broken: 3 passed, 15 failed, 7 errors, 1 not applicable, 13 skipped",
        [f"t::f{i}: not bit-exact" for i in range(15)] + [f"t::e{i}: AttributeError" for i in range(5)]
        + ["not applicable to the candidate: t::na: lacks save"]
        + [f"skipped t::s{i}: no checkpoint" for i in range(10)], not_applicable=na)


@pytest.mark.parametrize("result, summary", [
    pytest.param(run(passed=4, returncode=3), "pytest exit 3: 4 passed", id="exit-3"),
    pytest.param(run(passed=0), "pytest exit 0: 0 passed", id="nothing-passed"),
])
def test_a_parity_run_that_crashed_or_ran_nothing_blocks_naming_its_exit(result, summary):
    assert gate.rule_parity(result) == Check("parity", "fail", True, summary, [], not_applicable=[])


def test_a_clean_parity_run_passes_without_and_with_a_comparison_run():
    alone = gate.rule_parity(run(passed=3, skipped=[("t::x", "slow")]))
    assert alone == Check("parity", "pass", False, "bit-exact: 3 passed, 1 skipped", [], not_applicable=[])
    before = run(passed=4, passed_tests=["t::a", "t::b", "t::c", "t::d"]) | {"version": "0.2.1"}
    now = run(passed=3, skipped=[("t::e", "needs a GPU")], not_applicable=[("t::f", "lacks save")])
    assert gate.rule_parity(now, before) == Check(
        "parity", "pass", False,
        "bit-exact: 3 passed, 1 not applicable, 1 skipped; skips compared with the --against version's run (4 passed)",
        ["not applicable to the candidate: t::f: lacks save", "skipped t::e: needs a GPU"],
        not_applicable=[("t::f", "lacks save")])


def test_a_test_that_ran_before_and_skips_now_blocks_naming_the_version_it_ran_on():
    before = run(passed=3, passed_tests=["t::a", "t::b", "t::c"])
    now = run(passed=2, skipped=[("t::a", "needs save"), ("t::z", "no checkpoint")],
              not_applicable=[("t::b", "lacks load"), ("t::y", "padded")])
    expected = ["not applicable to the candidate (ran on {v}): t::b: lacks load",
                "not applicable to the candidate: t::y: padded",
                "ran on {v}, SKIPS on the candidate: t::a: needs save", "skipped t::z: no checkpoint"]
    summary = ("1 parity test(s) that ran on the --against version skip on the candidate: 2 passed, 2 not "
               "applicable, 2 skipped")
    na = [("t::b", "lacks load"), ("t::y", "padded")]
    assert gate.rule_parity(now, before) == Check(
        "parity", "fail", True, summary, [d.format(v="the --against version") for d in expected], not_applicable=na)
    assert gate.rule_parity(now, before | {"version": "0.2.1"}) == Check(
        "parity", "fail", True, summary, [d.format(v="0.2.1") for d in expected], not_applicable=na)


def test_a_broken_against_run_is_an_error_naming_its_failures_and_its_log():
    broken = run(passed=1, failed=[(f"t::f{i}", "boom") for i in range(8)], errors=[(f"t::e{i}", "err") for i in
                                                                                   range(4)], returncode=1)
    now = run(passed=2, not_applicable=[("t::na", "lacks save")])
    check = gate.rule_parity(now, broken | {"version": "0.2.1", "log": "out/parity-against.log"})
    assert check == Check(
        "parity", "error", False,
        "could not compare skips: the --against run (0.2.1) is broken: pytest exit 1, 1 passed, 8 failed, 4 errors; "
        "read out/parity-against.log, fix what stops it, and rerun (candidate: 2 passed, 1 not applicable)",
        [f"t::f{i}: boom" for i in range(8)] + ["t::e0: err", "t::e1: err",
                                                "the --against run's log: out/parity-against.log"],
        not_applicable=[("t::na", "lacks save")])
    nothing = run(passed=0)
    del nothing["passed_tests"]  # a run that recorded no test at all
    unnamed = gate.rule_parity(run(passed=2), nothing)
    assert unnamed.summary == ("could not compare skips: the --against run (the --against version) is broken: no test "
                               "passed (0 passed); read parity-against.log, fix what stops it, and rerun (candidate: "
                               "2 passed)"), unnamed.summary
    assert unnamed.details == ["the --against run's log: parity-against.log"]


# --- public_api, rule_api -------------------------------------------------------------------------------------


def test_the_public_api_leaves_out_private_modules_names_and_locals_but_keeps_a_packages_init():
    package = {"__init__.py:load": "1", "models/__init__.py:OmniVoice": "2", "models/omnivoice.py:A.save": "3",
               "models/_impl.py:f": "4", "models/omnivoice.py:A._g": "5", "a.py:f.<locals>.g": "6",
               "_private/x.py:f": "7", "models/omnivoice.py:<module>": "8", "utils/py.py:f": "9"}
    assert gate.public_api(package) == {"__init__.py:load", "models/__init__.py:OmniVoice",
                                        "models/omnivoice.py:A.save", "utils/py.py:f"}


def test_the_api_line_pass_downgrade_upgrade_and_a_version_that_is_no_release():
    assert gate.rule_api([], ("0.3.0", "0.2.1")) == Check(
        "api", "pass", False, "omnivoice 0.3.0 has every public function of omnivoice 0.2.1")
    missing = ["m.py:A.load", "m.py:A.save"]
    assert gate.rule_api(missing, ("0.2.0", "0.2.1"), ("fork-omnivoice", "omnivoice")) == Check(
        "api", "changed-as-expected", False,
        "fork-omnivoice 0.2.0 lacks 2 public function(s) that omnivoice 0.2.1 has (a downgrade: expected; code written "
        "for 0.2.1 that calls them will not find them): m.py:A.load, m.py:A.save", missing)
    warning = ("WARNING: omnivoice {0} removes 2 public function(s) that omnivoice 0.2.1 has: m.py:A.load, m.py:A.save; "
               "code that calls them breaks on {0}")
    for version in ("0.3.0", "0.2.1", "master"):  # an upgrade, the same version, and no release at all
        assert gate.rule_api(missing, (version, "0.2.1")) == Check(
            "api", "changed", False, warning.format(version), missing), version


# --- work_lost, rule_work -------------------------------------------------------------------------------------


@pytest.mark.parametrize("counts, said", [
    pytest.param((100, 50, 1000, 505), None, id="share-grew-by-the-slack-exactly"),
    pytest.param((100, 50, 1000, 506), "+1.2%", id="share-grew-past-the-slack"),
    pytest.param((100, 50, 1000, 400), None, id="share-shrank"),
    pytest.param((100, 0, 100, 1), "the stack did none of it before", id="stack-did-none-before"),
    pytest.param((0, 100, 0, 101), None, id="stock-none-stack-grew-by-the-slack"),
    pytest.param((0, 100, 0, 102), "stock does none of it, the stack 100 -> 102", id="stock-none-stack-grew"),
    pytest.param((0, 0, 0, 0), None, id="nobody-does-it"),
    pytest.param((5, 2, 0, 3), "stock no longer does it, the stack still does 3", id="stock-stopped"),
    pytest.param((5, 2, 0, 0), None, id="gone-from-both"),
    pytest.param((0, 0, 100, 101), None, id="stock-newly-stack-as-much-within-the-slack"),
    pytest.param((0, 0, 100, 102), "stock newly does 100, the stack more: 102", id="stock-newly-stack-more"),
])
def test_work_lost_per_counter(counts, said):
    assert gate.work_lost(*counts) == said


def counters(**given) -> dict:
    return dict(dict.fromkeys(gate.COUNTERS, 0), **given)


def test_work_that_lost_ground_blocks_naming_six_counters_with_every_line_in_the_details():
    against = {"p": {"stock": counters(**dict.fromkeys(gate.COUNTERS, 100)),
                     "fastpath": counters(**dict.fromkeys(gate.COUNTERS, 50))},
               "q": {"stock": counters(flops=200), "fastpath": counters(flops=100)}}
    candidate = {"p": {"stock": counters(**dict.fromkeys(gate.COUNTERS, 100)),
                       "fastpath": counters(**dict.fromkeys(gate.COUNTERS, 60))},
                 "q": {"stock": counters(flops=200, llm_calls=3), "fastpath": counters(flops=110, llm_calls=4)}}
    check = gate.rule_work(candidate, against, "new", "old")
    lines = [f"p {k}: stack/stock 0.5000 on old -> 0.6000 on new (+20.0%)" for k in gate.COUNTERS]
    lines += ["q flops: stack/stock 0.5000 on old -> 0.5500 on new (+10.0%)",
              "q llm_calls: stock 0 -> 3, stack 0 -> 4 (old -> new) (stock newly does 3, the stack more: 4)"]
    assert check == Check(
        "work", "fail", True, "the lossless stack lost ground to stock on new in 8 counter(s): p flops, p llm_calls, "
                              "p llm_positions, p head_rows, p embedded_positions, p reference_encodes ...", lines)


@pytest.mark.parametrize("lost", [1, 6, 7])
def test_work_lost_names_up_to_six_counters_and_says_when_there_are_more(lost):
    pairs = [("p", k) for k in gate.COUNTERS] + [("q", "flops")]
    against = {point: {"stock": counters(**dict.fromkeys(gate.COUNTERS, 100)),
                       "fastpath": counters(**dict.fromkeys(gate.COUNTERS, 50))} for point in "pq"}
    candidate = {point: {"stock": dict(sides["stock"]), "fastpath": dict(sides["fastpath"])}
                 for point, sides in against.items()}
    for point, key in pairs[:lost]:
        candidate[point]["fastpath"][key] = 60
    named = ", ".join(f"{point} {key}" for point, key in pairs[:min(lost, 6)]) + (" ..." if lost > 6 else "")
    assert gate.rule_work(candidate, against, "new", "old").summary == (
        f"the lossless stack lost ground to stock on new in {lost} counter(s): {named}")


def test_work_that_moved_without_losing_ground_is_changed_and_names_each_line():
    against = {"p": {"stock": counters(flops=200, llm_calls=2), "fastpath": counters(flops=100, llm_calls=1)}}
    candidate = {"p": {"stock": counters(flops=400, llm_calls=2), "fastpath": counters(flops=200, llm_calls=0,
                                                                                       head_rows=0)}}
    assert gate.rule_work(candidate, against, "new", "old") == Check(
        "work", "changed", False, "work counts moved, the stack's share of stock's did not grow",
        ["p flops: stack/stock 0.5000 on old -> 0.5000 on new (stock 200 -> 400)",
         "p llm_calls: stack/stock 0.5000 on old -> 0.0000 on new (stock 2 -> 2)"])
    gone = {"p": {"stock": counters(flops=200, reference_encodes=0), "fastpath": counters(flops=100)}}
    was = {"p": {"stock": counters(flops=200, reference_encodes=3), "fastpath": counters(flops=100,
                                                                                         reference_encodes=1)}}
    assert gate.rule_work(gone, was, "new", "old").details == [
        "p reference_encodes: stock 3 -> 0, stack 1 -> 0 (old -> new)"]
    same = {"p": {"stock": counters(flops=200), "fastpath": counters(flops=100)}}
    assert gate.rule_work(same, same, "new", "old") == Check(
        "work", "pass", False, "identical work counts, stock and lossless stack", [])


def test_work_not_measured_at_a_point_on_both_versions_blocks_naming_the_points_first():
    measured = {"p": {"stock": counters(flops=2), "fastpath": counters(flops=1)}}
    lost = {"p": {"stock": counters(flops=2), "fastpath": counters(flops=2)},
            "r": {"stock": counters(), "fastpath": counters()}}
    assert gate.rule_work(lost, measured | {"q": measured["p"]}, "new", "old") == Check(
        "work", "fail", True, "work not measured on both versions at ['q', 'r']", [])


# --- rule_rtf, rule_quality -----------------------------------------------------------------------------------


def test_rtf_is_informational_and_changed_only_past_its_threshold():
    assert gate.rule_rtf([], [1.0]) == gate.rule_rtf([1.0], []) == Check(
        "rtf", "skipped", False, "not measured (--rtf-rounds 0)")
    assert gate.rule_rtf([1.25], [1.0], threshold=0.25).status == "pass", "at the threshold: not past it"
    assert gate.rule_rtf([1.25], [1.0], threshold=0.24).status == "changed"
    assert gate.rule_rtf([1.05], [1.0]).status == "pass" and gate.rule_rtf([0.8], [1.0]).status == "changed"
    assert gate.rule_rtf([1.15], [1.0]) == Check(
        "rtf", "changed", False, "median RTF candidate/against = 1.150 over 1 rounds (informational: shared-machine "
                                 "noise; |ratio-1| > 0.1 is 'changed')", ["candidate [1.15]", "against [1.0]"])
    rounded = gate.rule_rtf([0.123456, 1.0, 9.0], [0.987654, 2.0])
    assert rounded.details == ["candidate [0.1235, 1.0, 9.0]", "against [0.9877, 2.0]"], rounded.details
    assert rounded.summary.startswith("median RTF candidate/against = 0.669 over 3 rounds"), rounded.summary


def test_quality_not_run_is_skipped_with_its_reason_and_keeps_whether_it_was_needed():
    assert gate.rule_quality(None, "no checkpoint") == Check("quality", "skipped", False, "skipped: no checkpoint")
    assert gate.rule_quality(None, "x", required=True).required
    assert gate.rule_quality(None).summary == "skipped: "


@pytest.mark.parametrize("required", [False, True])
def test_quality_runs_fail_crash_skip_or_pass(required):
    failed = [(f"t::f{i}", "WER +4") for i in range(11)]
    assert gate.rule_quality(run(passed=1, failed=failed[:9], errors=failed[9:], returncode=1), required=required) \
        == Check("quality", "fail", True, "11 quality tests failed: 1 passed, 9 failed, 2 errors",
                 [f"t::f{i}: WER +4" for i in range(10)], required=required)
    assert gate.rule_quality(run(passed=3, returncode=2), required=required) == Check(
        "quality", "fail", True, "the quality run crashed: pytest exit 2: 3 passed", [], required=required)
    skips = [(f"t::s{i}", f"why {i}") for i in range(11)]
    for code in (0, 5):
        assert gate.rule_quality(run(skipped=skips, returncode=code), required=required) == Check(
            "quality", "skipped", False, "skipped: why 0", [f"skipped t::s{i}: why {i}" for i in range(10)],
            required=required)
    assert gate.rule_quality(run(returncode=5), required=required) == Check(
        "quality", "skipped", False, "skipped: no quality test ran", [], required=required)
    assert gate.rule_quality(run(passed=3, skipped=skips), required=required) == Check(
        "quality", "pass", False, "3 quality tests passed", required=required)


# --- rule_cuda_rows -------------------------------------------------------------------------------------------


def parity_check(status="pass", blocks=False):
    return Check("parity", status, blocks, "bit-exact: 3 passed", ["d"], not_applicable=[("t", "na")])


def test_a_blocking_or_broken_parity_check_is_kept_noting_cuda_rows_that_did_not_run():
    for status, blocks in (("fail", True), ("error", False)):
        check = parity_check(status, blocks)
        assert gate.rule_cuda_rows(check, "no GPU", None) is check
        assert check.details == ["d", "the CUDA parity rows did not run: no GPU"]
        quiet = parity_check(status, blocks)
        assert gate.rule_cuda_rows(quiet, None, None) is quiet and quiet.details == ["d"]


@pytest.mark.parametrize("problem, cuda, why", [
    pytest.param("no driver", None, "the CUDA parity rows (--device cuda: pytest tests_parity -m cuda) cannot run "
                                    "here: no driver", id="cannot-run"),
    pytest.param(None, None, "no CUDA parity row ran (-m cuda)", id="no-run"),
    pytest.param(None, run(), "no CUDA parity row ran (-m cuda)", id="nothing-ran"),
    pytest.param(None, run(skipped=[("g::a", "bf16 needs 8.0"), ("g::b", "x")]),
                 "no CUDA parity row ran (-m cuda): every one skipped, the first: g::a: bf16 needs 8.0",
                 id="every-one-skipped"),
])
def test_cuda_rows_that_did_not_run_are_not_judged(problem, cuda, why):
    assert gate.rule_cuda_rows(parity_check(), problem, cuda) == Check(
        "parity", "skipped", False, f"not judged: {why}; the CPU rows: bit-exact: 3 passed", ["d", f"not judged: {why}"],
        complete=False, not_applicable=[("t", "na")])


def test_cuda_rows_that_ran_are_counted_in_the_summary():
    check = parity_check()
    assert gate.rule_cuda_rows(check, None, run(passed=2)) is check
    assert check == Check("parity", "pass", False, "bit-exact: 3 passed; CPU and CUDA rows (2 CUDA rows passed)",
                          ["d"], not_applicable=[("t", "na")])


# --- verdict --------------------------------------------------------------------------------------------------


def test_the_verdict_in_whole_reads_the_checks_fields():
    api = Check("api", "changed", False, "WARNING: lacks A.save", ["m.py:A.save"])
    parity = Check("parity", "pass", False, "bit-exact", not_applicable=[("t::a", "lacks load")])
    checks = [Check("install", "pass", False, "installs"), api, *ok_checks("parity"), parity,
              Check("goldens", "error", False, "could not run"), Check("quality", "skipped", False, "no run",
                                                                       required=True)]
    assert gate.verdict(checks) == {
        "ship": False, "state": "incomplete", "blocked_by": [], "not_run": ["quality"], "errors": [], "reason": None,
        "checks": [c.__dict__ for c in checks], "exit_status": 3,
        "not_applicable": [{"check": "parity", "test": "t::a", "reason": "lacks load"}],
        "api": {"status": "changed", "summary": "WARNING: lacks A.save", "missing": ["m.py:A.save"]}}


def test_the_verdict_ships_only_with_every_needed_check_whole_and_nothing_blocking():
    shipped = gate.verdict(ok_checks() + [Check("api", "pass", False, "all there"),
                                          Check("quality", "pass", False, "3 passed", required=True)])
    assert {k: shipped[k] for k in ("ship", "state", "blocked_by", "not_run", "errors", "exit_status", "api",
                                    "not_applicable", "reason")} == {
        "ship": True, "state": "may-ship", "blocked_by": [], "not_run": [], "errors": [], "exit_status": 0,
        "api": None, "not_applicable": [], "reason": None}
    assert gate.verdict(ok_checks())["api"] is None


def test_a_block_comes_before_an_error_and_an_error_before_a_missing_check():
    blocked = gate.verdict(ok_checks("behaviour", "work") + [
        Check("behaviour", "changed", True, ""), Check("work", "error", False, ""),
        Check("quality-set", "fail", True, "", required=True)])
    assert (blocked["state"], blocked["blocked_by"], blocked["errors"], blocked["exit_status"], blocked["ship"]) == (
        "must-not-ship", ["behaviour", "quality-set"], ["work"], 1, False)
    errors = gate.verdict(ok_checks("work", "parity") + [
        Check("quality", "error", False, "", required=True), Check("work", "error", False, ""),
        Check("goldens", "error", False, "")])
    assert (errors["state"], errors["errors"], errors["not_run"], errors["exit_status"]) == (
        "error", ["work", "quality"], ["parity"], 2)
    missing = gate.verdict(ok_checks("parity", "work") + [
        Check("work", "skipped", False, ""), Check("parity", "pass", False, "", complete=False),
        Check("quality-set", "pass", False, "", complete=False, required=True),
        Check("rtf", "skipped", False, "")])
    assert (missing["state"], missing["not_run"], missing["exit_status"]) == (
        "incomplete", ["parity", "work", "quality-set"], 3)


def test_a_candidate_that_did_not_install_is_could_not_run_with_the_installers_words():
    install = Check("install", "fail", True, "could not run: omnivoice==9.9.9 does not install: ERROR: no match")
    checks = [install, Check("parity", "skipped", False, "skipped")]
    assert gate.verdict(checks) == {
        "ship": False, "state": "could-not-run", "blocked_by": ["install"], "not_run": [], "errors": [],
        "reason": "omnivoice==9.9.9 does not install: ERROR: no match", "checks": [c.__dict__ for c in checks],
        "exit_status": 1}
    unblocked = gate.verdict([Check("install", "error", False, "could not run: x"), *ok_checks()])
    assert (unblocked["state"], unblocked["reason"]) == ("could-not-run", "x")


# --- parse_junit, merge_runs ----------------------------------------------------------------------------------


def test_parse_junit_in_whole(tmp_path):
    long = "y" * 400
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="m" name="a"><system-out>printed</system-out></testcase>'
        '<testcase classname="m" name="b"><failure>first line\n   second line  \nthird</failure></testcase>'
        '<testcase classname="m" name="c"><failure message="">from the text</failure></testcase>'
        f'<testcase classname="m" name="d"><error message="{long}"/></testcase>'
        f'<testcase classname="n" name="e"><skipped message="{strict.NA_PREFIX}lacks save"/></testcase>'
        '<testcase classname="n" name="f"><skipped message="no checkpoint"/></testcase>'
        f'<testcase classname="n" name="g"><error message="{strict.NA_PREFIX}an error stays one"/></testcase>'
        '<testcase classname="n" name="h"><system-err>x</system-err><skipped/></testcase>'
        '<testcase classname="n" name="i"/>'
        '</testsuite></testsuites>')
    assert gate.parse_junit(xml, 1) == {
        "returncode": 1, "passed": 2, "passed_tests": ["m::a", "n::i"],
        "failed": [("m::b", "first line second line"), ("m::c", "from the text")],
        "errors": [("m::d", "y" * 300), ("n::g", f"{strict.NA_PREFIX}an error stays one")],
        "skipped": [("n::f", "no checkpoint"), ("n::h", "")], "not_applicable": [("n::e", "lacks save")]}


def test_parse_junit_without_a_report_is_an_error_naming_the_exit(tmp_path):
    assert gate.parse_junit(tmp_path / "none.xml", 4) == {
        "returncode": 4, "passed": 0, "passed_tests": [], "failed": [], "errors": [
            ("pytest", "no junit report (pytest exit 4)")], "skipped": [], "not_applicable": []}


def test_runs_are_merged_with_the_first_failing_exit_and_every_list_joined_in_order():
    a = run(passed=2, passed_tests=["a1", "a2"], skipped=[("a3", "s")], not_applicable=[("a4", "na")])
    b = run(returncode=5)
    del b["passed_tests"], b["skipped"]  # a run that selected nothing
    c = run(passed=1, passed_tests=["c1"], failed=[("c2", "f")], returncode=1, not_applicable=[])
    d = run(passed=1, passed_tests=["d1"], errors=[("d2", "e")], returncode=2)
    assert gate.merge_runs([a, b, c, d]) == {
        "returncode": 1, "passed": 4, "passed_tests": ["a1", "a2", "c1", "d1"], "failed": [("c2", "f")],
        "errors": [("d2", "e")], "skipped": [("a3", "s")], "not_applicable": [("a4", "na")]}
    assert gate.merge_runs([b, run(returncode=5)])["returncode"] == 5, "nothing selected anywhere"
    assert gate.merge_runs([run(returncode=5), a])["returncode"] == 0, "a run that selected nothing adds nothing"
    assert gate.merge_runs([a, run(returncode=3), c])["returncode"] == 3


# --- fingerprint_rows, real_checkpoint --------------------------------------------------------------------------


def test_fingerprint_rows_pair_each_relied_on_name_with_the_versions_known_for_the_candidates_print(monkeypatch):
    asked = []

    def fingerprints_in(source, names):
        asked.append((source, names))
        return {"cand": {"a": "fa2", "b": "fb2", "c": None}, "base": {"a": "fa1", "b": "fb1", "c": "fc1"}}[source]

    monkeypatch.setattr(gate, "relied_on", lambda: ("a", "b", "c"))
    monkeypatch.setattr(fingerprints, "load_known", lambda: {"a": {"fa2": ["0.2.2"], "fa1": ["0.2.1"]},
                                                             "b": {"fb1": ["0.2.1"]}})
    monkeypatch.setattr(fingerprints, "fingerprints_in", fingerprints_in)
    assert gate.fingerprint_rows("cand", "base") == [
        {"name": "a", "against": "fa1", "candidate": "fa2", "known": ["0.2.2"]},
        {"name": "b", "against": "fb1", "candidate": "fb2", "known": []},
        {"name": "c", "against": "fc1", "candidate": None, "known": []}]
    assert asked == [("cand", ("a", "b", "c")), ("base", ("a", "b", "c"))]


@pytest.fixture
def no_checkpoint_found(monkeypatch):
    """No FASTPATH_CHECKPOINT and an empty Hugging Face cache (a test sets either)."""
    import harness.model.checkpoint as checkpoint

    monkeypatch.delenv(checkpoint.ENV_CHECKPOINT, raising=False)
    monkeypatch.setattr(checkpoint, "find_hf_cache", lambda: None)
    return checkpoint


def test_the_real_checkpoint_is_the_one_given_else_the_environments_else_the_cache(monkeypatch, no_checkpoint_found):
    assert gate.real_checkpoint(None) is None
    monkeypatch.setattr(no_checkpoint_found, "find_hf_cache", lambda: Path("/hf/snapshot"))
    assert gate.real_checkpoint(None) == "/hf/snapshot"
    monkeypatch.setenv(no_checkpoint_found.ENV_CHECKPOINT, "/env/ckpt")
    assert gate.real_checkpoint(None) == "/env/ckpt"
    assert gate.real_checkpoint(Path("/given")) == "/given"


# --- check_parity, check_quality, check_behaviour ---------------------------------------------------------------


class Side:
    """An environment for the checks that only hand it on."""

    def __init__(self, name):
        self.name = self.python = name

    def __repr__(self):
        return f"Side({self.name})"


def recording_pytest(monkeypatch, answers):
    """run_pytest answered by `answers(env name, log name)`, each call recorded with its arguments; the tier
    environment says whose it is."""
    asked = []

    def run_pytest(env, args, out, name, extra_env=None, timeout=3600):
        asked.append((env.name, args, out, name, extra_env))
        return answers(env.name, name)

    monkeypatch.setattr(gate, "run_pytest", run_pytest)
    monkeypatch.setattr(gate, "tier_environment", lambda env, version: {"tier": f"{env.name} {version}"})
    return asked


def test_check_parity_runs_the_tier_in_both_environments_each_with_its_own_review(monkeypatch, tmp_path):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=2, passed_tests=["t::a", "t::b"]) if env == "base"
                             else run(passed=1, skipped=[("t::b", "needs save")]))
    check = gate.check_parity(Side("cand"), tmp_path, None, "9.9.9", Side("base"), "0.2.1")
    assert asked == [("cand", ["tests_parity"], tmp_path, "parity", {"tier": "cand 9.9.9"}),
                     ("base", ["tests_parity"], tmp_path, "parity-against", {"tier": "base 0.2.1"})]
    assert (check.status, check.blocks) == ("fail", True)
    assert check.details == ["ran on 0.2.1, SKIPS on the candidate: t::b: needs save"], check.details


def test_check_parity_names_the_against_runs_logs_where_they_are_broken(monkeypatch, tmp_path):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=1) if env == "cand" else run(returncode=4))
    monkeypatch.setattr(gate, "cuda_problem_in", lambda env: None)
    check = gate.check_parity(Side("cand"), tmp_path, "revert", "9.9.9", Side("base"), "0.2.1", device="cuda")
    assert [(env, args) for env, args, *_ in asked] == [
        (env, ["tests_parity", "-m", marks, "-k", "revert"]) for env in ("cand", "base") for marks in ("not cuda", "cuda")]
    logs = f"{tmp_path / 'parity-against.log'}, {tmp_path / 'parity-cuda-against.log'}"
    assert check.summary == (f"could not compare skips: the --against run (0.2.1) is broken: pytest exit 4, 0 passed; "
                             f"read {logs}, fix what stops it, and rerun (candidate: 2 passed) (only the tests -k "
                             f"'revert' selects)"), check.summary
    assert (check.status, check.complete, check.details[-1]) == ("error", False, f"the --against run's log: {logs}")


def test_check_parity_by_default_reviews_each_side_under_its_role(monkeypatch, tmp_path):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=1) if env == "cand" else run(returncode=4))
    check = gate.check_parity(Side("cand"), tmp_path, against=Side("base"))
    assert [extra for *_, extra in asked] == [{"tier": "cand candidate"}, {"tier": "base against"}]
    assert check.summary.startswith("could not compare skips: the --against run (against) is broken"), check.summary


def test_cuda_rows_that_ran_in_both_environments_are_counted(monkeypatch, tmp_path):
    recording_pytest(monkeypatch, lambda env, name: run(passed=1, passed_tests=[f"{env}::{name}"]) if name.startswith(
        "parity-cuda") else run(passed=2, passed_tests=["t::a", "t::b"]))
    monkeypatch.setattr(gate, "cuda_problem_in", lambda env: None)
    check = gate.check_parity(Side("cand"), tmp_path, None, "9.9.9", Side("base"), "0.2.1", device="cuda")
    assert (check.status, check.summary) == ("pass", "bit-exact: 3 passed; skips compared with the --against version's "
                                                     "run (3 passed); CPU and CUDA rows (1 CUDA rows passed)"), check


@pytest.mark.parametrize("problems, said", [
    pytest.param({"cand": "no GPU", "base": "no GPU"}, "no GPU", id="the-same-in-both"),
    pytest.param({"cand": "no GPU", "base": "old driver"}, "candidate: no GPU; against: old driver", id="each-its-own"),
    pytest.param({"cand": "no GPU"}, "candidate: no GPU", id="the-candidate-only"),
])
def test_the_cuda_question_is_asked_of_both_environments_and_each_answer_named(monkeypatch, tmp_path, problems, said):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=1, passed_tests=["t::a"]))
    monkeypatch.setattr(gate, "cuda_problem_in", lambda env: problems.get(env.name))
    check = gate.check_parity(Side("cand"), tmp_path, None, "9.9.9", Side("base"), "0.2.1", device="cuda")
    assert check.summary.startswith(f"not judged: the CUDA parity rows (--device cuda: pytest tests_parity -m cuda) "
                                    f"cannot run here: {said};"), check.summary
    assert [name for _, _, _, name, _ in asked] == ["parity", "parity-against"]


def test_without_an_against_environment_the_candidates_cuda_answer_is_the_whole_answer(monkeypatch, tmp_path):
    recording_pytest(monkeypatch, lambda env, name: run(passed=1))
    monkeypatch.setattr(gate, "cuda_problem_in", lambda env: "no GPU")
    check = gate.check_parity(Side("cand"), tmp_path, None, "9.9.9", None, device="cuda")
    assert "cannot run here: no GPU; the CPU rows" in check.summary, check.summary


def test_check_quality_without_a_real_checkpoint_is_skipped_naming_how_to_give_one(monkeypatch, tmp_path,
                                                                                 no_checkpoint_found):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=1))
    assert gate.check_quality(Side("cand"), None, tmp_path) == Check(
        "quality", "skipped", False, "skipped: no real OmniVoice checkpoint (pass --checkpoint PATH or set "
                                     "FASTPATH_CHECKPOINT); the quality tier judges real speech only")
    assert asked == []


def test_check_quality_runs_the_real_weights_tier_on_the_checkpoint_and_is_needed(monkeypatch, tmp_path,
                                                                                no_checkpoint_found):
    asked = recording_pytest(monkeypatch, lambda env, name: run(passed=3))
    check = gate.check_quality(Side("cand"), "/ckpt", tmp_path, "9.9.9")
    assert check == Check("quality", "pass", False, "3 quality tests passed", required=True)
    assert asked == [("cand", ["tests_quality", "-m", "real_weights", "--checkpoint", "/ckpt"], tmp_path, "quality",
                      {"tier": "cand 9.9.9"})]
    gate.check_quality(Side("cand"), "/ckpt", tmp_path)
    assert asked[-1][-1] == {"tier": "cand candidate"}


def test_check_behaviour_compares_the_two_records_over_every_setting_either_made():
    def record(**settings):
        return {"settings": settings, "device": "cuda", "dtype": "bf16"}

    records = {"against": record(x={"error": "boom"}, z={"tokens": []}),
               "candidate": record(x={"error": "boom"}, y={"tokens": []})}
    check = gate.check_behaviour(records, VERSIONS, {})
    assert check == Check(
        "behaviour", "changed", True,
        "stock generation differs from 0.2.1 at 2 of 3 settings: y, z; 0 of 3 settings compared bit for bit; 1 raised "
        "in both versions: x raised boom",
        ["y [NOT accepted]: recorded by one version only", "z [NOT accepted]: recorded by one version only", TO_ACCEPT,
         "x: raised in both versions, not compared: boom", "grid recorded on cuda in bf16 by both versions"])
    accepted = gate.check_behaviour(records, VERSIONS, {"y": "new", "z": "gone"})
    assert accepted.status == "error" and accepted.details[-1] == "grid recorded on cuda in bf16 by both versions"


# --- could_not_run --------------------------------------------------------------------------------------------


def test_a_candidate_that_does_not_install_is_named_by_pips_error_line():
    said = "Collecting omnivoice==9.9.9\n\n  ERROR: No matching distribution\nERROR: second\n"
    assert gate.could_not_run("omnivoice==9.9.9", {"error": said, "traceback": ""}, installed=False) == Check(
        "install", "fail", True, "could not run: omnivoice==9.9.9 does not install: ERROR: No matching distribution",
        ["Collecting omnivoice==9.9.9", "  ERROR: No matching distribution", "ERROR: second"])
    assert gate.could_not_run("x", {"error": "", "traceback": ""}, installed=False) == Check(
        "install", "fail", True, "could not run: x does not install: no message", [])


def test_a_candidate_that_does_not_import_is_named_by_its_first_line_and_the_tracebacks_end():
    traceback = "\n".join(f"line {i}" for i in range(20))
    check = gate.could_not_run("x", {"error": "ImportError: no module y\nmore", "traceback": traceback},
                               installed=True)
    assert check == Check("install", "fail", True, "could not run: x does not import: ImportError: no module y",
                          [f"line {i}" for i in range(5, 20)])


# --- check_quality_set ----------------------------------------------------------------------------------------


def score(metric: str, verdict: str = "pass") -> stats.ScoreVerdict:
    return stats.ScoreVerdict(metric=metric, unit="u", verdict=verdict, delta=0.01, lower=-0.01, upper=0.03, se=0.01,
                              p_noninferior=0.01, p_worse=0.5, worse=False, mean_ref=0.8, mean_cand=0.81,
                              margin=0.02, n_clips=3, n_sentences=3, seeds=1, seeds_needed=1, equivalent_pass=0.9,
                              judge=f"{metric} judge")


def wer_verdict(verdict: str = "pass") -> stats.Verdict:
    return stats.Verdict(verdict=verdict, delta_wer=0.001, lower=-0.002, upper=0.004, se=0.001, p_noninferior=0.01,
                         p_worse=0.4, worse=False, wer_ref=0.05, wer_cand=0.051, margin=0.01, n_clips=3,
                         n_sentences=3, seeds=1, seeds_needed=None, pilot="pilot", equivalent_pass=0.9,
                         n_differing=1, judge="whisper")


class SetEnv(Side):
    """An environment that generates a set: each run recorded, answered with `returncode`."""

    def __init__(self, name, returncode=0):
        super().__init__(name)
        self.returncode, self.runs = returncode, []

    def run_env(self):
        return {"ENV": self.name}

    def run(self, args, **kwargs):
        self.runs.append((args, kwargs))
        return types.SimpleNamespace(returncode=self.returncode)


class FakeWerJudge:
    identity = json.dumps({"model": "tiny.en"})
    languages = ("en", "zh")  # what it hears

    def hears(self, language):
        return language in self.languages


@pytest.fixture
def quality_world(monkeypatch, tmp_path, no_checkpoint_found):
    """check_quality_set's collaborators replaced by recorders: the set read (two en items, one zh), the judges
    loaded (each by the name it was given), the serial and the sharded generation and judging. `world.result` is what
    the judging gives."""
    from harness.quality import evaluate, judge, mos, sets, shards, voice

    path = tmp_path / "sets" / "en" / "meta.lst"
    items = tuple(sets.CloneItem(f"u{i}", path.parent / f"p{i}.wav", "prompt", "target", lang, f"{path}:{i}")
                  for i, lang in enumerate(("en", "zh", "en")))
    world = types.SimpleNamespace(path=str(path), out=tmp_path / "out", calls=[], log=[],
                                  result=evaluate.Comparison(verdict=None, ref=None, cand=None, pack=None,
                                                             overall=stats.Overall((wer_verdict(), score("SIM")))))
    world.out.mkdir()
    (world.out / "quality-set").mkdir()

    def read_set(given):
        world.calls.append(("read_set", given))
        world.read = sets.EvalSet(path, "seed-tts", items)
        return world.read

    def loader(kind, made):
        def load(name=None):
            world.calls.append((kind, name))
            return made
        return load

    world.judges = {"wer": FakeWerJudge(), "sim": object(), "mos": object()}
    monkeypatch.setattr(sets, "read_set", read_set)
    monkeypatch.setattr(judge, "load_judge", loader("load_judge", world.judges["wer"]))
    monkeypatch.setattr(voice, "load_voice_judge", loader("load_voice_judge", world.judges["sim"]))
    monkeypatch.setattr(mos, "load_mos_judge", loader("load_mos_judge", world.judges["mos"]))

    def recorder(name, answer=None):
        def call(*args, **kwargs):
            world.calls.append((name, args, kwargs))
            return answer() if answer else None
        return call

    monkeypatch.setattr(evaluate, "compare_set_folders", recorder("compare_set_folders", lambda: world.result))
    monkeypatch.setattr(shards, "generate", recorder("generate"))
    monkeypatch.setattr(shards, "judge_set", recorder("judge_set", lambda: world.result))
    world.check = lambda envs, **given: gate.check_quality_set(
        envs[0], envs[1], given.pop("quality_set", world.path), given.pop("synth", "espeak"),
        given.pop("checkpoint", None), world.out, log=world.log.append, **given)
    return world


def test_a_quality_set_not_given_is_skipped_and_changes_nothing(quality_world):
    assert gate.check_quality_set(None, None, None, "espeak", None, quality_world.out) == Check(
        "quality-set", "skipped", False, "skipped: no --quality-set given (a Seed-TTS-eval meta.lst or a LibriSpeech-PC "
                                         "list)")
    assert quality_world.calls == []


def test_a_quality_set_the_omnivoice_synthesizer_cannot_make_without_weights_is_needed_and_skipped(quality_world):
    assert quality_world.check((SetEnv("cand"), SetEnv("base")), synth="omnivoice") == Check(
        "quality-set", "skipped", False, "skipped: the omnivoice synthesizer needs a real OmniVoice checkpoint (pass "
                                         "--checkpoint PATH or set FASTPATH_CHECKPOINT)", required=True)
    assert quality_world.calls == []


def test_a_set_is_generated_in_each_environment_and_judged_item_by_item_against_the_against_outputs(quality_world):
    world = quality_world
    env, against = SetEnv("cand"), SetEnv("base")
    check = world.check((env, against), checkpoint="/ignored-by-espeak",
                        judges={"wer": "/judges/whisper", "sim": "/judges/wavlm", "mos": "/judges/utmos.pt"})
    folders = {side: world.out / "quality-set" / side for side in ("against", "candidate")}
    resolved = str(Path(world.path).resolve())
    for e, side in ((against, "against"), (env, "candidate")):
        assert e.runs == [(["-m", "harness.quality.clone_run", resolved, str(folders[side]), "--synth", "espeak"],
                           {"timeout": 7200, "log": world.out / f"quality-set-{side}.log"})], e.runs
    assert world.calls == [
        ("read_set", world.path), ("load_judge", "/judges/whisper"), ("load_voice_judge", "/judges/wavlm"),
        ("load_mos_judge", "/judges/utmos.pt"),
        ("compare_set_folders", (world.judges["wer"], world.read, folders["against"], folders["candidate"]),
         {"label": "candidate", "pack_dir": world.out / "quality-set" / "pack", "voice_judge": world.judges["sim"],
          "mos_judge": world.judges["mos"]})]
    assert world.calls[-1][1][1] is world.read and world.read.items[1].language == "zh", "the set read is judged"
    assert world.log == ["quality-set: generating 3 items in the against environment (espeak)",
                         "quality-set: generating 3 items in the candidate environment (espeak)",
                         "quality-set: judging 3 items on WER, SIM, MOS, candidate against --against"]
    overall = world.result.overall
    assert check == Check("quality-set", "pass", False, "3 items (2 en, 1 zh) of meta.lst, espeak: non-inferior on "
                                                        "WER, SIM", overall.format().splitlines(), required=True)
    text = (world.out / "quality-set" / "verdict.json").read_text()
    assert text.startswith('{\n "set": '), "one key a line, for a person to read"
    assert json.loads(text) == {
        "set": str(Path(world.path)), "items": 3, "languages": {"en": 2, "zh": 1}, "synth": "espeak",
        "judged": ["wer", "sim", "mos"], "passed": True,
        "metrics": [json.loads(json.dumps(gate.metric_figures(v))) for v in overall.verdicts]}


def test_the_omnivoice_synthesizer_is_given_the_real_checkpoint_in_both_environments(quality_world):
    env, against = SetEnv("cand"), SetEnv("base")
    quality_world.check((env, against), synth="omnivoice", checkpoint="/ckpt", metrics=("sim",))
    assert [args[-4:] for e in (against, env) for args, _ in e.runs] == [
        ["--synth", "omnivoice", "--checkpoint", "/ckpt"]] * 2
    assert [c[:2] for c in quality_world.calls[:2]] == [("read_set", quality_world.path), ("load_voice_judge", None)]
    assert quality_world.log[-1] == "quality-set: judging 3 items on SIM, candidate against --against"
    judged = quality_world.calls[-1]
    assert judged[1][0] is None and judged[2]["mos_judge"] is None, "a metric left out loads no judge"


def test_a_language_the_wer_judge_cannot_hear_is_not_judged_naming_the_fix(quality_world):
    from harness.quality import judge

    quality_world.judges["wer"].languages = ("en",)
    check = quality_world.check((SetEnv("cand"), SetEnv("base")))
    assert check == Check("quality-set", "skipped", False,
                          f"not judged: {judge.CannotHear('tiny.en', ['zh'])}", required=True)
    assert "compare_set_folders" not in [c[0] for c in quality_world.calls]
    assert not (quality_world.out / "quality-set" / "verdict.json").exists()


@pytest.mark.parametrize("side", ["against", "candidate"])
def test_a_generation_that_fails_in_either_environment_is_the_gates_step_error_naming_its_log(quality_world, side):
    envs = (SetEnv("cand", 3 if side == "candidate" else 0), SetEnv("base", 3 if side == "against" else 0))
    with pytest.raises(gate.GateStepError) as failed:
        quality_world.check(envs)
    assert str(failed.value) == (f"generating the set failed in the {side} environment (exit 3); see "
                                 f"{quality_world.out / f'quality-set-{side}.log'}")


def test_a_failing_metric_blocks_naming_it_and_the_listening_pack(quality_world):
    world = quality_world
    world.result = world.result.__class__(verdict=None, ref=None, cand=None, pack=Path("/pack"),
                                          overall=stats.Overall((score("SIM"), score("MOS-OVRL", "fail"),
                                                                 score("MOS-P808", "underpowered"))))
    check = world.check((SetEnv("cand"), SetEnv("base")), metrics=("sim", "mos"))
    assert check == Check(
        "quality-set", "fail", True, "3 items (2 en, 1 zh) of meta.lst, espeak: not shown non-inferior on MOS-OVRL, "
                                     "MOS-P808", world.result.overall.format().splitlines() + ["listening pack: /pack"],
        required=True)
    written = json.loads((world.out / "quality-set" / "verdict.json").read_text())
    assert (written["passed"], written["judged"], [m["metric"] for m in written["metrics"]]) == (
        False, ["sim", "mos"], ["SIM", "MOS-OVRL", "MOS-P808"])


def test_a_verdicts_metric_rows_are_in_the_units_a_reader_compares():
    """gate.metric_figures, the rows of verdict.json, against figures worked by hand: WER in points (x 100, lower is
    better), a score in its own unit (higher is better), the bounds those of candidate - reference."""
    assert gate.metric_figures(wer_verdict("fail")) == {
        "metric": "WER", "verdict": "fail", "unit": "WER points", "better": "lower", "ref": pytest.approx(5.0),
        "cand": pytest.approx(5.1), "delta": pytest.approx(0.1), "lower": pytest.approx(-0.2),
        "upper": pytest.approx(0.4), "margin": pytest.approx(1.0), "clips": 3, "judge": "whisper"}
    assert gate.metric_figures(score("SIM")) == {
        "metric": "SIM", "verdict": "pass", "unit": "u", "better": "higher", "ref": 0.8, "cand": 0.81, "delta": 0.01,
        "lower": -0.01, "upper": 0.03, "margin": 0.02, "clips": 3, "judge": "SIM judge"}


def test_a_comparison_with_only_the_wer_verdict_is_judged_on_wer(quality_world):
    world = quality_world
    world.result = world.result.__class__(verdict=wer_verdict("fail"), ref=None, cand=None, pack=None)
    envs = (SetEnv("cand"), SetEnv("base"))
    check = gate.check_quality_set(envs[0], envs[1], world.path, "espeak", None, world.out, log=world.log.append,
                                   metrics=("wer",), judges={"wer": "/w"})
    assert (check.status, check.summary) == ("fail", "3 items (2 en, 1 zh) of meta.lst, espeak: not shown "
                                                      "non-inferior on WER"), check
    assert check.details == wer_verdict("fail").format().splitlines()
    written = json.loads((world.out / "quality-set" / "verdict.json").read_text())
    assert written["metrics"] == [json.loads(json.dumps(gate.metric_figures(wer_verdict("fail"))))]
    assert [c[:2] for c in world.calls[:-1]] == [("read_set", world.path), ("load_judge", "/w")], world.calls
    assert world.calls[-1][2]["voice_judge"] is None and world.calls[-1][2]["mos_judge"] is None


def test_over_workers_the_set_is_generated_and_judged_by_the_shards_with_the_loaded_judges(quality_world):
    world = quality_world
    env, against = SetEnv("cand"), SetEnv("base")
    judges = {"sim": "/judges/wavlm", "mos": None}
    check = world.check((env, against), synth="omnivoice", checkpoint="/ckpt", metrics=("sim", "mos"),
                        judges=judges, workers=3, engine="ray", gpus=["0", "1"])
    assert check.status == "pass" and env.runs == against.runs == []
    folders = {side: world.out / "quality-set" / side for side in ("against", "candidate")}
    generate = [(args, kwargs) for name, *rest in world.calls if name == "generate" for args, kwargs in [rest]]
    assert generate == [((world.path, folders[side], 3, "omnivoice"),
                         {"python": e.name, "checkpoint": "/ckpt", "extra_env": {"ENV": e.name}, "engine": "ray",
                          "gpus": ["0", "1"], "logs": world.out, "timeout": 7200, "log": world.log.append})
                        for side, e in (("against", against), ("candidate", env))]
    assert world.calls[-1] == ("judge_set", (world.path, folders["against"], folders["candidate"], 3,
                                             world.out / "quality-set" / "judged", ("sim", "mos"), judges),
                               {"label": "candidate", "pack_dir": world.out / "quality-set" / "pack", "engine": "ray",
                                "log": world.log.append,
                                "loaded": (None, world.judges["sim"], world.judges["mos"])})
    assert world.log == ["quality-set: generating 3 items in the against environment (omnivoice) over 3 workers (ray)",
                         "quality-set: generating 3 items in the candidate environment (omnivoice) over 3 workers "
                         "(ray)", "quality-set: judging 3 items on SIM, MOS, candidate against --against"]


def test_over_workers_without_judges_named_the_shards_get_an_empty_table(quality_world):
    quality_world.check((SetEnv("cand"), SetEnv("base")), metrics=("sim",), workers=2)
    assert quality_world.calls[-1][1][6] == {} and quality_world.calls[-1][2]["engine"] == "local"
    assert quality_world.log[0] == "quality-set: generating 3 items in the against environment (espeak) over 2 workers " \
                                   "(local)", quality_world.log


def test_a_shard_that_fails_is_the_gates_step_error(monkeypatch, quality_world):
    from harness.quality import shards

    def failing(what):
        def fail(*args, **kwargs):
            raise shards.ShardFailure(what, ["worker 1 died"])
        return fail

    monkeypatch.setattr(shards, "generate", failing("generating"))
    with pytest.raises(gate.GateStepError) as generating:
        quality_world.check((SetEnv("cand"), SetEnv("base")), metrics=("sim",), workers=2)
    assert str(generating.value) == ("generating the set failed in the against environment: "
                                     f"{shards.ShardFailure('generating', ['worker 1 died'])}")
    monkeypatch.setattr(shards, "generate", lambda *a, **k: None)
    monkeypatch.setattr(shards, "judge_set", failing("judging"))
    with pytest.raises(gate.GateStepError) as judging:
        quality_world.check((SetEnv("cand"), SetEnv("base")), metrics=("sim",), workers=2)
    assert str(judging.value) == str(shards.ShardFailure("judging", ["worker 1 died"]))


# --- run_gate -------------------------------------------------------------------------------------------------

GIT_SOURCE = {"kind": "git", "url": "https://example.org/omnivoice", "ref": "master", "commit": "0123456789abcdef",
              "distribution": "omnivoice", "version": "9.9.9", "spec": "git+https://example.org/omnivoice@master",
              "requires": []}


class GateEnv:
    """A prepared environment: where it is, what it imports (or the error it raises), what it installed."""

    def __init__(self, name, version, distribution="omnivoice", source=None, error=None):
        self.name, self.version, self.dist, self.error = name, version, distribution, error
        self.python, self.site = Path(f"/venvs/{name}/bin/python"), Path(f"/venvs/{name}/site")
        self.notes, self.source, self.imported = (f"{name} note",), source or {}, 0

    def __repr__(self):
        return f"GateEnv({self.name})"

    def import_check(self):
        self.imported += 1
        if self.error:
            return {"ok": False, "error": self.error, "traceback": f"Traceback (most recent call last):\n{self.error}"}
        found = {"ok": True, "distribution": self.dist, "version": self.version, "file": "x"}
        return found if self.dist else {k: v for k, v in found.items() if k != "distribution"}

    def distribution(self):
        return self.dist, self.version


class Recorded:
    """A Progress whose stages and steps are recorded."""

    def __init__(self):
        self.stages, self.steps = [], []

    @contextlib.contextmanager
    def stage(self, name, total):
        self.stages.append((name, total))
        yield self.steps.append


STEPS = {"check_api": "api", "check_fingerprints": "fingerprints", "check_behaviour": "behaviour",
         "check_goldens": "goldens", "check_parity": "parity", "check_work": "work", "check_rtf": "rtf",
         "check_quality_set": "quality-set", "check_quality": "quality"}


@pytest.fixture
def gate_world(monkeypatch, tmp_path, no_checkpoint_found):
    """run_gate with its environments (`world.envs`, by the text given), each check and the behaviour recording
    replaced by recorders (`world.calls`; `world.answers[check]`: an exception to raise, or the Check to give; else
    a pass), a clock that reads 12.34 s more after its first reading, and a recorded log and progress."""
    from harness.gate import goldens

    world = types.SimpleNamespace(calls=[], answers={}, log=[], progress=Recorded(), out=tmp_path / "gate" / "out",
                                  envs={"omnivoice==9.9.9": GateEnv("cand", "9.9.9", source=GIT_SOURCE),
                                        "current": GateEnv("base", "0.2.1")})

    def prepare(spec, fresh=False):
        world.calls.append(("prepare", spec.text, fresh))
        found = world.envs[spec.text]
        if isinstance(found, Exception):
            raise found
        return found

    def recorder(function, name):
        def call(*args):
            world.calls.append((name, *args))
            answer = world.answers.get(name)
            if isinstance(answer, BaseException):
                raise answer
            return answer or Check(name, "pass", False, "ok")
        return call

    def run_behaviour(env, out, tag, device="cpu", dtype="fp32"):
        world.calls.append(("run_behaviour", env, out, tag, device, dtype))
        return {"recorded in": tag}

    ticks = iter([100.0])
    monkeypatch.setattr(cand, "prepare", prepare)
    for function, name in STEPS.items():
        monkeypatch.setattr(gate, function, recorder(function, name))
    monkeypatch.setattr(gate, "run_behaviour", run_behaviour)
    monkeypatch.setattr(gate, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks, 112.34)))
    monkeypatch.setattr(goldens, "environment", lambda: {"torch": "2.x", "transformers": "4.x"})
    monkeypatch.setattr(gate.machine, "summary", lambda: "a test machine")
    world.run = lambda **given: gate.run_gate(given.pop("candidate", "omnivoice==9.9.9"), given.pop("against", "current"),
                                              world.out,
                                              log=world.log.append, progress=world.progress, **given)
    return world


def test_run_gate_hands_each_check_what_it_was_given_and_records_the_verdict(gate_world):
    world = gate_world
    cand_env, base = world.envs["omnivoice==9.9.9"], world.envs["current"]
    judges = {"wer": "/w", "sim": None, "mos": "/m"}
    report = world.run(rtf_rounds=2, checkpoint="/ckpt", fresh=True, command="fastpath-suite gate x",
                       parity_select="revert", accepted={"a": "reviewed"}, device="cuda", dtype="bf16",
                       quality_set="set/meta.lst", quality_synth="espeak", judges=judges, quality_metrics=("sim",),
                       workers=3, engine="ray", gpus=["0"])
    out, versions, recorded_as = world.out, ("9.9.9", "0.2.1"), ("9.9.9+g0123456789ab", "0.2.1")
    records = {"against": {"recorded in": "against"}, "candidate": {"recorded in": "candidate"}}
    assert world.calls == [
        ("prepare", "omnivoice==9.9.9", True), ("prepare", "current", True),
        ("api", cand_env, base, versions, ("omnivoice", "omnivoice")),
        ("run_behaviour", base, out, "against", "cuda", "bf16"), ("run_behaviour", cand_env, out, "candidate", "cuda",
                                                                  "bf16"),
        ("fingerprints", cand_env, base, recorded_as, out, list(records.values())),
        ("behaviour", records, versions, {"a": "reviewed"}),
        ("goldens", cand_env, recorded_as, out),
        ("parity", cand_env, out, "revert", "9.9.9", base, "0.2.1", "cuda"),
        ("work", cand_env, base, versions, out),
        ("rtf", cand_env, base, 2, out),
        ("quality-set", cand_env, base, "set/meta.lst", "espeak", "/ckpt", out, judges, world.log.append, ("sim",), 3,
         "ray", ["0"]),
        ("quality", cand_env, "/ckpt", out, "9.9.9")]
    assert (cand_env.imported, base.imported) == (1, 1)
    install = Check("install", "pass", False, "omnivoice 9.9.9 at commit 0123456789ab installs the omnivoice package, "
                                              "which imports from /venvs/cand/site",
                    ["cand note", "from https://example.org/omnivoice at master: commit 0123456789abcdef",
                     "omnivoice 9.9.9 as pip installed it (git+https://example.org/omnivoice@master); declares no "
                     "requirements; each met by this environment"])
    checks = [install, Check("api", "pass", False, "ok")] + [
        Check(n, "pass", False, "ok", ["took 0 s"], required=n in ("quality", "quality-set")) for n in gate.CHECKS]
    assert report == {
        **gate.verdict(checks),
        "candidate": {"spec": "omnivoice==9.9.9", "distribution": "omnivoice", "version": "9.9.9",
                      "python": "/venvs/cand/bin/python", "source": GIT_SOURCE},
        "against": {"spec": "current", "distribution": "omnivoice", "version": "0.2.1",
                    "python": "/venvs/base/bin/python", "source": {}},
        "environment": {"torch": "2.x", "transformers": "4.x", "omnivoice": None, "machine": "a test machine"},
        "command": "fastpath-suite gate x", "accepted": {"a": "reviewed"}, "seconds": 12.3}
    assert report["state"] == "may-ship"
    text = (out / "verdict.json").read_text()
    assert text.startswith('{\n "ship": true,\n'), "one key a line, for a person to read"
    assert json.loads(text) == json.loads(json.dumps(report))
    assert (out / "verdict.md").read_text() == gate.render_verdict(report)
    assert world.log == [
        "plan: prepare 2 environments (candidate omnivoice==9.9.9, against current: a venv each, reused from "
        ".cache/gate/ when built before), then 8 checks: fingerprints, behaviour, goldens, parity, work, rtf, "
        "quality-set, quality", "environment 1/2: omnivoice==9.9.9", "environment 2/2: current, 0:12 elapsed",
        *[f"check {i}/8: {n} started, 0:12 elapsed" for i, n in enumerate(gate.CHECKS, 1)]]
    assert world.progress.stages == [("checks", 8)]
    assert world.progress.steps == [f"{n} pass in 0 s" for n in gate.CHECKS]


def test_run_gate_by_default(gate_world):
    world = gate_world
    cand_env, base = world.envs["omnivoice==9.9.9"], world.envs["current"]
    report = gate.run_gate("omnivoice==9.9.9", "current", world.out, log=world.log.append)
    out = world.out
    calls = {c[0]: c[1:] for c in world.calls}
    assert [c[1:] for c in world.calls if c[0] == "prepare"] == [("omnivoice==9.9.9", False), ("current", False)]
    assert [c[3:] for c in world.calls if c[0] == "run_behaviour"] == [("against", "cpu", "fp32"),
                                                                        ("candidate", "cpu", "fp32")]
    assert calls["behaviour"][2] == {} and calls["parity"] == (cand_env, out, None, "9.9.9", base, "0.2.1", "cpu")
    assert calls["quality-set"] == (cand_env, base, None, "omnivoice", None, out, None, world.log.append,
                                    gate.QUALITY_METRICS, 1, "local", None)
    assert "rtf" not in calls, "no rounds asked for: the rtf check is not run"
    rows = {c["name"]: c for c in report["checks"]}
    assert {k: rows["rtf"][k] for k in ("status", "summary")} == {"status": "skipped",
                                                                  "summary": "not measured (--rtf-rounds 0)"}
    assert not rows["quality"]["required"] and not rows["quality-set"]["required"]
    assert (report["command"], report["accepted"]) == ("", {})


def test_the_behaviour_grid_is_recorded_once_whichever_check_asks_first_and_only_traced_when_it_runs(gate_world):
    world = gate_world
    world.run(checks=("behaviour", "fingerprints"))
    assert [c[0] for c in world.calls] == ["prepare", "prepare", "api", "run_behaviour", "run_behaviour",
                                           "behaviour", "fingerprints"]
    world.calls.clear()
    world.run(checks=("fingerprints",))
    assert [c for c in world.calls if c[0] == "fingerprints"][0][-1] is None, "no behaviour check: no trace"
    assert "run_behaviour" not in [c[0] for c in world.calls]


def test_a_fork_without_a_commit_is_named_by_its_distribution_and_recorded_under_its_version(gate_world):
    world = gate_world
    world.envs["lahgtna-omnivoice==0.1.5"] = GateEnv("fork", "0.1.5", distribution="lahgtna-omnivoice")
    report = world.run(candidate="lahgtna-omnivoice==0.1.5", checks=("goldens",))
    fork, base = world.envs["lahgtna-omnivoice==0.1.5"], world.envs["current"]
    assert world.calls[2:] == [("api", fork, base, ("0.1.5", "0.2.1"), ("lahgtna-omnivoice", "omnivoice")),
                               ("goldens", fork, ("0.1.5", "0.2.1"), world.out)]
    assert report["checks"][0]["summary"] == ("lahgtna-omnivoice 0.1.5 installs the omnivoice package, which imports "
                                              "from /venvs/fork/site")
    assert report["checks"][0]["details"] == ["fork note"]


def test_a_candidate_that_does_not_install_runs_no_check_and_is_named_by_the_installers_words(gate_world):
    world = gate_world
    said = "ERROR: No matching distribution found for omnivoice==9.9.9"
    world.envs["omnivoice==9.9.9"] = cand.CandidateError(said)
    report = world.run(checks=("fingerprints", "parity"))
    base = world.envs["current"]
    assert [c[0] for c in world.calls] == ["prepare", "prepare"] and base.imported == 0
    checks = [gate.could_not_run("omnivoice==9.9.9", {"ok": False, "error": said, "traceback": ""}, installed=False)]
    checks += [Check(n, "skipped", False, "skipped: the candidate could not be installed or imported")
               for n in ("fingerprints", "parity")]
    assert report["checks"] == [c.__dict__ for c in checks]
    assert (report["state"], report["exit_status"], report["reason"]) == (
        "could-not-run", 1, f"omnivoice==9.9.9 does not install: {said}")
    assert report["candidate"] == {"spec": "omnivoice==9.9.9", "distribution": None, "version": "?", "python": None,
                                   "source": {}}
    assert report["against"] == {"spec": "current", "distribution": "omnivoice", "version": "0.2.1",
                                 "python": "/venvs/base/bin/python", "source": {}}


def test_a_candidate_that_does_not_import_is_named_by_the_imports_error(gate_world):
    world = gate_world
    broken = world.envs["omnivoice==9.9.9"] = GateEnv("cand", "9.9.9", source=GIT_SOURCE, error="ImportError: y")
    report = world.run(checks=("work",))
    assert report["checks"][0]["summary"] == "could not run: omnivoice==9.9.9 does not import: ImportError: y"
    assert report["checks"][0]["details"] == ["Traceback (most recent call last):", "ImportError: y"]
    assert [c[0] for c in world.calls] == ["prepare", "prepare"] and world.envs["current"].imported == 0
    assert report["candidate"] == {"spec": "omnivoice==9.9.9", "distribution": None, "version": "?",
                                   "python": str(broken.python), "source": GIT_SOURCE}


def test_an_against_version_that_does_not_import_is_the_gates_error_with_no_verdict(gate_world):
    world = gate_world
    world.envs["current"] = GateEnv("base", "0.2.1", error="ImportError: z")
    with pytest.raises(cand.CandidateError) as failed:
        world.run(checks=("work",))
    assert str(failed.value) == "the --against environment does not import omnivoice: ImportError: z"
    assert not (world.out / "verdict.json").exists()


def test_checks_that_raise_or_time_out_are_error_rows_and_keep_whether_they_are_needed(gate_world):
    world = gate_world
    world.answers.update({
        "api": RuntimeError("no site"), "work": subprocess.TimeoutExpired(["python", "-m", "x", 3], 5.4),
        "quality": gate.GateStepError("probe failed"),
        "quality-set": Check("quality-set", "skipped", False, "skipped: needs weights", required=True)})
    report = world.run(checks=("work", "quality", "quality-set"), checkpoint="/ckpt")
    assert report["checks"][1:] == [c.__dict__ for c in [
        Check("api", "error", False, "could not run: RuntimeError: no site"),
        Check("work", "error", False, "could not run: timed out after 5 s: python -m x 3", ["took 0 s"]),
        Check("quality", "error", False, "could not run: GateStepError: probe failed", ["took 0 s"], required=True),
        Check("quality-set", "skipped", False, "skipped: needs weights", ["took 0 s"], required=True)]]
    assert (report["state"], report["errors"]) == ("error", ["work", "quality"])
    assert world.progress.steps == ["work error in 0 s", "quality error in 0 s", "quality-set skipped in 0 s"]


def test_an_import_check_that_does_not_name_the_distribution_is_read_as_omnivoice(gate_world):
    world = gate_world
    world.envs = {"omnivoice==9.9.9": GateEnv("cand", "9.9.9", distribution=None),
                  "current": GateEnv("base", "0.2.1", distribution=None)}
    report = world.run(checks=())
    assert world.calls[-1][-1] == ("omnivoice", "omnivoice"), world.calls
    assert (report["candidate"]["distribution"], report["against"]["distribution"]) == ("omnivoice", "omnivoice")
    assert report["checks"][0]["summary"].startswith("omnivoice 9.9.9 installs"), report["checks"][0]


def test_a_fork_as_the_against_version_is_named_by_its_distribution_whether_or_not_the_candidate_installs(gate_world):
    world = gate_world
    fork = world.envs["lahgtna-omnivoice==0.1.5"] = GateEnv("fork", "0.1.5", distribution="lahgtna-omnivoice")
    report = world.run(against="lahgtna-omnivoice==0.1.5", checks=())
    assert world.calls[-1] == ("api", world.envs["omnivoice==9.9.9"], fork, ("9.9.9", "0.1.5"),
                               ("omnivoice", "lahgtna-omnivoice"))
    assert report["against"]["distribution"] == "lahgtna-omnivoice"
    world.envs["omnivoice==9.9.9"] = cand.CandidateError("ERROR: no such version")
    broken = world.run(against="lahgtna-omnivoice==0.1.5", checks=())
    assert {k: broken["against"][k] for k in ("distribution", "version")} == {
        "distribution": "lahgtna-omnivoice", "version": "0.1.5"}


def test_run_gate_without_a_progress_says_nothing(gate_world, capsys):
    report = gate.run_gate("omnivoice==9.9.9", "current", gate_world.out, checks=("work",), log=gate_world.log.append)
    assert report["checks"][-1]["name"] == "work"
    assert capsys.readouterr() == ("", "")
