//! The log-prob gather (`log_softmax` then the target column) without the full log-softmax, with its backward.

use super::*;

fn targets_of(s: &CpuStorage, l: &Layout, op: &str) -> Result<Vec<usize>> {
    Ok(match s {
        CpuStorage::U32(v) => contiguous(v, l, op)?.iter().map(|&t| t as usize).collect(),
        CpuStorage::I64(v) => contiguous(v, l, op)?.iter().map(|&t| t.max(0) as usize).collect(),
        CpuStorage::U8(v) => contiguous(v, l, op)?.iter().map(|&t| t as usize).collect(),
        _ => return Err(Error::Msg(format!("{op}: targets must be U32, I64 or U8, got {:?}", s.dtype()))),
    })
}

fn check_targets(t: &[usize], v: usize, rows: usize, op: &str) -> Result<()> {
    if t.len() != rows {
        return Err(Error::Msg(format!("{op}: {} targets for {rows} rows", t.len())));
    }
    if let Some(bad) = t.iter().find(|&&x| x >= v) {
        return Err(Error::Msg(format!("{op}: target id {bad} out of range for vocabulary {v}")));
    }
    Ok(())
}

/// Row max and log-sum-exp.
fn lse<T: Float>(x: &[T]) -> T {
    let m = T::row_max(x);
    m + T::sum_exp_shifted(x, m).ln()
}

fn gather_fwd<T: Float>(x: &[T], t: &[usize], v: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; t.len()];
    let f = |(i, o): (usize, &mut T)| {
        let xi = &x[i * v..(i + 1) * v];
        *o = xi[t[i]] - lse(xi);
    };
    if x.len() >= PAR_MIN {
        out.par_iter_mut().enumerate().for_each(f);
    } else {
        out.iter_mut().enumerate().for_each(f);
    }
    out
}

/// `logits (…, V)`, `targets (…)` → `log softmax(logits)[target]`.
struct LogProbGather;

impl CustomOp2 for LogProbGather {
    fn name(&self) -> &'static str {
        "r2vpo-log-prob-gather"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let v = last_dim(l1, n)?;
        let rows = l1.shape().elem_count() / v;
        let t = targets_of(s2, l2, n)?;
        check_targets(&t, v, rows, n)?;
        let out = match s1 {
            CpuStorage::F32(x) => CpuStorage::F32(gather_fwd(contiguous(x, l1, n)?, &t, v)),
            CpuStorage::F64(x) => CpuStorage::F64(gather_fwd(contiguous(x, l1, n)?, &t, v)),
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l2.shape().clone()))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?;
        let d = logits.apply_op3_no_bwd(targets, &g, &LogProbGatherBwd)?;
        Ok((Some(d), None))
    }
}

/// d logits = g · (onehot(target) − softmax(logits)), written in one allocation.
struct LogProbGatherBwd;

fn gather_bwd<T: Float>(x: &[T], t: &[usize], g: &[T], v: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    for_rows(&mut out, v, |i, o| {
        let xi = &x[i * v..(i + 1) * v];
        let l = lse(xi);
        let gi = g[i];
        T::scaled_exp_shifted(xi, l, -gi, o);
        o[t[i]] = o[t[i]] + gi;
    });
    out
}

impl CustomOp3 for LogProbGatherBwd {
    fn name(&self) -> &'static str {
        "r2vpo-log-prob-gather-bwd"
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
        let n = self.name();
        let v = last_dim(l1, n)?;
        let t = targets_of(s2, l2, n)?;
        check_targets(&t, v, l1.shape().elem_count() / v, n)?;
        let out = match (s1, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(gather_bwd(contiguous(x, l1, n)?, &t, contiguous(g, l3, n)?, v))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(gather_bwd(contiguous(x, l1, n)?, &t, contiguous(g, l3, n)?, v))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// Log-probabilities of `targets (…)` under `logits (…, V)`, i.e.
/// `log_softmax(logits).gather(targets)`, without materialising the
/// log-softmax; differentiable in `logits`.
pub fn log_prob_gather(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let lead = &logits.dims()[..logits.rank().saturating_sub(1)];
    if targets.dims() != lead {
        return Err(Error::Msg(format!(
            "log_prob_gather: targets {:?} must match logits' leading dims {lead:?}",
            targets.dims()
        )));
    }
    if fused_ok(logits) {
        logits.contiguous()?.apply_op2(&targets.contiguous()?, LogProbGather)
    } else {
        log_prob_gather_composite(logits, targets)
    }
}

/// Reference log-prob gather from candle primitives.
pub fn log_prob_gather_composite(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let m = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&m)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logp = shifted.broadcast_sub(&lse)?;
    logp.gather(&targets.unsqueeze(D::Minus1)?.contiguous()?, D::Minus1)?.squeeze(D::Minus1)
}
