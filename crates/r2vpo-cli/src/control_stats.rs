//! `r2vpo control stats`: the flags of the pre-registered comparison
//! ([`r2vpo_control::stats`], which computes and writes it).

use std::path::PathBuf;

use anyhow::Result;
use r2vpo_control::stats::{stats as compare, StatsOptions};

/// `r2vpo control stats` arguments.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// A `control compare` output folder (`<task>/<algo>-seed<seed>/` runs).
    pub dir: PathBuf,
    /// Tasks, comma-separated (default: every task folder in DIR).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// The method that is tested.
    #[arg(long, default_value = "r2vpo")]
    pub method: String,
    /// The method it is tested against.
    #[arg(long, default_value = "ppo")]
    pub baseline: String,
    /// Seeds, comma-separated: every task × method × seed run must be
    /// finished.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3,4")]
    pub seeds: Vec<u64>,
    /// Bootstrap resamples per interval.
    #[arg(long, default_value_t = 10_000)]
    pub reps: usize,
    /// Seed of the bootstrap's random stream.
    #[arg(long, default_value_t = 0)]
    pub bootstrap_seed: u64,
    /// Confidence level of every interval.
    #[arg(long, default_value_t = 0.95)]
    pub level: f64,
    /// Scores are evaluation returns divided by this.
    #[arg(long, default_value_t = 1000.0)]
    pub score_scale: f64,
    /// The mechanism's metrics are averaged over this many last updates.
    #[arg(long, default_value_t = 16)]
    pub last_updates: usize,
}

/// `r2vpo control stats`: prints the table and the files it wrote.
pub fn stats(a: &StatsArgs) -> Result<()> {
    let analysis = compare(&StatsOptions {
        dir: a.dir.clone(),
        tasks: a.tasks.clone(),
        method: a.method.clone(),
        baseline: a.baseline.clone(),
        seeds: a.seeds.clone(),
        reps: a.reps,
        bootstrap_seed: a.bootstrap_seed,
        level: a.level,
        score_scale: a.score_scale,
        last_updates: a.last_updates,
    })?;
    print!("{}", analysis.markdown);
    for p in &analysis.written {
        println!("written: {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: StatsArgs,
    }

    /// The flags' defaults are the library's (the pre-registered choices).
    #[test]
    fn flag_defaults_are_the_pre_registered_options() {
        let a = Cli::try_parse_from(["x", "dir"]).unwrap().a;
        let d = StatsOptions::default();
        assert_eq!((a.method, a.baseline, a.seeds), (d.method, d.baseline, d.seeds));
        assert_eq!((a.reps, a.bootstrap_seed, a.last_updates), (d.reps, d.bootstrap_seed, d.last_updates));
        assert_eq!((a.level, a.score_scale), (d.level, d.score_scale));
    }
}
