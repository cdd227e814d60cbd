#!/usr/bin/env python3
"""transformers' side of the sampler comparison in `scripts/gpu/check.sh`:
`model.generate` on the shape, batch, prompt and response lengths that
`r2vpo bench step --sampler` samples, timed the same way.

A random-initialised model from the `config.json` shape (no weights
travel), bf16 (or f32) parameters, SDPA attention, the static KV cache
transformers picks by default, ancestral sampling at T = 1 (top-k and top-p
off) for exactly `--response` new tokens per row (EOS ignored:
`min_new_tokens` = `max_new_tokens`), the prompts made as `bench step`
makes them (SplitMix64 ids). Tokens/s counts generated tokens over the
whole call (prefill included), median of `--reps` after one warm-up.

Runs with the GPU machine's own torch/transformers; nothing here is
installed by `make`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from torch_step import splitmix64  # the ids `bench step` makes (this folder is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="a Hugging Face config.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="runs/bench/torch-generate.json")
    a = ap.parse_args()

    import torch
    import transformers

    with open(a.shape) as f:
        shape = json.load(f)
    cfg = transformers.AutoConfig.for_model(**shape)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    dev = torch.device(a.device)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").to(dev)
    model.eval()
    b, p, r = a.batch, a.prompt, a.response
    vocab = cfg.vocab_size
    # Row i's prompt is the first `p` tokens `bench step` makes for row i.
    ids = torch.tensor([[splitmix64(i * (p + r) + k) % vocab for k in range(p)] for i in range(b)],
                       dtype=torch.long, device=dev)
    att = torch.ones_like(ids)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def run() -> int:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=r, min_new_tokens=r, pad_token_id=0)
        return int(out.shape[1] - p) * b

    run()  # warm-up
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, tokens = [], 0
    for _ in range(max(1, a.reps)):
        t0 = time.perf_counter()
        tokens = run()
        sync()
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    res = {
        "stack": "transformers generate",
        "shape": a.shape,
        "parameters": sum(q.numel() for q in model.parameters()),
        "device": a.device,
        "dtype": a.dtype,
        "batch": b,
        "prompt": p,
        "response": r,
        "seconds": s,
        "times_s": times,
        "tokens_per_s": tokens / s,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(a.out + ".tmp", a.out)
    print(f"transformers generate, {a.shape}, {a.device} {a.dtype}, {b} × ({p} + {r}) tokens: "
          f"{res['tokens_per_s']:.1f} tokens/s (median of {len(times)})")


if __name__ == "__main__":
    main()
