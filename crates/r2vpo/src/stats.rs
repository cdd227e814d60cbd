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

/// A point estimate with a two-sided confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    /// The statistic on the data as observed.
    pub point: f64,
    /// The interval's lower end.
    pub lo: f64,
    /// The interval's upper end.
    pub hi: f64,
}

/// The interquartile mean: the mean of the values left after cutting
/// `⌊n/4⌋` from each end of the sorted values (`scipy.stats.trim_mean(v,
/// 0.25)`, rliable's `aggregate_iqm`). NaN for an empty slice.
pub fn iqm(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let cut = s.len() / 4;
    let mid = &s[cut..s.len() - cut];
    mid.iter().sum::<f64>() / mid.len() as f64
}

/// `P(X > Y)` for one task: the Mann–Whitney U of `x` over the pairs,
/// counting ties as half (rliable's `probability_of_improvement` per
/// task). NaN if either is empty.
pub fn prob_greater(x: &[f64], y: &[f64]) -> f64 {
    mann_whitney_u(x, y) / (x.len() * y.len()) as f64
}

/// `U_x = Σᵢⱼ [xᵢ > yⱼ] + ½ [xᵢ = yⱼ]`.
pub fn mann_whitney_u(x: &[f64], y: &[f64]) -> f64 {
    x.iter()
        .map(|&a| {
            y.iter()
                .map(|&b| {
                    if a > b {
                        1.0
                    } else if a == b {
                        0.5
                    } else {
                        0.0
                    }
                })
                .sum::<f64>()
        })
        .sum()
}

/// Most ways of splitting the pooled values that [`mann_whitney_exact`]
/// enumerates (`C(20, 10)` ≈ 1.8e5 is within).
pub const EXACT_MAX_SPLITS: u64 = 5_000_000;

/// The exact two-sided Mann–Whitney test of `x` against `y`: `(U_x, p)`,
/// with `p = min(1, 2 · min(P(U ≤ U_x), P(U ≥ U_x)))` under the
/// permutation distribution of `U` (every way of drawing `|x|` of the
/// pooled values, equally likely under the null), which is scipy's
/// `mannwhitneyu(x, y, method="exact")` where there are no ties and stays
/// exact with ties (ties count ½, as in [`mann_whitney_u`]). `None` where
/// either sample is empty or there are more than [`EXACT_MAX_SPLITS`] splits.
pub fn mann_whitney_exact(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let (n, k) = (x.len() + y.len(), x.len());
    if x.is_empty() || y.is_empty() {
        return None;
    }
    let splits = (0..k as u64).try_fold(1u64, |c, i| c.checked_mul(n as u64 - i).map(|c| c / (i + 1)))?;
    if splits > EXACT_MAX_SPLITS {
        return None;
    }
    let pooled: Vec<f64> = x.iter().chain(y).copied().collect();
    let u = mann_whitney_u(x, y);
    // In half-units, so ties count exactly.
    let (u2, mut le, mut ge) = ((2.0 * u).round() as i64, 0u64, 0u64);
    let mut chosen = Vec::with_capacity(k);
    fn walk(pooled: &[f64], start: usize, k: usize, chosen: &mut Vec<usize>, visit: &mut dyn FnMut(&[usize])) {
        if chosen.len() == k {
            visit(chosen);
            return;
        }
        for i in start..=pooled.len() - (k - chosen.len()) {
            chosen.push(i);
            walk(pooled, i + 1, k, chosen, visit);
            chosen.pop();
        }
    }
    walk(&pooled, 0, k, &mut chosen, &mut |c| {
        let mut twice = 0i64;
        let mut ci = 0;
        for (i, &a) in pooled.iter().enumerate() {
            if ci < c.len() && c[ci] == i {
                ci += 1;
                continue;
            }
            // `a` is in the other group: compare it with every chosen value.
            for &j in c {
                let b = pooled[j];
                twice += if b > a { 2 } else { i64::from(b == a) };
            }
        }
        le += u64::from(twice <= u2);
        ge += u64::from(twice >= u2);
    });
    let p = (2.0 * le.min(ge) as f64 / splits as f64).min(1.0);
    Some((u, p))
}

/// The percentile bootstrap confidence interval at `level` (e.g. 0.95) of
/// `mean(x) − mean(y)`: `reps` resamples, each group drawn with
/// replacement from itself, from a ChaCha8 stream seeded with `seed`
/// (the same inputs give the same interval).
pub fn bootstrap_mean_difference(x: &[f64], y: &[f64], reps: usize, level: f64, seed: u64) -> Interval {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let point = mean(x) - mean(y);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    let mut draws: Vec<f64> = (0..reps)
        .map(|_| {
            let mut resampled_mean = |v: &[f64]| {
                (0..v.len()).map(|_| v[rand::Rng::random_range(&mut rng, 0..v.len())]).sum::<f64>() / v.len() as f64
            };
            resampled_mean(x) - resampled_mean(y)
        })
        .collect();
    percentile_interval(point, &mut draws, level)
}

