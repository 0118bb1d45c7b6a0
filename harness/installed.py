"""What scripts/install.sh provides (Debian tools, Python packages): where it is missing a test skips on a
developer's machine, saying how to install it, and fails in CI (CI=true, as CI sets it), where a missing one is a
broken install that a skip would hide."""

from __future__ import annotations

import importlib
import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str):
    """Skip with `reason`, or fail with it under CI=true."""
    if in_ci():
        pytest.fail(f"{reason} -- CI=true: scripts/install.sh installs it, so this is a broken install, not a skip",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


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
