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

use crate::aggregate::Aggregation;
use crate::dual::{DualConfig, DualMode};
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
    /// The aggregation the algorithm's paper and reference code use
    /// (GSPO and SAPO: seq-mean-token-mean; Dr.GRPO: the constant horizon).
    pub aggregation: Option<Aggregation>,
}

impl ObjectiveSpec {
    const fn kind(kind: ObjectiveKind) -> Self {
        ObjectiveSpec {
            kind,
            eps: None,
            dual_clip: None,
            gppo_beta: None,
            topr_ratio_level: None,
            kl_estimator: None,
            aggregation: None,
        }
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
        if let Some(a) = self.aggregation {
            cfg.aggregation = a;
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
        if let Some(a) = self.aggregation {
            v.push(format!("objective.aggregation=\"{}\"", a.as_str()));
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
    /// `Some(λ)`: the penalty coefficient is this constant (`dual.mode =
    /// "fixed"`, `dual.lambda0 = λ`), e.g. prime-rl's `kl_tau`; `None`
    /// leaves `[dual]` to the run's config.
    pub fixed_lambda: Option<f64>,
    /// `Some(false)`: group-relative advantages without the std (Dr.GRPO's
    /// `R − mean`); applies to the trainers with group advantages (toy,
    /// LLM), the control trainer's GAE has no groups.
    pub scale_by_std: Option<bool>,
    /// The paper or code the defaults come from.
    pub source: &'static str,
    /// One line for the docs.
    pub summary: &'static str,
}

const CLIP_02: ObjectiveSpec = ObjectiveSpec { eps: Some((0.2, 0.2)), ..ObjectiveSpec::kind(ObjectiveKind::Clip) };
const CLIP_HIGHER: ObjectiveSpec = ObjectiveSpec { eps: Some((0.2, 0.28)), ..ObjectiveSpec::kind(ObjectiveKind::Clip) };
const R2VPO: ObjectiveSpec = ObjectiveSpec::kind(ObjectiveKind::R2vpo);
const M2PO: ObjectiveSpec = ObjectiveSpec::kind(ObjectiveKind::M2po);

const fn algo(
    name: &'static str,
    objective: ObjectiveSpec,
    mode: Mode,
    source: &'static str,
    summary: &'static str,
) -> Algorithm {
    Algorithm { name, objective, mode, fixed_lambda: None, scale_by_std: None, source, summary }
}

const PAPER: &str = "the R²VPO paper";

/// Every named algorithm, the single source of `--algo` and the objective
/// presets.
pub const ALGORITHMS: &[Algorithm] = &[
    algo("r2vpo-on", R2VPO, Mode::On, PAPER, "R²VPO-ON (Algorithm 1): ρÂ − λ(ρ−1)², epochs over each fresh batch"),
    algo(
        "r2vpo-off",
        R2VPO,
        Mode::Off,
        PAPER,
        "R²VPO-OFF (Algorithm 2): the same objective on a FIFO replay buffer of the last K iterations",
    ),
    algo("r2vpo", R2VPO, Mode::On, PAPER, "alias of r2vpo-on"),
    algo(
        "ppo",
        ObjectiveSpec { dual_clip: Some(None), ..ObjectiveSpec::kind(ObjectiveKind::Clip) },
        Mode::On,
        "Schulman et al. 2017; CleanRL",
        "PPO: ratio clipping at the config's ε, no dual-clip (CleanRL)",
    ),
    algo(
        "grpo",
        CLIP_02,
        Mode::On,
        "Shao et al. 2024; verl `vanilla`",
        "GRPO: clipping at ε 0.2/0.2 with the config's dual-clip (3 by default)",
    ),
    algo("grpo-ch", CLIP_HIGHER, Mode::On, "Yu et al. 2025 (DAPO)", "GRPO-CH: DAPO's clip-higher, ε 0.2/0.28"),
    algo(
        "gppo",
        ObjectiveSpec {
            eps: Some((0.2, 0.28)),
            gppo_beta: Some((0.25, 1.0)),
            ..ObjectiveSpec::kind(ObjectiveKind::Gppo)
        },
        Mode::On,
        "Su et al. 2025 (KlearReasoner)",
        "GPPO: clip-higher bounds whose clipped tokens keep a bounded gradient, ε 0.2/0.28, β 0.25/1.0",
    ),
    algo(
        "topr",
        ObjectiveSpec { topr_ratio_level: Some(RatioLevel::Token), ..ObjectiveSpec::kind(ObjectiveKind::Topr) },
        Mode::On,
        "Roux et al. 2025",
        "TOPR: tapered off-policy REINFORCE, token-level taper",
    ),
    algo(
        "grpo-kl",
        ObjectiveSpec { kl_estimator: Some(KlEstimator::K3), ..ObjectiveSpec::kind(ObjectiveKind::KlPenalty) },
        Mode::On,
        PAPER,
        "GRPO-KL: ρÂ − λ·KL estimate (k3), the exact-KL comparison",
    ),
    algo(
        "is-pg",
        ObjectiveSpec::kind(ObjectiveKind::IsPg),
        Mode::On,
        PAPER,
        "unclipped importance-sampled policy gradient (Theorem 3.3's J^UNC)",
    ),
    algo("grpo-off", CLIP_02, Mode::Off, PAPER, "GRPO on the replay buffer"),
    algo("grpo-ch-off", CLIP_HIGHER, Mode::Off, PAPER, "GRPO-CH on the replay buffer"),
    algo(
        "m2po",
        M2PO,
        Mode::On,
        "Zheng et al. 2025 (M2PO); AReaL",
        "M2PO: unclipped ρÂ on the tokens left after masking the largest (log ρ)² until their mean is ≤ 0.04",
    ),
    algo(
        "m2po-off",
        M2PO,
        Mode::Off,
        "Zheng et al. 2025 (M2PO)",
        "M2PO on the replay buffer, the stale data it was made for",
    ),
    Algorithm {
        fixed_lambda: Some(1e-3),
        ..algo(
            "log-ratio-sq",
            ObjectiveSpec::kind(ObjectiveKind::LogRatioSq),
            Mode::On,
            "prime-rl `kl_tau` (default loss)",
            "ρÂ − τ(log ρ)² with prime-rl's fixed τ = 10⁻³",
        )
    },
    algo(
        "log-ratio-sq-dual",
        ObjectiveSpec::kind(ObjectiveKind::LogRatioSq),
        Mode::On,
        "R²VPO's dual λ on prime-rl's penalty",
        "ρÂ − λ(log ρ)² with the dual λ of `[dual]`: the ablation of (ρ−1)² against log ρ²",
    ),
    algo(
        "spo",
        ObjectiveSpec::kind(ObjectiveKind::Spo),
        Mode::On,
        "Xie et al. 2025 (SPO)",
        "SPO: ρÂ − (ρ−1)²·abs(Â)/(2ε), ε = 0.2: each token's optimum is the clip edge, reached smoothly",
    ),
    algo(
        "gspo",
        ObjectiveSpec {
            eps: Some((3e-4, 4e-4)),
            aggregation: Some(Aggregation::SeqMeanTokenMean),
            ..ObjectiveSpec::kind(ObjectiveKind::Gspo)
        },
        Mode::On,
        "Zheng et al. 2025 (GSPO); verl `gspo`, TRL sequence-level",
        "GSPO: clipping of the sequence ratio (ρ's geometric mean), ε 3·10⁻⁴/4·10⁻⁴, seq-mean-token-mean",
    ),
    algo(
        "cispo",
        ObjectiveSpec::kind(ObjectiveKind::Cispo),
        Mode::On,
        "MiniMax 2025 (CISPO); TRL `cispo`",
        "CISPO: −sg(min(ρ, 5))·Â·log π, every token keeps its gradient",
    ),
    algo(
        "sapo",
        ObjectiveSpec { aggregation: Some(Aggregation::SeqMeanTokenMean), ..ObjectiveSpec::kind(ObjectiveKind::Sapo) },
        Mode::On,
        "Gao et al. 2025 (SAPO); verl `sapo`, TRL `sapo`",
        "SAPO: (4/τ)σ(τ(ρ−1))·Â, τ 1.0/1.05, seq-mean-token-mean",
    ),
    algo(
        "dppo-tv",
        ObjectiveSpec { eps: Some((0.15, 0.15)), dual_clip: Some(None), ..ObjectiveSpec::kind(ObjectiveKind::DppoTv) },
        Mode::On,
        "Qi et al. 2026 (DPPO); verl `dppo_tv`",
        "DPPO-TV: ρ-weighted REINFORCE, masked where the sampled token's probability moved over δ = 0.15 its advantage's way",
    ),
    algo(
        "dppo-kl",
        ObjectiveSpec { eps: Some((0.05, 0.05)), dual_clip: Some(None), ..ObjectiveSpec::kind(ObjectiveKind::DppoKl) },
        Mode::On,
        "Qi et al. 2026 (DPPO); verl `dppo_kl`",
        "DPPO-KL: the same with a binary-KL region, δ = 0.05",
    ),
    Algorithm {
        scale_by_std: Some(false),
        ..algo(
            "dr-grpo",
            ObjectiveSpec { aggregation: Some(Aggregation::SeqMeanTokenSumNorm), ..CLIP_02 },
            Mode::On,
            "Liu et al. 2025 (Dr.GRPO)",
            "Dr.GRPO: GRPO's clip with R − mean advantages (no std) and the constant-horizon aggregation",
        )
    },
];

/// The distinct objectives of the table, by a representative name (every
/// algorithm name is accepted by [`ObjectiveConfig::preset`]).
pub const PRESETS: [&str; 17] = [
    "r2vpo",
    "ppo",
    "grpo",
    "grpo-ch",
    "gppo",
    "topr",
    "grpo-kl",
    "is-pg",
    "m2po",
    "log-ratio-sq",
    "spo",
    "gspo",
    "cispo",
    "sapo",
    "dppo-tv",
    "dppo-kl",
    "dr-grpo",
];

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
        if let Some(l) = self.fixed_lambda {
            v.push("dual.mode=\"fixed\"".to_string());
            v.push(format!("dual.lambda0={l:?}"));
        }
        if with_mode {
            v.push(format!("mode={}", self.mode.as_str()));
            if let Some(b) = self.scale_by_std {
                v.push(format!("group_norm.scale_by_std={b}"));
            }
        }
        v
    }

    /// The typed twin of [`Algorithm::overrides`]'s `[dual]` keys.
    pub fn apply_dual(&self, dual: &mut DualConfig) {
        if let Some(l) = self.fixed_lambda {
            dual.mode = DualMode::Fixed;
            dual.lambda0 = l;
        }
    }

    /// The typed twin of [`Algorithm::overrides`]'s `[group_norm]` key.
    pub fn apply_group_norm(&self, g: &mut crate::advantage::GroupNormConfig) {
        if let Some(b) = self.scale_by_std {
            g.scale_by_std = b;
        }
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
