"""Noise-free work counters: exact on any machine, so they gate in the default CI run.

Each lossless patch removes a known amount of work. The expected counts are derived here from the sequence
lengths upstream itself computes (`_preprocess_all`, `_prepare_inference_inputs`), so a patch that silently
stops applying, or an upstream change that adds work, changes a count and fails. FLOPs (torch's flop counter)
are compared exactly with the values recorded in `baselines/work_counters.json` for this checkpoint and torch.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from importlib import metadata

import pytest
import torch

import fastpath
from fastpath import loop
from harness import REPO_ROOT
from harness.run import strict
from harness.parity.parity import POINTS
from harness.speed import measure
from harness.speed.measure import count_work, sequence_lengths

WORK_FILE = REPO_ROOT / "baselines" / "work_counters.json"
SAVE_COMMAND = ".venv/bin/python -m pytest tests_speed/test_work_counters.py --save-baseline"
COUNTED_POINTS = ["batch_of_3", "voice_clone_audio"]
NUM_STEP = 8  # counts scale linearly with steps; fewer keep the default run fast


def lengths(model, kwargs):
    return sequence_lengths(model, kwargs, NUM_STEP)


def expected_work(model, kwargs, flags) -> dict:
    """LLM calls, LLM positions, head rows and embedded positions of one generate under the given switches."""
    c_lens, t_lens = lengths(model, kwargs)
    B, max_c, steps = len(c_lens), max(c_lens), NUM_STEP
    if "batch_invariant" in flags:
        # one forward per distinct (key width, row length), each row at max(length, MIN_ROWS); keys: the item's
        # own c_len
        groups: dict = {}
        for c, t in zip(c_lens, t_lens):
            for length in (c, t):
                groups.setdefault((c, max(length, min(loop.MIN_ROWS, c))), []).append(t)
    elif "trimmed_cfg" in flags and loop.packed_counts(model, c_lens, t_lens, "sliced_heads" in flags):
        # one packed forward of every row at its own length (at least MIN_ROWS positions, plus the padding rows
        # loop.row_count finds this machine's GEMMs need: never more than stock's); the heads read each row's
        # target frames once
        own, targets, stock = sum(c_lens) + sum(t_lens), 2 * sum(t_lens), 2 * B * max_c
        counts = loop.packed_counts(model, c_lens, t_lens, "sliced_heads" in flags)
        positions, heads = counts.llm, counts.heads
        assert all(positions < rows <= stock for rows in counts.gemms.values()), (counts, stock)
        assert max(own, loop.MIN_ROWS) <= positions <= stock, (positions, own, stock)
        assert (max(targets, loop.MIN_ROWS) if "sliced_heads" in flags else positions) <= heads <= stock, heads
        embedded = positions + (steps - 1) * targets if "static_prefix" in flags else steps * positions
        return {"llm_calls": steps, "llm_positions": steps * positions, "head_rows": steps * heads,
                "embedded_positions": embedded}
    else:  # one forward of 2B rows at max_c
        groups = {(max_c, max_c): list(t_lens) * 2}
    positions = sum(width * len(ts) for (_, width), ts in groups.items())
    targets = sum(len(ts) * max(ts) for ts in groups.values())  # each row gathered at its group's longest target
    heads = positions
    if "sliced_heads" in flags and "batch_invariant" in flags:
        heads = sum(max(len(ts) * max(ts), loop.MIN_ROWS) for ts in groups.values())
    elif "sliced_heads" in flags:  # stock's layout: the target frames, padded as loop.row_count says (None: all)
        starts = [c - t for c, t in zip(c_lens, t_lens)] + [0] * B  # conditional rows, then unconditional
        frames = [torch.arange(max(t_lens)).clamp(max=t - 1) for t in 2 * t_lens]  # loop.index_targets' frames
        stock_rows = torch.cat([r * max_c + s + f for r, (s, f) in enumerate(zip(starts, frames))])
        least = max(stock_rows.numel(), loop.MIN_ROWS)
        heads = loop.row_count([model.audio_heads.weight], stock_rows, 2 * B * max_c, least) or positions
        assert least <= heads <= positions, (heads, least, positions)
    embedded = positions + (steps - 1) * targets if "static_prefix" in flags else steps * positions
    return {"llm_calls": steps * len(groups), "llm_positions": steps * positions, "head_rows": steps * heads,
            "embedded_positions": embedded}


def measured(model, kwargs) -> dict:
    work = count_work(model, seed=0, num_step=NUM_STEP, **kwargs).as_dict()
    return work


def check_counts(model, kwargs, patches) -> dict:
    if "batch_invariant" in patches and not loop.gemm_rows_independent(model):
        with pytest.raises(loop.UnsupportedHereError, match="MKL_CBWR"):
            fastpath.apply(model, list(patches))
        assert fastpath.applied(model) == [], "a refused apply must leave the model as it was"
        return {}
    with fastpath.patched(model, list(patches)):
        got = measured(model, kwargs)
    want = expected_work(model, kwargs, loop.effective_flags(model, patches))  # as loop runs on this machine
    mismatched = {k: (got[k], v) for k, v in want.items() if got[k] != v}
    assert not mismatched, f"{'+'.join(patches) or 'stock'}: counter (measured, expected) {mismatched}"
    return got


# prefix_kv_cache's work depends on the refresh interval: its own test below
CASES = [()] + [(n,) for n in loop.FEATURES if n != "prefix_kv_cache"] + [tuple(fastpath.LOSSLESS)]


@pytest.mark.cpu
@pytest.mark.parametrize("patches", CASES, ids=lambda p: "+".join(p) or "stock")
@pytest.mark.parametrize("point", COUNTED_POINTS)
def test_work_matches_what_each_patch_removes(model, point, patches):
    check_counts(model, POINTS[point], patches)


@pytest.mark.cpu
def test_a_patch_that_stops_applying_is_caught(model, monkeypatch):
    """Disable one lossless patch (its apply becomes a no-op): the stack's counts no longer match."""
    name, counter = "static_prefix", "embedded_positions"
    real = fastpath.PATCHES[name]
    monkeypatch.setitem(fastpath.PATCHES, name, real.__class__(**{**vars(real), "apply": lambda m: None}))
    with pytest.raises(AssertionError, match=counter):
        check_counts(model, POINTS["batch_of_3"], fastpath.LOSSLESS)


