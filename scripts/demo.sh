#!/usr/bin/env bash
# `make demo`: runs what r2vpo can do today on the embedded defaults and says
# where every output went. Outputs go to runs/demo/ (git-ignored).
set -euo pipefail
BIN=${1:-target/release/r2vpo}
OUT=runs/demo
mkdir -p "$OUT"

echo "== 1/6  The embedded default model (SmolLM2-135M-Instruct, GGUF from make deps)"
"$BIN" llm info | tee "$OUT/smollm2-info.json"

echo
echo "== 2/6  The main job: R²VPO-ON fine-tuning SmolLM2-135M-Instruct on built-in arithmetic (3 iterations of 4 prompts × 8 samples)"
rm -rf "$OUT/llm-r2vpo-on"
"$BIN" llm train --config configs/llm/smollm2-arith.toml --algo r2vpo-on --seed 0 --out "$OUT/llm-r2vpo-on" \
  --set iterations=3 --set eval_at_end=false --set sampling.max_new_tokens=64 --no-export

echo
echo "== 3/6  R²VPO vs GRPO on the synthetic sequence bandit (core algorithm end to end, on- and off-policy)"
"$BIN" toy compare --algos grpo,grpo-ch,r2vpo-on,grpo-off,r2vpo-off --seeds 0,1 --out "$OUT/toy" --overwrite

echo
echo "== 4/6  PPO vs R²VPO (fixed λ = 0.06) on DeepMind Control cartpole-swingup, real MuJoCo physics, 2 seeds × 200k steps"
"$BIN" control compare --tasks cartpole-swingup --algos ppo,r2vpo --seeds 0,1 --set total_env_steps=204800 --out "$OUT/control"
echo "   ... and one episode of the trained R²VPO policy filmed (MuJoCo's renderer, offscreen; H.264 MP4)"
"$BIN" control eval --run "$OUT/control/cartpole-swingup/r2vpo-seed0" --episodes 1 --video "$OUT/control/videos"

echo
echo "== 5/6  Theory: f-divergence ≈ ½·f''(1)·Var[ρ] (Proposition 3.1, Table 1, Figure 2)"
"$BIN" analyze divergence --out "$OUT/theory"

echo
echo "== 6/6  Theory: clipping error ≤ (A_max/ε)·E[(ρ−1)²] (Theorem 3.3)"
"$BIN" analyze clip-bound --out "$OUT/theory"

echo
echo "demo outputs:"
find "$OUT" -maxdepth 3 \( -name '*.png' -o -name '*.md' -o -name '*.csv' -o -name '*.mp4' \) | sort | sed 's/^/  /'
