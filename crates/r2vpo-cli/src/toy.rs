//! `r2vpo toy train` and `toy compare`: arguments and config layering around
//! the [`r2vpo_toy`] trainer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use r2vpo_report::edge::{open_run_folder, Existing, Progress};
use r2vpo_report::RunDir;
use r2vpo_toy::{compare_report, train, IterMetrics, ToyConfig};

use crate::args::{ConfigArgs, RunArgs};
use crate::config;

/// Named algorithm presets, as `--set` overrides applied before the user's.
pub fn algo_overrides(name: &str) -> Result<Vec<String>> {
    Ok(r2vpo_toy::algo_overrides(name)?)
}

/// `r2vpo toy train` arguments.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// `--config`, `--set`, `--seed`, `--out`, `--quiet`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Algorithm from the one table (`r2vpo::algo::ALGORITHMS`), applied before
    /// `--set`: r2vpo-on, r2vpo-off, r2vpo, ppo, grpo, grpo-ch, gppo, topr,
    /// grpo-kl, is-pg, grpo-off, grpo-ch-off, m2po, m2po-off, log-ratio-sq,
    /// log-ratio-sq-dual, spo, gspo, cispo, sapo, dppo-tv, dppo-kl, dr-grpo.
    #[arg(long)]
    pub algo: Option<String>,
}

/// `r2vpo toy compare` arguments.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// `--config` and `--set`.
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// Comma-separated algorithm presets, or `all` for the whole table
    /// (every entry but the `r2vpo` alias).
    #[arg(long, default_value = "grpo,grpo-ch,r2vpo-on,grpo-off,r2vpo-off", value_delimiter = ',')]
    pub algos: Vec<String>,
    /// Comma-separated seeds.
    #[arg(long, default_value = "0,1", value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Output folder (one sub-folder per run, plus plots and a table).
    #[arg(long, default_value = "runs/toy/compare")]
    pub out: PathBuf,
    /// Replace what an existing `--out` folder holds (refused by default).
    #[arg(long)]
    pub overwrite: bool,
}

fn resolve(config: Option<&Path>, algo: Option<&str>, sets: &[String]) -> Result<ToyConfig> {
    let mut all = match algo {
        Some(a) => algo_overrides(a)?,
        None => Vec::new(),
    };
    all.extend(sets.iter().cloned());
    Ok(config::load(config, &all)?)
}

/// `r2vpo toy train`.
pub fn cmd_train(a: &TrainArgs) -> Result<()> {
    let mut sets = a.run.cfg.sets.clone();
    if let Some(s) = a.run.seed {
        sets.insert(0, format!("seed={s}"));
    }
    let cfg = resolve(a.run.cfg.config.as_deref(), a.algo.as_deref(), &sets)?;
    cfg.validate()?;
    let out = a.run.out.clone().unwrap_or_else(|| PathBuf::from("runs/toy/train"));
    let run = r2vpo_report::edge::open_run_folder(&out, a.run.existing())?;
    train(&cfg, Some(&run), a.run.quiet)?;
    println!("run folder: {}", run.path().display());
    Ok(())
}

/// `--algos` with `all` replaced by every algorithm of the table but the
/// `r2vpo` alias, in table order.
fn expand_algos(names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|n| match n.as_str() {
            "all" => r2vpo::algo::names().into_iter().filter(|&a| a != "r2vpo").map(String::from).collect(),
            _ => vec![n.clone()],
        })
        .collect()
}

/// `r2vpo toy compare`: algorithms × seeds, reward curves with mean ± std
/// bands, the λ trajectory, and a Markdown table of final values. Every
/// run's config is resolved and validated before `--out` is touched, so a
/// bad `--set` leaves no folder behind.
pub fn cmd_compare(a: &CompareArgs) -> Result<()> {
    let algos = expand_algos(&a.algos);
    let mut plan: Vec<(String, Vec<(u64, ToyConfig)>)> = Vec::new();
    for algo in &algos {
        let mut runs = Vec::new();
        for &seed in &a.seeds {
            let mut sets = a.cfg.sets.clone();
            sets.push(format!("seed={seed}"));
            let cfg = resolve(a.cfg.config.as_deref(), Some(algo), &sets)
                .and_then(|c| {
                    c.validate()?;
                    Ok(c)
                })
                .with_context(|| format!("the config of {algo} seed {seed}"))?;
            runs.push((seed, cfg));
        }
        plan.push((algo.clone(), runs));
    }
    let existing = if a.overwrite { Existing::Overwrite } else { Existing::Refuse };
    let root = open_run_folder(&a.out, existing)?;
    let mut progress = Progress::new((algos.len() * a.seeds.len()) as u64, "runs", false, Duration::ZERO);
    let mut curves: Vec<(String, Vec<Vec<IterMetrics>>)> = Vec::new();
    let mut done = 0;
    for (algo, runs) in plan {
        let mut metrics = Vec::new();
        for (seed, cfg) in runs {
            progress.status(done, &format!("{algo} seed {seed}"));
            let run = RunDir::create(root.join(format!("{algo}-seed{seed}")))?;
            metrics.push(train(&cfg, Some(&run), true)?.metrics);
            done += 1;
            progress.update(done, &format!("{algo} seed {seed} done"));
        }
        curves.push((algo, metrics));
    }
    progress.finish();
    let (table, reward_png) = compare_report(&root, &curves)?;
    println!("{table}");
    println!("plots: {}", reward_png.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
    println!("runs and table: {}", root.path().display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_the_whole_table() {
        let all = expand_algos(&["all".to_string()]);
        assert_eq!(all.len(), r2vpo::algo::ALGORITHMS.len() - 1);
        assert!(all.contains(&"dppo-kl".to_string()) && !all.contains(&"r2vpo".to_string()));
        assert_eq!(expand_algos(&["grpo".to_string()]), vec!["grpo".to_string()]);
    }

    #[test]
    fn bad_config_is_rejected_with_the_key() {
        let e = config::load::<ToyConfig>(None, &["objective.eps_lo=0.1".to_string()]).unwrap_err().to_string();
        assert!(e.contains("eps_lo"), "{e}");
        let e = algo_overrides("ppo2").unwrap_err().to_string();
        assert!(e.contains("ppo2"), "{e}");
    }

    /// The TOML layering of `--algo` and `--set` gives the same config as
    /// the library's typed route, which the library's pinned runs use.
    #[test]
    fn layered_and_typed_configs_agree() {
        for a in r2vpo::algo::ALGORITHMS {
            let mut sets = algo_overrides(a.name).unwrap();
            sets.extend(["iterations=5", "minibatches=4", "dual.eta=2.0"].map(String::from));
            let layered: ToyConfig = config::load(None, &sets).unwrap();
            let mut typed = ToyConfig { iterations: 5, minibatches: 4, ..ToyConfig::default() };
            typed.dual.eta = 2.0;
            a.objective.apply(&mut typed.objective);
            a.apply_dual(&mut typed.dual);
            a.apply_group_norm(&mut typed.group_norm);
            typed.mode = a.mode;
            assert_eq!(serde_json::to_value(&layered).unwrap(), serde_json::to_value(&typed).unwrap(), "{}", a.name);
        }
    }
}
