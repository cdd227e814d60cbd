//! `r2vpo control train|eval|compare`: PPO vs
//! R²VPO on DeepMind Control tasks (issue #4).
//!
//! A run folder holds `config.toml` (resolved), `metrics.jsonl` (one record
//! per update, see [`UpdateMetrics`]), `checkpoints/` and, when finished,
//! `summary.json`. `--resume RUN_DIR` continues from the newest checkpoint.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use r2vpo::stats::mean_std;
use serde::Serialize;

use r2vpo_control::run::{check_same_config, sweep_state, train_in_folder, SweepRun};
use r2vpo_control::trainer::{algo_overrides, evaluate_policy_recorded, load_policy, TrainConfig, UpdateMetrics};
use r2vpo_control::video::VideoTarget;
use r2vpo_report::edge::{Existing, Progress, Stop, StopSignal};
use r2vpo_report::plot::{mean_std_band, Grid, LineChart, Series};
use r2vpo_report::RunDir;

use crate::args::{ConfigArgs, RunArgs, Stopped};
use crate::config;

/// `r2vpo control train` arguments.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// `--config`, `--set`, `--seed`, `--out`, `--quiet`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Task, e.g. `cheetah-run` (overrides the config's `task`).
    #[arg(long)]
    pub task: Option<String>,
    /// Algorithm from the one table (`r2vpo::algo::ALGORITHMS`), on-policy only
    /// here: r2vpo-on, r2vpo, ppo, grpo, grpo-ch, gppo, topr, grpo-kl, is-pg,
    /// m2po, log-ratio-sq, log-ratio-sq-dual, spo, gspo, cispo, sapo, dr-grpo;
    /// an unknown or replay name is refused with the list, DPPO (a bound on
    /// a token's probability) with the reason.
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
    /// Film episodes into this folder as MP4 (H.264, browser-playable):
    /// `<task>-seed<seed>-ep<i>.mp4`, plus a PNG of the first one's middle
    /// frame. Size and camera come from the run's `[video]`, else `--set`.
    #[arg(long)]
    pub video: Option<PathBuf>,
    /// How many of the episodes to film (the first ones).
    #[arg(long, default_value_t = 1, requires = "video")]
    pub video_episodes: usize,
    /// Overrides of the run's config for this evaluation, e.g.
    /// `--set video.width=640 --set video.height=480 --set video.camera=1`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
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

fn default_config(explicit: Option<&Path>) -> Option<PathBuf> {
    r2vpo_control::trainer::default_config(explicit)
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

/// `cfg` with `--set KEY=VALUE` overrides applied (as `control train`
/// applies them to a file).
fn with_sets(cfg: &TrainConfig, sets: &[String]) -> Result<TrainConfig> {
    let mut table = toml::Table::try_from(cfg).context("serialising the run's config")?;
    for s in sets {
        r2vpo_report::config::apply_override(&mut table, s)?;
    }
    toml::Value::Table(table).try_into().map_err(|e| anyhow::anyhow!("--set {}: {e}", sets.join(" --set ")))
}

/// `r2vpo control eval`.
pub fn eval(a: &EvalArgs) -> Result<()> {
    let saved = load_policy(&a.run.join("checkpoints")).context("loading the run's policy")?;
    if a.episodes == 0 {
        bail!("--episodes must be at least 1");
    }
    let mut saved = saved;
    if !a.sets.is_empty() {
        saved.config = with_sets(&saved.config, &a.sets)?;
        saved.config.validate()?;
    }
    let cfg = &saved.config;
    let targets = match &a.video {
        Some(dir) => {
            if a.video_episodes == 0 || a.video_episodes > a.episodes {
                bail!("--video-episodes must be between 1 and --episodes ({})", a.episodes);
            }
            (0..a.video_episodes)
                .map(|i| {
                    let stem = format!("{}-seed{}-ep{i}", cfg.task, a.seed);
                    VideoTarget {
                        path: dir.join(format!("{stem}.mp4")),
                        still: (i == 0).then(|| dir.join(format!("{stem}.png"))),
                    }
                })
                .collect()
        }
        None => Vec::new(),
    };
    if let Some(dir) = &a.video {
        // Software rendering takes seconds per episode; say what is coming.
        eprintln!(
            "filming {} episode(s) of {} at {}x{} into {}…",
            targets.len(),
            cfg.task,
            cfg.video.width,
            cfg.video.height,
            dir.display()
        );
    }
    let (returns, videos) = evaluate_policy_recorded(cfg, &saved.eval_policy(), a.episodes, a.seed, targets)?;
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
    for v in &videos {
        println!("video: {} ({} frames at {} fps)", v.path.display(), v.frames, v.fps);
    }
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

/// The y-axis title of `eval_curves`: how the runs evaluate
/// (`eval_deterministic`), since the paper's config samples actions as Brax
/// does while the CPU recipe takes the policy's mode.
fn eval_axis_label(plan: &[TrainConfig]) -> &'static str {
    if plan.iter().all(|c| c.eval_deterministic) {
        "evaluation return (mode of the policy)"
    } else if plan.iter().all(|c| !c.eval_deterministic) {
        "evaluation return (sampled actions)"
    } else {
        "evaluation return (mode or sampled, per run)"
    }
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
    let eval_label = eval_axis_label(&plan);
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
        let mut echart = LineChart::new(task.clone(), "environment steps", eval_label);
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
    fn eval_axis_label_says_how_the_runs_evaluated() {
        let mode = TrainConfig::default();
        let sampled = TrainConfig { eval_deterministic: false, ..TrainConfig::default() };
        assert!(mode.eval_deterministic);
        assert_eq!(eval_axis_label(&[mode.clone(), mode.clone()]), "evaluation return (mode of the policy)");
        assert_eq!(eval_axis_label(std::slice::from_ref(&sampled)), "evaluation return (sampled actions)");
        assert_eq!(eval_axis_label(&[mode, sampled]), "evaluation return (mode or sampled, per run)");
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
        eval(&EvalArgs { run: run.clone(), episodes: 1, seed: 1, video: None, video_episodes: 1, sets: Vec::new() })
            .unwrap();
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
