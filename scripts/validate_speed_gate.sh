#!/usr/bin/env bash
# Validates the CPU baseline gate on the full-size model (the speed issue's acceptance check), on a quiet machine:
#   1. records baselines/<device key>.json (--save-baseline),
#   2. five clean reruns must pass,
#   3. a run with every LLM forward slowed by 20% (--inject-slowdown 0.2) must fail.
# Logs go to out/speed_gate/. About 15 minutes on 2 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/speed_gate
run() {  # name, extra pytest args...
  local name=$1; shift
  .venv/bin/python -m pytest tests_speed/test_rtf.py --slow -k baseline -s -p no:cacheprovider "$@" \
    > "out/speed_gate/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc; $(grep -E '^auto-.*->' "out/speed_gate/$name.log" | tr '\n' ';')"
  return $rc
}
run record --save-baseline || exit 1
clean_failures=0
for i in 1 2 3 4 5; do run "clean$i" || clean_failures=$((clean_failures + 1)); done
run injected --inject-slowdown 0.2 && injected=passed || injected=failed
echo "clean reruns failed: $clean_failures/5 (want 0); injected 20% slowdown: $injected (want failed)"
[ "$clean_failures" -eq 0 ] && [ "$injected" = failed ]
