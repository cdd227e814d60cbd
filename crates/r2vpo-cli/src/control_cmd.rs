//! `r2vpo control train|eval|compare` and `r2vpo bench control`: PPO vs
//! R²VPO on DeepMind Control tasks (issue #4).
//!
//! A run folder holds `config.toml` (resolved), `metrics.jsonl` (one record
//! per update, see [`UpdateMetrics`]), `checkpoints/` and, when finished,
//! `summary.json`. `--resume RUN_DIR` continues from the newest checkpoint.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use r2vpo::stats::mean_std;
use serde::Serialize;

use r2vpo_control::bench::{best_product_rate, fast_kernels, learner_rate, raw_rate};
use r2vpo_control::native::NativeNet;
use r2vpo_control::policy::ActorCritic;
use r2vpo_control::run::{check_same_config, sweep_state, train_in_folder, SweepRun};
use r2vpo_control::trainer::{algo_overrides, evaluate_policy, load_policy, TrainConfig, Trainer, UpdateMetrics};
use r2vpo_control::{VecEnv, VecEnvConfig};
use r2vpo_kernels::Matmul;
use r2vpo_report::edge::{Existing, Progress, Stop, StopSignal};
use r2vpo_report::plot::{mean_std_band, Grid, LineChart, Series};
use r2vpo_report::RunDir;

use crate::args::{ConfigArgs, RunArgs, Stopped};
use crate::config;

/// The default config file, used when `--config` is not given and the file
/// exists (it matches [`TrainConfig::default`]).
pub const DEFAULT_CONFIG: &str = "configs/control/cpu.toml";

/// `r2vpo control train` arguments.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// `--config`, `--set`, `--seed`, `--out`, `--quiet`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Task, e.g. `cheetah-run` (overrides the config's `task`).
    #[arg(long)]
    pub task: Option<String>,
    /// Algorithm from the one table (`r2vpo::algo::ALGORITHMS`), on-policy
    /// only here: r2vpo (= r2vpo-on), ppo, grpo, grpo-ch, gppo, topr,
    /// grpo-kl, is-pg; an unknown or replay name is refused with the list.
    #[arg(long, default_value = "r2vpo")]
    pub algo: String,
    /// Continue the run in this folder from its newest checkpoint (its
    /// config.toml, then --set, e.g. a larger total_env_steps).
    #[arg(long, conflicts_with_all = ["task", "seed", "config", "out"])]
    pub resume: Option<PathBuf>,
}

/// `r2vpo control eval` arguments.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// A run folder written by `control train`.
    #[arg(long)]
    pub run: PathBuf,
    /// Episodes (one per parallel environment).
    #[arg(long, default_value_t = 10)]
    pub episodes: usize,
    /// Seed of the evaluation environments.
    #[arg(long, default_value_t = 12345)]
    pub seed: u64,
}

/// `r2vpo control compare` arguments.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// `--config` and `--set`.
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// Tasks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "cartpole-swingup")]
    pub tasks: Vec<String>,
    /// Algorithms, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "ppo,r2vpo")]
    pub algos: Vec<String>,
    /// Seeds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub seeds: Vec<u64>,
    /// Output folder: one run folder per task/algo/seed, plots and table.
    #[arg(long, default_value = "runs/control/compare")]
    pub out: PathBuf,
}

/// `r2vpo bench control` arguments.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// `--config` and `--set`.
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// Tasks to measure.
    #[arg(long, value_delimiter = ',', default_value = "cheetah-run,walker-walk")]
    pub tasks: Vec<String>,
    /// Environments for the raw physics measurement.
    #[arg(long, default_value_t = 64)]
    pub envs: usize,
    /// Seconds per raw physics measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Timed training updates (after one warm-up update); 0 skips the
    /// training measurement (a `paper.toml` update takes minutes).
    #[arg(long, default_value_t = 3)]
    pub updates: usize,
    /// Timed learner passes (one minibatch's forward and backward at the
    /// config's network and minibatch size, after one warm-up pass; more
    /// when they are short, to fill 0.3 s) on one thread and on all; 0
    /// skips the learner table.
    #[arg(long, default_value_t = 3)]
    pub learner_reps: usize,
    /// Where the JSON results go.
    #[arg(long, default_value = "runs/bench/control.json")]
    pub out: PathBuf,
}

