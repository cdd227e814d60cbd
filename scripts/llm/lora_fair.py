"""The pre-registered analysis of results/llm/lora-fair (README.md there).

    python3 scripts/llm/lora_fair.py extend ROOT   # grid points to add: METHOD:LR per line
    python3 scripts/llm/lora_fair.py pick ROOT     # "LORA_LR FULL_LR"
    python3 scripts/llm/lora_fair.py report ROOT   # the tables and the verdict (markdown)

ROOT holds sweep/{lora,full}-lr<LR>/ (seed 0, validation) and
final/{lora,full}-seed<S>/ (held-out). Standard library only.
"""

import json
import sys
from pathlib import Path

METHODS = ("lora", "full")
GRID = {"lora": ["5e-5", "2e-4", "8e-4"], "full": ["5e-6", "2e-5", "8e-5"]}
SEEDS = (0, 1, 2)


def last_eval(run):
    """The run's held-out or validation record after its last iteration, or None."""
    f = run / "eval.jsonl"
    if not f.exists() or not f.read_text().strip():
        return None
    return json.loads(f.read_text().strip().splitlines()[-1])


def skip_of(run):
    """eval.data.skip from the run's config.toml (0 when absent)."""
    text = (run / "config.toml").read_text()
    section = None
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "eval.data" and line.startswith("skip"):
            return int(line.split("=")[1])
    return 0


def sweep(root):
    """{method: {lr: eval record}} of the finished sweep runs, each checked to be on validation."""
    out = {m: {} for m in METHODS}
    for run in sorted((root / "sweep").glob("*-lr*")):
        method, lr = run.name.split("-lr")
        rec = last_eval(run)
        if rec is None:
            continue
        if skip_of(run) != 100 or rec["problems"] != 100:
            sys.exit(f"{run}: not evaluated on the validation split (eval.data.skip 100, 100 problems)")
        out[method][lr] = rec
    return out


def best(records):
    """The rate with the highest validation avg@4; a tie goes to the smaller rate."""
    return max(sorted(records, key=float), key=lambda lr: (records[lr]["avg_at_k"], -float(lr)))


def extend(root):
    s = sweep(root)
    for m in METHODS:
        if not all(lr in s[m] for lr in GRID[m]):
            sys.exit(f"{m}: the sweep is not finished ({sorted(s[m])} of {GRID[m]})")
        lrs = sorted(s[m], key=float)
        b = best(s[m])
        if b == lrs[0] and b == GRID[m][0]:
            print(f"{m}:{float(b) / 4:g}")
        elif b == lrs[-1] and b == GRID[m][-1]:
            print(f"{m}:{float(b) * 4:g}")


def pick(root):
    s = sweep(root)
    print(best(s["lora"]), best(s["full"]))


def pct(x):
    return f"{100 * x:.2f} %"


def report(root):
    s = sweep(root)
    print(f"# {root}: LoRA against full fine-tuning, picked on validation, reported on held-out\n")
    print("## Sweep (seed 0, validation: arith-eval problems 100–199)\n")
    print("| method | lr | avg@4 | pass@4 | maj@4 | response tokens |")
    print("|---|---|---|---|---|---|")
    for m in METHODS:
        for lr in sorted(s[m], key=float):
            r = s[m][lr]
            mark = " (picked)" if s[m] and lr == best(s[m]) else ""
            print(f"| {m} | {lr}{mark} | {pct(r['avg_at_k'])} | {pct(r['pass_at_k'])} | {pct(r['maj_at_k'])} "
                  f"| {r['response_len_mean']:.1f} |")
    final = {m: {k: last_eval(root / "final" / f"{m}-seed{k}") for k in SEEDS} for m in METHODS}
    missing = [f"{m}-seed{k}" for m in METHODS for k in SEEDS if final[m][k] is None]
    for m in METHODS:
        for k in SEEDS:
            r = final[m][k]
            if r is not None and (skip_of(root / "final" / f"{m}-seed{k}") != 0 or r["problems"] != 100):
                sys.exit(f"final/{m}-seed{k}: not evaluated on the held-out problems")
    print("\n## Held-out (arith-eval problems 0–99), seeds 0, 1, 2 at each pick\n")
    print("| method | seed 0 | seed 1 | seed 2 | mean | min–max |")
    print("|---|---|---|---|---|---|")
    for m in METHODS:
        v = [final[m][k]["avg_at_k"] if final[m][k] else None for k in SEEDS]
        got = [x for x in v if x is not None]
        cells = " | ".join("–" if x is None else pct(x) for x in v)
        tail = f"{pct(sum(got) / len(got))} | {pct(min(got))}–{pct(max(got))}" if got else "– | –"
        print(f"| {m} | {cells} | {tail} |")
    if missing:
        print(f"\n## Verdict\n\nincomplete: {', '.join(missing)} not finished")
        return
    d = [final["lora"][k]["avg_at_k"] - final["full"][k]["avg_at_k"] for k in SEEDS]
    mean = sum(d) / 3
    if all(x > 0 for x in d):
        out = "LoRA ahead of full fine-tuning"
    elif all(x < 0 for x in d):
        out = "LoRA behind full fine-tuning"
    else:
        out = "not distinguishable with 3 seeds"
    print("\n## Verdict\n")
    print("- LoRA − full, held-out avg@4, per seed: " + ", ".join(f"{100 * x:+.2f}" for x in d)
          + f" points; mean {100 * mean:+.2f}")
    print(f"- **outcome: {out}**")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("extend", "pick", "report"):
        sys.exit(__doc__)
    {"extend": extend, "pick": pick, "report": report}[sys.argv[1]](Path(sys.argv[2]))


if __name__ == "__main__":
    main()
