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
