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

pytest: ``missing(config, what, fix)`` and ``not_judged(what, fix)`` end the test as the mode says; the session's
summary lists every test that was not judged (conftest.py). Commands: ``add_argument(parser)`` and
``outcome(strict, what, fix)``.
"""

from __future__ import annotations

import os

NOT_JUDGED = 3  # exit status of a command that could not judge (the suite's commands; pytest keeps its own codes)
ENV = "FASTPATH_STRICT"  # "0": not strict (as --no-strict-inputs); "1" or unset: strict
PREFIX = "not judged: "  # how a pytest skip that is "not judged" begins (the summary counts these)
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
