//! Rollout–trainer mismatch corrections: importance weights between the
//! learner's log-probs of the sampled tokens at the weights that sampled them
//! (log π_old) and the inference engine's own (log μ), which differ when the
//! engine computes in another precision, with other kernels, or quantised.
//!
//! The weight `w = π_old/μ` is computed once per sample, before the update
//! (both sides are fixed then), and multiplies the policy-gradient term of any
//! objective, detached ([`crate::objective::PolicyBatch::weights`]); penalty
//! terms are not weighted, as in verl's rollout correction.
//!
//! | mode | weight | source |
//! |---|---|---|
//! | token TIS | `min(ρ_t, C)` | Yao et al. 2025 (TIS); verl `rollout_is = "token"` |
//! | sequence TIS | `min(exp(Σ_t log ρ_t), C)` on every token | verl `rollout_is = "sequence"` |
//! | token MIS | `ρ_t` if `ρ_t ≤ C`, else 0 | TRL `vllm_importance_sampling_mode = "token_mask"` |
//! | sequence MIS | `ρ_seq` if `ρ_seq ≤ C`, else 0 on every token | TRL `"sequence_mask"` (its default) |
//!
//! with `ρ_t = π_old/μ` per token and `log ρ_t` clamped to ±20 (verl) before
//! any `exp`. Masked tokens keep their place in the aggregation's normaliser
//! (TRL's semantics; verl's rejection sampling instead removes them from it).

use serde::{Deserialize, Serialize};

/// Clamp on `log ρ` (and on a sequence's sum) before `exp`, as verl's.
pub const LOG_WEIGHT_CLAMP: f64 = 20.0;

/// Which rollout–trainer mismatch correction to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutCorrection {
    /// No correction: weights of 1.
    #[default]
    None,
    /// Truncated IS per token: `min(ρ_t, C)`.
    TokenTis,
    /// Truncated IS per sequence: `min(Π_t ρ_t, C)`.
    SeqTis,
    /// Masked IS per token: `ρ_t`, or 0 where `ρ_t > C`.
    TokenMis,
    /// Masked IS per sequence: `Π_t ρ_t`, or 0 for the whole sequence where it exceeds C.
    SeqMis,
}

impl RolloutCorrection {
    /// The config name (`none`, `token-tis`, `seq-tis`, `token-mis`, `seq-mis`).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutCorrection::None => "none",
            RolloutCorrection::TokenTis => "token-tis",
            RolloutCorrection::SeqTis => "seq-tis",
            RolloutCorrection::TokenMis => "token-mis",
            RolloutCorrection::SeqMis => "seq-mis",
        }
    }
}

/// What the weights of one sample were, for the run's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CorrectionSums {
    /// Tokens weighed.
    pub tokens: f64,
    /// Sum of the weights applied.
    pub weight_sum: f64,
    /// Tokens whose weight was truncated (TIS) or zeroed (MIS).
    pub capped: f64,
}

impl CorrectionSums {
    /// Adds another sample's sums.
    pub fn add(&mut self, o: &CorrectionSums) {
        self.tokens += o.tokens;
        self.weight_sum += o.weight_sum;
        self.capped += o.capped;
    }
}

/// The per-token weights of one response, from the learner's log-probs
/// `old` and the engine's `rollout` (same length), under `mode` and cap `cap`.
pub fn weights(mode: RolloutCorrection, cap: f64, old: &[f32], rollout: &[f32]) -> (Vec<f32>, CorrectionSums) {
    assert_eq!(old.len(), rollout.len(), "one engine log-prob per learner log-prob");
    let n = old.len();
    let log_rho: Vec<f64> = old
        .iter()
        .zip(rollout)
        .map(|(&o, &r)| (f64::from(o) - f64::from(r)).clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
        .collect();
    // The raw weight each token gets: its own ratio, or its sequence's.
    let rho: Vec<f64> = match mode {
        RolloutCorrection::None => vec![1.0; n],
        RolloutCorrection::TokenTis | RolloutCorrection::TokenMis => log_rho.iter().map(|x| x.exp()).collect(),
        RolloutCorrection::SeqTis | RolloutCorrection::SeqMis => {
            vec![log_rho.iter().sum::<f64>().clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP).exp(); n]
        }
    };
    let masks = matches!(mode, RolloutCorrection::TokenMis | RolloutCorrection::SeqMis);
    let over = |r: f64| mode != RolloutCorrection::None && r > cap;
    let w: Vec<f64> = rho
        .iter()
        .map(|&r| {
            if !over(r) {
                r
            } else if masks {
                0.0
            } else {
                cap
            }
        })
        .collect();
    let capped = rho.iter().filter(|&&r| over(r)).count();
    let sums = CorrectionSums { tokens: n as f64, weight_sum: w.iter().sum(), capped: capped as f64 };
    (w.into_iter().map(|v| v as f32).collect(), sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_matches_its_formula() {
        let old = [-1.0f32, -0.5, -2.0];
        let eng = [-1.5f32, -0.4, -0.5];
        // ρ = e^0.5, e^−0.1, e^−1.5; Σ log ρ = −1.1.
        let r: Vec<f64> = [0.5f64, -0.1, -1.5].iter().map(|x| x.exp()).collect();
        let close = |a: &[f32], b: &[f64]| a.iter().zip(b).all(|(x, y)| (f64::from(*x) - y).abs() < 1e-6);
        let (w, s) = weights(RolloutCorrection::None, 2.0, &old, &eng);
        assert_eq!((w, s.capped), (vec![1.0; 3], 0.0));
        let (w, s) = weights(RolloutCorrection::TokenTis, 1.5, &old, &eng);
        assert!(close(&w, &[1.5, r[1], r[2]]), "{w:?}");
        assert_eq!(s.capped, 1.0);
        let (w, _) = weights(RolloutCorrection::TokenMis, 1.5, &old, &eng);
        assert!(close(&w, &[0.0, r[1], r[2]]), "{w:?}");
        let seq = (-1.1f64).exp();
        let (w, s) = weights(RolloutCorrection::SeqTis, 2.0, &old, &eng);
        assert!(close(&w, &[seq; 3]) && s.capped == 0.0, "{w:?}");
        // A sequence whose product exceeds the cap: all its tokens go.
        let (w, s) = weights(RolloutCorrection::SeqMis, 2.0, &[0.0, 0.0], &[-0.5, -0.5]);
        assert_eq!((w, s.capped), (vec![0.0, 0.0], 2.0));
        let (w, _) = weights(RolloutCorrection::SeqTis, 2.0, &[0.0, 0.0], &[-0.5, -0.5]);
        assert_eq!(w, vec![2.0, 2.0]);
        // Infinite engine log-probs are clamped, not propagated.
        let (w, _) = weights(RolloutCorrection::TokenTis, 2.0, &[0.0], &[f32::NEG_INFINITY]);
        assert_eq!(w, vec![2.0]);
    }
}
