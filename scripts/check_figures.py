#!/usr/bin/env python3
"""Recompute the figures the write-ups quote from the committed raw files.

    python3 scripts/check_figures.py          # exit 0: every figure agrees
    python3 scripts/check_figures.py -v       # also list what was checked

Why: the READMEs under results/, the status rows of README.md and the docs
quote numbers that were read off the runs by hand, and issue 71 found a
dozen of them that no longer matched (a range missing a seed, MiB divided
by 1000 and called GiB, a return rounded twice, a base-model accuracy from
an older verifier). This script reads the raw files again and compares.

What it checks, each against the raw file named:

- control, results/control/paper-geometry/: the 64-env, 2048-env and λ
  sweep prose in its README.md, the λ advice and its table in
  docs/control.md and the control row of README.md, against the runs'
  metrics.jsonl (approx_kl, ratio_mean, sq_dev, clip_frac, entropy,
  sigma_mean, lambda, eval_return_mean per update); every cell of the
  per-update and summary tables of envs-64/, envs-2048/ and
  lambda-64/analysis.md, and their verdict lines (recomputed with
  scripts/control/geometry_rule.py and lambda_sweep.py, imported);
- control, results/control/paper-hparams/: PPO's largest per-update KL in
  README.md and docs/control.md, and that 20 is the runs' log-ratio clamp
  (config.toml);
- every results/**/final_returns.md row against its runs' metrics.jsonl
  (the last evaluation) and summary.json (training return, steps, seeds);
- LLM: results/llm/base-eval.md against base-eval-*/eval.json, the
  comparison, hackable-verifier and LoRA tables and prose (results/llm/
  README.md, results/llm/lora/README.md, docs/llm-training.md, the LLM row
  of README.md) against each run's eval.jsonl, metrics.jsonl and
  iter-000015.json;
- results/bench/dist-cpu-2026-11-29/README.md and docs/distributed.md
  against ranks-f32.json and ranks-bf16.json (GiB = MiB / 1024);
- results/bench/dist-memory-*/README.md (table and prose) against
  memory.json;
- results/bench/packing-*/ against its runs' JSON;
- results/toy/menu-*/summary.md against each run's summary.json, and its
  README's prose against the table.

How: each figure is found by a regular expression anchored on the words
around it (whitespace-insensitive, so re-wrapping a paragraph does not
matter), and compared with the recomputed value at the precision it is
quoted with: a quoted 274 passes for a raw 273.507, a quoted 273 does not
(|quoted - raw| must be at most half a unit of the quoted last digit; a
number like 30,800 counts as rounded to its hundreds). An anchor that is
no longer found is itself a failure, so rewording a sentence cannot
silently drop its check: change the pattern here together with the prose.

One figure has no raw file in the tree: the base model's 9.8 % avg@4 under
the 2026-11-22 verifier, which the comparison runs were scored with (its
eval.md was overwritten by later re-runs; git show 5b6b865:results/llm/
base-eval-auto/eval.md). Quotes of it are checked against the figure
base-eval.md records for that verifier.

Standard library only (Python 3.11 for tomllib); runs in about a second.
"""

import glob
import json
import re
import statistics
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "control"))
import geometry_rule as gr  # noqa: E402
import lambda_sweep as lsw  # noqa: E402

GEOM = "results/control/paper-geometry"
PG_README = f"{GEOM}/README.md"
CONTROL_DOC = "docs/control.md"
TOP = "README.md"

# A quoted number: optional minus (ASCII or U+2212), thousands separators.
N = r"[−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
LIST = rf"((?:{N}, )+{N})"  # "0.61, 18.9, 19.7"


def parse(s):
    return float(s.replace("−", "-").replace(",", ""))


def half_unit(s):
    s = s.replace("−", "").lstrip("-")
    if "e" in s:  # 3.08e+04, as the analysis tables print large values
        mant, exp = s.split("e")
        return half_unit(mant) * 10 ** int(exp)
    if "." in s:
        return 0.5 * 10 ** -len(s.split(".")[1])
    if "," in s and s.endswith("00"):  # 30,800: rounded to hundreds
        return 0.5 * 10 ** (len(s) - len(s.rstrip("0")))
    return 0.5


def like(value, quoted):
    if "e" in quoted:
        mant = quoted.split("e")[0]
        return f"{value:.{len(mant.split('.')[1]) if '.' in mant else 0}e}"
    d = len(quoted.split(".")[1]) if "." in quoted else 0
    return f"{value:.{d}f}"


class Checker:
    def __init__(self, verbose=False):
        self.n = 0
        self.fails = []
        self.verbose = verbose
        self._flat = {}

    # -- reading the prose ---------------------------------------------------
    def flat(self, rel):
        """The file with every run of whitespace made one space."""
        if rel not in self._flat:
            p = ROOT / rel
            self._flat[rel] = re.sub(r"\s+", " ", p.read_text()) if p.exists() else None
        return self._flat[rel]

    def find(self, rel, pattern, what, within=None):
        """The first match of pattern in rel (or in the string within, a
        part of it); a missing anchor is a failure."""
        text = within if within is not None else self.flat(rel)
        m = re.search(pattern, text) if text is not None else None
        if m is None:
            self.n += 1
            self.fails.append(f"{rel}: {what}: anchor not found (pattern {pattern!r}); "
                              "update the pattern in scripts/check_figures.py with the prose")
        return m

    def part(self, rel, start, end, what):
        """The text between two anchors (for a bullet or a section)."""
        text = self.flat(rel)
        m = re.search(start, text) if text is not None else None
        if m is None:
            self.find(rel, start, what)
            return None
        e = re.search(end, text[m.end():])
        return text[m.start(): m.end() + (e.start() if e else len(text))]

    def fail(self, rel, message):
        self.n += 1
        self.fails.append(f"{rel}: {message}")

    # -- comparing -----------------------------------------------------------
    def num(self, rel, what, quoted, value):
        self.n += 1
        ok = abs(parse(quoted) - value) <= half_unit(quoted) + 1e-9 * max(1.0, abs(value))
        if not ok:
            self.fails.append(f"{rel}: {what}: quoted {quoted}, the raw files give "
                              f"{like(value, quoted)} ({value:.6g})")
        elif self.verbose:
            print(f"ok  {rel}: {what}: {quoted} ({value:.6g})")

    def rng(self, rel, what, lo, hi, values):
        values = list(values)
        self.num(rel, f"{what}, low end", lo, min(values))
        self.num(rel, f"{what}, high end", hi, max(values))

    def seq(self, rel, what, quoted, values, label="update"):
        items = quoted.split(", ")
        values = list(values)
        if len(items) != len(values):
            self.n += 1
            self.fails.append(f"{rel}: {what}: {len(items)} figures quoted, the raw files have {len(values)}")
            return
        for i, (q, v) in enumerate(zip(items, values), 1):
            self.num(rel, f"{what}, {label} {i}", q, v)

    def at_most(self, rel, what, quoted, values):
        """'KL ≤ 0.02': every value, at the quoted precision, is ≤ it."""
        self.n += 1
        v = max(values)
        if float(like(v, quoted)) > parse(quoted) + 1e-12:
            self.fails.append(f"{rel}: {what}: quoted ≤ {quoted}, the largest is {like(v, quoted)} ({v:.6g})")

    def below(self, rel, what, quoted, values):
        """'below 0.08': every value is < it."""
        self.n += 1
        v = max(values)
        if not v < parse(quoted):
            self.fails.append(f"{rel}: {what}: quoted below {quoted}, the largest is {v:.6g}")

    def same(self, rel, what, quoted, value):
        self.n += 1
        if str(quoted) != str(value):
            self.fails.append(f"{rel}: {what}: quoted {quoted}, the raw files give {value}")

    # -- markdown tables -------------------------------------------------------
    def table(self, rel, header_pattern, what):
        """Rows (lists of cells) of the table whose header matches."""
        p = ROOT / rel
        lines = p.read_text().splitlines() if p.exists() else []
        for i, line in enumerate(lines):
            if line.startswith("|") and re.search(header_pattern, line):
                rows = []
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    rows.append([c.strip() for c in row.strip().strip("|").split("|")])
                return rows
        self.fail(rel, f"{what}: table header not found (pattern {header_pattern!r})")
        return []


# ---------------------------------------------------------------------------
# raw data


def runs(arm, algo):
    """seed -> metrics rows (updates 1-10) of a paper-geometry arm."""
    return {s: gr.load(ROOT / GEOM / arm, algo, s) for s in gr.SEEDS}


def col(rows, key):
    return [r[key] for r in rows]


def first_excursion(rows):
    return next((r["update"] for r in rows if r["approx_kl"] > 1), None)


def excursion_updates(rows):
    return [r["update"] for r in rows if r["approx_kl"] > 1]


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def last_eval(run_dir):
    return jsonl(ROOT / run_dir / "eval.jsonl")[-1]


def pct(x):
    return 100.0 * x


# ---------------------------------------------------------------------------
# control: paper-geometry


