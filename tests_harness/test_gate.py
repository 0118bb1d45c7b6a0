"""The upstream version-bump gate (harness.gate.gate): its verdict rules on synthetic inputs, a candidate
with a one-line change to the unmasking schedule refused by name and caught by the goldens, and (slow) the
whole command end to end on that candidate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

import fastpath
from fastpath import fingerprints
from fastpath.instance import overridden
from fastpath.registry import relied_on
from harness import REPO_ROOT
from harness.gate import gate
from harness.gate import goldens
from harness.gate import candidate as cand
from harness.run.machine import numerics_key

FLOOR_FIXTURE = REPO_ROOT / "fixtures" / "upstream" / "floor_schedule.py"


def floor_schedule():
    spec = importlib.util.spec_from_file_location("floor_schedule", FLOOR_FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(name, against, candidate, known=()):
    return {"name": name, "against": against, "candidate": candidate, "known": list(known)}


# --- verdict rules -------------------------------------------------------------------------------------------


def test_fingerprints_identical_pass():
    check = gate.rule_fingerprints([row("f", "a", "a", ["0.2.1"])], "0.2.2", "0.2.1")
    assert (check.status, check.blocks) == ("pass", False)


def test_fingerprint_change_that_was_recorded_does_not_block():
    rows = [row("OmniVoice.forward", "a", "b", ["0.2.2"]), row("_gumbel_sample", "c", "c", ["0.2.1"])]
    check = gate.rule_fingerprints(rows, "0.2.2", "0.2.1")
    assert (check.status, check.blocks) == ("changed-as-expected", False)
    assert "OmniVoice.forward" in check.summary and "_gumbel_sample" not in check.summary


@pytest.mark.parametrize("new", ["b", None], ids=["changed", "removed"])
def test_unreviewed_fingerprint_change_blocks_naming_the_function(new):
    rows = [row("OmniVoice._generate_iterative", "a", new), row("_gumbel_sample", "c", "c", ["0.2.1"])]
    check = gate.rule_fingerprints(rows, "0.3.0", "0.2.1", "/x/omnivoice.py")
    assert (check.status, check.blocks) == ("changed", True)
    assert "OmniVoice._generate_iterative" in check.summary and "_gumbel_sample" not in check.summary
    assert any("--source /x/omnivoice.py --version 0.3.0 --record" in d for d in check.details), check.details


def parity_result(passed=10, failed=(), errors=(), skipped=(), returncode=0):
    return {"returncode": returncode, "passed": passed, "failed": list(failed), "errors": list(errors),
            "skipped": list(skipped)}


def test_a_parity_test_that_ran_before_and_skips_now_blocks_by_name():
    """A release that drops what a test needs (e.g. VoiceClonePrompt.save) turns that test into a skip, not a
    failure: the gate compares with the --against version's run and names it."""
    before = parity_result(passed=2) | {"passed_tests": ["t::saved_prompt", "t::other"], "version": "0.2.1"}
    now = parity_result(passed=1, skipped=[("t::saved_prompt", "needs VoiceClonePrompt.save"), ("t::x", "slow")])
    check = gate.rule_parity(now, before)
    assert (check.status, check.blocks) == ("fail", True), check
    assert any("SKIPS on the candidate: t::saved_prompt" in d for d in check.details), check.details
    assert gate.rule_parity(now).status == "pass", "without a comparison run a skip is only listed"
    same = parity_result(passed=2, skipped=[("t::x", "slow")])
    assert gate.rule_parity(same, before).status == "pass"


def test_parity_rules():
    assert gate.rule_parity(parity_result()).status == "pass"
    failing = gate.rule_parity(parity_result(failed=[("t", "not bit-exact")], returncode=1))
    assert (failing.status, failing.blocks) == ("fail", True) and "t: not bit-exact" in failing.details
    assert gate.rule_parity(parity_result(errors=[("t", "AttributeError")], returncode=1)).blocks
    assert gate.rule_parity(parity_result(returncode=2)).blocks, "a crashed pytest run must block"
    assert gate.rule_parity(parity_result(passed=0, returncode=0)).blocks, "no test ran: must block"
    skipped = gate.rule_parity(parity_result(skipped=[("t", "needs VoiceClonePrompt.save")]))
    assert skipped.status == "pass" and any("VoiceClonePrompt" in d for d in skipped.details)


# --against parity runs that cannot be compared with: (returncode, passed, failed) of the run
@pytest.mark.parametrize("returncode, passed, failed", [
    pytest.param(4, 0, [], id="usage-error-nothing-ran"),  # pytest exit 4: the run never started
    pytest.param(2, 1, [], id="interrupted-after-one-pass"),  # its junit file holds the passes of a part
    pytest.param(0, 0, [], id="every-test-skipped"),
    pytest.param(1, 1, [("t::other", "not bit-exact")], id="a-test-failed"),
])
def test_a_broken_against_run_is_an_error_not_a_comparison(returncode, passed, failed):
    """Skips are compared with the --against run only when it ran healthy (exit 0, a test passed): a candidate whose
    tests skip is never MAY SHIP against a run that says nothing about which tests run there."""
    before = parity_result(passed=passed, failed=failed, returncode=returncode) | {
        "passed_tests": ["t::other"][:passed], "version": "0.2.1", "log": "out/gate/x/parity-against.log"}
    now = parity_result(passed=1, skipped=[("t::saved_prompt", "needs VoiceClonePrompt.save")])
    check = gate.rule_parity(now, before)
    assert (check.status, check.blocks) == ("error", False), check
    assert "out/gate/x/parity-against.log" in check.summary and "0.2.1" in check.summary, check.summary
    report = gate.verdict([gate.Check(n, "pass", False, "") for n in gate.BLOCKING if n != "parity"] + [check])
    assert (report["state"], report["errors"]) == ("error", ["parity"]), report
    assert gate.headline(report).startswith("ERROR"), gate.headline(report)
    healthy = parity_result(passed=2) | {"passed_tests": ["t::other", "t::x"], "version": "0.2.1"}
    assert gate.rule_parity(now, healthy).status == "pass", "a healthy comparison run: the skip ran nowhere before"


