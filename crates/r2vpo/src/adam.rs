//! Adam's per-element arithmetic (Kingma & Ba 2015; decoupled weight decay,
//! Loshchilov & Hutter 2019), shared by the control networks' optimizer and
//! the LLM learner's candle AdamW so the two cannot drift apart. Each
//! caller owns its moments, clipping and parameter layout.
//!
//! Two arrangements of the same update, which differ by rounding only
//! ([`AdamForm`]): the bias corrections folded into the step and the
//! denominator, `lr/c₁ · m / (√v/√c₂ + ε)`, as `torch.optim.Adam(W)`
//! computes it; or applied to the moments first, `lr · (m/c₁) / (√(v/c₂) +
//! ε)`, as optax does. Each domain keeps the form its seeded runs were
//! pinned with. Every operation is f32, in a fixed order, so a run's bits
//! do not depend on the caller.

/// Where the bias corrections `c₁ = 1 − β₁ᵗ`, `c₂ = 1 − β₂ᵗ` enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdamForm {
    /// `d·w − (lr/c₁)·m / (√v/√c₂ + ε)`: PyTorch's (the control networks').
    Folded,
    /// `d·w − lr·((m·(1/c₁)) / (√(v·(1/c₂)) + ε))`: optax's arrangement, with
    /// the corrections as reciprocals (the LLM learner's candle AdamW).
    Corrected,
}

/// The coefficients of one step `t` (counted from 1), in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// The arrangement.
    pub form: AdamForm,
    /// The learning rate.
    pub lr: f32,
    /// `lr / c₁` ([`AdamForm::Folded`]).
    pub step: f32,
    /// `√c₂` ([`AdamForm::Folded`]).
    pub c2_sqrt: f32,
    /// `1 / c₁` and `1 / c₂` ([`AdamForm::Corrected`]).
    pub inv_c: (f32, f32),
    /// `1 − β₁` and `1 − β₂`, each computed in f64 and rounded once.
    pub fresh: (f32, f32),
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
    /// Step `t` (≥ 1) in `form` with learning rate `lr`, β₁, β₂, ε,
    /// decoupled weight decay `weight_decay` (0 = none) and gradients scaled
    /// by `grad_scale`. The corrections are computed in f64 and rounded
    /// once.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        form: AdamForm,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        t: u64,
        weight_decay: f64,
        grad_scale: f64,
    ) -> Self {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let c1 = 1.0 - beta1.powi(t);
        let c2 = 1.0 - beta2.powi(t);
        AdamStep {
            form,
            lr: lr as f32,
            step: (lr / c1) as f32,
            c2_sqrt: c2.sqrt() as f32,
            inv_c: ((1.0 / c1) as f32, (1.0 / c2) as f32),
            fresh: ((1.0 - beta1) as f32, (1.0 - beta2) as f32),
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
        match self.form {
            AdamForm::Folded => self.beta1 * m + (1.0 - self.beta1) * (g * self.grad_scale),
            AdamForm::Corrected => m * self.beta1 + (g * self.grad_scale) * self.fresh.0,
        }
    }

    /// The new second moment: `β₂·v + (1 − β₂)·(s·g)²`.
    #[inline(always)]
    pub fn second(&self, v: f32, g: f32) -> f32 {
        let h = g * self.grad_scale;
        match self.form {
            AdamForm::Folded => self.beta2 * v + (1.0 - self.beta2) * h * h,
            AdamForm::Corrected => v * self.beta2 + (h * h) * self.fresh.1,
        }
    }

    /// The new parameter from the new moments (the form's arrangement).
    #[inline(always)]
    pub fn param(&self, w: f32, m: f32, v: f32) -> f32 {
        match self.form {
            AdamForm::Folded => self.decay * w - self.step * m / (v.sqrt() / self.c2_sqrt + self.eps),
            AdamForm::Corrected => {
                let upd = (m * self.inv_c.0) / ((v * self.inv_c.1).sqrt() + self.eps);
                self.decay * w - upd * self.lr
            }
        }
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
        for form in [AdamForm::Folded, AdamForm::Corrected] {
            let s = AdamStep::new(form, 0.1, 0.9, 0.999, 1e-8, 1, 0.0, 0.5);
            let (mut w, g) = (vec![1.0f32, -2.0, 0.5], vec![0.2f32, -0.4, 0.0]);
            let (mut m, mut v) = (vec![0f32; 3], vec![0f32; 3]);
            s.apply(&mut w, &g, &mut m, &mut v);
            for (got, (w0, g)) in w.iter().zip([(1.0f64, 0.1f64), (-2.0, -0.2), (0.5, 0.0)]) {
                let want = w0 - 0.1 * g / (g.abs() + 1e-8);
                assert!((f64::from(*got) - want).abs() < 1e-6, "{form:?}: {got} vs {want}");
            }
            let d = AdamStep::new(form, 0.1, 0.9, 0.999, 1e-8, 1, 0.1, 1.0);
            assert_eq!(d.decay, 0.99);
            assert_eq!(d.param(2.0, 0.0, 0.0), 1.98);
        }
    }
}
