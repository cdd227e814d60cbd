#!/usr/bin/env bash
# CPU speed and memory side by side (#16): r2vpo against PyTorch +
# transformers on this machine, in one run, with the ratios printed.
#   decode: `r2vpo bench llm` (SmolLM2 GGUF dequantised to f32, sampling at
#           T = 1) vs transformers' greedy `generate` on the same shape,
#           batch 1/8/32, 128 new tokens, EOS ignored;
#   step:   forward + R²VPO objective + backward + AdamW at 8 × (44 + 256)
#           tokens: `r2vpo bench step` vs scripts/gpu/torch_step.py on the
#           CPU, the two taking turns step by step (scripts/hf/turns.py);
#           peak RSS by /usr/bin/time; then r2vpo's checkpointed step alone;
#   score:  the no-grad log-probs of the same batch (`bench step --score`
#           vs `torch_step.py --score`), taking turns as well;
#   limit:  PyTorch's f32 GEMM rate on the same threads (scripts/hf/peak.py),
#           which the batch-32 decode's and the scoring pass's shares divide by.
# Needs the release binary and the pinned venv (`make venv-hf`).
# Usage: scripts/hf/compare.sh [OUT_DIR]
#   default OUT_DIR: runs/bench/hf-compare/<YYYY-MM-DD>-<machine>, the machine
#   named from lscpu: its model name's first two words and its widest SIMD
#   (e.g. 2026-11-27-amd-epyc-avx2, 2026-11-26-intel-xeon-avx512-amx). To
#   commit a run, move it to results/bench/hf-compare/ under that name and
#   `git rm` the earlier run of the same machine there (results/bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
machine() {
    local model flags isa=generic
    model=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | sed 's/([^)]*)//g' | tr '[:upper:]' '[:lower:]' |
        tr -c 'a-z0-9\n' ' ' | awk 'NR == 1 { print ($2 == "" ? $1 : $1 "-" $2) }')
    flags=" $(lscpu | sed -n 's/^Flags:[[:space:]]*//p') "
    case "$flags" in *" avx2 "*) isa=avx2 ;; esac
    case "$flags" in *" avx512f "*) isa=avx512 ;; esac
    case "$flags" in *" amx_tile "*) isa=$isa-amx ;; esac
    echo "${model:-cpu}-$isa"
}
OUT=${1:-runs/bench/hf-compare/$(date +%F)-$(machine)}
PY=${HF_PY:-.deps/venv-hf/bin/python}
BIN=${R2VPO_BIN:-target/release/r2vpo}
T=${THREADS:-2}
export RAYON_NUM_THREADS=$T OMP_NUM_THREADS=$T
SHAPE=configs/shapes/smollm2-135m.json
[ -x "$PY" ] || { echo "compare: $PY not found: run make venv-hf" >&2; exit 1; }
[ -x "$BIN" ] || { echo "compare: $BIN not found: run make build" >&2; exit 1; }
mkdir -p "$OUT"
# Which CPU the figures are from (the summary names it): the kernels, and
# so the ratios, differ between CPUs with and without AVX-512 and AMX.
lscpu > "$OUT/lscpu.txt"
step=(--shape "$SHAPE" --batch 8 --prompt 44 --response 256)
# Timed pairs of the step and of the scoring pass (each side's steps).
STEP_PAIRS=${STEP_PAIRS:-5}
SCORE_PAIRS=${SCORE_PAIRS:-7}
q() { printf '%q ' "$@"; }

# The f32 limit the decode and scoring shares divide by (#16: "say how you
# computed the limit"): PyTorch's 2048³ GEMM on the same threads, measured
# before the first round and after the last; the summary takes the best.
echo "== f32 GEMM limit, $T threads"
"$PY" scripts/hf/peak.py --threads "$T" --out "$OUT/peak-1.json"
echo "== decode, batch 1/8/32, 128 new tokens, $T threads, two rounds in turn"
# Two rounds, r2vpo then transformers each time: the machine's speed drifts
# by 10-20 % over minutes, and the summary takes each round's ratio.
for round in 1 2; do
    "$BIN" bench llm --batches 1,8,32 --new-tokens 128 --train-batch 0 --out "$OUT/r2vpo-decode-$round.json"
    "$PY" scripts/hf/decode.py --shape "$SHAPE" --batches 1,8,32 --new-tokens 128 --threads "$T" \
        --out "$OUT/hf-decode-$round.json"
done
# Step and scoring pass with r2vpo and PyTorch resident at once and taking
# turns, step by step (A, B, B, A, …, a second of idle machine before each):
# the machine's speed drifts by 10-15 % within minutes and PyTorch's CPU
# step times moved by up to 40 % between runs, so each pair's ratio is taken
# between steps seconds apart, and the summary judges the median pair.
echo "== training step, 8 × (44 + 256) tokens, $STEP_PAIRS pairs taking turns"
python3 scripts/hf/turns.py --log "$OUT/turns-step.json" \
    "$(q /usr/bin/time -f %M -o "$OUT/r2vpo-step.maxrss" "$BIN" bench step "${step[@]}" --reps "$STEP_PAIRS" \
        --turns '{turns}' --out "$OUT/r2vpo-step.json")" \
    "$(q /usr/bin/time -f %M -o "$OUT/hf-step.maxrss" "$PY" scripts/gpu/torch_step.py "${step[@]}" --reps "$STEP_PAIRS" \
        --device cpu --dtype f32 --turns '{turns}' --out "$OUT/hf-step.json")"
echo "== scoring pass (no-grad log-probs), 8 × (44 + 256) tokens, $SCORE_PAIRS pairs taking turns"
python3 scripts/hf/turns.py --log "$OUT/turns-score.json" \
    "$(q "$BIN" bench step "${step[@]}" --score --reps "$SCORE_PAIRS" --turns '{turns}' --out "$OUT/r2vpo-score.json")" \
    "$(q "$PY" scripts/gpu/torch_step.py "${step[@]}" --score --reps "$SCORE_PAIRS" --device cpu --dtype f32 \
        --turns '{turns}' --out "$OUT/hf-score.json")"
"$PY" scripts/hf/peak.py --threads "$T" --out "$OUT/peak-2.json"
echo "== training step with activation checkpointing (memory), once"
/usr/bin/time -f %M -o "$OUT/r2vpo-ck-step.maxrss" "$BIN" bench step "${step[@]}" --reps 2 --checkpoint \
    --out "$OUT/r2vpo-ck-step.json"
python3 scripts/hf/summary.py "$OUT"
