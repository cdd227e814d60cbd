//! Advantage estimators: GAE for the control experiments and group-relative
//! advantages for the LLM experiments (Algorithm 1, line "Compute advantages
//! Â by GAE or relative group").
//!
//! Both compute in `f64` and hand back `f32`: the rollouts are `f32`, but the
//! backward recursion of GAE over long horizons and the group means/variances
//! lose digits in single precision for no benefit.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Discount and trace parameters of GAE (the `[gae]` table of a run config).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GaeConfig {
    /// Discount γ. 0.995 is the paper's control value (Appendix C, Part II).
    pub gamma: f64,
    /// Trace parameter λ_GAE. The paper does not report it; 0.95 is the
    /// Brax / MuJoCo Playground PPO default that its control setup follows.
    pub lambda: f64,
}

impl Default for GaeConfig {
    fn default() -> Self {
        GaeConfig { gamma: 0.995, lambda: 0.95 }
    }
}

impl GaeConfig {
    /// Checks that γ and λ lie in [0, 1]; errors name `gae.gamma` /
    /// `gae.lambda`.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("gamma", self.gamma), ("lambda", self.lambda)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::InvalidConfig {
                    field: format!("gae.{name}"),
                    message: format!("must lie in [0, 1], got {v}"),
                });
            }
        }
        Ok(())
    }
}

/// Generalised advantage estimation (Schulman et al. 2016) over a time-major
/// rollout of `T` steps × `n_envs` environments, flattened so that step `t`
/// of env `n` is at index `t * n_envs + n`.
///
/// ```text
/// δ_t = r_t + γ (1 − term_t) V(s_{t+1}) − V(s_t)
/// A_t = δ_t + γ λ (1 − done_t) A_{t+1},     done_t = term_t ∨ trunc_t
/// R_t = A_t + V(s_t)                        (the value-function target)
/// ```
///
/// * `next_values[i]` is V(s_{t+1}) for every step. For a **truncated** step
///   it must be the value of the true final observation (before the
///   environment auto-resets), because the episode would have continued; for
///   a **terminated** step it is ignored (the bootstrap is 0). For the last
///   step of the rollout it is the bootstrap value. Elsewhere it equals
///   `values` of the next step; using `next_values` everywhere keeps one code
///   path and lets the caller hand in one batched critic evaluation.
/// * The trace is cut at every episode end, terminated or truncated, so no
///   advantage leaks across an auto-reset into the next episode.
/// * A step both terminated and truncated counts as terminated (the MDP
///   really ended, so nothing is bootstrapped).
///
/// Returns `(advantages, returns)` in the same layout.
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    terminated: &[bool],
    truncated: &[bool],
    n_envs: usize,
    cfg: &GaeConfig,
) -> Result<(Vec<f32>, Vec<f32>)> {
    cfg.validate()?;
    let len = rewards.len();
    if n_envs == 0 || !len.is_multiple_of(n_envs) {
        return Err(Error::Shape(format!("gae: {len} rewards do not form a (T, {n_envs}) rollout")));
    }
    for (name, l) in [
        ("values", values.len()),
        ("next_values", next_values.len()),
        ("terminated", terminated.len()),
        ("truncated", truncated.len()),
    ] {
        if l != len {
            return Err(Error::Shape(format!("gae: {name} has {l} entries, rewards has {len}")));
        }
    }
    let (gamma, lambda) = (cfg.gamma, cfg.lambda);
    let steps = len / n_envs;
    let mut adv = vec![0.0f32; len];
    let mut ret = vec![0.0f32; len];
    // Running A_{t+1} per env; at the last rollout step there is no A_{t+1},
    // and the bootstrap lives entirely in next_values, so it starts at 0.
    let mut next_adv = vec![0.0f64; n_envs];
    for t in (0..steps).rev() {
        for (n, a_next) in next_adv.iter_mut().enumerate() {
            let i = t * n_envs + n;
            let v = f64::from(values[i]);
            let bootstrap = if terminated[i] { 0.0 } else { gamma * f64::from(next_values[i]) };
            let delta = f64::from(rewards[i]) + bootstrap - v;
            let carry = if terminated[i] || truncated[i] { 0.0 } else { gamma * lambda * *a_next };
            let a = delta + carry;
            *a_next = a;
            adv[i] = a as f32;
            ret[i] = (a + v) as f32;
        }
    }
    Ok((adv, ret))
}

