//! Adam's per-element arithmetic (Kingma & Ba 2015; decoupled weight decay,
//! Loshchilov & Hutter 2019), shared by the control networks' optimizer and
//! the LLM learner's candle AdamW so the two cannot drift apart. Each
//! caller owns its moments, clipping and parameter layout.
//!
//! The form is PyTorch's `torch.optim.Adam(W)` (non-fused): the bias
//! corrections enter as `lr/c₁` and `√v/√c₂`, not as `√(v/c₂)` (optax's);
//! the two differ by rounding only. Every operation is f32, in a fixed
//! order, so a seeded run's bits do not depend on the caller.

/// The coefficients of one step `t` (counted from 1), in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// `lr / (1 − β₁ᵗ)`.
    pub step: f32,
    /// `√(1 − β₂ᵗ)`.
    pub c2_sqrt: f32,
    /// β₁.
    pub beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// ε, added to `√v/√c₂`.
    pub eps: f32,
    /// The factor a decayed parameter is multiplied by first, `1 − lr·wd`
    /// (1 without decay).
    pub decay: f32,
    /// The factor each gradient is multiplied by first (a clipping scale).
    pub grad_scale: f32,
}

impl AdamStep {
    /// Step `t` (≥ 1) with learning rate `lr`, β₁, β₂, ε, decoupled weight
    /// decay `weight_decay` (0 = none) and gradients scaled by `grad_scale`.
    /// The corrections are computed in f64 and rounded once.
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, t: u64, weight_decay: f64, grad_scale: f64) -> Self {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let c1 = 1.0 - beta1.powi(t);
        let c2 = 1.0 - beta2.powi(t);
        AdamStep {
            step: (lr / c1) as f32,
            c2_sqrt: c2.sqrt() as f32,
            beta1: beta1 as f32,
            beta2: beta2 as f32,
            eps: eps as f32,
            decay: (1.0 - lr * weight_decay) as f32,
            grad_scale: grad_scale as f32,
        }
    }

    /// The new first moment: `β₁·m + (1 − β₁)·(s·g)`.
    #[inline(always)]
    pub fn first(&self, m: f32, g: f32) -> f32 {
        self.beta1 * m + (1.0 - self.beta1) * (g * self.grad_scale)
    }

    /// The new second moment: `β₂·v + (1 − β₂)·(s·g)·(s·g)`.
    #[inline(always)]
    pub fn second(&self, v: f32, g: f32) -> f32 {
        let h = g * self.grad_scale;
        self.beta2 * v + (1.0 - self.beta2) * h * h
    }

    /// The new parameter from the new moments: `d·w − (lr/c₁)·m / (√v/√c₂ + ε)`.
    #[inline(always)]
    pub fn param(&self, w: f32, m: f32, v: f32) -> f32 {
        self.decay * w - self.step * m / (v.sqrt() / self.c2_sqrt + self.eps)
    }

    /// One parameter's whole update in place: both moments, then the
    /// parameter (a loop that vectorises).
    pub fn apply(&self, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = self.first(*m, g);
            *v = self.second(*v, g);
            *w = self.param(*w, *m, *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step against the formula in f64: after the first step m̂ = g,
    /// v̂ = g², so the update is lr·g/(|g| + ε).
    #[test]
    fn the_first_step_moves_each_weight_by_lr_times_the_sign() {
        let s = AdamStep::new(0.1, 0.9, 0.999, 1e-8, 1, 0.0, 0.5);
        let (mut w, g) = (vec![1.0f32, -2.0, 0.5], vec![0.2f32, -0.4, 0.0]);
        let (mut m, mut v) = (vec![0f32; 3], vec![0f32; 3]);
        s.apply(&mut w, &g, &mut m, &mut v);
        for (got, (w0, g)) in w.iter().zip([(1.0f64, 0.1f64), (-2.0, -0.2), (0.5, 0.0)]) {
            let want = w0 - 0.1 * g / (g.abs() + 1e-8);
            assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
        }
        let d = AdamStep::new(0.1, 0.9, 0.999, 1e-8, 1, 0.1, 1.0);
        assert_eq!(d.decay, 0.99);
        assert_eq!(d.param(2.0, 0.0, 0.0), 1.98);
    }
}
