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
// [`exp_nonpos`] in 16 lanes under pulp's run-time dispatch (AVX-512 here):
// libm's scalar `expf` was 6 % of a scoring pass and the attention's
// softmax loop around it another 5 % (perf, SmolLM2 at 8 × 300 tokens).
// SwiGLU likewise ([`sigmoid_f32`]): its loops, compiled for baseline x86-64
// around libm's `expf`, were 5 % of a scoring pass.
impl_float!(
    f32,
    fn row_max(x: &[f32]) -> f32 {
        pulp::Arch::new().dispatch(RowMax(x))
    },
    fn exp_shifted(x: &mut [f32], m: f32) -> f32 {
        pulp::Arch::new().dispatch(ExpShifted((x, m)))
    },
    fn sum_exp_shifted(x: &[f32], m: f32) -> f32 {
        pulp::Arch::new().dispatch(SumExpShifted((x, m)))
    },
    fn scaled_exp_shifted(x: &[f32], m: f32, c: f32, out: &mut [f32]) {
        pulp::Arch::new().dispatch(ScaledExpShifted((x, m, c, out)))
    },
    fn swiglu(o: &mut [f32], a: &[f32], b: &[f32]) {
        pulp::Arch::new().dispatch(SwigluRows((o, a, b)))
    },
    fn swiglu_grad(d: (&mut [f32], &mut [f32]), a: &[f32], b: &[f32], g: &[f32]) {
        pulp::Arch::new().dispatch(SwigluGradRows((d, a, b, g)))
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

/// `e^x` for `x ≤ 0` in plain arithmetic that vectorises: Cephes' `expf`
/// (range reduction by `ln 2` in two parts, a degree-6 polynomial on
/// `|r| ≤ ln 2 / 2`, the power of two put into the exponent bits), 0 below
/// −87 where `e^x` leaves the normal floats. Within 2 ulp of libm's `expf`
/// (tested over the whole range).
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 · 2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let xc = if x < -87.0 { -87.0 } else { x };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // n as an integer, read from t's mantissa (t is in [2²³, 2²⁴), where
    // the float's bits step by one per unit): exactly `n as i32`, but `as`
    // saturates and maps NaN to 0, which compiles to a scalar convert and
    // two compares per lane (15 % of decode time at batch 32, perf).
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let e = f32::from_bits(((ni + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        y * e
    }
}

/// A kernel run under pulp's run-time dispatch (AVX-512 or AVX2 here): its
/// arguments and the `#[inline(always)]` fn that takes them. The fn is
/// called directly from `with_simd`, so it compiles into the function that
/// enables those features. A closure (or a fn item called through
/// `FnOnce`) handed to `Arch::dispatch` stayed out of line and compiled for
/// baseline x86-64: the decode attention ran that way in 4-wide SSE, 20 %
/// of decode time at batch 32 (perf, line tables).
macro_rules! simd_kernel {
    ($name:ident<$lt:lifetime>($args:ty) -> $out:ty = $f:ident) => {
        struct $name<$lt>($args);
        impl<$lt> pulp::WithSimd for $name<$lt> {
            type Output = $out;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, _: S) -> $out {
                $f(self.0)
            }
        }
    };
}

simd_kernel!(RowMax<'a>(&'a [f32]) -> f32 = max16);
simd_kernel!(ExpShifted<'a>((&'a mut [f32], f32)) -> f32 = exp_shifted16);
simd_kernel!(SumExpShifted<'a>((&'a [f32], f32)) -> f32 = sum_exp_shifted16);
simd_kernel!(ScaledExpShifted<'a>((&'a [f32], f32, f32, &'a mut [f32])) -> () = scaled_exp_shifted16);
simd_kernel!(SwigluRows<'a>((&'a mut [f32], &'a [f32], &'a [f32])) -> () = swiglu_rows);
simd_kernel!(SwigluGradRows<'a>(SwigluGradArgs<'a>) -> () = swiglu_grad_rows);

simd_kernel!(ExpMoments<'a>((&'a [f32], f32, Option<&'a mut Vec<f64>>)) -> (f64, f64) = exp_moments16);
simd_kernel!(ArgMax<'a>(&'a [f32]) -> (usize, f32) = argmax16);

/// For a row of logits `x` and `m` at least every element: `e = e^(x − m)`
/// appended to `out` (in f64), and `(Σ e, Σ e·(x − m))`, the normaliser and
/// the entropy's moment (`out` may be `None` where the caller does not keep
/// the exponentials). The exponentials are f32 ([`exp_nonpos`], 2 ulp),
/// the sums f64 (8 lanes each). A sampler's pass over the vocabulary: in
/// libm's f64 `exp` it was 7 % of decode time at batch 32 (perf, SmolLM2).
pub(crate) fn exp_moments(x: &[f32], m: f32, out: Option<&mut Vec<f64>>) -> (f64, f64) {
    pulp::Arch::new().dispatch(ExpMoments((x, m, out)))
}

