//! Adam with checkpointable moments.

use r2vpo::adam::{AdamForm, AdamStep};

use super::*;

/// Adam (Kingma & Ba) on flat f32 buffers, with moments that can be
/// checkpointed (candle_nn's `AdamW` keeps them private); the arithmetic
/// is the core's [`AdamStep`] in PyTorch's arrangement ([`AdamForm::Folded`]).
#[derive(Debug, Clone)]
pub struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    pub(super) t: u64,
    pub(super) m: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
}

impl Adam {
    /// Zero moments for `params`.
    pub fn new(params: &[(String, Var)], lr: f64, beta1: f64, beta2: f64, eps: f64) -> Self {
        let zeros = || params.iter().map(|(_, p)| vec![0f32; p.elem_count()]).collect();
        Self { lr, beta1, beta2, eps, t: 0, m: zeros(), v: zeros() }
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// One step: gradients are scaled by `min(1, max_norm / ‖g‖)` when
    /// `max_norm > 0` (‖g‖ over all parameters together). Returns ‖g‖ before
    /// clipping. Parameters without a gradient get a zero gradient.
    pub fn step(&mut self, params: &[(String, Var)], grads: &GradStore, max_norm: f64) -> TrainResult<f64> {
        let mut gs = Vec::with_capacity(params.len());
        let mut ws = Vec::with_capacity(params.len());
        for (_, p) in params {
            gs.push(match grads.get(p.as_tensor()) {
                Some(g) => g.flatten_all()?.to_vec1::<f32>()?,
                None => vec![0f32; p.elem_count()],
            });
            ws.push(p.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        let norm = self.step_flat(&mut ws.iter_mut().collect::<Vec<_>>(), &gs, max_norm);
        for ((_, p), w) in params.iter().zip(ws) {
            p.set(&Tensor::from_vec(w, p.shape(), &Device::Cpu)?)?;
        }
        Ok(norm)
    }

    /// [`Adam::step`] on flat buffers: `params[i]` and `grads[i]` pair with
    /// the `i`-th parameter given to [`Adam::new`]. Returns ‖g‖ before
    /// clipping; a non-finite norm leaves everything untouched.
    pub fn step_flat(&mut self, params: &mut [&mut Vec<f32>], grads: &[Vec<f32>], max_norm: f64) -> f64 {
        let sq: f64 = grads.iter().flatten().map(|&x| f64::from(x) * f64::from(x)).sum();
        let norm = sq.sqrt();
        if !norm.is_finite() {
            return norm;
        }
        // PyTorch's clip_grad_norm_ (CleanRL's): max / (‖g‖ + 1e-6).
        let scale = if max_norm > 0.0 && norm > max_norm { max_norm / (norm + 1e-6) } else { 1.0 };
        self.t += 1;
        let step = AdamStep::new(AdamForm::Folded, self.lr, self.beta1, self.beta2, self.eps, self.t, 0.0, scale);
        for ((w, g), (m, v)) in params.iter_mut().zip(grads).zip(self.m.iter_mut().zip(self.v.iter_mut())) {
            step.apply(w, g, m, v);
        }
        norm
    }
}