fn default_config(explicit: Option<&Path>) -> Option<PathBuf> {
    explicit.map(Path::to_path_buf).or_else(|| Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()))
}

/// Resolves a training config: file, then the algorithm preset, task and
/// seed, then the user's `--set`s.
pub fn resolve(
    file: Option<&Path>,
    algo: &str,
    task: Option<&str>,
    seed: Option<u64>,
    sets: &[String],
) -> Result<TrainConfig> {
    let mut all = algo_overrides(algo)?;
    if let Some(t) = task {
        all.push(format!("task=\"{t}\""));
    }
    if let Some(s) = seed {
        all.push(format!("seed={s}"));
    }
    all.extend(sets.iter().cloned());
    let file = default_config(file);
    let cfg: TrainConfig = config::load(file.as_deref(), &all)?;
    cfg.validate().with_context(|| config::source(file.as_deref(), sets))?;
    Ok(cfg)
}

/// Trains (or resumes) one run into `dir` with the console display; returns
/// all of its metrics. SIGINT/SIGTERM stop it with a checkpoint
/// ([`Stopped`]); the run-folder work is [`train_in_folder`].
fn train_into(cfg: TrainConfig, dir: &Path, existing: Existing, quiet: bool) -> Result<Vec<UpdateMetrics>> {
    let stop = Stop::install().context("installing the SIGINT/SIGTERM handlers")?;
    let mut progress = Progress::new(cfg.total_env_steps, "env steps", quiet, Duration::from_secs(30));
    if existing != Existing::Resume {
        progress = progress.starting_at(0);
    }
    let mut recent: Option<f64> = None;
    let mut last_eval: Option<f64> = None;
    let out = train_in_folder(cfg, dir, existing, stop.flag(), |m| {
        recent = m.episode_return_mean.or(recent);
        last_eval = m.eval_return_mean.or(last_eval);
        progress.update(
            m.env_steps,
            &format!(
                "{:.0} steps/s  return {}  eval {}  λ {:.3}",
                m.env_steps_per_s,
                recent.map_or("-".into(), |r| format!("{r:.1}")),
                last_eval.map_or("-".into(), |r| format!("{r:.1}")),
                m.lambda
            ),
        );
    })
    .with_context(|| format!("run folder {}", dir.display()))?;
    progress.finish();
    if out.stopped {
        let signal = stop.requested().unwrap_or(StopSignal::Interrupt);
        return Err(Stopped { signal, resume: format!("r2vpo control train --resume {}", dir.display()) }.into());
    }
    Ok(out.metrics)
}

/// `r2vpo control train`.
pub fn train(a: &TrainArgs) -> Result<()> {
    if let Some(dir) = &a.resume {
        let cfg: TrainConfig = config::load(Some(&dir.join("config.toml")), &a.run.cfg.sets)?;
        cfg.validate()?;
        train_into(cfg, dir, Existing::Resume, a.run.quiet)?;
        println!("run folder: {}", dir.display());
        return Ok(());
    }
    let cfg = resolve(a.run.cfg.config.as_deref(), &a.algo, a.task.as_deref(), a.run.seed, &a.run.cfg.sets)?;
    let out = a
        .run
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("runs/control/{}-{}-seed{}", cfg.task, a.algo, cfg.seed)));
    let all = train_into(cfg, &out, a.run.existing(), a.run.quiet)?;
    if let Some(m) = all.last() {
        println!(
            "{} env steps; final eval return {}",
            m.env_steps,
            all.iter().rev().find_map(|m| m.eval_return_mean).map_or("-".into(), |r| format!("{r:.1}"))
        );
    }
    println!("run folder: {}", out.display());
    Ok(())
}

