//! The paper's named algorithms in one typed table: each is an objective
//! (kind plus the settings that define it) and an update mode. The objective
//! presets ([`crate::objective::ObjectiveConfig::preset`]), `--algo` of every
//! trainer and the README's list are all derived from [`ALGORITHMS`], so a
//! run labelled GPPO is the GPPO the docs describe, whichever trainer ran it.
//!
//! An algorithm fixes only the keys that define it. Everything else (the
//! aggregation, λ's schedule, PPO's ε in the control domain, …) stays with
//! the run's config, so `--algo ppo` on the paper's control config keeps its
//! ε = 0.3.

use serde::{Deserialize, Serialize};

use crate::objective::{KlEstimator, ObjectiveConfig, ObjectiveKind, RatioLevel};
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

impl Mode {
    /// The config value (`"on"` / `"off"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::On => "on",
            Mode::Off => "off",
        }
    }
}

/// The objective settings that define an algorithm; `None` leaves a key to
/// the run's config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ObjectiveSpec {
    /// The objective kind.
    pub kind: ObjectiveKind,
    /// `(ε_low, ε_high)`.
    pub eps: Option<(f64, f64)>,
    /// The dual-clip constant: `Some(None)` disables it.
    pub dual_clip: Option<Option<f64>>,
    /// GPPO's `(β₁, β₂)`.
    pub gppo_beta: Option<(f64, f64)>,
    /// TOPR's ratio level.
    pub topr_ratio_level: Option<RatioLevel>,
    /// The KL estimator of the KL-penalty kind.
    pub kl_estimator: Option<KlEstimator>,
}

impl ObjectiveSpec {
    const fn kind(kind: ObjectiveKind) -> Self {
        ObjectiveSpec { kind, eps: None, dual_clip: None, gppo_beta: None, topr_ratio_level: None, kl_estimator: None }
    }

    /// Writes the defining keys into `cfg`, leaving the others alone.
    pub fn apply(&self, cfg: &mut ObjectiveConfig) {
        cfg.kind = self.kind;
        if let Some((lo, hi)) = self.eps {
            cfg.eps_low = lo;
            cfg.eps_high = hi;
        }
        if let Some(c) = self.dual_clip {
            cfg.dual_clip = c;
        }
        if let Some((b1, b2)) = self.gppo_beta {
            cfg.gppo_beta1 = b1;
            cfg.gppo_beta2 = b2;
        }
        if let Some(l) = self.topr_ratio_level {
            cfg.topr_ratio_level = l;
        }
        if let Some(k) = self.kl_estimator {
            cfg.kl_estimator = k;
        }
    }

    /// The same keys as `objective.key=value` config overrides (TOML values).
    pub fn overrides(&self) -> Vec<String> {
        let mut v = vec![format!("objective.kind=\"{}\"", self.kind.as_str())];
        if let Some((lo, hi)) = self.eps {
            v.push(format!("objective.eps_low={lo:?}"));
            v.push(format!("objective.eps_high={hi:?}"));
        }
        if let Some(c) = self.dual_clip {
            v.push(match c {
                Some(c) => format!("objective.dual_clip={c:?}"),
                None => "objective.dual_clip=\"none\"".to_string(),
            });
        }
        if let Some((b1, b2)) = self.gppo_beta {
            v.push(format!("objective.gppo_beta1={b1:?}"));
            v.push(format!("objective.gppo_beta2={b2:?}"));
        }
        if let Some(l) = self.topr_ratio_level {
            v.push(format!("objective.topr_ratio_level=\"{}\"", l.as_str()));
        }
        if let Some(k) = self.kl_estimator {
            v.push(format!("objective.kl_estimator=\"{}\"", k.as_str()));
        }
        v
    }
}

/// One named algorithm of the paper's comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Algorithm {
    /// The `--algo` name.
    pub name: &'static str,
    /// What it optimises.
    pub objective: ObjectiveSpec,
    /// How it uses data.
    pub mode: Mode,
    /// One line for the docs.
    pub summary: &'static str,
}

