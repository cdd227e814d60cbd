//! AdamW over the model's `Var`s with state that can be checkpointed
//! (candle-nn's `AdamW` keeps its moments private and decays every tensor,
//! norms included).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor, Var};

use super::config::OptimConfig;
use super::{TrainError, TrainResult};

/// Decoupled-weight-decay Adam (Loshchilov & Hutter) with bias correction.
pub struct AdamW {
    names: Vec<String>,
    vars: Vec<Var>,
    decay: Vec<bool>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    t: u64,
    cfg: OptimConfig,
}

impl AdamW {
    /// Moments start at zero. Tensors of rank < 2 (norm weights, biases) get
    /// no weight decay.
    pub fn new(params: Vec<(String, Var)>, cfg: OptimConfig) -> TrainResult<Self> {
        let mut s = Self { names: vec![], vars: vec![], decay: vec![], m: vec![], v: vec![], t: 0, cfg };
        for (name, var) in params {
            s.decay.push(var.as_tensor().rank() >= 2);
            s.m.push(var.as_tensor().zeros_like()?);
            s.v.push(var.as_tensor().zeros_like()?);
            s.names.push(name);
            s.vars.push(var);
        }
        Ok(s)
    }

    /// The parameters, in the order `step` expects their gradients.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Parameter names (Hugging Face names), aligned with [`AdamW::vars`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// The learning rate of the next step: linear warmup, then constant.
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.cfg.warmup_steps == 0 || step >= self.cfg.warmup_steps {
            self.cfg.lr
        } else {
            self.cfg.lr * (step + 1) as f64 / self.cfg.warmup_steps as f64
        }
    }

    /// The factor that scales gradients of global norm `norm` down to
    /// `grad_clip` (1 when they are within it, or clipping is off).
    pub fn clip_scale(&self, norm: f64) -> f64 {
        let clip = self.cfg.grad_clip;
        if clip > 0.0 && norm > clip {
            clip / norm
        } else {
            1.0
        }
    }

    /// One update with `grads[i]` for `vars()[i]` (`None`: no gradient, the
    /// parameter only decays) scaled by `grad_scale` (the clipping factor).
    /// Returns the learning rate used.
    pub fn step(&mut self, grads: &[Option<Tensor>], grad_scale: f64) -> TrainResult<f64> {
        if grads.len() != self.vars.len() {
            let msg = format!("{} gradients for {} parameters", grads.len(), self.vars.len());
            return Err(candle_core::Error::Msg(msg).into());
        }
        let lr = self.lr_at(self.t);
        self.t += 1;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let bc2 = 1.0 - b2.powi(self.t as i32);
        for (i, grad) in grads.iter().enumerate() {
            let w = self.vars[i].as_tensor().detach();
            let mut new_w = if self.decay[i] && self.cfg.weight_decay > 0.0 {
                w.affine(1.0 - lr * self.cfg.weight_decay, 0.0)?
            } else {
                w.clone()
            };
            if let Some(g) = grad {
                let g = g.detach().affine(grad_scale, 0.0)?;
                self.m[i] = self.m[i].affine(b1, 0.0)?.add(&g.affine(1.0 - b1, 0.0)?)?;
                self.v[i] = self.v[i].affine(b2, 0.0)?.add(&g.sqr()?.affine(1.0 - b2, 0.0)?)?;
                let denom = self.v[i].affine(1.0 / bc2, 0.0)?.sqrt()?.affine(1.0, self.cfg.eps)?;
                let upd = self.m[i].affine(1.0 / bc1, 0.0)?.div(&denom)?;
                new_w = new_w.sub(&upd.affine(lr, 0.0)?)?;
            }
            self.vars[i].set(&new_w)?;
        }
        Ok(lr)
    }

    /// Writes the moments as safetensors (`m.<name>`, `v.<name>`).
    pub fn save(&self, path: &Path) -> TrainResult<()> {
        let mut map: HashMap<String, Tensor> = HashMap::new();
        for (i, n) in self.names.iter().enumerate() {
            map.insert(format!("m.{n}"), self.m[i].clone());
            map.insert(format!("v.{n}"), self.v[i].clone());
        }
        candle_core::safetensors::save(&map, path)
            .map_err(|e| TrainError::Checkpoint { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Restores moments written by [`AdamW::save`] and the step count.
    pub fn load(&mut self, path: &Path, steps: u64) -> TrainResult<()> {
        let err = |m: String| TrainError::Checkpoint { path: path.to_path_buf(), message: m };
        let map = candle_core::safetensors::load(path, &candle_core::Device::Cpu).map_err(|e| err(e.to_string()))?;
        for (i, n) in self.names.iter().enumerate() {
            for (pre, slot) in [("m", &mut self.m[i]), ("v", &mut self.v[i])] {
                let t = map.get(&format!("{pre}.{n}")).ok_or_else(|| err(format!("missing `{pre}.{n}`")))?;
                if t.dims() != slot.dims() {
                    return Err(err(format!("`{pre}.{n}` has shape {:?}, model has {:?}", t.dims(), slot.dims())));
                }
                *slot = t.to_dtype(DType::F32)?.to_device(slot.device())?;
            }
        }
        self.t = steps;
        Ok(())
    }
}

/// Global L2 norm of a set of gradients, in f64 (`NaN`/`inf` propagate so
/// the caller can refuse the step).
pub fn global_norm(grads: &[Option<Tensor>]) -> TrainResult<f64> {
    let mut sq = 0.0f64;
    for g in grads.iter().flatten() {
        sq += g.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    }
    Ok(sq.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// One step against a hand-computed AdamW update, with and without decay.
    #[test]
    fn adamw_matches_hand_computation() {
        let dev = Device::Cpu;
        let w = Var::from_vec(vec![1.0f32, -2.0, 0.5, 3.0], (2, 2), &dev).unwrap();
        let b = Var::from_vec(vec![0.5f32, -0.5], 2, &dev).unwrap();
        let cfg = OptimConfig { lr: 0.1, weight_decay: 0.1, ..OptimConfig::default() };
        let mut opt = AdamW::new(vec![("w".into(), w.clone()), ("b".into(), b.clone())], cfg).unwrap();
        let gw = Tensor::from_vec(vec![0.2f32, -0.4, 0.0, 1.0], (2, 2), &dev).unwrap();
        let gb = Tensor::from_vec(vec![1.0f32, 2.0], 2, &dev).unwrap();
        opt.step(&[Some(gw), Some(gb)], 0.5).unwrap();
        // After one step m̂ = g', v̂ = g'² ⇒ update = sign(g')·|g'|/(|g'|+ε).
        let wv: Vec<f32> = w.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let want = |w0: f32, g: f32, decay: bool| {
            let g = g * 0.5;
            let d = if decay { w0 * (1.0 - 0.1 * 0.1) } else { w0 };
            d - 0.1 * g / (g.abs() + 1e-8)
        };
        for (got, (w0, g)) in wv.iter().zip([(1.0, 0.2), (-2.0, -0.4), (0.5, 0.0), (3.0, 1.0)]) {
            assert!((got - want(w0, g, true)).abs() < 1e-6, "{got} vs {}", want(w0, g, true));
        }
        let bv: Vec<f32> = b.as_tensor().to_vec1().unwrap();
        assert!((bv[0] - want(0.5, 1.0, false)).abs() < 1e-6);
        assert!((bv[1] - want(-0.5, 2.0, false)).abs() < 1e-6);
    }

    #[test]
    fn warmup_is_linear_then_constant() {
        let dev = Device::Cpu;
        let w = Var::zeros((2, 2), DType::F32, &dev).unwrap();
        let opt =
            AdamW::new(vec![("w".into(), w)], OptimConfig { lr: 1.0, warmup_steps: 4, ..Default::default() }).unwrap();
        let lrs: Vec<f64> = (0..6).map(|s| opt.lr_at(s)).collect();
        assert_eq!(lrs, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn global_norm_propagates_nan() {
        let dev = Device::Cpu;
        let g = Tensor::from_vec(vec![3.0f32, 4.0], 2, &dev).unwrap();
        assert!((global_norm(&[Some(g.clone()), None]).unwrap() - 5.0).abs() < 1e-12);
        let bad = Tensor::from_vec(vec![f32::NAN, 1.0], 2, &dev).unwrap();
        assert!(global_norm(&[Some(g), Some(bad)]).unwrap().is_nan());
    }
}