/// `r2vpo control eval`.
pub fn eval(a: &EvalArgs) -> Result<()> {
    let saved = load_policy(&a.run.join("checkpoints")).context("loading the run's policy")?;
    if a.episodes == 0 {
        bail!("--episodes must be at least 1");
    }
    let cfg = &saved.config;
    let returns = evaluate_policy(cfg, &saved.eval_policy(), a.episodes, a.seed)?;
    let (m, s) = mean_std(&returns);
    let kind = if cfg.eval_deterministic { "deterministic" } else { "sampled" };
    println!("{}: {} {kind} episodes: return {m:.1} ± {s:.1}", cfg.task, returns.len());
    #[derive(Serialize)]
    struct Out<'a> {
        task: &'a str,
        episodes: usize,
        seed: u64,
        mean: f64,
        std: f64,
        returns: &'a [f64],
    }
    let path = a.run.join("eval.json");
    r2vpo_report::atomic_write_json(
        &path,
        &Out { task: &cfg.task, episodes: returns.len(), seed: a.seed, mean: m, std: s, returns: &returns },
    )?;
    println!("written: {}", path.display());
    Ok(())
}

/// Training-return curve of one run: the return of the latest finished
/// episodes, carried forward, at every update's env-step count.
fn return_curve(ms: &[UpdateMetrics]) -> Vec<(f64, f64)> {
    let mut last = None;
    ms.iter()
        .filter_map(|m| {
            last = m.episode_return_mean.or(last);
            last.map(|r| (m.env_steps as f64, r))
        })
        .collect()
}

/// `r2vpo control compare`. Every run's config is resolved (and
/// validated) before `--out` is touched; a run folder left by an earlier
/// compare is reused (read back when finished, resumed otherwise) only when
/// its `config.toml` is this compare's config, else refused naming the key.
pub fn compare(a: &CompareArgs) -> Result<()> {
    let mut plan = Vec::new();
    for task in &a.tasks {
        for algo in &a.algos {
            for &seed in &a.seeds {
                let cfg = resolve(a.cfg.config.as_deref(), algo, Some(task), Some(seed), &a.cfg.sets)
                    .with_context(|| format!("resolving the config of {task}/{algo}/seed {seed}"))?;
                check_same_config(&cfg, &a.out.join(format!("{task}/{algo}-seed{seed}")))?;
                plan.push(cfg);
            }
        }
    }
    let mut plan = plan.into_iter();
    let root = RunDir::create(&a.out)?;
    let total = a.tasks.len() * a.algos.len() * a.seeds.len();
    let mut progress = Progress::new(total as u64, "runs", false, Duration::ZERO);
    let mut done = 0;
    // Each return cell is the mean ± the population SD over the seeds
    // (`mean_std` divides by n); the header and the caption under the table
    // say so.
    let mut table = String::from(concat!(
        "| task | algorithm | seeds | env steps | final eval return, mean ± SD ",
        "| final training return, mean ± SD |\n|---|---|---|---|---|---|\n"
    ));
    let mut panels = Vec::new();
    let mut eval_panels = Vec::new();
    for task in &a.tasks {
        let mut chart = LineChart::new(task.clone(), "environment steps", "episode return (training)");
        let mut echart = LineChart::new(task.clone(), "environment steps", "deterministic evaluation return");
        for (ai, algo) in a.algos.iter().enumerate() {
            let mut curves = Vec::new();
            let mut evals = Vec::new();
            let (mut fin_eval, mut fin_train, mut steps) = (Vec::new(), Vec::new(), 0);
            for &seed in &a.seeds {
                // The plan was made in this loop's order.
                let cfg = plan.next().expect("one planned config per run");
                progress.status(done, &format!("{task} {algo} seed {seed}"));
                let dir = root.join(format!("{task}/{algo}-seed{seed}"));
                // Resumable: finished runs are read back, interrupted ones continue.
                let ms = match sweep_state(&cfg, &dir)? {
                    SweepRun::Finished(ms) => ms,
                    SweepRun::Resume => train_into(cfg, &dir, Existing::Resume, true)?,
                    SweepRun::Fresh => train_into(cfg, &dir, Existing::Overwrite, true)?,
                };
                curves.push(return_curve(&ms));
                evals.push(
                    ms.iter().filter_map(|m| m.eval_return_mean.map(|r| (m.env_steps as f64, r))).collect::<Vec<_>>(),
                );
                if let Some(r) = ms.iter().rev().find_map(|m| m.eval_return_mean) {
                    fin_eval.push(r);
                }
                if let Some(r) = ms.iter().rev().find_map(|m| m.episode_return_mean) {
                    fin_train.push(r);
                }
                steps = ms.last().map_or(0, |m| m.env_steps);
                done += 1;
                progress.update(done, &format!("{task} {algo} seed {seed} done"));
            }
            let (m, b) = mean_std_band(&curves);
            chart.push(Series::line(algo.clone(), m).with_band(b).with_color(ai));
            let (m, b) = mean_std_band(&evals);
            echart.push(Series::line(algo.clone(), m).with_band(b).with_color(ai));
            let fmt = |v: &[f64]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    let (m, s) = mean_std(v);
                    format!("{m:.1} ± {s:.1}")
                }
            };
            table.push_str(&format!(
                "| {task} | {algo} | {} | {steps} | {} | {} |\n",
                a.seeds.len(),
                fmt(&fin_eval),
                fmt(&fin_train)
            ));
        }
        panels.push(chart);
        eval_panels.push(echart);
    }
    progress.finish();
    table.push_str(concat!(
        "\nmean ± SD over the seeds: SD is the population standard deviation ",
        "(divides by n, the seeds column).\n"
    ));
    let cols = panels.len().min(2);
    let mut written = Grid::new(cols, panels).save(&root.join("learning_curves"))?;
    written.extend(Grid::new(cols, eval_panels).save(&root.join("eval_curves"))?);
    let tpath = root.join("final_returns.md");
    r2vpo_report::atomic_write_string(&tpath, &table)?;
    print!("{table}");
    for p in written.iter().chain(std::iter::once(&tpath)) {
        println!("written: {}", p.display());
    }
    Ok(())
}

