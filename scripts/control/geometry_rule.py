"""The pre-registered analysis of results/control/paper-geometry (README.md
there): per-update tables of every run and the rule's verdict, for one arm
folder (e.g. results/control/paper-geometry/envs-64).

    python3 scripts/control/geometry_rule.py results/control/paper-geometry/envs-64

Standard library only. A run with fewer than 10 updates is reported as
incomplete and the verdict says which runs it still needs.
"""

import json
import sys
from pathlib import Path

TASK = "cheetah-run"
SEEDS = (0, 1, 2)
UPDATES = 10
COLUMNS = [
    ("update", "{:>3}"),
    ("approx_kl", "{:>9.4f}"),
    ("ratio_mean", "{:>7.3f}"),
    ("sq_dev", "{:>10.4g}"),
    ("clip_frac", "{:>6.3f}"),
    ("entropy", "{:>8.3f}"),
    ("sigma_mean", "{:>7.3f}"),
    ("eval_return_mean", "{:>7.1f}"),
]


def load(arm: Path, algo: str, seed: int):
    path = arm / TASK / f"{algo}-seed{seed}" / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    return [r for r in rows if r["update"] <= UPDATES]


def table(rows):
    out = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = []
        for name, fmt in COLUMNS:
            v = r.get(name)
            cells.append("–" if v is None else fmt.format(v).strip())
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def verdict(runs, first_update):
    """The rule over updates first_update..10 (README: primary from 1,
    secondary from 2)."""
    def window(rows):
        return [r for r in rows if r["update"] >= first_update]

    ppo_calm = sum(all(r["approx_kl"] < 0.1 for r in window(runs["ppo"][s])) for s in SEEDS)
    r2_alive = sum(all(r["ratio_mean"] > 0.5 for r in window(runs["r2vpo"][s])) for s in SEEDS)
    ppo_kl1 = sum(any(r["approx_kl"] > 1.0 for r in window(runs["ppo"][s])) for s in SEEDS)
    r2_kl1 = sum(any(r["approx_kl"] > 1.0 for r in window(runs["r2vpo"][s])) for s in SEEDS)
    lines = [
        f"- PPO seeds with approx KL < 0.1 at every update {first_update}–10: {ppo_calm} of 3",
        f"- R²VPO seeds with mean ratio > 0.5 at every update {first_update}–10: {r2_alive} of 3",
        f"- seeds with approx KL > 1 at some update {first_update}–10: PPO {ppo_kl1} of 3, R²VPO {r2_kl1} of 3",
    ]
    scaling = ppo_calm >= 2 and r2_alive >= 2
    objective = ppo_kl1 >= 2 and r2_kl1 >= 2
    if scaling and not objective:
        lines.append("- **outcome: the earlier failure was the scaling** (both methods held their trust region here)")
    elif objective and not scaling:
        lines.append("- **outcome: the objective at this λ (or the implementation)**: both crossed KL > 1 by update 10")
    elif scaling and objective:
        lines.append("- **outcome: both conditions hold** (cannot happen with these thresholds; a bug in this script)")
    else:
        lines.append("- **outcome: neither condition of the rule holds**: the rule does not decide")
    return lines


def main():
    arm = Path(sys.argv[1])
    runs = {a: {s: load(arm, a, s) for s in SEEDS} for a in ("ppo", "r2vpo")}
    missing = [f"{a}-seed{s} ({len(r)}/{UPDATES})" for a in runs for s, r in runs[a].items() if len(r) < UPDATES]
    print(f"# {arm}: {TASK}, updates 1–{UPDATES}\n")
    for a in ("ppo", "r2vpo"):
        for s in SEEDS:
            print(f"## {a}, seed {s}\n\n{table(runs[a][s])}\n")
    if missing:
        print("## Verdict\n\nincomplete: " + ", ".join(missing))
        return
    print("## Verdict (primary: updates 1–10, the rule as pre-registered)\n")
    print("\n".join(verdict(runs, 1)))
    print("\n## Secondary reading (updates 2–10, pre-registered beside it)\n")
    print("\n".join(verdict(runs, 2)))


if __name__ == "__main__":
    main()