def check_geometry(c):
    e64p, e64r = runs("envs-64", "ppo"), runs("envs-64", "r2vpo")
    e2p, e2r = runs("envs-2048", "ppo"), runs("envs-2048", "r2vpo")
    lam = {folder: runs(folder, "r2vpo") for _, folder, algo in lsw.SETTINGS if folder.startswith("lambda-64")}
    allp = lambda d: [r for s in gr.SEEDS for r in d[s]]  # noqa: E731
    f = PG_README

    # 64-env arm
    m = c.find(f, rf"Its per-update KL stayed at ({N})–({N}) in every update of every seed", "64-env PPO KL")
    if m:
        c.rng(f, "64-env PPO per-update KL", m[1], m[2], col(allp(e64p), "approx_kl"))
    m = c.find(f, rf"with ({N})–({N}) % of ratios outside \[0\.7, 1\.3\], and its evaluation return rose every "
                  rf"update in every seed \(to ({N})–({N}) at update 10\)", "64-env PPO clip fraction and return")
    if m:
        c.rng(f, "64-env PPO % ratios outside [0.7, 1.3]", m[1], m[2], map(pct, col(allp(e64p), "clip_frac")))
        c.rng(f, "64-env PPO return at update 10", m[3], m[4], [e64p[s][-1]["eval_return_mean"] for s in gr.SEEDS])
    m = c.find(f, rf"Update 1's KL is ({N})–({N}) \(PPO: ({N})–({N});.*?update 2's ({N})–({N})", "64-env update 1-2 KL")
    if m:
        c.rng(f, "64-env R²VPO update-1 KL", m[1], m[2], [e64r[s][0]["approx_kl"] for s in gr.SEEDS])
        c.rng(f, "64-env PPO update-1 KL", m[3], m[4], [e64p[s][0]["approx_kl"] for s in gr.SEEDS])
        c.rng(f, "64-env R²VPO update-2 KL", m[5], m[6], [e64r[s][1]["approx_kl"] for s in gr.SEEDS])
    m = c.find(f, rf"KL ({N})–({N}) in updates (\d+)–(\d+) \(seed (\d): (\d+)–(\d+)\), the mean ratio down to "
                  rf"({N})–({N}) at its lowest, E\[\(ρ−1\)²\] up to ({N})–({N})", "64-env R²VPO excursions")
    if m:
        exc = {s: excursion_updates(e64r[s]) for s in gr.SEEDS}
        c.rng(f, "64-env R²VPO KL in its excursions", m[1], m[2],
              [r["approx_kl"] for s in gr.SEEDS for r in e64r[s] if r["approx_kl"] > 1])
        odd = int(m[5])
        for s in gr.SEEDS:
            lo, hi = (m[6], m[7]) if s == odd else (m[3], m[4])
            c.same(f, f"64-env R²VPO seed {s} excursion updates", f"{lo}–{hi}", f"{exc[s][0]}–{exc[s][-1]}")
        c.rng(f, "64-env R²VPO lowest mean ratio per seed", m[8], m[9], [min(col(e64r[s], "ratio_mean")) for s in gr.SEEDS])
        c.rng(f, "64-env R²VPO largest E[(ρ−1)²] per seed", m[10], m[11], [max(col(e64r[s], "sq_dev")) for s in gr.SEEDS])
    m = c.find(f, rf"\(lowest ({N}) to ({N})\) while σ rises to ({N})–({N})", "64-env R²VPO entropy and σ")
    if m:
        lows = [min(col(e64r[s], "entropy")) for s in gr.SEEDS]
        c.num(f, "64-env R²VPO highest per-seed lowest entropy", m[1], max(lows))
        c.num(f, "64-env R²VPO lowest per-seed lowest entropy", m[2], min(lows))
        c.rng(f, "64-env R²VPO largest σ per seed", m[3], m[4], [max(col(e64r[s], "sigma_mean")) for s in gr.SEEDS])
    m = c.find(f, rf"Evaluation returns fall to ({N})–({N}) at the worst updates", "64-env R²VPO worst returns")
    if m:
        c.rng(f, "64-env R²VPO lowest return per seed", m[1], m[2], [min(col(e64r[s], "eval_return_mean")) for s in gr.SEEDS])
    m = c.find(f, rf"by update 9–10 KL is ({N})–({N}) and ratios are ≈ 1 again, with returns of ({N})–({N}) at "
                  rf"update 10 against PPO's ({N})–({N})", "64-env R²VPO recovery")
    if m:
        c.rng(f, "64-env R²VPO KL in updates 9-10", m[1], m[2], [r["approx_kl"] for s in gr.SEEDS for r in e64r[s][8:10]])
        c.rng(f, "64-env R²VPO return at update 10", m[3], m[4], [e64r[s][-1]["eval_return_mean"] for s in gr.SEEDS])
        c.rng(f, "64-env PPO return at update 10", m[5], m[6], [e64p[s][-1]["eval_return_mean"] for s in gr.SEEDS])

    # 2048-env arm, summary bullets
    m = c.find(f, rf"at the paper's geometry its KL is ({N})–({N}) in every update of every seed \(64 envs: ({N})–({N})\), "
                  rf"the mean ratio ({N})–({N}), ({N})–({N}) % of ratios outside \[0\.7, 1\.3\], and its evaluation "
                  rf"return rises every update to ({N})–({N}) at update 10 \(64 envs: ({N})–({N})\)", "2048-env PPO")
    if m:
        c.rng(f, "2048-env PPO per-update KL", m[1], m[2], col(allp(e2p), "approx_kl"))
        c.rng(f, "64-env PPO per-update KL", m[3], m[4], col(allp(e64p), "approx_kl"))
        c.rng(f, "2048-env PPO mean ratio", m[5], m[6], col(allp(e2p), "ratio_mean"))
        c.rng(f, "2048-env PPO % ratios outside", m[7], m[8], map(pct, col(allp(e2p), "clip_frac")))
        c.rng(f, "2048-env PPO return at update 10", m[9], m[10], [e2p[s][-1]["eval_return_mean"] for s in gr.SEEDS])
        c.rng(f, "64-env PPO return at update 10", m[11], m[12], [e64p[s][-1]["eval_return_mean"] for s in gr.SEEDS])
    m = c.find(f, rf"here in (\d)–(\d) of 10 updates of every seed \(KL ({N})–({N}), mean ratio ({N})–({N})\), from update "
                  rf"(\d) on in every seed \(64 envs: from update (\d), (\d)–(\d) updates per seed\)", "2048-env R²VPO excursions")
    if m:
        exc = [r for s in gr.SEEDS for r in e2r[s] if r["approx_kl"] > 1]
        c.rng(f, "2048-env R²VPO updates with KL > 1 per seed", m[1], m[2], [len(excursion_updates(e2r[s])) for s in gr.SEEDS])
        c.rng(f, "2048-env R²VPO KL in excursions", m[3], m[4], col(exc, "approx_kl"))
        c.rng(f, "2048-env R²VPO mean ratio in excursions", m[5], m[6], col(exc, "ratio_mean"))
        c.rng(f, "2048-env R²VPO first excursion", m[7], m[7], [first_excursion(e2r[s]) for s in gr.SEEDS])
        c.rng(f, "64-env R²VPO first excursion", m[8], m[8], [first_excursion(e64r[s]) for s in gr.SEEDS])
        c.rng(f, "64-env R²VPO updates with KL > 1 per seed", m[9], m[10], [len(excursion_updates(e64r[s])) for s in gr.SEEDS])
    m = c.find(f, rf"\(KL ({N})–({N}) and mean ratio ({N})–({N}) in the updates between, with returns of ({N})–({N})\)",
               "2048-env R²VPO between excursions")
    if m:
        between = [r for s in gr.SEEDS for r in e2r[s] if r["update"] >= 2 and r["approx_kl"] <= 1]
        c.rng(f, "2048-env R²VPO KL between excursions", m[1], m[2], col(between, "approx_kl"))
        c.rng(f, "2048-env R²VPO mean ratio between excursions", m[3], m[4], col(between, "ratio_mean"))
        c.rng(f, "2048-env R²VPO return between excursions", m[5], m[6], col(between, "eval_return_mean"))
    m = c.find(f, rf"Evaluation return at update 10: ({N}), ({N}), ({N}) \(({N}) ± ({N})\) against PPO's ({N}), ({N}), "
                  rf"({N}) \(({N}) ± ({N})\)", "2048-env returns at update 10")
    if m:
        for off, arm, name in ((1, e2r, "R²VPO"), (6, e2p, "PPO")):
            fin = [arm[s][-1]["eval_return_mean"] for s in gr.SEEDS]
            for i, s in enumerate(gr.SEEDS):
                c.num(f, f"2048-env {name} seed {s} return at update 10", m[off + i], fin[i])
            c.num(f, f"2048-env {name} mean return at update 10", m[off + 3], statistics.mean(fin))
            c.num(f, f"2048-env {name} SD of return at update 10", m[off + 4], statistics.pstdev(fin))

    # 2048-env arm, one bullet per run
    def bullet(algo, seed):
        return c.part(f, rf"- \*\*{algo} seed {seed}\*\* \(`envs-2048/cheetah-run/", r" - \*\*|## ", f"2048-env {algo} seed {seed} bullet")

    for s in gr.SEEDS:
        rows, b = e2p[s], bullet("PPO", s)
        if b is None:
            continue
        what = f"2048-env PPO seed {s}"
        m = c.find(f, rf"`approx_kl` ({N})–({N})", f"{what} KL", b)
        if m:
            c.rng(f, f"{what} KL", m[1], m[2], col(rows, "approx_kl"))
        m = c.find(f, rf"mean ratio ({N})–({N}), ({N})–({N}) % of ratios outside \[0\.7, 1\.3\], σ ({N}) → ({N})", f"{what} ratios", b)
        if m:
            c.rng(f, f"{what} mean ratio", m[1], m[2], col(rows, "ratio_mean"))
            c.rng(f, f"{what} % ratios outside", m[3], m[4], map(pct, col(rows, "clip_frac")))
            c.num(f, f"{what} σ at update 1", m[5], rows[0]["sigma_mean"])
            c.num(f, f"{what} σ at update 10", m[6], rows[-1]["sigma_mean"])
        m = c.find(f, rf"evaluation return rising every update (?:from ({N}) )?to ({N})", f"{what} return", b)
        if m:
            if m[1]:
                c.num(f, f"{what} return at update 1", m[1], rows[0]["eval_return_mean"])
            c.num(f, f"{what} return at update 10", m[2], rows[-1]["eval_return_mean"])
        if s == 0:
            m = c.find(f, rf"\(the 64-env arm's PPO seed 0: ({N})\)", f"{what}: 64-env PPO seed 0", b)
            if m:
                c.num(f, "64-env PPO seed 0 return at update 10", m[1], e64p[0][-1]["eval_return_mean"])
    for s in gr.SEEDS:
        rows, b = e2r[s], bullet("R²VPO", s)
        if b is None:
            continue
        what = f"2048-env R²VPO seed {s}"
        m = c.find(f, rf"`approx_kl` {LIST}; mean ratio {LIST}; E\[\(ρ−1\)²\] from ({N}) to ({N}); ({N})–({N}) % of ratios "
                      rf"outside \[0\.7, 1\.3\]; σ ({N}) → ({N})", f"{what} per-update lists", b)
        if m:
            c.seq(f, f"{what} approx_kl", m[1], col(rows, "approx_kl"))
            c.seq(f, f"{what} mean ratio", m[2], col(rows, "ratio_mean"))
            c.num(f, f"{what} smallest E[(ρ−1)²]", m[3], min(col(rows, "sq_dev")))
            c.num(f, f"{what} largest E[(ρ−1)²]", m[4], max(col(rows, "sq_dev")))
            c.rng(f, f"{what} % ratios outside", m[5], m[6], map(pct, col(rows, "clip_frac")))
            c.num(f, f"{what} σ at update 1", m[7], rows[0]["sigma_mean"])
            c.num(f, f"{what} σ at update 10", m[8], rows[-1]["sigma_mean"])
        m = c.find(f, rf"evaluation return {LIST}\.", f"{what} returns", b)
        if m:
            c.seq(f, f"{what} evaluation return", m[1], col(rows, "eval_return_mean"))
        m = c.find(f, rf"\(({N}) at update (\d+)\)", f"{what} largest σ", b) if s > 0 else None
        if m:
            top = max(rows, key=lambda r: r["sigma_mean"])
            c.num(f, f"{what} largest σ", m[1], top["sigma_mean"])
            c.same(f, f"{what} update of the largest σ", m[2], top["update"])
        m = re.search(rf"\(lowest ({N})\)", b)
        if m:
            c.num(f, f"{what} lowest entropy", m[1], min(col(rows, "entropy")))
        exc = [r for r in rows if r["approx_kl"] > 1]
        m = c.find(f, rf"\(KL ({N})–({N}), mean ratio ({N})–({N})\)", f"{what} excursion ranges", b)
        if m:
            c.rng(f, f"{what} KL in excursions", m[1], m[2], col(exc, "approx_kl"))
            c.rng(f, f"{what} mean ratio in excursions", m[3], m[4], col(exc, "ratio_mean"))
        m = c.find(f, r"(\w+) of (?:its )?(\w+) updates", f"{what} excursion count", b)
        words = {"five": 5, "six": 6, "ten": 10, "5": 5, "6": 6, "10": 10}
        if m:
            c.same(f, f"{what} updates with KL > 1", words.get(m[1].lower(), m[1]), len(exc))
    b = bullet("R²VPO", 2)
    if b:
        m = c.find(f, rf"`learn_s` ({N})–({N})\)", "2048-env R²VPO seed 2 learn_s", b)
        if m:
            c.rng(f, "2048-env R²VPO seed 2 learn_s", m[1], m[2], col(e2r[2], "learn_s"))

    # λ sweep: the table
    labels = {
        "PPO, clip 0.3 (the 64-env arm)": e64p, "λ 0.06 fixed (the 64-env arm)": e64r,
        "λ 0.5 fixed": lam["lambda-64/fixed-0.5"], "λ 1.5 fixed": lam["lambda-64/fixed-1.5"],
        "λ 3 fixed": lam["lambda-64/fixed-3"], "adaptive (δ 0.02, η 0.05)": lam["lambda-64/adaptive"],
        "adaptive, λ ≤ 3": lam["lambda-64/adaptive-cap3"],
    }
    rows = c.table(f, r"\| setting \| max approx KL \(3 seeds\) \| eval return at update 10 \|", "λ sweep table")
    for label, arm in labels.items():
        row = next((r for r in rows if r[0] == label), None)
        if row is None:
            c.find(f, re.escape(f"| {label} |"), "λ sweep table row")
            continue
        kl, ret = row[1].split("–"), row[2].split("–")
        c.rng(f, f"λ table {label}: max KL", kl[0], kl[1], [max(col(arm[s], "approx_kl")) for s in gr.SEEDS])
        c.rng(f, f"λ table {label}: return at update 10", ret[0], ret[1], [arm[s][-1]["eval_return_mean"] for s in gr.SEEDS])

    check_lambda_prose(c, e64p, e64r, lam)
    check_control_doc(c, e64p, e64r, e2p, e2r, lam)


