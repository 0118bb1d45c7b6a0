#!/usr/bin/env bash
# Records repeated runs of nightly speed points on this machine into a history file, the noise that
# `fastpath-suite history rates` draws its clean nights from (docs/speed.md, "Nightly history").
#
# usage: fastpath-suite record-nights [RUNS] [HISTORY]
#   RUNS     how many runs ("nights"), default 22; every 4th with one core kept busy by a background job at
#            nice 19 (a busy runner: a cron job, a CI agent), labelled busy-core in the history. A busy loop at
#            full priority is not noise but a broken measurement: on a 2-core machine it slows every point 3-4x.
#   HISTORY  default fixtures/nights/<this machine's hardware key>.json (appended to: an interrupted recording
#            continues)
#
# Each run is two fresh processes, as a nightly job is: the tiny test checkpoint at three points (per-call
# overhead) and the full-size one at auto-short-10 (the shapes of the real model), the lossless stack, 9 timed
# rounds after one warm-up. About 3 minutes a run on a 2-core machine: keep the machine otherwise idle (any other
# work on it is noise the rates would then include).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-22}
py=.venv/bin/python
history=${2:-fixtures/nights/$($py -c 'from harness.machine import hardware_key, machine_info; print(hardware_key(machine_info("cpu")))').json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [ -n "${busy:-}" ] && kill "$busy" 2>/dev/null || true' EXIT
for i in $(seq 1 "$runs"); do
  label=(); busy=""
  if [ $((i % 4)) -eq 0 ]; then
    nice -n 19 $py -c 'while True: pass' & busy=$!
    label=(--label busy-core)
  fi
  echo "run $i of $runs$( [ -n "$busy" ] && echo ', one core kept busy') (about $(( (runs - i + 1) * 3 )) minutes left)" >&2
  $py -m harness bench --size tiny --variants lossless --points auto-medium-32 clone3-short-32 clone6-medium-32 \
    --rounds 9 --quiet --save-baseline "$tmp/tiny.json" > "$tmp/tiny.log"
  $py -m harness bench --size full --variants lossless --points auto-short-10 \
    --rounds 9 --quiet --save-baseline "$tmp/full.json" > "$tmp/full.log"
  if [ -n "$busy" ]; then kill "$busy"; busy=""; fi
  $py -m harness history append "$history" "$tmp/tiny.json" "$tmp/full.json" "${label[@]}"
  rm -f "$tmp/tiny.json" "$tmp/full.json"
done