def test_golden_rules():
    same = {"0.2.1": {"p": [], "q": []}}
    assert gate.rule_goldens(same, "0.2.1", "0.2.2").status == "pass"
    other = {"0.2.1": {"p": ["tokens: 3/80 differ"], "q": []}, "0.2.2": {"p": [], "q": []}}
    assert gate.rule_goldens(other, "0.2.1", "0.2.2").status == "changed-as-expected"
    moved = gate.rule_goldens({"0.2.1": {"p": ["tokens: 3/80 differ", "logits: sha256 differs"], "q": []}},
                              "0.2.1", "0.3.0")
    assert (moved.status, moved.blocks) == ("changed", False), "a stock behaviour change informs, never blocks"
    assert moved.details == ["p: tokens: 3/80 differ; logits: sha256 differs"]
    assert gate.rule_goldens({}, "0.2.1", "0.3.0").status == "skipped"


def work(flops=100, positions=10):
    counters = dict.fromkeys(gate.COUNTERS, 1)
    return dict(counters, flops=flops, llm_positions=positions)


def test_work_rules():
    base = {"p": {"stock": work(200, 20), "fastpath": work(100, 10)}}
    assert gate.rule_work(base, base, "new", "old").status == "pass"
    lost = {"p": {"stock": work(200, 20), "fastpath": work(150, 10)}}  # stack 0.50 -> 0.75 of stock's FLOPs
    check = gate.rule_work(lost, base, "new", "old")
    assert (check.status, check.blocks) == ("fail", True), check
    assert "p flops: stack/stock 0.5000 on old -> 0.7500 on new" in check.details[0], check.details
    longer = {"p": {"stock": work(210, 21), "fastpath": work(105, 10)}}  # 5% longer speech: both grow, ratio kept
    check = gate.rule_work(longer, base, "new", "old")
    assert (check.status, check.blocks) == ("changed", False), check
    assert gate.rule_work({}, base, "new", "old").blocks, "unmeasured points must block"


def work_pair(stock, stack, key="reference_encodes"):
    """One point's counters with `key` set to stock's and the stack's count."""
    return {"p": {"stock": dict(work(), **{key: stock}), "fastpath": dict(work(), **{key: stack})}}


# (stock, stack) on the --against version -> (stock, stack) on the candidate: whether the work check blocks
@pytest.mark.parametrize("before, after, blocks", [
    pytest.param((200, 0), (200, 5), True, id="stack-did-none-now-some"),  # stack/stock 0 -> 0.025: lost ground
    pytest.param((0, 0), (0, 3), True, id="stock-none-both-stack-0-to-3"),  # work stock never does
    pytest.param((0, 2), (0, 3), True, id="stock-none-both-stack-grew"),
    pytest.param((5, 2), (0, 2), True, id="stock-stopped-stack-did-not"),
    pytest.param((0, 0), (5, 8), True, id="new-work-stack-does-more-than-stock"),
    pytest.param((0, 0), (5, 5), False, id="new-work-stack-does-as-stock"),  # a release adds work to both
    pytest.param((0, 2), (0, 1), False, id="stock-none-both-stack-shrank"),
    pytest.param((5, 2), (0, 0), False, id="work-gone-from-both"),
])
def test_work_that_stock_or_the_stack_did_none_of_is_judged_without_dividing_by_zero(before, after, blocks):
    """The share stack/stock has no value where a count is 0: the stack doing work that stock does not (or more of
    a work stock newly does than stock) is lost ground; the check names the work and never errors."""
    check = gate.rule_work(work_pair(*after), work_pair(*before), "new", "old")
    assert check.blocks == blocks and check.status == ("fail" if blocks else "changed"), check
    if blocks:
        assert "p reference_encodes" in check.summary, check.summary
        assert gate.verdict([gate.Check(n, "pass", False, "") for n in gate.BLOCKING if n != "work"]
                            + [check])["state"] == "must-not-ship"


def test_the_verdict_reads_the_checks_fields_not_their_summaries():
    """A summary is text for people: a changed upstream function whose name holds "subset" is no subset run."""
    ok = [gate.Check(n, "pass", False, "") for n in gate.BLOCKING]
    named = [c if c.name != "fingerprints" else
             gate.Check("fingerprints", "pass", False, "whole package: 1 changed function(s), 1 on the generation "
                                                       "path (utils/text.py:token_subset)") for c in ok]
    assert gate.verdict(named)["state"] == "may-ship", gate.verdict(named)
    part = [c if c.name != "parity" else gate.Check("parity", "pass", False, "bit-exact", complete=False)
            for c in ok]
    assert gate.verdict(part)["state"] == "incomplete" and gate.verdict(part)["not_run"] == ["parity"]


def test_parity_on_a_selection_is_marked_incomplete(monkeypatch, tmp_path):
    monkeypatch.setattr(gate, "run_pytest", lambda *a, **k: parity_result())
    monkeypatch.setattr(gate, "tier_environment", lambda *a, **k: {})
    assert gate.check_parity(None, tmp_path).complete
    part = gate.check_parity(None, tmp_path, "one_word")
    assert not part.complete and "-k 'one_word'" in part.summary, part


def fake_site(root, functions: str):
    """A folder holding an omnivoice package whose models/omnivoice.py is `functions`, as an environment."""
    (root / "omnivoice" / "models").mkdir(parents=True)
    (root / "omnivoice" / "__init__.py").write_text("")
    (root / "omnivoice" / "models" / "omnivoice.py").write_text(functions)
    return types.SimpleNamespace(site=root, upstream_file=root / "omnivoice" / "models" / "omnivoice.py")


