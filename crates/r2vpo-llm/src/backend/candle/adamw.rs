//! AdamW over the candle model's `Var`s with state that can be checkpointed
//! (candle-nn's `AdamW` keeps its moments private and decays every tensor,
//! norms included). The arithmetic is the core's [`AdamStep`] (shared with
//! the control networks' Adam) in optax's arrangement,
//! [`AdamForm::Corrected`].

use std::collections::HashMap;
use std::path::Path;

use candle_core::{CpuStorage, DType, Layout, Tensor, Var};
use rayon::prelude::*;

use r2vpo::adam::{AdamForm, AdamStep};

use crate::backend::OptimConfig;
use crate::model::{ModelError, Result};

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
    pub fn new(params: Vec<(String, Var)>, cfg: OptimConfig) -> Result<Self> {
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

    /// The learning rate of step `step`: [`OptimConfig::lr_at`].
    pub fn lr_at(&self, step: u64) -> f64 {
        self.cfg.lr_at(step)
    }

    /// One update with `grads[i]` for `vars()[i]` (`None`: no gradient, the
    /// parameter only decays) scaled by `grad_scale` (the clipping factor).
    /// Returns the learning rate used.
    pub fn step(&mut self, grads: &[Option<Tensor>], grad_scale: f64) -> Result<f64> {
        self.step_with(grads, grad_scale, true)
    }

    /// [`AdamW::step`], in place where the tensors allow it (contiguous f32
    /// on the CPU: three passes per parameter, nothing allocated) or else by
    /// candle ops (a dozen passes and tensors per parameter; any device).
    fn step_with(&mut self, grads: &[Option<Tensor>], grad_scale: f64, in_place: bool) -> Result<f64> {
        if grads.len() != self.vars.len() {
            let msg = format!("{} gradients for {} parameters", grads.len(), self.vars.len());
            return Err(candle_core::Error::Msg(msg).into());
        }
        let lr = self.lr_at(self.t);
        self.t += 1;
        let c = &self.cfg;
        // The arrangement this learner's pinned runs were recorded with.
        let form = AdamForm::Corrected;
        let decayed = AdamStep::new(form, lr, c.beta1, c.beta2, c.eps, self.t, c.weight_decay, grad_scale);
        let plain = AdamStep::new(form, lr, c.beta1, c.beta2, c.eps, self.t, 0.0, grad_scale);
        for (i, grad) in grads.iter().enumerate() {
            let w = self.vars[i].as_tensor();
            let decays = self.decay[i] && c.weight_decay > 0.0;
            let step = if decays { decayed } else { plain };
            if let Some(g) = grad.as_ref().filter(|g| in_place && in_place_ok(&[w, g, &self.m[i], &self.v[i]])) {
                let g = g.contiguous()?;
                self.m[i].inplace_op2(&g, &Moment { step, second: false })?;
                self.v[i].inplace_op2(&g, &Moment { step, second: true })?;
                w.inplace_op3(&self.m[i], &self.v[i], &Update(step))?;
                continue;
            }
            // The same arithmetic by candle ops, operation for operation in
            // f32 (the coefficients are the step's f32 values), so both paths
            // give the same bits (tested).
            let f = f64::from;
            let w = w.detach();
            let Some(g) = grad else {
                // No gradient: the parameter only decays (`Var::set` refuses
                // the var's own value, so a plain one is left alone).
                if decays {
                    self.vars[i].set(&w.affine(f(step.decay), 0.0)?)?;
                }
                continue;
            };
            let h = g.detach().affine(f(step.grad_scale), 0.0)?;
            self.m[i] = self.m[i].affine(f(step.beta1), 0.0)?.add(&h.affine(f(step.fresh.0), 0.0)?)?;
            self.v[i] = self.v[i].affine(f(step.beta2), 0.0)?.add(&h.sqr()?.affine(f(step.fresh.1), 0.0)?)?;
            let denom = self.v[i].affine(f(step.inv_c.1), 0.0)?.sqrt()?.affine(1.0, f(step.eps))?;
            let upd = self.m[i].affine(f(step.inv_c.0), 0.0)?.div(&denom)?.affine(f(step.lr), 0.0)?;
            let base = if decays { w.affine(f(step.decay), 0.0)? } else { w };
            self.vars[i].set(&base.sub(&upd)?)?;
        }
        Ok(lr)
    }

    /// Writes the moments as safetensors (`m.<name>`, `v.<name>`).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = HashMap::new();
        for (i, n) in self.names.iter().enumerate() {
            map.insert(format!("m.{n}"), self.m[i].clone());
            map.insert(format!("v.{n}"), self.v[i].clone());
        }
        candle_core::safetensors::save(&map, path)
            .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Restores moments written by [`AdamW::save`] and the step count.
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<()> {
        let err = |m: String| ModelError::Format { path: path.to_path_buf(), message: m };
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

/// Whether the update can run in place: contiguous f32 on the CPU.
fn in_place_ok(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous())
}

/// One moment of [`AdamStep`] in place: the first (`second = false`) or
/// the second, from the gradient. One pass where the composite ran five
/// ops and allocated five tensors.
struct Moment {
    step: AdamStep,
    second: bool,
}

impl candle_core::InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "r2vpo-adamw-moment"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        let (x, g) = f32_pair(s1, l1, s2, l2, self.name())?;
        let (step, second) = (self.step, self.second);
        x.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).for_each(|(x, g)| {
            for (x, &g) in x.iter_mut().zip(g) {
                *x = if second { step.second(*x, g) } else { step.first(*x, g) };
            }
        });
        Ok(())
    }
}