def pre_collapse(rows):
    k = first_excursion(rows)
    return [r for r in rows if k is None or r["update"] < k]


def check_lambda_prose(c, ppo, l006, lam):
    f = PG_README
    l15, l3, l05 = lam["lambda-64/fixed-1.5"], lam["lambda-64/fixed-3"], lam["lambda-64/fixed-0.5"]
    ad, cap = lam["lambda-64/adaptive"], lam["lambda-64/adaptive-cap3"]
    m = c.find(f, rf"At λ 1\.5 every seed learns steadily for (\d)–(\d) updates with a KL of ≈ ({N}) \(({N})–({N})× PPO's "
                  rf"mean KL over the same updates\), its return ({N})–({N}) at the last of those updates \(update (\d), (\d), "
                  rf"(\d) in seeds 0, 1, 2\) against PPO's ({N})–({N}) at the same updates \(seed by seed ({N}) against ({N}), "
                  rf"({N}) against ({N}), ({N}) against ({N})\)", "λ 1.5 against PPO")
    if m:
        pre = {s: pre_collapse(l15[s]) for s in gr.SEEDS}
        c.rng(f, "λ 1.5 updates before the collapse", m[1], m[2], [len(pre[s]) for s in gr.SEEDS])
        c.num(f, "λ 1.5 median KL before the collapse", m[3],
              statistics.median(r["approx_kl"] for s in gr.SEEDS for r in pre[s]))
        ratio = [statistics.mean(col(pre[s], "approx_kl")) / statistics.mean(col(ppo[s][:len(pre[s])], "approx_kl"))
                 for s in gr.SEEDS]
        c.rng(f, "λ 1.5 mean KL / PPO's over the same updates", m[4], m[5], ratio)
        last = {s: pre[s][-1]["update"] for s in gr.SEEDS}
        ours = [pre[s][-1]["eval_return_mean"] for s in gr.SEEDS]
        theirs = [ppo[s][last[s] - 1]["eval_return_mean"] for s in gr.SEEDS]
        c.rng(f, "λ 1.5 return at its last update before the collapse", m[6], m[7], ours)
        for i, s in enumerate(gr.SEEDS):
            c.same(f, f"λ 1.5 seed {s} last update before the collapse", m[8 + i], last[s])
            c.num(f, f"λ 1.5 seed {s} return there", m[13 + 2 * i], ours[i])
            c.num(f, f"PPO seed {s} return at the same update", m[14 + 2 * i], theirs[i])
        c.rng(f, "PPO return at λ 1.5's last updates before the collapse", m[11], m[12], theirs)
    m = c.find(f, rf"then collapses within two updates \(mean ratio ({N})–({N}) in the first, ({N})–({N}) in the second; "
                  rf"KL ({N})–({N}) in every update from the first on\) and never recovers \(returns ({N})–({N}) at update 10\)",
               "λ 1.5 collapse")
    if m:
        k = {s: first_excursion(l15[s]) for s in gr.SEEDS}
        c.rng(f, "λ 1.5 mean ratio in the first collapsing update", m[1], m[2], [l15[s][k[s] - 1]["ratio_mean"] for s in gr.SEEDS])
        c.rng(f, "λ 1.5 mean ratio in the second", m[3], m[4], [l15[s][k[s]]["ratio_mean"] for s in gr.SEEDS])
        c.rng(f, "λ 1.5 KL from the collapse on", m[5], m[6], [r["approx_kl"] for s in gr.SEEDS for r in l15[s][k[s] - 1:]])
        c.rng(f, "λ 1.5 return at update 10", m[7], m[8], [l15[s][-1]["eval_return_mean"] for s in gr.SEEDS])
    m = c.find(f, rf"At λ 3 no seed collapses \(KL ≤ ({N}) throughout\)", "λ 3 KL bound")
    if m:
        c.at_most(f, "λ 3 KL", m[1], [r["approx_kl"] for s in gr.SEEDS for r in l3[s]])
    check_pace(c, f, ppo, l3, full=True)
    m = c.find(f, rf"At λ 0\.5 the collapse comes as early as at 0\.06 \(updates (\d)–(\d)\)", "λ 0.5 first collapse")
    if m:
        c.rng(f, "λ 0.5 first update with KL > 1", m[1], m[2], [first_excursion(l05[s]) for s in gr.SEEDS])
    m = c.find(f, rf"λ rises from 0\.06 to ({N})–({N}) within the first update, stays at ({N})–({N}) and holds KL at ≈ ({N}) "
                  rf"\(({N})–({N}) in update 1\) for (\d)–(\d) updates; then the run collapses, over two updates in seeds "
                  rf"(\d) and (\d) \(KL ({N}) then ({N}), ({N}) then ({N}); mean ratio down to ({N}) and ({N})\) and in one in "
                  rf"seed (\d) \(KL ({N}), mean ratio ({N})\)", "adaptive λ settling and collapse")
    if m:
        pre = {s: pre_collapse(ad[s]) for s in gr.SEEDS}
        c.rng(f, "adaptive λ after update 1", m[1], m[2], [ad[s][0]["lambda"] for s in gr.SEEDS])
        c.rng(f, "adaptive λ before the collapse", m[3], m[4], [r["lambda"] for s in gr.SEEDS for r in pre[s]])
        c.num(f, "adaptive KL after update 1 before the collapse (median)", m[5],
              statistics.median(r["approx_kl"] for s in gr.SEEDS for r in pre[s][1:]))
        c.rng(f, "adaptive KL in update 1", m[6], m[7], [ad[s][0]["approx_kl"] for s in gr.SEEDS])
        c.rng(f, "adaptive updates before the collapse", m[8], m[9], [len(pre[s]) for s in gr.SEEDS])
        for j, s in enumerate((int(m[10]), int(m[11]))):
            exc = [r for r in ad[s] if r["approx_kl"] > 1]
            c.same(f, f"adaptive seed {s} updates with KL > 1", 2, len(exc))
            if len(exc) == 2:
                c.num(f, f"adaptive seed {s} KL, first collapsing update", m[12 + 2 * j], exc[0]["approx_kl"])
                c.num(f, f"adaptive seed {s} KL, second", m[13 + 2 * j], exc[1]["approx_kl"])
            c.num(f, f"adaptive seed {s} lowest mean ratio", m[16 + j], min(col(ad[s], "ratio_mean")))
        s = int(m[18])
        exc = [r for r in ad[s] if r["approx_kl"] > 1]
        c.same(f, f"adaptive seed {s} updates with KL > 1", 1, len(exc))
        c.num(f, f"adaptive seed {s} KL of its collapse", m[19], exc[0]["approx_kl"])
        c.num(f, f"adaptive seed {s} lowest mean ratio", m[20], min(col(ad[s], "ratio_mean")))
    m = c.find(f, rf"drives λ to ({N})–({N}), where it stays: the updates after barely move the policy \(KL ≤ ({N})\) and "
                  rf"the returns stay at ({N})–({N})", "adaptive λ lock")
    if m:
        c.rng(f, "adaptive final λ", m[1], m[2], [ad[s][-1]["lambda"] for s in gr.SEEDS])
        after = []
        for s in gr.SEEDS:
            last_exc = excursion_updates(ad[s])[-1]
            after += [r["approx_kl"] for r in ad[s] if r["update"] > last_exc]
        c.at_most(f, "adaptive KL after the collapse", m[3], after)
        c.rng(f, "adaptive return at update 10", m[4], m[5], [ad[s][-1]["eval_return_mean"] for s in gr.SEEDS])
    m = c.find(f, rf"the two seeds that collapsed before update 10 \(at updates (\d) and (\d)\) did not recover in the "
                  rf"updates left \(returns ({N})–({N}) at update 10\)", "capped adaptive λ")
    if m:
        early = sorted((first_excursion(cap[s]), s) for s in gr.SEEDS if first_excursion(cap[s]) < 10)
        c.same(f, "capped adaptive λ: updates of the collapses before 10", f"{m[1]} and {m[2]}",
               " and ".join(str(u) for u, _ in early))
        c.rng(f, "capped adaptive λ: their returns at update 10", m[3], m[4], [cap[s][-1]["eval_return_mean"] for _, s in early])


