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

    /// `c (+)= a · b` as [`mm`] takes it, on [`super::avx2::product_here`]
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
        if !super::kernels::on_avx2() {
            return false;
        }
        let la = super::avx2::Layout::of([acs as isize, ars as isize], m, k);
        let lb = super::avx2::Layout::of([bcs as isize, brs as isize], k, n);
        let (Some(la), Some(lb)) = (la, lb) else { return false };
        super::avx2::product_here([m, k, n], (a, la), (b, lb), c, ldc, acc).is_ok()
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

thread_local! {
    static COMPOSITES_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the fused CPU kernels off on this thread, so the CPU
/// computes with exactly the composites a CUDA device runs: the GPU path's
/// math checked against the fused path without a GPU (`r2vpo bench step
/// --composite --check`, `tests/model_ops.rs`).
pub fn with_composites<R>(f: impl FnOnce() -> R) -> R {
    let before = COMPOSITES_ONLY.with(|c| c.replace(true));
    let out = f();
    COMPOSITES_ONLY.with(|c| c.set(before));
    out
}

/// Whether [`with_composites`] is in force on this thread (so
/// [`super::on_pool`] can carry it to the pool thread it runs on).
pub(crate) fn composites_only() -> bool {
    COMPOSITES_ONLY.with(|c| c.get())
}

/// Whether the fused CPU kernels apply to `t`.
fn fused_ok(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && !COMPOSITES_ONLY.with(|c| c.get())
}

fn unsupported(op: &str, s: &CpuStorage) -> Error {
    Error::Msg(format!("{op}: unsupported dtype {:?} (F32/F64 only)", s.dtype()))
}

// ---------------------------------------------------------------- softmax

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

// ---------------------------------------------------------------- linear

/// `x · wᵀ` by the small-row kernel (few rows, f32, CPU), differentiable.
struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "r2vpo-linear"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let ((m, k), (o, k2)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        if k != k2 {
            return Err(Error::Msg(format!("{n}: x (…, {k}) against w ({o}, {k2})")));
        }
        let (x, w) = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => (contiguous(x, l1, n)?, contiguous(w, l2, n)?),
            _ => return Err(unsupported(n, s1)),
        };
        let y = if super::kernels::reference() {
            let mut y = Vec::with_capacity(m * o);
            y.resize(m * o, 0.0);
            // wᵀ as a (k, o) operand: row stride 1, column stride k.
            r2vpo_kernels::product([m, k, o], (x, (k, 1)), (w, (1, k)), &mut y, o, false);
            y
        } else if super::small_gemm::takes(m) {
            super::small_gemm::linear(x, m, k, &[(w, o)]).into_iter().next().expect("one weight")
        } else if super::kernels::on_amx() && m <= super::amx::FEW_ROWS {
            super::amx::linear_few(x, m, k, w, o)
        } else if super::kernels::on_amx() {
            super::amx::linear(x, m, k, w, o).map_err(Error::Msg)?
        } else if super::kernels::on_avx2() {
            super::avx2::linear(x, m, k, w, o).map_err(Error::Msg)?
        } else {
            // wᵀ as gemm's (k, o) right-hand side: row stride 1, column stride k.
            gemm_uninit([m, k, o], (x, [1, k as isize]), (w, [k as isize, 1]))
        };
        Ok((CpuStorage::F32(y), Shape::from((m, o))))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(matmul(g, w)?), Some(matmul(&g.t()?, x)?)))
    }
}

/// `a · b` for two 2-D tensors, the backward's products: on f32 CPU
/// tensors, the AVX2 kernel where it runs the forward ([`super::avx2`];
/// up to [`super::avx2::WHOLE_A_MAX`] values of `a`, so every layer's
/// products but not the LM head's), else OpenBLAS where it is in use
/// ([`super::openblas`]), else gemm called exactly as candle's matmul calls
/// it (so the same values, bit for bit) into an output that is not
/// zero-filled first; elsewhere candle's matmul.
fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let cpu_f32 = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32 && t.rank() == 2;
    if !(cpu_f32(a) && cpu_f32(b)) {
        return a.matmul(b);
    }
    let ((m, k), (k2, n)) = (a.dims2()?, b.dims2()?);
    if k != k2 {
        return a.matmul(b); // candle's shape error
    }
    let (ag, al) = a.storage_and_layout();
    let (bg, bl) = b.storage_and_layout();
    let (ad, bd) = (f32_storage(&ag, "r2vpo-matmul")?, f32_storage(&bg, "r2vpo-matmul")?);
    let stride = |l: &Layout| [l.stride()[1] as isize, l.stride()[0] as isize];
    let (lhs, rhs) = ((&ad[al.start_offset()..], stride(al)), (&bd[bl.start_offset()..], stride(bl)));
    if super::kernels::reference() {
        let mut y = vec![0f32; m * n];
        let rc = |s: [isize; 2]| (s[1] as usize, s[0] as usize);
        r2vpo_kernels::product([m, k, n], (lhs.0, rc(lhs.1)), (rhs.0, rc(rhs.1)), &mut y, n, false);
        return Tensor::from_vec(y, (m, n), a.device());
    }
    // OpenBLAS's rows depend on the rows beside them, which gradients may
    // (the forward's log-probs may not: scoring must equal training bit
    // for bit); the AVX2 kernel ran the layers' gradients faster in a step
    // (`avx2.rs`).
    if super::kernels::on_avx2() && m * k <= super::avx2::WHOLE_A_MAX {
        if let (Some(la), Some(lb)) = (super::avx2::Layout::of(lhs.1, m, k), super::avx2::Layout::of(rhs.1, k, n)) {
            let y = super::avx2::product([m, k, n], (lhs.0, la), (rhs.0, lb)).map_err(Error::Msg)?;
            return Tensor::from_vec(y, (m, n), a.device());
        }
    }
    let blas = if super::kernels::backward_blas() { super::openblas::sgemm([m, k, n], lhs, rhs) } else { None };
    let y = blas.unwrap_or_else(|| gemm_uninit([m, k, n], lhs, rhs));
    Tensor::from_vec(y, (m, n), a.device())
}

/// `lhs (m, k) · rhs (k, n)` into a new row-major `(m, n)`, each operand
/// given as its data and `[column stride, row stride]`.
///
/// Why not candle's matmul: it zero-fills its output before gemm
/// overwrites all of it (`read_dst = false`); those memsets were 6 % of a
/// scoring pass and of a training step (perf, SmolLM2 at 8 × 300 tokens).
/// The gemm call is candle 0.11's own (α 0, β 1, the same parallelism), so
/// results are unchanged bit for bit (the pinned trainer run is).
fn gemm_uninit(
    [m, k, n]: [usize; 3],
    (lhs, [lcs, lrs]): (&[f32], [isize; 2]),
    (rhs, [rcs, rrs]): (&[f32], [isize; 2]),
) -> Vec<f32> {
    let last = |[r, c]: [usize; 2], [cs, rs]: [isize; 2]| (r.max(1) - 1) as isize * rs + (c.max(1) - 1) as isize * cs;
    assert!(
        m * k == 0
            || (last([m, k], [lcs, lrs]) as usize) < lhs.len() && (last([k, n], [rcs, rrs]) as usize) < rhs.len(),
        "gemm_uninit: operands shorter than their shapes"
    );
    if m * n == 0 {
        return Vec::new();
    }
    if k == 0 {
        return vec![0.0; m * n];
    }
    let threads = candle_core::utils::get_num_threads();
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let mut y = Vec::<f32>::with_capacity(m * n);
    // SAFETY: the operands' extents were checked above; `y` has room for
    // m·n values, gemm writes every one of them without reading any
    // (`read_dst = false`), and only then is the length set.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            lcs,
            lrs,
            rhs.as_ptr(),
            rcs,
            rrs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
        y.set_len(m * n);
    }
    y
}

