#!/usr/bin/env python3
"""Data-parallel `llm train` on the CPU with 1, 2 and 3 ranks on the same
global batch: rollout and update time, each rank's peak resident memory and
each rank's share of the optimizer state (ZeRO-1: AdamW's moments, and with
`--dtype bf16` the f32 master weights), as a Markdown table with ratios
against the one-rank run measured in the same invocation.

    python3 scripts/dist/cpu_ranks.py --bin target/torch/release/r2vpo --dtype bf16 --out results/bench/dist-cpu-<date>

Each configuration runs `--reps` times (interleaved, so drift in the
machine's speed reaches every configuration alike); the table shows the
median of the per-iteration train time (rank 0's `timing.train_s`: the
update of one global batch, which every rank waits for) and the
peak resident memory of every rank (`rank_peak_rss_mib`, the largest over
the reps); rollout time is rank 0's `timing.rollout_s` (each rank samples
its share, then the ranks exchange them). On a machine with fewer cores than ranks × threads the ranks
share cores: the step time then says what the collectives cost, not what
more devices gain.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run(bin_: Path, ranks: int, threads: int, sets: list[str], out: Path) -> dict:
    cmd = [str(bin_), "--threads", str(threads)]
    if ranks > 1:
        cmd += ["launch", "--nproc-per-node", str(ranks), "--master-port", "0", "--"]
    cmd += ["llm", "train", "--quiet", "--no-export", "--config", "configs/llm/smollm2-arith.toml", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        # wait4: this child's own peak resident set (KiB on Linux); for a
        # launched job that is `launch`'s, and the ranks report their own.
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            log.seek(0)
            sys.exit(f"{' '.join(cmd)}\n{log.read()}")
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(l) for l in (out / "events.jsonl").read_text().splitlines()]
    shard = next((e for e in events if e.get("event") == "optimizer_sharded"), None)
    last = lines[-1]
    return {
        "train_s": [m["timing"]["train_s"] for m in lines],
        "rank_peak_rss_mib": last.get("rank_peak_rss_mib") or [usage.ru_maxrss / 1024.0],
        "moments_per_rank": shard["moment_values_per_rank"] if shard else None,
        "moments_total": shard["moment_values_total"] if shard else None,
        "masters_per_rank": shard.get("master_values_per_rank") if shard else None,
        "rollout_s": [m["timing"]["rollout_s"] for m in lines],
        "loss": [m["loss"] for m in lines],
        "lambda": [m["lambda"] for m in lines],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=Path, default=ROOT / "target/torch/release/r2vpo")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="tensor threads per rank")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="model.compute_dtype")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further `llm train --set` override, after the script's own")
    args = ap.parse_args()
    sets = [
        "model.backend=torch",
        f"model.compute_dtype={args.dtype}",
        "iterations=1",
        "prompts_per_iter=4",
        "group_size=4",
        "rollout_batch=16",
        "minibatch_size=16",
        "micro_batch_size=2",
        "sampling.max_new_tokens=32",
        "eval_at_start=false",
        "eval_at_end=false",
        "eval_every=0",
        "checkpoint_every=0",
        "histogram_every=0",
    ]
    sets += args.set
    ranks = [int(r) for r in args.ranks.split(",")]
    results: dict[int, list[dict]] = {r: [] for r in ranks}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for r in ranks:
                results[r].append(run(args.bin, r, args.threads, sets, Path(tmp) / f"r{r}-{rep}"))
    base = statistics.median(x for res in results[ranks[0]] for x in res["train_s"])
    rows = []
    for r in ranks:
        t = statistics.median(x for res in results[r] for x in res["train_s"])
        roll = statistics.median(x for res in results[r] for x in res["rollout_s"])
        rss = [max(res["rank_peak_rss_mib"][k] for res in results[r]) for k in range(r)]
        moments = results[r][0]["moments_per_rank"]
        rows.append({"ranks": r, "rollout_s": roll, "train_s": t, "ratio": t / base,
                     "masters_per_rank": results[r][0]["masters_per_rank"], "rank_peak_rss_mib": rss, "moments_per_rank": moments,
                     "moments_total": results[r][0]["moments_total"], "loss": results[r][0]["loss"],
                     "lambda": results[r][0]["lambda"]})
    print(f"SmolLM2-135M, torch backend on the CPU, {args.dtype}, one update of 16 sequences × (prompt + 32) tokens, "
          f"micro-batches of 2, {args.threads} thread(s) per rank, {os.cpu_count()} cores, median of {args.reps}")
    print("| ranks | rollout (s) | update (s) | × 1 rank | peak RSS per rank (MiB) | AdamW moment values per rank "
          "| f32 master values per rank |")
    print("|---:|---:|---:|---:|---|---|---|")
    for row in rows:
        rss = ", ".join(f"{x:.0f}" for x in row["rank_peak_rss_mib"])
        mom = ", ".join(f"{m / 1e6:.1f} M" for m in row["moments_per_rank"]) if row["moments_per_rank"] else "all (one rank)"
        mas = ", ".join(f"{m / 1e6:.1f} M" for m in row["masters_per_rank"]) if row["masters_per_rank"] else "all (one rank)"
        print(f"| {row['ranks']} | {row['rollout_s']:.2f} | {row['train_s']:.2f} | {row['ratio']:.2f} | {rss} | {mom} "
              f"| {mas} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ranks.json").write_text(json.dumps({"sets": sets, "threads": args.threads, "reps": args.reps, "dtype": args.dtype,
                                                     "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