def check_pace(c, f, ppo, l3, full=False):
    """λ 3's pace: its return at update 10 over PPO's, per seed and on the means."""
    ours = [l3[s][-1]["eval_return_mean"] for s in gr.SEEDS]
    theirs = [ppo[s][-1]["eval_return_mean"] for s in gr.SEEDS]
    per_seed = [a / b for a, b in zip(ours, theirs)]
    on_means = statistics.mean(ours) / statistics.mean(theirs)
    m = c.find(f, rf"({N})–({N})× (?:PPO's )?per seed(?: \([^)]*\))?,? (?:and )?({N})× on the means", "λ 3 pace")
    if m:
        c.rng(f, "λ 3 return at update 10 / PPO's, per seed", m[1], m[2], per_seed)
        c.num(f, "λ 3 mean return at update 10 / PPO's", m[3], on_means)
    if full:
        m = c.find(f, rf"per seed \(({N}), ({N}), ({N}) against ({N}), ({N}), ({N})\) and ({N})× on the means \(({N}) "
                      rf"against ({N})\)", "λ 3 pace, the returns")
        if m:
            for i, s in enumerate(gr.SEEDS):
                c.num(f, f"λ 3 seed {s} return at update 10", m[1 + i], ours[i])
                c.num(f, f"PPO seed {s} return at update 10", m[4 + i], theirs[i])
            c.num(f, "λ 3 mean return at update 10", m[8], statistics.mean(ours))
            c.num(f, "PPO mean return at update 10", m[9], statistics.mean(theirs))


def check_control_doc(c, e64p, e64r, e2p, e2r, lam):
    f = CONTROL_DOC
    l3, l05, l15 = lam["lambda-64/fixed-3"], lam["lambda-64/fixed-0.5"], lam["lambda-64/fixed-1.5"]
    ad, cap = lam["lambda-64/adaptive"], lam["lambda-64/adaptive-cap3"]
    fin = lambda arm: [arm[s][-1]["eval_return_mean"] for s in gr.SEEDS]  # noqa: E731
    allkl = lambda arm: [r["approx_kl"] for s in gr.SEEDS for r in arm[s]]  # noqa: E731
    m = c.find(f, rf"Brax's PPO at 64 envs \(KL ({N})–({N}) in updates (\d)–(\d) of seeds (\d) and (\d) and (\d)–(\d) of "
                  rf"seed (\d), while Brax's PPO stayed at ({N})–({N})\)", "64-env excursions")
    if m:
        c.rng(f, "64-env R²VPO KL in its excursions", m[1], m[2], [k for k in allkl(e64r) if k > 1])
        for s, (lo, hi) in ((int(m[5]), (m[3], m[4])), (int(m[6]), (m[3], m[4])), (int(m[9]), (m[7], m[8]))):
            exc = excursion_updates(e64r[s])
            c.same(f, f"64-env R²VPO seed {s} excursion updates", f"{lo}–{hi}", f"{exc[0]}–{exc[-1]}")
        c.rng(f, "64-env PPO per-update KL", m[10], m[11], allkl(e64p))
    check_2048_summary(c, f, e2p, e2r, rf"\(KL ({N})–({N}) in (\d)–(\d) of 10 updates of every seed, where PPO stayed below "
                                      rf"({N}) and returned ({N})–({N}) at update 10 against R²VPO's ({N})–({N});")
    check_hparams_kl(c, f, rf"PPO's approximate KL reached ({N})–({N}) \(20 is the log-ratio clamp")

    # the table
    arms = {"PPO, clip 0.3": e64p, "λ 0.06 fixed (the paper's)": e64r, "λ 0.5 fixed": l05, "λ 1.5 fixed": l15,
            "λ 3 fixed": l3, "adaptive (δ 0.02, η 0.05, from 0.06)": ad, "adaptive, λ ≤ 3": cap}
    rows = c.table(f, r"\| setting \| largest KL of an update \| updates with KL > 1 \(of 10\) \| eval return at update 10 \| its mean \|",
                   "λ table")
    for label, arm in arms.items():
        row = next((r for r in rows if r[0] == label), None)
        if row is None:
            c.find(f, re.escape(f"| {label} |"), "λ table row")
            continue
        for i, s in enumerate(gr.SEEDS):
            c.num(f, f"λ table {label} seed {s}: largest KL", row[1].split(" / ")[i], max(col(arm[s], "approx_kl")))
            c.same(f, f"λ table {label} seed {s}: updates with KL > 1", row[2].split(" / ")[i], len(excursion_updates(arm[s])))
            c.num(f, f"λ table {label} seed {s}: return at update 10", row[3].split(" / ")[i], arm[s][-1]["eval_return_mean"])
        c.num(f, f"λ table {label}: mean return", row[4], statistics.mean(fin(arm)))

    # the advice
    m = c.find(f, rf"the only R²VPO setting measured that never left it \(KL ≤ ({N}) in every update of every seed\)", "λ 3 bound")
    if m:
        c.at_most(f, "λ 3 KL", m[1], allkl(l3))
    check_pace(c, f, e64p, l3)
    c.n += 1
    if not all(a > b for a, b in zip(fin(e64r), fin(l3))):
        c.fails.append(f"{f}: 'its return is below λ 0.06's in every seed' does not hold")
    m = c.find(f, rf"leaves the trust region \(KL > 1 in (\d)–(\d) of 10 updates, largest ({N})–({N}); returns fall to "
                  rf"({N})–({N}) on the way\) and recovers in every seed by update 9–10, with the highest R²VPO "
                  rf"return measured in every seed \(({N})–({N}), ({N})× PPO's mean\)", "λ 0.06 advice")
    if m:
        c.rng(f, "λ 0.06 updates with KL > 1", m[1], m[2], [len(excursion_updates(e64r[s])) for s in gr.SEEDS])
        c.rng(f, "λ 0.06 largest KL", m[3], m[4], [max(col(e64r[s], "approx_kl")) for s in gr.SEEDS])
        c.rng(f, "λ 0.06 lowest return", m[5], m[6], [min(col(e64r[s], "eval_return_mean")) for s in gr.SEEDS])
        c.rng(f, "λ 0.06 return at update 10", m[7], m[8], fin(e64r))
        c.num(f, "λ 0.06 mean return / PPO's", m[9], statistics.mean(fin(e64r)) / statistics.mean(fin(e64p)))
        for i, s in enumerate(gr.SEEDS):
            c.n += 1
            if not fin(e64r)[i] > max(fin(a)[i] for a in (l05, l15, l3, ad, cap)):
                c.fails.append(f"{f}: λ 0.06 no longer has the highest R²VPO return at update 10 in seed {s}")
    m = c.find(f, rf"\(returns ({N}), ({N}) and ({N}) at update 10, one seed ending collapsed\)", "λ 0.06 at 2048 envs")
    if m:
        for q, v in zip((m[1], m[2], m[3]), sorted(fin(e2r))):
            c.num(f, "2048-env R²VPO return at update 10 (sorted)", q, v)
    m = c.find(f, rf"\(largest KL ({N})–({N}), mean ratio down to ({N})–({N})\) and return less\. λ 1\.5 learns steadily at a KL "
                  rf"of ≈ ({N}) for (\d)–(\d) updates, then collapses within two updates and does not recover \(({N})–({N}) at "
                  rf"update 10\); λ 0\.5 recovers in part \(({N})–({N})\)", "λ 0.5 and 1.5 advice")
    if m:
        both = [l05[s] for s in gr.SEEDS] + [l15[s] for s in gr.SEEDS]
        c.rng(f, "λ 0.5 and 1.5 largest KL", m[1], m[2], [max(col(r, "approx_kl")) for r in both])
        c.rng(f, "λ 0.5 and 1.5 lowest mean ratio", m[3], m[4], [min(col(r, "ratio_mean")) for r in both])
        pre = [r["approx_kl"] for s in gr.SEEDS for r in pre_collapse(l15[s])]
        c.num(f, "λ 1.5 median KL before the collapse", m[5], statistics.median(pre))
        c.rng(f, "λ 1.5 updates before the collapse", m[6], m[7], [len(pre_collapse(l15[s])) for s in gr.SEEDS])
        c.rng(f, "λ 1.5 return at update 10", m[8], m[9], fin(l15))
        c.rng(f, "λ 0.5 return at update 10", m[10], m[11], fin(l05))
    m = c.find(f, rf"it settles at ({N})–({N}), collapses like λ 1\.5 after (\d)–(\d) updates, and its dual step then drives λ "
                  rf"to ≈ ({N})–({N}), which freezes the policy \(returns ({N})–({N})\); capping it \(`dual\.lambda_max = 3`\) "
                  rf"does not bring a collapsed run back \(({N})–({N})\)", "adaptive λ advice")
    if m:
        c.rng(f, "adaptive λ before the collapse", m[1], m[2], [r["lambda"] for s in gr.SEEDS for r in pre_collapse(ad[s])])
        c.rng(f, "adaptive updates before the collapse", m[3], m[4], [len(pre_collapse(ad[s])) for s in gr.SEEDS])
        c.rng(f, "adaptive largest λ", m[5], m[6], [max(col(ad[s], "lambda")) for s in gr.SEEDS])
        c.rng(f, "adaptive return at update 10", m[7], m[8], fin(ad))
        c.rng(f, "capped adaptive return at update 10", m[9], m[10], fin(cap))
    m = c.find(f, rf"When both matter, PPO\*\*: the only method measured with a small KL at every update \(≤ ({N})\) and the "
                  rf"highest returns \(({N})–({N})\)", "PPO advice")
    if m:
        c.at_most(f, "64-env PPO KL", m[1], allkl(e64p))
        c.rng(f, "64-env PPO return at update 10", m[2], m[3], fin(e64p))


def check_2048_summary(c, f, e2p, e2r, pattern):
    m = c.find(f, pattern, "2048-env summary")
    if m:
        exc = [r for s in gr.SEEDS for r in e2r[s] if r["approx_kl"] > 1]
        c.rng(f, "2048-env R²VPO KL in excursions", m[1], m[2], col(exc, "approx_kl"))
        c.rng(f, "2048-env R²VPO updates with KL > 1 per seed", m[3], m[4], [len(excursion_updates(e2r[s])) for s in gr.SEEDS])
        c.below(f, "2048-env PPO KL", m[5], [r["approx_kl"] for s in gr.SEEDS for r in e2p[s]])
        c.rng(f, "2048-env PPO return at update 10", m[6], m[7], [e2p[s][-1]["eval_return_mean"] for s in gr.SEEDS])
        c.rng(f, "2048-env R²VPO return at update 10", m[8], m[9], [e2r[s][-1]["eval_return_mean"] for s in gr.SEEDS])


