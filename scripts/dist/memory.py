#!/usr/bin/env python3
"""Per-rank peak resident memory of data-parallel `llm train` on CPU ranks
(the torch backend), for ZeRO 0, 1 and 2 on 1, 2 and 3 ranks, during a
step, a checkpoint and a resume, beside `r2vpo llm plan`'s figures for the
same shape and settings; a Markdown table on stdout and `memory.json`.

    python3 scripts/dist/memory.py --bin target/torch/release/r2vpo --out results/bench/dist-memory-<date>

The model is random, of Qwen3-0.6B's widths with fewer layers (`--layers`,
default 8) and the embedded SmolLM2 tokenizer's vocabulary of 49,152 (176 M
parameters, tied embeddings), so that model state
(f32 weights, gradients and AdamW's moments, 16 bytes per parameter before
sharding) dominates a step on a machine of 24 GiB running three ranks.
Every configuration runs under `r2vpo launch` (one rank too), with
checkpointed layers, so each rank reports its own peaks:

* iteration: `rank_peak_rss_mib` of iteration 2 (each rank's `VmHWM`,
  reset at the previous iteration's record): the rollout (rank 0 alone
  samples this batch of one sampler call) and the step, moments allocated;
* checkpoint: the `checkpoint_memory` event after iteration 2: each
  rank's resident memory when the checkpoint began and its peak during it
  (from the optimizer gather to rank 0's write); their difference is what
  a checkpoint adds to a rank;
* resume: `rank_peak_rss_mib` of iteration 3 of the same run resumed
  (`--resume`, iterations = 3): loading the checkpoint's weights, mapping
  its optimizer file, reading the moments a rank steps, and the step.

`owned` is a rank's optimizer state in MiB (moments, from the
`optimizer_sharded` event; all of them unsharded). `plan` is `llm plan`'s
per-rank total for the same run (weights, gradients, moments, activations,
logits); a process's own footprint (libtorch, the tokenizer, the data, the
sampler's cache) comes on top of it, so the table also gives iteration − plan,
which should stay about constant across rows if the plan's model-state
terms are right.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
GGUF = ROOT / ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def sets(shape: Path, zero: int, max_new: int) -> list[str]:
    return [
        f"model.tokenizer={GGUF}",
        "model.backend=torch",
        "model.device=cpu",
        "model.compute_dtype=f32",
        f"model.random.shape={shape}",
        "model.random.seed=0",
        "activation_checkpointing=true",
        "entropy_coef=0",
        "iterations=2",
        "prompts_per_iter=2",
        "group_size=2",
        "rollout_batch=4",
        "minibatch_size=4",
        "micro_batch_size=1",
        f"sampling.max_new_tokens={max_new}",
        "checkpoint_every=1",
        "keep_checkpoints=1",
        "histogram_every=0",
        "eval_at_start=false",
        "eval_at_end=false",
        "eval_every=0",
        f"dist.zero_stage={zero}",
    ]


def run(bin_: Path, ranks: int, out: Path, args: list[str]) -> None:
    cmd = [str(bin_), "--threads", "1", "launch", "--nproc-per-node", str(ranks), "--master-port", "0", "--",
           "llm", "train", "--quiet", "--no-export", *args]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{p.stdout}\n{p.stderr}")


def jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def plan(bin_: Path, shape: Path, ranks: int, zero: int, max_new: int, tmp: Path) -> dict:
    out = tmp / f"plan-{ranks}-{zero}.json"
    cmd = [str(bin_), "llm", "plan", "--shape", str(shape), "--world-size", str(ranks), "--zero", str(zero),
           "--micro-batch", "1", "--prompt", "64", "--response", str(max_new), "--checkpoint", "true",
           "--dtype", "f32", "--backend", "torch", "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return json.loads(out.read_text())["plan"]


def measure(bin_: Path, shape: Path, ranks: int, zero: int, max_new: int, tmp: Path) -> dict:
    d = tmp / f"r{ranks}-z{zero}"
    run(bin_, ranks, d, ["--config", "configs/llm/smollm2-arith.toml", "--out", str(d),
                         *[x for s in sets(shape, zero, max_new) for x in ("--set", s)]])
    fresh = jsonl(d / "metrics.jsonl")
    events = jsonl(d / "events.jsonl")
    ckpt = [e for e in events if e.get("event") == "checkpoint_memory"]
    shard = next((e for e in events if e.get("event") == "optimizer_sharded"), None)
    run(bin_, ranks, d, ["--resume", str(d), "--set", "iterations=3"])
    resumed = jsonl(d / "metrics.jsonl")
    assert len(fresh) == 2 and len(resumed) == 3, (len(fresh), len(resumed))
    return {
        "ranks": ranks,
        "zero": zero,
        "step_mib": fresh[1]["rank_peak_rss_mib"],
        "first_iteration_mib": fresh[0]["rank_peak_rss_mib"],
        "checkpoint_mib": ckpt[-1]["rank_peak_rss_mib"],
        "checkpoint_start_mib": ckpt[-1]["rank_start_rss_mib"],
        "resume_mib": resumed[2]["rank_peak_rss_mib"],
        "moment_values_per_rank": shard["moment_values_per_rank"] if shard else None,
        "loss": [m["loss"] for m in resumed],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=Path, default=ROOT / "target/torch/release/r2vpo")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--zero", default="0,1,2")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    base_shape = json.loads((ROOT / "configs/shapes/qwen3-0.6b.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("R2VPO_BENCH_TMP")) as t:
        tmp = Path(t)
        shape = tmp / "shape.json"
        # The embedded tokenizer's vocabulary, which a random model takes
        # (`model.random`), so `llm plan` plans the model that trains.
        shape.write_text(json.dumps({**base_shape, "num_hidden_layers": args.layers, "vocab_size": 49152}))
        for zero in [int(z) for z in args.zero.split(",")]:
            for ranks in [int(r) for r in args.ranks.split(",")]:
                if zero > 0 and ranks == 1:
                    continue  # nothing to shard: ZeRO-0's row is the one rank's
                row = measure(args.bin, shape, ranks, zero, args.max_new_tokens, tmp)
                p = plan(args.bin, shape, ranks, zero, args.max_new_tokens, tmp)
                row["plan_mib"] = p["total"] / 2**20
                row["plan_transients_mib"] = {k: v / 2**20 for k, v in p["transients"].items()}
                row["parameters"] = p["parameters"]
                moments = row["moment_values_per_rank"] or [2 * p["parameters"]] * ranks
                row["owned_mib"] = [4 * m / 2**20 for m in moments]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    params = rows[0]["parameters"]
    print(f"Random Qwen3-0.6B widths, {args.layers} layers, vocabulary 49152 ({params / 1e6:.1f} M parameters), torch backend on the "
          f"CPU, f32, checkpointed layers, micro-batches of 1 sequence (prompt + {args.max_new_tokens} tokens), "
          f"{os.cpu_count()} cores; MiB per rank")
    print("| ranks | ZeRO | owned optimizer state | iteration | checkpoint: peak − start | resume | resume − iteration "
          "| plan (step) | iteration − plan |")
    print("|---:|---:|---|---|---|---|---|---:|---|")
    fmt = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    for r in rows:
        ckpt = ", ".join(f"{p:.0f} − {s:.0f}" for p, s in zip(r["checkpoint_mib"], r["checkpoint_start_mib"]))
        print(f"| {r['ranks']} | {r['zero']} | {fmt(r['owned_mib'])} | {fmt(r['step_mib'])} | {ckpt} | "
              f"{fmt(r['resume_mib'])} | {fmt(a - b for a, b in zip(r['resume_mib'], r['step_mib']))} | "
              f"{r['plan_mib']:.0f} | {fmt(x - r['plan_mib'] for x in r['step_mib'])} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps({"layers": args.layers, "max_new_tokens": args.max_new_tokens,
                                                      "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
