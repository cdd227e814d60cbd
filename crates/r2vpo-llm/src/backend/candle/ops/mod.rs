//! Differentiable fused ops for the decoder: RMSNorm, softmax over the last
//! dimension, rotate-half RoPE with per-row tables, a log-prob gather,
//! attention that keeps no score matrix ([`attention`]), the gated MLP's
//! `silu(gate) ⊙ up` ([`swiglu`]), and the linear
//! layer `x · wᵀ` ([`linear`], [`linear_many`]), which decode-sized inputs
//! run on a kernel that does not repack the weights.
//!
//! candle-nn's fused versions of the first three record no backward and the
//! gradient silently stops there, so these are our own `CustomOp`s with a
//! `bwd`. The CPU kernels handle F32 and F64 (F64 is what the finite
//! difference tests use); on any other device or dtype each function falls
//! back to its composite of candle primitives, which is differentiable
//! everywhere but materialises more temporaries. The composites are public
//! because the tests use them as the reference.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Error, Layout, Result, Shape, Tensor, D};
use r2vpo_kernels::simd;
use rayon::prelude::*;

/// The float operations the kernels need, for f32 and f64.
trait Float:
    Copy
    + r2vpo_kernels::Real
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::iter::Sum
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn from_f64(v: f64) -> Self;

    /// The largest element (`-inf` for an empty slice; NaNs are skipped).
    fn row_max(x: &[Self]) -> Self {
        x.iter().copied().fold(Self::NEG_INF, |a, b| if b > a { b } else { a })
    }

    /// `x ← e^(x − m)` elementwise; returns the sum of the new values.
    /// `m` is at least every element (a softmax's shift).
    fn exp_shifted(x: &mut [Self], m: Self) -> Self {
        x.iter_mut().fold(Self::ZERO, |s, v| {
            *v = (*v - m).exp();
            s + *v
        })
    }

    /// `Σ e^(x − m)` for `m` at least every element.
    fn sum_exp_shifted(x: &[Self], m: Self) -> Self {
        x.iter().map(|&v| (v - m).exp()).sum()
    }

    /// `out ← c · e^(x − m)` for `m` at least every element.
    fn scaled_exp_shifted(x: &[Self], m: Self, c: Self, out: &mut [Self]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = c * (v - m).exp();
        }
    }

    /// SwiGLU, `o ← silu(a) ⊙ b` elementwise.
    fn swiglu(o: &mut [Self], a: &[Self], b: &[Self]) {
        for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
            *o = x * sigmoid(x) * y;
        }
    }

    /// `c (+)= a · b` as [`mm`] takes it, on [`r2vpo_kernels::avx2::product_here`]
    /// where that kernel runs (f32 only); false where it did nothing.
    #[allow(clippy::too_many_arguments)]
    fn mm_avx2(
        _dims: (usize, usize, usize),
        _c: &mut [Self],
        _ldc: usize,
        _acc: bool,
        _a: &[Self],
        _as: (usize, usize),
        _b: &[Self],
        _bs: (usize, usize),
    ) -> bool {
        false
    }

    /// SwiGLU's gradients for the upstream `g`: `db ← g ⊙ silu(a)`,
    /// `da ← g ⊙ b ⊙ σ(a)(1 + a(1 − σ(a)))`.
    fn swiglu_grad((da, db): (&mut [Self], &mut [Self]), a: &[Self], b: &[Self], g: &[Self]) {
        for (((da, db), (&x, &y)), &gi) in da.iter_mut().zip(db.iter_mut()).zip(a.iter().zip(b)).zip(g) {
            let s = sigmoid(x);
            *db = gi * x * s;
            *da = gi * y * s * (Self::ONE + x * (Self::ONE - s));
        }
    }
}

