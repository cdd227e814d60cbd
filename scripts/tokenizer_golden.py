#!/usr/bin/env python3
"""Golden token ids for r2vpo-llm's GGUF tokenizer parity test.

Builds the SmolLM2-135M-Instruct tokenizer from the embedded GGUF file with
Hugging Face `transformers` (its own GGUF -> fast-tokenizer converter, an
implementation independent of r2vpo's) and writes the token ids of a set of
tricky strings (digits, whitespace runs, unicode, code, chat markup) to
`crates/r2vpo-llm/golden/tokenizer_smollm2.json`. The Rust test
(`tests/tokenizer_parity.rs`) needs no Python.

Usage (creates a throw-away virtualenv; needs network access to PyPI):
    python3 scripts/tokenizer_golden.py       # venv in /tmp/r2vpo-tokgolden-venv
Set R2VPO_TOKGOLDEN_PYTHON to an interpreter that already has torch,
transformers and gguf to skip the venv (transformers' GGUF reader imports
torch even for the tokenizer).
"""
import json
import os
import subprocess
import sys

VENV = os.environ.get("R2VPO_TOKGOLDEN_VENV", "/tmp/r2vpo-tokgolden-venv")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, ".deps", "models")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(ROOT, "crates", "r2vpo-llm", "golden", "tokenizer_smollm2.json")

STRINGS = [
    "",
    "The capital of France is Paris.",
    "12345 + 678 = 13023; 3.14159, -0.5e-10, 1,000,000",
    "abc123def x2+y2=z2 2024-01-31 0.000001 99.9% $1,234.56",
    "  leading spaces,\ttabs\t\tand\n\n\nnewline runs   \n  ",
    "     ",
    "\n",
    " \n \n\n  \t\r\n",
    "naïve café — Ünïcödé, 中文字符, 日本語, emoji 🤖🎉👍🏽, Ω≈ç√∫",
    "한국어 العربية עברית ไทย e\u0301 \u200d\u200b",
    "fn main() { println!(\"{}\", x[0] >> 2); } // code\r\n",
    "I'll they're it's WE'VE you'd",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|>c",
    "\\boxed{\\frac{1}{2}} and $x^2 + y^2 = z^2$",
    "<think>\nreasoning\n</think>\n\nAnswer: 4",
    "Let's compute 17 * 23: 17 * 20 = 340, 17 * 3 = 51, total 391.",
]


def ensure_env():
    py = os.environ.get("R2VPO_TOKGOLDEN_PYTHON")
    if py:
        if os.path.abspath(sys.executable) != os.path.abspath(py):
            os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
        return
    vpy = os.path.join(VENV, "bin", "python")
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    if not os.path.exists(vpy):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([vpy, "-m", "pip", "install", "-q", "torch", "transformers", "gguf"])
    os.execv(vpy, [vpy, os.path.abspath(__file__)] + sys.argv[1:])


def main():
    ensure_env()
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=GGUF)
    cases = []
    for s in STRINGS:
        ids = tok.encode(s, add_special_tokens=False)
        cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
    out = {
        "source": f"transformers {transformers.__version__} AutoTokenizer.from_pretrained(gguf_file={GGUF!r})",
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