/// The parameter's update of [`AdamStep`] in place, from the moments
/// [`Moment`] just wrote.
struct Update(AdamStep);

impl candle_core::InplaceOp3 for Update {
    fn name(&self) -> &'static str {
        "r2vpo-adamw-update"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<()> {
        let n = self.name();
        let (w, m) = f32_pair(s1, l1, s2, l2, n)?;
        let v = f32_slice(s3, l3, n)?;
        if v.len() != w.len() {
            return Err(candle_core::Error::Msg(format!("{n}: {} weights, {} second moments", w.len(), v.len())));
        }
        let step = self.0;
        w.par_chunks_mut(CHUNK).zip(m.par_chunks(CHUNK)).zip(v.par_chunks(CHUNK)).for_each(|((w, m), v)| {
            for ((w, &m), &v) in w.iter_mut().zip(m).zip(v) {
                *w = step.param(*w, m, v);
            }
        });
        Ok(())
    }
}

/// Elements per parallel task of the in-place update.
const CHUNK: usize = 1 << 15;

/// A contiguous f32 CPU slice of one operand.
fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => crate::backend::candle::ops::contiguous(v, l, op),
        _ => Err(candle_core::Error::Msg(format!("{op}: contiguous f32 operands only"))),
    }
}

/// The destination (mutable) and one source of an in-place op, of one length.
fn f32_pair<'a>(
    s1: &'a mut CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
    op: &str,
) -> candle_core::Result<(&'a mut [f32], &'a [f32])> {
    let g = f32_slice(s2, l2, op)?;
    let x = match (s1, l1.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => &mut v[a..b],
        _ => return Err(candle_core::Error::Msg(format!("{op}: contiguous f32 operands only"))),
    };
    if x.len() != g.len() {
        return Err(candle_core::Error::Msg(format!("{op}: {} elements against {}", x.len(), g.len())));
    }
    Ok((x, g))
}

/// Global L2 norm of a set of gradients, in f64 (`NaN`/`inf` propagate so
/// the caller can refuse the step).
pub fn global_norm(grads: &[Option<Tensor>]) -> Result<f64> {
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

    /// The in-place update gives the candle-op update's bits, over steps
    /// with and without decay, a gradient scale and a missing gradient.
    #[test]
    fn in_place_update_equals_the_composite_bit_for_bit() {
        let dev = Device::Cpu;
        let vals = |n: usize, s: f32| (0..n).map(|i| ((i as f32 + 1.0) * 0.37 + s).sin()).collect::<Vec<f32>>();
        let make = || {
            let w = Var::from_vec(vals(70_000, 0.1), (700, 100), &dev).unwrap();
            let b = Var::from_vec(vals(100, 0.2), 100, &dev).unwrap();
            let cfg = OptimConfig { lr: 0.01, weight_decay: 0.1, ..OptimConfig::default() };
            AdamW::new(vec![("w".into(), w), ("b".into(), b)], cfg).unwrap()
        };
        let (mut a, mut c) = (make(), make());
        for step in 0..3 {
            let gw = Tensor::from_vec(vals(70_000, step as f32), (700, 100), &dev).unwrap();
            let gb = Tensor::from_vec(vals(100, 2.0 + step as f32), 100, &dev).unwrap();
            let grads = [Some(gw), if step == 1 { None } else { Some(gb) }];
            a.step_with(&grads, 0.7, true).unwrap();
            c.step_with(&grads, 0.7, false).unwrap();
        }
        let bits = |o: &AdamW| -> Vec<u32> {
            let ts = o.vars.iter().map(|v| v.as_tensor().clone()).chain(o.m.iter().cloned()).chain(o.v.iter().cloned());
            ts.flat_map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap()).map(f32::to_bits).collect()
        };
        assert_eq!(bits(&a), bits(&c));
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
