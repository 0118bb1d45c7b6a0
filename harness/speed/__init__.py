"""Per-change speed: time a change against stock and against stored baselines.

`bench` (interleaved rounds of variants at points, `measure` underneath), `baselines` (the stored figures per
device key), `compare` (the regression rule: median slowdown above a factor AND a one-sided Mann-Whitney U test),
`floors` (same-run ratio floors), `stability` (the rule that calls a figure unstable instead of printing it),
`conditions` (what a run ran beside), and the timed jobs `streaming` (time to first audio), `service` (memory over
many calls) and `prefix` (the approximate prefix-KV cache). Jobs: `fastpath-suite bench|grid|compare|stream|memory|
prefix`. Docs: docs/speed.md.

Nothing here imports torch or the model at import time.
"""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.speed import bench, prefix, streaming, targets

    return {"grid": bench.render_results, "bench": bench.render_results, "stream": streaming.render_results,
            "prefix": prefix.render_results, "gpu-targets": targets.render_page}


hand_over(renderers)
