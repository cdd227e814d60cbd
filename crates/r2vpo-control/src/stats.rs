//! The pre-registered comparison of two methods over a `control compare`
//! folder, `r2vpo control stats` (`results/control/paper-hparams/README.md`
//! states the analysis before any run; this is its code).
//!
//! Per run, the score is the mean of its last two evaluations divided by
//! [`StatsOptions::score_scale`] (DeepMind Control's maximum return, 1000), and a run
//! collapsed if its final evaluation is below 0.7× its best. Per task: the
//! difference of mean scores with a percentile bootstrap interval and an
//! exact Mann–Whitney test. Over tasks: the interquartile mean per method
//! and the probability of improvement, with stratified bootstrap intervals
//! as Agarwal et al. (2021) define them (the `rliable` library). The
//! statistics are `r2vpo::stats`, tested there on data with known answers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use r2vpo::stats::{
    bootstrap_mean_difference, iqm, mann_whitney_exact, mean_t_interval, prob_greater, stratified_bootstrap, Interval,
};
use r2vpo_report::plot::{Grid, LineChart, Series};
use r2vpo_report::ReportError;
use serde::Serialize;

use crate::trainer::{TrainConfig, UpdateMetrics};

/// A final evaluation below this fraction of the run's best is a collapse.
const COLLAPSE_FRACTION: f64 = 0.7;

/// What [`stats`] compares, and how (`r2vpo control stats` fills it from
/// its flags; [`StatsOptions::default`] holds the pre-registered choices).
#[derive(Clone, Debug)]
pub struct StatsOptions {
    /// A `control compare` output folder (`<task>/<algo>-seed<seed>/` runs).
    pub dir: PathBuf,
    /// Tasks (empty: every task folder in `dir`).
    pub tasks: Vec<String>,
    /// The method that is tested.
    pub method: String,
    /// The method it is tested against.
    pub baseline: String,
    /// Seeds: every task × method × seed run must be finished.
    pub seeds: Vec<u64>,
    /// Bootstrap resamples per interval.
    pub reps: usize,
    /// Seed of the bootstrap's random stream.
    pub bootstrap_seed: u64,
    /// Confidence level of every interval.
    pub level: f64,
    /// Scores are evaluation returns divided by this.
    pub score_scale: f64,
    /// The mechanism's metrics are averaged over this many last updates.
    pub last_updates: usize,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions {
            dir: PathBuf::new(),
            tasks: Vec::new(),
            method: "r2vpo".into(),
            baseline: "ppo".into(),
            seeds: vec![0, 1, 2, 3, 4],
            reps: 10_000,
            bootstrap_seed: 0,
            level: 0.95,
            score_scale: 1000.0,
            last_updates: 16,
        }
    }
}

/// Why [`stats`] could not compare.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The folder, an option, or a run is not what the analysis needs.
    #[error("{0}")]
    Input(String),
    /// Writing the table, JSON or curves failed.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// What [`stats`] found and wrote.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// The table and verdict as Markdown (also written to `stats.md`).
    pub markdown: String,
    /// The pre-registered verdict.
    pub verdict: Verdict,
    /// Every file written: the curves, `stats.md`, `stats.json`.
    pub written: Vec<PathBuf>,
}

/// One finished run, reduced to what the analysis uses.
#[derive(Clone, Debug, Serialize)]
struct RunScore {
    seed: u64,
    /// Mean of the last two evaluations / the scale.
    score: f64,
    final_eval: f64,
    best_eval: f64,
    collapsed: bool,
    /// Means over the last `--last-updates` updates.
    approx_kl: f64,
    sq_dev: f64,
    entropy: f64,
    /// `(env steps, evaluation return)`.
    #[serde(skip)]
    evals: Vec<(f64, f64)>,
}

/// One task's comparison.
#[derive(Debug, Serialize)]
struct TaskRow {
    task: String,
    baseline: Vec<RunScore>,
    method: Vec<RunScore>,
    /// Mean score of the method minus the baseline's, with its interval.
    difference: Interval,
    /// The method's Mann–Whitney U over the baseline, and its exact
    /// two-sided p.
    mann_whitney_u: f64,
    mann_whitney_p: f64,
}

