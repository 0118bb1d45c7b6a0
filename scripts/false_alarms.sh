#!/usr/bin/env bash
# False-alarm figure of the default suite: runs the README's test command N times, each on a fresh clone of this
# checkout's HEAD with cold caches, and tabulates failures per test (markdown on stdout and in out/false_alarms/).
#
#   fastpath-suite audit false-alarms N [--busy K] [--avx2 K] [--ref REV] [--reuse-venv] [--results DIR]
#
#   --busy K      the last K runs with one core kept busy by another process (a shell busy loop)
#   --avx2 K      the first K runs with the AVX2 settings (docs/machines.md): ATEN_CPU_CAPABILITY=avx2
#                 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2, and MKL_ENABLE_INSTRUCTIONS=AVX2 too with
#                 FASTPATH_FA_MKL_AVX2=1 (on an Intel processor that cap makes results history-dependent: docs/machines.md)
#   --ref REV     clone this commit instead of HEAD (work can go on in the checkout meanwhile)
#   --reuse-venv  link this checkout's .venv into each clone instead of making a new one; scripts/install.sh still
#                 runs there (pip finds everything installed, then installs the clone's package). Caches (.cache/,
#                 the built checkpoints) stay cold either way.
#   --results DIR also write a "false-alarms" results file into DIR (e.g. results/; `fastpath-suite maintain results`
#                 renders it) from the files each run leaves in out/false_alarms/: run<i>.xml (pytest's junit
#                 report) and run<i>.json (settings, wall and install seconds, exit status, commit)
set -euo pipefail
caller=$(pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)
usage="usage: fastpath-suite audit false-alarms N [--busy K] [--avx2 K] [--ref REV] [--reuse-venv] [--results DIR]"
n=${1:?$usage}
shift
busy=0; avx2=0; reuse=0; ref=HEAD; results=""; results_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --busy) busy=$2; shift 2 ;;
    --avx2) avx2=$2; shift 2 ;;
    --ref) ref=$2; shift 2 ;;
    --reuse-venv) reuse=1; shift ;;
    --results) results=$2; results_arg=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -n "$results" ]; then
  case "$results" in /*) ;; *) results=$caller/$results ;; esac  # relative to where the command was given
  [ -x "$repo/.venv/bin/python" ] || { echo "--results needs $repo/.venv (bash scripts/install.sh)" >&2; exit 2; }
fi
out=$repo/out/false_alarms
mkdir -p "$out"
commit=$(git rev-parse --short "$ref")
full_commit=$(git rev-parse "$ref")
invocation="$(date -u +%Y%m%dT%H%M%SZ)-$$"  # ties each run<i>.json to this call of the script
command_line="fastpath-suite audit false-alarms $n --busy $busy --avx2 $avx2 --ref $commit"
if [ "${FASTPATH_FA_MKL_AVX2:-0}" = 1 ]; then command_line="FASTPATH_FA_MKL_AVX2=1 $command_line"; fi
if [ $reuse = 1 ]; then command_line="$command_line --reuse-venv"; fi
if [ -n "$results_arg" ]; then command_line="$command_line --results $(printf %q "$results_arg")"; fi
work=$(mktemp -d /tmp/fastpath-fa.XXXXXX)
table=$out/table.md
{
  echo "Default suite, $n runs on fresh clones of $commit ($(date -u +%Y-%m-%d)), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "Command: $command_line"
  echo
  echo "| run | settings | wall s (install + pytest) | passed | failed | skipped | failed tests |"
  echo "|---|---|---|---|---|---|---|"
} > "$table"
for i in $(seq 1 "$n"); do
  clone=$work/run$i
  git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$commit"
  [ $reuse = 1 ] && ln -s "$repo/.venv" "$clone/.venv"
  settings="plain"; envs=()
  if [ "$i" -le "$avx2" ]; then
    settings="AVX2 (emulated: torch, oneDNN, CTranslate2 capped)"
    envs=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2)
    if [ "${FASTPATH_FA_MKL_AVX2:-0}" = 1 ]; then settings="$settings + MKL capped"; envs+=(MKL_ENABLE_INSTRUCTIONS=AVX2); fi
  fi
  hog=""
  if [ "$i" -gt $((n - busy)) ]; then
    settings="$settings, one core busy"
    (while :; do :; done) & hog=$!
  fi
  rm -f "$out/run$i.xml" "$out/run$i.json" "$out/run$i.installed"  # never count an earlier call's report
  start=$(date +%s)
  set +e
  (cd "$clone" && env "${envs[@]}" bash -c "bash scripts/install.sh && date +%s > $out/run$i.installed && .venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=$out/run$i.xml") > "$out/run$i.log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  installed=$(cat "$out/run$i.installed" 2>/dev/null || echo "$end")
  wall="$((end - start)) ($((installed - start)) + $((end - installed)))"
  python3 - "$out/run$i.json" "$i" "$n" "$settings" "$rc" "$start" "$installed" "$end" "$full_commit" "$invocation" \
    "$([ "$i" -le "$avx2" ] && echo 1 || echo 0)" "$([ -n "$hog" ] && echo 1 || echo 0)" "${envs[@]}" <<'EOF'
import json, sys
path, i, n, settings, rc, start, installed, end, commit, invocation, avx2, busy, *envs = sys.argv[1:]
start, installed, end = int(start), int(installed), int(end)
with open(path, "w") as f:
    json.dump({"run": int(i), "runs": int(n), "settings": settings, "env": envs, "avx2": avx2 == "1",
               "one_core_busy": busy == "1", "exit_code": int(rc), "wall_s": end - start,
               "install_s": installed - start, "pytest_s": end - installed, "commit": commit,
               "invocation": invocation}, f, indent=1)
EOF
  [ -n "$hog" ] && kill "$hog" 2>/dev/null && wait "$hog" 2>/dev/null || true
  counts=$(python3 - "$out/run$i.xml" "$rc" <<'EOF'
import sys, xml.etree.ElementTree as ET
path, rc = sys.argv[1], sys.argv[2]
try:
    cases = list(ET.parse(path).iter("testcase"))
except (OSError, ET.ParseError):
    print(f"- | - | - | no report (exit {rc}): see the run's log"); sys.exit()
failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases if c.find("failure") is not None or c.find("error") is not None]
skipped = sum(c.find("skipped") is not None for c in cases)
print(f"{len(cases) - len(failed) - skipped} | {len(failed)} | {skipped} | {', '.join(failed) or '-'}")
EOF
)
  echo "| $i | $settings | $wall | $counts |" >> "$table"
  tail -1 "$table"
  rm -rf "$clone"
done
rmdir "$work" 2>/dev/null || true
python3 - "$out" "$n" >> "$table" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
per_test = collections.Counter()
for i in range(1, n + 1):
    try:
        cases = ET.parse(out / f"run{i}.xml").iter("testcase")
    except (OSError, ET.ParseError):
        continue
    per_test.update(f"{c.get('classname')}::{c.get('name')}" for c in cases
                    if c.find("failure") is not None or c.find("error") is not None)
print(f"\nFailures per test over {n} runs: " + ("none" if not per_test else
      "; ".join(f"{t}: {k}/{n}" for t, k in per_test.most_common())))
EOF
echo
cat "$table"
if [ -n "$results" ]; then
  PYTHONPATH=$repo "$repo/.venv/bin/python" -m harness.audit.false_alarms --out "$out" --results "$results" --runs "$n" \
    --command "$command_line"
fi