@pytest.mark.cpu
@pytest.mark.parametrize("patches", [(), fastpath.LOSSLESS], ids=["stock", "lossless"])
def test_an_injected_slowdown_slows_every_llm_forward(model, patches, monkeypatch):
    """`measure.slow_llm` (--inject-slowdown, what the speed gates are validated with) sleeps once per LLM forward
    on stock's path and on the stack's lean_llm, which does not call model.llm."""
    sleeps = []
    monkeypatch.setattr(measure.time, "sleep", sleeps.append)
    handles = measure.slow_llm(model, 0.5)
    try:
        with fastpath.patched(model, list(patches)):
            work = count_work(model, seed=0, **dict(POINTS["voice_clone_audio"], num_step=2))
    finally:
        for handle in handles:
            handle.remove()
    assert work.llm_calls > 0 and len(sleeps) == work.llm_calls, (len(sleeps), work.llm_calls)
    assert all(s > 0 for s in sleeps), sleeps


class ReplayWithoutModules:
    """A CUDA-graph double for the CPU: the capture runs the forward once (modules and their hooks run, as in a
    real capture); replay() runs no module, as a real replay runs kernels and no Python. The output keeps the
    captured values, which the counts do not depend on."""

    def __init__(self, run, pool):
        self.hidden = run().clone()

    def replay(self):
        pass