/// What `control stats` writes to `stats.json`.
#[derive(Debug, Serialize)]
struct Report {
    method: String,
    baseline: String,
    seeds: Vec<u64>,
    reps: usize,
    bootstrap_seed: u64,
    level: f64,
    tasks: Vec<TaskRow>,
    iqm_method: Interval,
    iqm_baseline: Interval,
    /// P(method > baseline), averaged over tasks.
    probability_of_improvement: Interval,
    verdict: Verdict,
}

/// The pre-registered verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// P's lower bound above 0.5 and no task's difference interval below 0.
    Confirms,
    /// P's upper bound below 0.5, or every task's difference interval below 0.
    Refutes,
    /// Neither.
    Inconclusive,
}

fn verdict(poi: &Interval, tasks: &[TaskRow]) -> Verdict {
    let below = |t: &TaskRow| t.difference.hi < 0.0;
    if poi.lo > 0.5 && !tasks.iter().any(below) {
        Verdict::Confirms
    } else if poi.hi < 0.5 || (!tasks.is_empty() && tasks.iter().all(below)) {
        Verdict::Refutes
    } else {
        Verdict::Inconclusive
    }
}

/// Reads `dir`'s run as a finished run, or says why it is not one.
fn read_run(dir: &Path, seed: u64, a: &StatsOptions) -> Result<RunScore, String> {
    let cfg_path = dir.join("config.toml");
    let text = std::fs::read_to_string(&cfg_path).map_err(|_| "not started".to_string())?;
    let cfg: TrainConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", cfg_path.display()))?;
    let metrics = dir.join("metrics.jsonl");
    let ms: Vec<UpdateMetrics> = if metrics.exists() {
        r2vpo_report::jsonl::read_records(&metrics).map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    let steps = ms.last().map_or(0, |m| m.env_steps);
    if !dir.join("summary.json").exists() || steps < cfg.total_env_steps {
        return Err(format!("unfinished ({steps} of {} env steps)", cfg.total_env_steps));
    }
    let evals: Vec<(f64, f64)> =
        ms.iter().filter_map(|m| m.eval_return_mean.map(|r| (m.env_steps as f64, r))).collect();
    if evals.len() < 2 {
        return Err(format!("{} evaluation(s); the score needs two", evals.len()));
    }
    let last2 = &evals[evals.len() - 2..];
    let best_eval = evals.iter().map(|e| e.1).fold(f64::NEG_INFINITY, f64::max);
    let final_eval = evals[evals.len() - 1].1;
    let tail = &ms[ms.len().saturating_sub(a.last_updates)..];
    let avg = |f: &dyn Fn(&UpdateMetrics) -> f64| tail.iter().map(f).sum::<f64>() / tail.len() as f64;
    Ok(RunScore {
        seed,
        score: (last2[0].1 + last2[1].1) / 2.0 / a.score_scale,
        final_eval,
        best_eval,
        collapsed: final_eval < COLLAPSE_FRACTION * best_eval,
        approx_kl: avg(&|m| m.approx_kl),
        sq_dev: avg(&|m| m.sq_dev),
        entropy: avg(&|m| m.entropy),
        evals,
    })
}

/// Compares `a.method` with `a.baseline` over the finished runs of
/// `a.dir`, writes `stats.md`, `stats.json` and `eval_ci_curves.{png,svg}`
/// there, and returns the table and the verdict. Every missing or
/// unfinished run is named in one error.
pub fn stats(a: &StatsOptions) -> Result<Analysis, StatsError> {
    let bail = |m: String| Err(StatsError::Input(m));
    if !a.dir.is_dir() {
        return bail(format!("{}: not a folder (give a `control compare --out` folder)", a.dir.display()));
    }
    if !(a.level > 0.0 && a.level < 1.0) || a.reps == 0 || a.score_scale <= 0.0 || a.last_updates == 0 {
        return bail("--level must be in (0, 1), and --reps, --score-scale and --last-updates positive".into());
    }
    if a.method == a.baseline {
        return bail(format!("--method and --baseline are both {:?}", a.method));
    }
    // A repeated seed would count one run twice (narrower intervals, a
    // different p); a repeated task would compare a task with itself.
    let repeated = |v: Vec<String>| {
        let mut seen = std::collections::BTreeSet::new();
        v.into_iter().find(|x| !seen.insert(x.clone()))
    };
    if let Some(s) = repeated(a.seeds.iter().map(u64::to_string).collect()) {
        return bail(format!("--seeds names seed {s} twice"));
    }
    if let Some(t) = repeated(a.tasks.clone()) {
        return bail(format!("--tasks names {t} twice"));
    }
    if a.seeds.is_empty() {
        return bail("--seeds is empty".into());
    }
    let tasks = if a.tasks.is_empty() {
        let mut t: Vec<String> = std::fs::read_dir(&a.dir)
            .map_err(|e| StatsError::Input(format!("reading {}: {e}", a.dir.display())))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        t.sort();
        t
    } else {
        a.tasks.clone()
    };
    if tasks.is_empty() {
        return bail(format!("{}: no task folders", a.dir.display()));
    }
    // Every run first, so one error lists every run that is missing.
    let mut runs: BTreeMap<(String, String), Vec<RunScore>> = BTreeMap::new();
    let mut problems = Vec::new();
    for task in &tasks {
        for algo in [&a.baseline, &a.method] {
            for &seed in &a.seeds {
                let rel = format!("{task}/{algo}-seed{seed}");
                match read_run(&a.dir.join(&rel), seed, a) {
                    Ok(r) => runs.entry((task.clone(), algo.clone())).or_default().push(r),
                    Err(why) => problems.push(format!("{rel}: {why}")),
                }
            }
        }
    }
    if !problems.is_empty() {
        return bail(format!(
            "{}: {} of {} runs are not ready for the analysis:\n  {}",
            a.dir.display(),
            problems.len(),
            tasks.len() * 2 * a.seeds.len(),
            problems.join("\n  ")
        ));
    }
    let mut take = |task: &str, algo: &str| runs.remove(&(task.to_string(), algo.to_string())).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let (base, meth) = (take(task, &a.baseline), take(task, &a.method));
        let scores = |v: &[RunScore]| v.iter().map(|r| r.score).collect::<Vec<_>>();
        let (bs, ms) = (scores(&base), scores(&meth));
        let (u, p) = mann_whitney_exact(&ms, &bs)
            .ok_or_else(|| StatsError::Input("too many runs for the exact Mann–Whitney test".into()))?;
        rows.push(TaskRow {
            task: task.clone(),
            difference: bootstrap_mean_difference(&ms, &bs, a.reps, a.level, a.bootstrap_seed.wrapping_add(i as u64)),
            mann_whitney_u: u,
            mann_whitney_p: p,
            baseline: base,
            method: meth,
        });
    }
    // scores[method][task][run]: 0 the method, 1 the baseline.
    let matrix: Vec<Vec<Vec<f64>>> = [true, false]
        .iter()
        .map(|&m| {
            rows.iter().map(|r| (if m { &r.method } else { &r.baseline }).iter().map(|s| s.score).collect()).collect()
        })
        .collect();
    let seed = a.bootstrap_seed.wrapping_add(1000);
    let pooled_iqm = |s: &[Vec<Vec<f64>>]| iqm(&s[0].concat());
    let iqm_method = stratified_bootstrap(&matrix[..1], &pooled_iqm, a.reps, a.level, seed);
    let iqm_baseline = stratified_bootstrap(&matrix[1..], &pooled_iqm, a.reps, a.level, seed.wrapping_add(1));
    let poi =
        |s: &[Vec<Vec<f64>>]| s[0].iter().zip(&s[1]).map(|(m, b)| prob_greater(m, b)).sum::<f64>() / s[0].len() as f64;
    let probability_of_improvement = stratified_bootstrap(&matrix, &poi, a.reps, a.level, seed.wrapping_add(2));
    let report = Report {
        method: a.method.clone(),
        baseline: a.baseline.clone(),
        seeds: a.seeds.clone(),
        reps: a.reps,
        bootstrap_seed: a.bootstrap_seed,
        level: a.level,
        verdict: verdict(&probability_of_improvement, &rows),
        tasks: rows,
        iqm_method,
        iqm_baseline,
        probability_of_improvement,
    };
    let markdown = markdown(&report, a);
    let mut written = curves(&report, a)?;
    let (mpath, jpath) = (a.dir.join("stats.md"), a.dir.join("stats.json"));
    r2vpo_report::atomic_write_string(&mpath, &markdown)?;
    r2vpo_report::atomic_write_json(&jpath, &report)?;
    written.extend([mpath, jpath]);
    Ok(Analysis { markdown, verdict: report.verdict, written })
}

