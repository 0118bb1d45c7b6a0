"""What the install provides is required (strict inputs, the default) and not judged, saying how to install it, with
--no-strict-inputs (FASTPATH_STRICT=0)."""

from __future__ import annotations

import pytest

from harness.run import installed

from harness.run import strict


def test_a_missing_module_or_tool_fails_naming_the_fix(monkeypatch):
    monkeypatch.setenv(strict.ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_xyz is not installed.*pip install x.*install.sh"):
        installed.require_module("no_such_module_xyz", "pip install x")
    with pytest.raises(pytest.fail.Exception, match="no-such-tool-xyz is not on PATH: apt-get install -y x"):
        installed.require_tool("no-such-tool-xyz", "apt-get install -y x")


def test_a_missing_module_is_not_judged_when_not_strict(monkeypatch):
    monkeypatch.setenv(strict.ENV, "0")
    with pytest.raises(pytest.skip.Exception, match="^not judged: no_such_module_xyz is not installed.*pip install x"):
        installed.require_module("no_such_module_xyz", "pip install x")


def test_what_is_installed_is_returned(monkeypatch):
    monkeypatch.setenv(strict.ENV, "1")
    assert installed.require_module("json", "").dumps([1]) == "[1]"
    assert installed.require_tool("sh", "").endswith("sh")


# --- the rule itself (harness/run/strict.py): each mode, each word ------------------------------------------------

@pytest.mark.parametrize("value, is_strict", [
    ("0", False), ("false", False), (" No ", False), ("OFF", False),
    ("", True), ("1", True), ("True", True), (" yes", True), ("ON ", True),
])
def test_the_environment_says_the_mode_in_any_case_and_spacing(monkeypatch, value, is_strict):
    monkeypatch.setenv(strict.ENV, value)
    assert strict.strict_default() is is_strict
    assert strict.is_strict() is is_strict, "without a config the mode is the environment's"


def test_an_unset_environment_is_strict(monkeypatch):
    monkeypatch.delenv(strict.ENV, raising=False)
    assert strict.strict_default() is True


def test_an_unknown_mode_in_the_environment_is_an_error_naming_both_values(monkeypatch):
    monkeypatch.setenv(strict.ENV, " Maybe")
    with pytest.raises(ValueError) as err:
        strict.strict_default()
    assert str(err.value) == ("FASTPATH_STRICT=' Maybe': give 1 (strict, the default) or 0 (a missing input is 'not "
                              "judged' instead of a failure)")


class Config:
    """pytest's config as strict.is_strict reads it: getoption raises ValueError for an option it lacks."""

    def __init__(self, **options):
        self.options = options

    def getoption(self, name):
        if name not in self.options:
            raise ValueError(f"no option named {name!r}")
        return self.options[name]


@pytest.mark.parametrize("option, env, expected", [(False, "1", False), (True, "0", True)])
def test_the_runs_option_wins_over_the_environment(monkeypatch, option, env, expected):
    monkeypatch.setenv(strict.ENV, env)
    assert strict.is_strict(Config(strict_inputs=option)) is expected


@pytest.mark.parametrize("env, expected", [("1", True), ("0", False)])
def test_a_run_without_the_suites_option_takes_the_environments_mode(monkeypatch, env, expected):
    monkeypatch.setenv(strict.ENV, env)
    assert strict.is_strict(Config()) is expected


def test_a_commands_missing_input_is_exit_1_when_strict_and_3_not_judged_otherwise():
    assert strict.outcome(True, "no baseline", "record one") == (1, "MISSING: no baseline; record one")
    assert strict.outcome(False, "no baseline", "record one") == (
        3, "NOT JUDGED: no baseline; record one (strict mode off: --no-strict-inputs or FASTPATH_STRICT=0)")
    assert strict.outcome(False, "no judge", "")[1].startswith("NOT JUDGED: no judge (strict mode off")


def test_a_missing_input_fails_without_a_traceback_when_strict_and_skips_as_not_judged_otherwise():
    with pytest.raises(pytest.fail.Exception) as failed:
        strict.missing(Config(strict_inputs=True), "no point p", "record it")
    assert str(failed.value) == ("MISSING INPUT: no point p; record it (a run without it: --no-strict-inputs, which "
                                 "reports the check as not judged)")
    assert failed.value.pytrace is False
    with pytest.raises(pytest.skip.Exception) as skipped:
        strict.missing(Config(strict_inputs=False), "no point p", "record it")
    assert str(skipped.value) == "not judged: no point p; record it"
    assert skipped.value.allow_module_level is True, "a module-level call skips the module"


def test_not_judged_and_not_applicable_are_skips_in_either_mode_with_their_prefix(monkeypatch):
    for env in ("0", "1"):
        monkeypatch.setenv(strict.ENV, env)
        with pytest.raises(pytest.skip.Exception) as skipped:
            strict.not_judged("no floor here", "add one")
        assert str(skipped.value) == "not judged: no floor here; add one"
        with pytest.raises(pytest.skip.Exception) as skipped:
            strict.not_applicable("save/load", "omnivoice 0.2.0 lacks it")
        assert str(skipped.value) == "not applicable: save/load; omnivoice 0.2.0 lacks it"


class Model:
    pass


def fake_patches(monkeypatch, apply):
    """fastpath.apply replaced by `apply`; applied() reads the model's 'patched' attribute; revert is recorded."""
    import fastpath

    reverted = []
    monkeypatch.setattr(fastpath, "apply", apply)
    monkeypatch.setattr(fastpath, "applied", lambda model: list(getattr(model, "patched", [])))
    monkeypatch.setattr(fastpath, "revert", lambda model, names: reverted.append((model, names)))
    return reverted


def refuse(model, names):
    from fastpath import loop

    raise loop.UnsupportedHereError("the CPU GEMM gives a row other bits for another row count. Run it on a GPU")


def test_a_patch_refusing_this_machine_cleanly_is_not_applicable_naming_the_refusals_first_sentence(monkeypatch):
    reverted = fake_patches(monkeypatch, refuse)
    with pytest.raises(pytest.skip.Exception) as skipped:
        strict.refused_by_design(Model(), "batch_invariant", "the layout it asks for")
    assert str(skipped.value) == ("not applicable: the layout it asks for; batch_invariant refuses this machine by "
                                  "design: the CPU GEMM gives a row other bits for another row count")
    assert reverted == []


@pytest.mark.parametrize("left", ["patched", "stray"])
def test_a_refusal_that_leaves_the_model_changed_is_a_failure_naming_what_it_left(monkeypatch, left):
    def half_apply(model, names):
        setattr(model, left, ["batch_invariant"] if left == "patched" else 1)
        refuse(model, names)

    fake_patches(monkeypatch, half_apply)
    with pytest.raises(AssertionError) as failed:
        strict.refused_by_design(Model(), "batch_invariant", "the layout it asks for")
    assert str(failed.value).startswith(f"batch_invariant refused this machine but left the model changed: "
                                        f"{['batch_invariant'] if left == 'patched' else ['stray']}")


def test_a_patch_that_applies_here_is_reverted_and_the_test_goes_on(monkeypatch):
    applied = []
    reverted = fake_patches(monkeypatch, lambda model, names: applied.append((model, names)))
    model = Model()
    assert strict.refused_by_design(model, "batch_invariant", "the layout it asks for") is None
    assert applied == [(model, ["batch_invariant"])] and reverted == [(model, ["batch_invariant"])]
