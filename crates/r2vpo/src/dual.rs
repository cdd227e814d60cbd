//! The dual variable λ: the strength of the ratio-variance penalty.
//!
//! R²VPO's Lagrangian (Eq. `primal_dual`) is minimised over λ ≥ 0 by
//! projected dual gradient descent (Eq. `lambda_update`):
//!
//! ```text
//! λ ← max(0, λ − η_λ (δ − E[(ρ_t − 1)²]))
//! ```
//!
//! When the measured constraint statistic exceeds the tolerance δ the penalty
//! grows; when the policy stays inside the trust region it decays, and the
//! projection stops it at exactly 0. In [`DualMode::Fixed`] λ is a plain
//! hyperparameter (the paper's control experiments use λ = 0.06).
//!
//! [`DualVariable`] is serialisable so a trainer can write it into its
//! checkpoint and resume with the same λ.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Whether λ is a constant or a Lagrange multiplier learnt by dual descent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DualMode {
    /// λ stays at `lambda0` for the whole run ("Fixed Regularization").
    Fixed,
    /// λ follows Eq. `lambda_update` ("Adaptive Lagrangian Tuning"); the
    /// paper's LLM setting.
    #[default]
    Adaptive,
}

/// Configuration of the dual variable (the `[dual]` table of a run config).
///
/// The default is the LLM column of the paper's hyperparameter table
/// (Appendix C): adaptive, λ₀ = 0, η_λ = 5·10⁻³, δ = 10⁻³.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DualConfig {
    /// Fixed or adaptive λ.
    pub mode: DualMode,
    /// Initial λ (the whole-run λ in [`DualMode::Fixed`]).
    pub lambda0: f64,
    /// Dual learning rate η_λ. Unused in [`DualMode::Fixed`].
    pub eta: f64,
    /// Target tolerance δ on E[(ρ − 1)²]. It enters the adaptive update only;
    /// in the loss it is a constant that does not change the gradient.
    pub delta: f64,
    /// Optional upper bound on λ. The paper has none; it is a safety valve
    /// for runs whose ratio statistic stays above δ for long stretches
    /// (λ would otherwise grow linearly without bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lambda_max: Option<f64>,
}

impl Default for DualConfig {
    fn default() -> Self {
        Self::llm_default()
    }
}

impl DualConfig {
    /// The paper's LLM setting (Appendix C, Part I): adaptive, λ₀ = 0,
    /// η_λ = 5·10⁻³, δ = 10⁻³, no upper bound.
    pub fn llm_default() -> Self {
        DualConfig { mode: DualMode::Adaptive, lambda0: 0.0, eta: 5e-3, delta: 1e-3, lambda_max: None }
    }

    /// The paper's continuous-control setting (Appendix C, Part II): a fixed
    /// λ = 0.06. η_λ and δ keep the LLM values so that switching `mode` to
    /// adaptive gives a sensible starting point rather than a zero rate.
    pub fn control_default() -> Self {
        DualConfig { mode: DualMode::Fixed, lambda0: 0.06, ..Self::llm_default() }
    }

    /// The initialisation written in the Algorithm 1/2 boxes: λ ← 0.04, with
    /// the adaptive update and the table's η_λ and δ.
    ///
    /// The boxes and the hyperparameter table disagree (0.04 vs 0.0 for the
    /// LLM runs); this is why λ₀ is a configuration option rather than a
    /// constant. Reproductions of the reported LLM numbers should use
    /// [`DualConfig::llm_default`].
    pub fn algorithm_box() -> Self {
        DualConfig { lambda0: 0.04, ..Self::llm_default() }
    }

