"""λ on Brax's PPO at the 64-env scaling (results/control/paper-geometry/
lambda-64, an exploratory sweep beside the pre-registered arms, not part of
their rule): per setting and seed, over updates 1–10, the largest approx KL,
the updates with KL > 1, the smallest mean ratio, the last λ and the
update-10 evaluation return, with the 64-env arm's PPO and λ = 0.06 runs as
the reference rows; then every run's per-update table.

    python3 scripts/control/lambda_sweep.py results/control/paper-geometry

Standard library only (the tables are geometry_rule.py's).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from geometry_rule import SEEDS, UPDATES, load, table  # noqa: E402

SETTINGS = [
    ("PPO (clip 0.3)", "envs-64", "ppo"),
    ("R²VPO, λ 0.06 fixed (the paper's)", "envs-64", "r2vpo"),
    ("R²VPO, λ 0.5 fixed", "lambda-64/fixed-0.5", "r2vpo"),
    ("R²VPO, λ 1.5 fixed", "lambda-64/fixed-1.5", "r2vpo"),
    ("R²VPO, λ 3 fixed", "lambda-64/fixed-3", "r2vpo"),
    ("R²VPO, adaptive λ (δ 0.02, η 0.05, from 0.06)", "lambda-64/adaptive", "r2vpo"),
    ("R²VPO, adaptive λ as above, λ ≤ 3", "lambda-64/adaptive-cap3", "r2vpo"),
]


def main():
    root = Path(sys.argv[1])
    print(f"# λ on Brax's PPO, cheetah-run, 64 envs, updates 1–{UPDATES}\n")
    print("| setting | seed | max approx KL | updates with KL > 1 | min mean ratio | last λ | "
          "eval return, update 10 |")
    print("|---|---|---|---|---|---|---|")
    runs = []
    for name, folder, algo in SETTINGS:
        for s in SEEDS:
            rows = load(root / folder, algo, s)
            runs.append((name, s, rows))
            if len(rows) < UPDATES:
                print(f"| {name} | {s} | incomplete ({len(rows)}/{UPDATES}) | | | | |")
                continue
            kl = [r["approx_kl"] for r in rows]
            lam = rows[-1].get("lambda") if algo == "r2vpo" else None
            print(f"| {name} | {s} | {max(kl):.3g} | {sum(k > 1 for k in kl)} | "
                  f"{min(r['ratio_mean'] for r in rows):.3f} | {'–' if lam is None else f'{lam:.3g}'} | "
                  f"{rows[-1]['eval_return_mean']:.1f} |")
    for name, s, rows in runs:
        print(f"\n## {name}, seed {s}\n\n{table(rows)}")


if __name__ == "__main__":
    main()
