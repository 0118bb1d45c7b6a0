#!/usr/bin/env bash
# CPU speed over the whole grid of fixtures/points.json (speed): stock, the public omnivoice-fastpath 0.1.0 and
# the lossless stack, interleaved, full-size test checkpoint, CPU fp32, with the FLOP bound. One bench run per
# point (a crash loses one point), JSON and the printed tables under out/speed_grid/<tag>/.
#
#   bash scripts/cpu_speed_grid.sh [--avx2] [--rounds N] [--steps S] [POINT ...]
#
#   --avx2     the AVX2-only settings of the README ("Machines differ"): ATEN_CPU_CAPABILITY=avx2
#              MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
#   --rounds   interleaved timed rounds per variant after one warm-up each (default 3)
#   --steps    unmasking steps at every point (default 8; every step has the same shapes, so the variants' ratio
#              is the same at any count, less the fixed costs of encoding and decoding, which all variants share)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3; steps=8; tag=native; envs=(); points=()
while [ $# -gt 0 ]; do
  case "$1" in
    --avx2) tag=avx2; envs=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2); shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) points+=("$1"); shift ;;
  esac
done
if [ ${#points[@]} -eq 0 ]; then
  mapfile -t points < <(.venv/bin/python -c "from harness.points import load_points; print('\n'.join(p.name for p in load_points()))")
fi
out=out/speed_grid/$tag
mkdir -p "$out"
for p in "${points[@]}"; do
  echo "== $p ($tag, $(date -u +%H:%M:%S))"
  env "${envs[@]}" .venv/bin/python -m harness.speed.bench --size full --variants stock peer lossless --bound \
    --rounds "$rounds" --num-step "$steps" --points "$p" --out "$out/$p.json" | tee "$out/$p.md"
done
.venv/bin/python - "$out" "$steps" <<'PY'
import json, statistics, sys
from pathlib import Path
out, steps = Path(sys.argv[1]), sys.argv[2]
rows = [f"| point, {steps} steps | stock RTF | omnivoice-fastpath 0.1.0 RTF | fastpath RTF | fastpath vs stock | vs 0.1.0 | 0.1.0 vs stock "
        "| FLOP bound | efficiency |", "|---|---|---|---|---|---|---|---|---|"]
for f in sorted(out.glob("*.json")):
    d = json.loads(f.read_text())
    for point, r in d["results"].items():
        med = {v.split("@")[0]: statistics.median(s["rtf"]) for v, s in r.items()}  # as measure.Samples.median
        fl = {v.split("@")[0]: n for v, n in d["flops"][point].items()}
        bound = fl["stock"] / fl["lossless"]
        rows.append(f"| {point} | {med['stock']:.3f} | {med['peer']:.3f} | {med['lossless']:.3f} | "
                    f"{med['stock'] / med['lossless']:.2f}x | {med['peer'] / med['lossless']:.2f}x | "
                    f"{med['stock'] / med['peer']:.2f}x | {bound:.2f}x | {med['stock'] / med['lossless'] / bound:.2f} |")
(out / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
