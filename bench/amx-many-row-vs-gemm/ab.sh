#!/usr/bin/env bash
# One binary, many-row products on AMX (default) or gemm (R2VPO_MATMUL=gemm),
# alternating; each line is one process's median pass time (s).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAYON_NUM_THREADS=2
S=(bench step --shape configs/shapes/smollm2-135m.json --batch 8 --prompt 44 --response 256)
t() { "$@" 2>&1 | grep -A2 "step s" | tail -1 | cut -d'|' -f2 | tr -d ' '; }
for i in 1 2 3 4; do
  echo "score gemm $(R2VPO_MATMUL=gemm t target/release/r2vpo "${S[@]}" --reps 3 --score --out /tmp/ab.json)  amx $(t target/release/r2vpo "${S[@]}" --reps 3 --score --out /tmp/ab.json)"
done
for i in 1 2 3; do
  echo "step gemm $(R2VPO_MATMUL=gemm t target/release/r2vpo "${S[@]}" --reps 1 --out /tmp/ab.json)  amx $(t target/release/r2vpo "${S[@]}" --reps 1 --out /tmp/ab.json)"
done
