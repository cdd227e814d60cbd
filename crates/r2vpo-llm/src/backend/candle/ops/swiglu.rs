//! The gated MLP's `silu(gate) ⊙ up` as one op, with its backward.

use super::*;

/// `silu(a) ⊙ b`, the gated MLP's product, as one op: the composite kept
/// `silu(a)` as well (one `(B·T, intermediate)` tensor a layer, 14.7 MB in
/// SmolLM2's step at 8 × 300 tokens, 0.44 GB over its 30 layers) and ran
/// four elementwise passes where this runs one forward and one backward.
struct SwiGlu;

/// Elements per parallel task of the elementwise SwiGLU passes.
const SWIGLU_CHUNK: usize = 4096;

pub(super) fn sigmoid<T: Float>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

fn swiglu_fwd<T: Float>(a: &[T], b: &[T]) -> Vec<T> {
    let mut out = vec![T::ZERO; a.len()];
    let chunk = SWIGLU_CHUNK.min(a.len().max(1));
    for_rows(&mut out, chunk, |i, o| {
        let at = i * chunk;
        T::swiglu(o, &a[at..at + o.len()], &b[at..at + o.len()]);
    });
    out
}

/// `(da, db)` for the upstream `g`: `db = g ⊙ silu(a)`, `da = g ⊙ b ⊙
/// σ(a)(1 + a(1 − σ(a)))`.
fn swiglu_bwd<T: Float>(a: &[T], b: &[T], g: &[T]) -> (Vec<T>, Vec<T>) {
    let (mut da, mut db) = (vec![T::ZERO; a.len()], vec![T::ZERO; a.len()]);
    let chunk = SWIGLU_CHUNK.min(a.len().max(1));
    let work = |(i, (da, db)): (usize, (&mut [T], &mut [T]))| {
        let (at, n) = (i * chunk, da.len());
        T::swiglu_grad((da, db), &a[at..at + n], &b[at..at + n], &g[at..at + n]);
    };
    if a.len() >= PAR_MIN {
        da.par_chunks_mut(chunk).zip(db.par_chunks_mut(chunk)).enumerate().for_each(work);
    } else {
        da.chunks_mut(chunk).zip(db.chunks_mut(chunk)).enumerate().for_each(work);
    }
    (da, db)
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "r2vpo-swiglu"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        if l1.shape() != l2.shape() {
            return Err(Error::Msg(format!("{n}: gate {:?} against up {:?}", l1.dims(), l2.dims())));
        }
        let out = match (s1, s2) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(swiglu_fwd(contiguous(a, l1, n)?, contiguous(b, l2, n)?))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                CpuStorage::F64(swiglu_fwd(contiguous(a, l1, n)?, contiguous(b, l2, n)?))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = self.name();
        let g = grad.contiguous()?;
        let ((sa, la), (sb, lb), (sg, lg)) = (a.storage_and_layout(), b.storage_and_layout(), g.storage_and_layout());
        use candle_core::Storage::Cpu;
        let (da, db) = match (&*sa, &*sb, &*sg) {
            (Cpu(CpuStorage::F32(x)), Cpu(CpuStorage::F32(y)), Cpu(CpuStorage::F32(gg))) => {
                let (da, db) = swiglu_bwd(contiguous(x, la, n)?, contiguous(y, lb, n)?, contiguous(gg, lg, n)?);
                (Tensor::from_vec(da, a.dims(), a.device())?, Tensor::from_vec(db, b.dims(), b.device())?)
            }
            (Cpu(CpuStorage::F64(x)), Cpu(CpuStorage::F64(y)), Cpu(CpuStorage::F64(gg))) => {
                let (da, db) = swiglu_bwd(contiguous(x, la, n)?, contiguous(y, lb, n)?, contiguous(gg, lg, n)?);
                (Tensor::from_vec(da, a.dims(), a.device())?, Tensor::from_vec(db, b.dims(), b.device())?)
            }
            _ => return Err(Error::Msg(format!("{n}: backward needs f32 or f64 CPU tensors of one dtype"))),
        };
        Ok((Some(da), Some(db)))
    }
}

/// `silu(gate) ⊙ up`, differentiable; fused on the CPU in f32/f64
/// ([`swiglu_composite`] elsewhere).
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if fused_ok(gate) && up.dtype() == gate.dtype() && up.device().is_cpu() {
        gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
    } else {
        swiglu_composite(gate, up)
    }
}

/// Reference `silu(gate) ⊙ up` from candle ops.
pub fn swiglu_composite(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}
