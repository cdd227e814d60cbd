#!/usr/bin/env python3
"""Policy-update diagnostics of a `r2vpo control compare` folder, as a
Markdown table: per task and algorithm, the mean over seeds of each run's
mean over its last N updates (default 60) of approx-KL(π_old‖π) per update,
the fraction of samples with ρ outside [1−ε, 1+ε], E[(ρ−1)²], policy
entropy and λ.

    python3 scripts/control_diagnostics.py COMPARE_DIR [--last N]

Standard library only; reads `<task>/<algo>-seed<s>/metrics.jsonl`.
"""
import argparse
import json
import pathlib
import re
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compare_dir", type=pathlib.Path)
    ap.add_argument("--last", type=int, default=60, help="updates averaged at the end of each run")
    a = ap.parse_args()
    rows = {}
    for m in sorted(a.compare_dir.glob("*/*-seed*/metrics.jsonl")):
        task, run = m.parent.parent.name, m.parent.name
        algo = re.sub(r"-seed\d+$", "", run)
        lines = [json.loads(l) for l in m.read_text().splitlines() if l.strip()]
        if not lines:
            continue
        tail = lines[-a.last:]
        keys = ["approx_kl", "clip_frac", "sq_dev", "entropy", "lambda"]
        stats = {k: statistics.fmean(x[k] for x in tail) for k in keys}
        # λ means nothing for PPO's clip (the trainer logs the unused value).
        cfg = (m.parent / "config.toml").read_text() if (m.parent / "config.toml").exists() else ""
        stats["has_lambda"] = not re.search(r'^kind\s*=\s*"clip"', cfg, re.M)
        rows.setdefault((task, algo), []).append(stats)
    if not rows:
        print(f"{a.compare_dir}: no <task>/<algo>-seed<s>/metrics.jsonl found", file=sys.stderr)
        return 1
    print(f"| task | algorithm | seeds | approx KL per update | outside [1−ε, 1+ε] | E[(ρ−1)²] | entropy | λ |")
    print("|---|---|---|---|---|---|---|---|")
    for (task, algo), runs in rows.items():
        mean = {k: statistics.fmean(r[k] for r in runs) for k in runs[0] if k != "has_lambda"}
        lam = f"{mean['lambda']:.3f}" if runs[0]["has_lambda"] else "–"
        print(
            f"| {task} | {algo} | {len(runs)} | {mean['approx_kl']:.3f} | {mean['clip_frac']:.2f} | "
            f"{mean['sq_dev']:.3f} | {mean['entropy']:.2f} | {lam} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
