#!/usr/bin/env bash
# Records repeated runs of nightly points on this machine into a history file, the noise that
# `fastpath-suite nightly rates` draws its clean nights from (docs/nightly.md, "What the rule catches, measured").
#
# usage: fastpath-suite nightly record [RUNS] [HISTORY] [--signal wall|instructions] [--points P ...] [--jobs N]
#   RUNS     how many runs ("nights"), default 22
#   HISTORY  default fixtures/nights/<this machine's hardware key>[-instructions].json (appended to: an interrupted
#            recording continues)
#   --signal wall (default): each run is two fresh processes, as a nightly job is: the tiny test checkpoint at
#            three points (per-call overhead) and the full-size one at auto-short-10, the lossless stack, 9 timed
#            rounds after one warm-up; every 4th run with one core kept busy by a loop at nice 19 (a busy runner: a
#            cron job, a CI agent), labelled busy-core. A busy loop at full priority is not noise but a broken
#            measurement: on a 2-core machine it slows every point 3-4x. About 3 minutes a run on a 2-core machine:
#            keep the machine otherwise idle.
#   --signal instructions: each run is `fastpath-suite counts instructions` (every counting point, stock and lossless, in
#            one process under callgrind: about 7 to 9 minutes); every 4th run beside a busy loop at the same priority
#            (labelled busy-core): a count must not move with it. --points: only these counting points (e.g. the
#            four tiny ones: one process of about 7 minutes a run); --jobs N: N runs side by side (a count does not
#            move with the load; each run is one process per checkpoint size, one thread each).
set -euo pipefail
cd "$(dirname "$0")/.."
signal=wall
args=(); points=(); jobs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --signal) signal=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --points) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do points+=("$1"); shift; done ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$signal" = wall ] && { [ "$jobs" != 1 ] || [ ${#points[@]} -gt 0 ]; }; then
  echo "--jobs and --points are for --signal instructions (wall-time runs must run alone, at their fixed points)" >&2
  exit 2
fi
case "$signal" in wall|instructions) ;; *) echo "--signal is wall or instructions, not $signal" >&2; exit 2 ;; esac
runs=${args[0]:-22}
py=.venv/bin/python
key=$($py -c 'from harness.run.machine import hardware_key, machine_info; print(hardware_key(machine_info("cpu")))')
suffix=""; [ "$signal" = instructions ] && suffix=-instructions
history=${args[1]:-fixtures/nights/$key$suffix.json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [ -n "${busy:-}" ] && kill "$busy" 2>/dev/null || true' EXIT
minutes=3; [ "$signal" = instructions ] && minutes=8
pflag=(); [ ${#points[@]} -gt 0 ] && pflag=(--points "${points[@]}")
i=0
while [ "$i" -lt "$runs" ]; do
  batch=$(( runs - i < jobs ? runs - i : jobs ))
  label=(); busy=""
  if [ $(( (i / jobs + 1) % 4 )) -eq 0 ]; then
    if [ "$signal" = instructions ]; then
      $py -c 'while True: pass' & busy=$!  # the same priority: the count must not see it
    else
      nice -n 19 $py -c 'while True: pass' & busy=$!
    fi
    label=(--label busy-core)
  fi
  echo "runs $((i + 1))-$((i + batch)) of $runs$( [ -n "$busy" ] && echo ', one core kept busy') (about \
$(( (runs - i + jobs - 1) / jobs * minutes )) minutes left)" >&2
  files=()
  if [ "$signal" = instructions ]; then
    pids=()
    for j in $(seq 1 "$batch"); do
      $py -m harness counts instructions "${pflag[@]}" --out "$tmp/instructions-$j.json" > "$tmp/instructions-$j.log" 2>&1 &
      pids+=($!); files+=("$tmp/instructions-$j.json")
    done
    for j in "${!pids[@]}"; do
      wait "${pids[$j]}" || { echo "run failed:" >&2; tail -20 "$tmp/instructions-$((j + 1)).log" >&2; exit 1; }
    done
  else
    $py -m harness bench --size tiny --variants lossless --points auto-medium-32 clone3-short-32 clone6-medium-32 \
      --rounds 9 --quiet --save-baseline "$tmp/tiny.json" > "$tmp/tiny.log"
    $py -m harness bench --size full --variants lossless --points auto-short-10 \
      --rounds 9 --quiet --save-baseline "$tmp/full.json" > "$tmp/full.log"
    files=("$tmp/tiny.json" "$tmp/full.json")
  fi
  if [ -n "$busy" ]; then kill "$busy"; busy=""; fi
  if [ "$signal" = instructions ]; then
    for f in "${files[@]}"; do $py -m harness nightly append "$history" "$f" "${label[@]}"; done  # a night each
  else
    $py -m harness nightly append "$history" "${files[@]}" "${label[@]}"
  fi
  rm -f "${files[@]}"
  i=$(( i + batch ))
done
