"""The work folder's sitecustomize.py (mutants.py copies this file there): Python imports it at the start of every
process a test starts with the mutants on its path, and it sets up mutmut's mode for that child.

- mutmut's stats run, with harness.audit.child_calls active: each function the child calls is appended to the file
  FASTPATH_MUTANT_CALLS names, and the plugin credits it to the test that started the child.
- The stats run without that file: the child runs the original code ("no mutant") and records nothing (it has no
  mutmut configuration to record in, and mutmut would fail the whole run).
- A mutant's run: the child runs the mutant too. A child started as `python -m pkg.mod` runs that module as
  `__main__`, and mutmut activates a mutant only in the module of its name: the mutant of `pkg.mod` is renamed to
  `__main__`'s, and a call recorded in `__main__` is named after the module it was run as.
"""

import os
import sys

MODE, CALLS = "MUTANT_UNDER_TEST", "FASTPATH_MUTANT_CALLS"


def run_module() -> str | None:
    """The module of `python -m NAME` (None for a script, `-c`, or no argument)."""
    argv, i = list(getattr(sys, "orig_argv", ())), 1
    while i < len(argv):
        if argv[i] == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if argv[i] in ("-X", "-W"):
            i += 1
        elif argv[i] == "-c" or not argv[i].startswith("-"):
            return None
        i += 1
    return None


def module_name(name: str) -> str:
    """A recorded `__main__.function` named after the module it was run as (its spec's name)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if name.startswith("__main__.") and spec is not None:
        return spec.name + name[len("__main__"):]
    return name


def record_calls(path: str) -> None:
    import mutmut.mutation.trampoline as trampoline

    seen = set()

    def record(name, caller=None):
        name = module_name(name)
        if name not in seen:
            seen.add(name)
            with open(path, "a") as f:
                f.write(name + "\n")

    trampoline.record_trampoline_hit = record


def setup() -> None:
    mode = os.environ.get(MODE)
    if mode == "stats":
        if os.environ.get(CALLS):
            record_calls(os.environ[CALLS])
        else:
            os.environ[MODE] = ""
    elif mode and (run := run_module()):
        module, _, mutant = mode.rpartition(".")
        if module in (run, run + ".__main__"):
            os.environ[MODE] = "__main__." + mutant


setup()
