#!/usr/bin/env bash
# The GPU learner's check, run on the GPU machine (docs/gpu.md):
#   1. correctness: CUDA log-probs and gradients against the CPU's on the
#      tiny Qwen3-shaped model (f32 must be within 1e-4 relative; bf16
#      mixed precision is reported);
#      and the torch backend (libtorch through tch-rs) against candle's CPU;
#   2. speed and memory: one training step of a Qwen3-1.7B-shaped model,
#      r2vpo on the torch backend and on candle (`bench step`) and PyTorch +
#      transformers (torch_step.py) on the same device, shape, batch and
#      objective, measured one after the other in this run, plain and
#      checkpointed (2 × 4096 tokens); peak GPU memory of each process
#      sampled by nvidia-smi;
#   3. one `llm train` end to end on the device (a random Qwen3-0.6B-shaped
#      policy, configs/llm/gpu-smoke.toml) on the torch backend and on
#      candle; the torch run again as the distributed learner (a launched
#      job of one rank, NCCL) after NCCL's collectives are checked; and a
#      tiny run checkpointed on the device, resumed on the CPU, then on the
#      device again;
#   4. one JSON + Markdown table in $OUT (default results/gpu).
# Each phase runs under a time limit and a failed one does not stop the
# rest (device time is scarce): $OUT/status.txt has each phase's exit code,
# $OUT/<phase>.log its output, and the script exits non-zero if any failed.
#
# Usage:   scripts/gpu/check.sh             on the GPU machine, after
#                                           carrying dist/gpu there (from
#                                           `make build-gpu`)
#          scripts/gpu/check.sh --dry-run   here: the CPU parts (the same
#                                           commands on device cpu, tiny
#                                           shapes, target/release/r2vpo)
# Env:     R2VPO_BIN, R2VPO_TORCH_BIN (the binary with the torch backend:
#          R2VPO_BIN on the GPU machine, target/torch/release/r2vpo from
#          `make build-torch` in the dry run), TORCH_PY (default
#          /opt/torch/.venv/bin/python), OUT, SHAPE, BATCH, PROMPT, RESPONSE,
#          REPS, ONLY (phase names to run, e.g.
#          ONLY="r2vpo-torch-step torch-step").
set -uo pipefail
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
    TBIN=${R2VPO_TORCH_BIN:-target/torch/release/r2vpo}
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
    TBIN=${R2VPO_TORCH_BIN:-$BIN}
fi
[ -x "$BIN" ] || { echo "check: $BIN not found (make build-gpu here, then carry it; or set R2VPO_BIN)" >&2; exit 1; }
mkdir -p "$OUT"

# The binary links libcudart/libcublas/libcurand/libnvrtc (CUDA 13): use
# the ones in the machine's torch venv, whose versions match the driver.
if [ $dry = 0 ]; then
    site=$("$TORCH_PY" -c 'import site; print(site.getsitepackages()[0])')
    libs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | paste -sd: -)
    # The torch backend loads this machine's libtorch (2.11.0+cu130, the
    # version it was built against).
    export LD_LIBRARY_PATH="$site/torch/lib:${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
    nvcc --version 2>/dev/null | tail -1 | tee -a "$OUT/device.txt" || true
    if ldd "$BIN" | grep "not found"; then echo "check: $BIN misses the libraries above" >&2; fi
    "$TORCH_PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' | tee -a "$OUT/device.txt"
fi

