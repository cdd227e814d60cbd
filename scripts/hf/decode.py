#!/usr/bin/env python3
"""PyTorch + transformers' decode throughput for `scripts/hf/compare.sh`:
greedy, a fixed number of new tokens (EOS ignored), batch sizes as given,
on a model random-initialised from a `config.json` shape (decode speed does
not depend on the weights' values). The prompt is the same length as
`r2vpo bench llm`'s chat prompt."""
from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=44)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(a.threads)
    with open(a.shape) as f:
        cfg = transformers.AutoConfig.for_model(**json.load(f))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(3, cfg.vocab_size, (b, a.prompt))
        att = torch.ones_like(ids)
        with torch.inference_mode():
            # Warm-up, then the timed call.
            model.generate(input_ids=ids, attention_mask=att, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=a.new_tokens,
                                 min_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0)
            secs = time.perf_counter() - t0
        new = (out.shape[1] - a.prompt) * b
        rows.append({"batch": b, "seconds": secs, "tokens_per_s": new / secs})
        print(f"| {b} | {secs:.2f} | {new / secs:.1f} |", flush=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "decode": rows}, f, indent=2)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