/// The first index of the largest element and the element (`(0, −inf)` if
/// none is above −inf; NaNs are skipped), a vectorised max then a scan.
pub(crate) fn argmax(x: &[f32]) -> (usize, f32) {
    pulp::Arch::new().dispatch(ArgMax(x))
}

#[inline(always)]
fn exp_moments16((x, m, mut out): (&[f32], f32, Option<&mut Vec<f64>>)) -> (f64, f64) {
    let (mut s0, mut s1) = ([0f64; 8], [0f64; 8]);
    let mut e = [0f64; 16];
    let ch = x.chunks_exact(16);
    let tail = ch.remainder();
    for c in ch {
        for l in 0..16 {
            e[l] = f64::from(exp_nonpos(c[l] - m));
        }
        for l in 0..16 {
            s0[l % 8] += e[l];
            s1[l % 8] += e[l] * f64::from(c[l] - m);
        }
        if let Some(o) = out.as_deref_mut() {
            o.extend_from_slice(&e);
        }
    }
    let (mut t0, mut t1) = (s0.iter().sum::<f64>(), s1.iter().sum::<f64>());
    for &v in tail {
        let ev = f64::from(exp_nonpos(v - m));
        t0 += ev;
        t1 += ev * f64::from(v - m);
        if let Some(o) = out.as_deref_mut() {
            o.push(ev);
        }
    }
    (t0, t1)
}

#[inline(always)]
fn argmax16(x: &[f32]) -> (usize, f32) {
    let mx = max16(x);
    match x.iter().position(|&v| v == mx) {
        Some(i) if mx > f32::NEG_INFINITY => (i, mx),
        _ => (0, f32::NEG_INFINITY),
    }
}

/// [`SwigluGradRows`]'s `((da, db), a, b, g)`.
type SwigluGradArgs<'a> = ((&'a mut [f32], &'a mut [f32]), &'a [f32], &'a [f32], &'a [f32]);

/// σ(x) for f32 through [`exp_nonpos`], so that it vectorises: with
/// e = e^(−|x|), 1/(1 + e) for x ≥ 0 and e/(1 + e) below (the same value,
/// and neither form overflows).
#[inline(always)]
fn sigmoid_f32(x: f32) -> f32 {
    let e = exp_nonpos(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 {
        r
    } else {
        e * r
    }
}

/// [`Float::swiglu`] for f32.
#[inline(always)]
fn swiglu_rows((o, a, b): (&mut [f32], &[f32], &[f32])) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = x * sigmoid_f32(x) * y;
    }
}

/// [`Float::swiglu_grad`] for f32.
#[inline(always)]
fn swiglu_grad_rows(((da, db), a, b, g): SwigluGradArgs) {
    for (((da, db), (&x, &y)), &gi) in da.iter_mut().zip(db.iter_mut()).zip(a.iter().zip(b)).zip(g) {
        let s = sigmoid_f32(x);
        *db = gi * x * s;
        *da = gi * y * s * (1.0 + x * (1.0 - s));
    }
}

/// [`Float::exp_shifted`] for f32 in 16 lanes.
#[inline(always)]
fn exp_shifted16((x, m): (&mut [f32], f32)) -> f32 {
    let mut acc = [0f32; 16];
    let mut ch = x.chunks_exact_mut(16);
    for c in &mut ch {
        for l in 0..16 {
            c[l] = exp_nonpos(c[l] - m);
            acc[l] += c[l];
        }
    }
    let tail = ch.into_remainder().iter_mut().fold(0.0, |s, v| {
        *v = exp_nonpos(*v - m);
        s + *v
    });
    acc.iter().sum::<f32>() + tail
}

/// [`Float::sum_exp_shifted`] for f32 in 16 lanes.
#[inline(always)]
fn sum_exp_shifted16((x, m): (&[f32], f32)) -> f32 {
    let mut acc = [0f32; 16];
    let ch = x.chunks_exact(16);
    let tail: f32 = ch.remainder().iter().map(|&v| exp_nonpos(v - m)).sum();
    for c in ch {
        for l in 0..16 {
            acc[l] += exp_nonpos(c[l] - m);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// [`Float::scaled_exp_shifted`] for f32.
#[inline(always)]
fn scaled_exp_shifted16((x, m, c, out): (&[f32], f32, f32, &mut [f32])) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = c * exp_nonpos(v - m);
    }
}

/// The largest of `x` in 16 independent lanes (so it vectorises).
#[inline(always)]
fn max16(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let ch = x.chunks_exact(16);
    let tail = ch.remainder().iter().copied().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
    for c in ch {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    acc.iter().copied().fold(tail, |a, b| if b > a { b } else { a })
}

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
