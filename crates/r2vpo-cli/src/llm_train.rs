//! `r2vpo llm train`: RL fine-tuning runs (R²VPO-ON/OFF and the baselines)
//! with a progress bar, Ctrl-C checkpointing and `--resume`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use r2vpo_llm::train::{Event, Outcome, TrainConfig, Trainer};
use r2vpo_report::RunDir;

use crate::config;

/// `r2vpo llm train` arguments.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// TOML config (e.g. `configs/llm/smollm2-arith.toml`; default: built-in
    /// defaults, see `r2vpo config show llm-train`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Algorithm preset applied before `--set`: grpo, grpo-ch, gppo, topr,
    /// grpo-kl, r2vpo-on, r2vpo-off, grpo-off, grpo-ch-off (default: the
    /// config's own objective and mode).
    #[arg(long)]
    pub algo: Option<String>,
    /// Master seed (overrides the config's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a config key, e.g. `--set optim.lr=1e-5` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Run folder (default: `runs/llm/<algo>-seed<seed>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in this folder from its latest checkpoint, with its
    /// `config.toml` plus any `--set` (e.g. `--set iterations=40`).
    #[arg(long, conflicts_with_all = ["config", "algo", "seed", "out"])]
    pub resume: Option<PathBuf>,
    /// Do not export the final policy as a Hugging Face folder (`RUN/model`).
    #[arg(long)]
    pub no_export: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Loads a train config: defaults → file → algorithm preset → seed → `--set`.
pub fn load_config(file: Option<&Path>, algo: Option<&str>, seed: Option<u64>, sets: &[String]) -> Result<TrainConfig> {
    let mut all = match algo {
        Some(a) => TrainConfig::algo_overrides(a)?,
        None => Vec::new(),
    };
    if let Some(s) = seed {
        all.push(format!("seed={s}"));
    }
    all.extend(sets.iter().cloned());
    let cfg: TrainConfig = config::load(file, &all)?;
    cfg.validate()
        .with_context(|| format!("config {}", file.map_or("defaults".into(), |p| p.display().to_string())))?;
    Ok(cfg)
}

static STOP: AtomicBool = AtomicBool::new(false);
static SIGINTS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only async-signal-safe work here: set a flag; a second Ctrl-C exits
    // at once (the last complete checkpoint is untouched).
    if SIGINTS.fetch_add(1, Ordering::SeqCst) >= 1 {
        unsafe { libc::_exit(130) };
    }
    STOP.store(true, Ordering::SeqCst);
}

fn install_sigint() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: installs a handler that only touches atomics and `_exit`.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

/// `r2vpo llm train`.
pub fn train(a: &TrainArgs) -> Result<()> {
    let (cfg, dir, resume) = match &a.resume {
        Some(dir) => {
            let file = dir.join("config.toml");
            if !file.exists() {
                bail!("{} has no config.toml: not a run folder", dir.display());
            }
            (load_config(Some(&file), None, None, &a.sets)?, dir.clone(), true)
        }
        None => {
            let cfg = load_config(a.config.as_deref(), a.algo.as_deref(), a.seed, &a.sets)?;
            let name =
                a.algo.clone().unwrap_or_else(|| format!("{:?}-{:?}", cfg.objective.kind, cfg.mode).to_lowercase());
            let dir = a.out.clone().unwrap_or_else(|| PathBuf::from(format!("runs/llm/{name}-seed{}", cfg.seed)));
            (cfg, dir, false)
        }
    };
    let run = RunDir::create(&dir)?;
    if !resume && run.join("metrics.jsonl").exists() {
        bail!("{} already holds a run; continue it with --resume {0}, or choose another --out", dir.display());
    }
    run.write_config(&config::to_toml(&cfg)?)?;
    let mut trainer = if resume {
        Trainer::resume(cfg.clone(), &dir).with_context(|| format!("resuming {}", dir.display()))?
    } else {
        Trainer::new(cfg.clone(), &dir).with_context(|| format!("starting {}", dir.display()))?
    };
    install_sigint();
    let bar = if a.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(cfg.iterations as u64).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} iterations  {msg}  [{elapsed} < {eta}]")
                .expect("static template"),
        )
    };
    bar.set_position(trainer.progress().iteration as u64);
    let mut last = String::new();
    let outcome = trainer.run(&STOP, &mut |e| match e {
        Event::Phase { name, .. } => bar.set_message(format!("{name}…  {last}")),
        Event::Iteration(m) => {
            last = format!(
                "reward {:.3}  acc {:.3}  len {:.0}  λ {:.4}  E[(ρ−1)²] {:.1e}  {:.0}/{:.0} tok/s",
                m.reward_mean,
                m.accuracy,
                m.response_len_mean,
                m.lambda,
                m.sq_dev,
                m.timing.rollout_tokens_per_s,
                m.timing.train_tokens_per_s
            );
            bar.set_position(m.iter as u64 + 1);
            bar.set_message(last.clone());
            if a.quiet {
                eprintln!("iter {:4}  {last}", m.iter);
            }
        }
        Event::Eval(r) => bar.println(format!(
            "eval after {} iterations: avg@{} {:.3}  pass@{} {:.3}  maj@{} {:.3}",
            r.iter, r.k, r.avg_at_k, r.k, r.pass_at_k, r.k, r.maj_at_k
        )),
        Event::Checkpoint(p) => bar.println(format!("checkpoint: {}", p.display())),
        Event::BadStep(d) => bar.println(format!("skipped a non-finite step: {d}")),
    });
    bar.finish_and_clear();
    match outcome? {
        Outcome::Stopped => {
            println!("interrupted; checkpoint written. Continue with: r2vpo llm train --resume {}", dir.display());
            return Ok(());
        }
        Outcome::Finished => {}
    }
    if !a.no_export {
        let out = dir.join("model");
        trainer.export(&out).with_context(|| format!("exporting the policy to {}", out.display()))?;
        println!("policy (Hugging Face folder): {}", out.display());
    }
    let plots = crate::llm_plot::plot_runs(std::slice::from_ref(&dir), &dir.join("plots"), None)?;
    for p in plots {
        println!("plot: {}", p.display());
    }
    println!("run folder: {}", dir.display());
    Ok(())
}