/// Scores indexed `[method][task][run]`.
pub type Scores = [Vec<Vec<f64>>];

/// The stratified bootstrap confidence interval at `level` of a statistic
/// of several methods' scores (rliable's `get_interval_estimates` with its
/// default independent stratified bootstrap): `scores[method][task]` holds
/// one score per run; each resample redraws every method's runs of every
/// task with replacement, independently of the other methods and tasks,
/// and applies `stat` to the resampled scores. `reps` resamples from a
/// ChaCha8 stream seeded with `seed`; the percentile interval.
pub fn stratified_bootstrap(
    scores: &Scores,
    stat: &dyn Fn(&Scores) -> f64,
    reps: usize,
    level: f64,
    seed: u64,
) -> Interval {
    let point = stat(scores);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    let mut draws: Vec<f64> = (0..reps)
        .map(|_| {
            let resampled: Vec<Vec<Vec<f64>>> = scores
                .iter()
                .map(|tasks| {
                    tasks
                        .iter()
                        .map(|runs| {
                            (0..runs.len()).map(|_| runs[rand::Rng::random_range(&mut rng, 0..runs.len())]).collect()
                        })
                        .collect()
                })
                .collect();
            stat(&resampled)
        })
        .collect();
    percentile_interval(point, &mut draws, level)
}

fn percentile_interval(point: f64, draws: &mut [f64], level: f64) -> Interval {
    draws.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    Interval { point, lo: quantile_sorted(draws, tail), hi: quantile_sorted(draws, 1.0 - tail) }
}

/// The mean of `v` with the Student-t confidence interval at `level`
/// (`mean ± t₍₁₊ₗₑᵥₑₗ₎⸝₂,ₙ₋₁ · s/√n`, `s` the sample SD): the learning
/// curves' bands over seeds. The interval is the mean alone for one value.
pub fn mean_t_interval(v: &[f64], level: f64) -> Interval {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return Interval { point: m, lo: m, hi: m };
    }
    let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let h = student_t_quantile((1.0 + level) / 2.0, n - 1.0) * sd / n.sqrt();
    Interval { point: m, lo: m - h, hi: m + h }
}

