#!/usr/bin/env python3
"""Small Parquet / JSONL fixtures for r2vpo-llm's dataset loader tests.

Writes, with pyarrow, the files under `crates/r2vpo-llm/tests/data/` that
`tests/data_parquet.rs` reads (the Rust tests need no Python):

* `verl.parquet` — verl's RL dataset layout with DAPO-Math-17k's columns and
  types: `data_source: string`, `prompt: list<struct<content, role>>`,
  `ability: string`, `reward_model: struct<ground_truth, style>`,
  `extra_info: struct<index>`. Six rows in three row groups: DAPO-templated
  prompts, a system + user chat, a multi-turn chat (the last `user` message is
  the question), unicode, an exact duplicate question, and a row whose
  `extra_info` is null. Snappy-compressed (pyarrow's default).
* `verl.jsonl` — the same six records as JSON lines (`ensure_ascii=False`).
* `flat.parquet` — top-level `question: string`, `answer: int64`,
  `subject: string`, plus columns the loader must ignore or reject when asked
  for (`difficulty: double`, `tags: list<string>`, `note: string` with a null);
  one question repeats another up to case and whitespace. Snappy.
* `flat_gzip.parquet`, `flat_lz4.parquet`, `flat_zstd.parquet`,
  `flat_brotli.parquet` — the same table with other codecs.
* `verl_no_ground_truth.parquet` — `reward_model` lacks `ground_truth`.
* `verl_prompt_string.parquet` — `prompt` is a plain string, not a chat list.

Usage (creates a throw-away virtualenv; needs network access to PyPI):
    python3 scripts/parquet_fixture.py           # venv in /tmp/r2vpo-parquet-venv
    python3 scripts/parquet_fixture.py --bench /tmp/big.parquet 200000
The second form writes a large DAPO-shaped file (each question repeated 100
times, like DAPO-Math-17k's 1.79M rows of ~17.9k questions) for timing the
loader; it is not committed.
Set R2VPO_PARQUET_PYTHON to an interpreter that already has pyarrow to skip
the venv.
"""
import json
import os
import subprocess
import sys

VENV = os.environ.get("R2VPO_PARQUET_VENV", "/tmp/r2vpo-parquet-venv")
PYARROW = "pyarrow==26.0.1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "r2vpo-llm", "tests", "data")


def ensure_env():
    py = os.environ.get("R2VPO_PARQUET_PYTHON")
    if py:
        if os.path.abspath(sys.executable) != os.path.abspath(py):
            os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
        return
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    vpy = os.path.join(VENV, "bin", "python")
    if not os.path.exists(vpy):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([vpy, "-m", "pip", "install", "-q", PYARROW])
    os.execv(vpy, [vpy, os.path.abspath(__file__)] + sys.argv[1:])


# DAPO-Math-17k's prompt wrapper (identical to r2vpo's `PromptTemplate::Dapo`).
DAPO = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
STYLE = "rule-lighteval/MATH_v2"


def user(text):
    return {"content": text, "role": "user"}


def verl_rows():
    q0 = "In triangle $ABC$, $AB = 13$, $BC = 14$ and $CA = 15$. Find the area of triangle $ABC$."
    q1 = "How many positive divisors does $2^{4} \\cdot 3^{2}$ have?"
    q2 = "Функция $f(x) = x^2 - 2x$ задана на ℝ. Найдите её минимум (数学, ≤, π, café)."
    q4 = "Compute $\\dfrac{1}{2} + \\dfrac{1}{3}$."
    q5 = "What is $7 \\times 8$?"
    rows = [
        ("math_dapo", [user(DAPO.format(q0))], "84", "a1f3c2d4-0000-4000-8000-000000000001"),
        (
            "math_dapo",
            [{"content": "You are a careful mathematician.", "role": "system"}, user(DAPO.format(q1))],
            "15",
            "a1f3c2d4-0000-4000-8000-000000000002",
        ),
        ("math_dapo", [user(DAPO.format(q2))], "-1", "a1f3c2d4-0000-4000-8000-000000000003"),
        # DAPO-Math-17k repeats every question; the copy has its own index.
        ("math_dapo", [user(DAPO.format(q0))], "84", "a1f3c2d4-0000-4000-8000-000000000004"),
        (
            "aime",
            [
                user("Warm-up: what is 1 + 1?"),
                {"content": "2", "role": "assistant"},
                user(DAPO.format(q4)),
            ],
            "\\frac{5}{6}",
            "a1f3c2d4-0000-4000-8000-000000000005",
        ),
        ("aime", [user(DAPO.format(q5))], "56", None),
    ]
    out = []
    for source, prompt, gold, index in rows:
        out.append(
            {
                "data_source": source,
                "prompt": prompt,
                "ability": "MATH",
                "reward_model": {"ground_truth": gold, "style": STYLE},
                "extra_info": None if index is None else {"index": index},
            }
        )
    return out


