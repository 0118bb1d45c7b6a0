#!/usr/bin/env bash
# False-alarm figure of the default suite: runs the README's test command N times, each on a fresh clone of this
# checkout's HEAD with cold caches, and tabulates failures per test (markdown on stdout and in out/false_alarms/).
#
#   bash scripts/false_alarms.sh N [--busy K] [--avx2 K] [--ref REV] [--reuse-venv]
#
#   --busy K      the last K runs with one core kept busy by another process (a shell busy loop)
#   --avx2 K      the first K runs with the AVX2 settings (README, "Machines differ"): ATEN_CPU_CAPABILITY=avx2
#                 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2, and MKL_ENABLE_INSTRUCTIONS=AVX2 too with
#                 FASTPATH_FA_MKL_AVX2=1 (on an Intel processor that cap makes results history-dependent: README)
#   --ref REV     clone this commit instead of HEAD (work can go on in the checkout meanwhile)
#   --reuse-venv  link this checkout's .venv into each clone instead of making a new one; scripts/install.sh still
#                 runs there (pip finds everything installed, then installs the clone's package). Caches (.cache/,
#                 the built checkpoints) stay cold either way.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
n=${1:?usage: bash scripts/false_alarms.sh N [--busy K] [--avx2 K] [--ref REV] [--reuse-venv]}
shift
busy=0; avx2=0; reuse=0; ref=HEAD
while [ $# -gt 0 ]; do
  case "$1" in
    --busy) busy=$2; shift 2 ;;
    --avx2) avx2=$2; shift 2 ;;
    --ref) ref=$2; shift 2 ;;
    --reuse-venv) reuse=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
out=$repo/out/false_alarms
mkdir -p "$out"
commit=$(git rev-parse --short "$ref")
work=$(mktemp -d /tmp/fastpath-fa.XXXXXX)
table=$out/table.md
{
  echo "Default suite, $n runs on fresh clones of $commit ($(date -u +%Y-%m-%d)), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "Command: bash scripts/false_alarms.sh $n --busy $busy --avx2 $avx2 --ref $commit$([ $reuse = 1 ] && echo ' --reuse-venv')"
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
  start=$(date +%s)
  set +e
  (cd "$clone" && env "${envs[@]}" bash -c "bash scripts/install.sh && date +%s > $out/run$i.installed && .venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=$out/run$i.xml") > "$out/run$i.log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  installed=$(cat "$out/run$i.installed" 2>/dev/null || echo "$end")
  wall="$((end - start)) ($((installed - start)) + $((end - installed)))"
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