const CLIP_02: ObjectiveSpec = ObjectiveSpec { eps: Some((0.2, 0.2)), ..ObjectiveSpec::kind(ObjectiveKind::Clip) };
const CLIP_HIGHER: ObjectiveSpec = ObjectiveSpec { eps: Some((0.2, 0.28)), ..ObjectiveSpec::kind(ObjectiveKind::Clip) };
const R2VPO: ObjectiveSpec = ObjectiveSpec::kind(ObjectiveKind::R2vpo);

/// Every named algorithm, the single source of `--algo` and the objective
/// presets.
pub const ALGORITHMS: &[Algorithm] = &[
    Algorithm {
        name: "r2vpo-on",
        objective: R2VPO,
        mode: Mode::On,
        summary: "R²VPO-ON (Algorithm 1): ρÂ − λ(ρ−1)², epochs over each fresh batch",
    },
    Algorithm {
        name: "r2vpo-off",
        objective: R2VPO,
        mode: Mode::Off,
        summary: "R²VPO-OFF (Algorithm 2): the same objective on a FIFO replay buffer of the last K iterations",
    },
    Algorithm { name: "r2vpo", objective: R2VPO, mode: Mode::On, summary: "alias of r2vpo-on" },
    Algorithm {
        name: "ppo",
        objective: ObjectiveSpec { dual_clip: Some(None), ..ObjectiveSpec::kind(ObjectiveKind::Clip) },
        mode: Mode::On,
        summary: "PPO: ratio clipping at the config's ε, no dual-clip (CleanRL)",
    },
    Algorithm {
        name: "grpo",
        objective: CLIP_02,
        mode: Mode::On,
        summary: "GRPO: clipping at ε 0.2/0.2 with the config's dual-clip (3 by default)",
    },
    Algorithm {
        name: "grpo-ch",
        objective: CLIP_HIGHER,
        mode: Mode::On,
        summary: "GRPO-CH: DAPO's clip-higher, ε 0.2/0.28",
    },
    Algorithm {
        name: "gppo",
        objective: ObjectiveSpec {
            eps: Some((0.2, 0.28)),
            gppo_beta: Some((0.25, 1.0)),
            ..ObjectiveSpec::kind(ObjectiveKind::Gppo)
        },
        mode: Mode::On,
        summary: "GPPO: clip-higher bounds whose clipped tokens keep a bounded gradient, ε 0.2/0.28, β 0.25/1.0",
    },
    Algorithm {
        name: "topr",
        objective: ObjectiveSpec {
            topr_ratio_level: Some(RatioLevel::Token),
            ..ObjectiveSpec::kind(ObjectiveKind::Topr)
        },
        mode: Mode::On,
        summary: "TOPR: tapered off-policy REINFORCE, token-level taper",
    },
    Algorithm {
        name: "grpo-kl",
        objective: ObjectiveSpec {
            kl_estimator: Some(KlEstimator::K3),
            ..ObjectiveSpec::kind(ObjectiveKind::KlPenalty)
        },
        mode: Mode::On,
        summary: "GRPO-KL: ρÂ − λ·KL estimate (k3), the exact-KL comparison",
    },
    Algorithm {
        name: "is-pg",
        objective: ObjectiveSpec::kind(ObjectiveKind::IsPg),
        mode: Mode::On,
        summary: "unclipped importance-sampled policy gradient (Theorem 3.3's J^UNC)",
    },
    Algorithm { name: "grpo-off", objective: CLIP_02, mode: Mode::Off, summary: "GRPO on the replay buffer" },
    Algorithm { name: "grpo-ch-off", objective: CLIP_HIGHER, mode: Mode::Off, summary: "GRPO-CH on the replay buffer" },
];

/// The distinct objectives of the table, by a representative name (every
/// algorithm name is accepted by [`ObjectiveConfig::preset`]).
pub const PRESETS: [&str; 8] = ["r2vpo", "ppo", "grpo", "grpo-ch", "gppo", "topr", "grpo-kl", "is-pg"];

// Defined here rather than beside ObjectiveConfig so the objective module does
// not depend on the table that depends on it.
impl ObjectiveConfig {
    /// The objective of the named algorithm in [`ALGORITHMS`] (e.g.
    /// `grpo-ch` → clip at ε 0.2/0.28), its defining keys set on the
    /// defaults. Replay variants (`r2vpo-off`) give the same objective as
    /// their on-policy twin.
    pub fn preset(name: &str) -> Result<Self> {
        Ok(find(name)?.objective_config())
    }
}