/// Rows at or below which [`linear`] may run a few-row kernel (decode
/// steps and short prefills: up to 32 rows on the f32 small-row kernel, up
/// to [`super::amx::FEW_ROWS`] on AMX's); above it AMX's or AVX2's
/// many-row kernel or gemm, which sum in another order.
pub const SMALL_ROWS: usize = super::amx::FEW_ROWS;

/// `x (M, K) · w (N, K)ᵀ`, differentiable: a linear layer with the weight
/// as checkpoints store it. Up to 32 rows of f32 on a CPU with AVX2 or
/// AVX-512 (every decode step) it runs without repacking `w`, on AMX from
/// 16 rows where the CPU has it; on AMX up to 64 rows (a short prompt's
/// prefill) run as 32-row blocks of that kernel; more rows run on AMX where the CPU has it
/// ([`super::amx`]: f32 products from split bf16 pieces), on AVX2 CPUs
/// without AVX-512 on [`super::avx2`]'s kernel, else gemm as candle's
/// matmul does, without zero-filling the output first. Every many-row path
/// sums a row independently of the rows beside it. The backward's products run on
/// OpenBLAS where it is in use ([`super::openblas`]), else gemm; other dtypes and devices use candle's matmul. The kernels sum in
/// different orders, so they agree to f32 rounding, not bit for bit
/// (tested).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let f32_2d = |t: &Tensor| t.dtype() == DType::F32 && t.rank() == 2 && t.device().is_cpu();
    if fused_ok(x) && f32_2d(x) && f32_2d(w) {
        x.contiguous()?.apply_op2(&w.contiguous()?, Linear)
    } else {
        x.matmul(&w.t()?)
    }
}

/// Whether `x · wᵀ` for these weights goes to the small-row kernel.
fn small_ok(x: &Tensor, ws: &[&Tensor]) -> Result<bool> {
    Ok(x.rank() == 2
        && super::small_gemm::takes(x.dim(0)?)
        && fused_ok(x)
        && x.dtype() == DType::F32
        && ws.iter().all(|w| w.dtype() == DType::F32 && w.rank() == 2))
}

/// [`linear`] of one input by several weights, `[x · w₁ᵀ, x · w₂ᵀ, …]`
/// (q, k and v; gate and up). Where nothing records a gradient (every
/// decode step) the small-row kernel runs them in one parallel pass;
/// otherwise each is a [`linear`], with the same values to f32 rounding.
pub fn linear_many(x: &Tensor, ws: &[&Tensor]) -> Result<Vec<Tensor>> {
    if !small_ok(x, ws)? || x.track_op() || ws.iter().any(|w| w.track_op()) {
        return ws.iter().map(|w| linear(x, w)).collect();
    }
    let x = x.contiguous()?;
    let ws: Vec<Tensor> = ws.iter().map(|w| w.contiguous()).collect::<Result<_>>()?;
    let (m, k) = x.dims2()?;
    let (xs, xl) = x.storage_and_layout();
    let guards: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let name = "r2vpo-linear-many";
    let xv = f32_data(&xs, xl, name)?;
    let mut wv = Vec::with_capacity(ws.len());
    for ((g, l), w) in guards.iter().zip(&ws) {
        if w.dim(1)? != k {
            return Err(Error::Msg(format!("{name}: x (…, {k}) against w {:?}", w.dims())));
        }
        wv.push((f32_data(g, l, name)?, w.dim(0)?));
    }
    let outs = super::small_gemm::linear(xv, m, k, &wv);
    outs.into_iter().zip(&wv).map(|(o, &(_, n))| Tensor::from_vec(o, (m, n), x.device())).collect()
}

// ---------------------------------------------------------------- decode attention

/// Queries per row at or below which [`attention_no_grad`] runs: decode
/// steps (one new token) and short chunks. Longer passes go to candle's
/// batched matmuls, which block for the cache and win there.
pub const ATTENTION_MAX_T: usize = 8;

/// Scaled-dot-product attention for a step that records no gradient, in
/// one pass per (row, kv head): `q (B, Hkv, G·T, D)` (already scaled; the
/// G query heads sharing a kv head stacked as `G·T` rows, `T` new tokens
/// each), `k, v (B, Hkv, TK, D)` with any strides but a unit last one (the
/// KV cache's views), additive `mask (B, 1, 1, T, TK)`. Returns
/// `(B, Hkv, G·T, D)`, or `None` where it does not apply (a gradient, not
/// f32 on the CPU, `T` above [`ATTENTION_MAX_T`]) and the caller runs the
/// matmul–softmax–matmul composite. Replaces eight candle ops (and their
/// allocations) per layer per decode step; same arithmetic (score, mask,
/// max-shifted exp, normalise, weighted sum) in another summation order.
///
/// `shared[r] = (s, l)` (empty: none) says row `r`'s first `l` keys and
/// values are those of row `s` ([`super::transformer::KvCache`]'s record of
/// rows replicated from one prefill): they are read from row `s`, so the
/// samples of one prompt read its keys from memory once, not once each.
/// The values are the same either way; wrong entries give wrong results.
pub fn attention_no_grad(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    t: usize,
    shared: &[(usize, usize)],
) -> Result<Option<Tensor>> {
    let ok = t <= ATTENTION_MAX_T
        && fused_ok(q)
        && [q, k, v, mask].iter().all(|x| x.dtype() == DType::F32 && !x.track_op() && x.device().is_cpu());
    if !ok {
        return Ok(None);
    }
    let (b, hk, gt, d) = q.dims4()?;
    let tk = k.dim(2)?;
    if k.dims4()? != (b, hk, tk, d)
        || v.dims4()? != (b, hk, tk, d)
        || mask.dims() != [b, 1, 1, t, tk]
        || gt % t != 0
        || !(shared.is_empty() || shared.len() == b && shared.iter().all(|&(s, _)| s < b))
    {
        return Err(Error::Msg(format!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?} for {t} new tokens, {} shared rows",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.dims(),
            shared.len()
        )));
    }
    let (q, mask) = (q.contiguous()?, mask.contiguous()?);
    let name = "r2vpo-attention";
    let (qg, ql) = q.storage_and_layout();
    let (mg, ml) = mask.storage_and_layout();
    let (kg, kl) = k.storage_and_layout();
    let (vg, vl) = v.storage_and_layout();
    let (qd, md) = (f32_data(&qg, ql, name)?, f32_data(&mg, ml, name)?);
    let (kd, vd) = (f32_storage(&kg, name)?, f32_storage(&vg, name)?);
    let (ks, vs) = (kl.stride(), vl.stride());
    if ks[3] != 1 || vs[3] != 1 {
        return Ok(None);
    }
    let (ko, vo) = (kl.start_offset(), vl.start_offset());
    let mut out = vec![0f32; b * hk * gt * d];
    // The SIMD pass's score sums follow the vector width (8 or 16 lanes);
    // the portable one's do not.
    let reference = super::kernels::reference();
    out.par_chunks_mut(gt * d).enumerate().for_each(|(rh, o)| {
        let (r, h) = (rh / hk, rh % hk);
        let (s, l) = shared.get(r).copied().unwrap_or((r, 0));
        let kv = KvRows {
            k: &kd[ko + r * ks[0] + h * ks[1]..],
            v: &vd[vo + r * vs[0] + h * vs[1]..],
            k_shared: &kd[ko + s * ks[0] + h * ks[1]..],
            v_shared: &vd[vo + s * vs[0] + h * vs[1]..],
            shared: l.min(tk),
            k_row: ks[2],
            v_row: vs[2],
            mask: &md[r * t * tk..(r + 1) * t * tk],
            t,
            tk,
            d,
        };
        let qs = &qd[rh * gt * d..(rh + 1) * gt * d];
        if reference {
            attend_any(qs, kv, o);
        } else {
            pulp::Arch::new().dispatch(Attend((qs, kv, o)));
        }
    });
    Ok(Some(Tensor::from_vec(out, (b, hk, gt, d), q.device())?))
}

