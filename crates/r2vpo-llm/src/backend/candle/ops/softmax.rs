//! Softmax over the last dimension, with its backward.

use super::*;

fn softmax_rows<T: Float>(x: &[T], d: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    for_rows(&mut out, d, |i, o| {
        let xi = &x[i * d..(i + 1) * d];
        let m = xi.iter().copied().fold(T::NEG_INF, |a, b| if b > a { b } else { a });
        let mut s = T::ZERO;
        for (o, &v) in o.iter_mut().zip(xi) {
            *o = (v - m).exp();
            s = s + *o;
        }
        let inv = T::ONE / s;
        o.iter_mut().for_each(|v| *v = *v * inv);
    });
    out
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "r2vpo-softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l, self.name())?;
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(softmax_rows(contiguous(v, l, self.name())?, d)),
            CpuStorage::F64(v) => CpuStorage::F64(softmax_rows(contiguous(v, l, self.name())?, d)),
            _ => return Err(unsupported(self.name(), s)),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = grad.contiguous()?;
        Ok(Some(res.apply_op2_no_bwd(&g, &SoftmaxBwd)?))
    }
}

/// dx = y ⊙ (g − Σ g⊙y), one pass per row and one allocation.
struct SoftmaxBwd;

fn softmax_bwd_rows<T: Float>(y: &[T], g: &[T], d: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; y.len()];
    for_rows(&mut out, d, |i, o| {
        let (yi, gi) = (&y[i * d..(i + 1) * d], &g[i * d..(i + 1) * d]);
        let dot: T = yi.iter().zip(gi).map(|(&a, &b)| a * b).sum();
        for ((o, &a), &b) in o.iter_mut().zip(yi).zip(gi) {
            *o = a * (b - dot);
        }
    });
    out
}

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "r2vpo-softmax-bwd"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1, self.name())?;
        let n = self.name();
        let out = match (s1, s2) {
            (CpuStorage::F32(y), CpuStorage::F32(g)) => {
                CpuStorage::F32(softmax_bwd_rows(contiguous(y, l1, n)?, contiguous(g, l2, n)?, d))
            }
            (CpuStorage::F64(y), CpuStorage::F64(g)) => {
                CpuStorage::F64(softmax_bwd_rows(contiguous(y, l1, n)?, contiguous(g, l2, n)?, d))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// Softmax over the last dimension, differentiable.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if fused_ok(x) {
        x.contiguous()?.apply_op1(Softmax)
    } else {
        softmax_composite(x)
    }
}

/// Reference softmax from candle primitives.
pub fn softmax_composite(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}
