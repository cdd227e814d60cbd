//! The CLI's configs: the library's layering of defaults, TOML file and
//! `--set` overrides ([`r2vpo_report::config`]).

pub use r2vpo_report::config::{load, source, to_toml};
