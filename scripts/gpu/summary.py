#!/usr/bin/env python3
"""Combines what scripts/gpu/check.sh measured in DIR into DIR/summary.json
and DIR/summary.md: the correctness checks, each stack's step time,
tokens/s and peak GPU memory, and r2vpo's ratios to PyTorch (the torch
backend's bars: tokens/s ≥ 0.9×, peak memory ≤ 1.2×; candle's: ≥ 0.5×,
≤ 1.5×). Standard library only."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def load(p: Path):
    return json.loads(p.read_text()) if p.exists() else None


def peak(p: Path):
    t = p.read_text().strip() if p.exists() else ""
    return int(t) if t else None


def stack(d: Path, name: str, tag: str):
    """One stack's step JSON with its peak GPU MiB, or None."""
    r = load(d / f"{name}{tag}-step.json")
    if r:
        r["peak_mib"] = peak(d / f"{name}{tag}-step-peak-mib")
    return r


def against(a, b, prefix: str) -> dict:
    """`a`'s tokens/s and peak memory over `b`'s, where both are there."""
    if not (a and b):
        return {}
    out = {f"{prefix}tokens_per_s": a["tokens_per_s"] / b["tokens_per_s"]}
    if a["peak_mib"] and b["peak_mib"]:
        out[f"{prefix}peak_memory"] = a["peak_mib"] / b["peak_mib"]
    return out


def dist_against_plain(plain, dist) -> dict | None:
    """The launched one-rank run against the plain one: train tokens/s over
    iterations after the first (which holds CUDA's warm-up), and the largest
    relative difference of the figures both report (sampling and the backward
    on a GPU are not bitwise deterministic, so near, not equal)."""
    if not plain or not dist or len(plain) != len(dist):
        return None
    later = slice(1, None) if len(plain) > 1 else slice(None)
    tok = lambda rows: sum(r["timing"]["train_tokens_per_s"] for r in rows[later]) / len(rows[later])
    worst, worst_rel = "", 0.0
    for a, b in zip(plain, dist):
        for k in ("loss", "grad_norm", "sq_dev", "lambda", "reward_mean", "response_len_mean", "entropy"):
            if isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float)):
                rel = abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), 1e-12)
                if rel >= worst_rel:
                    worst, worst_rel = f"{k} (iteration {a.get('iter')})", rel
    plain_tok, dist_tok = tok(plain), tok(dist)
    timed = [r.get("iter") for r in plain[later]]
    return {"timed": f"{timed[0]}–{timed[-1]}" if len(timed) > 1 else str(timed[0]), "train_tok_s_plain": plain_tok, "train_tok_s_dist": dist_tok,
            "overhead": plain_tok / dist_tok - 1.0, "worst_figure": worst, "worst_rel": worst_rel}