/// The algorithm called `name`; the error lists the valid names.
pub fn find(name: &str) -> Result<&'static Algorithm> {
    ALGORITHMS.iter().find(|a| a.name == name).ok_or_else(|| Error::InvalidConfig {
        field: "algo".into(),
        message: format!("unknown algorithm `{name}`; one of: {}", names().join(", ")),
    })
}

/// Every algorithm name, in table order.
pub fn names() -> Vec<&'static str> {
    ALGORITHMS.iter().map(|a| a.name).collect()
}

impl Algorithm {
    /// The objective with this algorithm's defining keys on the defaults.
    pub fn objective_config(&self) -> ObjectiveConfig {
        let mut cfg = ObjectiveConfig::default();
        self.objective.apply(&mut cfg);
        cfg
    }

    /// The `key=value` overrides that select this algorithm, meant to be
    /// applied after a `--config` file and before the user's own `--set`s.
    /// `with_mode` is false for trainers that have only one mode (control),
    /// which then refuse replay algorithms through [`Algorithm::require_on_policy`].
    pub fn overrides(&self, with_mode: bool) -> Vec<String> {
        let mut v = self.objective.overrides();
        if with_mode {
            v.push(format!("mode={}", self.mode.as_str()));
        }
        v
    }

    /// An error naming `trainer` when this algorithm needs replay.
    pub fn require_on_policy(&self, trainer: &str) -> Result<()> {
        if self.mode == Mode::Off {
            let on: Vec<&str> = ALGORITHMS.iter().filter(|a| a.mode == Mode::On).map(|a| a.name).collect();
            return Err(Error::InvalidConfig {
                field: "algo".into(),
                message: format!(
                    "`{}` learns from a replay buffer, which the {trainer} trainer does not have; one of: {}",
                    self.name,
                    on.join(", ")
                ),
            });
        }
        Ok(())
    }
}

/// The `key=value` config overrides that select a named algorithm (objective
/// keys and `mode`), for the trainers that have both modes.
pub fn algo_overrides(name: &str) -> Result<Vec<String>> {
    Ok(find(name)?.overrides(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_resolves_and_others_fail() {
        for a in ALGORITHMS {
            let o = algo_overrides(a.name).unwrap();
            assert!(o.iter().any(|s| s.starts_with("objective.kind=")) && o.iter().any(|s| s.starts_with("mode=")));
            a.objective_config().validate().unwrap();
        }
        let e = algo_overrides("ppo2").unwrap_err().to_string();
        assert!(e.contains("ppo2") && e.contains("grpo-ch"), "{e}");
        let mut seen = std::collections::HashSet::new();
        assert!(ALGORITHMS.iter().all(|a| seen.insert(a.name)), "duplicate name");
    }

    #[test]
    fn overrides_and_apply_agree() {
        // The string overrides, parsed as TOML into an ObjectiveConfig, give
        // exactly the typed preset: the two derivations cannot drift.
        for a in ALGORITHMS {
            let mut toml_text = String::new();
            for o in a.objective.overrides() {
                let (k, v) = o.split_once('=').unwrap();
                toml_text.push_str(&format!("{} = {v}\n", k.trim_start_matches("objective.")));
            }
            let parsed: ObjectiveConfig = toml::from_str(&toml_text).unwrap();
            assert_eq!(parsed, a.objective_config(), "{}: {toml_text}", a.name);
        }
    }

    #[test]
    fn gppo_is_the_documented_gppo() {
        let g = find("gppo").unwrap().objective_config();
        assert_eq!(
            (g.kind, g.eps_low, g.eps_high, g.gppo_beta1, g.gppo_beta2),
            (ObjectiveKind::Gppo, 0.2, 0.28, 0.25, 1.0)
        );
        assert!(algo_overrides("gppo").unwrap().contains(&"objective.eps_high=0.28".to_string()));
    }

    #[test]
    fn replay_algorithms_are_refused_where_there_is_no_replay() {
        assert!(find("r2vpo-off").unwrap().require_on_policy("control").unwrap_err().to_string().contains("replay"));
        find("ppo").unwrap().require_on_policy("control").unwrap();
    }
}