def test_no_count_on_the_generation_path_is_claimed_unless_the_grid_traced_it(tmp_path):
    """With the behaviour check left out (--checks fingerprints) nothing was traced: the summary says so instead of
    "0 on the generation path"."""
    against = fake_site(tmp_path / "a", "def generate():\n    return 1\n\ndef other():\n    return 1\n")
    candidate = fake_site(tmp_path / "c", "def generate():\n    return 2\n\ndef other():\n    return 2\n")
    untraced = gate.check_fingerprints(candidate, against, ("new", "old"), tmp_path / "out1", None)
    assert "on the generation path" not in untraced.summary, untraced.summary
    assert "2 changed function(s), not traced" in untraced.summary, untraced.summary
    traces = [{"called": ["models/omnivoice.py:generate"], "under_patched": []}]
    traced = gate.check_fingerprints(candidate, against, ("new", "old"), tmp_path / "out2", traces)
    assert "2 changed function(s), 1 on the generation path (models/omnivoice.py:generate)" in traced.summary, traced


def test_verdict_ships_only_when_every_blocking_check_ran_whole():
    ok = [gate.Check(n, "pass", False, "") for n in gate.BLOCKING] + [gate.Check("goldens", "changed", False, "")]
    assert gate.verdict(ok)["state"] == "may-ship" and gate.verdict(ok)["ship"]
    bad = gate.verdict(ok + [gate.Check("x", "fail", True, "x")])
    assert bad["state"] == "must-not-ship" and not bad["ship"] and bad["blocked_by"] == ["x"]
    partial = gate.verdict([c for c in ok if c.name != "parity"])
    assert partial["state"] == "incomplete" and partial["not_run"] == ["parity"] and not partial["ship"]
    subset = [c if c.name != "parity" else gate.Check("parity", "pass", False, "bit-exact", complete=False)
              for c in ok]
    assert gate.verdict(subset)["state"] == "incomplete"
    skipped = [c if c.name != "work" else gate.Check("work", "skipped", False, "skipped") for c in ok]
    assert gate.verdict(skipped)["not_run"] == ["work"]
    assert "INCOMPLETE" in gate.headline({**gate.verdict(skipped), "blocked_by": []})
    with pytest.raises(ValueError, match="status"):
        gate.Check("a", "ok", False, "")


class FakeEnv:
    """A candidate environment that imports, for run_gate's own logic (the checks themselves are replaced)."""

    spec = cand.Spec("fake", "current", "", "fake")
    python, site, notes, source = "python", "site", (), {}

    def import_check(self):
        return {"ok": True, "distribution": "omnivoice", "version": "9.9.9", "file": "x"}


def gate_with(monkeypatch, tmp_path, failing: dict, checkpoint: str | None = None, real: tuple = ()) -> dict:
    """run_gate with every check passing except `failing` ({check: exception to raise}) and those named in `real`
    (run as they are); `checkpoint`: the real checkpoint given (none found elsewhere: no FASTPATH_CHECKPOINT, no
    Hugging Face cache)."""
    import harness.model.checkpoint

    monkeypatch.delenv(harness.model.checkpoint.ENV_CHECKPOINT, raising=False)
    monkeypatch.setattr(harness.model.checkpoint, "find_hf_cache", lambda: None)
    monkeypatch.setattr(cand, "prepare", lambda spec, fresh=False: FakeEnv())
    passing = {"fingerprints": "check_fingerprints", "behaviour": "check_behaviour", "goldens": "check_goldens",
               "parity": "check_parity", "work": "check_work", "rtf": "check_rtf", "quality": "check_quality"}

    def step(name):
        def run(*args, **kwargs):
            if name in failing:
                raise failing[name]
            return gate.Check(name, "pass", False, "ok")
        return run

    for name, function in passing.items():
        if name not in real:
            monkeypatch.setattr(gate, function, step(name))
    monkeypatch.setattr(gate, "run_behaviour", lambda *a, **k: {"settings": {}})
    return gate.run_gate("omnivoice==9.9.9", "current", tmp_path, rtf_rounds=1, checkpoint=checkpoint,
                         log=lambda msg: None)


@pytest.mark.parametrize("name", ["goldens", "rtf", "quality"])
def test_an_informational_check_that_crashes_is_reported_and_blocks_nothing(monkeypatch, tmp_path, name):
    report = gate_with(monkeypatch, tmp_path, {name: RuntimeError("boom")})
    checks = {c["name"]: c for c in report["checks"]}
    assert report["state"] == "may-ship", gate.render_table(report)
    assert checks[name]["status"] == "error" and not checks[name]["blocks"] and "boom" in checks[name]["summary"]


def quality_run(passed=0, skipped=(), failed=(), returncode=0):
    return parity_result(passed=passed, skipped=skipped, failed=failed, returncode=returncode) | {"passed_tests": []}


ALL_SKIPPED = quality_run(skipped=[
    ("tests_quality/test_wer.py::test_fewer_steps", "the ASR judge's weights are missing: fastpath-suite judge "
                                                    "--fetch"),
    ("tests_quality/test_sim.py::test_voice", "needs a GPU"),
])


def test_with_a_real_checkpoint_the_quality_check_is_needed_for_a_verdict():
    """Given a real checkpoint, quality is required (Check.required): a run whose every test skipped leaves the bump
    INCOMPLETE, naming the first skip's reason, and one that could not run is ERROR. Without one, a skipped quality
    check changes nothing."""
    ok = [gate.Check(n, "pass", False, "") for n in gate.BLOCKING]
    skipped = gate.rule_quality(ALL_SKIPPED, required=True)
    assert (skipped.status, skipped.required) == ("skipped", True), skipped
    report = gate.verdict(ok + [skipped])
    assert (report["state"], report["not_run"]) == ("incomplete", ["quality"]), report
    assert "the ASR judge's weights are missing: fastpath-suite judge --fetch" in gate.headline(report), \
        gate.headline(report)
    raised = gate.Check("quality", "error", False, "could not run: timed out after 3600 s", required=True)
    assert (gate.verdict(ok + [raised])["state"], gate.verdict(ok + [raised])["errors"]) == ("error", ["quality"])
    assert gate.verdict(ok + [gate.rule_quality(ALL_SKIPPED)])["state"] == "may-ship", "no checkpoint: informational"
    passed = gate.rule_quality(quality_run(passed=3, skipped=ALL_SKIPPED["skipped"]), required=True)
    assert gate.verdict(ok + [passed])["state"] == "may-ship", passed
    failed = gate.rule_quality(quality_run(passed=2, failed=[("t", "WER +4 points")], returncode=1), required=True)
    assert gate.verdict(ok + [failed])["state"] == "must-not-ship", failed


