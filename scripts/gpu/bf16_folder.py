"""Writes a Hugging Face model folder with random bf16 weights for a
config.json shape (Llama / Qwen2 / Qwen3 layouts), as Hugging Face ships
models: what `scripts/gpu/check.sh` serves on the torch backend to measure
how much host memory loading a bf16 model onto the GPU takes. numpy alone
(no torch), so it runs in any Python the GPU machine has; the tensors are
written one at a time, so the script itself holds one in memory.

    python scripts/gpu/bf16_folder.py --shape configs/shapes/qwen3-1.7b.json --out DIR
"""

import argparse
import json
import os
import shutil

import numpy as np


def expected_params(cfg):
    """Hugging Face names and shapes, as r2vpo's `model::expected_params`."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or h // heads
    kv = cfg.get("num_key_value_heads") or heads
    inter = cfg["intermediate_size"]
    qwen2 = cfg["model_type"] == "qwen2"
    qwen3 = cfg["model_type"] == "qwen3"
    qkv_bias = qwen2 or bool(cfg.get("attention_bias"))
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (h,)))
        out.append((p + "self_attn.q_proj.weight", (heads * hd, h)))
        out.append((p + "self_attn.k_proj.weight", (kv * hd, h)))
        out.append((p + "self_attn.v_proj.weight", (kv * hd, h)))
        if qkv_bias:
            out.append((p + "self_attn.q_proj.bias", (heads * hd,)))
            out.append((p + "self_attn.k_proj.bias", (kv * hd,)))
            out.append((p + "self_attn.v_proj.bias", (kv * hd,)))
        out.append((p + "self_attn.o_proj.weight", (h, heads * hd)))
        if qwen3:
            out.append((p + "self_attn.q_norm.weight", (hd,)))
            out.append((p + "self_attn.k_norm.weight", (hd,)))
        out.append((p + "post_attention_layernorm.weight", (h,)))
        out.append((p + "mlp.gate_proj.weight", (inter, h)))
        out.append((p + "mlp.up_proj.weight", (inter, h)))
        out.append((p + "mlp.down_proj.weight", (h, inter)))
    out.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def bf16_bits(x):
    """float32 array → bf16 bit patterns (round to nearest even), uint16."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = u + (0x7FFF + ((u >> 16) & 1))
    return (rounded >> 16).astype("<u2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="a Hugging Face config.json")
    ap.add_argument("--out", required=True, help="the folder to write (replaced)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-vocab", type=int, default=0,
                    help="raise vocab_size to at least this (a tokenizer's), for tiny test shapes")
    a = ap.parse_args()
    with open(a.shape) as f:
        cfg = json.load(f)
    cfg["vocab_size"] = max(cfg["vocab_size"], a.min_vocab)
    params = expected_params(cfg)
    header, offset = {}, 0
    for name, shape in params:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    if os.path.isdir(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name, shape in params:
            if name.endswith("norm.weight"):
                x = 1.0 + 0.1 * (rng.random(shape, dtype=np.float32) - 0.5)
            else:
                x = 0.02 * np.sqrt(3.0) * (2.0 * rng.random(shape, dtype=np.float32) - 1.0)
            f.write(bf16_bits(x).tobytes())
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"{a.out}: {len(params)} tensors, {offset / 2**30:.2f} GiB of bf16 weights")


if __name__ == "__main__":
    main()
