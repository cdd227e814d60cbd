#!/usr/bin/env python3
r"""Hugging Face math-verify's verdict on a JSONL fixture of (response, gold) pairs.

Usage (inside the venv made by scripts/math_verify/venv.sh):

    .deps/venv-math-verify/bin/python scripts/math_verify/judge.py CASES.jsonl [--explain]
        [--answer-latex-only] [--hard-timeout SECONDS] > verdicts.jsonl

Each input line is a JSON object with at least "id", "response" and "gold"
(crates/r2vpo-verify/tests/fixtures/cases.jsonl). Each output line, in input
order, is {"id": ..., "math_verify": true|false, "error": null|"..."};
--explain adds "gold_parsed" and "answer_parsed" (math-verify's parse lists as
text) for reading disagreements.

Configuration, and why
----------------------
The verdict is the reward that the ecosystem's GRPO trainers give, modelled on
Open-R1's `accuracy_reward` (huggingface/open-r1, src/open_r1/rewards.py) and
TRL's `trl.rewards.accuracy_reward` (huggingface/trl,
trl/rewards/accuracy_rewards.py), which both call math-verify like this:

* gold: ``parse(gold, extraction_config=[LatexExtractionConfig(),
  ExprExtractionConfig()], extraction_mode="first_match")``. These are
  ``parse``'s default targets, as in Open-R1's latest ``parse(sol,
  extraction_mode="first_match")`` and TRL's ``parse(sol)``. math-verify's
  README says LaTeX is only extracted from inside a math environment
  ("`\[ x = 1 \]` is valid, but `x = 1` will not extract anything"), and
  Open-R1's datasets give a whole solution whose answer sits in ``\boxed{}``.
  A dataset's bare gold (``(3, \frac{\pi}{2})``, ``\text{(C)}``, ``1, 2``) is
  therefore wrapped in ``$...$`` first, unless it already holds a math
  delimiter (an unescaped ``$``, ``\(``, ``\[``, ``\boxed``, ``\fbox``). Bare
  plain numbers are wrapped too: for them both targets read the same value,
  except that a bare ``1,2`` is read by ExprExtractionConfig as the decimal
  1.2 while ``$1,2$`` is the set {1, 2}, and a dataset gold means the latter.
* answer: ``parse(response, extraction_config=[LatexExtractionConfig(
  normalization_config=NormalizationConfig(nits=False,
  malformed_operators=False, basic_latex=True, equations=True, boxed="all",
  units=True), boxed_match_priority=0, try_extract_without_anchor=False),
  ExprExtractionConfig()], extraction_mode="first_match")``. The
  LatexExtractionConfig is Open-R1's exactly ("we require the answer to be
  provided in correct latex (no malformed operators)"; ``boxed_match_priority=0``
  "ensures that boxed is tried first"). ExprExtractionConfig is added, as
  math-verify's README recommends for predictions ("we recommend using
  LatexExtractionConfig() and ExprExtractionConfig() together unless you have
  control over the model output"), so plain answer lines such as GSM8K's
  ``#### 72`` or ``The answer is 12.`` are read; Open-R1 and TRL omit it, and
  ``--answer-latex-only`` reproduces them exactly.
* comparison: ``verify(gold, answer)``, gold first as math-verify's README
  and TRL require (verify is not symmetric), with its defaults
  (float_rounding=6, numeric_precision=15, strict=True,
  allow_set_relation_comp=False).
* timeouts: math-verify's own, ``parse(..., parsing_timeout=5)`` and
  ``verify(..., timeout_seconds=5)`` (SIGALRM-based, so each case runs in the
  main thread of a worker process). A hard limit (--hard-timeout, default 60 s)
  kills the worker when those alarms cannot fire (a long computation inside C
  code), and the worker's address space is capped (--memory-gib, default 4),
  so one pathological case cannot hang or exhaust the machine. Either way the
  case is false with the reason in "error".
* failures: any exception, an unparseable gold, or a hard timeout is false
  with the error text; Open-R1 would instead reward an unparseable gold with 1
  and TRL skip it (None), neither of which is a verdict on the response.
* the ``<think>`` block is not removed, as in ``accuracy_reward`` (TRL's
  ``reasoning_accuracy_reward`` would cut at ``</think>``).
"""

import argparse
import json
import multiprocessing as mp
import re
import sys

_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")


def wrap_gold(gold: str) -> str:
    """The gold as math-verify's LaTeX extraction needs it: in a math environment."""
    text = gold.strip()
    if _DELIMITER.search(text):
        return text
    return f"${text}$"


