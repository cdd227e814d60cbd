#!/usr/bin/env python3
"""Long responses for timing the verifier at rollout size.

    python3 scripts/math_verify/long_cases.py > /tmp/long.jsonl
    cargo run --release -p r2vpo-verify --example score -- /tmp/long.jsonl

Writes 1,024 cases (a 128 × 8 iteration): each is a fixture case of
crates/r2vpo-verify/tests/fixtures/cases.jsonl with a reasoning block of
about 30,000 characters (5,000 words drawn, seeded, from one arithmetic
sentence) and 2,000 more characters of it before the fixture's response,
about the size of an 8 k-token rollout. The labels are the fixtures', so
the padding (which contains numbers and `$…$` spans) can change a verdict;
the file is for timing, not for agreement.
"""
import json
import random
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "crates/r2vpo-verify/tests/fixtures/cases.jsonl"
WORDS = ("Let us compute the value step by step; we have $x^2 + 3x = 10$ so that $(x+5)(x-2)=0$ "
         "and hence x = 2 or x = -5. Checking: 4 + 6 = 10.").split()


def main() -> None:
    random.seed(0)
    cases = [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]
    for i in range(1024):
        c = cases[i % len(cases)]
        pad = " ".join(random.choice(WORDS) for _ in range(5000))
        response = "<think>\n" + pad + "\n</think>\n" + pad[:2000] + "\n" + c["response"]
        print(json.dumps({"id": f"long-{i}", "response": response, "gold": c["gold"], "correct": c["correct"]}))


if __name__ == "__main__":
    main()
