//! f32 loops over slices that vectorise under pulp's run-time dispatch
//! (AVX-512, AVX2 or NEON): a vectorisable `e^x` for `x ≤ 0`
//! ([`exp_nonpos`]), softmax's row passes, SwiGLU and its gradient, and a
//! sampler's pass over the logits ([`exp_moments`], [`argmax`]). The
//! candle backend's ops and the sampler call them; nothing here knows of
//! tensors.

/// `e^x` for `x ≤ 0` in plain arithmetic that vectorises: Cephes' `expf`
/// (range reduction by `ln 2` in two parts, a degree-6 polynomial on
/// `|r| ≤ ln 2 / 2`, the power of two put into the exponent bits), 0 below
/// −87 where `e^x` leaves the normal floats. Within 2 ulp of libm's `expf`
/// (tested over the whole range).
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
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
pub fn exp_moments(x: &[f32], m: f32, out: Option<&mut Vec<f64>>) -> (f64, f64) {
    pulp::Arch::new().dispatch(ExpMoments((x, m, out)))
}

/// The first index of the largest element and the element (`(0, −inf)` if
/// none is above −inf; NaNs are skipped), a vectorised max then a scan.
pub fn argmax(x: &[f32]) -> (usize, f32) {
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
pub fn sigmoid(x: f32) -> f32 {
    let e = exp_nonpos(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 {
        r
    } else {
        e * r
    }
}

/// [`swiglu`]'s loop.
#[inline(always)]
fn swiglu_rows((o, a, b): (&mut [f32], &[f32], &[f32])) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = x * sigmoid(x) * y;
    }
}

/// [`swiglu_grad`]'s loop.
#[inline(always)]
fn swiglu_grad_rows(((da, db), a, b, g): SwigluGradArgs) {
    for (((da, db), (&x, &y)), &gi) in da.iter_mut().zip(db.iter_mut()).zip(a.iter().zip(b)).zip(g) {
        let s = sigmoid(x);
        *db = gi * x * s;
        *da = gi * y * s * (1.0 + x * (1.0 - s));
    }
}

/// [`exp_shifted`] in 16 lanes, for a caller already inside a kernel
/// pulp dispatched (it inlines there; [`exp_shifted`] dispatches anew).
#[inline(always)]
pub fn exp_shifted16((x, m): (&mut [f32], f32)) -> f32 {
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

/// [`sum_exp_shifted`] in 16 lanes.
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

/// [`scaled_exp_shifted`]'s loop.
#[inline(always)]
fn scaled_exp_shifted16((x, m, c, out): (&[f32], f32, f32, &mut [f32])) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = c * exp_nonpos(v - m);
    }
}

/// The largest of `x` in 16 independent lanes (so it vectorises), for a
/// caller already inside a kernel pulp dispatched ([`row_max`] dispatches).
#[inline(always)]
pub fn max16(x: &[f32]) -> f32 {
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

/// The largest element (`-inf` for an empty slice; NaNs are skipped), in 16
/// independent lanes.
pub fn row_max(x: &[f32]) -> f32 {
    pulp::Arch::new().dispatch(RowMax(x))
}

/// `x ← e^(x − m)` elementwise; returns the sum of the new values. `m` is
/// at least every element (a softmax's shift).
pub fn exp_shifted(x: &mut [f32], m: f32) -> f32 {
    pulp::Arch::new().dispatch(ExpShifted((x, m)))
}

/// `Σ e^(x − m)` for `m` at least every element.
pub fn sum_exp_shifted(x: &[f32], m: f32) -> f32 {
    pulp::Arch::new().dispatch(SumExpShifted((x, m)))
}

/// `out ← c · e^(x − m)` for `m` at least every element.
pub fn scaled_exp_shifted(x: &[f32], m: f32, c: f32, out: &mut [f32]) {
    pulp::Arch::new().dispatch(ScaledExpShifted((x, m, c, out)))
}

/// SwiGLU, `o ← silu(a) ⊙ b` elementwise.
pub fn swiglu(o: &mut [f32], a: &[f32], b: &[f32]) {
    pulp::Arch::new().dispatch(SwigluRows((o, a, b)))
}

/// SwiGLU's gradients for the upstream `g`: `db ← g ⊙ silu(a)`,
/// `da ← g ⊙ b ⊙ σ(a)(1 + a(1 − σ(a)))`.
pub fn swiglu_grad(d: (&mut [f32], &mut [f32]), a: &[f32], b: &[f32], g: &[f32]) {
    pulp::Arch::new().dispatch(SwigluGradRows((d, a, b, g)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