/// The f32 data of a CPU tensor's storage: all of it (for strided views,
/// read through their layout), or [`f32_data`]'s contiguous run.
fn f32_storage<'a>(g: &'a candle_core::Storage, op: &str) -> Result<&'a [f32]> {
    match g {
        candle_core::Storage::Cpu(CpuStorage::F32(v)) => Ok(v.as_slice()),
        _ => Err(Error::Msg(format!("{op}: f32 CPU tensors only"))),
    }
}

/// The elements of a contiguous f32 CPU tensor, from its storage and layout.
fn f32_data<'a>(g: &'a candle_core::Storage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    contiguous(f32_storage(g, op)?, l, op)
}

/// The keys, values and mask one (row, kv head) of [`attention_no_grad`]
/// attends to: keys `TK` rows apart by their strides (`k_row`, `v_row`),
/// the first `shared` read from the row that shares them, `mask (T, TK)`.
#[derive(Clone, Copy)]
struct KvRows<'a> {
    k: &'a [f32],
    v: &'a [f32],
    k_shared: &'a [f32],
    v_shared: &'a [f32],
    shared: usize,
    k_row: usize,
    v_row: usize,
    mask: &'a [f32],
    t: usize,
    tk: usize,
    d: usize,
}

impl<'a> KvRows<'a> {
    /// Key `j`'s buffer and where in it the key starts.
    #[inline(always)]
    fn key_at(&self, j: usize) -> (&'a [f32], usize) {
        (if j < self.shared { self.k_shared } else { self.k }, j * self.k_row)
    }

    /// Value `j`'s buffer and where in it the value starts.
    #[inline(always)]
    fn value_at(&self, j: usize) -> (&'a [f32], usize) {
        (if j < self.shared { self.v_shared } else { self.v }, j * self.v_row)
    }

    /// Key `j` (`d` values).
    #[inline(always)]
    fn key(&self, j: usize) -> &'a [f32] {
        let (x, at) = self.key_at(j);
        &x[at..at + self.d]
    }

    /// Value `j` (`d` values).
    #[inline(always)]
    fn value(&self, j: usize) -> &'a [f32] {
        let (x, at) = self.value_at(j);
        &x[at..at + self.d]
    }

    /// Query row `qi`'s mask over the keys (rows cycle through the `T` new
    /// tokens).
    #[inline(always)]
    fn mask_of(&self, qi: usize) -> &'a [f32] {
        &self.mask[(qi % self.t) * self.tk..(qi % self.t + 1) * self.tk]
    }
}

/// One (row, kv head) of [`attention_no_grad`]: `q (G·T, D)` against a
/// [`KvRows`], into `o (G·T, D)`, compiled for the widest SIMD the CPU has
/// (pulp's dispatch).
struct Attend<'a>((&'a [f32], KvRows<'a>, &'a mut [f32]));

impl pulp::WithSimd for Attend<'_> {
    type Output = ();

    /// Head sizes of 64 and 128 (SmolLM2, Llama, Qwen) hold the query and
    /// the output row in registers ([`attend_rows`]); others run
    /// [`attend_any`].
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let (q, kv, o) = self.0;
        match (S::F32_LANES, kv.d) {
            (16, 64) | (8, 32) => attend_rows::<S, 4>(simd, q, kv, o),
            (16, 128) | (8, 64) => attend_rows::<S, 8>(simd, q, kv, o),
            (8, 128) => attend_rows::<S, 16>(simd, q, kv, o),
            _ => attend_any(q, kv, o),
        }
    }
}

/// [`Attend`] for `D = C` SIMD vectors, in explicit vector operations: the
/// compiler's own vectorisation of these loops (plain arrays of 16 lanes)
/// came out two lanes wide with the output row kept in memory, which
/// chained every key's update to the previous one's store; that pass was
/// 19 % of decode time at batch 32 (perf, SmolLM2). The query rows go in
/// blocks of up to `16 / C` ([`attend_block`]), so every key and value row
/// is loaded once per block rather than once per query.
#[inline(always)]
fn attend_rows<S: pulp::Simd, const C: usize>(simd: S, q: &[f32], kv: KvRows, o: &mut [f32]) {
    let d = kv.d;
    let mut p = vec![0f32; 4 * kv.tk];
    let rows = q.len() / d;
    let mut i = 0;
    while i < rows {
        let n = (rows - i).min((16 / C).max(1));
        let (q, o) = (&q[i * d..(i + n) * d], &mut o[i * d..(i + n) * d]);
        match n {
            1 => attend_block::<S, C, 1>(simd, q, kv, o, i, &mut p),
            2 => attend_block::<S, C, 2>(simd, q, kv, o, i, &mut p),
            3 => attend_block::<S, C, 3>(simd, q, kv, o, i, &mut p),
            _ => attend_block::<S, C, 4>(simd, q, kv, o, i, &mut p),
        }
        i += n;
    }
}

