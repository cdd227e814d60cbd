//! The optimizer's configuration, the same for every backend (`[optim]`
//! of a training config): AdamW with warmup and gradient-norm clipping.
//! Each backend implements the update its own way (candle's
//! [`crate::backend::candle::adamw`], the torch backend's fused kernel).

use serde::{Deserialize, Serialize};

/// AdamW with warmup and gradient-norm clipping: the optimizer of every
/// backend (`[optim]` of a training config).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// Peak learning rate (the paper: 1e-6 for 1.7B–8B models).
    pub lr: f64,
    /// Adam β₁.
    pub beta1: f64,
    /// Adam β₂.
    pub beta2: f64,
    /// Adam ε.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only: 1-D tensors (norm
    /// weights, biases) are excluded, as in Hugging Face's trainer.
    pub weight_decay: f64,
    /// Optimizer steps of linear warmup from 0 to `lr`; constant after.
    pub warmup_steps: u64,
    /// Clip the global gradient L2 norm to this value (0 = off).
    pub grad_clip: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self { lr: 1e-6, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, warmup_steps: 0, grad_clip: 1.0 }
    }
}

impl OptimConfig {
    /// The learning rate of step `step` (counted from 0): linear warmup,
    /// then constant.
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.warmup_steps == 0 || step >= self.warmup_steps {
            self.lr
        } else {
            self.lr * (step + 1) as f64 / self.warmup_steps as f64
        }
    }

    /// Checks every field: `(field, what is wrong)` for the first bad one.
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        let finite_positive = |x: f64| x.is_finite() && x > 0.0;
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        for (k, v, ok, rule) in [
            ("lr", self.lr, finite_positive(self.lr), "must be positive"),
            ("beta1", self.beta1, (0.0..1.0).contains(&self.beta1), "must lie in [0, 1)"),
            ("beta2", self.beta2, (0.0..1.0).contains(&self.beta2), "must lie in [0, 1)"),
            ("eps", self.eps, finite_positive(self.eps), "must be positive"),
            ("weight_decay", self.weight_decay, non_negative(self.weight_decay), "must be non-negative"),
            ("grad_clip", self.grad_clip, non_negative(self.grad_clip), "must be non-negative (0 = off)"),
        ] {
            if !ok {
                return Err((k, format!("{rule}, got {v}")));
            }
        }
        Ok(())
    }

    /// The factor that scales gradients of global norm `norm` down to
    /// `grad_clip` (1 when they are within it, or clipping is off).
    pub fn clip_scale(&self, norm: f64) -> f64 {
        if self.grad_clip > 0.0 && norm > self.grad_clip {
            self.grad_clip / norm
        } else {
            1.0
        }
    }
}
