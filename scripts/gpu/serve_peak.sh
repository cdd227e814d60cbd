#!/usr/bin/env bash
# Starts `r2vpo serve` on a model folder, waits until it listens (the
# weights are on the device by then), and writes the server's peak and
# current host memory (VmHWM, VmRSS) and the folder's weight bytes as JSON:
# what loading the model cost the host. Stops the server by PID.
#
#   scripts/gpu/serve_peak.sh BIN FOLDER TOKENIZER OUT.json -- SERVE_FLAGS...
set -euo pipefail
bin=$1 folder=$2 tok=$3 out=$4; shift 4
[ "${1:-}" = "--" ] && shift
log=$(mktemp)
"$bin" --threads 1 serve --port 0 --model "$folder" --tokenizer "$tok" "$@" > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 1200); do
    grep -q "listening on" "$log" && break
    kill -0 $pid 2>/dev/null || { cat "$log" >&2; echo "serve_peak: the server exited" >&2; exit 1; }
    sleep 0.25
done
grep -q "listening on" "$log" || { cat "$log" >&2; echo "serve_peak: no listening line in 300 s" >&2; exit 1; }
kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$pid/status"; }
hwm=$(kb VmHWM) rss=$(kb VmRSS)
bytes=$(stat -c %s "$folder/model.safetensors")
cat "$log"
awk -v h="$hwm" -v r="$rss" -v b="$bytes" 'BEGIN {
    printf "{\"host_peak_gib\": %.3f, \"host_now_gib\": %.3f, \"weights_file_gib\": %.3f}\n", h / 1048576, r / 1048576, b / 1073741824
}' | tee "$out"