def check_hparams_kl(c, f, pattern):
    """PPO's largest per-update KL in each paper-hparams run, and the clamp."""
    runs_ = sorted(glob.glob(str(ROOT / "results/control/paper-hparams/*/ppo-seed*/metrics.jsonl")))
    maxima = [max(r["approx_kl"] for r in jsonl(p)) for p in runs_]
    m = c.find(f, pattern, "paper-hparams PPO KL")
    if m and maxima:
        c.rng(f, "paper-hparams PPO largest KL per run", m[1], m[2], maxima)
        clamps = {tomllib.loads((Path(p).parent / "config.toml").read_text())["objective"]["log_ratio_clamp"] for p in runs_}
        c.same(f, "paper-hparams log-ratio clamp (config.toml)", "{20.0}", clamps)


def check_top_control(c):
    f = TOP
    e64p, e64r = runs("envs-64", "ppo"), runs("envs-64", "r2vpo")
    e2p, e2r = runs("envs-2048", "ppo"), runs("envs-2048", "r2vpo")
    l3 = runs("lambda-64/fixed-3", "r2vpo")
    row = c.part(f, r"\| control \| ", r" \| [a-zA-Z]", "control row")
    if row is None:
        return
    m = c.find(f, rf"PPO holds its trust region \(KL ({N})–({N}) per update\) and R²VPO at λ 0\.06 leaves it in updates "
                  rf"(\d)–(\d) of seeds (\d) and (\d) and (\d)–(\d) of seed (\d);", "control row, 64 envs", row)
    if m:
        c.rng(f, "64-env PPO per-update KL", m[1], m[2], [r["approx_kl"] for s in gr.SEEDS for r in e64p[s]])
        for s, (lo, hi) in ((int(m[5]), (m[3], m[4])), (int(m[6]), (m[3], m[4])), (int(m[9]), (m[7], m[8]))):
            exc = excursion_updates(e64r[s])
            c.same(f, f"64-env R²VPO seed {s} excursion updates", f"{lo}–{hi}", f"{exc[0]}–{exc[-1]}")
    m = c.find(f, rf"PPO stays below KL ({N}) in every update \(return ({N})–({N}) at update 10\) and R²VPO at λ 0\.06 leaves "
                  rf"the trust region \(KL ({N})–({N})\) in (\d)–(\d) of 10 updates of every seed \(return ({N})–({N})\)",
               "control row, 2048 envs", row)
    if m:
        exc = [r for s in gr.SEEDS for r in e2r[s] if r["approx_kl"] > 1]
        c.below(f, "2048-env PPO KL", m[1], [r["approx_kl"] for s in gr.SEEDS for r in e2p[s]])
        c.rng(f, "2048-env PPO return at update 10", m[2], m[3], [e2p[s][-1]["eval_return_mean"] for s in gr.SEEDS])
        c.rng(f, "2048-env R²VPO KL in excursions", m[4], m[5], col(exc, "approx_kl"))
        c.rng(f, "2048-env R²VPO updates with KL > 1", m[6], m[7], [len(excursion_updates(e2r[s])) for s in gr.SEEDS])
        c.rng(f, "2048-env R²VPO return at update 10", m[8], m[9], [e2r[s][-1]["eval_return_mean"] for s in gr.SEEDS])
    m = c.find(f, rf"finds λ 3 the only setting that stays in the trust region \(KL ≤ ({N})\)", "control row, λ 3", row)
    if m:
        c.at_most(f, "λ 3 KL", m[1], [r["approx_kl"] for s in gr.SEEDS for r in l3[s]])
    check_pace(c, f, e64p, l3)
    m = c.find(f, rf"\(({N})–({N}) at update 10 against λ 3's ({N})–({N})\)", "control row, λ 0.06 against λ 3", row)
    if m:
        c.rng(f, "λ 0.06 return at update 10", m[1], m[2], [e64r[s][-1]["eval_return_mean"] for s in gr.SEEDS])
        c.rng(f, "λ 3 return at update 10", m[3], m[4], [l3[s][-1]["eval_return_mean"] for s in gr.SEEDS])


def check_hparams_readme(c):
    check_hparams_kl(c, "results/control/paper-hparams/README.md",
                     rf"its approximate KL per update reached ({N})–({N}) at some update of every run, where 20 is the "
                     rf"log-ratio clamp")


# ---------------------------------------------------------------------------
# control: analysis.md and final_returns.md


def check_analysis(c):
    """Every per-update table cell, the λ summary table and the verdicts."""
    def per_update(rel, title, rows):
        lines = (ROOT / rel).read_text().splitlines()
        try:
            i = lines.index(f"## {title}")
        except ValueError:
            c.find(rel, re.escape(f"## {title}"), "per-update table heading")
            return
        header = [h.strip() for h in lines[i + 2].strip().strip("|").split("|")]
        body = []
        for line in lines[i + 4:]:
            if not line.startswith("|"):
                break
            body.append([x.strip() for x in line.strip().strip("|").split("|")])
        c.same(rel, f"{title}: number of updates", len(body), len(rows))
        for cells, r in zip(body, rows):
            for name, cell in zip(header, cells):
                if name == "update":
                    c.same(rel, f"{title}: update", cell, r["update"])
                elif r.get(name) is None:
                    c.same(rel, f"{title}, update {r['update']}: {name}", cell, "–")
                else:
                    c.num(rel, f"{title}, update {r['update']}: {name}", cell, r[name])

    for arm in ("envs-64", "envs-2048"):
        rel = f"{GEOM}/{arm}/analysis.md"
        rs = {a: runs(arm, a) for a in ("ppo", "r2vpo")}
        for a in ("ppo", "r2vpo"):
            for s in gr.SEEDS:
                per_update(rel, f"{a}, seed {s}", rs[a][s])
        text = (ROOT / rel).read_text()
        for first in (1, 2):
            for line in gr.verdict(rs, first):
                c.n += 1
                if line not in text:
                    c.fails.append(f"{rel}: verdict line not found as recomputed: {line!r}")

    rel = f"{GEOM}/lambda-64/analysis.md"
    summary = c.table(rel, r"\| setting \| seed \| max approx KL \|", "λ summary table")
    for name, folder, algo in lsw.SETTINGS:
        for s in gr.SEEDS:
            rows = gr.load(ROOT / GEOM / folder, algo, s)
            per_update(rel, f"{name}, seed {s}", rows)
            row = next((r for r in summary if r[0] == name and r[1] == str(s)), None)
            if row is None:
                c.find(rel, re.escape(f"| {name} | {s} |"), "λ summary row")
                continue
            what = f"{name}, seed {s}"
            kl = col(rows, "approx_kl")
            c.num(rel, f"{what}: max approx KL", row[2], max(kl))
            c.same(rel, f"{what}: updates with KL > 1", row[3], sum(k > 1 for k in kl))
            c.num(rel, f"{what}: min mean ratio", row[4], min(col(rows, "ratio_mean")))
            if algo == "r2vpo":
                c.num(rel, f"{what}: last λ", row[5], rows[-1]["lambda"])
            else:
                c.same(rel, f"{what}: last λ", row[5], "–")
            c.num(rel, f"{what}: eval return, update 10", row[6], rows[-1]["eval_return_mean"])


def check_final_returns(c):
    """Each row of every final_returns.md: mean ± population SD over its runs
    of the last evaluation in metrics.jsonl (summary.json's
    final_eval_return where a run has no metrics.jsonl) and of summary.json's
    final training return."""
    for fr in sorted(glob.glob(str(ROOT / "results/**/final_returns.md"), recursive=True)):
        rel = str(Path(fr).relative_to(ROOT))
        rows = c.table(rel, r"\| task \| algorithm \| seeds \| env steps \|", "final returns table")
        for row in rows:
            task, algo, seeds, steps, ev, tr = row[:6]
            sums = sorted(Path(fr).parent.glob(f"{task}/{algo}-seed*/summary.json"))
            what = f"{task} {algo}"
            c.same(rel, f"{what}: seeds", seeds, len(sums))
            if not sums:
                continue
            evals, trains, st = [], [], set()
            for sp in sums:
                j = json.loads(sp.read_text())
                st.add(j["env_steps"])
                mp = sp.parent / "metrics.jsonl"
                e = [r["eval_return_mean"] for r in jsonl(mp) if r.get("eval_return_mean") is not None] if mp.exists() else []
                evals.append(e[-1] if e else j["final_eval_return"])
                trains.append(j["final_train_return"])
            c.same(rel, f"{what}: env steps", steps, ",".join(str(x) for x in sorted(st)))
            m = re.fullmatch(rf"({N}) ± ({N})", ev)
            if m is None:
                c.fail(rel, f"{what}: final eval return cell {ev!r}")
            else:
                c.num(rel, f"{what}: final eval return, mean", m[1], statistics.mean(evals))
                c.num(rel, f"{what}: final eval return, SD", m[2], statistics.pstdev(evals))
            if None in trains:
                c.same(rel, f"{what}: final training return", tr, "-")
            else:
                m = re.fullmatch(rf"({N}) ± ({N})", tr)
                if m is None:
                    c.fail(rel, f"{what}: final training return cell {tr!r}")
                else:
                    c.num(rel, f"{what}: final training return, mean", m[1], statistics.mean(trains))
                    c.num(rel, f"{what}: final training return, SD", m[2], statistics.pstdev(trains))


# ---------------------------------------------------------------------------
# LLM

LLM = "results/llm"
COMPARISON = {  # label in the tables -> run folder under results/llm/comparison
    "GRPO": "grpo", "GRPO-CH": "grpo-ch", "R²VPO-ON": "r2vpo-on", "R²VPO-OFF (K = 4)": "r2vpo-off", "R²VPO-OFF": "r2vpo-off",
}


def base_2026_11_22(c):
    """The base model's avg@4 under the 2026-11-22 verifier, as base-eval.md
    records it (the raw eval.md of then is in git history only)."""
    m = c.find(f"{LLM}/base-eval.md", rf"Against the 2026-11-22 verifier \(answer-line ({N}) / ({N}) / ({N}) / ({N}) %, auto "
                                     rf"({N}) / ({N}) / ({N}) / ({N}) %\)", "the 2026-11-22 base figures")
    return m[5] if m else None


