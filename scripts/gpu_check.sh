#!/usr/bin/env bash
# The GPU tier on a CUDA machine, stage by stage; the exit says whether every stage ran and passed (docs/gpu.md).
#
#   fastpath-suite gpu-check --quick   a first look on a lent GPU in one call of the device tool (under 8 minutes
#                                      expected on an H100 from a cold machine, the checkpoints' build included)
#   fastpath-suite gpu-check           the whole tier: longer than one 10-minute call, so split it with STAGES
#   fastpath-suite gpu-check --gather DIR [DIR ...]   record the fetched folders of several calls as one results
#                                      file here (RESULTS=DIR: where to write, default results/)
#
# Every call first: wheels (the carried .whl/ into /tmp/site, offline; FASTPATH_NO_WHEELS=1 ignores .whl/), env
# (versions, the GPU, its device key; where CUDA is not usable it stops at once with exit 4, naming what is missing:
# the driver, the wheel or a device), checkpoints (the tiny and full-size test checkpoints). Then, by STAGES:
#   --quick (default "collect quick-parity inductor targets"): collect (pytest -m cuda --collect-only: no cuda test
#     collected fails), quick-parity (QUICK_TESTS below: a bf16 row of each CUDA patch and of the stack, the compiled
#     vocoder, a stream, a move and every revert on CUDA), inductor (packed flex over ten lengths, its recompiles),
#     targets (bench: clone6-medium-32 clone3-mixed8-16 clone3-mixed8-16-each, stock@bf16 gpu@bf16 preset@bf16)
#   full (default "3 4 4b 4c 4d 5"): 3 pytest -m "cuda and not slow" over tests_patches, tests_parity, tests_speed;
#     4 bench and this device's speed baseline <device key>.json; 4b batching; 4c packed CFG; 4d memory over 1,000
#     calls; 5 streaming. Split over calls: STAGES="3 4 4b", then STAGES="4c 4d 5"
# Each stage runs under its own limit (NAME_LIMIT, seconds: the table in docs/gpu.md); DEADLINE (seconds for the
# whole call; --quick: 570) cuts the limits so that the call ends, recorded, inside the device tool's 600 s. A pytest
# stage lists the ids it selects first and is stopped by SIGINT at its limit, so it still writes its junit report;
# the ids it did not reach are named in the log and in the results file. After every stage the results file
# (harness/gpu_check.py, kind gpu-check) is written again, so a call cut off later still leaves one.
# Exit: 0 every stage ran and passed; 1 a stage failed, stopped at its limit, or collected tests that skipped or were
# not reached (green means it ran); 2 usage; 3 the carried wheels do not install; 4 this machine cannot run the tier
# (CUDA not usable, the suite does not import).
# Files in OUT (default out/gpu, under the current folder): env.txt, machine.json, steps.jsonl (a line per stage:
# exit, seconds, limit), NAME.log per stage (pytest: NAME.ids, NAME.xml; bench: NAME.json), RESULTS (OUT/results).
# Other settings: PYTHON (python3), FASTPATH_CACHE (the checkpoint cache, as every verb's).
#
#   run(command="bash scripts/gpu_check.sh --quick", carry=[".whl"], timeout_s=600)
set -uo pipefail  # not -e: a failing stage is counted (status) and the next one still runs; its results matter
caller=$PWD
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
usage() { echo "usage: fastpath-suite gpu-check [--quick] | --gather DIR [DIR ...]" >&2; exit 2; }
mode=full
case "${1:-}" in
  --gather)  # record fetched folders of earlier calls as one results file, here
    shift
    [ $# -gt 0 ] || usage
    py=${PYTHON:-$([ -x "$repo/.venv/bin/python" ] && echo "$repo/.venv/bin/python" || echo python3)}
    cd "$caller" && PYTHONPATH="$repo" exec "$py" -m harness.gpu_check --results "${RESULTS:-$repo/results}" --out "$@"
    ;;
  --quick) mode=quick; shift ;;
  "") ;;
  *) usage ;;
