//! The paper's LLM figures from `llm train` run folders (`r2vpo llm plot`):
//! reward, accuracy and response-length curves of several runs on one
//! figure (runs of the same algorithm with different seeds become mean ±
//! std), λ trajectories, ratio diagnostics, held-out accuracy, and ratio
//! histograms by staleness, plus a Markdown summary table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use r2vpo::dual::DualMode;
use r2vpo::objective::ObjectiveKind;
use r2vpo_report::plot::{mean_std_band, Grid, LineChart, Series};
use r2vpo_report::ReportError;

use crate::train::metrics::{EvalRecord, IterMetrics, RatioHistogram};
use crate::train::{Mode, TrainConfig};

/// Why a run folder could not be plotted; every message names the folder
/// or file.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The folder is not a finished-enough `llm train` run.
    #[error("{0}")]
    Run(String),
    /// Its config does not load.
    #[error(transparent)]
    Config(#[from] r2vpo_report::config::ConfigError),
    /// Reading logs or writing figures failed.
    #[error(transparent)]
    Report(#[from] ReportError),
}

type Result<T> = std::result::Result<T, PlotError>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(PlotError::Run(format!($($t)*))) };
}

/// One run folder's logs.
struct Run {
    dir: PathBuf,
    label: String,
    seed: u64,
    metrics: Vec<IterMetrics>,
    evals: Vec<EvalRecord>,
    hists: Vec<RatioHistogram>,
}

/// A short algorithm name for a config, as the paper labels its curves.
///
/// Runs whose λ acts (R²VPO, GRPO-KL) and departs from the adaptive, unbounded
/// default get it appended (`λ=0.04` fixed, `λ≤0.04` capped), so a λ
/// ablation plots as separate curves rather than as extra seeds of one.
/// Asynchronous runs get their staleness bound (`async s1`).
pub fn algo_label(cfg: &TrainConfig) -> String {
    let mut label = algo_base_label(cfg);
    if cfg.objective.kind.uses_lambda() {
        match (cfg.dual.mode, cfg.dual.lambda_max) {
            (DualMode::Fixed, _) => label = format!("{label} λ={}", cfg.dual.lambda0),
            (DualMode::Adaptive, Some(max)) => label = format!("{label} λ≤{max}"),
            (DualMode::Adaptive, None) => {}
        }
    }
    if cfg.actors.asynchronous {
        label = format!("{label} async s{}", cfg.actors.max_staleness);
    }
    label
}

fn algo_base_label(cfg: &TrainConfig) -> String {
    let o = &cfg.objective;
    let base = match o.kind {
        ObjectiveKind::R2vpo => "R²VPO".to_string(),
        ObjectiveKind::Clip if o.aggregation == r2vpo::aggregate::Aggregation::SeqMeanTokenSumNorm => {
            "Dr.GRPO".to_string()
        }
        ObjectiveKind::Clip if o.eps_high > o.eps_low => "GRPO-CH".to_string(),
        ObjectiveKind::Clip => "GRPO".to_string(),
        ObjectiveKind::Gppo => "GPPO".to_string(),
        ObjectiveKind::Topr => "TOPR".to_string(),
        ObjectiveKind::KlPenalty => "GRPO-KL".to_string(),
        ObjectiveKind::IsPg => "IS-PG".to_string(),
        ObjectiveKind::M2po => "M2PO".to_string(),
        ObjectiveKind::LogRatioSq => "log-ratio²".to_string(),
        ObjectiveKind::Spo => "SPO".to_string(),
        ObjectiveKind::Gspo => "GSPO".to_string(),
        ObjectiveKind::Cispo => "CISPO".to_string(),
        ObjectiveKind::Sapo => "SAPO".to_string(),
        ObjectiveKind::DppoTv => "DPPO-TV".to_string(),
        ObjectiveKind::DppoKl => "DPPO-KL".to_string(),
    };
    match cfg.mode {
        Mode::On if o.kind == ObjectiveKind::R2vpo => format!("{base}-ON"),
        Mode::On => base,
        Mode::Off if o.kind == ObjectiveKind::R2vpo => format!("{base}-OFF rb{}", cfg.replay.capacity_iters),
        Mode::Off => format!("{base} rb{}", cfg.replay.capacity_iters),
    }
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    Ok(r2vpo_report::jsonl::read_records(path)?)
}

