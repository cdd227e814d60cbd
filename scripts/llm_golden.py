#!/usr/bin/env python3
"""Golden files for r2vpo-llm's model parity tests.

Builds tiny random Llama, Qwen2 and Qwen3 models with Hugging Face
`transformers`, saves each as a Hugging Face folder under
`crates/r2vpo-llm/golden/<arch>/` together with `golden.json`: a fixed
left-padded batch (input_ids, attention_mask, position_ids) and the
reference logits (B, T, V) at every position.

Reference logits are computed in float64 (weights rounded to the saved
dtype); padded query positions hold 0 and are not compared.

The folders deliberately exercise different load paths: Llama is tied,
uses llama3 RoPE scaling and is saved sharded (model.safetensors.index.json)
in bf16; Qwen2 (qkv bias, untied) is saved in f16; Qwen3 (q/k norm, explicit
head_dim != hidden/heads, tied) in bf16. The Rust side upcasts and must match
to 1e-4 in f32 (and far tighter in f64).

Usage (creates a throw-away virtualenv; needs network access to PyPI):
    python3 scripts/llm_golden.py            # venv in /tmp/r2vpo-golden-venv
The script re-executes itself inside the venv.
"""
import json
import os
import subprocess
import sys

VENV = os.environ.get("R2VPO_GOLDEN_VENV", "/tmp/r2vpo-golden-venv")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "r2vpo-llm", "golden")


def ensure_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "torch", "transformers", "safetensors"])
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def main():
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        attn_implementation="eager",
    )
    specs = {
        "llama": (
            LlamaForCausalLM,
            LlamaConfig(
                **common,
                rope_theta=10000.0,
                tie_word_embeddings=True,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            ),
            torch.bfloat16,
            "60KB",
        ),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False), torch.float16, None),
        "qwen3": (
            Qwen3ForCausalLM,
            Qwen3Config(**common, head_dim=24, rope_theta=1000000.0, tie_word_embeddings=True),
            torch.bfloat16,
            None,
        ),
    }

    gen = torch.Generator().manual_seed(1234)
    b, t = 3, 7
    input_ids = torch.randint(0, 128, (b, t), generator=gen)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, :2] = 0
    attention_mask[2, :4] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

    for arch, (cls, cfg, dtype, shard) in specs.items():
        torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
        model = cls(cfg).float().eval()
        with torch.no_grad():
            # Non-trivial norms and biases so every parameter matters.
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.2 * torch.randn_like(p))
        d = os.path.join(OUT, arch)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        kwargs = {"safe_serialization": True}
        if shard:
            kwargs["max_shard_size"] = shard
        model.to(dtype).save_pretrained(d, **kwargs)
        # The reference is what transformers computes from the saved files
        # (computing it from the in-memory model is wrong: `.to(bf16)` also
        # rounds the non-persistent RoPE `inv_freq` buffer).
        ref = cls.from_pretrained(d, attn_implementation="eager").eval()
        with torch.no_grad():
            f32 = ref.float()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
            # float64, each row alone (its real tokens only): independent of
            # transformers' padding handling, whose float64 eager path turns
            # left-padded rows into NaN.
            ref = ref.double()
            logits = torch.zeros(b, t, cfg.vocab_size, dtype=torch.float64)
            for r in range(b):
                n = int(attention_mask[r].sum())
                logits[r, t - n :] = ref(input_ids=input_ids[r : r + 1, t - n :]).logits[0]
        real = attention_mask[:, :, None].bool()
        noise = (f32.double() - logits).masked_fill(~real, 0).abs().max().item()
        print(f"{arch}: max |logit| {logits.abs().max().item():.3f}, transformers f32 (padded batch) vs f64 {noise:.2e}")
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(
                {
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "input_ids": input_ids.tolist(),
                    "attention_mask": attention_mask.tolist(),
                    "position_ids": position_ids.tolist(),
                    "logits": [[[float(x) for x in row] for row in seq] for seq in logits.tolist()],
                },
                f,
            )
        # generation_config.json is not needed by the test.
        gc = os.path.join(d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{arch}: {sorted(os.listdir(d))} {size / 1024:.0f} KB")


if __name__ == "__main__":
    ensure_venv()
    main()