@pytest.mark.parametrize("error", [RuntimeError("boom"), subprocess.TimeoutExpired(["python", "-m", "pytest"], 3600)],
                         ids=["crash", "timeout"])
def test_a_quality_run_on_a_real_checkpoint_that_cannot_run_is_an_error(monkeypatch, tmp_path, error):
    report = gate_with(monkeypatch, tmp_path, {"quality": error}, checkpoint=str(tmp_path / "OmniVoice"))
    assert (report["state"], report["errors"]) == ("error", ["quality"]), gate.render_table(report)
    monkeypatch.setattr(gate, "run_gate", lambda *a, **k: report)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path / "o")]) == 2


def test_a_quality_run_on_a_real_checkpoint_whose_every_test_skips_is_incomplete(monkeypatch, tmp_path):
    monkeypatch.setattr(gate, "run_pytest", lambda *a, **k: ALL_SKIPPED)
    monkeypatch.setattr(gate, "tier_environment", lambda *a, **k: {})
    report = gate_with(monkeypatch, tmp_path, {}, checkpoint=str(tmp_path / "OmniVoice"), real=("quality",))
    assert (report["state"], report["not_run"]) == ("incomplete", ["quality"]), gate.render_table(report)
    assert "fastpath-suite judge --fetch" in gate.headline(report), gate.headline(report)
    monkeypatch.setattr(gate, "run_gate", lambda *a, **k: report)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path / "o")]) == 3


@pytest.mark.parametrize("error", [gate.GateStepError("probe failed"), RuntimeError("boom"),
                                   subprocess.TimeoutExpired(["python", "-m", "x"], 1800)],
                         ids=["step-error", "crash", "timeout"])
def test_a_blocking_check_that_cannot_run_is_an_error_not_a_verdict(monkeypatch, tmp_path, error):
    report = gate_with(monkeypatch, tmp_path, {"work": error})
    assert report["state"] == "error" and report["errors"] == ["work"], gate.render_table(report)
    assert "ERROR" in gate.headline(report) and "could not run" in {c["name"]: c for c in report["checks"]}["work"][
        "summary"]
    monkeypatch.setattr(gate, "run_gate", lambda *a, **k: report)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path / "o")]) == 2


def test_any_failure_to_set_up_the_gate_exits_2_with_the_reason(monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise subprocess.CalledProcessError(1, ["python", "-m", "venv"])

    monkeypatch.setattr(gate, "run_gate", broken)
    assert gate.main(["omnivoice==9.9.9", "--out", str(tmp_path)]) == 2
    assert "could not run" in capsys.readouterr().err


def test_behaviour_rule_blocks_unless_each_setting_is_accepted_by_name():
    diffs = {"auto_voice": ["scoring call 0 scores: first at (0, 1, 2): 1.0 vs 1.0000001"], "one_word": ["x"]}
    assert gate.rule_behaviour({}, {}, 25, ("new", "old")).status == "pass"
    check = gate.rule_behaviour(diffs, {"auto_voice": "reviewed: new CFG rounding"}, 25, ("new", "old"))
    assert check.blocks and "one_word" in check.summary and "auto_voice" not in check.summary, check
    assert any("ACCEPTED (reviewed: new CFG rounding)" in d for d in check.details)
    both = gate.rule_behaviour(diffs, {"*": "reviewed"}, 25, ("new", "old"))
    assert (both.status, both.blocks) == ("changed-as-expected", False)


def test_behaviour_compare_names_the_setting_the_call_and_the_element():
    import torch

    from harness.gate import behaviour

    def rec(scores):
        call = {"c_logits": torch.zeros(1, 2, 3, 4), "u_logits": torch.ones(1, 2, 3, 4),
                "pred_tokens": torch.zeros(1, 2, 3, dtype=torch.long), "scores": scores, "order": torch.arange(6)}
        return {"settings": {"s": {"calls": [dict(call, where="pass 0 step 0 item 0"),
                                             dict(call, where="pass 0 step 1 item 0")], "tokens": [torch.zeros(2, 3)], "target_lens": [3],
                                   "waveforms": [torch.zeros(10)]}}}

    base = torch.zeros(1, 2, 3)
    moved = base.clone()
    moved[0, 1, 2] = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0))  # one ulp
    assert behaviour.compare(rec(base), rec(base)) == {}
    found = behaviour.compare(rec(base), rec(moved))
    assert list(found) == ["s"], found
    assert found["s"][0].startswith("scoring call 0 (pass 0 step 0 item 0) scores: first at (0, 1, 2)"), found


def test_package_fingerprints_cover_functions_class_fields_and_constants():
    before = "X = 1\nclass Config:\n    num_step: int = 32\n    def f(self):\n        return 1\n"
    after = "X = 2\nclass Config:\n    num_step: int = 16\n    def f(self):\n        # reformatted\n        return (1)\n"
    a, b = fingerprints.definitions(before), fingerprints.definitions(after)
    assert set(a) == {"<module>", "Config.<body>", "Config.f"}
    assert [k for k in a if a[k] != b[k]] == ["Config.<body>", "<module>"]


def test_package_changes_are_marked_by_the_traces():
    against = {"a.py:f": "1", "a.py:g": "2", "b.py:h": "3", "b.py:C.<body>": "5"}
    candidate = {"a.py:f": "1", "a.py:g": "9", "b.py:h": "8", "b.py:new": "4", "b.py:C.<body>": "6"}
    traces = [{"called": ["a.py:g", "a.py:g.<locals>.<listcomp>"], "under_patched": ["a.py:g"]}]
    rows = {k: (c, m) for k, c, m in gate.package_changes(candidate, against, traces)}
    assert rows["a.py:g"] == ("changed", ["ON the generation path", "relied on by patches (transitively)"])
    assert rows["b.py:h"] == ("changed", ["not run by the grid"]) and rows["b.py:new"][0] == "added"
    assert "a.py:f" not in rows and "defaults" in rows["b.py:C.<body>"][1][0]