fn load_run(dir: &Path) -> Result<Run> {
    let cfg_path = dir.join("config.toml");
    if !cfg_path.exists() {
        bail!("{} has no config.toml: not an `r2vpo llm train` run folder", dir.display());
    }
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| PlotError::Run(format!("cannot read {}: {e}", cfg_path.display())))?;
    if let Ok(t) = text.parse::<toml::Table>() {
        if t.contains_key("task") && t.contains_key("num_envs") {
            bail!(
                "{} is a control run (`r2vpo control train`), not an LLM run: its learning curve is in {}, \
                 and `r2vpo control compare` plots several",
                dir.display(),
                dir.join("plots").display()
            );
        }
    }
    let cfg: TrainConfig = r2vpo_report::config::load(Some(&cfg_path), &[])?;
    let metrics: Vec<IterMetrics> = read_jsonl(&dir.join("metrics.jsonl"))?;
    if metrics.is_empty() {
        bail!("{} has no metrics yet", dir.join("metrics.jsonl").display());
    }
    Ok(Run {
        dir: dir.to_path_buf(),
        label: algo_label(&cfg),
        seed: cfg.seed,
        metrics,
        evals: read_jsonl(&dir.join("eval.jsonl"))?,
        hists: read_jsonl(&dir.join("ratio_hist.jsonl"))?,
    })
}

/// Trailing moving average over `w` points (the first points average what
/// exists so far), so noisy per-iteration rewards read as curves.
fn smooth(points: &[(f64, f64)], w: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let lo = i.saturating_sub(w.saturating_sub(1));
            let ys = &points[lo..=i];
            (points[i].0, ys.iter().map(|p| p.1).sum::<f64>() / ys.len() as f64)
        })
        .collect()
}

/// One chart: per label, the mean over seeds (± std band when there are
/// several) of `f` against the iteration.
fn chart(
    groups: &BTreeMap<String, Vec<&Run>>,
    title: &str,
    y: &str,
    window: usize,
    f: &dyn Fn(&IterMetrics) -> f64,
) -> LineChart {
    let mut c = LineChart::new(title, "iteration", y);
    for (i, (label, runs)) in groups.iter().enumerate() {
        let curves: Vec<Vec<(f64, f64)>> = runs
            .iter()
            .map(|r| smooth(&r.metrics.iter().map(|m| (m.iter as f64, f(m))).collect::<Vec<_>>(), window))
            .collect();
        let (mean, band) = mean_std_band(&curves);
        let name = if runs.len() > 1 { format!("{label} ({} seeds)", runs.len()) } else { label.clone() };
        let s = Series::line(name, mean).with_color(i);
        c.push(if runs.len() > 1 { s.with_band(band) } else { s });
    }
    c
}

/// The histogram of one run at one iteration: a density step curve per age.
fn histogram_chart(run: &Run, iter: usize) -> LineChart {
    let mut c = LineChart::new(
        format!("{} seed {}: ratio ρ by staleness, iteration {iter}", run.label, run.seed),
        "ρ = π_θ / π_off",
        "density",
    );
    for (k, h) in run.hists.iter().filter(|h| h.iter == iter).enumerate() {
        let bins = h.counts.len().max(1);
        let width = (h.hi - h.lo) / bins as f64;
        let scale = 1.0 / (h.n.max(1) as f64 * width);
        let mut pts = vec![(h.lo, 0.0)];
        for (i, &n) in h.counts.iter().enumerate() {
            let y = n as f64 * scale;
            pts.push((h.lo + i as f64 * width, y));
            pts.push((h.lo + (i + 1) as f64 * width, y));
        }
        pts.push((h.hi, 0.0));
        let label = format!(
            "age {} {}{} (n {}, mean {:.3}, var {:.1e}, out of range {})",
            h.age,
            h.age_unit,
            if h.age == 1 { "" } else { "s" },
            h.n,
            h.mean,
            h.var,
            h.underflow + h.overflow
        );
        c.push(Series::line(label, pts).with_color(k));
    }
    c
}