def check_llm(c):
    base = {k: json.loads((ROOT / LLM / f"base-eval-{k}/eval.json").read_text())["overall"] for k in ("auto", "answer-line")}
    f = f"{LLM}/base-eval.md"
    rows = c.table(f, r"\| answer extraction \| avg@4 \|", "base-eval table")
    for key, prefix in (("answer-line", "`answer-line`"), ("auto", "`auto`")):
        row = next((r for r in rows if r[0].startswith(prefix)), None)
        if row is None:
            c.find(f, re.escape(f"| {prefix}"), "base-eval row")
            continue
        o = base[key]
        for cell, v in zip(row[1:], (o["avg_at_k"], o["pass_at"]["1"], o["pass_at"]["4"], o["maj_at_k"])):
            c.num(f, f"base {key}", cell.rstrip("%"), pct(v))
        c.num(f, f"base {key}: mean tokens", row[5], o["mean_response_tokens"])
        c.num(f, f"base {key}: truncated", row[6].rstrip("%"), pct(o["truncated_fraction"]))
        c.num(f, f"base {key}: answer found", row[7].rstrip("%"), pct(o["extracted_fraction"]))
    old_base = base_2026_11_22(c)
    auto = pct(base["auto"]["avg_at_k"])

    def ev(folder):
        return last_eval(f"{LLM}/{folder}")

    def metrics(folder):
        return jsonl(ROOT / LLM / folder / "metrics.jsonl")

    # comparison table and means (results/llm/README.md)
    f = f"{LLM}/README.md"
    rows = c.table(f, r"\| run \| held-out avg@4 \| pass@4 \| maj@4 \| held-out response tokens \| rollout accuracy", "comparison table")
    for row in rows:
        if row[0] == "base model":
            if old_base:
                c.num(f, "base model avg@4 (2026-11-22 verifier)", row[1].rstrip("%"), parse(old_base))
            c.num(f, "base model pass@4", row[2].rstrip("%"), pct(base["auto"]["pass_at"]["4"]))
            c.num(f, "base model maj@4", row[3].rstrip("%"), pct(base["auto"]["maj_at_k"]))
            c.num(f, "base model tokens", row[4], base["auto"]["mean_response_tokens"])
            continue
        m = re.fullmatch(r"(.+) seed (\d)", row[0])
        if not m or m[1] not in COMPARISON:
            c.fail(f, f"comparison row {row[0]!r} has no run folder mapped in check_figures.py")
            continue
        folder = f"comparison/{COMPARISON[m[1]]}-seed{m[2]}"
        e, mt = ev(folder), metrics(folder)
        c.num(f, f"{row[0]}: avg@4", row[1].rstrip("%"), pct(e["avg_at_k"]))
        c.num(f, f"{row[0]}: pass@4", row[2].rstrip("%"), pct(e["pass_at_k"]))
        c.num(f, f"{row[0]}: maj@4", row[3].rstrip("%"), pct(e["maj_at_k"]))
        c.num(f, f"{row[0]}: tokens", row[4], e["response_len_mean"])
        c.num(f, f"{row[0]}: rollout accuracy, last 5", row[5], statistics.mean(r["accuracy"] for r in mt[-5:]))
    means = {k: statistics.mean(ev(f"comparison/{v}-seed{s}")["avg_at_k"] for s in (0, 1)) for k, v in COMPARISON.items()}
    m = c.find(f, rf"Means over the two seeds: held-out avg@4 GRPO ({N})%, GRPO-CH ({N})%, R²VPO-ON ({N})%, R²VPO-OFF "
                  rf"({N})% \(base ({N})%\)", "comparison means")
    if m:
        for i, k in enumerate(("GRPO", "GRPO-CH", "R²VPO-ON", "R²VPO-OFF")):
            c.num(f, f"{k} mean avg@4", m[1 + i], pct(means[k]))
        if old_base:
            c.num(f, "base avg@4 (2026-11-22 verifier)", m[5], parse(old_base))
    rows = c.table(f, r"\| run \| held-out avg@4 \| expression answers among 400 \|", "hackable-verifier table")
    hack = {"GRPO seed 0": "grpo-seed0", "GRPO seed 1": "grpo-seed1", "GRPO-CH seed 0": "grpo-ch-seed0", "R²VPO-ON seed 0": "r2vpo-on-seed0"}
    for row in rows:
        if row[0] not in hack:
            c.fail(f, f"hackable-verifier row {row[0]!r} has no run folder mapped")
            continue
        c.num(f, f"hackable {row[0]}: avg@4", re.match(N, row[1])[0], pct(ev(f"hackable-verifier/{hack[row[0]]}")["avg_at_k"]))

    # README's LLM row and docs/llm-training.md
    m = c.find(TOP, rf"held-out avg@4 from ({N}) % to ({N}) % \(GRPO\), ({N}) % \(GRPO-CH\), ({N}) % \(R²VPO-ON\) and ({N}) % "
                    rf"\(R²VPO-OFF", "LLM row, comparison")
    if m:
        if old_base:
            c.num(TOP, "LLM row: base avg@4 before the comparison (2026-11-22 verifier)", m[1], parse(old_base))
        for i, k in enumerate(("GRPO", "GRPO-CH", "R²VPO-ON", "R²VPO-OFF")):
            c.num(TOP, f"LLM row: {k} mean avg@4", m[2 + i], pct(means[k]))
    d = "docs/llm-training.md"
    rows = c.table(d, r"\| method \| held-out avg@4 \(seed 0 / 1\) \| mean \| mean training reward", "comparison table")
    for row in rows:
        v = COMPARISON.get(row[0])
        if v is None:
            c.fail(d, f"comparison row {row[0]!r} has no run folder mapped")
            continue
        for q, s in zip(row[1].rstrip(" %").split(" / "), (0, 1)):
            c.num(d, f"{row[0]} seed {s} avg@4", q, pct(ev(f"comparison/{v}-seed{s}")["avg_at_k"]))
        c.num(d, f"{row[0]} mean avg@4", row[2].rstrip(" %"), pct(means[row[0]]))
        c.num(d, f"{row[0]} mean training reward, last 5", row[3],
              statistics.mean(statistics.mean(r["reward_mean"] for r in metrics(f"comparison/{v}-seed{s}")[-5:]) for s in (0, 1)))
    m = c.find(d, rf"the base model scores ({N}) % avg@4 \(pass@4 ({N}) %\) with lenient answer extraction .*? today's verifier "
                  rf"\(({N}) % with the 2026-11-22 verifier", "base model in docs")
    if m:
        c.num(d, "base avg@4", m[1], auto)
        c.num(d, "base pass@4", m[2], pct(base["auto"]["pass_at"]["4"]))
        if old_base:
            c.num(d, "base avg@4, 2026-11-22 verifier", m[3], parse(old_base))

    # LoRA
    f = f"{LLM}/lora/README.md"
    m = c.find(f, rf"the base model scores ({N}) %, \[`\.\./base-eval\.md`\]", "LoRA README: base")
    if m:
        c.num(f, "base avg@4 (today's verifier, base-eval-auto/eval.json)", m[1], auto)
    rows = c.table(f, r"\| lr \| held-out avg@4 \| pass@4 \| maj@4 \| rollout reward", "LoRA sweep table")
    sweep = {}
    for row in rows:
        lr = re.match(r"\**([\de.-]+)", row[0])[1]
        folder = f"lora/lr-sweep/lr-{lr}"
        e, mt = ev(folder), metrics(folder)
        sweep[lr] = e["avg_at_k"]
        c.num(f, f"lr {lr}: avg@4", row[1].strip("*").rstrip(" %"), pct(e["avg_at_k"]))
        c.num(f, f"lr {lr}: pass@4", row[2].rstrip(" %"), pct(e["pass_at_k"]))
        c.num(f, f"lr {lr}: maj@4", row[3].rstrip(" %"), pct(e["maj_at_k"]))
        a, b = row[4].split(" → ")
        c.num(f, f"lr {lr}: reward, first 5", a, statistics.mean(r["reward_mean"] for r in mt[:5]))
        c.num(f, f"lr {lr}: reward, last 5", b, statistics.mean(r["reward_mean"] for r in mt[-5:]))
        c.num(f, f"lr {lr}: tokens", row[5], e["response_len_mean"])
    vs = {"full fine-tuning (lr 2e-5)": ("lora/vs-full/full-seed0", "lora/vs-full/full-seed1"),
          "LoRA r 16 (lr 2e-4)": ("lora/lr-sweep/lr-2e-4", "lora/vs-full/lora-seed1")}
    rows = c.table(f, r"\| \| seed 0 \| seed 1 \| mean \| trained parameters", "LoRA vs full table")
    vmeans = {}
    for row in rows:
        if row[0] not in vs:
            c.fail(f, f"LoRA vs full row {row[0]!r} has no run folder mapped")
            continue
        accs = [ev(x)["avg_at_k"] for x in vs[row[0]]]
        vmeans[row[0]] = statistics.mean(accs)
        c.num(f, f"{row[0]} seed 0", row[1].rstrip(" %"), pct(accs[0]))
        c.num(f, f"{row[0]} seed 1", row[2].rstrip(" %"), pct(accs[1]))
        c.num(f, f"{row[0]} mean", row[3].rstrip(" %"), pct(vmeans[row[0]]))
    full = [ev(x)["avg_at_k"] for x in vs["full fine-tuning (lr 2e-5)"]]
    comp = [ev(f"comparison/r2vpo-on-seed{s}")["avg_at_k"] for s in (0, 1)]
    m = c.find(f, rf"The full fine-tuning runs here \(({N}) % and ({N}) %\) score below the committed comparison's R²VPO-ON "
                  rf"runs of the same training settings and learning rate \(`\.\./comparison/`, ({N}) % and ({N}) %\)",
               "LoRA README: comparison runs")
    if m:
        for i, s in enumerate((0, 1)):
            c.num(f, f"full fine-tuning seed {s}", m[1 + i], pct(full[i]))
            c.num(f, f"comparison R²VPO-ON seed {s}", m[3 + i], pct(comp[i]))
    non_int, wrong = 0, True
    for s in (0, 1):
        rep = json.loads((ROOT / LLM / f"comparison/r2vpo-on-seed{s}/iter-000015.json").read_text())
        for p in rep["problems"]:
            for a, ok in zip(p["extracted"], p["sample_correct"]):
                if a is None or not re.fullmatch(r"-?\d+", a.strip()):
                    non_int += 1
                    wrong = wrong and not ok
    m = c.find(f, r"all but (one|\d+) of their (\d+) held-out answers are plain integers", "LoRA README: verdicts")
    if m:
        c.same(f, "comparison R²VPO-ON held-out answers that are not plain integers", {"one": "1"}.get(m[1], m[1]), non_int)
        c.same(f, "comparison R²VPO-ON held-out answers", m[2], 800)
        c.same(f, "the non-integer answers were all judged wrong", True, wrong)
    m = c.find(f, rf"iteration 0's mean response length ({N}) against ({N}) tokens in seed 0, ({N}) against ({N}) in seed 1",
               "LoRA README: iteration 0")
    if m:
        for i, s in enumerate((0, 1)):
            c.num(f, f"comparison R²VPO-ON seed {s} iteration-0 length", m[1 + 2 * i], metrics(f"comparison/r2vpo-on-seed{s}")[0]["response_len_mean"])
            c.num(f, f"full fine-tuning seed {s} iteration-0 length", m[2 + 2 * i], metrics(f"lora/vs-full/full-seed{s}")[0]["response_len_mean"])
    m = c.find(f, rf"gaps of ({N}) and ({N}) points are within the comparison's seed spreads \(up to ({N}) points: GRPO's "
                  rf"({N}) and ({N}) %\)", "LoRA README: gaps")
    if m:
        c.num(f, "gap, seed 0", m[1], pct(comp[0] - full[0]))
        c.num(f, "gap, seed 1", m[2], pct(comp[1] - full[1]))
        spreads = {k: abs(ev(f"comparison/{v}-seed0")["avg_at_k"] - ev(f"comparison/{v}-seed1")["avg_at_k"]) for k, v in COMPARISON.items()}
        c.num(f, "largest seed spread in the comparison", m[3], pct(max(spreads.values())))
        c.num(f, "GRPO seed 0", m[4], pct(ev("comparison/grpo-seed0")["avg_at_k"]))
        c.num(f, "GRPO seed 1", m[5], pct(ev("comparison/grpo-seed1")["avg_at_k"]))
    lora, fullm = vmeans.get("LoRA r 16 (lr 2e-4)"), vmeans.get("full fine-tuning (lr 2e-5)")
    m = c.find(d, rf"avg@4 ({N}) % at 5e-5, ({N}) % at 2e-4, ({N}) % at 8e-4", "docs: LoRA sweep")
    if m:
        for q, lr in zip(m.groups(), ("5e-5", "2e-4", "8e-4")):
            c.num(d, f"LoRA lr {lr} avg@4", q, pct(ev(f"lora/lr-sweep/lr-{lr}")["avg_at_k"]))
    # The pre-registered comparison (results/llm/lora-fair), quoted in the
    # docs, the README and the LoRA README.
    fair = ROOT / "results/llm/lora-fair/final"
    held = {m: [json.loads((fair / f"{m}-seed{k}" / "eval.jsonl").read_text().strip().splitlines()[-1])["avg_at_k"]
                for k in (0, 1, 2)] for m in ("lora", "full")}
    lmean, fmean = (sum(held[m]) / 3 for m in ("lora", "full"))
    for rel, pat in ((d, rf"are not distinguishable: ({N}) % and ({N}) % mean held-out avg@4\s+from the base's ({N}) %, "
                         rf"per-seed\s+differences\s+\+?({N}),\s+\+?({N})\s+and\s+\+?({N})\s+points"),
                     (TOP, rf"are not distinguishable: ({N}) % and ({N}) % mean held-out avg@4()"),
                     ("results/llm/lora/README.md", rf"not distinguishable with 3 seeds \(({N}) % and ({N}) % mean\s+held-out avg@4\)()")):
        m = c.find(rel, pat, "LoRA against full fine-tuning, fairly")
        if m:
            c.num(rel, "LoRA mean held-out avg@4", m[1], pct(lmean))
            c.num(rel, "full fine-tuning mean held-out avg@4", m[2], pct(fmean))
            if m[3]:
                c.num(rel, "base avg@4 (today's verifier)", m[3], auto)
            if m.re.groups >= 6:
                for i in range(3):
                    c.num(rel, f"LoRA − full, seed {i}", m[4 + i], pct(held["lora"][i] - held["full"][i]))