#[derive(Serialize)]
struct BenchRow {
    task: String,
    raw_env_steps_per_s_1_thread: f64,
    raw_env_steps_per_s_2_threads: f64,
    train_env_steps_per_s: f64,
    /// Share of the timed training wall time spent learning (GAE, epochs ×
    /// minibatches) rather than collecting the rollout.
    learn_share: f64,
    train_threads: usize,
    train_config: String,
    /// The products' kernel (`native::kernel_path`).
    kernel: String,
}

/// The learner table's row.
#[derive(Serialize)]
struct LearnerRow {
    task: String,
    /// The products' kernel (`native::kernel_path`).
    kernel: String,
    rows: usize,
    gflops_1_thread: f64,
    gflops_all_threads: f64,
    /// This binary's fastest 2048³ product on all threads, measured in
    /// the same run.
    limit_gflops: f64,
}

/// What `r2vpo bench control` writes.
#[derive(Serialize)]
struct BenchOut {
    /// The kernel `auto` (or `R2VPO_MATMUL`) runs the networks on here.
    kernel_chosen: String,
    learner: Vec<LearnerRow>,
    training: Vec<BenchRow>,
}

/// `r2vpo bench control`: per task, the learner's products on every
/// kernel this CPU has (against the fastest 2048³ product, measured in
/// the same run), the raw physics rate, and end-to-end training on every
/// kernel and, for `auto`'s kernel, on one thread too, so the speed-ups
/// of a kernel and of the second core are read from one run.
pub fn bench(a: &BenchArgs) -> Result<()> {
    let threads = std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1usize);
    let file = default_config(a.cfg.config.as_deref());
    let config_name = file.as_ref().map_or("defaults".into(), |p| p.display().to_string());
    let chosen = r2vpo_kernels::matmul();
    let kernel_chosen = r2vpo_control::native::kernel_path();
    let kernels = fast_kernels();
    let mut rows = Vec::new();
    let mut learner_rows = Vec::new();
    let limit = if a.learner_reps > 0 { Some(best_product_rate()) } else { None };
    for task in &a.tasks {
        let mut sets = vec![format!("task=\"{task}\""), "eval_episodes=0".to_string()];
        sets.extend(a.cfg.sets.iter().cloned());
        let cfg: TrainConfig = config::load(file.as_deref(), &sets)?;
        let cfg = TrainConfig { total_env_steps: u64::MAX / 2, ..cfg };
        if let Some((limit, _)) = limit {
            // The network alone: a Trainer would also build `num_envs`
            // environments and an optimizer the timing does not use.
            let env = VecEnv::new(VecEnvConfig::new(task, 1, 0))?;
            let dims = (env.observation_dim(), env.action_dim());
            let net = NativeNet::from_net(&ActorCritic::new(&cfg.policy, dims.0, dims.1, 0)?)?;
            let mb = cfg.minibatch_size();
            for &k in &kernels {
                r2vpo_kernels::set_matmul(k);
                let one = learner_rate(&net, dims, mb, a.learner_reps, 1)?;
                let all = learner_rate(&net, dims, mb, a.learner_reps, threads.max(1))?;
                learner_rows.push(LearnerRow {
                    task: task.clone(),
                    kernel: r2vpo_control::native::kernel_path(),
                    rows: mb,
                    gflops_1_thread: one,
                    gflops_all_threads: all,
                    limit_gflops: limit,
                });
            }
        }
        if a.updates == 0 {
            continue;
        }
        let r1 = raw_rate(task, a.envs, 1, a.seconds)?;
        let r2 = raw_rate(task, a.envs, 2, a.seconds)?;
        // Every kernel on all threads, then `auto`'s on one thread: the
        // learner as it ran before it used a second core.
        let plan: Vec<(Matmul, usize)> =
            kernels.iter().map(|&k| (k, threads)).chain((threads > 1).then_some((chosen, 1))).collect();
        for (k, n) in plan {
            r2vpo_kernels::set_matmul(k);
            let (rate, learn_share) =
                rayon::ThreadPoolBuilder::new().num_threads(n).build()?.install(|| -> Result<(f64, f64)> {
                    let mut t = Trainer::new(cfg.clone())?;
                    t.update()?; // warm-up: allocations, first-touch
                    let t0 = Instant::now();
                    let mut steps = 0u64;
                    let (mut rollout_s, mut learn_s) = (0.0, 0.0);
                    for _ in 0..a.updates.max(1) {
                        let m = t.update()?;
                        rollout_s += m.rollout_s;
                        learn_s += m.learn_s;
                        steps += cfg.steps_per_update();
                    }
                    Ok((steps as f64 / t0.elapsed().as_secs_f64(), learn_s / (rollout_s + learn_s).max(1e-12)))
                })?;
            rows.push(BenchRow {
                task: task.clone(),
                raw_env_steps_per_s_1_thread: r1,
                raw_env_steps_per_s_2_threads: r2,
                train_env_steps_per_s: rate,
                learn_share,
                train_threads: n,
                train_config: config_name.clone(),
                kernel: r2vpo_control::native::kernel_path(),
            });
        }
    }
    r2vpo_kernels::set_matmul(chosen);
    if let Some((limit, kernel)) = limit {
        println!(
            "control learner products ({config_name}; `auto` runs {kernel_chosen} here): one minibatch's forward + \
             backward, the fastest pass; against this binary's fastest 2048³ product on {threads} threads \
             ({kernel}: {limit:.0} GFLOP/s), measured in the same run"
        );
        println!(
            "| task | kernel | minibatch rows | GFLOP/s, 1 thread | GFLOP/s, {threads} threads | speed-up | vs gemm, {threads} threads | share of {limit:.0} |\n|---|---|---|---|---|---|---|---|"
        );
        for r in &learner_rows {
            // Against the task's first row: gemm on all threads.
            let first = learner_rows.iter().find(|b| b.task == r.task).map_or(f64::NAN, |b| b.gflops_all_threads);
            let vs = r.gflops_all_threads / first;
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.2}× | {:.2}× | {:.0}% |",
                r.task,
                r.kernel,
                r.rows,
                r.gflops_1_thread,
                r.gflops_all_threads,
                r.gflops_all_threads / r.gflops_1_thread,
                vs,
                100.0 * r.gflops_all_threads / limit
            );
        }
    }
    if !rows.is_empty() {
        println!(
            "control throughput ({} envs for raw physics; training with {config_name}, {} timed updates per row)",
            a.envs,
            a.updates.max(1)
        );
        println!(
            "| task | kernel | threads | raw env-steps/s, 1 thread | raw, 2 threads | training env-steps/s | vs gemm, {threads} threads | training / raw(2) | learning share |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in &rows {
            let first = rows.iter().find(|b| b.task == r.task).map_or(f64::NAN, |b| b.train_env_steps_per_s);
            let vs = r.train_env_steps_per_s / first;
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2} | {:.0}% |",
                r.task,
                r.kernel,
                r.train_threads,
                r.raw_env_steps_per_s_1_thread,
                r.raw_env_steps_per_s_2_threads,
                r.train_env_steps_per_s,
                vs,
                r.train_env_steps_per_s / r.raw_env_steps_per_s_2_threads,
                100.0 * r.learn_share
            );
        }
    }
    if learner_rows.is_empty() && rows.is_empty() {
        return Ok(());
    }
    r2vpo_report::atomic_write_json(&a.out, &BenchOut { kernel_chosen, learner: learner_rows, training: rows })?;
    println!("written: {}", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_presets_and_task_resolve() {
        let c = resolve(None, "ppo", Some("walker-walk"), Some(3), &["total_env_steps=5000".into()]).unwrap();
        assert_eq!(c.task, "walker-walk");
        assert_eq!(c.seed, 3);
        assert_eq!(c.objective.kind, r2vpo::objective::ObjectiveKind::Clip);
        assert_eq!(c.objective.dual_clip, None);
        let r = resolve(None, "r2vpo", None, None, &[]).unwrap();
        assert_eq!(r.objective.kind, r2vpo::objective::ObjectiveKind::R2vpo);
        assert!(resolve(None, "ppo2", None, None, &[]).is_err());
        let e = resolve(None, "ppo", None, None, &["epochz=1".into()]).unwrap_err().to_string();
        assert!(e.contains("epochz"), "{e}");
    }

    #[test]
    fn shipped_configs_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for f in ["configs/control/cpu.toml", "configs/control/paper.toml", "configs/control/paper-cleanrl.toml"] {
            let c: TrainConfig = config::load(Some(&root.join(f)), &[]).unwrap();
            c.validate().unwrap();
        }
        let cpu: TrainConfig = config::load(Some(&root.join("configs/control/cpu.toml")), &[]).unwrap();
        assert_eq!(cpu, TrainConfig::default(), "cpu.toml and TrainConfig::default() must agree");
        let paper: TrainConfig = config::load(Some(&root.join("configs/control/paper.toml")), &[]).unwrap();
        assert_eq!(
            (paper.num_envs, paper.unroll, paper.minibatches, paper.epochs, paper.batch_size),
            (2048, 30, 32, 16, 1024)
        );
        assert_eq!(paper.policy.actor_hidden, vec![256; 5]);
        assert_eq!(paper.dual.lambda0, 0.06);
        assert_eq!(paper.flavour, r2vpo_control::trainer::Flavour::Brax);
        assert_eq!(paper.gae_for_task().gamma, 0.995);
        let ball = TrainConfig { task: "ball_in_cup-catch".into(), ..paper.clone() };
        assert_eq!(ball.gae_for_task().gamma, 0.95);
    }

    #[test]
    fn train_resume_eval_compare_end_to_end() {
        let dir = tempfile::tempdir().unwrap();
        let sets: Vec<String> = [
            "num_envs=4",
            "unroll=8",
            "batch_size=4",
            "minibatches=2",
            "epochs=1",
            "total_env_steps=128",
            "eval_every=0",
            "eval_episodes=1",
        ]
        .map(String::from)
        .to_vec();
        let cfg = resolve(None, "ppo", Some("cartpole-balance"), Some(0), &sets).unwrap();
        let run = dir.path().join("run");
        train_into(cfg.clone(), &run, Existing::Refuse, true).unwrap();
        let more = TrainConfig { total_env_steps: 192, ..cfg };
        let all = train_into(more, &run, Existing::Resume, true).unwrap();
        assert_eq!(all.iter().map(|m| m.update).collect::<Vec<_>>(), vec![1, 2, 3]);
        eval(&EvalArgs { run: run.clone(), episodes: 1, seed: 1 }).unwrap();
        let out = dir.path().join("cmp");
        let mut csets = sets.clone();
        csets.push("total_env_steps=64".into());
        compare(&CompareArgs {
            tasks: vec!["cartpole-balance".into()],
            algos: vec!["ppo".into(), "r2vpo".into()],
            seeds: vec![0, 1],
            cfg: ConfigArgs { config: None, sets: csets },
            out: out.clone(),
        })
        .unwrap();
        assert!(out.join("final_returns.md").exists());
        assert!(out.join("learning_curves.png").exists());
    }
}
