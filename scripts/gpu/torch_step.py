#!/usr/bin/env python3
"""PyTorch + transformers' side of `scripts/gpu/check.sh`: the training step
`r2vpo bench step` times, on the same shape, batch and objective.

One step = forward (SDPA attention, logits for the response positions only)
+ R²VPO's per-token objective, token-mean (Eq. primal–dual objective,
λ = 0.05) + backward + gradient-norm clipping at 1.0 + AdamW (fused). The
model is random-initialised from the `config.json` shape (no weights travel).
Token ids and behaviour log-probs are made exactly as `bench step` makes
them (SplitMix64 ids, a 0.15·sin wobble), so both stacks see the same batch.

Runs with the GPU machine's own torch/transformers (the README names the
venv); nothing here is installed by `make`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time

MASK64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="a Hugging Face config.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="amp", choices=["f32", "bf16", "amp"],
                    help="amp: f32 parameters, gradients and AdamW state, bf16 compute under torch.autocast "
                         "(r2vpo's `--dtype bf16` arrangement); bf16: bf16 parameters and optimizer state throughout")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=44)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--checkpoint", action="store_true",
                    help="gradient checkpointing per decoder layer (transformers' gradient_checkpointing_enable)")
    ap.add_argument("--score", action="store_true",
                    help="time the scoring pass instead: no-grad log-probs of the response tokens")
    ap.add_argument("--turns", metavar="WAIT,DONE",
                    help="take turns with another benchmark through two named pipes (scripts/hf/turns.py): "
                         "after the warm-up one byte to DONE, then before each timed step one byte read from WAIT "
                         "and after it one byte to DONE (as `r2vpo bench step --turns`)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="train rank-r LoRA adapters (alpha 2r, all seven projections, as `bench step --lora-rank`) "
                         "on a frozen base held in bf16 (amp) or the compute dtype: Hugging Face PEFT where it "
                         "imports (PEFT_WHEELS: a folder of its wheels, put on sys.path), else the same LoRA "
                         "forward written here")
    ap.add_argument("--out", default="runs/bench/torch-step.json")
    a = ap.parse_args()

    import torch
    import transformers

    with open(a.shape) as f:
        shape = json.load(f)
    cfg = transformers.AutoConfig.for_model(**shape)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "amp": torch.float32}[a.dtype]
    autocast = (lambda: torch.autocast(device_type=a.device.split(":")[0], dtype=torch.bfloat16)) \
        if a.dtype == "amp" else contextlib.nullcontext
    dev = torch.device(a.device)
    torch.manual_seed(7)
    # With LoRA the frozen base needs no f32 master: bf16 under amp.
    base_dtype = torch.bfloat16 if a.lora_rank and a.dtype == "amp" else dtype
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=base_dtype, attn_implementation="sdpa").to(dev)
    lora_impl = None
    if a.lora_rank:
        model, lora_impl = add_lora(model, a.lora_rank, torch)
    model.train()
    if a.checkpoint:
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = sum(p.numel() for p in model.parameters())
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            fused=dev.type == "cuda")

    b, p, r = a.batch, a.prompt, a.response
    w = p + r
    vocab = cfg.vocab_size
    ids = torch.tensor([splitmix64(i) % vocab for i in range(b * w)], dtype=torch.long).view(b, w).to(dev)
    att = torch.ones(b, w, dtype=torch.long, device=dev)
    wobble = torch.tensor([0.15 * math.sin(i * 0.7) for i in range(b * r)], dtype=torch.float32).view(b, r).to(dev)
    adv = torch.tensor([1.0 if (i // r) % 2 == 0 else -1.0 for i in range(b * r)]).view(b, r).to(dev)
    mask = torch.ones(b, r, device=dev)
    lam, delta = 0.05, 1e-3

    def step() -> float:
        # Logits of the positions that predict the response tokens only
        # (r2vpo's tail_logprobs does the same).
        with autocast():
            out = model(input_ids=ids, attention_mask=att, logits_to_keep=r + 1)
        logits = out.logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, p:].unsqueeze(-1)).squeeze(-1)
        old = logp.detach() + wobble
        rho = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
        per_token = -(rho * adv - lam * ((rho - 1.0) ** 2 - delta))
        loss = (per_token * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    def score() -> float:
        # `bench step --score`'s pass: no graph, logits of the response
        # positions only, log-softmax gathered at the response tokens.
        with torch.no_grad(), autocast():
            out = model(input_ids=ids, attention_mask=att, logits_to_keep=r + 1)
            logits = out.logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, p:].unsqueeze(-1)).squeeze(-1)
            return logp.mean().item()

    if a.score:
        model.eval()
        step = score  # noqa: F811
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    turns = None
    if a.turns:
        wait, _, done = a.turns.partition(",")
        if not done:
            ap.error(f"--turns {a.turns}: expected two named pipes, WAIT,DONE")
        turns = (open(wait, "rb", buffering=0), open(done, "wb", buffering=0))
    step()  # warm-up: kernels, allocator, optimizer state
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if turns:
        turns[1].write(b".")  # ready
    times, loss = [], 0.0
    for _ in range(max(a.reps, 1)):
        if turns and not turns[0].read(1):
            sys.exit(f"--turns {a.turns}: the coordinator closed the pipe")
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
        if turns:
            turns[1].write(b".")
    step_s = statistics.median(times)
    res = {
        "shape": a.shape,
        "parameters": params,
        "device": a.device,
        "dtype": a.dtype,
        "checkpoint": a.checkpoint,
        "score": a.score,
        "batch": b,
        "prompt": p,
        "response": r,
        "step_s": step_s,
        "times_s": times,
        "tokens_per_s": b * w / step_s,
        "loss": loss,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
        # The process's peak resident set (Linux reports KiB).
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lora_rank": a.lora_rank,
        "lora": lora_impl,
        "trained_parameters": sum(p.numel() for p in trained),
    }
    print(f"torch {torch.__version__} + transformers {transformers.__version__}, {a.shape} ({params} parameters), "
          f"{a.device} {a.dtype}, {b} × ({p} + {r}) tokens, median of {len(times)}")
    print(f"| step s | tokens/s |\n|---|---|\n| {step_s:.3f} | {b * w / step_s:.1f} |")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, a.out)
    print(f"written: {a.out}")


TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def add_lora(model, r, torch):
    """Rank-r adapters (alpha 2r) on every projection, base frozen; the
    adapters are f32. Returns the model and which implementation made them."""
    wheels = os.environ.get("PEFT_WHEELS")
    if wheels and os.path.isdir(wheels):
        sys.path[:0] = [os.path.join(wheels, w) for w in sorted(os.listdir(wheels)) if w.endswith(".whl")]
    try:
        import peft
        cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, lora_dropout=0.0)
        model = peft.get_peft_model(model, cfg)
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
        return model, f"peft {peft.__version__}"
    except ImportError as e:
        print(f"torch_step: PEFT does not import ({e}); LoRA written here", file=sys.stderr)

    class Lora(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            dev = base.weight.device
            self.a = torch.nn.Parameter(torch.empty(r, base.in_features, device=dev))
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, r, device=dev))
            torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
            self.scale = 2.0

        def forward(self, x):
            low = torch.nn.functional.linear(torch.nn.functional.linear(x, self.a.to(x.dtype)) * self.scale,
                                             self.b.to(x.dtype))
            return self.base(x) + low

    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for t in TARGETS:
            child = getattr(module, t, None)
            if isinstance(child, torch.nn.Linear):
                setattr(module, t, Lora(child))
    return model, "written here (PEFT's math)"


if __name__ == "__main__":
    sys.exit(main())