# ---------------------------------------------------------------------------
# distributed bench


def check_dist(c):
    bench = "results/bench/dist-cpu-2026-11-29"
    data = {d: json.loads((ROOT / bench / f"ranks-{d}.json").read_text())["rows"] for d in ("f32", "bf16")}
    one = [data[d][0]["rank_peak_rss_mib"][0] for d in ("f32", "bf16")]
    many = [x for d in data for r in data[d] if r["ranks"] > 1 for x in r["rank_peak_rss_mib"]]
    gib = lambda xs: [x / 1024 for x in xs]  # noqa: E731
    f = f"{bench}/README.md"
    m = c.find(f, rf"its peak falls from ({N})–({N}) GiB \(({N}) and ({N}) MiB\) to ({N})–({N}) GiB \(({N})–({N}) MiB; GiB = "
                  rf"MiB ÷ 1024\)", "peak memory in GiB")
    if m:
        c.rng(f, "one process's peak, GiB", m[1], m[2], gib(one))
        c.num(f, "one process's peak, f32, MiB", m[3], one[0])
        c.num(f, "one process's peak, bf16, MiB", m[4], one[1])
        c.rng(f, "peak per rank at 2-3 ranks, GiB", m[5], m[6], gib(many))
        c.rng(f, "peak per rank at 2-3 ranks, MiB", m[7], m[8], many)
    m = c.find("docs/distributed.md", rf"each rank's peak memory falls from ({N})–({N}) GiB \(one process\) to ({N})–({N}) GiB "
                                      rf"at 2 and 3 ranks", "peak memory in GiB")
    if m:
        c.rng("docs/distributed.md", "one process's peak, GiB", m[1], m[2], gib(one))
        c.rng("docs/distributed.md", "peak per rank at 2-3 ranks, GiB", m[3], m[4], gib(many))
    for d, header in (("f32", "f32 compute"), ("bf16", "bf16 compute")):
        text = (ROOT / f).read_text()
        i = text.find(header)
        if i < 0:
            c.find(f, re.escape(header), "dist table heading")
            continue
        lines = text[i:].splitlines()
        j = next((k for k, l in enumerate(lines) if l.startswith("| ranks |")), None)
        if j is None:
            c.fail(f, f"{d} table")
            continue
        for line, r in zip(lines[j + 2:], data[d]):
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            what = f"{d}, {r['ranks']} rank(s)"
            c.same(f, f"{what}: ranks", cells[0], r["ranks"])
            c.num(f, f"{what}: rollout s", cells[1], r["rollout_s"])
            c.num(f, f"{what}: update s", cells[2], r["train_s"])
            c.num(f, f"{what}: update × 1 rank", cells[3], r["ratio"])
            c.seq(f, f"{what}: peak RSS MiB", cells[4], r["rank_peak_rss_mib"], label="rank")
            if r["moments_per_rank"]:
                c.seq(f, f"{what}: moments per rank (M)", cells[5].replace(" M", ""),
                      [x / 1e6 for x in r["moments_per_rank"]], label="rank")
    ratios = {d: {r["ranks"]: (r["rollout_s"] / data[d][0]["rollout_s"], r["ratio"]) for r in data[d]} for d in data}
    m = c.find(f, rf"update ({N})× \(f32\) and ({N})× \(bf16\), rollout ({N})× and ({N})×", "2-rank ratios")
    if m:
        c.num(f, "2 ranks f32 update", m[1], ratios["f32"][2][1])
        c.num(f, "2 ranks bf16 update", m[2], ratios["bf16"][2][1])
        c.num(f, "2 ranks f32 rollout", m[3], ratios["f32"][2][0])
        c.num(f, "2 ranks bf16 rollout", m[4], ratios["bf16"][2][0])
    g = "docs/distributed.md"
    m = c.find(g, rf"2 ranks take ({N})× \(f32\) and ({N})× \(bf16\) of the one-process update time and ({N})×/({N})× of its "
                  rf"rollout time, and 3 ranks on the two cores ({N})×/({N})×", "rank ratios")
    if m:
        c.num(g, "2 ranks f32 update", m[1], ratios["f32"][2][1])
        c.num(g, "2 ranks bf16 update", m[2], ratios["bf16"][2][1])
        c.num(g, "2 ranks f32 rollout", m[3], ratios["f32"][2][0])
        c.num(g, "2 ranks bf16 rollout", m[4], ratios["bf16"][2][0])
        c.num(g, "3 ranks f32 update", m[5], ratios["f32"][3][1])
        c.num(g, "3 ranks bf16 update", m[6], ratios["bf16"][3][1])


def check_dist_memory(c):
    """The per-rank memory table and prose against memory.json."""
    bench = "results/bench/dist-memory-2026-12-07-intel-xeon-avx512-amx"
    f = f"{bench}/README.md"
    rows = json.loads((ROOT / bench / "memory.json").read_text())["rows"]
    table = c.table(f, r"\| ranks \| ZeRO \| owned", "memory table")
    if table is not None:
        if len(table) != len(rows):
            c.fail(f, f"memory table: {len(table)} rows, memory.json {len(rows)}")
        for cells, r in zip(table, rows):
            what = f"{r['ranks']} rank(s), ZeRO-{r['zero']}"
            c.same(f, f"{what}: ranks", cells[0], r["ranks"])
            c.same(f, f"{what}: ZeRO", cells[1], r["zero"])
            c.seq(f, f"{what}: owned MiB", cells[2], r["owned_mib"], label="rank")
            c.seq(f, f"{what}: iteration MiB", cells[3], r["step_mib"], label="rank")
            ck = [x.split(" − ") for x in cells[4].split(", ")]
            c.seq(f, f"{what}: checkpoint peak", ", ".join(x[0] for x in ck), r["checkpoint_mib"], label="rank")
            c.seq(f, f"{what}: checkpoint start", ", ".join(x[-1] for x in ck), r["checkpoint_start_mib"], label="rank")
            c.seq(f, f"{what}: resume MiB", cells[5], r["resume_mib"], label="rank")
            c.seq(f, f"{what}: resume − iteration", cells[6],
                  [a - b for a, b in zip(r["resume_mib"], r["step_mib"])], label="rank")
            c.num(f, f"{what}: plan MiB", cells[7], r["plan_mib"])
            c.seq(f, f"{what}: iteration − plan", cells[8], [x - r["plan_mib"] for x in r["step_mib"]], label="rank")
    off = lambda zs: [s - r["plan_mib"] for r in rows if r["zero"] in zs for s in r["step_mib"]]  # noqa: E731
    m = c.find(f, rf"stays ({N})–({N}) MiB above", "offset at ZeRO 0 and 1")
    if m:
        c.rng(f, "iteration − plan at ZeRO 0-1", m[1], m[2], off((0, 1)))
    m = c.find(f, rf"At ZeRO-2 the offset is ({N})–({N}) MiB", "offset at ZeRO-2")
    if m:
        c.rng(f, "iteration − plan at ZeRO-2", m[1], m[2], off((2,)))
    m = c.find(f, rf"peaks rise by ({N})–({N}) MiB", "checkpoint rise")
    if m:
        c.rng(f, "checkpoint rise of ranks > 0", m[1], m[2],
              [p - s for r in rows if r["zero"] > 0 for p, s in list(zip(r["checkpoint_mib"], r["checkpoint_start_mib"]))[1:]])
    rise = lambda ranks, zs: [a - b for r in rows if r["zero"] in zs and r["ranks"] in ranks  # noqa: E731
                              for a, b in zip(r["resume_mib"], r["step_mib"])]
    m = c.find(f, rf"steady one by ({N})–({N}) MiB at ZeRO-0 \(owned ({N})\), ({N})–({N}) at 2 ranks ZeRO-1 \(owned "
                  rf"({N})–({N})\), ({N})–({N}) at 3 \(owned ({N})–({N})\), and at most ({N}) at ZeRO-2", "resume rise")
    if m:
        c.rng(f, "resume rise at ZeRO-0", m[1], m[2], rise((1, 2, 3), (0,)))
        c.num(f, "owned at ZeRO-0", m[3], rows[0]["owned_mib"][0])
        c.rng(f, "resume rise at 2 ranks ZeRO-1", m[4], m[5], rise((2,), (1,)))
        c.rng(f, "owned at 2 ranks ZeRO-1", m[6], m[7], [x for r in rows if (r["ranks"], r["zero"]) == (2, 1) for x in r["owned_mib"]])
        c.rng(f, "resume rise at 3 ranks ZeRO-1", m[8], m[9], rise((3,), (1,)))
        c.rng(f, "owned at 3 ranks ZeRO-1", m[10], m[11], [x for r in rows if (r["ranks"], r["zero"]) == (3, 1) for x in r["owned_mib"]])
        c.num(f, "largest resume rise at ZeRO-2", m[12], max(rise((2, 3), (2,))))


