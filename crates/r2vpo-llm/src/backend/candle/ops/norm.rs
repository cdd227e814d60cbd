//! RMSNorm, with its backward.

use super::*;

struct RmsNorm {
    eps: f64,
}

fn rms_fwd<T: Float>(x: &[T], w: &[T], d: usize, eps: f64) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    let (eps, dn) = (T::from_f64(eps), T::from_f64(d as f64));
    for_rows(&mut out, d, |i, o| {
        let xi = &x[i * d..(i + 1) * d];
        let ms: T = dot(xi, xi) / dn;
        let r = T::ONE / (ms + eps).sqrt();
        for ((o, &v), &wv) in o.iter_mut().zip(xi).zip(w) {
            *o = v * r * wv;
        }
    });
    out
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "r2vpo-rms-norm"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1, self.name())?;
        if l2.shape().elem_count() != d {
            return Err(Error::Msg(format!(
                "{}: weight has {} elements, expected {d}",
                self.name(),
                l2.shape().elem_count()
            )));
        }
        let n = self.name();
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => {
                CpuStorage::F32(rms_fwd(contiguous(x, l1, n)?, contiguous(w, l2, n)?, d, self.eps))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w)) => {
                CpuStorage::F64(rms_fwd(contiguous(x, l1, n)?, contiguous(w, l2, n)?, d, self.eps))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?;
        let x = x.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &RmsNormBwd { eps: self.eps, want_w: false })?;
        let dw = if w.track_op() {
            Some(x.apply_op3_no_bwd(w, &g, &RmsNormBwd { eps: self.eps, want_w: true })?)
        } else {
            None
        };
        Ok((Some(dx), dw))
    }
}

/// Gradients of RMSNorm. With r = (mean x² + ε)^(-1/2):
/// dx = r·(g⊙w) − x·r³·mean(g⊙w⊙x), dw = Σ_rows g⊙x·r.
struct RmsNormBwd {
    eps: f64,
    want_w: bool,
}

pub(super) fn rms_bwd<T: Float>(x: &[T], w: &[T], g: &[T], d: usize, eps: f64, want_w: bool) -> Vec<T> {
    let (eps, dn) = (T::from_f64(eps), T::from_f64(d as f64));
    let r_of = |xi: &[T]| T::ONE / (dot(xi, xi) / dn + eps).sqrt();
    if want_w {
        // Blocks of rows in parallel, their partial sums added in block
        // order: the same bits for any number of threads. (Serial, this
        // was one thread's work while the other waited.)
        const BLOCK: usize = 64;
        let partial = |(xs, gs): (&[T], &[T])| {
            let mut dw = vec![T::ZERO; d];
            for (xi, gi) in xs.chunks(d).zip(gs.chunks(d)) {
                let r = r_of(xi);
                for ((o, &xv), &gv) in dw.iter_mut().zip(xi).zip(gi) {
                    *o = *o + gv * xv * r;
                }
            }
            dw
        };
        let parts: Vec<Vec<T>> = if x.len() >= PAR_MIN {
            x.par_chunks(BLOCK * d).zip(g.par_chunks(BLOCK * d)).map(partial).collect()
        } else {
            x.chunks(BLOCK * d).zip(g.chunks(BLOCK * d)).map(partial).collect()
        };
        let mut dw = vec![T::ZERO; d];
        for p in parts {
            for (o, v) in dw.iter_mut().zip(p) {
                *o = *o + v;
            }
        }
        return dw;
    }
    let mut out = vec![T::ZERO; x.len()];
    for_rows(&mut out, d, |i, o| {
        let (xi, gi) = (&x[i * d..(i + 1) * d], &g[i * d..(i + 1) * d]);
        let r = r_of(xi);
        let c = r * r * r * dot3(xi, gi, w) / dn;
        for (((o, &xv), &gv), &wv) in o.iter_mut().zip(xi).zip(gi).zip(w) {
            *o = r * gv * wv - xv * c;
        }
    });
    out
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "r2vpo-rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1, self.name())?;
        let n = self.name();
        let shape = if self.want_w { l2.shape().clone() } else { l1.shape().clone() };
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(g)) => CpuStorage::F32(rms_bwd(
                contiguous(x, l1, n)?,
                contiguous(w, l2, n)?,
                contiguous(g, l3, n)?,
                d,
                self.eps,
                self.want_w,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(g)) => CpuStorage::F64(rms_bwd(
                contiguous(x, l1, n)?,
                contiguous(w, l2, n)?,
                contiguous(g, l3, n)?,
                d,
                self.eps,
                self.want_w,
            )),
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, shape))
    }
}

/// RMSNorm over the last dimension with weight `w`, differentiable in both.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if fused_ok(x) && x.dtype() == w.dtype() {
        x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps })
    } else {
        rms_norm_composite(x, w, eps)
    }
}

/// Reference RMSNorm from candle primitives.
pub fn rms_norm_composite(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}
