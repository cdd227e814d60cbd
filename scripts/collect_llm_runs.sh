#!/usr/bin/env bash
# Copy the plottable logs of finished `r2vpo llm train` runs into a results
# folder and draw their plots there, so results/ holds everything the
# figures and tables were made from (checkpoints and TensorBoard files stay
# behind: they are large and reproducible from the commands in the README).
#
#   scripts/collect_llm_runs.sh DEST RUN_DIR...
#
# A RUN_DIR already under results/ (a run collected for another figure) is
# plotted where it is, not plotted again.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DEST RUN_DIR..." >&2; exit 2; }
dest=$1; shift
bin=${R2VPO:-target/release/r2vpo}
mkdir -p "$dest"
results=$(realpath "$(dirname "$0")/../results")
plotted=()
for run in "$@"; do
  name=$(basename "$run")
  [ -f "$run/config.toml" ] || { echo "$run: no config.toml (not an llm train run)" >&2; exit 1; }
  if [[ "$(realpath "$run")" == "$results"/* ]]; then
    plotted+=("$run")
    continue
  fi
  mkdir -p "$dest/$name"
  for f in config.toml metrics.jsonl eval.jsonl ratio_hist.jsonl events.jsonl; do
    [ -f "$run/$f" ] && cp "$run/$f" "$dest/$name/"
  done
  [ -d "$run/eval" ] && cp "$run"/eval/*.json "$dest/$name/" 2>/dev/null || true
  plotted+=("$dest/$name")
done
"$bin" llm plot "${plotted[@]}" --out "$dest/plots"