def verl_schema(pa):
    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(message)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
            ("extra_info", pa.struct([("index", pa.string())])),
        ]
    )


def flat_table(pa):
    return pa.table(
        {
            "question": [
                "What is 12 * 12?",
                "Ile to jest 2 + 2? Zażółć gęślą jaźń — ∑ 🙂",
                "  WHAT is 12 *   12?  ",
                "Solve x + 3 = 10 for x.",
            ],
            "answer": pa.array([144, 4, 144, 7], pa.int64()),
            "subject": ["arithmetic", "unicode", "arithmetic", "algebra"],
            "difficulty": pa.array([1.0, 0.5, 1.0, 2.25], pa.float64()),
            "tags": pa.array([["a"], [], ["a", "dup"], ["b"]], pa.list_(pa.string())),
            "note": pa.array(["n1", "n2", None, "n4"], pa.string()),
        }
    )


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def bench(path, n):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    unique = max(1, n // 100)
    for i in range(n):
        k = i % unique
        q = f"Problem {k}: find the number of integers $n$ with $1 \\le n \\le {1000 + k}$ divisible by 7. " * 3
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [user(DAPO.format(q))],
                "ability": "MATH",
                "reward_model": {"ground_truth": str((1000 + k) // 7), "style": STYLE},
                "extra_info": {"index": f"bench-{k:08d}"},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows, schema=verl_schema(pa)), path, compression="snappy")
    print(f"wrote {path}: {n} rows, {unique} distinct questions, {os.path.getsize(path)} bytes")


def main():
    ensure_env()
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(sys.argv) == 4 and sys.argv[1] == "--bench":
        bench(sys.argv[2], int(sys.argv[3]))
        return
    os.makedirs(OUT, exist_ok=True)

    def out(name):
        return os.path.join(OUT, name)

    rows = verl_rows()
    verl = pa.Table.from_pylist(rows, schema=verl_schema(pa))
    # Three row groups, so the loader's row numbering crosses group boundaries.
    pq.write_table(verl, out("verl.parquet"), compression="snappy", row_group_size=2)
    write_jsonl(out("verl.jsonl"), rows)

    flat = flat_table(pa)
    pq.write_table(flat, out("flat.parquet"), compression="snappy")
    for codec in ["gzip", "lz4", "zstd", "brotli"]:
        pq.write_table(flat, out(f"flat_{codec}.parquet"), compression=codec)

    no_gt = pa.Table.from_pylist(
        [{"data_source": "math_dapo", "prompt": [user("What is 1 + 1?")], "reward_model": {"style": STYLE}}],
        schema=pa.schema(
            [
                ("data_source", pa.string()),
                ("prompt", verl_schema(pa).field("prompt").type),
                ("reward_model", pa.struct([("style", pa.string())])),
            ]
        ),
    )
    pq.write_table(no_gt, out("verl_no_ground_truth.parquet"), compression="snappy")

    prompt_str = pa.Table.from_pylist(
        [
            {"data_source": "math_dapo", "prompt": "What is 1 + 1?", "reward_model": {"ground_truth": "2"}},
        ],
        schema=pa.schema(
            [
                ("data_source", pa.string()),
                ("prompt", pa.string()),
                ("reward_model", pa.struct([("ground_truth", pa.string())])),
            ]
        ),
    )
    pq.write_table(prompt_str, out("verl_prompt_string.parquet"), compression="snappy")

    for name in sorted(os.listdir(OUT)):
        print(f"{name}: {os.path.getsize(out(name))} bytes")


if __name__ == "__main__":
    main()
