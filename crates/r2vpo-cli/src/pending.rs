//! Subcommands whose implementation belongs to a later issue. They parse any
//! arguments, say which issue owns them, and exit non-zero — never pretend to
//! have run.

use anyhow::{bail, Result};

/// Accepts and ignores any arguments of a not-yet-implemented subcommand.
#[derive(clap::Args, Debug)]
pub struct Pending {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

/// Fails with a message naming the owning issue.
pub fn not_yet(command: &str, issue: u32) -> Result<()> {
    bail!("`r2vpo {command}` is not implemented yet; it is owned by issue #{issue} (`issues show {issue}`)")
}
