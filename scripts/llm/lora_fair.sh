#!/usr/bin/env bash
# The pre-registered comparison of LoRA and full fine-tuning
# (results/llm/lora-fair/README.md): a learning-rate sweep of both methods
# evaluated on a validation split disjoint from the held-out problems, each
# method's rate picked there by scripts/llm/lora_fair.py, then three seeds of
# each at its pick evaluated on the held-out problems.
#
#   scripts/llm/lora_fair.sh            # everything, or whatever is left
#
# Resumable: a run with an eval.jsonl is done and skipped, one with a
# checkpoint resumes (`llm train --resume`), one without starts again. Runs
# already collected into results/llm/lora-fair/ (committed as each pair
# finishes, so a new machine does not run them again) are copied back
# first: the picks and the report read only their config.toml and
# eval.jsonl. Runs go two at a time with one thread each (the 2-core
# machine's cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${R2VPO:-target/release/r2vpo}
root=${ROOT:-runs/llm/lora-fair}
lora=configs/llm/smollm2-arith-lora.toml
full=configs/llm/smollm2-arith.toml
# Validation: the 100 arith-eval problems after the held-out 100.
val=(--set eval.data.count=200 --set eval.data.skip=100)

# run OUT CONFIG SEED LR [--set ...]
run() {
  local out=$1 cfg=$2 seed=$3 lr=$4
  shift 4
  if [ -s "$out/eval.jsonl" ]; then
    echo "done already: $out"
  elif [ -f "$out/checkpoints/latest" ]; then
    "$bin" --threads 1 llm train --resume "$out" --no-export --quiet
  else
    rm -rf "$out"
    "$bin" --threads 1 llm train --config "$cfg" --algo r2vpo-on --seed "$seed" \
      --set "optim.lr=$lr" "$@" --out "$out" --no-export --quiet
  fi
}

pair() {
  run "$@" > "$root/log-$(basename "$1").txt" 2>&1 &
}

mkdir -p "$root"
date -u
for done in results/llm/lora-fair/{sweep,final}/*/eval.jsonl; do
  [ -s "$done" ] || continue
  src=$(dirname "$done") phase=$(basename "$(dirname "$(dirname "$done")")")
  out="$root/$phase/$(basename "$src")"
  if [ ! -s "$out/eval.jsonl" ]; then
    mkdir -p "$out" && cp "$src"/{config.toml,metrics.jsonl,eval.jsonl} "$out/"
    echo "collected already: $out"
  fi
done
# 1. The sweep, seed 0, on validation: each method's rate and 4× either side.
for k in 0 1 2; do
  lr_lora=(5e-5 2e-4 8e-4); lr_full=(5e-6 2e-5 8e-5)
  pair "$root/sweep/lora-lr${lr_lora[k]}" "$lora" 0 "${lr_lora[k]}" "${val[@]}"
  pair "$root/sweep/full-lr${lr_full[k]}" "$full" 0 "${lr_full[k]}" "${val[@]}"
  wait
done
# 2. A pick on the grid's edge extends the grid by one more 4× step there.
for ext in $(python3 scripts/llm/lora_fair.py extend "$root"); do
  method=${ext%%:*} lr=${ext#*:}
  cfg=$lora; [ "$method" = full ] && cfg=$full
  pair "$root/sweep/$method-lr$lr" "$cfg" 0 "$lr" "${val[@]}"
done
wait
picks=$(python3 scripts/llm/lora_fair.py pick "$root")
read -r pick_lora pick_full <<< "$picks"
echo "picked on validation: LoRA lr $pick_lora, full fine-tuning lr $pick_full"
# 3. Seeds 0, 1, 2 of each at its pick, on the held-out problems.
for s in 0 1 2; do
  pair "$root/final/lora-seed$s" "$lora" "$s" "$pick_lora"
  pair "$root/final/full-seed$s" "$full" "$s" "$pick_full"
  wait
done
date -u
python3 scripts/llm/lora_fair.py report "$root"
