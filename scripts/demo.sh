#!/usr/bin/env bash
# `make demo`: runs what r2vpo can do today on the embedded defaults and says
# where every output went. Outputs go to runs/demo/ (git-ignored).
set -euo pipefail
BIN=${1:-target/release/r2vpo}
OUT=runs/demo
mkdir -p "$OUT"

echo "== 1/4  The embedded default model (SmolLM2-135M-Instruct, GGUF from make deps)"
"$BIN" llm info | tee "$OUT/smollm2-info.json"

echo
echo "== 2/4  R²VPO vs GRPO on the synthetic sequence bandit (core algorithm end to end, on- and off-policy)"
"$BIN" toy compare --algos grpo,grpo-ch,r2vpo-on,grpo-off,r2vpo-off --seeds 0,1 --out "$OUT/toy"

echo
echo "== 3/4  Theory: f-divergence ≈ ½·f''(1)·Var[ρ] (Proposition 3.1, Table 1, Figure 2)"
"$BIN" analyze divergence --out "$OUT/theory"

echo
echo "== 4/4  Theory: clipping error ≤ (A_max/ε)·E[(ρ−1)²] (Theorem 3.3)"
"$BIN" analyze clip-bound --out "$OUT/theory"

echo
echo "demo outputs:"
find "$OUT" -maxdepth 2 \( -name '*.png' -o -name '*.md' -o -name '*.csv' \) | sort | sed 's/^/  /'