/// A label as a file-name part: `R²VPO-OFF rb4` → `r2vpo-off-rb4`,
/// `R²VPO-OFF rb8 λ≤0.04` → `r2vpo-off-rb8-lambdamax0p04`.
fn slug(label: &str) -> String {
    let mut out = String::new();
    for c in label.to_lowercase().chars() {
        match c {
            '²' => out.push('2'),
            ' ' => out.push('-'),
            'λ' => out.push_str("lambda"),
            '≤' => out.push_str("max"),
            '.' => out.push('p'),
            c if c.is_ascii_alphanumeric() || c == '-' => out.push(c),
            _ => {}
        }
    }
    out
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

impl Run {
    /// Mean of `f` over the run's last five iterations, the window both
    /// summary tables use.
    fn last5(&self, f: &dyn Fn(&IterMetrics) -> f64) -> f64 {
        mean(&self.metrics.iter().rev().take(5).map(f).collect::<Vec<_>>())
    }
}

/// The Markdown summary: per algorithm, mean over seeds of the last five
/// iterations' reward, accuracy and length, λ at the end, and held-out
/// accuracy at the first and last evaluation.
fn summary_table(groups: &BTreeMap<String, Vec<&Run>>) -> String {
    let mut out = String::from(
        "| algorithm | seeds | iterations | reward (last 5) | accuracy (last 5) | length (last 5) | λ final | \
         E[(ρ−1)²] (last 5) | held-out avg@k |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (label, runs) in groups {
        let last5 = |f: &dyn Fn(&IterMetrics) -> f64| mean(&runs.iter().map(|r| r.last5(f)).collect::<Vec<_>>());
        let its = runs.iter().map(|r| r.metrics.len()).min().unwrap_or(0);
        let lambda = mean(&runs.iter().map(|r| r.metrics.last().map_or(0.0, |m| m.lambda)).collect::<Vec<_>>());
        // First and last held-out evaluation of each run (one number when a
        // run was evaluated only once, e.g. at the end).
        let evals: Vec<(f64, f64, usize)> = runs
            .iter()
            .filter_map(|r| Some((r.evals.first()?.avg_at_k, r.evals.last()?.avg_at_k, r.evals.len())))
            .collect();
        let held = if evals.is_empty() {
            "-".to_string()
        } else {
            let first = mean(&evals.iter().map(|e| e.0).collect::<Vec<_>>());
            let last = mean(&evals.iter().map(|e| e.1).collect::<Vec<_>>());
            if evals.iter().all(|e| e.2 > 1) {
                format!("{:.1}% → {:.1}%", 100.0 * first, 100.0 * last)
            } else {
                format!("{:.1}% (end)", 100.0 * last)
            }
        };
        out.push_str(&format!(
            "| {label} | {} | {its} | {:.3} | {:.3} | {:.1} | {:.4} | {:.2e} | {held} |\n",
            runs.len(),
            last5(&|m| m.reward_mean),
            last5(&|m| m.accuracy),
            last5(&|m| m.response_len_mean),
            lambda,
            last5(&|m| m.sq_dev),
        ));
    }
    out
}

/// The Markdown table of every run: the last held-out evaluation (avg@k,
/// pass@k, maj@k, response tokens) and the rollout accuracy of its last
/// five iterations, so single seeds stay visible next to the means.
fn per_run_table(runs: &[Run]) -> String {
    let mut out = String::from(
        "| run | algorithm | seed | iterations | held-out avg@k | pass@k | maj@k | held-out response tokens | \
         rollout accuracy (last 5) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let name = r.dir.file_name().map_or_else(|| r.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let acc = r.last5(&|m| m.accuracy);
        let held = match r.evals.last() {
            Some(e) => format!(
                "{:.1}% (k = {}, iter {}) | {:.1}% | {:.1}% | {:.1}",
                100.0 * e.avg_at_k,
                e.k,
                e.iter,
                100.0 * e.pass_at_k,
                100.0 * e.maj_at_k,
                e.response_len_mean
            ),
            None => "- | - | - | -".to_string(),
        };
        out.push_str(&format!("| {name} | {} | {} | {} | {held} | {acc:.3} |\n", r.label, r.seed, r.metrics.len()));
    }
    out
}

/// Writes every figure for `runs` into `out`; returns the files written.
pub fn plot_runs(runs: &[PathBuf], out: &Path, hist_iter: Option<usize>) -> Result<Vec<PathBuf>> {
    let loaded: Vec<Run> = runs.iter().map(|d| load_run(d)).collect::<Result<_>>()?;
    let mut groups: BTreeMap<String, Vec<&Run>> = BTreeMap::new();
    for r in &loaded {
        groups.entry(r.label.clone()).or_default().push(r);
    }
    std::fs::create_dir_all(out).map_err(|e| PlotError::Run(format!("cannot create {}: {e}", out.display())))?;
    let mut written = Vec::new();
    let w = 5;
    written.extend(
        chart(&groups, "Training reward", "mean reward (5-iteration average)", w, &|m| m.reward_mean)
            .save(&out.join("reward"))?,
    );
    written.extend(
        chart(&groups, "Response length", "mean tokens (5-iteration average)", w, &|m| m.response_len_mean)
            .save(&out.join("response_length"))?,
    );
    written.extend(chart(&groups, "λ trajectory", "λ", 1, &|m| m.lambda).save(&out.join("lambda"))?);
    let diag = Grid::new(
        3,
        vec![
            chart(&groups, "Accuracy (rollouts)", "fraction correct", w, &|m| m.accuracy),
            chart(&groups, "E[(ρ−1)²]", "E[(ρ−1)²]", 1, &|m| m.sq_dev),
            chart(&groups, "Var[ρ]", "Var[ρ]", 1, &|m| m.ratio_var),
            chart(&groups, "Tokens outside [1−ε, 1+ε]", "fraction", 1, &|m| m.clip_frac_low + m.clip_frac_high),
            chart(&groups, "Entropy", "nats / token", 1, &|m| m.entropy),
            chart(&groups, "approx KL(π_off‖π_θ)", "k1", 1, &|m| m.approx_kl),
            chart(&groups, "Zero-variance groups", "fraction", 1, &|m| m.zero_variance_frac),
            chart(&groups, "Mean ratio", "E[ρ]", 1, &|m| m.ratio_mean),
            chart(&groups, "Gradient norm", "‖g‖ before clipping", 1, &|m| m.grad_norm),
        ],
    );
    written.extend(diag.save(&out.join("diagnostics"))?);
    if loaded.iter().any(|r| r.metrics.iter().any(|m| m.mismatch.is_some())) {
        // How far the rollout engine's log-probs were from the learner's
        // before each iteration's first update (a stale or mis-pushed
        // engine shows here first).
        let gap = |f: fn(&crate::train::metrics::Mismatch) -> f64| {
            move |m: &IterMetrics| m.mismatch.as_ref().map_or(f64::NAN, f)
        };
        let mismatch = Grid::new(
            3,
            vec![
                chart(&groups, "Engine vs learner: mean |Δ log p|", "nats / token", 1, &gap(|x| x.abs_mean)),
                chart(&groups, "Engine vs learner: max |Δ log p|", "nats", 1, &gap(|x| x.abs_max)),
                chart(&groups, "E[(ρ−1)²] before any update", "mismatch only", 1, &gap(|x| x.sq_dev)),
            ],
        );
        written.extend(mismatch.save(&out.join("mismatch"))?);
    }
    if loaded.iter().any(|r| !r.evals.is_empty()) {
        let mut c = LineChart::new("Held-out accuracy", "iteration", "avg@k");
        for (i, (label, runs)) in groups.iter().enumerate() {
            let curves: Vec<Vec<(f64, f64)>> =
                runs.iter().map(|r| r.evals.iter().map(|e| (e.iter as f64, e.avg_at_k)).collect()).collect();
            if curves.iter().any(|c| !c.is_empty()) {
                let (m, b) = mean_std_band(&curves);
                c.push(Series::line(label.clone(), m).with_band(b).with_color(i));
            }
        }
        written.extend(c.save(&out.join("eval_accuracy"))?);
    }
    for r in &loaded {
        let Some(last) = r.hists.iter().map(|h| h.iter).max() else { continue };
        let iter = hist_iter.unwrap_or(last);
        if !r.hists.iter().any(|h| h.iter == iter) {
            bail!("{}: no ratio histogram at iteration {iter}", r.dir.display());
        }
        let stem = out.join(format!("ratio_hist_{}_seed{}", slug(&r.label), r.seed));
        written.extend(histogram_chart(r, iter).save(&stem)?);
    }
    let table = format!("{}\n{}", summary_table(&groups), per_run_table(&loaded));
    let md = out.join("summary.md");
    r2vpo_report::atomic_write_string(&md, &table)?;
    written.push(md);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r2vpo_off(capacity: usize) -> TrainConfig {
        let mut cfg = TrainConfig::default();
        cfg.objective.kind = ObjectiveKind::R2vpo;
        cfg.mode = Mode::Off;
        cfg.replay.capacity_iters = capacity;
        cfg
    }

    #[test]
    fn labels_separate_lambda_settings_and_make_distinct_file_names() {
        let plain = r2vpo_off(8);
        let mut capped = r2vpo_off(8);
        capped.dual.lambda_max = Some(0.04);
        let mut fixed = r2vpo_off(8);
        fixed.dual.mode = DualMode::Fixed;
        fixed.dual.lambda0 = 0.04;
        let mut ahead = r2vpo_off(4);
        ahead.actors.asynchronous = true;
        ahead.actors.max_staleness = 4;
        let labels = [algo_label(&plain), algo_label(&capped), algo_label(&fixed), algo_label(&ahead)];
        assert_eq!(labels, ["R²VPO-OFF rb8", "R²VPO-OFF rb8 λ≤0.04", "R²VPO-OFF rb8 λ=0.04", "R²VPO-OFF rb4 async s4"]);
        let slugs: Vec<String> = labels.iter().map(|l| slug(l)).collect();
        assert_eq!(
            slugs,
            ["r2vpo-off-rb8", "r2vpo-off-rb8-lambdamax0p04", "r2vpo-off-rb8-lambda0p04", "r2vpo-off-rb4-async-s4"]
        );
    }
}
