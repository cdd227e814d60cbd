#!/usr/bin/env bash
# The LLM experiments of results/llm/README.md, as a resumable queue.
#
#   scripts/llm_experiments.sh [LANES]      (default 2 lanes, one thread each)
#
# Each lane takes the next run from the list below. A run whose folder has a
# checkpoint is resumed (`--resume`, same metrics as an uninterrupted run);
# a finished run (its folder has a non-empty eval.jsonl: the final held-out
# evaluation; the file is created empty at the start) is skipped; anything else is
# started afresh. Checkpoints are written every iteration so stopping the
# lanes loses at most one iteration per lane; a finished run's checkpoint
# (1.6 GB) is deleted, since results/ keeps only logs. Kill the lanes with
# `pkill -f llm_experiments.sh; pkill -f "llm train"`.
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${1:-2}
bin=${R2VPO:-target/release/r2vpo}
out=${OUT:-runs/llm2}
config=configs/llm/smollm2-arith.toml
runs=(
  "r2vpo-off-seed0|--algo r2vpo-off --seed 0"
  "grpo-seed0|--algo grpo --seed 0"
  "grpo-ch-seed0|--algo grpo-ch --seed 0"
  "r2vpo-on-seed0|--algo r2vpo-on --seed 0"
  "r2vpo-off-seed1|--algo r2vpo-off --seed 1"
  "grpo-seed1|--algo grpo --seed 1"
  "grpo-ch-seed1|--algo grpo-ch --seed 1"
  "r2vpo-on-seed1|--algo r2vpo-on --seed 1"
  # Staleness ablation: the same replay loop for GRPO's clip and R²VPO's
  # penalty, buffer capacity 2 / 4 / 8 iterations (R²VPO-OFF at 4 is above).
  "grpo-off-rb8-seed0|--algo grpo-off --seed 0 --set replay.capacity_iters=8"
  "r2vpo-off-rb8-seed0|--algo r2vpo-off --seed 0 --set replay.capacity_iters=8"
  "grpo-off-rb2-seed0|--algo grpo-off --seed 0 --set replay.capacity_iters=2"
  "r2vpo-off-rb2-seed0|--algo r2vpo-off --seed 0 --set replay.capacity_iters=2"
  "grpo-off-rb4-seed0|--algo grpo-off --seed 0 --set replay.capacity_iters=4"
  # Deviation from the paper: R²VPO-OFF with λ capped at the paper's fixed
  # value 0.04 (its adaptive λ ratchets up on stale-ratio spikes otherwise).
  "r2vpo-off-rb8-lmax0.04-seed0|--algo r2vpo-off --seed 0 --set replay.capacity_iters=8 --set dual.lambda_max=0.04"
  "r2vpo-off-lmax0.04-seed0|--algo r2vpo-off --seed 0 --set dual.lambda_max=0.04"
  "r2vpo-off-lmax0.04-seed1|--algo r2vpo-off --seed 1 --set dual.lambda_max=0.04"
  "r2vpo-off-rb2-lmax0.04-seed0|--algo r2vpo-off --seed 0 --set replay.capacity_iters=2 --set dual.lambda_max=0.04"
)
mkdir -p "$out"
queue="$out/.queue"
printf '%s\n' "${runs[@]}" > "$queue"

lane() {
  while true; do
    local job
    job=$(flock "$queue.lock" bash -c 'l=$(head -n1 "$1"); [ -n "$l" ] && sed -i 1d "$1"; echo "$l"' _ "$queue")
    [ -z "$job" ] && return
    local name=${job%%|*} args=${job#*|}
    local dir="$out/$name"
    if [ -s "$dir/eval.jsonl" ]; then
      continue
    elif [ -e "$dir/checkpoints/latest" ]; then
      echo "$(date +%T) resume $name"
      "$bin" --threads 1 llm train --resume "$dir" --no-export >> "$dir.log" 2>&1
    else
      echo "$(date +%T) start $name"
      rm -rf "$dir"
      # shellcheck disable=SC2086
      "$bin" --threads 1 llm train --config "$config" $args --set checkpoint_every=1 \
        --out "$dir" --no-export >> "$dir.log" 2>&1
    fi
    [ -s "$dir/eval.jsonl" ] && rm -rf "$dir/checkpoints"
    echo "$(date +%T) end $name"
  done
}

for _ in $(seq "$lanes"); do
  lane &
  sleep 2
done
wait