PACKING = "results/bench/packing-2026-12-07-intel-xeon-avx512-amx"
PACKING_RUNS = (("lognormal", "log-normal"), ("uniform", "all 256"), ("short", "short answers"))


def check_packing(c):
    """The packing bench's tables (its README, docs/llm-training.md) against
    the runs' JSON: speed from one process per length distribution, memory
    from one process per layout."""
    f = f"{PACKING}/README.md"
    runs = {name: json.loads((ROOT / PACKING / f"{name}.json").read_text()) for name, _ in PACKING_RUNS}
    for name, label in PACKING_RUNS:
        rows = runs[name]["rows"]
        table = c.table(f, rf"\| layout \({re.escape(label)}", f"{name} table")
        if len(table) != len(rows):
            c.fail(f, f"{name} table: {len(table)} rows, {name}.json {len(rows)}")
        for cells, r in zip(table, rows):
            what = f"{name}: {r['layout']}"
            c.same(f, f"{what}: layout", cells[0], r["layout"])
            c.same(f, f"{what}: micro-batches", cells[1], r["micro_batches"])
            c.same(f, f"{what}: computed tokens", cells[2], r["computed_tokens"])
            c.num(f, f"{what}: padding %", cells[3].rstrip(" %"), 100 * r["padding_frac"])
            c.num(f, f"{what}: median step s", cells[4].rstrip(" s"), r["median_s"])
            m = re.match(rf"({N})× the time \(({N})× faster\)", cells[5])
            if m is None:
                c.fail(f, f"{what}: ratio cell {cells[5]!r}")
                continue
            c.num(f, f"{what}: time ratio", m[1], r["vs_padded"])
            c.num(f, f"{what}: speed-up", m[2], 1 / r["vs_padded"])
    table = c.table(f, r"\| layout \(alone in its process", "memory table")
    for cells in table:
        key = cells[0].split(" ")[0].strip("`")
        r = json.loads((ROOT / PACKING / f"memory-{key}.json").read_text())["rows"][0]
        c.same(f, f"memory {key}: layout", cells[1], r["layout"])
        c.num(f, f"memory {key}: peak GiB", cells[2].rstrip(" GiB"), r["peak_gib"])
    inv = lambda name, layouts: [1 / r["vs_padded"] for r in runs[name]["rows"]  # noqa: E731
                                 if r["layout"].split(",")[0] == "packed" and (("≤" in r["layout"]) in layouts)]
    ratio = lambda name, budget: [r["vs_padded"] for r in runs[name]["rows"]  # noqa: E731
                                  if r["layout"].split(",")[0] == "packed" and ("≤" in r["layout"]) == budget][0]
    m = c.find(f, rf"a step takes ({N})× the time \(({N})× with a token budget\)", "long-tailed time ratios")
    if m:
        c.num(f, "packed rows time ratio", m[1], ratio("lognormal", False))
        c.num(f, "packed budget time ratio", m[2], ratio("lognormal", True))
    m = c.find(f, rf"on such a distribution: ({N})–({N})×", "long-tailed speed-ups")
    if m:
        c.rng(f, "long-tailed packed speed-ups", m[1], m[2], inv("lognormal", (False, True)))
    m = c.find(f, rf"packing is not slower: ({N})–({N})× faster", "equal-length speed-ups")
    if m:
        c.rng(f, "equal-length packed speed-ups", m[1], m[2], inv("uniform", (False, True)))
    m = c.find(f, rf"shared prompts helped most \(({N})×\), packing is ({N})–({N})× faster", "short speed-ups")
    if m:
        shared = [1 / r["vs_padded"] for r in runs["short"]["rows"] if r["layout"].startswith("shared")][0]
        c.num(f, "short shared-prompt speed-up", m[1], shared)
        c.rng(f, "short packed speed-ups", m[2], m[3], inv("short", (False, True)))
    peak = lambda k: json.loads((ROOT / PACKING / f"memory-{k}.json").read_text())["rows"][0]["peak_gib"]  # noqa: E731
    for rel in (f, "docs/llm-training.md"):
        m = c.find(rel, rf"({N}) (?:GiB packed )?against ({N}) GiB", "packed against padded peak")
        if m:
            c.num(rel, "packed peak", m[1], peak("packed"))
            c.num(rel, "padded peak", m[2], peak("padded"))
    m = c.find(f, rf"and ({N}) against ({N}) GiB under", "budget peaks")
    if m:
        c.num(f, "packed budget peak", m[1], peak("packed-budget"))
        c.num(f, "padded budget peak", m[2], peak("padded-budget"))
    m = c.find("README.md", rf"a training step is ({N})× faster than padded rows on long-tailed answers and ({N})× on short",
               "README packing row")
    if m:
        c.num("README.md", "long-tailed packed budget speed-up", m[1], 1 / ratio("lognormal", True))
        c.num("README.md", "short packed budget speed-up", m[2], 1 / ratio("short", True))
    # The summary in docs/llm-training.md: each run's speed-up over padded rows.
    d = "docs/llm-training.md"
    table = c.table(d, r"\| response lengths \| padded rows", "packing summary")
    for cells, (name, _) in zip(table, PACKING_RUNS):
        by = {r["layout"].split(",")[0] + (" budget" if "≤" in r["layout"] else ""): r for r in runs[name]["rows"]}
        for cell, key in zip(cells[1:], ("padded rows", "shared prompts", "packed", "packed budget")):
            m = re.match(rf"({N})×", cell)
            if m is None:
                c.fail(d, f"{name}: cell {cell!r}")
            else:
                c.num(d, f"{name}: {key} speed-up", m[1], 1 / by[key]["vs_padded"])


TOY_MENU = "results/toy/menu-2026-12-07-intel-xeon-avx512-amx"


def check_toy_menu(c):
    """The whole-table toy comparison: summary.md's final reward and greedy
    accuracy (mean ± population std over seeds) against each run's
    summary.json, then the README's prose against summary.md."""
    f = f"{TOY_MENU}/summary.md"
    table = {cells[0]: cells for cells in c.table(f, r"\| algorithm \| seeds \| final reward", "menu table")}
    if len(table) != 22:
        c.fail(f, f"{len(table)} algorithms, the table has 22 (every entry but the r2vpo alias)")
    for algo, cells in table.items():
        runs = sorted(glob.glob(str(ROOT / TOY_MENU / "runs" / f"{algo}-seed*" / "summary.json")))
        finals = [json.loads(Path(r).read_text()) for r in runs]
        c.same(f, f"{algo}: seeds", cells[1], len(finals))
        for col, key in ((2, "reward"), (3, "greedy_accuracy")):
            v = [x[key] for x in finals]
            mean = sum(v) / len(v)
            std = (sum((x - mean) ** 2 for x in v) / len(v)) ** 0.5
            m = re.match(rf"({N}) ± ({N})", cells[col])
            if m is None:
                c.fail(f, f"{algo}: cell {cells[col]!r}")
                continue
            c.num(f, f"{algo}: final {key} mean", m[1], mean)
            c.num(f, f"{algo}: final {key} std", m[2], std)
    r = f"{TOY_MENU}/README.md"
    cell = lambda algo, col: parse(re.match(rf"({N})", table[algo][col])[1])  # noqa: E731
    on = ["r2vpo-on", "ppo", "grpo", "grpo-ch", "gppo", "topr", "grpo-kl", "is-pg", "m2po", "log-ratio-sq",
          "log-ratio-sq-dual", "cispo", "sapo", "dppo-tv", "dppo-kl"]
    m = c.find(r, rf"final reward ({N})–({N}) ± ({N})", "on-policy band")
    if m:
        c.rng(r, "on-policy final rewards", m[1], m[2], [cell(a, 2) for a in on])
    m = c.find(r, rf"E\[\(ρ−1\)²\] near ({N})·10⁻³", "on-policy sq-dev")
    if m:
        c.num(r, "r2vpo-on mean sq-dev ×1e3", m[1], 1e3 * parse(table["r2vpo-on"][5]))
    for algo, label in (("gspo", "GSPO"), ("spo", "SPO"), ("dr-grpo", "Dr.GRPO")):
        m = c.find(r, rf"(?<![A-Z]){re.escape(label)} \(({N})\)", f"{algo} final reward")
        if m:
            c.num(r, f"{algo} final reward", m[1], cell(algo, 2))
    m = c.find(r, rf"\(({N}) % of token ratios", "gspo clip fraction")
    if m:
        c.num(r, "gspo mean clip frac %", m[1], 100 * parse(table["gspo"][6]))
    m = c.find(r, rf"E\[\(ρ−1\)²\] ≈ ({N})–({N})·10⁻²", "replay sq-dev range")
    if m:
        c.rng(r, "replay mean sq-dev ×1e2", m[1], m[2],
              [1e2 * parse(table[a][5]) for a in ("r2vpo-off", "grpo-off", "grpo-ch-off", "m2po-off")])
    for algo, label in (("r2vpo-off", "R²VPO-OFF"), ("m2po-off", "M2PO-OFF"), ("grpo-off", "GRPO-OFF"),
                        ("grpo-ch-off", "GRPO-CH-OFF")):
        m = c.find(r, rf"{re.escape(label)} \(({N}) ± ({N})\)", f"{algo} final reward")
        if m:
            c.same(r, f"{algo} final reward", f"{m[1]} ± {m[2]}", table[algo][2])


# ---------------------------------------------------------------------------


def main():
    verbose = "-v" in sys.argv[1:]
    t0 = time.perf_counter()
    c = Checker(verbose)
    for step in (check_geometry, check_top_control, check_hparams_readme, check_analysis, check_final_returns,
                 check_llm, check_dist, check_dist_memory, check_packing, check_toy_menu):
        try:
            step(c)
        except Exception as e:  # a raw file missing or reshaped is a failure, not a crash
            c.n += 1
            c.fails.append(f"{step.__name__}: could not run: {type(e).__name__}: {e}")
    dt = time.perf_counter() - t0
    if c.fails:
        print(f"check_figures: {len(c.fails)} of {c.n} checks failed ({dt:.1f} s):", file=sys.stderr)
        for line in c.fails:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"check_figures: all {c.n} figures agree with the raw files ({dt:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
