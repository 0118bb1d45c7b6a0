"""One rule for missing inputs: no check passes without what it compares against.

A check needs inputs: a stored count, a baseline point, a ratio floor, a comparison run, a judge. Two cases, kept
apart:

* **missing**: an input that should be there is not (a point of a key that is recorded, a device key that does not
  depend on the machine, the `--against` run of the gate, a judge). In strict mode, on by default everywhere (the
  default run, CI, the nightly and every command), the check *fails* and names what to record or provide. With
  ``--no-strict-inputs`` (pytest, and every command that checks stored figures) or ``FASTPATH_STRICT=0`` it is
  "not judged" instead: a skip whose reason starts with "not judged" in pytest, exit status ``NOT_JUDGED`` (3) of a
  command, and in both a line in the summary.
* **not judged**: the check cannot judge here, in either mode: a figure that can only be recorded on the machine
  it describes and has not been yet (wall-time baselines and ratio floors, exact hashes of CPU bits), or a night
  measured beside competing work. Said in the exit status (3) of a command and the summary of a run; a streak of
  such nights is itself judged (harness.nightly.changes).

A third case is no input at all: **not applicable**. The check cannot apply here by design: the installed omnivoice
lacks the API it exercises (``VoiceClonePrompt.save/load`` before 0.2.1), or a patch refuses this machine as it is
built to (``batch_invariant`` where the CPU GEMM's rows depend on the row count). Nothing is missing and nothing
failed: in either mode it is a skip whose reason starts with "not applicable", counted and named in the summary
(conftest.py) and in the gate's verdict (harness.gate.gate), never a failure (harness.audit.controls lets a listed
control be not applicable) and never blocking.

pytest: ``missing(config, what, fix)`` and ``not_judged(what, fix)`` end the test as the mode says,
``not_applicable(what, why)`` (and its checked form ``refused_by_design``) in either mode; the
session's summary lists every test that was not judged and every one that was not applicable (conftest.py).
Commands: ``add_argument(parser)`` and ``outcome(strict, what, fix)``.
"""

from __future__ import annotations

import os

NOT_JUDGED = 3  # exit status of a command that could not judge (the suite's commands; pytest keeps its own codes)
ENV = "FASTPATH_STRICT"  # "0": not strict (as --no-strict-inputs); "1" or unset: strict
PREFIX = "not judged: "  # how a pytest skip that is "not judged" begins (the summary counts these)
NA_PREFIX = "not applicable: "  # how a pytest skip that is "not applicable" begins (counted too, never a failure)
OPTION = "--no-strict-inputs"


def strict_default() -> bool:
    """Strict unless FASTPATH_STRICT is "0" (or "false", "no", "off")."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("", "1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: give 1 (strict, the default) or 0 (a missing input is 'not "
                     f"judged' instead of a failure)")


def add_argument(parser) -> None:
    """--strict-inputs / --no-strict-inputs on an argparse parser (dest: strict_inputs, default: strict_default())."""
    import argparse

    parser.add_argument("--strict-inputs", dest="strict_inputs", action=argparse.BooleanOptionalAction,
                        default=strict_default(),
                        help=f"a missing stored figure, point or run fails the check (exit 1), naming what to "
                             f"record; with {OPTION} (or {ENV}=0) it is 'not judged' (exit {NOT_JUDGED})")


def message(what: str, fix: str) -> str:
    return f"{what}; {fix}" if fix else what


def outcome(strict: bool, what: str, fix: str) -> tuple:
    """(exit status, line) of a command whose input is missing: (1, "MISSING: ...") in strict mode, else
    (NOT_JUDGED, "NOT JUDGED: ...")."""
    text = message(what, fix)
    return (1, f"MISSING: {text}") if strict else (NOT_JUDGED, f"NOT JUDGED: {text} (strict mode off: "
                                                              f"{OPTION} or {ENV}=0)")


# --- pytest -------------------------------------------------------------------------------------------------------

def is_strict(config=None) -> bool:
    """The run's mode: conftest.py's --no-strict-inputs, which it also exports as FASTPATH_STRICT for the run (and
    its child processes); without a config, or in a pytester run without the suite's options, the environment's."""
    try:
        return bool(config.getoption("strict_inputs")) if config is not None else strict_default()
    except ValueError:
        return strict_default()


def missing(config, what: str, fix: str):
    """An input that should be there is not: fail the test (strict), else skip it as not judged (a module-level
    call skips the module). `config` may be None: the mode is then the environment's. Never returns."""
    import pytest

    if is_strict(config):
        pytest.fail(f"MISSING INPUT: {message(what, fix)} (a run without it: {OPTION}, which reports the check as "
                    f"not judged)", pytrace=False)
    pytest.skip(PREFIX + message(what, fix), allow_module_level=True)


def not_judged(what: str, fix: str):
    """The check cannot judge on this machine (nothing recorded for it yet): skip as not judged, in either mode.
    Never returns."""
    import pytest

    pytest.skip(PREFIX + message(what, fix))


def not_applicable(what: str, why: str):
    """The check cannot apply here by design (the version lacks the feature, or a patch refuses this machine): skip
    as not applicable, in either mode; the summary and the gate count and name it, and a listed control's rule does
    not turn it into a failure. The one way a test says so: call it only where the reason is checked (a point
    the version cannot resolve: harness.parity.parity.PointUnsupported; `refused_by_design`). Never returns."""
    import pytest

    pytest.skip(NA_PREFIX + message(what, why))


def refused_by_design(model, patch: str, what: str) -> None:
    """When `patch` refuses this machine by design (fastpath.loop.UnsupportedHereError: e.g. batch_invariant where
    the CPU GEMM gives a row other bits for another row count), check that the refusal left the model as it was and
    end the test as not applicable, naming the refusal; where the patch applies, revert it and return."""
    import fastpath
    from fastpath import loop

    before = set(model.__dict__)
    try:
        fastpath.apply(model, [patch])
    except loop.UnsupportedHereError as err:
        left = fastpath.applied(model) or sorted(set(model.__dict__) ^ before)
        assert not left, f"{patch} refused this machine but left the model changed: {left}"
        not_applicable(what, f"{patch} refuses this machine by design: {str(err).split('. ')[0]}")
    fastpath.revert(model, [patch])