fn markdown(r: &Report, a: &StatsOptions) -> String {
    let pct = (r.level * 100.0).round();
    let ci = |i: &Interval| format!("{:+.3} [{:+.3}, {:+.3}]", i.point, i.lo, i.hi);
    let ci0 = |i: &Interval| format!("{:.3} [{:.3}, {:.3}]", i.point, i.lo, i.hi);
    let mean = |v: &[RunScore]| v.iter().map(|s| s.score).sum::<f64>() / v.len() as f64;
    let (m, b) = (&r.method, &r.baseline);
    let mut s = format!(
        "# {m} against {b}\n\n{} tasks × {} seeds per method. Score per run: the mean of its last two \
         evaluations / {}. Intervals: {pct:.0} %, {} bootstrap resamples (seed {}). Collapse: a final \
         evaluation below {COLLAPSE_FRACTION}× the run's best.\n\n",
        r.tasks.len(),
        r.seeds.len(),
        a.score_scale,
        r.reps,
        r.bootstrap_seed
    );
    s.push_str(&format!(
        "| task | {b} score | {m} score | difference ({m} − {b}) [{pct:.0} % CI] | Mann–Whitney U ({m} over {b}), exact p | collapses {b} | collapses {m} |\n|---|---|---|---|---|---|---|\n"
    ));
    for t in &r.tasks {
        let collapses = |v: &[RunScore]| v.iter().filter(|s| s.collapsed).count();
        s.push_str(&format!(
            "| {} | {:.3} | {:.3} | {} | {} (p = {:.4}) | {}/{} | {}/{} |\n",
            t.task,
            mean(&t.baseline),
            mean(&t.method),
            ci(&t.difference),
            t.mann_whitney_u,
            t.mann_whitney_p,
            collapses(&t.baseline),
            t.baseline.len(),
            collapses(&t.method),
            t.method.len()
        ));
    }
    s.push_str(&format!(
        "\nOver tasks (stratified bootstrap): IQM {b} {}, IQM {m} {}, P({m} > {b}) {}.\n\n",
        ci0(&r.iqm_baseline),
        ci0(&r.iqm_method),
        ci0(&r.probability_of_improvement)
    ));
    s.push_str(&format!(
        "Mechanism, means over each run's last {} updates, then over seeds (min–max over seeds):\n\n\
         | task | method | approx. KL | E[(ρ−1)²] | entropy |\n|---|---|---|---|---|\n",
        a.last_updates
    ));
    for t in &r.tasks {
        for (name, v) in [(b, &t.baseline), (m, &t.method)] {
            let cell = |f: &dyn Fn(&RunScore) -> f64| {
                let x: Vec<f64> = v.iter().map(f).collect();
                let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{:.4} ({lo:.4}–{hi:.4})", x.iter().sum::<f64>() / x.len() as f64)
            };
            s.push_str(&format!(
                "| {} | {name} | {} | {} | {} |\n",
                t.task,
                cell(&|r| r.approx_kl),
                cell(&|r| r.sq_dev),
                cell(&|r| r.entropy)
            ));
        }
    }
    let why = match r.verdict {
        Verdict::Confirms => format!(
            "the lower end of P({m} > {b})'s interval is above 0.5 and no task's difference interval lies below 0"
        ),
        Verdict::Refutes => format!(
            "the upper end of P({m} > {b})'s interval is below 0.5, or every task's difference interval lies below 0"
        ),
        Verdict::Inconclusive => format!(
            "P({m} > {b})'s interval contains 0.5 (or lies above it while a task's difference interval lies below 0), \
             and not every task's difference interval lies below 0"
        ),
    };
    let word = match r.verdict {
        Verdict::Confirms => "confirms",
        Verdict::Refutes => "refutes",
        Verdict::Inconclusive => "inconclusive",
    };
    s.push_str(&format!("\n**Verdict: {word}**: {why}.\n"));
    s
}