/// `N` query rows of [`attend_rows`] (the first is row `first` of the
/// (row, kv head), which picks their mask rows) against one pass over the
/// keys and one over the values. At batch 32 the cache holds about a
/// quarter of the bytes a decode step reads, and one query at a time read
/// each key and value row once per query head sharing it (SmolLM2: three).
/// Each query's arithmetic is the one-query loop's, in its order (a score
/// is one multiply–add chain over the `C` vectors, then a lane sum; the
/// output sums the keys in order), so the results are the same bits.
#[inline(always)]
fn attend_block<S: pulp::Simd, const C: usize, const N: usize>(
    simd: S,
    q: &[f32],
    kv: KvRows,
    o: &mut [f32],
    first: usize,
    p: &mut [f32],
) {
    let (tk, d) = (kv.tk, kv.d);
    let zero = simd.splat_f32s(0.0);
    let row = |x: &[f32]| -> [S::f32s; C] {
        let xs = S::as_simd_f32s(x).0;
        let mut r = [zero; C];
        r.copy_from_slice(&xs[..C]);
        r
    };
    let qv: [[S::f32s; C]; N] = std::array::from_fn(|a| row(&q[a * d..(a + 1) * d]));
    let mr: [&[f32]; N] = std::array::from_fn(|a| kv.mask_of(first + a));
    let p = &mut p[..N * tk];
    for j in 0..tk {
        let (ahead, at) = kv.key_at(j + PREFETCH_ROWS);
        prefetch_row::<L1>(ahead, at, d);
        let (value, at) = kv.value_at(j);
        prefetch_row::<L2>(value, at, d);
        let kj = row(kv.key(j));
        for a in 0..N {
            let mut acc = zero;
            for c in 0..C {
                acc = simd.mul_add_e_f32s(qv[a][c], kj[c], acc);
            }
            p[a * tk + j] = simd.reduce_sum_f32s(acc) + mr[a][j];
        }
    }
    let mut inv = [0f32; N];
    for (a, pa) in p.chunks_exact_mut(tk).enumerate() {
        let mx = max16(pa);
        inv[a] = 1.0 / exp_shifted16((pa, mx));
    }
    let mut acc = [[zero; C]; N];
    for j in 0..tk {
        let vj = row(kv.value(j));
        for a in 0..N {
            let w = simd.splat_f32s(p[a * tk + j] * inv[a]);
            for c in 0..C {
                acc[a][c] = simd.mul_add_e_f32s(w, vj[c], acc[a][c]);
            }
        }
    }
    for (a, or) in o.chunks_exact_mut(d).enumerate() {
        S::as_mut_simd_f32s(or).0[..C].copy_from_slice(&acc[a]);
    }
}

/// Key rows ahead of the one being scored that [`attend_block`] asks for
/// (into L1), while it asks for the value row of the same index (into L2,
/// as the values are read only after the softmax). The cache comes from
/// memory in every decode step, and without these requests the hardware's
/// own prefetching kept too few lines in flight: the kernel read keys and
/// values at 10–12 GB/s (`ops::timing`, batch 32, SmolLM2), where a plain
/// two-thread stream reads 23–25. With them: 18–21 GB/s (16 rows ahead;
/// 8 and 32 were slower, and values into L1 as well slower still).
const PREFETCH_ROWS: usize = 16;

#[cfg(target_arch = "x86_64")]
const L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const L2: i32 = 0;

/// Asks for the cache lines of `x[at..at + d]` into the cache `HINT` names
/// ([`L1`], [`L2`]); nothing if out of range, or off x86-64.
#[inline(always)]
fn prefetch_row<const HINT: i32>(x: &[f32], at: usize, d: usize) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, at, d);
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = x.get(at..at + d) {
        for i in (0..d).step_by(16) {
            // SAFETY: a prefetch is a hint that never faults, and the
            // address is in bounds.
            unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(r.as_ptr().add(i).cast()) }
        }
    }
}

/// [`Attend`] for any head size.
#[inline(always)]
fn attend_any(q: &[f32], kv: KvRows, o: &mut [f32]) {
    let (tk, d) = (kv.tk, kv.d);
    let mut p = vec![0f32; tk];
    for (qi, (qr, or)) in q.chunks_exact(d).zip(o.chunks_exact_mut(d)).enumerate() {
        let mr = kv.mask_of(qi);
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = dot(qr, kv.key(j)) + mr[j];
        }
        let mx = max16(&p);
        let inv = 1.0 / exp_shifted16((&mut p, mx));
        for (j, &pj) in p.iter().enumerate() {
            let w = pj * inv;
            for (a, &x) in or.iter_mut().zip(kv.value(j)) {
                *a += w * x;
            }
        }
    }
}

// ---------------------------------------------------------------- attention

/// Query rows per block of [`attention`]: keys after the last one any row
/// of the block sees are skipped, so a causal pass of `T` rows computes
/// about `(T + ROWS) / 2T` of the full scores (SmolLM2's step, T = 300:
/// 0.61 at 64 rows, 0.58 at 48). Smaller blocks skip more but give the
/// products thinner shapes. Timed inside a SmolLM2 step
/// (`results/bench/kernel-ab/avx2-backward-vs-openblas-2026-11-27/`), the
/// attention's forward + backward: on gemm 32, 64, 128 and 300 rows 0.49 + 1.08, 0.47 + 1.05, 0.52 + 1.15
/// and 0.65 + 1.57 s; on the AVX2 kernel 48, 60, 64 and 96 rows 0.40 +
/// 0.91, 0.44 + 0.92, 0.43 + 1.01 and 0.46 + 0.98 s (48: a multiple of its
/// 6-row tile). The block changes a score's bits (the products' shapes), so
/// the gemm and AMX paths keep the 64 their pinned runs were recorded with.
fn attention_rows() -> usize {
    if super::kernels::on_avx2() {
        48
    } else {
        64
    }
}

/// An additive mask entry at or below this hides its key. The model's mask
/// uses −1e9; any score plus −1e4 is far past where `exp` reaches zero, so
/// skipping such keys (rather than adding the mask and exponentiating)
/// leaves every softmax unchanged.
const HIDDEN: f64 = -1e4;

/// Scaled-dot-product attention, differentiable, that keeps no `(T × TK)`
/// tensor: `q (B, Hkv, G·T, D)` already scaled (the G query heads sharing a
/// kv head stacked as `G·T` rows of `T` queries each), `k, v (B, Hkv, TK,
/// D)`, additive `mask (B, 1, 1, T, TK)` (0 or ≤ −1e4). Returns `(B, Hkv,
/// G·T, D)`, `softmax(q·kᵀ + mask)·v`.
///
/// On the CPU in f32/f64 it is one op whose backward recomputes the scores
/// a block of query rows at a time (FlashAttention's recomputation, Dao et
/// al. 2022, without its tiling of the keys: a block's `64 × TK` scores fit
/// in L2), so the graph keeps only `q`, `k`, `v` and the output. The
/// composite it replaces kept three `(B, H, T, TK)` tensors per layer
/// (scores, masked scores, probabilities): 78 MB a layer, 2.3 GB for
/// SmolLM2's step at 8 × 300 tokens. Blocks also skip the keys that the
/// causal mask hides from all their rows. Elsewhere (another device or
/// dtype, [`with_composites`]) it is [`attention_composite`].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, t: usize) -> Result<Tensor> {
    let same = [k, v, mask].iter().all(|x| x.dtype() == q.dtype() && x.device().is_cpu());
    if !(fused_ok(q) && same) {
        return attention_composite(q, k, v, mask, t);
    }
    attention_dims(q, k, v, mask, t)?;
    // Views with a unit last stride (the KV cache's) are read in place.
    let rows = |x: &Tensor| if x.stride()[3] == 1 { Ok(x.clone()) } else { x.contiguous() };
    q.contiguous()?.apply_op3(&rows(k)?, &rows(v)?, Attention { mask: mask.contiguous()?, t })
}