def test_parse_junit_counts_outcomes(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/>'
                   '<testcase classname="m" name="b"><failure message="b is not bit-exact">tb</failure></testcase>'
                   '<testcase classname="m" name="c"><skipped message="slow"/></testcase>'
                   '<testcase classname="m" name="d"><error message="boom"/></testcase></testsuite></testsuites>')
    result = gate.parse_junit(xml, 1)
    assert result["passed"] == 1 and result["failed"] == [("m::b", "b is not bit-exact")]
    assert result["skipped"] == [("m::c", "slow")] and result["errors"] == [("m::d", "boom")]
    assert gate.parse_junit(tmp_path / "none.xml", 4)["errors"], "a missing report must count as an error"


def test_bad_candidate_names_the_fix(tmp_path):
    with pytest.raises(cand.CandidateError, match="omnivoice==X.Y.Z"):
        cand.parse_spec(str(tmp_path / "nothing.whl"))
    with pytest.raises(cand.CandidateError, match="holds no omnivoice package"):
        cand.parse_spec(str(tmp_path))
    assert gate.main([str(tmp_path)]) == 2


def test_a_rebuilt_wheel_of_the_same_name_is_a_new_candidate(tmp_path):
    wheel = tmp_path / "omnivoice-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"first build")
    first = cand.parse_spec(str(wheel))
    wheel.write_bytes(b"second build")
    second = cand.parse_spec(str(wheel))
    assert first.name != second.name and first.name.startswith(wheel.stem), (first.name, second.name)


def test_a_folder_whose_dist_info_installs_omnivoice_under_another_name_is_that_candidate(tmp_path):
    """A source folder with a fork's dist-info beside the package (top_level.txt names omnivoice) is gated as that
    distribution; a venv where no distribution installs the package is refused, not read as this environment's
    omnivoice (importlib.metadata would find it through the shared-site .pth)."""
    source = cand.edited_copy(tmp_path / "src", {}, "9.9.9+renamed")
    info = next((tmp_path / "src").glob("omnivoice-*.dist-info"))
    fork = tmp_path / "src" / "other_name-9.9.9.dist-info"
    info.rename(fork)  # a distribution of another name
    (fork / "METADATA").write_text("Metadata-Version: 2.1\nName: other-name\nVersion: 9.9.9\n")
    (fork / "top_level.txt").write_text("omnivoice\n")
    env = cand.prepare(cand.parse_spec(str(source)), root=tmp_path / "venvs")
    assert env.distribution() == ("other-name", "9.9.9")
    for made in env.site.glob("*.dist-info"):
        shutil.rmtree(made)
    found = env.import_check()
    assert not found["ok"] and "no distribution in" in found["error"] and "installs the omnivoice" in found["error"], found


def test_source_fingerprints_equal_the_installed_ones():
    """Fingerprinting a source file without importing it gives what `fingerprint` gives for the imported module."""
    names = relied_on()
    from_source = fingerprints.fingerprints_in(cand.current_env().upstream_file.read_text(), names)
    assert from_source == {n: fingerprints.fingerprint(n) for n in names}
    assert fingerprints.fingerprints_in("def other():\n    pass\n", names) == dict.fromkeys(names)


# --- the gate's parity run on an identical release: what the default run sees ---------------------------------------

# the parity tests that assert a refusal or a fallback on an upstream they make unknown: the ones a blanket override
# in the gate's environment would flip (one did: every candidate was refused)
REFUSAL_TESTS = "refus or changed"


def test_the_gate_gives_the_parity_tier_nothing_that_changes_a_test_on_an_identical_release(monkeypatch):
    """By construction: on the installed version the gate's parity invocation is the default run's parity tier.
    Same selection (the tier whole, which the default run collects) and an environment that adds only fingerprints
    fingerprints.json already knows, so every test sees the known set it sees in the default run."""
    import tomllib

    env = cand.current_env()
    version = fingerprints.omnivoice_version()
    extra = gate.tier_environment(env, version)
    assert set(extra) == {fingerprints.ENV_REVIEWED}, f"the gate's tiers get more than the review: {sorted(extra)}"
    assert fingerprints.ENV_ALLOW not in extra
    monkeypatch.delenv(fingerprints.ENV_REVIEWED, raising=False)
    plain = fingerprints.load_known()
    for name, value in extra.items():
        monkeypatch.setenv(name, value)
    assert fingerprints.load_known() == plain, "the review adds fingerprints the installed version has not recorded"
    assert fingerprints.reviewed()[1] == {n: fingerprints.fingerprint(n) for n in relied_on()}
    assert gate.parity_args() == ["tests_parity"]
    testpaths = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert "tests_parity" in testpaths, "the default run no longer runs the tier the gate runs"


NICE = ["nice", "-n", "19"] if shutil.which("nice") else []  # beside the other tests: the cores they leave idle


def gate_parity_with_the_override_exported(folder):
    """The gate's own parity step (its environment, its pytest call, its junit reading) on the installed version, on
    the tests a blanket override would flip, run as a user would: in a process whose environment exports the blanket
    override (the suite never shows it to a test: conftest.py). About 20 s; started when collection ends."""
    code = ("import json, pathlib\n"
            "from fastpath import fingerprints\n"
            "from harness.gate import candidate as cand, gate\n"
            f"check = gate.check_parity(cand.current_env(), pathlib.Path({str(folder)!r}), {REFUSAL_TESTS!r}, "
            "fingerprints.omnivoice_version())\n"
            "print(json.dumps(vars(check)))\n")
    done = subprocess.run([*NICE, sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, fingerprints.ENV_ALLOW: "1"})
    junit = gate.parse_junit(folder / "parity-junit.xml", done.returncode)
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-3000:], "junit": junit}


@pytest.mark.early.with_args(gate_parity_with_the_override_exported)
def test_the_gates_parity_invocation_passes_the_refusal_tests_on_the_installed_version(early):
    assert early["returncode"] == 0, early["stderr"]
    check = json.loads(early["stdout"].strip().splitlines()[-1])
    assert check["status"] == "pass", gate.render_table({"checks": [check], "candidate": {"version": "current"},
                                                         "against": {"version": "current"}, "state": "x",
                                                         "blocked_by": [], "not_run": []})
    result = early["junit"]
    # a test that cannot apply here by design (a lean_llm case where GEMM rows depend on the row count) is counted
    # apart; any other skip of the refusal tests is one
    assert result["passed"] >= 3 and not result["skipped"], result