@pytest.mark.cpu
def test_counters_and_slowdown_see_graph_replays(model, monkeypatch):
    """A forward replayed from a CUDA graph (cuda_graphs, compiled reduce-overhead) runs none of model.llm's
    submodules; the counters and the injected slowdown still see it once per forward."""
    from fastpath.gpu import graphs
    from fastpath.gpu.shapes import Buckets

    kwargs = dict(POINTS["batch_of_3"], num_step=3)
    stock = count_work(model, seed=0, **kwargs)
    graphs.install(model, buckets=Buckets(64), devices=("cpu",),
                   capture=lambda run, pool: (g := ReplayWithoutModules(run, pool), g.hidden))
    sleeps = []
    monkeypatch.setattr(measure.time, "sleep", sleeps.append)
    handles = measure.slow_llm(model, 0.5)
    try:
        graphed = count_work(model, seed=0, **kwargs)
        replays = graphs.stats(model)["hits"]
    finally:
        for handle in handles:
            handle.remove()
        graphs.remove(model)
    assert replays > 0
    assert (graphed.llm_calls, graphed.llm_positions) == (stock.llm_calls, stock.llm_positions) > (0, 0)
    assert len(sleeps) == graphed.llm_calls


@pytest.mark.cpu
def test_prompt_cache_encodes_a_reference_once(model):
    kwargs = dict(POINTS["voice_clone_audio"], num_step=2)
    for patches, encodes in (((), 2), (("prompt_cache",), 1)):
        with fastpath.patched(model, list(patches)):
            total = sum(count_work(model, seed=0, **kwargs).reference_encodes for _ in range(2))
        assert total == encodes, f"{patches or 'stock'}: {total} reference encodes over 2 calls, expected {encodes}"


def layout_key(counts, least: int) -> str:
    """What the packed layout pads on this machine, for the FLOPs' key: '' where nothing."""
    if counts is None:
        return "__stock-layout"
    key = f"__rows+{counts.llm - least}" if counts.llm > least else ""
    return key + "".join(f"__{n}x{k}+{rows - least}" for (n, k), rows in sorted(counts.gemms.items()))


def work_key(checkpoint) -> str:
    return f"{checkpoint.identity}__torch-{metadata.version('torch')}__omnivoice-{metadata.version('omnivoice')}"


@contextmanager
def the_runs_threads():
    """The packed layout's padding rows (loop.row_count) are measured at the thread count the GEMMs run with, and
    MKL's AVX2 kernels give a row other bits at another thread count: an xdist worker runs with its share of the
    threads (conftest.py), so alone and under -n auto the same machine had two layouts, and the one recorded alone
    was not found in a worker. Counted at the thread count the run started with (THREADS_ENV, exported before
    xdist splits the threads), alone or in a worker; put back after."""
    from harness.run.machine import started_threads

    had = torch.get_num_threads()
    torch.set_num_threads(started_threads())
    try:
        yield
    finally:
        torch.set_num_threads(had)


def recorded_counts(entries: dict, base: str, key: str, point: str, config):
    """The recorded counts of `point` under `key` (base + this machine's layout), or the test ends: missing (strict:
    a failure) when no layout of `base` holds the point, "not judged" when other layouts do and this machine's is
    not recorded (a layout is per point: each entry holds the points that had that layout where it was recorded)."""
    if point in entries.get(key, {}):
        return entries[key][point]
    layouts = sorted(k.removeprefix(base) or "(no extra rows)" for k in entries if k.startswith(base)
                     and point in entries[k])
    if not layouts:
        strict.missing(config, f"no recorded work counts of {point} for {base} (this checkpoint, torch and "
                               f"omnivoice)", f"record them with: {SAVE_COMMAND}")
    here = key.removeprefix(base) or "no extra rows"
    strict.not_judged(f"the stack's packed layout of {point} on this machine ({here}) has no recorded work counts "
                      f"(recorded layouts of {point}: {', '.join(layouts)})",
                      f"record this machine's with: {SAVE_COMMAND}")


