#!/usr/bin/env python3
"""PyTorch's GFLOP/s on the learner's products at SmolLM2's shapes for
8 × 300 tokens (forward x·wᵀ, input gradient g·w, weight gradient gᵀ·x),
beside `ops::timing::learner_products` in r2vpo-llm, which times r2vpo's
kernels on the same shapes. Run in the pinned venv (`make venv-hf`)."""
import argparse
import time

import torch

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
tot = [0.0, 0.0]
for k, n in [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]:
    m = 2048 if n == 49152 else 2400
    x, w, g = torch.rand(m, k) * 2 - 1, torch.rand(n, k) * 2 - 1, torch.rand(m, n) * 2 - 1
    flop = 2.0 * m * n * k
    line = f"{m}x{k}x{n}:"
    for name, f in [("fwd", lambda: x @ w.t()), ("dx", lambda: g @ w), ("dw", lambda: g.t() @ x)]:
        f()
        t = time.perf_counter()
        for _ in range(a.reps):
            f()
        s = (time.perf_counter() - t) / a.reps
        tot[0] += flop
        tot[1] += s
        line += f"  {name} {flop / s / 1e9:6.1f} GFLOP/s ({s * 1e3:5.1f} ms)"
    print(line)
print(f"all: {tot[0] / tot[1] / 1e9:.1f} GFLOP/s")
