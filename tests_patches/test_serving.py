"""fastpath inside a real server: omnivoice-server from the package index, installed beside fastpath's wheel by pip,
serving stock and patched (the recipe of docs/serving.md) the same requests of every kind, one at a time and at
once (harness/serving/serving.py says how). Slow: it makes a venv from the index once per change of fastpath's sources and
starts two servers (the nightly `slow` job)."""

from __future__ import annotations

import pytest

from harness.serving import serving

from harness.gate import versions
from harness.model.checkpoint import build_checkpoint


@pytest.fixture(scope="module")
def env():
    return serving.prepare()


@pytest.mark.slow
def test_pip_resolves_fastpath_beside_omnivoice_server_to_a_verified_omnivoice(env):
    """In the empty venv pip resolved the wheel and the server together, to an omnivoice both admit; that is the one
    installed, and fastpath imports from its wheel."""
    omnivoice = env.resolved.get("omnivoice")
    assert omnivoice in versions.verified_versions(), env.resolved
    assert versions.declared_range().contains(omnivoice)
    assert env.resolved.get("omnivoice-server") == serving.SERVER.split("==")[1]
    assert env.installed["omnivoice"] == omnivoice and env.installed["omnivoice-server"] == "0.2.5"
    assert "/venv/" in env.installed["fastpath_file"], env.installed


@pytest.mark.slow
def test_omnivoice_server_with_fastpath_serves_stocks_bytes_and_tokens(env, tmp_path):
    import fastpath

    report = serving.check(env, build_checkpoint("tiny"), tmp_path)
    print(serving.render_results(report))
    assert report["responses"] >= 20 and len(report["kinds"]) == len(serving.plan(""))
    assert report["applied"] == list(fastpath.LOSSLESS)
    assert not report["problems"], "\n".join(report["problems"])
    assert report["same_bytes"] == report["responses"]
    assert report["same_tokens"] == report["generations"] > 0
    for label, server in report["servers"].items():
        # SIGTERM ends uvicorn by the signal (-15) once its shutdown is done, SIGINT with exit 0 (serving.EXIT_STATUS)
        assert server["exit"] == serving.EXIT_STATUS[serving.SIGNALS[label]], (label, server)
        assert server["overlapping"] > 0, (label, server)


def test_the_comparison_names_a_response_and_a_generation_that_differ():
    """The check can fail: one byte of one response and one generation's tokens changed are named; a log line with
    a traceback, an exit status and a stack that was not applied are problems too."""
    def run(label, sha, tokens, applied, log="", returncode=0):
        r = serving.ServerRun(label)
        r.setup = {"status": 201}
        r.responses = [{"name": "auto voice", "round": "one at a time", "status": 200, "error": "", "sha256": sha,
                        "bytes": 10}]
        r.records = [{"text": "The library opens at nine.", "thread": "a", "start": 0.0, "end": 2.0,
                      "tokens": [[[1, 8, 5], "x"]], "applied": applied},
                     {"text": "Hello.", "thread": "b", "start": 1.0, "end": 3.0, "tokens": tokens,
                      "applied": applied}]
        r.log = "Shutting down...\nDone.\nApplication shutdown complete.\nFinished server process\n" + log
        r.returncode = returncode
        return r

    stock = run("stock", "s1", [[[1, 8, 5], "t1"]], [], returncode=-15)
    same, problems = serving.compare(stock, run("fastpath", "s1", [[[1, 8, 5], "t1"]], ["a"]), ["a"])
    assert problems == [] and same["same_bytes"] == 1 and same["same_tokens"] == 2
    _, problems = serving.compare(stock, run("fastpath", "s2", [[[1, 8, 5], "t2"]], ["a"],
                                             "Traceback (most recent call last):", 1), ["a", "b"])
    text = "\n".join(problems)
    assert "auto voice (one at a time): fastpath's 200, 10 bytes differ from stock's 200, 10 bytes" in text
    assert "generation of 'Hello.': fastpath's tokens differ" in text
    assert "fastpath log: Traceback" in text and "fastpath: exit status 1 after SIGINT, not 0" in text
    assert "not ['a', 'b']" in text


def test_the_recipe_is_on_the_serving_page_and_applies_after_the_servers_load():
    source = serving.recipe_source()
    compile(source, "serve_fastpath.py", "exec")
    assert "ModelService._load_sync" in source and "fastpath.apply(self.model)" in source
    assert source.index("server_load(self)") < source.index("fastpath.apply(self.model)")


def test_coverage_names_what_the_plan_did_not_reach():
    """No generations at the same time, a long text in one piece and a stream not split by sentence: each named."""
    run = serving.ServerRun("fastpath")
    run.records = [{"text": serving.LONG_TEXT, "thread": "a", "start": 0.0, "end": 1.0, "tokens": [[[1, 8, 9], "x"]]},
                   {"text": " ".join(serving.STREAM_SENTENCES), "thread": "b", "start": 1.0, "end": 2.0, "tokens": []}]
    text = "\n".join(serving.coverage(run))
    assert "no two generations ran at the same time" in text
    assert "the long text was not generated in chunks (token tensors per generation of it: [1])" in text
    assert f"the stream sentence {serving.STREAM_SENTENCES[0]!r} was generated 0 times" in text
