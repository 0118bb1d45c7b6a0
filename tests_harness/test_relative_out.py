"""A relative --out works where a verb runs its steps in another folder: serve-check (each server runs in its own
folder under DIR) and the gate (the candidate venv runs in the repository). serve-check: the
check is given the folder as an absolute path; a relative one made the server look for its script under itself)."""

from __future__ import annotations

import pytest

from harness.serving import serving


class Stop(BaseException):  # past the verbs' own error handling
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


def test_the_gate_gives_its_steps_the_out_folder_as_an_absolute_path(tmp_path, monkeypatch):
    """The gate's steps run in the candidate's venv with the repository as their working directory: a relative
    --out wrote the goldens under the repository and the gate, reading from the caller's folder, found none."""
    from harness.gate import gate

    seen = {}

    def run_gate(candidate, against, out, *rest, **kwargs):
        seen["out"] = out
        raise Stop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "run_gate", run_gate)
    with pytest.raises(Stop):
        gate.main(["omnivoice==0.2.1", "--out", "out/gate", "--quiet"])
    assert seen["out"] == tmp_path / "out" / "gate" and seen["out"].is_absolute(), seen
