"""`fastpath-suite serve-check --out DIR`: a relative DIR works (each server runs in its own folder under DIR, so the
check is given the folder as an absolute path; a relative one made the server look for its script under itself)."""

from __future__ import annotations

import pytest

from harness.serving import serving


class Stop(Exception):
    pass


def test_a_relative_out_folder_reaches_the_check_as_an_absolute_path(tmp_path, monkeypatch):
    seen = {}

    def check(env, checkpoint, out, say):
        seen["out"] = out
        raise Stop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(serving, "prepare", lambda fresh, log: "env")
    monkeypatch.setattr(serving, "build_checkpoint", lambda size: "checkpoint")
    monkeypatch.setattr(serving, "check", check)
    with pytest.raises(Stop):
        serving.main(["--out", "out/serving", "--quiet"])
    assert seen["out"] == tmp_path / "out" / "serving" and seen["out"].is_absolute(), seen
