//! dm_control's `rewards.tolerance`, with the same floating-point operation
//! order so rewards match bit-for-bit up to libm differences.

/// Shapes of the fall-off outside the bounds (`utils/rewards.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sigmoid {
    /// `exp(-½(d·s)²)`, `s = √(−2 ln v)`.
    Gaussian,
    /// `1 − d(1−v)` while positive.
    Linear,
    /// `1 − (d√(1−v))²` while positive.
    Quadratic,
    /// `1/cosh(d·acosh(1/v))`.
    Hyperbolic,
    /// `1/((d√(1/v−1))² + 1)`.
    LongTail,
    /// `1/(|d|(1/v−1) + 1)`.
    Reciprocal,
    /// `(1 + cos(π d k))/2` while `|d k| < 1`, `k = acos(2v−1)/π`.
    Cosine,
    /// `1 − tanh(d·atanh(√(1−v)))²`.
    TanhSquared,
}

/// dm_control's default `value_at_margin`.
pub const DEFAULT_VALUE_AT_MARGIN: f64 = 0.1;

fn sigmoid(x: f64, value_at_1: f64, kind: Sigmoid) -> f64 {
    match kind {
        Sigmoid::Gaussian => {
            let scale = (-2.0 * value_at_1.ln()).sqrt();
            let y = x * scale;
            (-0.5 * (y * y)).exp()
        }
        Sigmoid::Linear => {
            let scaled = x * (1.0 - value_at_1);
            if scaled.abs() < 1.0 {
                1.0 - scaled
            } else {
                0.0
            }
        }
        Sigmoid::Quadratic => {
            let scaled = x * (1.0 - value_at_1).sqrt();
            if scaled.abs() < 1.0 {
                1.0 - scaled * scaled
            } else {
                0.0
            }
        }
        Sigmoid::Hyperbolic => 1.0 / (x * (1.0 / value_at_1).acosh()).cosh(),
        Sigmoid::LongTail => {
            let y = x * (1.0 / value_at_1 - 1.0).sqrt();
            1.0 / (y * y + 1.0)
        }
        Sigmoid::Reciprocal => 1.0 / (x.abs() * (1.0 / value_at_1 - 1.0) + 1.0),
        Sigmoid::Cosine => {
            let scaled = x * ((2.0 * value_at_1 - 1.0).acos() / std::f64::consts::PI);
            if scaled.abs() < 1.0 {
                (1.0 + (std::f64::consts::PI * scaled).cos()) / 2.0
            } else {
                0.0
            }
        }
        Sigmoid::TanhSquared => {
            let t = (x * (1.0 - value_at_1).sqrt().atanh()).tanh();
            1.0 - t * t
        }
    }
}

/// 1 inside `[lower, upper]`; outside, 0 when `margin == 0`, else the sigmoid
/// of the distance to the nearest bound divided by `margin`.
pub fn tolerance(x: f64, (lower, upper): (f64, f64), margin: f64, kind: Sigmoid, value_at_margin: f64) -> f64 {
    debug_assert!(lower <= upper && margin >= 0.0);
    let in_bounds = lower <= x && x <= upper;
    if in_bounds {
        1.0
    } else if margin == 0.0 {
        0.0
    } else {
        let d = if x < lower { lower - x } else { x - upper } / margin;
        sigmoid(d, value_at_margin, kind)
    }
}

/// `tolerance` with bounds only (gaussian, no margin): an indicator.
pub fn in_bounds(x: f64, bounds: (f64, f64)) -> f64 {
    tolerance(x, bounds, 0.0, Sigmoid::Gaussian, DEFAULT_VALUE_AT_MARGIN)
}

/// NumPy's pairwise summation for arrays up to 128 elements (eight
/// interleaved accumulators from 8 elements on), so means match `np.mean`.
pub fn np_sum(xs: &[f64]) -> f64 {
    if xs.len() < 8 {
        let mut s = 0.0;
        for &x in xs {
            s += x;
        }
        return s;
    }
    if xs.len() > 128 {
        let mid = xs.len() / 2;
        let mid = mid - mid % 8;
        return np_sum(&xs[..mid]) + np_sum(&xs[mid..]);
    }
    let mut r = [0.0f64; 8];
    r.copy_from_slice(&xs[..8]);
    let mut i = 8;
    while i + 8 <= xs.len() {
        for k in 0..8 {
            r[k] += xs[i + k];
        }
        i += 8;
    }
    let mut s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for &x in &xs[i..] {
        s += x;
    }
    s
}

/// `np.mean` of a slice.
pub fn np_mean(xs: &[f64]) -> f64 {
    np_sum(xs) / xs.len() as f64
}

/// `np.linalg.norm` of a short vector (`sqrt(x·x)`).
pub fn norm(xs: &[f64]) -> f64 {
    let mut s = 0.0;
    for &x in xs {
        s += x * x;
    }
    s.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_matches_reference_points() {
        // Values at the margin equal value_at_margin by construction.
        for kind in [
            Sigmoid::Gaussian,
            Sigmoid::Hyperbolic,
            Sigmoid::LongTail,
            Sigmoid::Reciprocal,
            Sigmoid::Cosine,
            Sigmoid::Linear,
            Sigmoid::Quadratic,
            Sigmoid::TanhSquared,
        ] {
            let v = tolerance(3.0, (0.0, 1.0), 2.0, kind, 0.1);
            assert!((v - 0.1).abs() < 1e-12, "{kind:?}: {v}");
            assert_eq!(tolerance(0.5, (0.0, 1.0), 2.0, kind, 0.1), 1.0);
        }
        assert_eq!(in_bounds(2.0, (0.0, 1.0)), 0.0);
        assert_eq!(tolerance(-3.0, (0.0, 0.0), 1.0, Sigmoid::Linear, 0.0), 0.0);
    }

    #[test]
    fn np_sum_is_pairwise() {
        let xs: Vec<f64> = (0..21).map(|i| 0.1 * i as f64).collect();
        let direct: f64 = xs.iter().sum();
        assert!((np_sum(&xs) - direct).abs() < 1e-12);
    }
}
