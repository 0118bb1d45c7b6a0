#!/usr/bin/env bash
# The GPU tier on a CUDA machine, stage by stage; the exit says whether every stage ran and passed (docs/gpu.md).
#
#   fastpath-suite gpu-check --quick   a first look: a bf16 row of each CUDA patch and the speed targets, in one
#                                      call that ends, its results file written, within DEADLINE seconds
#   fastpath-suite gpu-check           the whole tier; on a GPU machine that limits how long one command may run,
#                                      split it over several calls with STAGES
#   fastpath-suite gpu-check --gather DIR [DIR ...]   record the folders of several calls as one results file
#                                      here (RESULTS=DIR: where to write, default results/)
#
# Every call first: wheels (the wheels in .whl/ into /tmp/site, offline; FASTPATH_NO_WHEELS=1 ignores .whl/), env
# (versions, the GPU, its device key; where CUDA is not usable it stops at once with exit 4, naming what is missing:
# the driver, the wheel or a device), checkpoints (the tiny and full-size test checkpoints). Then, by STAGES:
#   --quick (default "collect quick-parity inductor targets"): collect (pytest -m cuda --collect-only: no cuda test
#     collected fails), quick-parity (QUICK_TESTS below: a bf16 row of each CUDA patch and of the stack, the compiled
#     vocoder, a stream, a move and every revert on CUDA), inductor (packed flex over ten lengths, its recompiles),
#     targets (bench: clone6-medium-32 clone3-mixed8-16 clone3-mixed8-16-each, stock@bf16 gpu@bf16 preset@bf16)
#   full (default "3 4 4b 4c 4d 5"): 3 pytest -m "cuda and not slow" over tests_patches, tests_parity, tests_speed;
#     4 bench and this device's speed baseline <device key>.json; 4b batching; 4c packed CFG; 4d memory over 1,000
#     calls; 5 streaming. Split over two calls: STAGES="3 4 4b", then STAGES="4c 4d 5"
# Each stage runs under its own limit in seconds (NAME_LIMIT, e.g. BENCH_LIMIT=200; docs/gpu.md renders each
# default beside the seconds a run measured). DEADLINE is the seconds the whole call may take: each stage's limit is
# cut so that the call ends, its records written, within it. --quick's default suits a machine that stops a command after 10
# minutes; set DEADLINE to your machine's limit less 30 s. A pytest stage lists the ids it selects first and is
# stopped by SIGINT at its limit, so it still writes its junit report; the ids it did not reach are named in the log
# and in the results file. After every stage the results file (harness/gpu_check.py, kind gpu-check) is written
# again, so a call stopped later still leaves the stages before it.
# Exit: 0 every stage ran and passed; 1 a stage failed, stopped at its limit, or collected tests that skipped or were
# not reached (green means it ran); 2 usage; 3 the wheels in .whl/ do not install; 4 this machine cannot run the
# tier (CUDA not usable, the suite does not import).
# Files in OUT (default out/gpu, under the current folder): env.txt, machine.json, steps.jsonl (a line per stage:
# exit, seconds, limit), NAME.log per stage (pytest: NAME.ids, NAME.xml; bench: NAME.json), RESULTS (OUT/results).
# Other settings: PYTHON (python3), FASTPATH_CACHE (the checkpoint cache, as every verb's).
# On a GPU machine without the suite installed, run this script from the checkout with `bash scripts/gpu_check.sh
# --quick`, the wheels of scripts/gpu_wheels.txt in .whl/ beside it (scripts/fetch_gpu_wheels.sh downloads them).
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

  # Limits in seconds, each `NAME=${NAME:-default}  # stage: what it bounds` (docs/gpu.md renders these lines, and
  # beside them the seconds each stage took in the results files of earlier runs: every default is an estimate until
  # such a run measures it)