esac
[ $# -eq 0 ] || usage

  # This call as a command line: the settings that change what it measures (as given), then the verb.
CALL=""
for var in STAGES DEADLINE ENV_LIMIT CHECKPOINT_LIMIT COLLECT_LIMIT QUICK_PARITY_LIMIT INDUCTOR_LIMIT TARGETS_LIMIT \
  PATCHES_LIMIT PYTEST_LIMIT PARITY_LIMIT SPEED_LIMIT BENCH_LIMIT BATCH_LIMIT PACKED_LIMIT MEMORY_LIMIT STREAM_LIMIT \
  STREAM_STOCK_LIMIT; do
  if [ -n "${!var:-}" ]; then CALL="$CALL$var='${!var}' "; fi
done
CALL="${CALL}fastpath-suite gpu-check$([ "$mode" = quick ] && echo " --quick")"

  # Limits in seconds. Measured: one run on the H200 (2026-12-01, docs/gpu.md) with CHECKPOINT_LIMIT=120
  # PYTEST_LIMIT=140 BENCH_LIMIT=100 BATCH_LIMIT=50 took 357 s in all: its parity stage was stopped at 140 s (two
  # compile tests took 91 s), its bench and batching stages finished inside 100 s and 50 s. Every other figure is an
  # estimate, to be replaced by the seconds the summary of a run prints beside each limit.
ENV_LIMIT=${ENV_LIMIT:-60}                     # estimate: torch import, CUDA init, nvidia-smi (about 10 s)
CHECKPOINT_LIMIT=${CHECKPOINT_LIMIT:-180}      # estimate: the H200 run gave it 120 s, not recorded whether it needed them
COLLECT_LIMIT=${COLLECT_LIMIT:-60}             # estimate: collecting tests_patches/parity/speed takes 10 s on 2 CPU cores
QUICK_PARITY_LIMIT=${QUICK_PARITY_LIMIT:-240}  # estimate: 2 LLM compiles (tiny; 91 s on the H200), the vocoder's, flex's
INDUCTOR_LIMIT=${INDUCTOR_LIMIT:-90}           # estimate: ten packed lengths through compiled flex attention
TARGETS_LIMIT=${TARGETS_LIMIT:-120}            # estimate: 2 full-size models, 3 points x 3 variants x 4 calls
PATCHES_LIMIT=${PATCHES_LIMIT:-90}             # estimate: the cuda tests of tests_patches (the inductor test)
PARITY_LIMIT=${PARITY_LIMIT:-${PYTEST_LIMIT:-240}}  # measured: 140 s stopped it before the against-fp32 tests
SPEED_LIMIT=${SPEED_LIMIT:-${PYTEST_LIMIT:-120}}    # estimate (the H200 run gave it 140 s; its share of 357 s unknown)
BENCH_LIMIT=${BENCH_LIMIT:-100}                # measured: the H200's bench finished inside 100 s
BATCH_LIMIT=${BATCH_LIMIT:-60}                 # measured: the H200's batching bench finished inside 50 s
PACKED_LIMIT=${PACKED_LIMIT:-120}              # estimate: never run on a GPU
MEMORY_LIMIT=${MEMORY_LIMIT:-240}              # estimate: never run on a GPU
STREAM_LIMIT=${STREAM_LIMIT:-90}               # estimate: never run on a GPU
STREAM_STOCK_LIMIT=${STREAM_STOCK_LIMIT:-60}   # estimate: never run on a GPU
DEADLINE=${DEADLINE:-$([ "$mode" = quick ] && echo 570)}  # the device tool's 600 s less 30 for the last records
RESERVE=30  # seconds a stage leaves before DEADLINE: pytest's 20 s after SIGINT, the records and the summary
STAGES=${STAGES:-$([ "$mode" = quick ] && echo "collect quick-parity inductor targets" || echo "3 4 4b 4c 4d 5")}

  # --quick's selection, in one place: a bf16 row of each CUDA patch and of the stack (compiled rows on the tiny
  # checkpoint; cuda_tf32 acts on fp32 matmuls only, so its row is fp32), the compiled vocoder, a stream and a move
  # with cuda_graphs, and every revert on CUDA (compiled_llm_max_autotune has no revert row: autotuning takes minutes)
PARITY_FILE=tests_parity/test_gpu_parity.py
QUICK_TESTS=(
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[graphs-bf16-single]"
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[gpu-stack-bf16-single]"
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[gpu-stack-packed-bf16-single]"
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[compiled-default-bf16-single]"
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[compiled-ro-bf16-single]"
  "$PARITY_FILE::test_gpu_patch_is_close_to_stock_at_the_same_precision[tf32-fp32-single]"
  "$PARITY_FILE::test_compiled_vocoder_decodes_the_same_waveform[default]"
  "$PARITY_FILE::test_stream_with_cuda_graphs_captures_beside_the_decode_and_matches_chunked_generate"
  "$PARITY_FILE::test_graphs_capture_anew_after_the_model_moves"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[cuda_graphs]"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[compiled_llm]"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[compiled_llm_reduce_overhead]"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[compiled_vocoder]"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[packed_cfg]"
  "$PARITY_FILE::test_revert_gives_stock_back_on_cuda[cuda_tf32]"
  "$PARITY_FILE::test_reverting_tf32_under_cuda_graphs_replays_no_tf32_graph"
  "$PARITY_FILE::test_batched_scoring_gives_each_item_its_own_draws[bf16]"
)
QUICK_INDUCTOR=("tests_patches/test_inductor.py::test_packed_flex_over_ten_lengths_compiles_a_bounded_number_of_times[cuda]")
TARGET_POINTS=(clone6-medium-32 clone3-mixed8-16 clone3-mixed8-16-each)  # harness/gpu_check.py TARGETS' points

OUT=${OUT:-out/gpu}
case $OUT in /*) ;; *) OUT=$caller/$OUT ;; esac
RESULTS=${RESULTS:-$OUT/results}
case $RESULTS in /*) ;; *) RESULTS=$caller/$RESULTS ;; esac
mkdir -p "$OUT" || exit 2
rm -f "$OUT/steps.jsonl" "$OUT/machine.json"  # this call's stages only
export PYTHONUNBUFFERED=1 PYTHONPATH="$repo"
PY=${PYTHON:-python3}
T0=$(date +%s)
status=0  # 1 once a stage did not pass

stage() { echo; echo "=== [+$(( $(date +%s) - T0 ))s] $*"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
step() {  # step NAME EXIT LIMIT START [NOTE]: a line of OUT/steps.jsonl (harness/gpu_check.py reads the last per step)
  local note=null
  [ -n "${5:-}" ] && note="\"$5\""
  printf '{"step": "%s", "exit": %d, "limit_s": %d, "seconds": %d, "call": "%s", "mode": "%s", "note": %s}\n' \
    "$1" "$2" "$3" "$(( $(date +%s) - $4 ))" "${CALL//\"/\\\"}" "$mode" "$note" >>"$OUT/steps.jsonl"
}
record() {  # record NAME: the results file written again; prints the stage's verdict and the tests it did not run
  "$PY" -m harness.gpu_check --out "$OUT" --results "$RESULTS" --command "$CALL" --stage "$1" || status=1
}
limit_for() {  # limit_for SECONDS: a stage's limit, cut to what DEADLINE leaves (0: none left)
  local limit=$1 left
  if [ -n "$DEADLINE" ]; then
    left=$(( DEADLINE - ($(date +%s) - T0) - RESERVE ))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo $(( limit > 0 ? limit : 0 ))
}
run_stage() {  # run_stage NAME LIMIT SIGNAL COMMAND...: COMMAND under the stage's limit, its output in OUT/NAME.log
  local name=$1 asked=$2 signal=$3 limit start rc=1
  limit=$(limit_for "$asked")
  start=$(date +%s)
  shift 3
  rm -rf "${OUT:?}/$name" "$OUT/$name.json" "$OUT/$name.xml"
  if [ "$limit" -lt "$asked" ] && [ "$limit" -lt 10 ]; then  # cut by DEADLINE to too little to start in
    echo "$name: not started: DEADLINE=$DEADLINE s leaves $limit s"
    step "$name" 124 "$limit" "$start" "not started: the call's DEADLINE ($DEADLINE s) left $limit s"
  else
    timeout -s "$signal" -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    step "$name" "$rc" "$limit" "$start"
    echo "$name exit $rc after $(( $(date +%s) - start )) s of its $limit s (124, 137: stopped at the limit)"
    tail -n 15 "$OUT/$name.log" | cut -c1-300
  fi
  [ "$rc" -eq 0 ] || status=1
  record "$name"
}
run_pytest() {  # run_pytest NAME LIMIT ARGS...: the ids the selection collects (OUT/NAME.ids), then the tests under
  local name=$1 limit=$2 start rc  # the limit, stopped by SIGINT so that pytest still writes OUT/NAME.xml
  shift 2
  rm -f "$OUT/$name.ids" "$OUT/$name.xml"
  start=$(date +%s)
  timeout "$COLLECT_LIMIT" "$PY" -m pytest --collect-only -q -p no:cacheprovider "$@" >"$OUT/$name.ids" 2>&1
  rc=$?
  echo "$name: $(grep -c '::' "$OUT/$name.ids") tests collected in $(( $(date +%s) - start )) s (exit $rc)"
  if [ "$rc" -ne 0 ]; then
    tail -n 5 "$OUT/$name.ids"
    step "$name" "$rc" "$COLLECT_LIMIT" "$start" "collection failed with exit $rc: see $name.ids"
    status=1
    record "$name"
    return
  fi
  run_stage "$name" "$limit" INT "$PY" -m pytest "$@" -p no:cacheprovider -rA -q --durations=12 \
    --junitxml="$OUT/$name.xml"
}

stage "wheels"
if [ -z "${FASTPATH_NO_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
  export PYTHONPATH="/tmp/site:$repo"
  if ! "$PY" -c "import transformers" >/dev/null 2>&1; then  # the carried transformers unusable: the image's
    echo "carried transformers does not import here; falling back to the image's:"
    "$PY" -c "import transformers" 2>&1 | tail -n 2
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
  fi
else
  echo "no .whl/ used: the image's packages (scripts/fetch_gpu_wheels.sh where pip reaches PyPI, then carry .whl)"
fi

stage "env: versions, the GPU, the device key"
start=$(date +%s)
timeout "$ENV_LIMIT" "$PY" -m harness.gpu_check --environment --out "$OUT" 2>&1 | tee "$OUT/env.txt"
rc=${PIPESTATUS[0]}
step env "$rc" "$ENV_LIMIT" "$start"
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 124 ] && echo "the env stage did not finish in $ENV_LIMIT s"
  echo "gpu-check stops at its first stage (exit 4): this machine cannot run the GPU tier, see above"
  exit 4
fi
record env

stage "checkpoints: tiny and full size"
run_stage checkpoints "$CHECKPOINT_LIMIT" TERM "$PY" -c "from harness.model.checkpoint import build_checkpoint
print(build_checkpoint('tiny')); print(build_checkpoint('full'))"

if [ "$mode" = quick ]; then
  if want collect; then
    stage "collect: the cuda tests of tests_patches, tests_parity, tests_speed"
    run_stage collect "$COLLECT_LIMIT" TERM "$PY" -m pytest --collect-only -q -p no:cacheprovider \
      -m "cuda and not slow" tests_patches tests_parity tests_speed
  fi
  if want quick-parity; then
    stage "quick-parity: ${#QUICK_TESTS[@]} cuda tests of tests_parity"
    run_pytest quick-parity "$QUICK_PARITY_LIMIT" "${QUICK_TESTS[@]}"
  fi
  if want inductor; then
    stage "inductor: packed flex over ten lengths, its recompiles"
    run_pytest inductor "$INDUCTOR_LIMIT" "${QUICK_INDUCTOR[@]}"
  fi
  if want targets; then
    stage "targets: the GPU stack and the batch against stock eager bf16"
    run_stage targets "$TARGETS_LIMIT" TERM "$PY" -m harness.speed.bench --size full --device cuda \
      --points "${TARGET_POINTS[@]}" --variants stock@bf16 gpu@bf16 preset@bf16 --rounds 3 --out "$OUT/targets.json"
  fi
else
  if want 3; then
    stage "3 pytest -m 'cuda and not slow': tests_patches, tests_parity, tests_speed"
    run_pytest patches "$PATCHES_LIMIT" -m "cuda and not slow" tests_patches
    run_pytest parity "$PARITY_LIMIT" -m "cuda and not slow" tests_parity
    run_pytest speed "$SPEED_LIMIT" -m "cuda and not slow" tests_speed
  fi
  if want 4; then
    stage "4 bench + baseline"
    rm -f "$OUT/baseline.json"
    run_stage bench "$BENCH_LIMIT" TERM "$PY" -m harness.speed.bench --size full --device cuda \
      --points clone6-medium-32 auto-short-10 --variants stock@fp32 stock@bf16 gpu@bf16 preset@bf16 --rounds 6 \
      --out "$OUT/bench.json" --save-baseline "$OUT/baseline.json"
    if [ -f "$OUT/baseline.json" ]; then
      key=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['device_key'])" "$OUT/baseline.json")
      mv "$OUT/baseline.json" "$OUT/$key.json" && echo "baseline: $OUT/$key.json (copy to baselines/)"
    fi
  fi
  if want 4b; then
    stage "4b batching: 8 mixed-length utterances as one batch vs one call each"
    run_stage batching "$BATCH_LIMIT" TERM "$PY" -m harness.speed.bench --size full --device cuda \
      --points clone3-mixed8-16 clone3-mixed8-16-each --variants stock@bf16 gpu@bf16 --rounds 2 \
      --out "$OUT/batching.json"
  fi
  if want 4c; then
    stage "4c packed CFG: the GPU stack with and without packed_cfg, batch 1 and a mixed batch of 8"
    run_stage packed "$PACKED_LIMIT" TERM "$PY" -m harness.speed.bench --size full --device cuda \
      --points clone6-medium-32 clone3-mixed8-16 --variants stock@bf16 gpu@bf16 gpu-packed@bf16 --rounds 3 \
      --out "$OUT/packed.json"
  fi
  if want 4d; then
    stage "4d memory over long service: 1,000 generate calls of mixed lengths with the GPU stack (goal: flat)"
    run_stage memory "$MEMORY_LIMIT" INT "$PY" -m harness.speed.service --size full --device cuda --dtype bfloat16 \
      --apply defaults --calls 1000 --warmup 50 --quiet --out "$OUT/memory"
  fi
  if want 5; then
    stage "5 streaming: time to first audio and underruns"
    run_stage stream-gpu-defaults "$STREAM_LIMIT" TERM "$PY" -m harness.speed.streaming --size full --device cuda \
      --dtype bfloat16 --apply defaults --rounds 5 --out "$OUT/stream-gpu-defaults"
    run_stage stream-gpu-stock "$STREAM_STOCK_LIMIT" TERM "$PY" -m harness.speed.streaming --size full --device cuda \
      --dtype bfloat16 --points clone6-six-32 --rounds 3 --out "$OUT/stream-gpu-stock"
  fi
fi

stage "summary: each stage's verdict, its seconds against its limit"
"$PY" -m harness.gpu_check --out "$OUT" --summary || status=1
echo "results file: $RESULTS/gpu-check/ (copy it into the checkout's results/); gpu-check exit $status"
exit "$status"