/// Reference attention from candle ops: scores, mask, softmax, weighted sum.
pub fn attention_composite(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, t: usize) -> Result<Tensor> {
    let (b, hk, g, _, tk, _) = attention_dims(q, k, v, mask, t)?;
    let scores = q.matmul(&k.t()?)?.reshape((b, hk, g, t, tk))?.broadcast_add(mask)?;
    softmax_last_dim(&scores)?.reshape((b, hk, g * t, tk))?.matmul(v)
}

/// `(B, Hkv, G, T, TK, D)` of an attention's operands, or an error naming
/// their shapes.
fn attention_dims(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    t: usize,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let (b, hk, gt, d) = q.dims4()?;
    let tk = k.dim(2)?;
    if t == 0
        || gt % t != 0
        || k.dims4()? != (b, hk, tk, d)
        || v.dims4()? != (b, hk, tk, d)
        || mask.dims() != [b, 1, 1, t, tk]
    {
        return Err(Error::Msg(format!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?} for {t} queries a row",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.dims()
        )));
    }
    Ok((b, hk, gt / t, t, tk, d))
}

/// The fused op: `q`, `k`, `v` are its arguments, the mask a constant.
struct Attention {
    mask: Tensor,
    t: usize,
}

/// A `(B, Hkv, N, D)` operand on the CPU: its elements from the start
/// offset on, and its first three strides (the last is 1).
struct Heads<'a, T> {
    data: &'a [T],
    stride: [usize; 3],
}

impl<'a, T> Heads<'a, T> {
    fn new(s: &'a [T], l: &Layout, op: &str) -> Result<Self> {
        let st = l.stride();
        if st.len() != 4 || st[3] != 1 {
            return Err(Error::Msg(format!("{op}: operands need a unit last stride, got {st:?}")));
        }
        Ok(Heads { data: &s[l.start_offset()..], stride: [st[0], st[1], st[2]] })
    }

    /// Row `r`, kv head `h`: its rows from the first on, `stride[2]` apart.
    fn at(&self, r: usize, h: usize) -> &'a [T] {
        &self.data[r * self.stride[0] + h * self.stride[1]..]
    }
}

/// One past the last key each `(row, query)` of `mask (B·T, TK)` sees, or
/// all `TK` for a query that sees none (the composite spreads its softmax
/// evenly over every key, and so must this).
fn key_bounds<T: Float>(mask: &[T], tk: usize) -> Vec<usize> {
    let hidden = T::from_f64(HIDDEN);
    mask.chunks_exact(tk).map(|m| m.iter().rposition(|&x| x > hidden).map_or(tk, |j| j + 1)).collect()
}

/// `c = a · b` (or `c += a · b` with `acc`), row-major `c (m × n)` with row
/// stride `ldc`, `a (m × k)` and `b (k × n)` with (row, column) strides, on
/// one thread (the callers run heads in parallel): in f32 on the AVX2
/// kernel where it runs ([`Float::mm_avx2`]: inside a SmolLM2 step the
/// attention's forward and backward took 0.43 + 1.01 s on it against gemm's
/// 0.47 + 1.05 s at 64-row blocks,
/// `results/bench/kernel-ab/avx2-backward-vs-openblas-2026-11-27/`), else on
/// gemm's microkernels.
#[allow(clippy::too_many_arguments)]
fn mm<T: Float>(
    (m, n, k): (usize, usize, usize),
    c: &mut [T],
    ldc: usize,
    acc: bool,
    a: &[T],
    (ars, acs): (usize, usize),
    b: &[T],
    (brs, bcs): (usize, usize),
) {
    let span = |r: usize, c: usize, rs: usize, cs: usize| (r - 1) * rs + (c - 1) * cs + 1;
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(span(m, k, ars, acs) <= a.len() && span(k, n, brs, bcs) <= b.len() && span(m, n, ldc, 1) <= c.len());
    if super::kernels::reference() {
        r2vpo_kernels::product([m, k, n], (a, (ars, acs)), (b, (brs, bcs)), c, ldc, acc);
        return;
    }
    if T::mm_avx2((m, n, k), c, ldc, acc, a, (ars, acs), b, (brs, bcs)) {
        return;
    }
    // SAFETY: the assert keeps every index gemm forms from these strides
    // inside the three slices, and `c` does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            acc,
            a.as_ptr(),
            acs as isize,
            ars as isize,
            b.as_ptr(),
            bcs as isize,
            brs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Shapes of one (row, kv head) of [`attention`].
#[derive(Clone, Copy)]
struct Unit {
    g: usize,
    t: usize,
    tk: usize,
    d: usize,
}

impl Unit {
    /// Each block of query rows: its first row in the `G·T` stack, its row
    /// count, its first query position in `0..T`, and the keys it sees.
    fn blocks<'a>(&self, hi: &'a [usize]) -> impl Iterator<Item = (usize, usize, usize, usize)> + 'a {
        let (Unit { g, t, .. }, rows) = (*self, attention_rows());
        (0..g).flat_map(move |gi| {
            (0..t).step_by(rows).map(move |i0| {
                let i1 = (i0 + rows).min(t);
                (gi * t + i0, i1 - i0, i0, hi[i0..i1].iter().copied().max().unwrap_or(1))
            })
        })
    }

    /// `s (n × kn) = softmax(q_rows · k[..kn]ᵀ + mask)`, the block's
    /// probabilities, for query positions `i0..i0 + n`.
    #[allow(clippy::too_many_arguments)]
    fn probs<T: Float>(
        &self,
        s: &mut [T],
        q: &[T],
        k: &[T],
        ks: usize,
        mask: &[T],
        (n, i0, kn): (usize, usize, usize),
    ) {
        let (tk, d) = (self.tk, self.d);
        mm((n, kn, d), s, kn, false, q, (d, 1), k, (1, ks));
        for (i, row) in s.chunks_exact_mut(kn).enumerate() {
            let m = &mask[(i0 + i) * tk..(i0 + i) * tk + kn];
            for (x, &a) in row.iter_mut().zip(m) {
                *x = *x + a;
            }
            let mx = T::row_max(row);
            let inv = T::ONE / T::exp_shifted(row, mx);
            row.iter_mut().for_each(|x| *x = *x * inv);
        }
    }
}

fn attention_fwd<T: Float>(q: &[T], k: Heads<T>, v: Heads<T>, mask: &[T], dims: (usize, usize, Unit)) -> Vec<T> {
    let (b, hk, u) = dims;
    let (gt, tk, d) = (u.g * u.t, u.tk, u.d);
    let hi = key_bounds(mask, tk);
    let mut out = vec![T::ZERO; b * hk * gt * d];
    out.par_chunks_mut(gt * d).enumerate().for_each(|(rh, o)| {
        let (r, h) = (rh / hk, rh % hk);
        let (kr, vr, qr) = (k.at(r, h), v.at(r, h), &q[rh * gt * d..(rh + 1) * gt * d]);
        let (mr, hr) = (&mask[r * u.t * tk..(r + 1) * u.t * tk], &hi[r * u.t..(r + 1) * u.t]);
        let mut s = vec![T::ZERO; attention_rows().min(u.t) * tk];
        for (row, n, i0, kn) in u.blocks(hr) {
            let s = &mut s[..n * kn];
            u.probs(s, &qr[row * d..], kr, k.stride[2], mr, (n, i0, kn));
            mm((n, d, kn), &mut o[row * d..], d, false, s, (kn, 1), vr, (v.stride[2], 1));
        }
    });
    out
}

