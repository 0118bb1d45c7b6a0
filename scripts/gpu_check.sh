#!/usr/bin/env bash
# The GPU tier in one call on a lent CUDA machine (written for the H200 of the `run` tool; docs/gpu.md):
#   1. install the carried wheels (.whl/, see scripts/gpu_wheels.txt) into /tmp/site, offline
#   2. build the tiny and full-size test checkpoints
#   3. pytest -m cuda over tests_parity, then tests_speed (each log holds every measured value: -rA)
#   4. benchmark stock eager fp32 and bf16, the GPU stack, and the full preset (GPU stack + 12 steps), and write
#      the samples as this device's speed baseline, <device key>.json
#   4b. the same for 8 mixed-length utterances, one batch against one call each (the batching target)
#   4c. packed CFG: the GPU stack with and without packed_cfg (and stock), batch 1 and a mixed batch of 8
#   4d. memory over long service: allocated and reserved MiB after each of 1,000 generate calls of mixed lengths
#   5. streaming: time to first audio and underruns of fastpath.stream vs one generate call, full size,
#      bf16, with the GPU defaults applied once (all four stream points), and stock eager (the six-sentence clone)
#   6. results: one "gpu-check" results file (harness/gpu_check.py: test counts per tier from the junit reports,
#      bench samples, streaming rounds, each step's exit status) into $RESULTS (default $OUT/results, so it comes
#      back with the other files; copy results/gpu-check/*.json into the checkout's results/)
# STAGES picks stages 3-5 (default all: "3 4 4b 4c 4d 5"); stages 1-2 and 6 always run. All of them exceed one call's 10
# minutes since stage 5 joined: run "3 4 4b" and "4c 4d 5" as two calls, e.g. STAGES="4c 4d 5" fastpath-suite gpu-check; each
# call's results file then holds its own stages only. To record both calls as one results file, fetch both
# folders and gather them here (this checkout's commit; the GPU named by their bench and streaming files):
#   fastpath-suite gpu-check --gather DIR [DIR ...]      (RESULTS=DIR: where to write, default results/)
# Everything lands in $OUT (the run tool's result folder; default out/gpu here): env.txt, each step's log, the
# pytest junit reports parity.xml and speed.xml, bench.json, batching.json, the baseline <device key>.json,
# stream-gpu-*/streaming.json, steps.jsonl (one line per step: its exit status, seconds and limit) and results/.
# Each stage has its own time limit, so a slow stage still leaves the others' results. On the H200 (2026-12-01) a
# run with the parity tier stopped at 140 s took 357 s; with the parity limit of 240 s about 7.5 minutes, plus
# about 3 to start.
#
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=560)
set -uo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--gather" ]; then  # record fetched folders of earlier calls as one results file, here
  shift
  [ $# -gt 0 ] || { echo "usage: fastpath-suite gpu-check --gather DIR [DIR ...]" >&2; exit 2; }
  repo=$PWD
  py=${PYTHON:-$([ -x "$repo/.venv/bin/python" ] && echo "$repo/.venv/bin/python" || echo python3)}
  cd "$caller" && PYTHONPATH="$repo" exec "$py" -m harness.gpu_check --results "${RESULTS:-$repo/results}" --out "$@"
fi
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" FASTPATH_CACHE=${FASTPATH_CACHE:-/tmp/fastpath-cache}
PY=${PYTHON:-python3}
T0=$(date +%s)
stage() { echo; echo "=== [+$(( $(date +%s) - T0 ))s] $*"; }
want() { [[ " ${STAGES:-3 4 4b 4c 4d 5} " == *" $1 "* ]]; }
CALL=""  # this call as a command line: the settings that change what it measures, then the verb
for var in STAGES PYTEST_LIMIT BENCH_LIMIT BATCH_LIMIT PACKED_LIMIT MEMORY_LIMIT STREAM_LIMIT STREAM_STOCK_LIMIT; do
  if [ -n "${!var:-}" ]; then CALL="$CALL$var='${!var}' "; fi
done
CALL="${CALL}fastpath-suite gpu-check"
step() {  # step NAME EXIT LIMIT START: a line of $OUT/steps.jsonl (harness/gpu_check.py: the last per step)
  printf '{"step": "%s", "exit": %d, "limit_s": %d, "seconds": %d, "call": "%s"}\n' "$1" "$2" "$3" \
    "$(( $(date +%s) - $4 ))" "${CALL//\"/\\\"}" >>"$OUT/steps.jsonl"
}

stage "1/4 wheels"
if [ -z "${FASTPATH_NO_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then  # FASTPATH_NO_WHEELS=1: dry run here
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD"
  if ! $PY -c "import transformers" >/dev/null 2>&1; then  # the carried transformers unusable here: the image's
    echo "carried transformers does not import here; falling back to the image's:"
    $PY -c "import transformers" 2>&1 | tail -n 2
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
  fi
else
  echo "no .whl/ here: using the image's packages (run scripts/fetch_gpu_wheels.sh where pip reaches PyPI, carry .whl)"
fi
{
  $PY - <<'PYEOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "| capability", torch.cuda.get_device_capability())
for name in ("omnivoice", "transformers", "tokenizers", "soundfile", "pytest", "pytest-benchmark", "scipy", "triton"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
PYEOF
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv \
    2>&1 || true
  $PY -c "import omnivoice, fastpath.gpu.graphs; print('omnivoice imports')" 2>&1 | tail -n 3
} 2>&1 | tee "$OUT/env.txt"

stage "2/4 checkpoints"
timeout "${CHECKPOINT_LIMIT:-180}" $PY -c "
from harness.model.checkpoint import build_checkpoint
print(build_checkpoint('tiny')); print(build_checkpoint('full'))" 2>&1 | tail -n 5
echo "checkpoint build exit ${PIPESTATUS[0]} (124: timed out; the tests then build what is missing)"

stage "3/4 pytest -m cuda (parity, then speed)"  # SIGINT at the limit: pytest stops, and still prints the
# summary and every finished test's measured values, and writes its junit report
want 3 && for tier in parity speed; do
  limit=${PYTEST_LIMIT:-$([ $tier = parity ] && echo 240 || echo 120)}; t=$(date +%s)
  rm -f "$OUT/$tier.xml"
  timeout -s INT -k 20 "$limit" $PY -m pytest -m cuda "tests_$tier" -p no:cacheprovider -rA -q \
    --durations=12 --junitxml="$OUT/$tier.xml" >"$OUT/$tier.log" 2>&1
  rc=$?; step "$tier" $rc "$limit" "$t"
  echo "pytest tests_$tier exit $rc (124: stopped at the limit)"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/$tier.log" | cut -c1-300 | tail -n 40
done

stage "4/4 bench + baseline"
t=$(date +%s)
want 4 && rm -f "$OUT/bench.json" && timeout "${BENCH_LIMIT:-100}" $PY -m harness.speed.bench --size full --device cuda \
  --points clone6-medium-32 auto-short-10 --variants stock@fp32 stock@bf16 gpu@bf16 preset@bf16 --rounds 6 \
  --out "$OUT/bench.json" --save-baseline "$OUT/baseline.json" >"$OUT/bench.log" 2>&1
rc=$?; want 4 && step bench $rc "${BENCH_LIMIT:-100}" "$t"
echo "bench exit $rc"
if want 4 && [ -f "$OUT/baseline.json" ]; then
  key=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['device_key'])" "$OUT/baseline.json")
  mv "$OUT/baseline.json" "$OUT/$key.json" && echo "baseline: $OUT/$key.json (copy to baselines/)"
fi

stage "4b batching: 8 mixed-length utterances as one batch vs one call each (target: >= 3x utterances/s)"
t=$(date +%s)
want 4b && rm -f "$OUT/batching.json" && timeout "${BATCH_LIMIT:-60}" $PY -m harness.speed.bench --size full \
  --device cuda --points clone3-mixed8-16 clone3-mixed8-16-each --variants stock@bf16 gpu@bf16 --rounds 2 \
  --out "$OUT/batching.json" >"$OUT/batching.log" 2>&1
rc=$?; want 4b && step batching $rc "${BATCH_LIMIT:-60}" "$t"
echo "batching bench exit $rc"; tail -n 12 "$OUT/batching.log"

stage "4c packed CFG: the GPU stack with and without packed_cfg, batch 1 and a mixed batch of 8"
t=$(date +%s)
want 4c && rm -f "$OUT/packed.json" && timeout "${PACKED_LIMIT:-120}" $PY -m harness.speed.bench --size full \
  --device cuda --points clone6-medium-32 clone3-mixed8-16 --variants stock@bf16 gpu@bf16 gpu-packed@bf16 \
  --rounds 3 --out "$OUT/packed.json" >"$OUT/packed.log" 2>&1
rc=$?; want 4c && step packed $rc "${PACKED_LIMIT:-120}" "$t"
echo "packed bench exit $rc"; tail -n 12 "$OUT/packed.log"

stage "4d memory over long service: 1,000 generate calls of mixed lengths with the GPU stack (goal: flat)"
t=$(date +%s)
want 4d && rm -rf "$OUT/memory" && timeout -s INT -k 20 "${MEMORY_LIMIT:-240}" $PY -m harness.speed.service \
  --size full --device cuda --dtype bfloat16 --apply defaults --calls 1000 --warmup 50 --quiet \
  --out "$OUT/memory" >"$OUT/memory.log" 2>&1
rc=$?; want 4d && step memory $rc "${MEMORY_LIMIT:-240}" "$t"
echo "memory exit $rc (1: grows; SIGINT at the limit keeps the calls measured)"; tail -n 6 "$OUT/memory.log"

stage "5 streaming: time to first audio and underruns"
if want 5; then
  t=$(date +%s); rm -f "$OUT/stream-gpu-defaults/streaming.json"
  timeout "${STREAM_LIMIT:-90}" $PY -m harness.speed.streaming --size full --device cuda --dtype bfloat16 \
    --apply defaults --rounds 5 --out "$OUT/stream-gpu-defaults" >"$OUT/stream-gpu-defaults.log" 2>&1
  rc=$?; step stream-gpu-defaults $rc "${STREAM_LIMIT:-90}" "$t"
  echo "stream (GPU defaults) exit $rc"; tail -n 10 "$OUT/stream-gpu-defaults.log"
  t=$(date +%s); rm -f "$OUT/stream-gpu-stock/streaming.json"
  timeout "${STREAM_STOCK_LIMIT:-60}" $PY -m harness.speed.streaming --size full --device cuda --dtype bfloat16 \
    --points clone6-six-32 --rounds 3 --out "$OUT/stream-gpu-stock" >"$OUT/stream-gpu-stock.log" 2>&1
  rc=$?; step stream-gpu-stock $rc "${STREAM_STOCK_LIMIT:-60}" "$t"
  echo "stream (stock bf16) exit $rc"; tail -n 5 "$OUT/stream-gpu-stock.log"
fi

stage "summary"
grep -hE "^(target|forward_ms|first_request|memory_mib|many_shapes|graph_stats|vocoder|compile_)" "$OUT/speed.log" \
  "$OUT/parity.log" | cut -c1-300 | tail -n 30
tail -n 30 "$OUT/bench.log"
tail -n 2 "$OUT/parity.log" "$OUT/speed.log"

stage "6 results: one gpu-check results file in ${RESULTS:-$OUT/results}"
$PY -m harness.gpu_check --out "$OUT" --results "${RESULTS:-$OUT/results}" --command "$CALL"
echo "results exit $?"
ls -la "$OUT"