macro_rules! impl_float {
    ($t:ty $(, $extra:item)*) => {
        impl Float for $t {
            $($extra)*
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
// f32, which every model runs in, overrides the softmax loops with
// `r2vpo_kernels::simd`'s `exp_nonpos` in 16 lanes under pulp's run-time
// dispatch (AVX-512 here):
// libm's scalar `expf` was 6 % of a scoring pass and the attention's
// softmax loop around it another 5 % (perf, SmolLM2 at 8 × 300 tokens).
// SwiGLU likewise (`simd::sigmoid`): its loops, compiled for baseline x86-64
// around libm's `expf`, were 5 % of a scoring pass.
impl_float!(
    f32,
    fn row_max(x: &[f32]) -> f32 {
        simd::row_max(x)
    },
    fn exp_shifted(x: &mut [f32], m: f32) -> f32 {
        simd::exp_shifted(x, m)
    },
    fn sum_exp_shifted(x: &[f32], m: f32) -> f32 {
        simd::sum_exp_shifted(x, m)
    },
    fn scaled_exp_shifted(x: &[f32], m: f32, c: f32, out: &mut [f32]) {
        simd::scaled_exp_shifted(x, m, c, out)
    },
    fn swiglu(o: &mut [f32], a: &[f32], b: &[f32]) {
        simd::swiglu(o, a, b)
    },
    fn swiglu_grad(d: (&mut [f32], &mut [f32]), a: &[f32], b: &[f32], g: &[f32]) {
        simd::swiglu_grad(d, a, b, g)
    },
    fn mm_avx2(
        (m, n, k): (usize, usize, usize),
        c: &mut [f32],
        ldc: usize,
        acc: bool,
        a: &[f32],
        (ars, acs): (usize, usize),
        b: &[f32],
        (brs, bcs): (usize, usize),
    ) -> bool {
        // `mm` returns before calling this on an empty product.
        if !r2vpo_kernels::dispatch::on_avx2() {
            return false;
        }
        let la = r2vpo_kernels::avx2::Layout::of([acs as isize, ars as isize], m, k);
        let lb = r2vpo_kernels::avx2::Layout::of([bcs as isize, brs as isize], k, n);
        let (Some(la), Some(lb)) = (la, lb) else { return false };
        r2vpo_kernels::avx2::product_here([m, k, n], (a, la), (b, lb), c, ldc, acc).is_ok()
    }
);
impl_float!(f64);

/// Rows below this many elements in total run on one thread: rayon's
/// hand-off costs more than the work for decode-sized inputs.
const PAR_MIN: usize = 1 << 14;

/// The elements of a contiguous tensor from its storage slice and layout,
/// or an error naming `op`.
pub(crate) fn contiguous<'a, T>(s: &'a [T], l: &Layout, op: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s[a..b]),
        None => Err(Error::Msg(format!("{op}: input must be contiguous"))),
    }
}

fn for_rows<T: Send>(out: &mut [T], row: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(row).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        out.chunks_mut(row).enumerate().for_each(|(i, o)| f(i, o));
    }
}

/// Partial sums a row reduction keeps: independent lanes the compiler can
/// put in SIMD registers, where one running sum is a chain of dependent
/// adds it may not reorder (RMSNorm's row sums ran scalar: 1.5 % of a
/// scoring pass, 1.8 % of a training step with its backward, perf).
const LANES: usize = 16;

/// Σ aᵢ·bᵢ in [`LANES`] interleaved partial sums, then the lanes, then the
/// tail (the attention scores' and RMSNorm's row sums).
#[inline(always)]
fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: T = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x * y).sum();
    let mut acc = [T::ZERO; LANES];
    for (x, y) in ca.zip(cb) {
        for j in 0..LANES {
            acc[j] = acc[j] + x[j] * y[j];
        }
    }
    acc.iter().copied().sum::<T>() + tail
}

/// Σ aᵢ·bᵢ·cᵢ, summed as [`dot`] sums.
fn dot3<T: Float>(a: &[T], b: &[T], c: &[T]) -> T {
    let (ca, cb, cc) = (a.chunks_exact(LANES), b.chunks_exact(LANES), c.chunks_exact(LANES));
    let tail: T = ca.remainder().iter().zip(cb.remainder()).zip(cc.remainder()).map(|((&x, &y), &z)| x * y * z).sum();
    let mut acc = [T::ZERO; LANES];
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for j in 0..LANES {
            acc[j] = acc[j] + x[j] * y[j] * z[j];
        }
    }
    acc.iter().copied().sum::<T>() + tail
}

fn last_dim(l: &Layout, op: &str) -> Result<usize> {
    match l.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => Err(Error::Msg(format!("{op}: input needs a non-empty last dimension"))),
    }
}

pub use crate::pool::{composites_only, with_composites};

/// Whether the fused CPU kernels apply to `t`.
fn fused_ok(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && !composites_only()
}

fn unsupported(op: &str, s: &CpuStorage) -> Error {
    Error::Msg(format!("{op}: unsupported dtype {:?} (F32/F64 only)", s.dtype()))
}

mod attention;
mod decode_attention;
mod linear;
mod log_prob;
mod norm;
mod rope;
mod softmax;
mod swiglu;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timing;

pub use attention::*;
pub use decode_attention::*;
pub use linear::*;
pub use log_prob::*;
pub use norm::*;
pub use rope::*;
pub use softmax::*;
pub use swiglu::*;