/// The gradients `(dq, dk, dv)` for the upstream `dout (B, Hkv, G·T, D)`:
/// per block, P again, then `dv += Pᵀ·dout`, `dP = dout·vᵀ`,
/// `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dq = dS·k`, `dk += dSᵀ·q`.
fn attention_bwd<T: Float>(
    q: &[T],
    k: Heads<T>,
    v: Heads<T>,
    mask: &[T],
    dout: &[T],
    dims: (usize, usize, Unit),
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (b, hk, u) = dims;
    let (gt, tk, d) = (u.g * u.t, u.tk, u.d);
    let hi = key_bounds(mask, tk);
    let mut dq = vec![T::ZERO; b * hk * gt * d];
    let mut dk = vec![T::ZERO; b * hk * tk * d];
    let mut dv = vec![T::ZERO; b * hk * tk * d];
    let units = dq.par_chunks_mut(gt * d).zip(dk.par_chunks_mut(tk * d)).zip(dv.par_chunks_mut(tk * d));
    units.enumerate().for_each(|(rh, ((dq, dk), dv))| {
        let (r, h) = (rh / hk, rh % hk);
        let (kr, vr) = (k.at(r, h), v.at(r, h));
        let (qr, gr) = (&q[rh * gt * d..(rh + 1) * gt * d], &dout[rh * gt * d..(rh + 1) * gt * d]);
        let (mr, hr) = (&mask[r * u.t * tk..(r + 1) * u.t * tk], &hi[r * u.t..(r + 1) * u.t]);
        let cap = attention_rows().min(u.t) * tk;
        let (mut s, mut dp) = (vec![T::ZERO; cap], vec![T::ZERO; cap]);
        for (row, n, i0, kn) in u.blocks(hr) {
            let (s, dp) = (&mut s[..n * kn], &mut dp[..n * kn]);
            u.probs(s, &qr[row * d..], kr, k.stride[2], mr, (n, i0, kn));
            mm((kn, d, n), dv, d, true, s, (1, kn), &gr[row * d..], (d, 1));
            mm((n, kn, d), dp, kn, false, &gr[row * d..], (d, 1), vr, (1, v.stride[2]));
            for (pr, dr) in s.chunks_exact(kn).zip(dp.chunks_exact_mut(kn)) {
                let dot: T = pr.iter().zip(dr.iter()).map(|(&p, &x)| p * x).sum();
                dr.iter_mut().zip(pr).for_each(|(x, &p)| *x = p * (*x - dot));
            }
            mm((n, d, kn), &mut dq[row * d..], d, false, dp, (kn, 1), kr, (k.stride[2], 1));
            mm((kn, d, n), dk, d, true, dp, (1, kn), &qr[row * d..], (d, 1));
        }
    });
    (dq, dk, dv)
}

