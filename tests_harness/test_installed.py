"""What the install provides is required in CI (CI=true) and skipped, saying how to install it, elsewhere."""

from __future__ import annotations

import pytest

from harness import installed


def test_a_missing_module_skips_with_the_fix_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no_such_module_xyz is not installed.*pip install x"):
        installed.require_module("no_such_module_xyz", "pip install x")


def test_a_missing_module_or_tool_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="broken install"):
        installed.require_module("no_such_module_xyz", "pip install x")
    with pytest.raises(pytest.fail.Exception, match="no-such-tool-xyz is not on PATH"):
        installed.require_tool("no-such-tool-xyz", "apt-get install -y x")


def test_what_is_installed_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert installed.require_module("json", "").dumps([1]) == "[1]"
    assert installed.require_tool("sh", "").endswith("sh")
