//! The argument groups every config-driven command shares, so `--config`,
//! `--set`, `--seed`, `--out` and `--quiet` mean the same thing everywhere.

use std::path::PathBuf;

use r2vpo_report::edge::{Existing, StopSignal};

/// A TOML config file and `--set` overrides, layered over the built-in
/// defaults (the paper's values): defaults → `--config` → each `--set`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// TOML config file (default: the built-in defaults; `r2vpo config show`
    /// prints them).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. `--set dual.lambda0=0.04` (repeatable,
    /// applied in order; the value is read as TOML, else as a string, so
    /// `--set objective.kind=clip` and `--set data.offset=-3` both work).
    #[arg(long = "set", value_name = "KEY=VALUE", allow_hyphen_values = true)]
    pub sets: Vec<String>,
}

/// [`ConfigArgs`] plus what every run takes: its seed, folder and verbosity.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RunArgs {
    /// The config layering.
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// Master seed (overrides the config's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output folder (each command names its default).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress bar or per-iteration lines.
    #[arg(long)]
    pub quiet: bool,
    /// Replace what an existing `--out` folder holds (by default a command
    /// refuses to write into a folder that is not empty).
    #[arg(long)]
    pub overwrite: bool,
}

impl RunArgs {
    /// The overwrite rule for a fresh run into `--out`.
    pub fn existing(&self) -> Existing {
        if self.overwrite {
            Existing::Overwrite
        } else {
            Existing::Refuse
        }
    }
}

/// A run ended early by SIGINT/SIGTERM after writing a checkpoint (or a
/// process that keeps none, an actor, ended by one): the binary prints it
/// and exits with the signal's code (130 / 143), so scripts can tell it
/// from a finished run (exit 0) and from a failure (1).
#[derive(Debug)]
pub struct Stopped {
    /// The signal.
    pub signal: StopSignal,
    /// The command that continues the run.
    pub resume: String,
}

impl Stopped {
    /// A process without a checkpoint of its own (an `llm actor`), stopped
    /// by `signal`; `restart` is the command that starts it again.
    pub fn without_checkpoint(signal: StopSignal, restart: String) -> NoCheckpoint {
        NoCheckpoint(Stopped { signal, resume: restart })
    }
}

/// [`Stopped`] for a process that keeps no checkpoint.
#[derive(Debug)]
pub struct NoCheckpoint(pub Stopped);

fn signal_name(s: StopSignal) -> &'static str {
    match s {
        StopSignal::Interrupt => "SIGINT",
        StopSignal::Terminate => "SIGTERM",
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {}; checkpoint written. Continue with: {}", signal_name(self.signal), self.resume)
    }
}

impl std::fmt::Display for NoCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {}. Restart with: {}", signal_name(self.0.signal), self.0.resume)
    }
}

impl std::error::Error for NoCheckpoint {}

impl std::error::Error for Stopped {}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn sets_may_start_with_a_hyphen_and_keep_their_order() {
        let c = Cli::try_parse_from(["x", "--set", "a=-1", "--set", "-b=2", "--seed", "3", "--quiet"]).unwrap();
        assert_eq!(c.run.cfg.sets, ["a=-1", "-b=2"]);
        assert_eq!((c.run.seed, c.run.quiet), (Some(3), true));
    }
}