impl Attention {
    fn dims(&self, q: &Layout, k: &Layout) -> Result<(usize, usize, Unit)> {
        let (b, hk, gt, d) = q.shape().dims4()?;
        Ok((b, hk, Unit { g: gt / self.t, t: self.t, tk: k.dims()[2], d }))
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "r2vpo-attention"
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
        let dims = self.dims(l1, l2)?;
        let (ms, ml) = self.mask.storage_and_layout();
        let out = match (s1, s2, s3, &*ms) {
            (
                CpuStorage::F32(q),
                CpuStorage::F32(k),
                CpuStorage::F32(v),
                candle_core::Storage::Cpu(CpuStorage::F32(m)),
            ) => {
                let (k, v) = (Heads::new(k, l2, n)?, Heads::new(v, l3, n)?);
                CpuStorage::F32(attention_fwd(contiguous(q, l1, n)?, k, v, contiguous(m, ml, n)?, dims))
            }
            (
                CpuStorage::F64(q),
                CpuStorage::F64(k),
                CpuStorage::F64(v),
                candle_core::Storage::Cpu(CpuStorage::F64(m)),
            ) => {
                let (k, v) = (Heads::new(k, l2, n)?, Heads::new(v, l3, n)?);
                CpuStorage::F64(attention_fwd(contiguous(q, l1, n)?, k, v, contiguous(m, ml, n)?, dims))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = self.name();
        let grad = grad.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (ms, ml) = self.mask.storage_and_layout();
        let dims = self.dims(ql, kl)?;
        use candle_core::Storage::Cpu;
        let (dq, dk, dv) = match (&*qs, &*ks, &*vs, &*gs, &*ms) {
            (
                Cpu(CpuStorage::F32(q)),
                Cpu(CpuStorage::F32(k)),
                Cpu(CpuStorage::F32(v)),
                Cpu(CpuStorage::F32(g)),
                Cpu(CpuStorage::F32(m)),
            ) => {
                let (k, v) = (Heads::new(k, kl, n)?, Heads::new(v, vl, n)?);
                let (q, g, m) = (contiguous(q, ql, n)?, contiguous(g, gl, n)?, contiguous(m, ml, n)?);
                let (a, b, c) = attention_bwd(q, k, v, m, g, dims);
                (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(c))
            }
            (
                Cpu(CpuStorage::F64(q)),
                Cpu(CpuStorage::F64(k)),
                Cpu(CpuStorage::F64(v)),
                Cpu(CpuStorage::F64(g)),
                Cpu(CpuStorage::F64(m)),
            ) => {
                let (k, v) = (Heads::new(k, kl, n)?, Heads::new(v, vl, n)?);
                let (q, g, m) = (contiguous(q, ql, n)?, contiguous(g, gl, n)?, contiguous(m, ml, n)?);
                let (a, b, c) = attention_bwd(q, k, v, m, g, dims);
                (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(c))
            }
            _ => return Err(Error::Msg(format!("{n}: backward needs f32 or f64 CPU tensors of one dtype"))),
        };
        let dev = q.device();
        let wrap = |s: CpuStorage, shape: &[usize]| -> Result<Tensor> {
            match s {
                CpuStorage::F32(x) => Tensor::from_vec(x, shape, dev),
                CpuStorage::F64(x) => Tensor::from_vec(x, shape, dev),
                _ => unreachable!("built above as f32 or f64"),
            }
        };
        Ok((Some(wrap(dq, q.dims())?), Some(wrap(dk, k.dims())?), Some(wrap(dv, v.dims())?)))
    }
}

// ---------------------------------------------------------------- swiglu

/// `silu(a) ⊙ b`, the gated MLP's product, as one op: the composite kept
/// `silu(a)` as well (one `(B·T, intermediate)` tensor a layer, 14.7 MB in
/// SmolLM2's step at 8 × 300 tokens, 0.44 GB over its 30 layers) and ran
/// four elementwise passes where this runs one forward and one backward.
struct SwiGlu;

/// Elements per parallel task of the elementwise SwiGLU passes.
const SWIGLU_CHUNK: usize = 4096;

fn sigmoid<T: Float>(x: T) -> T {
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

// ---------------------------------------------------------------- rms norm

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
        let dw = x.apply_op3_no_bwd(w, &g, &RmsNormBwd { eps: self.eps, want_w: true })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Gradients of RMSNorm. With r = (mean x² + ε)^(-1/2):
/// dx = r·(g⊙w) − x·r³·mean(g⊙w⊙x), dw = Σ_rows g⊙x·r.
struct RmsNormBwd {
    eps: f64,
    want_w: bool,
}

fn rms_bwd<T: Float>(x: &[T], w: &[T], g: &[T], d: usize, eps: f64, want_w: bool) -> Vec<T> {
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

// ---------------------------------------------------------------- rope

/// Rotate-half RoPE on `x: (B, H, T, D)` with tables `cos, sin: (B, T, D/2)`.
/// `inverse` rotates by −θ, which is exactly the backward of the forward.
struct Rope {
    inverse: bool,
}

/// `x` from its start offset, read through its first three strides (the
/// last is 1), so the `(B, T, H, D)` projections transposed to `(B, H, T,
/// D)` are read in place rather than copied first. The output is contiguous.
fn rope_kernel<T: Float>(
    x: &[T],
    st: [usize; 3],
    cos: &[T],
    sin: &[T],
    dims: (usize, usize, usize, usize),
    inverse: bool,
) -> Vec<T> {
    let (b, h, t, d) = dims;
    let half = d / 2;
    let mut out = vec![T::ZERO; b * h * t * d];
    // One chunk = one (b, h, t) vector; its table row is (b, t).
    for_rows(&mut out, d, |i, o| {
        let (bi, hi, ti) = (i / (h * t), i / t % h, i % t);
        let tab = (bi * t + ti) * half;
        let (c, s) = (&cos[tab..tab + half], &sin[tab..tab + half]);
        let at = bi * st[0] + hi * st[1] + ti * st[2];
        let xi = &x[at..at + d];
        let (x1, x2) = xi.split_at(half);
        let (o1, o2) = o.split_at_mut(half);
        for j in 0..half {
            let sj = if inverse { -s[j] } else { s[j] };
            o1[j] = x1[j] * c[j] - x2[j] * sj;
            o2[j] = x2[j] * c[j] + x1[j] * sj;
        }
    });
    out
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "r2vpo-rope"
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
        let (b, h, t, d) = l1.shape().dims4()?;
        let (cb, ct, ch) = l2.shape().dims3()?;
        if d % 2 != 0 || (cb, ct, ch) != (b, t, d / 2) || l3.shape() != l2.shape() {
            return Err(Error::Msg(format!(
                "{n}: x {:?} needs cos/sin of shape ({b}, {t}, {}), got {:?} / {:?}",
                l1.dims(),
                d / 2,
                l2.dims(),
                l3.dims()
            )));
        }
        let dims = (b, h, t, d);
        let st = l1.stride();
        if st[3] != 1 {
            return Err(Error::Msg(format!("{n}: x needs a unit last stride, got {st:?}")));
        }
        let (st, at) = ([st[0], st[1], st[2]], l1.start_offset());
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(c), CpuStorage::F32(s)) => CpuStorage::F32(rope_kernel(
                &x[at..],
                st,
                contiguous(c, l2, n)?,
                contiguous(s, l3, n)?,
                dims,
                self.inverse,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(c), CpuStorage::F64(s)) => CpuStorage::F64(rope_kernel(
                &x[at..],
                st,
                contiguous(c, l2, n)?,
                contiguous(s, l3, n)?,
                dims,
                self.inverse,
            )),
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The tables are constants (built from positions), so only x gets a gradient.
        let dx = grad.contiguous()?.apply_op3_no_bwd(cos, sin, &Rope { inverse: !self.inverse })?;
        Ok((Some(dx), None, None))
    }
}

/// Rotate-half RoPE (Hugging Face layout) on `x: (B, H, T, D)` with per-row
/// tables `cos, sin: (B, T, D/2)`; differentiable in `x`. Tables multiplied
/// by a constant scale the output by it (the queries' `1/√D`). On the CPU a
/// view of `x` with a unit last stride is read in place; the result is
/// contiguous.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_ok(x) && cos.dtype() == x.dtype() {
        let x = if x.rank() == 4 && x.stride()[3] == 1 { x.clone() } else { x.contiguous()? };
        x.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { inverse: false })
    } else {
        rope_composite(x, cos, sin)
    }
}

/// Reference RoPE from candle primitives.
pub fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let c = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let s = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&c)? + rot.broadcast_mul(&s)?
}