def test_a_user_blanket_override_becomes_a_review_of_the_installed_fingerprints(monkeypatch, request):
    """conftest.no_blanket_override: the variable is gone from the tests' environment, the installed fingerprints
    are under review instead, and both are put back after the run."""
    import os

    # the root conftest as pytest registered it (sys.modules["conftest"] is whichever conftest.py came last)
    root = next(p for p in request.config.pluginmanager.get_plugins()
                if getattr(p, "__file__", None) == str(REPO_ROOT / "conftest.py"))
    monkeypatch.setenv(fingerprints.ENV_ALLOW, "1")
    monkeypatch.delenv(fingerprints.ENV_REVIEWED, raising=False)
    session = dict(root._ENV_BEFORE)  # what this session's own configure changed: kept for its unconfigure
    root._ENV_BEFORE.clear()
    try:
        note = root.no_blanket_override()
        assert fingerprints.ENV_ALLOW not in os.environ and "under review" in note, note
        assert fingerprints.reviewed() == (fingerprints.omnivoice_version(),
                                           {n: fingerprints.fingerprint(n) for n in relied_on()})
    finally:
        root.restore_environment()
        root._ENV_BEFORE.update(session)
    assert os.environ.get(fingerprints.ENV_ALLOW) == "1" and fingerprints.ENV_REVIEWED not in os.environ


def test_fingerprints_under_review_apply_and_say_so_while_others_stay_refused(model, monkeypatch):
    """A candidate's changed function (a fingerprint no version recorded) applies when under review, with a
    warning on the model; any other unknown fingerprint is still refused; a malformed review names the fix."""
    real = fingerprints.fingerprint
    name = "OmniVoice._generate_iterative"
    monkeypatch.setattr(fingerprints, "fingerprint", lambda n: "f" * 16 if n == name else real(n))
    with pytest.raises(fingerprints.UpstreamMismatchError, match=name):
        fastpath.apply(model, "sliced_heads")
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, fingerprints.review_value({name: "f" * 16}, "9.9.9"))
    try:
        assert fastpath.apply(model, "sliced_heads") == ["sliced_heads"]
        assert any("under review" in w and name in w for w in model._fastpath_warnings), model._fastpath_warnings
    finally:
        fastpath.revert(model)
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, fingerprints.review_value({name: "e" * 16}, "9.9.9"))
    with pytest.raises(fingerprints.UpstreamMismatchError, match=name):
        fastpath.apply(model, "sliced_heads")
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, "{not json")
    with pytest.raises(fingerprints.UpstreamMismatchError, match=f"{fingerprints.ENV_REVIEWED} is not a review"):
        fastpath.apply(model, "sliced_heads")


# --- the one-line schedule change ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def floor_source(tmp_path_factory):
    """A copy of the installed omnivoice with math.ceil -> math.floor in the unmasking schedule."""
    return floor_schedule().build(tmp_path_factory.mktemp("candidate") / "omnivoice-floor")


def test_schedule_change_is_refused_naming_the_function(floor_source):
    """Fingerprinted from the source folder, nothing installed."""
    fixture = floor_schedule()
    mutated = (floor_source / "omnivoice" / fixture.FILE).read_text()
    installed = cand.current_env().upstream_file.read_text()
    rows = gate.fingerprint_rows(mutated, installed)
    assert [r["name"] for r in rows if r["candidate"] != r["against"]] == [fixture.FUNCTION]
    check = gate.rule_fingerprints(rows, "0.2.1+floor", fingerprints.omnivoice_version())
    assert check.blocks and fixture.FUNCTION in check.summary, check
    diff = gate.function_diff(fixture.FUNCTION, mutated, installed)
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert changed == ["-" + " " * 24 + fixture.OLD, "+" + " " * 24 + fixture.NEW], diff


@pytest.mark.cpu
def test_schedule_change_moves_the_goldens(model, checkpoint, floor_source):
    """Stock generation with the mutated `_generate_iterative` (compiled from the candidate's source, bound to this
    instance only) no longer matches the installed version's goldens, while the unmutated one does."""
    if checkpoint.kind != "tiny":
        pytest.skip("goldens are recorded on the tiny test checkpoint")
    known = goldens.load_goldens()
    version = fingerprints.omnivoice_version()
    assert version in known, f"no goldens for omnivoice {version}: fastpath-suite maintain goldens --record"
    import omnivoice.models.omnivoice as upstream

    fixture = floor_schedule()
    source = fingerprints.definition_source((floor_source / "omnivoice" / fixture.FILE).read_text(), fixture.FUNCTION)
    namespace = dict(vars(upstream))
    exec(compile(textwrap.dedent(source), str(floor_source), "exec"), namespace)
    mutated = namespace[fixture.FUNCTION.split(".")[-1]]
    points = ["auto_voice", "batch_of_3"]
    stock = goldens.match_versions(goldens.record_goldens(model, points), {version: known[version]})
    assert not any(stock[version][p] for p in points), stock
    with overridden(model, "_generate_iterative", lambda _: types.MethodType(mutated, model)):
        moved = goldens.match_versions(goldens.record_goldens(model, points), {version: known[version]})
    exact = numerics_key() in goldens.exact_keys(known[version])  # portable parts move on every machine
    for p in points:
        assert any(part.startswith("tokens") for part in moved[version][p]), moved
        assert any(part.startswith("logits_moments: moved") for part in moved[version][p]), moved
        assert exact == ("logits: sha256 differs (exact, recorded for this machine)" in moved[version][p]), moved
    check = gate.rule_goldens({version: {p: moved[version][p] for p in points}}, version, "0.2.1+floor")
    assert check.status == "changed" and "2/2 points differ" in check.summary


