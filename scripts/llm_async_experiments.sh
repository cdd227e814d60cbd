#!/usr/bin/env bash
# The asynchronous actor–learner runs of results/llm/async/ (README
# "Asynchronous actor–learner"): R²VPO-OFF vs GRPO-off, `llm train --async`
# with 2 actor threads at actors.max_staleness 1 and 4, seeds 0 and 1.
#
#   scripts/llm_async_experiments.sh
#
# Small settings (about 6 minutes a run on a 2-core machine): the embedded
# default config (configs/llm/smollm2-arith.toml) with 6 iterations, 48 new
# tokens and a 30-problem held-out evaluation. One run at
# a time (the learner and both actors share the cores). A run whose folder
# has a checkpoint is resumed, a finished one (non-empty eval.jsonl) skipped;
# a finished run's checkpoint is deleted (results/ keeps only logs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${R2VPO:-target/release/r2vpo}
out=${OUT:-runs/llm-async}
config=configs/llm/smollm2-arith.toml
small=(--set iterations=6 --set sampling.max_new_tokens=48 --set eval.sampling.max_new_tokens=48
  --set eval.data.count=30 --set checkpoint_every=1 --set histogram_every=1)
runs=(
  "r2vpo-off-s1-seed0|--algo r2vpo-off --seed 0 --set actors.max_staleness=1"
  "grpo-off-s1-seed0|--algo grpo-off --seed 0 --set actors.max_staleness=1"
  "r2vpo-off-s4-seed0|--algo r2vpo-off --seed 0 --set actors.max_staleness=4"
  "grpo-off-s4-seed0|--algo grpo-off --seed 0 --set actors.max_staleness=4"
  "r2vpo-off-s1-seed1|--algo r2vpo-off --seed 1 --set actors.max_staleness=1"
  "grpo-off-s1-seed1|--algo grpo-off --seed 1 --set actors.max_staleness=1"
  "r2vpo-off-s4-seed1|--algo r2vpo-off --seed 1 --set actors.max_staleness=4"
  "grpo-off-s4-seed1|--algo grpo-off --seed 1 --set actors.max_staleness=4"
)
mkdir -p "$out"
for job in "${runs[@]}"; do
  name=${job%%|*} args=${job#*|}
  dir="$out/$name"
  if [ -s "$dir/eval.jsonl" ]; then
    continue
  elif [ -e "$dir/checkpoints/latest" ]; then
    echo "$(date +%T) resume $name"
    "$bin" llm train --resume "$dir" --no-export >> "$dir.log" 2>&1
  else
    echo "$(date +%T) start $name"
    rm -rf "$dir"
    # shellcheck disable=SC2086
    "$bin" llm train --config "$config" $args --async --set actors.count=2 "${small[@]}" \
      --out "$dir" --no-export >> "$dir.log" 2>&1
  fi
  [ -s "$dir/eval.jsonl" ] && rm -rf "$dir/checkpoints"
  echo "$(date +%T) end $name"
done