@pytest.mark.cpu
@pytest.mark.parametrize("point", COUNTED_POINTS)
def test_flops_match_the_recorded_counts(model, checkpoint, point, request):
    """Exact FLOPs of stock and of the lossless stack, against the recorded ones for this checkpoint and torch."""
    with the_runs_threads():
        got = {"stock": measured(model, POINTS[point])}
        with fastpath.patched(model):
            got["fastpath"] = measured(model, POINTS[point])
        c_lens, t_lens = lengths(model, POINTS[point])
        counts = loop.packed_counts(model, c_lens, t_lens, True)  # the stack's rows here (None: stock's layout)
    key = work_key(checkpoint) + layout_key(counts, max(sum(c_lens) + sum(t_lens), loop.MIN_ROWS))
    data = json.loads(WORK_FILE.read_text()) if WORK_FILE.exists() else {"format": "fastpath-work-counters", "entries": {}}
    assert data.get("format") == "fastpath-work-counters", f"{WORK_FILE} is not a work-counter file; restore it from git"
    if request.config.getoption("save_baseline"):
        data["entries"].setdefault(key, {})[point] = got
        WORK_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    recorded = recorded_counts(data["entries"], work_key(checkpoint), key, point, request.config)
    assert got == recorded, f"{point}: work changed (measured vs recorded):\n{got}\n{recorded}"
    if counts is not None:  # else the stack runs stock's layout: the same arithmetic
        assert got["fastpath"]["flops"] < got["stock"]["flops"]


@pytest.mark.cpu
@pytest.mark.parametrize("refresh, alone", [(None, False), (2, False), (4, False), (2, True)],
                         ids=["default", "2", "4", "2-alone"])
def test_prefix_kv_cache_runs_only_the_target_between_refreshes(model, refresh, alone):
    """LLM positions: the conditional row is whole at refresh steps, its target only in between; the
    unconditional row (target only) is unchanged. With no refresh set, every loop.DEFAULT_REFRESH steps; the same
    applied alone, without the lossless stack."""
    kwargs = POINTS["voice_clone_audio"]
    (c_len,), (t_len,) = lengths(model, kwargs)
    refreshes = math.ceil(NUM_STEP / (refresh or loop.DEFAULT_REFRESH))
    want = refreshes * c_len + (NUM_STEP - refreshes) * t_len + NUM_STEP * max(t_len, loop.MIN_ROWS)
    with fastpath.patched(model, ["prefix_kv_cache"] if alone else list(fastpath.LOSSLESS) + ["prefix_kv_cache"]):
        if refresh is not None:
            loop.set_prefix_refresh(model, refresh)
        got = count_work(model, seed=0, num_step=NUM_STEP, **kwargs).llm_positions
    assert got == want, f"refresh {refresh}: {got} LLM positions, expected {want} (c_len {c_len}, t_len {t_len})"



@pytest.mark.cpu
def test_the_recorded_counts_are_found_in_a_worker_with_its_share_of_the_threads(model, checkpoint, request,
                                                                                 monkeypatch):
    """Known worse, as `pytest -n auto` ran on an Intel Xeon: an xdist worker computes on its share of the threads
    (conftest.py), and where the exact row counts of the packed layout depend on the thread count (MKL's AVX2
    kernels) the worker's layout differed from the one recorded alone: "MISSING INPUT: no recorded work counts of
    batch_of_3", though they were recorded. Planted: the run started with 2 threads, this process computes on 1, and
    `loop.row_count` answers three rows more than it finds on fewer threads than the run's (the kernels' row blocks
    at another thread count). The counts are measured at the run's thread count and found."""
    from harness.run.machine import THREADS_ENV

    found = loop.row_count

    def row_count(weights, rows, count, least):
        n = found(weights, rows, count, least)
        return n if n is None or torch.get_num_threads() >= 2 else min(n + 3, count)

    monkeypatch.setattr(loop, "row_count", row_count)
    monkeypatch.setenv(THREADS_ENV, "2")
    had = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's share
    try:
        test_flops_match_the_recorded_counts(model, checkpoint, "batch_of_3", request)
    finally:
        torch.set_num_threads(had)