    /// Checks ranges; errors name the field as `dual.<field>`.
    pub fn validate(&self) -> Result<()> {
        let err = |field: &str, message: String| Error::InvalidConfig { field: format!("dual.{field}"), message };
        if !(self.lambda0.is_finite() && self.lambda0 >= 0.0) {
            return Err(err(
                "lambda0",
                format!(
                    "must be finite and >= 0 (λ is a Lagrange multiplier of an inequality constraint), got {}",
                    self.lambda0
                ),
            ));
        }
        if !(self.delta.is_finite() && self.delta >= 0.0) {
            return Err(err("delta", format!("must be finite and >= 0, got {}", self.delta)));
        }
        if !(self.eta.is_finite() && self.eta >= 0.0) {
            return Err(err("eta", format!("must be finite and >= 0, got {}", self.eta)));
        }
        if self.mode == DualMode::Adaptive {
            if self.eta == 0.0 {
                return Err(err("eta", "must be > 0 in adaptive mode (use mode = \"fixed\" for a constant λ)".into()));
            }
            // E[(ρ−1)²] ≥ 0, so with δ = 0 the update can only ever raise λ.
            if self.delta == 0.0 {
                return Err(err("delta", "must be > 0 in adaptive mode; with δ = 0 λ can only grow".into()));
            }
        }
        if let Some(max) = self.lambda_max {
            if !(max.is_finite() && max >= 0.0) {
                return Err(err("lambda_max", format!("must be finite and >= 0, got {max}")));
            }
            if self.lambda0 > max {
                return Err(err("lambda_max", format!("must be >= lambda0 = {}, got {max}", self.lambda0)));
            }
        }
        Ok(())
    }
}

/// The current λ together with the settings that move it.
///
/// Serialisable so it can be stored in a checkpoint; a resumed run continues
/// from the saved λ and step count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "DualVariableRepr")]
pub struct DualVariable {
    cfg: DualConfig,
    lambda: f64,
    steps: u64,
}

/// The serialised form, checked before it becomes a [`DualVariable`] so a
/// hand-edited checkpoint cannot resume with a negative or out-of-bound λ.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DualVariableRepr {
    cfg: DualConfig,
    lambda: f64,
    steps: u64,
}

impl TryFrom<DualVariableRepr> for DualVariable {
    type Error = Error;

    fn try_from(r: DualVariableRepr) -> Result<Self> {
        r.cfg.validate()?;
        let in_range = r.lambda.is_finite() && r.lambda >= 0.0 && r.cfg.lambda_max.is_none_or(|m| r.lambda <= m);
        if !in_range {
            return Err(Error::InvalidConfig {
                field: "dual.lambda".into(),
                message: format!("checkpointed λ = {} is outside [0, lambda_max]", r.lambda),
            });
        }
        Ok(DualVariable { cfg: r.cfg, lambda: r.lambda, steps: r.steps })
    }
}

impl DualVariable {
    /// A dual variable at `cfg.lambda0`; fails if `cfg` does not validate.
    pub fn new(cfg: &DualConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(DualVariable { cfg: *cfg, lambda: cfg.lambda0, steps: 0 })
    }

    /// The current λ, to be used as a constant (no gradient) in the loss.
    pub fn value(&self) -> f64 {
        self.lambda
    }

    /// Number of successful [`DualVariable::update`] calls, in either mode,
    /// so the logged step axis is the same for fixed and adaptive runs.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The configuration this variable was built from.
    pub fn config(&self) -> &DualConfig {
        &self.cfg
    }

    /// One projected dual-descent step, Eq. `lambda_update`:
    /// λ ← max(0, λ − η_λ(δ − stat)), then clamped to `lambda_max` if set.
    /// Returns the new λ.
    ///
    /// `constraint_stat` is the batch estimate of E[(ρ_t − 1)²] measured with
    /// the ratios of the step just taken (detached). In [`DualMode::Fixed`]
    /// λ does not move.
    ///
    /// A non-finite statistic (or one that would make λ non-finite) returns
    /// an error and leaves λ and the step count unchanged: a single NaN
    /// batch must not poison the multiplier for the rest of the run. This is
    /// checked in fixed mode too, because a NaN ratio statistic means the
    /// update diverged whichever mode is in use.
    pub fn update(&mut self, constraint_stat: f64) -> Result<f64> {
        if !constraint_stat.is_finite() {
            return Err(Error::InvalidConfig {
                field: "dual.constraint_stat".into(),
                message: format!("E[(ρ−1)²] = {constraint_stat} is not finite; λ kept at {}", self.lambda),
            });
        }
        if self.cfg.mode == DualMode::Adaptive {
            let mut next = (self.lambda - self.cfg.eta * (self.cfg.delta - constraint_stat)).max(0.0);
            if let Some(max) = self.cfg.lambda_max {
                next = next.min(max);
            }
            if !next.is_finite() {
                return Err(Error::InvalidConfig {
                    field: "dual.constraint_stat".into(),
                    message: format!("E[(ρ−1)²] = {constraint_stat} would make λ overflow; λ kept at {}", self.lambda),
                });
            }
            self.lambda = next;
        }
        self.steps += 1;
        Ok(self.lambda)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-15 * (1.0 + b.abs())
    }

