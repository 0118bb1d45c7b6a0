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
