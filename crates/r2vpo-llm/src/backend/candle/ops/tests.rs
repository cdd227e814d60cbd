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
