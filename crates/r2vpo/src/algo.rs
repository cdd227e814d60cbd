//! The paper's named algorithms as (objective, update mode) pairs, shared by
//! every trainer so `--algo grpo-ch` means the same thing everywhere.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// On-policy (Algorithm 1) or replay (Algorithm 2) updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `epochs` passes over each fresh batch, then discard it (R²VPO-ON, GRPO).
    On,
    /// A FIFO buffer of the last K iterations, sampled uniformly with an
    /// update-to-data ratio (R²VPO-OFF, and any baseline with replay).
    Off,
}

/// Names accepted by [`algo_overrides`].
pub const ALGORITHMS: [&str; 9] =
    ["grpo", "grpo-ch", "gppo", "topr", "grpo-kl", "r2vpo-on", "r2vpo-off", "grpo-off", "grpo-ch-off"];

/// The `key=value` config overrides that select a named algorithm: the
/// objective kind (with GRPO's ε = 0.2 or GRPO-CH's clip-higher 0.2/0.28)
/// and the mode. They are meant to be applied before a user's own `--set`s,
/// so any of them can still be changed.
pub fn algo_overrides(name: &str) -> Result<Vec<String>> {
    let v: &[&str] = match name {
        "grpo" => &["objective.kind=clip", "objective.eps_low=0.2", "objective.eps_high=0.2", "mode=on"],
        "grpo-ch" => &["objective.kind=clip", "objective.eps_low=0.2", "objective.eps_high=0.28", "mode=on"],
        "gppo" => &["objective.kind=gppo", "mode=on"],
        "topr" => &["objective.kind=topr", "mode=on"],
        "grpo-kl" => &["objective.kind=kl-penalty", "mode=on"],
        "r2vpo-on" => &["objective.kind=r2vpo", "mode=on"],
        "r2vpo-off" => &["objective.kind=r2vpo", "mode=off"],
        "grpo-off" => &["objective.kind=clip", "objective.eps_low=0.2", "objective.eps_high=0.2", "mode=off"],
        "grpo-ch-off" => &["objective.kind=clip", "objective.eps_low=0.2", "objective.eps_high=0.28", "mode=off"],
        other => {
            return Err(Error::InvalidConfig {
                field: "algo".into(),
                message: format!("unknown algorithm `{other}`; one of: {}", ALGORITHMS.join(", ")),
            })
        }
    };
    Ok(v.iter().map(|s| s.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_algorithm_resolves_and_others_fail() {
        for a in ALGORITHMS {
            let o = algo_overrides(a).unwrap();
            assert!(o.iter().any(|s| s.starts_with("objective.kind=")) && o.iter().any(|s| s.starts_with("mode=")));
        }
        let e = algo_overrides("ppo2").unwrap_err().to_string();
        assert!(e.contains("ppo2") && e.contains("grpo-ch"), "{e}");
    }
}
