#!/usr/bin/env bash
# The GPU learner's check, run on the GPU machine (README "GPU learner"):
#   1. correctness: CUDA log-probs and gradients against the CPU's on the
#      tiny Qwen3-shaped model (f32 must be within 1e-4 relative; bf16
#      mixed precision is reported);
#   2. speed and memory: one training step of a Qwen3-1.7B-shaped model,
#      r2vpo (`bench step`) and PyTorch + transformers (torch_step.py) on the
#      same device, shape, batch and objective, measured one after the other
#      in this run; peak GPU memory of each process sampled by nvidia-smi;
#   3. one JSON + Markdown table in $OUT (default results/gpu).
#
# Usage:   scripts/gpu/check.sh             on the GPU machine, after
#                                           carrying dist/gpu there (from
#                                           `make build-gpu`)
#          scripts/gpu/check.sh --dry-run   here: the CPU parts (the same
#                                           commands on device cpu, tiny
#                                           shapes, target/release/r2vpo)
# Env:     R2VPO_BIN, TORCH_PY (default /opt/torch/.venv/bin/python), OUT,
#          SHAPE, BATCH, PROMPT, RESPONSE, REPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMPOSITE=

dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
OUT=${OUT:-results/gpu}
REPS=${REPS:-3}
if [ $dry = 1 ]; then
    BIN=${R2VPO_BIN:-target/release/r2vpo}
    DEV=cpu
    SHAPE=${SHAPE:-configs/shapes/qwen3-tiny.json}
    BATCH=${BATCH:-2} PROMPT=${PROMPT:-16} RESPONSE=${RESPONSE:-48}
    OUT=${OUT_DRY:-runs/gpu-dry-run}
    TORCH_PY=${TORCH_PY:-python3}
    # The fused CPU kernels off: the CPU runs the ops a CUDA device runs.
    COMPOSITE=--composite
else
    BIN=${R2VPO_BIN:-dist/gpu/r2vpo}
    if [ ! -x "$BIN" ] && [ -f dist/gpu/r2vpo.xz ]; then
        # Carried compressed (the raw binary is above the 64 MiB carry limit).
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            dist/gpu/r2vpo.xz "$BIN.tmp"
        chmod +x "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
    fi
    DEV=cuda
    SHAPE=${SHAPE:-configs/shapes/qwen3-1.7b.json}
    # 4 × 1024 tokens: fits both stacks without gradient checkpointing.
    BATCH=${BATCH:-4} PROMPT=${PROMPT:-256} RESPONSE=${RESPONSE:-768}
    TORCH_PY=${TORCH_PY:-/opt/torch/.venv/bin/python}
fi
[ -x "$BIN" ] || { echo "check: $BIN not found (make build-gpu here, then carry it; or set R2VPO_BIN)" >&2; exit 1; }
mkdir -p "$OUT"

# The binary links libcudart/libcublas/libcurand/libnvrtc (CUDA 13): use
# the ones in the machine's torch venv, whose versions match the driver.
if [ $dry = 0 ]; then
    site=$("$TORCH_PY" -c 'import site; print(site.getsitepackages()[0])')
    libs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | paste -sd: -)
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
    nvcc --version 2>/dev/null | tail -1 | tee -a "$OUT/device.txt" || true
    "$TORCH_PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' | tee -a "$OUT/device.txt"
fi

# Runs a command, sampling its GPU memory every 0.1 s; prints the peak MiB
# to $2 (empty where there is no nvidia-smi, as in the dry run).
with_peak() {
    local peakfile=$1; shift
    "$@" &
    local pid=$! peak=0 m
    if command -v nvidia-smi >/dev/null; then
        while kill -0 $pid 2>/dev/null; do
            m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
                | awk -F', ' -v p=$pid '$1 == p {print $2}')
            [ -n "$m" ] && [ "$m" -gt "$peak" ] && peak=$m
            sleep 0.1
        done
        echo "$peak" > "$peakfile"
    else
        : > "$peakfile"
    fi
    wait $pid
}

echo "== 1. correctness: $DEV vs cpu on configs/shapes/qwen3-tiny.json"
"$BIN" bench step --shape configs/shapes/qwen3-tiny.json --device $DEV $COMPOSITE --dtype f32 --check --tolerance 1e-4 \
    --batch 2 --prompt 16 --response 48 --out "$OUT/check-f32.json"
# Mixed precision (bf16 compute, f32 master weights and logits): reported,
# not gated (--tolerance inf); bf16 keeps 8 bits of mantissa.
"$BIN" bench step --shape configs/shapes/qwen3-tiny.json --device $DEV $COMPOSITE --dtype bf16 --check --tolerance inf \
    --batch 2 --prompt 16 --response 48 --out "$OUT/check-bf16.json"

dtype=bf16
[ $dry = 1 ] && dtype=f32   # bf16 is 2.7x slower than f32 on a CPU in candle
echo "== 2. training step: $SHAPE, $DEV $dtype, $BATCH × ($PROMPT + $RESPONSE) tokens"
with_peak "$OUT/r2vpo-peak-mib" "$BIN" bench step --shape "$SHAPE" --device $DEV --dtype $dtype \
    --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" --out "$OUT/r2vpo-step.json"
if "$TORCH_PY" -c 'import torch, transformers' 2>/dev/null; then
    with_peak "$OUT/torch-peak-mib" "$TORCH_PY" scripts/gpu/torch_step.py --shape "$SHAPE" --device $DEV \
        --dtype $dtype --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" \
        --out "$OUT/torch-step.json"
else
    echo "check: $TORCH_PY has no torch/transformers: the PyTorch step is skipped" >&2
    rm -f "$OUT/torch-step.json" "$OUT/torch-peak-mib"
fi

# Long rows with gradient checkpointing on both sides (what fits 8k-token
# sequences at all): r2vpo's `--checkpoint`, transformers'
# gradient_checkpointing_enable.
LONG_BATCH=${LONG_BATCH:-2} LONG_RESPONSE=${LONG_RESPONSE:-3840}
[ $dry = 1 ] && LONG_BATCH=2 LONG_RESPONSE=112
echo "== 2b. checkpointed step: $SHAPE, $DEV $dtype, $LONG_BATCH × ($PROMPT + $LONG_RESPONSE) tokens"
with_peak "$OUT/r2vpo-ck-peak-mib" "$BIN" bench step --shape "$SHAPE" --device $DEV --dtype $dtype --checkpoint \
    --batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" --reps "$REPS" --out "$OUT/r2vpo-ck-step.json"
if "$TORCH_PY" -c 'import torch, transformers' 2>/dev/null; then
    with_peak "$OUT/torch-ck-peak-mib" "$TORCH_PY" scripts/gpu/torch_step.py --shape "$SHAPE" --device $DEV \
        --dtype $dtype --checkpoint --batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" \
        --reps "$REPS" --out "$OUT/torch-ck-step.json"
fi

echo "== 3. summary"
python3 scripts/gpu/summary.py "$OUT"
