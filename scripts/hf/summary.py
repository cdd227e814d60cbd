#!/usr/bin/env python3
"""Table of scripts/hf/compare.sh's measurements in DIR, with r2vpo's ratios
to PyTorch + transformers and #16's goals; writes DIR/summary.md and
DIR/summary.json. Standard library only."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def paired_steps(d: Path, load, rss, name, md: list[str]):
    """Step and scoring pass taken in turns (scripts/hf/turns.py): step i of
    r2vpo beside step i of PyTorch, each pair's ratio, and their median,
    which the goals are judged on."""
    steps, score = [], []
    sections = [("step", "Training step, 8 × (44 + 256) tokens", "goals: time ≤ 0.67×, peak RSS ≤ 1×"),
                ("score", "Scoring pass, no-grad log-probs of 8 × 256 response tokens", "goal: time ≤ 0.67×")]
    for what, title, goals in sections:
        if not (d / f"r2vpo-{what}.json").exists():
            continue
        ours, theirs = load(f"r2vpo-{what}.json")["times_s"], load(f"hf-{what}.json")["times_s"]
        pairs = list(zip(ours, theirs))
        ratios = [o / t for o, t in pairs]
        mid, ours_mid, theirs_mid = median(ratios), median(ours), median(theirs)
        records = [{"r2vpo_s": o, "pytorch_s": t, "time_ratio": r} for (o, t), r in zip(pairs, ratios)]
        md += ["", f"## {title}: {len(pairs)} pairs, r2vpo and PyTorch taking turns ({goals}, on the median "
                   "of the pairs' ratios)\n",
               "| pair | r2vpo s | PyTorch s | time / PyTorch |", "|---|---|---|---|"]
        md += [f"| {i + 1} | {o:.3f} | {t:.3f} | {r:.2f} |" for i, ((o, t), r) in enumerate(zip(pairs, ratios))]
        md.append(f"| median | {ours_mid:.3f} | {theirs_mid:.3f} | **{mid:.2f}** "
                  f"({min(ratios):.2f}–{max(ratios):.2f}; {sum(r <= 0.67 for r in ratios)} of {len(ratios)} "
                  "pairs ≤ 0.67) |")
        if what == "score":
            score = [{"round": None, "r2vpo_s": ours_mid, "pytorch_s": theirs_mid, "time_ratio": mid, "pairs": records}]
            continue
        hs, hm = theirs_mid, rss("hf-step.maxrss")
        md += ["", "| stack | step s (median) | peak RSS GiB | time / PyTorch | RSS / PyTorch |",
               "|---|---|---|---|---|"]
        rows = [("r2vpo, full graph", ours_mid, rss("r2vpo-step.maxrss"), mid)]
        if (d / "r2vpo-ck-step.json").exists():
            ck = load("r2vpo-ck-step.json")["step_s"]
            rows.append(("r2vpo, activation_checkpointing (run alone, after)", ck, rss("r2vpo-ck-step.maxrss"), ck / hs))
        for stack, s, m, r in rows:
            steps.append({"round": None, "stack": stack, "step_s": s, "peak_rss_gib": m, "time_ratio": r,
                          "rss_ratio": m / hm})
            md.append(f"| {stack} | {s:.2f} | {m:.2f} | {r:.2f} | {m / hm:.2f} |")
        steps[0]["pairs"] = records
        steps.append({"round": None, "stack": "PyTorch", "step_s": hs, "peak_rss_gib": hm})
        md.append(f"| PyTorch + transformers | {hs:.2f} | {hm:.2f} | 1 | 1 |")
    return steps, score


def round_steps(d: Path, load, rss, name, md: list[str]):
    """Step and scoring pass in rounds of separate processes, one after the
    other: the layout compare.sh wrote before a4c572f (e.g.
    results/bench/hf-compare/2026-11-26-intel-xeon-avx512-amx/)."""
    srounds = sorted(p.stem.rsplit("-", 1)[1] for p in d.glob("r2vpo-step-[0-9]*.json")) or [None]
    md += ["", f"## Training step, 8 × (44 + 256) tokens, {len(srounds)} round(s) in turn "
               "(goals: time ≤ 0.67×, peak RSS ≤ 1×)\n",
           "| round | stack | step s | peak RSS GiB | time / PyTorch | RSS / PyTorch |", "|---|---|---|---|---|---|"]
    steps = []
    for r in srounds:
        hs, hm = load(name("hf", "step", r, "json"))["step_s"], rss(name("hf", "step", r, "maxrss"))
        rows = [("r2vpo, full graph", name("r2vpo", "step", r, "json"), name("r2vpo", "step", r, "maxrss"))]
        if r in (None, srounds[0]) and (d / "r2vpo-ck-step.json").exists():
            rows.append(("r2vpo, activation_checkpointing", "r2vpo-ck-step.json", "r2vpo-ck-step.maxrss"))
        for stack, js, mx in rows:
            s, m = load(js)["step_s"], rss(mx)
            steps.append({"round": r, "stack": stack, "step_s": s, "peak_rss_gib": m, "time_ratio": s / hs,
                          "rss_ratio": m / hm})
            md.append(f"| {r or 1} | {stack} | {s:.2f} | {m:.2f} | {s / hs:.2f} | {m / hm:.2f} |")
        steps.append({"round": r, "stack": "PyTorch", "step_s": hs, "peak_rss_gib": hm})
        md.append(f"| {r or 1} | PyTorch + transformers | {hs:.2f} | {hm:.2f} | 1 | 1 |")
    score = []
    for r in srounds:
        if not (d / name("r2vpo", "score", r, "json")).exists():
            continue
        ours_s, theirs_s = load(name("r2vpo", "score", r, "json"))["step_s"], load(name("hf", "score", r, "json"))["step_s"]
        score.append({"round": r, "r2vpo_s": ours_s, "pytorch_s": theirs_s, "time_ratio": ours_s / theirs_s})
    if score:
        md += ["", "## Scoring pass, no-grad log-probs of 8 × 256 response tokens (goal: time ≤ 0.67×)\n",
               "| round | r2vpo s | PyTorch s | time / PyTorch |", "|---|---|---|---|"]
        md += [f"| {x['round'] or 1} | {x['r2vpo_s']:.3f} | {x['pytorch_s']:.3f} | {x['time_ratio']:.2f} |" for x in score]
    return steps, score


def main() -> None:
    d = Path(sys.argv[1])
    load = lambda name: json.loads((d / name).read_text())  # noqa: E731
    rss = lambda name: int((d / name).read_text().split()[-1]) / 2**20  # KiB → GiB  # noqa: E731
    # Decode rounds (r2vpo then transformers, in turn); an older layout had one.
    rounds = sorted(p.stem.rsplit("-", 1)[1] for p in d.glob("r2vpo-decode-*.json")) or [None]
    # A measurement's file, `{side}-{what}-{round}.{ext}`; runs with a single
    # round (older layouts) have no round suffix.
    name = lambda side, what, r, ext="json": f"{side}-{what}-{r}.{ext}" if r else f"{side}-{what}.{ext}"  # noqa: E731
    per = [({x["batch"]: x["tokens_per_s"] for x in load(name("r2vpo", "decode", r))["decode"]},
            {x["batch"]: x["tokens_per_s"] for x in load(name("hf", "decode", r))["decode"]}) for r in rounds]
    hf = load(name("hf", "decode", rounds[0]))
    cpu = "this CPU"
    if (d / "lscpu.txt").exists():
        info = dict(line.split(":", 1) for line in (d / "lscpu.txt").read_text().splitlines() if ":" in line)
        flags = info.get("Flags", "").split()
        simd = "AMX" if "amx_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
        cpu = f"{info.get('Model name', '?').strip()} ({simd}, {info.get('CPU(s)', '?').strip()} CPUs)"
    step1 = load("r2vpo-step.json" if (d / "r2vpo-step.json").exists() else name("r2vpo", "step", rounds[0]))
    matmul = f"; r2vpo's many-row products on {step1['matmul']}" if "matmul" in step1 else ""
    md = [f"# r2vpo vs PyTorch {hf['torch']} + transformers {hf['transformers']} on {cpu}{matmul}\n",
          f"## Decode (new tokens/s, {len(per)} round(s) in turn; goal ≥ 1.5×)\n",
          "| batch | r2vpo | transformers | r2vpo / transformers, per round | mean ratio |", "|---|---|---|---|---|"]
    decode = []
    for b in sorted(per[0][0]):
        ratios = [o[b] / t[b] for o, t in per]
        ours_b, theirs_b = [o[b] for o, _ in per], [t[b] for _, t in per]
        mean = sum(ratios) / len(ratios)
        decode.append({"batch": b, "r2vpo": ours_b, "transformers": theirs_b, "ratios": ratios, "ratio": mean})
        md.append(f"| {b} | {' / '.join(f'{x:.1f}' for x in ours_b)} | {' / '.join(f'{x:.1f}' for x in theirs_b)} "
                  f"| {' / '.join(f'{x:.2f}' for x in ratios)} | {mean:.2f} |")
    # Shares of the f32 limit: 2 FLOP per parameter per token (every weight
    # is one multiply–add per token, the tied head included; attention's
    # own products are left out, so the shares are, if anything, low).
    peaks = [load(p.name) for p in sorted(d.glob("peak-*.json"))]
    limit = max(x["gflops_best"] for x in peaks) if peaks else None
    params = next((load(p.name).get("parameters") for p in sorted(d.glob("r2vpo-step*.json"))), None)
    shares = {}
    if limit and params and decode:
        top = decode[-1]
        gflops = [x * 2 * params / 1e9 for x in top["r2vpo"]]
        shares.update(limit_gflops=limit, decode_batch=top["batch"], decode=[g / limit for g in gflops])
        md += ["", f"f32 limit: {limit:.0f} GFLOP/s (the fastest of {sum(x['reps'] for x in peaks)} timed 2048³ "
                   f"products by PyTorch on the same threads, scripts/hf/peak.py). Batch-{top['batch']} decode at "
                   f"2 × {params / 1e6:.1f} M FLOP per token: "
                   + " / ".join(f"{g:.0f} GFLOP/s = {s:.0%}" for g, s in zip(gflops, shares["decode"]))
                   + " of the limit (goal ≥ 50 %)."]
    paired = all((d / f).exists() and "times_s" in load(f) for f in ("r2vpo-step.json", "hf-step.json"))
    steps, score = (paired_steps if paired else round_steps)(d, load, rss, name, md)
    if score and "limit_gflops" in shares:
        sc = load("r2vpo-score.json" if paired else name("r2vpo", "score", score[0]["round"], "json"))
        flop = 2 * params * sc["batch"] * (sc["prompt"] + sc["response"])
        shares["score"] = [flop / x["r2vpo_s"] / 1e9 / limit for x in score]
        md += ["", f"Scoring at 2 × {params / 1e6:.1f} M FLOP per token over {sc['batch']} × "
                   f"({sc['prompt']} + {sc['response']}) tokens ({flop / 1e12:.2f} TFLOP): r2vpo at "
                   + " / ".join(f"{s:.0%}" for s in shares["score"]) + " of the limit; 0.67× PyTorch's time needs "
                   + " / ".join(f"{flop / (0.67 * x['pytorch_s']) / 1e9 / limit:.0%}" for x in score) + "."]
    for fname, text in [("summary.json", json.dumps({"decode": decode, "step": steps, "score": score, "limit": shares}, indent=2)),
                       ("summary.md", "\n".join(md) + "\n")]:
        tmp = d / (fname + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, d / fname)
    print("\n".join(md))


if __name__ == "__main__":
    main()