ENV_LIMIT=${ENV_LIMIT:-60}                     # env: torch's import, CUDA's init, nvidia-smi
CHECKPOINT_LIMIT=${CHECKPOINT_LIMIT:-180}      # checkpoints: building the tiny and full-size test checkpoints
COLLECT_LIMIT=${COLLECT_LIMIT:-60}             # collect: listing the cuda tests of three tiers; also each pytest stage's listing
QUICK_PARITY_LIMIT=${QUICK_PARITY_LIMIT:-240}  # quick-parity: two LLM compiles on the tiny checkpoint, the vocoder's and flex attention's, four model loads
INDUCTOR_LIMIT=${INDUCTOR_LIMIT:-90}           # inductor: ten packed lengths through compiled flex attention
TARGETS_LIMIT=${TARGETS_LIMIT:-120}            # targets: two full-size models, 3 points x 3 variants x 4 calls
PATCHES_LIMIT=${PATCHES_LIMIT:-90}             # patches: the cuda tests of tests_patches
PARITY_LIMIT=${PARITY_LIMIT:-${PYTEST_LIMIT:-240}}  # parity: the cuda tests of tests_parity (PYTEST_LIMIT, the older setting, sets parity and speed)
SPEED_LIMIT=${SPEED_LIMIT:-${PYTEST_LIMIT:-120}}    # speed: the cuda tests of tests_speed (PYTEST_LIMIT as for parity)
BENCH_LIMIT=${BENCH_LIMIT:-100}                # bench: stage 4, four variants at two points, 6 rounds
BATCH_LIMIT=${BATCH_LIMIT:-60}                 # batching: stage 4b, a batch of 8 against one call each, 2 rounds
PACKED_LIMIT=${PACKED_LIMIT:-120}              # packed: stage 4c, packed CFG at two points, 3 rounds
MEMORY_LIMIT=${MEMORY_LIMIT:-240}              # memory: stage 4d, stopped with SIGINT at its limit, keeping the calls measured
STREAM_LIMIT=${STREAM_LIMIT:-90}               # stream-gpu-defaults: stage 5, the stream with the GPU defaults
STREAM_STOCK_LIMIT=${STREAM_STOCK_LIMIT:-60}   # stream-gpu-stock: stage 5, stock eager
MUTANTS_LIMIT=${MUTANTS_LIMIT:-420}            # mutants-gpu: stage 6, the mutants only a GPU run can observe, against the cuda tests
DEADLINE=${DEADLINE:-$([ "$mode" = quick ] && echo 570)}  # the call: with --quick, a 10-minute limit per command less 30 s for the last records
RESERVE=30  # seconds a stage leaves before DEADLINE: pytest's 20 s after SIGINT, the records and the summary
STAGES=${STAGES:-$([ "$mode" = quick ] && echo "collect quick-parity inductor targets" || echo "3 4 4b 4c 4d 5 6")}

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
  if ! "$PY" -c "import transformers" >/dev/null 2>&1; then  # the wheel's transformers unusable: the image's
    echo "the transformers of .whl/ does not import here; falling back to the image's:"
    "$PY" -c "import transformers" 2>&1 | tail -n 2
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
  fi
else
  echo "no .whl/ used: the image's packages (scripts/fetch_gpu_wheels.sh where pip reaches PyPI, then copy .whl/ here)"
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
  if want 6; then
    stage "6 mutants only a GPU run can observe (fixtures/mutants/needs_gpu.json), against the cuda tests"
    limit=$(limit_for "$MUTANTS_LIMIT")
    run_stage mutants-gpu "$MUTANTS_LIMIT" TERM "$PY" -m harness audit mutants --needs-gpu \
      --budget "$(( limit > 60 ? limit - 60 : 1 ))" --results "$RESULTS"
  fi
fi

stage "summary: each stage's verdict, its seconds against its limit"
"$PY" -m harness.gpu_check --out "$OUT" --summary || status=1
echo "results file: $RESULTS/gpu-check/ (copy it into the checkout's results/); gpu-check exit $status"
exit "$status"
