"""The name check (harness.release, `fastpath-suite maintain name-check`): pip's answers read right, a taken or too-near name
refused, and an index that does not answer is an error, never a free name. pip is a stand-in here (a script that
answers as pip does), so no network is needed; the real look-up is the results file results/name/."""

from __future__ import annotations

import sys

import pytest

from harness import DISTRIBUTION, release

# what `pip index versions NAME` prints (pip 26), by name; a name not here gets pip's "not found"
ANSWERS = {
    "fastpath": "fastpath (1.9)\nAvailable versions: 1.9, 1.8\n",
    "omnivoice-fastpath": "omnivoice-fastpath (0.1.0)\nAvailable versions: 0.1.0\n",
    "taken-name": "taken-name (2.0)\nAvailable versions: 2.0, 1.0\n",
}
FAKE_PIP = '''
import re
import sys
answers = {answers!r}
if sys.argv[1:3] == ["config", "list"]:
    print("global.extra-index-url='file:///mirror/simple'")
elif sys.argv[1] == "--version":
    print("pip 26.3 from /somewhere (python 3.11)")
elif {offline!r}:
    print("WARNING: Retrying ... NewConnectionError", file=sys.stderr)
    print("ERROR: Could not fetch URL https://pypi.org/simple/x/: connection refused", file=sys.stderr)
    sys.exit(1)
elif re.sub(r"[-_.]+", "-", sys.argv[3]).lower() in answers:  # pip asks by the name's normal form
    print(answers[re.sub(r"[-_.]+", "-", sys.argv[3]).lower()], end="")
else:
    print("WARNING: Location 'file:///mirror/simple/x/' is ignored: it is neither a file nor a directory.", file=sys.stderr)
    print(f"ERROR: No matching distribution found for {{sys.argv[3]}}", file=sys.stderr)
    sys.exit(1)
'''


def fake_pip(tmp_path, offline=False) -> tuple:
    path = tmp_path / "pip.py"
    path.write_text(FAKE_PIP.format(answers=ANSWERS, offline=offline))
    return (sys.executable, str(path))


@pytest.mark.parametrize("name, verdict", [
    pytest.param("omnivoice-speedup", "free", id="free"),
    pytest.param("taken-name", "taken", id="taken"),
    pytest.param("fastpath-omnivoice", "too near", id="free but holds the peer's word"),
    pytest.param("Omnivoice_FastPath", "taken", id="the peer in another spelling"),
])
def test_the_verdict_follows_the_index_and_the_rules(tmp_path, name, verdict):
    figures = release.check(name, fake_pip(tmp_path))
    assert figures["verdict"] == verdict, figures
    assert [a["name"] for a in figures["answers"]] == [name, *release.NEAR]
    assert figures["answers"][1] == {"name": "fastpath", "taken": True, "latest": "1.9", "versions": ["1.9", "1.8"],
                                     "output": ["fastpath (1.9)", "Available versions: 1.9, 1.8"]}
    assert figures["index"]["index_url"] == "https://pypi.org/simple"  # no index-url configured: pip's default


def test_the_peer_in_another_spelling_is_taken_by_the_rules_too():
    assert release.too_near("Omnivoice_FastPath") == [
        "it is 'omnivoice-fastpath' to the index (PEP 503)",
        "it holds 'fastpath', the word that names fastpath, omnivoice-fastpath"]
    assert release.too_near(DISTRIBUTION) == []


def test_an_index_that_does_not_answer_is_an_error_not_a_free_name(tmp_path, monkeypatch, capsys):
    pip = fake_pip(tmp_path, offline=True)
    with pytest.raises(release.IndexUnreachable, match="connection refused"):
        release.check("omnivoice-speedup", pip)
    real = release.check
    monkeypatch.setattr(release, "check", lambda name: real(name, pip))
    assert release.main(["omnivoice-speedup"]) == 2
    assert "Fix: check the network" in capsys.readouterr().err


def test_the_command_exits_by_the_verdict_and_writes_its_results_file(tmp_path, monkeypatch, capsys):
    pip = fake_pip(tmp_path)
    real = release.check
    monkeypatch.setattr(release, "check", lambda name: real(name, pip))
    assert release.main(["taken-name"]) == 1
    assert release.main(["omnivoice-speedup", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "omnivoice-speedup: FREE" in out and "taken-name: TAKEN" in out
    (path,) = (tmp_path / "results" / "name").glob("*.json")
    from harness.run import results

    data = results.load(path)
    assert data["figures"]["verdict"] == "free"
    page = results.renderer("name")(data["figures"])
    assert "`omnivoice-speedup`: **free**" in page and "| `fastpath` | taken | 1.9 |" in page