/// Which standard deviation normalises a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdKind {
    /// Bessel-corrected, divides by `G − 1`: `torch.std`'s default and
    /// therefore what verl (and TRL, OpenRLHF) compute.
    #[default]
    Unbiased,
    /// Population std, divides by `G` (`numpy.std`'s default).
    Biased,
}

/// How group-relative advantages are normalised (the `[group_norm]` table of
/// a run config).
///
/// Defaults follow verl's GRPO estimator, the framework the paper builds on:
/// `(R − mean) / (std + 1e-6)` with the Bessel-corrected std. Other
/// frameworks differ only in ε: TRL uses 1e-4, OpenRLHF's `group_norm` 1e-9.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupNormConfig {
    /// Divide by the group std (GRPO). `false` gives Dr.GRPO's `R − mean`,
    /// which removes the std's bias towards too easy / too hard prompts; the
    /// Dr.GRPO recipe pairs it with the constant-length `SeqMeanTokenSumNorm`
    /// aggregation (see [`crate::aggregate`]).
    pub scale_by_std: bool,
    /// Bessel-corrected or population std.
    pub std: StdKind,
    /// Added to the std before dividing, so near-constant groups do not
    /// explode. verl's value.
    pub eps: f64,
}

impl Default for GroupNormConfig {
    fn default() -> Self {
        GroupNormConfig { scale_by_std: true, std: StdKind::Unbiased, eps: 1e-6 }
    }
}

impl GroupNormConfig {
    /// Dr.GRPO: centre by the group mean, do not scale.
    pub fn dr_grpo() -> Self {
        GroupNormConfig { scale_by_std: false, ..Self::default() }
    }

    /// Checks that ε is finite and ≥ 0; errors name `group_norm.eps`.
    pub fn validate(&self) -> Result<()> {
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(Error::InvalidConfig {
                field: "group_norm.eps".into(),
                message: format!("must be finite and >= 0, got {}", self.eps),
            });
        }
        Ok(())
    }
}

fn check_groups(rewards: &[f32], group_size: usize) -> Result<()> {
    if group_size == 0 {
        return Err(Error::InvalidConfig { field: "group_size".into(), message: "must be >= 1".into() });
    }
    if !rewards.len().is_multiple_of(group_size) {
        return Err(Error::Shape(format!(
            "{} rewards are not a whole number of groups of {group_size}",
            rewards.len()
        )));
    }
    // A NaN reward (a crashed verifier) would otherwise turn its whole group
    // into NaN advantages and only surface later as a NaN loss.
    if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
        return Err(Error::InvalidConfig {
            field: format!("rewards[{i}]"),
            message: format!("reward {} is not finite", rewards[i]),
        });
    }
    Ok(())
}

/// Exact equality, not a tolerance: a group whose rewards differ at all
/// carries a learning signal, however small.
fn is_constant(group: &[f32]) -> bool {
    group.iter().all(|&r| r == group[0])
}

/// Group-relative advantages (GRPO; verl's `compute_grpo_outcome_advantage`):
/// for each consecutive group of `group_size` responses to one prompt,
///
/// ```text
/// Â_i = (R_i − mean_g) / (std_g + ε)     (scale_by_std)
/// Â_i =  R_i − mean_g                    (Dr.GRPO)
/// ```
///
/// A group whose rewards are all equal — every response right or every one
/// wrong — gets exactly zero advantages; it is detected explicitly because
/// `R − mean` of equal floats is not always exactly 0. This also covers
/// `group_size == 1`, where the unbiased std is undefined (verl instead
/// substitutes mean 0, std 1 and passes the raw reward through; a single
/// sample carries no relative signal, so we give it none).
///
/// Errors if `group_size == 0`, if the rewards are not a whole number of
/// groups, or if a reward is not finite.
pub fn group_relative(rewards: &[f32], group_size: usize, cfg: &GroupNormConfig) -> Result<Vec<f32>> {
    cfg.validate()?;
    check_groups(rewards, group_size)?;
    let mut out = Vec::with_capacity(rewards.len());
    for group in rewards.chunks_exact(group_size) {
        if is_constant(group) {
            out.extend(std::iter::repeat_n(0.0f32, group.len()));
            continue;
        }
        let g = group.len() as f64;
        let mean = group.iter().map(|&r| f64::from(r)).sum::<f64>() / g;
        let ss = group.iter().map(|&r| (f64::from(r) - mean).powi(2)).sum::<f64>();
        let scale = if cfg.scale_by_std {
            // A non-constant group has G ≥ 2, so G − 1 ≥ 1.
            let dof = match cfg.std {
                StdKind::Unbiased => g - 1.0,
                StdKind::Biased => g,
            };
            (ss / dof).sqrt() + cfg.eps
        } else {
            1.0
        };
        out.extend(group.iter().map(|&r| ((f64::from(r) - mean) / scale) as f32));
    }
    Ok(out)
}