/// The `p`-quantile of Student's t with `df` degrees of freedom, for `p`
/// in (0.5, 1): bisection on the distribution function, which is
/// `1 − ½ I_{df/(df+t²)}(df/2, ½)` (the regularized incomplete beta).
pub fn student_t_quantile(p: f64, df: f64) -> f64 {
    assert!(p > 0.5 && p < 1.0 && df > 0.0, "student_t_quantile({p}, {df})");
    let cdf = |t: f64| 1.0 - 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
    let (mut lo, mut hi) = (0.0, 1.0);
    while cdf(hi) < p {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let s = C[1..].iter().enumerate().fold(C[0], |s, (i, c)| s + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

/// The regularized incomplete beta `I_x(a, b)` by its continued fraction
/// (modified Lentz), on the side where it converges fast.
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(b, a, 1.0 - x);
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp() / a;
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    d = if d.abs() < tiny { tiny } else { d };
    d = 1.0 / d;
    let mut f = d;
    for m in 1..500 {
        let m = m as f64;
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            d = if d.abs() < tiny { tiny } else { d };
            c = 1.0 + num / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-16 {
            break;
        }
    }
    front * f
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

    #[test]
    fn iqm_and_probability_of_improvement_match_their_definitions() {
        // trim_mean(range(1, 11), 0.25) = mean(3..=8) = 5.5.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(iqm(&v), 5.5);
        // n = 5: one cut from each end.
        assert_eq!(iqm(&[10.0, 1.0, 3.0, 2.0, 100.0]), 5.0);
        assert_eq!(prob_greater(&[2.0, 3.0], &[1.0, 1.0]), 1.0);
        assert_eq!(prob_greater(&[1.0, 3.0], &[2.0, 2.0]), 0.5);
        assert_eq!(prob_greater(&[2.0], &[2.0]), 0.5);
        assert_eq!(mann_whitney_u(&[1.0, 4.0, 5.0], &[2.0, 3.0]), 4.0);
    }

    #[test]
    fn mann_whitney_exact_matches_scipy() {
        // scipy.stats.mannwhitneyu(x, y, method="exact"): no overlap at
        // 5 + 5 is U = 0 or 25 with p = 2/252.
        let (x, y) = ([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]);
        let (u, p) = mann_whitney_exact(&x, &y).unwrap();
        assert_eq!(u, 0.0);
        assert!((p - 2.0 / 252.0).abs() < 1e-15, "{p}");
        let (u, p) = mann_whitney_exact(&y, &x).unwrap();
        assert_eq!(u, 25.0);
        assert!((p - 2.0 / 252.0).abs() < 1e-15);
        // mannwhitneyu([1, 3, 5, 7, 9], [2, 4, 6, 8, 10], method="exact")
        // = (10.0, 0.6904761904761905).
        let (u, p) = mann_whitney_exact(&[1.0, 3.0, 5.0, 7.0, 9.0], &[2.0, 4.0, 6.0, 8.0, 10.0]).unwrap();
        assert_eq!(u, 10.0);
        assert!((p - 0.690_476_190_476_190_5).abs() < 1e-12, "{p}");
        // Counted by hand for 2 + 2 values: the 6 splits give U = 0, 1, 2,
        // 2, 3, 4, so U = 1 has P(U ≤ 1) = 2/6 and p = 4/6.
        let (u, p) = mann_whitney_exact(&[1.0, 3.0], &[2.0, 4.0]).unwrap();
        assert_eq!(u, 1.0);
        assert!((p - 4.0 / 6.0).abs() < 1e-15);
        // All values tied: every split gives U = 2, so p = 1.
        assert_eq!(mann_whitney_exact(&[1.0, 1.0], &[1.0, 1.0]), Some((2.0, 1.0)));
        assert_eq!(mann_whitney_exact(&[], &[1.0]), None);
        assert_eq!(mann_whitney_exact(&[0.0; 20], &[0.0; 20]), None, "C(40, 20) splits is too many");
    }

    #[test]
    fn bootstrap_intervals_have_known_answers() {
        // The resampled mean of {0, 0, 0, 0, 1} is Binomial(5, 0.2)/5:
        // P(0) = 0.328 > 2.5 % and P(≤ 0.4) = 0.942 < 97.5 % < P(≤ 0.6) =
        // 0.993, so the 95 % interval is [0, 0.6] up to resampling noise
        // far smaller than those gaps.
        let ci = bootstrap_mean_difference(&[0.0, 0.0, 0.0, 0.0, 1.0], &[0.0], 10_000, 0.95, 0);
        assert_eq!((ci.point, ci.lo, ci.hi), (0.2, 0.0, 0.6));
        // Constant groups: a degenerate interval at the difference.
        let ci = bootstrap_mean_difference(&[3.0; 5], &[1.0; 5], 1000, 0.95, 7);
        assert_eq!((ci.point, ci.lo, ci.hi), (2.0, 2.0, 2.0));
        // Seeded: the same call gives the same interval.
        let (x, y) = ([0.3, 0.9, 0.5, 0.7, 0.2], [0.1, 0.4, 0.2, 0.35, 0.6]);
        assert_eq!(bootstrap_mean_difference(&x, &y, 2000, 0.95, 3), bootstrap_mean_difference(&x, &y, 2000, 0.95, 3));
        // Stratified: one task, one method, {0, 0, 0, 0, 1} again.
        let scores = vec![vec![vec![0.0, 0.0, 0.0, 0.0, 1.0]]];
        let mean = |s: &[Vec<Vec<f64>>]| s[0][0].iter().sum::<f64>() / 5.0;
        let ci = stratified_bootstrap(&scores, &mean, 10_000, 0.95, 0);
        assert_eq!((ci.point, ci.lo, ci.hi), (0.2, 0.0, 0.6));
        // Probability of improvement with no overlap in any resample: 1.
        let two = vec![vec![vec![5.0, 6.0], vec![7.0, 8.0]], vec![vec![1.0, 2.0], vec![3.0, 4.0]]];
        let poi = |s: &[Vec<Vec<f64>>]| (prob_greater(&s[0][0], &s[1][0]) + prob_greater(&s[0][1], &s[1][1])) / 2.0;
        let ci = stratified_bootstrap(&two, &poi, 1000, 0.95, 0);
        assert_eq!((ci.point, ci.lo, ci.hi), (1.0, 1.0, 1.0));
    }

    #[test]
    fn student_t_quantiles_match_tables() {
        // scipy.stats.t.ppf(0.975, df).
        for (df, want) in [(1.0, 12.706_204_736_174_698), (4.0, 2.776_445_105_197_799), (30.0, 2.042_272_456_301_238)] {
            let t = student_t_quantile(0.975, df);
            assert!((t - want).abs() < 1e-9 * want, "df {df}: {t} against {want}");
        }
        let ci = mean_t_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95);
        // mean 3, s = √2.5, t₀.₉₇₅,₄ · s/√5.
        let h = 2.776_445_105_197_799 * 2.5f64.sqrt() / 5f64.sqrt();
        assert!((ci.lo - (3.0 - h)).abs() < 1e-9 && (ci.hi - (3.0 + h)).abs() < 1e-9);
        assert_eq!(mean_t_interval(&[2.0], 0.95), Interval { point: 2.0, lo: 2.0, hi: 2.0 });
    }
}
