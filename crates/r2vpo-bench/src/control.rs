//! `r2vpo bench control`: per task, the control learner's products on
//! every kernel this CPU has (against the fastest 2048³ product, measured
//! in the same run), the raw physics rate, and end-to-end training on every
//! kernel (and, for `auto`'s kernel, on one thread too), so the speed-ups
//! of a kernel and of the second core are read from one run. The
//! measurements themselves are `r2vpo_control::bench`'s.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use r2vpo_control::bench::{best_product_rate, fast_kernels, learner_rate, raw_rate};
use r2vpo_control::native::NativeNet;
use r2vpo_control::policy::ActorCritic;
use r2vpo_control::trainer::{TrainConfig, Trainer};
use r2vpo_control::{VecEnv, VecEnvConfig};
use r2vpo_kernels::Matmul;

/// `r2vpo bench control` arguments.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// TOML config file (default: `configs/control/cpu.toml` where it
    /// exists, else the built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. `--set num_envs=64` (repeatable, applied
    /// in order after `--config`).
    #[arg(long = "set", value_name = "KEY=VALUE", allow_hyphen_values = true)]
    pub sets: Vec<String>,
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
    let file = r2vpo_control::trainer::default_config(a.config.as_deref());
    let config_name = file.as_ref().map_or("defaults".into(), |p| p.display().to_string());
    let chosen = r2vpo_kernels::matmul();
    let kernel_chosen = r2vpo_control::native::kernel_path();
    let kernels = fast_kernels();
    let mut rows = Vec::new();
    let mut learner_rows = Vec::new();
    let limit = if a.learner_reps > 0 { Some(best_product_rate()) } else { None };
    for task in &a.tasks {
        let mut sets = vec![format!("task=\"{task}\""), "eval_episodes=0".to_string()];
        sets.extend(a.sets.iter().cloned());
        let cfg: TrainConfig = r2vpo_report::config::load(file.as_deref(), &sets)?;
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