    #[test]
    fn presets_match_the_paper() {
        let llm = DualConfig::default();
        assert_eq!(llm, DualConfig::llm_default());
        assert_eq!(
            (llm.mode, llm.lambda0, llm.eta, llm.delta, llm.lambda_max),
            (DualMode::Adaptive, 0.0, 5e-3, 1e-3, None)
        );
        let ctl = DualConfig::control_default();
        assert_eq!((ctl.mode, ctl.lambda0), (DualMode::Fixed, 0.06));
        let bx = DualConfig::algorithm_box();
        assert_eq!((bx.mode, bx.lambda0), (DualMode::Adaptive, 0.04));
        for c in [llm, ctl, bx] {
            c.validate().unwrap();
        }
    }

    #[test]
    fn grows_when_constraint_is_violated() {
        // Default rates: each step adds η(stat − δ) = 5e-3·(0.011 − 0.001) = 5e-5.
        let mut d = DualVariable::new(&DualConfig::llm_default()).unwrap();
        assert_eq!(d.value(), 0.0);
        let l1 = d.update(0.011).unwrap();
        assert!(close(l1, 5e-5), "{l1}");
        let l2 = d.update(0.011).unwrap();
        assert!(close(l2, 1e-4), "{l2}");
        // stat = 0.201 → +5e-3·0.2 = 1e-3.
        let l3 = d.update(0.201).unwrap();
        assert!(close(l3, 1.1e-3), "{l3}");
        assert_eq!(d.steps(), 3);
    }

    #[test]
    fn stat_equal_to_delta_leaves_lambda_unchanged() {
        let mut d = DualVariable::new(&DualConfig::algorithm_box()).unwrap();
        assert_eq!(d.update(1e-3).unwrap(), 0.04);
    }

    #[test]
    fn decays_to_exactly_zero_and_stays_there() {
        // η = 0.5, δ = 0.25 and stat = 0 make every step subtract exactly
        // 0.125: 0.3 → 0.175 → 0.05 → max(0, −0.075) = 0 → 0.
        let cfg = DualConfig { mode: DualMode::Adaptive, lambda0: 0.3, eta: 0.5, delta: 0.25, lambda_max: None };
        let mut d = DualVariable::new(&cfg).unwrap();
        assert!(close(d.update(0.0).unwrap(), 0.175));
        assert!(close(d.update(0.0).unwrap(), 0.05));
        assert_eq!(d.update(0.0).unwrap(), 0.0);
        assert_eq!(d.update(0.0).unwrap(), 0.0);
        for _ in 0..100 {
            assert!(d.update(0.1).unwrap() >= 0.0);
        }
        assert_eq!(d.value(), 0.0);
        // A violation lifts it off zero again: 0 − 0.5·(0.25 − 0.45) = 0.1.
        assert!(close(d.update(0.45).unwrap(), 0.1));
    }

    #[test]
    fn fixed_never_moves() {
        let mut d = DualVariable::new(&DualConfig::control_default()).unwrap();
        for stat in [0.0, 1e-3, 10.0, 1e6] {
            assert_eq!(d.update(stat).unwrap(), 0.06);
        }
        assert_eq!(d.value(), 0.06);
        assert_eq!(d.steps(), 4);
    }

    #[test]
    fn lambda_max_caps_growth() {
        let cfg =
            DualConfig { lambda0: 0.0, eta: 1.0, delta: 0.1, lambda_max: Some(0.25), ..DualConfig::llm_default() };
        let mut d = DualVariable::new(&cfg).unwrap();
        // +1.0·(0.3 − 0.1) = 0.2, then 0.4 clamps to 0.25, and it stays there.
        assert!(close(d.update(0.3).unwrap(), 0.2));
        assert_eq!(d.update(0.3).unwrap(), 0.25);
        assert_eq!(d.update(0.3).unwrap(), 0.25);
        // Decay starts from the cap, not from the unclamped value.
        assert!(close(d.update(0.0).unwrap(), 0.15));
    }