@pytest.mark.slow
def test_gate_command_refuses_the_schedule_change(floor_source, tmp_path):
    """End to end in the candidate's own venv: fingerprints, goldens, and the parity tier's tests at the one-word
    point (every patch alone and stacked). The whole tier took over 9 minutes on 2 shared cores; one point is
    enough to show that the refusal was right: fastpath's loop keeps the ceil schedule."""
    out = tmp_path / "gate"
    cmd = [sys.executable, "-m", "harness.gate.gate", str(floor_source), "--out", str(out),
           "--checks", "fingerprints,goldens,parity", "--parity-k", "one_word"]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "verdict.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["install"]["status"] == "pass", checks["install"]
    assert checks["fingerprints"]["status"] == "changed" and checks["fingerprints"]["blocks"]
    assert "OmniVoice._generate_iterative" in checks["fingerprints"]["summary"]
    assert (out / "fingerprints" / "OmniVoice._generate_iterative.diff").is_file()
    assert checks["goldens"]["status"] == "changed", checks["goldens"]
    assert checks["parity"]["status"] == "fail", "fastpath's own schedule copy must disagree with the mutated stock"
    assert "MUST NOT SHIP" in done.stdout and (out / "verdict.md").is_file()


# --- one-line candidates: each refused with the change named; 0.2.1 itself may ship --------------------------------


def one_line():
    spec = importlib.util.spec_from_file_location("one_line_candidates",
                                                  REPO_ROOT / "fixtures" / "upstream" / "one_line_candidates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", list(one_line().CANDIDATES))
def test_gate_refuses_a_one_line_candidate_naming_the_change(name, tmp_path):
    """Both versions' behaviour recorded in their own environments in this job: the change moves at least one
    grid setting (blocks), and the whole-package fingerprints name the changed function on the generation path.
    About 2 minutes each on 2 cores."""
    fixture = one_line()
    source = fixture.build(name, tmp_path / f"omnivoice-{name}")
    report = gate.run_gate(str(source), "current", tmp_path / "out", checks=("fingerprints", "behaviour"),
                           log=lambda msg: None)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["state"] == "must-not-ship" and "behaviour" in report["blocked_by"], gate.render_table(report)
    function = fixture.CANDIDATES[name][3]
    named = [d for d in checks["fingerprints"]["details"] if f":{function}: changed" in d]
    assert named and "ON the generation path" in named[0], checks["fingerprints"]["details"]
    assert (tmp_path / "out" / "behaviour-candidate.pt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("dtype, status", [pytest.param("fp32", "pass", id="fp32-passes", marks=pytest.mark.control),
                                           pytest.param("bf16", "changed", id="bf16-refuses")])
def test_a_change_of_a_bf16_path_is_seen_only_with_dtype_bf16(dtype, status, tmp_path):
    """The behaviour grid at the dtype a service runs (--dtype; with --device cuda on a GPU): a one-line candidate
    that changes only what bf16 computes passes the fp32 grid and is refused by the bf16 one. About 3 minutes each
    on 2 cores."""
    source = one_line().build("embed_halves_bf16", tmp_path / "omnivoice-bf16")
    report = gate.run_gate(str(source), "current", tmp_path / "out", checks=("behaviour",), log=lambda msg: None,
                           dtype=dtype)
    (check,) = [c for c in report["checks"] if c["name"] == "behaviour"]
    assert check["status"] == status, gate.render_table(report)
    assert f"grid recorded on cpu in {dtype} by both versions" in check["details"], check["details"]


def test_the_gate_passes_device_and_dtype_to_both_recordings(tmp_path):
    """--device / --dtype reach the behaviour recording of each environment (the recording itself:
    tests_harness/test_behaviour.py)."""
    import torch

    calls = []

    class Recorder:
        def run(self, args, **kwargs):
            calls.append(args)
            torch.save({"settings": {}, "device": args[-3], "dtype": args[-1]}, args[2])
            return types.SimpleNamespace(returncode=0)

    record = gate.run_behaviour(Recorder(), tmp_path, "candidate", "cuda", "bf16")
    assert calls[0][-4:] == ["--device", "cuda", "--dtype", "bf16"] and record["dtype"] == "bf16", calls
    with pytest.raises(SystemExit) as refused:  # a dtype the grid does not know: argparse's exit 2, before any work
        gate.main(["omnivoice==0.2.0", "--dtype", "int8"])
    assert refused.value.code == 2


@pytest.mark.slow
@pytest.mark.control
def test_gate_lets_the_unmodified_version_ship(tmp_path):
    """0.2.1 copied unchanged, every blocking check whole (the parity tier in its environment included), and an
    evaluation set in Seed-TTS-eval's layout generated in both environments and judged item by item (the espeak
    stand-in; the release sets no STANDIN_DAMAGE): MAY SHIP. About 10 minutes on 2 cores."""
    from importlib import metadata

    from harness.quality import espeak_set

    source = cand.edited_copy(tmp_path / "omnivoice-same", {}, f"{metadata.version('omnivoice')}+same")
    evaluation = espeak_set.build(tmp_path / "seedtts-espeak") / "en"
    report = gate.run_gate(str(source), "current", tmp_path / "out", checks=("fingerprints", "behaviour", "parity",
                                                                             "work", "quality-set"),
                           log=lambda msg: None, quality_set=str(evaluation), quality_synth="espeak")
    assert report["state"] == "may-ship", gate.render_table(report)
    row = {c["name"]: c for c in report["checks"]}["quality-set"]
    assert row["required"] and row["status"] == "pass", row


NA = "not applicable: "  # harness.run.strict.NA_PREFIX


def test_parse_junit_counts_a_test_that_cannot_apply_apart_from_a_skip(tmp_path):
    """A skip that says "not applicable" (strict.not_applicable) is counted apart; any other skip stays a skip, so
    the parity invocation's "no skip" still fails on one."""
    from harness.run import strict

    assert strict.NA_PREFIX == NA
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/>'
                   f'<testcase classname="m" name="b"><skipped message="{NA}the padded case: rows depend on the row '
                   'count"/></testcase><testcase classname="m" name="c"><skipped message="no checkpoint"/>'
                   '</testcase></testsuite></testsuites>')
    result = gate.parse_junit(xml, 0)
    assert result["not_applicable"] == [("m::b", "the padded case: rows depend on the row count")], result
    assert result["skipped"] == [("m::c", "no checkpoint")], result
    assert gate.tally(result) == "1 passed, 1 not applicable, 1 skipped", gate.tally(result)


