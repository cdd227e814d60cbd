//! The learner contract every trainer shares: an objective and its dual
//! variable, wired the same way whether the gradients come from candle
//! autograd (LLM, toy) or a hand-written backward pass (control).
//!
//! One optimizer step is:
//! 1. [`Learner::loss`] on each micro-batch, all normalised by the step's
//!    [`GlobalBatch`] and all at the same λ;
//! 2. the trainer's backward pass and optimizer update;
//! 3. [`Learner::after_step`] with the micro-batches' statistics: they are
//!    pooled ([`RatioStats::merge`]) and λ moves once, by the dual update
//!    (Eq. λ update), only for objectives that have a λ
//!    ([`ObjectiveKind::uses_lambda`](crate::objective::ObjectiveKind::uses_lambda)),
//!    so baselines log a constant rather than a multiplier acting on nothing.
//!
//! A step whose loss or gradient is not finite skips step 3: λ must not
//! learn from a step that was not taken.

use crate::aggregate::GlobalBatch;
use crate::dual::{DualConfig, DualVariable};
use crate::objective::{ObjectiveConfig, ObjectiveOutput, PolicyBatch, RatioStats};
use crate::Result;

/// An objective with its penalty coefficient λ (fixed or adaptive).
#[derive(Clone, Debug)]
pub struct Learner {
    objective: ObjectiveConfig,
    dual: DualVariable,
}

impl Learner {
    /// A learner at λ = `dual.lambda0`; both configs are validated.
    pub fn new(objective: ObjectiveConfig, dual: &DualConfig) -> Result<Self> {
        Self::with_dual(objective, DualVariable::new(dual)?)
    }

    /// A learner resuming a saved dual variable (its value and step count).
    pub fn with_dual(objective: ObjectiveConfig, dual: DualVariable) -> Result<Self> {
        objective.validate()?;
        Ok(Learner { objective, dual })
    }

    /// The objective being optimised.
    pub fn objective(&self) -> &ObjectiveConfig {
        &self.objective
    }

    /// The dual variable (for checkpoints and diagnostics).
    pub fn dual(&self) -> &DualVariable {
        &self.dual
    }

    /// The current λ.
    pub fn lambda(&self) -> f64 {
        self.dual.value()
    }

    /// The loss of one micro-batch at the current λ, normalised by the whole
    /// step's `global` totals (the objective's Eq. primal–dual, or the
    /// baseline's).
    pub fn loss(&self, batch: &PolicyBatch, global: &GlobalBatch) -> Result<ObjectiveOutput> {
        self.objective.loss(batch, self.dual.value(), global)
    }

    /// Closes an optimizer step that was taken: pools the micro-batches'
    /// statistics and, for objectives with a λ, applies the dual update to
    /// the pooled constraint statistic. Returns the pooled statistics.
    pub fn after_step(&mut self, parts: &[RatioStats]) -> Result<RatioStats> {
        let merged = RatioStats::merge(parts);
        if self.objective.kind.uses_lambda() {
            self.dual.update(merged.constraint)?;
        }
        Ok(merged)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::dual::DualMode;

    fn stats(constraint: f64) -> RatioStats {
        RatioStats { tokens: 3.0, constraint, sq_dev_mean: constraint, ..RatioStats::default() }
    }

    #[test]
    fn lambda_moves_only_for_objectives_that_have_one() {
        let dual = DualConfig { mode: DualMode::Adaptive, lambda0: 0.0, eta: 1.0, delta: 0.1, lambda_max: None };
        for name in crate::algo::names() {
            let obj = ObjectiveConfig::preset(name).unwrap();
            let mut l = Learner::new(obj.clone(), &dual).unwrap();
            l.after_step(&[stats(0.5)]).unwrap();
            let moved = l.lambda() != 0.0;
            assert_eq!(moved, obj.kind.uses_lambda(), "{name}");
            if moved {
                // λ ← max(0, λ − η(δ − E[(ρ−1)²])) = 0 − 1·(0.1 − 0.5)
                assert!((l.lambda() - 0.4).abs() < 1e-15);
            }
        }
    }

    #[test]
    fn merging_one_part_is_the_identity() {
        let s = RatioStats { tokens: 7.0, ratio_mean: 0.1, ratio_var: 0.3, constraint: 0.1, ..RatioStats::default() };
        assert_eq!(RatioStats::merge(std::slice::from_ref(&s)), s);
    }

    #[test]
    fn loss_uses_the_current_lambda() {
        let dev = Device::Cpu;
        let logp = Tensor::new(&[[-0.5f32, -1.0]], &dev).unwrap();
        let old = Tensor::new(&[[-1.0f32, -1.0]], &dev).unwrap();
        let adv = Tensor::new(&[[1.0f32, -1.0]], &dev).unwrap();
        let mask = Tensor::ones((1, 2), candle_core::DType::F32, &dev).unwrap();
        let b = PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &mask, weights: None };
        let g = GlobalBatch::from_mask(&mask).unwrap();
        let cfg = DualConfig { mode: DualMode::Fixed, lambda0: 0.5, ..DualConfig::default() };
        let l = Learner::new(ObjectiveConfig::default(), &cfg).unwrap();
        let want = ObjectiveConfig::default().loss(&b, 0.5, &g).unwrap().loss.to_scalar::<f32>().unwrap();
        assert_eq!(l.loss(&b, &g).unwrap().loss.to_scalar::<f32>().unwrap(), want);
    }
}
