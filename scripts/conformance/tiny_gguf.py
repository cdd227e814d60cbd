"""Writes a tiny random Llama GGUF that llama.cpp and r2vpo both load.

The tokenizer (vocabulary, merges, special ids, chat template) is copied from
the embedded SmolLM2 GGUF, so both sides tokenize alike; the weights are
random f32 (seeded), two layers of width 64. Used by `make test-conformance`.

usage: tiny_gguf.py SOURCE.gguf OUT.gguf [SEED]
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_field(w, field):
    name = field.name
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        w.add_array(name, vals)
    elif kind == GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
    else:
        w.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)


def main():
    src, out = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    r = GGUFReader(src)
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    hidden, ffn, layers, heads, kv_heads = 64, 128, 2, 4, 2
    w = GGUFWriter(out, "llama")
    w.add_name("tiny-random")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(0)  # all f32
    for name, field in r.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.ggml.add_bos_token":
            copy_field(w, field)
    # Both sides must see the same prompt ids: no implicit BOS.
    w.add_add_bos_token(False)
    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def t(*shape, std=0.5):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w.add_tensor("token_embd.weight", t(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(heads * hd, hidden, std=0.2))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(kv_heads * hd, hidden, std=0.2))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(kv_heads * hd, hidden, std=0.2))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(hidden, heads * hd, std=0.2))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(ffn, hidden, std=0.2))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(ffn, hidden, std=0.2))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, ffn, std=0.2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


if __name__ == "__main__":
    main()