def main() -> None:
    d = Path(sys.argv[1])
    checks = [c for c in (load(d / f"check{s}-{t}.json") for s in ("-torch", "", "-0.6b") for t in ("f32", "bf16"))
              if c]
    device = (d / "device.txt").read_text().strip() if (d / "device.txt").exists() else "cpu (dry run)"
    md = [f"# GPU learner check\n\nDevice: {device}\n", "## Correctness (against the CPU in f32, same weights and batch)\n",
          "| shape | device | dtype | log-probs (max rel.) | gradients (max rel.) | worst tensor | tolerance | result |",
          "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        # JSON has no infinity: a null tolerance is a reported-only check.
        tol, result = (f"{c['tolerance']:g}", "pass" if c["pass"] else "FAIL") if c["tolerance"] is not None \
            else ("none", "reported")
        dev = c["device"] + (" (composites)" if c.get("composite") else "")
        md.append(f"| {Path(c['shape']).stem} | {dev} | {c['dtype']} | {c['logprobs_rel']:.2e} | {c['grads_rel_max']:.2e} | "
                  f"`{c['worst_grad']}` | {tol} | {result} |")
    samplers = [c for c in (load(d / f"check-sampler{s}-{t}.json") for s in ("-torch", "", "-0.6b")
                            for t in ("f32", "bf16")) if c]
    if samplers:
        md += ["", "## Sampler against learner (behaviour log-probs, same device)\n",
               "| shape | device | dtype | max abs. diff (nats) | on the CPU in f32 | same tokens as the CPU | tolerance | result |",
               "|---|---|---|---|---|---|---|---|"]
        for c in samplers:
            tol, result = (f"{c['tolerance']:g}", "pass" if c["pass"] else "FAIL") if c["tolerance"] is not None \
                else ("none", "reported")
            md.append(f"| {Path(c['shape']).stem} | {c['device']} | {c['dtype']} | {c['max_abs']:.2e} | "
                      f"{c['cpu_max_abs']:.2e} | {100 * c['same_tokens_frac']:.0f} % | {tol} | {result} |")
    sampling = []
    for p in sorted(d.glob("sample-torch-*.json")):
        ours = load(p)
        theirs = load(d / p.name.replace("sample-torch-", "sample-hf-"))
        for r, kind in ((ours, "torch"), (theirs, "hf")):
            if r:
                r["peak_mib"] = peak(d / f"sample-{kind}-{p.stem.split('sample-torch-', 1)[1]}-peak-mib")
        sampling.append({"r2vpo": ours, "transformers": theirs,
                         "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"] if theirs else None})
    if sampling:
        md += ["", "## Sampler: the torch backend against transformers' generate (T = 1, every row to full length)\n",
               "| shape | dtype | batch × (prompt + response) | r2vpo tokens/s | transformers tokens/s | ratio | goal |",
               "|---|---|---|---|---|---|---|"]
        for x in sorted(sampling, key=lambda x: (x["r2vpo"]["shape"], x["r2vpo"]["batch"])):
            o, t = x["r2vpo"], x["transformers"]
            goal = "≥ 3×" if o["batch"] == 64 else ("≥ 5× (moonshot)" if o["batch"] == 256 else "–")
            md.append(f"| {Path(o['shape']).stem} | {o['dtype']} | {o['batch']} × ({o['prompt']} + {o['response']}) | "
                      f"{o['tokens_per_s']:.1f} | {t['tokens_per_s']:.1f} | {x['ratio']:.2f}× | {goal} |" if t else
                      f"| {Path(o['shape']).stem} | {o['dtype']} | {o['batch']} × ({o['prompt']} + {o['response']}) | "
                      f"{o['tokens_per_s']:.1f} | – | – | {goal} |")
    steps = {}
    for tag, title in [("", "Training step"), ("-ck", "Training step with gradient checkpointing, long rows")]:
        ours, theirs = stack(d, "r2vpo", tag), stack(d, "torch", tag)
        ref, tch = stack(d, "torch-bf16", tag), stack(d, "r2vpo-torch", tag)
        head = ours or tch
        if head is None:
            continue
        ratios = {**against(ours, theirs, ""), **against(tch, theirs, "tch_")}
        steps[tag or "plain"] = {"r2vpo": ours, "torch": theirs, "torch_bf16_params": ref, "r2vpo_torch": tch,
                                 "r2vpo_over_torch": ratios}
        md += ["", f"## {title}: {head['shape']} ({head['parameters']:,} parameters), {head['device']} "
               f"{head['dtype']}, {head['batch']} × ({head['prompt']} + {head['response']}) tokens\n",
               "| stack | step s | tokens/s | peak GPU MiB |", "|---|---|---|---|"]
        rows = [("r2vpo (candle), bf16 compute, f32 master weights" if ours and ours["dtype"] == "bf16"
                 else f"r2vpo (candle), {head['dtype']}", ours),
                ("PyTorch + transformers (SDPA), the same: f32 parameters under autocast(bf16)"
                 if theirs and theirs["dtype"] == "amp" else "PyTorch + transformers (SDPA)", theirs),
                ("PyTorch + transformers (SDPA), bf16 parameters and AdamW state (reference)", ref),
                (f"r2vpo on the torch backend (libtorch, SDPA), {tch['dtype'] if tch else ''} compute, "
                 "f32 master weights", tch)]
        for name, r in rows:
            if r:
                md.append(f"| {name} | {r['step_s']:.3f} | {r['tokens_per_s']:.1f} | {r['peak_mib'] or '–'} |")
        if ratios:
            md.append("")
            if "tokens_per_s" in ratios:
                md.append(f"r2vpo / PyTorch: tokens/s {ratios['tokens_per_s']:.2f}× (goal ≥ 0.5×)"
                          + (f", peak memory {ratios['peak_memory']:.2f}× (goal ≤ 1.5×)" if "peak_memory" in ratios
                             else ""))
            if "tch_tokens_per_s" in ratios:
                md.append(f"\nr2vpo (torch backend) / PyTorch: tokens/s {ratios['tch_tokens_per_s']:.2f}× (goal ≥ 0.9×)"
                          + (f", peak memory {ratios['tch_peak_memory']:.2f}× (goal ≤ 1.2×)"
                             if "tch_peak_memory" in ratios else ""))
    plans = {}
    for name, title in [("torch-step", "plain step"), ("torch-ck-step", "checkpointed step")]:
        plan, measured = load(d / f"plan-{name}.json"), peak(d / f"r2vpo-{name}-peak-mib")
        if not plan:
            continue
        planned = plan["plan"]["total"] / 2**30
        plans[name] = {"planned_gib": planned, "peak_gib": measured / 1024 if measured else None}
        if len(plans) == 1:
            md += ["", "## `llm plan` against the torch backend's peak GPU memory\n",
                   "| step | planned GiB | peak GiB (nvidia-smi, with the CUDA context) | measured / planned |",
                   "|---|---|---|---|"]
        ratio = f"{measured / 1024 / planned:.2f}×" if measured and planned else "–"
        md.append(f"| {title} | {planned:.2f} | {measured / 1024 if measured else float('nan'):.2f} | {ratio} |")
    ours_l, theirs_l = load(d / "r2vpo-torch-lora-step.json"), load(d / "torch-lora-step.json")
    if ours_l or theirs_l:
        head = ours_l or theirs_l
        md += ["", f"## LoRA step, rank {head['lora_rank']}: {head['shape']}, {head['batch']} × "
                   f"({head['prompt']} + {head['response']}) tokens, checkpointed\n",
               "| stack | step s | tokens/s | trained parameters | peak GPU MiB |", "|---|---|---|---|---|"]
        for name, r, phase in [("r2vpo on the torch backend, frozen base in the compute dtype", ours_l,
                                "r2vpo-torch-lora-step"),
                               (f"PyTorch + transformers, LoRA by {theirs_l['lora'] if theirs_l else ''}", theirs_l,
                                "torch-lora-step")]:
            if r:
                mib = peak(d / f"{phase}-peak-mib")
                md.append(f"| {name} | {r['step_s']:.3f} | {r['tokens_per_s']:.1f} | {r['trained_parameters']:,} | "
                          f"{mib or '–'} |")
        if ours_l and theirs_l:
            md.append(f"\nr2vpo / PyTorch: tokens/s {ours_l['tokens_per_s'] / theirs_l['tokens_per_s']:.2f}×")
    packing = load(d / "r2vpo-torch-packing.json")
    if packing:
        mib = peak(d / "r2vpo-torch-packing-peak-mib")
        md += ["", f"## Packed micro-batches against padded rows: {packing['shape']}, {packing['backend']}"
                   f"{', checkpointed' if packing['checkpoint'] else ''}, {packing['samples']} samples\n",
               "| layout | micro-batches | computed tokens | padding | step s (median) | vs padded rows |",
               "|---|---|---|---|---|---|"]
        for r in packing["rows"]:
            md.append(f"| {r['layout']} | {r['micro_batches']} | {r['computed_tokens']} | "
                      f"{100 * r['padding_frac']:.0f} % | {r['median_s']:.3f} | {r['vs_padded']:.2f}× the time |")
        md.append(f"\nPeak GPU MiB over the phase (every layout): {mib or '–'}")
    loading = load(d / "serve-load.json")
    if loading:
        log = (d / "serve-load.log").read_text() if (d / "serve-load.log").exists() else ""
        # "... (model PATH, BACKEND DEVICE DTYPE, weight version ...)"
        served = next((line.split("(model ", 1)[1].split(", ")[1]
                       for line in log.splitlines() if "listening on" in line and "(model " in line), "?")
        gpu = peak(d / "serve-load-peak-mib")
        loading["gpu_peak_gib"] = gpu / 1024 if gpu else None
        md += ["", "## Loading a bf16 model (`r2vpo serve` on a random bf16 folder)\n",
               "| served | weights file GiB | host peak GiB | host peak / weights | GPU peak GiB |", "|---|---|---|---|---|",
               f"| {served} | {loading['weights_file_gib']:.2f} | {loading['host_peak_gib']:.2f} | "
               f"{loading['host_peak_gib'] / loading['weights_file_gib']:.2f}× | "
               f"{loading['gpu_peak_gib'] if loading['gpu_peak_gib'] is not None else float('nan'):.2f} |"]
    runs = {}
    for name, title in [("torch-e2e", "`llm train --config configs/llm/gpu-smoke.toml --set model.backend=torch`"),
                        ("torch-dist1", "the same as the distributed learner: `r2vpo launch --nproc-per-node 1 -- "
                                        "llm train ...` (one rank; NCCL on a GPU)"),
                        ("e2e", "`llm train --config configs/llm/gpu-smoke.toml`"),
                        ("xdev", "tiny run: iteration 1 on the device, 2 on the CPU (resumed), 3 on the device")]:
        p = d / f"train-{name}-metrics.jsonl"
        if not p.exists():
            continue
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        runs[name] = rows
        md += ["", f"## {title}\n",
               "| iteration | reward | λ | E[(ρ−1)²] | grad norm | rollout tok/s | train tok/s | iteration s |",
               "|---|---|---|---|---|---|---|---|"]
        nan = float("nan")
        for r in rows:
            t = r.get("timing", {})
            md.append(f"| {r.get('iter', '?')} | {r.get('reward_mean', nan):.3f} | {r.get('lambda', nan):.3g} | "
                      f"{r.get('sq_dev', nan):.3g} | {r.get('grad_norm', nan):.3g} | "
                      f"{t.get('rollout_tokens_per_s', nan):.1f} | {t.get('train_tokens_per_s', nan):.1f} | "
                      f"{t.get('iteration_s', nan):.1f} |")
    dist = dist_against_plain(runs.get("torch-e2e"), runs.get("torch-dist1"))
    if dist:
        md += ["", "## The distributed learner (one rank; NCCL on a GPU) against the plain process\n",
                f"Train tokens/s over iterations {dist['timed']}: {dist['train_tok_s_dist']:.1f} against "
               f"{dist['train_tok_s_plain']:.1f}, overhead {100 * dist['overhead']:.1f} % (goal ≤ 3 %); largest "
               f"relative difference of a figure: {dist['worst_figure']} {dist['worst_rel']:.2g}."]
    collectives = d / "dist-check.log"
    if collectives.exists():
        table = [line for line in collectives.read_text().splitlines() if line.startswith(("|", "dist check:"))]
        if table:
            md += ["", "## `dist check` on the device\n", *table]
    status = (d / "status.txt").read_text().split("\n") if (d / "status.txt").exists() else []
    status = [s for s in status if s.strip()]
    if status:
        md += ["", "## Phases (exit code, seconds)\n", "```", *status, "```"]
    summary = {"device": device, "checks": checks, "samplers": samplers, "sampling": sampling, "steps": steps,
               "plans": plans, "loading": loading, "runs": runs, "dist": dist, "packing": packing,
               "phases": status}
    for name, text in [("summary.json", json.dumps(summary, indent=2)), ("summary.md", "\n".join(md) + "\n")]:
        tmp = d / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, d / name)
    print("\n".join(md))
    print(f"\nwritten: {d}/summary.json, {d}/summary.md")


if __name__ == "__main__":
    main()