/// Evaluation curves per task, each method's mean with its Student-t
/// interval over seeds, at the evaluation points every seed has.
fn curves(r: &Report, a: &StatsOptions) -> Result<Vec<PathBuf>, ReportError> {
    let pct = (r.level * 100.0).round();
    let mut panels = Vec::new();
    for t in &r.tasks {
        let mut chart = LineChart::new(
            t.task.clone(),
            "environment steps",
            format!("evaluation return, mean ± {pct:.0} % CI over seeds"),
        );
        for (ci, (name, v)) in [(&r.baseline, &t.baseline), (&r.method, &t.method)].into_iter().enumerate() {
            let n = v.iter().map(|s| s.evals.len()).min().unwrap_or(0);
            let (mut line, mut band) = (Vec::new(), Vec::new());
            for i in 0..n {
                let x = v[0].evals[i].0;
                let iv = mean_t_interval(&v.iter().map(|s| s.evals[i].1).collect::<Vec<_>>(), a.level);
                line.push((x, iv.point));
                band.push((x, iv.lo, iv.hi));
            }
            chart.push(Series::line(name.clone(), line).with_band(band).with_color(ci));
        }
        panels.push(chart);
    }
    let cols = panels.len().min(2);
    Grid::new(cols, panels).save(&a.dir.join("eval_ci_curves"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished synthetic run: `evals` at every other update, the
    /// mechanism's metrics constant.
    fn write_run(dir: &Path, evals: &[f64], kl: f64) {
        std::fs::create_dir_all(dir).unwrap();
        let updates = evals.len() as u64 * 2;
        let cfg = TrainConfig { total_env_steps: updates * 100, ..TrainConfig::default() };
        std::fs::write(dir.join("config.toml"), toml::to_string(&cfg).unwrap()).unwrap();
        let ms: Vec<UpdateMetrics> = (1..=updates)
            .map(|u| UpdateMetrics {
                update: u,
                env_steps: u * 100,
                eval_return_mean: (u % 2 == 0).then(|| evals[(u / 2 - 1) as usize]),
                approx_kl: kl,
                sq_dev: 2.0 * kl,
                entropy: 1.0,
                ..UpdateMetrics::default()
            })
            .collect();
        let lines: String = ms.iter().map(|m| serde_json::to_string(m).unwrap() + "\n").collect();
        std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
        std::fs::write(dir.join("summary.json"), "{}").unwrap();
    }

    fn args(dir: &Path) -> StatsOptions {
        StatsOptions { dir: dir.to_path_buf(), reps: 2000, ..StatsOptions::default() }
    }

    /// Two tasks × two methods × five seeds, the method's scores `shift`
    /// above the baseline's.
    fn sweep(dir: &Path, shift: f64) {
        for task in ["a-run", "b-catch"] {
            for seed in 0..5u64 {
                let base = 300.0 + 20.0 * seed as f64;
                write_run(&dir.join(format!("{task}/ppo-seed{seed}")), &[100.0, base, base], 0.01);
                write_run(&dir.join(format!("{task}/r2vpo-seed{seed}")), &[100.0, base + shift, base + shift], 0.02);
            }
        }
    }

    fn report(dir: &Path) -> serde_json::Value {
        stats(&args(dir)).unwrap();
        serde_json::from_str(&std::fs::read_to_string(dir.join("stats.json")).unwrap()).unwrap()
    }

    #[test]
    fn a_clear_win_confirms_a_clear_loss_refutes_a_tie_is_inconclusive() {
        let d = tempfile::tempdir().unwrap();
        sweep(d.path(), 500.0);
        let r = report(d.path());
        assert_eq!(r["verdict"], "confirms");
        // Every method run beats every baseline run: P = 1, U = 25, p = 2/252.
        assert_eq!(r["probability_of_improvement"]["point"], 1.0);
        assert_eq!(r["tasks"][0]["mann_whitney_u"], 25.0);
        assert!((r["tasks"][0]["mann_whitney_p"].as_f64().unwrap() - 2.0 / 252.0).abs() < 1e-12);
        // Scores 0.3..0.38 against 0.8..0.88: the difference is 0.5, and
        // every resample's lies within 0.42..0.58.
        let diff = &r["tasks"][1]["difference"];
        let (p, lo, hi) = (diff["point"].as_f64().unwrap(), diff["lo"].as_f64().unwrap(), diff["hi"].as_f64().unwrap());
        assert!((p - 0.5).abs() < 1e-12 && (0.42..0.5).contains(&lo) && hi > 0.5 && hi <= 0.58 + 1e-12, "{diff}");
        // IQM of 0.3, 0.32, …, 0.38 twice: the middle six of ten.
        assert!((r["iqm_baseline"]["point"].as_f64().unwrap() - 0.34).abs() < 1e-12);
        assert_eq!(r["tasks"][0]["method"][0]["approx_kl"], 0.02);
        assert_eq!(r["tasks"][0]["baseline"][0]["collapsed"], false);
        for f in ["stats.md", "eval_ci_curves.png", "eval_ci_curves.svg"] {
            assert!(d.path().join(f).exists(), "{f}");
        }
        let md = std::fs::read_to_string(d.path().join("stats.md")).unwrap();
        assert!(md.contains("**Verdict: confirms**"), "{md}");

        let d = tempfile::tempdir().unwrap();
        sweep(d.path(), -200.0);
        assert_eq!(report(d.path())["verdict"], "refutes");

        let d = tempfile::tempdir().unwrap();
        sweep(d.path(), 0.0);
        let r = report(d.path());
        assert_eq!(r["verdict"], "inconclusive");
        assert_eq!(r["probability_of_improvement"]["point"], 0.5);
    }

    #[test]
    fn collapses_are_counted_and_missing_runs_named() {
        let d = tempfile::tempdir().unwrap();
        sweep(d.path(), 0.0);
        // Best 900, final 600 < 0.7 × 900: collapsed.
        write_run(&d.path().join("a-run/ppo-seed2"), &[900.0, 700.0, 600.0], 0.01);
        let r = report(d.path());
        let runs = r["tasks"][0]["baseline"].as_array().unwrap();
        assert_eq!(runs.iter().filter(|x| x["collapsed"] == true).count(), 1);
        assert!((runs[2]["score"].as_f64().unwrap() - 0.65).abs() < 1e-12);

        let dup = StatsOptions { seeds: vec![0, 1, 1], ..args(d.path()) };
        assert!(stats(&dup).unwrap_err().to_string().contains("seed 1 twice"));
        let dup = StatsOptions { tasks: vec!["a-run".into(), "a-run".into()], ..args(d.path()) };
        assert!(stats(&dup).unwrap_err().to_string().contains("a-run twice"));

        std::fs::remove_dir_all(d.path().join("b-catch/r2vpo-seed4")).unwrap();
        std::fs::remove_file(d.path().join("a-run/ppo-seed1/summary.json")).unwrap();
        let e = stats(&args(d.path())).unwrap_err().to_string();
        assert!(e.contains("2 of 20 runs"), "{e}");
        assert!(e.contains("b-catch/r2vpo-seed4: not started"), "{e}");
        assert!(e.contains("a-run/ppo-seed1: unfinished"), "{e}");
    }
}