// ---------------------------------------------------------------- log-prob gather

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The RMSNorm weight gradient sums its row blocks in block order, so
    /// it is the same bits on one thread as on several; and it agrees with
    /// a plain f64 sum over rows.
    #[test]
    fn rms_weight_gradient_is_the_same_on_any_thread_count() {
        let (rows, d) = (300, 96);
        let x: Vec<f32> = (0..rows * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let g: Vec<f32> = (0..rows * d).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
        let w = vec![1.0f32; d];
        assert!(x.len() >= PAR_MIN, "big enough to run in parallel");
        let on = |n: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
            pool.install(|| rms_bwd(&x, &w, &g, d, 1e-6, true))
        };
        let one = on(1);
        assert_eq!(one, on(2));
        assert_eq!(one, on(3));
        for (j, &v) in one.iter().enumerate() {
            let want: f64 = (0..rows)
                .map(|r| {
                    let xi = &x[r * d..(r + 1) * d];
                    let ms = xi.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / d as f64;
                    f64::from(g[r * d + j]) * f64::from(xi[j]) / (ms + 1e-6).sqrt()
                })
                .sum();
            assert!((f64::from(v) - want).abs() <= 1e-5 * want.abs().max(1.0), "dw[{j}] {v} vs {want}");
        }
    }

    /// The vectorised `exp` against libm's over its whole domain, within
    /// 2 ulp; exactly 0 where it cuts off and 1 at 0.
    #[test]
    fn exp_nonpos_is_within_two_ulp_of_libm() {
        let mut worst = 0f32;
        for i in 0..=2_000_000 {
            let x = -87.0 * i as f32 / 2_000_000.0;
            let (got, want) = (exp_nonpos(x), x.exp());
            worst = worst.max((got - want).abs() / (want * f32::EPSILON));
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_nonpos(0.0), 1.0);
        // Reading n from t's mantissa gives `n as i32`'s power of two: the
        // same bits as the form with the saturating cast.
        let with_cast = |x: f32| {
            let xc = x.max(-87.0);
            let n = (xc * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            let two_n = f32::from_bits(((n as i32 + 127) << 23) as u32);
            (n, two_n)
        };
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let (n, two_n) = with_cast(x);
            let t = x * std::f32::consts::LOG2_E + 12_582_912.0;
            let ni = (t.to_bits() as i32).wrapping_sub(12_582_912f32.to_bits() as i32);
            assert_eq!((ni as f32, f32::from_bits(((ni + 127) << 23) as u32)), (n, two_n), "{x}");
        }
        assert_eq!(exp_nonpos(-88.0), 0.0);
        assert_eq!(exp_nonpos(-1e9), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpos(f32::NAN).is_nan());
    }

    /// The sampler's pass over a vocabulary against libm's f64: Σe and Σe·d
    /// to 3e-7 relative, each exponential within its rounding; argmax is the first
    /// largest and skips NaN, as a plain scan's `>` does.
    #[test]
    fn exp_moments_and_argmax_match_f64() {
        let x: Vec<f32> = (0..49_157).map(|i| ((i as f32) * 0.731).sin() * 9.0 - 4.0).collect();
        let (i, m) = argmax(&x);
        let first = x.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (j, &v)| if v > b.1 { (j, v) } else { b });
        assert_eq!((i, m), first);
        let mut e = Vec::new();
        let (s0, s1) = exp_moments(&x, m, Some(&mut e));
        assert_eq!(exp_moments(&x, m, None), (s0, s1));
        let d: Vec<f64> = x.iter().map(|&v| f64::from(v) - f64::from(m)).collect();
        let want0: f64 = d.iter().map(|v| v.exp()).sum();
        let want1: f64 = d.iter().map(|v| v.exp() * v).sum();
        assert!((s0 / want0 - 1.0).abs() < 3e-7 && (s1 / want1 - 1.0).abs() < 3e-7, "{s0} {want0} {s1} {want1}");
        assert_eq!(e.len(), x.len());
        // Each exponential: 2 ulp, plus the f32 subtraction's half ulp of d.
        for (a, v) in e.iter().zip(&d) {
            assert!((a - v.exp()).abs() <= (3e-7 + 6e-8 * v.abs()) * v.exp(), "{a} vs e^{v}");
        }
        assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, f32::NAN, 3.0]), (2, 3.0));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), (0, f32::NEG_INFINITY));
        assert_eq!(argmax(&[]), (0, f32::NEG_INFINITY));
    }

    /// The f32 softmax loops (16 lanes and a tail) against plain ones.
    #[test]
    fn f32_row_loops_match_scalar_ones() {
        let x: Vec<f32> = (0..103).map(|i| ((i as f32) * 0.37).sin() * 5.0 - 2.0).collect();
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(<f32 as Float>::row_max(&x), m);
        let want: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
        let sum: f32 = want.iter().sum();
        assert!((<f32 as Float>::sum_exp_shifted(&x, m) - sum).abs() < 1e-5 * sum);
        let mut y = x.clone();
        assert!((<f32 as Float>::exp_shifted(&mut y, m) - sum).abs() < 1e-5 * sum);
        let mut z = vec![0f32; x.len()];
        <f32 as Float>::scaled_exp_shifted(&x, m, -3.0, &mut z);
        for ((a, b), w) in y.iter().zip(&z).zip(&want) {
            assert!((a - w).abs() < 1e-6 && (b + 3.0 * w).abs() < 3e-6);
        }
    }
}

#[cfg(test)]
mod timing {
    use candle_core::{Device, Tensor};

    /// Not a test: milliseconds per decode step of [`super::attention_no_grad`]
    /// over SmolLM2's 30 layers at batch 32 (3 kv heads of 3 queries, D 64,
    /// caches of 172 columns, each layer's its own so they come from memory
    /// as in a step), at the key counts a 44-token prompt + 128-token decode
    /// passes through (`cargo test --release -p r2vpo-llm --lib
    /// ops::timing -- --ignored --nocapture`; `HOT=1`: one layer's cache,
    /// which stays in L3).
    #[test]
    #[ignore]
    fn smollm2_decode_attention() {
        let (b, hk, g, d, cap) = (32, 3, 3, 64, 172);
        let layers = if std::env::var("HOT").is_ok() { 1 } else { 30 };
        let dev = Device::Cpu;
        let rand = || Tensor::rand(-1f32, 1.0, (b, hk, cap, d), &dev).unwrap();
        let caches: Vec<(Tensor, Tensor)> = (0..layers).map(|_| (rand(), rand())).collect();
        let q = Tensor::rand(-0.1f32, 0.1, (b, hk, g, d), &dev).unwrap();
        for tk in [44, 76, 108, 140, 172] {
            let mask = Tensor::zeros((b, 1, 1, 1, tk), candle_core::DType::F32, &dev).unwrap();
            let reps = 600 / layers;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for (k, v) in &caches {
                    let (k, v) = (k.narrow(2, 0, tk).unwrap(), v.narrow(2, 0, tk).unwrap());
                    std::hint::black_box(super::attention_no_grad(&q, &k, &v, &mask, 1, &[]).unwrap());
                }
            }
            let s = t.elapsed().as_secs_f64() / (reps * layers) as f64 * 30.0;
            let bytes = (30 * b * hk * tk * d * 4 * 2) as f64;
            println!("tk {tk:3}: {:.2} ms per step, {:.1} GB/s of keys and values", s * 1e3, bytes / s / 1e9);
        }
    }

    /// Not a test: GFLOP/s of the learner's products on the CPU kernel that
    /// runs them here (gemm, or AMX's where the CPU has it for the forward),
    /// at SmolLM2's shapes for 8 × 300 tokens: forward `x · wᵀ`, the
    /// input gradient `g · w` and the weight gradient `gᵀ · x`
    /// (`cargo test --release -p r2vpo-llm --lib ops::timing::learner_products
    /// -- --ignored --nocapture`; `scripts/hf/products.py` times PyTorch's).
    #[test]
    #[ignore]
    fn learner_products() {
        let dev = Device::Cpu;
        let rows = 2400;
        let mut all = (0.0, 0.0);
        for (k, n) in [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)] {
            let m = if n == 49152 { 2048 } else { rows };
            let x = Tensor::rand(-1f32, 1.0, (m, k), &dev).unwrap();
            let w = Tensor::rand(-1f32, 1.0, (n, k), &dev).unwrap();
            let g = Tensor::rand(-1f32, 1.0, (m, n), &dev).unwrap();
            let flop = 2.0 * (m * n * k) as f64;
            let mut line = format!("{m}x{k}x{n}:");
            for (name, f) in [
                ("fwd", &(|| super::linear(&x, &w).map(|_| ())) as &dyn Fn() -> candle_core::Result<()>),
                ("dx", &|| super::matmul(&g, &w).map(|_| ())),
                ("dw", &|| super::matmul(&g.t()?, &x).map(|_| ())),
            ] {
                f().unwrap();
                let reps = 3;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    f().unwrap();
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                all = (all.0 + flop, all.1 + s);
                line += &format!("  {name} {:6.1} GFLOP/s ({:5.1} ms)", flop / s / 1e9, s * 1e3);
            }
            println!("{line}");
        }
        println!("all: {:.1} GFLOP/s", all.0 / all.1 / 1e9);
    }
}
