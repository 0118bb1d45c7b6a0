"""What a Ray task is sent of this process's environment (harness.run.workers.forwarded_env), without Ray: the
settings the harness reads, and this process's thread count where none is set (Ray would give a task of one CPU
OMP_NUM_THREADS=1, and on an AVX2 machine the judges' figures follow the thread count). The cluster test of the
same is in test_ray.py (controls stage)."""

import torch

from harness.run import workers


def test_a_task_computes_with_this_processs_threads_where_none_is_set(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("FASTPATH_STRICT", "1")
    monkeypatch.delenv("FASTPATH_DEFAULT_THREADS", raising=False)
    env = workers.forwarded_env()
    assert env["OMP_NUM_THREADS"] == str(torch.get_num_threads()), env
    assert env["FASTPATH_STRICT"] == "1"
    # in a pytest worker (xdist: its share of the threads), the count the run started with, as a serial run has
    monkeypatch.setenv("FASTPATH_DEFAULT_THREADS", "3")
    assert workers.forwarded_env()["OMP_NUM_THREADS"] == "3"


def test_a_thread_count_the_user_set_is_sent_as_it_is(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert workers.forwarded_env()["OMP_NUM_THREADS"] == "7"
