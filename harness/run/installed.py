"""What scripts/install.sh provides (Debian tools, Python packages, the judges): a test whose tool is missing fails,
naming how to install it (a missing one is a broken install, which a skip would hide), or with
--no-strict-inputs (FASTPATH_STRICT=0) is not judged (harness.run.strict)."""

from __future__ import annotations

import importlib
import shutil

from harness.run import strict


def missing(reason: str):
    """strict.missing: fail naming the fix, or (not strict) skip as not judged."""
    strict.missing(None, reason, "scripts/install.sh installs it")


def require_module(name: str, how: str):
    """The imported module, or missing() naming `how` to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing(f"{name} is not installed ({err}): {how}")


def require_tool(name: str, how: str) -> str:
    """The path of a command-line tool, or missing() naming `how` to install it."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not on PATH: {how}")
    return path
