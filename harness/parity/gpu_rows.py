"""The GPU tier's same-precision tolerance rows (tests_parity/test_gpu_parity.py), with what a GPU measured and why.

Each row (`harness.parity.tolerance.Row`): a patch set at a checkpoint size and dtype, the bounds its closeness to
stock at the same precision keeps, what a GPU measured (None: not yet; the first-look run prints it) and why the
bounds are what they are: 0.0 where the GPU measured 0.0, the measured figure with stated headroom elsewhere, a first
estimate marked unmeasured where no GPU has run the row. docs/parity.md's table is `render_rows`, rendered by
`fastpath-suite maintain results`; tests_harness/test_tolerance.py holds each row to what it exists to refuse.
"""

from __future__ import annotations

import fastpath
from harness.parity.tolerance import Row

GPU_STACK = tuple(fastpath.defaults("cuda"))
H200 = "NVIDIA H200, 2026-12-01"  # the one GPU run so far (docs/gpu.md, "Status on a GPU")
FIRST_ESTIMATE = ("not measured on a GPU yet: a first estimate from the arithmetic (bf16 1e-3..1e-2 per product over "
                  "28 layers)")

SAME_PRECISION = [
    Row("graphs-fp32", ("cuda_graphs",), "full", "fp32", 1e-5, 0.999, 0.99, (1.3e-6, None, 1.0), H200,
        "fp32 rounding only (a padded GEMM may pick other tiles): measured 1.3e-6; 10x for another card's tiles, and "
        "a near-tie's argmax may flip once in a run"),
    Row("graphs-bf16", ("cuda_graphs",), "full", "bf16", 0.0, 1.0, 1.0, (0.0, 1.0, 1.0), H200,
        "measured 0.0: the padded bf16 forward gave stock's bits"),
    Row("graphs-fp16", ("cuda_graphs",), "full", "fp16", 0.0, 1.0, 1.0, (0.0, 1.0, 1.0), H200,
        "measured 0.0: the padded fp16 forward gave stock's bits"),
    Row("tf32-fp32", ("cuda_tf32",), "full", "fp32", 3e-3, 0.995, 0.95, (1.0e-3, 0.9993, 0.989), H200,
        "TF32 rounds every fp32 matmul input to 10 mantissa bits: measured 1.0e-3, argmax 0.9993, tokens 0.989; 3x the "
        "error for another card's reduction order, and a flipped argmax changes every later step's input"),
    Row("gpu-stack-bf16", GPU_STACK, "full", "bf16", 5e-2, 0.95, 0.5, None, None, FIRST_ESTIMATE),
    Row("gpu-stack-fp32", GPU_STACK, "full", "fp32", 1e-2, 0.98, 0.5, None, None, FIRST_ESTIMATE + "; TF32 on"),
    Row("packed-fp32", ("packed_cfg",), "full", "fp32", 1e-4, 0.999, 0.95, None, None,
        "not measured on a GPU yet: FlexAttention over each row's own keys is another kernel; on CPU its step-0 "
        "relative error is below 1e-5"),
    Row("gpu-stack-packed-bf16", GPU_STACK + ("packed_cfg",), "full", "bf16", 5e-2, 0.95, 0.5, None, None,
        FIRST_ESTIMATE),
    # compile on the tiny checkpoint: compiling the 28-layer model costs about a minute per mode, over the tier's
    # budget (tests_speed/test_gpu_speed.py times it on full size under --slow)
    Row("compiled-default-bf16", ("compiled_llm",), "tiny", "bf16", 1e-2, 0.99, 0.8, (4.8e-3, 0.996, 0.86), H200,
        "fused kernels reorder bf16 reductions: measured 4.8e-3, argmax 0.996-0.998, tokens 0.86-0.92 (one flipped "
        "argmax changes the next step's input); 2x the error"),
    Row("compiled-ro-bf16", ("compiled_llm_reduce_overhead",), "tiny", "bf16", 1e-2, 0.99, 0.8, (4.8e-3, 0.996, 0.86),
        H200, "as compiled-default-bf16 (measured the same)"),
    Row("compiled-vocoder-fp32", ("compiled_vocoder",), "full", "fp32", 0.0, 1.0, 1.0, (0.0, 1.0, 1.0), H200,
        "the vocoder does not touch the LLM: logits and tokens identical (its waveform: "
        "test_compiled_vocoder_decodes_the_same_waveform)"),
]


def render_rows(results_dir=None) -> str:
    """docs/parity.md's table of the rows (`results_dir` unused: the rows are data of the code, not measurements)."""
    lines = ["| row | patches | checkpoint | dtype | max rel err | min argmax | min tokens | measured (rel err, argmax, "
             "tokens) | why |", "|---|---|---|---|---|---|---|---|---|"]
    for r in SAME_PRECISION:
        patches = "the GPU stack" + (" + packed_cfg" if "packed_cfg" in r.patches else "") \
            if set(GPU_STACK) <= set(r.patches) else ", ".join(r.patches)
        measured = "not yet" if r.measured is None else (
            ", ".join("-" if v is None else f"{v:g}" for v in r.measured) + f" ({r.card})")
        lines.append(f"| `{r.name}` | {patches} | {r.size} | {r.dtype} | {r.max_rel_err:g} | {r.min_argmax:g} | "
                     f"{r.min_tokens:g} | {measured} | {r.why} |")
    return "\n".join(lines)