/// Number of groups whose rewards are all equal, i.e. whose advantages
/// [`group_relative`] sets to zero: the "zero-std" groups that carry no
/// gradient and that DAPO's dynamic sampling filters out. Same errors as
/// [`group_relative`].
pub fn count_zero_variance_groups(rewards: &[f32], group_size: usize) -> Result<usize> {
    check_groups(rewards, group_size)?;
    Ok(rewards.chunks_exact(group_size).filter(|g| is_constant(g)).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_close(got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() <= tol, "index {i}: got {g}, want {w}");
        }
    }

    #[test]
    fn gae_defaults() {
        let c = GaeConfig::default();
        assert_eq!((c.gamma, c.lambda), (0.995, 0.95));
        c.validate().unwrap();
        assert!(GaeConfig { gamma: 1.01, ..c }.validate().unwrap_err().to_string().contains("gae.gamma"));
        assert!(GaeConfig { lambda: -0.1, ..c }.validate().unwrap_err().to_string().contains("gae.lambda"));
        assert!(GaeConfig { lambda: f64::NAN, ..c }.validate().is_err());
    }

    /// 3 steps × 2 envs, γ = λ = 0.5 (so γλ = 0.25).
    ///
    /// Env 0 terminates at t = 1 (t = 2 starts a new episode); env 1 is
    /// truncated at t = 0 with V(final obs) = 3.
    ///
    /// Env 0: r = [1, 2, 3], V = [0.5, 1, 2], V' = [1, (99 ignored), 4]
    ///   δ0 = 1 + 0.5·1 − 0.5 = 1;  δ1 = 2 + 0 − 1 = 1;  δ2 = 3 + 0.5·4 − 2 = 3
    ///   A2 = 3;  A1 = 1 (terminated: no carry);  A0 = 1 + 0.25·1 = 1.25
    ///   R = [1.75, 2, 5]
    /// Env 1: r = [1, 0, −1], V = [2, 1, 0.5], V' = [3, 0.5, 1]
    ///   δ0 = 1 + 0.5·3 − 2 = 0.5;  δ1 = 0 + 0.5·0.5 − 1 = −0.75;  δ2 = −1 + 0.5·1 − 0.5 = −1
    ///   A2 = −1;  A1 = −0.75 + 0.25·(−1) = −1;  A0 = 0.5 (truncated: no carry)
    ///   R = [2.5, 0, −0.5]
    #[test]
    fn gae_hand_worked_termination_and_truncation() {
        // Time-major: [t0e0, t0e1, t1e0, t1e1, t2e0, t2e1].
        let rewards = [1.0, 1.0, 2.0, 0.0, 3.0, -1.0];
        let values = [0.5, 2.0, 1.0, 1.0, 2.0, 0.5];
        let next_values = [1.0, 3.0, 99.0, 0.5, 4.0, 1.0];
        let terminated = [false, false, true, false, false, false];
        let truncated = [false, true, false, false, false, false];
        let cfg = GaeConfig { gamma: 0.5, lambda: 0.5 };
        let (a, r) = gae(&rewards, &values, &next_values, &terminated, &truncated, 2, &cfg).unwrap();
        assert_close(&a, &[1.25, 0.5, 1.0, -1.0, 3.0, -1.0], 1e-7);
        assert_close(&r, &[1.75, 2.5, 2.0, 0.0, 5.0, -0.5], 1e-7);
    }

    /// With γ = λ = 1 the advantage telescopes to the Monte-Carlo return to
    /// the end of the episode (plus the bootstrap where it was cut without
    /// terminating) minus V(s_t).
    #[test]
    fn gae_gamma_lambda_one_is_monte_carlo() {
        let (t_len, n) = (7usize, 3usize);
        let mut rewards = vec![0.0f32; t_len * n];
        let mut values = vec![0.0f32; t_len * n];
        let mut terminated = vec![false; t_len * n];
        for i in 0..t_len * n {
            rewards[i] = ((i * 37 % 11) as f32) * 0.25 - 1.0;
            values[i] = ((i * 13 % 7) as f32) * 0.5;
        }
        // Env 0 terminates at t = 2 and t = 5; env 1 never; env 2 at the last step.
        terminated[2 * n] = true;
        terminated[5 * n] = true;
        terminated[(t_len - 1) * n + 2] = true;
        let bootstrap = [10.0f32, -3.0, 77.0];
        // Consistent next values: V of the next step, the bootstrap at the end.
        let mut next_values = vec![0.0f32; t_len * n];
        for t in 0..t_len {
            for e in 0..n {
                next_values[t * n + e] = if t + 1 < t_len { values[(t + 1) * n + e] } else { bootstrap[e] };
            }
        }
        let cfg = GaeConfig { gamma: 1.0, lambda: 1.0 };
        let (adv, ret) = gae(&rewards, &values, &next_values, &terminated, &vec![false; t_len * n], n, &cfg).unwrap();
        for (e, &boot) in bootstrap.iter().enumerate() {
            for t in 0..t_len {
                let mut g = 0.0f64;
                let mut k = t;
                loop {
                    let i = k * n + e;
                    g += f64::from(rewards[i]);
                    if terminated[i] {
                        break;
                    }
                    if k + 1 == t_len {
                        g += f64::from(boot);
                        break;
                    }
                    k += 1;
                }
                let i = t * n + e;
                assert!((f64::from(adv[i]) - (g - f64::from(values[i]))).abs() < 1e-5, "t={t} e={e}");
                assert!((f64::from(ret[i]) - g).abs() < 1e-5, "t={t} e={e}");
            }
        }
    }

    #[test]
    fn gae_lambda_zero_is_one_step_td() {
        let rewards = [0.3, -1.0, 2.0, 0.7, 0.1, 5.0];
        let values = [1.0, 0.2, -0.4, 2.0, 0.9, 1.1];
        let next_values = [-0.4, 2.0, 0.9, 1.1, 3.0, -2.0];
        let terminated = [false, false, false, true, false, false];
        let truncated = [true, false, false, false, false, false];
        let cfg = GaeConfig { gamma: 0.9, lambda: 0.0 };
        let (a, _) = gae(&rewards, &values, &next_values, &terminated, &truncated, 2, &cfg).unwrap();
        let want: Vec<f64> = (0..6)
            .map(|i| {
                let boot = if terminated[i] { 0.0 } else { 0.9 * f64::from(next_values[i]) };
                f64::from(rewards[i]) + boot - f64::from(values[i])
            })
            .collect();
        assert_close(&a, &want, 1e-6);
    }

    #[test]
    fn gae_shape_errors() {
        let cfg = GaeConfig::default();
        let x = [0.0f32; 4];
        let b = [false; 4];
        assert!(matches!(gae(&x, &x, &x, &b, &b, 0, &cfg), Err(Error::Shape(_))));
        assert!(matches!(gae(&x, &x, &x, &b, &b, 3, &cfg), Err(Error::Shape(_))));
        assert!(matches!(gae(&x, &x[..3], &x, &b, &b, 2, &cfg), Err(Error::Shape(_))));
        assert!(matches!(gae(&x, &x, &x, &b, &b[..2], 2, &cfg), Err(Error::Shape(_))));
        let (a, r) = gae(&[], &[], &[], &[], &[], 2, &cfg).unwrap();
        assert!(a.is_empty() && r.is_empty());
    }

    /// Group [0, 1, 1, 2]: mean 1, Σ(R − mean)² = 2.
    /// Unbiased std = √(2/3) ≈ 0.8164966, biased std = √(1/2) ≈ 0.7071068.
    #[test]
    fn group_relative_known_values() {
        let r = [0.0, 1.0, 1.0, 2.0];
        let unbiased = group_relative(&r, 4, &GroupNormConfig::default()).unwrap();
        let su = (2.0f64 / 3.0).sqrt() + 1e-6;
        assert_close(&unbiased, &[-1.0 / su, 0.0, 0.0, 1.0 / su], 1e-6);
        assert!((f64::from(unbiased[3]) - 1.224_743).abs() < 1e-5);

        let biased =
            group_relative(&r, 4, &GroupNormConfig { std: StdKind::Biased, eps: 0.0, ..Default::default() }).unwrap();
        assert_close(&biased, &[-std::f64::consts::SQRT_2, 0.0, 0.0, std::f64::consts::SQRT_2], 1e-6);

        let dr = group_relative(&r, 4, &GroupNormConfig::dr_grpo()).unwrap();
        assert_close(&dr, &[-1.0, 0.0, 0.0, 1.0], 0.0);

        // Binary rewards, G = 2: mean 0.5, unbiased std √0.5, so ±0.5/√0.5 = ±√0.5.
        let bin = group_relative(&[1.0, 0.0], 2, &GroupNormConfig { eps: 0.0, ..Default::default() }).unwrap();
        assert_close(&bin, &[std::f64::consts::FRAC_1_SQRT_2, -std::f64::consts::FRAC_1_SQRT_2], 1e-7);
    }

    #[test]
    fn groups_are_independent_and_constant_groups_are_zero() {
        // Three groups of 3: all-correct, mixed, all-wrong.
        let r = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let a = group_relative(&r, 3, &GroupNormConfig::default()).unwrap();
        assert_eq!(&a[..3], &[0.0; 3]);
        assert_eq!(&a[6..], &[0.0; 3]);
        // Mixed group: mean 1/3, unbiased std = √(1/3) ≈ 0.57735.
        let s = (1.0f64 / 3.0).sqrt() + 1e-6;
        assert_close(&a[3..6], &[(2.0 / 3.0) / s, -(1.0 / 3.0) / s, -(1.0 / 3.0) / s], 1e-6);
        assert_eq!(count_zero_variance_groups(&r, 3).unwrap(), 2);
        // A constant group whose float mean is inexact still gives exact zeros.
        let z = group_relative(&[0.1; 7], 7, &GroupNormConfig::dr_grpo()).unwrap();
        assert!(z.iter().all(|&x| x == 0.0));
        // Singleton groups carry no relative signal.
        assert_eq!(group_relative(&[3.0, -2.0], 1, &GroupNormConfig::default()).unwrap(), vec![0.0, 0.0]);
        assert_eq!(count_zero_variance_groups(&[3.0, -2.0], 1).unwrap(), 2);
    }

    #[test]
    fn normalised_groups_have_zero_mean_and_unit_std() {
        let r: Vec<f32> = (0..32).map(|i| ((i * 7919 % 13) as f32) * 0.3).collect();
        let a = group_relative(&r, 8, &GroupNormConfig { eps: 0.0, ..Default::default() }).unwrap();
        for g in a.chunks_exact(8) {
            let m = g.iter().map(|&x| f64::from(x)).sum::<f64>() / 8.0;
            let v = g.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / 7.0;
            assert!(m.abs() < 1e-6 && (v - 1.0).abs() < 1e-5, "mean {m} var {v}");
        }
    }

    #[test]
    fn group_errors() {
        let cfg = GroupNormConfig::default();
        assert!(matches!(group_relative(&[1.0, 2.0, 3.0], 2, &cfg), Err(Error::Shape(_))));
        assert!(matches!(group_relative(&[1.0, 2.0], 0, &cfg), Err(Error::InvalidConfig { .. })));
        assert!(count_zero_variance_groups(&[1.0, 2.0, 3.0], 2).is_err());
        assert!(count_zero_variance_groups(&[1.0], 0).is_err());
        let e = group_relative(&[1.0, f32::NAN], 2, &cfg).unwrap_err();
        assert!(e.to_string().contains("rewards[1]"), "{e}");
        let e = group_relative(&[1.0, 2.0], 2, &GroupNormConfig { eps: -1.0, ..cfg }).unwrap_err();
        assert!(e.to_string().contains("group_norm.eps"), "{e}");
        assert!(group_relative(&[], 4, &cfg).unwrap().is_empty());
    }

    #[test]
    fn group_norm_config_from_toml() {
        let c: GroupNormConfig = toml::from_str("scale_by_std = false\nstd = \"biased\"\neps = 1e-4\n").unwrap();
        assert_eq!(c, GroupNormConfig { scale_by_std: false, std: StdKind::Biased, eps: 1e-4 });
        assert_eq!(toml::from_str::<GroupNormConfig>("").unwrap(), GroupNormConfig::default());
        assert!(toml::from_str::<GroupNormConfig>("epsilon = 1.0").is_err());
        assert_eq!(toml::from_str::<GaeConfig>("gamma = 0.99").unwrap(), GaeConfig { gamma: 0.99, lambda: 0.95 });
    }
}