def test_a_parity_test_that_cannot_apply_to_the_candidate_is_named_and_does_not_block():
    """omnivoice 0.2.0 lacks VoiceClonePrompt.save/load: its saved-prompt point is not applicable, counted and named
    in the verdict, and MAY SHIP; nothing "failed". The same test skipping for any other reason still blocks."""
    before = parity_result(passed=3) | {"passed_tests": ["t::saved", "t::a", "t::b"], "version": "0.2.1"}
    why = "the voice_clone_prompt point: needs VoiceClonePrompt.save/load, which this omnivoice lacks (added in 0.2.1)"
    now = parity_result(passed=2, skipped=[("t::x", "slow")]) | {"not_applicable": [("t::saved", why)]}
    check = gate.rule_parity(now, before)
    assert (check.status, check.blocks, check.not_applicable) == ("pass", False, [("t::saved", why)]), check
    assert "failed" not in check.summary and "1 not applicable" in check.summary, check.summary
    report = gate.verdict([gate.Check(n, "pass", False, "") for n in gate.BLOCKING if n != "parity"] + [check])
    assert report["state"] == "may-ship" and report["not_applicable"] == [
        {"check": "parity", "test": "t::saved", "reason": why}], report
    report.update(candidate={"version": "0.2.0"}, against={"version": "0.2.1"})
    assert f"parity: t::saved: {why}" in gate.render_table(report), gate.render_table(report)
    skipped = parity_result(passed=2, skipped=[("t::saved", "needs a file that is not there")])
    assert gate.rule_parity(skipped, before).blocks, "a plain skip of a test that ran before must still block"


def test_an_api_the_against_version_has_and_the_candidate_lacks_is_its_own_line():
    """Downgrade: expected; upgrade (or the same version): a warning naming each name; never blocking."""
    against = {"models/omnivoice.py:VoiceClonePrompt.save": "1", "models/omnivoice.py:VoiceClonePrompt.load": "2",
               "utils/text.py:normalize_text": "3", "utils/text.py:_private": "4", "_x.py:f": "5",
               "models/omnivoice.py:OmniVoice._generate_iterative": "6", "a.py:f.<locals>.g": "7"}
    assert gate.public_api(against) == {"models/omnivoice.py:VoiceClonePrompt.save",
                                        "models/omnivoice.py:VoiceClonePrompt.load", "utils/text.py:normalize_text"}
    missing = sorted(gate.public_api(against) - gate.public_api({"utils/text.py:normalize_text": "3"}))
    down = gate.rule_api(missing, ("0.2.0", "0.2.1"))
    assert (down.status, down.blocks) == ("changed-as-expected", False) and "downgrade: expected" in down.summary
    up = gate.rule_api(missing, ("0.3.0", "0.2.1"))
    assert (up.status, up.blocks) == ("changed", False) and up.summary.startswith("WARNING"), up
    assert all(name in up.summary for name in missing), up.summary
    assert gate.rule_api([], ("0.3.0", "0.2.1")).status == "pass"
    report = gate.verdict([gate.Check(n, "pass", False, "") for n in gate.BLOCKING] + [up])
    assert report["state"] == "may-ship" and report["api"]["missing"] == missing, report
    assert any(line.startswith("API: WARNING") for line in gate.verdict_notes(report)), gate.verdict_notes(report)


def test_a_results_file_gathers_one_verdict_per_candidate():
    def figures(spec, state):
        return {"candidate": {"spec": spec, "version": spec[-5:]}, "against": {"spec": "current", "version": "0.2.1"},
                "state": state, "blocked_by": [], "not_run": [], "errors": [], "checks": [], "seconds": 1.0}

    first = gate.gathered(figures("omnivoice==0.2.0", "must-not-ship"), None)
    both = gate.gathered(figures("omnivoice==0.1.5", "may-ship"), first)
    again = gate.gathered(figures("omnivoice==0.2.0", "may-ship"), both)
    assert [(v["candidate"]["spec"], v["state"]) for v in again["verdicts"]] == [
        ("omnivoice==0.1.5", "may-ship"), ("omnivoice==0.2.0", "may-ship")], again
    assert "omnivoice==0.1.5" in gate.render_results(again) and "command" in again["verdicts"][0]


def gate_verdicts(results_dir=REPO_ROOT / "results") -> dict:
    """{omnivoice version: [state, ...]} of every upstream release's gate verdict in results/gate/ (forks aside)."""
    from harness.run import results as result_files

    found: dict = {}
    for path in sorted((results_dir / "gate").glob("*.json")):
        for v in result_files.load(path)["figures"].get("verdicts", []):
            if v["candidate"].get("distribution") == "omnivoice" and v["candidate"]["spec"].startswith("omnivoice=="):
                found.setdefault(v["candidate"]["version"], []).append(v["state"])
    return found


def test_the_declared_range_admits_the_releases_the_gate_passes():
    """pyproject's omnivoice range and the gate's verdicts in results/gate/ agree: every release with a verdict
    there passed (MAY SHIP) exactly when the range admits it, and every admitted release below the installed one
    has a verdict (fastpath-suite gate omnivoice==X --results results/)."""
    from packaging.version import Version

    from harness.gate import versions

    declared = versions.declared_range()
    verdicts = gate_verdicts()
    disagree = {v: states for v, states in verdicts.items() if (set(states) == {"may-ship"}) != declared.contains(v)}
    assert not disagree, f"pyproject declares omnivoice{declared}, the gate's verdicts: {disagree}"
    installed = fingerprints.omnivoice_version()
    unverdicted = [r for r in versions.admitted(declared, versions.known_releases())
                   if r not in verdicts and Version(r) < Version(installed)]
    assert not unverdicted, (f"omnivoice{declared} admits {unverdicted} with no gate verdict in results/gate/: run "
                             f"`fastpath-suite gate omnivoice==X --results results/` for each")