    #[test]
    fn non_finite_stat_is_an_error_and_changes_nothing() {
        let mut d = DualVariable::new(&DualConfig::algorithm_box()).unwrap();
        d.update(0.5).unwrap();
        let before = d.clone();
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = d.update(bad).unwrap_err();
            assert!(e.to_string().contains("dual.constraint_stat"), "{e}");
            assert_eq!(d, before);
        }
        // Finite but overflowing.
        let mut big = DualVariable::new(&DualConfig { eta: 1e300, ..DualConfig::llm_default() }).unwrap();
        assert!(big.update(1e300).is_err());
        assert_eq!(big.value(), 0.0);
        assert_eq!(big.steps(), 0);
        // Fixed mode rejects it too.
        let mut f = DualVariable::new(&DualConfig::control_default()).unwrap();
        assert!(f.update(f64::NAN).is_err());
        assert_eq!(f.steps(), 0);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |c: DualConfig, field: &str| {
            let e = c.validate().unwrap_err();
            match &e {
                Error::InvalidConfig { field: f, .. } => assert_eq!(f, field, "{e}"),
                other => panic!("unexpected {other:?}"),
            }
            assert!(DualVariable::new(&c).is_err());
        };
        let d = DualConfig::llm_default();
        bad(DualConfig { lambda0: -0.1, ..d }, "dual.lambda0");
        bad(DualConfig { lambda0: f64::NAN, ..d }, "dual.lambda0");
        bad(DualConfig { eta: 0.0, ..d }, "dual.eta");
        bad(DualConfig { eta: -1.0, ..d }, "dual.eta");
        bad(DualConfig { delta: 0.0, ..d }, "dual.delta");
        bad(DualConfig { delta: f64::INFINITY, ..d }, "dual.delta");
        bad(DualConfig { lambda_max: Some(-1.0), ..d }, "dual.lambda_max");
        bad(DualConfig { lambda0: 0.5, lambda_max: Some(0.1), ..d }, "dual.lambda_max");
        // η = 0 and δ = 0 are harmless when λ is fixed.
        DualConfig { eta: 0.0, delta: 0.0, ..DualConfig::control_default() }.validate().unwrap();
    }

    #[test]
    fn serde_round_trip_of_state_and_config() {
        let cfg = DualConfig { lambda_max: Some(2.0), ..DualConfig::algorithm_box() };
        let mut d = DualVariable::new(&cfg).unwrap();
        d.update(0.3).unwrap();
        d.update(0.002).unwrap();
        let json = serde_json::to_string(&d).unwrap();
        let mut back: DualVariable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
        // The restored variable continues exactly like the original.
        assert_eq!(back.update(0.07).unwrap().to_bits(), d.update(0.07).unwrap().to_bits());
        assert_eq!(back.steps(), 3);
        // A checkpoint whose λ breaks the invariants does not load.
        let mut v: serde_json::Value = serde_json::to_value(&d).unwrap();
        v["lambda"] = (-0.5).into();
        assert!(serde_json::from_value::<DualVariable>(v.clone()).is_err());
        v["lambda"] = 3.0.into();
        assert!(serde_json::from_value::<DualVariable>(v.clone()).is_err());
        v["lambda"] = 1.0.into();
        v["cfg"]["eta"] = 0.0.into();
        assert!(serde_json::from_value::<DualVariable>(v).is_err());
    }

    #[test]
    fn config_from_toml_table() {
        #[derive(Deserialize)]
        struct Run {
            dual: DualConfig,
        }
        let r: Run = toml::from_str("[dual]\nmode = \"fixed\"\nlambda0 = 0.06\n").unwrap();
        assert_eq!(r.dual, DualConfig::control_default());
        let r: Run = toml::from_str("[dual]\nlambda_max = 1.5\n").unwrap();
        assert_eq!(r.dual, DualConfig { lambda_max: Some(1.5), ..DualConfig::llm_default() });
        assert!(toml::from_str::<Run>("[dual]\nlamda0 = 0.1\n").is_err());
        // Serialising the default omits the absent bound and round-trips.
        let s = toml::to_string(&DualConfig::default()).unwrap();
        assert!(!s.contains("lambda_max"));
        assert_eq!(toml::from_str::<DualConfig>(&s).unwrap(), DualConfig::default());
    }
}