def _configs(answer_latex_only: bool):
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    gold_cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    answer_cfg = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(
                nits=False,
                malformed_operators=False,
                basic_latex=True,
                equations=True,
                boxed="all",
                units=True,
            ),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
    ]
    if not answer_latex_only:
        answer_cfg.append(ExprExtractionConfig())
    return gold_cfg, answer_cfg


def judge_one(response: str, gold: str, gold_cfg, answer_cfg) -> dict:
    """math-verify's verdict on one pair; never raises."""
    from math_verify import parse, verify

    out = {"math_verify": False, "error": None, "gold_parsed": None, "answer_parsed": None}
    try:
        gold_parsed = parse(wrap_gold(gold), extraction_config=gold_cfg, extraction_mode="first_match")
        out["gold_parsed"] = str(gold_parsed)
        if len(gold_parsed) == 0:
            out["error"] = "gold not parseable by math-verify"
            return out
        answer_parsed = parse(response, extraction_config=answer_cfg, extraction_mode="first_match")
        out["answer_parsed"] = str(answer_parsed)
        out["math_verify"] = bool(verify(gold_parsed, answer_parsed))
    except BaseException as e:  # noqa: BLE001 - any failure is a false verdict
        if isinstance(e, KeyboardInterrupt):
            raise
        out["math_verify"] = False
        out["error"] = f"{type(e).__name__}: {e}"[:500]
    return out


def _worker(conn, answer_latex_only: bool, memory_gib: float):
    import logging
    import resource

    logging.disable(logging.CRITICAL)  # math-verify logs timeouts/parse failures; stdout stays JSON
    if memory_gib > 0:
        limit = int(memory_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    gold_cfg, answer_cfg = _configs(answer_latex_only)
    while True:
        item = conn.recv()
        if item is None:
            return
        response, gold = item
        conn.send(judge_one(response, gold, gold_cfg, answer_cfg))


class Judge:
    """A worker process that is replaced when a case exceeds the hard timeout."""

    def __init__(self, answer_latex_only: bool, hard_timeout: float, memory_gib: float):
        self.args = (answer_latex_only, memory_gib)
        self.hard_timeout = hard_timeout
        self.ctx = mp.get_context("fork")
        self.proc = None
        self.conn = None

    def _start(self):
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent

    def _stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.conn.close()
        self.proc = None
        self.conn = None

    def __call__(self, response: str, gold: str) -> dict:
        if self.proc is None:
            self._start()
        self.conn.send((response, gold))
        if self.conn.poll(self.hard_timeout):
            try:
                return self.conn.recv()
            except EOFError:
                code = self.proc.exitcode
                self._stop()
                return {"math_verify": False, "error": f"worker died (exit code {code})"}
        self._stop()
        return {
            "math_verify": False,
            "error": f"hard timeout after {self.hard_timeout:g}s (math-verify's own timeouts did not fire)",
        }

    def close(self):
        if self.proc is not None:
            try:
                self.conn.send(None)
                self.proc.join(5)
            finally:
                self._stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("cases", help="JSONL file with id, response and gold per line")
    ap.add_argument("--explain", action="store_true", help="add gold_parsed and answer_parsed to each line")
    ap.add_argument(
        "--answer-latex-only",
        action="store_true",
        help="parse the response with Open-R1's LatexExtractionConfig alone, as Open-R1 and TRL do",
    )
    ap.add_argument("--hard-timeout", type=float, default=60.0, help="seconds per case before the worker is killed")
    ap.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap of the worker (0: none)")
    args = ap.parse_args(argv)

    try:
        import math_verify  # noqa: F401
    except ImportError:
        print(
            "judge.py: math_verify is not importable; run scripts/math_verify/venv.sh and use "
            ".deps/venv-math-verify/bin/python",
            file=sys.stderr,
        )
        return 2

    try:
        f = open(args.cases, encoding="utf-8")
    except OSError as e:
        print(f"judge.py: cannot read {args.cases}: {e.strerror}", file=sys.stderr)
        return 2
    judge = Judge(args.answer_latex_only, args.hard_timeout, args.memory_gib)
    try:
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    case = json.loads(line)
                    response, gold, case_id = case["response"], case["gold"], case["id"]
                except (ValueError, KeyError, TypeError) as e:
                    print(f"judge.py: {args.cases}:{lineno}: bad case: {e}", file=sys.stderr)
                    return 2
                result = judge(response, gold)
                row = {"id": case_id, "math_verify": result["math_verify"], "error": result["error"]}
                if args.explain:
                    row["gold_parsed"] = result.get("gold_parsed")
                    row["answer_parsed"] = result.get("answer_parsed")
                sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
                sys.stdout.flush()
    finally:
        judge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
