//! Small descriptive statistics shared by the trainers, benchmarks and
//! analyses (one home, so every table computes them the same way).

/// Mean and population standard deviation (divides by n). `(0, 0)` for an
/// empty slice.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n).sqrt())
}

/// The `q`-quantile of an ascending slice by linear interpolation between
/// order statistics (numpy's default `linear` method). Panics on an empty
/// slice.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (pos - lo as f64) * (sorted[hi] - sorted[lo])
}

/// The median of `v` (sorted in place; NaN sorts last), the mean of the two
/// middle values for an even count. Panics on an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile_sorted(v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_numpy() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - 1.118_033_988_749_895).abs() < 1e-15);
        assert_eq!(mean_std(&[]), (0.0, 0.0));
        let v = [1.0, 2.0, 4.0, 8.0];
        // numpy.quantile([1, 2, 4, 8], [0, .25, .5, .9]) = 1, 1.75, 3, 6.8
        assert_eq!(quantile_sorted(&v, 0.0), 1.0);
        assert_eq!(quantile_sorted(&v, 0.25), 1.75);
        assert_eq!(quantile_sorted(&v, 0.5), 3.0);
        assert!((quantile_sorted(&v, 0.9) - 6.8).abs() < 1e-12);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
