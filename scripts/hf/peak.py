#!/usr/bin/env python3
"""This machine's f32 GEMM rate on T threads, by PyTorch: the limit that
issue #16's "share of the f32 compute limit" divides by. Times a
2048 × 2048 × 2048 matmul (2·2048³ FLOP) REPS times after a warm-up and
writes the best and median GFLOP/s as JSON. Run in the pinned venv
(`make venv-hf`); scripts/hf/compare.sh calls it."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(a.n, a.n, generator=g), torch.randn(a.n, a.n, generator=g)
    out = torch.empty(a.n, a.n)
    for _ in range(3):
        torch.matmul(x, y, out=out)
    rates = []
    for _ in range(a.reps):
        t = time.perf_counter()
        torch.matmul(x, y, out=out)
        rates.append(2 * a.n**3 / (time.perf_counter() - t) / 1e9)
    res = {"torch": torch.__version__, "threads": a.threads, "n": a.n, "reps": a.reps,
           "gflops_best": max(rates), "gflops_median": statistics.median(rates)}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, a.out)
    print(f"f32 GEMM {a.n}³ on {a.threads} threads: best {res['gflops_best']:.1f}, "
          f"median {res['gflops_median']:.1f} GFLOP/s (torch {torch.__version__})")


if __name__ == "__main__":
    main()