# phase NAME LIMIT_S CMD...: runs CMD under a time limit, its output to the
# terminal and $OUT/NAME.log, and its exit code and seconds to
# $OUT/status.txt. With PEAK=1 it also samples the GPU memory in use every
# 0.1 s (all compute processes: the phases run one at a time) and writes the
# peak MiB to $OUT/NAME-peak-mib, and each process's own peak (a launched
# job's ranks) to $OUT/NAME-peak-per-process-mib (nothing where there is no
# nvidia-smi, as in the dry run).
failed=0
# Nothing of an earlier check is left to be read as this one's.
rm -f "$OUT"/*.json "$OUT"/*.jsonl "$OUT"/*-peak-mib "$OUT"/*.log "$OUT"/summary.md
: > "$OUT/status.txt"
phase() {
    local name=$1 limit=$2; shift 2
    # ONLY="r2vpo-step torch-step ..." runs just those phases (a re-run).
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
    local t0=$SECONDS peak=0 m rc
    timeout "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1 &
    local pid=$!
    if [ "${PEAK:-0}" = 1 ] && command -v nvidia-smi >/dev/null; then
        # Also each process's own peak (a launched job's ranks, one per
        # GPU): "pid mib" lines in NAME-peak-per-process-mib.
        local -A per=()
        local apps p u
        while kill -0 $pid 2>/dev/null; do
            apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null)
            m=$(echo "$apps" | awk -F', *' 'NF == 2 {s += $2} END {print s + 0}')
            [ -n "$m" ] && [ "$m" -gt "$peak" ] && peak=$m
            while IFS=', ' read -r p u; do
                [ -n "$p" ] && [ -n "$u" ] && [ "$u" -gt "${per[$p]:-0}" ] && per[$p]=$u
            done <<< "$apps"
            sleep 0.1
        done
        echo "$peak" > "$OUT/$name-peak-mib"
        for p in "${!per[@]}"; do echo "$p ${per[$p]}"; done > "$OUT/$name-peak-per-process-mib"
    fi
    wait $pid; rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/status.txt"
    [ $rc = 0 ] || failed=1
    return 0
}
has_torch() { "$TORCH_PY" -c 'import torch, transformers' 2>/dev/null; }
# Whether $TBIN has the torch backend (a binary without it says so).
tbin=0
if [ -x "$TBIN" ] && ! "$TBIN" bench step --shape configs/shapes/qwen3-tiny.json --backend torch --batch 1 \
        --prompt 2 --response 1 --reps 1 --out /dev/null 2>&1 | grep -q "built without the torch backend"; then
    tbin=1
else
    echo "check: $TBIN has no torch backend (make build-torch / make build-gpu): its phases are skipped" >&2
fi

echo "== 1. correctness: $DEV vs cpu on configs/shapes/qwen3-tiny.json"
if [ $tbin = 1 ]; then
    # The torch backend on this device against candle on the CPU in f32,
    # the trainer's step (left padding, entropy bonus), two steps.
    phase check-torch-f32 120 "$TBIN" bench step --backend torch --shape configs/shapes/qwen3-tiny.json \
        --device $DEV --dtype f32 --check --tolerance 1e-4 --batch 4 --prompt 16 --response 48 --pad 8 \
        --entropy 0.01 --out "$OUT/check-torch-f32.json"
    phase check-torch-bf16 120 "$TBIN" bench step --backend torch --shape configs/shapes/qwen3-tiny.json \
        --device $DEV --dtype bf16 --check --tolerance inf --batch 4 --prompt 16 --response 48 --pad 8 \
        --entropy 0.01 --out "$OUT/check-torch-bf16.json"
fi
# The first CUDA call also JIT-compiles candle's kernels (≈ 15 s).
phase check-f32 120 "$BIN" bench step --shape configs/shapes/qwen3-tiny.json --device $DEV $COMPOSITE --dtype f32 \
    --check --tolerance 1e-4 --batch 4 --prompt 16 --response 48 --pad 8 --entropy 0.01 --out "$OUT/check-f32.json"
# Mixed precision (bf16 compute, f32 master weights and logits): reported,
# not gated (--tolerance inf); bf16 keeps 8 bits of mantissa.
phase check-bf16 60 "$BIN" bench step --shape configs/shapes/qwen3-tiny.json --device $DEV $COMPOSITE --dtype bf16 \
    --check --tolerance inf --batch 4 --prompt 16 --response 48 --pad 8 --entropy 0.01 --out "$OUT/check-bf16.json"

# r2vpo's bf16 is mixed precision (f32 master weights, gradients and AdamW
# moments; bf16 compute), so PyTorch runs the same arrangement: f32
# parameters under torch.autocast(bf16) (`amp`). PyTorch with bf16
# parameters throughout (`bf16`: half the optimizer memory, bf16 AdamW
# updates) is timed as well, as a reference.
# The sampler (KV-cache decode) against the learner on the same device:
# the behaviour log-probs the trainer's ratio divides by.
phase check-sampler-f32 120 "$BIN" bench step --shape configs/shapes/qwen3-tiny.json --device $DEV $COMPOSITE \
    --dtype f32 --check --sampler --tolerance 1e-4 --batch 4 --prompt 16 --response 48 --pad 4 \
    --out "$OUT/check-sampler-f32.json"
if [ $dry = 0 ]; then
    phase check-sampler-0.6b-f32 120 "$BIN" bench step --shape configs/shapes/qwen3-0.6b.json --device $DEV \
        --dtype f32 --check --sampler --tolerance 1e-4 --batch 4 --prompt 16 --response 48 --pad 4 \
        --out "$OUT/check-sampler-0.6b-f32.json"
    phase check-sampler-0.6b-bf16 120 "$BIN" bench step --shape configs/shapes/qwen3-0.6b.json --device $DEV \
        --dtype bf16 --check --sampler --tolerance 1e-2 --batch 4 --prompt 16 --response 48 --pad 4 \
        --out "$OUT/check-sampler-0.6b-bf16.json"
fi

# The same at a real depth (28 layers): where rounding compounds.
if [ $dry = 0 ]; then
    phase check-0.6b-f32 120 "$BIN" bench step --shape configs/shapes/qwen3-0.6b.json --device $DEV --dtype f32 \
        --check --tolerance 1e-4 --batch 4 --prompt 16 --response 48 --pad 8 --entropy 0.01 --out "$OUT/check-0.6b-f32.json"
    phase check-0.6b-bf16 120 "$BIN" bench step --shape configs/shapes/qwen3-0.6b.json --device $DEV --dtype bf16 \
        --check --tolerance inf --batch 4 --prompt 16 --response 48 --pad 8 --entropy 0.01 --out "$OUT/check-0.6b-bf16.json"
fi

dtype=bf16 tdtype=amp
[ $dry = 1 ] && dtype=f32 tdtype=f32   # bf16 is 2.7x slower than f32 on a CPU in candle
echo "== 2. training step: $SHAPE, $DEV $dtype, $BATCH × ($PROMPT + $RESPONSE) tokens"
if [ $tbin = 1 ]; then
    PEAK=1 phase r2vpo-torch-step 150 "$TBIN" bench step --backend torch --shape "$SHAPE" --device $DEV \
        --dtype $dtype --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" \
        --out "$OUT/r2vpo-torch-step.json"
fi
PEAK=1 phase r2vpo-step 150 "$BIN" bench step --shape "$SHAPE" --device $DEV --dtype $dtype \
    --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" --out "$OUT/r2vpo-step.json"
if has_torch; then
    PEAK=1 phase torch-step 120 "$TORCH_PY" scripts/gpu/torch_step.py --shape "$SHAPE" --device $DEV \
        --dtype $tdtype --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" \
        --out "$OUT/torch-step.json"
else
    echo "check: $TORCH_PY has no torch/transformers: the PyTorch step is skipped" >&2
fi

# Long rows with gradient checkpointing on both sides (what fits 8k-token
# sequences at all): r2vpo's `--checkpoint`, transformers'
# gradient_checkpointing_enable.
LONG_BATCH=${LONG_BATCH:-2} LONG_RESPONSE=${LONG_RESPONSE:-3840}
[ $dry = 1 ] && LONG_BATCH=2 LONG_RESPONSE=112
echo "== 2b. checkpointed step: $SHAPE, $DEV $dtype, $LONG_BATCH × ($PROMPT + $LONG_RESPONSE) tokens"
if [ $tbin = 1 ]; then
    PEAK=1 phase r2vpo-torch-ck-step 150 "$TBIN" bench step --backend torch --shape "$SHAPE" --device $DEV \
        --dtype $dtype --checkpoint --batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" \
        --reps "$REPS" --out "$OUT/r2vpo-torch-ck-step.json"
fi
PEAK=1 phase r2vpo-ck-step 150 "$BIN" bench step --shape "$SHAPE" --device $DEV --dtype $dtype --checkpoint \
    --batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" --reps "$REPS" --out "$OUT/r2vpo-ck-step.json"
if has_torch; then
    PEAK=1 phase torch-ck-step 120 "$TORCH_PY" scripts/gpu/torch_step.py --shape "$SHAPE" --device $DEV \
        --dtype $tdtype --checkpoint --batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" \
        --reps "$REPS" --out "$OUT/torch-ck-step.json"
fi

# Packed micro-batches against padded rows on the device (#69): one
# checkpointed torch-backend step over 2 prompts × 8 samples of log-normal
# lengths up to 8192 tokens (a reasoning model's spread), padded rows of 4
# against packed ones, by rows and by a 16k-token budget.
PACK_MAX=${PACK_MAX:-8192} PACK_MEDIAN=${PACK_MEDIAN:-1000} PACK_BUDGET=${PACK_BUDGET:-16384}
[ $dry = 1 ] && PACK_MAX=96 PACK_MEDIAN=24 PACK_BUDGET=256
echo "== 2c. packing: $SHAPE, $DEV $dtype, log-normal responses to $PACK_MAX tokens"
if [ $tbin = 1 ]; then
    PEAK=1 phase r2vpo-torch-packing 300 "$TBIN" bench packing --backend torch --shape "$SHAPE" --device $DEV \
        --dtype $dtype --checkpoint --prompt "$PROMPT" --median "$PACK_MEDIAN" --max "$PACK_MAX" --min 20 \
        --budget "$PACK_BUDGET" --reps "$REPS" --out "$OUT/r2vpo-torch-packing.json"
fi

# LoRA on one GPU (#54): rank-16 adapters on a frozen bf16 base of the
# Qwen3-8B shape, checkpointed, 4 × 4096 tokens (the goal: it fits one
# 80 GB GPU), r2vpo's torch backend against PyTorch + PEFT (or the same
# LoRA forward in PyTorch where PEFT does not import there).
LORA_SHAPE=${LORA_SHAPE:-configs/shapes/qwen3-8b.json} LORA_BATCH=${LORA_BATCH:-4}
LORA_RESPONSE=${LORA_RESPONSE:-4052} LORA_RANK=${LORA_RANK:-16}
[ $dry = 1 ] && LORA_SHAPE=configs/shapes/qwen3-tiny.json LORA_BATCH=2 LORA_RESPONSE=48 LORA_RANK=4
echo "== 2d. LoRA step: $LORA_SHAPE, rank $LORA_RANK, $DEV $dtype, $LORA_BATCH × ($PROMPT + $LORA_RESPONSE) tokens"
if [ $tbin = 1 ]; then
    PEAK=1 phase r2vpo-torch-lora-step 300 "$TBIN" bench step --backend torch --shape "$LORA_SHAPE" --device $DEV \
        --dtype $dtype --checkpoint --lora-rank "$LORA_RANK" --batch "$LORA_BATCH" --prompt "$PROMPT" \
        --response "$LORA_RESPONSE" --reps "$REPS" --out "$OUT/r2vpo-torch-lora-step.json"
fi
if has_torch; then
    PEAK=1 PEFT_WHEELS=${PEFT_WHEELS:-dist/gpu/wheels} phase torch-lora-step 300 "$TORCH_PY" \
        scripts/gpu/torch_step.py --shape "$LORA_SHAPE" --device $DEV --dtype $tdtype --checkpoint \
        --lora-rank "$LORA_RANK" --batch "$LORA_BATCH" --prompt "$PROMPT" --response "$LORA_RESPONSE" \
        --reps "$REPS" --out "$OUT/torch-lora-step.json"
fi

# `llm plan`'s prediction for the two torch-backend steps above, against
# their peak GPU memory in the summary (the plan leaves out the CUDA context
# and the caching allocator's slack, which nvidia-smi counts).
phase plan-torch-step 30 "$BIN" llm plan --shape "$SHAPE" --backend torch --dtype $dtype --checkpoint false \
    --micro-batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --json "$OUT/plan-torch-step.json"
phase plan-torch-ck-step 30 "$BIN" llm plan --shape "$SHAPE" --backend torch --dtype $dtype --checkpoint true \
    --micro-batch "$LONG_BATCH" --prompt "$PROMPT" --response "$LONG_RESPONSE" --json "$OUT/plan-torch-ck-step.json"

# The trainer end to end on the device: sampling (KV cache, behaviour
# log-probs), rewards, the R²VPO update with gradient checkpointing, λ, a
# checkpoint. Then a tiny run checkpointed on the device, resumed on the
# CPU and back on the device: checkpoints load on either.
TOK=${TOK:-dist/gpu/tokenizer}
W=${RUNS:-runs/gpu-check}
if [ ! -f "$TOK/tokenizer.json" ] && [ -f .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    "$BIN" llm info --save-tokenizer "$TOK" > /dev/null   # what `make build-gpu` leaves in dist/gpu
fi
rm -rf "$W" && mkdir -p "$W"
# How much host memory loading a bf16 model onto the device takes: a random
# bf16 folder of $LOAD_SHAPE (as Hugging Face ships weights) served on the
# torch backend, the server's peak resident memory once it listens against
# the weights' size. Weights reach the device one tensor at a time, so the
# peak should be the process's base plus about one tensor, not a multiple
# of the model (docs/decisions.md). The dry run serves the tiny shape on
# the candle backend, so the phase's plumbing is tested everywhere.
NUMPY_PY=${NUMPY_PY:-$TORCH_PY}
LOAD_SHAPE=${LOAD_SHAPE:-$SHAPE}
load_bin=$TBIN load_flags=(--backend torch --device "$DEV" --dtype bf16)
if [ $dry = 1 ] || [ $tbin = 0 ]; then load_bin=$BIN load_flags=(--backend candle); fi
echo "== 3a. loading a bf16 $LOAD_SHAPE folder: ${load_flags[*]}"
if "$NUMPY_PY" -c 'import numpy' 2>/dev/null; then
    # --min-vocab: the served tokenizer's (SmolLM2's 49,152 ids; the tiny
    # shape has 1,024).
    phase bf16-folder 300 "$NUMPY_PY" scripts/gpu/bf16_folder.py --shape "$LOAD_SHAPE" --min-vocab 49152 \
        --out "$W/bf16-model"
    PEAK=1 phase serve-load 300 scripts/gpu/serve_peak.sh "$load_bin" "$W/bf16-model" "$TOK" "$OUT/serve-load.json" \
        -- "${load_flags[@]}"
    rm -rf "$W/bf16-model"
else
    echo "check: $NUMPY_PY has no numpy: the load measurement is skipped" >&2
fi

smoke=(llm train --config configs/llm/gpu-smoke.toml --no-export --set "model.tokenizer=$TOK" --set "model.device=$DEV")
[ $dry = 1 ] && smoke+=(--set model.random.shape=configs/shapes/qwen3-tiny.json --set model.compute_dtype=f32
    --set prompts_per_iter=2 --set rollout_batch=16 --set minibatch_size=8 --set micro_batch_size=8
    --set sampling.max_new_tokens=16)
echo "== 3. llm train end to end: configs/llm/gpu-smoke.toml on $DEV"
if [ $tbin = 1 ]; then
    # Sampling and learning on the torch backend, on the device: rollout
    # and learning tokens/s and their shares of an iteration.
    PEAK=1 phase train-torch-e2e 300 "$TBIN" "${smoke[@]}" --set model.backend=torch --out "$W/torch-e2e"
    [ -f "$W/torch-e2e/metrics.jsonl" ] && cp "$W/torch-e2e/metrics.jsonl" "$OUT/train-torch-e2e-metrics.jsonl"
fi
# The distributed learner on the device (#57): NCCL's collectives checked
# on GPU tensors, then the torch run above again as a launched job of one
# rank — the data-parallel path (process group, exchanged rollouts,
# gradients all-reduced in buckets through NCCL, the optimizer sharded over
# one rank) — against the plain process: the same figures, and its train
# tokens/s against the plain run's (goal: within 3 %), in the summary.
# Several GPUs: `r2vpo launch --nproc-per-node N -- llm train ...`, or
# torchrun (docs/distributed.md).
if [ $tbin = 1 ]; then
    echo "== 3c. the distributed learner, one rank: $( [ $dry = 1 ] && echo Gloo || echo NCCL ) on $DEV"
    DIST_NUMEL=${DIST_NUMEL:-67108864}
    [ $dry = 1 ] && DIST_NUMEL=1048576
    phase dist-check 120 "$TBIN" launch --nproc-per-node 1 --master-port 0 -- dist check --device $DEV \
        --numel "$DIST_NUMEL" --iters 20
    PEAK=1 phase train-torch-dist1 300 "$TBIN" launch --nproc-per-node 1 --master-port 0 -- "${smoke[@]}" \
        --set model.backend=torch --out "$W/torch-dist1"
    [ -f "$W/torch-dist1/metrics.jsonl" ] && cp "$W/torch-dist1/metrics.jsonl" "$OUT/train-torch-dist1-metrics.jsonl"
    # Each rank's host peak per iteration and during its checkpoint.
    [ -f "$W/torch-dist1/events.jsonl" ] && grep -h '"checkpoint_memory"' "$W/torch-dist1/events.jsonl" \
        > "$OUT/train-torch-dist1-checkpoint-memory.jsonl" || true
fi
PEAK=1 phase train-e2e 180 "$BIN" "${smoke[@]}" --out "$W/e2e"
[ -f "$W/e2e/metrics.jsonl" ] && cp "$W/e2e/metrics.jsonl" "$OUT/train-e2e-metrics.jsonl"
tiny=(--set model.random.shape=configs/shapes/qwen3-tiny.json --set prompts_per_iter=2 --set rollout_batch=16
    --set minibatch_size=8 --set micro_batch_size=8 --set sampling.max_new_tokens=16 --set checkpoint_every=1)
echo "== 3b. a checkpoint moves between devices: $DEV → cpu → $DEV"
phase xdev-1 60 "$BIN" "${smoke[@]}" "${tiny[@]}" --set iterations=1 --out "$W/xdev"
phase xdev-2 60 "$BIN" llm train --resume "$W/xdev" --no-export --set model.device=cpu --set iterations=2
phase xdev-3 60 "$BIN" llm train --resume "$W/xdev" --no-export --set "model.device=$DEV" --set iterations=3
[ -f "$W/xdev/metrics.jsonl" ] && cp "$W/xdev/metrics.jsonl" "$OUT/train-xdev-metrics.jsonl"

# One short iteration of the end-to-end run per variant, on the device and
# on the CPU, for comparing gradient norms (the first GPU check's device
# run reported norms 1e5 times the CPU's).
if [ $dry = 0 ]; then
    short=(--set iterations=1 --set sampling.max_new_tokens=32 --set checkpoint_every=0)
    for v in "cuda-bf16 model.device=cuda model.compute_dtype=bf16" \
             "cuda-f32 model.device=cuda model.compute_dtype=f32" \
             "cuda-bf16-unshared model.device=cuda model.compute_dtype=bf16 share_prompt_prefix=false" \
             "cuda-f32-unshared model.device=cuda model.compute_dtype=f32 share_prompt_prefix=false" \
             "cpu-f32 model.device=cpu model.compute_dtype=f32"; do
        set -- $v; name=$1; shift
        sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
        phase "grad-$name" 90 "$BIN" "${smoke[@]}" "${short[@]}" "${sets[@]}" --out "$W/grad-$name"
        [ -f "$W/grad-$name/metrics.jsonl" ] && cp "$W/grad-$name/metrics.jsonl" "$OUT/grad-$name.jsonl"
    done
    python3 - "$OUT" <<'PY' | tee "$OUT/grad-norms.txt"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("grad-*.jsonl")):
    for line in p.read_text().splitlines():
        r = json.loads(line)
        print(f"{p.stem:28} grad_norm {r['grad_norm']:.4g} loss {r['loss']:.5g} sq_dev {r['sq_dev']:.3g} "
              f"ratio [{r['ratio_min']:.3g}, {r['ratio_max']:.3g}] entropy {r['entropy']:.4g}")
PY
fi

if [ $dry = 0 ] && has_torch; then
    echo "== 2c. reference: PyTorch with bf16 parameters and optimizer state"
    PEAK=1 phase torch-bf16-step 120 "$TORCH_PY" scripts/gpu/torch_step.py --shape "$SHAPE" \
        --device $DEV --dtype bf16 --batch "$BATCH" --prompt "$PROMPT" --response "$RESPONSE" --reps "$REPS" \
        --out "$OUT/torch-bf16-step.json"
fi

# The sampler on the torch backend against transformers' generate: the
# same shapes, batches, prompt and response lengths, every row to the full
# length at T = 1 (GPU-rollouts issue: ≥ 3× at batch 64, moonshot ≥ 5× at
# 256); and its behaviour log-probs against its learner's in bf16.
SSHAPES=${SSHAPES:-"configs/shapes/qwen3-0.6b.json configs/shapes/qwen3-1.7b.json"}
SBATCHES=${SBATCHES:-"64 256"} SPROMPT=${SPROMPT:-512} SRESPONSE=${SRESPONSE:-1024}
[ $dry = 1 ] && SSHAPES=configs/shapes/qwen3-tiny.json SBATCHES=4 SPROMPT=16 SRESPONSE=16
if [ $tbin = 1 ]; then
    echo "== 5. sampler: torch backend against transformers' generate, $DEV $dtype"
    gshape=configs/shapes/qwen3-0.6b.json
    [ $dry = 1 ] && gshape=configs/shapes/qwen3-tiny.json
    phase check-sampler-torch-$dtype 180 "$TBIN" bench step --backend torch --sampler --check --tolerance inf \
        --shape "$gshape" --device $DEV --dtype $dtype --batch 8 --prompt 64 --response 128 --pad 8 \
        --out "$OUT/check-sampler-torch-$dtype.json"
    for sh in $SSHAPES; do
        name=$(basename "$sh" .json)
        for b in $SBATCHES; do
            PEAK=1 phase "sample-torch-$name-$b" 300 "$TBIN" bench step --backend torch --sampler --shape "$sh" \
                --device $DEV --dtype $dtype --batch "$b" --prompt "$SPROMPT" --response "$SRESPONSE" --reps 1 \
                --out "$OUT/sample-torch-$name-$b.json"
            if has_torch; then
                PEAK=1 phase "sample-hf-$name-$b" 300 "$TORCH_PY" scripts/gpu/torch_generate.py --shape "$sh" \
                    --device $DEV --dtype $dtype --batch "$b" --prompt "$SPROMPT" --response "$SRESPONSE" --reps 1 \
                    --out "$OUT/sample-hf-$name-$b.json"
            fi
        done
    done
fi

echo "== 4. summary"
phase summary 60 python3 scripts/gpu/summary.py "$OUT"
exit $failed
